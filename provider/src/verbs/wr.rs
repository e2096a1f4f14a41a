//! The `ibv_qp_ex` work request builders. `ibv_wr_start` ..
//! `ibv_wr_complete`/`ibv_wr_abort` is a per-QP critical section (ibv_wr_post(3)).

use super::*;

/// Who is between `wr_start` and `wr_complete`/`wr_abort`, and what they built.
#[derive(Default)]
pub(super) struct Section {
    owner: Option<ThreadId>,
    batch: Batch,
}

thread_local! {
    static THREAD: ThreadId = std::thread::current().id();
}

pub(super) fn this_thread() -> ThreadId {
    THREAD.with(|t| *t)
}

#[derive(Default)]
pub(super) struct Batch {
    items: Vec<(SendWqe, SendBody)>,
    /// The WR being built: its header and `ibv_send_flags`, waiting for a payload.
    pending: Option<(SendWqe, u32)>,
    /// Why the batch fails (the last of the builders' errors).
    err: Option<Error>,
}

impl Batch {
    fn seal(&mut self, q: &Qp, sges: SgeList, inline: bool) {
        let Some((wqe, flags)) = self.pending.take() else {
            return;
        };
        let flags = if inline {
            flags | IBV_SEND_INLINE
        } else {
            flags & !IBV_SEND_INLINE
        };
        if !inline && sges.len() > q.caps.max_send_sge as usize {
            self.err = Some(Error::invalid("more SGEs than the QP takes"));
            return;
        }
        match finish_wqe(q, wqe, flags, sges) {
            Ok(item) => self.items.push(item),
            Err(e) => self.err = Some(e),
        }
    }
}

pub(super) unsafe fn qpx<'a>(q: *mut ibv_qp_ex) -> &'a XiwQp {
    // SAFETY: every ibv_qp_ex handed out is the first member of an XiwQp.
    unsafe { &*(q as *mut XiwQp) }
}

impl XiwQp {
    fn lock_section(&self) -> parking_lot::MutexGuard<'_, Section> {
        self.section.lock()
    }
}

/// Runs a builder on the batch of the calling thread's section; a builder
/// called outside `wr_start` .. `wr_complete` is ignored (another thread may be
/// building its own batch on this QP).
pub(super) fn with_batch(q: *mut ibv_qp_ex, f: impl FnOnce(&XiwQp, &mut Batch)) {
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

/// Starts a new WR, made by `make` from the wr_id the application set on
/// the QP, with the flags it set there.
pub(super) fn begin(q: *mut ibv_qp_ex, make: impl FnOnce(u64) -> SendWqe) {
    with_batch(q, |x, b| {
        // SAFETY: ours; read only by the section's owner (this thread), who
        // set them for this WR.
        let (wr_id, flags) = unsafe { ((*q).wr_id, (*q).wr_flags) };
        b.seal(&x.qp, SgeList::new(), false);
        b.pending = Some((make(wr_id), flags));
    })
}

/// Enters the QP's critical section, waiting while another thread is in it.
pub(super) unsafe extern "C" fn wr_start(q: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: ours.
        let x = unsafe { qpx(q) };
        let me = this_thread();
        let mut sec = x.lock_section();
        while sec.owner.is_some_and(|o| o != me) {
            x.section_free.wait(&mut sec);
        }
        // A second wr_start without wr_complete starts over.
        sec.owner = Some(me);
        sec.batch = Batch::default();
    })
}

/// Leaves the section if the calling thread holds it; its batch, if so.
pub(super) fn leave_section(x: &XiwQp) -> Option<Batch> {
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
pub(super) unsafe extern "C" fn wr_complete(q: *mut ibv_qp_ex) -> i32 {
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
        batch.seal(&x.qp, SgeList::new(), false);
        if let Some(e) = batch.err {
            return e.errno();
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

pub(super) unsafe extern "C" fn wr_abort(q: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: ours.
        leave_section(unsafe { qpx(q) });
    })
}

pub(super) unsafe extern "C" fn wr_send(q: *mut ibv_qp_ex) {
    begin(q, wqe::send)
}

pub(super) unsafe extern "C" fn wr_send_inv(q: *mut ibv_qp_ex, inv: u32) {
    begin(q, |id| wqe::send_inv(id, inv))
}

pub(super) unsafe extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(q, |id| wqe::write(id, rkey, addr))
}

pub(super) unsafe extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(q, |id| wqe::read(id, rkey, addr))
}

pub(super) unsafe extern "C" fn wr_local_inv(q: *mut ibv_qp_ex, rkey: u32) {
    begin(q, |id| wqe::local_inv(id, rkey))
}

pub(super) unsafe extern "C" fn wr_bind_mw(
    q: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    if info.is_null() {
        return fail_batch(q, Error::invalid("no bind information"));
    }
    // SAFETY: the caller's window and bind information.
    match unsafe { window_bind(mw, IBV_MW_TYPE_2, rkey, &*info) } {
        Ok(bind) => begin(q, |id| wqe::bind_mw(id, &bind)),
        Err(e) => fail_batch(q, e),
    }
}

