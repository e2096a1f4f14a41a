//! Two engines back to back in memory: each side a [`Receiver`] and a
//! [`Sender`] over a [`Sim`], the stream between them a pair of byte queues
//! with faults injected at will (a cut or a corrupted byte at any offset, any
//! segmentation, a side that stalls, media results held back). Deterministic:
//! the same faults give the same run. A side fails as its [`Lifecycle`]
//! says, the same code a driver's QP fails by: it sends its Terminate (if
//! any), stops reading, and completes every work request it holds, as a QP
//! moving to the error state does.

use std::collections::VecDeque;

use crate::fault::AccessFault;
use crate::fault::{Event, Fail, Status};
use crate::lifecycle::{Action, Lifecycle, Step};
use crate::queue1::{Inbound, Outstanding};
use crate::recv::{self, Host, Receiver, RecvCompletion};
use crate::send::{self, Completion, Piece, ReadArrival, Sender, Span};
use crate::setup;
use crate::sim::{RecvOutcome, Sges, Sim, SimRecv};
use crate::wire::mpa::Rtr;

/// One side of the pair.
#[derive(Debug)]
pub struct Endpoint {
    pub mem: Sim,
    pub rx: Receiver<SimRecv>,
    pub tx: Sender<Sges, Sges>,
    /// Why this side failed, once it has (the first failure).
    pub failed: Option<Fail>,
    /// How failures end this side. The pair's streams come from no
    /// connection manager and never run out of room: its lifecycle never
    /// connects, lingers, reopens or waits for room for a Terminate.
    pub life: Lifecycle,
    /// The asynchronous events raised, as a driver raises them to the
    /// application.
    pub events: Vec<Event>,
    inbox: Vec<u8>,
    /// Bytes this side put on the stream (its Terminate last, if it failed).
    out: Vec<u8>,
    /// Media results are held until [`Pair::release_media`].
    pub hold_media: bool,
    /// Frame a small Send or Write with [`Sender::frame_now`] when nothing
    /// is unfinished ahead of it, as a driver does for a lone post.
    pub post_now: bool,
    /// Requests framed that way.
    pub framed_now: u64,
}

/// The receive engine's view of one side: memory and receives in the `Sim`,
/// queue 1 state in the side's `Sender`.
struct Link<'a> {
    mem: &'a mut Sim,
    tx: &'a mut Sender<Sges, Sges>,
}

