//! `soak`: many QPs, both directions at once, a long random mix of every
//! operation xiw carries: Send, RDMA Write, RDMA Read, Fetch-and-Add,
//! Compare-and-Swap, Atomic Write and Flush, mostly small (0 bytes to
//! 16 KiB, some at the FPDU boundaries), in random SGE layouts, signaled and
//! not, posted through `ibv_post_send` and the `ibv_wr_*` builders in turn.
//!
//! Both sides derive the same operation streams from the seed, so each knows
//! what the other will do: every completion is checked (status, opcode,
//! wr_id order, length), every byte that lands is checked at the side where it
//! lands (receive buffers, Write targets, Read sinks, atomic results), every
//! byte around them must still hold the poison pattern, and the atomic words
//! must hold what the sequence of atomics leaves there.
//!
//! Operations run in rounds of up to [`PER_ROUND`] per QP and direction, each
//! closed by a signaled Send (which also tells the target that the Writes
//! before it are placed); the two processes meet between rounds over the
//! out-of-band connection.

use super::integrity::{
    check_next, quiet_end, timed_out, verify_region, wr_id, Claim, Expect, Local, TAG_RECV,
};
use super::*;
use xiw_tests::ibv::{ExOp, ExWr};

/// Most operations per QP and direction in one round (plus the closing Send).
const PER_ROUND: usize = 48;
/// Largest total of one round's payload per QP and direction.
const BUDGET: usize = 384 * 1024;
/// Each QP's target for the peer's Writes (a round's Writes and the gaps
/// between them fit).
const TGT_LEN: usize = BUDGET + PER_ROUND * 64 + 4096;
/// The region the peer reads from.
const SRC_LEN: usize = 128 * 1024;
/// The atomic words of each QP: word 0 takes Fetch-and-Add and
/// Compare-and-Swap, word 1 Atomic Write; the rest must stay poisoned.
const ATOM_LEN: usize = 64;
const LOCAL_MRS: usize = 4;
/// xiw's default FPDU payload size (XIW_MULPDU) and DDP's 16 KiB.
const FPDU: [usize; 2] = [65_400, 16_384];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    Read,
    FetchAdd,
    CmpSwp,
    AtomicWrite,
    Flush,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Send,
        Kind::Write,
        Kind::Read,
        Kind::FetchAdd,
        Kind::CmpSwp,
        Kind::AtomicWrite,
        Kind::Flush,
    ];

    fn code(self) -> u64 {
        self as u64 + 1
    }

    /// Needs the `ibv_wr_*` builders (xiwdv's Flush; Atomic Write has no
    /// `ibv_post_send` opcode in every rdma-core served).
    fn ex_only(self) -> bool {
        matches!(self, Kind::AtomicWrite | Kind::Flush)
    }
}

#[derive(Clone, Debug)]
struct Op {
    seq: u64,
    kind: Kind,
    len: usize,
    signaled: bool,
    inline: bool,
    /// Write: offset in the peer's target; Read: offset in its source.
    remote_off: usize,
    seed: u64,
    /// Fetch-and-Add: the addend; Compare-and-Swap: the compare value.
    add: u64,
    /// Compare-and-Swap: the swap value; Atomic Write: the value.
    swap: u64,
    /// The atomic word's value before this atomic (what it returns).
    old: u64,
    /// Compare-and-Swap: compares with the word's value (or one bit off).
    hit: bool,
}

/// One side's requests on one QP, as both sides derive them.
struct Stream {
    rng: fastrand::Rng,
    left: usize,
    pending: Option<Op>,
    seq: u64,
    base: u64,
    max_inline: usize,
    /// The atomic words as the requests so far leave them.
    word: [u64; 2],
}

fn draw_len(rng: &mut fastrand::Rng) -> usize {
    match rng.u32(0..100) {
        0..=4 => 0,
        5..=49 => rng.usize(1..=64),
        50..=84 => rng.usize(65..=4096),
        85..=96 => rng.usize(4097..=16_384),
        _ => {
            let unit = FPDU[rng.usize(0..FPDU.len())];
            unit + rng.usize(0..=64) - 32
        }
    }
}

