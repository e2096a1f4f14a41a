//! The receive side of a QP: FPDUs in (any segmentation of the stream), every
//! field checked against the QP's state and the STag table, payload placed
//! through the driver's [`Host`], completions and queue 1 work out (RFC 5040
//! section 5, RFC 5041, RFC 7306, draft-talpey-rdma-commit). Any violation is a
//! [`Fail`] carrying the Terminate for the peer.
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

use crate::fault::{AccessFault, Fail, Status};
use crate::queue1::VERIFY_MAX_HASH;
use crate::queue1::{access, flush_need, queue_of, Inbound, Outstanding, PendingRead, ReadResp};
use crate::send::Span;
use crate::wire::terminate::Cause;
use crate::wire::{self, atomic, commit, ddp, mpa, rdmap};

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

/// What an Immediate Data message completes: the RDMA Write it follows (its
/// length), if any, and whether it asked for a solicited event.
#[derive(Clone, Copy)]
struct ImmOf {
    write: Option<u64>,
    solicited: bool,
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
    /// The FPDU whose payload the driver is reading into memory.
    placing: Option<Placing>,
}

/// A large tagged payload read from the stream straight into memory.
#[derive(Debug)]
struct Placing {
    read_response: bool,
    last: bool,
    /// Payload bytes in all, and still to come.
    len: u32,
    left: u32,
    /// Where they go, the next first.
    spans: std::collections::VecDeque<Span>,
    /// The QP's rights the spans are checked with (remote writes).
    allowed: u32,
    /// Pad and CRC bytes after the payload.
    trailer: usize,
    crc: Option<mpa::Crc>,
    /// The DDP header, for a Terminate.
    dhdr: [u8; ddp::TAGGED_HDR_LEN],
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

    /// Where the next bytes of the stream go while a payload is placed in
    /// place: at most `len` bytes into the memory of this span, which the
    /// driver checks again (rights `need`, and the QP's `allowed`) as it
    /// reads into it, then reports with [`Receiver::direct_placed`].
    pub fn direct(&self) -> Option<(Span, u32)> {
        let p = self.placing.as_ref().filter(|p| p.left > 0)?;
        Some((*p.spans.front()?, p.allowed))
    }

    /// After a payload placed in place, how many bytes the driver should read
    /// into its buffer next: its trailer and the header of the FPDU after it,
    /// so that a large payload there is placed in place too rather than read
    /// into the buffer with its header.
    pub fn read_hint(&self) -> Option<usize> {
        let p = self.placing.as_ref().filter(|p| p.left == 0)?;
        Some(p.trailer + mpa::LEN_FIELD_LEN + ddp::TAGGED_HDR_LEN)
    }

    /// The driver read `data` from the stream into the memory [`Receiver::direct`] named.
    pub fn direct_placed(&mut self, data: &[u8]) {
        let Some(p) = self.placing.as_mut() else {
            return;
        };
        let data = &data[..data.len().min(p.left as usize)];
        if let Some(c) = p.crc.as_mut() {
            c.update(data);
        }
        let mut n = data.len() as u32;
        p.left -= n;
        while n > 0 {
            let Some(s) = p.spans.front_mut() else { break };
            let t = n.min(s.len);
            s.to = s.to.wrapping_add(t as u64);
            s.len -= t;
            n -= t;
            if s.len == 0 {
                p.spans.pop_front();
            }
        }
    }

    /// The memory [`Receiver::direct`] named could not be reached (`e`):
    /// the failure to report; nothing more may be processed.
    pub fn direct_lost(&mut self, e: AccessFault) -> Fail {
        let Some(p) = self.placing.take() else {
            return Fail::stream("no payload was being placed");
        };
        if p.read_response {
            sink_lost()
        } else {
            Fail::placement(e, &p.dhdr, "RDMA Write refused")
        }
    }

