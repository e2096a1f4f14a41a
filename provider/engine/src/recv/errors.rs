//! The receive side's failures, each with the Terminate it sends (RFC 5040
//! section 7 and figure 9, RFC 5041 section 7.2, RFC 5044, RFC 6581) and the
//! status of the receive it hit, if any. `dhdr` is always the whole DDP
//! header of the offending segment as it came (14 octets tagged, 18
//! untagged), copied into the Terminate.

use crate::fault::{AccessFault, Fail, Status};
use crate::wire::ddp;
use crate::wire::terminate::Cause;

/// The FPDU's CRC does not match (RFC 5044 section 8).
#[cold]
pub(super) fn crc_error() -> Fail {
    Fail::terminate(Cause::MPA_CRC, None, None, "MPA CRC error")
}

/// A segment of another DDP version, told tagged or untagged by its T bit
/// (RFC 5041 section 7.2).
#[cold]
pub(super) fn bad_ddp_version(ulpdu: &[u8]) -> Fail {
    let tagged = ddp::is_tagged(ulpdu) == Some(true);
    let hlen = if tagged {
        ddp::TAGGED_HDR_LEN
    } else {
        ddp::UNTAGGED_HDR_LEN
    };
    // The header alone is copied, never payload.
    let dhdr = &ulpdu[..hlen.min(ulpdu.len())];
    Fail::terminate(
        Cause::ddp_bad_version(tagged),
        Some(dhdr),
        None,
        "bad DDP version",
    )
}

/// A segment shorter than its DDP header.
#[cold]
pub(super) fn short_segment() -> Fail {
    Fail::terminate(
        Cause::DDP_LOCAL_CATASTROPHIC,
        None,
        None,
        "short DDP segment",
    )
}

/// A message of another RDMAP version.
#[cold]
pub(super) fn bad_rdmap_version(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::RDMAP_OP_INVALID_VERSION,
        Some(dhdr),
        None,
        "bad RDMAP version",
    )
}

/// The first FPDU is not the zero-length Send agreed as ready-to-receive
/// message (RFC 6581 section 6).
#[cold]
pub(super) fn not_the_agreed_rtr() -> Fail {
    Fail::terminate(
        Cause::MPA_NO_MATCHING_RTR,
        None,
        None,
        "the first FPDU is not the zero-length Send agreed as ready-to-receive message",
    )
}

/// An opcode this side does not expect here: undefined, on a segment of
/// the other buffer model, on another queue, or a response to no request
/// of its kind.
#[cold]
pub(super) fn unexpected(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::RDMAP_OP_UNEXPECTED_OPCODE,
        Some(dhdr),
        None,
        "unexpected opcode",
    )
}

/// An untagged segment on a queue RDMAP does not use.
#[cold]
pub(super) fn invalid_queue(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_U_INVALID_QN,
        Some(dhdr),
        None,
        "invalid queue number",
    )
}

/// An untagged segment with an MSN its queue does not expect next.
#[cold]
pub(super) fn msn_out_of_range(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_U_INVALID_MSN_RANGE,
        Some(dhdr),
        None,
        "MSN out of range",
    )
}

/// The first segment of a message does not start at offset 0.
#[cold]
pub(super) fn first_mo(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_U_INVALID_MO,
        Some(dhdr),
        None,
        "first segment with non-zero MO",
    )
}

/// A later segment of a message does not continue where the last ended.
#[cold]
pub(super) fn mo_out_of_order(dhdr: &[u8]) -> Fail {
    Fail::terminate(Cause::DDP_U_INVALID_MO, Some(dhdr), None, "MO out of order")
}

/// A Send found no receive posted.
#[cold]
pub(super) fn no_receive(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_U_INVALID_MSN_NO_BUFFER,
        Some(dhdr),
        None,
        "Send with no receive posted",
    )
}

/// Immediate Data that completes a receive of its own found none posted.
#[cold]
pub(super) fn no_receive_for_immediate(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_U_INVALID_MSN_NO_BUFFER,
        Some(dhdr),
        None,
        "Immediate Data with no receive posted",
    )
}

/// A Send is longer than its receive.
#[cold]
pub(super) fn too_long(dhdr: &[u8]) -> Fail {
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
pub(super) fn bad_receive(dhdr: &[u8]) -> Fail {
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

/// A Send with Invalidate names an STag that cannot be invalidated (RFC
/// 5040 section 5.3); its receive fails with a remote access error.
#[cold]
pub(super) fn cannot_invalidate(dhdr: &[u8]) -> Fail {
    Fail {
        rq_status: Some(Status::RemoteAccess),
        ..Fail::terminate(
            Cause::RDMAP_PROT_STAG_CANNOT_INVALIDATE,
            Some(dhdr),
            None,
            "Send with Invalidate of an STag that cannot be invalidated",
        )
    }
}

/// An RDMA Write cannot be placed (`e`): a DDP tagged buffer error, or an
/// RDMAP protection error for missing rights (RFC 5041 section 7.2). Boxed,
/// for the handlers that return their failure boxed.
#[cold]
#[inline(never)]
pub(super) fn write_refused(e: AccessFault, dhdr: &[u8]) -> Box<Fail> {
    Box::new(Fail::placement(e, dhdr, "RDMA Write refused"))
}

/// A Read Response names a sink STag other than the Read's.
#[cold]
pub(super) fn unknown_sink(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_T_INVALID_STAG,
        Some(dhdr),
        None,
        "Read Response to an unknown sink STag",
    )
}

/// A Read Response does not fit the Read's sink where its data has reached.
#[cold]
pub(super) fn outside_sink(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_T_BASE_BOUNDS,
        Some(dhdr),
        None,
        "Read Response outside the sink buffer",
    )
}

/// The local buffer a Read's data lands in cannot be written.
#[cold]
pub(super) fn sink_lost() -> Fail {
    Fail::local(Status::LocalProtection, "read sink with a bad lkey")
}

/// The Read a response answers is gone: the QP was flushed meanwhile.
#[cold]
pub(super) fn read_flushed() -> Fail {
    Fail::stream("the Read was flushed while its data came")
}

/// The driver reported memory lost while no payload was being placed.
#[cold]
pub(super) fn nothing_placed() -> Fail {
    Fail::stream("no payload was being placed")
}

/// A queue 1 request or queue 3 response that does not have the layout of
/// its kind: a DDP local catastrophic error.
#[cold]
pub(super) fn malformed(dhdr: &[u8], what: &str) -> Fail {
    Fail::terminate(Cause::DDP_LOCAL_CATASTROPHIC, Some(dhdr), None, what)
}

/// A request or response of a fixed size carries exactly its fields,
/// nothing behind them.
pub(super) fn sized(payload: &[u8], len: usize, dhdr: &[u8], what: &str) -> Result<(), Fail> {
    if payload.len() != len {
        return Err(malformed(dhdr, what));
    }
    Ok(())
}

/// An Atomic Request with an AOpCode xiw does not implement (RFC 7306
/// section 5.2.1 rule 4).
#[cold]
pub(super) fn unsupported_atomic(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::RDMAP_OP_UNEXPECTED_OPCODE,
        Some(dhdr),
        None,
        "unsupported atomic operation code",
    )
}

/// A queue 1 request beyond the IRD the peer was given: no untagged buffer
/// for it (RFC 6581).
#[cold]
pub(super) fn beyond_ird(dhdr: &[u8]) -> Fail {
    Fail::terminate(
        Cause::DDP_U_INVALID_MSN_NO_BUFFER,
        Some(dhdr),
        None,
        "more outstanding queue 1 requests than IRD",
    )
}
