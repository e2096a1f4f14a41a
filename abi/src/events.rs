//! The events page of a context in kernel mode (`struct xiw_events_header`
//! and what follows it in `include/xiw_abi.h`): where the module's socket
//! callbacks mark what happened on each QP's stream, so that the provider
//! looks at memory instead of making a system call to find out.
//!
//! Layout: a [`EventsHeader`], the summary bitmap (one bit per slot, in
//! 64-bit words) at [`SUMMARY_OFFSET`], then one [`EventsSlot`] per QP at
//! [`SLOTS_OFFSET`]. The module or's `EV_*` bits into a slot's `events`; on
//! a slot's first mark it sets the slot's summary bit and `pending`, then,
//! if `armed`, clears that and signals the context's eventfd. The provider
//! exchanges `events` with 0 to take them; it sets `hint` to say who took
//! them last.
//!
//! A slot's `place` says who reads the stream: the provider
//! ([`PLACE_USER`]), or, while the provider is at an FPDU boundary with
//! nothing buffered, the module ([`PLACE_KERNEL`]), which then places whole
//! RDMA Writes that pass its checks straight from the socket and hands the
//! stream back (`PLACE_USER`, and a mark) at the first FPDU it does not
//! place, which stays in the socket. The Write accounting the receive
//! engine keeps for Immediate Data (RFC 7306) travels with the stream in
//! `write_len` and `after_write` (valid when `flags` has
//! [`PLACE_F_AFTER_WRITE`]): whoever reads the stream owns them.
//!
//! A small FPDU it does not place, whole in the socket, the module may hand
//! up instead: it takes its bytes out of the socket into the slot's `hand`
//! (the next `hand_len & HAND_LEN_MASK` bytes of the stream) and gives the
//! stream back as [`PLACE_HANDED`], so that the provider reads no socket for
//! it. It claims the stream by compare-and-swap from [`PLACE_KERNEL`] before
//! it takes a byte (so never once the provider took it back), and releases
//! [`HAND_DONE`] in `hand_len` once the bytes are there; [`HAND_MORE`] says
//! the socket may hold more.
//!
//! The Read Responses of the oldest Read this side sent may be lent too
//! (`flags` with [`PLACE_F_READ`]): the module places a whole Read Response
//! segment that goes to `read_stag` at exactly `read_to`, no longer than
//! `read_left` and, if the last, exactly that long, into a region of its
//! table that grants local writes; it advances `read_to` and `read_left`,
//! and clears [`PLACE_F_READ`] with the last segment (the Read is
//! answered, and the stream is marked so that the provider completes it).

use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::limits::MAX_QP;

pub const EVENTS_MAGIC: u32 = 0x7869_7745; // "xiwE"
pub const EVENTS_VERSION: u32 = 4;
pub const SLOTS: u32 = MAX_QP;
pub const SUMMARY_OFFSET: usize = 64;
pub const SLOTS_OFFSET: usize = SUMMARY_OFFSET + SLOTS as usize / 8;
pub const SLOT_BYTES: usize = 128;
pub const EVENTS_BYTES: usize = SLOTS_OFFSET + SLOTS as usize * SLOT_BYTES;

/// Bytes (or the stream's end) to read.
pub const EV_DATA: u32 = 1 << 0;
/// Room to send again.
pub const EV_WRITABLE: u32 = 1 << 1;
/// The stream closed or broke.
pub const EV_CLOSED: u32 = 1 << 2;
/// Bits 8 and up of `events` count the messages among the marked bytes for
/// which the module woke the receive CQ's completion channel already
/// (`METHOD_CQ_RING`): their completions are stored without another event.
pub const EV_SIGNALLED_SHIFT: u32 = 8;
pub const EV_SIGNALLED_ONE: u32 = 1 << EV_SIGNALLED_SHIFT;
/// The marks of `events` (the bits below the count), which the provider
/// takes apart from the count.
pub const EV_MARKS: u32 = EV_SIGNALLED_ONE - 1;

/// The provider's progress thread took the slot's last events: the module
/// wakes it at once.
pub const HINT_PROGRESS: u32 = 0;
/// The application's own polling took them: the module waits its
/// `event_delay_us` before waking the progress thread, in case it takes the
/// next ones too.
pub const HINT_APP: u32 = 1;

#[repr(C)]
pub struct EventsHeader {
    pub magic: u32,
    pub version: u32,
    pub slots: u32,
    /// The module queued a connection for the provider to take (set before
    /// it signals the eventfd for it).
    pub cm: AtomicU32,
    /// The provider's progress thread sleeps: the module signals the eventfd.
    pub armed: AtomicU32,
    /// A slot was marked since the provider last cleared this.
    pub pending: AtomicU32,
    pub reserved: [u32; 10],
}

/// The provider reads the stream (`EventsSlot::place`).
pub const PLACE_USER: u32 = 0;
/// The module may place whole RDMA Writes from the head of the stream.
pub const PLACE_KERNEL: u32 = 1;
/// The module gave the stream back with the next bytes in `hand`.
pub const PLACE_HANDED: u32 = 2;
/// `EventsSlot::hand`'s size: an FPDU of up to 6 payload bytes.
pub const HAND_BYTES: usize = 28;
/// `EventsSlot::hand_len`: the bytes in `hand`, and [`HAND_MORE`].
pub const HAND_LEN_MASK: u32 = 0xffff;
/// `EventsSlot::hand_len`: the socket may hold more bytes after `hand`'s.
pub const HAND_MORE: u32 = 1 << 31;
/// `EventsSlot::hand_len`: the module is done with `hand` (released last;
/// the module clears `hand_len` before it claims the stream).
pub const HAND_DONE: u32 = 1 << 30;
/// `EventsSlot::flags`: `after_write` holds the length of the RDMA Write
/// message just before the next one (none: the last message was another).
pub const PLACE_F_AFTER_WRITE: u32 = 1 << 0;
/// `EventsSlot::flags`: the Read Responses of the Read in `read_stag`,
/// `read_to` and `read_left` are lent with the stream.
pub const PLACE_F_READ: u32 = 1 << 1;

#[repr(C)]
pub struct EventsSlot {
    pub events: AtomicU32,
    pub hint: AtomicU32,
    pub place: AtomicU32,
    pub flags: AtomicU32,
    /// Bytes of the RDMA Write message whose last segment has not come.
    pub write_len: AtomicU64,
    pub after_write: AtomicU64,
    pub hand_len: AtomicU32,
    /// Written by the module only while the stream is lent to it, read by
    /// the provider only once it is handed back.
    pub hand: [u8; HAND_BYTES],
    /// The sink STag of the Read lent ([`PLACE_F_READ`]).
    pub read_stag: AtomicU32,
    pub read_reserved: u32,
    /// The TO its next Read Response segment goes to.
    pub read_to: AtomicU64,
    /// Bytes of it still to come.
    pub read_left: AtomicU64,
    pub reserved: [u64; 5],
}

/// A summary word: bit `k` of word `w` is slot `64 * w + k`.
pub type SummaryWord = AtomicU64;

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<EventsHeader>() == SUMMARY_OFFSET);
    assert!(size_of::<EventsSlot>() == SLOT_BYTES);
    assert!(SLOTS.is_multiple_of(64));
};
