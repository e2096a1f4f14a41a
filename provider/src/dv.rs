//! The direct verbs of `xiwdv.h`: C entry points for what rdma-core 44's
//! verbs cannot express (RDMA Flush and Verify, masked and swap atomics,
//! flushable/verifiable registration). Each checks its pointers, converts and
//! hands over to the ordinary verbs machinery.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::ptr;

use xiw_abi::driver::verbs_device;
use xiw_abi::ring::SendWqe;
use xiw_abi::verbs::*;
use xiw_engine::send::AtomicOp;

use crate::error::Error;
use crate::persist::Hash;
use crate::verbs::{begin_dv, fail_batch, flush_flags, guard, set_errno, shared};
use crate::wqe;

/// `enum xiwdv_mr_attr_mask`.
const MR_ATTR_VERIFY_HASH: u64 = 1 << 0;
/// `enum xiwdv_device_caps`.
const CAP_ALL: u64 = 0x3f;

#[repr(C)]
pub struct XiwdvMrAttr {
    pub comp_mask: u64,
    pub verify_hash: u32,
    pub reserved: u32,
}

#[repr(C)]
pub struct XiwdvDeviceAttr {
    pub caps: u64,
    pub hashes: u32,
    pub max_hash_len: u32,
    pub reserved: [u64; 4],
}

