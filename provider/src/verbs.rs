//! The verbs surface: every `extern "C"` entry libibverbs calls.
//!
//! Each entry checks its pointers, converts, calls safe Rust and maps errors to
//! errno; a panic is caught here and never crosses into C.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::mem::{size_of, ManuallyDrop};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;

use xiw_abi::driver::*;
use xiw_abi::ring::{op, wqe_flag, Cqe, SendWqe, Sge};
use xiw_abi::verbs::*;

use crate::context::Shared;
use crate::cq::Cq;
use crate::devinfo;
use crate::mem;
use crate::mem::NEED_NONE;
use crate::qp::{self, Caps, Qp, RecvJob, SendBody};
use crate::srq::Srq;

pub const MAX_CQE: u32 = 1 << 20;
pub const MAX_QP: u32 = 16384;
pub const MAX_MR: u32 = 1 << 24;
pub const MAX_SRQ: u32 = 16384;
pub const MAX_PD: u32 = 65536;
pub const MAX_MSG_SZ: u32 = 1 << 31;
pub const VENDOR_ID: u32 = 0x787769; // "xwi"
pub const VENDOR_PART_ID: u32 = 1;

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

#[repr(C)]
pub struct XiwContext {
    pub vctx: verbs_context,
    pub sh: *const Shared,
    pub progress: *mut std::thread::JoinHandle<()>,
}

#[repr(C)]
pub struct XiwPd {
    pub ibv: ibv_pd,
    pub id: u32,
}

#[repr(C)]
pub struct XiwMr {
    pub vmr: verbs_mr,
}

#[repr(C)]
pub struct XiwCq {
    pub vcq: verbs_cq,
    pub cq: Arc<Cq>,
    /// Extended polling: the completion `start_poll`/`next_poll` is looking at.
    cur: UnsafeCell<Option<Cqe>>,
    wc_flags: u64,
}

#[repr(C)]
pub struct XiwQp {
    pub vqp: verbs_qp,
    pub qp: Arc<Qp>,
    /// `ibv_wr_start` .. `ibv_wr_complete`/`ibv_wr_abort`: a per-QP critical
    /// section (ibv_wr_post(3), CONCURRENCY) and the batch built inside it.
    section: Mutex<Section>,
    section_free: Condvar,
}

/// Who is between `wr_start` and `wr_complete`/`wr_abort`, and what they built.
#[derive(Default)]
struct Section {
    owner: Option<ThreadId>,
    batch: Batch,
}

thread_local! {
    static THREAD: ThreadId = std::thread::current().id();
}

fn this_thread() -> ThreadId {
    THREAD.with(|t| *t)
}

#[repr(C)]
pub struct XiwSrq {
    pub vsrq: verbs_srq,
    pub srq: Arc<Srq>,
}

#[derive(Default)]
struct Batch {
    items: Vec<(SendWqe, SendBody)>,
    /// The WR being built: its header and `ibv_send_flags`, waiting for a payload.
    pending: Option<(SendWqe, u32)>,
    err: i32,
}

impl Batch {
    fn seal(&mut self, q: &Qp, sges: Vec<Sge>, inline: bool) {
        let Some((wqe, flags)) = self.pending.take() else {
            return;
        };
        let flags = if inline {
            flags | IBV_SEND_INLINE
        } else {
            flags & !IBV_SEND_INLINE
        };
        if !inline && sges.len() > q.caps.max_send_sge as usize {
            self.err = libc::EINVAL;
            return;
        }
        match finish_wqe(q, wqe, flags, sges) {
            Ok(item) => self.items.push(item),
            Err(e) => self.err = e,
        }
    }
}

/// # Safety
/// `ctx` is a context this provider allocated.
pub(crate) unsafe fn shared<'a>(ctx: *mut ibv_context) -> &'a Shared {
    // SAFETY: `ibv_context` is the last member of `verbs_context`, which is the first
    // member of `XiwContext`; `sh` is set before the context is handed out.
    unsafe {
        let vctx =
            (ctx as *mut u8).sub(std::mem::offset_of!(verbs_context, context)) as *mut XiwContext;
        &*(*vctx).sh
    }
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

// ---- device and port ------------------------------------------------------

unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> i32 {
    guard(libc::EIO, || {
        if ctx.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ctx is ours (libibverbs only calls us with our contexts).
        let sh = unsafe { shared(ctx) };
        let a = device_attr(sh);
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller provides `attr_size` writable bytes at `attr`.
        unsafe { ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n) };
        0
    })
}

/// `IB_UVERBS_DEVICE_FLUSH_GLOBAL`, `_FLUSH_PERSISTENT` and `_ATOMIC_WRITE` of
/// newer kernels and rdma-core (device_cap_flags_ex bits).
pub const DEVICE_FLUSH_GLOBAL: u64 = 1 << 38;
pub const DEVICE_FLUSH_PERSISTENT: u64 = 1 << 39;
pub const DEVICE_ATOMIC_WRITE: u64 = 1 << 40;

