//! Transmit: frames work requests, read responses and Terminates into FPDUs
//! (RFC 5044 section 4, RFC 5041, RFC 5040) and writes them to the stream.
//!
//! Whoever posts work transmits it on its own thread when it can take the `tx`
//! lock; when the socket is full the progress thread finishes the job on EPOLLOUT.

use std::collections::VecDeque;
use std::mem::size_of;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use xiw_abi::ring::{op, wqe_flag, SendWqe, Sge};
use xiw_abi::verbs::*;

use crate::mem::{self, NEED_NONE};
use crate::qp::Qp;
use crate::rx::{Fail, Status};
use crate::wire::{atomic, commit, ddp, mpa, rdmap};
use xiw_engine::queue1::PendingRead;

/// Bytes framed per round before they are written.
const BATCH: usize = 256 * 1024;
/// A staging buffer up to this size is kept when its QP goes idle.
const TRIM_KEEP: usize = 16 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    /// Framed; completes once the stream has taken its last byte.
    Sent,
    /// Waiting for a response (RDMA Read, Atomic, Flush, Verify, Atomic Write).
    AwaitResponse,
    Done(u32),
    /// Done, with a byte count other than the WQE's own (the hash of a Verify).
    DoneLen(u32, u32),
}

pub use xiw_engine::queue1::{flush_need, Inbound, ReadResp, VERIFY_MAX_HASH};

/// A queue 1 request this side issued, with the SGEs its response lands in.
pub type Outstanding = xiw_engine::queue1::Outstanding<Arc<[Sge]>>;

enum Job {
    Sq {
        idx: u32,
        wqe: SendWqe,
        body: Body,
    },
    Inbound(Inbound),
    /// The response to a request carried out by the media worker.
    Respond(rdmap::Opcode, Vec<u8>),
}

/// A Flush to persistence or a Verify waits on the disk: the context's media
/// worker carries it out, so neither the progress thread nor an application
/// thread polling its CQ blocks on I/O. Later queue 1 requests wait their turn;
/// this side's own work goes on.
enum Media {
    Idle,
    Busy(u64),
    Done(Result<(rdmap::Opcode, Vec<u8>), Fail>),
}

/// Whether carrying out `req` touches the medium.
fn needs_media(req: &Inbound) -> bool {
    match req {
        Inbound::Flush { flags, len, .. } => *len > 0 && flags & commit::FLUSH_PERSISTENCE != 0,
        Inbound::Verify { .. } => true,
        _ => false,
    }
}

enum Body {
    Sges(Vec<Sge>),
    Inline(Vec<u8>),
}

struct Cur {
    job: Job,
    sent: u64,
}

pub struct Tx {
    /// Stream descriptor once the connection is established.
    pub fd: Option<i32>,
    pub crc: bool,
    /// Largest DDP payload in one FPDU.
    pub mulpdu: usize,
    /// Responder side: nothing may be sent before the peer's first FPDU (RFC 6581).
    pub gate: bool,
    buf: Vec<u8>,
    off: usize,
    /// Stream positions: bytes framed, bytes taken by the socket.
    framed: u64,
    written: u64,
    /// Next SQ index to frame.
    pub next: u32,
    slots: Vec<Option<Slot>>,
    done_at: VecDeque<(u32, u64)>,
    cur: Option<Cur>,
    /// Next MSN for each outbound untagged queue (QN 0 to 3); the first is 1 (RFC 5041 5.1).
    msn: [u32; 4],
    pub ord_max: u32,
    /// Requests sent on queue 1 and not yet answered, oldest first (at most ORD).
    pub orq: VecDeque<Outstanding>,
    /// Requests received on queue 1 and not yet answered (at most IRD).
    pub irq: VecDeque<Inbound>,
    /// Request Identifier of the next Atomic Request (RFC 7306 section 5.2.1).
    next_request_id: u32,
    media: Media,
    pub ird_max: u32,
    /// A Terminate body to send ahead of everything else.
    pub term: Option<Vec<u8>>,
    /// Control FPDU (ready-to-receive) to send first.
    pub rtr: bool,
    want_out: bool,
    /// Bytes went out since the last trim pass.
    active: bool,
    /// The peer's IRD from the MPA exchange; ORD never exceeds it (RFC 6581 section 7).
    pub peer_ird: u32,
}

