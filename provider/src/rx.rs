//! Receive: reads FPDUs off the stream, checks every field against the QP's
//! state and the STag table, and places payload (RFC 5040 section 5, RFC 5041).
//! Any violation ends in a Terminate to the peer and the QP in error.

use xiw_abi::ring::{Cqe, Sge};
use xiw_abi::verbs::*;

use crate::mem::{self, AccessError};
use crate::qp::{Qp, RecvJob};
use crate::tx::{self, Inbound, Outstanding, ReadResp};
use crate::wire::{self, atomic, commit, ddp, mpa, rdmap, terminate as term};

/// An RDMA Read this side issued, waiting for its response.
#[derive(Clone, Debug)]
pub struct PendingRead {
    pub sq_idx: u32,
    pub sink_stag: u32,
    pub sink_to: u64,
    /// Shared, so that each Read Response segment takes it without a copy.
    pub sges: std::sync::Arc<[Sge]>,
    pub length: u64,
    pub received: u64,
}

/// What went wrong, and what to tell the peer and the application.
#[derive(Debug)]
pub struct Fail {
    pub why: String,
    /// Terminate message body for the peer, if the stream is still usable.
    pub term: Option<Vec<u8>>,
    pub sq_status: Option<u32>,
    pub rq_status: Option<u32>,
    pub event: u32,
    /// The peer closed its end in order: fail after a short linger, so the
    /// application can reap what the peer sent before its flush errors.
    pub linger: bool,
}

impl Fail {
    pub fn stream(why: String) -> Fail {
        Fail {
            why,
            term: None,
            sq_status: None,
            rq_status: None,
            event: IBV_EVENT_QP_FATAL,
            linger: false,
        }
    }

    /// A fault of this side's own work (a bad lkey, say): the peer is told with
    /// a Terminate sent instead of the message, carrying no headers (RFC 5040
    /// section 7.1, RFC 7306 section 8.1, draft-talpey-rdma-commit section 5.1).
    pub fn local(status: u32, why: &str) -> Fail {
        Fail {
            sq_status: Some(status),
            ..terminate(
                term::LAYER_RDMAP,
                term::RDMAP_ETYPE_LOCAL_CATASTROPHIC,
                0,
                None,
                None,
                why,
            )
        }
    }
}

#[derive(Default)]
pub struct Rx {
    pub fd: Option<i32>,
    pub crc: bool,
    /// Responder side: the peer's first FPDU is its ready-to-receive message.
    pub expect_rtr: bool,
    /// `qp_access_flags` for remote requests.
    pub access: u32,
    /// Bytes read and not yet processed start at `start`.
    buf: Vec<u8>,
    start: usize,
    /// Next expected MSN per inbound untagged queue 0 to 3 (0 until established).
    msn: [u32; 4],
    pub cur: Option<RecvJob>,
    placed: u64,
    /// RFC 7306 atomics and immediate data, and the commit draft's operations, are on.
    pub extensions: bool,
    /// The peer is an xiw that sends Send with Immediate as Immediate Data directly
    /// followed by the Send, and Immediate Data on its own only after an RDMA Write:
    /// such a pair then takes a single receive, as the verbs promise.
    pub merge_imm: bool,
    /// The immediate of that pair, waiting for its Send.
    pending_imm: Option<u32>,
    /// Bytes of the RDMA Write message being received.
    write_len: u64,
    /// The message before this one was a whole RDMA Write of that many bytes.
    after_write: Option<u64>,
    /// Responses or freed ORD credits are waiting to go out: transmit once the
    /// bytes read so far are processed, so a burst of requests is answered
    /// with a burst of FPDUs in few writes.
    want_kick: bool,
    /// Bytes came in since the last trim pass.
    active: bool,
}

/// Receive buffer bounds: the largest FPDU (2 + 65535 + pad + CRC) always fits.
const RX_BUF_MIN: usize = 16 * 1024;
const RX_BUF_MAX: usize = 256 * 1024;

impl Rx {
    /// Frees the buffer of a QP that received nothing since the last pass;
    /// true while it still holds a large one.
    pub fn trim(&mut self) -> bool {
        let idle = !std::mem::replace(&mut self.active, false);
        if idle && self.start == self.buf.len() && self.buf.capacity() > RX_BUF_MIN {
            self.buf = Vec::new();
            self.start = 0;
        }
        self.buf.capacity() > RX_BUF_MIN
    }

    pub fn established(fd: i32, crc: bool, expect_rtr: bool, access: u32) -> Rx {
        Rx {
            fd: Some(fd),
            crc,
            expect_rtr,
            access,
            msn: [1; 4],
            ..Default::default()
        }
    }
}