pub fn device_attr(sh: &Shared) -> ibv_device_attr_ex {
    let mut a = ibv_device_attr_ex::default();
    let o = &mut a.orig_attr;
    let fw = b"0.1.0";
    for (i, b) in fw.iter().enumerate() {
        o.fw_ver[i] = *b as _;
    }
    o.node_guid = sh.dev.node_guid.to_be();
    o.sys_image_guid = sh.dev.node_guid.to_be();
    o.max_mr_size = u64::MAX >> 1;
    o.page_size_cap = !4095u64;
    o.vendor_id = VENDOR_ID;
    o.vendor_part_id = VENDOR_PART_ID;
    o.hw_ver = 0;
    o.max_qp = MAX_QP as i32;
    o.max_qp_wr = qp::MAX_QP_WR as i32;
    o.device_cap_flags = IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_MEM_MGT_EXTENSIONS;
    o.max_sge = qp::MAX_SGE as i32;
    o.max_sge_rd = qp::MAX_SGE as i32;
    o.max_cq = MAX_QP as i32 * 2;
    o.max_cqe = MAX_CQE as i32;
    o.max_mr = MAX_MR as i32;
    o.max_pd = MAX_PD as i32;
    o.max_qp_rd_atom = qp::MAX_RD_ATOMIC as i32;
    o.max_res_rd_atom = (qp::MAX_RD_ATOMIC * MAX_QP) as i32;
    o.max_qp_init_rd_atom = qp::MAX_RD_ATOMIC as i32;
    // Atomics are carried out with CPU atomic instructions on the responder's
    // memory: atomic against other QPs of this device and the host's own CPUs.
    o.atomic_cap = if sh.cfg.extensions {
        IBV_ATOMIC_GLOB
    } else {
        IBV_ATOMIC_NONE
    };
    o.max_srq = MAX_SRQ as i32;
    o.max_srq_wr = qp::MAX_QP_WR as i32;
    o.max_srq_sge = qp::MAX_SGE as i32;
    o.max_pkeys = 1;
    o.phys_port_cnt = 1;
    a.device_cap_flags_ex = o.device_cap_flags as u64;
    if sh.cfg.extensions {
        a.device_cap_flags_ex |=
            DEVICE_FLUSH_GLOBAL | DEVICE_FLUSH_PERSISTENT | DEVICE_ATOMIC_WRITE;
    }
    a.phys_port_cnt_ex = 1;
    a
}

unsafe extern "C" fn query_port(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> i32 {
    guard(libc::EIO, || {
        if ctx.is_null() || attr.is_null() || port != 1 {
            return libc::EINVAL;
        }
        // SAFETY: ctx is ours.
        let sh = unsafe { shared(ctx) };
        let up = link_up(&sh.dev.netdev);
        let a = ibv_port_attr {
            state: if up { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
            max_mtu: IBV_MTU_4096,
            active_mtu: devinfo::ibv_mtu_for(sh.dev.mtu) as ibv_mtu,
            gid_tbl_len: 1,
            max_msg_sz: MAX_MSG_SZ,
            pkey_tbl_len: 1,
            max_vl_num: 1,
            active_width: 1,
            active_speed: 4,
            phys_state: if up { 5 } else { 3 },
            link_layer: IBV_LINK_LAYER_ETHERNET as u8,
            ..Default::default()
        };
        // SAFETY: the caller passes a full ibv_port_attr.
        unsafe { *attr = a };
        0
    })
}

fn link_up(netdev: &str) -> bool {
    match std::fs::read_to_string(format!("/sys/class/net/{netdev}/operstate")) {
        Ok(s) => matches!(s.trim(), "up" | "unknown"),
        Err(_) => true,
    }
}

/// libibverbs has read an event from `async_fd`: the next one may go.
unsafe extern "C" fn async_event(ctx: *mut ibv_context, ev: *mut ibv_async_event) {
    guard((), || {
        if ctx.is_null() || ev.is_null() {
            return;
        }
        // SAFETY: ctx is ours; ev is the event libibverbs just filled in.
        let (sh, ev) = unsafe { (shared(ctx), &*ev) };
        // SAFETY: every member of the element union is a pointer or a port
        // number; the pointer member covers the whole of it for QP, CQ and SRQ
        // events, and a port number is not what the queue compares against.
        let element = unsafe { ev.element.qp } as u64;
        sh.events.read_by_app(element, ev.event_type);
    })
}

// ---- protection domains and memory ---------------------------------------

unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
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

unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> i32 {
    guard(libc::EIO, || {
        if pd.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: pd is ours.
        let (p, sh) = unsafe { (pd_of(pd), shared((*pd).context)) };
        let id = p.id;
        let (mrs, qps) = (sh.mrs.count_for_pd(id), sh.qps_using(|q| q.pd == id));
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

unsafe extern "C" fn reg_mr(
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
fn mr_ext(
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
fn mapped(addr: u64, len: u64, writable: bool) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return true;
    };
    let mut need = addr;
    let end = addr + len;
    let mut ranges: Vec<(u64, u64, bool, bool)> = maps
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let range = it.next()?;
            let perms = it.next()?.as_bytes();
            let (a, b) = range.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
                perms.first() == Some(&b'r'),
                perms.get(1) == Some(&b'w'),
            ))
        })
        .collect();
    ranges.sort_unstable();
    for (a, b, r, w) in ranges {
        if b <= need || a > need {
            continue;
        }
        if !r || (writable && !w) {
            return false;
        }
        need = b;
        if need >= end {
            return true;
        }
    }
    false
}

unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> i32 {
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

// ---- completion queues ------------------------------------------------------

fn new_cq(
    ctx: *mut ibv_context,
    cqe: i32,
    channel: *mut ibv_comp_channel,
    wc_flags: u64,
) -> Result<*mut XiwCq, i32> {
    // SAFETY: ctx is ours.
    let sh = unsafe { shared(ctx) };
    if !channel.is_null() {
        crate::log::warn(
            &sh.log,
            format_args!("completion channels need the xiw kernel module"),
        );
        return Err(libc::EOPNOTSUPP);
    }
    if cqe <= 0 || cqe as u32 > MAX_CQE {
        return Err(libc::EINVAL);
    }
    let id = sh.next_id();
    let cq =
        Arc::new(Cq::new(id, cqe as u32).map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?);
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
        wc_flags,
    });
    let p = Box::into_raw(b);
    sh.set_handle(id, p as usize);
    Ok(p)
}

unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: i32,
    channel: *mut ibv_comp_channel,
    _vector: i32,
) -> *mut ibv_cq {
    guard(ptr::null_mut(), || match new_cq(ctx, cqe, channel, 0) {
        Ok(p) => p as *mut ibv_cq,
        Err(e) => null_err(e),
    })
}

const CQ_EX_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

unsafe extern "C" fn create_cq_ex(
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
        if a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        match new_cq(ctx, a.cqe as i32, a.channel, a.wc_flags) {
            Ok(p) => {
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
            Err(e) => null_err(e),
        }
    })
}

unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> i32 {
    guard(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: cq is ours.
        let (c, sh) = unsafe { (cq_of(cq), shared((*cq).context)) };
        if Arc::strong_count(&c.cq) > 1 {
            return libc::EBUSY;
        }
        sh.set_handle(c.cq.id, 0);
        let read = sh.events.retire(cq as u64);
        // SAFETY: the CQ's own pthread objects and counter, initialised at creation.
        unsafe {
            crate::events::wait_acks(
                &mut (*cq).mutex as *mut _ as *mut libc::pthread_mutex_t,
                &mut (*cq).cond as *mut _ as *mut libc::pthread_cond_t,
                &(*cq).async_events_completed,
                read,
            )
        };
        // SAFETY: allocated by new_cq with Box; handed back once.
        drop(unsafe { Box::from_raw(cq as *mut XiwCq) });
        0
    })
}

fn fill_wc(wc: &mut ibv_wc, c: &Cqe) {
    wc.wr_id = c.wr_id;
    wc.status = c.status as ibv_wc_status;
    wc.opcode = c.opcode as ibv_wc_opcode;
    wc.vendor_err = c.vendor_err;
    wc.byte_len = c.byte_len;
    wc.__bindgen_anon_1.imm_data = c.imm_or_inv;
    wc.qp_num = c.qp_num;
    wc.src_qp = 0;
    wc.wc_flags = c.wc_flags as u32;
    wc.pkey_index = 0;
    wc.slid = 0;
    wc.sl = 0;
    wc.dlid_path_bits = 0;
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
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
                c.cq.assist();
                poll() as i32
            }
            got => got as i32,
        }
    })
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited: i32) -> i32 {
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
        c.cq.ring.header().arm.store(arm, Ordering::Release);
        0
    })
}

unsafe fn cq_ex<'a>(cq: *mut ibv_cq_ex) -> &'a XiwCq {
    // SAFETY: every ibv_cq_ex handed out is the first member of an XiwCq.
    unsafe { &*(cq as *mut XiwCq) }
}

/// Loads the completion at the head into `cur` and the public fields; ENOENT if none.
unsafe fn cq_load(cq: *mut ibv_cq_ex, c: &XiwCq) -> i32 {
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

unsafe extern "C" fn cq_start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: cq is ours.
        let c = unsafe { cq_ex(cq) };
        if c.cq.is_empty() {
            c.cq.assist();
        }
        c.cq.lock_consumer();
        // SAFETY: lock held.
        let r = unsafe { cq_load(cq, c) };
        if r == libc::ENOENT {
            // No end_poll follows an empty start_poll.
            // SAFETY: we took the lock just above.
            unsafe { c.cq.unlock_consumer() };
        }
        r
    })
}

unsafe extern "C" fn cq_next_poll(cq: *mut ibv_cq_ex) -> i32 {
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

unsafe extern "C" fn cq_end_poll(cq: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: cq is ours; start_poll took the consumer lock.
        let c = unsafe { cq_ex(cq) };
        // SAFETY: as above.
        if unsafe { (*c.cur.get()).take().is_some() } {
            c.cq.advance();
        }
        // SAFETY: start_poll took the lock.
        unsafe { c.cq.unlock_consumer() };
    })
}

fn cur_cqe(cq: *mut ibv_cq_ex) -> Cqe {
    // SAFETY: read accessors run between start_poll and end_poll on our CQ.
    unsafe { (*cq_ex(cq).cur.get()).unwrap_or_default() }
}