impl Tx {
    pub fn new(entries: u32) -> Tx {
        Tx {
            fd: None,
            crc: false,
            mulpdu: 16384,
            gate: false,
            buf: Vec::new(),
            off: 0,
            framed: 0,
            written: 0,
            next: 0,
            slots: vec![None; entries as usize],
            done_at: VecDeque::new(),
            cur: None,
            msn: [1; 4],
            ord_max: 1,
            orq: VecDeque::new(),
            irq: VecDeque::new(),
            next_request_id: 1,
            media: Media::Idle,
            ird_max: 1,
            term: None,
            rtr: false,
            want_out: false,
            active: false,
            peer_ird: 1,
        }
    }

    /// Frees the staging buffer of a QP that sent nothing since the last pass;
    /// true while it still holds a large one.
    pub fn trim(&mut self) -> bool {
        let idle = !std::mem::replace(&mut self.active, false);
        if idle && self.off == self.buf.len() && self.buf.capacity() > TRIM_KEEP {
            self.buf = Vec::new();
            self.off = 0;
        }
        self.buf.capacity() > TRIM_KEEP
    }

    /// Bytes framed but not yet taken by the socket.
    pub fn pending(&self) -> bool {
        self.off < self.buf.len()
    }

    fn slot(&mut self, idx: u32) -> &mut Option<Slot> {
        let mask = self.slots.len() - 1;
        &mut self.slots[idx as usize & mask]
    }

