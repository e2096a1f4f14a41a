//! Receive driver: reads the stream into a buffer and runs the engine's
//! receive side over it ([`xiw_engine::recv`]); the engine reaches registered
//! memory, the receive queue and the queue 1 state through [`Placer`].

use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;

use xiw_abi::ring::{Cqe, Sge};
use xiw_abi::verbs::*;
use xiw_engine::recv::{self, Receiver, RecvCompletion, Whole};
use xiw_engine::send::{ReadArrival, Span};

use crate::events_page::StreamEvents;
use crate::mem::AccessError;
use crate::qp::core::{QpCore, ReadLend};
use crate::qp::tx::{Inbound, Outstanding, TxCell};
use crate::queue::{sge_spans, take_single, RecvJob, RecvSges};
use crate::sys;
use crate::verbs_status;
use crate::wire::mpa;

pub use xiw_engine::fault::{Fail, Status};

pub struct Rx {
    pub fd: Option<i32>,
    pub engine: Receiver<RecvJob>,
    /// Bytes read and not yet processed (the start of an FPDU).
    buf: Vec<u8>,
    /// Bytes came in since the last trim pass.
    active: bool,
    /// Kernel mode: the module places RDMA Writes from a stream it marks
    /// the events of, while the provider lends it the stream between passes.
    lendable: bool,
    /// Lent since the last read: the Write tally is the module's.
    lent: bool,
    /// Taken back with what the module left of that Read (the bytes still
    /// to come, whether it placed the last segment), for the engine to
    /// count ([`settle`]).
    read_back: Option<(recv::LentRead, u64, bool)>,
    /// Kernel mode: `Some` while `buf` starts with bytes the module handed
    /// up, not processed yet; true if the socket may hold more after them.
    handed: Option<bool>,
}

impl Default for Rx {
    fn default() -> Rx {
        Rx {
            fd: None,
            engine: Receiver::new(recv::Params::default()),
            buf: Vec::new(),
            active: false,
            lendable: false,
            lent: false,
            read_back: None,
            handed: None,
        }
    }
}

/// Receive buffer bounds: the largest FPDU (2 + 65535 + pad + CRC) always fits.
const RX_BUF_MIN: usize = 16 * 1024;
const RX_BUF_MAX: usize = 256 * 1024;

impl Rx {
    /// Frees the buffer of a QP that received nothing since the last pass;
    /// true while it still holds a large one.
    pub fn trim(&mut self) -> bool {
        let idle = !std::mem::replace(&mut self.active, false);
        if idle && self.buf.is_empty() && self.buf.capacity() > RX_BUF_MIN {
            self.buf = Vec::new();
        }
        self.buf.capacity() > RX_BUF_MIN
    }

    /// A stream is up: its receive side starts afresh (a receive taken by an
    /// earlier stream of this QP stays taken).
    pub fn establish(&mut self, fd: i32, p: recv::Params, lendable: bool) {
        let cur = self.engine.take_current();
        *self = Rx {
            fd: Some(fd),
            engine: Receiver::new(p),
            lendable,
            ..Default::default()
        };
        self.engine.use_crc32c(crate::crc::crc32c());
        if let Some(job) = cur {
            self.engine.resume(job);
        }
    }

    /// Takes the stream back from the module (kernel mode), which places
    /// nothing from the next batch of bytes on; the Write tally is taken at
    /// the next read, or now if the module handed the stream back with the
    /// next bytes in its slot (then done with it): those go into `buf`.
    pub fn recall(&mut self, qp: &QpCore) {
        let Some((ev, slot)) = qp.stream_events().filter(|_| self.lent) else {
            return;
        };
        let Some(h) = ev.recall(slot) else { return };
        self.taken_back(qp, ev, slot);
        // A stream is lent with nothing buffered.
        self.buf.extend_from_slice(&h.bytes[..h.len]);
        self.active = true;
        self.handed = Some(h.more);
    }

