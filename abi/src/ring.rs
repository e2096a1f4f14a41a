//! Queues shared between a consumer of verbs and the engine that executes them.
//!
//! Every queue (send, receive, shared receive, completion) is one ring in one
//! mapping: a [`RingHeader`] followed by `entries` slots of `stride` bytes.
//! In standalone mode both sides live in the provider; with the kernel shim the
//! same mapping is shared with the module, so everything here is `#[repr(C)]`,
//! fixed-width and mirrored in `include/xiw_abi.h` (kept in step by a test).
//!
//! Indices are free-running `u32` counters; a slot is `index & (entries - 1)`.
//! The producer writes a slot, then stores `producer` with release ordering;
//! the consumer loads `producer` with acquire ordering, reads the slot, then
//! stores `consumer` with release ordering. Each index sits on its own cache line.

use core::mem::{offset_of, size_of};
use core::sync::atomic::AtomicU32;

pub const RING_MAGIC: u32 = 0x7869_7752; // "xiwR"
pub const RING_VERSION: u32 = 1;

pub const RING_KIND_SQ: u32 = 1;
pub const RING_KIND_RQ: u32 = 2;
pub const RING_KIND_SRQ: u32 = 3;
pub const RING_KIND_CQ: u32 = 4;

/// Offset of slot 0 from the start of a ring mapping.
pub const RING_SLOTS_OFFSET: usize = 256;

/// `RingHeader::flags`: the consumer sleeps and must be woken by a doorbell.
pub const RING_F_NEED_DOORBELL: u32 = 1 << 0;
/// `RingHeader::flags`: the ring is in error; producers must stop.
pub const RING_F_ERROR: u32 = 1 << 1;

/// `RingHeader::arm` values for a completion queue (`ibv_req_notify_cq`).
pub const CQ_ARM_NONE: u32 = 0;
pub const CQ_ARM_NEXT: u32 = 1;
pub const CQ_ARM_SOLICITED: u32 = 2;
/// In a CQE's `wc_flags`: the completion of a Send that asked for a solicited
/// event (RFC 5040 Send with Solicited Event); the provider's own, never
/// reported to the application.
pub const CQE_F_SOLICITED: u8 = 0x80;

#[repr(C, align(64))]
pub struct CacheLineU32 {
    pub value: AtomicU32,
}

/// The first 256 bytes of every ring mapping.
#[repr(C)]
pub struct RingHeader {
    pub magic: u32,
    pub version: u32,
    pub kind: u32,
    /// Number of slots, a power of two.
    pub entries: u32,
    /// Bytes per slot, a multiple of 16.
    pub stride: u32,
    /// QP number (SQ/RQ) or object id (CQ/SRQ) the ring belongs to.
    pub owner_id: u32,
    pub _reserved: [u32; 10],
    /// Written by the producer only.
    pub producer: CacheLineU32,
    /// Written by the consumer only.
    pub consumer: CacheLineU32,
    /// Doorbell and state flags (`RING_F_*`), then the CQ arm word and its sequence.
    pub flags: AtomicU32,
    pub arm: AtomicU32,
    pub arm_seq: AtomicU32,
    pub doorbell: AtomicU32,
    pub _reserved2: [u32; 12],
}

/// Send queue operation codes carried in [`SendWqe::opcode`].
pub mod op {
    pub const SEND: u8 = 0;
    pub const SEND_INV: u8 = 1;
    pub const SEND_IMM: u8 = 2;
    pub const WRITE: u8 = 3;
    pub const WRITE_IMM: u8 = 4;
    pub const READ: u8 = 5;
    pub const ATOMIC_CMP_SWP: u8 = 6;
    pub const ATOMIC_FETCH_ADD: u8 = 7;
    pub const LOCAL_INV: u8 = 8;
    pub const ATOMIC_WRITE: u8 = 9;
    pub const FLUSH: u8 = 10;
    pub const VERIFY: u8 = 11;
    pub const ATOMIC_MASKED_CMP_SWP: u8 = 12;
    pub const ATOMIC_MASKED_FETCH_ADD: u8 = 13;
    pub const ATOMIC_SWAP: u8 = 14;
    /// Binds a memory window: `rkey` its new STag, `remote_addr` and
    /// `operand0` the range of the region whose key is `operand1`, `op_flags`
    /// the window's rights, `imm_or_inv` its type (1 or 2).
    pub const BIND_MW: u8 = 15;
}

