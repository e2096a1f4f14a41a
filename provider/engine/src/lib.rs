//! xiw's iWARP protocol engine, sans-IO: bytes, work requests and time in;
//! frames, placements, completions, events and deadlines out. No sockets,
//! threads, clocks, libc or unsafe code: the drivers (the standalone TCP
//! driver, the in-memory test pair, the kernel module's handed-over sockets)
//! do the I/O.
//!
//! - [`wire`]: the codecs, one module per header.
//! - [`setup`]: the MPA Request/Reply exchange (RFC 5044 section 7, RFC 6581)
//!   in both roles.
//! - [`fault`]: the Terminate for a refused access, and what a peer's
//!   Terminate means (the engine's own status and event types).
//! - [`queue1`]: the requests that are answered in order (Read, atomics,
//!   Flush, Verify, Atomic Write), both ways.
//! - [`recv`]: the receive side of a QP, reaching memory and queues through
//!   its driver's `Host`.
//! - [`send`]: the transmit side of a QP: work requests and answers in,
//!   FPDUs out, payload gathered through its driver's `SendHost`.
//! - [`lifecycle`]: a QP's connection from first attempt to end: its
//!   deadlines (connect, retry, linger, the Terminate's wait for room) and
//!   what a failure does, in what order, as actions for its driver.
//! - [`pair`]: two engines back to back in memory, with faults injected.
//! - [`sim`]: an in-memory `Host` (memory as windows of one arena), for
//!   tests and fuzzing.

#![forbid(unsafe_code)]

pub mod fault;
pub mod lifecycle;
pub mod pair;
pub mod queue1;
pub mod recv;
pub mod send;
pub mod setup;
pub mod sim;
pub mod wire;
