//! `fault --case CASE --op OP`: a steady stream of one kind of operation on a
//! QP to the peer (the victim), while a fault hits its connection, and beside
//! it a QP pair inside the client's own process (the bystander) carrying
//! checked traffic of its own.
//!
//! The fault comes from outside (tests/tests/faults.rs injects it: a TCP
//! reset, the link taken down) or, for `kill`, from the server itself, which
//! kills itself with SIGKILL in the middle of the stream. The client then
//! checks what an application relies on: every work request it posted
//! completes exactly once, in order; the first that fails carries the status
//! the fault calls for (`--expect`), every later one is flushed, none succeeds
//! after a failure; the QP is in the error state; no verb hangs; and the
//! bystander pair still carries checked traffic afterwards. With
//! `--expect survive` (a link down for less than the stream's time-out) no
//! request may fail at all, and every Send's bytes are checked by the server.
//!
//! Operations (`--op`): send, write, read, atomic (Fetch-and-Add), flush,
//! atomic-write, mixed (all of them in turn).

use super::*;
use xiw_tests::ibv::{ExOp, ExWr};

/// Requests in flight on the victim.
const WINDOW: u64 = 16;
/// Victim requests per second at most, so that the server's pre-posted
/// receives last the whole run.
const RATE: f64 = 2000.0;
/// Receives the server posts up front (and keeps posted).
const RQ_DEPTH: u32 = 16_384;
const SEND_MAX: usize = 256;
const REGION: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    Write,
    Read,
    Atomic,
    Flush,
    AtomicWrite,
}

const OPS: [Op; 6] = [
    Op::Send,
    Op::Write,
    Op::Read,
    Op::Atomic,
    Op::Flush,
    Op::AtomicWrite,
];

fn op_named(s: &str) -> Res<Option<Op>> {
    Ok(Some(match s {
        "send" => Op::Send,
        "write" => Op::Write,
        "read" => Op::Read,
        "atomic" => Op::Atomic,
        "flush" => Op::Flush,
        "atomic-write" => Op::AtomicWrite,
        "mixed" => return Ok(None),
        _ => return Err(format!("unknown --op {s}")),
    }))
}

/// What the client is told to expect of the victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// The peer dies or resets the stream: the first failure is any status a
    /// lost peer may give, the rest are flushed.
    Lost,
    /// The peer stops acknowledging for longer than the stream's time-out:
    /// the first failure is IBV_WC_RETRY_EXC_ERR.
    Retry,
    /// Nothing may fail.
    Survive,
    /// The peer refuses an access: IBV_WC_REM_ACCESS_ERR first.
    Access,
}

/// Options of this scenario, from `--case` values `key=value`.
struct Opts {
    kill: bool,
    /// The server deregisters the region the client writes into while its
    /// Writes are in flight, and checks that no byte lands after
    /// `ibv_dereg_mr` returned.
    dereg: bool,
    op: Option<Op>,
    expect: Expect,
    /// How long the client streams when nothing fails (`survive`), and at most
    /// otherwise, in seconds.
    secs: u64,
}

fn opts(a: &Args) -> Res<Opts> {
    let mut o = Opts {
        kill: false,
        dereg: false,
        op: None,
        expect: Expect::Lost,
        secs: 30,
    };
    for c in &a.cases {
        let (k, v) = c.split_once('=').unwrap_or((c.as_str(), ""));
        match k {
            "kill" => o.kill = true,
            "dereg" => o.dereg = true,
            "op" => o.op = op_named(v)?,
            "expect" => {
                o.expect = match v {
                    "lost" => Expect::Lost,
                    "retry" => Expect::Retry,
                    "survive" => Expect::Survive,
                    "access" => Expect::Access,
                    _ => return Err(format!("unknown expect={v}")),
                }
            }
            "secs" => o.secs = v.parse().map_err(|_| format!("bad secs={v}"))?,
            _ => return Err(format!("unknown fault option {c}")),
        }
    }
    Ok(o)
}

pub fn run(a: &Args) -> Res<String> {
    on_device(a, body)
}

