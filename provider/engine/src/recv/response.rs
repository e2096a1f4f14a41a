//! The responses on queue 3 (Atomic Response, RFC 7306 section 5.3; Flush,
//! Verify and Atomic Write Response, draft-talpey-rdma-commit section 3.2):
//! each answers the oldest outstanding request, which must be of the same
//! kind (RFC 7306 section 5.4 rule 8: responses come back in request order).

use super::{errors, Host};
use crate::fault::{Fail, Status};
use crate::queue1::Outstanding;
use crate::wire::{atomic, rdmap};

/// A response on queue 3 (`op` is one that travels there): the oldest
/// request answered, completing with the byte count a Verify reports.
pub(super) fn response<H: Host>(
    host: &mut H,
    op: rdmap::Opcode,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    let len = match (op, host.oldest_outstanding()) {
        (
            rdmap::Opcode::AtomicResponse,
            Some(Outstanding::Atomic {
                request_id, result, ..
            }),
        ) => {
            atomic_response(host, request_id, &result, payload, dhdr)?;
            None
        }
        (rdmap::Opcode::FlushResponse, Some(Outstanding::Flush { .. }))
        | (rdmap::Opcode::AtomicWriteResponse, Some(Outstanding::AtomicWrite { .. })) => {
            // These answers carry no payload.
            if !payload.is_empty() {
                return Err(errors::malformed(
                    dhdr,
                    "a response without payload carries some",
                ));
            }
            None
        }
        (rdmap::Opcode::VerifyResponse, Some(Outstanding::Verify { result, .. })) => {
            Some(verify_response(host, &result, payload)?)
        }
        _ => return Err(errors::unexpected(dhdr)),
    };
    host.answered(len);
    Ok(())
}

/// An Atomic Response to request `request_id`: the original value into its
/// result buffer.
fn atomic_response<H: Host>(
    host: &mut H,
    request_id: u32,
    result: &H::Local,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    errors::sized(
        payload,
        atomic::RESPONSE_LEN,
        dhdr,
        "Atomic Response of another length",
    )?;
    let resp = atomic::AtomicResponseRepr::parse(&atomic::ResponsePacket::new_unchecked(payload))
        .map_err(|_| errors::malformed(dhdr, "short Atomic Response"))?;
    if resp.request_id != request_id {
        return Err(errors::unexpected(dhdr));
    }
    if host
        .scatter(result, 0, &resp.original_value.to_ne_bytes())
        .is_err()
    {
        return Err(Fail::local(
            Status::LocalProtection,
            "atomic result buffer with a bad lkey",
        ));
    }
    Ok(())
}

/// A Verify Response: the hash it carries into the result buffer, whose
/// length the Verify completes with.
fn verify_response<H: Host>(host: &mut H, result: &H::Local, payload: &[u8]) -> Result<u32, Fail> {
    if host.local_len(result) < payload.len() as u64 {
        return Err(Fail::local(
            Status::LocalLength,
            "verify result buffer shorter than the hash",
        ));
    }
    if host.scatter(result, 0, payload).is_err() {
        return Err(Fail::local(
            Status::LocalProtection,
            "verify result buffer with a bad lkey",
        ));
    }
    Ok(payload.len() as u32)
}
