//! The requests on queue 1 (RDMA Read Request, RFC 5040 section 5.2.1;
//! Atomic Request, RFC 7306 section 5.2; Flush, Verify and Atomic Write
//! Request, draft-talpey-rdma-commit section 3.1): each checked now, against
//! the STag table and the rules of RFC 5040 section 7, RFC 7306 section 8.2
//! and the commit draft's section 5.2, then queued behind the earlier ones to
//! be answered in order.

use super::{errors, Host, Receiver};
use crate::fault::Fail;
use crate::queue1::{access, flush_need, Inbound, ReadResp, VERIFY_MAX_HASH};
use crate::wire::{atomic, commit, ddp, rdmap};

/// The QP's rights a request is checked with: Flush and Verify rights live
/// on the MR only; the QP's flags gate the rest.
fn with_mr_only(qp_access: u32) -> u32 {
    qp_access | access::MR_ONLY
}

/// The DDP header of a request, kept with it for a Terminate about it.
fn header(dhdr: &[u8]) -> [u8; ddp::UNTAGGED_HDR_LEN] {
    let mut d = [0u8; ddp::UNTAGGED_HDR_LEN];
    d.copy_from_slice(&dhdr[..ddp::UNTAGGED_HDR_LEN]);
    d
}

impl<R> Receiver<R> {
    /// A request on queue 1 (`op` is one that travels there), checked, then
    /// queued.
    pub(super) fn request<H: Host>(
        &mut self,
        host: &mut H,
        op: rdmap::Opcode,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Fail> {
        let qp_access = self.access;
        let entry = match op {
            rdmap::Opcode::ReadRequest => read_request(host, qp_access, payload, dhdr)?,
            rdmap::Opcode::AtomicRequest => atomic_request(host, qp_access, payload, dhdr)?,
            rdmap::Opcode::FlushRequest => flush_request(host, qp_access, payload, dhdr)?,
            rdmap::Opcode::VerifyRequest => verify_request(host, qp_access, payload, dhdr)?,
            // The only other request queue 1 carries.
            _ => atomic_write_request(host, qp_access, payload, dhdr)?,
        };
        // A peer that exceeds the IRD it was given has no untagged buffer for
        // the request (RFC 6581).
        if !host.queue_request(entry) {
            return Err(errors::beyond_ird(dhdr));
        }
        Ok(())
    }
}

/// An RDMA Read Request (RFC 5040 sections 5.2.1 and 7.2).
fn read_request<H: Host>(
    host: &mut H,
    qp_access: u32,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<Inbound, Fail> {
    errors::sized(
        payload,
        rdmap::READ_REQUEST_LEN,
        dhdr,
        "Read Request of another length",
    )?;
    let req = rdmap::ReadRequestRepr::parse(&rdmap::ReadRequestPacket::new_unchecked(payload))
        .map_err(|_| errors::malformed(dhdr, "short Read Request"))?;
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
    Ok(Inbound::Read(ReadResp {
        sink_stag: req.sink_stag,
        sink_to: req.sink_to,
        src_stag: req.src_stag,
        src_to: req.src_to,
        len: req.size,
    }))
}

/// An Atomic Request (RFC 7306 sections 5.2 and 8.2).
fn atomic_request<H: Host>(
    host: &mut H,
    qp_access: u32,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<Inbound, Fail> {
    errors::sized(
        payload,
        atomic::REQUEST_LEN,
        dhdr,
        "Atomic Request of another length",
    )?;
    let req = atomic::AtomicRequestRepr::parse(&atomic::RequestPacket::new_unchecked(payload))
        .map_err(|_| errors::malformed(dhdr, "short Atomic Request"))?;
    if req.op().is_none() {
        // An AOpCode xiw does not implement (section 5.2.1 rule 4).
        return Err(errors::unsupported_atomic(dhdr));
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
    Ok(Inbound::Atomic {
        req,
        allowed: qp_access,
        dhdr: header(dhdr),
    })
}

/// An RDMA Flush Request (draft-talpey-rdma-commit section 3.1.1).
fn flush_request<H: Host>(
    host: &mut H,
    qp_access: u32,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<Inbound, Fail> {
    errors::sized(
        payload,
        commit::FLUSH_REQUEST_LEN,
        dhdr,
        "Flush Request of another length",
    )?;
    let req = commit::FlushRequestRepr::parse(&commit::FlushRequestPacket::new_unchecked(payload))
        .map_err(|_| errors::malformed(dhdr, "short Flush Request"))?;
    let flags = req.flags & commit::FLUSH_KNOWN_FLAGS;
    let allowed = with_mr_only(qp_access);
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
    Ok(Inbound::Flush {
        stag: req.stag,
        to: req.to,
        len: req.length,
        flags,
        allowed,
        dhdr: header(dhdr),
    })
}

/// An RDMA Verify Request (draft-talpey-rdma-commit section 3.1.2).
fn verify_request<H: Host>(
    host: &mut H,
    qp_access: u32,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<Inbound, Fail> {
    let req =
        commit::VerifyRequestRepr::parse(&commit::VerifyRequestPacket::new_unchecked(payload))
            .map_err(|_| errors::malformed(dhdr, "short Verify Request"))?;
    let allowed = with_mr_only(qp_access);
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
    Ok(Inbound::Verify {
        stag: req.stag,
        to: req.to,
        len: req.length,
        expected,
        expected_len: req.hash.len() as u8,
        allowed,
        dhdr: header(dhdr),
    })
}

/// An Atomic Write Request (draft-talpey-rdma-commit section 3.1.3).
fn atomic_write_request<H: Host>(
    host: &mut H,
    qp_access: u32,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<Inbound, Fail> {
    errors::sized(
        payload,
        commit::ATOMIC_WRITE_REQUEST_LEN,
        dhdr,
        "Atomic Write Request of another length",
    )?;
    let req = commit::AtomicWriteRequestRepr::parse(
        &commit::AtomicWriteRequestPacket::new_unchecked(payload),
    )
    .map_err(|_| errors::malformed(dhdr, "short Atomic Write Request"))?;
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
    Ok(Inbound::AtomicWrite {
        stag: req.stag,
        to: req.to,
        value: u64::from_be_bytes(req.data),
        allowed: qp_access,
        dhdr: header(dhdr),
    })
}
