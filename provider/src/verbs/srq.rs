//! Shared receive queues.

use super::*;

pub(super) fn new_srq(
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    attr: &mut ibv_srq_attr,
    srq_context: *mut c_void,
) -> Result<*mut ibv_srq, Error> {
    if pd.is_null() {
        return Err(Error::invalid("no protection domain"));
    }
    // SAFETY: ctx and pd are ours.
    let (sh, p) = unsafe { (shared(ctx), pd_of(pd)) };
    if attr.max_wr == 0 || attr.max_wr > crate::qp::MAX_QP_WR || attr.max_sge > crate::qp::MAX_SGE {
        return Err(Error::invalid(
            "the SRQ's size or SGE count is out of range",
        ));
    }
    let id = sh.next_id();
    let srq = Arc::new(
        Srq::new(id, p.id, attr.max_wr, attr.max_sge.max(1), sh.kernel)
            .map_err(|_| Error::NoMemory("the SRQ's ring cannot be had".into()))?,
    );
    srq.limit.store(attr.srq_limit, Ordering::Release);
    attr.max_wr = srq.capacity();
    attr.max_sge = srq.max_sge;
    // SAFETY: ibv_srq/verbs_srq are plain data; all-zero is a valid starting value.
    let mut v: verbs_srq = unsafe { std::mem::zeroed() };
    v.srq.context = ctx;
    v.srq.srq_context = srq_context;
    v.srq.pd = pd;
    v.srq.handle = id;
    v.srq_type = IBV_SRQT_BASIC;
    let (max_wr, max_sge) = (attr.max_wr, attr.max_sge);
    let b = Box::into_raw(Box::new(XiwSrq {
        vsrq: v,
        srq,
        kernel: None,
    }));
    // Kernel mode: the kernel's SRQ, which QPs on it name.
    if let (Some(k), Some(pd)) = (sh.kernel, p.kernel) {
        match k.create_srq(b as u64, pd, max_wr, max_sge) {
            // SAFETY: b is fresh, not yet handed out.
            Ok(h) => unsafe {
                (*b).kernel = Some(h);
                (*b).vsrq.srq.handle = h;
            },
            Err(e) => {
                // SAFETY: as above; freed once, here.
                drop(unsafe { Box::from_raw(b) });
                return Err(e);
            }
        }
    }
    // SAFETY: b is fresh; the pthread objects are initialised in place before use.
    unsafe {
        libc::pthread_mutex_init(
            &mut (*b).vsrq.srq.mutex as *mut _ as *mut libc::pthread_mutex_t,
            ptr::null(),
        );
        libc::pthread_cond_init(
            &mut (*b).vsrq.srq.cond as *mut _ as *mut libc::pthread_cond_t,
            ptr::null(),
        );
    }
    sh.async_events.set_handle(id, b as usize);
    // SAFETY: pd is ours.
    unsafe { domain_use(pd, true) };
    Ok(b as *mut ibv_srq)
}

pub(super) unsafe extern "C" fn create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(ptr::null_mut(), || {
        if pd.is_null() || attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: valid pointers from the caller.
        let (ctx, a) = unsafe { ((*pd).context, &mut *attr) };
        match new_srq(ctx, pd, &mut a.attr, a.srq_context) {
            Ok(p) => p,
            Err(e) => null_err(e.errno()),
        }
    })
}

pub(super) unsafe extern "C" fn create_srq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard(ptr::null_mut(), || {
        if attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: valid pointer from the caller.
        let a = unsafe { &mut *attr };
        let known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        if a.comp_mask & !known != 0 || a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != IBV_SRQT_BASIC {
            return null_err(libc::EOPNOTSUPP);
        }
        match new_srq(ctx, a.pd, &mut a.attr, a.srq_context) {
            Ok(p) => p,
            Err(e) => null_err(e.errno()),
        }
    })
}

pub(super) unsafe extern "C" fn modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: i32,
) -> i32 {
    guard(libc::EIO, || {
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours / caller's.
        let (s, a) = unsafe { (srq_of(srq), &*attr) };
        let mask = mask as u32;
        if mask & IBV_SRQ_MAX_WR != 0 {
            return libc::EOPNOTSUPP;
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            if a.srq_limit > s.srq.capacity() {
                return libc::EINVAL;
            }
            s.srq.limit.store(a.srq_limit, Ordering::Release);
        }
        0
    })
}

pub(super) unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> i32 {
    guard(libc::EIO, || {
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours / caller's.
        let s = unsafe { srq_of(srq) };
        // SAFETY: caller's struct.
        unsafe {
            *attr = ibv_srq_attr {
                max_wr: s.srq.capacity(),
                max_sge: s.srq.max_sge,
                srq_limit: s.srq.limit.load(Ordering::Acquire),
            }
        };
        0
    })
}

pub(super) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> i32 {
    guard(libc::EIO, || {
        if srq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours.
        let (s, sh) = unsafe { (srq_of(srq), shared((*srq).context)) };
        if Arc::strong_count(&s.srq) > 1 {
            return libc::EBUSY;
        }
        let mut kernel_events = 0;
        if let (Some(k), Some(h)) = (sh.kernel, s.kernel) {
            match k.destroy_srq(h) {
                Ok(n) => kernel_events = n,
                Err(e) => return e.errno(),
            }
        }
        sh.async_events.set_handle(s.srq.id, 0);
        // SAFETY: the SRQ's PD, as create_srq recorded it.
        unsafe { domain_use((*srq).pd, false) };
        // SAFETY: ours, and freed only below.
        unsafe { retire_events(sh, srq, kernel_events) };
        // SAFETY: allocated by new_srq with Box; handed back once.
        drop(unsafe { Box::from_raw(srq as *mut XiwSrq) });
        0
    })
}

pub(super) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> i32 {
    guard(libc::EIO, || {
        if srq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours.
        let s = unsafe { srq_of(srq) };
        // SAFETY: the caller's WR list.
        match s.srq.post(unsafe { recv_list(wr) }) {
            Ok(()) => 0,
            Err((i, e)) => {
                // SAFETY: as above.
                unsafe { report_bad_recv(bad, wr, i) };
                e.errno()
            }
        }
    })
}

/// The receive WRs of the caller's list `wr`, each as its wr_id and SGEs.
///
/// # Safety
/// `wr` is null or a valid linked list of WRs, each naming `num_sge` SGEs at
/// `sg_list`, which stay valid while the iterator is used.
pub(super) unsafe fn recv_list<'a>(
    mut wr: *mut ibv_recv_wr,
) -> impl Iterator<Item = (u64, &'a [Sge])> {
    std::iter::from_fn(move || {
        // SAFETY: per the function contract.
        let w = unsafe { wr.as_ref()? };
        wr = w.next;
        // More than any queue takes is refused whatever the count: only as
        // many as that are looked at.
        let n = (w.num_sge.max(0) as usize).min(crate::queue::MAX_SGE as usize + 1);
        // SAFETY: as above.
        Some((w.wr_id, unsafe { sges(w.sg_list, n) }))
    })
}

/// Points `bad` at WR `i` of the list `wr`.
///
/// # Safety
/// As for [`recv_list`], with at least `i + 1` WRs; `bad` is null or the
/// caller's out pointer.
pub(super) unsafe fn report_bad_recv(bad: *mut *mut ibv_recv_wr, wr: *mut ibv_recv_wr, i: usize) {
    let mut at = wr;
    for _ in 0..i {
        // SAFETY: per the function contract.
        at = unsafe { (*at).next };
    }
    if !bad.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *bad = at };
    }
}
