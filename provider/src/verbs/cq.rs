//! Completion queues: creation, and polling through `ibv_poll_cq` and the
//! extended `ibv_cq_ex` interface.

use super::*;

/// A CQ size the device takes (1 to `max_cqe`).
fn cqe_in_range(cqe: i32) -> bool {
    (1..=MAX_CQE as i64).contains(&i64::from(cqe))
}

pub(super) fn new_cq(
    ctx: *mut ibv_context,
    cqe: i32,
    channel: *mut ibv_comp_channel,
    vector: i64,
    wc_flags: u64,
) -> Result<*mut XiwCq, Error> {
    // SAFETY: ctx is ours.
    let sh = unsafe { shared(ctx) };
    if !cqe_in_range(cqe) {
        return Err(Error::invalid("the CQ size is out of range"));
    }
    if !(0..i64::from(COMP_VECTORS)).contains(&vector) {
        return Err(Error::invalid("the completion vector is out of range"));
    }
    if !channel.is_null() && sh.kernel.is_none() {
        crate::log::warn(
            &sh.log,
            format_args!("completion channels need the xiw kernel module"),
        );
        return Err(Error::unsupported(
            "completion channels need the xiw kernel module",
        ));
    }
    let id = sh.next_id();
    let cq = Arc::new(Cq::new(id, cqe as u32, sh.kernel).map_err(|e| Error::ring(&e))?);
    // SAFETY: ibv_cq_ex is plain data (pointers, integers, pthread objects, function
    // pointers); all-zero is a valid starting value.
    let mut ex: ibv_cq_ex = unsafe { std::mem::zeroed() };
    ex.context = ctx;
    ex.handle = id;
    ex.cqe = cq.capacity() as i32;
    let b = Box::new(XiwCq {
        vcq: verbs_cq {
            cq_ex: ManuallyDrop::new(ex),
        },
        cq,
        cur: UnsafeCell::new(None),
        held: UnsafeCell::new(Default::default()),
        wc_flags,
        domain: ptr::null_mut(),
    });
    let p = Box::into_raw(b);
    // Kernel mode: the kernel's object, which carries the completion channel;
    // its events name the CQ by the pointer the application holds.
    if let Some(k) = sh.kernel {
        // SAFETY: a channel libibverbs made on this context.
        let ch = (!channel.is_null()).then(|| unsafe { (*channel).fd });
        match k.create_cq(p as u64, cqe as u32, ch, vector as u32) {
            // SAFETY: p is the CQ just made, not yet handed out.
            Ok(h) => unsafe {
                (*p).cq.set_kernel(k, h, sh.cfg.kernel_events);
                (*(*p).vcq.cq_ex).handle = h;
            },
            Err(e) => {
                // SAFETY: as above; freed once, here.
                drop(unsafe { Box::from_raw(p) });
                return Err(e);
            }
        }
    }
    sh.async_events.set_handle(id, p as usize);
    Ok(p)
}

pub(super) unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: i32,
    channel: *mut ibv_comp_channel,
    vector: i32,
) -> *mut ibv_cq {
    guard(ptr::null_mut(), || {
        match new_cq(ctx, cqe, channel, vector.into(), 0) {
            Ok(p) => p as *mut ibv_cq,
            Err(e) => null_err(e.errno()),
        }
    })
}

pub(super) const CQ_EX_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

pub(super) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(ptr::null_mut(), || {
        if attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: the caller passes a valid attribute struct.
        let a = unsafe { &*attr };
        if a.wc_flags & !CQ_EX_FLAGS != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        // A CQ may name the parent domain whose allocators it would use (xiw
        // does not call them: see alloc_parent_domain); a plain PD is wrong.
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            let pd = a.parent_domain;
            // SAFETY: a PD of this context, if the caller names one.
            if pd.is_null()
                || unsafe { (*pd).context } != ctx
                || unsafe { pd_of(pd) }.parent.is_null()
            {
                return null_err(libc::EINVAL);
            }
        }
        let cqe = i32::try_from(a.cqe).unwrap_or(i32::MAX);
        match new_cq(ctx, cqe, a.channel, a.comp_vector.into(), a.wc_flags) {
            Ok(p) => {
                if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
                    // SAFETY: p was just made; the parent domain was checked above.
                    unsafe {
                        (*p).domain = a.parent_domain;
                        domain_use(a.parent_domain, true);
                    }
                }
                // SAFETY: p was just allocated; we are its only user.
                let ex = unsafe { &mut *(*p).vcq.cq_ex };
                ex.start_poll = Some(cq_start_poll);
                ex.next_poll = Some(cq_next_poll);
                ex.end_poll = Some(cq_end_poll);
                ex.read_opcode = Some(cq_read_opcode);
                ex.read_vendor_err = Some(cq_read_vendor_err);
                ex.read_byte_len = Some(cq_read_byte_len);
                ex.read_imm_data = Some(cq_read_imm_data);
                ex.read_qp_num = Some(cq_read_qp_num);
                ex.read_src_qp = Some(cq_read_src_qp);
                ex.read_wc_flags = Some(cq_read_wc_flags);
                ex.read_slid = Some(cq_read_zero_u32);
                ex.read_sl = Some(cq_read_zero_u8);
                ex.read_dlid_path_bits = Some(cq_read_zero_u8);
                p as *mut ibv_cq_ex
            }
            Err(e) => null_err(e.errno()),
        }
    })
}

