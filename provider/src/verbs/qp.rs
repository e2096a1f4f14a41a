//! Queue pairs: creation, state, posting.

use super::*;
use crate::wqe::Payload;

pub const SEND_OPS: u64 = (IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW) as u64;

/// `IBV_QP_EX_WITH_FLUSH` (rdma-core 45+), and xiw's own Verify and masked atomics (xiwdv.h).
pub const QP_EX_WITH_FLUSH: u64 = 1 << 11;
pub const QP_EX_WITH_VERIFY: u64 = 1 << 32;
pub const QP_EX_WITH_MASKED_ATOMICS: u64 = 1 << 33;

/// What RFC 7306 and the commit draft add to the builders.
pub const SEND_OPS_EXT: u64 = (IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_ATOMIC_WRITE) as u64
    | QP_EX_WITH_FLUSH
    | QP_EX_WITH_VERIFY
    | QP_EX_WITH_MASKED_ATOMICS;

pub(super) fn new_qp(
    ctx: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
) -> Result<*mut ibv_qp, Error> {
    // SAFETY: ctx is ours.
    let sh_ref = unsafe { shared(ctx) };
    check_init_attr(sh_ref, a)?;
    // SAFETY: pd, CQs and SRQ pointers come from this provider.
    let (p, scq, rcq) = unsafe { (pd_of(a.pd), cq_of(a.send_cq), cq_of(a.recv_cq)) };
    let srq = if a.srq.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { srq_of(a.srq) }.srq.clone())
    };
    let caps = clamp_caps(&a.cap, srq.is_some());
    // SAFETY: ctx is ours.
    let sh = unsafe { counted_shared(ctx) };
    let q = Qp::new(
        QpCore::new(
            sh.clone(),
            p.id,
            scq.cq.clone(),
            rcq.cq.clone(),
            srq,
            caps,
            a.sq_sig_all != 0,
        )
        .map_err(|e| Error::ring(&e))?,
    );
    report_caps(&mut a.cap, &q, &caps);
    let q = Arc::new(q);
    q.send_cq.attach(&q);
    if !Arc::ptr_eq(&q.send_cq, &q.recv_cq) {
        q.recv_cq.attach(&q);
    }
    let v = verbs_qp_of(ctx, a, q.qpn, sh_ref.cfg.extensions);
    let b = boxed_qp(v, q.clone());
    // Kernel mode: the kernel's QP, under the provider's number (what the
    // connection manager finds it by), made of the kernel's PD, CQs and SRQ.
    if let Some(k) = sh.kernel {
        // SAFETY: b is fresh, not yet handed out; a's PD, CQs and SRQ are ours.
        unsafe { kernel_qp(k, b, a, &q, &sh) }?;
    }
    q.handle.store(b as usize, Ordering::Release);
    sh.qps.insert(q.qpn, q);
    // SAFETY: the caller's PD, checked to be ours above.
    unsafe { domain_use(a.pd, true) };
    Ok(b as *mut ibv_qp)
}

/// Checks a QP's creation attributes: an RC QP, only the attributes and
/// send operations the device has, its PD and CQs named, its capabilities
/// within the device's.
fn check_init_attr(sh: &Shared, a: &ibv_qp_init_attr_ex) -> Result<(), Error> {
    if a.qp_type != IBV_QPT_RC {
        crate::log::debug(
            &sh.log,
            format_args!("create_qp: only RC queue pairs exist on iWARP"),
        );
        return Err(Error::unsupported("only RC queue pairs exist on iWARP"));
    }
    let known =
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if a.comp_mask & !known != 0 {
        return Err(Error::unsupported("unknown bits in comp_mask"));
    }
    // No creation flag is supported; naming none is fine.
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        return Err(Error::unsupported("no creation flag is supported"));
    }
    let ops = if sh.cfg.extensions {
        SEND_OPS | SEND_OPS_EXT
    } else {
        SEND_OPS
    };
    if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags & !ops != 0 {
        return Err(Error::unsupported("send operations this device lacks"));
    }
    if a.pd.is_null() || a.send_cq.is_null() || a.recv_cq.is_null() {
        return Err(Error::invalid("no PD, send CQ or receive CQ"));
    }
    let c = &a.cap;
    if c.max_send_wr > crate::qp::MAX_QP_WR
        || c.max_recv_wr > crate::qp::MAX_QP_WR
        || c.max_send_sge > crate::qp::MAX_SGE
        || c.max_recv_sge > crate::qp::MAX_SGE
        || c.max_inline_data > crate::qp::MAX_INLINE
    {
        return Err(Error::invalid("the QP's capabilities exceed the device's"));
    }
    Ok(())
}

