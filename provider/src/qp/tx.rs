//! Transmit driver: runs the engine's transmit side ([`xiw_engine::send`]) and
//! writes what it frames to the stream; takes work requests from the send
//! queue ring and reports their completions in ring order.
//!
//! Whoever posts work transmits it on its own thread when it can take the `tx`
//! lock; when the socket is full the progress thread finishes the job on EPOLLOUT.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use xiw_abi::ring::{wqe_flag, SendWqe, Sge};
use xiw_abi::verbs::*;
use xiw_engine::send::{self, Completion, NowOp, Piece, Sender, Span, WindowBind, Wr, WrClass};

use crate::mem::{AccessError, NEED_NONE};
use crate::qp::core::{QpCore, SgeList};
use crate::queue::{sge_spans, sges_of, MAX_SGE};
use crate::sys;
use crate::wqe;
pub use xiw_engine::fault::Fail;

use xiw_engine::queue1::Outcome;
pub use xiw_engine::queue1::{flush_need, Inbound, ReadResp};

/// A queue 1 request this side issued, with the SGEs its response lands in.
pub type Outstanding = xiw_engine::queue1::Outstanding<Arc<[Sge]>>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    /// Taken by the engine; not finished yet.
    Sent,
    Done(u32),
    /// Done, with a byte count other than the WQE's own (the hash of a Verify).
    DoneLen(u32, u32),
}

/// Where a work request's payload comes from: its SGEs, or its inline bytes
/// in its send queue slot (which stays put until the request completes).
#[derive(Debug)]
pub enum Body {
    Sges(SgeList),
    Inline { idx: u32, len: u32 },
}

pub struct Tx {
    /// Stream descriptor once the connection is established.
    pub fd: Option<i32>,
    pub engine: Sender<Arc<[Sge]>, Body>,
    /// Next SQ index the engine takes.
    pub next: u32,
    slots: Vec<Option<Slot>>,
    want_out: bool,
}

impl Tx {
    pub fn new(entries: u32) -> Tx {
        let mut engine = Sender::default();
        engine.use_crc32c(crate::crc::crc32c());
        Tx {
            fd: None,
            engine,
            next: 0,
            slots: vec![None; entries as usize],
            want_out: false,
        }
    }

    /// Frees the framing buffer of a QP that sent nothing since the last pass;
    /// true while it still holds a large one.
    pub fn trim(&mut self) -> bool {
        self.engine.trim()
    }

    /// Bytes framed but not yet taken by the socket.
    pub fn pending(&self) -> bool {
        self.engine.has_pending()
    }

    fn slot(&mut self, idx: u32) -> &mut Option<Slot> {
        slot_of(&mut self.slots, idx)
    }

    /// Frames and writes whatever can go now.
    pub fn run(&mut self, qp: &QpCore) -> Result<(), Fail> {
        let Some(fd) = self.fd else { return Ok(()) };
        loop {
            if !self.write_out(qp, fd)? {
                self.complete_written(qp);
                return Ok(());
            }
            let Tx {
                engine,
                next,
                slots,
                ..
            } = self;
            let framed = engine.frame_more(&mut SqHost { qp, next, slots })?;
            if framed {
                crate::qp::rx::offer_read(qp, engine.orq.front());
            }
            // Also what finished without a byte to send (a Local Invalidate):
            // nothing else would report it on an idle stream.
            self.complete_written(qp);
            if !framed {
                break;
            }
        }
        self.arm_out(qp, fd, false);
        Ok(())
    }

