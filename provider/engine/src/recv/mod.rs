//! The receive side of a QP: FPDUs in (any segmentation of the stream), every
//! field checked against the QP's state and the STag table, payload placed
//! through the driver's [`Host`], completions and queue 1 work out (RFC 5040
//! section 5, RFC 5041, RFC 7306, draft-talpey-rdma-commit). Any violation is a
//! [`Fail`] carrying the Terminate for the peer.
//!
//! This module takes the stream apart into FPDUs, decodes and judges their
//! DDP and RDMAP headers and hands each message to the handler of its kind:
//!
//! - `write`: RDMA Write (tagged placement);
//! - `read`: RDMA Read Response, into the sink of the oldest Read;
//! - `send`: the Send variants (a whole Send in one segment in one host
//!   step) and Immediate Data;
//! - `request`: the requests on queue 1 (Read, Atomic, Flush, Verify, Atomic
//!   Write), checked and queued;
//! - `response`: the responses on queue 3 (Atomic, Flush, Verify, Atomic
//!   Write);
//! - `terminate`: the peer's Terminate;
//! - `direct`: large Writes and Read Responses placed in place;
//! - `errors`: the failures, each with its Terminate.
//!
//! A large RDMA Write or Read Response whose FPDU has not fully arrived is
//! placed in place: once its header has passed every check (STag, bounds,
//! rights, the Read it answers), [`Receiver::direct`] names the memory its
//! payload goes to, and the driver reads the stream straight into it; the
//! CRC, if any, is checked when the trailer comes. Placement before the CRC
//! check is what DDP allows for tagged buffers (their contents are undefined
//! until the message completes; a CRC error ends the stream with a
//! Terminate). Anything that fails a check is left to the buffered path,
//! which reports it exactly as it would any FPDU.

mod direct;
mod errors;
mod read;
mod request;
mod response;
mod send;
mod terminate;
mod write;

pub use read::LentRead;

use crate::fault::{AccessFault, Fail, Status};
use crate::queue1::{queue_of, Inbound, Outstanding};
use crate::send::Span;
use crate::wire::{self, ddp, mpa, rdmap};

/// What a completed receive reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvCompletion {
    pub byte_len: u32,
    /// Immediate data (RFC 7306 section 6).
    pub imm: Option<u32>,
    /// The STag a Send with Invalidate invalidated.
    pub invalidated: Option<u32>,
    /// The immediate data of an RDMA Write (`RECV_RDMA_WITH_IMM`), not a Send.
    pub after_write: bool,
    /// The message asked for a solicited event (Send with Solicited Event,
    /// RFC 5040 section 4.3; Immediate Data with Solicited Event, RFC 7306).
    pub solicited: bool,
}

/// What the receive side needs from the driver: registered memory, the receive
/// queue, and the queue 1 state the transmit side shares.
pub trait Host {
    /// A posted receive.
    type Recv;
    /// A local buffer list: the sink of a Read, the result of an atomic or Verify.
    type Local: Clone;

