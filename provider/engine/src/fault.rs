//! What a fault means on the wire and to the application: the Terminate this
//! side sends when it refuses a tagged access (RFC 5041 section 7.2, RFC 5040
//! section 7.2), and what a Terminate from the peer means for the oldest
//! request still outstanding, in the engine's own status and event types (the
//! verbs edge maps them to `ibv_wc_status` and `ibv_event_type`).

use crate::wire::terminate::{self as term, Cause, TerminateRepr};

/// Why an access to registered memory was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessFault {
    #[error("invalid STag")]
    InvalidStag,
    #[error("STag belongs to another protection domain")]
    WrongPd,
    #[error("access rights violation")]
    Access,
    #[error("base or bounds violation")]
    Bounds,
    #[error("tagged offset wraps")]
    Wrap,
}

impl AccessFault {
    /// The Terminate for data that cannot be placed (an RDMA Write or Read
    /// Response): a DDP tagged buffer error, except that a rights violation
    /// is an RDMAP protection error (DDP has no code for it).
    pub fn placement_cause(self) -> Cause {
        match self {
            AccessFault::InvalidStag => Cause::DDP_T_INVALID_STAG,
            AccessFault::Bounds => Cause::DDP_T_BASE_BOUNDS,
            AccessFault::WrongPd => Cause::DDP_T_STAG_NOT_ASSOCIATED,
            AccessFault::Wrap => Cause::DDP_T_TO_WRAP,
            AccessFault::Access => Cause::RDMAP_PROT_ACCESS_RIGHTS,
        }
    }

    /// The Terminate for a request that is refused (RDMA Read Request, atomic,
    /// Flush, Verify, Atomic Write): an RDMAP remote protection error.
    pub fn request_cause(self) -> Cause {
        match self {
            AccessFault::InvalidStag => Cause::RDMAP_PROT_INVALID_STAG,
            AccessFault::Bounds => Cause::RDMAP_PROT_BASE_BOUNDS,
            AccessFault::Access => Cause::RDMAP_PROT_ACCESS_RIGHTS,
            AccessFault::WrongPd => Cause::RDMAP_PROT_STAG_NOT_ASSOCIATED,
            AccessFault::Wrap => Cause::RDMAP_PROT_TO_WRAP,
        }
    }
}

/// How a work request ended, when it did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// A local buffer was too short for what arrived.
    LocalLength,
    /// A local buffer's key or rights did not allow the access.
    LocalProtection,
    /// The request cannot be carried out on this QP.
    LocalQpOperation,
    /// The QP failed before the request could run.
    Flushed,
    /// A memory window or local invalidation failed.
    MemoryBind,
    /// The peer refused an access to its memory.
    RemoteAccess,
    /// The peer cannot carry out the request at all (an opcode it lacks, a
    /// message longer than its buffer).
    RemoteInvalidRequest,
    /// The peer failed while carrying it out.
    RemoteOperation,
    /// The peer had no receive buffer for a Send.
    ReceiverNotReady,
    /// The peer stopped acknowledging what was sent for longer than the
    /// stream allows: the transport's retries ran out.
    RetryExceeded,
}

/// The asynchronous event that tells the application its QP failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    QpFatal,
    QpAccessError,
}

/// What went wrong on a QP's stream, and what to tell the peer and the
/// application: the QP goes to the error state.
#[derive(Debug)]
pub struct Fail {
    pub why: String,
    /// The Terminate message body for the peer, if the stream is still usable.
    pub term: Option<Vec<u8>>,
    /// The status of the oldest outstanding send work request.
    pub sq_status: Option<Status>,
    /// The status of the receive in progress.
    pub rq_status: Option<Status>,
    pub event: Event,
    /// The peer closed its end in order: fail after a short linger, so the
    /// application can reap what the peer sent before its flush errors.
    pub linger: bool,
}

impl Fail {
    /// The stream broke (or the peer terminated): nothing to tell the peer.
    pub fn stream(why: impl Into<String>) -> Fail {
        Fail {
            why: why.into(),
            term: None,
            sq_status: None,
            rq_status: None,
            event: Event::QpFatal,
            linger: false,
        }
    }

    /// The stream gave up on a peer that stopped acknowledging: the oldest
    /// outstanding request fails with [`Status::RetryExceeded`], the rest
    /// are flushed.
    pub fn timed_out(why: impl Into<String>) -> Fail {
        Fail {
            sq_status: Some(Status::RetryExceeded),
            ..Fail::stream(why)
        }
    }

    /// A Terminate for the peer with the offending headers copied in (RFC
    /// 5040 section 4.8): the DDP header, and the RDMAP header of a Read
    /// Request.
    pub fn terminate(cause: Cause, dhdr: Option<&[u8]>, rhdr: Option<&[u8]>, why: &str) -> Fail {
        let repr = TerminateRepr {
            layer: cause.layer,
            etype: cause.etype,
            ecode: cause.ecode,
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
            term: Some(body),
            ..Fail::stream(why)
        }
    }

    /// A fault of this side's own work (a bad lkey, say): the peer is told with
    /// a Terminate sent instead of the message, carrying no headers (RFC 5040
    /// section 7.1, RFC 7306 section 8.1, draft-talpey-rdma-commit section 5.1).
    pub fn local(status: Status, why: &str) -> Fail {
        Fail {
            sq_status: Some(status),
            ..Fail::terminate(Cause::RDMAP_LOCAL_CATASTROPHIC, None, None, why)
        }
    }

