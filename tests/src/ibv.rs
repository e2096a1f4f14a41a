//! A thin layer over the real libibverbs (`-libverbs`), for test programs.
//!
//! The exported functions are declared here against the bindgen types of
//! [`xiw_abi::verbs`]; the ones `verbs.h` defines as `static inline` (post_send,
//! post_recv, poll_cq, query_port, create_cq_ex and the `ibv_cq_ex` readers) are
//! reimplemented exactly as the header does, by calling through the context's
//! operation tables. Plain-data types are re-exported so callers need not name
//! the bindgen module.
//!
//! The RAII wrappers keep their parents alive through reference counts, so any
//! drop order is safe: an [`Mr`] or [`Qp`] holds its [`Pd`], a [`Pd`] or [`Cq`]
//! holds its [`Context`].
//!
//! The `unsafe` needed to use libibverbs lives here, so that programs built on
//! this layer (xiw-verbs-check) need none of their own.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::io;
use std::mem::{offset_of, size_of};
use std::ptr::{self, NonNull};
use std::rc::Rc;

/// The constants and enum values of `verbs.h` (`IBV_*`).
pub use xiw_abi::verbs as sys;
use xiw_abi::verbs::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_device, ibv_mr,
    ibv_pd, ibv_poll_cq_attr, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_wc, verbs_context,
};
pub use xiw_abi::verbs::{
    ibv_device_attr, ibv_gid, ibv_port_attr, ibv_qp_attr, ibv_qp_cap, ibv_qp_init_attr, ibv_sge,
};

#[link(name = "ibverbs")]
extern "C" {
    fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    fn ibv_free_device_list(list: *mut *mut ibv_device);
    fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
    fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    fn ibv_close_device(context: *mut ibv_context) -> c_int;
    fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    /// The exported (compat) symbol; [`Context::query_port`] does what the
    /// `ibv_query_port` macro of verbs.h does and only falls back to it.
    #[link_name = "ibv_query_port"]
    fn ibv_query_port_compat(
        context: *mut ibv_context,
        port: u8,
        attr: *mut ibv_port_attr,
    ) -> c_int;
    fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid)
        -> c_int;
    fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    /// The exported function; the verbs.h macro of the same name calls it for
    /// access flags without IBV_ACCESS_OPTIONAL_RANGE bits, as all of ours are.
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr;
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    fn ibv_query_qp(
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        mask: c_int,
        init: *mut ibv_qp_init_attr,
    ) -> c_int;
    fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    fn ibv_wc_status_str(status: u32) -> *const c_char;
}

/// `ibv_wc_status_str`.
pub fn wc_status_str(status: u32) -> String {
    // SAFETY: libibverbs returns a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(ibv_wc_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}

/// The name of an errno value, for messages.
pub fn errno_str(e: i32) -> String {
    format!("{} ({})", io::Error::from_raw_os_error(e), e)
}

/// `verbs_get_ctx` of verbs.h: the extended context around `ctx`, if it is one.
///
/// # Safety
/// `ctx` must be a live context from `ibv_open_device`.
unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> Option<*mut verbs_context> {
    // SAFETY: ctx is live (caller); abi_compat is a plain field.
    if unsafe { (*ctx).abi_compat } != usize::MAX as *mut c_void {
        return None;
    }
    // SAFETY: an extended context embeds `ibv_context` as verbs_context::context
    // (container_of, as the header open-codes it).
    Some(unsafe { (ctx as *mut u8).sub(offset_of!(verbs_context, context)) } as *mut verbs_context)
}

/// The `sz` test of `verbs_get_ctx_op`: is the member at `op_offset` inside the
/// part of verbs_context this library provides?
///
/// # Safety
/// `vctx` must come from [`verbs_get_ctx`].
unsafe fn vctx_has(vctx: *mut verbs_context, op_offset: usize) -> bool {
    // SAFETY: sz is a plain field of a live verbs_context.
    unsafe { (*vctx).sz >= size_of::<verbs_context>() - op_offset }
}

// ---- device and context ---------------------------------------------------------

struct CtxInner {
    raw: NonNull<ibv_context>,
    name: String,
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device; every child holds a reference, so none is left.
        unsafe { ibv_close_device(self.raw.as_ptr()) };
    }
}

