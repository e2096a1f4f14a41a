//! The transmit side of a QP: work requests and queue 1 answers in, FPDUs out
//! (RFC 5044 section 4, RFC 5041, RFC 5040, RFC 7306, draft-talpey-rdma-commit).
//! The engine frames into its own buffer; the driver hands what
//! [`Sender::pieces`] lists to the stream and reports what it took with
//! [`Sender::advance`]. Large payloads on a stream without CRC are not copied
//! into the buffer: they are listed as [`Span`]s of registered memory, which
//! the driver hands to the stream in place (writev). With CRC they are copied:
//! the CRC must cover exactly the bytes sent, and memory the application or a
//! peer may change meanwhile (a Read's source) cannot promise that. Payload,
//! the send queue and the carrying out of requests are reached through the
//! driver's [`SendHost`].

use std::collections::VecDeque;

use crate::fault::{AccessFault, Fail, Status};
use crate::queue1::{
    self, access, Inbound, Outcome, Outstanding, PendingRead, Response, VERIFY_MAX_HASH,
};
use crate::wire::{atomic, commit, ddp, mpa, rdmap};

/// Bytes framed per round before they are handed to the stream.
pub const BATCH: usize = 256 * 1024;
/// Zeros a short FPDU is laid out on.
static ZEROS: [u8; 128] = [0; 128];
/// FPDUs up to this size are laid out on a block of zeros of this size.
const SHORT_FPDU: usize = 32;
/// Room for an encoded DDP/RDMAP header (the untagged one is the longer).
const HEAD_MAX: usize = ddp::UNTAGGED_HDR_LEN;

/// A framing buffer up to this size is kept when its QP goes idle.
const TRIM_KEEP: usize = 16 * 1024;

/// The operands of an RFC 7306 atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    FetchAdd {
        add: u64,
    },
    MaskedFetchAdd {
        add: u64,
        mask: u64,
    },
    CmpSwap {
        compare: u64,
        swap: u64,
    },
    MaskedCmpSwap {
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    },
    Swap {
        swap: u64,
    },
}

/// A request [`Sender::frame_now`] frames: a Send or an RDMA Write without
/// Immediate Data, whose one FPDU completes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NowOp {
    Send {
        solicited: bool,
        invalidate: Option<u32>,
    },
    Write {
        stag: u32,
        to: u64,
    },
}

impl<L> WrOp<L> {
    /// The request as [`Sender::frame_now`] takes it, if it is one it frames.
    pub fn now_op(&self) -> Option<NowOp> {
        match *self {
            WrOp::Send {
                solicited,
                invalidate,
                imm: None,
            } => Some(NowOp::Send {
                solicited,
                invalidate,
            }),
            WrOp::Write {
                stag,
                to,
                imm: None,
                ..
            } => Some(NowOp::Write { stag, to }),
            _ => None,
        }
    }
}

/// What a work request asks for. `L` is the driver's local buffer list, where
/// a response lands.
#[derive(Clone, Debug)]
pub enum WrOp<L> {
    Send {
        solicited: bool,
        invalidate: Option<u32>,
        imm: Option<u32>,
    },
    Write {
        stag: u32,
        to: u64,
        imm: Option<u32>,
        solicited: bool,
    },
    Read {
        stag: u32,
        to: u64,
        sink_stag: u32,
        sink_to: u64,
        sink: L,
    },
    Atomic {
        op: AtomicOp,
        stag: u32,
        to: u64,
        result: L,
    },
    Flush {
        stag: u32,
        to: u64,
        len: u32,
        flags: u32,
    },
    Verify {
        stag: u32,
        to: u64,
        len: u32,
        hash: [u8; VERIFY_MAX_HASH],
        hash_len: u8,
        result: L,
    },
    AtomicWrite {
        stag: u32,
        to: u64,
        value: u64,
    },
    LocalInvalidate {
        stag: u32,
    },
    /// Binds a memory window. Local: carried out in send queue order,
    /// nothing on the wire.
    BindWindow(WindowBind),
    /// Nothing this QP can carry out (an inline queue 1 request, an unknown opcode).
    Invalid(&'static str),
}

impl<L> WrOp<L> {
    /// Answered by the peer on queue 3 or 2, so counted against ORD.
    pub fn is_queue1(&self) -> bool {
        matches!(
            self,
            WrOp::Read { .. }
                | WrOp::Atomic { .. }
                | WrOp::Flush { .. }
                | WrOp::Verify { .. }
                | WrOp::AtomicWrite { .. }
        )
    }
}

/// A work request taken from the send queue: `idx` is the driver's token for
/// it, `payload` where its data comes from (`length` bytes).
#[derive(Clone, Debug)]
pub struct Wr<L, P> {
    pub idx: u32,
    pub op: WrOp<L>,
    pub length: u32,
    pub payload: P,
    /// A Send or Write that reports a completion (signaled): with
    /// [`Sender::set_confirm`] it completes once the peer confirms it.
    pub confirmed: bool,
}

/// A memory window bind: window `stag` (its new STag) of type `kind` (1 or
/// 2) to `[to, to+len)` of region `mr`, granting `access`; length 0 unbinds
/// a type 1 window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowBind {
    pub stag: u32,
    pub kind: u8,
    pub mr: u32,
    pub to: u64,
    pub len: u64,
    pub access: u32,
}

/// What decides whether the next work request may start now.
#[derive(Clone, Copy, Debug)]
pub struct WrClass {
    pub queue1: bool,
    pub fence: bool,
    /// As [`Wr::confirmed`]: with [`Sender::set_confirm`] it needs room in ORD.
    pub confirmed: bool,
}

/// How a work request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    Success,
    /// Success, with a byte count other than the request's own (a Verify's hash).
    SuccessLen(u32),
    Error(Status),
}

/// A run of registered memory an FPDU's payload is sent from in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub stag: u32,
    pub to: u64,
    pub len: u32,
    /// The rights the access needs: [`access::REMOTE_READ`] for a Read's
    /// source, none for a work request's own buffers.
    pub need: u32,
}

impl Span {
    /// The failure when the span cannot be reached any more at transmission
    /// (its MR deregistered meanwhile): as for a payload that cannot be gathered.
    pub fn fault(&self) -> Fail {
        if self.need & access::REMOTE_READ != 0 {
            Fail::local(Status::Flushed, "read source deregistered while answering")
        } else {
            send_buffer_lost()
        }
    }
}