    /// Places `data` at `to` of tagged buffer `stag` (a remote write: the MR
    /// must grant `need` and the QP `allowed`).
    fn place(
        &mut self,
        stag: u32,
        to: u64,
        data: &[u8],
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessFault>;
    /// Checks that `len` bytes at `to` of `stag` may be accessed.
    fn check(
        &mut self,
        stag: u32,
        to: u64,
        len: u64,
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessFault>;
    /// Whether the driver can read a payload from the stream straight into
    /// the memory of tagged buffer `stag` ([`Receiver::direct`]); if not, a
    /// large payload for it is buffered and placed with [`Host::place`],
    /// as a small one is.
    fn in_place(&mut self, _stag: u32) -> bool {
        true
    }
    /// As [`Host::check`] for the 8 bytes at `to`; whether they are 64-bit aligned in memory.
    fn aligned8(
        &mut self,
        stag: u32,
        to: u64,
        need: u32,
        allowed: u32,
    ) -> Result<bool, AccessFault>;
    /// Invalidates `stag` for a Send with Invalidate.
    fn invalidate(&mut self, stag: u32) -> Result<(), AccessFault>;

    /// Takes the next posted receive.
    fn take_recv(&mut self) -> Option<Self::Recv>;
    fn recv_len(&self, r: &Self::Recv) -> u64;
    /// Copies `data` into receive `r` at message offset `off`.
    fn scatter_recv(&mut self, r: &Self::Recv, off: u64, data: &[u8]) -> Result<(), AccessFault>;
    fn recv_done(&mut self, r: Self::Recv, c: RecvCompletion);
    fn recv_failed(&mut self, r: Self::Recv, status: Status);
    /// A whole message in one segment, into the next posted receive: takes
    /// it, places `data` at its start and completes it with `c`; on a
    /// failure, nothing is completed, and the receive taken (if any) comes
    /// back for the engine to fail. The same as [`take_recv`](Host::take_recv),
    /// [`scatter_recv`](Host::scatter_recv) and [`recv_done`](Host::recv_done)
    /// in turn, which is what it does unless the driver has a shorter way.
    fn recv_whole(&mut self, data: &[u8], c: RecvCompletion) -> Result<(), Whole<Self::Recv>> {
        recv_whole_by_parts(self, data, c)
    }
    /// Copies `data` into local buffer `l` at offset `off`.
    fn scatter(&mut self, l: &Self::Local, off: u64, data: &[u8]) -> Result<(), AccessFault>;
    fn local_len(&self, l: &Self::Local) -> u64;
    /// Appends the spans of registered memory that `n` bytes of local buffer
    /// `l` from offset `off` occupy, each checked for a local write, to
    /// `spans`; false if the driver cannot place into them directly.
    fn locate_local(
        &mut self,
        l: &Self::Local,
        off: u64,
        n: usize,
        spans: &mut Vec<Span>,
    ) -> Result<bool, AccessFault>;

    /// The oldest request this side sent and still waits on.
    fn oldest_outstanding(&mut self) -> Option<Outstanding<Self::Local>>;
    /// `n` more bytes of the oldest request (a Read) were placed; with `last`
    /// the Read is answered and completes. False if it is gone (the QP was
    /// flushed meanwhile).
    fn read_arrived(&mut self, n: u64, last: bool) -> bool;
    /// The oldest request is answered: it completes (with `len` as its byte
    /// count, if given).
    fn answered(&mut self, len: Option<u32>);
    /// Queues a request from the peer behind the earlier ones; false if IRD
    /// requests are waiting already.
    fn queue_request(&mut self, req: Inbound) -> bool;
    /// The peer's first FPDU arrived: this side may transmit (RFC 6581 section 6).
    fn may_transmit(&mut self);
}

/// Why [`Host::recv_whole`] placed nothing.
#[derive(Debug)]
pub enum Whole<R> {
    /// No receive is posted.
    NoRecv,
    /// The message is longer than receive `R`.
    TooLong(R),
    /// Receive `R` names memory it may not write.
    BadBuffer(R),
}

/// [`Host::recv_whole`] through the host's separate steps.
pub fn recv_whole_by_parts<H: Host + ?Sized>(
    host: &mut H,
    data: &[u8],
    c: RecvCompletion,
) -> Result<(), Whole<H::Recv>> {
    let Some(r) = host.take_recv() else {
        return Err(Whole::NoRecv);
    };
    if data.len() as u64 > host.recv_len(&r) {
        return Err(Whole::TooLong(r));
    }
    if host.scatter_recv(&r, 0, data).is_err() {
        return Err(Whole::BadBuffer(r));
    }
    host.recv_done(r, c);
    Ok(())
}

/// The receive state of an established stream.
#[derive(Debug)]
pub struct Receiver<R> {
    crc: bool,
    crc32c: mpa::Crc32c,
    /// Responder side: the ready-to-receive message the peer's first FPDU
    /// is, until it came (`Rtr::None`: none awaited).
    rtr: mpa::Rtr,
    /// The QP's rights for remote requests.
    access: u32,
    /// RFC 7306 atomics and immediate data, and the commit draft's operations.
    extensions: bool,
    /// The peer is an xiw that sends Send with Immediate as Immediate Data directly
    /// followed by the Send, and Immediate Data on its own only after an RDMA
    /// Write: such a pair takes a single receive, as the verbs promise.
    merge_imm: bool,
    /// Next expected MSN per inbound untagged queue 0 to 3 (RFC 5041 section 5.1).
    msn: [u32; 4],
    cur: Option<R>,
    placed: u64,
    /// The immediate of that pair, waiting for its Send.
    pending_imm: Option<u32>,
    /// The merged Immediate Data asked for a solicited event.
    pending_se: bool,
    /// Bytes of the RDMA Write message being received.
    write_len: u64,
    /// The message before this one was a whole RDMA Write of that many bytes.
    after_write: Option<u64>,
    /// Payloads of at least this many bytes are placed in place (0: never).
    inplace_min: usize,
    /// The FPDU whose payload the driver is reading into memory. Boxed:
    /// while there is none, no field of it is left uninitialised for
    /// optimised code to read ahead of the check (memcheck would flag it).
    placing: Option<Box<direct::Placing>>,
}

/// The accounting of RDMA Writes that Immediate Data reads (RFC 7306
/// section 6), as it stands between two FPDUs: what a driver that lets
/// another place whole RDMA Writes from the stream (the kernel module)
/// lends it, and takes back with the Writes it placed counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteTally {
    /// Bytes of the Write message whose last segment has not come.
    pub write_len: u64,
    /// The message before the next one was a whole Write of that many bytes.
    pub after_write: Option<u64>,
}

impl WriteTally {
    /// One more segment of an RDMA Write, of `n` bytes, placed elsewhere:
    /// the tally as [`Receiver`] keeps it for a Write it places (every
    /// message forgets the Write before it; the last segment makes one).
    pub fn written(&mut self, n: u64, last: bool) {
        self.after_write = None;
        self.write_len += n;
        if last {
            self.after_write = Some(std::mem::take(&mut self.write_len));
        }
    }
}

/// How a stream was set up, for its receive side.
#[derive(Clone, Copy, Debug, Default)]
pub struct Params {
    pub crc: bool,
    /// The ready-to-receive message agreed that the peer sends first
    /// (`Rtr::None` on the initiator's side, or when none was agreed).
    pub rtr: mpa::Rtr,
    pub access: u32,
    pub extensions: bool,
    pub merge_imm: bool,
    /// Tagged payloads of at least this many bytes are placed in place (0: never).
    pub inplace_min: usize,
}

impl<R> Receiver<R> {
    /// Computes CRCs with `f` (the driver's choice for its machine).
    pub fn use_crc32c(&mut self, f: mpa::Crc32c) {
        self.crc32c = f;
    }

