//! The libibverbs this process runs: which rdma-core release it is, which
//! private ABI layout the provider must use (`xiw_abi::driver::Layout`), and
//! its private helpers, looked up at run time (`xiw_abi::driver::private`).

use std::ffi::CStr;
use std::sync::OnceLock;

use xiw_abi::driver::private::{
    self as p, InitAndAllocContext, Log, RegisterDriver, SetOps, UninitContext,
};
use xiw_abi::driver::*;

/// libibverbs' private helpers of [`PRIVATE_ABI`].
pub struct Private {
    pub register_driver: RegisterDriver,
    pub init_and_alloc_context: InitAndAllocContext,
    pub uninit_context: UninitContext,
    pub set_ops: SetOps,
    pub log: Log,
}

/// Whether this process has libibverbs loaded at all (the `xiw` command,
/// which shares the provider's code, has not).
pub fn loaded() -> bool {
    libibverbs().is_some_and(|h| {
        // SAFETY: drops the reference just taken.
        unsafe { libc::dlclose(h) };
        true
    })
}

/// The already loaded libibverbs (a handle that keeps nothing else loaded).
fn libibverbs() -> Option<*mut libc::c_void> {
    // SAFETY: RTLD_NOLOAD only looks up a library that is loaded already:
    // the one that is loading this provider (or that the program linked).
    let h = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD,
        )
    };
    (!h.is_null()).then_some(h)
}

/// A symbol of the loaded libibverbs, with the symbol version `version`.
fn symbol(name: &CStr, version: &CStr) -> Option<*mut libc::c_void> {
    let h = libibverbs()?;
    // SAFETY: looking a versioned symbol up in a loaded library.
    let f = unsafe { libc::dlvsym(h, name.as_ptr(), version.as_ptr()) };
    // SAFETY: drops the reference dlopen took; the library stays loaded by
    // whoever loaded it first.
    unsafe { libc::dlclose(h) };
    (!f.is_null()).then_some(f)
}

/// The private helpers, or `None` if this libibverbs lacks one of them (an
/// rdma-core of another private ABI).
pub fn private() -> Option<&'static Private> {
    static P: OnceLock<Option<Private>> = OnceLock::new();
    P.get_or_init(|| {
        // SAFETY: each symbol has the C type its name has in rdma-core's
        // driver.h of this private ABI (mirrored in xiw_abi::driver::private).
        unsafe {
            Some(Private {
                register_driver: std::mem::transmute::<*mut libc::c_void, RegisterDriver>(
                    symbol(p::REGISTER_DRIVER, p::VERSION)?,
                ),
                init_and_alloc_context: std::mem::transmute::<
                    *mut libc::c_void,
                    InitAndAllocContext,
                >(symbol(p::INIT_AND_ALLOC_CONTEXT, p::VERSION)?),
                uninit_context: std::mem::transmute::<*mut libc::c_void, UninitContext>(symbol(
                    p::UNINIT_CONTEXT,
                    p::VERSION,
                )?),
                set_ops: std::mem::transmute::<*mut libc::c_void, SetOps>(symbol(
                    p::SET_OPS,
                    p::VERSION,
                )?),
                log: std::mem::transmute::<*mut libc::c_void, Log>(symbol(p::LOG, p::VERSION)?),
            })
        }
    })
    .as_ref()
}

/// The layout of the rdma-core this process runs, found at registration.
static LAYOUT: OnceLock<&'static Layout> = OnceLock::new();

/// Records the layout found at registration.
pub fn set_layout(l: &'static Layout) {
    let _ = LAYOUT.set(l);
}

/// The private ABI layout in use (rdma-core 44's before registration).
pub fn layout() -> &'static Layout {
    LAYOUT.get().copied().unwrap_or(&LAYOUTS[0])
}

/// Which of [`LAYOUTS`] the loaded libibverbs has: the release its file
/// name carries, confirmed by a symbol that only some releases export.
pub fn detect() -> Result<&'static Layout, String> {
    let v =
        rdma_core_version().ok_or("cannot tell which rdma-core version loaded this provider")?;
    let (major, minor) = v
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| format!("cannot read the rdma-core version {v:?}"))?;
    let l = Layout::of(major, minor).ok_or_else(|| {
        format!(
            "running with rdma-core {v}; this provider serves rdma-core {} (private ABI {PRIVATE_ABI})",
            Layout::known()
        )
    })?;
    if private().is_none() {
        return Err(format!(
            "libibverbs of rdma-core {v} lacks the private helpers of ABI {PRIVATE_ABI}"
        ));
    }
    let has_opcode_str = symbol(c"ibv_wr_opcode_str", p::VERSION).is_some();
    if has_opcode_str != l.has_wr_opcode_str {
        return Err(format!(
            "libibverbs is named as rdma-core {v}, but its symbols are not that release's"
        ));
    }
    Ok(l)
}

/// The rdma-core version of the libibverbs in this process, from its file name
/// (`libibverbs.so.1.14.44.0` is rdma-core 44.0).
fn rdma_core_version() -> Option<String> {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for a symbol we link.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let f = symbol(c"ibv_get_device_list", c"IBVERBS_1.1")?;
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
    let (_, core) = v.split_once('.')?;
    Some(core.to_owned())
}
