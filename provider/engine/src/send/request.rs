//! The requests this side issues on queue 1 (RDMA Read Request, RFC 5040
//! section 5.2.1; Atomic Request, RFC 7306 section 5.2; Flush, Verify and
//! Atomic Write Request, draft-talpey-rdma-commit section 3.1): each encoded
//! by a function of its own, then framed on queue 1 and counted against ORD
//! until its answer comes.

use super::fpdu::{no_payload, untagged};
use super::{AtomicOp, Sender, WrOp};
use crate::fault::{Fail, Status};
use crate::queue1::{Outstanding, PendingRead, VERIFY_MAX_HASH};
use crate::wire::{atomic, commit, ddp, rdmap};

/// A request as it goes out: its opcode, its body, and what this side keeps
/// of it until the answer.
struct Request<L> {
    opcode: rdmap::Opcode,
    body: Vec<u8>,
    pending: Outstanding<L>,
}

impl<L: Clone + Default, P> Sender<L, P> {
    /// A Read, Atomic, Flush, Verify or Atomic Write Request on queue 1.
    pub(super) fn frame_request(&mut self, idx: u32, op: WrOp<L>, length: u32) -> Result<(), Fail> {
        if self.ord_max == 0 {
            // The connection agreed on ORD 0 (or the QP's max_rd_atomic is
            // 0): nothing of queue 1 may go (RFC 6581 section 7.1).
            return Err(Fail::local(
                Status::LocalQpOperation,
                "RDMA Read or atomic request with ORD 0",
            ));
        }
        let req = match op {
            WrOp::Read {
                stag,
                to,
                sink_stag,
                sink_to,
                sink,
            } => read(idx, stag, to, length, sink_stag, sink_to, sink),
            WrOp::Flush {
                stag,
                to,
                len,
                flags,
            } => flush(idx, stag, to, len, flags),
            WrOp::Verify {
                stag,
                to,
                len,
                hash,
                hash_len,
                result,
            } => verify(
                idx,
                stag,
                to,
                len,
                &hash[..(hash_len as usize).min(VERIFY_MAX_HASH)],
                result,
            ),
            WrOp::AtomicWrite { stag, to, value } => atomic_write(idx, stag, to, value),
            WrOp::Atomic {
                op,
                stag,
                to,
                result,
            } => {
                let id = self.next_request_id;
                self.next_request_id = id.wrapping_add(1);
                atomic(idx, id, op, stag, to, result)
            }
            _ => unreachable!("frame_request takes queue 1 requests"),
        };
        self.orq.push_back(req.pending);
        let msn = self.take_msn(ddp::QN_READ_REQUEST);
        let hdr = untagged(req.opcode, 0, ddp::QN_READ_REQUEST, msn, 0, true);
        self.put_fpdu(&hdr, &req.body, 0, no_payload)
    }

    /// The zero-length RDMA Read framed behind signaled request `idx`, whose
    /// answer confirms the peer has taken it (see [`Sender::set_confirm`]).
    pub(super) fn frame_confirm(&mut self, idx: u32) -> Result<(), Fail> {
        let read = WrOp::Read {
            stag: 0,
            to: 0,
            sink_stag: 0,
            sink_to: 0,
            sink: L::default(),
        };
        self.frame_request(idx, read, 0)
    }
}

/// An RDMA Read Request of `size` bytes from `stag`/`to` into
/// `sink_stag`/`sink_to`.
fn read<L>(
    idx: u32,
    stag: u32,
    to: u64,
    size: u32,
    sink_stag: u32,
    sink_to: u64,
    sink: L,
) -> Request<L> {
    let req = rdmap::ReadRequestRepr {
        sink_stag,
        sink_to,
        size,
        src_stag: stag,
        src_to: to,
    };
    let mut body = vec![0u8; rdmap::READ_REQUEST_LEN];
    req.emit(&mut rdmap::ReadRequestPacket::new_unchecked(&mut body[..]));
    Request {
        opcode: rdmap::Opcode::ReadRequest,
        body,
        pending: Outstanding::Read(PendingRead {
            sq_idx: idx,
            sink_stag,
            sink_to,
            sink,
            length: size as u64,
            received: 0,
        }),
    }
}

/// A Flush Request; only the flags the draft knows go out.
fn flush<L>(idx: u32, stag: u32, to: u64, len: u32, flags: u32) -> Request<L> {
    let req = commit::FlushRequestRepr {
        stag,
        length: len,
        to,
        flags: flags & commit::FLUSH_KNOWN_FLAGS,
    };
    let mut body = vec![0u8; req.buffer_len()];
    req.emit(&mut commit::FlushRequestPacket::new_unchecked(
        &mut body[..],
    ));
    Request {
        opcode: rdmap::Opcode::FlushRequest,
        body,
        pending: Outstanding::Flush { sq_idx: idx },
    }
}

/// A Verify Request with the hash to compare; the result lands in `result`.
fn verify<L>(idx: u32, stag: u32, to: u64, len: u32, hash: &[u8], result: L) -> Request<L> {
    let req = commit::VerifyRequestRepr {
        stag,
        length: len,
        to,
        hash,
    };
    let mut body = vec![0u8; req.buffer_len()];
    req.emit(&mut commit::VerifyRequestPacket::new_unchecked(
        &mut body[..],
    ));
    Request {
        opcode: rdmap::Opcode::VerifyRequest,
        body,
        pending: Outstanding::Verify {
            sq_idx: idx,
            result,
        },
    }
}

/// An Atomic Write Request of the 8 bytes of `value`.
fn atomic_write<L>(idx: u32, stag: u32, to: u64, value: u64) -> Request<L> {
    let req = commit::AtomicWriteRequestRepr {
        stag,
        length: commit::ATOMIC_WRITE_DATA_LEN,
        to,
        data: value.to_be_bytes(),
    };
    let mut body = vec![0u8; req.buffer_len()];
    req.emit(&mut commit::AtomicWriteRequestPacket::new_unchecked(
        &mut body[..],
    ));
    Request {
        opcode: rdmap::Opcode::AtomicWriteRequest,
        body,
        pending: Outstanding::AtomicWrite { sq_idx: idx },
    }
}

/// An Atomic Request with Request Identifier `id`; the original lands in
/// `result`.
fn atomic<L>(idx: u32, id: u32, op: AtomicOp, stag: u32, to: u64, result: L) -> Request<L> {
    use atomic::AtomicRequestRepr as A;
    let req = match op {
        AtomicOp::FetchAdd { add } => A::fetch_add(id, stag, to, add),
        AtomicOp::MaskedFetchAdd { add, mask } => A::masked_fetch_add(id, stag, to, add, mask),
        AtomicOp::CmpSwap { compare, swap } => A::cmp_swap(id, stag, to, compare, swap),
        AtomicOp::MaskedCmpSwap {
            compare,
            compare_mask,
            swap,
            swap_mask,
        } => A::masked_cmp_swap(id, stag, to, compare, compare_mask, swap, swap_mask),
        // Swap: a CmpSwap whose compare mask selects nothing.
        AtomicOp::Swap { swap } => A::masked_cmp_swap(id, stag, to, 0, 0, swap, atomic::NO_MASK),
    };
    let mut body = vec![0u8; req.buffer_len()];
    req.emit(&mut atomic::RequestPacket::new_unchecked(&mut body[..]));
    Request {
        opcode: rdmap::Opcode::AtomicRequest,
        body,
        pending: Outstanding::Atomic {
            sq_idx: idx,
            request_id: id,
            result,
        },
    }
}
