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
//!
//! This module holds the [`Sender`], its public types and the loop that
//! frames work and answers in turn; what each kind of work frames is in a
//! file of its own:
//!
//! - `data`: Send and RDMA Write, segmented, their payload copied or sent in
//!   place, with Immediate Data;
//! - `now`: the immediate path, a one-FPDU Send or Write framed the moment
//!   it is posted ([`Sender::frame_now`], [`NowOp`]);
//! - `request`: the requests this side issues on queue 1 (Read, Atomic,
//!   Flush, Verify, Atomic Write), one function per request;
//! - `answer`: the answers to the peer's queue 1 requests (Read Responses,
//!   the responses on queue 3) and the requests that wait on the medium;
//! - `ord`: ORD, IRD and fences, and which work request may start now;
//! - `complete`: the completions of this side's work requests;
//! - `fpdu`: FPDUs laid out in the buffer, their headers and MSNs;
//! - `stream`: what is framed and not yet taken, handed to the stream.

mod answer;
mod complete;
mod data;
mod fpdu;
mod now;
mod ord;
mod request;
mod stream;

use std::collections::VecDeque;

use crate::fault::{AccessFault, Fail, Status};
use crate::queue1::{access, Inbound, Outcome, Outstanding, Response, VERIFY_MAX_HASH};
use crate::wire::{ddp, mpa, rdmap};

use answer::Media;
use fpdu::{no_payload, tagged, untagged};
pub use now::NowOp;

/// Bytes framed per round before they are handed to the stream.
pub const BATCH: usize = 256 * 1024;

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

    /// Payloads of at least `n` bytes go to the stream in place on a stream
    /// without CRC (0: never); for what is framed from now on.
    pub fn set_inplace_min(&mut self, n: usize) {
        self.inplace_min = n;
    }

    /// Sends `body` as a Terminate ahead of everything else; nothing follows it.
    pub fn terminate(&mut self, body: Vec<u8>) {
        self.term = Some(body);
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
                if self.frame_terminate(host)? {
                    continue;
                }
                break;
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

    /// With a Terminate waiting: the peer's requests that came before the
    /// fault are answered first, in order, as an RNIC working through its
    /// input in order would have: the peer then tells the request the
    /// Terminate is about from those before it. Then the Terminate, and
    /// nothing more of the send queue goes. False while an answer on the
    /// medium must come first.
    fn frame_terminate<H>(&mut self, host: &mut H) -> Result<bool, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        let answering = match &self.cur {
            Some(c) => !matches!(c.job, Job::Sq(_)),
            None => {
                self.cur = self.next_answer(host)?;
                self.cur.is_some()
            }
        };
        if answering {
            let Some(mut cur) = self.cur.take() else {
                return Ok(false);
            };
            if !self.frame_job(host, &mut cur)? {
                self.cur = Some(cur);
            }
            return Ok(true);
        }
        if matches!(self.media, Media::Busy(..)) {
            // An answer on the medium comes first.
            return Ok(false);
        }
        if let Some(body) = self.term.take() {
            let msn = self.take_msn(ddp::QN_TERMINATE);
            let hdr = untagged(rdmap::Opcode::Terminate, 0, ddp::QN_TERMINATE, msn, 0, true);
            self.put_fpdu(&hdr, &body, 0, no_payload)?;
            // Nothing follows a Terminate (RFC 5040 section 7.1).
            self.gate = true;
        }
        Ok(true)
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

    /// Frames as much of `cur` as the batch allows; true once its last FPDU is framed.
    fn frame_job<H>(&mut self, host: &mut H, cur: &mut Cur<L, P>) -> Result<bool, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        match &cur.job {
            Job::Inbound(Inbound::Read(r)) => {
                let r = *r;
                self.read_response(host, r, &mut cur.sent)
            }
            Job::Inbound(req) => self.carry_out(host, req),
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
