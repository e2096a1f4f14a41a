//! Transmit: frames work requests, read responses and Terminates into FPDUs
//! (RFC 5044 section 4, RFC 5041, RFC 5040) and writes them to the stream.
//!
//! Whoever posts work transmits it on its own thread when it can take the `tx`
//! lock; when the socket is full the progress thread finishes the job on EPOLLOUT.

use std::collections::VecDeque;
use std::mem::size_of;
use std::sync::atomic::Ordering;

use xiw_abi::ring::{op, wqe_flag, SendWqe, Sge};
use xiw_abi::verbs::*;

use crate::mem::NEED_NONE;
use crate::qp::Qp;
use crate::rx::{Fail, PendingRead};
use crate::wire::{ddp, mpa, rdmap};

/// Bytes framed per round before they are written.
const BATCH: usize = 256 * 1024;
/// A staging buffer up to this size is kept when its QP goes idle.
const TRIM_KEEP: usize = 16 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    /// Framed; completes once the stream has taken its last byte.
    Sent,
    /// Waiting for a response (RDMA Read).
    AwaitResponse,
    Done(u32),
}

/// An RDMA Read Request accepted from the peer, answered in order (RFC 5040 section 5.3).
#[derive(Clone, Copy, Debug)]
pub struct ReadResp {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub src_stag: u32,
    pub src_to: u64,
    pub len: u32,
}

enum Job {
    Sq { idx: u32, wqe: SendWqe, body: Body },
    ReadResp(ReadResp),
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
    /// Next MSN for each outbound untagged queue (QN 0, 1, 2); the first is 1 (RFC 5041 5.1).
    msn: [u32; 3],
    pub ord_max: u32,
    pub reads: VecDeque<PendingRead>,
    pub irq: VecDeque<ReadResp>,
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
            msn: [1; 3],
            ord_max: 1,
            reads: VecDeque::new(),
            irq: VecDeque::new(),
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
            let Some(Slot::Done(status)) = *self.slot(c) else {
                break;
            };
            *self.slot(c) = None;
            // SAFETY: slot `c` lies in [consumer, producer): posted and not yet released,
            // so its contents are stable until the release below.
            let wqe: SendWqe = unsafe { qp.sq.read(c, 0) };
            c = c.wrapping_add(1);
            qp.sq.release(c);
            qp.complete_send(&wqe, status);
        }
    }

    /// Marks the oldest outstanding RDMA Read as answered.
    pub fn read_done(&mut self, qp: &Qp, idx: u32, status: u32) {
        *self.slot(idx) = Some(Slot::Done(status));
        self.complete_ready(qp);
    }

    /// Completes every outstanding SQ WQE in error; the QP is in the error state.
    pub fn flush(&mut self, qp: &Qp) {
        self.fd = None;
        self.buf.clear();
        self.off = 0;
        self.cur = None;
        self.done_at.clear();
        self.reads.clear();
        self.irq.clear();
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
        if let Some(r) = self.irq.pop_front() {
            return Ok(Some(Cur {
                job: Job::ReadResp(r),
                sent: 0,
            }));
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
        if wqe.flags & wqe_flag::FENCE != 0 && !self.reads.is_empty() {
            return Ok(None);
        }
        if wqe.opcode == op::READ && self.reads.len() as u32 >= self.ord_max {
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
                let need = if wqe.opcode == op::READ {
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
                    return Err(Fail::local(IBV_WC_LOC_PROT_ERR, "send WQE with a bad lkey"));
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
            Job::ReadResp(r) => {
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
                                        IBV_WC_WR_FLUSH_ERR,
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
            Job::Sq { idx, wqe, .. } => {
                let (idx, wqe) = (*idx, *wqe);
                match wqe.opcode {
                    op::SEND | op::SEND_INV | op::WRITE => self.frame_data(qp, cur, idx, &wqe),
                    op::READ => {
                        let Job::Sq {
                            body: Body::Sges(sges),
                            ..
                        } = &cur.job
                        else {
                            return Err(Fail::local(IBV_WC_LOC_QP_OP_ERR, "inline RDMA Read"));
                        };
                        let (sink_stag, sink_to) =
                            sges.first().map(|s| (s.lkey, s.addr)).unwrap_or((0, 0));
                        let req = rdmap::ReadRequestRepr {
                            sink_stag,
                            sink_to,
                            size: wqe.length,
                            src_stag: wqe.rkey,
                            src_to: wqe.remote_addr,
                        };
                        self.reads.push_back(PendingRead {
                            sq_idx: idx,
                            sink_stag,
                            sink_to,
                            sges: sges.clone(),
                            length: wqe.length as u64,
                            received: 0,
                        });
                        *self.slot(idx) = Some(Slot::AwaitResponse);
                        let mut body = [0u8; rdmap::READ_REQUEST_LEN];
                        req.emit(&mut rdmap::ReadRequestPacket::new_unchecked(&mut body[..]));
                        let msn = self.take_msn(ddp::QN_READ_REQUEST);
                        let hdr = untagged(
                            rdmap::Opcode::ReadRequest,
                            0,
                            ddp::QN_READ_REQUEST,
                            msn,
                            0,
                            true,
                        );
                        self.push_fpdu(&hdr, &body, |_| Ok(()), 0)?;
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
                        IBV_WC_LOC_QP_OP_ERR,
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
        let is_send = wqe.opcode != op::WRITE;
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
                self.done_at.push_back((idx, self.framed));
                return Ok(true);
            }
            if self.buf.len() >= BATCH {
                return Ok(false);
            }
        }
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
                            IBV_WC_LOC_PROT_ERR,
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