/// `ibv_resize_cq`: room for at least `cqe` completions, keeping those not
/// yet polled; `cq->cqe` becomes the new capacity. EINVAL for a size out of
/// range or below the completions waiting.
pub(super) unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: i32) -> i32 {
    guard(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        if !cqe_in_range(cqe) {
            return libc::EINVAL;
        }
        // SAFETY: cq is ours.
        let c = unsafe { cq_of(cq) };
        match c.cq.resize(cqe as u32) {
            Ok(()) => {
                // SAFETY: cq is ours; libibverbs reads cqe, the provider keeps it.
                unsafe { (*cq).cqe = c.cq.capacity() as i32 };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

pub(super) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> i32 {
    guard(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: cq is ours.
        let (c, sh) = unsafe { (cq_of(cq), shared((*cq).context)) };
        if Arc::strong_count(&c.cq) > 1 {
            return libc::EBUSY;
        }
        let mut kernel_async = 0;
        if let (Some(k), Some(h)) = (sh.kernel, c.cq.kernel_handle()) {
            match k.destroy_cq(h) {
                Ok((comp, async_events)) => {
                    // The completion events the kernel delivered must be
                    // acknowledged first, as ibv_destroy_cq(3) says.
                    // SAFETY: cq is ours; libibverbs set up its counters.
                    unsafe {
                        crate::async_event::Acks {
                            mutex: ptr::addr_of_mut!((*cq).mutex) as *mut libc::pthread_mutex_t,
                            cond: ptr::addr_of_mut!((*cq).cond) as *mut libc::pthread_cond_t,
                            completed: ptr::addr_of!((*cq).comp_events_completed),
                        }
                        .wait(comp)
                    };
                    kernel_async = async_events;
                }
                Err(e) => return e.errno(),
            }
        }
        sh.async_events.set_handle(c.cq.id, 0);
        // SAFETY: the parent domain the CQ named, if any, outlives it.
        unsafe { domain_use(c.domain, false) };
        // SAFETY: ours, and freed only below.
        unsafe { retire_events(sh, cq, kernel_async) };
        // SAFETY: allocated by new_cq with Box; handed back once.
        drop(unsafe { Box::from_raw(cq as *mut XiwCq) });
        0
    })
}

pub(super) fn fill_wc(wc: &mut ibv_wc, c: &Cqe) {
    wc.wr_id = c.wr_id;
    wc.status = c.status as ibv_wc_status;
    wc.opcode = c.opcode as ibv_wc_opcode;
    wc.vendor_err = c.vendor_err;
    wc.byte_len = c.byte_len;
    wc.__bindgen_anon_1.imm_data = c.imm_or_inv;
    wc.qp_num = c.qp_num;
    wc.src_qp = 0;
    wc.wc_flags = u32::from(c.wc_flags & !xiw_abi::ring::CQE_F_SOLICITED);
    wc.pkey_index = 0;
    wc.slid = 0;
    wc.sl = 0;
    wc.dlid_path_bits = 0;
}

pub(super) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
    guard(-1, || {
        if cq.is_null() || n < 0 || (wc.is_null() && n > 0) {
            return -1;
        }
        // SAFETY: cq is ours.
        let c = unsafe { cq_of(cq) };
        let poll = || {
            c.cq.poll(n as usize, |i, cqe| {
                // SAFETY: the caller provides room for `n` completions; i < n.
                fill_wc(unsafe { &mut *wc.add(i) }, cqe)
            })
        };
        match poll() {
            0 if n > 0 => {
                // What this thread stores now, this poll returns: its
                // events wait for the poll's end (`Polling`).
                let _polling = crate::cq::Polling::begin(&c.cq);
                let collected = c.cq.assist();
                match poll() {
                    0 => {
                        let (got, held) = c.cq.poll_owed(collected, poll);
                        c.cq.raise_held(held);
                        got as i32
                    }
                    got => got as i32,
                }
            }
            got => got as i32,
        }
    })
}

pub(super) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited: i32) -> i32 {
    guard(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: cq is ours.
        let c = unsafe { cq_of(cq) };
        let arm = if solicited != 0 {
            xiw_abi::ring::CQ_ARM_SOLICITED
        } else {
            xiw_abi::ring::CQ_ARM_NEXT
        };
        c.cq.settle_owed();
        c.cq.app_waits();
        c.cq.arm(arm);
        0
    })
}

