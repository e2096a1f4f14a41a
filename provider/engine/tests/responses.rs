//! The answers to queue 1 requests, byte for byte, through two engines back
//! to back (the in-memory `Pair`): for each request kind (the RFC 7306
//! atomics, RDMA Flush, RDMA Verify, Atomic Write) the exact response the
//! responder sends, or the exact Terminate when the request is refused, by
//! its STag check when it arrives or when it is carried out (the memory
//! changed in between), or because the operation fails (a target no longer
//! aligned, a medium that fails, a Verify hash that differs).

use xiw_engine::fault::{Event, Status};
use xiw_engine::pair::Pair;
use xiw_engine::queue1::access;
use xiw_engine::send::{AtomicOp, Completion, WrOp};
use xiw_engine::sim::{Sges, Sim};
use xiw_engine::wire::commit::{FLUSH_GLOBAL_VISIBILITY, FLUSH_PERSISTENCE};
use xiw_engine::wire::mpa;

const ALL: u32 = access::LOCAL_WRITE
    | access::REMOTE_WRITE
    | access::REMOTE_READ
    | access::REMOTE_ATOMIC
    | access::FLUSH_GLOBAL
    | access::FLUSH_PERSISTENT
    | access::VERIFY;
/// Each side: MEM (arena 0..4096 at 0x2_0000), the memory requests name;
/// RES (arena 4096..4160 at 0x4_0000), where a result lands.
const MEM: u32 = 0x20;
const MEM_IOVA: u64 = 0x2_0000;
const RES: u32 = 0x40;
const RES_IOVA: u64 = 0x4_0000;
/// The target of atomics, Flush and Verify: MEM+0x100.
const AT: u64 = MEM_IOVA + 0x100;
/// What the target word holds before a request.
const BEFORE: u64 = 0x0123_4567_89ab_cdef;

fn side() -> Sim {
    let mut s = Sim::new(8192, 0xee);
    s.register(MEM, 0, 4096, MEM_IOVA, ALL);
    s.register(RES, 4096, 64, RES_IOVA, access::LOCAL_WRITE);
    for (i, b) in s.arena[..4096].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13).wrapping_add(5);
    }
    s.arena[0x100..0x108].copy_from_slice(&BEFORE.to_ne_bytes());
    s
}

fn result() -> Sges {
    vec![(RES, RES_IOVA, 32)]
}

/// What goes wrong with the responder's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spoil {
    Nothing,
    /// MEM is invalidated.
    Stag,
    /// MEM ends before the target.
    Bounds,
    /// MEM loses the right the request needs.
    Rights,
    /// MEM moves 4 bytes up the arena: the target word is no longer aligned.
    Misaligned,
    /// The medium fails.
    Medium,
}

/// When the memory changes: before the request arrives, or between its
/// arrival (its checks passed) and its turn to be carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum When {
    Arrival,
    Execution,
}

impl Spoil {
    fn apply(self, s: &mut Sim, right: u32) {
        let r = s.regions.iter_mut().find(|r| r.stag == MEM).expect("MEM");
        match self {
            Spoil::Nothing => {}
            Spoil::Stag => r.valid = false,
            Spoil::Bounds => r.len = (AT - MEM_IOVA) as usize,
            Spoil::Rights => r.access &= !right,
            Spoil::Misaligned => r.at += 4,
            Spoil::Medium => s.media_fails = true,
        }
    }
}

/// What the exchange of one request left behind.
struct Run {
    pair: Pair,
}

impl Run {
    /// Side 0 posts `op` to side 1, whose memory is spoiled `when` asked;
    /// both run until nothing moves (media results let through).
    fn new(op: WrOp<Sges>, payload: Sges, spoil: Spoil, when: When, right: u32) -> Run {
        let mut a = side();
        a.post(op, payload, false);
        let mut pair = Pair::connected(a, side(), true, 16384, 4, 4);
        pair.ends[1].hold_media = true;
        match when {
            When::Arrival => spoil.apply(&mut pair.ends[1].mem, right),
            When::Execution => {
                while pair.ends[1].tx.irq.is_empty() {
                    assert!(pair.step(), "the request never arrived");
                }
                spoil.apply(&mut pair.ends[1].mem, right);
            }
        }
        pair.run();
        pair.release_media(1);
        pair.run();
        Run { pair }
    }

    /// The ULPDUs (DDP header and what follows it) the responder sent.
    fn answers(&self) -> Vec<Vec<u8>> {
        ulpdus(self.pair.sent(1))
    }

    fn requester_done(&self) -> &[(u32, Completion)] {
        &self.pair.ends[0].mem.sq_done
    }
}