/// The rings' sizes for the capabilities asked for: at least one of each,
/// no receive queue with an SRQ, and as much inline data as the send
/// queue's stride holds.
fn clamp_caps(c: &ibv_qp_cap, with_srq: bool) -> Caps {
    let max_send_sge = c.max_send_sge.max(1);
    let stride = xiw_abi::ring::send_stride(max_send_sge, c.max_inline_data);
    let max_inline = (stride - size_of::<SendWqe>() as u32).min(crate::qp::MAX_INLINE);
    Caps {
        max_send_wr: c.max_send_wr.max(1),
        max_recv_wr: if with_srq { 0 } else { c.max_recv_wr.max(1) },
        max_send_sge,
        max_recv_sge: if with_srq { 0 } else { c.max_recv_sge.max(1) },
        max_inline,
    }
}

/// Tells the caller the capabilities the QP has.
fn report_caps(c: &mut ibv_qp_cap, q: &Qp, caps: &Caps) {
    c.max_send_wr = q.sq.entries.min(crate::qp::MAX_QP_WR);
    c.max_recv_wr = q.rq.as_ref().map(|r| r.entries).unwrap_or(0);
    c.max_send_sge = caps.max_send_sge;
    c.max_recv_sge = caps.max_recv_sge;
    c.max_inline_data = caps.max_inline;
}

/// A counted handle on the context's shared state, for a QP to hold.
///
/// # Safety
/// `ctx` is a context of ours.
unsafe fn counted_shared(ctx: *mut ibv_context) -> Arc<Shared> {
    // SAFETY: the context outlives its QPs; we only need a counted handle.
    let raw = unsafe { (*XiwContext::of(ctx)).sh };
    // SAFETY: `sh` came from Arc::into_raw in alloc_context and is still alive.
    unsafe {
        Arc::increment_strong_count(raw);
        Arc::from_raw(raw)
    }
}

/// libibverbs' view of the new QP: its objects, its number, and the
/// builders of the extended post-send API this device has.
fn verbs_qp_of(
    ctx: *mut ibv_context,
    a: &ibv_qp_init_attr_ex,
    qpn: u32,
    extensions: bool,
) -> verbs_qp {
    // SAFETY: verbs_qp is plain data; all-zero is a valid starting value.
    let mut v: verbs_qp = unsafe { std::mem::zeroed() };
    {
        // SAFETY: writing the ibv_qp_ex view of a zeroed union.
        let ex = unsafe { &mut *v.u.qp_ex };
        let b = &mut ex.qp_base;
        b.context = ctx;
        b.qp_context = a.qp_context;
        b.pd = a.pd;
        b.send_cq = a.send_cq;
        b.recv_cq = a.recv_cq;
        b.srq = a.srq;
        b.handle = qpn;
        b.qp_num = qpn;
        // libibverbs' own view of a new QP, as for every provider; the QP
        // itself is INIT (see QpCore::new), which ibv_query_qp reports.
        b.state = IBV_QPS_RESET;
        b.qp_type = IBV_QPT_RC;
        ex.wr_start = Some(wr_start);
        ex.wr_complete = Some(wr_complete);
        ex.wr_abort = Some(wr_abort);
        ex.wr_send = Some(wr_send);
        ex.wr_send_inv = Some(wr_send_inv);
        ex.wr_rdma_write = Some(wr_rdma_write);
        ex.wr_rdma_read = Some(wr_rdma_read);
        ex.wr_local_inv = Some(wr_local_inv);
        ex.wr_bind_mw = Some(wr_bind_mw);
        if extensions {
            ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
            ex.wr_send_imm = Some(wr_send_imm);
            ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
            ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
            ex.wr_atomic_write = Some(wr_atomic_write);
        }
        ex.wr_set_sge = Some(wr_set_sge);
        ex.wr_set_sge_list = Some(wr_set_sge_list);
        ex.wr_set_inline_data = Some(wr_set_inline_data);
        ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    }
    // `ibv_wr_flush` is the commit draft's Flush where libibverbs has it
    // (rdma-core 45 and later), as xiwdv_wr_flush is.
    let flush: Option<WrFlush> = extensions.then_some(wr_flush);
    crate::rdma_core::layout().set_qp_tail(&mut v, VERBS_QP_EX, flush);
    v
}