/// [`SendWqe::flags`].
pub mod wqe_flag {
    pub const SIGNALED: u8 = 1 << 0;
    pub const SOLICITED: u8 = 1 << 1;
    pub const FENCE: u8 = 1 << 2;
    /// The payload follows the header inline (`length` bytes) instead of SGEs.
    pub const INLINE: u8 = 1 << 3;
}

/// Scatter/gather element, as in `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Header of a send queue slot; `num_sge` [`Sge`]s or the inline bytes follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SendWqe {
    pub wr_id: u64,
    pub opcode: u8,
    pub flags: u8,
    pub num_sge: u8,
    /// Operation modifiers: for FLUSH the Flush Request's disposition flags
    /// (persistence 0x1, global visibility 0x2); for VERIFY the length of the
    /// expected hash held in `operand0..=mask1` (0: none).
    pub op_flags: u8,
    /// Immediate data (network order as given), the STag to invalidate, or
    /// the remote length of a FLUSH or VERIFY.
    pub imm_or_inv: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Total payload length (sum of SGE lengths, or inline length).
    pub length: u32,
    /// Compare (CmpSwap) or add (FetchAdd) operand; Atomic Write value.
    pub operand0: u64,
    /// Swap operand.
    pub operand1: u64,
    /// Compare mask (masked CmpSwap) or add boundary mask (masked FetchAdd).
    pub mask0: u64,
    /// Swap mask (masked CmpSwap).
    pub mask1: u64,
}

/// Header of a receive queue slot; `num_sge` [`Sge`]s follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub num_sge: u32,
    pub length: u32,
}

/// One completion, 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    pub wr_id: u64,
    pub byte_len: u32,
    /// Immediate data (as on the wire) or the invalidated STag.
    pub imm_or_inv: u32,
    pub qp_num: u32,
    pub vendor_err: u32,
    /// `enum ibv_wc_opcode`.
    pub opcode: u8,
    /// `enum ibv_wc_status`.
    pub status: u8,
    /// `enum ibv_wc_flags` (low 8 bits).
    pub wc_flags: u8,
    pub _reserved: [u8; 5],
}

/// Bytes needed for a ring of `entries` slots of `stride` bytes.
pub const fn ring_bytes(entries: u32, stride: u32) -> usize {
    RING_SLOTS_OFFSET + entries as usize * stride as usize
}

/// Slot stride for a send queue allowing `max_sge` SGEs or `max_inline` inline bytes.
pub const fn send_stride(max_sge: u32, max_inline: u32) -> u32 {
    let sges = max_sge as usize * size_of::<Sge>();
    let body = if sges > max_inline as usize {
        sges
    } else {
        max_inline as usize
    };
    round_up(size_of::<SendWqe>() + body, 64) as u32
}

/// Slot stride for a receive queue allowing `max_sge` SGEs.
pub const fn recv_stride(max_sge: u32) -> u32 {
    round_up(
        size_of::<RecvWqe>() + max_sge as usize * size_of::<Sge>(),
        16,
    ) as u32
}

const fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

const _: () = {
    assert!(size_of::<CacheLineU32>() == 64);
    assert!(offset_of!(RingHeader, producer) == 64);
    assert!(offset_of!(RingHeader, consumer) == 128);
    assert!(offset_of!(RingHeader, flags) == 192);
    assert!(offset_of!(RingHeader, arm) == 196);
    assert!(offset_of!(RingHeader, arm_seq) == 200);
    assert!(offset_of!(RingHeader, doorbell) == 204);
    assert!(size_of::<RingHeader>() == RING_SLOTS_OFFSET);
    assert!(size_of::<Sge>() == 16);
    assert!(size_of::<SendWqe>() == 64);
    assert!(offset_of!(SendWqe, remote_addr) == 16);
    assert!(offset_of!(SendWqe, operand0) == 32);
    assert!(size_of::<RecvWqe>() == 16);
    assert!(size_of::<Cqe>() == 32);
    assert!(offset_of!(Cqe, opcode) == 24);
};
