//! The verbs surface: every `extern "C"` entry libibverbs calls.
//!
//! Each entry checks its pointers, converts, calls safe Rust and maps errors to
//! errno; a panic is caught here and never crosses into C.

use parking_lot::{Condvar, Mutex};
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::mem::{size_of, ManuallyDrop};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use xiw_abi::driver::*;
use xiw_abi::ring::{wqe_flag, Cqe, SendWqe, Sge};
use xiw_abi::verbs::*;
use xiw_engine::send::{AtomicOp, WindowBind};

use crate::context::Shared;
use crate::cq::Cq;
use crate::error::Error;
use crate::mem;
use crate::mem::NEED_NONE;
use crate::qp::core::QpCore;
use crate::qp::{Caps, InlineBytes, Qp, SendBody, SgeList};
use crate::srq::Srq;
use crate::sysfs_tree;
use crate::wqe;

pub use xiw_abi::limits::{
    MAX_CQE, MAX_MR, MAX_MSG_SZ, MAX_PD, MAX_QP, MAX_SRQ, VENDOR_ID, VENDOR_PART_ID,
};
/// Completion vectors a context reports: one (a CQ's comp_vector must be 0).
pub const COMP_VECTORS: i32 = 1;

pub(crate) fn set_errno(e: i32) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`, turning a panic into `on_panic` (and EIO in errno).
pub(crate) fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        on_panic
    })
}

/// Points the caller's `bad_wr` at the WR that was refused.
fn report_bad<T>(bad: *mut *mut T, wrs: &[*mut T], i: usize, first: *mut T) {
    if !bad.is_null() {
        // SAFETY: `bad` is the caller's out pointer for the failing WR.
        unsafe { *bad = wrs.get(i).copied().unwrap_or(first) };
    }
}

/// Returns null with errno set.
fn null_err<T>(e: i32) -> *mut T {
    set_errno(e);
    ptr::null_mut()
}

/// A device context: libibverbs' `verbs_context` of whichever release is
/// loaded (that of rdma-core 44, behind room for what later releases put in
/// front of it), then xiw's own.
#[repr(C)]
pub struct XiwContext {
    pub front: ContextFront,
    pub vctx: verbs_context,
    pub sh: *const Shared,
    pub progress: *mut std::thread::JoinHandle<()>,
}

impl XiwContext {
    /// The context `ctx` belongs to: `ibv_context` is the last member of
    /// `verbs_context` in every release, so it sits at one place in ours.
    ///
    /// # Safety
    /// `ctx` is a context this provider allocated.
    pub unsafe fn of(ctx: *mut ibv_context) -> *mut XiwContext {
        let at =
            std::mem::offset_of!(XiwContext, vctx) + std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract, `ctx` is that far into an XiwContext.
        unsafe { (ctx as *mut u8).sub(at) as *mut XiwContext }
    }

    /// Where the `verbs_context` of release `l` starts in the context at
    /// `this` (the pointer libibverbs knows it by).
    pub fn release_vctx(this: *mut XiwContext, l: &Layout) -> *mut verbs_context {
        let at = std::mem::offset_of!(XiwContext, vctx) - l.context_front();
        this.cast::<u8>().wrapping_add(at).cast()
    }
}

#[repr(C)]
pub struct XiwPd {
    pub ibv: ibv_pd,
    /// The protection domain (a parent domain has its PD's).
    pub id: u32,
    /// A parent domain's PD; null for a plain PD.
    pub parent: *mut ibv_pd,
    /// A parent domain's thread domain, if any.
    pub td: *mut XiwTd,
    /// Parent domains made on this PD: it may not go before them.
    pub children: AtomicU32,
    /// A parent domain's objects (QPs, MRs, SRQs, CQs) made through it: it
    /// may not go before them either (a plain PD's are counted by its id).
    pub uses: AtomicU32,
    /// Kernel mode: the handle of the kernel's PD (a parent domain's PD's).
    pub kernel: Option<u32>,
}

/// Counts an object made (`up`) or destroyed through `pd`, if `pd` is a
/// parent domain (see [`XiwPd::uses`]).
///
/// # Safety
/// `pd` is null or a live PD of this provider.
unsafe fn domain_use(pd: *mut ibv_pd, up: bool) {
    if pd.is_null() {
        return;
    }
    // SAFETY: as the caller promises.
    let p = unsafe { pd_of(pd) };
    if p.parent.is_null() {
        return;
    }
    if up {
        p.uses.fetch_add(1, Ordering::AcqRel);
    } else {
        p.uses.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A thread domain (`ibv_alloc_td`).
#[repr(C)]
pub struct XiwTd {
    pub ibv: ibv_td,
    /// Parent domains that name it.
    pub users: AtomicU32,
}

#[repr(C)]
pub struct XiwMr {
    pub vmr: verbs_mr,
    /// The device memory it is registered on (`ibv_reg_dm_mr`), if any.
    pub dm: *mut XiwDm,
    /// Kernel mode: the handle of the kernel's object for it.
    pub kernel: Option<u32>,
}

#[repr(C)]
pub struct XiwCq {
    pub vcq: verbs_cq,
    pub cq: Arc<Cq>,
    /// Extended polling: the completion `start_poll`/`next_poll` is looking at.
    cur: UnsafeCell<Option<Cqe>>,
    /// Extended polling: the events held back while `start_poll` did the
    /// data-path work, raised at `end_poll` if completions are left.
    held: UnsafeCell<crate::cq::HeldEvent>,
    wc_flags: u64,
    /// The parent domain named at creation (`IBV_CQ_INIT_ATTR_MASK_PD`), or null.
    domain: *mut ibv_pd,
}

#[repr(C)]
pub struct XiwQp {
    pub vqp: verbs_qp,
    pub qp: Arc<Qp>,
    /// `ibv_wr_start` .. `ibv_wr_complete`/`ibv_wr_abort`: a per-QP critical
    /// section (ibv_wr_post(3), CONCURRENCY) and the batch built inside it.
    section: Mutex<Section>,
    section_free: Condvar,
    /// Kernel mode: the handle of the kernel's QP.
    kernel: Option<u32>,
}

#[repr(C)]
pub struct XiwSrq {
    pub vsrq: verbs_srq,
    pub srq: Arc<Srq>,
    /// Kernel mode: the handle of the kernel's SRQ.
    pub kernel: Option<u32>,
}

/// # Safety
/// `ctx` is a context this provider allocated.
pub(crate) unsafe fn shared<'a>(ctx: *mut ibv_context) -> &'a Shared {
    // SAFETY: per the contract; `sh` is set before the context is handed out.
    unsafe { &*(*XiwContext::of(ctx)).sh }
}

unsafe fn pd_of<'a>(pd: *mut ibv_pd) -> &'a XiwPd {
    // SAFETY: every ibv_pd handed out is the first member of an XiwPd.
    unsafe { &*(pd as *mut XiwPd) }
}

unsafe fn qp_of<'a>(qp: *mut ibv_qp) -> &'a XiwQp {
    // SAFETY: every ibv_qp handed out is the first member of an XiwQp.
    unsafe { &*(qp as *mut XiwQp) }
}

unsafe fn cq_of<'a>(cq: *mut ibv_cq) -> &'a XiwCq {
    // SAFETY: every ibv_cq (and ibv_cq_ex) handed out is the first member of an XiwCq.
    unsafe { &*(cq as *mut XiwCq) }
}

unsafe fn srq_of<'a>(srq: *mut ibv_srq) -> &'a XiwSrq {
    // SAFETY: every ibv_srq handed out is the first member of an XiwSrq.
    unsafe { &*(srq as *mut XiwSrq) }
}

/// A verbs object that async events name, with the counter
/// `ibv_ack_async_event` raises under the object's mutex.
trait EventTarget {
    /// # Safety
    /// `obj` is a live object of this provider.
    unsafe fn acks(obj: *mut Self) -> crate::async_event::Acks;
}

macro_rules! event_target {
    ($ty:ty, $counter:ident) => {
        impl EventTarget for $ty {
            unsafe fn acks(obj: *mut Self) -> crate::async_event::Acks {
                // SAFETY: per the caller: the fields of a live object.
                unsafe {
                    crate::async_event::Acks {
                        mutex: &mut (*obj).mutex as *mut _ as *mut libc::pthread_mutex_t,
                        cond: &mut (*obj).cond as *mut _ as *mut libc::pthread_cond_t,
                        completed: &(*obj).$counter,
                    }
                }
            }
        }
    };
}
event_target!(ibv_qp, events_completed);
event_target!(ibv_cq, async_events_completed);
event_target!(ibv_srq, events_completed);

/// Drops `obj`'s unread async events and waits until the application has
/// acknowledged every one it read (ibv_get_async_event(3)), before it is
/// freed; in kernel mode, the `kernel` events the kernel reported for it
/// (its destroy's answer) too.
///
/// # Safety
/// `obj` is a live object of this provider's context `sh`.
unsafe fn retire_events<T: EventTarget>(sh: &Shared, obj: *mut T, kernel: u32) {
    let read = sh.async_events.queue.retire(obj as u64);
    // SAFETY: per the caller.
    unsafe { T::acks(obj).wait(read + kernel) }
}

/// The application's SGE list as the rings hold it.
///
/// # Safety
/// `list` is null or points at `n` SGEs.
unsafe fn sge_list(list: *const ibv_sge, n: usize) -> SgeList {
    // SAFETY: per the caller.
    SgeList::from_slice(unsafe { sges(list, n) })
}

// `ibv_sge` and the rings' `Sge` are the same C struct.
const _: () = {
    assert!(std::mem::size_of::<ibv_sge>() == std::mem::size_of::<Sge>());
    assert!(std::mem::align_of::<ibv_sge>() == std::mem::align_of::<Sge>());
    assert!(std::mem::offset_of!(ibv_sge, addr) == std::mem::offset_of!(Sge, addr));
    assert!(std::mem::offset_of!(ibv_sge, length) == std::mem::offset_of!(Sge, length));
    assert!(std::mem::offset_of!(ibv_sge, lkey) == std::mem::offset_of!(Sge, lkey));
};

/// The caller's SGE list as the rings' SGEs, without copying: empty when
/// `n` is 0 or `list` is null.
///
/// # Safety
/// `list` is null or points at `n` SGEs that outlive `'a`.
unsafe fn sges<'a>(list: *const ibv_sge, n: usize) -> &'a [Sge] {
    if n == 0 || list.is_null() {
        return &[];
    }
    // SAFETY: per the caller, and the layouts are the same (checked above).
    unsafe { std::slice::from_raw_parts(list as *const Sge, n) }
}