thread_local! {
    /// Why this thread's last xiwdv call or registration failed.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `why` for xiwdv_last_error().
pub fn set_last_error(why: &str) {
    let c = CString::new(why.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

extern "C" {
    /// libibverbs' fork protection for a range (a no-op unless the
    /// application asked for it), as its own ibv_reg_mr does first.
    fn ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int;
    fn ibv_dofork_range(base: *mut c_void, size: usize) -> c_int;
}

/// True if `ctx` was opened by this provider.
///
/// # Safety
/// `ctx` is null or a live context from libibverbs.
unsafe fn ours(ctx: *mut ibv_context) -> bool {
    if ctx.is_null() {
        return false;
    }
    // SAFETY: a live context's device is a verbs_device (libibverbs allocates
    // every device through a provider's alloc_device), whose first member it is.
    unsafe {
        let dev = (*ctx).device as *const verbs_device;
        !dev.is_null() && (*dev).ops == crate::registration::device_ops()
    }
}

/// # Safety
/// `q` is null or a live `ibv_qp_ex`.
unsafe fn ours_qpx(q: *mut ibv_qp_ex) -> bool {
    // SAFETY: as the caller promises.
    !q.is_null() && unsafe { ours((*q).qp_base.context) }
}

/// # Safety
/// See xiwdv.h.
#[no_mangle]
pub unsafe extern "C" fn xiwdv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_uint,
    attr: *const XiwdvMrAttr,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller passes a live PD or null.
        if pd.is_null() || !unsafe { ours((*pd).context) } {
            set_last_error("xiwdv_reg_mr: the protection domain is not an xiw device's");
            set_errno(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        let mut hash = None;
        if !attr.is_null() {
            // SAFETY: the caller's attribute structure.
            let a = unsafe { &*attr };
            if a.comp_mask & !MR_ATTR_VERIFY_HASH != 0 {
                set_last_error("xiwdv_reg_mr: unknown bits in comp_mask");
                set_errno(libc::EINVAL);
                return ptr::null_mut();
            }
            if a.comp_mask & MR_ATTR_VERIFY_HASH != 0 && a.verify_hash != 0 {
                match Hash::from_id(a.verify_hash) {
                    Some(h) => hash = Some(h),
                    None => {
                        set_last_error(&format!(
                            "xiwdv_reg_mr: hash algorithm {} is not one xiw offers (CRC32c 1, SHA-256 2)",
                            a.verify_hash
                        ));
                        set_errno(libc::EINVAL);
                        return ptr::null_mut();
                    }
                }
            }
        }
        // SAFETY: the caller's range; libibverbs undoes this in ibv_dereg_mr.
        if unsafe { ibv_dontfork_range(addr, length) } != 0 {
            set_last_error("xiwdv_reg_mr: fork protection of the range failed");
            return ptr::null_mut();
        }
        // SAFETY: pd is a protection domain of this provider (checked above).
        match unsafe { crate::verbs::register_mr(pd, addr, length, addr as u64, access, hash) } {
            Ok(mr) => mr,
            Err(e) => {
                // SAFETY: undoing the call above on the same range.
                unsafe { ibv_dofork_range(addr, length) };
                set_last_error(&e.to_string());
                set_errno(e.errno());
                ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn xiwdv_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// # Safety
/// `ctx` is null or a live context.
#[no_mangle]
pub unsafe extern "C" fn xiwdv_is_xiw(ctx: *mut ibv_context) -> c_int {
    // SAFETY: as the caller promises.
    guard(0, || unsafe { ours(ctx) } as c_int)
}

/// # Safety
/// `ctx` is null or a live context; `attr` null or writable.
#[no_mangle]
pub unsafe extern "C" fn xiwdv_query_device(
    ctx: *mut ibv_context,
    attr: *mut XiwdvDeviceAttr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: as the caller promises.
        if attr.is_null() || !unsafe { ours(ctx) } {
            return if attr.is_null() {
                libc::EINVAL
            } else {
                libc::EOPNOTSUPP
            };
        }
        // SAFETY: ours.
        let sh = unsafe { shared(ctx) };
        let on = sh.cfg.extensions;
        let a = XiwdvDeviceAttr {
            caps: if on { CAP_ALL } else { 0 },
            hashes: if on {
                1 << Hash::Crc32c.id() | 1 << Hash::Sha256.id()
            } else {
                0
            },
            max_hash_len: if on { Hash::Sha256.len() as u32 } else { 0 },
            reserved: [0; 4],
        };
        // SAFETY: the caller's writable structure.
        unsafe { attr.write(a) };
        0
    })
}

/// Starts an xiw-only WR on `q` if it is xiw's, made by `make` from its
/// wr_id; `checked` is the verdict on the caller's arguments (an error makes
/// the next wr_complete fail, and `make` is not called).
///
/// # Safety
/// `q` is null or a live `ibv_qp_ex`.
unsafe fn start(
    q: *mut ibv_qp_ex,
    what: &str,
    checked: Result<(), Error>,
    make: impl FnOnce(u64) -> SendWqe,
) {
    // SAFETY: as the caller promises.
    if !unsafe { ours_qpx(q) } {
        set_last_error(&format!("{what}: not an xiw queue pair"));
        return;
    }
    match checked {
        Ok(()) => begin_dv(q, make),
        Err(e) => {
            set_last_error(&format!("{what}: {e}"));
            fail_batch(q, e);
        }
    }
}

/// # Safety
/// See xiwdv.h.
#[no_mangle]
pub unsafe extern "C" fn xiwdv_wr_flush(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    len: usize,
    kind: u8,
    level: u8,
) {
    guard((), || {
        let (checked, flags) = match flush_flags(len, kind, level) {
            Ok(f) => (Ok(()), f),
            Err(e) => (Err(e), 0),
        };
        // SAFETY: as the caller promises.
        unsafe {
            // `len` fits 32 bits when the arguments passed the check.
            start(q, "xiwdv_wr_flush", checked, |id| {
                wqe::flush(id, rkey, addr, len as u32, flags)
            })
        }
    })
}

/// # Safety
/// See xiwdv.h.
#[no_mangle]
pub unsafe extern "C" fn xiwdv_wr_verify(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    len: u32,
    expected: *const c_void,
    expected_len: usize,
) {
    guard((), || {
        let checked =
            if expected_len > wqe::VERIFY_MAX_HASH || (expected.is_null() && expected_len > 0) {
                Err(Error::invalid(
                    "expected hash longer than 32 bytes, or missing",
                ))
            } else {
                Ok(())
            };
        let hash: &[u8] = if checked.is_ok() && expected_len > 0 {
            // SAFETY: the caller passes `expected_len` readable bytes at `expected`.
            unsafe { std::slice::from_raw_parts(expected as *const u8, expected_len) }
        } else {
            &[]
        };
        // SAFETY: as the caller promises.
        unsafe {
            start(q, "xiwdv_wr_verify", checked, |id| {
                wqe::verify(id, rkey, addr, len, hash)
            })
        }
    })
}

/// # Safety
/// See xiwdv.h.
#[no_mangle]
pub unsafe extern "C" fn xiwdv_wr_atomic_masked_fetch_add(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    add: u64,
    boundary_mask: u64,
) {
    // SAFETY: as the caller promises.
    guard((), || unsafe {
        start(q, "xiwdv_wr_atomic_masked_fetch_add", Ok(()), |id| {
            let a = AtomicOp::MaskedFetchAdd {
                add,
                mask: boundary_mask,
            };
            wqe::atomic(id, rkey, addr, a)
        })
    })
}

/// # Safety
/// See xiwdv.h.
#[no_mangle]
pub unsafe extern "C" fn xiwdv_wr_atomic_masked_cmp_swp(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    compare_mask: u64,
    swap: u64,
    swap_mask: u64,
) {
    // SAFETY: as the caller promises.
    guard((), || unsafe {
        start(q, "xiwdv_wr_atomic_masked_cmp_swp", Ok(()), |id| {
            let a = AtomicOp::MaskedCmpSwap {
                compare,
                compare_mask,
                swap,
                swap_mask,
            };
            wqe::atomic(id, rkey, addr, a)
        })
    })
}

/// # Safety
/// See xiwdv.h.
#[no_mangle]
pub unsafe extern "C" fn xiwdv_wr_atomic_swap(q: *mut ibv_qp_ex, rkey: u32, addr: u64, swap: u64) {
    // SAFETY: as the caller promises.
    guard((), || unsafe {
        start(q, "xiwdv_wr_atomic_swap", Ok(()), |id| {
            wqe::atomic(id, rkey, addr, AtomicOp::Swap { swap })
        })
    })
}