impl Stream {
    fn new(seed: u64, q: usize, dir: usize, ops: usize, max_inline: usize) -> Stream {
        let base = mix(seed, &[q as u64, dir as u64, 0x50a4]);
        Stream {
            rng: fastrand::Rng::with_seed(base),
            left: ops,
            pending: None,
            seq: 0,
            base,
            max_inline,
            word: [0; 2],
        }
    }

    fn gen(&mut self) -> Op {
        let r = &mut self.rng;
        let kind = match r.u32(0..100) {
            0..=29 => Kind::Send,
            30..=54 => Kind::Write,
            55..=74 => Kind::Read,
            75..=82 => Kind::FetchAdd,
            83..=89 => Kind::CmpSwp,
            90..=94 => Kind::AtomicWrite,
            _ => Kind::Flush,
        };
        let len = match kind {
            Kind::Send | Kind::Write | Kind::Read => draw_len(r),
            Kind::Flush => r.usize(1..=TGT_LEN),
            _ => 8,
        };
        // Drawn for every kind, so both sides stay in step.
        let (sig, inl, roff, add, swap, hit) = (
            r.bool(),
            r.bool(),
            r.usize(0..=SRC_LEN - len.min(SRC_LEN)),
            r.u64(..),
            r.u64(..),
            r.u32(0..4) != 0,
        );
        self.seq += 1;
        Op {
            seq: self.seq,
            kind,
            len,
            signaled: sig,
            inline: inl && matches!(kind, Kind::Send | Kind::Write) && len <= self.max_inline,
            remote_off: if kind == Kind::Read { roff } else { 0 },
            seed: mix(self.base, &[self.seq]),
            add,
            swap,
            hit,
            old: 0,
        }
    }

    /// The next round's operations, closed by a signaled Send.
    fn round(&mut self) -> Vec<Op> {
        let mut ops: Vec<Op> = Vec::new();
        let (mut used, mut tgt) = (0usize, 0usize);
        while ops.len() < PER_ROUND && self.left > 0 {
            let mut op = match self.pending.take() {
                Some(op) => op,
                None => self.gen(),
            };
            if !ops.is_empty() && used + op.len > BUDGET && op.kind != Kind::Flush {
                self.pending = Some(op);
                break;
            }
            self.left -= 1;
            match op.kind {
                Kind::Write => {
                    used += op.len;
                    tgt += self.rng.usize(0..=64);
                    op.remote_off = tgt;
                    tgt += op.len;
                }
                Kind::Send | Kind::Read => used += op.len,
                Kind::FetchAdd => {
                    op.old = self.word[0];
                    self.word[0] = op.old.wrapping_add(op.add);
                }
                Kind::CmpSwp => {
                    op.old = self.word[0];
                    if op.hit {
                        op.add = op.old;
                        self.word[0] = op.swap;
                    } else {
                        op.add = op.old ^ 1 << (op.add % 64);
                    }
                }
                Kind::AtomicWrite => self.word[1] = op.swap,
                Kind::Flush => {}
            }
            ops.push(op);
        }
        if !ops.is_empty() {
            self.seq += 1;
            let len = self.rng.usize(1..=64);
            ops.push(Op {
                seq: self.seq,
                kind: Kind::Send,
                len,
                signaled: true,
                inline: false,
                remote_off: 0,
                seed: mix(self.base, &[self.seq]),
                add: 0,
                swap: 0,
                old: 0,
                hit: false,
            });
        }
        ops
    }
}

#[derive(Default)]
struct Totals {
    by_kind: [usize; 7],
    via_wr_builders: usize,
    inline: usize,
    unsignaled: usize,
    bytes: usize,
    wcs: usize,
}

struct Link {
    qp: Qp,
    /// Where the peer's Writes land, and its atomics.
    tgt: Mr,
    atom: Mr,
    peer_tgt: (u64, u32),
    peer_atom: (u64, u32),
}

pub fn run(a: &Args) -> Res<String> {
    on_device(a, body)
}

fn parse_pair(s: &str) -> Res<(u64, u32)> {
    let (x, y) = s.split_once(':').ok_or("bad address:rkey")?;
    Ok((
        x.parse().map_err(|_| "bad address")?,
        y.parse().map_err(|_| "bad rkey")?,
    ))
}