    /// The module is done with the stream lent to it: its Write tally is
    /// the engine's again, and the messages it raised the receive CQ's
    /// event for (it signals only while the stream is lent) are among the
    /// bytes from here on: their completions are owed.
    fn taken_back(&mut self, qp: &QpCore, ev: &StreamEvents, slot: u32) {
        self.lent = false;
        self.engine.take_back(ev.tally(slot));
        // Taken under the lock the transmit side lends a Read under.
        let lent = std::mem::take(&mut *qp.read_lend.lock());
        if let Some(r) = lent.lent {
            let (left, done) = ev.read_left(slot);
            self.read_back = Some((r, left, done));
        }
        qp.recv_cq.owe_signalled(ev, slot);
    }

    /// The initiator's first FPDU has not come yet (responder side).
    pub fn expects_rtr(&self) -> bool {
        self.engine.expects_rtr()
    }
}

/// Reads and processes everything available on the stream.
///
/// The buffer starts small and grows (up to `RX_BUF_MAX`) only while the stream
/// keeps it full or an FPDU needs the room, so an idle QP holds little memory.
pub fn on_readable(qp: &QpCore, rx: &Mutex<Rx>, tx: &TxCell) -> Result<(), Fail> {
    read_stream(qp, rx.lock(), tx, false)
}

/// As [`on_readable`], for a stream whose end may have come (kernel mode:
/// the module marked its state change): reads until the socket says it has
/// nothing more, so that an end behind the last bytes is not missed (no
/// further mark would come for it).
pub fn on_closed(qp: &QpCore, rx: &Mutex<Rx>, tx: &TxCell) -> Result<(), Fail> {
    read_stream(qp, rx.lock(), tx, true)
}

/// As [`on_readable`], unless another thread is receiving on this QP already.
pub fn poll_readable(qp: &QpCore, rx: &Mutex<Rx>, tx: &TxCell) -> Result<(), Fail> {
    match rx.try_lock() {
        Some(rx) => read_stream(qp, rx, tx, false),
        None => Ok(()),
    }
}

/// Reads and processes what the stream has. A read that fills less than it
/// asked for ends the pass (the socket is empty), unless `to_end`: then only
/// a read that finds nothing, the end or an error does.
///
/// Kernel mode: a pass takes the stream back from the module first, and
/// lends it again at its end if nothing is left buffered, so that RDMA
/// Writes that come meanwhile are placed without waking anyone.
fn read_stream(
    qp: &QpCore,
    mut rx: MutexGuard<'_, Rx>,
    tx: &TxCell,
    to_end: bool,
) -> Result<(), Fail> {
    let Some(fd) = rx.fd else { return Ok(()) };
    if rx.lent && !to_end {
        if let Some((ev, slot)) = qp.stream_events().filter(|(ev, slot)| ev.still_lent(*slot)) {
            if let Some(r) = answered_lent(qp, &mut rx, tx, ev, slot) {
                return r;
            }
        }
    }
    rx.recall(qp);
    settle(qp, &mut rx, tx)?;
    let events = qp.stream_events().filter(|_| rx.lendable);
    let r = match rx.handed.take() {
        // What the module handed up comes first; with nothing more in the
        // socket, no read for it (bytes that come later are marked for a
        // later pass).
        Some(more) => take_in(qp, &mut rx, tx).and_then(|()| {
            if more || to_end {
                read_loop(qp, &mut rx, tx, to_end, fd, events)
            } else {
                Ok(())
            }
        }),
        None => read_loop(qp, &mut rx, tx, to_end, fd, events),
    };
    if let (Some((ev, slot)), Ok(())) = (events, &r) {
        if rx.fd.is_some() && rx.buf.is_empty() {
            if let Some(t) = rx.engine.lend() {
                let read = lend_read(qp, tx);
                ev.lend(slot, t, read);
                *qp.read_lend.lock() = ReadLend {
                    open: read.is_none() && qp.sh.cfg.kernel_place_reads,
                    lent: read,
                };
                rx.lent = true;
            }
        }
    }
    r
}

