//! A work request as the send queue ring holds it ([`SendWqe`]): one
//! constructor per kind of request, filling the entry from plain arguments
//! (the verbs, their extended builders, the direct verbs and memory window
//! binds all build through these); what its payload may be ([`payload`]);
//! its decoding into the engine's work request ([`class`], [`decode`],
//! [`now_op`]); and the completion it reports ([`wc_opcode`],
//! [`wc_byte_len`]). The ring's opcodes ([`op`]) are written and read here
//! only.
//!
//! A constructor fills what the request itself names (its opcode, wr_id,
//! remote buffer and operands); the posting path adds the send flags
//! ([`flags`]) and the payload's description (`length`, `num_sge`, inline).

use std::mem::size_of;
use std::sync::Arc;

use xiw_abi::ring::{op, wqe_flag, SendWqe, Sge};
use xiw_abi::verbs::*;
use xiw_engine::send::{AtomicOp, NowOp, WindowBind, WrClass, WrOp};

pub use xiw_engine::queue1::VERIFY_MAX_HASH;

/// `IBV_WC_FLUSH` of rdma-core 45 and later (absent from 44's verbs.h).
pub const WC_FLUSH: u32 = 8;

/// A Send.
#[inline]
pub fn send(wr_id: u64) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::SEND,
        ..Default::default()
    }
}

/// A Send with Invalidate of the peer's `stag`.
#[inline]
pub fn send_inv(wr_id: u64, stag: u32) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::SEND_INV,
        imm_or_inv: stag,
        ..Default::default()
    }
}

/// A Send with Immediate Data `imm` (as given: network order).
#[inline]
pub fn send_imm(wr_id: u64, imm: u32) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::SEND_IMM,
        imm_or_inv: imm,
        ..Default::default()
    }
}

/// An RDMA Write to `addr` of `rkey`.
#[inline]
pub fn write(wr_id: u64, rkey: u32, addr: u64) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::WRITE,
        rkey,
        remote_addr: addr,
        ..Default::default()
    }
}

/// An RDMA Write with Immediate Data `imm` to `addr` of `rkey`.
#[inline]
pub fn write_imm(wr_id: u64, rkey: u32, addr: u64, imm: u32) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::WRITE_IMM,
        rkey,
        remote_addr: addr,
        imm_or_inv: imm,
        ..Default::default()
    }
}

/// An RDMA Read from `addr` of `rkey` (into the request's SGEs).
#[inline]
pub fn read(wr_id: u64, rkey: u32, addr: u64) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::READ,
        rkey,
        remote_addr: addr,
        ..Default::default()
    }
}

/// A Local Invalidate of `stag`.
#[inline]
pub fn local_inv(wr_id: u64, stag: u32) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::LOCAL_INV,
        imm_or_inv: stag,
        ..Default::default()
    }
}

/// The bind of a memory window: `rkey` its new STag, `remote_addr` and
/// `operand0` the range of the region whose key is `operand1`, `op_flags`
/// the window's rights, `imm_or_inv` its type.
#[inline]
pub fn bind_mw(wr_id: u64, b: &WindowBind) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::BIND_MW,
        rkey: b.stag,
        imm_or_inv: u32::from(b.kind),
        remote_addr: b.to,
        operand0: b.len,
        operand1: u64::from(b.mr),
        op_flags: b.access as u8,
        ..Default::default()
    }
}

/// An RFC 7306 atomic on the 8 bytes at `addr` of `rkey`; the original
/// value lands in the request's SGEs.
#[inline]
pub fn atomic(wr_id: u64, rkey: u32, addr: u64, a: AtomicOp) -> SendWqe {
    let w = SendWqe {
        wr_id,
        rkey,
        remote_addr: addr,
        ..Default::default()
    };
    match a {
        AtomicOp::FetchAdd { add } => SendWqe {
            opcode: op::ATOMIC_FETCH_ADD,
            operand0: add,
            ..w
        },
        AtomicOp::MaskedFetchAdd { add, mask } => SendWqe {
            opcode: op::ATOMIC_MASKED_FETCH_ADD,
            operand0: add,
            mask0: mask,
            ..w
        },
        AtomicOp::CmpSwap { compare, swap } => SendWqe {
            opcode: op::ATOMIC_CMP_SWP,
            operand0: compare,
            operand1: swap,
            ..w
        },
        AtomicOp::MaskedCmpSwap {
            compare,
            compare_mask,
            swap,
            swap_mask,
        } => SendWqe {
            opcode: op::ATOMIC_MASKED_CMP_SWP,
            operand0: compare,
            operand1: swap,
            mask0: compare_mask,
            mask1: swap_mask,
            ..w
        },
        AtomicOp::Swap { swap } => SendWqe {
            opcode: op::ATOMIC_SWAP,
            operand1: swap,
            ..w
        },
    }
}

