//! Two engines back to back running arbitrary work (Sends, Writes with and
//! without immediate data, Reads, atomics, Flushes, Atomic Writes, some with
//! bad keys or out of bounds) under arbitrary faults (a cut or a corrupted
//! byte, any segmentation, media results held back): never a panic or a
//! livelock, every work request completes exactly once, and memory no one may
//! write stays as it was.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xiw_engine::pair::{Faults, Pair};
use xiw_engine::queue1::access;
use xiw_engine::send::{AtomicOp, WrOp};
use xiw_engine::sim::{Sim, SimRecv, FLUSH_PERSISTENCE};

const ALL: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
// Per side: RW (arena 0..2048), RO (2048..3072, remote read only), LOC
// (4096..6144, local write only); 3072..4096 and 6144.. never registered.
const RW: u32 = 0x10;
const RO: u32 = 0x20;
const LOC: u32 = 0x30;

fn side(seed: u8) -> Sim {
    let mut s = Sim::new(8192, 0x5a);
    s.register(RW, 0, 2048, 0x1_0000, ALL | access::FLUSH_PERSISTENT);
    s.register(RO, 2048, 1024, 0x2_0000, access::REMOTE_READ);
    s.register(LOC, 4096, 2048, 0x3_0000, access::LOCAL_WRITE);
    for (i, b) in s.arena[..3072].iter_mut().enumerate() {
        *b = (i as u8) ^ seed;
    }
    s
}

/// Reads the input a byte at a time (zeros once it runs out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
}

/// A remote key: usually a good one, sometimes not.
fn rkey(b: &mut Bytes, good: u32) -> u32 {
    match b.u8() % 8 {
        0 => 0x99,
        1 => RO,
        _ => good,
    }
}

fn post(s: &mut Sim, b: &mut Bytes) -> usize {
    let n = (b.u8() % 8) as usize;
    for _ in 0..n {
        let kind = b.u8() % 7;
        let len = (b.u16() % 1500) as u32;
        let off = (b.u16() % 2048) as u64;
        let fence = b.u8() % 5 == 0;
        let local = vec![(
            if b.u8() % 16 == 0 { 0x77 } else { RW },
            0x1_0000 + off % 512,
            len,
        )];
        let sink = vec![(LOC, 0x3_0000 + off % 512, len)];
        let op = match kind {
            0 => WrOp::Send {
                solicited: false,
                invalidate: None,
                imm: None,
            },
            1 => WrOp::Send {
                solicited: true,
                invalidate: None,
                imm: Some(7),
            },
            2 => WrOp::Write {
                stag: rkey(b, RW),
                to: 0x1_0000 + off,
                imm: (b.u8() % 2 == 0).then_some(3),
                solicited: false,
            },
            3 => {
                s.post(
                    WrOp::Read {
                        stag: rkey(b, RO),
                        to: 0x2_0000 + off % 1024,
                        sink_stag: LOC,
                        sink_to: 0x3_0000 + off % 512,
                        sink: sink.clone(),
                    },
                    sink,
                    fence,
                );
                continue;
            }
            4 => {
                let result = vec![(LOC, 0x3_0000 + (off % 256) * 8, 8)];
                s.post(
                    WrOp::Atomic {
                        op: AtomicOp::FetchAdd { add: 1 },
                        stag: rkey(b, RW),
                        to: 0x1_0000 + (off % 256) * 8,
                        result: result.clone(),
                    },
                    result,
                    fence,
                );
                continue;
            }
            5 => {
                s.post(
                    WrOp::Flush {
                        stag: rkey(b, RW),
                        to: 0x1_0000 + off % 1024,
                        len: len % 1024,
                        flags: FLUSH_PERSISTENCE,
                    },
                    vec![],
                    fence,
                );
                continue;
            }
            _ => {
                s.post(
                    WrOp::AtomicWrite {
                        stag: rkey(b, RW),
                        to: 0x1_0000 + (off % 256) * 8,
                        value: 9,
                    },
                    vec![],
                    fence,
                );
                continue;
            }
        };
        s.post(op, local, fence);
    }
    n
}

fn recvs(s: &mut Sim, b: &mut Bytes) -> usize {
    let n = (b.u8() % 10) as usize;
    for i in 0..n {
        let len = b.u16() % 2048;
        s.recvs.push_back(SimRecv {
            wr_id: i as u64,
            sges: vec![(LOC, 0x3_0000, len as u32)],
        });
    }
    n
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let cfg = b.u8();
    let crc = cfg & 1 != 0;
    let mulpdu = [64, 512, 1400, 16384][(cfg >> 1 & 3) as usize];
    let (ord, ird) = (u32::from(b.u8() % 4 + 1), u32::from(b.u8() % 4 + 1));
    let (mut a, mut z) = (side(1), side(2));
    let sends = [post(&mut a, &mut b), post(&mut z, &mut b)];
    let posted_recvs = [recvs(&mut a, &mut b), recvs(&mut z, &mut b)];
    let before = [a.arena.clone(), z.arena.clone()];
    let mut p = Pair::connected(a, z, crc, mulpdu, ord, ird);
    for dir in 0..2 {
        let f = b.u8();
        p.faults[dir] = Faults {
            cut_at: (f & 1 != 0).then(|| u64::from(b.u16())),
            corrupt_at: (f & 2 != 0).then(|| (u64::from(b.u16()), b.u8() | 1)),
            chunk: usize::from(b.u8() % 32),
            stalled: false,
        };
        p.ends[dir].hold_media = f & 4 != 0;
    }
    p.run();
    for i in 0..2 {
        p.release_media(i);
    }
    p.run();
    let settled = (0..2).all(|i| p.ends[i].all_completed(sends[i], posted_recvs[i]));
    if !settled {
        // A stalled stream (a corrupted length, work waiting for a peer that
        // failed): the application gives up on the connection.
        p.close();
    }
    for (i, e) in p.ends.iter().enumerate() {
        assert!(
            e.all_completed(sends[i], posted_recvs[i]),
            "side {i}: {:?}",
            e.mem.sq_done
        );
        let guarded = |k: usize| (2048..4096).contains(&k) || k >= 6144;
        for k in 0..before[i].len() {
            if guarded(k) {
                assert_eq!(e.mem.arena[k], before[i][k], "side {i} byte {k} written");
            }
        }
    }
});