    /// Frames and writes whatever can go now.
    pub fn run(&mut self, qp: &Qp) -> Result<(), Fail> {
        let Some(fd) = self.fd else { return Ok(()) };
        loop {
            if self.off < self.buf.len() {
                // SAFETY: the slice is initialised bytes of `buf`; `fd` is the QP's stream,
                // kept open until the QP is dropped.
                let n = unsafe {
                    libc::send(
                        fd,
                        self.buf.as_ptr().add(self.off) as *const libc::c_void,
                        self.buf.len() - self.off,
                        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                    )
                };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EAGAIN) => {
                            self.arm_out(qp, fd, true);
                            self.complete_written(qp);
                            return Ok(());
                        }
                        Some(libc::EINTR) => continue,
                        _ => return Err(Fail::stream(format!("send: {e}"))),
                    }
                }
                self.off += n as usize;
                self.written += n as u64;
                self.active = true;
                if self.off == self.buf.len() {
                    self.buf.clear();
                    self.off = 0;
                }
                continue;
            }
            self.complete_written(qp);
            if !self.frame_more(qp)? {
                break;
            }
        }
        self.arm_out(qp, fd, false);
        Ok(())
    }

    fn arm_out(&mut self, qp: &Qp, fd: i32, on: bool) {
        if self.want_out != on {
            self.want_out = on;
            qp.tx_blocked.store(on, Ordering::Release);
            qp.sh
                .watch_data(fd, qp.qpn, !qp.rx_eof.load(Ordering::Acquire), on);
        }
    }

    fn complete_written(&mut self, qp: &Qp) {
        while let Some(&(idx, pos)) = self.done_at.front() {
            if pos > self.written {
                break;
            }
            self.done_at.pop_front();
            if let Some(s @ Slot::Sent) = self.slot(idx) {
                *s = Slot::Done(IBV_WC_SUCCESS);
            }
        }
        self.complete_ready(qp);
    }

    /// Reports finished SQ WQEs, strictly in order (RFC 5040 section 5.5). The slots
    /// are released before the completions become visible, so an application that
    /// sees a completion can always post again.
    pub fn complete_ready(&mut self, qp: &Qp) {
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
    pub fn media_done(&mut self, ticket: u64, r: Result<(rdmap::Opcode, Vec<u8>), Fail>) -> bool {
        if !matches!(self.media, Media::Busy(t) if t == ticket) {
            return false;
        }
        self.media = Media::Done(r);
        true
    }

    /// Marks the oldest outstanding queue 1 request as answered.
    pub fn read_done(&mut self, qp: &Qp, idx: u32, status: u32) {
        *self.slot(idx) = Some(Slot::Done(status));
        self.complete_ready(qp);
    }

    /// As [`Tx::read_done`], with the byte count to report.
    pub fn response_done(&mut self, qp: &Qp, idx: u32, len: u32) {
        *self.slot(idx) = Some(Slot::DoneLen(IBV_WC_SUCCESS, len));
        self.complete_ready(qp);
    }

    /// Completes every outstanding SQ WQE in error; the QP is in the error state.
    pub fn flush(&mut self, qp: &Qp) {
        self.fd = None;
        self.buf.clear();
        self.off = 0;
        self.cur = None;
        self.done_at.clear();
        self.orq.clear();
        self.irq.clear();
        self.media = Media::Idle;
        self.term = None;
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

    /// Frames FPDUs until `BATCH` bytes are waiting; false if there was nothing to frame.
    fn frame_more(&mut self, qp: &Qp) -> Result<bool, Fail> {
        let before = self.buf.len();
        while self.buf.len() < BATCH {
            if self.rtr {
                // Ready-to-receive: a zero-length RDMA Write (RFC 6581 section 6).
                self.rtr = false;
                let hdr = ddp::HeaderRepr {
                    last: true,
                    version: ddp::DDP_VERSION,
                    rdmap_ctrl: ctrl(rdmap::Opcode::Write),
                    kind: ddp::Kind::Tagged { stag: 0, to: 0 },
                };
                self.push_fpdu(&hdr, &[], |_| Ok(()), 0)?;
                continue;
            }
            if let Some(body) = self.term.take() {
                let msn = self.take_msn(ddp::QN_TERMINATE);
                let hdr = untagged(rdmap::Opcode::Terminate, 0, ddp::QN_TERMINATE, msn, 0, true);
                self.push_fpdu(&hdr, &body, |_| Ok(()), 0)?;
                // Nothing follows a Terminate (RFC 5040 section 7.1).
                self.gate = true;
                continue;
            }
            if self.gate {
                break;
            }
            if self.cur.is_none() {
                self.cur = self.next_job(qp)?;
            }
            let Some(mut cur) = self.cur.take() else {
                break;
            };
            let finished = self.frame_job(qp, &mut cur)?;
            if !finished {
                self.cur = Some(cur);
            }
        }
        Ok(self.buf.len() > before)
    }

    fn next_job(&mut self, qp: &Qp) -> Result<Option<Cur>, Fail> {
        match std::mem::replace(&mut self.media, Media::Idle) {
            Media::Done(Ok((op, body))) => {
                return Ok(Some(Cur {
                    job: Job::Respond(op, body),
                    sent: 0,
                }))
            }
            Media::Done(Err(f)) => return Err(f),
            Media::Busy(t) => self.media = Media::Busy(t),
            Media::Idle => {
                if let Some(r) = self.irq.pop_front() {
                    if !needs_media(&r) {
                        return Ok(Some(Cur {
                            job: Job::Inbound(r),
                            sent: 0,
                        }));
                    }
                    // Unique in the context: a job of a destroyed or reset QP
                    // can never answer for this one.
                    let ticket = qp.sh.media_ticket();
                    self.media = Media::Busy(ticket);
                    crate::context::submit_media(&qp.sh, qp.qpn, ticket, r);
                }
            }
        }
        // iWARP has no receive-only state: once the stream is up (reached at RTR),
        // the send queue runs, as with iWARP RNICs whose CM moves the QP to RTS.
        if !matches!(qp.state(), IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_SQD) {
            return Ok(None);
        }
        if self.next == qp.sq.producer() {
            return Ok(None);
        }
        let idx = self.next;
        // SAFETY: slot `idx` is in [consumer, producer): published by post_send and not released.
        let wqe: SendWqe = unsafe { qp.sq.read(idx, 0) };
        if wqe.flags & wqe_flag::FENCE != 0 && !self.orq.is_empty() {
            return Ok(None);
        }
        if queue1_request(wqe.opcode) && self.orq.len() as u32 >= self.ord_max {
            return Ok(None);
        }
        let body = if wqe.flags & wqe_flag::INLINE != 0 {
            let mut v = vec![0u8; wqe.length as usize];
            // SAFETY: the inline bytes were copied into this slot at post time and
            // `length` was bounded by max_inline, which sized the stride.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    qp.sq.slot(idx).add(size_of::<SendWqe>()),
                    v.as_mut_ptr(),
                    v.len(),
                )
            };
            Body::Inline(v)
        } else {
            let n = (wqe.num_sge as usize).min(crate::qp::MAX_SGE as usize);
            // SAFETY: as above; `num_sge` was bounded by max_send_sge at post time.
            Body::Sges(
                (0..n)
                    .map(|k| unsafe { qp.sq.read::<Sge>(idx, size_of::<SendWqe>() + k * 16) })
                    .collect(),
            )
        };
        self.next = idx.wrapping_add(1);
        *self.slot(idx) = Some(Slot::Sent);
        if let Body::Sges(sges) = &body {
            // Local protection is checked before the first byte goes out.
            for s in sges.iter().filter(|s| s.length > 0) {
                // A Read's data, an atomic's original and a hash land in the SGEs.
                let need = if queue1_request(wqe.opcode)
                    && !matches!(wqe.opcode, op::FLUSH | op::ATOMIC_WRITE)
                {
                    IBV_ACCESS_LOCAL_WRITE
                } else {
                    NEED_NONE
                };
                if qp
                    .sh
                    .mrs
                    .with_mem(s.lkey, qp.pd, s.addr, s.length as usize, need, |_| ())
                    .is_err()
                {
                    return Err(Fail::local(
                        Status::LocalProtection,
                        "send WQE with a bad lkey",
                    ));
                }
            }
        }
        Ok(Some(Cur {
            job: Job::Sq { idx, wqe, body },
            sent: 0,
        }))
    }

    /// Frames as much of `cur` as the batch allows; true once its last FPDU is framed.
    fn frame_job(&mut self, qp: &Qp, cur: &mut Cur) -> Result<bool, Fail> {
        match &cur.job {
            Job::Inbound(Inbound::Read(r)) => {
                let r = *r;
                loop {
                    let n = (r.len as u64 - cur.sent).min(self.mulpdu as u64) as usize;
                    let last = cur.sent + n as u64 == r.len as u64;
                    let hdr = ddp::HeaderRepr {
                        last,
                        version: ddp::DDP_VERSION,
                        rdmap_ctrl: ctrl(rdmap::Opcode::ReadResponse),
                        kind: ddp::Kind::Tagged {
                            stag: r.sink_stag,
                            to: r.sink_to.wrapping_add(cur.sent),
                        },
                    };
                    let (pd, stag, to) = (qp.pd, r.src_stag, r.src_to + cur.sent);
                    self.push_fpdu(
                        &hdr,
                        &[],
                        |buf| {
                            qp.sh
                                .mrs
                                .read(stag, pd, to, n, IBV_ACCESS_REMOTE_READ, buf)
                                .map_err(|_| {
                                    Fail::local(
                                        Status::Flushed,
                                        "read source deregistered while answering",
                                    )
                                })
                        },
                        n,
                    )?;
                    cur.sent += n as u64;
                    if last {
                        return Ok(true);
                    }
                    if self.buf.len() >= BATCH {
                        return Ok(false);
                    }
                }
            }
            Job::Inbound(req) => {
                let (op, body) = execute(qp, req)?;
                self.respond(op, &body)?;
                Ok(true)
            }
            Job::Respond(op, body) => {
                self.respond(*op, body)?;
                Ok(true)
            }
            Job::Sq { idx, wqe, .. } => {
                let (idx, wqe) = (*idx, *wqe);
                match wqe.opcode {
                    op::SEND | op::SEND_INV | op::SEND_IMM | op::WRITE | op::WRITE_IMM => {
                        self.frame_data(qp, cur, idx, &wqe)
                    }
                    op if queue1_request(op) => {
                        let Job::Sq {
                            body: Body::Sges(sges),
                            ..
                        } = &cur.job
                        else {
                            return Err(Fail::local(
                                Status::LocalQpOperation,
                                "inline queue 1 request",
                            ));
                        };
                        let sges = sges.clone();
                        self.frame_request(idx, &wqe, sges)?;
                        Ok(true)
                    }
                    op::LOCAL_INV => {
                        let st = match qp.sh.mrs.invalidate(wqe.imm_or_inv, qp.pd) {
                            Ok(()) => IBV_WC_SUCCESS,
                            Err(_) => IBV_WC_MW_BIND_ERR,
                        };
                        *self.slot(idx) = Some(Slot::Sent);
                        self.done_at.push_back((idx, self.framed));
                        if st != IBV_WC_SUCCESS {
                            *self.slot(idx) = Some(Slot::Done(st));
                        }
                        Ok(true)
                    }
                    _ => Err(Fail::local(
                        Status::LocalQpOperation,
                        "unsupported opcode on the send queue",
                    )),
                }
            }
        }
    }

    /// Send family and RDMA Write: segments of at most `mulpdu` payload bytes.
    fn frame_data(
        &mut self,
        qp: &Qp,
        cur: &mut Cur,
        idx: u32,
        wqe: &SendWqe,
    ) -> Result<bool, Fail> {
        let total = wqe.length as u64;
        let solicited = wqe.flags & wqe_flag::SOLICITED != 0;
        let send_op = match (wqe.opcode, solicited) {
            (op::SEND_INV, false) => rdmap::Opcode::SendInvalidate,
            (op::SEND_INV, true) => rdmap::Opcode::SendSolicitedInvalidate,
            (_, false) => rdmap::Opcode::Send,
            (_, true) => rdmap::Opcode::SendSolicited,
        };
        let is_send = !matches!(wqe.opcode, op::WRITE | op::WRITE_IMM);
        if wqe.opcode == op::SEND_IMM && cur.sent == 0 {
            // Send with Immediate: Immediate Data, then the Send it belongs to, in
            // one run of the stream (xiw's receiver gives both one receive; a plain
            // RFC 7306 receiver completes them as two messages, in order).
            self.push_immediate(wqe.imm_or_inv, false)?;
        }
        let msn = if is_send && cur.sent == 0 {
            self.take_msn(ddp::QN_SEND)
        } else {
            self.msn[0].wrapping_sub(1)
        };
        loop {
            let n = (total - cur.sent).min(self.mulpdu as u64) as usize;
            let last = cur.sent + n as u64 == total;
            let hdr = if is_send {
                let inv = if wqe.opcode == op::SEND_INV {
                    wqe.imm_or_inv
                } else {
                    0
                };
                untagged(send_op, inv, ddp::QN_SEND, msn, cur.sent as u32, last)
            } else {
                ddp::HeaderRepr {
                    last,
                    version: ddp::DDP_VERSION,
                    rdmap_ctrl: ctrl(rdmap::Opcode::Write),
                    kind: ddp::Kind::Tagged {
                        stag: wqe.rkey,
                        to: wqe.remote_addr.wrapping_add(cur.sent),
                    },
                }
            };
            let off = cur.sent;
            let Job::Sq { body, .. } = &cur.job else {
                unreachable!()
            };
            self.push_fpdu(&hdr, &[], |buf| gather(qp, body, off, n, buf), n)?;
            cur.sent += n as u64;
            if last {
                if wqe.opcode == op::WRITE_IMM {
                    // RDMA Write with Immediate: the Write, then Immediate Data (RFC 7306 section 6).
                    self.push_immediate(wqe.imm_or_inv, solicited)?;
                }
                self.done_at.push_back((idx, self.framed));
                return Ok(true);
            }
            if self.buf.len() >= BATCH {
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
        self.push_fpdu(&hdr, &body, |_| Ok(()), 0)
    }

    /// A Read, Atomic, Flush, Verify or Atomic Write Request on queue 1.
    fn frame_request(&mut self, idx: u32, wqe: &SendWqe, sges: Vec<Sge>) -> Result<(), Fail> {
        let (opcode, body, pending): (_, Vec<u8>, _) = match wqe.opcode {
            op::READ => {
                let (sink_stag, sink_to) = sges.first().map(|s| (s.lkey, s.addr)).unwrap_or((0, 0));
                let req = rdmap::ReadRequestRepr {
                    sink_stag,
                    sink_to,
                    size: wqe.length,
                    src_stag: wqe.rkey,
                    src_to: wqe.remote_addr,
                };
                let mut b = vec![0u8; rdmap::READ_REQUEST_LEN];
                req.emit(&mut rdmap::ReadRequestPacket::new_unchecked(&mut b[..]));
                let pending = Outstanding::Read(PendingRead {
                    sq_idx: idx,
                    sink_stag,
                    sink_to,
                    sink: sges.into(),
                    length: wqe.length as u64,
                    received: 0,
                });
                (rdmap::Opcode::ReadRequest, b, pending)
            }
            op::FLUSH => {
                let req = commit::FlushRequestRepr {
                    stag: wqe.rkey,
                    length: wqe.imm_or_inv,
                    to: wqe.remote_addr,
                    flags: wqe.op_flags as u32 & commit::FLUSH_KNOWN_FLAGS,
                };
                let mut b = vec![0u8; req.buffer_len()];
                req.emit(&mut commit::FlushRequestPacket::new_unchecked(&mut b[..]));
                (
                    rdmap::Opcode::FlushRequest,
                    b,
                    Outstanding::Flush { sq_idx: idx },
                )
            }
            op::VERIFY => {
                let expected = verify_expected(wqe);
                let req = commit::VerifyRequestRepr {
                    stag: wqe.rkey,
                    length: wqe.imm_or_inv,
                    to: wqe.remote_addr,
                    hash: &expected.0[..expected.1],
                };
                let mut b = vec![0u8; req.buffer_len()];
                req.emit(&mut commit::VerifyRequestPacket::new_unchecked(&mut b[..]));
                (
                    rdmap::Opcode::VerifyRequest,
                    b,
                    Outstanding::Verify {
                        sq_idx: idx,
                        result: sges.into(),
                    },
                )
            }
            op::ATOMIC_WRITE => {
                let req = commit::AtomicWriteRequestRepr {
                    stag: wqe.rkey,
                    length: commit::ATOMIC_WRITE_DATA_LEN,
                    to: wqe.remote_addr,
                    data: wqe.operand0.to_be_bytes(),
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
            _ => {
                let id = self.next_request_id;
                self.next_request_id = id.wrapping_add(1);
                let (stag, to) = (wqe.rkey, wqe.remote_addr);
                let req = match wqe.opcode {
                    op::ATOMIC_FETCH_ADD => {
                        atomic::AtomicRequestRepr::fetch_add(id, stag, to, wqe.operand0)
                    }
                    op::ATOMIC_MASKED_FETCH_ADD => atomic::AtomicRequestRepr::masked_fetch_add(
                        id,
                        stag,
                        to,
                        wqe.operand0,
                        wqe.mask0,
                    ),
                    op::ATOMIC_CMP_SWP => atomic::AtomicRequestRepr::cmp_swap(
                        id,
                        stag,
                        to,
                        wqe.operand0,
                        wqe.operand1,
                    ),
                    op::ATOMIC_MASKED_CMP_SWP => atomic::AtomicRequestRepr::masked_cmp_swap(
                        id,
                        stag,
                        to,
                        wqe.operand0,
                        wqe.mask0,
                        wqe.operand1,
                        wqe.mask1,
                    ),
                    // Swap: a CmpSwap whose compare mask selects nothing.
                    _ => atomic::AtomicRequestRepr::masked_cmp_swap(
                        id,
                        stag,
                        to,
                        0,
                        0,
                        wqe.operand1,
                        atomic::NO_MASK,
                    ),
                };
                let mut b = vec![0u8; req.buffer_len()];
                req.emit(&mut atomic::RequestPacket::new_unchecked(&mut b[..]));
                (
                    rdmap::Opcode::AtomicRequest,
                    b,
                    Outstanding::Atomic {
                        sq_idx: idx,
                        request_id: id,
                        result: sges.into(),
                    },
                )
            }
        };
        self.orq.push_back(pending);
        *self.slot(idx) = Some(Slot::AwaitResponse);
        let msn = self.take_msn(ddp::QN_READ_REQUEST);
        let hdr = untagged(opcode, 0, ddp::QN_READ_REQUEST, msn, 0, true);
        self.push_fpdu(&hdr, &body, |_| Ok(()), 0)
    }

    /// Frames the response to a queue 1 request on queue 3.
    fn respond(&mut self, opcode: rdmap::Opcode, body: &[u8]) -> Result<(), Fail> {
        let msn = self.take_msn(ddp::QN_ATOMIC_RESPONSE);
        let hdr = untagged(opcode, 0, ddp::QN_ATOMIC_RESPONSE, msn, 0, true);
        self.push_fpdu(&hdr, body, |_| Ok(()), 0)
    }

    fn take_msn(&mut self, qn: u32) -> u32 {
        let m = self.msn[qn as usize];
        self.msn[qn as usize] = m.wrapping_add(1);
        m
    }

    /// Appends one FPDU: length, DDP/RDMAP header, `extra` header bytes, `payload_len`
    /// bytes produced by `payload`, pad and CRC (RFC 5044 section 4.1).
    fn push_fpdu(
        &mut self,
        hdr: &ddp::HeaderRepr,
        extra: &[u8],
        payload: impl FnOnce(&mut Vec<u8>) -> Result<(), Fail>,
        payload_len: usize,
    ) -> Result<(), Fail> {
        let start = self.buf.len();
        let hlen = match hdr.kind {
            ddp::Kind::Tagged { .. } => ddp::TAGGED_HDR_LEN,
            ddp::Kind::Untagged { .. } => ddp::UNTAGGED_HDR_LEN,
        };
        let ulpdu = hlen + extra.len() + payload_len;
        self.buf.extend_from_slice(&(ulpdu as u16).to_be_bytes());
        self.buf.resize(start + 2 + hlen, 0);
        hdr.emit(&mut self.buf[start + 2..]);
        self.buf.extend_from_slice(extra);
        if let Err(e) = payload(&mut self.buf) {
            self.buf.truncate(start);
            return Err(e);
        }
        debug_assert_eq!(self.buf.len(), start + 2 + ulpdu);
        let pad = mpa::pad_len(ulpdu);
        self.buf.resize(self.buf.len() + pad, 0);
        let trailer = if self.crc {
            let mut c = mpa::Crc::new();
            c.update(&self.buf[start..]);
            c.finish()
        } else {
            [0; 4]
        };
        self.buf.extend_from_slice(&trailer);
        self.framed += (self.buf.len() - start) as u64;
        Ok(())
    }
}

/// Copies `n` bytes of a WQE's payload starting at message offset `off` into `out`.
fn gather(qp: &Qp, body: &Body, mut off: u64, mut n: usize, out: &mut Vec<u8>) -> Result<(), Fail> {
    match body {
        Body::Inline(v) => {
            out.extend_from_slice(&v[off as usize..off as usize + n]);
            Ok(())
        }
        Body::Sges(sges) => {
            for s in sges {
                if n == 0 {
                    break;
                }
                if off >= s.length as u64 {
                    off -= s.length as u64;
                    continue;
                }
                let take = ((s.length as u64 - off) as usize).min(n);
                qp.sh
                    .mrs
                    .read(s.lkey, qp.pd, s.addr + off, take, NEED_NONE, out)
                    .map_err(|_| {
                        Fail::local(
                            Status::LocalProtection,
                            "send buffer deregistered while in flight",
                        )
                    })?;
                off = 0;
                n -= take;
            }
            Ok(())
        }
    }
}

/// Why a queue 1 request could not be carried out.
enum Refused {
    /// The STag check failed at execution (the MR changed since the request came).
    Access(mem::AccessError),
    /// The operation itself failed.
    Failed(String),
}

impl From<mem::AccessError> for Refused {
    fn from(e: mem::AccessError) -> Refused {
        Refused::Access(e)
    }
}

/// Carries out a queue 1 request from the peer (other than a Read) and returns
/// its response; a failure ends in a Terminate that names the request
/// (draft-talpey-rdma-commit section 5, RFC 7306 section 8).
pub fn execute(qp: &Qp, req: &Inbound) -> Result<(rdmap::Opcode, Vec<u8>), Fail> {
    carry_out(qp, req).map_err(|r| match r {
        Refused::Access(e) => Fail::protection(e, req.ddp_header(), None, "request refused"),
        Refused::Failed(why) => Fail::operation_failed(req.ddp_header(), &why),
    })
}

fn carry_out(qp: &Qp, req: &Inbound) -> Result<(rdmap::Opcode, Vec<u8>), Refused> {
    let mrs = &qp.sh.mrs;
    let pd = qp.pd;
    let failed = |why: &str| Refused::Failed(why.into());
    Ok(match *req {
        Inbound::Read(_) => unreachable!("reads are streamed by frame_job"),
        Inbound::Atomic { req, allowed, .. } => {
            let original = mrs
                .atomic(
                    req.stag,
                    pd,
                    req.to,
                    IBV_ACCESS_REMOTE_ATOMIC,
                    allowed,
                    |word| {
                        let mut old = word.load(Ordering::SeqCst);
                        loop {
                            let new = req.apply(old)?;
                            if new == old {
                                break Some(old);
                            }
                            match word.compare_exchange_weak(
                                old,
                                new,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            ) {
                                Ok(_) => break Some(old),
                                Err(now) => old = now,
                            }
                        }
                    },
                )?
                .flatten()
                .ok_or_else(|| failed("atomic operation not performed"))?;
            let resp = atomic::AtomicResponseRepr {
                request_id: req.request_id,
                original_value: original,
            };
            let mut b = vec![0u8; resp.buffer_len()];
            resp.emit(&mut atomic::ResponsePacket::new_unchecked(&mut b[..]));
            (rdmap::Opcode::AtomicResponse, b)
        }
        Inbound::Flush {
            stag,
            to,
            len,
            flags,
            allowed,
            ..
        } => {
            if len > 0 {
                let need = flush_need(flags);
                mrs.with_mr_allowed(stag, pd, to, len as usize, need, allowed, |host, mr| {
                    if flags & commit::FLUSH_PERSISTENCE == 0 {
                        return Ok(());
                    }
                    match &mr.ext {
                        Some(ext) => ext.media.flush_persistent(host, len as u64),
                        None => Err(std::io::Error::other("MR has no durable medium")),
                    }
                })?
                .map_err(|e| Refused::Failed(format!("RDMA Flush failed: {e}")))?;
            }
            if flags & commit::FLUSH_GLOBAL_VISIBILITY != 0 {
                crate::persist::flush_global();
            }
            (rdmap::Opcode::FlushResponse, Vec::new())
        }
        Inbound::Verify {
            stag,
            to,
            len,
            expected,
            expected_len,
            allowed,
            ..
        } => {
            let hash = mrs
                .with_mr_allowed(
                    stag,
                    pd,
                    to,
                    len as usize,
                    mem::ACCESS_VERIFY,
                    allowed,
                    |host, mr| match mr.ext.as_deref() {
                        Some(mem::MrExt {
                            media,
                            hash: Some(alg),
                        }) => media.hash(*alg, host, len as u64),
                        _ => Err(std::io::Error::other("MR is not verifiable")),
                    },
                )?
                .map_err(|e| Refused::Failed(format!("RDMA Verify failed: {e}")))?;
            if expected_len > 0 && expected[..expected_len as usize] != hash[..] {
                // A hash was given and does not match: Terminate, no response
                // (draft-talpey-rdma-commit sections 3.1.2.1 and 3.1.2.2).
                return Err(failed("RDMA Verify: hash mismatch"));
            }
            (rdmap::Opcode::VerifyResponse, hash)
        }
        Inbound::AtomicWrite {
            stag,
            to,
            value,
            allowed,
            ..
        } => {
            mrs.atomic(stag, pd, to, IBV_ACCESS_REMOTE_WRITE, allowed, |word| {
                word.store(value, Ordering::SeqCst)
            })?
            .ok_or_else(|| failed("Atomic Write target not aligned"))?;
            (rdmap::Opcode::AtomicWriteResponse, Vec::new())
        }
    })
}

/// Work that is answered by the peer on queue 3 or 2 and counts against ORD.
pub fn queue1_request(opcode: u8) -> bool {
    matches!(
        opcode,
        op::READ
            | op::ATOMIC_CMP_SWP
            | op::ATOMIC_FETCH_ADD
            | op::ATOMIC_MASKED_CMP_SWP
            | op::ATOMIC_MASKED_FETCH_ADD
            | op::ATOMIC_SWAP
            | op::FLUSH
            | op::VERIFY
            | op::ATOMIC_WRITE
    )
}

/// Keeps `hash` (at most [`VERIFY_MAX_HASH`] bytes) as the expected hash of a
/// Verify WQE, in its operand words; [`verify_expected`] reads it back.
pub fn set_verify_expected(wqe: &mut SendWqe, hash: &[u8]) {
    let mut h = [0u8; VERIFY_MAX_HASH];
    let n = hash.len().min(VERIFY_MAX_HASH);
    h[..n].copy_from_slice(&hash[..n]);
    let word = |k: usize| u64::from_ne_bytes(h[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
    (wqe.operand0, wqe.operand1, wqe.mask0, wqe.mask1) = (word(0), word(1), word(2), word(3));
    wqe.op_flags = n as u8;
}

/// The expected hash of a Verify WQE (bytes, length): kept in its operand words.
pub fn verify_expected(wqe: &SendWqe) -> ([u8; VERIFY_MAX_HASH], usize) {
    let mut h = [0u8; VERIFY_MAX_HASH];
    for (k, w) in [wqe.operand0, wqe.operand1, wqe.mask0, wqe.mask1]
        .iter()
        .enumerate()
    {
        h[k * 8..k * 8 + 8].copy_from_slice(&w.to_ne_bytes());
    }
    (h, (wqe.op_flags as usize).min(VERIFY_MAX_HASH))
}

fn ctrl(op: rdmap::Opcode) -> u8 {
    rdmap::Ctrl {
        version: rdmap::RDMAP_VERSION,
        opcode: op as u8,
    }
    .to_byte()
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

/// Transmits on the calling thread if no one else is; otherwise leaves a note
/// that the current holder picks up before it lets go. Callable with the QP's
/// cm or rx lock held.
pub fn kick(qp: &Qp) {
    qp.tx_want.store(true, Ordering::SeqCst);
    loop {
        let mut tx = match qp.tx.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::WouldBlock) => return,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        qp.tx_want.store(false, Ordering::SeqCst);
        let r = tx.run(qp);
        drop(tx);
        if let Err(f) = r {
            // The caller may hold this QP's cm or rx lock, which failing takes:
            // the progress thread applies the failure with no locks held.
            qp.defer_fail(f);
            return;
        }
        if !qp.tx_want.load(Ordering::SeqCst) {
            return;
        }
    }
}