/// A piece of what is framed and not yet taken by the stream.
#[derive(Clone, Copy, Debug)]
pub enum Piece<'a> {
    /// Bytes of the sender's own buffer.
    Bytes(&'a [u8]),
    /// Registered memory, to be read in place.
    Span(Span),
}

/// What the transmit side needs from the driver.
pub trait SendHost {
    type Local: Clone;
    type Payload;

    /// Takes the next work request if `admit` accepts its class; None if there
    /// is none, the QP cannot send, or it must wait.
    fn next_wr(
        &mut self,
        admit: impl FnOnce(WrClass) -> bool,
    ) -> Option<Wr<Self::Local, Self::Payload>>;
    /// Checks the local buffers of a request (`need`: the rights it must grant).
    fn check_payload(&mut self, p: &Self::Payload, need: u32) -> Result<(), AccessFault>;
    /// Appends `n` payload bytes from message offset `off` to `out`.
    fn gather(
        &mut self,
        p: &Self::Payload,
        off: u64,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessFault>;
    /// Appends `n` bytes of tagged buffer `stag` at `to` to `out` (a Read's source).
    fn read_source(
        &mut self,
        stag: u32,
        to: u64,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessFault>;
    /// Whether the stream may take bytes of tagged buffer `stag` straight
    /// from its memory (a [`Span`]); if not, they are read with
    /// [`SendHost::read_source`] into the sender's buffer.
    fn in_place(&mut self, _stag: u32) -> bool {
        true
    }
    /// Appends the spans of registered memory that hold `n` payload bytes
    /// from message offset `off`, each checked, to `spans`; false (nothing
    /// appended) if the payload does not lie in registered memory (inline
    /// bytes): it is gathered then.
    fn locate(
        &mut self,
        p: &Self::Payload,
        off: u64,
        n: usize,
        spans: &mut Vec<Span>,
    ) -> Result<bool, AccessFault>;
    /// Checks a span of registered memory (a Read's source) before it is listed.
    fn check_span(&mut self, s: &Span) -> Result<(), AccessFault>;
    /// Carries out a queue 1 request (other than a Read) on memory and says
    /// what it did, or why it could not; the engine makes the response.
    fn carry_out(&mut self, req: &Inbound) -> Outcome;
    /// Hands a request that waits on the medium to a worker, which carries
    /// it out as [`SendHost::carry_out`] does; it reports the outcome
    /// through [`Sender::media_done`] with the ticket returned.
    fn defer(&mut self, req: Inbound) -> u64;
    fn invalidate_local(&mut self, stag: u32) -> Result<(), AccessFault>;
    /// Carries out a [`WrOp::BindWindow`]; a driver without memory windows
    /// refuses every bind.
    fn bind_window(&mut self, _bind: &WindowBind) -> Result<(), AccessFault> {
        Err(AccessFault::InvalidStag)
    }
    /// Work request `idx` is finished (completions are reported in send queue
    /// order by the driver).
    fn completed(&mut self, idx: u32, c: Completion);
}

/// Whether carrying out `req` touches the medium.
fn needs_media(req: &Inbound) -> bool {
    match req {
        Inbound::Flush { flags, len, .. } => *len > 0 && flags & commit::FLUSH_PERSISTENCE != 0,
        Inbound::Verify { .. } => true,
        _ => false,
    }
}

/// A Flush to persistence or a Verify waits on the disk: a worker carries it
/// out, later queue 1 requests wait their turn, this side's own work goes on.
#[derive(Debug)]
enum Media {
    Idle,
    /// The worker has the request, under its ticket.
    Busy(u64, Inbound),
    Done(Result<Response, Fail>),
}

#[derive(Debug)]
enum Job<L, P> {
    Sq(Wr<L, P>),
    Inbound(Inbound),
    /// The response to a request the worker carried out.
    Respond(Response),
}

#[derive(Debug)]
struct Cur<L, P> {
    job: Job<L, P>,
    sent: u64,
}

/// What the data of a Read Response did to the oldest request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadArrival {
    /// It is not a Read (the QP was flushed meanwhile).
    Gone,
    /// More data is due.
    More,
    /// The Read is complete: its send queue index.
    Answered(u32),
}

/// How a stream was set up, for its transmit side.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub crc: bool,
    /// Largest DDP payload in one FPDU.
    pub mulpdu: usize,
    /// Responder: nothing goes out before the peer's first FPDU (RFC 6581).
    pub gate: bool,
    /// Initiator: send the zero-length Write ready-to-receive first.
    pub rtr: bool,
    /// The peer's IRD; ORD never exceeds it (RFC 6581 section 7).
    pub peer_ird: u32,
    /// This side's ORD, at most `peer_ird`.
    pub ord: u32,
    /// This side's IRD.
    pub ird: u32,
    /// Payloads of at least this many bytes go to the stream in place on a
    /// stream without CRC (0: never).
    pub inplace_min: usize,
}

#[derive(Debug)]
pub struct Sender<L, P> {
    crc: bool,
    crc32c: mpa::Crc32c,
    mulpdu: usize,
    /// Nothing but a Terminate or ready-to-receive may go out.
    pub gate: bool,
    rtr: bool,
    /// A Terminate body to send ahead of everything else.
    term: Option<Vec<u8>>,
    /// Next MSN for each outbound untagged queue (QN 0 to 3); the first is 1 (RFC 5041 5.1).
    msn: [u32; 4],
    pub peer_ird: u32,
    pub ord_max: u32,
    pub ird_max: u32,
    /// Requests sent on queue 1 and not yet answered, oldest first (at most ORD).
    pub orq: VecDeque<Outstanding<L>>,
    /// Requests received on queue 1 and not yet answered (at most IRD).
    pub irq: VecDeque<Inbound>,
    /// Request Identifier of the next Atomic Request (RFC 7306 section 5.2.1).
    next_request_id: u32,
    media: Media,
    cur: Option<Cur<L, P>>,
    inplace_min: usize,
    /// Framed bytes of the sender's own, and the spans that go between them:
    /// each before the byte of `buf` at its position, in stream order.
    buf: Vec<u8>,
    spans: VecDeque<(usize, Span)>,
    /// Taken by the stream: bytes of `buf`, and of the first span.
    off: usize,
    span_off: u32,
    /// Room for the spans of one FPDU.
    scratch: Vec<Span>,
    /// Stream positions: bytes framed, bytes taken by the stream.
    framed: u64,
    written: u64,
    /// Work requests that are done once the stream has taken this many bytes.
    done_at: VecDeque<(u32, u64)>,
    /// Bytes went out since the last trim pass.
    active: bool,
    /// Signaled Sends and Writes complete once the peer answers a
    /// zero-length Read framed behind them (see [`Sender::set_confirm`]).
    confirm: bool,
}

