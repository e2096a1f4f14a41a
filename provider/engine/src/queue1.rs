//! Queue 1 (RFC 5040 section 5.3, RFC 7306 section 5.4, draft-talpey-rdma-commit
//! section 4): the requests a peer sends on DDP queue 1 and this side answers in
//! order, and the requests this side sent and waits on, oldest first.

use crate::fault::{AccessFault, Fail};
use crate::wire::{atomic, ddp, rdmap};

/// Access rights, with the values the verbs give them (`IBV_ACCESS_*`), plus
/// the persistence rights of the commit draft.
pub mod access {
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 1 << 1;
    pub const REMOTE_READ: u32 = 1 << 2;
    pub const REMOTE_ATOMIC: u32 = 1 << 3;
    /// The peer may flush to global visibility (rdma-core 45+ `IBV_ACCESS_FLUSH_GLOBAL`).
    pub const FLUSH_GLOBAL: u32 = 1 << 8;
    /// The peer may flush to persistence (rdma-core 45+ `IBV_ACCESS_FLUSH_PERSISTENT`).
    pub const FLUSH_PERSISTENT: u32 = 1 << 9;
    /// The MR keeps a Verify hash (xiw's own; never an application flag).
    pub const VERIFY: u32 = 1 << 19;
    /// Rights that live on the MR alone: the QP's flags do not gate them.
    pub const MR_ONLY: u32 = FLUSH_GLOBAL | FLUSH_PERSISTENT | VERIFY;
}

/// Largest Verify hash xiw produces or accepts (SHA-256).
pub const VERIFY_MAX_HASH: usize = 32;

/// The MR rights an RDMA Flush with `flags` needs.
pub fn flush_need(flags: u32) -> u32 {
    use crate::wire::commit;
    let mut need = 0;
    if flags & commit::FLUSH_PERSISTENCE != 0 {
        need |= access::FLUSH_PERSISTENT;
    }
    if flags & commit::FLUSH_GLOBAL_VISIBILITY != 0 {
        need |= access::FLUSH_GLOBAL;
    }
    need
}

/// An RDMA Read Request accepted from the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadResp {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub src_stag: u32,
    pub src_to: u64,
    pub len: u32,
}

/// A queue 1 request from the peer, checked and waiting for its turn. Each is
/// carried out when its turn to be answered comes, so a Read answered before an
/// Atomic never sees that Atomic's result, and an Atomic Write is placed only
/// after every earlier Flush has finished.
#[derive(Clone, Copy, Debug)]
pub enum Inbound {
    Read(ReadResp),
    Atomic {
        req: atomic::AtomicRequestRepr,
        allowed: u32,
        dhdr: [u8; ddp::UNTAGGED_HDR_LEN],
    },
    Flush {
        stag: u32,
        to: u64,
        len: u32,
        flags: u32,
        allowed: u32,
        dhdr: [u8; ddp::UNTAGGED_HDR_LEN],
    },
    Verify {
        stag: u32,
        to: u64,
        len: u32,
        expected: [u8; VERIFY_MAX_HASH],
        expected_len: u8,
        allowed: u32,
        dhdr: [u8; ddp::UNTAGGED_HDR_LEN],
    },
    AtomicWrite {
        stag: u32,
        to: u64,
        value: u64,
        allowed: u32,
        dhdr: [u8; ddp::UNTAGGED_HDR_LEN],
    },
}

impl Inbound {
    /// The DDP header of the request, for a Terminate about it.
    pub fn ddp_header(&self) -> &[u8] {
        match self {
            Inbound::Read(_) => &[],
            Inbound::Atomic { dhdr, .. }
            | Inbound::Flush { dhdr, .. }
            | Inbound::Verify { dhdr, .. }
            | Inbound::AtomicWrite { dhdr, .. } => dhdr,
        }
    }
}

/// What carrying out a queue 1 request did to memory: the driver's part of
/// the answer, which [`answer`] turns into the response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// An atomic ran (a compare that failed included): the value the target
    /// held before it.
    Atomic { original: u64 },
    /// A Flush: the range has reached the placement it asked for.
    Flushed,
    /// A Verify: the hash of the range, as the MR's algorithm computes it.
    Hashed { hash: Vec<u8> },
    /// An Atomic Write stored its value.
    Stored,
}

/// Why the driver could not carry out a queue 1 request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The STag, bounds or rights check failed when the request was carried
    /// out (the memory changed since the request came).
    Access(AccessFault),
    /// The operation itself failed (a target that is not aligned, a medium
    /// that failed); the reason.
    Failed(String),
    /// The driver failed while carrying it out (its worker panicked): the QP
    /// fails, and the peer is told nothing.
    Broken(String),
}

impl From<AccessFault> for Refused {
    fn from(e: AccessFault) -> Refused {
        Refused::Access(e)
    }
}

/// What became of a queue 1 request the driver carried out.
pub type Outcome = Result<Effect, Refused>;