/// An open device (`ibv_context`).
#[derive(Clone)]
pub struct Context(Rc<CtxInner>);

/// The names of the devices libibverbs finds.
pub fn device_names() -> io::Result<Vec<String>> {
    let mut n: c_int = 0;
    // SAFETY: plain call; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(*list.add(i))) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: from ibv_get_device_list, freed once.
    unsafe { ibv_free_device_list(list) };
    Ok(names)
}

impl Context {
    /// Opens the device called `name`, or the first one found.
    pub fn open(name: Option<&str>) -> io::Result<Context> {
        let mut n: c_int = 0;
        // SAFETY: plain call; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(io::Error::last_os_error());
        }
        let mut found = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: as above.
            let dname = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if name.is_none() || name == Some(dname.as_str()) {
                found = Some((dev, dname));
                break;
            }
        }
        let result = match found {
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no RDMA device {} (found {n})", name.unwrap_or("at all")),
            )),
            Some((dev, dname)) => {
                // SAFETY: dev is valid until the list is freed; an opened context
                // stays valid after that (libibverbs keeps a device reference).
                let ctx = unsafe { ibv_open_device(dev) };
                NonNull::new(ctx)
                    .map(|raw| Context(Rc::new(CtxInner { raw, name: dname })))
                    .ok_or_else(io::Error::last_os_error)
            }
        };
        // SAFETY: from ibv_get_device_list, freed once.
        unsafe { ibv_free_device_list(list) };
        result
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    fn raw(&self) -> *mut ibv_context {
        self.0.raw.as_ptr()
    }

    pub fn query_device(&self) -> io::Result<ibv_device_attr> {
        let mut a = ibv_device_attr::default();
        // SAFETY: live context, caller-sized struct.
        match unsafe { ibv_query_device(self.raw(), &mut a) } {
            0 => Ok(a),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    /// `ibv_query_port` as the verbs.h macro does it.
    pub fn query_port(&self, port: u8) -> io::Result<ibv_port_attr> {
        let mut a = ibv_port_attr::default();
        let ctx = self.raw();
        // SAFETY: live context; the op is called only if present, with a full struct
        // and its size, exactly as ___ibv_query_port does.
        let rc = unsafe {
            match verbs_get_ctx(ctx) {
                Some(v)
                    if vctx_has(v, offset_of!(verbs_context, query_port))
                        && (*v).query_port.is_some() =>
                {
                    ((*v).query_port.unwrap())(ctx, port, &mut a, size_of::<ibv_port_attr>())
                }
                _ => ibv_query_port_compat(ctx, port, &mut a),
            }
        };
        match rc {
            0 => Ok(a),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    pub fn query_gid(&self, port: u8, index: i32) -> io::Result<[u8; 16]> {
        let mut g = ibv_gid::default();
        // SAFETY: live context, caller's union.
        match unsafe { ibv_query_gid(self.raw(), port, index, &mut g) } {
            // SAFETY: every bit pattern of the union is a valid byte array.
            0 => Ok(unsafe { g.raw }),
            _ => Err(io::Error::last_os_error()),
        }
    }

    pub fn alloc_pd(&self) -> io::Result<Pd> {
        // SAFETY: live context.
        let pd = unsafe { ibv_alloc_pd(self.raw()) };
        NonNull::new(pd)
            .map(|raw| {
                Pd(Rc::new(PdInner {
                    raw,
                    _ctx: self.clone(),
                }))
            })
            .ok_or_else(io::Error::last_os_error)
    }
}

// ---- protection domains and memory regions --------------------------------------

struct PdInner {
    raw: NonNull<ibv_pd>,
    _ctx: Context,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: from ibv_alloc_pd; its MRs and QPs hold references, so none is left.
        unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct Pd(Rc<PdInner>);

impl Pd {
    fn raw(&self) -> *mut ibv_pd {
        self.0.raw.as_ptr()
    }
}

/// Page-aligned anonymous memory.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> io::Result<Mapping> {
        let n = len.max(1);
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(p as *mut u8).expect("mmap result"),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by Mapping::new with this length.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut c_void, self.len.max(1)) };
    }
}