/// Splits a stream of FPDUs with CRC into their ULPDUs, each CRC checked.
fn ulpdus(mut s: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let n = u16::from_be_bytes([s[0], s[1]]) as usize;
        let end = 2 + n + (4 - (2 + n) % 4) % 4;
        let crc = u32::from_le_bytes(s[end..end + 4].try_into().unwrap());
        assert_eq!(crc, mpa::crc32c(0, &s[..end]), "the CRC");
        out.push(s[2..2 + n].to_vec());
        s = &s[end + 4..];
    }
    out
}

/// An untagged DDP header, last segment, DDP and RDMAP version 1, MO 0.
fn untagged(opcode: u8, qn: u32, msn: u32) -> Vec<u8> {
    let mut h = vec![0x41, 0x40 | opcode, 0, 0, 0, 0];
    h.extend_from_slice(&qn.to_be_bytes());
    h.extend_from_slice(&msn.to_be_bytes());
    h.extend_from_slice(&[0; 4]);
    h
}

/// The response on queue 3, the first (MSN 1).
fn response(opcode: u8, body: &[u8]) -> Vec<u8> {
    let mut r = untagged(opcode, 3, 1);
    r.extend_from_slice(body);
    r
}

/// The Terminate about the first request on queue 1 (opcode `request`):
/// layer, error type and code, the DDP header copied (D set, DDP Segment
/// Length 0), no RDMAP header (RFC 7306 section 8.1).
fn terminate(layer: u8, etype: u8, ecode: u8, request: u8) -> Vec<u8> {
    let mut t = untagged(0x7, 2, 1);
    t.extend_from_slice(&[layer << 4 | etype, ecode, 0x40, 0, 0, 0]);
    t.extend_from_slice(&untagged(request, 1, 1));
    t
}

const ATOMIC_REQUEST: u8 = 0xa;
const ATOMIC_RESPONSE: u8 = 0xb;
const FLUSH_REQUEST: u8 = 0xc;
const FLUSH_RESPONSE: u8 = 0xd;
const VERIFY_REQUEST: u8 = 0xe;
const VERIFY_RESPONSE: u8 = 0xf;
const ATOMIC_WRITE_REQUEST: u8 = 0x10;
const ATOMIC_WRITE_RESPONSE: u8 = 0x11;

/// The Terminate codes of a refusal: RDMAP remote protection (invalid STag,
/// base or bounds, access rights), or RDMAP remote operation, catastrophic
/// error localized to the stream.
fn cause(spoil: Spoil) -> (u8, u8, u8) {
    match spoil {
        Spoil::Stag => (0, 1, 0),
        Spoil::Bounds => (0, 1, 1),
        Spoil::Rights => (0, 1, 2),
        Spoil::Misaligned | Spoil::Medium => (0, 2, 7),
        Spoil::Nothing => unreachable!(),
    }
}

/// The refusal that `spoil` is, as both sides see it: the responder's
/// Terminate (and its event), the requester's completion.
fn check_refused(run: &Run, spoil: Spoil, request: u8, what: &str) {
    let (layer, etype, ecode) = cause(spoil);
    assert_eq!(
        run.answers(),
        vec![terminate(layer, etype, ecode, request)],
        "{what}"
    );
    let f = run.pair.ends[1]
        .failed
        .as_ref()
        .expect("the responder failed");
    let (event, status) = if etype == 1 {
        (Event::QpAccessError, Status::RemoteAccess)
    } else {
        (Event::QpFatal, Status::RemoteOperation)
    };
    assert_eq!(f.event, event, "{what}");
    assert_eq!(
        run.requester_done(),
        &[(0, Completion::Error(status))],
        "{what}"
    );
}

fn target(s: &Sim) -> u64 {
    u64::from_ne_bytes(s.bytes(MEM, AT, 8).try_into().unwrap())
}

/// The atomic variants, each with the value the target holds afterwards.
fn atomics() -> Vec<(AtomicOp, u64)> {
    vec![
        (AtomicOp::FetchAdd { add: 5 }, BEFORE + 5),
        // Four 16-bit fields: the carry out of each is lost.
        (
            AtomicOp::MaskedFetchAdd {
                add: 0x0001_0001_0001_fff0,
                mask: 0x8000_8000_8000_8000,
            },
            0x0124_4568_89ac_cddf,
        ),
        (
            AtomicOp::CmpSwap {
                compare: BEFORE,
                swap: 7,
            },
            7,
        ),
        // Compare unequal: nothing changes, the original still comes back.
        (
            AtomicOp::CmpSwap {
                compare: 1,
                swap: 7,
            },
            BEFORE,
        ),
        // The top 16 bits compared, the low 32 swapped.
        (
            AtomicOp::MaskedCmpSwap {
                compare: 0x0123_0000_0000_0000,
                compare_mask: 0xffff_0000_0000_0000,
                swap: 0xaaaa_bbbb_cccc_dddd,
                swap_mask: 0x0000_0000_ffff_ffff,
            },
            0x0123_4567_cccc_dddd,
        ),
        (
            AtomicOp::MaskedCmpSwap {
                compare: 0x0124_0000_0000_0000,
                compare_mask: 0xffff_0000_0000_0000,
                swap: 0xaaaa_bbbb_cccc_dddd,
                swap_mask: 0x0000_0000_ffff_ffff,
            },
            BEFORE,
        ),
        (AtomicOp::Swap { swap: 0x5555 }, 0x5555),
    ]
}