/// A response to a request of the peer, sent on queue 3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub opcode: rdmap::Opcode,
    pub body: Vec<u8>,
}

/// The response to `req` once the driver carried it out, or the failure
/// that ends in a Terminate naming the request (RFC 7306 section 8,
/// draft-talpey-rdma-commit section 5): a refused access is a remote
/// protection error, a failed operation a remote operation error, both
/// with the request's DDP header copied. A Verify whose hash differs from
/// the one the request gives is not answered: it ends in the Terminate
/// (draft-talpey-rdma-commit sections 3.1.2.1 and 3.1.2.2).
pub fn answer(req: &Inbound, outcome: Outcome) -> Result<Response, Fail> {
    let dhdr = req.ddp_header();
    let effect = match outcome {
        Ok(effect) => effect,
        Err(Refused::Access(e)) => return Err(Fail::protection(e, dhdr, None, "request refused")),
        Err(Refused::Failed(why)) => return Err(Fail::operation_failed(dhdr, &why)),
        Err(Refused::Broken(why)) => return Err(Fail::stream(why)),
    };
    let (opcode, body) = match (req, effect) {
        (Inbound::Atomic { req, .. }, Effect::Atomic { original }) => {
            let resp = atomic::AtomicResponseRepr {
                request_id: req.request_id,
                original_value: original,
            };
            let mut b = vec![0u8; resp.buffer_len()];
            resp.emit(&mut atomic::ResponsePacket::new_unchecked(&mut b[..]));
            (rdmap::Opcode::AtomicResponse, b)
        }
        (Inbound::Flush { .. }, Effect::Flushed) => (rdmap::Opcode::FlushResponse, Vec::new()),
        (
            Inbound::Verify {
                expected,
                expected_len,
                ..
            },
            Effect::Hashed { hash },
        ) => {
            let expected = &expected[..*expected_len as usize];
            if !expected.is_empty() && expected != &hash[..] {
                return Err(Fail::operation_failed(dhdr, "RDMA Verify: hash mismatch"));
            }
            (rdmap::Opcode::VerifyResponse, hash)
        }
        (Inbound::AtomicWrite { .. }, Effect::Stored) => {
            (rdmap::Opcode::AtomicWriteResponse, Vec::new())
        }
        _ => {
            return Err(Fail::operation_failed(
                dhdr,
                "the driver carried out another operation than the request",
            ))
        }
    };
    Ok(Response { opcode, body })
}

/// An RDMA Read this side issued, waiting for its data. `L` is the driver's
/// local buffer list (the sink).
#[derive(Clone, Debug)]
pub struct PendingRead<L> {
    pub sq_idx: u32,
    pub sink_stag: u32,
    pub sink_to: u64,
    pub sink: L,
    pub length: u64,
    pub received: u64,
}

/// A queue 1 request this side issued, waiting for its response; responses come
/// back in the order the requests went (RFC 7306 section 5.4 rule 8).
#[derive(Clone, Debug)]
pub enum Outstanding<L> {
    Read(PendingRead<L>),
    Atomic {
        sq_idx: u32,
        request_id: u32,
        result: L,
    },
    Flush {
        sq_idx: u32,
    },
    Verify {
        sq_idx: u32,
        result: L,
    },
    AtomicWrite {
        sq_idx: u32,
    },
}

impl<L> Outstanding<L> {
    /// The send queue index of the work request.
    pub fn sq_idx(&self) -> u32 {
        match self {
            Outstanding::Read(r) => r.sq_idx,
            Outstanding::Atomic { sq_idx, .. }
            | Outstanding::Flush { sq_idx }
            | Outstanding::Verify { sq_idx, .. }
            | Outstanding::AtomicWrite { sq_idx } => *sq_idx,
        }
    }
}

/// The untagged queue an opcode travels on, for the queue 1 requests and the
/// queue 3 responses (RFC 5040 section 4.3, RFC 7306 section 5.2,
/// draft-talpey-rdma-commit table 1).
pub fn queue_of(op: rdmap::Opcode) -> Option<u32> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::Event;

    fn flush() -> Inbound {
        Inbound::Flush {
            stag: 1,
            to: 0,
            len: 8,
            flags: 0,
            allowed: 0,
            dhdr: [7; ddp::UNTAGGED_HDR_LEN],
        }
    }

    #[test]
    fn a_driver_that_broke_fails_the_stream_and_tells_the_peer_nothing() {
        let f = answer(&flush(), Err(Refused::Broken("worker panicked".into()))).unwrap_err();
        assert!(f.term.is_none());
        assert_eq!(f.event, Event::QpFatal);
        assert_eq!(f.why, "worker panicked");
    }

    #[test]
    fn an_effect_of_another_kind_is_an_operation_error() {
        let f = answer(&flush(), Ok(Effect::Stored)).unwrap_err();
        let want = Fail::operation_failed(flush().ddp_header(), "");
        assert_eq!(f.term, want.term);
        assert_eq!(f.event, Event::QpFatal);
    }
}