unsafe extern "C" fn cq_read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    cur_cqe(cq).opcode as ibv_wc_opcode
}
unsafe extern "C" fn cq_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).vendor_err
}
unsafe extern "C" fn cq_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).byte_len
}
unsafe extern "C" fn cq_read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).imm_or_inv
}
unsafe extern "C" fn cq_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).qp_num
}
unsafe extern "C" fn cq_read_src_qp(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn cq_read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    cur_cqe(cq).wc_flags as u32
}
unsafe extern "C" fn cq_read_zero_u32(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn cq_read_zero_u8(_cq: *mut ibv_cq_ex) -> u8 {
    0
}

// ---- shared receive queues ----------------------------------------------------

fn new_srq(
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    attr: &mut ibv_srq_attr,
    srq_context: *mut c_void,
) -> Result<*mut ibv_srq, i32> {
    if pd.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: ctx and pd are ours.
    let (sh, p) = unsafe { (shared(ctx), pd_of(pd)) };
    if attr.max_wr == 0 || attr.max_wr > qp::MAX_QP_WR || attr.max_sge > qp::MAX_SGE {
        return Err(libc::EINVAL);
    }
    let id = sh.next_id();
    let srq =
        Arc::new(Srq::new(id, p.id, attr.max_wr, attr.max_sge.max(1)).map_err(|_| libc::ENOMEM)?);
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
    let b = Box::into_raw(Box::new(XiwSrq { vsrq: v, srq }));
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
    sh.set_handle(id, b as usize);
    Ok(b as *mut ibv_srq)
}

unsafe extern "C" fn create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard(ptr::null_mut(), || {
        if pd.is_null() || attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: valid pointers from the caller.
        let (ctx, a) = unsafe { ((*pd).context, &mut *attr) };
        match new_srq(ctx, pd, &mut a.attr, a.srq_context) {
            Ok(p) => p,
            Err(e) => null_err(e),
        }
    })
}

unsafe extern "C" fn create_srq_ex(
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
            Err(e) => null_err(e),
        }
    })
}

unsafe extern "C" fn modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: i32) -> i32 {
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

unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> i32 {
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

unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> i32 {
    guard(libc::EIO, || {
        if srq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours.
        let (s, sh) = unsafe { (srq_of(srq), shared((*srq).context)) };
        if Arc::strong_count(&s.srq) > 1 {
            return libc::EBUSY;
        }
        sh.set_handle(s.srq.id, 0);
        let read = sh.events.retire(srq as u64);
        // SAFETY: the SRQ's own pthread objects and counter, initialised at creation.
        unsafe {
            crate::events::wait_acks(
                &mut (*srq).mutex as *mut _ as *mut libc::pthread_mutex_t,
                &mut (*srq).cond as *mut _ as *mut libc::pthread_cond_t,
                &(*srq).events_completed,
                read,
            )
        };
        // SAFETY: allocated by new_srq with Box; handed back once.
        drop(unsafe { Box::from_raw(srq as *mut XiwSrq) });
        0
    })
}

unsafe extern "C" fn post_srq_recv(
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
        let (jobs, wrs) = unsafe { recv_jobs(wr) };
        match s.srq.post(&jobs) {
            Ok(()) => 0,
            Err((i, e)) => {
                report_bad(bad, &wrs, i, wr);
                e
            }
        }
    })
}

unsafe fn recv_jobs(mut wr: *mut ibv_recv_wr) -> (Vec<RecvJob>, Vec<*mut ibv_recv_wr>) {
    let mut jobs = Vec::new();
    let mut wrs = Vec::new();
    while !wr.is_null() {
        // SAFETY: the caller's linked list of valid WRs.
        let w = unsafe { &*wr };
        let n = w.num_sge.max(0) as usize;
        let sges: Vec<Sge> = if n == 0 || w.sg_list.is_null() {
            Vec::new()
        } else {
            // SAFETY: the WR names `num_sge` SGEs at `sg_list`.
            unsafe { std::slice::from_raw_parts(w.sg_list, n) }
                .iter()
                .map(|s| Sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                })
                .collect()
        };
        jobs.push(RecvJob {
            wr_id: w.wr_id,
            length: sges.iter().map(|s| s.length as u64).sum(),
            sges,
        });
        wrs.push(wr);
        wr = w.next;
    }
    (jobs, wrs)
}

// ---- queue pairs ----------------------------------------------------------------

pub const SEND_OPS: u64 = (IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_LOCAL_INV) as u64;

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