pub(super) unsafe fn cq_ex<'a>(cq: *mut ibv_cq_ex) -> &'a XiwCq {
    // SAFETY: every ibv_cq_ex handed out is the first member of an XiwCq.
    unsafe { &*(cq as *mut XiwCq) }
}

/// Loads the completion at the head into `cur` and the public fields; ENOENT if none.
pub(super) unsafe fn cq_load(cq: *mut ibv_cq_ex, c: &XiwCq) -> i32 {
    let head = c.cq.head();
    // SAFETY: `cur` is only touched between start_poll and end_poll, under the consumer lock.
    unsafe { *c.cur.get() = head };
    match head {
        Some(cqe) => {
            // SAFETY: cq is ours and exclusively polled under the consumer lock.
            unsafe {
                (*cq).wr_id = cqe.wr_id;
                (*cq).status = cqe.status as ibv_wc_status;
            }
            0
        }
        None => libc::ENOENT,
    }
}

pub(super) unsafe extern "C" fn cq_start_poll(
    cq: *mut ibv_cq_ex,
    _attr: *mut ibv_poll_cq_attr,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: cq is ours.
        let c = unsafe { cq_ex(cq) };
        // As poll_cq: an empty CQ lets this thread do a QP's data-path work,
        // then looks again, and waits a while for a completion whose event
        // the module raised already. The events of what this thread stores
        // meanwhile wait for end_poll, which consumes what it returns.
        let load = || {
            c.cq.lock_consumer();
            // SAFETY: lock held.
            let r = unsafe { cq_load(cq, c) };
            if r == libc::ENOENT {
                // No end_poll follows an empty start_poll.
                // SAFETY: we took the lock just above.
                unsafe { c.cq.unlock_consumer() };
            }
            r
        };
        match load() {
            libc::ENOENT => {
                let polling = crate::cq::Polling::begin(&c.cq);
                let collected = c.cq.assist();
                let mut r = load();
                let mut held = crate::cq::HeldEvent::default();
                if r == libc::ENOENT {
                    let (_, h) = c.cq.poll_owed(collected, || {
                        r = load();
                        usize::from(r == 0)
                    });
                    held = h;
                }
                held = held | polling.finish();
                if r == 0 {
                    // SAFETY: the consumer lock is held until end_poll.
                    unsafe { *c.held.get() = held };
                } else {
                    c.cq.raise_held(held);
                }
                r
            }
            r => r,
        }
    })
}

pub(super) unsafe extern "C" fn cq_next_poll(cq: *mut ibv_cq_ex) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: cq is ours; start_poll took the consumer lock.
        let c = unsafe { cq_ex(cq) };
        // SAFETY: as above.
        if unsafe { (*c.cur.get()).is_some() } {
            c.cq.advance();
        }
        // SAFETY: as above.
        unsafe { cq_load(cq, c) }
    })
}

pub(super) unsafe extern "C" fn cq_end_poll(cq: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: cq is ours; start_poll took the consumer lock.
        let c = unsafe { cq_ex(cq) };
        // SAFETY: as above.
        if unsafe { (*c.cur.get()).take().is_some() } {
            c.cq.advance();
        }
        // SAFETY: as above.
        let held = std::mem::take(unsafe { &mut *c.held.get() });
        // SAFETY: start_poll took the lock.
        unsafe { c.cq.unlock_consumer() };
        c.cq.raise_held(held);
    })
}

pub(super) fn cur_cqe(cq: *mut ibv_cq_ex) -> Cqe {
    // SAFETY: read accessors run between start_poll and end_poll on our CQ.
    unsafe { (*cq_ex(cq).cur.get()).unwrap_or_default() }
}

pub(super) unsafe extern "C" fn cq_read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    cur_cqe(cq).opcode as ibv_wc_opcode
}
pub(super) unsafe extern "C" fn cq_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).vendor_err
}
pub(super) unsafe extern "C" fn cq_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).byte_len
}
pub(super) unsafe extern "C" fn cq_read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).imm_or_inv
}
pub(super) unsafe extern "C" fn cq_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).qp_num
}
pub(super) unsafe extern "C" fn cq_read_src_qp(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
pub(super) unsafe extern "C" fn cq_read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    u32::from(cur_cqe(cq).wc_flags & !xiw_abi::ring::CQE_F_SOLICITED)
}
pub(super) unsafe extern "C" fn cq_read_zero_u32(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
pub(super) unsafe extern "C" fn cq_read_zero_u8(_cq: *mut ibv_cq_ex) -> u8 {
    0
}