impl Host for Link<'_> {
    type Recv = SimRecv;
    type Local = Sges;

    fn place(
        &mut self,
        stag: u32,
        to: u64,
        data: &[u8],
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessFault> {
        self.mem.place(stag, to, data, need, allowed)
    }
    fn check(
        &mut self,
        stag: u32,
        to: u64,
        len: u64,
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessFault> {
        self.mem.check(stag, to, len, need, allowed)
    }
    fn aligned8(
        &mut self,
        stag: u32,
        to: u64,
        need: u32,
        allowed: u32,
    ) -> Result<bool, AccessFault> {
        self.mem.aligned8(stag, to, need, allowed)
    }
    fn invalidate(&mut self, stag: u32) -> Result<(), AccessFault> {
        Host::invalidate(self.mem, stag)
    }
    fn take_recv(&mut self) -> Option<SimRecv> {
        self.mem.take_recv()
    }
    fn recv_len(&self, r: &SimRecv) -> u64 {
        self.mem.recv_len(r)
    }
    fn scatter_recv(&mut self, r: &SimRecv, off: u64, data: &[u8]) -> Result<(), AccessFault> {
        self.mem.scatter_recv(r, off, data)
    }
    fn recv_done(&mut self, r: SimRecv, c: RecvCompletion) {
        self.mem.recv_done(r, c)
    }
    fn recv_failed(&mut self, r: SimRecv, status: Status) {
        self.mem.recv_failed(r, status)
    }
    fn scatter(&mut self, l: &Sges, off: u64, data: &[u8]) -> Result<(), AccessFault> {
        Host::scatter(self.mem, l, off, data)
    }
    fn local_len(&self, l: &Sges) -> u64 {
        self.mem.local_len(l)
    }
    fn locate_local(
        &mut self,
        l: &Sges,
        off: u64,
        n: usize,
        spans: &mut Vec<Span>,
    ) -> Result<bool, AccessFault> {
        self.mem.locate_local(l, off, n, spans)
    }
    fn oldest_outstanding(&mut self) -> Option<Outstanding<Sges>> {
        self.tx.orq.front().cloned()
    }
    fn read_arrived(&mut self, n: u64, last: bool) -> bool {
        match self.tx.read_arrived(n, last) {
            ReadArrival::Answered(idx) => self.mem.finish(idx, Completion::Success),
            ReadArrival::More => {}
            ReadArrival::Gone => return false,
        }
        true
    }
    fn answered(&mut self, len: Option<u32>) {
        if let Some(idx) = self.tx.answer_oldest() {
            let c = len.map_or(Completion::Success, Completion::SuccessLen);
            self.mem.finish(idx, c);
        }
    }
    fn queue_request(&mut self, req: Inbound) -> bool {
        self.tx.queue_request(req)
    }
    fn may_transmit(&mut self) {
        self.tx.gate = false;
    }
}

impl Endpoint {
    pub fn new(mem: Sim, rp: recv::Params, sp: send::Params) -> Endpoint {
        Endpoint {
            mem,
            rx: Receiver::new(rp),
            tx: Sender::new(sp),
            failed: None,
            life: Lifecycle::default(),
            events: Vec::new(),
            inbox: Vec::new(),
            out: Vec::new(),
            hold_media: false,
            post_now: false,
            framed_now: 0,
        }
    }

    /// With [`Endpoint::post_now`]: the oldest queued request framed at once,
    /// if it qualifies and every request before it has completed; it then
    /// completes once the stream takes it. A payload that cannot be gathered
    /// leaves it to the usual path, which reports the fault.
    fn frame_now(&mut self) -> bool {
        let Some(w) = self.mem.sq.front() else {
            return false;
        };
        if !self.post_now || self.mem.sq_done.len() != self.mem.next_idx as usize {
            return false;
        }
        let mut payload = Vec::new();
        let len = w.length as usize;
        if len > NOW_MAX
            || self
                .mem
                .gather_sges(&w.payload, 0, len, &mut payload)
                .is_err()
        {
            return false;
        }
        let fill = |b: &mut [u8]| {
            b.copy_from_slice(&payload);
            Ok::<(), ()>(())
        };
        let Some(op) = w.op.now_op() else {
            return false;
        };
        if self.tx.frame_now(op, len, fill) != Ok(true) {
            return false;
        }
        self.mem.sq.pop_front();
        let idx = self.mem.next_idx;
        self.mem.next_idx += 1;
        self.tx.complete_at(idx);
        self.framed_now += 1;
        true
    }

    /// Frames whatever can go and puts it on the stream; true if any did.
    fn transmit(&mut self) -> bool {
        if self.failed.is_some() {
            return false;
        }
        let before = self.out.len();
        loop {
            if self.frame_now() {
                if let Err(f) = self.put_on_stream() {
                    self.fail(f);
                    break;
                }
                self.tx.complete_written(&mut self.mem);
                continue;
            }
            match self.tx.frame_more(&mut self.mem) {
                Ok(more) => {
                    if let Err(f) = self.put_on_stream() {
                        self.fail(f);
                        break;
                    }
                    self.tx.complete_written(&mut self.mem);
                    if !more {
                        break;
                    }
                }
                Err(f) => {
                    self.fail(f);
                    break;
                }
            }
        }
        self.out.len() > before
    }

    /// Puts everything framed on the stream, reading spans in place as a
    /// driver's writev does.
    fn put_on_stream(&mut self) -> Result<(), Fail> {
        let mut bytes = Vec::new();
        let mut lost = None;
        let mem = &self.mem;
        self.tx.pieces(|p| match p {
            Piece::Bytes(b) => {
                bytes.extend_from_slice(b);
                true
            }
            Piece::Span(s) => match mem.read_span(&s, &mut bytes) {
                Ok(()) => true,
                Err(_) => {
                    lost = Some(s.fault());
                    false
                }
            },
        });
        self.tx.advance(bytes.len());
        self.out.extend_from_slice(&bytes);
        lost.map_or(Ok(()), Err)
    }

    /// Takes in stream bytes: into the memory the receive side names while
    /// it places a payload in place, as a driver reads the stream into it,
    /// into the buffer otherwise.
    fn receive(&mut self, mut bytes: &[u8]) {
        while self.failed.is_none() && !bytes.is_empty() {
            if let Some((span, allowed)) = self.rx.direct() {
                let take = bytes.len().min(span.len as usize);
                match self.mem.write_span(&span, allowed, &bytes[..take]) {
                    Ok(()) => self.rx.direct_placed(&bytes[..take]),
                    Err(e) => {
                        let f = self.rx.direct_lost(e);
                        self.fail(f);
                        return;
                    }
                }
                bytes = &bytes[take..];
                continue;
            }
            self.inbox.extend_from_slice(bytes);
            bytes = &[];
            self.handle_inbox();
        }
    }

    fn handle_inbox(&mut self) {
        let mut link = Link {
            mem: &mut self.mem,
            tx: &mut self.tx,
        };
        let (used, r) = self.rx.handle(&mut link, &self.inbox);
        self.inbox.drain(..used);
        if let Err(f) = r {
            self.fail(f);
        }
    }

    /// Hands the worker's results back; true if there were any.
    fn run_media(&mut self) -> bool {
        let mut any = false;
        while let Some((ticket, req)) = self.mem.deferred.pop_front() {
            let r = self.mem.carry_out(&req);
            self.tx.media_done(ticket, r);
            any = true;
        }
        any
    }

    /// A failure found on this side: it goes as the lifecycle says. The
    /// first one ends the side: its Terminate goes out (nothing after it),
    /// then the side moves to the error state.
    pub fn fail(&mut self, f: Fail) {
        let due = self.rx.expects_rtr();
        let mut todo: VecDeque<Action> = self.life.fail(f, due).into();
        while let Some(a) = todo.pop_front() {
            match a {
                Action::Terminate(body) => {
                    self.tx.terminate(body);
                    self.tx.gate = true;
                    if self.tx.frame_more(&mut self.mem).is_ok() {
                        let _ = self.put_on_stream();
                    }
                    // The stream takes everything at once.
                    todo.extend(self.life.terminate_written());
                }
                Action::Fail(f) => self.enter_error(f),
                Action::Timer | Action::StopReading | Action::Reopen | Action::Connect => {}
            }
        }
    }

    /// The side moves to the error state for `f`, in the lifecycle's steps:
    /// the receive it hit completes with its status, its event is raised,
    /// then every work request still held completes: the oldest send with
    /// the first failure's status, everything else flushed.
    fn enter_error(&mut self, f: Fail) {
        let fresh = self.failed.is_none();
        let mut sq_status = if fresh { f.sq_status } else { None };
        for step in self.life.entered_error(fresh, f.rq_status, Some(f.event)) {
            match step {
                Step::Detach => self.tx.abort(),
                Step::Close | Step::Mirror => {}
                Step::FailRecv(st) => {
                    if let Some(r) = self.rx.take_current() {
                        self.mem.completed.push((r.wr_id, RecvOutcome::Failed(st)));
                    }
                }
                Step::Raise(e) => self.events.push(e),
                Step::Flush => self.flush(sq_status.take()),
            }
        }
        if fresh {
            self.failed = Some(f);
        }
    }

    /// Completes every work request still held: the oldest send with
    /// `sq_status` (if given), everything else flushed, sends first.
    fn flush(&mut self, sq_status: Option<Status>) {
        self.tx.abort();
        let mut first = sq_status;
        for idx in self.mem.sq_done.len() as u32..self.mem.next_idx {
            let st = first.take().unwrap_or(Status::Flushed);
            self.mem.finish(idx, Completion::Error(st));
        }
        while self.mem.sq.pop_front().is_some() {
            let idx = self.mem.next_idx;
            self.mem.next_idx += 1;
            self.mem.finish(idx, Completion::Error(Status::Flushed));
        }
        if let Some(r) = self.rx.take_current() {
            self.mem
                .completed
                .push((r.wr_id, RecvOutcome::Failed(Status::Flushed)));
        }
        while let Some(r) = self.mem.recvs.pop_front() {
            self.mem
                .completed
                .push((r.wr_id, RecvOutcome::Failed(Status::Flushed)));
        }
    }

    /// Every work request posted has completed, once.
    pub fn all_completed(&self, posted_sends: usize, posted_recvs: usize) -> bool {
        let mut ids: Vec<u64> = self.mem.completed.iter().map(|c| c.0).collect();
        ids.sort_unstable();
        ids.dedup();
        self.mem.sq_done.len() == posted_sends
            && self.mem.sq.is_empty()
            && self.mem.completed.len() == posted_recvs
            && ids.len() == posted_recvs
    }
}

/// Largest payload [`Endpoint::post_now`] frames at once (the driver's
/// default).
pub const NOW_MAX: usize = 512;

/// Payloads the pair's engines send in place on a stream without CRC: all
/// but the smallest, so both ways of sending are exercised.
pub const INPLACE_MIN: usize = 3;

/// What goes wrong on the stream from side `from` to the other.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Deliver only this many bytes, then the stream is cut (both sides fail
    /// once nothing more moves).
    pub cut_at: Option<u64>,
    /// XOR the byte at this offset with the mask.
    pub corrupt_at: Option<(u64, u8)>,
    /// Largest piece delivered at once (0: everything there is).
    pub chunk: usize,
    /// The receiving side takes nothing (a stalled peer).
    pub stalled: bool,
}