fn new_qp(ctx: *mut ibv_context, a: &mut ibv_qp_init_attr_ex) -> Result<*mut ibv_qp, i32> {
    // SAFETY: ctx is ours.
    let sh_ref = unsafe { shared(ctx) };
    if a.qp_type != IBV_QPT_RC {
        crate::log::debug(
            &sh_ref.log,
            format_args!("create_qp: only RC queue pairs exist on iWARP"),
        );
        return Err(libc::EOPNOTSUPP);
    }
    let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !known != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let ops = if sh_ref.cfg.extensions {
        SEND_OPS | SEND_OPS_EXT
    } else {
        SEND_OPS
    };
    if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags & !ops != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if a.pd.is_null() || a.send_cq.is_null() || a.recv_cq.is_null() {
        return Err(libc::EINVAL);
    }
    let c = &mut a.cap;
    if c.max_send_wr > qp::MAX_QP_WR
        || c.max_recv_wr > qp::MAX_QP_WR
        || c.max_send_sge > qp::MAX_SGE
        || c.max_recv_sge > qp::MAX_SGE
        || c.max_inline_data > qp::MAX_INLINE
    {
        return Err(libc::EINVAL);
    }
    // SAFETY: pd, CQs and SRQ pointers come from this provider.
    let (p, scq, rcq) = unsafe { (pd_of(a.pd), cq_of(a.send_cq), cq_of(a.recv_cq)) };
    let srq = if a.srq.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { srq_of(a.srq) }.srq.clone())
    };
    let max_send_sge = c.max_send_sge.max(1);
    let stride = xiw_abi::ring::send_stride(max_send_sge, c.max_inline_data);
    let max_inline = (stride - size_of::<SendWqe>() as u32).min(qp::MAX_INLINE);
    let caps = Caps {
        max_send_wr: c.max_send_wr.max(1),
        max_recv_wr: if srq.is_some() {
            0
        } else {
            c.max_recv_wr.max(1)
        },
        max_send_sge,
        max_recv_sge: if srq.is_some() {
            0
        } else {
            c.max_recv_sge.max(1)
        },
        max_inline,
    };
    let sh = {
        // SAFETY: the context outlives its QPs; we only need a counted handle.
        let raw = unsafe {
            let vctx = (ctx as *mut u8).sub(std::mem::offset_of!(verbs_context, context))
                as *mut XiwContext;
            (*vctx).sh
        };
        // SAFETY: `sh` came from Arc::into_raw in alloc_context and is still alive.
        unsafe {
            Arc::increment_strong_count(raw);
            Arc::from_raw(raw)
        }
    };
    let q = Qp::new(
        sh.clone(),
        p.id,
        scq.cq.clone(),
        rcq.cq.clone(),
        srq,
        caps,
        a.sq_sig_all != 0,
    )
    .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
    c.max_send_wr = q.sq.entries.min(qp::MAX_QP_WR);
    c.max_recv_wr = q.rq.as_ref().map(|r| r.entries).unwrap_or(0);
    c.max_send_sge = caps.max_send_sge;
    c.max_recv_sge = caps.max_recv_sge;
    c.max_inline_data = caps.max_inline;
    let q = Arc::new(q);
    q.send_cq.attach(&q);
    if !Arc::ptr_eq(&q.send_cq, &q.recv_cq) {
        q.recv_cq.attach(&q);
    }
    let qpn = q.qpn;
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
        if sh_ref.cfg.extensions {
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
    v.comp_mask = VERBS_QP_EX;
    let b = Box::into_raw(Box::new(XiwQp {
        vqp: v,
        qp: q.clone(),
        section: Mutex::new(Section::default()),
        section_free: Condvar::new(),
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
    q.handle.store(b as usize, Ordering::Release);
    sh.register_qp(q);
    Ok(b as *mut ibv_qp)
}

unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
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
            Err(e) => null_err(e),
        }
    })
}

unsafe extern "C" fn create_qp_ex(
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
            Err(e) => null_err(e),
        }
    })
}

unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> i32 {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours.
        let (x, sh) = unsafe { (qp_of(qp), shared((*qp).context)) };
        let q = &x.qp;
        q.destroyed.store(true, Ordering::Release);
        q.handle.store(0, Ordering::Release);
        let read = sh.events.retire(qp as u64);
        // SAFETY: the QP's own pthread objects and counter, initialised at creation.
        unsafe {
            crate::events::wait_acks(
                &mut (*qp).mutex as *mut _ as *mut libc::pthread_mutex_t,
                &mut (*qp).cond as *mut _ as *mut libc::pthread_cond_t,
                &(*qp).events_completed,
                read,
            )
        };
        // Let the last bytes go out: hand whatever is still staged to the socket
        // once more, then close the stream gracefully.
        crate::tx::kick(q);
        q.detach_stream();
        q.lock_cm().close(sh);
        sh.unregister_qp(q.qpn);
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

unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: i32) -> i32 {
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ours / caller's.
        let (x, a) = unsafe { (qp_of(qp), &*attr) };
        match crate::qpstate::modify(&x.qp, a, mask as u32) {
            Ok(state) => {
                // SAFETY: our ibv_qp; the state field mirrors the QP's.
                unsafe { (*qp).state = state };
                0
            }
            Err(e) => e,
        }
    })
}