/// The QP as handed out, on the heap, its pthread objects initialised.
fn boxed_qp(v: verbs_qp, q: Arc<Qp>) -> *mut XiwQp {
    let b = Box::into_raw(Box::new(XiwQp {
        vqp: v,
        qp: q,
        section: Mutex::new(Section::default()),
        section_free: Condvar::new(),
        kernel: None,
    }));
    // SAFETY: b is fresh; its pthread objects are initialised before anyone uses them.
    unsafe {
        let base = &mut (*(*b).vqp.u.qp_ex).qp_base;
        libc::pthread_mutex_init(
            &mut base.mutex as *mut _ as *mut libc::pthread_mutex_t,
            ptr::null(),
        );
        libc::pthread_cond_init(
            &mut base.cond as *mut _ as *mut libc::pthread_cond_t,
            ptr::null(),
        );
    }
    b
}

/// Makes the kernel's QP for `b` and records its handle (and its slot in the
/// module's events page, where there is one). If that fails, `b` is freed.
///
/// # Safety
/// `b` is fresh from `boxed_qp`, not yet handed out; `a`'s PD, CQs and SRQ
/// are ours.
unsafe fn kernel_qp(
    k: crate::kernel::Kernel,
    b: *mut XiwQp,
    a: &ibv_qp_init_attr_ex,
    q: &Qp,
    sh: &Shared,
) -> Result<(), Error> {
    // SAFETY: the caller's PD and CQs, checked to be ours.
    let (p, scq, rcq) = unsafe { (pd_of(a.pd), cq_of(a.send_cq), cq_of(a.recv_cq)) };
    // SAFETY: the caller's SRQ, checked to be ours above.
    let srq_k = (!a.srq.is_null()).then(|| unsafe { srq_of(a.srq) }.kernel);
    let objects = (|| {
        Some(crate::kernel::QpObjects {
            pd: p.kernel?,
            send_cq: scq.cq.kernel_handle()?,
            recv_cq: rcq.cq.kernel_handle()?,
            srq: match srq_k {
                Some(h) => Some(h?),
                None => None,
            },
            caps: a.cap,
            sq_sig_all: a.sq_sig_all != 0,
        })
    })();
    let made = match objects {
        Some(o) => k.create_qp(b as u64, o, q.qpn),
        None => Err(Error::invalid(
            "the PD, a CQ or the SRQ has no kernel object",
        )),
    };
    match made {
        // SAFETY: b is fresh, not yet handed out.
        Ok((h, slot)) => {
            // SAFETY: as above.
            unsafe {
                (*b).kernel = Some(h);
                (*(*b).vqp.u.qp_ex).qp_base.handle = h;
            }
            let _ = q.kernel.set(h);
            if let (Some(s), Some(_)) = (slot, &sh.kernel_events.page) {
                let _ = q.ev_slot.set(s);
                sh.kernel_events.register_slot(s, q.qpn);
            }
            Ok(())
        }
        Err(e) => {
            // SAFETY: b is fresh, not yet handed out; freed once, here.
            drop(unsafe { Box::from_raw(b) });
            Err(e)
        }
    }
}