/// An Atomic Write of `value` to the 8 bytes at `addr` of `rkey`.
#[inline]
pub fn atomic_write(wr_id: u64, rkey: u32, addr: u64, value: u64) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::ATOMIC_WRITE,
        rkey,
        remote_addr: addr,
        operand0: value,
        ..Default::default()
    }
}

/// A Flush of `[addr, addr+len)` of `rkey`, with the Flush Request's
/// disposition `flags` (`wire::commit::FLUSH_*`).
#[inline]
pub fn flush(wr_id: u64, rkey: u32, addr: u64, len: u32, flags: u8) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op::FLUSH,
        rkey,
        remote_addr: addr,
        imm_or_inv: len,
        op_flags: flags,
        ..Default::default()
    }
}

/// A Verify of `[addr, addr+len)` of `rkey` against `expected` (at most
/// [`VERIFY_MAX_HASH`] bytes are kept; none: the computed hash comes back
/// into the request's SGEs).
#[inline]
pub fn verify(wr_id: u64, rkey: u32, addr: u64, len: u32, expected: &[u8]) -> SendWqe {
    let mut w = SendWqe {
        wr_id,
        opcode: op::VERIFY,
        rkey,
        remote_addr: addr,
        imm_or_inv: len,
        ..Default::default()
    };
    set_verify_expected(&mut w, expected);
    w
}