unsafe extern "C" fn query_qp(
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
        let at = *q.attrs.lock().unwrap_or_else(|e| e.into_inner());
        let cap = ibv_qp_cap {
            max_send_wr: q.sq.entries.min(qp::MAX_QP_WR),
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

/// Converts one `ibv_send_wr` into a WQE, checking it against the QP's limits.
unsafe fn send_wqe(q: &Qp, w: &ibv_send_wr) -> Result<(SendWqe, SendBody), i32> {
    let n = w.num_sge.max(0) as usize;
    if n > q.caps.max_send_sge as usize {
        return Err(libc::EINVAL);
    }
    let sges: &[ibv_sge] = if n == 0 || w.sg_list.is_null() {
        &[]
    } else {
        // SAFETY: the WR names `num_sge` SGEs at `sg_list`.
        unsafe { std::slice::from_raw_parts(w.sg_list, n) }
    };
    let mut wqe = SendWqe {
        wr_id: w.wr_id,
        ..Default::default()
    };
    // SAFETY: reading the union member that matches the opcode.
    unsafe {
        match w.opcode {
            IBV_WR_SEND => wqe.opcode = op::SEND,
            IBV_WR_SEND_WITH_INV => {
                wqe.opcode = op::SEND_INV;
                wqe.imm_or_inv = w.__bindgen_anon_1.invalidate_rkey;
            }
            IBV_WR_RDMA_WRITE => {
                wqe.opcode = op::WRITE;
                wqe.remote_addr = w.wr.rdma.remote_addr;
                wqe.rkey = w.wr.rdma.rkey;
            }
            IBV_WR_RDMA_READ => {
                wqe.opcode = op::READ;
                wqe.remote_addr = w.wr.rdma.remote_addr;
                wqe.rkey = w.wr.rdma.rkey;
            }
            IBV_WR_LOCAL_INV => {
                wqe.opcode = op::LOCAL_INV;
                wqe.imm_or_inv = w.__bindgen_anon_1.invalidate_rkey;
            }
            IBV_WR_RDMA_WRITE_WITH_IMM if q.sh.cfg.extensions => {
                wqe.opcode = op::WRITE_IMM;
                wqe.remote_addr = w.wr.rdma.remote_addr;
                wqe.rkey = w.wr.rdma.rkey;
                wqe.imm_or_inv = w.__bindgen_anon_1.imm_data;
            }
            IBV_WR_SEND_WITH_IMM if q.sh.cfg.extensions => {
                wqe.opcode = op::SEND_IMM;
                wqe.imm_or_inv = w.__bindgen_anon_1.imm_data;
            }
            IBV_WR_ATOMIC_FETCH_AND_ADD if q.sh.cfg.extensions => {
                wqe.opcode = op::ATOMIC_FETCH_ADD;
                wqe.remote_addr = w.wr.atomic.remote_addr;
                wqe.rkey = w.wr.atomic.rkey;
                wqe.operand0 = w.wr.atomic.compare_add;
            }
            IBV_WR_ATOMIC_CMP_AND_SWP if q.sh.cfg.extensions => {
                wqe.opcode = op::ATOMIC_CMP_SWP;
                wqe.remote_addr = w.wr.atomic.remote_addr;
                wqe.rkey = w.wr.atomic.rkey;
                wqe.operand0 = w.wr.atomic.compare_add;
                wqe.operand1 = w.wr.atomic.swap;
            }
            IBV_WR_ATOMIC_WRITE if q.sh.cfg.extensions => {
                // The 8 bytes come from the SGE list and are taken now, as inline data is.
                wqe.opcode = op::ATOMIC_WRITE;
                wqe.remote_addr = w.wr.rdma.remote_addr;
                wqe.rkey = w.wr.rdma.rkey;
                let total: u64 = sges.iter().map(|s| s.length as u64).sum();
                if total != 8 {
                    return Err(libc::EINVAL);
                }
                let mut data = Vec::with_capacity(8);
                for s in sges.iter().filter(|s| s.length > 0) {
                    q.sh.mrs
                        .read(
                            s.lkey,
                            q.pd,
                            s.addr,
                            s.length as usize,
                            NEED_NONE,
                            &mut data,
                        )
                        .map_err(|_| libc::EINVAL)?;
                }
                wqe.operand0 = u64::from_ne_bytes(data[..8].try_into().expect("8 bytes"));
                return finish_wqe(q, wqe, w.send_flags & !IBV_SEND_INLINE, Vec::new());
            }
            _ => return Err(libc::EINVAL),
        }
    }
    finish_wqe(
        q,
        wqe,
        w.send_flags,
        sges.iter()
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect(),
    )
}

/// Applies send flags and builds the body (inline bytes are copied now).
fn finish_wqe(
    q: &Qp,
    mut wqe: SendWqe,
    flags: u32,
    sges: Vec<Sge>,
) -> Result<(SendWqe, SendBody), i32> {
    let total: u64 = sges.iter().map(|s| s.length as u64).sum();
    if total > MAX_MSG_SZ as u64 {
        return Err(libc::EINVAL);
    }
    wqe.length = total as u32;
    match wqe.opcode {
        // The original value comes back into exactly one 64-bit buffer.
        op::ATOMIC_CMP_SWP
        | op::ATOMIC_FETCH_ADD
        | op::ATOMIC_MASKED_CMP_SWP
        | op::ATOMIC_MASKED_FETCH_ADD
        | op::ATOMIC_SWAP
            if total != 8 || flags & IBV_SEND_INLINE != 0 =>
        {
            return Err(libc::EINVAL)
        }
        op::FLUSH | op::ATOMIC_WRITE if total != 0 => return Err(libc::EINVAL),
        op::VERIFY if flags & IBV_SEND_INLINE != 0 => return Err(libc::EINVAL),
        _ => {}
    }
    if flags & IBV_SEND_SIGNALED != 0 {
        wqe.flags |= wqe_flag::SIGNALED;
    }
    if flags & IBV_SEND_SOLICITED != 0 {
        wqe.flags |= wqe_flag::SOLICITED;
    }
    if flags & IBV_SEND_FENCE != 0 {
        wqe.flags |= wqe_flag::FENCE;
    }
    if flags & IBV_SEND_INLINE != 0
        && matches!(
            wqe.opcode,
            op::SEND | op::SEND_INV | op::SEND_IMM | op::WRITE | op::WRITE_IMM
        )
    {
        if total > q.caps.max_inline as u64 {
            return Err(libc::EINVAL);
        }
        let mut bytes = Vec::with_capacity(total as usize);
        for s in &sges {
            // SAFETY: inline data is read from the caller's buffers now, as the
            // verbs contract says; no lkey applies.
            bytes.extend_from_slice(unsafe {
                std::slice::from_raw_parts(s.addr as *const u8, s.length as usize)
            });
        }
        wqe.flags |= wqe_flag::INLINE;
        return Ok((wqe, SendBody::Inline(bytes)));
    }
    wqe.num_sge = sges.len() as u8;
    Ok((wqe, SendBody::Sges(sges)))
}

unsafe extern "C" fn post_send(
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
        let mut wrs = Vec::new();
        let mut cur = wr;
        while !cur.is_null() {
            wrs.push(cur);
            // SAFETY: caller's linked list.
            cur = unsafe { (*cur).next };
        }
        // SAFETY: each pointer is a valid WR from the caller's list.
        let mut it = wrs.iter().map(|&w| unsafe { send_wqe(&x.qp, &*w) });
        match x.qp.post_send(&mut it) {
            Ok(()) => 0,
            Err((i, e)) => {
                crate::log::debug(
                    &x.qp.sh.log,
                    format_args!("qp {}: post_send refused WR {i}: errno {e}", x.qp.qpn),
                );
                report_bad(bad, &wrs, i, wr);
                e
            }
        }
    })
}