impl<L: Clone + Default, P> Default for Sender<L, P> {
    fn default() -> Self {
        Sender::new(Params {
            crc: false,
            mulpdu: 16384,
            gate: false,
            rtr: false,
            peer_ird: 1,
            ord: 1,
            ird: 1,
            inplace_min: 0,
        })
    }
}

impl<L: Clone + Default, P> Sender<L, P> {
    pub fn new(p: Params) -> Self {
        let mut s = Sender {
            crc: false,
            crc32c: mpa::crc32c,
            mulpdu: 0,
            gate: false,
            rtr: false,
            term: None,
            msn: [1; 4],
            peer_ird: 1,
            ord_max: 1,
            ird_max: 1,
            orq: VecDeque::new(),
            irq: VecDeque::new(),
            next_request_id: 1,
            media: Media::Idle,
            cur: None,
            inplace_min: 0,
            buf: Vec::new(),
            spans: VecDeque::new(),
            off: 0,
            span_off: 0,
            scratch: Vec::new(),
            framed: 0,
            written: 0,
            done_at: VecDeque::new(),
            active: false,
            confirm: false,
        };
        s.establish(p);
        s
    }

    /// Completions that say the peer has taken the message: a signaled Send
    /// or Write completes once the peer answers a zero-length RDMA Read
    /// framed right behind it. RDMAP's ordering makes that answer follow the
    /// message's placement (RFC 5040 section 5.5: a Read Response is not
    /// sent before the messages ahead of its request are placed), and a peer
    /// that refuses the message sends its Terminate instead, which this
    /// request then reports. The zero-length Read takes a place in ORD and
    /// carries no STag the peer may check (section 5.2.1); without ORD (0)
    /// the message completes once the stream takes it, as it does otherwise.
    pub fn set_confirm(&mut self, on: bool) {
        self.confirm = on;
    }

    /// Computes CRCs with `f` (the driver's choice for its machine).
    pub fn use_crc32c(&mut self, f: mpa::Crc32c) {
        self.crc32c = f;
    }

    /// A stream is up: its parameters, with the queues as they are.
    pub fn establish(&mut self, p: Params) {
        self.crc = p.crc;
        self.mulpdu = p.mulpdu.clamp(1, mpa::MAX_ULPDU - ddp::UNTAGGED_HDR_LEN);
        self.gate = p.gate;
        self.rtr = p.rtr;
        // 0 is honoured both ways (RFC 6581 section 7.1): with ORD 0 no
        // request of queue 1 goes out, with IRD 0 none is taken in.
        self.peer_ird = p.peer_ird;
        self.ord_max = p.ord.min(self.peer_ird);
        self.ird_max = p.ird;
        self.inplace_min = p.inplace_min;
    }

    /// `n` more bytes of the oldest request (a Read) arrived; with `last` it
    /// is answered.
    pub fn read_arrived(&mut self, n: u64, last: bool) -> ReadArrival {
        match self.orq.front_mut() {
            Some(Outstanding::Read(r)) => r.received += n,
            _ => return ReadArrival::Gone,
        }
        if !last {
            return ReadArrival::More;
        }
        match self.answer_oldest() {
            Some(idx) => ReadArrival::Answered(idx),
            None => ReadArrival::Gone,
        }
    }

    /// The oldest request is answered: its send queue index.
    pub fn answer_oldest(&mut self) -> Option<u32> {
        self.orq.pop_front().map(|o| o.sq_idx())
    }

    /// Queues a request from the peer behind the earlier ones; false if IRD
    /// of them wait already (RFC 6581: the peer has no buffer for it).
    pub fn queue_request(&mut self, req: Inbound) -> bool {
        if self.irq.len() as u32 >= self.ird_max {
            return false;
        }
        self.irq.push_back(req);
        true
    }

    /// Payloads of at least `n` bytes go to the stream in place on a stream
    /// without CRC (0: never); for what is framed from now on.
    pub fn set_inplace_min(&mut self, n: usize) {
        self.inplace_min = n;
    }

    /// Sets ORD (modify_qp's `max_rd_atomic`), within the peer's IRD.
    pub fn set_ord(&mut self, ord: u32) {
        self.ord_max = self.peer_ird.min(ord);
    }

    /// Sends `body` as a Terminate ahead of everything else; nothing follows it.
    pub fn terminate(&mut self, body: Vec<u8>) {
        self.term = Some(body);
    }

    /// Bytes framed and not yet taken by the stream, up to the first span
    /// (all of them when [`Sender::has_spans`] is false).
    pub fn pending(&self) -> &[u8] {
        let end = self.spans.front().map_or(self.buf.len(), |&(at, _)| at);
        &self.buf[self.off..end]
    }

    pub fn has_pending(&self) -> bool {
        self.off < self.buf.len() || !self.spans.is_empty()
    }

    /// Some of what is pending lies in registered memory.
    pub fn has_spans(&self) -> bool {
        !self.spans.is_empty()
    }

    /// Hands `f` what is framed and not yet taken, in stream order, until it
    /// returns false.
    pub fn pieces(&self, mut f: impl FnMut(Piece<'_>) -> bool) {
        let mut at = self.off;
        for (k, &(pos, span)) in self.spans.iter().enumerate() {
            if at < pos && !f(Piece::Bytes(&self.buf[at..pos])) {
                return;
            }
            at = pos;
            let skip = if k == 0 { self.span_off } else { 0 };
            let rest = Span {
                to: span.to.wrapping_add(skip as u64),
                len: span.len - skip,
                ..span
            };
            if !f(Piece::Span(rest)) {
                return;
            }
        }
        if at < self.buf.len() {
            f(Piece::Bytes(&self.buf[at..]));
        }
    }

    /// Bytes framed and not yet taken by the stream, spans included.
    fn queued(&self) -> u64 {
        self.framed - self.written
    }

    /// The stream took `n` more bytes.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        self.written += n as u64;
        self.active = true;
        if self.spans.is_empty() && n == self.buf.len() - self.off {
            // All of it: the usual case for small messages.
            self.buf.clear();
            self.off = 0;
            return;
        }
        self.advance_part(n);
    }