fn body(a: &Args, dev: &Dev) -> Res<String> {
    let o = opts(a)?;
    let client = a.server.is_some();
    let mut oob = Oob::open(a)?;
    let cq = Cq::new(&dev.ctx, 4 * RQ_DEPTH as i32).map_err(|e| format!("ibv_create_cq: {e}"))?;
    let cap = ibv::ibv_qp_cap {
        max_send_wr: 64,
        max_recv_wr: RQ_DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ex_ops = (sys::IBV_QP_EX_WITH_SEND
        | sys::IBV_QP_EX_WITH_ATOMIC_WRITE
        | sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64
        | xiwdv::XIWDV_QP_EX_WITH_FLUSH;
    let qp = Qp::new_ex(&dev.ctx, &dev.pd, &cq, &cq, cap, false, ex_ops)
        .map_err(|e| format!("ibv_create_qp_ex: {e} (xiw: {})", xiwdv::last_error()))?;
    let remote = ALL_ACCESS | sys::IBV_ACCESS_REMOTE_ATOMIC | xiwdv::IBV_ACCESS_FLUSH_GLOBAL;
    let region = Mr::new(&dev.pd, REGION, remote).map_err(|e| format!("ibv_reg_mr: {e}"))?;
    region.write(0, &payload(mix(a.seed, &[0xfa]), REGION));
    let m = oob.exchange(&[
        ("qpn", qp.qpn().to_string()),
        ("gid", hex(&dev.gid)),
        ("addr", region.addr().to_string()),
        ("rkey", region.rkey().to_string()),
    ])?;
    let peer_gid = unhex16(m.get("gid").ok_or("no gid from the peer")?)?;
    let peer_region: (u64, u32) = (get(&m, "addr")?, get(&m, "rkey")?);
    qp.to_init(remote)?;
    qp.to_rts(peer_gid, get(&m, "qpn")?, RD_ATOMIC)?;
    if client {
        client_side(dev, &o, a.seed, &qp, &cq, peer_region, &mut oob)
    } else {
        server_side(dev, &o, a.seed, &qp, &cq, region, &mut oob)
    }
}

/// The responder: keeps receives posted and checks every Send's bytes, in
/// order; for `kill`, dies in the middle of the stream.
fn server_side(
    dev: &Dev,
    o: &Opts,
    seed: u64,
    qp: &Qp,
    cq: &Cq,
    region: Mr,
    oob: &mut Oob,
) -> Res<String> {
    let slot = SEND_MAX;
    let bufs = Mr::new(
        &dev.pd,
        RQ_DEPTH as usize * slot,
        sys::IBV_ACCESS_LOCAL_WRITE,
    )
    .map_err(|e| format!("ibv_reg_mr: {e}"))?;
    let recv = |i: u64| RecvWr {
        wr_id: i,
        sges: vec![bufs.sge((i % RQ_DEPTH as u64) as usize * slot, slot)],
        num_sge: None,
    };
    let wrs: Vec<RecvWr> = (0..RQ_DEPTH as u64).map(recv).collect();
    qp.post_recv(&wrs)
        .map_err(|(i, e)| format!("ibv_post_recv refused WR {i}: {}", ibv::errno_str(e)))?;
    let mut posted = RQ_DEPTH as u64;
    oob.sync("fault-ready", &Ok(()))?;
    if o.kill {
        // Let the client's stream get going, then die on the spot: no
        // verb, no close, nothing flushed.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: plain system calls on this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    // The region and what it held when ibv_dereg_mr returned.
    let mut region = Some(region);
    let mut gone: Option<(ibv::Mapping, Vec<u8>, Duration)> = None;
    let dereg_at = Instant::now() + Duration::from_millis(300);
    // Until the client says it is done: check the Sends as they come.
    oob.w
        .set_nonblocking(true)
        .map_err(|e| format!("out-of-band: {e}"))?;
    // Receives completed (`done`), and of them the Sends checked (`got`)
    // and the receives flushed.
    let (mut got, mut done, mut failed) = (0u64, 0u64, None::<String>);
    let mut flushed = 0u64;
    let mut line = String::new();
    loop {
        for w in cq.poll(64).map_err(|e| format!("poll_cq returned {e}"))? {
            done += 1;
            if w.status != sys::IBV_WC_SUCCESS {
                flushed += u64::from(w.status == sys::IBV_WC_WR_FLUSH_ERR);
                failed.get_or_insert_with(|| fmt_wc(&w));
                continue;
            }
            if failed.is_some() {
                return Err(format!(
                    "a receive succeeded after one failed: {}",
                    fmt_wc(&w)
                ));
            }
            if w.wr_id != got {
                return Err(format!(
                    "receive out of order: {} (expected wr_id {got})",
                    fmt_wc(&w)
                ));
            }
            let want = send_bytes(seed, got);
            let at = (got % RQ_DEPTH as u64) as usize * slot;
            if w.byte_len as usize != want.len() || bufs.read(at, want.len()) != want {
                return Err(format!(
                    "Send #{got}: wrong length or bytes: {}",
                    fmt_wc(&w)
                ));
            }
            got += 1;
            qp.post_recv(&[recv(posted)])
                .map_err(|(_, e)| format!("ibv_post_recv: {}", ibv::errno_str(e)))?;
            posted += 1;
        }
        if o.dereg && gone.is_none() && Instant::now() >= dereg_at {
            let t = Instant::now();
            let mr = region.take().expect("registered");
            let mem = mr
                .deregister()
                .map_err(|(_, e)| format!("ibv_dereg_mr: {}", ibv::errno_str(e)))?;
            let took = t.elapsed();
            let snap = mem.snapshot();
            gone = Some((mem, snap, took));
        }
        match oob.r.read_line(&mut line) {
            Ok(0) => return Err("the client closed the out-of-band connection".into()),
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("out-of-band: {e}")),
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    oob.w
        .set_nonblocking(false)
        .map_err(|e| format!("out-of-band: {e}"))?;
    let survive = line.trim() == "DONE survive";
    if survive && failed.is_some() {
        return Err(format!(
            "a receive failed in a run where nothing may: {failed:?}"
        ));
    }
    // The receives still posted: flushed, every one, once the QP is in error
    // (it may be already).
    let to_err = ibv::ibv_qp_attr {
        qp_state: sys::IBV_QPS_ERR,
        ..Default::default()
    };
    qp.modify(&to_err, sys::IBV_QP_STATE)
        .map_err(|e| format!("modify_qp to ERR: {}", ibv::errno_str(e)))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while done < posted {
        for w in cq.poll(256).map_err(|e| format!("poll_cq returned {e}"))? {
            if w.status == sys::IBV_WC_SUCCESS {
                // The last Sends may still land before the QP failed.
                got += 1;
            } else if w.status == sys::IBV_WC_WR_FLUSH_ERR {
                flushed += 1;
            } else {
                failed.get_or_insert_with(|| fmt_wc(&w));
            }
            done += 1;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {posted} receives never completed after the QP went to error",
                posted - done
            ));
        }
    }
    let mut dereg = String::new();
    if let Some((mem, snap, took)) = &gone {
        let now = mem.snapshot();
        if let Some(i) = now.iter().zip(snap).position(|(a, b)| a != b) {
            return Err(format!(
                "byte {i} of the deregistered region changed after ibv_dereg_mr returned"
            ));
        }
        dereg = format!(
            "; ibv_dereg_mr took {:.2} ms with Writes in flight, and no byte of its {} changed after it returned",
            took.as_secs_f64() * 1e3,
            now.len()
        );
    }
    oob.sync("fault-end", &Ok(()))?;
    Ok(format!(
        "{got} Sends received and checked, {flushed} receives flushed{}{dereg}",
        failed
            .map(|f| format!(", first failure: {f}"))
            .unwrap_or_default()
    ))
}

/// The bytes of the client's Send number `i`.
fn send_bytes(seed: u64, i: u64) -> Vec<u8> {
    let n = (mix(seed, &[i, 0x5e]) % SEND_MAX as u64) as usize;
    payload(mix(seed, &[i, 0x5d]), n)
}

/// A Read's sink offset, source offset and length.
type ReadAt = (usize, usize, usize);

/// A QP pair inside this process, carrying Writes and Sends whose bytes are
/// checked.
struct Bystander {
    /// Each QP with its own CQ.
    a: (Cq, Qp),
    b: (Cq, Qp),
    src: Mr,
    dst: Mr,
    rounds: u64,
}

impl Bystander {
    fn new(dev: &Dev) -> Res<Bystander> {
        let (a, b) = (small_qp(dev)?, small_qp(dev)?);
        a.1.to_init(ALL_ACCESS)?;
        b.1.to_init(ALL_ACCESS)?;
        a.1.to_rts(dev.gid, b.1.qpn(), RD_ATOMIC)?;
        b.1.to_rts(dev.gid, a.1.qpn(), RD_ATOMIC)?;
        let src = Mr::new(&dev.pd, 8192, ALL_ACCESS).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let dst = Mr::new(&dev.pd, 8192, ALL_ACCESS).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        Ok(Bystander {
            a,
            b,
            src,
            dst,
            rounds: 0,
        })
    }

    /// One checked round: a Write and a Send from `a` to `b`.
    fn round(&mut self) -> Res {
        let k = self.rounds;
        self.rounds += 1;
        let data = payload(mix(k, &[0xb7]), 8192);
        self.src.write(0, &data);
        self.dst.fill(0, 8192, POISON);
        self.b
            .1
            .post_recv(&[RecvWr {
                wr_id: k,
                sges: vec![self.dst.sge(4096, 4096)],
                num_sge: None,
            }])
            .map_err(|(_, e)| format!("bystander ibv_post_recv: {}", ibv::errno_str(e)))?;
        let write = SendWr {
            wr_id: k,
            opcode: sys::IBV_WR_RDMA_WRITE,
            sges: vec![self.src.sge(0, 4096)],
            remote_addr: self.dst.addr(),
            rkey: self.dst.rkey(),
            ..Default::default()
        };
        let send = SendWr {
            wr_id: k,
            opcode: sys::IBV_WR_SEND,
            flags: sys::IBV_SEND_SIGNALED,
            sges: vec![self.src.sge(4096, 4096)],
            ..Default::default()
        };
        self.a
            .1
            .post_send(&[write, send])
            .map_err(|(_, e)| format!("bystander ibv_post_send: {}", ibv::errno_str(e)))?;
        let wcs = wait_wcs(
            &[&self.a.0, &self.b.0],
            2,
            Instant::now() + Duration::from_secs(10),
            "bystander",
        )?;
        for w in &wcs {
            if w.status != sys::IBV_WC_SUCCESS {
                return Err(format!("bystander round {k}: {}", fmt_wc(w)));
            }
        }
        if self.dst.read(0, 8192) != data {
            return Err(format!("bystander round {k}: the bytes differ"));
        }
        Ok(())
    }
}

/// The requester: streams operations on the victim until it fails (or, for
/// `survive`, for the time given), keeping the bystander busy.
fn client_side(
    dev: &Dev,
    o: &Opts,
    seed: u64,
    qp: &Qp,
    cq: &Cq,
    peer: (u64, u32),
    oob: &mut Oob,
) -> Res<String> {
    let mut by = Bystander::new(dev)?;
    let local = Mr::new(&dev.pd, REGION, ALL_ACCESS).map_err(|e| format!("ibv_reg_mr: {e}"))?;
    let peer_data = payload(mix(seed, &[0xfa]), REGION);
    oob.sync("fault-ready", &Ok(()))?;
    let start = Instant::now();
    let limit = start + Duration::from_secs(o.secs);
    let (mut posted, mut done, mut sends) = (0u64, 0u64, 0u64);
    // Per WR: what it was, and for a Read where its bytes went and came from.
    let mut inflight: VecDeque<(u64, Op, Option<ReadAt>)> = VecDeque::new();
    let mut first_err: Option<(u64, Op, u32)> = None;
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let mut reads_checked = 0u64;
    // A post the QP refused, once in error: it noticed the fault.
    let mut refused: Option<u64> = None;
    let mut by_next = Instant::now();
    loop {
        // Post while the window and the rate allow, until something failed.
        // Sends are paced, so that the server's receives last; other
        // requests go as fast as the window allows.
        let due = if matches!(o.op, Some(op) if op != Op::Send) {
            u64::MAX
        } else {
            (start.elapsed().as_secs_f64() * RATE) as u64
        };
        while first_err.is_none()
            && posted - done < WINDOW
            && posted < due
            && Instant::now() < limit
        {
            let op = o.op.unwrap_or(OPS[(posted % OPS.len() as u64) as usize]);
            // The peer's region: Writes land in its first quarter (and a
            // little past it), Reads come from its second half, atomics hit
            // its last 16 bytes. Here: Write sources at the start, Read sinks
            // from the middle, atomic results at the end.
            let off = (mix(seed, &[posted, 0x0f]) % (REGION as u64 / 4)) as usize & !7;
            let (wr, read) = match op {
                Op::Send => {
                    // A slot of its own: the last 64 Sends may be in flight.
                    let data = send_bytes(seed, sends);
                    let at = (sends % 64) as usize * SEND_MAX;
                    local.write(at, &data);
                    sends += 1;
                    let w = ExOp::Send;
                    (
                        ExWr {
                            wr_id: posted,
                            flags: sys::IBV_SEND_SIGNALED,
                            op: w,
                            sges: vec![local.sge(at, data.len())],
                        },
                        None,
                    )
                }
                Op::Write => (
                    ExWr {
                        wr_id: posted,
                        flags: sys::IBV_SEND_SIGNALED,
                        op: ExOp::Write {
                            rkey: peer.1,
                            addr: peer.0 + off as u64,
                        },
                        // Small ones, and large ones placed straight from
                        // the socket into the target.
                        sges: vec![
                            local.sge(REGION / 8, if posted % 2 == 0 { 4096 } else { 65536 })
                        ],
                    },
                    None,
                ),
                Op::Read => {
                    let len = 1 + (posted as usize * 97) % 8192;
                    let to = REGION / 2 + (posted as usize % 32) * 8192;
                    let off = REGION / 2 + off;
                    (
                        ExWr {
                            wr_id: posted,
                            flags: sys::IBV_SEND_SIGNALED,
                            op: ExOp::Read {
                                rkey: peer.1,
                                addr: peer.0 + off as u64,
                            },
                            sges: vec![local.sge(to, len)],
                        },
                        Some((to, off, len)),
                    )
                }
                Op::Atomic => (
                    ExWr {
                        wr_id: posted,
                        flags: sys::IBV_SEND_SIGNALED,
                        op: ExOp::FetchAdd {
                            rkey: peer.1,
                            addr: peer.0 + REGION as u64 - 8,
                            add: 1,
                        },
                        sges: vec![local.sge(REGION - 8, 8)],
                    },
                    None,
                ),
                Op::Flush => (
                    ExWr {
                        wr_id: posted,
                        flags: sys::IBV_SEND_SIGNALED,
                        op: ExOp::Flush {
                            rkey: peer.1,
                            addr: peer.0 + off as u64,
                            len: 65536,
                            placement: xiwdv::Placement::Global as u8,
                            level: xiwdv::Selectivity::Range as u8,
                        },
                        sges: vec![],
                    },
                    None,
                ),
                Op::AtomicWrite => (
                    ExWr {
                        wr_id: posted,
                        flags: sys::IBV_SEND_SIGNALED,
                        op: ExOp::AtomicWrite {
                            rkey: peer.1,
                            addr: peer.0 + REGION as u64 - 16,
                            value: posted.to_ne_bytes(),
                        },
                        sges: vec![],
                    },
                    None,
                ),
            };
            match qp.post_ex(&[wr]) {
                Ok(()) => {
                    inflight.push_back((posted, op, read));
                    posted += 1;
                }
                // A QP already in error may refuse new work: that counts as
                // noticing the fault.
                Err(_) if qp.state() == Ok(sys::IBV_QPS_ERR) => {
                    refused = Some(posted);
                    break;
                }
                Err(e) => return Err(format!("posting {op:?} #{posted}: {}", ibv::errno_str(e))),
            }
        }
        for w in cq.poll(64).map_err(|e| format!("poll_cq returned {e}"))? {
            let (id, op, read) = inflight
                .pop_front()
                .ok_or_else(|| format!("a completion with nothing outstanding: {}", fmt_wc(&w)))?;
            if w.wr_id != id {
                return Err(format!(
                    "completion out of order or lost: {} (expected wr_id {id})",
                    fmt_wc(&w)
                ));
            }
            done += 1;
            *statuses.entry(ibv::wc_status_str(w.status)).or_default() += 1;
            if w.status == sys::IBV_WC_SUCCESS {
                if first_err.is_some() {
                    return Err(format!(
                        "{op:?} #{id} succeeded after an earlier request failed"
                    ));
                }
                if let Some((to, from, len)) = read {
                    if local.read(to, len) != peer_data[from..from + len] {
                        return Err(format!("Read #{id}: the bytes differ from the peer's"));
                    }
                    reads_checked += 1;
                }
                continue;
            }
            match first_err {
                None => first_err = Some((id, op, w.status)),
                Some(_) if w.status != sys::IBV_WC_WR_FLUSH_ERR => {
                    return Err(format!(
                        "{op:?} #{id}: after the first failure, {} instead of a flush",
                        fmt_wc(&w)
                    ))
                }
                Some(_) => {}
            }
        }
        // The bystander works all along.
        if by_next <= Instant::now() {
            by.round()?;
            by_next = Instant::now() + Duration::from_millis(20);
        }
        if (first_err.is_some() || refused.is_some()) && done == posted {
            break;
        }
        if first_err.is_none() && Instant::now() >= limit && done == posted {
            break;
        }
        if Instant::now() > limit + Duration::from_secs(30) {
            return Err(format!(
                "{posted} posted, {done} completed ({statuses:?}) 30 s past the end: requests never completed"
            ));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let failure = match (o.expect, first_err) {
        (Expect::Survive, None) => "none".to_string(),
        (Expect::Survive, Some((id, op, st))) => {
            return Err(format!(
                "{op:?} #{id} failed ({}) in a run where nothing may",
                ibv::wc_status_str(st)
            ))
        }
        (_, None) => {
            return Err(format!(
                "the victim never failed in {elapsed:.1} s ({posted} requests)"
            ))
        }
        (e, Some((id, op, st))) => {
            let allowed: &[u32] = match e {
                Expect::Retry => &[sys::IBV_WC_RETRY_EXC_ERR],
                Expect::Access => &[sys::IBV_WC_REM_ACCESS_ERR],
                _ => &[
                    sys::IBV_WC_WR_FLUSH_ERR,
                    sys::IBV_WC_REM_ACCESS_ERR,
                    sys::IBV_WC_REM_OP_ERR,
                    sys::IBV_WC_REM_ABORT_ERR,
                    sys::IBV_WC_RETRY_EXC_ERR,
                    sys::IBV_WC_FATAL_ERR,
                    sys::IBV_WC_GENERAL_ERR,
                ],
            };
            if !allowed.contains(&st) {
                return Err(format!(
                    "the first failure, {op:?} #{id}, has status {} (expected one of {:?})",
                    ibv::wc_status_str(st),
                    allowed
                        .iter()
                        .map(|s| ibv::wc_status_str(*s))
                        .collect::<Vec<_>>()
                ));
            }
            let st = qp
                .state()
                .map_err(|e| format!("ibv_query_qp: {}", ibv::errno_str(e)))?;
            if st != sys::IBV_QPS_ERR {
                return Err(format!(
                    "the victim is in {} after its failure, expected ERR",
                    state_name(st)
                ));
            }
            format!("{op:?} #{id} at {elapsed:.1} s")
        }
    };
    // The bystander still works after the fault.
    for _ in 0..50 {
        by.round()?;
    }
    let summary = format!(
        "{posted} requests ({}), all completed once and in order: {statuses:?}; first failure: {failure}; \
         {reads_checked} Reads checked; bystander: {} rounds checked",
        o.op.map_or("mixed".to_string(), |op| format!("{op:?}")),
        by.rounds
    );
    if !o.kill {
        let tag = if o.expect == Expect::Survive {
            "survive"
        } else {
            "failed"
        };
        oob.send(&format!("DONE {tag}"))?;
        oob.sync("fault-end", &Ok(()))?;
    }
    Ok(summary)
}