    /// Hands the engine's pending bytes to the stream until it has taken
    /// them all (true) or the socket is full (false: EPOLLOUT is armed).
    fn write_out(&mut self, qp: &QpCore, fd: i32) -> Result<bool, Fail> {
        while self.engine.has_pending() {
            let r = if self.engine.has_spans() {
                send_pieces(&self.engine, qp, fd)?
            } else {
                // SAFETY: `fd` is the QP's stream, kept open until the QP is dropped.
                unsafe { sys::send_now(fd, self.engine.pending()) }
            };
            match r {
                Ok(n) => self.engine.advance(n),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        self.arm_out(qp, fd, true);
                        return Ok(false);
                    }
                    Some(libc::EINTR) => continue,
                    _ => return Err(crate::tcp::stream_error("send", &e)),
                },
            }
        }
        Ok(true)
    }

    /// Frames `op`, a request of `len` payload bytes that `fill` gathers,
    /// and hands it to the stream at once, if nothing is queued ahead of it
    /// (see [`Sender::frame_now`]); the caller has checked that the send
    /// queue holds nothing unfinished. `Ok(None)`: not taken, nothing changed
    /// (also when `fill` fails). `Ok(Some(true))`: the stream took all of it,
    /// the request is complete. `Ok(Some(false))` or `Err`: it is framed, and
    /// the caller names it with [`Tx::owe`].
    pub fn send_now(
        &mut self,
        qp: &QpCore,
        op: NowOp,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), AccessError>,
    ) -> Result<Option<bool>, Box<Fail>> {
        let Some(fd) = self.fd else { return Ok(None) };
        if self.engine.frame_now(op, len, fill) != Ok(true) {
            return Ok(None);
        }
        // The FPDU just framed is all that is pending (the sender was idle,
        // and a request framed now is never sent in place): one send of it,
        // usually taken whole.
        let out = self.engine.pending();
        let want = out.len();
        // SAFETY: `fd` is the QP's stream, kept open until the QP is dropped.
        if let Ok(n) = unsafe { sys::send_now(fd, out) } {
            self.engine.advance(n);
            if n == want {
                return Ok(Some(true));
            }
        }
        // Part of it, or nothing (the stream is full, or failing): the usual
        // way, which retries and arms the stream or reports the error.
        self.write_out(qp, fd).map(Some).map_err(Box::new)
    }

    /// The request [`Tx::send_now`] left partly unsent is send queue index
    /// `idx`, just published: it completes once the stream takes the rest.
    pub fn owe(&mut self, idx: u32) {
        debug_assert_eq!(idx, self.next, "the send queue was empty");
        self.next = idx.wrapping_add(1);
        *self.slot(idx) = Some(Slot::Sent);
        self.engine.complete_at(idx);
    }

    fn arm_out(&mut self, qp: &QpCore, fd: i32, on: bool) {
        if self.want_out != on {
            self.want_out = on;
            qp.tx_blocked.store(on, Ordering::Release);
            qp.watch_stream(fd, !qp.rx_eof.load(Ordering::Acquire), on);
        }
    }

    fn complete_written(&mut self, qp: &QpCore) {
        let Tx {
            engine,
            next,
            slots,
            ..
        } = self;
        engine.complete_written(&mut SqHost { qp, next, slots });
        self.complete_ready(qp);
    }

    /// Reports finished SQ WQEs, strictly in order (RFC 5040 section 5.5). The slots
    /// are released before the completions become visible, so an application that
    /// sees a completion can always post again.
    pub fn complete_ready(&mut self, qp: &QpCore) {
        let mut c = qp.sq.consumer();
        while c != self.next {
            let (status, len) = match *self.slot(c) {
                Some(Slot::Done(status)) => (status, None),
                Some(Slot::DoneLen(status, len)) => (status, Some(len)),
                _ => break,
            };
            *self.slot(c) = None;
            // SAFETY: slot `c` lies in [consumer, producer): posted and not yet released,
            // so its contents are stable until the release below.
            let wqe: SendWqe = unsafe { qp.sq.read(c, 0) };
            c = c.wrapping_add(1);
            qp.sq.release(c);
            qp.complete_send_len(&wqe, status, len);
        }
    }

    /// The media worker finished `ticket`; false if the QP gave up on it meanwhile.
    pub fn media_done(&mut self, ticket: u64, outcome: Outcome) -> bool {
        self.engine.media_done(ticket, outcome)
    }

    /// Marks the oldest outstanding queue 1 request as answered.
    pub fn read_done(&mut self, qp: &QpCore, idx: u32, status: u32) {
        *self.slot(idx) = Some(Slot::Done(status));
        self.complete_ready(qp);
    }

    /// As [`Tx::read_done`], with the byte count to report.
    pub fn response_done(&mut self, qp: &QpCore, idx: u32, len: u32) {
        *self.slot(idx) = Some(Slot::DoneLen(IBV_WC_SUCCESS, len));
        self.complete_ready(qp);
    }

    /// Completes every outstanding SQ WQE in error; the QP is in the error state.
    pub fn flush(&mut self, qp: &QpCore) {
        self.fd = None;
        self.engine.abort();
        self.complete_ready(qp);
        let mut c = qp.sq.consumer();
        let end = qp.sq.producer();
        let mut flushed = Vec::new();
        while c != end {
            let started = c != self.next && self.slot(c).is_some();
            let status = if flushed.is_empty() && started {
                match qp.last_error.swap(IBV_WC_SUCCESS, Ordering::AcqRel) {
                    IBV_WC_SUCCESS => IBV_WC_WR_FLUSH_ERR,
                    s => s,
                }
            } else {
                IBV_WC_WR_FLUSH_ERR
            };
            *self.slot(c) = None;
            // SAFETY: as in `complete_ready`.
            flushed.push((unsafe { qp.sq.read::<SendWqe>(c, 0) }, status));
            c = c.wrapping_add(1);
        }
        self.next = end;
        qp.sq.release(end);
        for (wqe, status) in &flushed {
            qp.complete_send(wqe, *status);
        }
    }
}