/// The loop of [`read_stream`].
fn read_loop(
    qp: &QpCore,
    rx: &mut Rx,
    tx: &TxCell,
    to_end: bool,
    fd: i32,
    events: Option<(&StreamEvents, u32)>,
) -> Result<(), Fail> {
    loop {
        if let Some((span, allowed)) = rx.engine.direct() {
            // A large payload: read straight into the memory the engine
            // named, checked again under the MR table's read lock, which is
            // held until the bytes are in (deregistration waits for it).
            let want = span.len as usize;
            let got = qp.sh.mrs.with_reader(|mrs| {
                let at = mrs.mem(span.stag, qp.by(), span.to, want, span.need, allowed)?;
                // SAFETY: `at` is `want` bytes of registered memory, writable as
                // checked just now; `fd` is the QP's stream.
                let n = unsafe { sys::recv_raw(fd, at, want, libc::MSG_DONTWAIT) };
                if n > 0 {
                    // SAFETY: recv wrote these `n` bytes; the MR stays registered
                    // while the read lock is held.
                    let placed = unsafe { std::slice::from_raw_parts(at as *const u8, n as usize) };
                    rx.engine.direct_placed(placed);
                }
                Ok(n)
            });
            let n = match got {
                Ok(n) => n,
                Err(e) => {
                    rx.fd = None;
                    return Err(rx.engine.direct_lost(e));
                }
            };
            if n <= 0 {
                match stream_end(qp, rx, fd, n) {
                    Some(r) => return r,
                    None => continue,
                }
            }
            rx.active = true;
            if (n as usize) < want && !to_end {
                return Ok(());
            }
            continue;
        }
        let need = mpa::peek_fpdu_len(&rx.buf).unwrap_or(0).max(RX_BUF_MIN);
        let cap = rx.buf.capacity();
        if cap < need || cap - rx.buf.len() < RX_BUF_MIN / 4 {
            let want = need.max((cap * 2).min(RX_BUF_MAX));
            let len = rx.buf.len();
            rx.buf.reserve_exact(want - len);
        }
        let hint = rx.engine.read_hint();
        let spare = rx.buf.spare_capacity_mut();
        let room = hint.map_or(spare.len(), |h| h.min(spare.len()));
        // SAFETY: recv writes at most `room` bytes into the spare capacity of `buf`;
        // `fd` is the QP's stream, open while the QP lives.
        let n =
            unsafe { sys::recv_raw(fd, spare.as_mut_ptr() as *mut u8, room, libc::MSG_DONTWAIT) };
        if rx.lent {
            // The read waited for a batch the module was placing: its
            // tally is final now (a stream lent has nothing buffered, so
            // this is the pass's first read).
            match events {
                Some((ev, slot)) => rx.taken_back(qp, ev, slot),
                None => rx.lent = false,
            }
            settle(qp, rx, tx)?;
        }
        if n <= 0 {
            match stream_end(qp, rx, fd, n) {
                Some(r) => return r,
                None => continue,
            }
        }
        rx.active = true;
        let len = rx.buf.len() + n as usize;
        // SAFETY: recv initialised the first `n` bytes of the spare capacity.
        unsafe { rx.buf.set_len(len) };
        take_in(qp, rx, tx)?;
        if (n as usize) < room && !to_end {
            return Ok(());
        }
    }
}

/// The Read Responses the module may place with the stream lent: those of
/// the oldest outstanding Read, if its sink is placeable from a Read
/// Response's STag and TO alone ([`recv::LentRead::of`];
/// XIW_KERNEL_PLACE_READS=0: none). The receive loop calls this at the end
/// of every pass, so it never waits for the transmit side: with its lock
/// taken, no Read is lent (the transmit side offers one as it frames it).
fn lend_read(qp: &QpCore, tx: &TxCell) -> Option<recv::LentRead> {
    if !qp.sh.cfg.kernel_place_reads {
        return None;
    }
    let tx = tx.try_lock(qp)?;
    let Some(Outstanding::Read(pr)) = tx.engine.orq.front() else {
        return None;
    };
    recv::LentRead::of(pr, |l, off, n, spans| locate_sink(qp, l, off, n, spans))
}

/// The spans of registered memory `n` bytes of local buffer list `l` from
/// offset `off` occupy, each checked for a local write ([`recv::Host::locate_local`]).
fn locate_sink(
    qp: &QpCore,
    l: &Arc<[Sge]>,
    off: u64,
    n: usize,
    spans: &mut Vec<Span>,
) -> Result<bool, AccessError> {
    qp.sh.mrs.with_reader(|r| {
        r.spans(
            qp.by(),
            sge_spans(l, off, n),
            n,
            IBV_ACCESS_LOCAL_WRITE,
            spans,
        )
    })
}