pub(super) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        if pd.is_null() || attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: caller's struct.
        let a = unsafe { &mut *attr };
        let mut ex = ibv_qp_init_attr_ex {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
            comp_mask: IBV_QP_INIT_ATTR_PD,
            pd,
            ..Default::default()
        };
        // SAFETY: pd is ours.
        match new_qp(unsafe { (*pd).context }, &mut ex) {
            Ok(q) => {
                a.cap = ex.cap;
                q
            }
            Err(e) => null_err(e.errno()),
        }
    })
}

pub(super) unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        if attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: caller's struct.
        match new_qp(ctx, unsafe { &mut *attr }) {
            Ok(q) => q,
            Err(e) => null_err(e.errno()),
        }
    })
}

pub(super) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> i32 {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours.
        let (x, sh) = unsafe { (qp_of(qp), shared((*qp).context)) };
        let mut kernel_events = 0;
        if let (Some(k), Some(h)) = (sh.kernel, x.kernel) {
            match k.destroy_qp(h) {
                Ok(n) => kernel_events = n,
                Err(e) => return e.errno(),
            }
        }
        // SAFETY: the QP's PD, as create_qp recorded it.
        unsafe { domain_use((*qp).pd, false) };
        let q = &x.qp;
        q.destroyed.store(true, Ordering::Release);
        q.handle.store(0, Ordering::Release);
        // SAFETY: ours, and freed only below.
        unsafe { retire_events(sh, qp, kernel_events) };
        // Let the last bytes go out: hand whatever is still staged to the socket
        // once more, then close the stream gracefully.
        q.kick();
        q.detach_stream();
        q.lock_cm().close(sh);
        sh.qps.remove(q.qpn);
        if let Some(&s) = q.ev_slot.get() {
            sh.kernel_events.unregister_slot(s);
        }
        // The progress thread (an event, a timer) or the media worker may still
        // hold the QP for a moment. Its CQs, SRQ and PD are busy until the QP is
        // gone, so drop it here, once this is the last reference (try_unwrap
        // takes it atomically, so no timer can pick it up in between).
        // SAFETY: allocated by new_qp with Box; handed back once.
        let XiwQp { qp: mut q, .. } = *unsafe { Box::from_raw(qp as *mut XiwQp) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match Arc::try_unwrap(q) {
                Ok(last) => {
                    drop(last);
                    break;
                }
                Err(still) if std::time::Instant::now() < deadline => {
                    q = still;
                    std::thread::yield_now();
                }
                Err(_) => break,
            }
        }
        0
    })
}

pub(super) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: i32,
) -> i32 {
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours / caller's.
        let (x, a) = unsafe { (qp_of(qp), &*attr) };
        match crate::qp::state::modify(&x.qp, a, mask as u32) {
            Ok(state) => {
                // SAFETY: our ibv_qp; the state field mirrors the QP's.
                unsafe { (*qp).state = state };
                // Kernel mode: the kernel's QP follows (`rdma resource`); the
                // provider's QP is what carries the state.
                if mask as u32 & IBV_QP_STATE != 0 {
                    x.qp.mirror_state(state);
                }
                0
            }
            Err(e) => e.errno(),
        }
    })
}

pub(super) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: i32,
    init: *mut ibv_qp_init_attr,
) -> i32 {
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() || init.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours / caller's.
        let (x, base) = unsafe { (qp_of(qp), &*qp) };
        let q = &x.qp;
        let at = *q.attrs.lock();
        let cap = ibv_qp_cap {
            max_send_wr: q.sq.entries.min(crate::qp::MAX_QP_WR),
            max_recv_wr: q.rq.as_ref().map(|r| r.entries).unwrap_or(0),
            max_send_sge: q.caps.max_send_sge,
            max_recv_sge: q.caps.max_recv_sge,
            max_inline_data: q.caps.max_inline,
        };
        let state = q.state();
        // SAFETY: caller's structs.
        unsafe {
            *attr = ibv_qp_attr {
                qp_state: state,
                cur_qp_state: state,
                path_mtu: at.path_mtu,
                path_mig_state: IBV_MIG_MIGRATED,
                qkey: 0,
                rq_psn: at.rq_psn,
                sq_psn: at.sq_psn,
                dest_qp_num: at.dest_qp_num,
                qp_access_flags: at.qp_access_flags,
                cap,
                ah_attr: at.ah_attr,
                pkey_index: at.pkey_index,
                en_sqd_async_notify: 0,
                sq_draining: 0,
                max_rd_atomic: at.max_rd_atomic,
                max_dest_rd_atomic: at.max_dest_rd_atomic,
                min_rnr_timer: at.min_rnr_timer,
                port_num: at.port_num,
                timeout: at.timeout,
                retry_cnt: at.retry_cnt,
                rnr_retry: at.rnr_retry,
                ..Default::default()
            };
            *init = ibv_qp_init_attr {
                qp_context: base.qp_context,
                send_cq: base.send_cq,
                recv_cq: base.recv_cq,
                srq: base.srq,
                cap,
                qp_type: IBV_QPT_RC,
                sq_sig_all: q.sq_sig_all as i32,
            };
        }
        0
    })
}