    /// The requested operation could not be carried out (misaligned atomic,
    /// failed flush, hash mismatch, ...): RDMAP Remote Operation Error,
    /// "Catastrophic Error, Localized to RDMAP Stream", as RFC 7306 section 8.2
    /// asks for a misaligned atomic; no Terminated RDMA Header (section 8.1).
    pub fn operation_failed(dhdr: &[u8], why: &str) -> Fail {
        Fail::terminate(Cause::RDMAP_OP_CATASTROPHIC_STREAM, Some(dhdr), None, why)
    }

    /// A request refused by its STag check: RDMAP Remote Protection Error
    /// (RFC 5040 section 7.2); `rhdr` is the Read Request's RDMAP header, left
    /// out for the RFC 7306 and commit-draft requests (RFC 7306 section 8.1).
    pub fn protection(e: AccessFault, dhdr: &[u8], rhdr: Option<&[u8]>, why: &str) -> Fail {
        Fail {
            event: Event::QpAccessError,
            ..Fail::terminate(e.request_cause(), Some(dhdr), rhdr, &format!("{why}: {e}"))
        }
    }

    /// Data that cannot be placed in a tagged buffer (RFC 5041 section 7.2).
    pub fn placement(e: AccessFault, dhdr: &[u8], why: &str) -> Fail {
        Fail {
            event: Event::QpAccessError,
            ..Fail::terminate(
                e.placement_cause(),
                Some(dhdr),
                None,
                &format!("{why}: {e}"),
            )
        }
    }
}

/// What the peer's Terminate (its body, as received) means for the oldest
/// outstanding request, and the event to raise. A body that does not parse
/// is a remote operation error.
pub fn peer_terminate(body: &[u8]) -> (Status, Event) {
    let status = match TerminateRepr::parse_bytes(body) {
        Ok(t) => match (t.layer, t.etype, t.ecode) {
            (term::LAYER_RDMAP, term::RDMAP_ETYPE_REMOTE_PROTECTION, _) => Status::RemoteAccess,
            // A peer without the operation (RFC 7306 section 3.1.4 discovery).
            (
                term::LAYER_RDMAP,
                term::RDMAP_ETYPE_REMOTE_OPERATION,
                term::RDMAP_ECODE_UNEXPECTED_OPCODE,
            ) => Status::RemoteInvalidRequest,
            (term::LAYER_DDP, term::DDP_ETYPE_TAGGED_BUFFER, _) => Status::RemoteAccess,
            (term::LAYER_DDP, term::DDP_ETYPE_UNTAGGED_BUFFER, term::DDP_ECODE_U_MSG_TOO_LONG) => {
                Status::RemoteInvalidRequest
            }
            (
                term::LAYER_DDP,
                term::DDP_ETYPE_UNTAGGED_BUFFER,
                term::DDP_ECODE_U_INVALID_MSN_NO_BUFFER,
            ) => Status::ReceiverNotReady,
            _ => Status::RemoteOperation,
        },
        Err(_) => Status::RemoteOperation,
    };
    let event = if status == Status::RemoteAccess {
        Event::QpAccessError
    } else {
        Event::QpFatal
    };
    (status, event)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(c: Cause) -> Vec<u8> {
        let t = TerminateRepr {
            layer: c.layer,
            etype: c.etype,
            ecode: c.ecode,
            hdrct_m: false,
            hdrct_d: false,
            hdrct_r: false,
            ddp_segment_len: None,
            ddp_header: &[],
            rdmap_header: &[],
        };
        let mut b = vec![0u8; t.buffer_len()];
        t.emit(&mut term::Packet::new_unchecked(&mut b[..]));
        b
    }

    #[test]
    fn access_faults_name_the_rfc_codes() {
        let all = [
            AccessFault::InvalidStag,
            AccessFault::WrongPd,
            AccessFault::Access,
            AccessFault::Bounds,
            AccessFault::Wrap,
        ];
        for f in all {
            let (p, r) = (f.placement_cause(), f.request_cause());
            assert!(p.is_defined() && r.is_defined(), "{f:?}");
            assert_eq!(r.layer, term::LAYER_RDMAP);
            assert_eq!(r.etype, term::RDMAP_ETYPE_REMOTE_PROTECTION);
        }
        assert_eq!(
            AccessFault::Bounds.placement_cause(),
            Cause::DDP_T_BASE_BOUNDS
        );
        assert_eq!(
            AccessFault::Access.placement_cause(),
            Cause::RDMAP_PROT_ACCESS_RIGHTS
        );
        assert_eq!(
            AccessFault::InvalidStag.request_cause(),
            Cause::RDMAP_PROT_INVALID_STAG
        );
    }

    #[test]
    fn a_peer_terminate_names_the_status() {
        let cases = [
            (Cause::RDMAP_PROT_ACCESS_RIGHTS, Status::RemoteAccess),
            (Cause::DDP_T_INVALID_STAG, Status::RemoteAccess),
            (
                Cause::RDMAP_OP_UNEXPECTED_OPCODE,
                Status::RemoteInvalidRequest,
            ),
            (Cause::DDP_U_MSG_TOO_LONG, Status::RemoteInvalidRequest),
            (Cause::DDP_U_INVALID_MSN_NO_BUFFER, Status::ReceiverNotReady),
            (Cause::RDMAP_OP_CATASTROPHIC_STREAM, Status::RemoteOperation),
            (Cause::MPA_CRC, Status::RemoteOperation),
        ];
        for (cause, status) in cases {
            let (s, e) = peer_terminate(&body(cause));
            assert_eq!(s, status, "{cause:?}");
            let access = status == Status::RemoteAccess;
            assert_eq!(e == Event::QpAccessError, access, "{cause:?}");
        }
        assert_eq!(peer_terminate(&[1, 2]).0, Status::RemoteOperation);
    }
}
