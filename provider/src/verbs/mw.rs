//! Memory windows (RFC 5040 section 2.1; verbs types 1 and 2): allocated
//! in a protection domain, bound to part of a region by a work request on a
//! QP of that domain, carried out in send queue order. Type 1 is bound with
//! `ibv_bind_mw` (each bind gives it a new key; length 0 unbinds it); type 2
//! with an `IBV_WR_BIND_MW` work request naming its new key, and it serves
//! only the QP it was bound through until it is invalidated (Local
//! Invalidate, or the peer's Send with Invalidate on that QP).

use super::*;

/// A memory window handed to the application.
#[repr(C)]
pub struct XiwMw {
    pub ibv: ibv_mw,
}

pub(super) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, kind: ibv_mw_type) -> *mut ibv_mw {
    guard(ptr::null_mut(), || {
        if pd.is_null() {
            return null_err(libc::EINVAL);
        }
        if kind != IBV_MW_TYPE_1 && kind != IBV_MW_TYPE_2 {
            return null_err(libc::EINVAL);
        }
        // SAFETY: pd is ours.
        let (p, ctx) = unsafe { (pd_of(pd), (*pd).context) };
        // SAFETY: as above.
        let sh = unsafe { shared(ctx) };
        let stag = sh.mrs.alloc_window(p.id, kind as u8);
        // SAFETY: as above.
        unsafe { domain_use(pd, true) };
        Box::into_raw(Box::new(XiwMw {
            ibv: ibv_mw {
                context: ctx,
                pd,
                rkey: stag,
                handle: stag >> 8,
                type_: kind,
            },
        })) as *mut ibv_mw
    })
}

pub(super) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> i32 {
    guard(libc::EIO, || {
        if mw.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: mw is ours.
        let (ctx, pd, index) = unsafe { ((*mw).context, (*mw).pd, (*mw).handle) };
        // SAFETY: as above.
        let sh = unsafe { shared(ctx) };
        if !sh.mrs.free_window(index) {
            return libc::EINVAL;
        }
        // SAFETY: the window's PD, still alive (it cannot go while it has windows).
        unsafe { domain_use(pd, false) };
        // SAFETY: allocated by alloc_mw with Box; handed back once.
        drop(unsafe { Box::from_raw(mw as *mut XiwMw) });
        0
    })
}

/// The bind of `mw` under its new key `rkey` to what `info` names.
/// `EINVAL` for a window of another device or type than `kind`, a key of
/// another window, rights a window cannot grant, or a region missing for a
/// range.
///
/// # Safety
/// `mw` is null or a window of this provider; `info.mr` is null or an MR.
pub(crate) unsafe fn window_bind(
    mw: *mut ibv_mw,
    kind: ibv_mw_type,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<WindowBind, Error> {
    if mw.is_null() {
        return Err(Error::invalid("no memory window"));
    }
    // SAFETY: per the contract.
    let (index, t) = unsafe { ((*mw).handle, (*mw).type_) };
    let rights = IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_ZERO_BASED;
    // Local write is no right of a window's (its region's decides); it is
    // accepted and dropped, as other providers do.
    let access = info.mw_access_flags & !IBV_ACCESS_LOCAL_WRITE;
    if t != kind {
        return Err(Error::invalid(
            "the window is not of the type this bind takes",
        ));
    }
    if rkey >> 8 != index {
        return Err(Error::invalid("the key is another window's"));
    }
    if access & !rights != 0 {
        return Err(Error::invalid("rights a window cannot grant"));
    }
    let lkey = if info.mr.is_null() {
        if info.length != 0 {
            return Err(Error::invalid("a range to bind names no region"));
        }
        0
    } else {
        // SAFETY: per the contract.
        unsafe { (*info.mr).lkey }
    };
    Ok(WindowBind {
        stag: rkey,
        kind: kind as u8,
        mr: lkey,
        to: info.addr,
        len: info.length,
        access,
    })
}

/// `ibv_bind_mw` (type 1): the window gets a new key, bound in send queue
/// order; the bind completes with `IBV_WC_BIND_MW` if signaled.
pub(super) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> i32 {
    guard(libc::EIO, || {
        if qp.is_null() || mw.is_null() || bind.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours, and the caller's bind request.
        let (x, b, old) = unsafe { (qp_of(qp), &*bind, (*mw).rkey) };
        let rkey = old & !0xff | (old.wrapping_add(1) & 0xff);
        // SAFETY: mw is ours; the bind names an MR or none.
        let bind = match unsafe { window_bind(mw, IBV_MW_TYPE_1, rkey, &b.bind_info) } {
            Ok(bind) => bind,
            Err(e) => return e.errno(),
        };
        let mut wqe = wqe::bind_mw(b.wr_id, &bind);
        wqe.flags = wqe::flags(b.send_flags);
        let mut one = std::iter::once(Ok((wqe, SendBody::Sges(SgeList::new()))));
        match x.qp.post_send(&mut one) {
            Ok(()) => {
                // SAFETY: mw is ours; the new key is the window's from now on.
                unsafe { (*mw).rkey = rkey };
                0
            }
            Err((_, e)) => e,
        }
    })
}
