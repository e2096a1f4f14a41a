//! Device memory (`ibv_alloc_dm`): memory the device holds, which the
//! application reaches only through `ibv_memcpy_to_dm`/`_from_dm` and which
//! peers and work requests reach through a zero-based MR (`ibv_reg_dm_mr`).
//! xiw's device is its provider: device memory is pages the provider maps
//! for it, up to [`MAX_DM`] bytes per context. As on RNICs with on-chip
//! memory, copies take offsets and lengths in multiples of 4 bytes.

use super::*;

/// Device memory a context may hold.
pub const MAX_DM: u64 = 256 * 1024;
/// Alignment of device memory copies.
const DM_ALIGN: u64 = 4;

#[repr(C)]
pub struct XiwDm {
    pub ibv: ibv_dm,
    /// `len` bytes of zeroed, page-aligned memory of the provider's own.
    mem: *mut u8,
    len: u64,
    /// MRs registered on it.
    mrs: AtomicU32,
}

fn page() -> u64 {
    crate::sys::page_size()
}

pub(super) unsafe extern "C" fn alloc_dm(
    ctx: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    guard(ptr::null_mut(), || {
        if ctx.is_null() || attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        let len = a.length as u64;
        // Pages are the strictest alignment served.
        if a.comp_mask != 0
            || len == 0
            || 1u64
                .checked_shl(a.log_align_req)
                .is_none_or(|al| al > page())
        {
            return null_err(libc::EINVAL);
        }
        // SAFETY: ctx is ours.
        let sh = unsafe { shared(ctx) };
        if !sh.device_memory.reserve(len, MAX_DM) {
            return null_err(libc::ENOMEM);
        }
        let map = len.next_multiple_of(page()) as usize;
        let Ok(mem) = crate::sys::map_anonymous(map) else {
            sh.device_memory.release(len);
            return null_err(libc::ENOMEM);
        };
        Box::into_raw(Box::new(XiwDm {
            ibv: ibv_dm {
                context: ctx,
                memcpy_to_dm: Some(memcpy_to_dm),
                memcpy_from_dm: Some(memcpy_from_dm),
                comp_mask: 0,
                handle: sh.next_id(),
            },
            mem,
            len,
            mrs: AtomicU32::new(0),
        })) as *mut ibv_dm
    })
}

/// `ibv_free_dm`: `EBUSY` while MRs are registered on it.
pub(super) unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> i32 {
    guard(libc::EIO, || {
        if dm.is_null() {
            return libc::EINVAL;
        }
        let d = dm as *mut XiwDm;
        // SAFETY: ours.
        let (ctx, mem, len) = unsafe { ((*d).ibv.context, (*d).mem, (*d).len) };
        // SAFETY: as above.
        if unsafe { (*d).mrs.load(Ordering::Acquire) } > 0 {
            return libc::EBUSY;
        }
        // SAFETY: the mapping alloc_dm made, no longer reachable.
        let _ = unsafe { crate::sys::unmap(mem, len.next_multiple_of(page()) as usize) };
        // SAFETY: ctx is ours.
        unsafe { shared(ctx) }.device_memory.release(len);
        // SAFETY: allocated by alloc_dm; handed back once.
        drop(unsafe { Box::from_raw(d) });
        0
    })
}

/// The device memory of `dm` at `[off, off+len)`, if aligned and inside it.
///
/// # Safety
/// `dm` is null or a device memory of this provider.
unsafe fn dm_range(dm: *mut ibv_dm, off: u64, len: usize) -> Option<*mut u8> {
    if dm.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let d = unsafe { &*(dm as *mut XiwDm) };
    let len = len as u64;
    let end = off.checked_add(len)?;
    (off.is_multiple_of(DM_ALIGN) && len.is_multiple_of(DM_ALIGN) && end <= d.len)
        // SAFETY: inside the mapping.
        .then(|| unsafe { d.mem.add(off as usize) })
}

/// Copies `len` bytes between the caller's `host` and `[off, off+len)` of
/// `dm` (into the device memory if `to_dm`); 0 or `EINVAL`.
///
/// # Safety
/// `dm` is a device memory of this provider; `host` holds `len` bytes.
unsafe fn copy(dm: *mut ibv_dm, off: u64, host: *mut u8, len: usize, to_dm: bool) -> i32 {
    // SAFETY: per the contract.
    match unsafe { dm_range(dm, off, len) } {
        Some(at) if len == 0 || !host.is_null() => {
            let (src, dst) = if to_dm {
                (host as *const u8, at)
            } else {
                (at as *const u8, host)
            };
            // SAFETY: `len` bytes on each side: the caller's, and the range checked.
            unsafe { ptr::copy_nonoverlapping(src, dst, len) };
            0
        }
        _ => libc::EINVAL,
    }
}

unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    off: u64,
    host: *const libc::c_void,
    len: usize,
) -> i32 {
    // SAFETY: libibverbs passes our device memory and the caller's buffer.
    guard(libc::EIO, || unsafe {
        copy(dm, off, host as *mut u8, len, true)
    })
}

unsafe extern "C" fn memcpy_from_dm(
    host: *mut libc::c_void,
    dm: *mut ibv_dm,
    off: u64,
    len: usize,
) -> i32 {
    // SAFETY: as above.
    guard(libc::EIO, || unsafe {
        copy(dm, off, host.cast(), len, false)
    })
}

/// `ibv_reg_dm_mr`: a zero-based MR (`IBV_ACCESS_ZERO_BASED` is required)
/// over `[off, off+len)` of the device memory.
pub(super) unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    off: u64,
    len: usize,
    access: u32,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        if pd.is_null() || dm.is_null() || access & IBV_ACCESS_ZERO_BASED == 0 {
            return null_err(libc::EINVAL);
        }
        let d = dm as *mut XiwDm;
        // SAFETY: ours.
        let (mem, dlen) = unsafe { ((*d).mem, (*d).len) };
        if off.checked_add(len as u64).is_none_or(|end| end > dlen) {
            return null_err(libc::EINVAL);
        }
        // SAFETY: pd is ours; the range is inside the device memory.
        let r = unsafe {
            register_mr(
                pd,
                mem.add(off as usize).cast(),
                len,
                0,
                access & !IBV_ACCESS_ZERO_BASED,
                None,
            )
        };
        match r {
            Ok(mr) => {
                // SAFETY: the MR just made (an XiwMr) and the device memory.
                unsafe {
                    (*d).mrs.fetch_add(1, Ordering::AcqRel);
                    let x = mr as *mut XiwMr;
                    (*x).dm = d;
                    // Zero-based: the MR's addresses start at 0.
                    (*x).vmr.ibv_mr.addr = ptr::null_mut();
                }
                mr
            }
            Err(e) => null_err(e.errno()),
        }
    })
}

/// An MR on device memory `d` (or none) is gone.
///
/// # Safety
/// `d` is null or a live device memory of this provider.
pub(super) unsafe fn dm_released(d: *mut XiwDm) {
    if !d.is_null() {
        // SAFETY: per the contract.
        unsafe { (*d).mrs.fetch_sub(1, Ordering::AcqRel) };
    }
}
