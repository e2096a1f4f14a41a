//! Protection domains and memory registration.

use super::*;

pub(super) unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard(ptr::null_mut(), || {
        if ctx.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: ctx is ours.
        let sh = unsafe { shared(ctx) };
        let id = sh.next_id();
        let pd = Box::new(XiwPd {
            ibv: ibv_pd {
                context: ctx,
                handle: id,
            },
            id,
        });
        Box::into_raw(pd) as *mut ibv_pd
    })
}

pub(super) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> i32 {
    guard(libc::EIO, || {
        if pd.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: pd is ours.
        let (p, sh) = unsafe { (pd_of(pd), shared((*pd).context)) };
        let id = p.id;
        let (mrs, qps) = (sh.mrs.count_for_pd(id), sh.pd_has_qps(id));
        if mrs > 0 || qps {
            crate::log::debug(
                &sh.log,
                format_args!("dealloc_pd: still in use ({mrs} MRs, QPs: {qps})"),
            );
            return libc::EBUSY;
        }
        // SAFETY: allocated by alloc_pd with Box; the application hands it back once.
        drop(unsafe { Box::from_raw(pd as *mut XiwPd) });
        0
    })
}

pub(super) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: i32,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller's arguments, as libibverbs passes them.
        match unsafe { register_mr(pd, addr, len, iova, access as u32, None) } {
            Ok(mr) => mr,
            Err((e, _)) => null_err(e),
        }
    })
}

/// Registers memory, with a Verify hash for the direct verbs' registration.
/// On failure: the errno and why (also logged).
///
/// # Safety
/// `pd` is null or one of this provider's protection domains.
pub(crate) unsafe fn register_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
    hash: Option<crate::persist::Hash>,
) -> Result<*mut ibv_mr, (i32, String)> {
    if pd.is_null() {
        return Err((libc::EINVAL, "no protection domain".into()));
    }
    // SAFETY: pd is ours.
    let (p, ctx) = unsafe { (pd_of(pd), (*pd).context) };
    // SAFETY: as above.
    let sh = unsafe { shared(ctx) };
    let refuse = |e: i32, why: String| {
        crate::log::debug(&sh.log, format_args!("reg_mr: {why}"));
        Err((e, why))
    };
    // Bits from IBV_ACCESS_OPTIONAL_FIRST up may be ignored by a provider.
    let access = access & (IBV_ACCESS_OPTIONAL_FIRST - 1);
    if access & !mem::SUPPORTED_ACCESS != 0 {
        return refuse(
            libc::EOPNOTSUPP,
            format!("unsupported access flags {access:#x}"),
        );
    }
    let wants_write = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    if access & wants_write != 0 && access & IBV_ACCESS_LOCAL_WRITE == 0 {
        return refuse(
            libc::EINVAL,
            "remote write or atomic access needs local write access".into(),
        );
    }
    if (addr.is_null() && len > 0) || (addr as u64).checked_add(len as u64).is_none() {
        return refuse(libc::EINVAL, format!("bad range {addr:p}+{len}"));
    }
    let writable = access & (IBV_ACCESS_LOCAL_WRITE | wants_write) != 0;
    if len > 0 && !mapped(addr as u64, len as u64, writable) {
        return refuse(
            libc::EFAULT,
            format!("{addr:p}+{len} is not mapped with the needed protection"),
        );
    }
    let ext = match mr_ext(sh, addr as u64, len as u64, access, hash) {
        Ok(ext) => ext,
        Err((e, why)) => return refuse(e, why),
    };
    let internal = if hash.is_some() {
        access | mem::ACCESS_VERIFY
    } else {
        access
    };
    let stag = sh
        .mrs
        .register_ext(p.id, addr as u64, len as u64, iova, internal, ext);
    let mr = Box::new(XiwMr {
        vmr: verbs_mr {
            ibv_mr: ibv_mr {
                context: ctx,
                pd,
                addr,
                length: len,
                handle: stag,
                lkey: stag,
                rkey: stag,
            },
            mr_type: IBV_MR_TYPE_MR,
            access: access as i32,
        },
    });
    Ok(Box::into_raw(mr) as *mut ibv_mr)
}

/// The flush/verify attributes of a new MR: the medium behind it, found now,
/// for flush-to-persistence and Verify (draft-talpey-rdma-commit section 2.4:
/// memory that cannot be made durable is refused at registration).
pub(super) fn mr_ext(
    sh: &Shared,
    addr: u64,
    len: u64,
    access: u32,
    hash: Option<crate::persist::Hash>,
) -> Result<Option<Box<mem::MrExt>>, (i32, String)> {
    let flush = access & (mem::ACCESS_FLUSH_GLOBAL | mem::ACCESS_FLUSH_PERSISTENT);
    if (flush != 0 || hash.is_some()) && !sh.cfg.extensions {
        return Err((
            libc::EOPNOTSUPP,
            "flushable and verifiable memory need the extensions (XIW_EXTENSIONS=0)".into(),
        ));
    }
    let persistent = access & mem::ACCESS_FLUSH_PERSISTENT != 0;
    if !(persistent || hash.is_some()) || len == 0 {
        return Ok(None);
    }
    let media = crate::persist::Media::probe(addr, len).map_err(|e| (libc::EINVAL, e))?;
    if let Some(why) = persistent.then(|| media.why_not_durable()).flatten() {
        return Err((
            libc::EINVAL,
            format!(
                "IBV_ACCESS_FLUSH_PERSISTENT: {why}; map a file on a persistent file system \
                 (MAP_SHARED) instead"
            ),
        ));
    }
    Ok(Some(Box::new(mem::MrExt { media, hash })))
}

/// True if `[addr, addr+len)` is mapped readable (and writable if asked), as
/// pinning would find it; later accesses rely on this.
pub(super) fn mapped(addr: u64, len: u64, writable: bool) -> bool {
    match crate::maps::read() {
        Ok(maps) => crate::maps::covered(&maps, addr, len, writable),
        // Without /proc the check cannot be made; the registration goes ahead.
        Err(_) => true,
    }
}

pub(super) unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> i32 {
    guard(libc::EIO, || {
        if vmr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: vmr is ours.
        let (stag, ctx) = unsafe { ((*vmr).ibv_mr.lkey, (*vmr).ibv_mr.context) };
        // SAFETY: as above.
        let sh = unsafe { shared(ctx) };
        sh.mrs.deregister(stag);
        // SAFETY: allocated by reg_mr with Box; handed back once.
        drop(unsafe { Box::from_raw(vmr as *mut XiwMr) });
        0
    })
}