pub struct Pair {
    pub ends: [Endpoint; 2],
    /// Faults of the stream from side 0 to 1, and from 1 to 0.
    pub faults: [Faults; 2],
    /// Bytes of each direction delivered so far.
    delivered: [usize; 2],
    cut: bool,
}

impl Pair {
    pub fn new(a: Endpoint, b: Endpoint) -> Pair {
        Pair {
            ends: [a, b],
            faults: [Faults::default(); 2],
            delivered: [0; 2],
            cut: false,
        }
    }

    /// Two sides connected as an MPA exchange leaves them: side 0 the
    /// initiator (it sends the ready-to-receive first), side 1 the responder
    /// (silent until it arrives).
    pub fn connected(a: Sim, b: Sim, crc: bool, mulpdu: usize, ord: u32, ird: u32) -> Pair {
        let rp = |rtr| recv::Params {
            crc,
            rtr,
            access: u32::MAX,
            extensions: true,
            merge_imm: true,
            inplace_min: INPLACE_MIN,
        };
        let sp = |gate, rtr| send::Params {
            crc,
            mulpdu,
            gate,
            rtr,
            peer_ird: ird,
            ord,
            ird,
            inplace_min: INPLACE_MIN,
        };
        Pair::new(
            Endpoint::new(a, rp(Rtr::None), sp(false, true)),
            Endpoint::new(b, rp(Rtr::ZeroLengthWrite), sp(true, false)),
        )
    }