fn body(a: &Args, dev: &Dev) -> Res<String> {
    let client = a.server.is_some();
    let me = if client { 0 } else { 1 };
    let peer = 1 - me;
    let mut oob = Oob::open(a)?;
    let hello = oob.exchange(&[
        ("qps", a.qps.to_string()),
        ("ops", a.ops.to_string()),
        ("seed", a.seed.to_string()),
        ("gid", hex(&dev.gid)),
    ])?;
    let (qps, ops, seed) = if client {
        (a.qps, a.ops, a.seed)
    } else {
        (
            get(&hello, "qps")?,
            get(&hello, "ops")?,
            get(&hello, "seed")?,
        )
    };
    let peer_gid = unhex16(hello.get("gid").ok_or("no gid from the peer")?)?;

    let max_sge = dev.attr.max_sge.clamp(1, 8) as u32;
    let max_sge_rd = (dev.attr.max_sge_rd.clamp(1, 8) as usize).min(max_sge as usize);
    let depth = (PER_ROUND + 8) as u32;
    let scq = Cq::new(&dev.ctx, (qps as u32 * depth) as i32)
        .map_err(|e| format!("ibv_create_cq: {e}"))?;
    let rcq =
        Cq::new_ex(&dev.ctx, qps as u32 * depth).map_err(|e| format!("ibv_create_cq_ex: {e}"))?;
    let cap = ibv::ibv_qp_cap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: max_sge,
        max_recv_sge: max_sge,
        max_inline_data: 64,
    };
    let ex_ops = (sys::IBV_QP_EX_WITH_SEND
        | sys::IBV_QP_EX_WITH_RDMA_WRITE
        | sys::IBV_QP_EX_WITH_RDMA_READ
        | sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
        | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
        | sys::IBV_QP_EX_WITH_ATOMIC_WRITE) as u64
        | xiwdv::XIWDV_QP_EX_WITH_FLUSH;
    let remote = sys::IBV_ACCESS_LOCAL_WRITE
        | sys::IBV_ACCESS_REMOTE_READ
        | sys::IBV_ACCESS_REMOTE_WRITE
        | sys::IBV_ACCESS_REMOTE_ATOMIC;
    let mut links = Vec::new();
    for _ in 0..qps {
        let qp = Qp::new_ex(&dev.ctx, &dev.pd, &scq, &rcq, cap, false, ex_ops)
            .map_err(|e| format!("ibv_create_qp_ex: {e} (xiw: {})", xiwdv::last_error()))?;
        let tgt = Mr::new(&dev.pd, TGT_LEN, remote | xiwdv::IBV_ACCESS_FLUSH_GLOBAL)
            .map_err(|e| format!("ibv_reg_mr (flush global): {e}"))?;
        tgt.fill(0, TGT_LEN, POISON);
        let atom = Mr::new(&dev.pd, ATOM_LEN, remote).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        atom.fill(0, ATOM_LEN, POISON);
        atom.write(0, &[0; 16]);
        links.push(Link {
            qp,
            tgt,
            atom,
            peer_tgt: (0, 0),
            peer_atom: (0, 0),
        });
    }
    let src = Mr::new(&dev.pd, SRC_LEN, remote).map_err(|e| format!("ibv_reg_mr: {e}"))?;
    let src_data = [
        payload(mix(seed, &[0x5c, 0]), SRC_LEN),
        payload(mix(seed, &[0x5c, 1]), SRC_LEN),
    ];
    src.write(0, &src_data[me]);
    // A round's buffers at most: its own Sends, Reads and atomic results, the
    // peer's Sends with room to spare, and the gaps between them.
    let local_len = qps * (2 * BUDGET + 2 * depth as usize * (4096 + 64)) / LOCAL_MRS + (1 << 20);
    let mut local = Local::new(dev, LOCAL_MRS, local_len)?;

    let qpinfo: Vec<String> = links
        .iter()
        .map(|l| {
            format!(
                "{}:{}:{}:{}:{}",
                l.qp.qpn(),
                l.tgt.addr(),
                l.tgt.rkey(),
                l.atom.addr(),
                l.atom.rkey()
            )
        })
        .collect();
    let info = oob.exchange(&[
        ("src", format!("{}:{}", src.addr(), src.rkey())),
        ("inline", links[0].qp.cap().max_inline_data.to_string()),
        ("qps", qpinfo.join(",")),
    ])?;
    let peer_src = parse_pair(info.get("src").ok_or("no src from the peer")?)?;
    let max_inline = get::<usize>(&info, "inline")?.min(links[0].qp.cap().max_inline_data as usize);
    let peer_qps: Vec<&str> = info
        .get("qps")
        .ok_or("no qps from the peer")?
        .split(',')
        .collect();
    if peer_qps.len() != qps {
        return Err(format!(
            "the peer has {} QPs, we have {qps}",
            peer_qps.len()
        ));
    }
    for (l, s) in links.iter_mut().zip(&peer_qps) {
        let f: Vec<&str> = s.split(':').collect();
        if f.len() != 5 {
            return Err(format!("bad qp info {s:?}"));
        }
        let qpn: u32 = f[0].parse().map_err(|_| "bad qpn")?;
        l.peer_tgt = parse_pair(&format!("{}:{}", f[1], f[2]))?;
        l.peer_atom = parse_pair(&format!("{}:{}", f[3], f[4]))?;
        l.qp.to_init(remote)?;
        l.qp.to_rts(peer_gid, qpn, RD_ATOMIC)?;
    }

    let mut streams: Vec<[Stream; 2]> = (0..qps)
        .map(|q| {
            [
                Stream::new(seed, q, 0, ops, max_inline),
                Stream::new(seed, q, 1, ops, max_inline),
            ]
        })
        .collect();
    let mut lrng = fastrand::Rng::with_seed(mix(seed, &[0x10ca1, me as u64]));
    let mut tot = Totals::default();
    let start = Instant::now();
    let mut round = 0u64;
    loop {
        let plans: Vec<[Vec<Op>; 2]> = streams
            .iter_mut()
            .map(|s| [s[0].round(), s[1].round()])
            .collect();
        if plans.iter().all(|p| p[0].is_empty() && p[1].is_empty()) {
            break;
        }
        round += 1;
        let words: Vec<[u64; 2]> = streams.iter().map(|s| s[peer].word).collect();
        let ctx = Round {
            links: &links,
            cqs: [&scq, &rcq],
            plans: &plans,
            me,
            peer,
            src_data: &src_data,
            peer_src,
            max_sge: max_sge as usize,
            max_sge_rd,
            words: &words,
        };
        let r = run_round(&ctx, &mut local, &mut lrng, &mut tot, &mut oob, round);
        oob.sync(
            &format!("done{round}"),
            &r.as_ref()
                .map(|_| ())
                .map_err(|e| format!("round {round}: {e}")),
        )?;
        // Every request of both sides has completed at its requester, so the
        // peer's queue 1 requests (atomics among them) have been carried out
        // here: a Send behind them may complete before they are (RFC 5040
        // orders only their responses).
        let r = r.and_then(|expect| verify_targets(&ctx, &expect));
        oob.sync(
            &format!("round{round}"),
            &r.map_err(|e| format!("round {round}: {e}")),
        )?;
    }
    quiet_end(&[&scq, &rcq], links.iter().map(|l| &l.qp))?;
    oob.sync("end", &Ok(()))?;
    let secs = start.elapsed().as_secs_f64();
    let total: usize = tot.by_kind.iter().sum();
    let kinds: Vec<String> = Kind::ALL
        .iter()
        .zip(&tot.by_kind)
        .map(|(k, n)| format!("{n} {k:?}"))
        .collect();
    Ok(format!(
        "qps={qps} ops={ops} seed={seed} rounds={round}: requested {total} operations ({}; {} through \
         ibv_wr_*, {} inline, {} unsignaled), {:.1} MB of payload, {} completions checked, 0 corruptions, \
         in {secs:.1}s ({:.0} operations/s both ways)",
        kinds.join(", "),
        tot.via_wr_builders,
        tot.inline,
        tot.unsignaled,
        tot.bytes as f64 / 1e6,
        tot.wcs,
        2.0 * total as f64 / secs
    ))
}