/// The WQE of a Send, Send with Invalidate or RDMA Write (the requests
/// [`post_now`] may frame at once); None for another opcode.
///
/// # Safety
/// `w` is a valid WR.
#[inline]
unsafe fn data_wqe(w: &ibv_send_wr) -> Option<SendWqe> {
    // SAFETY: reading the union member that matches the opcode.
    unsafe {
        match w.opcode {
            IBV_WR_SEND => Some(wqe::send(w.wr_id)),
            IBV_WR_SEND_WITH_INV => {
                Some(wqe::send_inv(w.wr_id, w.__bindgen_anon_1.invalidate_rkey))
            }
            IBV_WR_RDMA_WRITE => Some(wqe::write(w.wr_id, w.wr.rdma.rkey, w.wr.rdma.remote_addr)),
            _ => None,
        }
    }
}

/// Converts one `ibv_send_wr` into a WQE, checking it against the QP's limits.
pub(super) unsafe fn send_wqe(q: &Qp, w: &ibv_send_wr) -> Result<(SendWqe, SendBody), Error> {
    let n = w.num_sge.max(0) as usize;
    if n > q.caps.max_send_sge as usize {
        return Err(Error::invalid("more SGEs than the QP takes"));
    }
    // SAFETY: the WR names `num_sge` SGEs at `sg_list`.
    let sges = unsafe { sges(w.sg_list, n) };
    let ext = q.sh.cfg.extensions;
    let id = w.wr_id;
    // SAFETY: the caller's valid WR.
    let wqe = match unsafe { data_wqe(w) } {
        Some(wqe) => wqe,
        // SAFETY: reading the union member that matches the opcode.
        None => unsafe {
            match w.opcode {
                IBV_WR_RDMA_READ => wqe::read(id, w.wr.rdma.rkey, w.wr.rdma.remote_addr),
                IBV_WR_LOCAL_INV => wqe::local_inv(id, w.__bindgen_anon_1.invalidate_rkey),
                IBV_WR_BIND_MW => {
                    let b = &w.__bindgen_anon_2.bind_mw;
                    // Only a type 2 window is bound by a work request.
                    let bind = window_bind(b.mw, IBV_MW_TYPE_2, b.rkey, &b.bind_info)?;
                    wqe::bind_mw(id, &bind)
                }
                IBV_WR_RDMA_WRITE_WITH_IMM if ext => wqe::write_imm(
                    id,
                    w.wr.rdma.rkey,
                    w.wr.rdma.remote_addr,
                    w.__bindgen_anon_1.imm_data,
                ),
                IBV_WR_SEND_WITH_IMM if ext => wqe::send_imm(id, w.__bindgen_anon_1.imm_data),
                IBV_WR_ATOMIC_FETCH_AND_ADD if ext => {
                    let a = &w.wr.atomic;
                    let add = a.compare_add;
                    wqe::atomic(id, a.rkey, a.remote_addr, AtomicOp::FetchAdd { add })
                }
                IBV_WR_ATOMIC_CMP_AND_SWP if ext => {
                    let a = &w.wr.atomic;
                    let (compare, swap) = (a.compare_add, a.swap);
                    wqe::atomic(
                        id,
                        a.rkey,
                        a.remote_addr,
                        AtomicOp::CmpSwap { compare, swap },
                    )
                }
                IBV_WR_ATOMIC_WRITE if ext => {
                    // The 8 bytes come from the SGE list and are taken now, as inline data is.
                    let total: u64 = sges.iter().map(|s| s.length as u64).sum();
                    if total != 8 {
                        return Err(Error::invalid("an Atomic Write carries 8 bytes"));
                    }
                    let mut data = Vec::with_capacity(8);
                    for s in sges.iter().filter(|s| s.length > 0) {
                        q.sh.mrs
                            .read(
                                s.lkey,
                                q.by(),
                                s.addr,
                                s.length as usize,
                                NEED_NONE,
                                &mut data,
                            )
                            .map_err(|_| {
                                Error::invalid("the Atomic Write's bytes cannot be read")
                            })?;
                    }
                    let value = u64::from_ne_bytes(data[..8].try_into().expect("8 bytes"));
                    let wqe = wqe::atomic_write(id, w.wr.rdma.rkey, w.wr.rdma.remote_addr, value);
                    return finish_wqe(q, wqe, w.send_flags & !IBV_SEND_INLINE, SgeList::new());
                }
                _ => return Err(Error::invalid("an opcode this QP does not post")),
            }
        },
    };
    finish_wqe(q, wqe, w.send_flags, SgeList::from_slice(sges))
}

