//! Direct verbs of xiw, the software iWARP RNIC, for Rust programs.
//!
//! The Rust face of `infiniband/xiwdv.h`: the operations that rdma-core 44's
//! `verbs.h` cannot express, namely RDMA Flush, RDMA Verify and Atomic Write
//! (draft-talpey-rdma-commit-01), the masked and swap forms of the RFC 7306
//! atomics, and registration of flushable and verifiable memory. FetchAdd,
//! CmpSwap, the Immediate Data operations and Atomic Write itself go through
//! the ordinary verbs (`ibv_post_send`, `ibv_wr_*`).
//!
//! Nothing is linked at build time. The functions are exported by the provider
//! library (`libxiw-rdmav34.so`) that libibverbs loads from its provider
//! directory, so they are looked up at run time, once, when first needed: a
//! program without xiw gets [`Error::Unavailable`] from every call, never a
//! crash. Pointers are the `ibv_*` types of [`xiw_abi::verbs`].
//!
//! The work request builders ([`wr_flush`], [`wr_verify`], the masked
//! atomics) extend `struct ibv_qp_ex` exactly like `ibv_wr_rdma_write()`: call
//! them between `wr_start` and `wr_complete` of a QP that xiw created with
//! `ibv_create_qp_ex()` and the `send_ops_flags` of the operations it uses
//! ([`XIWDV_QP_EX_WITH_FLUSH`], [`XIWDV_QP_EX_WITH_VERIFY`],
//! [`XIWDV_QP_EX_WITH_MASKED_ATOMICS`]). Bad arguments make the following
//! `wr_complete` fail with `EINVAL`, and nothing is posted.
//!
//! # Example: a durable log append
//!
//! The record goes to the peer's log with an RDMA Write, an RDMA Flush makes
//! it persistent, and an 8-byte Atomic Write then publishes the new length.
//! The peer registered its log file mapping with [`reg_mr`] and
//! [`IBV_ACCESS_FLUSH_PERSISTENT`]; the length word lands only after the
//! Flush has made the record durable, so a reader never sees a length ahead
//! of its data.
//!
//! ```no_run
//! use xiw_abi::verbs::{ibv_qp_ex, IBV_SEND_SIGNALED};
//!
//! /// Appends `rec` (registered under `lkey`) at `log + off` of the peer's
//! /// memory (`rkey`) and sets the 8-byte word at `len_addr` to `new_len`.
//! ///
//! /// # Safety
//! /// `qpx` is a connected xiw QP created with `IBV_QP_EX_WITH_RDMA_WRITE`,
//! /// `IBV_QP_EX_WITH_ATOMIC_WRITE` and `XIWDV_QP_EX_WITH_FLUSH`; `rec`
//! /// stays registered until the completion arrives.
//! unsafe fn append(
//!     qpx: *mut ibv_qp_ex,
//!     lkey: u32,
//!     rec: &[u8],
//!     rkey: u32,
//!     log: u64,
//!     off: u64,
//!     len_addr: u64,
//!     new_len: u64,
//! ) -> Result<(), xiwdv::Error> {
//!     unsafe {
//!         ((*qpx).wr_start.unwrap())(qpx);
//!         (*qpx).wr_id = 1;
//!         (*qpx).wr_flags = 0;
//!         ((*qpx).wr_rdma_write.unwrap())(qpx, rkey, log + off);
//!         ((*qpx).wr_set_sge.unwrap())(qpx, lkey, rec.as_ptr() as u64, rec.len() as u32);
//!         (*qpx).wr_id = 2;
//!         let persistent = xiwdv::Placement::Persistent as u8;
//!         let range = xiwdv::Selectivity::Range as u8;
//!         xiwdv::wr_flush(qpx, rkey, log + off, rec.len(), persistent, range)?;
//!         (*qpx).wr_id = 3;
//!         (*qpx).wr_flags = IBV_SEND_SIGNALED;
//!         // The eight bytes land as given: agree on a byte order with the reader.
//!         let word = new_len.to_le_bytes();
//!         ((*qpx).wr_atomic_write.unwrap())(qpx, rkey, len_addr, word.as_ptr().cast());
//!         match ((*qpx).wr_complete.unwrap())(qpx) {
//!             0 => Ok(()),
//!             e => Err(xiwdv::Error::Failed { errno: e, reason: xiwdv::last_error() }),
//!         }
//!     }
//! }
//! ```

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::OnceLock;