/// The transmit side framed requests, and the oldest outstanding is
/// `oldest`: if it is a Read none of whose data has come, and the stream
/// is lent with no Read, its Read Responses are lent too (before the
/// request goes out, so that the module can place them all). Never waits
/// for the receive side.
pub fn offer_read(qp: &QpCore, oldest: Option<&Outstanding>) {
    let Some(Outstanding::Read(pr)) = oldest else {
        return;
    };
    if pr.received != 0 {
        return;
    }
    let Some(mut g) = qp.read_lend.try_lock() else {
        return;
    };
    if !g.open {
        return;
    }
    // One try per lending of the stream.
    g.open = false;
    let Some((ev, slot)) = qp.stream_events() else {
        return;
    };
    let Some(r) = recv::LentRead::of(pr, |l, off, n, spans| locate_sink(qp, l, off, n, spans))
    else {
        return;
    };
    ev.lend_read(slot, r);
    g.lent = Some(r);
}

/// The stream is still lent, and the module placed the last Read Response
/// of the Read lent with it: the Read completes, and the next Read's Read
/// Responses (or, with none outstanding, the next Read framed: `open`) are
/// lent in its place, all without taking the stream back. Then nothing is
/// left in the socket for this side: the module took everything up to that
/// Read Response from the head of the stream (bytes that came while the
/// stream was not lent, and were marked, included), and leaves in it only
/// what it gives the stream back at. `None` if that is not so: the stream
/// is read as usual.
fn answered_lent(
    qp: &QpCore,
    rx: &mut Rx,
    tx: &TxCell,
    ev: &StreamEvents,
    slot: u32,
) -> Option<Result<(), Fail>> {
    {
        let mut g = qp.read_lend.lock();
        let lent = g.lent?;
        let (left, done) = ev.read_left(slot);
        if !done {
            return None;
        }
        // Neither side lends another Read until this one is counted.
        g.lent = None;
        g.open = false;
        rx.read_back = Some((lent, left, done));
    }
    if let Err(f) = settle(qp, rx, tx) {
        return Some(Err(f));
    }
    let next = lend_read(qp, tx);
    let mut g = qp.read_lend.lock();
    match next {
        Some(r) => {
            ev.lend_read(slot, r);
            g.lent = Some(r);
        }
        None => g.open = qp.sh.cfg.kernel_place_reads,
    }
    Some(Ok(()))
}

/// Counts what the module placed of a Read lent to it, once the stream is
/// back: with its last segment the Read completes (and an ORD credit is
/// free); a Read flushed meanwhile ends the stream.
fn settle(qp: &QpCore, rx: &mut Rx, tx: &TxCell) -> Result<(), Fail> {
    let Some((lent, left, done)) = rx.read_back.take() else {
        return Ok(());
    };
    let r = with_host(qp, tx, |host| rx.engine.read_back(host, lent, left, done));
    if r.is_err() {
        rx.fd = None;
    }
    r
}

/// Runs `f` with the engine's view of the QP, then transmits what it made
/// due (responses, freed ORD credits), once for all of it.
fn with_host<T>(qp: &QpCore, tx: &TxCell, f: impl FnOnce(&mut Placer<'_>) -> T) -> T {
    let mut want_kick = false;
    let r = f(&mut Placer {
        qp,
        tx,
        want_kick: &mut want_kick,
    });
    if want_kick {
        tx.kick(qp);
    }
    r
}

/// Processes the bytes read so far: checks, placement, completions, queue 1
/// work; on a failure the stream is given up. Kept out of line, so that `xiw-bench --instr` can count the receiving
/// side's instructions, from bytes read to placement and CQE, as this
/// function's.
#[inline(never)]
fn take_in(qp: &QpCore, rx: &mut Rx, tx: &TxCell) -> Result<(), Fail> {
    // Responses or freed ORD credits go out once the bytes read so far are
    // processed, so a burst of requests is answered in few writes.
    let (used, r) = with_host(qp, tx, |host| rx.engine.handle(host, &rx.buf));
    rx.buf.drain(..used);
    if r.is_err() {
        // The stream is dead from this byte on: no thread may place anything
        // after it (the engine has completed the receive it hit already,
        // before any flush can claim it).
        rx.fd = None;
    }
    r
}

/// What a `recv` that returned `n <= 0` means: the end of this pass
/// (`Some`), or try again (`None`, interrupted).
fn stream_end(qp: &QpCore, rx: &mut Rx, fd: i32, n: isize) -> Option<Result<(), Fail>> {
    if n == 0 {
        // An orderly close: nothing more will come. Stop watching the stream
        // for input (EOF stays readable), keep sending what is posted, and
        // let the QP linger before it fails.
        rx.fd = None;
        qp.rx_eof.store(true, std::sync::atomic::Ordering::Release);
        qp.watch_stream(
            fd,
            false,
            qp.tx_blocked.load(std::sync::atomic::Ordering::Acquire),
        );
        return Some(Err(Fail {
            linger: true,
            ..Fail::stream("peer closed the connection")
        }));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Some(Ok(())),
        Some(libc::EINTR) => None,
        _ => Some(Err(crate::tcp::stream_error("recv", &e))),
    }
}

/// The provider's side of the engine's receive path.
struct Placer<'a> {
    qp: &'a QpCore,
    tx: &'a TxCell,
    want_kick: &'a mut bool,
}