unsafe extern "C" fn post_recv(
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
        let (jobs, wrs) = unsafe { recv_jobs(wr) };
        match x.qp.post_recv(&jobs) {
            Ok(()) => 0,
            Err((i, e)) => {
                report_bad(bad, &wrs, i, wr);
                e
            }
        }
    })
}

// ---- ibv_qp_ex work request builders -------------------------------------------------

unsafe fn qpx<'a>(q: *mut ibv_qp_ex) -> &'a XiwQp {
    // SAFETY: every ibv_qp_ex handed out is the first member of an XiwQp.
    unsafe { &*(q as *mut XiwQp) }
}

impl XiwQp {
    fn lock_section(&self) -> std::sync::MutexGuard<'_, Section> {
        self.section.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs a builder on the batch of the calling thread's section; a builder
/// called outside `wr_start` .. `wr_complete` is ignored (another thread may be
/// building its own batch on this QP).
fn with_batch(q: *mut ibv_qp_ex, f: impl FnOnce(&XiwQp, &mut Batch)) {
    guard((), || {
        // SAFETY: ours.
        let x = unsafe { qpx(q) };
        let mut sec = x.lock_section();
        if sec.owner != Some(this_thread()) {
            crate::log::debug(
                &x.qp.sh.log,
                format_args!("qp {}: ibv_wr_* outside ibv_wr_start: ignored", x.qp.qpn),
            );
            return;
        }
        f(x, &mut sec.batch)
    })
}

/// Starts a new WR with the wr_id and flags the application set on the QP.
fn begin(q: *mut ibv_qp_ex, opcode: u8, set: impl FnOnce(&mut SendWqe)) {
    // SAFETY: ours; wr_id/wr_flags are plain fields the section's owner just wrote.
    let (wr_id, flags) = unsafe { ((*q).wr_id, (*q).wr_flags) };
    with_batch(q, |x, b| {
        b.seal(&x.qp, Vec::new(), false);
        let mut wqe = SendWqe {
            wr_id,
            opcode,
            ..Default::default()
        };
        set(&mut wqe);
        b.pending = Some((wqe, flags));
    })
}

/// Enters the QP's critical section, waiting while another thread is in it.
unsafe extern "C" fn wr_start(q: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: ours.
        let x = unsafe { qpx(q) };
        let me = this_thread();
        let mut sec = x.lock_section();
        while sec.owner.is_some_and(|o| o != me) {
            sec = x.section_free.wait(sec).unwrap_or_else(|e| e.into_inner());
        }
        // A second wr_start without wr_complete starts over.
        sec.owner = Some(me);
        sec.batch = Batch::default();
    })
}

/// Leaves the section if the calling thread holds it; its batch, if so.
fn leave_section(x: &XiwQp) -> Option<Batch> {
    let mut sec = x.lock_section();
    if sec.owner != Some(this_thread()) {
        return None;
    }
    sec.owner = None;
    let batch = std::mem::take(&mut sec.batch);
    drop(sec);
    x.section_free.notify_one();
    Some(batch)
}