/// The bytes an SGE of inline data names (no lkey applies).
///
/// # Safety
/// Inline data is read from the caller's buffers at post time, as the verbs
/// contract says: `s` names `length` readable bytes at `addr`.
unsafe fn inline_bytes<'a>(s: &Sge) -> &'a [u8] {
    if s.length == 0 {
        return &[];
    }
    // SAFETY: per the function contract.
    unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) }
}

/// Applies send flags and builds the body (inline bytes are copied now).
pub(super) fn finish_wqe(
    q: &Qp,
    mut wqe: SendWqe,
    flags: u32,
    sges: SgeList,
) -> Result<(SendWqe, SendBody), Error> {
    let total: u64 = sges.iter().map(|s| s.length as u64).sum();
    if total > MAX_MSG_SZ as u64 {
        return Err(Error::invalid("longer than the largest message"));
    }
    wqe.length = total as u32;
    let inline = flags & IBV_SEND_INLINE != 0;
    let payload = wqe::payload(wqe.opcode);
    match payload {
        // The original value comes back into exactly one 64-bit buffer.
        Payload::Original if total != 8 || inline => {
            return Err(Error::invalid(
                "an atomic's original value comes back into one 8-byte buffer",
            ))
        }
        Payload::Empty if total != 0 => {
            return Err(Error::invalid(
                "a Flush or Atomic Write names no local memory",
            ))
        }
        Payload::Hash if inline => return Err(Error::invalid("a Verify carries no inline data")),
        _ => {}
    }
    wqe.flags |= wqe::flags(flags);
    if inline && payload == Payload::Data {
        if total > q.caps.max_inline as u64 {
            return Err(Error::invalid("more inline data than the QP takes"));
        }
        let mut bytes = InlineBytes::with_capacity(total as usize);
        for s in &sges {
            // SAFETY: the caller's buffers, as posting inline data names them.
            bytes.extend_from_slice(unsafe { inline_bytes(s) });
        }
        wqe.flags |= wqe_flag::INLINE;
        return Ok((wqe, SendBody::Inline(bytes)));
    }
    wqe.num_sge = sges.len() as u8;
    Ok((wqe, SendBody::Sges(sges)))
}