mod cq;
mod device;
mod dm;
mod mr;
mod mw;
mod qp;
mod srq;
mod wr;

use cq::*;
use device::*;
use dm::*;
use mr::*;
use mw::*;
use qp::*;
use srq::*;
use wr::*;

pub use device::device_attr;
pub(crate) use mr::register_mr;
pub(crate) use wr::{begin_dv, fail_batch, flush_flags};

/// The ops table handed to libibverbs; entries left out answer EOPNOTSUPP.
pub fn ops() -> verbs_context_ops {
    verbs_context_ops {
        advise_mr: Some(advise_mr),
        alloc_dm: Some(alloc_dm),
        alloc_mw: Some(alloc_mw),
        alloc_pd: Some(alloc_pd),
        bind_mw: Some(bind_mw),
        dealloc_mw: Some(dealloc_mw),
        free_dm: Some(free_dm),
        reg_dm_mr: Some(reg_dm_mr),
        async_event: Some(async_event),
        create_cq: Some(create_cq),
        create_cq_ex: Some(create_cq_ex),
        create_qp: Some(create_qp),
        create_qp_ex: Some(create_qp_ex),
        create_srq: Some(create_srq),
        create_srq_ex: Some(create_srq_ex),
        dealloc_pd: Some(dealloc_pd),
        dereg_mr: Some(dereg_mr),
        destroy_cq: Some(destroy_cq),
        destroy_qp: Some(destroy_qp),
        destroy_srq: Some(destroy_srq),
        modify_qp: Some(modify_qp),
        modify_srq: Some(modify_srq),
        poll_cq: Some(poll_cq),
        post_recv: Some(post_recv),
        post_send: Some(post_send),
        post_srq_recv: Some(post_srq_recv),
        query_device_ex: Some(query_device_ex),
        query_port: Some(query_port),
        query_qp: Some(query_qp),
        query_srq: Some(query_srq),
        reg_mr: Some(reg_mr),
        rereg_mr: Some(rereg_mr),
        resize_cq: Some(resize_cq),
        alloc_parent_domain: Some(alloc_parent_domain),
        alloc_td: Some(alloc_td),
        dealloc_td: Some(dealloc_td),
        req_notify_cq: Some(req_notify_cq),
        ..verbs_context_ops::EMPTY
    }
}