    /// [`Sender::advance`] for anything but all that is pending.
    fn advance_part(&mut self, n: usize) {
        let mut n = n;
        while n > 0 {
            match self.spans.front() {
                Some(&(pos, span)) if pos == self.off => {
                    let t = n.min((span.len - self.span_off) as usize);
                    self.span_off += t as u32;
                    n -= t;
                    if self.span_off == span.len {
                        self.spans.pop_front();
                        self.span_off = 0;
                    }
                }
                next => {
                    let end = next.map_or(self.buf.len(), |&(pos, _)| pos);
                    let t = n.min(end - self.off);
                    assert!(t > 0, "the stream took more than was pending");
                    self.off += t;
                    n -= t;
                }
            }
        }
        if self.off == self.buf.len() && self.spans.is_empty() {
            self.buf.clear();
            self.off = 0;
        }
    }

    /// Reports the work requests whose last byte the stream has taken.
    pub fn complete_written<H: SendHost>(&mut self, host: &mut H) {
        while let Some(&(idx, pos)) = self.done_at.front() {
            if pos > self.written {
                break;
            }
            self.done_at.pop_front();
            host.completed(idx, Completion::Success);
        }
    }

    /// The stream is gone (the QP failed): everything in flight is dropped.
    pub fn abort(&mut self) {
        self.buf.clear();
        self.spans.clear();
        self.off = 0;
        self.span_off = 0;
        self.cur = None;
        self.done_at.clear();
        self.orq.clear();
        self.irq.clear();
        self.media = Media::Idle;
        self.term = None;
    }

    /// Frees the buffer of a QP that sent nothing since the last pass; true
    /// while it still holds a large one.
    pub fn trim(&mut self) -> bool {
        let idle = !std::mem::replace(&mut self.active, false);
        if idle && !self.has_pending() && self.buf.capacity() > TRIM_KEEP {
            self.buf = Vec::new();
            self.off = 0;
        }
        self.buf.capacity() > TRIM_KEEP
    }

    /// The worker carried out request `ticket` with `outcome`; false if the
    /// QP gave up on it meanwhile.
    pub fn media_done(&mut self, ticket: u64, outcome: Outcome) -> bool {
        let Media::Busy(t, req) = &self.media else {
            return false;
        };
        if *t != ticket {
            return false;
        }
        self.media = Media::Done(queue1::answer(req, outcome));
        true
    }

    /// Nothing is framed, being framed or owed: a request framed now is the
    /// next thing on the stream.
    pub fn idle(&self) -> bool {
        !self.has_pending()
            && self.cur.is_none()
            && self.done_at.is_empty()
            && self.term.is_none()
            && !self.gate
            && !self.rtr
            && self.irq.is_empty()
            && matches!(self.media, Media::Idle)
    }

    /// Frames a Send or RDMA Write (without Immediate Data) of `len` payload
    /// bytes, which fit one FPDU, the moment it is posted: the driver need not
    /// queue it when nothing waits ahead of it. `fill` writes the payload in
    /// place; if it fails, nothing is framed and its error is returned.
    /// `Ok(false)`, with nothing changed, if the sender is not
    /// [idle](Sender::idle) or the request does not qualify; it then goes the
    /// usual way. The FPDU is the one [`Sender::frame_more`] would frame for
    /// the same request. The request is complete once the stream has taken
    /// every pending byte; if the driver leaves some for later it names the
    /// request with [`Sender::complete_at`].
    pub fn frame_now<E>(
        &mut self,
        op: NowOp,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<bool, E> {
        if len > self.mulpdu || !self.idle() {
            return Ok(false);
        }
        // The header, encoded here: the one `untagged` or `tagged` would
        // give for the request, with fewer steps (tests/now.rs compares the
        // two byte for byte).
        const RV: u8 = rdmap::RDMAP_VERSION << 6;
        const LAST: u8 = ddp::FLAG_LAST | ddp::DDP_VERSION;
        let mut hdr = [0u8; HEAD_MAX];
        let (hlen, send) = match op {
            NowOp::Send {
                solicited,
                invalidate,
            } => {
                let op = send_opcode(invalidate.is_some(), solicited);
                let msn = self.msn[ddp::QN_SEND as usize];
                hdr[0] = LAST;
                hdr[1] = RV | op as u8;
                hdr[2..6].copy_from_slice(&invalidate.unwrap_or(0).to_be_bytes());
                // Queue number 0 (bytes 6..10) and MO 0 (14..18) stay zero.
                hdr[10..14].copy_from_slice(&msn.to_be_bytes());
                (ddp::UNTAGGED_HDR_LEN, true)
            }
            NowOp::Write { stag, to } => {
                hdr[0] = ddp::FLAG_TAGGED | LAST;
                hdr[1] = RV | rdmap::Opcode::Write as u8;
                hdr[2..6].copy_from_slice(&stag.to_be_bytes());
                hdr[6..14].copy_from_slice(&to.to_be_bytes());
                (ddp::TAGGED_HDR_LEN, false)
            }
        };
        self.put_fpdu_head(&hdr, hlen, len, fill)?;
        if send {
            self.take_msn(ddp::QN_SEND);
        }
        Ok(true)
    }

    /// The request [`Sender::frame_now`] framed, whose bytes the stream has
    /// not all taken yet, is send queue index `idx`: it completes through
    /// [`Sender::complete_written`] once they are.
    pub fn complete_at(&mut self, idx: u32) {
        self.done_at.push_back((idx, self.framed));
    }

    /// Frames FPDUs until [`BATCH`] bytes are waiting; false if there was
    /// nothing to frame.
    pub fn frame_more<H>(&mut self, host: &mut H) -> Result<bool, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        let before = self.framed;
        while self.queued() < BATCH as u64 {
            if self.rtr {
                // Ready-to-receive: a zero-length RDMA Write (RFC 6581 section 6).
                self.rtr = false;
                let hdr = tagged(rdmap::Opcode::Write, 0, 0, true);
                self.put_fpdu(&hdr, &[], 0, no_payload)?;
                continue;
            }
            if self.term.is_some() {
                // The peer's requests that came before the fault are answered
                // first, in order, as an RNIC working through its input in
                // order would have: the peer then tells the request the
                // Terminate is about from those before it. Nothing more of
                // the send queue goes.
                let answering = match &self.cur {
                    Some(c) => !matches!(c.job, Job::Sq(_)),
                    None => {
                        self.cur = self.next_answer(host)?;
                        self.cur.is_some()
                    }
                };
                if answering {
                    let Some(mut cur) = self.cur.take() else {
                        break;
                    };
                    if !self.frame_job(host, &mut cur)? {
                        self.cur = Some(cur);
                    }
                    continue;
                }
                if matches!(self.media, Media::Busy(..)) {
                    // An answer on the medium comes first.
                    break;
                }
            }
            if let Some(body) = self.term.take() {
                let msn = self.take_msn(ddp::QN_TERMINATE);
                let hdr = untagged(rdmap::Opcode::Terminate, 0, ddp::QN_TERMINATE, msn, 0, true);
                self.put_fpdu(&hdr, &body, 0, no_payload)?;
                // Nothing follows a Terminate (RFC 5040 section 7.1).
                self.gate = true;
                continue;
            }
            if self.gate {
                break;
            }
            if self.cur.is_none() {
                self.cur = self.next_job(host)?;
            }
            let Some(mut cur) = self.cur.take() else {
                break;
            };
            if !self.frame_job(host, &mut cur)? {
                self.cur = Some(cur);
            }
        }
        Ok(self.framed > before)
    }