    /// The beginning of a large FPDU is in `prefix` (`len` bytes in all): if
    /// it is an RDMA Write or Read Response whose header passes every check,
    /// places what of its payload is there and returns the bytes consumed;
    /// the rest of the payload is read into place by the driver.
    fn start_direct<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        prefix: &[u8],
        len: usize,
    ) -> Result<Option<usize>, Fail> {
        let hdr_end = mpa::LEN_FIELD_LEN + ddp::TAGGED_HDR_LEN;
        let ulpdu_len = usize::from(u16::from_be_bytes([prefix[0], prefix[1]]));
        if ulpdu_len < ddp::TAGGED_HDR_LEN {
            return Ok(None);
        }
        let trailer = len - mpa::LEN_FIELD_LEN - ulpdu_len;
        let payload_len = ulpdu_len - ddp::TAGGED_HDR_LEN;
        if self.inplace_min == 0
            || payload_len < self.inplace_min
            || prefix.len() < hdr_end
            || self.expects_rtr()
            || self.pending_imm.is_some()
        {
            return Ok(None);
        }
        let ulpdu = &prefix[mpa::LEN_FIELD_LEN..];
        let Ok((hdr, hlen)) = ddp::HeaderRepr::parse(ulpdu) else {
            return Ok(None);
        };
        let ddp::Kind::Tagged { stag, to } = hdr.kind else {
            return Ok(None);
        };
        debug_assert_eq!(hlen, ddp::TAGGED_HDR_LEN);
        let c = rdmap::Ctrl::from_byte(hdr.rdmap_ctrl);
        let opcode = rdmap::Opcode::from_u8(c.opcode);
        if c.version != rdmap::RDMAP_VERSION {
            return Ok(None);
        }
        let mut spans = Vec::new();
        let (read_response, allowed) = match opcode {
            Some(rdmap::Opcode::Write) => {
                let need = access::REMOTE_WRITE;
                if !host.in_place(stag)
                    || host
                        .check(stag, to, payload_len as u64, need, self.access)
                        .is_err()
                {
                    return Ok(None);
                }
                spans.push(Span {
                    stag,
                    to,
                    len: payload_len as u32,
                    need,
                });
                (false, self.access)
            }
            Some(rdmap::Opcode::ReadResponse) => {
                let dhdr = &ulpdu[..ddp::TAGGED_HDR_LEN];
                let Ok(pr) = answered_read(host, stag, to, payload_len as u64, hdr.last, dhdr)
                else {
                    return Ok(None);
                };
                match host.locate_local(&pr.sink, pr.received, payload_len, &mut spans) {
                    Ok(true) => {}
                    _ => return Ok(None),
                }
                (true, u32::MAX)
            }
            _ => return Ok(None),
        };
        // Any message but Immediate Data forgets a Write before it.
        self.after_write = None;
        let mut dhdr = [0u8; ddp::TAGGED_HDR_LEN];
        dhdr.copy_from_slice(&ulpdu[..ddp::TAGGED_HDR_LEN]);
        let mut crc = self.crc.then(|| mpa::Crc::using(self.crc32c));
        if let Some(c) = crc.as_mut() {
            c.update(&prefix[..hdr_end]);
        }
        self.placing = Some(Placing {
            read_response,
            last: hdr.last,
            len: payload_len as u32,
            left: payload_len as u32,
            spans: spans.into(),
            allowed,
            trailer,
            crc,
            dhdr,
        });
        // What of the payload came with the header is placed from here.
        let have = &prefix[hdr_end..prefix.len().min(hdr_end + payload_len)];
        let mut rest = have;
        while !rest.is_empty() {
            let (s, allowed) = self.direct().expect("payload left");
            let take = rest.len().min(s.len as usize);
            if let Err(e) = host.place(s.stag, s.to, &rest[..take], s.need, allowed) {
                return Err(self.direct_lost(e));
            }
            self.direct_placed(&rest[..take]);
            rest = &rest[take..];
        }
        Ok(Some(hdr_end + have.len()))
    }

    /// The trailer of a payload placed in place came: checks the CRC and
    /// completes what the payload was for.
    fn finish_direct<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        trailer: &[u8],
    ) -> Result<(), Fail> {
        let p = self.placing.take().expect("placing");
        if let Some(mut c) = p.crc {
            let (pad, got) = trailer.split_at(trailer.len() - mpa::CRC_LEN);
            c.update(pad);
            if c.finish() != got {
                return Err(Fail::terminate(Cause::MPA_CRC, None, None, "MPA CRC error"));
            }
        }
        if p.read_response {
            if !host.read_arrived(p.len as u64, p.last) {
                return Err(Fail::stream("the Read was flushed while its data came"));
            }
        } else {
            self.write_len += p.len as u64;
            if p.last {
                self.after_write = Some(std::mem::take(&mut self.write_len));
            }
        }
        Ok(())
    }

    /// The commonest messages, known by the exact bytes of their headers: a
    /// whole Send (with or without Solicited Event) in one segment, and the
    /// last segment of an RDMA Write, on a stream in its steady state (no
    /// ready-to-receive message awaited, no Immediate Data waiting for its
    /// Send, no Send being received). Each is handled as [`Receiver::segment`]
    /// would handle it, with less decoding; `None` for anything else, which
    /// takes the general path (where every other byte value is judged).
    /// (The failure is boxed, as for [`Receiver::whole_send`].)
    #[inline(always)]
    fn steady<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        ulpdu: &[u8],
    ) -> Option<Result<(), Box<Fail>>> {
        const LAST: u8 = ddp::FLAG_LAST | ddp::DDP_VERSION;
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
                self.after_write = None;
                let (dhdr, payload) = ulpdu.split_at(ddp::UNTAGGED_HDR_LEN);
                let op = if op == SEND {
                    rdmap::Opcode::Send
                } else {
                    rdmap::Opcode::SendSolicited
                };
                Some(self.whole_send(host, op, payload, dhdr))
            }
            [ddp::FLAG_TAGGED | LAST, WRITE, ..] if ulpdu.len() >= ddp::TAGGED_HDR_LEN => {
                let stag = be32(2);
                let to = wire::be::u64_at(ulpdu, 6..14);
                let (dhdr, payload) = ulpdu.split_at(ddp::TAGGED_HDR_LEN);
                if !payload.is_empty() {
                    if let Err(e) = host.place(stag, to, payload, access::REMOTE_WRITE, self.access)
                    {
                        let f = Fail::placement(e, dhdr, "RDMA Write refused");
                        return Some(Err(Box::new(f)));
                    }
                }
                let len = std::mem::take(&mut self.write_len) + payload.len() as u64;
                self.after_write = Some(len);
                Some(Ok(()))
            }
            _ => None,
        }
    }

    /// A whole Send in one segment, with no receive in progress: the host
    /// takes, fills and completes the receive in one step. (The failure is
    /// boxed so that the common outcome is returned in a register.)
    #[inline]
    fn whole_send<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        op: rdmap::Opcode,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Box<Fail>> {
        let done = RecvCompletion {
            byte_len: payload.len() as u32,
            imm: self.pending_imm.take(),
            solicited: std::mem::take(&mut self.pending_se) || op == rdmap::Opcode::SendSolicited,
            ..Default::default()
        };
        match host.recv_whole(payload, done) {
            Ok(()) => {
                self.msn[0] = self.msn[0].wrapping_add(1);
                Ok(())
            }
            Err(w) => Err(self.whole_failed(w, dhdr)),
        }
    }

    /// Why [`Receiver::whole_send`] failed, with the receive it took (if
    /// any) kept for the failure to complete.
    #[cold]
    #[inline(never)]
    fn whole_failed(&mut self, w: Whole<R>, dhdr: &[u8]) -> Box<Fail> {
        Box::new(match w {
            Whole::NoRecv => no_receive(dhdr),
            Whole::TooLong(job) => {
                self.cur = Some(job);
                too_long(dhdr)
            }
            Whole::BadBuffer(job) => {
                self.cur = Some(job);
                bad_receive(dhdr)
            }
        })
    }

    /// One FPDU.
    fn segment<H: Host<Recv = R>>(&mut self, host: &mut H, fpdu: &[u8]) -> Result<(), Fail> {
        let Ok(ulpdu) = mpa::check_fpdu_with(fpdu, self.crc.then_some(self.crc32c)) else {
            return Err(Fail::terminate(Cause::MPA_CRC, None, None, "MPA CRC error"));
        };
        if let Some(r) = self.steady(host, ulpdu) {
            return r.map_err(|f| *f);
        }
        let (hdr, hlen) = match ddp::HeaderRepr::parse(ulpdu) {
            Ok(v) => v,
            Err(wire::Error::BadVersion) => {
                let cause = if ulpdu.first().is_some_and(|b| b & 0x80 != 0) {
                    Cause::DDP_T_INVALID_VERSION
                } else {
                    Cause::DDP_U_INVALID_VERSION
                };
                return Err(Fail::terminate(cause, Some(ulpdu), None, "bad DDP version"));
            }
            Err(_) => {
                return Err(Fail::terminate(
                    Cause::DDP_LOCAL_CATASTROPHIC,
                    None,
                    None,
                    "short DDP segment",
                ))
            }
        };
        let dhdr = &ulpdu[..hlen];
        let payload = &ulpdu[hlen..];
        let c = rdmap::Ctrl::from_byte(hdr.rdmap_ctrl);
        if c.version != rdmap::RDMAP_VERSION {
            return Err(Fail::terminate(
                Cause::RDMAP_OP_INVALID_VERSION,
                Some(dhdr),
                None,
                "bad RDMAP version",
            ));
        }
        let opcode = rdmap::Opcode::from_u8(c.opcode);
        let rtr = std::mem::replace(&mut self.rtr, mpa::Rtr::None);
        if rtr != mpa::Rtr::None {
            // The initiator's first FPDU (RFC 6581 section 6): this side may now
            // transmit, whatever it is. The agreed zero-length Write carries
            // nothing more; anything else is processed as it is.
            host.may_transmit();
            if rtr == mpa::Rtr::ZeroLengthSend {
                // The agreed zero-length Send is the stream's, never the
                // application's: it takes the first MSN of queue 0 and no
                // receive; anything else is not the message agreed.
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
                    return Err(Fail::terminate(
                        Cause::MPA_NO_MATCHING_RTR,
                        None,
                        None,
                        "the first FPDU is not the zero-length Send agreed as ready-to-receive message",
                    ));
                }
                self.msn[ddp::QN_SEND as usize] = 2;
                return Ok(());
            }
            if opcode == Some(rdmap::Opcode::Write) && payload.is_empty() {
                return Ok(());
            }
        }
        if self.pending_imm.is_some() {
            // The Send that an xiw peer's Immediate Data announced must come next.
            let is_send = matches!(
                hdr.kind,
                ddp::Kind::Untagged {
                    qn: ddp::QN_SEND,
                    ..
                }
            ) && matches!(
                opcode,
                Some(rdmap::Opcode::Send | rdmap::Opcode::SendSolicited)
            );
            if !is_send {
                return Err(unexpected(dhdr));
            }
        }
        // Whether the previous message was a whole RDMA Write is for Immediate
        // Data to read (it takes it); any other message forgets it.
        let is_imm = matches!(
            opcode,
            Some(rdmap::Opcode::ImmediateData | rdmap::Opcode::ImmediateDataSolicited)
        );
        let after_write = if is_imm {
            self.after_write.take()
        } else {
            self.after_write = None;
            None
        };
        match (hdr.kind, opcode) {
            (ddp::Kind::Tagged { stag, to }, Some(rdmap::Opcode::Write)) => {
                // A zero-length Write touches no memory, so its STag is not checked.
                if !payload.is_empty() {
                    host.place(stag, to, payload, access::REMOTE_WRITE, self.access)
                        .map_err(|e| Fail::placement(e, dhdr, "RDMA Write refused"))?;
                }
                self.write_len += payload.len() as u64;
                if hdr.last {
                    self.after_write = Some(std::mem::take(&mut self.write_len));
                }
                Ok(())
            }
            (ddp::Kind::Tagged { stag, to }, Some(rdmap::Opcode::ReadResponse)) => {
                read_response(host, stag, to, hdr.last, payload, dhdr)
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
                let top = if self.extensions {
                    ddp::QN_ATOMIC_RESPONSE
                } else {
                    ddp::QN_TERMINATE
                };
                if qn > top {
                    return Err(Fail::terminate(
                        Cause::DDP_U_INVALID_QN,
                        Some(dhdr),
                        None,
                        "invalid queue number",
                    ));
                }
                let q = qn as usize;
                if msn != self.msn[q] {
                    return Err(Fail::terminate(
                        Cause::DDP_U_INVALID_MSN_RANGE,
                        Some(dhdr),
                        None,
                        "MSN out of range",
                    ));
                }
                match (qn, op) {
                    (
                        ddp::QN_SEND,
                        rdmap::Opcode::Send
                        | rdmap::Opcode::SendInvalidate
                        | rdmap::Opcode::SendSolicited
                        | rdmap::Opcode::SendSolicitedInvalidate,
                    ) => self.recv_send(host, op, ulp_word, mo, hdr.last, payload, dhdr),
                    (
                        ddp::QN_SEND,
                        rdmap::Opcode::ImmediateData | rdmap::Opcode::ImmediateDataSolicited,
                    ) if self.extensions => {
                        let of = ImmOf {
                            write: after_write,
                            solicited: op == rdmap::Opcode::ImmediateDataSolicited,
                        };
                        self.immediate(host, of, mo, hdr.last, payload, dhdr)
                    }
                    // Requests on queue 1 and their responses on queue 3 are
                    // single segments; each takes one MSN (RFC 5041 section 5.1).
                    (ddp::QN_READ_REQUEST | ddp::QN_ATOMIC_RESPONSE, _)
                        if hdr.last
                            && mo == 0
                            && (op == rdmap::Opcode::ReadRequest || self.extensions)
                            && queue_of(op) == Some(qn) =>
                    {
                        self.msn[q] = self.msn[q].wrapping_add(1);
                        if qn == ddp::QN_READ_REQUEST {
                            self.queue1_request(host, op, payload, dhdr)
                        } else {
                            response(host, op, payload, dhdr)
                        }
                    }
                    (ddp::QN_TERMINATE, rdmap::Opcode::Terminate) => {
                        let (status, event) = crate::fault::peer_terminate(payload);
                        Err(Fail {
                            sq_status: Some(status),
                            event,
                            ..Fail::stream("peer sent a Terminate")
                        })
                    }
                    _ => Err(unexpected(dhdr)),
                }
            }
            _ => Err(unexpected(dhdr)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn recv_send<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        op: rdmap::Opcode,
        inv_stag: u32,
        mo: u32,
        last: bool,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Fail> {
        if self.cur.is_none() {
            if mo != 0 {
                return Err(Fail::terminate(
                    Cause::DDP_U_INVALID_MO,
                    Some(dhdr),
                    None,
                    "first segment with non-zero MO",
                ));
            }
            if last && matches!(op, rdmap::Opcode::Send | rdmap::Opcode::SendSolicited) {
                return self.whole_send(host, op, payload, dhdr).map_err(|f| *f);
            }
            let Some(job) = host.take_recv() else {
                return Err(no_receive(dhdr));
            };
            self.cur = Some(job);
            self.placed = 0;
        }
        if mo as u64 != self.placed {
            return Err(Fail::terminate(
                Cause::DDP_U_INVALID_MO,
                Some(dhdr),
                None,
                "MO out of order",
            ));
        }
        let job = self.cur.as_ref().expect("receive in progress");
        if self.placed + payload.len() as u64 > host.recv_len(job) {
            return Err(too_long(dhdr));
        }
        if host.scatter_recv(job, self.placed, payload).is_err() {
            return Err(bad_receive(dhdr));
        }
        self.placed += payload.len() as u64;
        if !last {
            return Ok(());
        }
        let mut done = RecvCompletion {
            byte_len: self.placed as u32,
            imm: self.pending_imm.take(),
            solicited: std::mem::take(&mut self.pending_se)
                || matches!(
                    op,
                    rdmap::Opcode::SendSolicited | rdmap::Opcode::SendSolicitedInvalidate
                ),
            ..Default::default()
        };
        if matches!(
            op,
            rdmap::Opcode::SendInvalidate | rdmap::Opcode::SendSolicitedInvalidate
        ) {
            if host.invalidate(inv_stag).is_err() {
                return Err(Fail {
                    rq_status: Some(Status::RemoteAccess),
                    ..Fail::terminate(
                        Cause::RDMAP_PROT_STAG_CANNOT_INVALIDATE,
                        Some(dhdr),
                        None,
                        "Send with Invalidate of an STag that cannot be invalidated",
                    )
                });
            }
            done.imm = None;
            done.invalidated = Some(inv_stag);
        }
        let job = self.cur.take().expect("receive in progress");
        self.msn[0] = self.msn[0].wrapping_add(1);
        host.recv_done(job, done);
        Ok(())
    }

    /// Immediate Data (RFC 7306 section 6): completes a receive of its own, or,
    /// from an xiw peer and not after an RDMA Write, rides with the Send that follows.
    fn immediate<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        of: ImmOf,
        mo: u32,
        last: bool,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Fail> {
        // Exactly 8 bytes in one segment (section 6.3).
        if !last || mo != 0 || payload.len() != atomic::IMMEDIATE_LEN {
            return Err(Fail::operation_failed(
                dhdr,
                "Immediate Data not exactly 8 bytes",
            ));
        }
        self.msn[0] = self.msn[0].wrapping_add(1);
        let imm = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
        if of.write.is_none() && self.merge_imm {
            self.pending_imm = Some(imm);
            self.pending_se = of.solicited;
            return Ok(());
        }
        let Some(job) = host.take_recv() else {
            return Err(Fail::terminate(
                Cause::DDP_U_INVALID_MSN_NO_BUFFER,
                Some(dhdr),
                None,
                "Immediate Data with no receive posted",
            ));
        };
        host.recv_done(
            job,
            RecvCompletion {
                byte_len: of.write.unwrap_or(0) as u32,
                imm: Some(imm),
                invalidated: None,
                after_write: true,
                solicited: of.solicited,
            },
        );
        Ok(())
    }

    /// A queue 1 request (Read, Atomic, Flush, Verify, Atomic Write): checked now,
    /// against the STag table and the rules of RFC 5040 section 7, RFC 7306
    /// section 8.2 and the commit draft's section 5.2, then queued behind the
    /// earlier ones.
    fn queue1_request<H: Host>(
        &mut self,
        host: &mut H,
        op: rdmap::Opcode,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Fail> {
        let mut d = [0u8; ddp::UNTAGGED_HDR_LEN];
        d.copy_from_slice(&dhdr[..ddp::UNTAGGED_HDR_LEN]);
        let qp_access = self.access;
        // Flush and Verify rights live on the MR only; the QP's flags gate the rest.
        let allowed = qp_access | access::MR_ONLY;
        let short = |what| Fail::terminate(Cause::DDP_LOCAL_CATASTROPHIC, Some(dhdr), None, what);
        // A request of a fixed size carries nothing behind its fields.
        let sized = |len: usize, what| {
            (payload.len() == len)
                .then_some(())
                .ok_or_else(|| short(what))
        };
        let entry = match op {
            rdmap::Opcode::ReadRequest => {
                sized(rdmap::READ_REQUEST_LEN, "Read Request of another length")?;
                let pkt = rdmap::ReadRequestPacket::new_checked(payload)
                    .map_err(|_| short("short Read Request"))?;
                let req = rdmap::ReadRequestRepr::parse(&pkt).map_err(|_| unexpected(dhdr))?;
                let rhdr = &payload[..rdmap::READ_REQUEST_LEN];
                // A zero-length Read touches no memory, so its source is not checked.
                if req.size > 0 {
                    host.check(
                        req.src_stag,
                        req.src_to,
                        req.size as u64,
                        access::REMOTE_READ,
                        qp_access,
                    )
                    .map_err(|e| Fail::protection(e, dhdr, Some(rhdr), "RDMA Read refused"))?;
                }
                Inbound::Read(ReadResp {
                    sink_stag: req.sink_stag,
                    sink_to: req.sink_to,
                    src_stag: req.src_stag,
                    src_to: req.src_to,
                    len: req.size,
                })
            }
            rdmap::Opcode::AtomicRequest => {
                sized(atomic::REQUEST_LEN, "Atomic Request of another length")?;
                let pkt = atomic::RequestPacket::new_checked(payload)
                    .map_err(|_| short("short Atomic Request"))?;
                let req = atomic::AtomicRequestRepr::parse(&pkt)
                    .map_err(|_| short("bad Atomic Request"))?;
                if req.op().is_none() {
                    // An AOpCode xiw does not implement (section 5.2.1 rule 4).
                    return Err(Fail::terminate(
                        Cause::RDMAP_OP_UNEXPECTED_OPCODE,
                        Some(dhdr),
                        None,
                        "unsupported atomic operation code",
                    ));
                }
                let ok = host
                    .aligned8(req.stag, req.to, access::REMOTE_ATOMIC, qp_access)
                    .map_err(|e| Fail::protection(e, dhdr, None, "Atomic refused"))?;
                if !ok {
                    return Err(Fail::operation_failed(
                        dhdr,
                        "atomic target not 64-bit aligned",
                    ));
                }
                Inbound::Atomic {
                    req,
                    allowed: qp_access,
                    dhdr: d,
                }
            }
            rdmap::Opcode::FlushRequest => {
                sized(commit::FLUSH_REQUEST_LEN, "Flush Request of another length")?;
                let pkt = commit::FlushRequestPacket::new_checked(payload)
                    .map_err(|_| short("short Flush Request"))?;
                let req = commit::FlushRequestRepr::parse(&pkt)
                    .map_err(|_| short("bad Flush Request"))?;
                let flags = req.flags & commit::FLUSH_KNOWN_FLAGS;
                if req.length > 0 {
                    host.check(
                        req.stag,
                        req.to,
                        req.length as u64,
                        flush_need(flags),
                        allowed,
                    )
                    .map_err(|e| Fail::protection(e, dhdr, None, "RDMA Flush refused"))?;
                }
                Inbound::Flush {
                    stag: req.stag,
                    to: req.to,
                    len: req.length,
                    flags,
                    allowed,
                    dhdr: d,
                }
            }
            rdmap::Opcode::VerifyRequest => {
                let pkt = commit::VerifyRequestPacket::new_checked(payload)
                    .map_err(|_| short("short Verify Request"))?;
                let req = commit::VerifyRequestRepr::parse(&pkt)
                    .map_err(|_| short("bad Verify Request"))?;
                host.check(req.stag, req.to, req.length as u64, access::VERIFY, allowed)
                    .map_err(|e| Fail::protection(e, dhdr, None, "RDMA Verify refused"))?;
                if req.hash.len() > VERIFY_MAX_HASH {
                    return Err(Fail::operation_failed(
                        dhdr,
                        "Verify hash longer than any xiw computes",
                    ));
                }
                let mut expected = [0u8; VERIFY_MAX_HASH];
                expected[..req.hash.len()].copy_from_slice(req.hash);
                Inbound::Verify {
                    stag: req.stag,
                    to: req.to,
                    len: req.length,
                    expected,
                    expected_len: req.hash.len() as u8,
                    allowed,
                    dhdr: d,
                }
            }
            _ => {
                sized(
                    commit::ATOMIC_WRITE_REQUEST_LEN,
                    "Atomic Write Request of another length",
                )?;
                let pkt = commit::AtomicWriteRequestPacket::new_checked(payload)
                    .map_err(|_| short("short Atomic Write Request"))?;
                let req = commit::AtomicWriteRequestRepr::parse(&pkt)
                    .map_err(|_| short("bad Atomic Write Request"))?;
                // 64 bits at 64-bit alignment, or nothing at all (section 3.1.3.1).
                if req.length != commit::ATOMIC_WRITE_DATA_LEN {
                    return Err(Fail::operation_failed(dhdr, "Atomic Write length is not 8"));
                }
                let ok = host
                    .aligned8(req.stag, req.to, access::REMOTE_WRITE, qp_access)
                    .map_err(|e| Fail::protection(e, dhdr, None, "Atomic Write refused"))?;
                if !ok {
                    return Err(Fail::operation_failed(
                        dhdr,
                        "Atomic Write target not 64-bit aligned",
                    ));
                }
                Inbound::AtomicWrite {
                    stag: req.stag,
                    to: req.to,
                    value: u64::from_be_bytes(req.data),
                    allowed: qp_access,
                    dhdr: d,
                }
            }
        };
        // A peer that exceeds the IRD it was given has no untagged buffer for
        // the request (RFC 6581).
        if !host.queue_request(entry) {
            return Err(Fail::terminate(
                Cause::DDP_U_INVALID_MSN_NO_BUFFER,
                Some(dhdr),
                None,
                "more outstanding queue 1 requests than IRD",
            ));
        }
        Ok(())
    }
}

/// The Read that `n` bytes of a Read Response (to `stag` at `to`, the last
/// of it with `last`) answer: the oldest outstanding request, which must be
/// a Read whose sink they fit exactly where its data has reached. Only the
/// receive path advances `received`, so the copy is current.
fn answered_read<H: Host>(
    host: &mut H,
    stag: u32,
    to: u64,
    n: u64,
    last: bool,
    dhdr: &[u8],
) -> Result<PendingRead<H::Local>, Fail> {
    let Some(Outstanding::Read(pr)) = host.oldest_outstanding() else {
        return Err(unexpected(dhdr));
    };
    if stag != pr.sink_stag {
        return Err(Fail::terminate(
            Cause::DDP_T_INVALID_STAG,
            Some(dhdr),
            None,
            "Read Response to an unknown sink STag",
        ));
    }
    let received = pr.received + n;
    if to != pr.sink_to.wrapping_add(pr.received)
        || received > pr.length
        || (last && received != pr.length)
    {
        return Err(Fail::terminate(
            Cause::DDP_T_BASE_BOUNDS,
            Some(dhdr),
            None,
            "Read Response outside the sink buffer",
        ));
    }
    Ok(pr)
}

/// Data of an RDMA Read Response, for the oldest outstanding request.
fn read_response<H: Host>(
    host: &mut H,
    stag: u32,
    to: u64,
    last: bool,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    let pr = answered_read(host, stag, to, payload.len() as u64, last, dhdr)?;
    if host.scatter(&pr.sink, pr.received, payload).is_err() {
        return Err(sink_lost());
    }
    if !host.read_arrived(payload.len() as u64, last) {
        return Err(Fail::stream("the Read was flushed while its data came"));
    }
    Ok(())
}

/// An Atomic, Flush, Verify or Atomic Write Response: answers the oldest
/// outstanding request, which must be of the same kind (RFC 7306 section 5.4
/// rule 8: responses come back in request order).
fn response<H: Host>(
    host: &mut H,
    op: rdmap::Opcode,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    let short = |what| Fail::terminate(Cause::DDP_LOCAL_CATASTROPHIC, Some(dhdr), None, what);
    let len = match (op, host.oldest_outstanding()) {
        (
            rdmap::Opcode::AtomicResponse,
            Some(Outstanding::Atomic {
                request_id, result, ..
            }),
        ) => {
            if payload.len() != atomic::RESPONSE_LEN {
                return Err(short("Atomic Response of another length"));
            }
            let pkt = atomic::ResponsePacket::new_checked(payload)
                .map_err(|_| short("short Atomic Response"))?;
            let resp = atomic::AtomicResponseRepr::parse(&pkt)
                .map_err(|_| short("bad Atomic Response"))?;
            if resp.request_id != request_id {
                return Err(unexpected(dhdr));
            }
            if host
                .scatter(&result, 0, &resp.original_value.to_ne_bytes())
                .is_err()
            {
                return Err(Fail::local(
                    Status::LocalProtection,
                    "atomic result buffer with a bad lkey",
                ));
            }
            None
        }
        (rdmap::Opcode::FlushResponse, Some(Outstanding::Flush { .. }))
        | (rdmap::Opcode::AtomicWriteResponse, Some(Outstanding::AtomicWrite { .. })) => {
            // These answers carry no payload.
            if !payload.is_empty() {
                return Err(short("a response without payload carries some"));
            }
            None
        }
        (rdmap::Opcode::VerifyResponse, Some(Outstanding::Verify { result, .. })) => {
            if host.local_len(&result) < payload.len() as u64 {
                return Err(Fail::local(
                    Status::LocalLength,
                    "verify result buffer shorter than the hash",
                ));
            }
            if host.scatter(&result, 0, payload).is_err() {
                return Err(Fail::local(
                    Status::LocalProtection,
                    "verify result buffer with a bad lkey",
                ));
            }
            Some(payload.len() as u32)
        }
        _ => return Err(unexpected(dhdr)),
    };
    host.answered(len);
    Ok(())
}

/// The local buffer a Read's data lands in cannot be written.
fn sink_lost() -> Fail {
    Fail::local(Status::LocalProtection, "read sink with a bad lkey")
}

/// A Send found no receive posted.
#[cold]
fn no_receive(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_U_INVALID_MSN_NO_BUFFER,
        Some(dhdr),
        None,
        "Send with no receive posted",
    )
}

/// A Send is longer than its receive.
#[cold]
fn too_long(dhdr: &[u8]) -> Fail {
    Fail {
        rq_status: Some(Status::LocalLength),
        ..Fail::terminate(
            Cause::DDP_U_MSG_TOO_LONG,
            Some(dhdr),
            None,
            "Send longer than the receive buffer",
        )
    }
}

/// A Send's receive names memory it may not write.
#[cold]
fn bad_receive(dhdr: &[u8]) -> Fail {
    Fail {
        rq_status: Some(Status::LocalProtection),
        ..Fail::terminate(
            Cause::RDMAP_OP_CATASTROPHIC_STREAM,
            Some(dhdr),
            None,
            "receive buffer with a bad lkey",
        )
    }
}

fn unexpected(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::RDMAP_OP_UNEXPECTED_OPCODE,
        Some(dhdr),
        None,
        "unexpected opcode",
    )
}
