//! Queue 1 (RFC 5040 section 5.3, RFC 7306 section 5.4, draft-talpey-rdma-commit
//! section 4): the requests a peer sends on DDP queue 1 and this side answers in
//! order, and the requests this side sent and waits on, oldest first.

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