    pub fn new(p: Params) -> Receiver<R> {
        Receiver {
            crc: p.crc,
            crc32c: mpa::crc32c,
            rtr: p.rtr,
            access: p.access,
            extensions: p.extensions,
            merge_imm: p.merge_imm,
            msn: [1; 4],
            cur: None,
            placed: 0,
            pending_imm: None,
            pending_se: false,
            write_len: 0,
            after_write: None,
            inplace_min: p.inplace_min,
            placing: None,
        }
    }

    /// Still waiting for the peer's first FPDU.
    pub fn expects_rtr(&self) -> bool {
        self.rtr != mpa::Rtr::None
    }

    /// Whether another may place whole RDMA Writes from the head of the
    /// stream now, and the tally it carries on: only between two FPDUs, the
    /// ready-to-receive message come, no Immediate Data waiting for its
    /// Send (a Write there is refused), and the QP open to remote Writes.
    /// The driver must have no byte of the stream buffered.
    pub fn lend(&self) -> Option<WriteTally> {
        let idle = self.placing.is_none()
            && self.rtr == mpa::Rtr::None
            && self.pending_imm.is_none()
            && self.access & crate::queue1::access::REMOTE_WRITE != 0;
        idle.then_some(WriteTally {
            write_len: self.write_len,
            after_write: self.after_write,
        })
    }

    /// The stream is back from whoever [`Receiver::lend`] lent it to, with
    /// the Writes it placed counted in `t`.
    pub fn take_back(&mut self, t: WriteTally) {
        self.write_len = t.write_len;
        self.after_write = t.after_write;
    }

    /// With a stream [`Receiver::lend`] lends: the Read Responses the
    /// borrower may place as well, those of the oldest outstanding Read if
    /// its sink allows ([`LentRead`]). A Read Response placed that way
    /// forgets the Write before it, as every message does.
    pub fn lend_read<H: Host<Recv = R>>(&self, host: &mut H) -> Option<LentRead> {
        read::lendable(host)
    }

    /// The stream is back from the borrower of `lent`, with `left` bytes of
    /// the Read still to come, and `done` if it placed the Read's last
    /// segment: what it placed counts as arrived (the Read completes with
    /// its last); a failure (the Read was flushed meanwhile) ends the stream.
    pub fn read_back<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        lent: LentRead,
        left: u64,
        done: bool,
    ) -> Result<(), Fail> {
        read::read_back(host, lent, left, done)
    }

    /// The QP's rights for remote requests changed (modify_qp in RTS).
    pub fn set_access(&mut self, access: u32) {
        self.access = access;
    }

    /// Carries a receive taken by an earlier stream of the QP over to this one.
    pub fn resume(&mut self, r: R) {
        self.cur = Some(r);
    }

