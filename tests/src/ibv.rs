//! A thin layer over the real libibverbs (`-libverbs`), for test programs.
//!
//! The exported functions are declared here against the bindgen types of
//! [`xiw_abi::verbs`]; the ones `verbs.h` defines as `static inline` (post_send,
//! post_recv, poll_cq, query_port, create_cq_ex, create_qp_ex, the `ibv_cq_ex`
//! readers and the `ibv_wr_*` builders of `ibv_qp_ex`) are reimplemented exactly
//! as the header does, by calling through the context's operation tables or the
//! object's function pointers. xiw's direct verbs (flushable and verifiable
//! memory, Flush, Verify, the masked atomics) come through the `xiwdv` crate.
//! Plain-data types are re-exported so callers need not name the bindgen module.
//!
//! The RAII wrappers keep their parents alive through reference counts, so any
//! drop order is safe: an [`Mr`] or [`Qp`] holds its [`Pd`], a [`Pd`] or [`Cq`]
//! holds its [`Context`].
//!
//! The `unsafe` needed to use libibverbs lives here, so that programs built on
//! this layer (xiw-verbs-check, xiw-ext-check) need none of their own.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::io;
use std::mem::{offset_of, size_of};
use std::ptr::{self, NonNull};
use std::rc::Rc;

/// The constants and enum values of `verbs.h` (`IBV_*`).
pub use xiw_abi::verbs as sys;
use xiw_abi::verbs::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_device, ibv_mr,
    ibv_pd, ibv_poll_cq_attr, ibv_qp, ibv_qp_ex, ibv_qp_init_attr_ex, ibv_recv_wr, ibv_send_wr,
    ibv_wc, verbs_context,
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
    fn ibv_rereg_mr(
        mr: *mut ibv_mr,
        flags: c_int,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> c_int;
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int;
    fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    fn ibv_query_qp(
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        mask: c_int,
        init: *mut ibv_qp_init_attr,
    ) -> c_int;
    fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex;
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

    /// `xiwdv_is_xiw`: false without the xiw library too.
    pub fn is_xiw(&self) -> bool {
        // SAFETY: live context.
        unsafe { xiwdv::is_xiw(self.raw()) }
    }

    /// `xiwdv_query_device`: xiw's extension capabilities.
    pub fn xiwdv_query_device(&self) -> Result<xiwdv::DeviceAttr, xiwdv::Error> {
        // SAFETY: live context.
        unsafe { xiwdv::query_device(self.raw()) }
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

/// Page-aligned memory of our own: anonymous, or a shared mapping of a file.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// `len` zeroed bytes of private anonymous memory.
    pub fn anon(len: usize) -> io::Result<Mapping> {
        Self::new(len)
    }

    /// The first `len` bytes of `file`, mapped shared (MAP_SHARED): stores
    /// reach the file's pages, which msync writes back.
    pub fn file(file: &std::fs::File, len: usize) -> io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of an open file; the kernel keeps its
        // own reference to the file, so `file` may be closed afterwards.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
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

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of the bytes, read with volatile loads (something else may be
    /// writing them: that is what a caller checks for).
    pub fn snapshot(&self) -> Vec<u8> {
        (0..self.len)
            // SAFETY: within the mapping, which lives as long as `self`.
            .map(|i| unsafe { ptr::read_volatile(self.ptr.as_ptr().add(i)) })
            .collect()
    }

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

/// How [`Mr::register`] registers its memory.
#[derive(Clone, Copy, Debug)]
pub enum Reg {
    /// `ibv_reg_mr`.
    Verbs,
    /// `xiwdv_reg_mr` with these attributes (None: NULL).
    Xiwdv(Option<xiwdv::MrAttr>),
}

impl Mr {
    /// Registers `mem` (which the MR then owns) with `access` (`IBV_ACCESS_*`,
    /// including xiwdv's flush flags) the way `how` says. A failure carries
    /// the errno and, for xiwdv, its reason (`xiwdv_last_error`).
    pub fn register(pd: &Pd, mem: Mapping, access: u32, how: Reg) -> Result<Mr, xiwdv::Error> {
        let addr = mem.ptr.as_ptr() as *mut c_void;
        let mr = match how {
            // SAFETY: the mapping is ours and outlives the registration (Drop order).
            Reg::Verbs => {
                NonNull::new(unsafe { ibv_reg_mr(pd.raw(), addr, mem.len, access as c_int) })
                    .ok_or_else(|| xiwdv::Error::Failed {
                        errno: io::Error::last_os_error()
                            .raw_os_error()
                            .unwrap_or(libc::EIO),
                        reason: String::new(),
                    })?
            }
            // SAFETY: as above; the PD is live.
            Reg::Xiwdv(attr) => unsafe {
                xiwdv::reg_mr(pd.raw(), addr, mem.len, access, attr.as_ref())?
            },
        };
        Ok(Mr {
            raw: mr,
            mem,
            _pd: pd.clone(),
        })
    }

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

    /// `ibv_rereg_mr` onto `mem` (which the MR then owns; the old buffer is
    /// unmapped) with `access`, keeping the keys. Err: errno.
    pub fn rereg(&mut self, mem: Mapping, access: u32) -> Result<(), i32> {
        let flags = xiw_abi::verbs::IBV_REREG_MR_CHANGE_TRANSLATION
            | xiw_abi::verbs::IBV_REREG_MR_CHANGE_ACCESS;
        // SAFETY: our registered MR; the new mapping outlives the registration
        // (it replaces `mem`, dropped after deregistration).
        let r = unsafe {
            ibv_rereg_mr(
                self.raw.as_ptr(),
                flags as c_int,
                ptr::null_mut(),
                mem.ptr.as_ptr() as *mut c_void,
                mem.len,
                access as c_int,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        self.mem = mem;
        Ok(())
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

impl Mr {
    /// `ibv_dereg_mr`, keeping the memory: once it returns, the memory is
    /// the caller's again. On failure the MR stays registered and comes back
    /// with the errno.
    pub fn deregister(self) -> Result<Mapping, (Mr, i32)> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: registered by ibv_reg_mr; on success it is deregistered
        // here once, and Drop never runs for it.
        let r = unsafe { ibv_dereg_mr(this.raw.as_ptr()) };
        if r != 0 {
            return Err((std::mem::ManuallyDrop::into_inner(this), r));
        }
        // SAFETY: `this` is never used or dropped again; its fields are
        // moved out once each.
        let (mem, pd) = unsafe { (ptr::read(&this.mem), ptr::read(&this._pd)) };
        drop(pd);
        Ok(mem)
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
    /// Immediate data in network byte order, as delivered (valid with
    /// `IBV_WC_WITH_IMM`; an extended CQ reports it only if made with
    /// `IBV_WC_EX_WITH_IMM`, see [`Cq::new_ex_with`]).
    pub imm_data: u32,
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
            // SAFETY: both members of the union are a u32; any value is valid.
            imm_data: unsafe { w.__bindgen_anon_1.imm_data },
        }
    }
}

enum CqKind {
    Classic(NonNull<ibv_cq>),
    Ex(NonNull<ibv_cq_ex>),
}

struct CqInner {
    kind: CqKind,
    /// `IBV_WC_EX_WITH_*` of an extended CQ.
    ex_flags: u64,
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
                    ex_flags: 0,
                    _ctx: ctx.clone(),
                }))
            })
            .ok_or_else(io::Error::last_os_error)
    }

    /// `ibv_create_cq_ex` (static inline in verbs.h) reporting byte_len and qp_num.
    pub fn new_ex(ctx: &Context, cqe: u32) -> io::Result<Cq> {
        Self::new_ex_with(
            ctx,
            cqe,
            (sys::IBV_WC_EX_WITH_BYTE_LEN | sys::IBV_WC_EX_WITH_QP_NUM) as u64,
        )
    }

    /// `ibv_create_cq_ex` with these `IBV_WC_EX_WITH_*` flags.
    pub fn new_ex_with(ctx: &Context, cqe: u32, wc_flags: u64) -> io::Result<Cq> {
        let mut attr = ibv_cq_init_attr_ex {
            cqe,
            wc_flags,
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
                    ex_flags: wc_flags,
                    _ctx: ctx.clone(),
                }))
            })
            .ok_or_else(io::Error::last_os_error)
    }

    pub fn is_ex(&self) -> bool {
        matches!(self.0.kind, CqKind::Ex(_))
    }

    /// `ibv_resize_cq`; the error is its return value (an errno).
    pub fn resize(&self, cqe: i32) -> Result<(), i32> {
        // SAFETY: a live CQ of ours.
        match unsafe { ibv_resize_cq(self.as_cq(), cqe) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// The capacity the CQ reports (`cq->cqe`).
    pub fn cqe(&self) -> i32 {
        // SAFETY: a live CQ of ours.
        unsafe { (*self.as_cq()).cqe }
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
                let flags = self.0.ex_flags;
                let has = |f: u32| flags & f as u64 != 0;
                let mut out = Vec::new();
                let mut attr = ibv_poll_cq_attr::default();
                // SAFETY: ibv_start_poll / ibv_next_poll / ibv_end_poll and the
                // ibv_wc_read_* helpers of verbs.h call the CQ's own function
                // pointers; the readers are valid between a successful start/next
                // and end_poll, and byte_len / qp_num were requested at creation.
                // A reader is called only if its IBV_WC_EX_WITH_* flag was requested.
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
                        let wc_flags = (cur.read_wc_flags.expect("read_wc_flags"))(cq);
                        let with_imm = wc_flags & sys::IBV_WC_WITH_IMM != 0;
                        out.push(Wc {
                            wr_id: cur.wr_id,
                            status: cur.status,
                            opcode: (cur.read_opcode.expect("read_opcode"))(cq),
                            vendor_err: (cur.read_vendor_err.expect("read_vendor_err"))(cq),
                            byte_len: if has(sys::IBV_WC_EX_WITH_BYTE_LEN) {
                                (cur.read_byte_len.expect("read_byte_len"))(cq)
                            } else {
                                0
                            },
                            qp_num: if has(sys::IBV_WC_EX_WITH_QP_NUM) {
                                (cur.read_qp_num.expect("read_qp_num"))(cq)
                            } else {
                                0
                            },
                            wc_flags,
                            imm_data: if has(sys::IBV_WC_EX_WITH_IMM) && with_imm {
                                (cur.read_imm_data.expect("read_imm_data"))(cq)
                            } else {
                                0
                            },
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
    /// Atomics (`wr.atomic`): the add value of FetchAdd, the compare value of CmpSwap.
    pub compare_add: u64,
    /// CmpSwap: the swap value.
    pub swap: u64,
    /// `*_WITH_IMM`: the immediate data, in network byte order as given.
    pub imm_data: u32,
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
    /// The `ibv_qp_ex` of a QP made by [`Qp::new_ex`].
    qpx: Option<NonNull<ibv_qp_ex>>,
    _pd: Pd,
    _cqs: (Cq, Cq),
}

/// One operation of an `ibv_qp_ex` work request ([`Qp::post_ex`]): the
/// `ibv_wr_*` builder of verbs.h, or an xiwdv builder.
#[derive(Clone, Debug)]
pub enum ExOp {
    Send,
    /// `ibv_wr_send_imm`; `imm` in network byte order as given.
    SendImm {
        imm: u32,
    },
    Write {
        rkey: u32,
        addr: u64,
    },
    WriteImm {
        rkey: u32,
        addr: u64,
        imm: u32,
    },
    Read {
        rkey: u32,
        addr: u64,
    },
    FetchAdd {
        rkey: u32,
        addr: u64,
        add: u64,
    },
    CmpSwp {
        rkey: u32,
        addr: u64,
        compare: u64,
        swap: u64,
    },
    /// `ibv_wr_atomic_write`: the eight bytes land as given.
    AtomicWrite {
        rkey: u32,
        addr: u64,
        value: [u8; 8],
    },
    /// `xiwdv_wr_flush`.
    Flush {
        rkey: u32,
        addr: u64,
        len: usize,
        placement: u8,
        level: u8,
    },
    /// `xiwdv_wr_verify`.
    Verify {
        rkey: u32,
        addr: u64,
        len: u32,
        expected: Option<Vec<u8>>,
    },
    /// `xiwdv_wr_atomic_masked_fetch_add`.
    MaskedFetchAdd {
        rkey: u32,
        addr: u64,
        add: u64,
        boundary: u64,
    },
    /// `xiwdv_wr_atomic_masked_cmp_swp`.
    MaskedCmpSwp {
        rkey: u32,
        addr: u64,
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    },
    /// `xiwdv_wr_atomic_swap`.
    Swap {
        rkey: u32,
        addr: u64,
        swap: u64,
    },
}

impl ExOp {
    /// Whether the operation takes a local buffer (`ibv_wr_set_sge*`).
    fn has_sges(&self) -> bool {
        !matches!(self, ExOp::Flush { .. } | ExOp::AtomicWrite { .. })
    }
}

/// A work request for [`Qp::post_ex`].
#[derive(Clone)]
pub struct ExWr {
    pub wr_id: u64,
    /// `IBV_SEND_*`
    pub flags: u32,
    pub op: ExOp,
    /// The local buffer(s); one SGE goes through `ibv_wr_set_sge`, several
    /// (or none) through `ibv_wr_set_sge_list`.
    pub sges: Vec<ibv_sge>,
}

/// errno of [`Qp::post_ex`] when the xiw direct verbs cannot be loaded.
pub const ENOSYS_XIWDV: i32 = libc::ENOSYS;

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
                qpx: None,
                _pd: pd.clone(),
                _cqs: (send_cq.clone(), recv_cq.clone()),
            }),
            None => Err(io::Error::last_os_error()),
        }
    }

    /// An RC QP made by `ibv_create_qp_ex` (static inline in verbs.h) with
    /// `IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` and
    /// `send_ops_flags` (`IBV_QP_EX_WITH_*`, `XIWDV_QP_EX_WITH_*`), so that
    /// [`Qp::post_ex`] can build work requests on it.
    pub fn new_ex(
        ctx: &Context,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: ibv_qp_cap,
        sq_sig_all: bool,
        send_ops_flags: u64,
    ) -> io::Result<Qp> {
        let mut attr = ibv_qp_init_attr_ex {
            send_cq: send_cq.as_cq(),
            recv_cq: recv_cq.as_cq(),
            cap,
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: sq_sig_all as c_int,
            comp_mask: sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            pd: pd.raw(),
            send_ops_flags,
            ..Default::default()
        };
        let raw_ctx = ctx.raw();
        // SAFETY: live context, PD and CQs (kept alive by the Qp); the op is
        // used only if the context provides it, as verbs.h does.
        let qp = unsafe {
            match verbs_get_ctx(raw_ctx) {
                Some(v)
                    if vctx_has(v, offset_of!(verbs_context, create_qp_ex))
                        && (*v).create_qp_ex.is_some() =>
                {
                    ((*v).create_qp_ex.unwrap())(raw_ctx, &mut attr)
                }
                _ => return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
            }
        };
        let raw = NonNull::new(qp).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: a QP created with send_ops_flags, which makes it an ibv_qp_ex.
        let qpx = NonNull::new(unsafe { ibv_qp_to_qp_ex(qp) });
        Ok(Qp {
            raw,
            cap: attr.cap,
            qpx,
            _pd: pd.clone(),
            _cqs: (send_cq.clone(), recv_cq.clone()),
        })
    }

    /// Posts `wrs` as one `ibv_wr_start` .. `ibv_wr_complete` batch through the
    /// QP's `ibv_qp_ex` builders (and xiwdv's). The error is what
    /// `ibv_wr_complete` returned, EOPNOTSUPP if the QP lacks a builder (it was
    /// not made by [`Qp::new_ex`], or the provider leaves the op out), or
    /// [`ENOSYS_XIWDV`] if the xiw direct verbs cannot be loaded; in those two
    /// cases the batch is aborted.
    ///
    /// The SGEs' memory must stay registered until the completions arrive.
    pub fn post_ex(&self, wrs: &[ExWr]) -> Result<(), i32> {
        let Some(qpx) = self.qpx else {
            return Err(libc::EOPNOTSUPP);
        };
        let q = qpx.as_ptr();
        // SAFETY: q is the live ibv_qp_ex of this QP. Each builder is one of its
        // function pointers (called only if set) or an xiwdv builder meant for
        // it, between wr_start and wr_complete/wr_abort as verbs.h requires;
        // every pointer handed over (SGE lists, atomic write value, expected
        // hash) lives in `wrs` until this call returns.
        unsafe {
            let (Some(start), Some(complete), Some(abort)) =
                ((*q).wr_start, (*q).wr_complete, (*q).wr_abort)
            else {
                return Err(libc::EOPNOTSUPP);
            };
            start(q);
            for w in wrs {
                (*q).wr_id = w.wr_id;
                (*q).wr_flags = w.flags;
                let missing = || -> Result<(), i32> { Err(libc::EOPNOTSUPP) };
                let xerr = |e: xiwdv::Error| match e {
                    xiwdv::Error::Unavailable(_) => ENOSYS_XIWDV,
                    e => e.errno(),
                };
                let r: Result<(), i32> = match &w.op {
                    ExOp::Send => (*q).wr_send.map(|f| f(q)).map_or_else(missing, Ok),
                    ExOp::SendImm { imm } => (*q)
                        .wr_send_imm
                        .map(|f| f(q, *imm))
                        .map_or_else(missing, Ok),
                    ExOp::Write { rkey, addr } => (*q)
                        .wr_rdma_write
                        .map(|f| f(q, *rkey, *addr))
                        .map_or_else(missing, Ok),
                    ExOp::WriteImm { rkey, addr, imm } => (*q)
                        .wr_rdma_write_imm
                        .map(|f| f(q, *rkey, *addr, *imm))
                        .map_or_else(missing, Ok),
                    ExOp::Read { rkey, addr } => (*q)
                        .wr_rdma_read
                        .map(|f| f(q, *rkey, *addr))
                        .map_or_else(missing, Ok),
                    ExOp::FetchAdd { rkey, addr, add } => (*q)
                        .wr_atomic_fetch_add
                        .map(|f| f(q, *rkey, *addr, *add))
                        .map_or_else(missing, Ok),
                    ExOp::CmpSwp {
                        rkey,
                        addr,
                        compare,
                        swap,
                    } => (*q)
                        .wr_atomic_cmp_swp
                        .map(|f| f(q, *rkey, *addr, *compare, *swap))
                        .map_or_else(missing, Ok),
                    ExOp::AtomicWrite { rkey, addr, value } => (*q)
                        .wr_atomic_write
                        .map(|f| f(q, *rkey, *addr, value.as_ptr() as *const c_void))
                        .map_or_else(missing, Ok),
                    ExOp::Flush {
                        rkey,
                        addr,
                        len,
                        placement,
                        level,
                    } => xiwdv::wr_flush(q, *rkey, *addr, *len, *placement, *level).map_err(xerr),
                    ExOp::Verify {
                        rkey,
                        addr,
                        len,
                        expected,
                    } => xiwdv::wr_verify(q, *rkey, *addr, *len, expected.as_deref()).map_err(xerr),
                    ExOp::MaskedFetchAdd {
                        rkey,
                        addr,
                        add,
                        boundary,
                    } => xiwdv::wr_atomic_masked_fetch_add(q, *rkey, *addr, *add, *boundary)
                        .map_err(xerr),
                    ExOp::MaskedCmpSwp {
                        rkey,
                        addr,
                        compare,
                        compare_mask,
                        swap,
                        swap_mask,
                    } => xiwdv::wr_atomic_masked_cmp_swp(
                        q,
                        *rkey,
                        *addr,
                        *compare,
                        *compare_mask,
                        *swap,
                        *swap_mask,
                    )
                    .map_err(xerr),
                    ExOp::Swap { rkey, addr, swap } => {
                        xiwdv::wr_atomic_swap(q, *rkey, *addr, *swap).map_err(xerr)
                    }
                };
                let r = r.and_then(|()| {
                    if !w.op.has_sges() {
                        return Ok(());
                    }
                    match w.sges.as_slice() {
                        [one] => (*q)
                            .wr_set_sge
                            .map(|f| f(q, one.lkey, one.addr, one.length))
                            .map_or_else(missing, Ok),
                        list => (*q)
                            .wr_set_sge_list
                            .map(|f| f(q, list.len(), list.as_ptr()))
                            .map_or_else(missing, Ok),
                    }
                });
                if let Err(e) = r {
                    abort(q);
                    return Err(e);
                }
            }
            match complete(q) {
                0 => Ok(()),
                e => Err(e),
            }
        }
    }

    /// Whether the QP has an `ibv_qp_ex` (made by [`Qp::new_ex`]).
    pub fn is_ex(&self) -> bool {
        self.qpx.is_some()
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

    /// RESET → INIT with the given remote access flags.
    pub fn to_init(&self, access: u32) -> Result<(), String> {
        let a = ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: access,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_PKEY_INDEX
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS;
        self.modify(&a, mask)
            .map_err(|e| format!("modify_qp to INIT: {}", errno_str(e)))
    }

    /// INIT → RTR (which starts the connection to the peer's GID and QPN, as
    /// standalone mode does) → RTS, with `rd_atomic` as both IRD and ORD.
    pub fn to_rts(&self, peer_gid: [u8; 16], peer_qpn: u32, rd_atomic: u8) -> Result<(), String> {
        let mut a = ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: sys::IBV_MTU_1024,
            dest_qp_num: peer_qpn,
            rq_psn: 0,
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid.raw = peer_gid;
        a.ah_attr.grh.sgid_index = 0;
        a.ah_attr.grh.hop_limit = 64;
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        self.modify(&a, mask)
            .map_err(|e| format!("modify_qp to RTR: {}", errno_str(e)))?;
        let a = ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: rd_atomic,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&a, mask)
            .map_err(|e| format!("modify_qp to RTS: {}", errno_str(e)))
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
                r.__bindgen_anon_1.imm_data = w.imm_data;
                if matches!(
                    w.opcode,
                    sys::IBV_WR_ATOMIC_CMP_AND_SWP | sys::IBV_WR_ATOMIC_FETCH_AND_ADD
                ) {
                    r.wr.atomic.remote_addr = w.remote_addr;
                    r.wr.atomic.compare_add = w.compare_add;
                    r.wr.atomic.swap = w.swap;
                    r.wr.atomic.rkey = w.rkey;
                } else {
                    // Everything else, IBV_WR_ATOMIC_WRITE among them, names its target in wr.rdma.
                    r.wr.rdma.remote_addr = w.remote_addr;
                    r.wr.rdma.rkey = w.rkey;
                }
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