pub(super) unsafe extern "C" fn wr_rdma_write_imm(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    imm: u32,
) {
    begin(q, |id| wqe::write_imm(id, rkey, addr, imm))
}

pub(super) unsafe extern "C" fn wr_send_imm(q: *mut ibv_qp_ex, imm: u32) {
    begin(q, |id| wqe::send_imm(id, imm))
}

pub(super) unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(q, |id| {
        wqe::atomic(id, rkey, addr, AtomicOp::CmpSwap { compare, swap })
    })
}

pub(super) unsafe extern "C" fn wr_atomic_fetch_add(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    add: u64,
) {
    begin(q, |id| {
        wqe::atomic(id, rkey, addr, AtomicOp::FetchAdd { add })
    })
}

pub(super) unsafe extern "C" fn wr_atomic_write(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    data: *const c_void,
) {
    if data.is_null() {
        with_batch(q, |_, b| {
            b.err = Some(Error::invalid("no data for the Atomic Write"))
        });
        return;
    }
    let mut v = [0u8; 8];
    // SAFETY: the verbs contract: `data` points at the 8 bytes to write, read now.
    unsafe { ptr::copy_nonoverlapping(data as *const u8, v.as_mut_ptr(), 8) };
    let value = u64::from_ne_bytes(v);
    begin(q, |id| wqe::atomic_write(id, rkey, addr, value))
}

/// `enum ibv_placement_type` (rdma-core 45 and later) and xiwdv's.
const PLACEMENT_GLOBAL: u8 = 1 << 0;
const PLACEMENT_PERSISTENT: u8 = 1 << 1;
/// `IBV_FLUSH_RANGE` / `XIWDV_FLUSH_RANGE`.
const SELECT_RANGE: u8 = 0;

/// The Flush Request's flags for `ibv_wr_flush`/`xiwdv_wr_flush`
/// arguments, or why they have no wire form.
pub(crate) fn flush_flags(len: usize, kind: u8, level: u8) -> Result<u8, Error> {
    if level != SELECT_RANGE {
        // The draft's Flush Request names a range; a whole-MR flush has no wire form.
        return Err(Error::invalid(
            "only the range selectivity (FLUSH_RANGE) exists on the wire",
        ));
    }
    if kind == 0 || kind & !(PLACEMENT_GLOBAL | PLACEMENT_PERSISTENT) != 0 {
        return Err(Error::invalid(
            "type must be FLUSH_GLOBAL and/or FLUSH_PERSISTENT",
        ));
    }
    if u32::try_from(len).is_err() {
        return Err(Error::invalid(
            "length does not fit the 32-bit Data Sink Length",
        ));
    }
    let mut flags = 0u32;
    if kind & PLACEMENT_PERSISTENT != 0 {
        flags |= crate::wire::commit::FLUSH_PERSISTENCE;
    }
    if kind & PLACEMENT_GLOBAL != 0 {
        flags |= crate::wire::commit::FLUSH_GLOBAL_VISIBILITY;
    }
    Ok(flags as u8)
}

/// `ibv_wr_flush` (rdma-core 45 and later): the commit draft's RDMA Flush of
/// `[addr, addr+len)` of `rkey`; arguments without a wire form make the
/// batch fail with EINVAL.
pub(super) unsafe extern "C" fn wr_flush(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    len: usize,
    kind: u8,
    level: u8,
) {
    guard((), || match flush_flags(len, kind, level) {
        // `len` fits 32 bits (see flush_flags).
        Ok(flags) => begin(q, |id| wqe::flush(id, rkey, addr, len as u32, flags)),
        Err(e) => fail_batch(q, e),
    })
}

/// Starts an xiw-only WR (xiwdv.h) on a QP the caller says is xiw's.
pub(crate) fn begin_dv(q: *mut ibv_qp_ex, make: impl FnOnce(u64) -> SendWqe) {
    begin(q, make)
}

/// Makes the next wr_complete on `q` fail with `err`'s errno.
pub(crate) fn fail_batch(q: *mut ibv_qp_ex, err: Error) {
    with_batch(q, |_, b| {
        b.pending = None;
        b.err = Some(err);
    })
}

pub(super) fn set_payload(q: *mut ibv_qp_ex, sges: SgeList, inline: bool) {
    with_batch(q, |x, b| {
        if b.pending.is_none() {
            b.err = Some(Error::invalid("a payload for no work request"));
            return;
        }
        b.seal(&x.qp, sges, inline);
    })
}

pub(super) unsafe extern "C" fn wr_set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    set_payload(q, smallvec::smallvec![Sge { addr, length, lkey }], false)
}

pub(super) unsafe extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // SAFETY: the caller passes `n` SGEs at `list`.
    set_payload(q, unsafe { sge_list(list, n) }, false)
}

pub(super) unsafe extern "C" fn wr_set_inline_data(
    q: *mut ibv_qp_ex,
    addr: *mut c_void,
    length: usize,
) {
    set_payload(
        q,
        smallvec::smallvec![Sge {
            addr: addr as u64,
            length: length as u32,
            lkey: 0,
        }],
        true,
    )
}

pub(super) unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    let sges = if n == 0 || list.is_null() {
        SgeList::new()
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