    /// Takes the receive a message was being placed into (the QP is failing).
    pub fn take_current(&mut self) -> Option<R> {
        self.cur.take()
    }

    /// Processes every whole FPDU at the start of `buf`, and starts placing
    /// a large one in place when only its beginning is there (see
    /// [`Receiver::direct`]); returns the bytes consumed. On a failure the
    /// receive it hit has completed with its own status, and nothing more may
    /// be processed.
    pub fn handle<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        buf: &[u8],
    ) -> (usize, Result<(), Fail>) {
        let mut at = 0;
        let r = self.handle_from(host, buf, &mut at);
        if let Err(mut f) = r {
            self.placing = None;
            if let Some(status) = f.rq_status.take() {
                if let Some(job) = self.cur.take() {
                    host.recv_failed(job, status);
                }
            }
            return (at, Err(f));
        }
        (at, Ok(()))
    }

    /// The FPDU loop: the trailer of a payload placed in place, the start of
    /// a large FPDU that can be placed in place, or a whole FPDU, until the
    /// bytes run out.
    fn handle_from<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        buf: &[u8],
        at: &mut usize,
    ) -> Result<(), Fail> {
        loop {
            if let Some(p) = &self.placing {
                if p.left > 0 || buf.len() - *at < p.trailer {
                    return Ok(());
                }
                let trailer = &buf[*at..*at + p.trailer];
                *at += p.trailer;
                self.finish_direct(host, trailer)?;
                continue;
            }
            let Some(len) = mpa::peek_fpdu_len(&buf[*at..]) else {
                return Ok(());
            };
            if buf.len() - *at < len {
                if let Some(n) = self.start_direct(host, &buf[*at..], len)? {
                    *at += n;
                    continue;
                }
                return Ok(());
            }
            let fpdu = &buf[*at..*at + len];
            *at += len;
            self.segment(host, fpdu)?;
        }
    }

    /// One FPDU: its CRC, then the steady state's commonest headers, else
    /// the general decode.
    fn segment<H: Host<Recv = R>>(&mut self, host: &mut H, fpdu: &[u8]) -> Result<(), Fail> {
        let Ok(ulpdu) = mpa::check_fpdu_with(fpdu, self.crc.then_some(self.crc32c)) else {
            return Err(errors::crc_error());
        };
        if let Some(r) = self.steady(host, ulpdu) {
            return r.map_err(|f| *f);
        }
        self.decoded(host, ulpdu)
    }

    /// The commonest messages, known by the exact bytes of their headers: a
    /// whole Send (with or without Solicited Event) in one segment, and the
    /// last segment of an RDMA Write, on a stream in its steady state (no
    /// ready-to-receive message awaited, no Immediate Data waiting for its
    /// Send, no Send being received). The bytes matched are the checks the
    /// general decode would make of them; the message then goes to the same
    /// handler the general path calls. `None` for anything else, which
    /// takes the general path (where every other byte value is judged).
    /// (The failure is boxed, as for [`Receiver::whole_send`].)
    #[inline(always)]
    fn steady<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        ulpdu: &[u8],
    ) -> Option<Result<(), Box<Fail>>> {
        const LAST: u8 = ddp::FLAG_LAST | ddp::DDP_VERSION;
        // Each byte value a constant of its own: in a pattern, `A | B` is
        // either of two values, not their bits together.
        const TAGGED_LAST: u8 = ddp::FLAG_TAGGED | LAST;
        const RV: u8 = rdmap::RDMAP_VERSION << 6;
        const SEND: u8 = RV | rdmap::Opcode::Send as u8;
        const SEND_SE: u8 = RV | rdmap::Opcode::SendSolicited as u8;
        const WRITE: u8 = RV | rdmap::Opcode::Write as u8;
        if self.rtr != mpa::Rtr::None || self.pending_imm.is_some() || self.cur.is_some() {
            return None;
        }
        let be32 = |at: usize| wire::be::u32_at(ulpdu, at..at + 4);
        match *ulpdu {
            [LAST, op @ (SEND | SEND_SE), ..] if ulpdu.len() >= ddp::UNTAGGED_HDR_LEN => {
                // Queue number, MSN and MO follow the ULP word.
                if be32(6) != ddp::QN_SEND || be32(10) != self.msn[0] || be32(14) != 0 {
                    return None;
                }
                self.previous_write();
                let (dhdr, payload) = ulpdu.split_at(ddp::UNTAGGED_HDR_LEN);
                let op = if op == SEND {
                    rdmap::Opcode::Send
                } else {
                    rdmap::Opcode::SendSolicited
                };
                // Whole, at MO 0, with no receive in progress: the Send
                // handler's one-step case.
                Some(self.whole_send(host, op, payload, dhdr))
            }
            [TAGGED_LAST, WRITE, ..] if ulpdu.len() >= ddp::TAGGED_HDR_LEN => {
                let stag = be32(2);
                let to = wire::be::u64_at(ulpdu, 6..14);
                self.previous_write();
                let (dhdr, payload) = ulpdu.split_at(ddp::TAGGED_HDR_LEN);
                Some(self.write(host, stag, to, true, payload, dhdr))
            }
            _ => None,
        }
    }

    /// The general path: the DDP and RDMAP headers decoded and judged (RFC
    /// 5041 section 7, RFC 5040 section 7.2), the ready-to-receive message
    /// taken, then the message handed to the handler of its kind.
    fn decoded<H: Host<Recv = R>>(&mut self, host: &mut H, ulpdu: &[u8]) -> Result<(), Fail> {
        let (hdr, hlen) = match ddp::HeaderRepr::parse(ulpdu) {
            Ok(v) => v,
            Err(wire::Error::BadVersion) => return Err(errors::bad_ddp_version(ulpdu)),
            Err(_) => return Err(errors::short_segment()),
        };
        let (dhdr, payload) = ulpdu.split_at(hlen);
        let c = rdmap::Ctrl::from_byte(hdr.rdmap_ctrl);
        if c.version != rdmap::RDMAP_VERSION {
            return Err(errors::bad_rdmap_version(dhdr));
        }
        let opcode = rdmap::Opcode::from_u8(c.opcode);
        if self.rtr != mpa::Rtr::None && self.ready_to_receive(host, &hdr, opcode, payload)? {
            return Ok(());
        }
        self.dispatch(host, &hdr, opcode, dhdr, payload)
    }

    /// The initiator's first FPDU (RFC 6581 section 6): this side may now
    /// transmit, whatever it is. True if it was the agreed zero-length
    /// message, which carries nothing more; anything else is processed as
    /// it is, except where a zero-length Send was agreed: then it is not the
    /// message agreed.
    fn ready_to_receive<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        hdr: &ddp::HeaderRepr,
        opcode: Option<rdmap::Opcode>,
        payload: &[u8],
    ) -> Result<bool, Fail> {
        let rtr = std::mem::replace(&mut self.rtr, mpa::Rtr::None);
        host.may_transmit();
        if rtr != mpa::Rtr::ZeroLengthSend {
            // The agreed zero-length RDMA Write is tagged, as every Write is.
            let agreed =
                hdr.kind.is_tagged() && opcode == Some(rdmap::Opcode::Write) && payload.is_empty();
            return Ok(agreed);
        }
        // The agreed zero-length Send is the stream's, never the
        // application's: it takes the first MSN of queue 0 and no receive.
        let agreed = matches!(
            hdr.kind,
            ddp::Kind::Untagged {
                qn: ddp::QN_SEND,
                msn: 1,
                mo: 0,
                ..
            }
        ) && hdr.last
            && opcode == Some(rdmap::Opcode::Send)
            && payload.is_empty();
        if !agreed {
            return Err(errors::not_the_agreed_rtr());
        }
        self.msn[ddp::QN_SEND as usize] = 2;
        Ok(true)
    }

    /// Hands a decoded message to the handler of its kind. RDMA Write and
    /// Read Response reference a tagged buffer (RFC 5040 sections 5.1 and
    /// 5.2.2); every other message an untagged one, on the queue its opcode
    /// names (sections 5.2.1, 5.3 and 5.4, RFC 7306 sections 5.2 and 6,
    /// draft-talpey-rdma-commit section 3.1). An opcode on a segment of the
    /// other model or on another queue is unexpected (RFC 5040 section 7.2:
    /// the opcode must be valid), and its Terminate copies the whole DDP
    /// header as it came, 14 octets tagged or 18 untagged.
    fn dispatch<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        hdr: &ddp::HeaderRepr,
        opcode: Option<rdmap::Opcode>,
        dhdr: &[u8],
        payload: &[u8],
    ) -> Result<(), Fail> {
        use rdmap::Opcode as Op;
        if self.pending_imm.is_some() && !send::announced(hdr.kind, opcode) {
            return Err(errors::unexpected(dhdr));
        }
        let previous_write = self.previous_write();
        let last = hdr.last;
        let (ulp_word, qn, mo, op) = match (hdr.kind, opcode) {
            (ddp::Kind::Tagged { stag, to }, Some(Op::Write)) => {
                return self
                    .write(host, stag, to, last, payload, dhdr)
                    .map_err(|f| *f);
            }
            (ddp::Kind::Tagged { stag, to }, Some(Op::ReadResponse)) => {
                return read::read_response(host, stag, to, last, payload, dhdr);
            }
            (
                ddp::Kind::Untagged {
                    ulp_word,
                    qn,
                    msn,
                    mo,
                },
                Some(op),
            ) => {
                self.untagged_queue(qn, msn, dhdr)?;
                (ulp_word, qn, mo, op)
            }
            _ => return Err(errors::unexpected(dhdr)),
        };
        match (qn, op) {
            (
                ddp::QN_SEND,
                Op::Send | Op::SendInvalidate | Op::SendSolicited | Op::SendSolicitedInvalidate,
            ) => self
                .send(host, op, ulp_word, mo, last, payload, dhdr)
                .map_err(|f| *f),
            (ddp::QN_SEND, Op::ImmediateData | Op::ImmediateDataSolicited) if self.extensions => {
                let of = send::ImmOf {
                    write: previous_write,
                    solicited: op == Op::ImmediateDataSolicited,
                };
                self.immediate(host, of, mo, last, payload, dhdr)
            }
            (ddp::QN_READ_REQUEST, _) if self.single_segment(qn, op, last, mo) => {
                self.msn[qn as usize] = self.msn[qn as usize].wrapping_add(1);
                self.request(host, op, payload, dhdr)
            }
            (ddp::QN_ATOMIC_RESPONSE, _) if self.single_segment(qn, op, last, mo) => {
                self.msn[qn as usize] = self.msn[qn as usize].wrapping_add(1);
                response::response(host, op, payload, dhdr)
            }
            (ddp::QN_TERMINATE, Op::Terminate) => Err(terminate::peer_terminated(payload)),
            _ => Err(errors::unexpected(dhdr)),
        }
    }

    /// The DDP checks of an untagged segment's queue (RFC 5041 section 7.2):
    /// a queue number RDMAP uses (0 to 2, and 3 with the extensions) and the
    /// MSN that queue expects next.
    fn untagged_queue(&self, qn: u32, msn: u32, dhdr: &[u8]) -> Result<(), Fail> {
        let top = if self.extensions {
            ddp::QN_ATOMIC_RESPONSE
        } else {
            ddp::QN_TERMINATE
        };
        if qn > top {
            return Err(errors::invalid_queue(dhdr));
        }
        if msn != self.msn[qn as usize] {
            return Err(errors::msn_out_of_range(dhdr));
        }
        Ok(())
    }

    /// Requests on queue 1 and their responses on queue 3 are single
    /// segments, each taking one MSN (RFC 5041 section 5.1), on the queue
    /// their opcode names; all but the Read Request are extensions.
    fn single_segment(&self, qn: u32, op: rdmap::Opcode, last: bool, mo: u32) -> bool {
        last && mo == 0
            && (op == rdmap::Opcode::ReadRequest || self.extensions)
            && queue_of(op) == Some(qn)
    }

    /// Whether the message before this one was a whole RDMA Write, and of
    /// how many bytes: Immediate Data reads it (RFC 7306 section 6);
    /// every message, whatever its kind, forgets it.
    #[inline(always)]
    fn previous_write(&mut self) -> Option<u64> {
        self.after_write.take()
    }
}

