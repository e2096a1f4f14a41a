//! The libibverbs this process runs: which rdma-core release it is, which
//! private ABI layout the provider must use (`xiw_abi::driver::Layout`), and
//! its private helpers, looked up at run time (`xiw_abi::driver::private`).

use std::ffi::CStr;
use std::mem::size_of;
use std::sync::OnceLock;

use xiw_abi::driver::private::{
    self as p, CmdGetContext34, CmdGetContext57, InitAndAllocContext, Log, RegisterDriver, SetOps,
    UninitContext,
};
use xiw_abi::driver::*;

use crate::error::Error;

/// libibverbs' private helpers, of the private ABI of its release.
pub struct Private {
    pub register_driver: RegisterDriver,
    pub init_and_alloc_context: InitAndAllocContext,
    pub uninit_context: UninitContext,
    pub set_ops: SetOps,
    pub log: Log,
    get_context: GetContext,
}

/// `ibv_cmd_get_context` as the private ABI in use declares it.
#[derive(Clone, Copy)]
enum GetContext {
    V34(CmdGetContext34),
    V57(CmdGetContext57),
}

impl Private {
    /// Asks the kernel for its context of the device behind `vctx` (a device
    /// the kernel module registered).
    ///
    /// # Safety
    /// `vctx` was just made by `init_and_alloc_context` on the device's command fd.
    /// `cm_eventfd` is the descriptor the module signals when rdma_cm has a
    /// connection for the provider (-1: none).
    pub unsafe fn get_context(
        &self,
        vctx: *mut xiw_abi::verbs::verbs_context,
        cm_eventfd: i32,
    ) -> Result<xiw_abi::kernel::AllocUcontextResp, Error> {
        /// `struct ibv_get_context` (header and response pointer, which
        /// libibverbs fills in), then xiw's driver data.
        #[repr(C)]
        struct Cmd {
            core: [u64; 2],
            req: xiw_abi::kernel::AllocUcontextReq,
        }
        const { assert!(size_of::<Cmd>() == p::GET_CONTEXT_CMD_SIZE) };
        let mut cmd = Cmd {
            core: [0; 2],
            req: xiw_abi::kernel::AllocUcontextReq {
                cm_eventfd,
                reserved: 0,
            },
        };
        /// `struct ib_uverbs_get_context_resp`, then xiw's driver response.
        #[repr(C)]
        struct Resp {
            core: [u64; p::GET_CONTEXT_RESP_SIZE / 8],
            drv: xiw_abi::kernel::AllocUcontextResp,
        }
        let mut resp = Resp {
            core: [0; p::GET_CONTEXT_RESP_SIZE / 8],
            drv: Default::default(),
        };
        let (c, r) = (
            (&mut cmd as *mut Cmd).cast(),
            (&mut resp as *mut Resp).cast(),
        );
        let (cs, rs) = (p::GET_CONTEXT_CMD_SIZE, size_of::<Resp>());
        // SAFETY: buffers of the sizes given, as the helper's type says.
        let rc = unsafe {
            match self.get_context {
                GetContext::V34(f) => f(vctx, c, cs, r, rs),
                GetContext::V57(f) => f(vctx, c, cs, std::ptr::null_mut(), r, rs),
            }
        };
        if rc == 0 {
            Ok(resp.drv)
        } else {
            Err(Error::Kernel {
                what: "a context",
                errno: rc,
            })
        }
    }
}

/// Whether this process has libibverbs loaded at all (the `xiw` command,
/// which shares the provider's code, has not).
pub fn loaded() -> bool {
    Loaded::get().is_some()
}

/// A reference to the already loaded libibverbs (one that loads nothing).
struct Loaded(*mut libc::c_void);

impl Loaded {
    fn get() -> Option<Loaded> {
        // SAFETY: RTLD_NOLOAD only looks up a library that is loaded already:
        // the one that is loading this provider (or that the program linked).
        let h = unsafe {
            libc::dlopen(
                c"libibverbs.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_NOLOAD,
            )
        };
        // `then`, not `then_some`: a Loaded made of a null handle would be dropped,
        // and closed.
        (!h.is_null()).then(|| Loaded(h))
    }

    /// The address of `name` with the symbol version `version`.
    fn address(&self, name: &CStr, version: &CStr) -> Option<*mut libc::c_void> {
        // SAFETY: looking a versioned symbol up in a loaded library.
        let f = unsafe { libc::dlvsym(self.0, name.as_ptr(), version.as_ptr()) };
        (!f.is_null()).then_some(f)
    }

    /// The private helper `name` of private ABI `abi` as the function type `F`.
    ///
    /// # Safety
    /// `F` is the C type `name` has in rdma-core's driver.h of that ABI
    /// (mirrored in `xiw_abi::driver::private`).
    unsafe fn helper<F: Copy>(&self, name: &CStr, abi: u32) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<*mut libc::c_void>()) };
        let f = self.address(name, p::version(abi))?;
        // SAFETY: a function address, as the function type the caller names.
        Some(unsafe { std::mem::transmute_copy::<*mut libc::c_void, F>(&f) })
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: drops the reference dlopen took; the library stays loaded
        // by whoever loaded it first.
        unsafe { libc::dlclose(self.0) };
    }
}