    /// Two sides that first run the MPA exchange (RFC 5044 section 7, RFC
    /// 6581) in memory, side 0 as initiator, and then start their engines
    /// from what was agreed: the seam a driver with its own exchange (or a
    /// stream negotiated elsewhere) uses. The ready-to-receive message the
    /// engines exchange is the zero-length Write, or none.
    pub fn negotiate(
        a: Sim,
        b: Sim,
        ia: &setup::Local,
        rb: &setup::Local,
        mulpdu: usize,
    ) -> Result<(Pair, setup::Agreed, setup::Agreed), setup::SetupError> {
        let (mut init, request) = setup::Initiator::new(ia.clone())?;
        let mut reader = setup::FrameReader::default();
        let (_, frame) = reader.feed(&request)?;
        let req = setup::Request::parse(&frame.ok_or(setup::SetupError::WrongKind("Request"))?)?;
        let (reply, responder) = match setup::accept(&req, rb) {
            Ok(v) => v,
            Err(e) => {
                // The initiator hears the reject.
                init.handle(&setup::reject(req.revision, &[]))?;
                return Err(e);
            }
        };
        let (_, initiator) = init.handle(&reply)?;
        let initiator = initiator.ok_or(setup::SetupError::WrongKind("Reply"))?;
        let side = |ag: &setup::Agreed, responder: bool| {
            let rtr = ag.rtr != Rtr::None;
            Endpoint::new(
                Sim::new(0, 0),
                recv::Params {
                    crc: ag.crc,
                    rtr: if responder { ag.rtr } else { Rtr::None },
                    access: u32::MAX,
                    extensions: true,
                    merge_imm: true,
                    inplace_min: INPLACE_MIN,
                },
                send::Params {
                    crc: ag.crc,
                    mulpdu,
                    gate: responder && rtr,
                    rtr: !responder && ag.rtr == Rtr::ZeroLengthWrite,
                    peer_ird: u32::from(ag.peer_ird),
                    ord: u32::from(ag.ord),
                    ird: u32::from(ag.ird),
                    inplace_min: INPLACE_MIN,
                },
            )
        };
        if matches!(initiator.rtr, Rtr::ZeroLengthRead | Rtr::ZeroLengthSend) {
            return Err(setup::SetupError::NoRtr);
        }
        let (mut ea, mut eb) = (side(&initiator, false), side(&responder, true));
        ea.mem = a;
        eb.mem = b;
        Ok((Pair::new(ea, eb), initiator, responder))
    }