fn atomic(op: AtomicOp) -> WrOp<Sges> {
    WrOp::Atomic {
        op,
        stag: MEM,
        to: AT,
        result: result(),
    }
}

#[test]
fn an_atomic_is_answered_with_its_request_id_and_the_original() {
    for (op, after) in atomics() {
        let run = Run::new(atomic(op), result(), Spoil::Nothing, When::Arrival, 0);
        // Request Identifier 1 (the first), the original value.
        let mut body = vec![0, 0, 0, 1];
        body.extend_from_slice(&BEFORE.to_be_bytes());
        assert_eq!(
            run.answers(),
            vec![response(ATOMIC_RESPONSE, &body)],
            "{op:?}"
        );
        let [a, b] = &run.pair.ends;
        assert!(b.failed.is_none(), "{op:?}");
        assert_eq!(target(&b.mem), after, "{op:?}");
        assert_eq!(
            a.mem.bytes(RES, RES_IOVA, 8),
            BEFORE.to_ne_bytes(),
            "{op:?}"
        );
        assert_eq!(run.requester_done(), &[(0, Completion::Success)]);
    }
}

#[test]
fn a_refused_atomic_is_terminated_and_leaves_the_target_alone() {
    let spoils = [Spoil::Stag, Spoil::Bounds, Spoil::Rights, Spoil::Misaligned];
    for (op, _) in atomics() {
        for when in [When::Arrival, When::Execution] {
            for spoil in spoils {
                let run = Run::new(atomic(op), result(), spoil, when, access::REMOTE_ATOMIC);
                let what = format!("{op:?} {spoil:?} at {when:?}");
                check_refused(&run, spoil, ATOMIC_REQUEST, &what);
                let b = &run.pair.ends[1].mem;
                assert_eq!(b.arena[..4096], side().arena[..4096], "{what}");
            }
        }
    }
}

fn flush(len: u32, flags: u32) -> WrOp<Sges> {
    WrOp::Flush {
        stag: MEM,
        to: AT,
        len,
        flags,
    }
}

#[test]
fn a_flush_is_answered_with_an_empty_response() {
    for flags in [
        FLUSH_GLOBAL_VISIBILITY,
        FLUSH_PERSISTENCE,
        FLUSH_PERSISTENCE | FLUSH_GLOBAL_VISIBILITY,
    ] {
        for len in [0, 64] {
            let run = Run::new(flush(len, flags), vec![], Spoil::Nothing, When::Arrival, 0);
            assert_eq!(
                run.answers(),
                vec![response(FLUSH_RESPONSE, &[])],
                "{flags} {len}"
            );
            assert_eq!(run.requester_done(), &[(0, Completion::Success)]);
        }
    }
    // A Flush of nothing names no memory: it is answered whatever its STag.
    let run = Run::new(
        flush(0, FLUSH_PERSISTENCE),
        vec![],
        Spoil::Stag,
        When::Arrival,
        0,
    );
    assert_eq!(run.answers(), vec![response(FLUSH_RESPONSE, &[])]);
}

#[test]
fn a_refused_flush_is_terminated() {
    for (flags, right) in [
        (FLUSH_GLOBAL_VISIBILITY, access::FLUSH_GLOBAL),
        (FLUSH_PERSISTENCE, access::FLUSH_PERSISTENT),
    ] {
        for when in [When::Arrival, When::Execution] {
            for spoil in [Spoil::Stag, Spoil::Bounds, Spoil::Rights] {
                let run = Run::new(flush(64, flags), vec![], spoil, when, right);
                let what = format!("flags {flags} {spoil:?} at {when:?}");
                check_refused(&run, spoil, FLUSH_REQUEST, &what);
            }
        }
    }
    // The medium fails under a Flush to persistence; one to global
    // visibility does not reach it.
    let run = Run::new(
        flush(64, FLUSH_PERSISTENCE),
        vec![],
        Spoil::Medium,
        When::Execution,
        0,
    );
    check_refused(&run, Spoil::Medium, FLUSH_REQUEST, "medium");
    let run = Run::new(
        flush(64, FLUSH_GLOBAL_VISIBILITY),
        vec![],
        Spoil::Medium,
        When::Execution,
        0,
    );
    assert_eq!(run.answers(), vec![response(FLUSH_RESPONSE, &[])]);
}