pub use xiw_abi::verbs::{ibv_context, ibv_mr, ibv_pd, ibv_qp_ex};

// ---- constants (values exactly as in xiwdv.h) ----------------------------------

/// Access flag: the peer may flush the MR to global visibility (rdma-core 45+ value).
pub const IBV_ACCESS_FLUSH_GLOBAL: u32 = 1 << 8;
/// Access flag: the peer may flush the MR to persistence (rdma-core 45+ value).
pub const IBV_ACCESS_FLUSH_PERSISTENT: u32 = 1 << 9;
pub const XIWDV_ACCESS_FLUSH_GLOBAL: u32 = IBV_ACCESS_FLUSH_GLOBAL;
pub const XIWDV_ACCESS_FLUSH_PERSISTENT: u32 = IBV_ACCESS_FLUSH_PERSISTENT;

pub const XIWDV_HASH_NONE: u32 = 0;
pub const XIWDV_HASH_CRC32C: u32 = 1;
pub const XIWDV_HASH_SHA256: u32 = 2;
/// The longest hash an RDMA Verify returns or accepts.
pub const XIWDV_MAX_HASH_LEN: usize = 32;

/// [`MrAttr::comp_mask`]: `verify_hash` is valid.
pub const XIWDV_MR_ATTR_VERIFY_HASH: u64 = 1 << 0;

/// RFC 7306 FetchAdd and CmpSwap, and the masked forms.
pub const XIWDV_CAP_ATOMICS: u64 = 1 << 0;
/// RFC 7306 Immediate Data.
pub const XIWDV_CAP_IMMEDIATE: u64 = 1 << 1;
/// RDMA Flush to global visibility.
pub const XIWDV_CAP_FLUSH_GLOBAL: u64 = 1 << 2;
/// RDMA Flush to persistence.
pub const XIWDV_CAP_FLUSH_PERSISTENT: u64 = 1 << 3;
/// RDMA Verify.
pub const XIWDV_CAP_VERIFY: u64 = 1 << 4;
/// Atomic Write.
pub const XIWDV_CAP_ATOMIC_WRITE: u64 = 1 << 5;

/// `send_ops_flags` for `ibv_create_qp_ex()`: upstream `IBV_QP_EX_WITH_FLUSH`.
pub const XIWDV_QP_EX_WITH_FLUSH: u64 = 1 << 11;
/// `send_ops_flags`: RDMA Verify (xiw only).
pub const XIWDV_QP_EX_WITH_VERIFY: u64 = 1 << 32;
/// `send_ops_flags`: the masked and swap atomics (xiw only).
pub const XIWDV_QP_EX_WITH_MASKED_ATOMICS: u64 = 1 << 33;

pub const XIWDV_FLUSH_GLOBAL: u8 = 1 << 0;
pub const XIWDV_FLUSH_PERSISTENT: u8 = 1 << 1;
pub const XIWDV_FLUSH_RANGE: u8 = 0;
pub const XIWDV_FLUSH_MR: u8 = 1;

/// Completion opcode of an RDMA Flush (upstream `IBV_WC_FLUSH`).
pub const XIWDV_WC_FLUSH: u32 = 8;
/// Completion opcode of an RDMA Verify.
pub const XIWDV_WC_VERIFY: u32 = xiw_abi::verbs::IBV_WC_DRIVER1;

// ---- enums -----------------------------------------------------------------------

/// Hash algorithm of a verifiable MR (`enum xiwdv_hash`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashAlg {
    /// Not verifiable.
    None = XIWDV_HASH_NONE,
    /// 4 bytes, big-endian CRC32c.
    Crc32c = XIWDV_HASH_CRC32C,
    /// 32 bytes.
    Sha256 = XIWDV_HASH_SHA256,
}

