//! Framing a small Send or Write the moment it is posted (`Sender::frame_now`):
//! the stream carries exactly what the usual path (queue, then `frame_more`)
//! would put there, MSNs run on across both paths, and a request that does
//! not qualify, or a sender with anything ahead of it, is left to the usual
//! path with nothing changed.

use xiw_engine::pair::{Faults, Pair};
use xiw_engine::queue1::access;
use xiw_engine::send::{Completion, Params, Sender, WrOp};
use xiw_engine::sim::{RecvOutcome, Sges, Sim, SimRecv};

const SRC: u32 = 0x10;
const BASE: u64 = 0x1_0000;

fn mem() -> Sim {
    let mut s = Sim::new(8192, 0);
    s.register(SRC, 0, 8192, BASE, access::LOCAL_WRITE);
    for (i, b) in s.arena.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13).wrapping_add(5);
    }
    s
}

fn params(crc: bool, mulpdu: usize) -> Params {
    Params {
        crc,
        mulpdu,
        gate: false,
        rtr: false,
        peer_ird: 4,
        ord: 4,
        ird: 4,
        inplace_min: 0,
    }
}

fn sender(crc: bool, mulpdu: usize) -> Sender<Sges, Sges> {
    Sender::new(params(crc, mulpdu))
}

fn ops() -> Vec<WrOp<Sges>> {
    vec![
        WrOp::Send {
            solicited: false,
            invalidate: None,
            imm: None,
        },
        WrOp::Send {
            solicited: true,
            invalidate: None,
            imm: None,
        },
        WrOp::Send {
            solicited: false,
            invalidate: Some(0x1234_5678),
            imm: None,
        },
        WrOp::Send {
            solicited: true,
            invalidate: Some(0x42),
            imm: None,
        },
        WrOp::Write {
            stag: 0xabcd_0001,
            to: 0x1122_3344_5566_7788,
            imm: None,
            solicited: false,
        },
    ]
}

/// What the usual path puts on the stream for `reqs` posted one after the
/// other, each sent before the next is posted.
fn usual(crc: bool, mulpdu: usize, reqs: &[(WrOp<Sges>, usize, usize)]) -> Vec<u8> {
    let mut m = mem();
    let mut tx = sender(crc, mulpdu);
    let mut out = Vec::new();
    for (op, off, len) in reqs {
        m.post(
            op.clone(),
            vec![(SRC, BASE + *off as u64, *len as u32)],
            false,
        );
        while tx.frame_more(&mut m).unwrap() {
            out.extend_from_slice(tx.pending());
            let n = tx.pending().len();
            tx.advance(n);
            tx.complete_written(&mut m);
        }
    }
    assert_eq!(m.sq_done.len(), reqs.len());
    out
}

/// The same requests framed by `frame_now`.
fn now(crc: bool, mulpdu: usize, reqs: &[(WrOp<Sges>, usize, usize)]) -> Vec<u8> {
    let m = mem();
    let mut tx = sender(crc, mulpdu);
    let mut out = Vec::new();
    for (op, off, len) in reqs {
        assert!(tx.idle());
        let src = &m.arena[*off..off + len];
        let framed = tx.frame_now(op.now_op().expect("framed now"), *len, |b| fill(b, src));
        assert_eq!(framed, Ok(true), "{op:?}");
        out.extend_from_slice(tx.pending());
        let n = tx.pending().len();
        tx.advance(n);
        assert!(tx.idle());
    }
    out
}

fn fill(out: &mut [u8], src: &[u8]) -> Result<(), ()> {
    out.copy_from_slice(src);
    Ok(())
}

/// `frame_now` with `payload`: whether it framed it.
fn try_now(tx: &mut Sender<Sges, Sges>, op: &WrOp<Sges>, payload: &[u8]) -> bool {
    op.now_op().is_some_and(|op| {
        tx.frame_now(op, payload.len(), |b| fill(b, payload))
            .unwrap()
    })
}

#[test]
fn framed_now_the_stream_carries_what_the_usual_path_sends() {
    for crc in [true, false] {
        for (k, op) in ops().into_iter().enumerate() {
            for len in [0, 1, 2, 3, 4, 5, 63, 64, 300] {
                let reqs = [(op.clone(), k * 7, len)];
                assert_eq!(
                    now(crc, 300, &reqs),
                    usual(crc, 300, &reqs),
                    "crc {crc}, {op:?}, {len} bytes"
                );
            }
        }
    }
}

#[test]
fn msns_run_on_across_requests_framed_now() {
    // Every kind in turn, twice: each Send takes the next MSN of queue 0.
    let reqs: Vec<_> = ops()
        .into_iter()
        .chain(ops())
        .enumerate()
        .map(|(k, op)| (op, k * 11, 1 + k * 3))
        .collect();
    for crc in [true, false] {
        assert_eq!(now(crc, 1024, &reqs), usual(crc, 1024, &reqs), "crc {crc}");
    }
}