/// A memory region over its own page-aligned buffer.
///
/// The buffer is the target of RDMA: the provider reads and writes it while work
/// requests that name it are outstanding, and the peer while it holds the rkey.
/// It is only ever touched through raw copies ([`Mr::write`], [`Mr::read`],
/// [`Mr::fill`]); read a range only after the completion (or peer message) that
/// orders the RDMA writes into it before the read.
pub struct Mr {
    raw: NonNull<ibv_mr>,
    // Dropped after `raw` is deregistered (see Drop).
    mem: Mapping,
    _pd: Pd,
}

impl Mr {
    /// Allocates `len` zeroed bytes and registers them with `access` (`IBV_ACCESS_*`).
    pub fn new(pd: &Pd, len: usize, access: u32) -> io::Result<Mr> {
        let mem = Mapping::new(len)?;
        // SAFETY: the mapping is ours and outlives the registration (Drop order).
        let mr = unsafe {
            ibv_reg_mr(
                pd.raw(),
                mem.ptr.as_ptr() as *mut c_void,
                len,
                access as c_int,
            )
        };
        match NonNull::new(mr) {
            Some(raw) => Ok(Mr {
                raw,
                mem,
                _pd: pd.clone(),
            }),
            None => Err(io::Error::last_os_error()),
        }
    }

    fn get(&self) -> &ibv_mr {
        // SAFETY: registered and alive for our lifetime; libibverbs never changes it.
        unsafe { self.raw.as_ref() }
    }

    pub fn addr(&self) -> u64 {
        self.get().addr as u64
    }

    pub fn len(&self) -> usize {
        self.get().length
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn lkey(&self) -> u32 {
        self.get().lkey
    }

    pub fn rkey(&self) -> u32 {
        self.get().rkey
    }

    /// An SGE for `len` bytes at offset `off`.
    pub fn sge(&self, off: usize, len: usize) -> ibv_sge {
        assert!(
            off + len <= self.mem.len,
            "SGE {off}+{len} outside the MR ({})",
            self.mem.len
        );
        ibv_sge {
            addr: self.addr() + off as u64,
            length: len as u32,
            lkey: self.lkey(),
        }
    }

    /// Copies `data` into the buffer at `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(
            off + data.len() <= self.mem.len,
            "write {off}+{} outside the MR",
            data.len()
        );
        // SAFETY: in bounds of our mapping, which is only ever accessed through raw
        // pointers (here, by the provider and by the peer); see the type's note.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.mem.ptr.as_ptr().add(off), data.len())
        };
    }

    /// Sets `len` bytes at `off` to `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) {
        assert!(off + len <= self.mem.len, "fill {off}+{len} outside the MR");
        // SAFETY: as in `write`.
        unsafe { ptr::write_bytes(self.mem.ptr.as_ptr().add(off), byte, len) };
    }

    /// A copy of `len` bytes at `off`.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.mem.len, "read {off}+{len} outside the MR");
        let mut v = vec![0u8; len];
        // SAFETY: as in `write`.
        unsafe { ptr::copy_nonoverlapping(self.mem.ptr.as_ptr().add(off), v.as_mut_ptr(), len) };
        v
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once, before `mem` is unmapped.
        unsafe { ibv_dereg_mr(self.raw.as_ptr()) };
    }
}

// ---- completion queues -----------------------------------------------------------

/// One work completion, whichever polling interface produced it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub qp_num: u32,
    pub wc_flags: u32,
}

impl Wc {
    fn from_wc(w: &ibv_wc) -> Wc {
        Wc {
            wr_id: w.wr_id,
            status: w.status,
            opcode: w.opcode,
            vendor_err: w.vendor_err,
            byte_len: w.byte_len,
            qp_num: w.qp_num,
            wc_flags: w.wc_flags,
        }
    }
}

enum CqKind {
    Classic(NonNull<ibv_cq>),
    Ex(NonNull<ibv_cq_ex>),
}