impl HashAlg {
    /// The length of the hash an RDMA Verify returns.
    pub const fn len(self) -> usize {
        match self {
            HashAlg::None => 0,
            HashAlg::Crc32c => 4,
            HashAlg::Sha256 => 32,
        }
    }

    /// True for [`HashAlg::None`], whose hash is empty.
    pub const fn is_empty(self) -> bool {
        self.len() == 0
    }

    pub const fn from_u32(v: u32) -> Option<HashAlg> {
        match v {
            XIWDV_HASH_NONE => Some(HashAlg::None),
            XIWDV_HASH_CRC32C => Some(HashAlg::Crc32c),
            XIWDV_HASH_SHA256 => Some(HashAlg::Sha256),
            _ => None,
        }
    }
}

/// Flush placement type (`enum xiwdv_placement_type`); OR them with `as u8`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Visible to every CPU of the responder.
    Global = XIWDV_FLUSH_GLOBAL,
    /// Durable on the responder's medium.
    Persistent = XIWDV_FLUSH_PERSISTENT,
}

/// Flush selectivity (`enum xiwdv_selectivity_level`). The wire format carries
/// a range only, so [`Selectivity::Mr`] is refused.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Selectivity {
    Range = XIWDV_FLUSH_RANGE,
    Mr = XIWDV_FLUSH_MR,
}

// ---- structures ------------------------------------------------------------------

/// `struct xiwdv_mr_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrAttr {
    /// `XIWDV_MR_ATTR_*`.
    pub comp_mask: u64,
    /// `XIWDV_HASH_*`.
    pub verify_hash: u32,
    pub reserved: u32,
}

impl MrAttr {
    /// Attributes of an MR that RDMA Verify hashes with `hash`.
    pub const fn verifiable(hash: HashAlg) -> MrAttr {
        MrAttr {
            comp_mask: XIWDV_MR_ATTR_VERIFY_HASH,
            verify_hash: hash as u32,
            reserved: 0,
        }
    }
}

/// `struct xiwdv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceAttr {
    /// `XIWDV_CAP_*`.
    pub caps: u64,
    /// Bit `1 << XIWDV_HASH_*` per supported algorithm.
    pub hashes: u32,
    pub max_hash_len: u32,
    pub reserved: [u64; 4],
}

impl DeviceAttr {
    /// True if every bit of `cap` (`XIWDV_CAP_*`) is reported.
    pub const fn has(&self, cap: u64) -> bool {
        self.caps & cap == cap
    }

    /// True if RDMA Verify can use `hash`.
    pub const fn supports_hash(&self, hash: HashAlg) -> bool {
        self.hashes & (1 << hash as u32) != 0
    }
}

// ---- errors ----------------------------------------------------------------------

/// Why a direct verb could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The xiw provider library cannot be loaded, or it lacks the function
    /// (an xiw without direct verbs).
    #[error("xiw direct verbs unavailable: {0}")]
    Unavailable(String),
    /// The context does not belong to xiw.
    #[error("not an xiw device context")]
    NotXiw,
    /// The call failed with `errno`; `reason` is [`last_error`] right after it.
    #[error("{} ({reason})", std::io::Error::from_raw_os_error(*errno))]
    Failed { errno: i32, reason: String },
}

impl Error {
    /// The errno value of a failed call (EOPNOTSUPP for the others).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Failed { errno, .. } => *errno,
            _ => libc::EOPNOTSUPP,
        }
    }
}

// ---- run-time binding ------------------------------------------------------------

/// The provider's file name; glibc matches an already loaded library by its soname.
pub const LIBRARY: &str = "libxiw-rdmav34.so";

type RegMrFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_uint, *const MrAttr) -> *mut ibv_mr;
type LastErrorFn = unsafe extern "C" fn() -> *const c_char;
type IsXiwFn = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type QueryDeviceFn = unsafe extern "C" fn(*mut ibv_context, *mut DeviceAttr) -> c_int;
type FlushFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8);
type VerifyFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32, *const c_void, usize);
type MaskedFetchAddFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64);
type MaskedCmpSwpFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64, u64, u64);
type SwapFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64);