/// A Verify of 64 bytes at the target, with `expected` as its hash.
fn verify(expected: &[u8]) -> WrOp<Sges> {
    let mut hash = [0u8; 32];
    hash[..expected.len()].copy_from_slice(expected);
    WrOp::Verify {
        stag: MEM,
        to: AT,
        len: 64,
        hash,
        hash_len: expected.len() as u8,
        result: result(),
    }
}

/// The hash of the Verify's range, as the responder computes it.
fn hash_of_target() -> Vec<u8> {
    Sim::hash(side().bytes(MEM, AT, 64))
}

#[test]
fn a_verify_is_answered_with_the_hash() {
    let hash = hash_of_target();
    // With the matching hash given, and with none.
    for expected in [&hash[..], &[]] {
        let run = Run::new(verify(expected), result(), Spoil::Nothing, When::Arrival, 0);
        assert_eq!(
            run.answers(),
            vec![response(VERIFY_RESPONSE, &hash)],
            "{expected:?}"
        );
        let a = &run.pair.ends[0];
        assert_eq!(a.mem.bytes(RES, RES_IOVA, hash.len()), &hash[..]);
        assert_eq!(
            run.requester_done(),
            &[(0, Completion::SuccessLen(hash.len() as u32))]
        );
    }
}

#[test]
fn a_verify_whose_hash_differs_is_terminated_without_a_response() {
    let mut wrong = hash_of_target();
    wrong[0] ^= 1;
    let run = Run::new(verify(&wrong), result(), Spoil::Nothing, When::Arrival, 0);
    assert_eq!(run.answers(), vec![terminate(0, 2, 7, VERIFY_REQUEST)]);
    assert_eq!(
        run.requester_done(),
        &[(0, Completion::Error(Status::RemoteOperation))]
    );
    let f = run.pair.ends[1].failed.as_ref().unwrap();
    assert_eq!(f.event, Event::QpFatal);
    // Nothing of the hash reached the requester.
    assert_eq!(run.pair.ends[0].mem.bytes(RES, RES_IOVA, 4), &[0xee; 4]);
}

#[test]
fn a_refused_verify_is_terminated() {
    let hash = hash_of_target();
    for expected in [&hash[..], &[]] {
        for when in [When::Arrival, When::Execution] {
            for spoil in [Spoil::Stag, Spoil::Bounds, Spoil::Rights] {
                let run = Run::new(verify(expected), result(), spoil, when, access::VERIFY);
                let what = format!("{expected:?} {spoil:?} at {when:?}");
                check_refused(&run, spoil, VERIFY_REQUEST, &what);
            }
        }
        let run = Run::new(
            verify(expected),
            result(),
            Spoil::Medium,
            When::Execution,
            0,
        );
        check_refused(&run, Spoil::Medium, VERIFY_REQUEST, "medium");
    }
}

const VALUE: u64 = 0x1122_3344_5566_7788;

fn atomic_write() -> WrOp<Sges> {
    WrOp::AtomicWrite {
        stag: MEM,
        to: AT,
        value: VALUE,
    }
}

#[test]
fn an_atomic_write_is_answered_with_an_empty_response() {
    let run = Run::new(atomic_write(), vec![], Spoil::Nothing, When::Arrival, 0);
    assert_eq!(run.answers(), vec![response(ATOMIC_WRITE_RESPONSE, &[])]);
    assert_eq!(target(&run.pair.ends[1].mem), VALUE);
    assert_eq!(run.requester_done(), &[(0, Completion::Success)]);
}

#[test]
fn a_refused_atomic_write_is_terminated_and_stores_nothing() {
    let spoils = [Spoil::Stag, Spoil::Bounds, Spoil::Rights, Spoil::Misaligned];
    for when in [When::Arrival, When::Execution] {
        for spoil in spoils {
            let run = Run::new(atomic_write(), vec![], spoil, when, access::REMOTE_WRITE);
            let what = format!("{spoil:?} at {when:?}");
            check_refused(&run, spoil, ATOMIC_WRITE_REQUEST, &what);
            let b = &run.pair.ends[1].mem;
            assert_eq!(b.arena[..4096], side().arena[..4096], "{what}");
        }
    }
}