/// What one round works on.
struct Round<'a> {
    links: &'a [Link],
    /// Send CQ, receive CQ.
    cqs: [&'a Cq; 2],
    plans: &'a [[Vec<Op>; 2]],
    me: usize,
    peer: usize,
    src_data: &'a [Vec<u8>; 2],
    peer_src: (u64, u32),
    max_sge: usize,
    max_sge_rd: usize,
    /// The peer's atomic words on each QP once this round is through.
    words: &'a [[u64; 2]],
}

/// A request in both forms; which one is posted is drawn per batch.
struct Wr {
    plain: Option<SendWr>,
    ex: ExWr,
}

fn build(
    c: &Round,
    l: &Link,
    q: usize,
    op: &Op,
    local: &mut Local,
    rng: &mut fastrand::Rng,
    tot: &mut Totals,
) -> Res<(Wr, Option<Expect>)> {
    let what = format!("qp{q} own {:?} #{} ({} bytes)", op.kind, op.seq, op.len);
    let id = wr_id(q, op.kind.code(), op.seq);
    let mut flags = 0;
    if op.signaled {
        flags |= sys::IBV_SEND_SIGNALED;
    } else {
        tot.unsignaled += 1;
    }
    tot.by_kind[op.kind as usize] += 1;
    if op.kind != Kind::Flush {
        tot.bytes += op.len;
    }
    let mut plain = SendWr {
        wr_id: id,
        flags,
        ..Default::default()
    };
    let (tgt_addr, tgt_rkey) = l.peer_tgt;
    let (atom_addr, atom_rkey) = l.peer_atom;
    let result8 =
        |local: &mut Local, rng: &mut fastrand::Rng, old: u64| -> Res<Vec<ibv::ibv_sge>> {
            let parts = local.sges(rng, 8, 1)?;
            local.claim(&parts, &old.to_ne_bytes(), &format!("{what} result"));
            Ok(local.sge_list(&parts))
        };
    let (ex_op, sges, opcode, byte_len) = match op.kind {
        Kind::Send | Kind::Write => {
            let parts = local.sges(rng, op.len, c.max_sge)?;
            let data = payload(op.seed, op.len);
            local.write(&parts, &data);
            local.claim(&parts, &data, &format!("{what} source"));
            let sges = local.sge_list(&parts);
            if op.kind == Kind::Send {
                plain.opcode = sys::IBV_WR_SEND;
                (ExOp::Send, sges, sys::IBV_WC_SEND, None)
            } else {
                plain.opcode = sys::IBV_WR_RDMA_WRITE;
                plain.remote_addr = tgt_addr + op.remote_off as u64;
                plain.rkey = tgt_rkey;
                let to = ExOp::Write {
                    rkey: tgt_rkey,
                    addr: tgt_addr + op.remote_off as u64,
                };
                (to, sges, sys::IBV_WC_RDMA_WRITE, None)
            }
        }
        Kind::Read => {
            let parts = local.sges(rng, op.len, c.max_sge_rd)?;
            let data = &c.src_data[c.peer][op.remote_off..op.remote_off + op.len];
            local.claim(
                &parts,
                data,
                &format!("{what} sink (peer offset {})", op.remote_off),
            );
            plain.opcode = sys::IBV_WR_RDMA_READ;
            plain.remote_addr = c.peer_src.0 + op.remote_off as u64;
            plain.rkey = c.peer_src.1;
            let from = ExOp::Read {
                rkey: c.peer_src.1,
                addr: c.peer_src.0 + op.remote_off as u64,
            };
            (
                from,
                local.sge_list(&parts),
                sys::IBV_WC_RDMA_READ,
                Some(op.len as u32),
            )
        }
        Kind::FetchAdd => {
            plain.opcode = sys::IBV_WR_ATOMIC_FETCH_AND_ADD;
            plain.remote_addr = atom_addr;
            plain.rkey = atom_rkey;
            plain.compare_add = op.add;
            let fa = ExOp::FetchAdd {
                rkey: atom_rkey,
                addr: atom_addr,
                add: op.add,
            };
            (
                fa,
                result8(local, rng, op.old)?,
                sys::IBV_WC_FETCH_ADD,
                Some(8),
            )
        }
        Kind::CmpSwp => {
            plain.opcode = sys::IBV_WR_ATOMIC_CMP_AND_SWP;
            plain.remote_addr = atom_addr;
            plain.rkey = atom_rkey;
            plain.compare_add = op.add;
            plain.swap = op.swap;
            let cs = ExOp::CmpSwp {
                rkey: atom_rkey,
                addr: atom_addr,
                compare: op.add,
                swap: op.swap,
            };
            (
                cs,
                result8(local, rng, op.old)?,
                sys::IBV_WC_COMP_SWAP,
                Some(8),
            )
        }
        Kind::AtomicWrite => {
            let aw = ExOp::AtomicWrite {
                rkey: atom_rkey,
                addr: atom_addr + 8,
                value: op.swap.to_ne_bytes(),
            };
            (aw, Vec::new(), sys::IBV_WC_ATOMIC_WRITE, None)
        }
        Kind::Flush => {
            let f = ExOp::Flush {
                rkey: tgt_rkey,
                addr: tgt_addr,
                len: op.len,
                placement: xiwdv::Placement::Global as u8,
                level: xiwdv::Selectivity::Range as u8,
            };
            (f, Vec::new(), xiwdv::XIWDV_WC_FLUSH, None)
        }
    };
    plain.sges = sges.clone();
    let plain = (!op.kind.ex_only()).then_some(plain);
    let ex = ExWr {
        wr_id: id,
        flags,
        op: ex_op,
        sges,
    };
    let expect = op.signaled.then_some(Expect {
        wr_id: id,
        opcode,
        byte_len,
        what,
    });
    Ok((Wr { plain, ex }, expect))
}