#[cfg(test)]
mod tests {
    //! The steady state's fast path against the general decode: for every value
    //! of the two control bytes a header starts with, on a tagged-looking and an
    //! untagged-looking rest of header, [`Receiver::steady`] takes exactly the
    //! headers it is meant to know, and what it does with them ends as
    //! [`Receiver::decoded`] (the general path alone) does: the same Terminate,
    //! the same memory, completions and receive state.

    use super::*;
    use crate::fault::Status;
    use crate::queue1::access;
    use crate::sim::{RecvOutcome, Sim, SimRecv};

    const BUF: u32 = 0x100;
    const BUF_IOVA: u64 = 0x1000;
    const LOC: u32 = 0x300;

    fn sim() -> Sim {
        let mut s = Sim::new(1024, 0xee);
        s.register(BUF, 0, 512, BUF_IOVA, access::REMOTE_WRITE);
        s.register(LOC, 512, 512, 512, access::LOCAL_WRITE);
        s.recvs.push_back(SimRecv {
            wr_id: 1,
            sges: vec![(LOC, 512, 64)],
        });
        s
    }

    /// What a receiver and its host were left with.
    #[derive(Debug, PartialEq)]
    struct End {
        term: Option<Vec<u8>>,
        rq_status: Option<Status>,
        arena: Vec<u8>,
        completed: Vec<(u64, RecvOutcome)>,
        msn: [u32; 4],
        after_write: Option<u64>,
        write_len: u64,
        receiving: bool,
    }