/// Most pieces handed to the stream in one `sendmsg`.
const MAX_IOV: usize = 64;

/// Hands what the engine framed to the stream in one `sendmsg`: its own
/// bytes, and the spans of registered memory large payloads are sent from in
/// place, each checked again under the MR table's read lock, which is held
/// until the kernel has copied them (deregistration waits for it). Returns
/// what the send gave; a span whose memory went away fails the QP once
/// everything before it has gone.
fn send_pieces(
    engine: &Sender<Arc<[Sge]>, Body>,
    qp: &QpCore,
    fd: i32,
) -> Result<std::io::Result<usize>, Fail> {
    qp.sh.mrs.with_reader(|mrs| {
        let mut iov: smallvec::SmallVec<[libc::iovec; MAX_IOV]> = smallvec::SmallVec::new();
        let mut lost: Option<Span> = None;
        engine.pieces(|p| {
            let (base, len) = match p {
                Piece::Bytes(b) => (b.as_ptr(), b.len()),
                Piece::Span(s) => {
                    match mrs.mem(s.stag, qp.by(), s.to, s.len as usize, s.need, u32::MAX) {
                        Ok(at) => (at as *const u8, s.len as usize),
                        Err(_) => {
                            lost = Some(s);
                            return false;
                        }
                    }
                }
            };
            iov.push(libc::iovec {
                iov_base: base as *mut libc::c_void,
                iov_len: len,
            });
            iov.len() < MAX_IOV
        });
        if iov.is_empty() {
            return Err(lost.map_or_else(|| Fail::stream("nothing to send"), |s| s.fault()));
        }
        // SAFETY: a zeroed msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: every iovec points at initialised bytes: the engine's buffer,
        // or registered memory checked under the read lock held here; `fd` is
        // the QP's stream.
        let n = unsafe { sys::sendmsg_raw(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        Ok(if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        })
    })
}

/// The provider's side of the engine's transmit path: the send queue ring,
/// the MR table and the media worker.
struct SqHost<'a> {
    qp: &'a QpCore,
    next: &'a mut u32,
    slots: &'a mut [Option<Slot>],
}

/// The slot of send queue index `idx` (the ring size is a power of two).
fn slot_of(slots: &mut [Option<Slot>], idx: u32) -> &mut Option<Slot> {
    let mask = slots.len() - 1;
    &mut slots[idx as usize & mask]
}