    /// Lets the held media results of side `i` through.
    pub fn release_media(&mut self, i: usize) {
        self.ends[i].run_media();
    }

    /// Stream bytes side `i` has sent so far.
    pub fn sent(&self, i: usize) -> &[u8] {
        &self.ends[i].out
    }

    /// One round: both sides transmit, the stream delivers, both sides
    /// receive, media results come back. True if anything moved.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        for i in 0..2 {
            moved |= self.ends[i].transmit();
            if !self.ends[i].hold_media {
                moved |= self.ends[i].run_media();
            }
        }
        for from in 0..2 {
            let to = 1 - from;
            let f = self.faults[from];
            if f.stalled {
                continue;
            }
            let total = self.ends[from].out.len();
            let limit = f.cut_at.map_or(total, |c| total.min(c as usize));
            let start = self.delivered[from];
            if start >= limit {
                continue;
            }
            let end = if f.chunk == 0 {
                limit
            } else {
                limit.min(start + f.chunk)
            };
            let mut piece = self.ends[from].out[start..end].to_vec();
            if let Some((at, mask)) = f.corrupt_at {
                let at = at as usize;
                if (start..end).contains(&at) {
                    piece[at - start] ^= mask;
                }
            }
            self.delivered[from] = end;
            self.ends[to].receive(&piece);
            moved = true;
        }
        moved
    }

    /// Both ends see the stream close (a reset, or the application giving
    /// up on a stalled connection): each fails, if it had not already.
    pub fn close(&mut self) {
        for e in &mut self.ends {
            e.fail(Fail::stream("the stream was closed"));
        }
        self.run();
    }

    /// Steps until nothing moves; a cut stream then fails both sides. Panics
    /// if the pair never settles (a livelock).
    pub fn run(&mut self) {
        for _ in 0..1_000_000 {
            if self.step() {
                continue;
            }
            let cut = (0..2).any(|i| {
                self.faults[i]
                    .cut_at
                    .is_some_and(|c| (c as usize) < self.ends[i].out.len())
            });
            if cut && !self.cut {
                self.cut = true;
                for e in &mut self.ends {
                    e.fail(Fail::stream("the stream was cut"));
                }
                continue;
            }
            return;
        }
        panic!("the pair never settled");
    }
}