impl recv::Host for Placer<'_> {
    type Recv = RecvJob;
    type Local = Arc<[Sge]>;

    fn place(
        &mut self,
        stag: u32,
        to: u64,
        data: &[u8],
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessError> {
        let qp = self.qp;
        qp.sh
            .mrs
            .write_allowed(stag, qp.by(), to, data, need, allowed)
    }

    fn check(
        &mut self,
        stag: u32,
        to: u64,
        len: u64,
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessError> {
        let len = usize::try_from(len).map_err(|_| AccessError::Bounds)?;
        let qp = self.qp;
        qp.sh.mrs.check(stag, qp.by(), to, len, need, allowed)
    }

    fn in_place(&mut self, stag: u32) -> bool {
        self.qp.sh.mrs.in_place(stag)
    }

    fn aligned8(
        &mut self,
        stag: u32,
        to: u64,
        need: u32,
        allowed: u32,
    ) -> Result<bool, AccessError> {
        let qp = self.qp;
        qp.sh
            .mrs
            .with_mem_allowed(stag, qp.by(), to, 8, need, allowed, |p| {
                (p as usize).is_multiple_of(8)
            })
    }

    fn invalidate(&mut self, stag: u32) -> Result<(), AccessError> {
        let qp = self.qp;
        // Shared on several streams: another QP of the protection domain.
        let mut shared = || qp.sh.qps.pd_count(qp.pd) > 1;
        qp.sh.mrs.invalidate_remote(stag, qp.by(), &mut shared)
    }

    fn take_recv(&mut self) -> Option<RecvJob> {
        self.qp.take_recv()
    }

    fn recv_len(&self, r: &RecvJob) -> u64 {
        r.length
    }

    fn scatter_recv(&mut self, r: &RecvJob, off: u64, data: &[u8]) -> Result<(), AccessError> {
        scatter(self.qp, &r.sges, off, data)
    }

    fn recv_done(&mut self, job: RecvJob, c: RecvCompletion) {
        self.complete(job.wr_id, c);
    }

    #[inline]
    fn recv_whole(&mut self, data: &[u8], c: RecvCompletion) -> Result<(), Whole<RecvJob>> {
        let qp = self.qp;
        let Some(rq) = qp.rq.as_ref() else {
            return recv::recv_whole_by_parts(self, data, c);
        };
        // The receive is read where it was posted, its slot released before
        // anything else happens, as taking it off the ring would.
        let Some((wr_id, sge)) = take_single(rq) else {
            return recv::recv_whole_by_parts(self, data, c);
        };
        let job = || RecvJob {
            wr_id,
            sges: RecvSges::from_buf([sge]),
            length: u64::from(sge.length),
        };
        if data.len() > sge.length as usize {
            return Err(Whole::TooLong(job()));
        }
        if qp
            .sh
            .mrs
            .write(sge.lkey, qp.by(), sge.addr, data, IBV_ACCESS_LOCAL_WRITE)
            .is_err()
        {
            return Err(Whole::BadBuffer(job()));
        }
        self.complete(wr_id, c);
        Ok(())
    }

    fn recv_failed(&mut self, job: RecvJob, status: Status) {
        self.qp
            .complete_recv_error(&job, verbs_status::status(status));
    }

    fn scatter(&mut self, l: &Arc<[Sge]>, off: u64, data: &[u8]) -> Result<(), AccessError> {
        scatter(self.qp, l, off, data)
    }

    fn local_len(&self, l: &Arc<[Sge]>) -> u64 {
        l.iter().map(|s| s.length as u64).sum()
    }

    fn locate_local(
        &mut self,
        l: &Arc<[Sge]>,
        off: u64,
        n: usize,
        spans: &mut Vec<Span>,
    ) -> Result<bool, AccessError> {
        locate_sink(self.qp, l, off, n, spans)
    }

    fn oldest_outstanding(&mut self) -> Option<Outstanding> {
        self.tx.lock(self.qp).engine.orq.front().cloned()
    }

    fn read_arrived(&mut self, n: u64, last: bool) -> bool {
        let qp = self.qp;
        let mut tx = self.tx.lock(qp);
        match tx.engine.read_arrived(n, last) {
            ReadArrival::Answered(idx) => {
                tx.read_done(qp, idx, IBV_WC_SUCCESS);
                // An ORD credit is free.
                *self.want_kick = true;
            }
            ReadArrival::More => {}
            ReadArrival::Gone => return false,
        }
        true
    }

    fn answered(&mut self, len: Option<u32>) {
        let qp = self.qp;
        let mut tx = self.tx.lock(qp);
        // Gone already if another thread flushed the QP meanwhile.
        if let Some(idx) = tx.engine.answer_oldest() {
            match len {
                Some(n) => tx.response_done(qp, idx, n),
                None => tx.read_done(qp, idx, IBV_WC_SUCCESS),
            }
        }
        drop(tx);
        *self.want_kick = true;
    }

    fn queue_request(&mut self, req: Inbound) -> bool {
        let queued = self.tx.lock(self.qp).engine.queue_request(req);
        *self.want_kick |= queued;
        queued
    }

    fn may_transmit(&mut self) {
        let qp = self.qp;
        crate::log::debug(
            &qp.sh.log,
            format_args!("qp {}: the peer's first FPDU came", qp.qpn),
        );
        self.tx.lock(qp).engine.gate = false;
        self.tx.kick(qp);
    }
}

impl Placer<'_> {
    /// Completes the receive `wr_id` as `c` says.
    #[inline]
    fn complete(&mut self, wr_id: u64, c: RecvCompletion) {
        let qp = self.qp;
        let mut cqe = Cqe {
            wr_id,
            byte_len: c.byte_len,
            qp_num: qp.qpn,
            opcode: if c.after_write {
                IBV_WC_RECV_RDMA_WITH_IMM
            } else {
                IBV_WC_RECV
            } as u8,
            status: IBV_WC_SUCCESS as u8,
            ..Default::default()
        };
        if let Some(imm) = c.imm {
            cqe.wc_flags = IBV_WC_WITH_IMM as u8;
            cqe.imm_or_inv = imm;
        }
        if let Some(stag) = c.invalidated {
            cqe.wc_flags = IBV_WC_WITH_INV as u8;
            cqe.imm_or_inv = stag;
        }
        if c.solicited {
            cqe.wc_flags |= xiw_abi::ring::CQE_F_SOLICITED;
        }
        qp.push_recv_cqe(cqe);
    }
}

/// Copies `data` into the SGE list at message offset `off`, checking each SGE.
fn scatter(qp: &QpCore, sges: &[Sge], off: u64, mut data: &[u8]) -> Result<(), AccessError> {
    if let [s] = sges {
        // One SGE: bounds are the MR table's to check, once the offset is in it.
        if off + data.len() as u64 > u64::from(s.length) {
            return Err(AccessError::Bounds);
        }
        return qp.sh.mrs.write(
            s.lkey,
            qp.by(),
            s.addr.wrapping_add(off),
            data,
            IBV_ACCESS_LOCAL_WRITE,
        );
    }
    for (lkey, addr, take) in sge_spans(sges, off, data.len()) {
        qp.sh
            .mrs
            .write(lkey, qp.by(), addr, &data[..take], IBV_ACCESS_LOCAL_WRITE)?;
        data = &data[take..];
    }
    Ok(())
}