impl send::SendHost for SqHost<'_> {
    type Local = Arc<[Sge]>;
    type Payload = Body;

    fn next_wr(&mut self, admit: impl FnOnce(WrClass) -> bool) -> Option<Wr<Arc<[Sge]>, Body>> {
        let qp = self.qp;
        // iWARP has no receive-only state: once the stream is up (reached at RTR),
        // the send queue runs, as with iWARP RNICs whose CM moves the QP to RTS.
        if !matches!(qp.state(), IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_SQD) {
            return None;
        }
        let idx = *self.next;
        if idx == qp.sq.producer() {
            return None;
        }
        // SAFETY: slot `idx` is in [consumer, producer): published by post_send and not released.
        let wqe: SendWqe = unsafe { qp.sq.read(idx, 0) };
        let class = wqe::class(&wqe);
        if !admit(class) {
            return None;
        }
        let payload = if wqe.flags & wqe_flag::INLINE != 0 {
            Body::Inline {
                idx,
                len: wqe.length,
            }
        } else {
            let n = (wqe.num_sge as usize).min(MAX_SGE as usize);
            // SAFETY: as above; `num_sge` was bounded by max_send_sge at post time.
            Body::Sges(sges_of(n, |k| unsafe {
                qp.sq.read::<Sge>(idx, wqe::sge_offset(k))
            }))
        };
        *self.next = idx.wrapping_add(1);
        *slot_of(self.slots, idx) = Some(Slot::Sent);
        let local = match &payload {
            Body::Sges(sges) => Some(sges.as_slice()),
            Body::Inline { .. } => None,
        };
        Some(Wr {
            idx,
            op: wqe::decode(&wqe, local),
            length: wqe.length,
            payload,
            confirmed: class.confirmed,
        })
    }

    fn check_payload(&mut self, p: &Body, need: u32) -> Result<(), AccessError> {
        let Body::Sges(sges) = p else { return Ok(()) };
        let qp = self.qp;
        for s in sges.iter().filter(|s| s.length > 0) {
            qp.sh
                .mrs
                .with_mem(s.lkey, qp.by(), s.addr, s.length as usize, need, |_| ())?;
        }
        Ok(())
    }

    fn gather(
        &mut self,
        p: &Body,
        off: u64,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessError> {
        match p {
            &Body::Inline { idx, len } => {
                if off + n as u64 > len as u64 {
                    return Err(AccessError::Bounds);
                }
                // SAFETY: the slot holds `len` inline bytes, copied there at post
                // time (bounded by max_inline, which sized the stride); it is not
                // released before this request completes, which is after framing.
                let inline = unsafe {
                    std::slice::from_raw_parts(
                        self.qp.sq.slot(idx).add(wqe::INLINE_OFFSET + off as usize),
                        n,
                    )
                };
                out.extend_from_slice(inline);
                Ok(())
            }
            Body::Sges(sges) => {
                let qp = self.qp;
                for (lkey, addr, take) in sge_spans(sges, off, n) {
                    qp.sh.mrs.read(lkey, qp.by(), addr, take, NEED_NONE, out)?;
                }
                Ok(())
            }
        }
    }

    fn read_source(
        &mut self,
        stag: u32,
        to: u64,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessError> {
        let qp = self.qp;
        qp.sh
            .mrs
            .read(stag, qp.by(), to, n, IBV_ACCESS_REMOTE_READ, out)
    }

    fn locate(
        &mut self,
        p: &Body,
        off: u64,
        n: usize,
        spans: &mut Vec<Span>,
    ) -> Result<bool, AccessError> {
        let Body::Sges(sges) = p else {
            return Ok(false);
        };
        let qp = self.qp;
        qp.sh
            .mrs
            .with_reader(|r| r.spans(qp.by(), sge_spans(sges, off, n), n, NEED_NONE, spans))
    }

    fn in_place(&mut self, stag: u32) -> bool {
        self.qp.sh.mrs.in_place(stag)
    }

    fn check_span(&mut self, s: &Span) -> Result<(), AccessError> {
        let qp = self.qp;
        qp.sh
            .mrs
            .with_mem(s.stag, qp.by(), s.to, s.len as usize, s.need, |_| ())
    }

    fn carry_out(&mut self, req: &Inbound) -> Outcome {
        super::responder::carry_out(self.qp, req)
    }

    fn defer(&mut self, req: Inbound) -> u64 {
        let qp = self.qp;
        // Unique in the context: a job of a destroyed or reset QP can never
        // answer for this one.
        let ticket = qp.sh.media.ticket();
        crate::context::media::submit(&qp.sh, qp.qpn, ticket, req);
        ticket
    }

    fn invalidate_local(&mut self, stag: u32) -> Result<(), AccessError> {
        self.qp.sh.mrs.invalidate(stag, self.qp.by())
    }

    fn bind_window(&mut self, bind: &WindowBind) -> Result<(), AccessError> {
        self.qp.sh.mrs.bind_window(self.qp.by(), bind)
    }

    fn completed(&mut self, idx: u32, c: Completion) {
        let slot = slot_of(self.slots, idx);
        match c {
            // Only a request still in flight: a flush may have claimed it.
            Completion::Success => {
                if let Some(s @ Slot::Sent) = slot {
                    *s = Slot::Done(IBV_WC_SUCCESS);
                }
            }
            Completion::SuccessLen(n) => *slot = Some(Slot::DoneLen(IBV_WC_SUCCESS, n)),
            Completion::Error(st) => *slot = Some(Slot::Done(crate::verbs_status::status(st))),
        }
    }
}

/// A QP's transmit side behind its lock. Whoever holds the lock transmits
/// for everyone: [`TxCell::kick`] only try-locks, and leaves a note that the
/// holder picks up before it lets go (see [`TxGuard`]).
pub struct TxCell {
    tx: parking_lot::Mutex<Tx>,
    /// Someone asked for transmission while the lock was held.
    want: AtomicBool,
}

impl TxCell {
    pub fn new(entries: u32) -> TxCell {
        TxCell {
            tx: parking_lot::Mutex::new(Tx::new(entries)),
            want: AtomicBool::new(false),
        }
    }

    /// The transmit side, for work other than transmitting; it transmits on
    /// behalf of other threads when released, if they asked meanwhile.
    pub fn lock<'a>(&'a self, qp: &'a QpCore) -> TxGuard<'a> {
        TxGuard {
            g: Some(self.tx.lock()),
            cell: self,
            qp,
        }
    }

    /// [`TxCell::lock`] if nobody holds it now.
    pub fn try_lock<'a>(&'a self, qp: &'a QpCore) -> Option<TxGuard<'a>> {
        let g = self.tx.try_lock()?;
        Some(TxGuard {
            g: Some(g),
            cell: self,
            qp,
        })
    }

    /// Someone asked for transmission while the lock was held (and it was not
    /// released since).
    pub fn wanted(&self) -> bool {
        self.want.load(Ordering::SeqCst)
    }

    /// Transmits on the calling thread if no one else is; otherwise leaves a
    /// note that the current holder picks up before it lets go. Callable with
    /// the QP's cm or rx lock held.
    pub fn kick(&self, qp: &QpCore) {
        self.want.store(true, Ordering::SeqCst);
        loop {
            let Some(mut tx) = self.tx.try_lock() else {
                return;
            };
            self.want.store(false, Ordering::SeqCst);
            let r = tx.run(qp);
            drop(tx);
            if let Err(f) = r {
                // The caller may hold this QP's cm or rx lock, which failing takes:
                // the progress thread applies the failure with no locks held.
                qp.defer_fail(f);
                return;
            }
            if !self.want.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

/// See [`TxCell::lock`].
pub struct TxGuard<'a> {
    g: Option<parking_lot::MutexGuard<'a, Tx>>,
    cell: &'a TxCell,
    qp: &'a QpCore,
}

impl std::ops::Deref for TxGuard<'_> {
    type Target = Tx;
    fn deref(&self) -> &Tx {
        self.g.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for TxGuard<'_> {
    fn deref_mut(&mut self) -> &mut Tx {
        self.g.as_mut().expect("held until dropped")
    }
}

impl Drop for TxGuard<'_> {
    fn drop(&mut self) {
        drop(self.g.take());
        if self.cell.wanted() {
            self.cell.kick(self.qp);
        }
    }
}