/// The resolved functions; `None` where the library lacks one.
struct Api {
    path: String,
    reg_mr: Option<RegMrFn>,
    last_error: Option<LastErrorFn>,
    is_xiw: Option<IsXiwFn>,
    query_device: Option<QueryDeviceFn>,
    wr_flush: Option<FlushFn>,
    wr_verify: Option<VerifyFn>,
    wr_masked_fetch_add: Option<MaskedFetchAddFn>,
    wr_masked_cmp_swp: Option<MaskedCmpSwpFn>,
    wr_swap: Option<SwapFn>,
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the
    // next dl* call on this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `<dir of the loaded libibverbs>/libibverbs/<LIBRARY>`, where libibverbs
/// itself loads providers from.
fn beside_libibverbs() -> Option<PathBuf> {
    // SAFETY: looks a symbol up in the objects already loaded; the name is a
    // NUL-terminated literal.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ibv_get_device_list".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: Dl_info is plain pointers and integers; all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: sym is an address inside a loaded object; info is ours.
    if unsafe { libc::dladdr(sym, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr filled dli_fname with a NUL-terminated path that lives as
    // long as the object stays loaded; it is copied at once.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    let dir = PathBuf::from(file).parent()?.to_path_buf();
    Some(dir.join("libibverbs").join(LIBRARY))
}

fn candidates() -> Vec<String> {
    let mut v = vec![LIBRARY.to_string()];
    if let Some(p) = beside_libibverbs() {
        v.push(p.to_string_lossy().into_owned());
    }
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    for dir in [
        format!("/usr/lib/{triple}"),
        "/usr/lib64".into(),
        "/usr/lib".into(),
        "/usr/local/lib".into(),
    ] {
        let p = format!("{dir}/libibverbs/{LIBRARY}");
        if !v.contains(&p) {
            v.push(p);
        }
    }
    v
}

/// A handle to the provider library: the copy libibverbs loaded if there is one.
fn open_library() -> Result<(*mut c_void, String), String> {
    let name = CString::new(LIBRARY).expect("no NUL in the name");
    // SAFETY: NUL-terminated name; RTLD_NOLOAD only returns an object that is
    // already loaded (the one libibverbs opened), it loads nothing.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        return Ok((h, LIBRARY.to_string()));
    }
    let mut tried = Vec::new();
    for c in candidates() {
        let Ok(cs) = CString::new(c.as_str()) else {
            continue;
        };
        // SAFETY: NUL-terminated path; loading the provider runs only its own
        // constructors (it registers itself with libibverbs).
        let h = unsafe { libc::dlopen(cs.as_ptr(), libc::RTLD_NOW) };
        if !h.is_null() {
            return Ok((h, c));
        }
        tried.push(dlerror_text());
    }
    Err(format!(
        "cannot load {LIBRARY} (is xiw installed?): {}",
        tried.join("; ")
    ))
}

fn api() -> Result<&'static Api, Error> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let (h, path) = open_library()?;
        let sym = |name: &CStr| -> Option<*mut c_void> {
            // SAFETY: h is a live handle (never closed), name NUL-terminated.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        // SAFETY (each transmute): the symbol is the C function of xiwdv.h with
        // exactly this signature; the handle is never closed, so it stays valid.
        macro_rules! bind {
            ($name:literal, $ty:ty) => {
                sym($name).map(|p| unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
            };
        }
        Ok(Api {
            path,
            reg_mr: bind!(c"xiwdv_reg_mr", RegMrFn),
            last_error: bind!(c"xiwdv_last_error", LastErrorFn),
            is_xiw: bind!(c"xiwdv_is_xiw", IsXiwFn),
            query_device: bind!(c"xiwdv_query_device", QueryDeviceFn),
            wr_flush: bind!(c"xiwdv_wr_flush", FlushFn),
            wr_verify: bind!(c"xiwdv_wr_verify", VerifyFn),
            wr_masked_fetch_add: bind!(c"xiwdv_wr_atomic_masked_fetch_add", MaskedFetchAddFn),
            wr_masked_cmp_swp: bind!(c"xiwdv_wr_atomic_masked_cmp_swp", MaskedCmpSwpFn),
            wr_swap: bind!(c"xiwdv_wr_atomic_swap", SwapFn),
        })
    })
    .as_ref()
    .map_err(|e| Error::Unavailable(e.clone()))
}

fn need<T: Copy>(f: Option<T>, name: &str) -> Result<T, Error> {
    let a = api()?;
    f.ok_or_else(|| Error::Unavailable(format!("{} has no {name}", a.path)))
}

/// Where the provider library was loaded from, or why it could not be.
pub fn library_path() -> Result<String, Error> {
    api().map(|a| a.path.clone())
}

// ---- the functions of xiwdv.h ----------------------------------------------------

/// Why the calling thread's last failed xiwdv or registration call failed
/// (`xiwdv_last_error`); empty if there was none, or if xiw is unavailable.
pub fn last_error() -> String {
    let Ok(f) = api().and_then(|a| need(a.last_error, "xiwdv_last_error")) else {
        return String::new();
    };
    // SAFETY: takes no arguments; returns a static or thread-local
    // NUL-terminated string (never NULL, but checked), copied at once.
    let p = unsafe { f() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL and NUL-terminated (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `xiwdv_reg_mr`: registers `[addr, addr + length)` with `access`
/// (`IBV_ACCESS_*`, including [`IBV_ACCESS_FLUSH_GLOBAL`] and
/// [`IBV_ACCESS_FLUSH_PERSISTENT`]) and xiw's attributes (`None`: none).
/// Deregister the result with `ibv_dereg_mr`.
///
/// [`IBV_ACCESS_FLUSH_PERSISTENT`] needs a shared mapping of a file on a
/// persistent file system; anonymous memory and tmpfs files are refused with
/// `EINVAL` (see [`Error::Failed`]'s reason).
///
/// # Safety
/// `pd` must be a live protection domain of an xiw context; the memory must
/// stay mapped until the MR is deregistered, and while the MR is registered
/// the peer and the provider may access it at any time.
pub unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: u32,
    attr: Option<&MrAttr>,
) -> Result<NonNull<ibv_mr>, Error> {
    let f = need(api()?.reg_mr, "xiwdv_reg_mr")?;
    let a = attr.map_or(std::ptr::null(), |a| a as *const MrAttr);
    // SAFETY: the caller's contract; `a` is NULL or a live MrAttr.
    let mr = unsafe { f(pd, addr, length, access, a) };
    NonNull::new(mr).ok_or_else(|| {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        Error::Failed {
            errno,
            reason: last_error(),
        }
    })
}

/// `xiwdv_is_xiw`: whether `ctx` is an xiw device context. Without the xiw
/// library no context is one.
///
/// # Safety
/// `ctx` must be a live context from `ibv_open_device`.
pub unsafe fn is_xiw(ctx: *mut ibv_context) -> bool {
    match api().and_then(|a| need(a.is_xiw, "xiwdv_is_xiw")) {
        // SAFETY: the caller's contract.
        Ok(f) => unsafe { f(ctx) != 0 },
        Err(_) => false,
    }
}

/// `xiwdv_query_device`: the extension capabilities of the device.
///
/// # Safety
/// `ctx` must be a live context from `ibv_open_device`.
pub unsafe fn query_device(ctx: *mut ibv_context) -> Result<DeviceAttr, Error> {
    let f = need(api()?.query_device, "xiwdv_query_device")?;
    let mut attr = DeviceAttr::default();
    // SAFETY: the caller's contract; attr is ours and of the C layout.
    match unsafe { f(ctx, &mut attr) } {
        0 => Ok(attr),
        libc::EOPNOTSUPP => Err(Error::NotXiw),
        errno => Err(Error::Failed {
            errno,
            reason: last_error(),
        }),
    }
}

/// `xiwdv_wr_flush`: RDMA Flush of `[remote_addr, remote_addr + len)` under
/// `rkey`, to the `placement` of [`Placement`] bits (ORed) at `level`
/// ([`Selectivity`]). `len` must fit in 32 bits and `level` must be
/// [`Selectivity::Range`], or `wr_complete` fails with `EINVAL`.
///
/// # Safety
/// `qpx` must be an xiw QP from `ibv_create_qp_ex` with
/// [`XIWDV_QP_EX_WITH_FLUSH`], between `wr_start` and `wr_complete`.
pub unsafe fn wr_flush(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    placement: u8,
    level: u8,
) -> Result<(), Error> {
    let f = need(api()?.wr_flush, "xiwdv_wr_flush")?;
    // SAFETY: the caller's contract.
    unsafe { f(qpx, rkey, remote_addr, len, placement, level) };
    Ok(())
}

/// `xiwdv_wr_verify`: RDMA Verify of `[remote_addr, remote_addr + len)`:
/// the responder hashes the range as read back from its medium, with the
/// algorithm of the MR behind `rkey`. Set the local buffer for the returned
/// hash with `wr_set_sge` afterwards. With `expected` (at most
/// [`XIWDV_MAX_HASH_LEN`] bytes) a mismatch completes the Verify with
/// `IBV_WC_REM_OP_ERR` and the QP goes to the error state.
///
/// # Safety
/// As for [`wr_flush`], with [`XIWDV_QP_EX_WITH_VERIFY`].
pub unsafe fn wr_verify(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: u32,
    expected: Option<&[u8]>,
) -> Result<(), Error> {
    let f = need(api()?.wr_verify, "xiwdv_wr_verify")?;
    let (p, n) = expected.map_or((std::ptr::null(), 0), |e| (e.as_ptr().cast(), e.len()));
    // SAFETY: the caller's contract; `p` is NULL or `n` readable bytes.
    unsafe { f(qpx, rkey, remote_addr, len, p, n) };
    Ok(())
}

/// `xiwdv_wr_atomic_masked_fetch_add`: RFC 7306 masked FetchAdd of `add` to
/// the 8-byte-aligned word at `remote_addr`; a carry does not propagate out of
/// a bit set in `boundary_mask`. The original value comes back in the 8-byte
/// buffer set with `wr_set_sge`, in host byte order.
///
/// # Safety
/// As for [`wr_flush`], with [`XIWDV_QP_EX_WITH_MASKED_ATOMICS`].
pub unsafe fn wr_atomic_masked_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
    boundary_mask: u64,
) -> Result<(), Error> {
    let f = need(
        api()?.wr_masked_fetch_add,
        "xiwdv_wr_atomic_masked_fetch_add",
    )?;
    // SAFETY: the caller's contract.
    unsafe { f(qpx, rkey, remote_addr, add, boundary_mask) };
    Ok(())
}

/// `xiwdv_wr_atomic_masked_cmp_swp`: RFC 7306 masked CmpSwap: if
/// `(original ^ compare) & compare_mask == 0` the word becomes
/// `(original & !swap_mask) | (swap & swap_mask)`. The original comes back as
/// for [`wr_atomic_masked_fetch_add`].
///
/// # Safety
/// As for [`wr_atomic_masked_fetch_add`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn wr_atomic_masked_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    compare_mask: u64,
    swap: u64,
    swap_mask: u64,
) -> Result<(), Error> {
    let f = need(api()?.wr_masked_cmp_swp, "xiwdv_wr_atomic_masked_cmp_swp")?;
    // SAFETY: the caller's contract.
    unsafe {
        f(
            qpx,
            rkey,
            remote_addr,
            compare,
            compare_mask,
            swap,
            swap_mask,
        )
    };
    Ok(())
}

/// `xiwdv_wr_atomic_swap`: unconditional swap (a CmpSwap whose compare mask
/// is zero); the original comes back as for [`wr_atomic_masked_fetch_add`].
///
/// # Safety
/// As for [`wr_atomic_masked_fetch_add`].
pub unsafe fn wr_atomic_swap(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    swap: u64,
) -> Result<(), Error> {
    let f = need(api()?.wr_swap, "xiwdv_wr_atomic_swap")?;
    // SAFETY: the caller's contract.
    unsafe { f(qpx, rkey, remote_addr, swap) };
    Ok(())
}

#[cfg(test)]
mod tests;