/// Leaves the section, then posts its batch: all of it, or (on an error) none.
unsafe extern "C" fn wr_complete(q: *mut ibv_qp_ex) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: ours.
        let x = unsafe { qpx(q) };
        let Some(mut batch) = leave_section(x) else {
            crate::log::debug(
                &x.qp.sh.log,
                format_args!("qp {}: ibv_wr_complete without ibv_wr_start", x.qp.qpn),
            );
            return libc::EINVAL;
        };
        batch.seal(&x.qp, Vec::new(), false);
        if batch.err != 0 {
            return batch.err;
        }
        match x.qp.post_batch(batch.items) {
            Ok(()) => 0,
            Err((i, e)) => {
                crate::log::debug(
                    &x.qp.sh.log,
                    format_args!("qp {}: wr_complete refused WR {i}: errno {e}", x.qp.qpn),
                );
                e
            }
        }
    })
}

unsafe extern "C" fn wr_abort(q: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: ours.
        leave_section(unsafe { qpx(q) });
    })
}

unsafe extern "C" fn wr_send(q: *mut ibv_qp_ex) {
    begin(q, op::SEND, |_| {})
}

unsafe extern "C" fn wr_send_inv(q: *mut ibv_qp_ex, inv: u32) {
    begin(q, op::SEND_INV, |w| w.imm_or_inv = inv)
}

unsafe extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(q, op::WRITE, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
    })
}

unsafe extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(q, op::READ, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
    })
}

unsafe extern "C" fn wr_local_inv(q: *mut ibv_qp_ex, rkey: u32) {
    begin(q, op::LOCAL_INV, |w| w.imm_or_inv = rkey)
}

unsafe extern "C" fn wr_rdma_write_imm(q: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    begin(q, op::WRITE_IMM, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.imm_or_inv = imm;
    })
}

unsafe extern "C" fn wr_send_imm(q: *mut ibv_qp_ex, imm: u32) {
    begin(q, op::SEND_IMM, |w| w.imm_or_inv = imm)
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(q, op::ATOMIC_CMP_SWP, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.operand0 = compare;
        w.operand1 = swap;
    })
}

unsafe extern "C" fn wr_atomic_fetch_add(q: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    begin(q, op::ATOMIC_FETCH_ADD, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.operand0 = add;
    })
}

unsafe extern "C" fn wr_atomic_write(q: *mut ibv_qp_ex, rkey: u32, addr: u64, data: *const c_void) {
    if data.is_null() {
        with_batch(q, |_, b| b.err = libc::EINVAL);
        return;
    }
    let mut v = [0u8; 8];
    // SAFETY: the verbs contract: `data` points at the 8 bytes to write, read now.
    unsafe { ptr::copy_nonoverlapping(data as *const u8, v.as_mut_ptr(), 8) };
    begin(q, op::ATOMIC_WRITE, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.operand0 = u64::from_ne_bytes(v);
    })
}

/// Starts an xiw-only WR (xiwdv.h) on a QP the caller says is xiw's.
pub(crate) fn begin_dv(q: *mut ibv_qp_ex, opcode: u8, set: impl FnOnce(&mut SendWqe)) {
    begin(q, opcode, set)
}

/// Makes the next wr_complete on `q` fail with `err`.
pub(crate) fn fail_batch(q: *mut ibv_qp_ex, err: i32) {
    with_batch(q, |_, b| {
        b.pending = None;
        b.err = err;
    })
}

fn set_payload(q: *mut ibv_qp_ex, sges: Vec<Sge>, inline: bool) {
    with_batch(q, |x, b| {
        if b.pending.is_none() {
            b.err = libc::EINVAL;
            return;
        }
        b.seal(&x.qp, sges, inline);
    })
}

unsafe extern "C" fn wr_set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    set_payload(q, vec![Sge { addr, length, lkey }], false)
}

unsafe extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    let sges = if n == 0 || list.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller passes `n` SGEs at `list`.
        unsafe { std::slice::from_raw_parts(list, n) }
            .iter()
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect()
    };
    set_payload(q, sges, false)
}

unsafe extern "C" fn wr_set_inline_data(q: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    set_payload(
        q,
        vec![Sge {
            addr: addr as u64,
            length: length as u32,
            lkey: 0,
        }],
        true,
    )
}

unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    let sges = if n == 0 || list.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller passes `n` buffers at `list`.
        unsafe { std::slice::from_raw_parts(list, n) }
            .iter()
            .map(|d| Sge {
                addr: d.addr as u64,
                length: d.length as u32,
                lkey: 0,
            })
            .collect()
    };
    set_payload(q, sges, true)
}

/// The ops table handed to libibverbs; entries left out answer EOPNOTSUPP.
pub fn ops() -> verbs_context_ops {
    verbs_context_ops {
        alloc_pd: Some(alloc_pd),
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
        req_notify_cq: Some(req_notify_cq),
        ..verbs_context_ops::EMPTY
    }
}