#[test]
fn a_request_that_does_not_qualify_changes_nothing() {
    let payload = [7u8; 64];
    let refused: Vec<WrOp<Sges>> = vec![
        WrOp::Send {
            solicited: false,
            invalidate: None,
            imm: Some(1),
        },
        WrOp::Write {
            stag: 1,
            to: 0,
            imm: Some(1),
            solicited: false,
        },
        WrOp::Read {
            stag: 1,
            to: 0,
            sink_stag: SRC,
            sink_to: BASE,
            sink: vec![(SRC, BASE, 8)],
        },
        WrOp::LocalInvalidate { stag: 1 },
    ];
    for op in &refused {
        let mut tx = sender(true, 1024);
        assert!(!try_now(&mut tx, op, &payload), "{op:?}");
        assert!(tx.idle() && !tx.has_pending());
    }
    // Longer than one FPDU.
    let mut tx = sender(true, 63);
    assert!(!try_now(&mut tx, &ops()[0], &payload));
    assert!(tx.idle() && !tx.has_pending());
    // Nothing goes out before the peer's first FPDU, nor after a Terminate.
    let mut tx = sender(true, 1024);
    tx.gate = true;
    assert!(!try_now(&mut tx, &ops()[0], &payload));
    assert!(!tx.has_pending());
    let mut tx = sender(true, 1024);
    tx.terminate(vec![0; 28]);
    assert!(!tx.idle() && !try_now(&mut tx, &ops()[0], &payload));
    assert!(!tx.has_pending());
    // The ready-to-receive goes first.
    let mut tx = Sender::<Sges, Sges>::new(Params {
        rtr: true,
        ..params(true, 1024)
    });
    assert!(!try_now(&mut tx, &ops()[4], &payload));
    assert!(!tx.has_pending());
}

#[test]
fn a_payload_that_cannot_be_gathered_frames_nothing_and_takes_no_msn() {
    for crc in [true, false] {
        let mut tx = sender(crc, 1024);
        assert_eq!(
            tx.frame_now(ops()[0].now_op().expect("framed now"), 10, |_| Err("gone")),
            Err("gone")
        );
        assert!(tx.idle() && !tx.has_pending());
        // The next Send still carries MSN 1.
        let reqs = [(ops()[0].clone(), 0, 10)];
        let mut out = Vec::new();
        let m = mem();
        assert!(try_now(&mut tx, &reqs[0].0, &m.arena[..10]));
        out.extend_from_slice(tx.pending());
        assert_eq!(out, usual(crc, 1024, &reqs));
    }
}

#[test]
fn bytes_ahead_of_it_leave_a_request_to_the_usual_path() {
    let mut m = mem();
    let mut tx = sender(false, 1024);
    m.post(ops()[0].clone(), vec![(SRC, BASE, 10)], false);
    assert!(tx.frame_more(&mut m).unwrap());
    // Framed, not yet taken by the stream.
    assert!(!tx.idle());
    let before = tx.pending().to_vec();
    assert!(!try_now(&mut tx, &ops()[4], &[1, 2]));
    assert_eq!(tx.pending(), &before[..]);
    let n = before.len();
    tx.advance(n);
    tx.complete_written(&mut m);
    assert_eq!(m.sq_done, vec![(0, Completion::Success)]);
    assert!(tx.idle());
}

#[test]
fn a_request_framed_now_and_not_all_taken_completes_when_it_is() {
    let mut m = mem();
    let mut tx = sender(true, 1024);
    assert!(try_now(&mut tx, &ops()[4], &[9; 40]));
    let total = tx.pending().len();
    tx.advance(10);
    tx.complete_at(0);
    tx.complete_written(&mut m);
    assert!(m.sq_done.is_empty());
    assert!(!tx.idle());
    tx.advance(total - 10);
    tx.complete_written(&mut m);
    assert_eq!(m.sq_done, vec![(0, Completion::Success)]);
    assert!(tx.idle());
}