struct CqInner {
    kind: CqKind,
    _ctx: Context,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let cq = match self.kind {
            CqKind::Classic(c) => c.as_ptr(),
            // ibv_cq_ex_to_cq of verbs.h: the ibv_cq_ex starts with an ibv_cq.
            CqKind::Ex(c) => c.as_ptr() as *mut ibv_cq,
        };
        // SAFETY: created by us; QPs using it hold references, so none is left.
        unsafe { ibv_destroy_cq(cq) };
    }
}

/// A completion queue, made by `ibv_create_cq` or `ibv_create_cq_ex`.
#[derive(Clone)]
pub struct Cq(Rc<CqInner>);

impl Cq {
    pub fn new(ctx: &Context, cqe: i32) -> io::Result<Cq> {
        // SAFETY: live context; no channel.
        let cq = unsafe { ibv_create_cq(ctx.raw(), cqe, ptr::null_mut(), ptr::null_mut(), 0) };
        NonNull::new(cq)
            .map(|c| {
                Cq(Rc::new(CqInner {
                    kind: CqKind::Classic(c),
                    _ctx: ctx.clone(),
                }))
            })
            .ok_or_else(io::Error::last_os_error)
    }

    /// `ibv_create_cq_ex` (static inline in verbs.h) reporting byte_len and qp_num.
    pub fn new_ex(ctx: &Context, cqe: u32) -> io::Result<Cq> {
        let mut attr = ibv_cq_init_attr_ex {
            cqe,
            wc_flags: (sys::IBV_WC_EX_WITH_BYTE_LEN | sys::IBV_WC_EX_WITH_QP_NUM) as u64,
            ..Default::default()
        };
        let raw = ctx.raw();
        // SAFETY: live context; the op is used only if present, as verbs.h does.
        let cq = unsafe {
            match verbs_get_ctx(raw) {
                Some(v)
                    if vctx_has(v, offset_of!(verbs_context, create_cq_ex))
                        && (*v).create_cq_ex.is_some() =>
                {
                    ((*v).create_cq_ex.unwrap())(raw, &mut attr)
                }
                _ => return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
            }
        };
        NonNull::new(cq)
            .map(|c| {
                Cq(Rc::new(CqInner {
                    kind: CqKind::Ex(c),
                    _ctx: ctx.clone(),
                }))
            })
            .ok_or_else(io::Error::last_os_error)
    }

    pub fn is_ex(&self) -> bool {
        matches!(self.0.kind, CqKind::Ex(_))
    }

    fn as_cq(&self) -> *mut ibv_cq {
        match self.0.kind {
            CqKind::Classic(c) => c.as_ptr(),
            CqKind::Ex(c) => c.as_ptr() as *mut ibv_cq,
        }
    }

    /// Polls up to `max` completions (ibv_poll_cq, or the start/next/end_poll
    /// iteration for an extended CQ). An error is the provider's return value.
    pub fn poll(&self, max: usize) -> Result<Vec<Wc>, i32> {
        match self.0.kind {
            CqKind::Classic(c) => {
                let mut wcs: Vec<ibv_wc> = vec![ibv_wc::default(); max];
                let cq = c.as_ptr();
                // SAFETY: ibv_poll_cq of verbs.h: cq->context->ops.poll_cq(cq, n, wc);
                // the array holds `max` entries.
                let n = unsafe {
                    let poll = (*(*cq).context).ops.poll_cq.expect("poll_cq op");
                    poll(cq, max as c_int, wcs.as_mut_ptr())
                };
                if n < 0 {
                    return Err(n);
                }
                Ok(wcs[..n as usize].iter().map(Wc::from_wc).collect())
            }
            CqKind::Ex(c) => {
                let cq = c.as_ptr();
                let mut out = Vec::new();
                let mut attr = ibv_poll_cq_attr::default();
                // SAFETY: ibv_start_poll / ibv_next_poll / ibv_end_poll and the
                // ibv_wc_read_* helpers of verbs.h call the CQ's own function
                // pointers; the readers are valid between a successful start/next
                // and end_poll, and byte_len / qp_num were requested at creation.
                unsafe {
                    let cur = &*cq;
                    let mut rc = (cur.start_poll.expect("start_poll"))(cq, &mut attr);
                    if rc == libc::ENOENT {
                        return Ok(out);
                    }
                    if rc != 0 {
                        return Err(rc);
                    }
                    loop {
                        let cur = &*cq;
                        out.push(Wc {
                            wr_id: cur.wr_id,
                            status: cur.status,
                            opcode: (cur.read_opcode.expect("read_opcode"))(cq),
                            vendor_err: (cur.read_vendor_err.expect("read_vendor_err"))(cq),
                            byte_len: (cur.read_byte_len.expect("read_byte_len"))(cq),
                            qp_num: (cur.read_qp_num.expect("read_qp_num"))(cq),
                            wc_flags: (cur.read_wc_flags.expect("read_wc_flags"))(cq),
                        });
                        if out.len() >= max {
                            break;
                        }
                        rc = (cur.next_poll.expect("next_poll"))(cq);
                        if rc != 0 {
                            break;
                        }
                    }
                    ((*cq).end_poll.expect("end_poll"))(cq);
                    if rc != 0 && rc != libc::ENOENT {
                        return Err(rc);
                    }
                }
                Ok(out)
            }
        }
    }
}