    fn next_job<H>(&mut self, host: &mut H) -> Result<Option<Cur<L, P>>, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        if let Some(cur) = self.next_answer(host)? {
            return Ok(Some(cur));
        }
        self.next_request(host)
    }

    /// The next answer to the peer: a medium job finished, or the oldest
    /// request waiting (one that needs the medium goes to it).
    fn next_answer<H>(&mut self, host: &mut H) -> Result<Option<Cur<L, P>>, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        match self.media {
            Media::Done(_) => {
                let Media::Done(r) = std::mem::replace(&mut self.media, Media::Idle) else {
                    unreachable!("the medium's job is done")
                };
                return r.map(|resp| {
                    Some(Cur {
                        job: Job::Respond(resp),
                        sent: 0,
                    })
                });
            }
            Media::Busy(..) => {}
            Media::Idle => {
                if let Some(r) = self.irq.pop_front() {
                    if !needs_media(&r) {
                        return Ok(Some(Cur {
                            job: Job::Inbound(r),
                            sent: 0,
                        }));
                    }
                    self.media = Media::Busy(host.defer(r), r);
                }
            }
        }
        Ok(None)
    }

    /// The next work request of the send queue that may start now.
    fn next_request<H>(&mut self, host: &mut H) -> Result<Option<Cur<L, P>>, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        let (outstanding, ord) = (self.orq.len() as u32, self.ord_max);
        // A fenced request waits for every Read before it; a queue 1 request for
        // room in ORD.
        let confirm = self.confirm && ord > 0;
        // With ORD 0 a queue 1 request is taken, to fail: it can never go.
        let admit = |c: WrClass| {
            let fenced = c.fence && outstanding > 0;
            let full = (c.queue1 || (confirm && c.confirmed)) && outstanding >= ord && ord > 0;
            !fenced && !full
        };
        let Some(wr) = host.next_wr(admit) else {
            return Ok(None);
        };
        // Local protection is checked before the request goes out: a Read's
        // data, an atomic's original and a hash land in the local buffers. (A
        // Send's or Write's payload is checked as it is framed, in frame_data.)
        let lands = matches!(
            wr.op,
            WrOp::Read { .. } | WrOp::Atomic { .. } | WrOp::Verify { .. }
        );
        if lands
            && host
                .check_payload(&wr.payload, access::LOCAL_WRITE)
                .is_err()
        {
            return Err(bad_lkey());
        }
        Ok(Some(Cur {
            job: Job::Sq(wr),
            sent: 0,
        }))
    }

    /// Frames as much of `cur` as the batch allows; true once its last FPDU is framed.
    fn frame_job<H>(&mut self, host: &mut H, cur: &mut Cur<L, P>) -> Result<bool, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        match &cur.job {
            Job::Inbound(Inbound::Read(r)) => {
                let r = *r;
                loop {
                    let n = (r.len as u64 - cur.sent).min(self.mulpdu as u64) as usize;
                    let last = cur.sent + n as u64 == r.len as u64;
                    let to = r.sink_to.wrapping_add(cur.sent);
                    let hdr = tagged(rdmap::Opcode::ReadResponse, r.sink_stag, to, last);
                    let src = r.src_to.wrapping_add(cur.sent);
                    let span = Span {
                        stag: r.src_stag,
                        to: src,
                        len: n as u32,
                        need: access::REMOTE_READ,
                    };
                    if self.in_place(n) && host.in_place(r.src_stag) {
                        host.check_span(&span).map_err(|_| span.fault())?;
                        self.push_fpdu_spans(&hdr, &[span], n)?;
                    } else {
                        self.push_fpdu(
                            &hdr,
                            &[],
                            |buf| {
                                // A zero-length Read names no memory that
                                // could be read (RFC 5040 section 5.2.1).
                                if n == 0 {
                                    return Ok(());
                                }
                                host.read_source(r.src_stag, src, n, buf)
                                    .map_err(|_| span.fault())
                            },
                            n,
                        )?;
                    }
                    cur.sent += n as u64;
                    if last {
                        return Ok(true);
                    }
                    if self.queued() >= BATCH as u64 {
                        return Ok(false);
                    }
                }
            }
            Job::Inbound(req) => {
                let resp = queue1::answer(req, host.carry_out(req))?;
                self.respond(&resp)?;
                Ok(true)
            }
            Job::Respond(resp) => {
                self.respond(resp)?;
                Ok(true)
            }
            Job::Sq(wr) => match &wr.op {
                WrOp::Send { .. } | WrOp::Write { .. } => self.frame_data(host, cur),
                WrOp::LocalInvalidate { stag } => {
                    let r = host.invalidate_local(*stag);
                    self.local_done(host, wr.idx, r);
                    Ok(true)
                }
                WrOp::BindWindow(b) => {
                    let r = host.bind_window(b);
                    self.local_done(host, wr.idx, r);
                    Ok(true)
                }
                WrOp::Invalid(why) => Err(Fail::local(Status::LocalQpOperation, why)),
                _ => {
                    self.frame_request(wr.idx, wr.op.clone(), wr.length)?;
                    Ok(true)
                }
            },
        }
    }

    /// A local work request (Local Invalidate, a window bind) carried out:
    /// it completes in order once what was framed before it is taken, or
    /// failed with the memory bind error.
    fn local_done<H: SendHost>(&mut self, host: &mut H, idx: u32, r: Result<(), AccessFault>) {
        match r {
            Ok(()) => self.done_at.push_back((idx, self.framed)),
            Err(_) => host.completed(idx, Completion::Error(Status::MemoryBind)),
        }
    }

    /// Send family and RDMA Write: segments of at most `mulpdu` payload bytes.
    fn frame_data<H>(&mut self, host: &mut H, cur: &mut Cur<L, P>) -> Result<bool, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        let Job::Sq(wr) = &cur.job else {
            unreachable!()
        };
        let total = wr.length as u64;
        let (send, stag, to, imm, solicited, inv) = match wr.op {
            WrOp::Send {
                solicited,
                invalidate,
                imm,
            } => (true, 0, 0, imm, solicited, invalidate),
            WrOp::Write {
                stag,
                to,
                imm,
                solicited,
            } => (false, stag, to, imm, solicited, None),
            _ => unreachable!("frame_data takes Sends and Writes"),
        };
        let send_op = send_opcode(inv.is_some(), solicited);
        // Local protection is checked before the message's first byte goes
        // out. A message of one FPDU is checked by gathering its payload, before
        // anything of it is framed; a longer one, or one whose Immediate Data
        // goes first, is checked whole now.
        let first = cur.sent == 0;
        if first && (total > self.mulpdu as u64 || (send && imm.is_some())) {
            host.check_payload(&wr.payload, 0).map_err(|_| bad_lkey())?;
        }
        if send && first {
            if let Some(imm) = imm {
                // Send with Immediate: Immediate Data, then the Send it belongs
                // to, in one run of the stream (xiw's receiver gives both one
                // receive; a plain RFC 7306 receiver completes them as two
                // messages, in order).
                self.push_immediate(imm, false)?;
            }
        }
        let msn = if send && cur.sent == 0 {
            self.take_msn(ddp::QN_SEND)
        } else {
            self.msn[0].wrapping_sub(1)
        };
        loop {
            let n = (total - cur.sent).min(self.mulpdu as u64) as usize;
            let last = cur.sent + n as u64 == total;
            let hdr = if send {
                untagged(
                    send_op,
                    inv.unwrap_or(0),
                    ddp::QN_SEND,
                    msn,
                    cur.sent as u32,
                    last,
                )
            } else {
                tagged(rdmap::Opcode::Write, stag, to.wrapping_add(cur.sent), last)
            };
            let off = cur.sent;
            let payload = &wr.payload;
            let mut spans = std::mem::take(&mut self.scratch);
            spans.clear();
            let located = self.in_place(n)
                && host
                    .locate(payload, off, n, &mut spans)
                    .map_err(|_| send_buffer_lost())?;
            let r = if located {
                self.push_fpdu_spans(&hdr, &spans, n)
            } else {
                self.push_fpdu(
                    &hdr,
                    &[],
                    |buf| {
                        host.gather(payload, off, n, buf)
                            .map_err(|_| send_buffer_lost())
                    },
                    n,
                )
            };
            self.scratch = spans;
            r?;
            cur.sent += n as u64;
            if last {
                if let (false, Some(imm)) = (send, imm) {
                    // RDMA Write with Immediate: the Write, then Immediate Data (RFC 7306 section 6).
                    self.push_immediate(imm, solicited)?;
                }
                if self.confirm && wr.confirmed && self.ord_max > 0 {
                    let fence = WrOp::Read {
                        stag: 0,
                        to: 0,
                        sink_stag: 0,
                        sink_to: 0,
                        sink: L::default(),
                    };
                    self.frame_request(wr.idx, fence, 0)?;
                } else {
                    self.done_at.push_back((wr.idx, self.framed));
                }
                return Ok(true);
            }
            if self.queued() >= BATCH as u64 {
                return Ok(false);
            }
        }
    }

    /// One Immediate Data message: the 32-bit immediate of the verbs in the low
    /// half of RFC 7306's 64 bits.
    fn push_immediate(&mut self, imm: u32, solicited: bool) -> Result<(), Fail> {
        let mut body = [0u8; atomic::IMMEDIATE_LEN];
        body[4..].copy_from_slice(&imm.to_ne_bytes());
        let op = if solicited {
            rdmap::Opcode::ImmediateDataSolicited
        } else {
            rdmap::Opcode::ImmediateData
        };
        let msn = self.take_msn(ddp::QN_SEND);
        let hdr = untagged(op, 0, ddp::QN_SEND, msn, 0, true);
        self.put_fpdu(&hdr, &body, 0, no_payload)
    }

    /// A Read, Atomic, Flush, Verify or Atomic Write Request on queue 1.
    fn frame_request(&mut self, idx: u32, op: WrOp<L>, length: u32) -> Result<(), Fail> {
        if self.ord_max == 0 {
            // The connection agreed on ORD 0 (or the QP's max_rd_atomic is
            // 0): nothing of queue 1 may go (RFC 6581 section 7.1).
            return Err(Fail::local(
                Status::LocalQpOperation,
                "RDMA Read or atomic request with ORD 0",
            ));
        }
        let (opcode, body, pending): (_, Vec<u8>, _) = match op {
            WrOp::Read {
                stag,
                to,
                sink_stag,
                sink_to,
                sink,
            } => {
                let req = rdmap::ReadRequestRepr {
                    sink_stag,
                    sink_to,
                    size: length,
                    src_stag: stag,
                    src_to: to,
                };
                let mut b = vec![0u8; rdmap::READ_REQUEST_LEN];
                req.emit(&mut rdmap::ReadRequestPacket::new_unchecked(&mut b[..]));
                let pending = Outstanding::Read(PendingRead {
                    sq_idx: idx,
                    sink_stag,
                    sink_to,
                    sink,
                    length: length as u64,
                    received: 0,
                });
                (rdmap::Opcode::ReadRequest, b, pending)
            }
            WrOp::Flush {
                stag,
                to,
                len,
                flags,
            } => {
                let req = commit::FlushRequestRepr {
                    stag,
                    length: len,
                    to,
                    flags: flags & commit::FLUSH_KNOWN_FLAGS,
                };
                let mut b = vec![0u8; req.buffer_len()];
                req.emit(&mut commit::FlushRequestPacket::new_unchecked(&mut b[..]));
                (
                    rdmap::Opcode::FlushRequest,
                    b,
                    Outstanding::Flush { sq_idx: idx },
                )
            }
            WrOp::Verify {
                stag,
                to,
                len,
                hash,
                hash_len,
                result,
            } => {
                let req = commit::VerifyRequestRepr {
                    stag,
                    length: len,
                    to,
                    hash: &hash[..(hash_len as usize).min(VERIFY_MAX_HASH)],
                };
                let mut b = vec![0u8; req.buffer_len()];
                req.emit(&mut commit::VerifyRequestPacket::new_unchecked(&mut b[..]));
                (
                    rdmap::Opcode::VerifyRequest,
                    b,
                    Outstanding::Verify {
                        sq_idx: idx,
                        result,
                    },
                )
            }
            WrOp::AtomicWrite { stag, to, value } => {
                let req = commit::AtomicWriteRequestRepr {
                    stag,
                    length: commit::ATOMIC_WRITE_DATA_LEN,
                    to,
                    data: value.to_be_bytes(),
                };
                let mut b = vec![0u8; req.buffer_len()];
                req.emit(&mut commit::AtomicWriteRequestPacket::new_unchecked(
                    &mut b[..],
                ));
                (
                    rdmap::Opcode::AtomicWriteRequest,
                    b,
                    Outstanding::AtomicWrite { sq_idx: idx },
                )
            }
            WrOp::Atomic {
                op: aop,
                stag,
                to,
                result,
            } => {
                let id = self.next_request_id;
                self.next_request_id = id.wrapping_add(1);
                use atomic::AtomicRequestRepr as A;
                let req = match aop {
                    AtomicOp::FetchAdd { add } => A::fetch_add(id, stag, to, add),
                    AtomicOp::MaskedFetchAdd { add, mask } => {
                        A::masked_fetch_add(id, stag, to, add, mask)
                    }
                    AtomicOp::CmpSwap { compare, swap } => A::cmp_swap(id, stag, to, compare, swap),
                    AtomicOp::MaskedCmpSwap {
                        compare,
                        compare_mask,
                        swap,
                        swap_mask,
                    } => A::masked_cmp_swap(id, stag, to, compare, compare_mask, swap, swap_mask),
                    // Swap: a CmpSwap whose compare mask selects nothing.
                    AtomicOp::Swap { swap } => {
                        A::masked_cmp_swap(id, stag, to, 0, 0, swap, atomic::NO_MASK)
                    }
                };
                let mut b = vec![0u8; req.buffer_len()];
                req.emit(&mut atomic::RequestPacket::new_unchecked(&mut b[..]));
                (
                    rdmap::Opcode::AtomicRequest,
                    b,
                    Outstanding::Atomic {
                        sq_idx: idx,
                        request_id: id,
                        result,
                    },
                )
            }
            _ => unreachable!("frame_request takes queue 1 requests"),
        };
        self.orq.push_back(pending);
        let msn = self.take_msn(ddp::QN_READ_REQUEST);
        let hdr = untagged(opcode, 0, ddp::QN_READ_REQUEST, msn, 0, true);
        self.put_fpdu(&hdr, &body, 0, no_payload)
    }

    /// Frames the response to a queue 1 request on queue 3.
    fn respond(&mut self, resp: &Response) -> Result<(), Fail> {
        let msn = self.take_msn(ddp::QN_ATOMIC_RESPONSE);
        let hdr = untagged(resp.opcode, 0, ddp::QN_ATOMIC_RESPONSE, msn, 0, true);
        self.put_fpdu(&hdr, &resp.body, 0, no_payload)
    }

    /// A payload of `n` bytes goes to the stream in place.
    fn in_place(&self, n: usize) -> bool {
        !self.crc && self.inplace_min > 0 && n >= self.inplace_min
    }

    /// Appends one FPDU (no CRC) whose payload, `payload_len` bytes, is sent
    /// from `spans` in place.
    fn push_fpdu_spans(
        &mut self,
        hdr: &ddp::HeaderRepr,
        spans: &[Span],
        payload_len: usize,
    ) -> Result<(), Fail> {
        debug_assert!(!self.crc, "a CRC must cover the bytes sent");
        if spans.iter().map(|s| s.len as usize).sum::<usize>() != payload_len {
            return Err(wrong_length());
        }
        let start = self.open_fpdu(hdr, &[], payload_len);
        let at = self.buf.len();
        self.spans
            .extend(spans.iter().filter(|s| s.len > 0).map(|&s| (at, s)));
        self.close_fpdu(start, payload_len);
        Ok(())
    }

    fn take_msn(&mut self, qn: u32) -> u32 {
        let m = self.msn[qn as usize];
        self.msn[qn as usize] = m.wrapping_add(1);
        m
    }

    /// Appends one FPDU, laid out whole: length, DDP/RDMAP header, `extra`
    /// header bytes, `len` payload bytes that `fill` writes in place, pad and
    /// trailer (RFC 5044 section 4.1). If `fill` fails nothing is appended.
    fn put_fpdu<E>(
        &mut self,
        hdr: &ddp::HeaderRepr,
        extra: &[u8],
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let hlen = hdr.buffer_len();
        let mut head = [0u8; HEAD_MAX];
        hdr.emit(&mut head);
        let n = extra.len();
        self.put_fpdu_head(&head, hlen, n + len, |b| {
            b[..n].copy_from_slice(extra);
            fill(&mut b[n..])
        })
    }

    /// As [`Sender::put_fpdu`], for an encoded DDP/RDMAP header: the first
    /// `hlen` bytes of `head` (the rest zeros); `fill` writes the `len`
    /// bytes after it.
    #[inline]
    fn put_fpdu_head<E>(
        &mut self,
        head: &[u8; HEAD_MAX],
        hlen: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let start = self.buf.len();
        let h = start + mpa::LEN_FIELD_LEN;
        let at = h + hlen;
        let end = at + len + mpa::pad_len(hlen + len);
        // Appending from zeros costs less than a resize for the short
        // FPDUs of small messages.
        // The FPDU of a message of a few bytes takes a fixed-size block of
        // zeros, which is copied in line, cut to its length.
        let n = end + mpa::CRC_LEN - start;
        if n <= SHORT_FPDU {
            self.buf.extend_from_slice(&ZEROS[..SHORT_FPDU]);
            self.buf.truncate(start + n);
        } else {
            match ZEROS.get(..n) {
                Some(z) => self.buf.extend_from_slice(z),
                None => self.buf.resize(end + mpa::CRC_LEN, 0),
            }
        }
        // The whole block of `head`, in one copy of a fixed size: what lies
        // past the header is zeros, and lands on bytes that the payload,
        // pad or trailer take next (every FPDU has at least the trailer's 4
        // bytes after its header, and no header is shorter than 14).
        self.buf[h..h + HEAD_MAX].copy_from_slice(head);
        if let Err(e) = fill(&mut self.buf[at..at + len]) {
            self.buf.truncate(start);
            return Err(e);
        }
        self.buf[start..h].copy_from_slice(&((hlen + len) as u16).to_be_bytes());
        self.seal(start, end, 0);
        Ok(())
    }

    /// Appends one FPDU: length, DDP/RDMAP header, `extra` header bytes,
    /// `payload_len` bytes produced by `payload`, pad and CRC (RFC 5044 section 4.1).
    fn push_fpdu(
        &mut self,
        hdr: &ddp::HeaderRepr,
        extra: &[u8],
        payload: impl FnOnce(&mut Vec<u8>) -> Result<(), Fail>,
        payload_len: usize,
    ) -> Result<(), Fail> {
        let start = self.open_fpdu(hdr, extra, payload_len);
        let end = self.buf.len() + payload_len;
        let r = payload(&mut self.buf).and_then(|()| {
            // The driver gathered another length than asked: never frame it.
            (self.buf.len() == end)
                .then_some(())
                .ok_or_else(wrong_length)
        });
        if let Err(e) = r {
            self.buf.truncate(start);
            return Err(e);
        }
        self.close_fpdu(start, 0);
        Ok(())
    }

    /// Starts an FPDU of `payload_len` payload bytes with its ULPDU_Length,
    /// the DDP/RDMAP header and `extra` header bytes; returns where it starts.
    fn open_fpdu(&mut self, hdr: &ddp::HeaderRepr, extra: &[u8], payload_len: usize) -> usize {
        let start = self.buf.len();
        let hlen = hdr.buffer_len();
        let ulpdu = hlen + extra.len() + payload_len;
        self.buf.extend_from_slice(&(ulpdu as u16).to_be_bytes());
        self.buf.resize(start + mpa::LEN_FIELD_LEN + hlen, 0);
        hdr.emit(&mut self.buf[start + mpa::LEN_FIELD_LEN..]);
        self.buf.extend_from_slice(extra);
        start
    }

    /// Ends the FPDU at `start` with pad and trailer (the CRC, or zeros
    /// without CRC); `in_place` of its payload bytes are spans, not in the buffer.
    fn close_fpdu(&mut self, start: usize, in_place: usize) {
        let ulpdu = usize::from(u16::from_be_bytes([self.buf[start], self.buf[start + 1]]));
        let end = self.buf.len() + mpa::pad_len(ulpdu);
        self.buf.resize(end + mpa::CRC_LEN, 0);
        self.seal(start, end, in_place);
    }

    /// Writes the trailer of the FPDU that runs from `start` to `end` (pad
    /// included) into the zeroed bytes after it: the CRC, or zeros without
    /// CRC; counts it framed, with `in_place` payload bytes that are spans.
    fn seal(&mut self, start: usize, end: usize, in_place: usize) {
        if self.crc {
            debug_assert_eq!(in_place, 0, "a CRC must cover the bytes sent");
            let c = (self.crc32c)(0, &self.buf[start..end]);
            self.buf[end..end + mpa::CRC_LEN].copy_from_slice(&c.to_le_bytes());
        }
        self.framed += (end + mpa::CRC_LEN - start + in_place) as u64;
    }
}