/// The pair's side A posts small Writes and Sends in groups, the stream
/// settling between them, as an application posts over time: some alone,
/// one behind a Read (which keeps it queued), one too long to frame at
/// once, one with a bad key when `bad_key`; side B posts the receives.
/// `faults` apply to the stream from A once it is up; once A has failed it
/// posts no more. Returns the pair and how many requests A posted.
fn small_traffic(crc: bool, now: bool, bad_key: bool, faults: Faults) -> (Pair, usize) {
    let side = |seed: u8| {
        let mut s = Sim::new(16384, 0xee);
        s.register(
            SRC,
            0,
            4096,
            BASE,
            access::LOCAL_WRITE | access::REMOTE_READ,
        );
        s.register(
            0x20,
            4096,
            4096,
            0x2_0000,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        );
        for (i, b) in s.arena[..4096].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(11).wrapping_add(seed);
        }
        s
    };
    let (a, mut b) = (side(1), side(2));
    for k in 0..3u64 {
        b.recvs.push_back(SimRecv {
            wr_id: 300 + k,
            sges: vec![(0x20, 0x2_0000 + 2048 + 640 * k, 640)],
        });
    }
    let mut p = Pair::connected(a, b, crc, 256, 4, 4);
    for e in &mut p.ends {
        e.post_now = now;
    }
    // The ready-to-receive, and the stream is up.
    p.run();
    p.faults[0] = faults;
    let write = |to: u64| WrOp::Write {
        stag: 0x20,
        to: 0x2_0000 + to,
        imm: None,
        solicited: false,
    };
    let send = WrOp::Send {
        solicited: false,
        invalidate: None,
        imm: None,
    };
    let read = WrOp::Read {
        stag: SRC,
        to: BASE + 100,
        sink_stag: 0x20,
        sink_to: 0x2_0000 + 1000,
        sink: vec![(0x20, 0x2_0000 + 1000, 300)],
    };
    let key = if bad_key { 0x99 } else { SRC };
    let groups: Vec<Vec<(WrOp<Sges>, Sges)>> = vec![
        vec![(write(0), vec![(SRC, BASE, 10)])],
        vec![(send.clone(), vec![(SRC, BASE + 10, 20)])],
        vec![
            (read, vec![(0x20, 0x2_0000 + 1000, 300)]),
            (write(100), vec![(SRC, BASE + 40, 30)]),
        ],
        vec![(send.clone(), vec![(SRC, BASE + 70, 600)])],
        vec![(write(200), vec![(key, BASE + 700, 7)])],
        vec![(send, vec![(SRC, BASE + 800, 2), (SRC, BASE + 900, 3)])],
    ];
    let mut posted = 0;
    for g in groups {
        if p.ends[0].failed.is_some() {
            break;
        }
        for (op, sges) in g {
            p.ends[0].mem.post(op, sges, false);
            posted += 1;
        }
        p.run();
    }
    (p, posted)
}

#[test]
fn framing_at_once_in_a_pair_gives_the_same_stream_and_outcome() {
    for crc in [true, false] {
        let run = |now: bool| {
            let (p, _) = small_traffic(crc, now, false, Faults::default());
            assert!(p.ends.iter().all(|e| e.failed.is_none()));
            assert!(p.ends[0].all_completed(7, 0) && p.ends[1].all_completed(0, 3));
            let framed_now = p.ends[0].framed_now;
            let [a, b] = p.ends;
            (
                framed_now,
                (a.mem.arena, b.mem.arena, a.mem.sq_done, b.mem.completed),
            )
        };
        let (n_queued, queued) = run(false);
        let (n_now, now) = run(true);
        assert_eq!(n_queued, 0);
        // All but the Read, the Write behind it and the long Send.
        assert_eq!(n_now, 4, "crc {crc}: {n_now} framed at once");
        assert_eq!(now, queued, "crc {crc}");
        assert!(queued.3.iter().all(|c| matches!(c.1, RecvOutcome::Done(_))));
    }
}

#[test]
fn a_bad_key_posted_with_nothing_ahead_fails_as_it_does_when_queued() {
    let run = |now: bool| {
        let (p, _) = small_traffic(true, now, true, Faults::default());
        let f = p.ends[0].failed.as_ref().expect("the bad key fails side A");
        (f.sq_status, p.ends[0].mem.sq_done.clone())
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn a_fault_at_every_byte_offset_with_requests_framed_at_once() {
    let (clean, _) = small_traffic(true, true, false, Faults::default());
    let len = clean.sent(0).len() as u64;
    let mut failed = 0;
    for k in 0..len {
        for fault in 0..2 {
            let f = Faults {
                cut_at: (fault == 0).then_some(k),
                corrupt_at: (fault == 1).then_some((k, 0x41)),
                chunk: 1 + (k as usize % 17),
                stalled: false,
            };
            let (mut p, posted) = small_traffic(true, true, false, f);
            if !(p.ends[0].all_completed(posted, 0) && p.ends[1].all_completed(0, 3)) {
                p.close();
            }
            assert!(
                p.ends[0].all_completed(posted, 0) && p.ends[1].all_completed(0, 3),
                "fault {fault} at byte {k}: a work request did not complete once: {:?}",
                p.ends[0].mem.sq_done
            );
            failed += p.ends.iter().any(|e| e.failed.is_some()) as usize;
        }
    }
    // Every cut ends the connection (a corrupted byte of the ready-to-receive,
    // already delivered, does not).
    assert!(failed as u64 >= len, "{failed} of {} runs failed", 2 * len);
}