// ---- queue pairs -----------------------------------------------------------------

/// A send work request, turned into an `ibv_send_wr` list by [`Qp::post_send`].
#[derive(Clone, Default)]
pub struct SendWr {
    pub wr_id: u64,
    /// `IBV_WR_*`
    pub opcode: u32,
    /// `IBV_SEND_*`
    pub flags: u32,
    pub sges: Vec<ibv_sge>,
    /// Overrides `sges.len()` as num_sge (to test the provider's checks).
    pub num_sge: Option<i32>,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// A receive work request.
#[derive(Clone, Default)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sges: Vec<ibv_sge>,
    pub num_sge: Option<i32>,
}

/// A queue pair.
pub struct Qp {
    raw: NonNull<ibv_qp>,
    cap: ibv_qp_cap,
    _pd: Pd,
    _cqs: (Cq, Cq),
}

impl Qp {
    /// An RC QP; `cap` is what to ask for, [`Qp::cap`] what was granted.
    pub fn new(
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: ibv_qp_cap,
        sq_sig_all: bool,
    ) -> io::Result<Qp> {
        let mut attr = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.as_cq(),
            recv_cq: recv_cq.as_cq(),
            srq: ptr::null_mut(),
            cap,
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: sq_sig_all as c_int,
        };
        Self::with_attr(pd, send_cq, recv_cq, &mut attr)
    }

    /// `ibv_create_qp` with `attr` as given except for its CQ pointers.
    pub fn with_attr(
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        attr: &mut ibv_qp_init_attr,
    ) -> io::Result<Qp> {
        attr.send_cq = send_cq.as_cq();
        attr.recv_cq = recv_cq.as_cq();
        attr.srq = ptr::null_mut();
        // SAFETY: live PD and CQs (kept alive by the Qp), caller's attributes.
        let qp = unsafe { ibv_create_qp(pd.raw(), attr) };
        match NonNull::new(qp) {
            Some(raw) => Ok(Qp {
                raw,
                cap: attr.cap,
                _pd: pd.clone(),
                _cqs: (send_cq.clone(), recv_cq.clone()),
            }),
            None => Err(io::Error::last_os_error()),
        }
    }

    fn raw(&self) -> *mut ibv_qp {
        self.raw.as_ptr()
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP; qp_num never changes.
        unsafe { (*self.raw()).qp_num }
    }

    /// The capabilities create_qp granted.
    pub fn cap(&self) -> ibv_qp_cap {
        self.cap
    }

    /// `ibv_modify_qp`; the error is the errno value it returns.
    pub fn modify(&self, attr: &ibv_qp_attr, mask: u32) -> Result<(), i32> {
        let mut a = *attr;
        // SAFETY: live QP, local copy of the attributes.
        match unsafe { ibv_modify_qp(self.raw(), &mut a, mask as c_int) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    pub fn query(&self) -> Result<(ibv_qp_attr, ibv_qp_init_attr), i32> {
        let mut a = ibv_qp_attr::default();
        let mut i = ibv_qp_init_attr::default();
        // SAFETY: live QP, our structs.
        match unsafe { ibv_query_qp(self.raw(), &mut a, sys::IBV_QP_STATE as c_int, &mut i) } {
            0 => Ok((a, i)),
            e => Err(e),
        }
    }

    /// The state as ibv_query_qp reports it.
    pub fn state(&self) -> Result<u32, i32> {
        self.query().map(|(a, _)| a.qp_state)
    }

    /// `ibv_post_send` (static inline in verbs.h) with `wrs` chained in order.
    /// On failure: the index of the WR `bad_wr` named and the returned errno.
    ///
    /// The provider reads the SGEs' memory: inline data during this call, the rest
    /// while the WR is outstanding. Keep it registered and alive until then.
    pub fn post_send(&self, wrs: &[SendWr]) -> Result<(), (usize, i32)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<Vec<ibv_sge>> = wrs.iter().map(|w| w.sges.clone()).collect();
        let mut raw: Vec<ibv_send_wr> = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(w, s)| {
                let mut r = ibv_send_wr {
                    wr_id: w.wr_id,
                    next: ptr::null_mut(),
                    sg_list: if s.is_empty() {
                        ptr::null_mut()
                    } else {
                        s.as_mut_ptr()
                    },
                    num_sge: w.num_sge.unwrap_or(s.len() as i32),
                    opcode: w.opcode,
                    send_flags: w.flags,
                    ..Default::default()
                };
                r.wr.rdma.remote_addr = w.remote_addr;
                r.wr.rdma.rkey = w.rkey;
                r
            })
            .collect();
        let base = raw.as_mut_ptr();
        for i in 0..raw.len() - 1 {
            // SAFETY: i + 1 < len; the vector is neither resized nor borrowed
            // again while the list is in use, so `base` stays valid.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        let qp = self.raw();
        // SAFETY: ibv_post_send of verbs.h: qp->context->ops.post_send(qp, wr, bad_wr);
        // the list and its SGE arrays live until the call returns.
        let rc = unsafe {
            let post = (*(*qp).context).ops.post_send.expect("post_send op");
            post(qp, base, &mut bad)
        };
        if rc == 0 {
            return Ok(());
        }
        let idx = if bad.is_null() {
            usize::MAX
        } else {
            // SAFETY: the provider points bad_wr into our list.
            unsafe { bad.offset_from(base) as usize }
        };
        Err((idx, rc))
    }

    /// `ibv_post_recv` (static inline in verbs.h); errors as for [`Qp::post_send`].
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), (usize, i32)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<Vec<ibv_sge>> = wrs.iter().map(|w| w.sges.clone()).collect();
        let mut raw: Vec<ibv_recv_wr> = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(w, s)| ibv_recv_wr {
                wr_id: w.wr_id,
                next: ptr::null_mut(),
                sg_list: if s.is_empty() {
                    ptr::null_mut()
                } else {
                    s.as_mut_ptr()
                },
                num_sge: w.num_sge.unwrap_or(s.len() as i32),
            })
            .collect();
        let base = raw.as_mut_ptr();
        for i in 0..raw.len() - 1 {
            // SAFETY: as in post_send.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        let qp = self.raw();
        // SAFETY: ibv_post_recv of verbs.h: qp->context->ops.post_recv(qp, wr, bad_wr).
        let rc = unsafe {
            let post = (*(*qp).context).ops.post_recv.expect("post_recv op");
            post(qp, base, &mut bad)
        };
        if rc == 0 {
            return Ok(());
        }
        let idx = if bad.is_null() {
            usize::MAX
        } else {
            // SAFETY: the provider points bad_wr into our list.
            unsafe { bad.offset_from(base) as usize }
        };
        Err((idx, rc))
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once; the PD and CQs outlive it.
        unsafe { ibv_destroy_qp(self.raw()) };
    }
}

/// Registers memory and returns the errno on failure, without keeping the MR
/// (for checks of reg_mr's own error codes).
pub fn try_reg_mr(pd: &Pd, len: usize, access: u32) -> Result<(), i32> {
    Mr::new(pd, len, access)
        .map(drop)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

/// Ends the process at once (`_exit`): no destructors, no atexit handlers, no
/// provider teardown, as if it had been killed.
pub fn exit_now(code: i32) -> ! {
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // SAFETY: _exit never returns and touches no memory of ours.
    unsafe { libc::_exit(code) }
}