    /// How `ulpdu` ends, through the fast path if `fast` and it takes it (and
    /// whether it did), else through the general decode.
    fn run(ulpdu: &[u8], fast: bool) -> (End, bool) {
        let mut s = sim();
        let mut rx = Receiver::<SimRecv>::new(Params {
            access: u32::MAX,
            extensions: true,
            ..Params::default()
        });
        let steady = if fast { rx.steady(&mut s, ulpdu) } else { None };
        let took = steady.is_some();
        let r = match steady {
            Some(r) => r.map_err(|f| *f),
            None => rx.decoded(&mut s, ulpdu),
        };
        let (term, rq_status) = match r {
            Ok(()) => (None, None),
            Err(f) => (Some(f.term.unwrap_or_default()), f.rq_status),
        };
        let end = End {
            term,
            rq_status,
            arena: s.arena,
            completed: s.completed,
            msn: rx.msn,
            after_write: rx.after_write,
            write_len: rx.write_len,
            receiving: rx.cur.is_some(),
        };
        (end, took)
    }

    /// A tagged RDMA Write segment of `n` payload bytes at the start of BUF.
    fn write_segment(n: usize, last: bool) -> Vec<u8> {
        let mut u = vec![0u8; 14 + n];
        u[0] = if last { 0xc1 } else { 0x81 };
        u[1] = 0x40;
        u[2..6].copy_from_slice(&BUF.to_be_bytes());
        u[6..14].copy_from_slice(&BUF_IOVA.to_be_bytes());
        u
    }

