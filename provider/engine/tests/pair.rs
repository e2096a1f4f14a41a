//! Two engines back to back (the in-memory `Pair`): a short mixed exchange
//! (Send, Write with Immediate, Read, atomic, Flush, Atomic Write) end to end,
//! the ordering rules of RFC 5040 section 5 and RFC 7306 section 5.4, and a
//! fault at every byte offset of the exchange: never a panic or a hang, the
//! QPs in error, every work request completed once, no stray write.

use xiw_engine::fault::Status;
use xiw_engine::pair::Pair;
use xiw_engine::queue1::access;
use xiw_engine::send::{AtomicOp, Completion, WrOp};
use xiw_engine::sim::{RecvOutcome, Sim, SimRecv, FLUSH_PERSISTENCE};

const ALL: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
/// Each side: SRC (arena 0..4096), DST (4096..8192), RO (8192..9216, remote
/// read only), LOC (10240..14336, local write only); the rest is never
/// registered.
const SRC: u32 = 0x10;
const DST: u32 = 0x20;
const RO: u32 = 0x30;
const LOC: u32 = 0x40;

fn side(seed: u8) -> Sim {
    let mut s = Sim::new(16384, 0xee);
    s.register(SRC, 0, 4096, 0x1_0000, ALL);
    s.register(DST, 4096, 4096, 0x2_0000, ALL | access::FLUSH_PERSISTENT);
    s.register(RO, 8192, 1024, 0x3_0000, access::REMOTE_READ);
    s.register(LOC, 10240, 4096, 0x4_0000, access::LOCAL_WRITE);
    for (i, b) in s.arena[..4096].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7).wrapping_add(seed);
    }
    for (i, b) in s.arena[8192..9216].iter_mut().enumerate() {
        *b = (i as u8) ^ seed;
    }
    // The atomic target: 40 at DST+3000.
    s.arena[4096 + 3000..4096 + 3008].copy_from_slice(&40u64.to_ne_bytes());
    s
}

const A_SENDS: usize = 6;
const A_RECVS: usize = 1;
const B_SENDS: usize = 1;
const B_RECVS: usize = 2;

/// The exchange: A sends six requests, B one; each posts its receives.
fn exchange(crc: bool, mulpdu: usize) -> Pair {
    let (mut a, mut b) = (side(1), side(2));
    a.post(
        WrOp::Send {
            solicited: false,
            invalidate: None,
            imm: None,
        },
        vec![(SRC, 0x1_0000, 3000)],
        false,
    );
    a.post(
        WrOp::Write {
            stag: DST,
            to: 0x2_0000 + 10,
            imm: Some(7),
            solicited: false,
        },
        vec![(SRC, 0x1_0000 + 100, 1000)],
        false,
    );
    a.post(
        WrOp::Read {
            stag: RO,
            to: 0x3_0000,
            sink_stag: DST,
            sink_to: 0x2_0000 + 2000,
            sink: vec![(DST, 0x2_0000 + 2000, 500)],
        },
        vec![(DST, 0x2_0000 + 2000, 500)],
        false,
    );
    a.post(
        WrOp::Atomic {
            op: AtomicOp::FetchAdd { add: 5 },
            stag: DST,
            to: 0x2_0000 + 3000,
            result: vec![(DST, 0x2_0000 + 3104, 8)],
        },
        vec![(DST, 0x2_0000 + 3104, 8)],
        false,
    );
    a.post(
        WrOp::Flush {
            stag: DST,
            to: 0x2_0000,
            len: 100,
            flags: FLUSH_PERSISTENCE,
        },
        vec![],
        false,
    );
    a.post(
        WrOp::AtomicWrite {
            stag: DST,
            to: 0x2_0000 + 3008,
            value: 0x1122_3344_5566_7788,
        },
        vec![],
        false,
    );
    a.recvs.push_back(SimRecv {
        wr_id: 100,
        sges: vec![(LOC, 0x4_0000, 64)],
    });
    b.post(
        WrOp::Send {
            solicited: false,
            invalidate: None,
            imm: Some(9),
        },
        vec![(SRC, 0x1_0000, 40)],
        false,
    );
    b.recvs.push_back(SimRecv {
        wr_id: 200,
        sges: vec![(LOC, 0x4_0000, 2000), (LOC, 0x4_0000 + 2048, 2000)],
    });
    b.recvs.push_back(SimRecv {
        wr_id: 201,
        sges: vec![(LOC, 0x4_0000, 16)],
    });
    Pair::connected(a, b, crc, mulpdu, 4, 4)
}