/// Keeps `hash` (at most [`VERIFY_MAX_HASH`] bytes) as the expected hash of a
/// Verify WQE, in its operand words and its length in `op_flags`;
/// [`verify_expected`] reads it back.
fn set_verify_expected(wqe: &mut SendWqe, hash: &[u8]) {
    let mut h = [0u8; VERIFY_MAX_HASH];
    let n = hash.len().min(VERIFY_MAX_HASH);
    h[..n].copy_from_slice(&hash[..n]);
    let word = |k: usize| u64::from_ne_bytes(h[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
    (wqe.operand0, wqe.operand1, wqe.mask0, wqe.mask1) = (word(0), word(1), word(2), word(3));
    wqe.op_flags = n as u8;
}

/// The expected hash of a Verify WQE (bytes, length): kept in its operand words.
fn verify_expected(wqe: &SendWqe) -> ([u8; VERIFY_MAX_HASH], usize) {
    let mut h = [0u8; VERIFY_MAX_HASH];
    for (k, w) in [wqe.operand0, wqe.operand1, wqe.mask0, wqe.mask1]
        .iter()
        .enumerate()
    {
        h[k * 8..k * 8 + 8].copy_from_slice(&w.to_ne_bytes());
    }
    (h, (wqe.op_flags as usize).min(VERIFY_MAX_HASH))
}

/// Where SGE `k` of a request sits in its send queue slot: the SGEs follow
/// the header.
#[inline]
pub const fn sge_offset(k: usize) -> usize {
    size_of::<SendWqe>() + k * size_of::<Sge>()
}

/// Where a request's inline bytes start in its send queue slot: right after
/// the header.
pub const INLINE_OFFSET: usize = size_of::<SendWqe>();

/// The WQE flags for `ibv_send_flags` (all but inline, which is a way of
/// posting, not of sending).
#[inline]
pub fn flags(send_flags: u32) -> u8 {
    let mut f = 0;
    if send_flags & IBV_SEND_SIGNALED != 0 {
        f |= wqe_flag::SIGNALED;
    }
    if send_flags & IBV_SEND_SOLICITED != 0 {
        f |= wqe_flag::SOLICITED;
    }
    if send_flags & IBV_SEND_FENCE != 0 {
        f |= wqe_flag::FENCE;
    }
    f
}

/// What a request's payload (its SGEs, or inline data) is for, which
/// decides what may be posted with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Bytes sent (the Send family, RDMA Write): SGEs, or inline data.
    Data,
    /// Exactly 8 bytes of SGEs, never inline: where an atomic's original
    /// value lands.
    Original,
    /// None: every operand is in the WQE (Flush, Atomic Write).
    Empty,
    /// SGEs, never inline: where a Verify's computed hash lands.
    Hash,
    /// SGEs as given, inline posting ignored (an RDMA Read's sink; Local
    /// Invalidate and Bind).
    Sges,
}

/// What the payload of a request of ring opcode `opcode` is for.
#[inline]
pub fn payload(opcode: u8) -> Payload {
    match opcode {
        op::SEND | op::SEND_INV | op::SEND_IMM | op::WRITE | op::WRITE_IMM => Payload::Data,
        op::ATOMIC_CMP_SWP
        | op::ATOMIC_FETCH_ADD
        | op::ATOMIC_MASKED_CMP_SWP
        | op::ATOMIC_MASKED_FETCH_ADD
        | op::ATOMIC_SWAP => Payload::Original,
        op::FLUSH | op::ATOMIC_WRITE => Payload::Empty,
        op::VERIFY => Payload::Hash,
        _ => Payload::Sges,
    }
}

/// Work that is answered by the peer on queue 3 or 2 and counts against ORD.
#[inline]
pub fn is_queue1(opcode: u8) -> bool {
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

/// What decides whether the request may start now (see [`WrClass`]): a
/// signaled Send or Write is one the peer may be asked to confirm.
#[inline]
pub fn class(wqe: &SendWqe) -> WrClass {
    WrClass {
        queue1: is_queue1(wqe.opcode),
        fence: wqe.flags & wqe_flag::FENCE != 0,
        confirmed: wqe.flags & wqe_flag::SIGNALED != 0 && payload(wqe.opcode) == Payload::Data,
    }
}

/// The request as the engine's work request; `local` is its SGE list
/// (where a queue 1 request's response lands), None when its payload is
/// inline.
#[inline]
pub fn decode(wqe: &SendWqe, local: Option<&[Sge]>) -> WrOp<Arc<[Sge]>> {
    if let Some(op) = data_op(wqe) {
        return op;
    }
    match wqe.opcode {
        op::LOCAL_INV => WrOp::LocalInvalidate {
            stag: wqe.imm_or_inv,
        },
        op::BIND_MW => WrOp::BindWindow(WindowBind {
            stag: wqe.rkey,
            kind: wqe.imm_or_inv as u8,
            mr: wqe.operand1 as u32,
            to: wqe.remote_addr,
            len: wqe.operand0,
            access: u32::from(wqe.op_flags),
        }),
        o if is_queue1(o) => match local {
            Some(local) => queue1_op(wqe, local.into()),
            None => WrOp::Invalid("inline queue 1 request"),
        },
        _ => WrOp::Invalid("unsupported opcode on the send queue"),
    }
}

/// A Send or RDMA Write without Immediate Data as [`Sender::frame_now`]
/// frames it (its flags set); None for any other request.
///
/// [`Sender::frame_now`]: xiw_engine::send::Sender::frame_now
#[inline]
pub fn now_op(wqe: &SendWqe) -> Option<NowOp> {
    data_op::<()>(wqe)?.now_op()
}

/// A WQE of the Send family or an RDMA Write as the engine's work request.
#[inline]
fn data_op<L>(wqe: &SendWqe) -> Option<WrOp<L>> {
    let solicited = wqe.flags & wqe_flag::SOLICITED != 0;
    Some(match wqe.opcode {
        op::SEND | op::SEND_IMM | op::SEND_INV => WrOp::Send {
            solicited,
            invalidate: (wqe.opcode == op::SEND_INV).then_some(wqe.imm_or_inv),
            imm: (wqe.opcode == op::SEND_IMM).then_some(wqe.imm_or_inv),
        },
        op::WRITE | op::WRITE_IMM => WrOp::Write {
            stag: wqe.rkey,
            to: wqe.remote_addr,
            imm: (wqe.opcode == op::WRITE_IMM).then_some(wqe.imm_or_inv),
            solicited,
        },
        _ => return None,
    })
}

/// A queue 1 request; `local` is where its response lands.
fn queue1_op(wqe: &SendWqe, local: Arc<[Sge]>) -> WrOp<Arc<[Sge]>> {
    let (stag, to) = (wqe.rkey, wqe.remote_addr);
    let atomic_op = |op| WrOp::Atomic {
        op,
        stag,
        to,
        result: local.clone(),
    };
    match wqe.opcode {
        op::READ => {
            let (sink_stag, sink_to) = local.first().map(|s| (s.lkey, s.addr)).unwrap_or((0, 0));
            WrOp::Read {
                stag,
                to,
                sink_stag,
                sink_to,
                sink: local,
            }
        }
        op::FLUSH => WrOp::Flush {
            stag,
            to,
            len: wqe.imm_or_inv,
            flags: wqe.op_flags as u32,
        },
        op::VERIFY => {
            let (hash, len) = verify_expected(wqe);
            WrOp::Verify {
                stag,
                to,
                len: wqe.imm_or_inv,
                hash,
                hash_len: len as u8,
                result: local,
            }
        }
        op::ATOMIC_WRITE => WrOp::AtomicWrite {
            stag,
            to,
            value: wqe.operand0,
        },
        op::ATOMIC_FETCH_ADD => atomic_op(AtomicOp::FetchAdd { add: wqe.operand0 }),
        op::ATOMIC_MASKED_FETCH_ADD => atomic_op(AtomicOp::MaskedFetchAdd {
            add: wqe.operand0,
            mask: wqe.mask0,
        }),
        op::ATOMIC_CMP_SWP => atomic_op(AtomicOp::CmpSwap {
            compare: wqe.operand0,
            swap: wqe.operand1,
        }),
        op::ATOMIC_MASKED_CMP_SWP => atomic_op(AtomicOp::MaskedCmpSwap {
            compare: wqe.operand0,
            compare_mask: wqe.mask0,
            swap: wqe.operand1,
            swap_mask: wqe.mask1,
        }),
        op::ATOMIC_SWAP => atomic_op(AtomicOp::Swap { swap: wqe.operand1 }),
        _ => WrOp::Invalid("unsupported opcode on the send queue"),
    }
}

/// The `ibv_wc_opcode` the request's completion reports.
#[inline]
pub fn wc_opcode(wqe: &SendWqe) -> ibv_wc_opcode {
    match wqe.opcode {
        op::SEND | op::SEND_INV | op::SEND_IMM => IBV_WC_SEND,
        op::WRITE | op::WRITE_IMM => IBV_WC_RDMA_WRITE,
        op::READ => IBV_WC_RDMA_READ,
        op::ATOMIC_CMP_SWP | op::ATOMIC_MASKED_CMP_SWP | op::ATOMIC_SWAP => IBV_WC_COMP_SWAP,
        op::ATOMIC_FETCH_ADD | op::ATOMIC_MASKED_FETCH_ADD => IBV_WC_FETCH_ADD,
        op::LOCAL_INV => IBV_WC_LOCAL_INV,
        op::BIND_MW => IBV_WC_BIND_MW,
        op::ATOMIC_WRITE => IBV_WC_ATOMIC_WRITE,
        op::FLUSH => WC_FLUSH,
        op::VERIFY => IBV_WC_DRIVER1,
        _ => IBV_WC_SEND,
    }
}

/// The byte count the request's completion reports, unless its response
/// gives one (a Verify's hash): a Read's length, an atomic's 8 bytes, else 0.
#[inline]
pub fn wc_byte_len(wqe: &SendWqe) -> u32 {
    match wqe.opcode {
        op::READ => wqe.length,
        op::ATOMIC_CMP_SWP
        | op::ATOMIC_FETCH_ADD
        | op::ATOMIC_MASKED_CMP_SWP
        | op::ATOMIC_MASKED_FETCH_ADD
        | op::ATOMIC_SWAP
        | op::ATOMIC_WRITE => 8,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SGE: Sge = Sge {
        addr: 0x1000,
        length: 8,
        lkey: 0x100,
    };

    /// A request as built, the engine's work request for it, and its
    /// completion opcode.
    type Kind = (SendWqe, WrOp<Arc<[Sge]>>, ibv_wc_opcode);

    /// Every kind of request, built by its constructor.
    fn every_kind() -> Vec<Kind> {
        let local: Arc<[Sge]> = Arc::new([SGE]);
        let hash: Vec<u8> = (1..=32).collect();
        let mut expected = [0u8; VERIFY_MAX_HASH];
        expected[..4].copy_from_slice(&hash[..4]);
        let bind = WindowBind {
            stag: 0x1234_5601,
            kind: 2,
            mr: 0x77,
            to: 0x9000,
            len: 4096,
            access: IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
        };
        let engine_atomic = |op| WrOp::Atomic {
            op,
            stag: 7,
            to: 0x2000,
            result: local.clone(),
        };
        let solicited = false;
        vec![
            (
                send(1),
                WrOp::Send {
                    solicited,
                    invalidate: None,
                    imm: None,
                },
                IBV_WC_SEND,
            ),
            (
                send_inv(2, 0xabcd),
                WrOp::Send {
                    solicited,
                    invalidate: Some(0xabcd),
                    imm: None,
                },
                IBV_WC_SEND,
            ),
            (
                send_imm(3, 0x0102_0304),
                WrOp::Send {
                    solicited,
                    invalidate: None,
                    imm: Some(0x0102_0304),
                },
                IBV_WC_SEND,
            ),
            (
                write(4, 7, 0x2000),
                WrOp::Write {
                    stag: 7,
                    to: 0x2000,
                    imm: None,
                    solicited,
                },
                IBV_WC_RDMA_WRITE,
            ),
            (
                write_imm(5, 7, 0x2000, 9),
                WrOp::Write {
                    stag: 7,
                    to: 0x2000,
                    imm: Some(9),
                    solicited,
                },
                IBV_WC_RDMA_WRITE,
            ),
            (
                read(6, 7, 0x2000),
                WrOp::Read {
                    stag: 7,
                    to: 0x2000,
                    sink_stag: SGE.lkey,
                    sink_to: SGE.addr,
                    sink: local.clone(),
                },
                IBV_WC_RDMA_READ,
            ),
            (
                local_inv(7, 0x55),
                WrOp::LocalInvalidate { stag: 0x55 },
                IBV_WC_LOCAL_INV,
            ),
            (bind_mw(8, &bind), WrOp::BindWindow(bind), IBV_WC_BIND_MW),
            (
                atomic(9, 7, 0x2000, AtomicOp::FetchAdd { add: 3 }),
                engine_atomic(AtomicOp::FetchAdd { add: 3 }),
                IBV_WC_FETCH_ADD,
            ),
            (
                atomic(
                    10,
                    7,
                    0x2000,
                    AtomicOp::MaskedFetchAdd { add: 3, mask: 0xf0 },
                ),
                engine_atomic(AtomicOp::MaskedFetchAdd { add: 3, mask: 0xf0 }),
                IBV_WC_FETCH_ADD,
            ),
            (
                atomic(
                    11,
                    7,
                    0x2000,
                    AtomicOp::CmpSwap {
                        compare: 1,
                        swap: 2,
                    },
                ),
                engine_atomic(AtomicOp::CmpSwap {
                    compare: 1,
                    swap: 2,
                }),
                IBV_WC_COMP_SWAP,
            ),
            (
                atomic(
                    12,
                    7,
                    0x2000,
                    AtomicOp::MaskedCmpSwap {
                        compare: 1,
                        compare_mask: 0xff,
                        swap: 2,
                        swap_mask: 0xff00,
                    },
                ),
                engine_atomic(AtomicOp::MaskedCmpSwap {
                    compare: 1,
                    compare_mask: 0xff,
                    swap: 2,
                    swap_mask: 0xff00,
                }),
                IBV_WC_COMP_SWAP,
            ),
            (
                atomic(13, 7, 0x2000, AtomicOp::Swap { swap: 5 }),
                engine_atomic(AtomicOp::Swap { swap: 5 }),
                IBV_WC_COMP_SWAP,
            ),
            (
                atomic_write(14, 7, 0x2000, 0x1122_3344_5566_7788),
                WrOp::AtomicWrite {
                    stag: 7,
                    to: 0x2000,
                    value: 0x1122_3344_5566_7788,
                },
                IBV_WC_ATOMIC_WRITE,
            ),
            (
                flush(15, 7, 0x2000, 4096, 0x3),
                WrOp::Flush {
                    stag: 7,
                    to: 0x2000,
                    len: 4096,
                    flags: 0x3,
                },
                WC_FLUSH,
            ),
            (
                verify(16, 7, 0x2000, 4096, &hash[..4]),
                WrOp::Verify {
                    stag: 7,
                    to: 0x2000,
                    len: 4096,
                    hash: expected,
                    hash_len: 4,
                    result: local.clone(),
                },
                IBV_WC_DRIVER1,
            ),
            (
                verify(17, 7, 0x2000, 4096, &hash),
                WrOp::Verify {
                    stag: 7,
                    to: 0x2000,
                    len: 4096,
                    hash: hash.clone().try_into().expect("32 bytes"),
                    hash_len: 32,
                    result: local.clone(),
                },
                IBV_WC_DRIVER1,
            ),
            (
                verify(18, 7, 0x2000, 4096, &[]),
                WrOp::Verify {
                    stag: 7,
                    to: 0x2000,
                    len: 4096,
                    hash: [0; VERIFY_MAX_HASH],
                    hash_len: 0,
                    result: local,
                },
                IBV_WC_DRIVER1,
            ),
        ]
    }

    #[test]
    fn a_request_decodes_to_what_was_built() {
        for (wqe, want, _) in every_kind() {
            let got = decode(&wqe, Some(&[SGE]));
            // WrOp has no PartialEq (its local list is the driver's type).
            assert_eq!(
                format!("{got:?}"),
                format!("{want:?}"),
                "wr_id {}",
                wqe.wr_id
            );
            assert_eq!(
                got.is_queue1(),
                is_queue1(wqe.opcode),
                "wr_id {}",
                wqe.wr_id
            );
            assert_eq!(class(&wqe).queue1, got.is_queue1());
        }
    }

    #[test]
    fn a_request_completes_with_its_opcode_and_length() {
        for (mut wqe, op, wc) in every_kind() {
            wqe.length = 8;
            assert_eq!(wc_opcode(&wqe), wc, "wr_id {}", wqe.wr_id);
            let len = match op {
                WrOp::Read { .. } | WrOp::Atomic { .. } | WrOp::AtomicWrite { .. } => 8,
                _ => 0,
            };
            assert_eq!(wc_byte_len(&wqe), len, "wr_id {}", wqe.wr_id);
        }
        let mut r = read(1, 7, 0x2000);
        r.length = 12345;
        assert_eq!(wc_byte_len(&r), 12345);
    }

    #[test]
    fn flags_solicit_fence_and_confirm() {
        let all = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_FENCE | IBV_SEND_INLINE;
        assert_eq!(
            flags(all),
            wqe_flag::SIGNALED | wqe_flag::SOLICITED | wqe_flag::FENCE
        );
        assert_eq!(flags(IBV_SEND_INLINE), 0);
        let mut w = send(1);
        w.flags = flags(IBV_SEND_SOLICITED | IBV_SEND_SIGNALED);
        assert!(matches!(
            decode(&w, None),
            WrOp::Send {
                solicited: true,
                ..
            }
        ));
        let c = class(&w);
        assert!(c.confirmed && !c.fence && !c.queue1);
        let mut r = read(2, 7, 0x2000);
        r.flags = flags(IBV_SEND_SIGNALED | IBV_SEND_FENCE);
        let c = class(&r);
        assert!(!c.confirmed && c.fence && c.queue1);
    }

    #[test]
    fn only_plain_sends_and_writes_are_framed_at_once() {
        for (mut wqe, op, _) in every_kind() {
            wqe.flags = wqe_flag::SOLICITED;
            let want = match op {
                WrOp::Send {
                    invalidate,
                    imm: None,
                    ..
                } => Some(NowOp::Send {
                    solicited: true,
                    invalidate,
                }),
                WrOp::Write {
                    stag,
                    to,
                    imm: None,
                    ..
                } => Some(NowOp::Write { stag, to }),
                _ => None,
            };
            assert_eq!(now_op(&wqe), want, "wr_id {}", wqe.wr_id);
        }
    }

    #[test]
    fn inline_data_is_no_queue1_requests_payload() {
        for (wqe, op, _) in every_kind() {
            let got = decode(&wqe, None);
            if op.is_queue1() {
                assert!(matches!(got, WrOp::Invalid(_)), "wr_id {}", wqe.wr_id);
            } else {
                assert_eq!(format!("{got:?}"), format!("{op:?}"));
            }
        }
    }

    #[test]
    fn payload_rules() {
        let rule = |w: SendWqe| payload(w.opcode);
        assert_eq!(rule(send(1)), Payload::Data);
        assert_eq!(rule(write_imm(1, 2, 3, 4)), Payload::Data);
        assert_eq!(rule(read(1, 2, 3)), Payload::Sges);
        assert_eq!(rule(local_inv(1, 2)), Payload::Sges);
        assert_eq!(
            rule(atomic(1, 2, 3, AtomicOp::Swap { swap: 4 })),
            Payload::Original
        );
        assert_eq!(rule(atomic_write(1, 2, 3, 4)), Payload::Empty);
        assert_eq!(rule(flush(1, 2, 3, 4, 1)), Payload::Empty);
        assert_eq!(rule(verify(1, 2, 3, 4, &[])), Payload::Hash);
    }

    /// Each operand sits in the field the ring's layout gives it.
    #[test]
    fn operands_sit_where_the_ring_says() {
        let b = WindowBind {
            stag: 0x4242_4201,
            kind: 1,
            mr: 0x99,
            to: 0x7000,
            len: 0,
            access: IBV_ACCESS_REMOTE_ATOMIC,
        };
        let w = bind_mw(3, &b);
        assert_eq!(
            (w.opcode, w.rkey, w.imm_or_inv, w.remote_addr),
            (op::BIND_MW, 0x4242_4201, 1, 0x7000)
        );
        assert_eq!((w.operand0, w.operand1, w.op_flags), (0, 0x99, 8));
        let w = atomic(
            4,
            5,
            6,
            AtomicOp::MaskedCmpSwap {
                compare: 1,
                compare_mask: 2,
                swap: 3,
                swap_mask: 4,
            },
        );
        assert_eq!((w.operand0, w.operand1, w.mask0, w.mask1), (1, 3, 2, 4));
        assert_eq!((w.wr_id, w.rkey, w.remote_addr), (4, 5, 6));
        let w = atomic(4, 5, 6, AtomicOp::Swap { swap: 9 });
        assert_eq!((w.operand0, w.operand1), (0, 9));
        let w = flush(1, 2, 3, 4096, 0x2);
        assert_eq!((w.imm_or_inv, w.op_flags), (4096, 0x2));
        let w = verify(1, 2, 3, 4096, &[0xee; 9]);
        assert_eq!((w.imm_or_inv, w.op_flags), (4096, 9));
        assert_eq!(w.operand0, u64::from_ne_bytes([0xee; 8]));
        assert_eq!(w.operand1, u64::from_ne_bytes([0xee, 0, 0, 0, 0, 0, 0, 0]));
        assert_eq!((w.mask0, w.mask1), (0, 0));
        for w in [send(1), write(1, 2, 3), local_inv(1, 2)] {
            assert_eq!((w.flags, w.num_sge, w.length), (0, 0, 0));
        }
    }

    #[test]
    fn a_verify_keeps_at_most_the_longest_hash() {
        let long = [0xa5u8; VERIFY_MAX_HASH + 8];
        let w = verify(1, 2, 3, 4, &long);
        let (h, n) = verify_expected(&w);
        assert_eq!((h, n), ([0xa5; VERIFY_MAX_HASH], VERIFY_MAX_HASH));
    }

    /// The ring's opcodes are classified once for admission (`is_queue1`,
    /// before the request is taken) and once by the engine (`WrOp::is_queue1`);
    /// the two must agree for every opcode, or ORD would be miscounted.
    #[test]
    fn ring_and_engine_agree_on_queue1_requests() {
        for opcode in 0..=u8::MAX {
            let wqe = SendWqe {
                opcode,
                length: 8,
                ..Default::default()
            };
            let op = decode(&wqe, Some(&[SGE]));
            let invalid = matches!(op, WrOp::Invalid(_));
            assert!(
                invalid || is_queue1(opcode) == op.is_queue1(),
                "opcode {opcode}: ring says {}, engine {op:?}",
                is_queue1(opcode)
            );
            assert_eq!(invalid, opcode > op::BIND_MW, "opcode {opcode}");
        }
    }
}