/// Reads and processes everything available on the stream.
///
/// The buffer starts small and grows (up to `RX_BUF_MAX`) only while the stream
/// keeps it full or an FPDU needs the room, so an idle QP holds little memory.
pub fn on_readable(qp: &Qp) -> Result<(), Fail> {
    read_stream(qp, qp.lock_rx())
}

/// As [`on_readable`], unless another thread is receiving on this QP already.
pub fn poll_readable(qp: &Qp) -> Result<(), Fail> {
    match qp.rx.try_lock() {
        Ok(rx) => read_stream(qp, rx),
        Err(std::sync::TryLockError::WouldBlock) => Ok(()),
        Err(std::sync::TryLockError::Poisoned(p)) => read_stream(qp, p.into_inner()),
    }
}

fn read_stream(qp: &Qp, mut rx: std::sync::MutexGuard<'_, Rx>) -> Result<(), Fail> {
    let Some(fd) = rx.fd else { return Ok(()) };
    loop {
        if rx.start > 0 {
            let s = rx.start;
            rx.buf.drain(..s);
            rx.start = 0;
        }
        let need = mpa::peek_fpdu_len(&rx.buf).unwrap_or(0).max(RX_BUF_MIN);
        let cap = rx.buf.capacity();
        if cap < need || cap - rx.buf.len() < RX_BUF_MIN / 4 {
            let want = need.max((cap * 2).min(RX_BUF_MAX));
            let len = rx.buf.len();
            rx.buf.reserve_exact(want - len);
        }
        let spare = rx.buf.spare_capacity_mut();
        let room = spare.len();
        // SAFETY: recv writes at most `room` bytes into the spare capacity of `buf`;
        // `fd` is the QP's stream, open while the QP lives.
        let n = unsafe {
            libc::recv(
                fd,
                spare.as_mut_ptr() as *mut libc::c_void,
                room,
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            // An orderly close: nothing more will come. Stop watching the stream
            // for input (EOF stays readable), keep sending what is posted, and
            // let the QP linger before it fails.
            rx.fd = None;
            qp.rx_eof.store(true, std::sync::atomic::Ordering::Release);
            qp.sh.watch_data(
                fd,
                qp.qpn,
                false,
                qp.tx_blocked.load(std::sync::atomic::Ordering::Acquire),
            );
            return Err(Fail {
                linger: true,
                ..Fail::stream("peer closed the connection".into())
            });
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(()),
                Some(libc::EINTR) => continue,
                _ => return Err(Fail::stream(format!("recv: {e}"))),
            }
        }
        rx.active = true;
        let len = rx.buf.len() + n as usize;
        // SAFETY: recv initialised the first `n` bytes of the spare capacity.
        unsafe { rx.buf.set_len(len) };
        let buf = std::mem::take(&mut rx.buf);
        let r = process_buffered(qp, &mut rx, &buf);
        rx.buf = buf;
        if std::mem::take(&mut rx.want_kick) {
            tx::kick(qp);
        }
        if let Err(mut f) = r {
            // The stream is dead from this byte on: no thread may place anything
            // after it, and the receive it hit completes with its own status now,
            // before any flush can claim it.
            rx.fd = None;
            if let Some(status) = f.rq_status.take() {
                if let Some(job) = rx.cur.take() {
                    qp.complete_recv_error(&job, status);
                }
            }
            return Err(f);
        }
        if (n as usize) < room {
            return Ok(());
        }
    }
}

fn process_buffered(qp: &Qp, rx: &mut Rx, buf: &[u8]) -> Result<(), Fail> {
    while let Some(len) = mpa::peek_fpdu_len(&buf[rx.start..]) {
        if buf.len() - rx.start < len {
            break;
        }
        let fpdu = &buf[rx.start..rx.start + len];
        rx.start += len;
        segment(qp, rx, fpdu)?;
        if rx.fd.is_none() {
            break;
        }
    }
    Ok(())
}