/// Posts `w`, a lone Send or RDMA Write of at most `XIW_POST_NOW_MAX` bytes, through
/// [`Qp::post_now`]; false if it does not qualify or is refused (the usual
/// path then posts it, or reports what is wrong with it).
///
/// # Safety
/// `w` is a valid WR (its SGE list and, for inline data, its buffers).
unsafe fn post_now(q: &Qp, w: &ibv_send_wr) -> bool {
    let n = w.num_sge.max(0) as usize;
    if n > q.caps.max_send_sge as usize || (n > 0 && w.sg_list.is_null()) {
        return false;
    }
    // SAFETY: per the function contract.
    let Some(mut wqe) = (unsafe { data_wqe(w) }) else {
        return false;
    };
    // SAFETY: the WR names `num_sge` SGEs at `sg_list`.
    let sges = unsafe { sges(w.sg_list, n) };
    let total: u64 = match sges {
        [s] => u64::from(s.length),
        _ => sges.iter().map(|s| u64::from(s.length)).sum(),
    };
    let inline = w.send_flags & IBV_SEND_INLINE != 0;
    if total > q.sh.cfg.post_now_max || (inline && total > u64::from(q.caps.max_inline)) {
        return false;
    }
    wqe.length = total as u32;
    wqe.flags = wqe::flags(w.send_flags);
    let Some(op) = wqe::now_op(&wqe) else {
        return false;
    };
    q.post_now(wqe, op, |out| {
        if inline {
            let mut at = 0;
            for s in sges {
                // SAFETY: the caller's buffers, as posting inline data names them.
                let src = unsafe { inline_bytes(s) };
                out[at..at + src.len()].copy_from_slice(src);
                at += src.len();
            }
            return Ok(());
        }
        if let [s] = sges {
            return q.sh.mrs.read_into(s.lkey, q.by(), s.addr, out);
        }
        let parts = sges.iter().map(|s| (s.lkey, s.addr, s.length as usize));
        q.sh.mrs.gather(q.by(), parts, out).map(|_| ())
    })
}

pub(super) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> i32 {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours.
        let x = unsafe { qp_of(qp) };
        // SAFETY: the caller's WR list.
        if !wr.is_null() && unsafe { (*wr).next.is_null() && post_now(&x.qp, &*wr) } {
            return 0;
        }
        // SAFETY: the caller's WR list and out pointer.
        unsafe { post_send_ring(&x.qp, wr, bad) }
    })
}

/// `ibv_post_send` of a list, or of a request [`post_now`] left: the WQEs go
/// through the send queue ring. Kept out of line, so that the single small
/// request's path stays short.
///
/// # Safety
/// `wr` is the caller's WR list, `bad` its out pointer.
#[inline(never)]
unsafe fn post_send_ring(qp: &Qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> i32 {
    let mut wrs: smallvec::SmallVec<[*mut ibv_send_wr; 8]> = smallvec::SmallVec::new();
    let mut cur = wr;
    while !cur.is_null() {
        wrs.push(cur);
        // SAFETY: caller's linked list.
        cur = unsafe { (*cur).next };
    }
    // SAFETY: each pointer is a valid WR from the caller's list.
    let mut it = wrs.iter().map(|&w| unsafe { send_wqe(qp, &*w) });
    match qp.post_send(&mut it) {
        Ok(()) => 0,
        Err((i, e)) => {
            crate::log::debug(
                &qp.sh.log,
                format_args!("qp {}: post_send refused WR {i}: errno {e}", qp.qpn),
            );
            report_bad(bad, &wrs, i, wr);
            e
        }
    }
}

pub(super) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> i32 {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours.
        let x = unsafe { qp_of(qp) };
        // SAFETY: the caller's WR list.
        let r = match unsafe { wr.as_ref() } {
            // The usual repost: one WR with one SGE.
            Some(w) if w.next.is_null() && w.num_sge == 1 && !w.sg_list.is_null() => {
                // SAFETY: the WR names one SGE at `sg_list`.
                let sge = unsafe { sges(w.sg_list, 1) };
                x.qp.post_recv(std::iter::once((w.wr_id, sge)))
            }
            // SAFETY: as above.
            _ => x.qp.post_recv(unsafe { recv_list(wr) }),
        };
        match r {
            Ok(()) => 0,
            Err((i, e)) => {
                // SAFETY: as above.
                unsafe { report_bad_recv(bad, wr, i) };
                e
            }
        }
    })
}