#[test]
fn a_mixed_exchange_lands_every_byte_and_completes_in_order() {
    for (crc, mulpdu) in [(true, 16384), (false, 1024), (true, 100)] {
        let mut p = exchange(crc, mulpdu);
        p.run();
        let [a, b] = &p.ends;
        assert!(
            a.failed.is_none() && b.failed.is_none(),
            "{:?} {:?}",
            a.failed,
            b.failed
        );
        let ok: Vec<(u32, Completion)> = (0..A_SENDS as u32)
            .map(|i| (i, Completion::Success))
            .collect();
        assert_eq!(a.mem.sq_done, ok, "A's sends, in order");
        assert_eq!(b.mem.sq_done, vec![(0, Completion::Success)]);
        // The Send, in two SGEs.
        let sent = a.mem.bytes(SRC, 0x1_0000, 3000).to_vec();
        assert_eq!(b.mem.completed[0].0, 200);
        assert_eq!(b.mem.bytes(LOC, 0x4_0000 + 2048, 1000), &sent[2000..]);
        // The Write, then its immediate in a receive of its own.
        assert_eq!(
            b.mem.bytes(DST, 0x2_0000 + 10, 1000),
            a.mem.bytes(SRC, 0x1_0000 + 100, 1000)
        );
        match &b.mem.completed[1] {
            (201, RecvOutcome::Done(c)) => {
                assert!(c.after_write && c.imm == Some(7) && c.byte_len == 1000)
            }
            other => panic!("{other:?}"),
        }
        // The Read.
        assert_eq!(
            a.mem.bytes(DST, 0x2_0000 + 2000, 500),
            b.mem.bytes(RO, 0x3_0000, 500)
        );
        // The atomic: the original came back, the target grew.
        assert_eq!(a.mem.bytes(DST, 0x2_0000 + 3104, 8), &40u64.to_ne_bytes());
        assert_eq!(b.mem.bytes(DST, 0x2_0000 + 3000, 8), &45u64.to_ne_bytes());
        // The Atomic Write.
        assert_eq!(
            b.mem.bytes(DST, 0x2_0000 + 3008, 8),
            &0x1122_3344_5566_7788u64.to_ne_bytes()
        );
        // B's Send with Immediate: one receive, with the immediate.
        match &a.mem.completed[0] {
            (100, RecvOutcome::Done(c)) => {
                assert!(c.imm == Some(9) && c.byte_len == 40 && !c.after_write)
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn queue1_responses_keep_request_order_while_a_flush_waits_on_the_medium() {
    let (mut a, b) = (side(1), side(2));
    a.post(
        WrOp::Flush {
            stag: DST,
            to: 0x2_0000,
            len: 64,
            flags: FLUSH_PERSISTENCE,
        },
        vec![],
        false,
    );
    a.post(
        WrOp::Read {
            stag: RO,
            to: 0x3_0000,
            sink_stag: DST,
            sink_to: 0x2_0000,
            sink: vec![(DST, 0x2_0000, 100)],
        },
        vec![(DST, 0x2_0000, 100)],
        false,
    );
    let mut p = Pair::connected(a, b, true, 16384, 4, 4);
    p.ends[1].hold_media = true;
    p.run();
    // The Read was answered by nothing yet: it waits behind the Flush.
    assert!(p.ends[0].mem.sq_done.is_empty());
    assert_eq!(p.ends[1].mem.deferred.len(), 1);
    p.release_media(1);
    p.run();
    assert_eq!(
        p.ends[0].mem.sq_done,
        vec![(0, Completion::Success), (1, Completion::Success)]
    );
}

#[test]
fn ord_bounds_the_requests_in_flight_and_a_fence_waits_for_them() {
    let (mut a, mut b) = (side(1), side(2));
    for i in 0..6u64 {
        a.post(
            WrOp::Read {
                stag: RO,
                to: 0x3_0000 + i * 100,
                sink_stag: DST,
                sink_to: 0x2_0000 + i * 100,
                sink: vec![(DST, 0x2_0000 + i * 100, 100)],
            },
            vec![(DST, 0x2_0000 + i * 100, 100)],
            false,
        );
    }
    a.post(
        WrOp::Send {
            solicited: false,
            invalidate: None,
            imm: None,
        },
        vec![(SRC, 0x1_0000, 8)],
        true,
    );
    b.recvs.push_back(SimRecv {
        wr_id: 1,
        sges: vec![(LOC, 0x4_0000, 8)],
    });
    let mut p = Pair::connected(a, b, false, 16384, 2, 2);
    let mut steps = 0;
    while p.step() {
        steps += 1;
        assert!(p.ends[0].tx.orq.len() <= 2, "more Reads in flight than ORD");
        if !p.ends[1].mem.completed.is_empty() {
            // The fenced Send arrived: every Read before it is done.
            assert!(p.ends[0].mem.sq_done.len() >= 6, "Send passed its fence");
        }
        assert!(steps < 10_000);
    }
    assert_eq!(p.ends[0].mem.sq_done.len(), 7);
    assert_eq!(p.ends[1].mem.completed.len(), 1);
}

#[test]
fn a_peer_that_stalls_holds_everything_until_it_reads_again() {
    let mut p = exchange(true, 512);
    p.faults[0].stalled = true;
    p.run();
    assert!(p.ends[1].mem.completed.is_empty());
    // The Send and the Write completed when the stream took them (RFC 5040
    // section 5); the Read waits for its data.
    assert_eq!(p.ends[0].mem.sq_done.len(), 2);
    p.faults[0].stalled = false;
    p.run();
    assert_eq!(p.ends[0].mem.sq_done.len(), A_SENDS);
    assert!(p.ends[0].all_completed(A_SENDS, A_RECVS) && p.ends[1].all_completed(B_SENDS, B_RECVS));
}

#[test]
fn any_segmentation_gives_the_same_outcome() {
    let reference = {
        let mut p = exchange(true, 300);
        p.run();
        (p.ends[0].mem.arena.clone(), p.ends[1].mem.arena.clone())
    };
    for chunk in [1, 2, 3, 5, 7, 64, 1000] {
        let mut p = exchange(true, 300);
        p.faults = [xiw_engine::pair::Faults {
            chunk,
            ..Default::default()
        }; 2];
        p.run();
        assert!(
            p.ends[0].failed.is_none() && p.ends[1].failed.is_none(),
            "chunk {chunk}"
        );
        assert_eq!(
            (p.ends[0].mem.arena.clone(), p.ends[1].mem.arena.clone()),
            reference,
            "chunk {chunk}"
        );
    }
}

#[test]
fn payload_sent_in_place_gives_the_stream_a_copy_gives() {
    // Without CRC, payloads of INPLACE_MIN bytes and more go out as spans of
    // registered memory; the bytes on the stream must be the same as when
    // every payload is copied into the sender's buffer, at any segmentation.
    for mulpdu in [1024, 300, 7] {
        let run = |inplace: bool| {
            let mut p = exchange(false, mulpdu);
            if !inplace {
                for e in &mut p.ends {
                    e.tx.set_inplace_min(0);
                }
            }
            p.run();
            assert!(p.ends.iter().all(|e| e.failed.is_none()));
            [p.sent(0).to_vec(), p.sent(1).to_vec()]
        };
        let copied = run(false);
        assert_eq!(run(true), copied, "mulpdu {mulpdu}");
        assert!(copied[0].len() > 4000);
    }
}

#[test]
fn a_span_whose_memory_went_away_names_a_local_protection_error() {
    // A Send framed in place whose source MR goes away before the stream
    // takes it: the driver, checking again as it transmits, finds the span
    // gone, and fails the QP with the status of a payload it cannot gather.
    let p = exchange(false, 1024);
    let [mut ea, _] = p.ends;
    let framed = ea.tx.frame_more(&mut ea.mem).unwrap();
    assert!(framed && ea.tx.has_spans());
    xiw_engine::recv::Host::invalidate(&mut ea.mem, SRC).unwrap();
    let mut lost = None;
    let mem = &ea.mem;
    ea.tx.pieces(|piece| match piece {
        xiw_engine::send::Piece::Bytes(_) => true,
        xiw_engine::send::Piece::Span(s) => match mem.read_span(&s, &mut Vec::new()) {
            Ok(()) => true,
            Err(_) => {
                lost = Some(s.fault());
                false
            }
        },
    });
    let f = lost.expect("the span is found gone");
    assert_eq!(f.sq_status, Some(Status::LocalProtection));
}

/// Memory nobody may write: RO, and everything never registered.
fn untouched(s: &Sim, before: &[u8]) -> Option<usize> {
    let guarded = |i: usize| (8192..10240).contains(&i) || i >= 14336;
    (0..before.len()).find(|&i| guarded(i) && s.arena[i] != before[i])
}

#[test]
fn a_fault_at_every_byte_offset_fails_cleanly() {
    let clean = {
        let mut p = exchange(true, 400);
        p.run();
        [p.sent(0).len(), p.sent(1).len()]
    };
    let before = [side(1).arena, side(2).arena];
    let mut runs = 0;
    for (dir, &len) in clean.iter().enumerate() {
        for k in 0..len as u64 {
            for fault in 0..2 {
                let mut p = exchange(true, 400);
                if fault == 0 {
                    p.faults[dir].cut_at = Some(k);
                } else {
                    p.faults[dir].corrupt_at = Some((k, 0x5a));
                }
                // Every other run in pieces, so that large payloads are
                // placed in place before their CRC is checked.
                if k % 2 == 1 {
                    p.faults[dir].chunk = 53;
                }
                p.run();
                runs += 1;
                let settled = p.ends[0].all_completed(A_SENDS, A_RECVS)
                    && p.ends[1].all_completed(B_SENDS, B_RECVS);
                if !settled {
                    // A corrupted length field leaves the receiver waiting
                    // for bytes that never come (MPA cannot tell before the
                    // CRC): the application gives up on the connection.
                    assert!(fault == 1 || p.ends.iter().any(|e| e.failed.is_some()));
                    p.close();
                }
                let what = format!(
                    "{} at byte {k} from side {dir}",
                    ["cut", "corruption"][fault]
                );
                assert!(
                    p.ends[0].all_completed(A_SENDS, A_RECVS)
                        && p.ends[1].all_completed(B_SENDS, B_RECVS),
                    "{what}: a work request did not complete once: {:?} {:?}",
                    p.ends[0].mem.sq_done,
                    p.ends[1].mem.sq_done
                );
                assert!(
                    p.ends[0].failed.is_some() || p.ends[1].failed.is_some(),
                    "{what}: nobody noticed"
                );
                for (i, (e, b)) in p.ends.iter().zip(&before).enumerate() {
                    if let Some(at) = untouched(&e.mem, b) {
                        panic!("{what}: side {i} byte {at} written");
                    }
                }
                // The side that failed first reports it on its oldest request
                // or a receive; every other request is flushed.
                for e in &p.ends {
                    let errors = e
                        .mem
                        .sq_done
                        .iter()
                        .filter(|c| {
                            !matches!(
                                c.1,
                                Completion::Success | Completion::Error(Status::Flushed)
                            )
                        })
                        .count();
                    assert!(errors <= 1, "{what}: {errors} non-flush errors");
                }
            }
        }
    }
    eprintln!("{runs} faulted runs");
    assert!(runs > 1000, "{runs} runs");
}

mod negotiated {
    use super::*;
    use proptest::prelude::*;
    use xiw_engine::setup::Local;
    use xiw_engine::wire::mpa::RtrSet;

    const WRITE_RTR: RtrSet = RtrSet {
        send: false,
        write: true,
        read: false,
    };

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The MPA exchange decides CRC and IRD/ORD; the engines then honour
        /// it: CRC whenever either side asked, never more Reads in flight than
        /// the initiator's ORD or the responder's IRD, every Read answered.
        #[test]
        fn engines_keep_what_the_exchange_agreed(
            icrc in any::<bool>(), rcrc in any::<bool>(),
            iird in 1u16..6, iord in 1u16..6, rird in 1u16..6, rord in 1u16..6,
            reads in 1usize..12,
        ) {
            let (mut a, b) = (side(1), side(2));
            for i in 0..reads as u64 {
                let to = 0x2_0000 + i * 64;
                a.post(
                    WrOp::Read { stag: RO, to: 0x3_0000 + i * 64, sink_stag: DST, sink_to: to, sink: vec![(DST, to, 64)] },
                    vec![(DST, to, 64)],
                    false,
                );
            }
            let local = |crc, ird, ord| Local { crc, ird, ord, rtr: WRITE_RTR, data: Vec::new() };
            let (mut p, ia, ra) = Pair::negotiate(a, b, &local(icrc, iird, iord), &local(rcrc, rird, rord), 512)
                .expect("the exchange succeeds");
            prop_assert_eq!(ia.crc, icrc || rcrc);
            prop_assert_eq!(ra.crc, icrc || rcrc);
            let ord = u32::from(iord.min(rird));
            while p.step() {
                prop_assert!(p.ends[0].tx.orq.len() as u32 <= ord);
                prop_assert!(p.ends[1].tx.irq.len() as u32 <= u32::from(rird));
            }
            prop_assert!(p.ends[0].failed.is_none() && p.ends[1].failed.is_none());
            prop_assert_eq!(p.ends[0].mem.sq_done.len(), reads);
            for i in 0..reads as u64 {
                let to = 0x2_0000 + i * 64;
                prop_assert_eq!(p.ends[0].mem.bytes(DST, to, 64), p.ends[1].mem.bytes(RO, 0x3_0000 + i * 64, 64));
            }
            // CRC on the wire exactly when agreed: a stream checked with the
            // other setting fails.
            let first = p.sent(0);
            let len = xiw_engine::wire::mpa::peek_fpdu_len(first).unwrap();
            prop_assert!(xiw_engine::wire::mpa::check_fpdu(&first[..len], ia.crc).is_ok());
            if ia.crc {
                prop_assert!(xiw_engine::wire::mpa::check_fpdu(&first[..len], true).is_ok());
                let trailer = &first[len - 4..len];
                prop_assert!(trailer != [0, 0, 0, 0]);
            }
        }
    }

    #[test]
    fn a_refused_exchange_starts_no_engine() {
        let none = RtrSet {
            send: false,
            write: false,
            read: false,
        };
        let read_only = RtrSet {
            send: false,
            write: false,
            read: true,
        };
        let l = |rtr| Local {
            crc: true,
            ird: 4,
            ord: 4,
            rtr,
            data: Vec::new(),
        };
        assert!(Pair::negotiate(side(1), side(2), &l(read_only), &l(WRITE_RTR), 512).is_err());
        // Neither side wants a ready-to-receive message: the responder may
        // send at once.
        let (mut p, ia, _) = Pair::negotiate(side(1), side(2), &l(none), &l(none), 512).unwrap();
        assert_eq!(ia.rtr, xiw_engine::wire::mpa::Rtr::None);
        p.ends[1].mem.post(
            WrOp::Send {
                solicited: false,
                invalidate: None,
                imm: None,
            },
            vec![(SRC, 0x1_0000, 16)],
            false,
        );
        p.ends[0].mem.recvs.push_back(SimRecv {
            wr_id: 5,
            sges: vec![(LOC, 0x4_0000, 16)],
        });
        p.run();
        assert_eq!(p.ends[0].mem.completed.len(), 1);
        assert!(
            p.sent(0).is_empty(),
            "the initiator sent no ready-to-receive"
        );
    }
}

/// The failing request completes first with its own status, then everything
/// after it is flushed; the peer learns why from the Terminate (RFC 5040
/// sections 5 and 7).
#[test]
fn a_refused_read_completes_first_with_its_own_status() {
    let (mut a, mut b) = (side(1), side(2));
    a.post(
        WrOp::Send {
            solicited: false,
            invalidate: None,
            imm: None,
        },
        vec![(SRC, 0x1_0000, 8)],
        false,
    );
    // The source STag is not B's: a remote access error.
    a.post(
        WrOp::Read {
            stag: 0x77,
            to: 0,
            sink_stag: DST,
            sink_to: 0x2_0000,
            sink: vec![(DST, 0x2_0000, 8)],
        },
        vec![(DST, 0x2_0000, 8)],
        false,
    );
    for _ in 0..3 {
        a.post(
            WrOp::Write {
                stag: DST,
                to: 0x2_0000,
                imm: None,
                solicited: false,
            },
            vec![(SRC, 0x1_0000, 8)],
            false,
        );
    }
    a.recvs.push_back(SimRecv {
        wr_id: 9,
        sges: vec![(LOC, 0x4_0000, 8)],
    });
    b.recvs.push_back(SimRecv {
        wr_id: 1,
        sges: vec![(LOC, 0x4_0000, 8)],
    });
    b.recvs.push_back(SimRecv {
        wr_id: 2,
        sges: vec![(LOC, 0x4_0000, 8)],
    });
    let mut p = Pair::connected(a, b, true, 16384, 4, 4);
    p.run();
    let a = &p.ends[0];
    assert_eq!(a.mem.sq_done[0], (0, Completion::Success));
    assert_eq!(
        a.mem.sq_done[1],
        (1, Completion::Error(Status::RemoteAccess))
    );
    // The Writes behind the Read went out before the Terminate came back:
    // they completed (an iWARP Write completes when the stream takes it).
    assert!(a.mem.sq_done[2..]
        .iter()
        .all(|c| c.1 == Completion::Success));
    assert_eq!(
        a.mem.completed,
        vec![(9, RecvOutcome::Failed(Status::Flushed))]
    );
    let b = &p.ends[1];
    let f = b.failed.as_ref().expect("B refused the Read");
    let t = xiw_engine::wire::terminate::TerminateRepr::parse_bytes(f.term.as_deref().unwrap())
        .unwrap();
    assert_eq!(
        xiw_engine::wire::terminate::Cause::new(t.layer, t.etype, t.ecode),
        xiw_engine::wire::terminate::Cause::RDMAP_PROT_INVALID_STAG
    );
    assert!(
        t.hdrct_d && t.hdrct_r,
        "a Read Request's headers are copied"
    );
    assert_eq!(
        b.mem.completed[0],
        (
            1,
            RecvOutcome::Done(xiw_engine::recv::RecvCompletion {
                byte_len: 8,
                ..Default::default()
            })
        )
    );
    assert_eq!(
        b.mem.completed[1],
        (2, RecvOutcome::Failed(Status::Flushed))
    );
}

/// A local fault (a send buffer whose key is bad) fails the request with a
/// local protection error and tells the peer with a Terminate that carries
/// no headers (RFC 5040 section 7.1).
#[test]
fn a_bad_lkey_fails_locally_and_terminates_the_peer() {
    let (mut a, mut b) = (side(1), side(2));
    a.post(
        WrOp::Send {
            solicited: false,
            invalidate: None,
            imm: None,
        },
        vec![(0x99, 0, 8)],
        false,
    );
    a.post(
        WrOp::Send {
            solicited: false,
            invalidate: None,
            imm: None,
        },
        vec![(SRC, 0x1_0000, 8)],
        false,
    );
    b.recvs.push_back(SimRecv {
        wr_id: 1,
        sges: vec![(LOC, 0x4_0000, 8)],
    });
    let mut p = Pair::connected(a, b, true, 16384, 4, 4);
    p.run();
    assert_eq!(
        p.ends[0].mem.sq_done,
        vec![
            (0, Completion::Error(Status::LocalProtection)),
            (1, Completion::Error(Status::Flushed))
        ]
    );
    let f = p.ends[1].failed.as_ref().expect("B heard the Terminate");
    assert!(f.term.is_none(), "a Terminate is not answered with one");
    assert_eq!(
        p.ends[1].mem.completed,
        vec![(1, RecvOutcome::Failed(Status::Flushed))]
    );
    let t = p.ends[0].failed.as_ref().unwrap();
    let t = xiw_engine::wire::terminate::TerminateRepr::parse_bytes(t.term.as_deref().unwrap())
        .unwrap();
    assert_eq!(
        xiw_engine::wire::terminate::Cause::new(t.layer, t.etype, t.ecode),
        xiw_engine::wire::terminate::Cause::RDMAP_LOCAL_CATASTROPHIC
    );
    assert!(!t.hdrct_d && !t.hdrct_r);
    // Each side raised its one event, as a QP failing does.
    assert_eq!(p.ends[0].events, [xiw_engine::fault::Event::QpFatal]);
    assert_eq!(p.ends[1].events, [xiw_engine::fault::Event::QpFatal]);
}

/// With confirmed completions (`Sender::set_confirm`) a Write completes
/// only once the peer has answered the zero-length Read framed behind it,
/// by which time it is placed; a Write the peer refuses completes with the
/// peer's error instead of success.
#[test]
fn confirmed_completions_wait_for_the_peer() {
    let (mut a, b) = (side(1), side(2));
    a.post(
        WrOp::Write {
            stag: DST,
            to: 0x2_0000,
            imm: None,
            solicited: false,
        },
        vec![(SRC, 0x1_0000, 64)],
        false,
    );
    // RO grants no remote write: B refuses it.
    a.post(
        WrOp::Write {
            stag: RO,
            to: 0x3_0000,
            imm: None,
            solicited: false,
        },
        vec![(SRC, 0x1_0000, 8)],
        false,
    );
    let mut p = Pair::connected(a, b, true, 16384, 4, 4);
    p.ends[0].tx.set_confirm(true);
    // B's answers are held back: A's Write lands, and does not complete.
    p.faults[1].stalled = true;
    p.run();
    assert_eq!(
        &p.ends[1].mem.arena[4096..4096 + 64],
        &p.ends[0].mem.arena[..64],
        "the Write is placed"
    );
    assert!(
        p.ends[0].mem.sq_done.is_empty(),
        "completed before the peer answered: {:?}",
        p.ends[0].mem.sq_done
    );
    p.faults[1].stalled = false;
    p.run();
    let a = &p.ends[0];
    assert_eq!(a.mem.sq_done[0], (0, Completion::Success));
    assert_eq!(
        a.mem.sq_done[1],
        (1, Completion::Error(Status::RemoteAccess))
    );
}

/// A zero-length Read names no memory: the responder does not check its
/// source STag and answers it with a zero-length Read Response (RFC 5040
/// section 5.2.1), and the Read completes.
#[test]
fn a_zero_length_read_of_any_stag_is_answered() {
    let (mut a, b) = (side(1), side(2));
    a.post(
        WrOp::Read {
            stag: 0x7777,
            to: 0xdead_0000,
            sink_stag: DST,
            sink_to: 0x2_0000,
            sink: vec![],
        },
        vec![],
        false,
    );
    let mut p = Pair::connected(a, b, true, 16384, 4, 4);
    p.run();
    assert_eq!(p.ends[0].mem.sq_done, vec![(0, Completion::Success)]);
    assert!(p.ends[0].failed.is_none() && p.ends[1].failed.is_none());
}

/// A connection that agreed on ORD 0 (the peer offered IRD 0, RFC 6581
/// section 7.1) sends no RDMA Read: one posted fails locally with the QP
/// operation error, and the peer never sees the request.
#[test]
fn with_ord_zero_no_read_goes_out() {
    let (mut a, b) = (side(1), side(2));
    a.post(
        WrOp::Read {
            stag: RO,
            to: 0x3_0000,
            sink_stag: DST,
            sink_to: 0x2_0000,
            sink: vec![(DST, 0x2_0000, 8)],
        },
        vec![(DST, 0x2_0000, 8)],
        false,
    );
    let mut p = Pair::connected(a, b, true, 16384, 0, 0);
    p.run();
    assert_eq!(
        p.ends[0].mem.sq_done,
        vec![(0, Completion::Error(Status::LocalQpOperation))]
    );
    let sent = p.sent(0);
    let mut at = 0;
    while at < sent.len() {
        let n = xiw_engine::wire::mpa::peek_fpdu_len(&sent[at..]).expect("whole FPDUs");
        let ctrl = xiw_engine::wire::rdmap::Ctrl::from_byte(sent[at + 3]);
        assert_ne!(
            xiw_engine::wire::rdmap::Opcode::from_u8(ctrl.opcode),
            Some(xiw_engine::wire::rdmap::Opcode::ReadRequest),
            "a Read Request went out"
        );
        at += n;
    }
}