/// One FPDU.
fn segment(qp: &Qp, rx: &mut Rx, fpdu: &[u8]) -> Result<(), Fail> {
    let ulpdu = match mpa::check_fpdu(fpdu, rx.crc) {
        Ok(u) => u,
        Err(_) => {
            return Err(terminate(
                term::LAYER_LLP,
                term::MPA_ETYPE,
                term::MPA_ECODE_CRC,
                None,
                None,
                "MPA CRC error",
            ))
        }
    };
    let (hdr, hlen) = match ddp::HeaderRepr::parse(ulpdu) {
        Ok(v) => v,
        Err(wire::Error::BadVersion) => {
            let (etype, code) = if ulpdu.first().is_some_and(|b| b & 0x80 != 0) {
                (
                    term::DDP_ETYPE_TAGGED_BUFFER,
                    term::DDP_ECODE_T_INVALID_VERSION,
                )
            } else {
                (
                    term::DDP_ETYPE_UNTAGGED_BUFFER,
                    term::DDP_ECODE_U_INVALID_VERSION,
                )
            };
            return Err(terminate(
                term::LAYER_DDP,
                etype,
                code,
                Some(ulpdu),
                None,
                "bad DDP version",
            ));
        }
        Err(_) => {
            return Err(terminate(
                term::LAYER_DDP,
                term::DDP_ETYPE_LOCAL_CATASTROPHIC,
                term::DDP_ECODE_LOCAL_CATASTROPHIC,
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
        return Err(terminate(
            term::LAYER_RDMAP,
            term::RDMAP_ETYPE_REMOTE_OPERATION,
            term::RDMAP_ECODE_INVALID_VERSION,
            Some(dhdr),
            None,
            "bad RDMAP version",
        ));
    }
    let opcode = rdmap::Opcode::from_u8(c.opcode);
    if rx.expect_rtr {
        // The initiator's first FPDU (RFC 6581 section 6): this side may now
        // transmit, whatever it is. The agreed zero-length Write carries
        // nothing more; anything else is processed as it is.
        rx.expect_rtr = false;
        crate::log::debug(
            &qp.sh.log,
            format_args!("qp {}: first FPDU (opcode {opcode:?}) came", qp.qpn),
        );
        let mut tx = qp.lock_tx();
        tx.gate = false;
        drop(tx);
        tx::kick(qp);
        if opcode == Some(rdmap::Opcode::Write) && payload.is_empty() {
            return Ok(());
        }
    }
    if rx.pending_imm.is_some() {
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
    // Whether the previous message was a whole RDMA Write is for Immediate Data
    // to read (it takes it); any other message forgets it.
    let is_imm = matches!(
        opcode,
        Some(rdmap::Opcode::ImmediateData | rdmap::Opcode::ImmediateDataSolicited)
    );
    let after_write = if is_imm {
        rx.after_write.take()
    } else {
        rx.after_write = None;
        None
    };
    match (hdr.kind, opcode) {
        (ddp::Kind::Tagged { stag, to }, Some(rdmap::Opcode::Write)) => {
            // A zero-length Write touches no memory, so its STag is not checked.
            if !payload.is_empty() {
                qp.sh
                    .mrs
                    .write_allowed(stag, qp.pd, to, payload, IBV_ACCESS_REMOTE_WRITE, rx.access)
                    .map_err(|e| access_fail(e, dhdr, "RDMA Write refused"))?;
            }
            rx.write_len += payload.len() as u64;
            if hdr.last {
                rx.after_write = Some(std::mem::take(&mut rx.write_len));
            }
            Ok(())
        }
        (ddp::Kind::Tagged { stag, to }, Some(rdmap::Opcode::ReadResponse)) => {
            read_response(qp, rx, stag, to, hdr.last, payload, dhdr)
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
            let q = qn as usize;
            let top = if rx.extensions {
                ddp::QN_ATOMIC_RESPONSE
            } else {
                ddp::QN_TERMINATE
            };
            if qn > top {
                return Err(terminate(
                    term::LAYER_DDP,
                    term::DDP_ETYPE_UNTAGGED_BUFFER,
                    term::DDP_ECODE_U_INVALID_QN,
                    Some(dhdr),
                    None,
                    "invalid queue number",
                ));
            }
            if msn != rx.msn[q] {
                return Err(terminate(
                    term::LAYER_DDP,
                    term::DDP_ETYPE_UNTAGGED_BUFFER,
                    term::DDP_ECODE_U_INVALID_MSN_RANGE,
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
                ) => recv_send(qp, rx, op, ulp_word, mo, hdr.last, payload, dhdr),
                (
                    ddp::QN_SEND,
                    rdmap::Opcode::ImmediateData | rdmap::Opcode::ImmediateDataSolicited,
                ) if rx.extensions => immediate(qp, rx, after_write, mo, hdr.last, payload, dhdr),
                // Requests on queue 1 and their responses on queue 3 are single
                // segments; each takes one MSN (RFC 5041 section 5.1).
                (ddp::QN_READ_REQUEST | ddp::QN_ATOMIC_RESPONSE, _)
                    if hdr.last
                        && mo == 0
                        && (op == rdmap::Opcode::ReadRequest || rx.extensions)
                        && queue_of(op) == Some(qn) =>
                {
                    rx.msn[q] = rx.msn[q].wrapping_add(1);
                    if qn == ddp::QN_READ_REQUEST {
                        queue1_request(qp, rx, op, payload, dhdr)
                    } else {
                        response(qp, rx, op, payload, dhdr)
                    }
                }
                (ddp::QN_TERMINATE, rdmap::Opcode::Terminate) => Err(peer_terminated(qp, payload)),
                _ => Err(unexpected(dhdr)),
            }
        }
        _ => Err(unexpected(dhdr)),
    }
}

#[allow(clippy::too_many_arguments)]
fn recv_send(
    qp: &Qp,
    rx: &mut Rx,
    op: rdmap::Opcode,
    inv_stag: u32,
    mo: u32,
    last: bool,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    if rx.cur.is_none() {
        if mo != 0 {
            return Err(terminate(
                term::LAYER_DDP,
                term::DDP_ETYPE_UNTAGGED_BUFFER,
                term::DDP_ECODE_U_INVALID_MO,
                Some(dhdr),
                None,
                "first segment with non-zero MO",
            ));
        }
        match qp.take_recv() {
            Some(job) => {
                rx.cur = Some(job);
                rx.placed = 0;
            }
            None => {
                return Err(terminate(
                    term::LAYER_DDP,
                    term::DDP_ETYPE_UNTAGGED_BUFFER,
                    term::DDP_ECODE_U_INVALID_MSN_NO_BUFFER,
                    Some(dhdr),
                    None,
                    "Send with no receive posted",
                ))
            }
        }
    }
    if mo as u64 != rx.placed {
        return Err(terminate(
            term::LAYER_DDP,
            term::DDP_ETYPE_UNTAGGED_BUFFER,
            term::DDP_ECODE_U_INVALID_MO,
            Some(dhdr),
            None,
            "MO out of order",
        ));
    }
    let job = rx.cur.as_ref().expect("receive in progress");
    if rx.placed + payload.len() as u64 > job.length {
        let mut f = terminate(
            term::LAYER_DDP,
            term::DDP_ETYPE_UNTAGGED_BUFFER,
            term::DDP_ECODE_U_MSG_TOO_LONG,
            Some(dhdr),
            None,
            "Send longer than the receive buffer",
        );
        f.rq_status = Some(IBV_WC_LOC_LEN_ERR);
        return Err(f);
    }
    if scatter(qp, &job.sges, rx.placed, payload).is_err() {
        let mut f = terminate(
            term::LAYER_RDMAP,
            term::RDMAP_ETYPE_REMOTE_OPERATION,
            term::RDMAP_ECODE_CATASTROPHIC_STREAM,
            Some(dhdr),
            None,
            "receive buffer with a bad lkey",
        );
        f.rq_status = Some(IBV_WC_LOC_PROT_ERR);
        return Err(f);
    }
    rx.placed += payload.len() as u64;
    if !last {
        return Ok(());
    }
    let job = rx.cur.take().expect("receive in progress");
    rx.msn[0] = rx.msn[0].wrapping_add(1);
    let mut cqe = Cqe {
        wr_id: job.wr_id,
        byte_len: rx.placed as u32,
        qp_num: qp.qpn,
        opcode: IBV_WC_RECV as u8,
        status: IBV_WC_SUCCESS as u8,
        ..Default::default()
    };
    if let Some(imm) = rx.pending_imm.take() {
        cqe.wc_flags = IBV_WC_WITH_IMM as u8;
        cqe.imm_or_inv = imm;
    }
    if matches!(
        op,
        rdmap::Opcode::SendInvalidate | rdmap::Opcode::SendSolicitedInvalidate
    ) {
        if qp.sh.mrs.invalidate(inv_stag, qp.pd).is_err() {
            let mut f = terminate(
                term::LAYER_RDMAP,
                term::RDMAP_ETYPE_REMOTE_PROTECTION,
                term::RDMAP_ECODE_STAG_CANNOT_INVALIDATE,
                Some(dhdr),
                None,
                "Send with Invalidate of an STag that cannot be invalidated",
            );
            f.rq_status = Some(IBV_WC_REM_ACCESS_ERR);
            rx.cur = Some(job);
            return Err(f);
        }
        cqe.wc_flags = IBV_WC_WITH_INV as u8;
        cqe.imm_or_inv = inv_stag;
    }
    qp.push_cqe(&qp.recv_cq, cqe);
    Ok(())
}

/// Copies `data` into the SGE list at message offset `off`, checking each SGE.
fn scatter(qp: &Qp, sges: &[Sge], mut off: u64, mut data: &[u8]) -> Result<(), AccessError> {
    for s in sges {
        if data.is_empty() {
            break;
        }
        if off >= s.length as u64 {
            off -= s.length as u64;
            continue;
        }
        let take = ((s.length as u64 - off) as usize).min(data.len());
        qp.sh.mrs.write(
            s.lkey,
            qp.pd,
            s.addr + off,
            &data[..take],
            IBV_ACCESS_LOCAL_WRITE,
        )?;
        data = &data[take..];
        off = 0;
    }
    Ok(())
}

/// The untagged queue an opcode travels on, for the queue 1 requests and the
/// queue 3 responses (RFC 5040 section 4.3, RFC 7306 section 5.2,
/// draft-talpey-rdma-commit table 1).
fn queue_of(op: rdmap::Opcode) -> Option<u32> {
    use rdmap::Opcode::*;
    match op {
        ReadRequest | AtomicRequest | FlushRequest | VerifyRequest | AtomicWriteRequest => {
            Some(ddp::QN_READ_REQUEST)
        }
        AtomicResponse | FlushResponse | VerifyResponse | AtomicWriteResponse => {
            Some(ddp::QN_ATOMIC_RESPONSE)
        }
        _ => None,
    }
}

fn read_request(qp: &Qp, rx: &mut Rx, payload: &[u8], dhdr: &[u8]) -> Result<(), Fail> {
    let pkt = rdmap::ReadRequestPacket::new_checked(payload)
        .map_err(|_| short(dhdr, "short Read Request"))?;
    let req = rdmap::ReadRequestRepr::parse(&pkt).map_err(|_| unexpected(dhdr))?;
    let rhdr = &payload[..rdmap::READ_REQUEST_LEN];
    // A zero-length Read touches no memory, so its source STag is not checked.
    let checked = if req.size == 0 {
        Ok(())
    } else {
        qp.sh.mrs.with_mem_allowed(
            req.src_stag,
            qp.pd,
            req.src_to,
            req.size as usize,
            IBV_ACCESS_REMOTE_READ,
            rx.access,
            |_| (),
        )
    };
    if let Err(e) = checked {
        return Err(rdmap_protection(e, dhdr, Some(rhdr), "RDMA Read refused"));
    }
    let entry = Inbound::Read(ReadResp {
        sink_stag: req.sink_stag,
        sink_to: req.sink_to,
        src_stag: req.src_stag,
        src_to: req.src_to,
        len: req.size,
    });
    queue_inbound(qp, rx, entry, dhdr)
}

fn read_response(
    qp: &Qp,
    rx: &mut Rx,
    stag: u32,
    to: u64,
    last: bool,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    let tx = qp.lock_tx();
    let Some(Outstanding::Read(pr)) = tx.orq.front().cloned() else {
        drop(tx);
        return Err(unexpected(dhdr));
    };
    drop(tx);
    let bounds = || {
        terminate(
            term::LAYER_DDP,
            term::DDP_ETYPE_TAGGED_BUFFER,
            term::DDP_ECODE_T_BASE_BOUNDS,
            Some(dhdr),
            None,
            "Read Response outside the sink buffer",
        )
    };
    if stag != pr.sink_stag {
        return Err(terminate(
            term::LAYER_DDP,
            term::DDP_ETYPE_TAGGED_BUFFER,
            term::DDP_ECODE_T_INVALID_STAG,
            Some(dhdr),
            None,
            "Read Response to an unknown sink STag",
        ));
    }
    if to != pr.sink_to.wrapping_add(pr.received) || pr.received + payload.len() as u64 > pr.length
    {
        return Err(bounds());
    }
    if scatter(qp, &pr.sges, pr.received, payload).is_err() {
        return Err(Fail::local(
            IBV_WC_LOC_PROT_ERR,
            "read sink with a bad lkey",
        ));
    }
    let mut tx = qp.lock_tx();
    let Some(Outstanding::Read(front)) = tx.orq.front_mut() else {
        // Another thread failed the QP and flushed the Read meanwhile.
        drop(tx);
        return Err(Fail::stream(
            "the Read was flushed while its data came".into(),
        ));
    };
    front.received += payload.len() as u64;
    if last {
        if front.received != front.length {
            drop(tx);
            return Err(bounds());
        }
        let idx = front.sq_idx;
        tx.orq.pop_front();
        tx.read_done(qp, idx, IBV_WC_SUCCESS);
        drop(tx);
        rx.want_kick = true;
    }
    Ok(())
}

/// The peer sent a Terminate: map it to a completion status for the oldest
/// outstanding request (RFC 5040 section 7.2).
fn peer_terminated(_qp: &Qp, payload: &[u8]) -> Fail {
    let (status, event) = xiw_engine::fault::peer_terminate(payload);
    Fail {
        why: "peer sent a Terminate".into(),
        term: None,
        sq_status: Some(ibv_status(status)),
        rq_status: None,
        event: ibv_event(event),
        linger: false,
    }
}

/// The engine's status as the verbs report it.
fn ibv_status(s: xiw_engine::fault::Status) -> u32 {
    use xiw_engine::fault::Status;
    match s {
        Status::RemoteAccess => IBV_WC_REM_ACCESS_ERR,
        Status::RemoteInvalidRequest => IBV_WC_REM_INV_REQ_ERR,
        Status::RemoteOperation => IBV_WC_REM_OP_ERR,
        Status::ReceiverNotReady => IBV_WC_RNR_RETRY_EXC_ERR,
    }
}

/// The engine's event as the verbs report it.
fn ibv_event(e: xiw_engine::fault::Event) -> u32 {
    use xiw_engine::fault::Event;
    match e {
        Event::QpFatal => IBV_EVENT_QP_FATAL,
        Event::QpAccessError => IBV_EVENT_QP_ACCESS_ERR,
    }
}

/// Immediate Data (RFC 7306 section 6): completes a receive of its own, or,
/// from an xiw peer and not after an RDMA Write, rides with the Send that follows.
#[allow(clippy::too_many_arguments)]
fn immediate(
    qp: &Qp,
    rx: &mut Rx,
    after_write: Option<u64>,
    mo: u32,
    last: bool,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    // Exactly 8 bytes in one segment (section 6.3).
    if !last || mo != 0 || payload.len() != atomic::IMMEDIATE_LEN {
        return Err(operation_failed(dhdr, "Immediate Data not exactly 8 bytes"));
    }
    rx.msn[0] = rx.msn[0].wrapping_add(1);
    let mut b = [0u8; 4];
    b.copy_from_slice(&payload[4..8]);
    let imm = u32::from_ne_bytes(b);
    if after_write.is_none() && rx.merge_imm {
        rx.pending_imm = Some(imm);
        return Ok(());
    }
    let Some(job) = qp.take_recv() else {
        return Err(terminate(
            term::LAYER_DDP,
            term::DDP_ETYPE_UNTAGGED_BUFFER,
            term::DDP_ECODE_U_INVALID_MSN_NO_BUFFER,
            Some(dhdr),
            None,
            "Immediate Data with no receive posted",
        ));
    };
    qp.push_cqe(
        &qp.recv_cq,
        Cqe {
            wr_id: job.wr_id,
            byte_len: after_write.unwrap_or(0) as u32,
            imm_or_inv: imm,
            qp_num: qp.qpn,
            opcode: IBV_WC_RECV_RDMA_WITH_IMM as u8,
            status: IBV_WC_SUCCESS as u8,
            wc_flags: IBV_WC_WITH_IMM as u8,
            ..Default::default()
        },
    );
    Ok(())
}

fn short(dhdr: &[u8], what: &str) -> Fail {
    terminate(
        term::LAYER_DDP,
        term::DDP_ETYPE_LOCAL_CATASTROPHIC,
        term::DDP_ECODE_LOCAL_CATASTROPHIC,
        Some(dhdr),
        None,
        what,
    )
}

/// A queue 1 request (Read, Atomic, Flush, Verify, Atomic Write): checked now,
/// against the STag table and the rules of RFC 5040 section 7, RFC 7306
/// section 8.2 and the commit draft's section 5.2, then queued behind the
/// earlier ones.
fn queue1_request(
    qp: &Qp,
    rx: &mut Rx,
    op: rdmap::Opcode,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    let mut d = [0u8; ddp::UNTAGGED_HDR_LEN];
    d.copy_from_slice(&dhdr[..ddp::UNTAGGED_HDR_LEN]);
    let mrs = &qp.sh.mrs;
    let pd = qp.pd;
    // Flush and Verify rights live on the MR only; the QP's flags gate the rest.
    let allowed =
        rx.access | mem::ACCESS_FLUSH_GLOBAL | mem::ACCESS_FLUSH_PERSISTENT | mem::ACCESS_VERIFY;
    let aligned = |stag: u32, to: u64, need: u32| {
        mrs.with_mem_allowed(stag, pd, to, 8, need, rx.access, |p| {
            (p as usize).is_multiple_of(8)
        })
        .map_err(|e| protection_failed(e, dhdr, "request refused"))
    };
    let entry = match op {
        rdmap::Opcode::ReadRequest => return read_request(qp, rx, payload, dhdr),
        rdmap::Opcode::AtomicRequest => {
            let pkt = atomic::RequestPacket::new_checked(payload)
                .map_err(|_| short(dhdr, "short Atomic Request"))?;
            let req = atomic::AtomicRequestRepr::parse(&pkt)
                .map_err(|_| short(dhdr, "bad Atomic Request"))?;
            if req.op().is_none() {
                // An AOpCode xiw does not implement (section 5.2.1 rule 4).
                return Err(terminate(
                    term::LAYER_RDMAP,
                    term::RDMAP_ETYPE_REMOTE_OPERATION,
                    term::RDMAP_ECODE_UNEXPECTED_OPCODE,
                    Some(dhdr),
                    None,
                    "unsupported atomic operation code",
                ));
            }
            if !aligned(req.stag, req.to, IBV_ACCESS_REMOTE_ATOMIC)? {
                return Err(operation_failed(dhdr, "atomic target not 64-bit aligned"));
            }
            Inbound::Atomic {
                req,
                allowed: rx.access,
                dhdr: d,
            }
        }
        rdmap::Opcode::FlushRequest => {
            let pkt = commit::FlushRequestPacket::new_checked(payload)
                .map_err(|_| short(dhdr, "short Flush Request"))?;
            let req = commit::FlushRequestRepr::parse(&pkt)
                .map_err(|_| short(dhdr, "bad Flush Request"))?;
            let flags = req.flags & commit::FLUSH_KNOWN_FLAGS;
            if req.length > 0 {
                mrs.with_mem_allowed(
                    req.stag,
                    pd,
                    req.to,
                    req.length as usize,
                    tx::flush_need(flags),
                    allowed,
                    |_| (),
                )
                .map_err(|e| protection_failed(e, dhdr, "RDMA Flush refused"))?;
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
                .map_err(|_| short(dhdr, "short Verify Request"))?;
            let req = commit::VerifyRequestRepr::parse(&pkt)
                .map_err(|_| short(dhdr, "bad Verify Request"))?;
            mrs.with_mem_allowed(
                req.stag,
                pd,
                req.to,
                req.length as usize,
                mem::ACCESS_VERIFY,
                allowed,
                |_| (),
            )
            .map_err(|e| protection_failed(e, dhdr, "RDMA Verify refused"))?;
            if req.hash.len() > tx::VERIFY_MAX_HASH {
                return Err(operation_failed(
                    dhdr,
                    "Verify hash longer than any xiw computes",
                ));
            }
            let mut expected = [0u8; tx::VERIFY_MAX_HASH];
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
            let pkt = commit::AtomicWriteRequestPacket::new_checked(payload)
                .map_err(|_| short(dhdr, "short Atomic Write Request"))?;
            let req = commit::AtomicWriteRequestRepr::parse(&pkt)
                .map_err(|_| short(dhdr, "bad Atomic Write Request"))?;
            // 64 bits at 64-bit alignment, or nothing at all (section 3.1.3.1).
            if req.length != commit::ATOMIC_WRITE_DATA_LEN {
                return Err(operation_failed(dhdr, "Atomic Write length is not 8"));
            }
            if !aligned(req.stag, req.to, IBV_ACCESS_REMOTE_WRITE)? {
                return Err(operation_failed(
                    dhdr,
                    "Atomic Write target not 64-bit aligned",
                ));
            }
            Inbound::AtomicWrite {
                stag: req.stag,
                to: req.to,
                value: u64::from_be_bytes(req.data),
                allowed: rx.access,
                dhdr: d,
            }
        }
    };
    queue_inbound(qp, rx, entry, dhdr)
}

/// Queues a queue 1 request behind the earlier ones, within IRD (RFC 6581:
/// a peer that exceeds the IRD it was given has no untagged buffer for it).
fn queue_inbound(qp: &Qp, rx: &mut Rx, entry: Inbound, dhdr: &[u8]) -> Result<(), Fail> {
    let mut tx = qp.lock_tx();
    if tx.irq.len() as u32 >= tx.ird_max {
        drop(tx);
        return Err(terminate(
            term::LAYER_DDP,
            term::DDP_ETYPE_UNTAGGED_BUFFER,
            term::DDP_ECODE_U_INVALID_MSN_NO_BUFFER,
            Some(dhdr),
            None,
            "more outstanding queue 1 requests than IRD",
        ));
    }
    tx.irq.push_back(entry);
    drop(tx);
    rx.want_kick = true;
    Ok(())
}

/// An Atomic, Flush, Verify or Atomic Write Response: answers the oldest
/// outstanding request, which must be of the same kind (RFC 7306 section 5.4
/// rule 8: responses come back in request order).
fn response(
    qp: &Qp,
    rx: &mut Rx,
    op: rdmap::Opcode,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    let front = qp.lock_tx().orq.front().cloned();
    let (idx, len) = match (op, front) {
        (
            rdmap::Opcode::AtomicResponse,
            Some(Outstanding::Atomic {
                sq_idx,
                request_id,
                result,
            }),
        ) => {
            let pkt = atomic::ResponsePacket::new_checked(payload)
                .map_err(|_| short(dhdr, "short Atomic Response"))?;
            let resp = atomic::AtomicResponseRepr::parse(&pkt)
                .map_err(|_| short(dhdr, "bad Atomic Response"))?;
            if resp.request_id != request_id {
                return Err(unexpected(dhdr));
            }
            if scatter(qp, &result, 0, &resp.original_value.to_ne_bytes()).is_err() {
                return Err(Fail::local(
                    IBV_WC_LOC_PROT_ERR,
                    "atomic result buffer with a bad lkey",
                ));
            }
            (sq_idx, None)
        }
        (rdmap::Opcode::FlushResponse, Some(Outstanding::Flush { sq_idx }))
        | (rdmap::Opcode::AtomicWriteResponse, Some(Outstanding::AtomicWrite { sq_idx })) => {
            (sq_idx, None)
        }
        (rdmap::Opcode::VerifyResponse, Some(Outstanding::Verify { sq_idx, result })) => {
            let room: u64 = result.iter().map(|s| s.length as u64).sum();
            if room < payload.len() as u64 {
                return Err(Fail::local(
                    IBV_WC_LOC_LEN_ERR,
                    "verify result buffer shorter than the hash",
                ));
            }
            if scatter(qp, &result, 0, payload).is_err() {
                return Err(Fail::local(
                    IBV_WC_LOC_PROT_ERR,
                    "verify result buffer with a bad lkey",
                ));
            }
            (sq_idx, Some(payload.len() as u32))
        }
        _ => return Err(unexpected(dhdr)),
    };
    let mut tx = qp.lock_tx();
    tx.orq.pop_front();
    match len {
        Some(n) => tx.response_done(qp, idx, n),
        None => tx.read_done(qp, idx, IBV_WC_SUCCESS),
    }
    drop(tx);
    rx.want_kick = true;
    Ok(())
}

/// The requested operation could not be carried out (misaligned atomic, failed
/// flush, hash mismatch, ...): RDMAP Remote Operation Error, "Catastrophic
/// Error, Localized to RDMAP Stream", as RFC 7306 section 8.2 asks for a
/// misaligned atomic; the Terminated RDMA Header is left out (section 8.1).
pub fn operation_failed(dhdr: &[u8], why: &str) -> Fail {
    terminate(
        term::LAYER_RDMAP,
        term::RDMAP_ETYPE_REMOTE_OPERATION,
        term::RDMAP_ECODE_CATASTROPHIC_STREAM,
        Some(dhdr),
        None,
        why,
    )
}

/// A queue 1 request failed its STag check: RDMAP Remote Protection Error,
/// without the Terminated RDMA Header (RFC 7306 section 8.1).
pub fn protection_failed(e: AccessError, dhdr: &[u8], why: &str) -> Fail {
    rdmap_protection(e, dhdr, None, &format!("{why}: {e}"))
}

fn unexpected(dhdr: &[u8]) -> Fail {
    terminate(
        term::LAYER_RDMAP,
        term::RDMAP_ETYPE_REMOTE_OPERATION,
        term::RDMAP_ECODE_UNEXPECTED_OPCODE,
        Some(dhdr),
        None,
        "unexpected opcode",
    )
}

/// A tagged buffer refused an RDMA Write: its faults are DDP errors (RFC 5041
/// section 7.2), a permission fault an RDMAP remote protection error (RFC 5040
/// section 7.2).
fn access_fail(e: AccessError, dhdr: &[u8], why: &str) -> Fail {
    let c = e.placement_cause();
    let mut f = terminate(c.layer, c.etype, c.ecode, Some(dhdr), None, why);
    f.event = IBV_EVENT_QP_ACCESS_ERR;
    f
}

/// RDMAP Remote Protection Error for `e` (RFC 5040 section 7.2).
fn rdmap_protection(e: AccessError, dhdr: &[u8], rhdr: Option<&[u8]>, why: &str) -> Fail {
    let c = e.request_cause();
    let mut f = terminate(c.layer, c.etype, c.ecode, Some(dhdr), rhdr, why);
    f.event = IBV_EVENT_QP_ACCESS_ERR;
    f
}

/// A Terminate for the peer with the offending headers copied in.
fn terminate(
    layer: u8,
    etype: u8,
    ecode: u8,
    dhdr: Option<&[u8]>,
    rhdr: Option<&[u8]>,
    why: &str,
) -> Fail {
    let repr = term::TerminateRepr {
        layer,
        etype,
        ecode,
        hdrct_m: false,
        hdrct_d: dhdr.is_some(),
        hdrct_r: rhdr.is_some(),
        ddp_segment_len: None,
        ddp_header: dhdr.unwrap_or(&[]),
        rdmap_header: rhdr.unwrap_or(&[]),
    };
    let mut body = vec![0u8; repr.buffer_len()];
    repr.emit(&mut term::Packet::new_unchecked(&mut body[..]));
    Fail {
        why: why.into(),
        term: Some(body),
        sq_status: None,
        rq_status: None,
        event: IBV_EVENT_QP_FATAL,
        linger: false,
    }
}