    #[test]
    fn a_write_tally_counts_writes_as_the_receiver_does() {
        let segments = [(3, false), (5, true), (0, true), (7, false), (2, false)];
        let mut s = sim();
        let mut rx = Receiver::<SimRecv>::new(Params {
            access: u32::MAX,
            ..Params::default()
        });
        let mut t = WriteTally::default();
        for (n, last) in segments {
            rx.decoded(&mut s, &write_segment(n, last)).expect("placed");
            t.written(n as u64, last);
            assert_eq!(rx.lend(), Some(t), "after {n} bytes, last {last}");
        }
        assert_eq!(t.write_len, 9);
        assert_eq!(t.after_write, None);
        // Taken back with Writes placed elsewhere counted, the receiver goes
        // on from the tally it was given.
        t.written(4, true);
        rx.take_back(t);
        assert_eq!(rx.lend().map(|t| t.after_write), Some(Some(13)));
    }

    fn pending_read(sink: crate::sim::Sges, length: u64) -> Outstanding<crate::sim::Sges> {
        Outstanding::Read(crate::queue1::PendingRead {
            sq_idx: 7,
            sink_stag: sink[0].0,
            sink_to: sink[0].1,
            sink,
            length,
            received: 0,
        })
    }

    #[test]
    fn the_oldest_reads_responses_are_lent_and_counted_back() {
        let mut s = sim();
        let rx = Receiver::<SimRecv>::new(Params {
            access: u32::MAX,
            ..Params::default()
        });
        // No Read outstanding: nothing but Writes to lend.
        assert_eq!(rx.lend_read(&mut s), None);
        s.orq.push_back(pending_read(vec![(LOC, 528, 100)], 100));
        let mut rx = rx;
        let lent = rx.lend_read(&mut s).expect("a sink of one span");
        assert_eq!(
            lent,
            LentRead {
                stag: LOC,
                to: 528,
                left: 100
            }
        );
        // What the borrower may place: the STag and TO exactly, no more
        // than is left, and all of it with the last segment.
        assert!(!lent.fits(LOC + 1, 528, 10, false));
        assert!(!lent.fits(LOC, 529, 10, false));
        assert!(!lent.fits(LOC, 528, 101, false));
        assert!(!lent.fits(LOC, 528, 99, true));
        assert!(lent.fits(LOC, 528, 100, true));
        let mut b = lent;
        assert!(b.fits(LOC, 528, 40, false));
        b.placed(40);
        assert_eq!((b.to, b.left), (568, 60));
        rx.read_back(&mut s, lent, b.left, false)
            .expect("40 bytes arrived");
        assert!(s.answered.is_empty());
        // Lent again from where its data reached; the last segment answers it.
        let again = rx.lend_read(&mut s).expect("the rest");
        assert_eq!((again.to, again.left), (568, 60));
        rx.read_back(&mut s, again, 0, true).expect("answered");
        assert_eq!(s.answered, vec![(7, None)]);
        assert!(s.orq.is_empty());
        // Nothing placed: nothing changes.
        s.orq.push_back(pending_read(vec![(LOC, 512, 8)], 8));
        let lent = rx.lend_read(&mut s).expect("a sink of one span");
        rx.read_back(&mut s, lent, 8, false).expect("nothing");
        assert_eq!(rx.lend_read(&mut s), Some(lent));
        // Flushed meanwhile: the stream ends.
        s.orq.clear();
        assert!(rx.read_back(&mut s, lent, 0, true).is_err());
    }