/// What the peer's Writes of a round leave in each QP's target: the claims
/// and the extent they cover.
type Targets = Vec<(Vec<Claim>, usize)>;

fn run_round(
    c: &Round,
    local: &mut Local,
    rng: &mut fastrand::Rng,
    tot: &mut Totals,
    oob: &mut Oob,
    round: u64,
) -> Res<Targets> {
    local.reset();
    let n = c.links.len();
    // Receives for the peer's Sends, and what its Writes leave in our targets.
    let mut tgt_claims: Vec<Vec<Claim>> = (0..n).map(|_| Vec::new()).collect();
    let mut tgt_used = vec![0usize; n];
    let mut want_recv: Vec<VecDeque<Expect>> = (0..n).map(|_| VecDeque::new()).collect();
    for (q, l) in c.links.iter().enumerate() {
        let mut wrs = Vec::new();
        for op in &c.plans[q][c.peer] {
            match op.kind {
                Kind::Send => {
                    let extra = if rng.bool() { 0 } else { rng.usize(1..=4096) };
                    let parts = local.sges(rng, op.len + extra, c.max_sge)?;
                    let what = format!("qp{q} peer Send #{} ({} bytes) receive", op.seq, op.len);
                    local.claim(&parts, &payload(op.seed, op.len), &what);
                    let id = wr_id(q, TAG_RECV, op.seq);
                    wrs.push(RecvWr {
                        wr_id: id,
                        sges: local.sge_list(&parts),
                        num_sge: None,
                    });
                    want_recv[q].push_back(Expect {
                        wr_id: id,
                        opcode: sys::IBV_WC_RECV,
                        byte_len: Some(op.len as u32),
                        what,
                    });
                }
                Kind::Write => {
                    tgt_used[q] = tgt_used[q].max(op.remote_off + op.len);
                    tgt_claims[q].push(Claim {
                        off: op.remote_off,
                        data: payload(op.seed, op.len),
                        what: format!("qp{q} peer Write #{} ({} bytes)", op.seq, op.len),
                    });
                }
                _ => {}
            }
        }
        let mut i = 0;
        while i < wrs.len() {
            let k = rng.usize(1..=8).min(wrs.len() - i);
            l.qp.post_recv(&wrs[i..i + k]).map_err(|(j, e)| {
                format!(
                    "qp{q}: ibv_post_recv refused WR {j} of {k}: {}",
                    ibv::errno_str(e)
                )
            })?;
            i += k;
        }
    }
    oob.sync(&format!("posted{round}"), &Ok(()))?;

    // Our requests, in batches of 1 to 8, each posted through ibv_post_send
    // or the ibv_wr_* builders (always the builders for a batch with an
    // operation only they can post); the QPs take turns.
    let mut want_send: Vec<VecDeque<Expect>> = (0..n).map(|_| VecDeque::new()).collect();
    let mut posts: Vec<Vec<Wr>> = Vec::new();
    for (q, l) in c.links.iter().enumerate() {
        let mut wrs = Vec::new();
        for op in &c.plans[q][c.me] {
            let (wr, expect) = build(c, l, q, op, local, rng, tot)?;
            if let Some(e) = expect {
                want_send[q].push_back(e);
            }
            wrs.push((wr, op.inline));
        }
        posts.push(
            wrs.into_iter()
                .map(|(mut w, inline)| {
                    if let (Some(p), true) = (&mut w.plain, inline) {
                        p.flags |= sys::IBV_SEND_INLINE;
                    }
                    w
                })
                .collect(),
        );
    }
    let mut next = vec![0usize; n];
    while next.iter().zip(&posts).any(|(i, p)| *i < p.len()) {
        for q in 0..n {
            let i = next[q];
            if i >= posts[q].len() {
                continue;
            }
            let k = rng.usize(1..=8).min(posts[q].len() - i);
            let batch = &posts[q][i..i + k];
            let qp = &c.links[q].qp;
            let plain: Option<Vec<SendWr>> = if rng.bool() {
                batch.iter().map(|w| w.plain.clone()).collect()
            } else {
                None
            };
            match plain {
                Some(wrs) => {
                    tot.inline += wrs
                        .iter()
                        .filter(|w| w.flags & sys::IBV_SEND_INLINE != 0)
                        .count();
                    qp.post_send(&wrs).map_err(|(j, e)| {
                        format!(
                            "qp{q}: ibv_post_send refused WR {j} of {k}: {}",
                            ibv::errno_str(e)
                        )
                    })?
                }
                None => {
                    let wrs: Vec<ExWr> = batch.iter().map(|w| w.ex.clone()).collect();
                    tot.via_wr_builders += k;
                    qp.post_ex(&wrs).map_err(|e| {
                        format!(
                            "qp{q}: ibv_wr_complete refused a batch of {k}: {} (xiw: {})",
                            ibv::errno_str(e),
                            xiwdv::last_error()
                        )
                    })?
                }
            }
            next[q] += k;
        }
    }

    // Completions: per QP in order, each exactly as expected.
    let total: usize = want_send.iter().chain(&want_recv).map(|w| w.len()).sum();
    let deadline = Instant::now() + Duration::from_secs(30);
    let qpn_index: HashMap<u32, usize> = c
        .links
        .iter()
        .enumerate()
        .map(|(q, l)| (l.qp.qpn(), q))
        .collect();
    let mut seen = 0;
    while seen < total {
        let mut any = false;
        for (ci, cq) in c.cqs.iter().enumerate() {
            let wcs = cq.poll(64).map_err(|e| format!("poll_cq returned {e}"))?;
            any |= !wcs.is_empty();
            for w in wcs {
                seen += 1;
                let q = *qpn_index
                    .get(&w.qp_num)
                    .ok_or_else(|| format!("completion for an unknown QP: {}", fmt_wc(&w)))?;
                let queue = if ci == 1 {
                    &mut want_recv[q]
                } else {
                    &mut want_send[q]
                };
                check_next(queue, q, &w, ci == 1)?;
                tot.wcs += 1;
            }
        }
        if seen >= total {
            break;
        }
        if Instant::now() > deadline {
            return Err(timed_out(seen, total, &[&want_send, &want_recv]));
        }
        if !any {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    // Our Reads and atomics and the peer's Sends are in.
    local.verify()?;
    Ok(tgt_claims.into_iter().zip(tgt_used).collect())
}

/// The peer's Writes and atomics of the round, once both sides' requests
/// have completed; the targets are poisoned again for the next round.
fn verify_targets(c: &Round, t: &Targets) -> Res {
    for (q, (l, (claims, used))) in c.links.iter().zip(t).enumerate() {
        verify_region(&l.tgt, *used, claims, &format!("qp{q} write target"))?;
        l.tgt.fill(0, *used, POISON);
        let atom = l.atom.read(0, ATOM_LEN);
        for (k, want) in c.words[q].iter().enumerate() {
            let got = u64::from_ne_bytes(atom[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
            if got != *want {
                return Err(format!(
                    "qp{q}: atomic word {k} holds {got:#x}, expected {want:#x} after the peer's atomics"
                ));
            }
        }
        if let Some(i) = atom[16..].iter().position(|&b| b != POISON) {
            return Err(format!(
                "qp{q}: atomic region byte {} is {:#04x}, expected untouched",
                16 + i,
                atom[16 + i]
            ));
        }
    }
    Ok(())
}