/// The fill of an FPDU that carries no payload.
fn no_payload(_: &mut [u8]) -> Result<(), Fail> {
    Ok(())
}

/// A driver located or gathered another payload length than asked.
fn wrong_length() -> Fail {
    Fail::local(Status::LocalProtection, "payload of the wrong length")
}

/// A work request names a local buffer it may not use.
fn bad_lkey() -> Fail {
    Fail::local(Status::LocalProtection, "send WQE with a bad lkey")
}

/// A work request's own buffer went away while it was being sent.
fn send_buffer_lost() -> Fail {
    Fail::local(
        Status::LocalProtection,
        "send buffer deregistered while in flight",
    )
}

/// The Send variant for a Send that invalidates or is solicited.
fn send_opcode(invalidate: bool, solicited: bool) -> rdmap::Opcode {
    match (invalidate, solicited) {
        (true, false) => rdmap::Opcode::SendInvalidate,
        (true, true) => rdmap::Opcode::SendSolicitedInvalidate,
        (false, false) => rdmap::Opcode::Send,
        (false, true) => rdmap::Opcode::SendSolicited,
    }
}

fn ctrl(op: rdmap::Opcode) -> u8 {
    rdmap::Ctrl {
        version: rdmap::RDMAP_VERSION,
        opcode: op as u8,
    }
    .to_byte()
}

fn tagged(op: rdmap::Opcode, stag: u32, to: u64, last: bool) -> ddp::HeaderRepr {
    ddp::HeaderRepr {
        last,
        version: ddp::DDP_VERSION,
        rdmap_ctrl: ctrl(op),
        kind: ddp::Kind::Tagged { stag, to },
    }
}

fn untagged(
    op: rdmap::Opcode,
    ulp_word: u32,
    qn: u32,
    msn: u32,
    mo: u32,
    last: bool,
) -> ddp::HeaderRepr {
    ddp::HeaderRepr {
        last,
        version: ddp::DDP_VERSION,
        rdmap_ctrl: ctrl(op),
        kind: ddp::Kind::Untagged {
            ulp_word,
            qn,
            msn,
            mo,
        },
    }
}