    #[test]
    fn a_read_is_lent_only_where_its_stag_and_to_locate_its_sink() {
        let mut s = sim();
        let rx = Receiver::<SimRecv>::new(Params {
            access: u32::MAX,
            ..Params::default()
        });
        // Two buffers: the second is not where the TO says.
        s.orq
            .push_back(pending_read(vec![(LOC, 512, 8), (LOC, 600, 8)], 16));
        assert_eq!(rx.lend_read(&mut s), None);
        // A sink that may not be written locally.
        s.orq.clear();
        s.orq.push_back(pending_read(vec![(BUF, BUF_IOVA, 8)], 8));
        assert_eq!(rx.lend_read(&mut s), None);
        // A zero-length Read: its one segment is left to the engine.
        s.orq.clear();
        s.orq.push_back(pending_read(vec![(LOC, 512, 0)], 0));
        assert_eq!(rx.lend_read(&mut s), None);
    }

    #[test]
    fn a_stream_is_lent_only_where_a_write_is_placed_as_anywhere() {
        let open = Params {
            access: u32::MAX,
            ..Params::default()
        };
        assert!(Receiver::<SimRecv>::new(open).lend().is_some());
        // The ready-to-receive message has yet to come.
        let rtr = Params {
            rtr: mpa::Rtr::ZeroLengthWrite,
            ..open
        };
        assert!(Receiver::<SimRecv>::new(rtr).lend().is_none());
        // The QP takes no remote Writes.
        let closed = Params {
            access: crate::queue1::access::REMOTE_READ,
            ..open
        };
        assert!(Receiver::<SimRecv>::new(closed).lend().is_none());
        let mut rx = Receiver::<SimRecv>::new(open);
        rx.set_access(0);
        assert!(rx.lend().is_none());
    }

    #[test]
    fn the_fast_path_ends_as_the_general_decode_does() {
        let mut tagged = vec![0u8; 20];
        tagged[2..6].copy_from_slice(&BUF.to_be_bytes());
        tagged[6..14].copy_from_slice(&(BUF_IOVA + 8).to_be_bytes());
        tagged[14..].copy_from_slice(b"abcdef");
        // ULP word 0, QN 0, MSN 1, MO 0.
        let mut untagged = vec![0u8; 24];
        untagged[13] = 1;
        untagged[18..].copy_from_slice(b"ghijkl");
        let mut taken = Vec::new();
        for rest in [&tagged, &untagged] {
            for b0 in 0..=255u8 {
                for b1 in 0..=255u8 {
                    let mut ulpdu = rest.clone();
                    ulpdu[0] = b0;
                    ulpdu[1] = b1;
                    let (fast, took) = run(&ulpdu, true);
                    let (general, _) = run(&ulpdu, false);
                    assert_eq!(fast, general, "{b0:#04x} {b1:#04x}");
                    if took {
                        taken.push((ulpdu.len(), b0, b1, fast.term.is_none()));
                    }
                }
            }
        }
        // The last segment of an RDMA Write (T, L, DV 1; RV 1, opcode 0), placed
        // (or, on the untagged-looking rest, refused for its STag 0), and a whole
        // Send and Send with Solicited Event (L, DV 1; RV 1, opcode 3 or 5), and
        // nothing else.
        assert_eq!(
            taken,
            vec![
                (20, 0xc1, 0x40, true),
                (24, 0x41, 0x43, true),
                (24, 0x41, 0x45, true),
                (24, 0xc1, 0x40, false),
            ]
        );
    }
}