/// What registration found: the layout of the loaded libibverbs and its
/// private helpers, or why the provider does not serve it.
struct Found {
    layout: &'static Layout,
    private: Private,
}

fn found() -> &'static Result<Found, Error> {
    static F: OnceLock<Result<Found, Error>> = OnceLock::new();
    F.get_or_init(find)
}

/// The private helpers, or `None` if the provider does not serve the
/// libibverbs loaded (or none is).
pub fn private() -> Option<&'static Private> {
    found().as_ref().ok().map(|f| &f.private)
}

/// The private ABI layout in use (rdma-core 44's where none was found).
pub fn layout() -> &'static Layout {
    found().as_ref().map_or(MIRRORED, |f| f.layout)
}

/// Which of [`LAYOUTS`] the loaded libibverbs has, or why none: the
/// release its file name carries, confirmed by what the library exports
/// (see [`find`]).
pub fn detect() -> Result<&'static Layout, Error> {
    found().as_ref().map(|f| f.layout).map_err(Clone::clone)
}

/// The release of the loaded libibverbs, from three sources that must
/// agree: its file name (`libibverbs.so.1.14.44.0`: library version 1.14 of
/// rdma-core 44.0), the private ABI whose `verbs_register_driver_N` it
/// exports, and the probe symbols it exports ([`PROBES`]), which arrived in
/// known releases. Releases 39 to 48 export the same symbols; there the name
/// alone tells them apart.
fn find() -> Result<Found, Error> {
    let lib = Loaded::get().ok_or_else(|| Error::Library("libibverbs is not loaded".into()))?;
    let (library_minor, v) = rdma_core_version(&lib).ok_or_else(|| {
        Error::Library("cannot tell which rdma-core version loaded this provider".into())
    })?;
    // "56.1": the series decides the layout (no minor release changed one).
    let major: u32 = v
        .split_once('.')
        .filter(|(_, minor)| minor.parse::<u32>().is_ok())
        .and_then(|(major, _)| major.parse().ok())
        .ok_or_else(|| Error::Library(format!("cannot read the rdma-core version {v:?}")))?;
    let l = Layout::of(major).ok_or_else(|| {
        Error::Library(format!(
            "running with rdma-core {v}; this provider serves rdma-core {}",
            Layout::known()
        ))
    })?;
    let abi = l.private_abi();
    let exported_abis: Vec<u32> = p::ABIS
        .iter()
        .filter(|(_, version, register)| lib.address(register, version).is_some())
        .map(|e| e.0)
        .collect();
    let probes_agree = PROBES.iter().all(|&(name, node, since)| {
        let version = match node {
            Node::Public(v) => v,
            Node::Private => p::version(abi),
        };
        lib.address(name, version).is_some() == l.has_probe(since)
    });
    if exported_abis != [abi] || library_minor != l.library_minor() || !probes_agree {
        return Err(Error::Library(format!(
            "libibverbs is named as rdma-core {v}, but its symbols are not that release's"
        )));
    }
    // SAFETY: each type is its name's (xiw_abi::driver::private).
    let private = unsafe {
        (|| {
            Some(Private {
                register_driver: lib.helper::<RegisterDriver>(p::register_driver(abi), abi)?,
                init_and_alloc_context: lib
                    .helper::<InitAndAllocContext>(p::INIT_AND_ALLOC_CONTEXT, abi)?,
                uninit_context: lib.helper::<UninitContext>(p::UNINIT_CONTEXT, abi)?,
                set_ops: lib.helper::<SetOps>(p::SET_OPS, abi)?,
                log: lib.helper::<Log>(p::LOG, abi)?,
                get_context: if l.get_context_fd_arr() {
                    GetContext::V57(lib.helper(p::CMD_GET_CONTEXT, abi)?)
                } else {
                    GetContext::V34(lib.helper(p::CMD_GET_CONTEXT, abi)?)
                },
            })
        })()
    }
    .ok_or_else(|| {
        Error::Library(format!(
            "libibverbs of rdma-core {v} lacks the private helpers of ABI {abi}"
        ))
    })?;
    Ok(Found { layout: l, private })
}

/// The library's minor version and the rdma-core version of the
/// libibverbs in this process, from its file name
/// (`libibverbs.so.1.14.44.0` is library version 1.14 of rdma-core 44.0).
fn rdma_core_version(lib: &Loaded) -> Option<(u32, String)> {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for a symbol we link.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let f = lib.address(c"ibv_get_device_list", c"IBVERBS_1.1")?;
    // SAFETY: the address of a libibverbs function.
    if unsafe { libc::dladdr(f, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returns a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_str()
        .ok()?
        .to_owned();
    let real = std::fs::canonicalize(&path).ok()?;
    let name = real.file_name()?.to_str()?;
    let v = name.strip_prefix("libibverbs.so.1.")?;
    let (library_minor, core) = v.split_once('.')?;
    Some((library_minor.parse().ok()?, core.to_owned()))
}
