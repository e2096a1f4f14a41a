//! `xiw-ext-check`: the RFC 7306 and draft-talpey-rdma-commit operations of xiw,
//! checked through the real libibverbs by a server and its clients.
//!
//! ```text
//! xiw-ext-check SCENARIO --port P [--server ADDR] [--dev NAME] [options]
//! ```
//!
//! Without `--server` it is the server: it listens on TCP port P for its
//! clients' out-of-band connections (`--clients K` of them), over which they
//! exchange GIDs, QPNs, rkeys and addresses and hold barriers. Queue pairs are
//! connected by modify_qp (xiw's standalone mode) and every completion queue is
//! polled. Each process prints one result line, `ext ok (server|client): ...`,
//! or `ext FAIL (...)` with the details on stderr and a non-zero exit code.
//!
//! Scenarios:
//! - `fetch-add --qps N --iters M [--clients K]`: every client runs M FetchAdds
//!   of its own increment on each of N QPs against one server counter; the
//!   returned originals of all clients must tile the counter's history exactly.
//! - `spinlock --qps N --iters M [--clients K]`: a lock taken and released with
//!   CmpSwap guards a counter updated by RDMA Read + Write: no lost update.
//! - `masked --iters M --seed S`: masked FetchAdd, masked CmpSwap, swap, FetchAdd
//!   and CmpSwap on one word, checked against a model of RFC 7306.
//! - `write-imm --iters R --seed S`: Write with Immediate (and Send with
//!   Immediate): one receive per message, immediate, length and data in place.
//! - `commit --file PATH --records N`: a durable log (Write, Flush, Atomic Write
//!   of the record count, Flush of the count) into a file mapping; the client
//!   prints `committed <i>` as each record is durable.
//! - `verify --file PREFIX`: RDMA Verify with SHA-256 and CRC32c over file
//!   mappings, and a byte flipped on the medium behind the server's back.
//! - `errors --file PREFIX`: remote access and alignment errors, argument
//!   checks and registration refusals, the server's memory unchanged.
//! - `refuse`: the server runs with `XIW_EXTENSIONS=0`; a FetchAdd is refused.
//!
//! Common options: `--timeout SECS` (a watchdog ends the process after that,
//! default 50). On a failure the process ends at once, without tearing the
//! device down, since a provider in trouble could hang there.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use xiw_tests::check::{
    fmt_wc, hex, mix, open_dev, payload, state_name, status_name, unhex16, Dev, POISON,
};
use xiw_tests::ibv::{self, sys, Cq, ExOp, ExWr, Mapping, Mr, Qp, RecvWr, Reg, SendWr, Wc};
use xiwdv::{HashAlg, MrAttr};

type Res<T = ()> = Result<T, String>;

// ---- command line -------------------------------------------------------------

#[derive(Clone, Debug)]
struct Args {
    scenario: String,
    port: u16,
    server: Option<String>,
    dev: Option<String>,
    qps: usize,
    iters: usize,
    clients: usize,
    seed: u64,
    file: Option<PathBuf>,
    records: usize,
    timeout: u64,
}

fn usage() -> String {
    "usage: xiw-ext-check fetch-add|spinlock|masked|write-imm|commit|verify|errors|refuse \
     --port P [--server ADDR] [--dev NAME] [--qps N] [--iters M] [--clients K] [--seed S] \
     [--file PATH] [--records N] [--timeout SECS]"
        .into()
}

fn parse_args() -> Res<Args> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        scenario: it.next().ok_or_else(usage)?,
        port: 0,
        server: None,
        dev: None,
        qps: 4,
        iters: 100,
        clients: 1,
        seed: 1,
        file: None,
        records: 50,
        timeout: 50,
    };
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{k} {s}: {e}"));
        match k.as_str() {
            "--port" => a.port = num(v()?)? as u16,
            "--server" => a.server = Some(v()?),
            "--dev" => a.dev = Some(v()?),
            "--qps" => a.qps = num(v()?)?.max(1) as usize,
            "--iters" => a.iters = num(v()?)? as usize,
            "--clients" => a.clients = num(v()?)?.max(1) as usize,
            "--seed" => a.seed = num(v()?)?,
            "--file" => a.file = Some(PathBuf::from(v()?)),
            "--records" => a.records = num(v()?)?.max(1) as usize,
            "--timeout" => a.timeout = num(v()?)?,
            _ => return Err(format!("unknown argument {k}\n{}", usage())),
        }
    }
    if a.port == 0 {
        return Err(format!("--port is required\n{}", usage()));
    }
    Ok(a)
}

/// The role, for [`fail_fast`].
static ROLE: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

fn print_failure(role: &str, e: &str) {
    eprintln!("{role}: {e}");
    println!("ext FAIL ({role}): {}", e.replace('\n', " | "));
    let _ = std::io::stdout().flush();
}

/// Reports a failure and ends the process without tearing anything down: after
/// a failure the provider may be stuck, and closing the device would wait for it.
fn fail_fast(e: &str) -> ! {
    print_failure(ROLE.get().copied().unwrap_or("?"), e);
    ibv::exit_now(1)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let role = if args.server.is_some() {
        "client"
    } else {
        "server"
    };
    let _ = ROLE.set(role);
    let limit = Duration::from_secs(args.timeout);
    // Every wait below has its own deadline; this one catches anything that slips through.
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        println!(
            "ext FAIL ({role}): watchdog: still running after {}s",
            limit.as_secs()
        );
        let _ = std::io::stdout().flush();
        ibv::exit_now(3);
    });
    let client = args.server.is_some();
    let r = match args.scenario.as_str() {
        "fetch-add" if client => fetch_add::client(&args),
        "fetch-add" => fetch_add::server(&args),
        "spinlock" if client => spinlock::client(&args),
        "spinlock" => spinlock::server(&args),
        "masked" if client => masked::client(&args),
        "masked" => masked::server(&args),
        "write-imm" if client => write_imm::client(&args),
        "write-imm" => write_imm::server(&args),
        "commit" if client => commit::client(&args),
        "commit" => commit::server(&args),
        "verify" if client => verify::client(&args),
        "verify" => verify::server(&args),
        "errors" if client => errors::client(&args),
        "errors" => errors::server(&args),
        "refuse" if client => refuse::client(&args),
        "refuse" => refuse::server(&args),
        s => Err(format!("unknown scenario {s}\n{}", usage())),
    };
    match r {
        Ok(line) => {
            println!("ext ok ({role}): {}: {line}", args.scenario);
            let _ = std::io::stdout().flush();
            ExitCode::SUCCESS
        }
        // Before the context is closed: a provider in trouble could hang there.
        Err(e) => fail_fast(&format!("{}: {e}", args.scenario)),
    }
}

// ---- out-of-band channel ------------------------------------------------------

/// Line-based messages, `TAG key=value ...`, over a TCP connection of our own.
struct Oob {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

/// The `key=value` pairs of one message.
struct Kv(HashMap<String, String>);

impl Kv {
    fn str(&self, k: &str) -> Res<&str> {
        self.0
            .get(k)
            .map(String::as_str)
            .ok_or_else(|| format!("peer message lacks {k}"))
    }

    fn get<T: std::str::FromStr>(&self, k: &str) -> Res<T> {
        self.str(k)?
            .parse()
            .map_err(|_| format!("peer message has a bad {k}"))
    }

    fn hex(&self, k: &str) -> Res<u64> {
        u64::from_str_radix(self.str(k)?, 16).map_err(|_| format!("peer message has a bad {k}"))
    }
}

impl Oob {
    fn setup(s: TcpStream, read_timeout: Duration) -> Res<Oob> {
        s.set_nonblocking(false).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(read_timeout))
            .map_err(|e| e.to_string())?;
        let r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
        Ok(Oob { w: s, r })
    }

    /// The server side: `n` clients, in the order they connect.
    fn accept(a: &Args, n: usize) -> Res<Vec<Oob>> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let l = TcpListener::bind(("0.0.0.0", a.port))
            .map_err(|e| format!("listen on port {}: {e}", a.port))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut v = Vec::new();
        while v.len() < n {
            match l.accept() {
                Ok((s, _)) => v.push(Oob::setup(s, Duration::from_secs(a.timeout))?),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(format!("{} of {n} clients connected within 20 s", v.len()));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(format!("accept: {e}")),
            }
        }
        Ok(v)
    }

    fn connect(a: &Args) -> Res<Oob> {
        let host = a.server.as_deref().expect("a client has --server");
        let deadline = Instant::now() + Duration::from_secs(20);
        let s = loop {
            match TcpStream::connect((host, a.port)) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("connect to {host}:{}: {e}", a.port))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        Oob::setup(s, Duration::from_secs(a.timeout))
    }

    fn send(&mut self, tag: &str, kv: &[(&str, String)]) -> Res {
        let mut line = tag.to_string();
        for (k, v) in kv {
            line.push_str(&format!(" {k}={v}"));
        }
        writeln!(self.w, "{line}").map_err(|e| format!("out-of-band send: {e}"))
    }

    fn recv(&mut self, tag: &str) -> Res<Kv> {
        let mut s = String::new();
        match self.r.read_line(&mut s) {
            Ok(0) => {
                return Err(format!(
                    "the peer closed the out-of-band connection while we waited for {tag} \
                     (did it fail? see its output)"
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(format!("out-of-band receive of {tag}: {e}")),
        }
        let s = s.trim_end();
        if let Some(why) = s.strip_prefix("FAIL ") {
            return Err(format!("the peer failed: {why}"));
        }
        let mut parts = s.split_whitespace();
        let got = parts.next().unwrap_or("");
        if got != tag {
            return Err(format!("out-of-band protocol: expected {tag}, got {s:?}"));
        }
        Ok(Kv(parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()))
    }

    /// Tells the peer we failed (best effort), then returns the error.
    fn fail<T>(&mut self, e: String) -> Res<T> {
        let _ = writeln!(self.w, "FAIL {}", e.replace('\n', " | "));
        Err(e)
    }
}

// ---- shared helpers -----------------------------------------------------------

const REMOTE_ALL: u32 =
    sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_ATOMIC;
const LOCAL: u32 = sys::IBV_ACCESS_LOCAL_WRITE;
const SIG: u32 = sys::IBV_SEND_SIGNALED;
/// Outstanding RDMA Reads and atomics per QP, both directions.
const RD_ATOMIC: u8 = 16;
const WAIT: Duration = Duration::from_secs(20);

fn cap(send: u32, recv: u32) -> ibv::ibv_qp_cap {
    ibv::ibv_qp_cap {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 0,
    }
}

fn new_cq(dev: &Dev, n: i32) -> Res<Cq> {
    Cq::new(&dev.ctx, n).map_err(|e| format!("ibv_create_cq: {e}"))
}

/// A plain QP (ibv_create_qp).
fn plain_qp(dev: &Dev, scq: &Cq, rcq: &Cq, send: u32, recv: u32) -> Res<Qp> {
    Qp::new(&dev.pd, scq, rcq, cap(send, recv), false).map_err(|e| format!("ibv_create_qp: {e}"))
}

/// A QP with the ibv_qp_ex builders of `ops` (`IBV_QP_EX_WITH_*`, `XIWDV_QP_EX_WITH_*`).
fn ex_qp(dev: &Dev, scq: &Cq, rcq: &Cq, send: u32, recv: u32, ops: u64) -> Res<Qp> {
    Qp::new_ex(&dev.ctx, &dev.pd, scq, rcq, cap(send, recv), false, ops).map_err(|e| {
        format!(
            "ibv_create_qp_ex with send_ops_flags {ops:#x}: {e} (xiw: {})",
            xiwdv::last_error()
        )
    })
}

/// `n` client QPs on one send CQ: QP 0 posts through the ibv_wr_* builders of
/// `ex_ops`, the others through ibv_post_send.
fn client_qps(dev: &Dev, cq: &Cq, rcq: &Cq, n: usize, send: u32, ex_ops: u64) -> Res<Vec<Qp>> {
    (0..n)
        .map(|q| {
            if q == 0 {
                ex_qp(dev, cq, rcq, send, 16, ex_ops)
            } else {
                plain_qp(dev, cq, rcq, send, 16)
            }
        })
        .collect()
}

/// Exchanges QPNs with the peer (same number of QPs, same order on both
/// sides), connects them, and waits until the peer has done so too.
fn connect(oob: &mut Oob, peer_gid: [u8; 16], qps: &[&Qp]) -> Res {
    let mine: Vec<String> = qps.iter().map(|q| q.qpn().to_string()).collect();
    oob.send("QPS", &[("qpns", mine.join(","))])?;
    let got = oob.recv("QPS")?;
    let theirs: Vec<u32> = got
        .str("qpns")?
        .split(',')
        .map(|s| s.parse().map_err(|_| format!("bad qpn {s}")))
        .collect::<Res<_>>()?;
    if theirs.len() != qps.len() {
        return oob.fail(format!(
            "{} QPs here, {} at the peer",
            qps.len(),
            theirs.len()
        ));
    }
    for (q, peer) in qps.iter().zip(&theirs) {
        if let Err(e) = q
            .to_init(REMOTE_ALL)
            .and_then(|()| q.to_rts(peer_gid, *peer, RD_ATOMIC))
        {
            return oob.fail(e);
        }
    }
    oob.send("CONNECTED", &[])?;
    oob.recv("CONNECTED").map(drop)
}

/// Polls `cq` until `n` completions arrived or `deadline` passed.
fn wait_wcs(cq: &Cq, n: usize, deadline: Instant, what: &str) -> Res<Vec<Wc>> {
    let mut got: Vec<Wc> = Vec::new();
    while got.len() < n {
        let w = cq
            .poll(n - got.len())
            .map_err(|e| format!("{what}: poll_cq returned {e}"))?;
        if w.is_empty() {
            if Instant::now() > deadline {
                let seen: Vec<String> = got.iter().map(fmt_wc).collect();
                return Err(format!(
                    "{what}: timed out with {} of {n} completions; got: [{}]",
                    got.len(),
                    seen.join("; ")
                ));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        got.extend(w);
    }
    Ok(got)
}

fn wait_one(cq: &Cq, what: &str) -> Res<Wc> {
    Ok(wait_wcs(cq, 1, Instant::now() + WAIT, what)?[0])
}

/// Nothing more arrives on `cq` within `quiet`.
fn expect_quiet(cq: &Cq, quiet: Duration, what: &str) -> Res {
    let end = Instant::now() + quiet;
    while Instant::now() < end {
        let w = cq
            .poll(4)
            .map_err(|e| format!("{what}: poll_cq returned {e}"))?;
        if let Some(w) = w.first() {
            return Err(format!("{what}: unexpected completion {}", fmt_wc(w)));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// A successful completion of `opcode` (and `byte_len`, if given).
fn check_ok(w: &Wc, opcode: u32, byte_len: Option<u32>, what: &str) -> Res {
    if w.status != sys::IBV_WC_SUCCESS {
        return Err(format!("{what}: failed: {}", fmt_wc(w)));
    }
    if w.opcode != opcode {
        return Err(format!(
            "{what}: opcode {} instead of {opcode}: {}",
            w.opcode,
            fmt_wc(w)
        ));
    }
    if let Some(n) = byte_len {
        if w.byte_len != n {
            return Err(format!(
                "{what}: byte_len {} instead of {n}: {}",
                w.byte_len,
                fmt_wc(w)
            ));
        }
    }
    Ok(())
}

fn check_status(w: &Wc, status: u32, what: &str) -> Res {
    if w.status != status {
        return Err(format!(
            "{what}: expected status {}, got {}",
            status_name(status),
            fmt_wc(w)
        ));
    }
    Ok(())
}

fn expect_state(qp: &Qp, want: u32, what: &str) -> Res {
    // The QP's state follows its completions closely but not in the same step.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = qp
            .state()
            .map_err(|e| format!("{what}: ibv_query_qp: {}", ibv::errno_str(e)))?;
        if s == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: the QP is in {} instead of {}",
                state_name(s),
                state_name(want)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn post(qp: &Qp, wrs: &[SendWr], what: &str) -> Res {
    qp.post_send(wrs).map_err(|(i, e)| {
        format!(
            "{what}: ibv_post_send refused WR {i}: {}",
            ibv::errno_str(e)
        )
    })
}

fn post_ex(qp: &Qp, wrs: &[ExWr], what: &str) -> Res {
    qp.post_ex(wrs).map_err(|e| {
        format!(
            "{what}: ibv_wr_complete: {} (xiw: {})",
            ibv::errno_str(e),
            xiwdv::last_error()
        )
    })
}

fn recv_all(qp: &Qp, wrs: &[RecvWr], what: &str) -> Res {
    qp.post_recv(wrs).map_err(|(i, e)| {
        format!(
            "{what}: ibv_post_recv refused WR {i}: {}",
            ibv::errno_str(e)
        )
    })
}

fn read_u64(mr: &Mr, off: usize) -> u64 {
    u64::from_ne_bytes(mr.read(off, 8).try_into().expect("8 bytes"))
}

fn write_u64(mr: &Mr, off: usize, v: u64) {
    mr.write(off, &v.to_ne_bytes());
}

/// A client's greeting and the server's answer.
struct Peer {
    oob: Oob,
    gid: [u8; 16],
    id: usize,
    hello: Kv,
}

/// The server side of the greeting: accepts `a.clients` clients, tells each
/// its id and our GID plus `extra`, and reads their GID and parameters.
fn greet_clients(a: &Args, dev: &Dev, extra: &[(&str, String)]) -> Res<Vec<Peer>> {
    let oobs = Oob::accept(a, a.clients)?;
    let mut peers = Vec::new();
    for (id, mut oob) in oobs.into_iter().enumerate() {
        let mut kv = vec![("id", id.to_string()), ("gid", hex(&dev.gid))];
        kv.extend(extra.iter().cloned());
        oob.send("HELLO", &kv)?;
        let hello = oob.recv("HELLO")?;
        let gid = unhex16(hello.str("gid")?)?;
        peers.push(Peer {
            oob,
            gid,
            id,
            hello,
        });
    }
    Ok(peers)
}

/// The client side: sends our GID and `params`, returns the server's greeting.
fn greet_server(a: &Args, dev: &Dev, params: &[(&str, String)]) -> Res<(Oob, Kv, [u8; 16])> {
    let mut oob = Oob::connect(a)?;
    let hello = oob.recv("HELLO")?;
    let mut kv = vec![("gid", hex(&dev.gid))];
    kv.extend(params.iter().cloned());
    oob.send("HELLO", &kv)?;
    let gid = unhex16(hello.str("gid")?)?;
    Ok((oob, hello, gid))
}

fn per_sec(n: usize, t: Duration) -> f64 {
    n as f64 / t.as_secs_f64().max(1e-9)
}

// ---- fetch-add ----------------------------------------------------------------

mod fetch_add {
    use super::*;

    /// The counter's offset in the server's MR (8-byte aligned).
    const COUNTER: usize = 64;
    /// Low word near its top: the additions carry across bit 32.
    const INITIAL: u64 = 0x7fff_fff0_ffff_ff00;

    /// Client `id`'s increment: distinct per client, carries in both words.
    fn increment(id: usize) -> u64 {
        (id as u64 + 1) * 0x1_0000_0001
    }

    pub fn server(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let mr = Mr::new(&dev.pd, 4096, sys::IBV_ACCESS_REMOTE_ATOMIC | LOCAL)
            .map_err(|e| format!("ibv_reg_mr (REMOTE_ATOMIC): {e}"))?;
        write_u64(&mr, COUNTER, INITIAL);
        let mut peers = greet_clients(
            a,
            &dev,
            &[
                ("rkey", mr.rkey().to_string()),
                ("addr", format!("{:x}", mr.addr() + COUNTER as u64)),
                ("initial", format!("{INITIAL:x}")),
            ],
        )?;
        let cq = new_cq(&dev, 64)?;
        let mut qps: Vec<Vec<Qp>> = Vec::new();
        for p in &mut peers {
            let n: usize = p.hello.get("qps")?;
            let v: Vec<Qp> = (0..n)
                .map(|_| plain_qp(&dev, &cq, &cq, 16, 16))
                .collect::<Res<_>>()?;
            connect(&mut p.oob, p.gid, &v.iter().collect::<Vec<_>>())?;
            qps.push(v);
        }
        for p in &mut peers {
            p.oob.send("GO", &[])?;
        }
        // (original, increment) of every FetchAdd of every client.
        let mut all: Vec<(u64, u64)> = Vec::new();
        let mut expected = INITIAL;
        for p in &mut peers {
            let done = p.oob.recv("DONE")?;
            let (n, m): (u64, u64) = (p.hello.get("qps")?, p.hello.get("iters")?);
            let inc = increment(p.id);
            expected = expected.wrapping_add(n * m * inc);
            let vals: Vec<u64> = done
                .str("vals")?
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| u64::from_str_radix(s, 16).map_err(|_| format!("bad value {s}")))
                .collect::<Res<_>>()?;
            if vals.len() as u64 != n * m {
                return Err(format!(
                    "client {} reported {} values for {n}x{m} FetchAdds",
                    p.id,
                    vals.len()
                ));
            }
            all.extend(vals.into_iter().map(|v| (v, inc)));
        }
        let fin = read_u64(&mr, COUNTER);
        let verdict = check_history(&mut all, fin, expected);
        for p in &mut peers {
            p.oob.send("FINAL", &[("value", format!("{fin:x}"))])?;
        }
        verdict?;
        for p in &mut peers {
            p.oob.recv("VERDICT")?;
        }
        Ok(format!(
            "{} clients, {} FetchAdds, final counter {fin:#x} = initial + exact sum; the \
             originals tile the counter's history",
            peers.len(),
            all.len()
        ))
    }

    /// Sorted by original, each FetchAdd must start where the one before it
    /// ended: the first at the initial value, the last ending at `fin`.
    fn check_history(all: &mut [(u64, u64)], fin: u64, expected: u64) -> Res {
        if fin != expected {
            return Err(format!(
                "final counter {fin:#x}, expected {expected:#x} (initial {INITIAL:#x} + the sum \
                 of all increments): lost or doubled updates"
            ));
        }
        // The counter never wraps here, so the history is increasing.
        all.sort_unstable();
        let mut at = INITIAL;
        for (i, (orig, inc)) in all.iter().enumerate() {
            if *orig != at {
                return Err(format!(
                    "FetchAdd #{i} in counter order returned {orig:#x} where the counter must \
                     have been {at:#x}"
                ));
            }
            at = at.wrapping_add(*inc);
        }
        if at != fin {
            return Err(format!(
                "the history ends at {at:#x}, the counter at {fin:#x}"
            ));
        }
        Ok(())
    }

    pub fn client(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let (n, m) = (a.qps, a.iters);
        let (mut oob, hello, gid) =
            greet_server(a, &dev, &[("qps", n.to_string()), ("iters", m.to_string())])?;
        let id: usize = hello.get("id")?;
        let rkey: u32 = hello.get("rkey")?;
        let addr = hello.hex("addr")?;
        let initial = hello.hex("initial")?;
        let inc = increment(id);
        let depth = (RD_ATOMIC as usize)
            .min(dev.attr.max_qp_rd_atom.max(1) as usize)
            .min(m.max(1));
        let cq = new_cq(&dev, (n * depth + 16) as i32)?;
        let rcq = new_cq(&dev, 16)?;
        let ex_ops = (sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
            | sys::IBV_QP_EX_WITH_RDMA_READ
            | sys::IBV_QP_EX_WITH_SEND) as u64;
        let qps = client_qps(&dev, &cq, &rcq, n, 64, ex_ops)?;
        connect(&mut oob, gid, &qps.iter().collect::<Vec<_>>())?;
        oob.recv("GO")?;

        let results = Mr::new(&dev.pd, n * m * 8, LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        results.fill(0, n * m * 8, POISON);
        let slot = |q: usize, i: usize| (q * m + i) * 8;
        let mut posted = vec![0usize; n];
        let mut done = vec![0usize; n];
        let mut seen = vec![false; n * m];
        let start = Instant::now();
        let deadline = start + Duration::from_secs(a.timeout.saturating_sub(5).max(5));
        while done.iter().sum::<usize>() < n * m {
            for q in 0..n {
                let k = (depth - (posted[q] - done[q])).min(m - posted[q]);
                if k == 0 {
                    continue;
                }
                let ids = posted[q]..posted[q] + k;
                let what = format!("client {id} qp{q} FetchAdd #{}..", posted[q]);
                if q == 0 {
                    let wrs: Vec<ExWr> = ids
                        .map(|i| ExWr {
                            wr_id: ((q as u64) << 32) | i as u64,
                            flags: SIG,
                            op: ExOp::FetchAdd {
                                rkey,
                                addr,
                                add: inc,
                            },
                            sges: vec![results.sge(slot(q, i), 8)],
                        })
                        .collect();
                    post_ex(&qps[q], &wrs, &what)?;
                } else {
                    let wrs: Vec<SendWr> = ids
                        .map(|i| SendWr {
                            wr_id: ((q as u64) << 32) | i as u64,
                            opcode: sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
                            flags: SIG,
                            sges: vec![results.sge(slot(q, i), 8)],
                            remote_addr: addr,
                            rkey,
                            compare_add: inc,
                            ..Default::default()
                        })
                        .collect();
                    post(&qps[q], &wrs, &what)?;
                }
                posted[q] += k;
            }
            let wcs = cq.poll(64).map_err(|e| format!("poll_cq returned {e}"))?;
            if wcs.is_empty() {
                if Instant::now() > deadline {
                    return Err(format!("timed out: posted {posted:?}, completed {done:?}"));
                }
                std::thread::yield_now();
            }
            for w in wcs {
                let (q, i) = ((w.wr_id >> 32) as usize, (w.wr_id & 0xffff_ffff) as usize);
                let what = format!("client {id} qp{q} FetchAdd #{i}");
                check_ok(&w, sys::IBV_WC_FETCH_ADD, Some(8), &what)?;
                if q >= n || i >= m || seen[q * m + i] {
                    return Err(format!(
                        "{what}: unknown or repeated completion {}",
                        fmt_wc(&w)
                    ));
                }
                // Send queue completions come in posting order.
                if i != done[q] {
                    return Err(format!(
                        "{what}: completed out of order (expected #{})",
                        done[q]
                    ));
                }
                seen[q * m + i] = true;
                done[q] += 1;
            }
        }
        let took = start.elapsed();
        let vals: Vec<u64> = (0..n * m).map(|k| read_u64(&results, k * 8)).collect();
        let mut own: Vec<u64> = vals.clone();
        own.sort_unstable();
        let mut verdict: Res = Ok(());
        if let Some(w) = own.windows(2).find(|w| w[0] == w[1]) {
            verdict = Err(format!(
                "two FetchAdds returned the same original {:#x}",
                w[0]
            ));
        } else if own[0] < initial {
            verdict = Err(format!(
                "an original {:#x} below the initial {initial:#x}",
                own[0]
            ));
        } else if let Some(w) = own.windows(2).find(|w| w[1] - w[0] < inc) {
            verdict = Err(format!(
                "originals {:#x} and {:#x} are closer than this client's own increment {inc:#x}",
                w[0], w[1]
            ));
        }
        let list: Vec<String> = vals.iter().map(|v| format!("{v:x}")).collect();
        oob.send("DONE", &[("vals", list.join(","))])?;
        let fin = oob.recv("FINAL")?.hex("value")?;
        if verdict.is_ok() {
            if let Some(v) = own.iter().find(|v| **v >= fin) {
                verdict = Err(format!(
                    "original {v:#x} is not below the final counter {fin:#x}"
                ));
            }
        }
        if let Err(e) = verdict {
            return oob.fail(e);
        }
        oob.send("VERDICT", &[])?;
        Ok(format!(
            "client {id}: {n} QPs x {m} FetchAdds of {inc:#x} ({depth} outstanding per QP, qp0 \
             through ibv_wr_atomic_fetch_add) in {:.3} s ({:.0}/s); originals distinct, all below \
             the final {fin:#x}",
            took.as_secs_f64(),
            per_sec(n * m, took)
        ))
    }
}

// ---- spinlock -----------------------------------------------------------------

mod spinlock {
    use super::*;

    /// Lock word and counter, on cache lines of their own in the server's MR.
    const LOCK: usize = 0;
    const COUNTER: usize = 64;

    pub fn server(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let mr = Mr::new(&dev.pd, 4096, REMOTE_ALL | LOCAL)
            .map_err(|e| format!("ibv_reg_mr (REMOTE_ATOMIC|READ|WRITE): {e}"))?;
        let mut peers = greet_clients(
            a,
            &dev,
            &[
                ("rkey", mr.rkey().to_string()),
                ("lock", format!("{:x}", mr.addr() + LOCK as u64)),
                ("counter", format!("{:x}", mr.addr() + COUNTER as u64)),
            ],
        )?;
        let cq = new_cq(&dev, 64)?;
        let mut qps: Vec<Vec<Qp>> = Vec::new();
        let mut expected = 0u64;
        for p in &mut peers {
            let n: usize = p.hello.get("qps")?;
            let m: u64 = p.hello.get("iters")?;
            expected += n as u64 * m;
            let v: Vec<Qp> = (0..n)
                .map(|_| plain_qp(&dev, &cq, &cq, 16, 16))
                .collect::<Res<_>>()?;
            connect(&mut p.oob, p.gid, &v.iter().collect::<Vec<_>>())?;
            qps.push(v);
        }
        for p in &mut peers {
            p.oob.send("GO", &[])?;
        }
        let mut spins = 0u64;
        for p in &mut peers {
            spins += p.oob.recv("DONE")?.get::<u64>("spins")?;
        }
        let (lock, count) = (read_u64(&mr, LOCK), read_u64(&mr, COUNTER));
        for p in &mut peers {
            p.oob.send("FINAL", &[("counter", count.to_string())])?;
        }
        if lock != 0 {
            return Err(format!(
                "the lock word is {lock:#x} after every client released it"
            ));
        }
        if count != expected {
            return Err(format!(
                "counter {count}, expected {expected}: {} updates lost under the lock",
                expected as i64 - count as i64
            ));
        }
        Ok(format!(
            "{} clients, {expected} critical sections, counter exact, lock free; {spins} failed \
             acquire attempts",
            peers.len()
        ))
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum St {
        Acquiring,
        Reading,
        /// The Write of counter+1 and the releasing CmpSwap are both outstanding.
        Releasing(u8),
        Done,
    }

    const ACQ: u64 = 1;
    const READ: u64 = 2;
    const WRITE: u64 = 3;
    const REL: u64 = 4;

    pub fn client(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let (n, m) = (a.qps, a.iters);
        let (mut oob, hello, gid) =
            greet_server(a, &dev, &[("qps", n.to_string()), ("iters", m.to_string())])?;
        let id: usize = hello.get("id")?;
        let rkey: u32 = hello.get("rkey")?;
        let lock = hello.hex("lock")?;
        let counter = hello.hex("counter")?;
        let cq = new_cq(&dev, (n * 4 + 16) as i32)?;
        let rcq = new_cq(&dev, 16)?;
        let ex_ops = (sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
            | sys::IBV_QP_EX_WITH_RDMA_READ
            | sys::IBV_QP_EX_WITH_RDMA_WRITE) as u64;
        let qps = client_qps(&dev, &cq, &rcq, n, 16, ex_ops)?;
        connect(&mut oob, gid, &qps.iter().collect::<Vec<_>>())?;
        oob.recv("GO")?;

        // Per QP, 32 bytes: CmpSwap result, Read result, Write source, release result.
        let local = Mr::new(&dev.pd, n * 32, LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let owner = |q: usize| ((id as u64 + 1) << 32) | (q as u64 + 1);
        let wr_id = |q: usize, kind: u64| ((q as u64) << 8) | kind;
        // One operation on QP q: through ibv_qp_ex on QP 0, ibv_post_send elsewhere.
        let issue = |q: usize, ops: Vec<(u64, ExOp, usize)>| -> Res {
            let what = format!("client {id} qp{q}");
            if q == 0 {
                let wrs: Vec<ExWr> = ops
                    .into_iter()
                    .map(|(kind, op, off)| ExWr {
                        wr_id: wr_id(q, kind),
                        flags: SIG,
                        op,
                        sges: vec![local.sge(q * 32 + off, 8)],
                    })
                    .collect();
                return post_ex(&qps[q], &wrs, &what);
            }
            let wrs: Vec<SendWr> = ops
                .into_iter()
                .map(|(kind, op, off)| {
                    let mut w = SendWr {
                        wr_id: wr_id(q, kind),
                        flags: SIG,
                        sges: vec![local.sge(q * 32 + off, 8)],
                        ..Default::default()
                    };
                    match op {
                        ExOp::CmpSwp {
                            rkey,
                            addr,
                            compare,
                            swap,
                        } => {
                            w.opcode = sys::IBV_WR_ATOMIC_CMP_AND_SWP;
                            (w.rkey, w.remote_addr, w.compare_add, w.swap) =
                                (rkey, addr, compare, swap);
                        }
                        ExOp::Read { rkey, addr } => {
                            w.opcode = sys::IBV_WR_RDMA_READ;
                            (w.rkey, w.remote_addr) = (rkey, addr);
                        }
                        ExOp::Write { rkey, addr } => {
                            w.opcode = sys::IBV_WR_RDMA_WRITE;
                            (w.rkey, w.remote_addr) = (rkey, addr);
                        }
                        _ => unreachable!("only CmpSwap, Read and Write here"),
                    }
                    w
                })
                .collect();
            post(&qps[q], &wrs, &what)
        };
        let acquire = |q: usize| {
            let op = ExOp::CmpSwp {
                rkey,
                addr: lock,
                compare: 0,
                swap: owner(q),
            };
            issue(q, vec![(ACQ, op, 0)])
        };

        let mut st = vec![St::Acquiring; n];
        let mut iter = vec![0usize; n];
        let mut last_seen = vec![None::<u64>; n];
        let mut spins = 0u64;
        for q in 0..n {
            local.fill(q * 32, 32, 0);
            acquire(q)?;
        }
        let start = Instant::now();
        let deadline = start + Duration::from_secs(a.timeout.saturating_sub(5).max(5));
        while st.iter().any(|s| *s != St::Done) {
            let wcs = cq.poll(32).map_err(|e| format!("poll_cq returned {e}"))?;
            if wcs.is_empty() {
                if Instant::now() > deadline {
                    return Err(format!("timed out: states {st:?}, iterations {iter:?}"));
                }
                std::thread::yield_now();
            }
            for w in wcs {
                let (q, kind) = ((w.wr_id >> 8) as usize, w.wr_id & 0xff);
                let what = format!("client {id} qp{q} iteration {} op {kind}", iter[q]);
                let base = q * 32;
                match (st[q], kind) {
                    (St::Acquiring, ACQ) => {
                        check_ok(&w, sys::IBV_WC_COMP_SWAP, Some(8), &what)?;
                        let orig = read_u64(&local, base);
                        if orig == 0 {
                            st[q] = St::Reading;
                            issue(
                                q,
                                vec![(
                                    READ,
                                    ExOp::Read {
                                        rkey,
                                        addr: counter,
                                    },
                                    8,
                                )],
                            )?;
                        } else if orig == owner(q) {
                            return Err(format!("{what}: the lock is already ours"));
                        } else {
                            spins += 1;
                            acquire(q)?;
                        }
                    }
                    (St::Reading, READ) => {
                        check_ok(&w, sys::IBV_WC_RDMA_READ, Some(8), &what)?;
                        let v = read_u64(&local, base + 8);
                        if let Some(prev) = last_seen[q] {
                            if v <= prev {
                                return Err(format!(
                                    "{what}: read the counter as {v} under the lock after {prev}"
                                ));
                            }
                        }
                        last_seen[q] = Some(v);
                        write_u64(&local, base + 16, v + 1);
                        st[q] = St::Releasing(2);
                        let rel = ExOp::CmpSwp {
                            rkey,
                            addr: lock,
                            compare: owner(q),
                            swap: 0,
                        };
                        // The responder executes them in order: the counter is
                        // written before the lock is free.
                        issue(
                            q,
                            vec![
                                (
                                    WRITE,
                                    ExOp::Write {
                                        rkey,
                                        addr: counter,
                                    },
                                    16,
                                ),
                                (REL, rel, 24),
                            ],
                        )?;
                    }
                    (St::Releasing(2), WRITE) => {
                        check_ok(&w, sys::IBV_WC_RDMA_WRITE, None, &what)?;
                        st[q] = St::Releasing(1);
                    }
                    (St::Releasing(1), REL) => {
                        check_ok(&w, sys::IBV_WC_COMP_SWAP, Some(8), &what)?;
                        let orig = read_u64(&local, base + 24);
                        if orig != owner(q) {
                            return Err(format!(
                                "{what}: releasing returned {orig:#x}, not our id {:#x}: the lock \
                                 was not ours",
                                owner(q)
                            ));
                        }
                        iter[q] += 1;
                        if iter[q] == m {
                            st[q] = St::Done;
                        } else {
                            st[q] = St::Acquiring;
                            acquire(q)?;
                        }
                    }
                    (s, k) => {
                        return Err(format!(
                            "{what}: completion of op {k} in state {s:?}: {}",
                            fmt_wc(&w)
                        ));
                    }
                }
            }
        }
        let took = start.elapsed();
        oob.send("DONE", &[("spins", spins.to_string())])?;
        let count: u64 = oob.recv("FINAL")?.get("counter")?;
        Ok(format!(
            "client {id}: {n} QPs x {m} critical sections (CmpSwap, Read, Write, CmpSwap) in \
             {:.3} s, {spins} failed acquires; final counter {count}",
            took.as_secs_f64()
        ))
    }
}

// ---- masked -------------------------------------------------------------------

mod masked {
    use super::*;

    /// The word under test, between two sentinels that must never change.
    const WORD: usize = 8;
    const SENTINELS: [(usize, u64); 2] = [(0, 0x0123_4567_89ab_cdef), (16, 0xfedc_ba98_7654_3210)];

    /// RFC 7306 section 5.1, masked Fetch and Add: bitwise addition from bit 0
    /// up, where the carry out of a bit set in the add mask is dropped (the
    /// mask marks the top bit of each independent field).
    pub fn masked_add(orig: u64, add: u64, mask: u64) -> u64 {
        let (mut carry, mut out) = (0u64, 0u64);
        for bit in 0..64 {
            let sum = (orig >> bit & 1) + (add >> bit & 1) + carry;
            out |= (sum & 1) << bit;
            carry = if mask >> bit & 1 == 1 { 0 } else { sum >> 1 };
        }
        out
    }

    /// RFC 7306 section 5.1, masked Compare and Swap.
    pub fn masked_cas(orig: u64, compare: u64, cmask: u64, swap: u64, smask: u64) -> u64 {
        if (compare ^ orig) & cmask == 0 {
            (orig & !smask) | (swap & smask)
        } else {
            orig
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Op {
        FetchAdd(u64),
        CmpSwap {
            compare: u64,
            swap: u64,
        },
        MaskedFetchAdd {
            add: u64,
            mask: u64,
        },
        MaskedCmpSwap {
            compare: u64,
            cmask: u64,
            swap: u64,
            smask: u64,
        },
        Swap(u64),
    }

    impl Op {
        fn apply(self, orig: u64) -> u64 {
            match self {
                Op::FetchAdd(add) => orig.wrapping_add(add),
                Op::CmpSwap { compare, swap } => masked_cas(orig, compare, !0, swap, !0),
                Op::MaskedFetchAdd { add, mask } => masked_add(orig, add, mask),
                Op::MaskedCmpSwap {
                    compare,
                    cmask,
                    swap,
                    smask,
                } => masked_cas(orig, compare, cmask, swap, smask),
                Op::Swap(v) => v,
            }
        }

        fn wc_opcode(self) -> u32 {
            match self {
                Op::FetchAdd(_) | Op::MaskedFetchAdd { .. } => sys::IBV_WC_FETCH_ADD,
                _ => sys::IBV_WC_COMP_SWAP,
            }
        }
    }

    /// Hand-picked cases first: (word to start from, operation).
    fn edge_cases() -> Vec<(Option<u64>, Op)> {
        let ones = u64::MAX;
        vec![
            // Wrap-around of a plain FetchAdd.
            (Some(ones), Op::FetchAdd(1)),
            (Some(ones - 5), Op::FetchAdd(ones)),
            // Mask zero: a plain add; all ones: every bit its own field (XOR).
            (
                Some(0x0000_0000_ffff_ffff),
                Op::MaskedFetchAdd { add: 1, mask: 0 },
            ),
            (
                Some(0x0000_0000_ffff_ffff),
                Op::MaskedFetchAdd {
                    add: 1,
                    mask: 1 << 31,
                },
            ),
            (
                Some(0xdead_beef_0bad_f00d),
                Op::MaskedFetchAdd {
                    add: ones,
                    mask: ones,
                },
            ),
            (
                Some(0x0f0f_0f0f_0f0f_0f0f),
                Op::MaskedFetchAdd {
                    add: 0x1111_1111_1111_1111,
                    mask: ones,
                },
            ),
            // Byte fields: carries stop at every byte boundary.
            (
                Some(0xff00_ff00_ff00_ff00),
                Op::MaskedFetchAdd {
                    add: 0x0101_0101_0101_0101,
                    mask: 0x8080_8080_8080_8080,
                },
            ),
            (
                Some(0x7fff_ffff_ffff_ffff),
                Op::MaskedFetchAdd {
                    add: 1,
                    mask: 0x0000_0000_8000_0000,
                },
            ),
            // The top field wraps without a carry anywhere to go.
            (
                Some(ones),
                Op::MaskedFetchAdd {
                    add: 1,
                    mask: 1 << 63,
                },
            ),
            (
                Some(ones),
                Op::MaskedFetchAdd {
                    add: 1 << 32,
                    mask: 1 << 31,
                },
            ),
            // Masked CmpSwap: compare mask zero always swaps; swap mask zero changes nothing.
            (
                Some(0x1234),
                Op::MaskedCmpSwap {
                    compare: 0xffff,
                    cmask: 0,
                    swap: 0xabcd_0000_0000_0000,
                    smask: ones,
                },
            ),
            (
                Some(0x1234),
                Op::MaskedCmpSwap {
                    compare: 0x1234,
                    cmask: ones,
                    swap: ones,
                    smask: 0,
                },
            ),
            // Mismatch inside the compare mask: no change.
            (
                Some(0xaaaa_5555),
                Op::MaskedCmpSwap {
                    compare: 0xaaaa_5554,
                    cmask: 0xffff,
                    swap: 0,
                    smask: ones,
                },
            ),
            // Mismatch only outside the compare mask: swap under the swap mask.
            (
                Some(0xaaaa_5555),
                Op::MaskedCmpSwap {
                    compare: 0x1111_5555,
                    cmask: 0xffff,
                    swap: 0x9999_9999,
                    smask: 0xff00_ff00,
                },
            ),
            // Plain CmpSwap, equal and not.
            (
                Some(42),
                Op::CmpSwap {
                    compare: 42,
                    swap: ones,
                },
            ),
            (
                Some(42),
                Op::CmpSwap {
                    compare: 43,
                    swap: 7,
                },
            ),
            (
                Some(ones),
                Op::CmpSwap {
                    compare: ones,
                    swap: 0,
                },
            ),
            // Swap to the extremes.
            (None, Op::Swap(0)),
            (None, Op::Swap(ones)),
            (None, Op::Swap(0x8000_0000_0000_0001)),
        ]
    }

    fn random_mask(r: &mut fastrand::Rng) -> u64 {
        match r.u32(0..8) {
            0 => 0,
            1 => u64::MAX,
            2 => 1 << r.u32(0..64),
            3 => 0x8080_8080_8080_8080,
            4 => 0x8000_8000_8000_8000,
            5 => 0x8000_0000_8000_0000,
            _ => r.u64(..),
        }
    }

    fn random_value(r: &mut fastrand::Rng) -> u64 {
        match r.u32(0..6) {
            0 => 0,
            1 => u64::MAX,
            2 => 1 << r.u32(0..64),
            3 => r.u64(..) & 0x0101_0101_0101_0101,
            _ => r.u64(..),
        }
    }

    fn random_op(r: &mut fastrand::Rng, cur: u64) -> Op {
        // Compare values that match (in part) often enough to swap.
        let compare = |r: &mut fastrand::Rng| match r.u32(0..3) {
            0 => cur,
            1 => cur ^ (1 << r.u32(0..64)),
            _ => r.u64(..),
        };
        match r.u32(0..5) {
            0 => Op::FetchAdd(random_value(r)),
            1 => Op::CmpSwap {
                compare: compare(r),
                swap: random_value(r),
            },
            2 => Op::MaskedFetchAdd {
                add: random_value(r),
                mask: random_mask(r),
            },
            3 => Op::MaskedCmpSwap {
                compare: compare(r),
                cmask: random_mask(r),
                swap: random_value(r),
                smask: random_mask(r),
            },
            _ => Op::Swap(random_value(r)),
        }
    }

    pub fn server(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let mr = Mr::new(&dev.pd, 4096, REMOTE_ALL | LOCAL)
            .map_err(|e| format!("ibv_reg_mr (REMOTE_ATOMIC|READ|WRITE): {e}"))?;
        let initial = mix(a.seed, &[0x5eed]);
        write_u64(&mr, WORD, initial);
        for (off, v) in SENTINELS {
            write_u64(&mr, off, v);
        }
        let mut peers = greet_clients(
            a,
            &dev,
            &[
                ("rkey", mr.rkey().to_string()),
                ("addr", format!("{:x}", mr.addr() + WORD as u64)),
                ("initial", format!("{initial:x}")),
            ],
        )?;
        let cq = new_cq(&dev, 16)?;
        let p = &mut peers[0];
        let qp = plain_qp(&dev, &cq, &cq, 16, 16)?;
        connect(&mut p.oob, p.gid, &[&qp])?;
        let done = p.oob.recv("DONE")?;
        let model = done.hex("word")?;
        let word = read_u64(&mr, WORD);
        let mut errs = Vec::new();
        if word != model {
            errs.push(format!(
                "the word is {word:#x}, the client's model says {model:#x}"
            ));
        }
        for (off, v) in SENTINELS {
            let got = read_u64(&mr, off);
            if got != v {
                errs.push(format!(
                    "the neighbour at offset {off} changed: {got:#x}, was {v:#x}"
                ));
            }
        }
        if !errs.is_empty() {
            return p.oob.fail(errs.join("; "));
        }
        p.oob.send("VERDICT", &[])?;
        Ok(format!(
            "{} operations; word {word:#x} as modelled, neighbours intact",
            done.str("ops")?
        ))
    }

    pub fn client(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let (mut oob, hello, gid) = greet_server(a, &dev, &[])?;
        let rkey: u32 = hello.get("rkey")?;
        let addr = hello.hex("addr")?;
        let mut model = hello.hex("initial")?;
        let cq = new_cq(&dev, 16)?;
        let ops = (sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
            | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
            | sys::IBV_QP_EX_WITH_RDMA_READ) as u64
            | xiwdv::XIWDV_QP_EX_WITH_MASKED_ATOMICS;
        let qp = ex_qp(&dev, &cq, &cq, 16, 16, ops)?;
        connect(&mut oob, gid, &[&qp])?;
        let local = Mr::new(&dev.pd, 64, LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;

        let mut rng = fastrand::Rng::with_seed(mix(a.seed, &[0x3a5]));
        let edges = edge_cases();
        let total = edges.len() + a.iters;
        let mut counts = [0usize; 5];
        let start = Instant::now();
        for k in 0..total {
            // An edge case may need its starting value: set it with a swap first.
            let (setup, op) = match edges.get(k) {
                Some((s, op)) => (*s, *op),
                None => (None, random_op(&mut rng, model)),
            };
            let mut steps = Vec::new();
            if let Some(v) = setup {
                steps.push(Op::Swap(v));
            }
            steps.push(op);
            for op in steps {
                let what = format!("operation {k} {op:x?} on {model:#x}");
                local.fill(0, 16, POISON);
                let kind = match op {
                    Op::FetchAdd(_) => 0,
                    Op::CmpSwap { .. } => 1,
                    Op::MaskedFetchAdd { .. } => 2,
                    Op::MaskedCmpSwap { .. } => 3,
                    Op::Swap(_) => 4,
                };
                counts[kind] += 1;
                // Plain FetchAdd and CmpSwap alternate between ibv_post_send and ibv_wr_*.
                let classic = k % 2 == 0;
                let ex = |op: ExOp| ExWr {
                    wr_id: k as u64,
                    flags: SIG,
                    op,
                    sges: vec![local.sge(0, 8)],
                };
                match op {
                    Op::FetchAdd(add) if classic => post(
                        &qp,
                        &[SendWr {
                            wr_id: k as u64,
                            opcode: sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
                            flags: SIG,
                            sges: vec![local.sge(0, 8)],
                            remote_addr: addr,
                            rkey,
                            compare_add: add,
                            ..Default::default()
                        }],
                        &what,
                    )?,
                    Op::CmpSwap { compare, swap } if classic => post(
                        &qp,
                        &[SendWr {
                            wr_id: k as u64,
                            opcode: sys::IBV_WR_ATOMIC_CMP_AND_SWP,
                            flags: SIG,
                            sges: vec![local.sge(0, 8)],
                            remote_addr: addr,
                            rkey,
                            compare_add: compare,
                            swap,
                            ..Default::default()
                        }],
                        &what,
                    )?,
                    Op::FetchAdd(add) => {
                        post_ex(&qp, &[ex(ExOp::FetchAdd { rkey, addr, add })], &what)?
                    }
                    Op::CmpSwap { compare, swap } => post_ex(
                        &qp,
                        &[ex(ExOp::CmpSwp {
                            rkey,
                            addr,
                            compare,
                            swap,
                        })],
                        &what,
                    )?,
                    Op::MaskedFetchAdd { add, mask } => post_ex(
                        &qp,
                        &[ex(ExOp::MaskedFetchAdd {
                            rkey,
                            addr,
                            add,
                            boundary: mask,
                        })],
                        &what,
                    )?,
                    Op::MaskedCmpSwap {
                        compare,
                        cmask,
                        swap,
                        smask,
                    } => post_ex(
                        &qp,
                        &[ex(ExOp::MaskedCmpSwp {
                            rkey,
                            addr,
                            compare,
                            compare_mask: cmask,
                            swap,
                            swap_mask: smask,
                        })],
                        &what,
                    )?,
                    Op::Swap(swap) => post_ex(&qp, &[ex(ExOp::Swap { rkey, addr, swap })], &what)?,
                }
                let w = wait_one(&cq, &what)?;
                check_ok(&w, op.wc_opcode(), Some(8), &what)?;
                let orig = read_u64(&local, 0);
                if orig != model {
                    return oob.fail(format!(
                        "{what}: returned the original {orig:#x}, the word was {model:#x}"
                    ));
                }
                model = op.apply(orig);
                // Read the word back.
                post(
                    &qp,
                    &[SendWr {
                        wr_id: 1 << 40,
                        opcode: sys::IBV_WR_RDMA_READ,
                        flags: SIG,
                        sges: vec![local.sge(8, 8)],
                        remote_addr: addr,
                        rkey,
                        ..Default::default()
                    }],
                    &what,
                )?;
                let w = wait_one(&cq, &what)?;
                check_ok(
                    &w,
                    sys::IBV_WC_RDMA_READ,
                    Some(8),
                    &format!("{what}: read back"),
                )?;
                let now = read_u64(&local, 8);
                if now != model {
                    return oob.fail(format!(
                        "{what}: the word became {now:#x}; RFC 7306 makes it {model:#x}"
                    ));
                }
            }
        }
        let took = start.elapsed();
        // Ordering (RFC 7306 section 7): Reads and atomics posted together are
        // carried out in the order posted; each Read sees exactly the atomics
        // before it and none after it.
        let batches = 100;
        for b in 0..batches {
            let d = 1 + (b as u64 % 7);
            let what = format!("ordered batch {b} on {model:#x}");
            local.fill(0, 40, POISON);
            let read = |slot: usize| SendWr {
                wr_id: slot as u64,
                opcode: sys::IBV_WR_RDMA_READ,
                flags: SIG,
                sges: vec![local.sge(slot * 8, 8)],
                remote_addr: addr,
                rkey,
                ..Default::default()
            };
            let wrs = [
                read(0),
                SendWr {
                    wr_id: 1,
                    opcode: sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
                    flags: SIG,
                    sges: vec![local.sge(8, 8)],
                    remote_addr: addr,
                    rkey,
                    compare_add: d,
                    ..Default::default()
                },
                read(2),
                SendWr {
                    wr_id: 3,
                    opcode: sys::IBV_WR_ATOMIC_CMP_AND_SWP,
                    flags: SIG,
                    sges: vec![local.sge(24, 8)],
                    remote_addr: addr,
                    rkey,
                    compare_add: model.wrapping_add(d),
                    swap: model.wrapping_add(2 * d),
                    ..Default::default()
                },
                read(4),
            ];
            post(&qp, &wrs, &what)?;
            let wcs = wait_wcs(
                &cq,
                wrs.len(),
                Instant::now() + Duration::from_secs(10),
                &what,
            )?;
            for (i, w) in wcs.iter().enumerate() {
                if w.wr_id != i as u64 {
                    return oob.fail(format!(
                        "{what}: completion {i} is WR {}, not in posting order",
                        w.wr_id
                    ));
                }
                check_status(w, sys::IBV_WC_SUCCESS, &what)?;
            }
            let want = [
                model,
                model,
                model.wrapping_add(d),
                model.wrapping_add(d),
                model.wrapping_add(2 * d),
            ];
            for (slot, w) in want.iter().enumerate() {
                let got = read_u64(&local, slot * 8);
                if got != *w {
                    return oob.fail(format!(
                        "{what}: result {slot} (Read, FetchAdd, Read, CmpSwap, Read) is \
                         {got:#x}, in-order execution gives {w:#x}"
                    ));
                }
            }
            model = model.wrapping_add(2 * d);
        }
        let n: usize = counts.iter().sum::<usize>() + 2 * batches;
        oob.send(
            "DONE",
            &[("word", format!("{model:x}")), ("ops", n.to_string())],
        )?;
        oob.recv("VERDICT")?;
        Ok(format!(
            "{n} atomics ({} edge cases) checked against the model and read back in {:.3} s: \
             FetchAdd {}, CmpSwap {}, masked FetchAdd {}, masked CmpSwap {}, swap {}; \
             {batches} batches of Read/FetchAdd/Read/CmpSwap/Read in posting order",
            edges.len(),
            took.as_secs_f64(),
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            counts[4]
        ))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn masked_add_matches_the_rfc_examples() {
            assert_eq!(masked_add(5, 7, 0), 12);
            assert_eq!(masked_add(u64::MAX, 1, 0), 0);
            assert_eq!(masked_add(0xffff_ffff, 1, 1 << 31), 0);
            assert_eq!(
                masked_add(0xff00_ff00, 0x0101_0101, 0x8080_8080),
                0x0001_0001
            );
            assert_eq!(masked_add(0xabcd, 0x1234, u64::MAX), 0xabcd ^ 0x1234);
        }

        #[test]
        fn masked_cas_selects_bits() {
            assert_eq!(masked_cas(0xaa, 0xab, 0xf0, 0x55, 0x0f), 0xa5);
            assert_eq!(masked_cas(0xaa, 0xab, 0x0f, 0x55, 0x0f), 0xaa);
            assert_eq!(masked_cas(1, 2, 0, 9, u64::MAX), 9);
        }
    }
}

// ---- write-imm ----------------------------------------------------------------

mod write_imm {
    use super::*;

    /// Two QPs: 0 with a classic receive CQ, 1 with an extended one.
    const QPS: usize = 2;
    /// Target bytes per QP.
    const TGT: usize = 4 << 20;
    /// Receive buffer per WQE.
    const RBUF: usize = 512;
    const MAX_WRITE: usize = 48 * 1024;

    /// One message of the plan both sides derive from the seed.
    #[derive(Clone, Debug)]
    struct Msg {
        len: usize,
        off: usize,
        imm: u32,
        seed: u64,
    }

    fn plan(seed: u64, q: usize, phase: u64, r: usize, max: usize) -> Vec<Msg> {
        let mut rng = fastrand::Rng::with_seed(mix(seed, &[q as u64, phase]));
        let mut off = 0usize;
        let mut v = Vec::new();
        for i in 0..r {
            let len = match rng.u32(0..10) {
                0 => 0,
                1 => 1,
                // DDP segment and page boundaries, where they fit.
                2 => [4095, 4096, 4097, 16383, 16384, 16385][rng.usize(0..6)].min(max),
                3..=5 => rng.usize(1..=64),
                _ => rng.usize(0..=max),
            };
            off += rng.usize(0..=64);
            v.push(Msg {
                len,
                off,
                // Byte order matters for these: the bytes must arrive as given.
                imm: rng.u32(..) | 0x0100_0000,
                seed: mix(seed, &[q as u64, phase, i as u64]),
            });
            off += len;
        }
        assert!(off <= TGT, "plan larger than the target");
        v
    }

    /// The Send closing a phase: it must land in the WQE after the last message.
    fn closer(q: usize, phase: u64) -> Vec<u8> {
        format!("closer q{q} p{phase}.").into_bytes()
    }

    pub fn server(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let mut peers = greet_clients(a, &dev, &[])?;
        let p = &mut peers[0];
        let r: usize = p.hello.get("iters")?;
        let seed: u64 = p.hello.get("seed")?;
        let tgt = Mr::new(&dev.pd, QPS * TGT, REMOTE_ALL | LOCAL)
            .map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let rbuf = Mr::new(&dev.pd, QPS * (r + 1) * RBUF, LOCAL)
            .map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let scq = new_cq(&dev, 16)?;
        let rcqs = [
            new_cq(&dev, (r + 8) as i32)?,
            Cq::new_ex_with(
                &dev.ctx,
                (r + 8) as u32,
                (sys::IBV_WC_EX_WITH_BYTE_LEN
                    | sys::IBV_WC_EX_WITH_QP_NUM
                    | sys::IBV_WC_EX_WITH_IMM) as u64,
            )
            .map_err(|e| format!("ibv_create_cq_ex with IBV_WC_EX_WITH_IMM: {e}"))?,
        ];
        let qps: Vec<Qp> = (0..QPS)
            .map(|q| plain_qp(&dev, &scq, &rcqs[q], 16, (r + 8) as u32))
            .collect::<Res<_>>()?;
        p.oob.send(
            "MR",
            &[
                ("rkey", tgt.rkey().to_string()),
                ("addr", format!("{:x}", tgt.addr())),
            ],
        )?;
        connect(&mut p.oob, p.gid, &qps.iter().collect::<Vec<_>>())?;

        let mut checked = 0usize;
        let mut bytes = 0usize;
        for phase in [1u64, 2] {
            let max = if phase == 1 { MAX_WRITE } else { RBUF };
            tgt.fill(0, QPS * TGT, POISON);
            rbuf.fill(0, QPS * (r + 1) * RBUF, POISON);
            for (q, qp) in qps.iter().enumerate() {
                let wrs: Vec<RecvWr> = (0..=r)
                    .map(|i| RecvWr {
                        wr_id: i as u64,
                        sges: vec![rbuf.sge((q * (r + 1) + i) * RBUF, RBUF)],
                        num_sge: None,
                    })
                    .collect();
                recv_all(qp, &wrs, &format!("phase {phase} qp{q}"))?;
            }
            p.oob.send("READY", &[])?;
            let deadline = Instant::now() + WAIT;
            let plans: Vec<Vec<Msg>> = (0..QPS).map(|q| plan(seed, q, phase, r, max)).collect();
            let mut next = [0usize; QPS];
            // Completions are checked as they arrive: the data must be in place by then.
            while next.iter().any(|n| *n <= r) {
                let mut any = false;
                for q in 0..QPS {
                    if next[q] > r {
                        continue;
                    }
                    let Some(w) = rcqs[q]
                        .poll(1)
                        .map_err(|e| format!("poll_cq returned {e}"))?
                        .pop()
                    else {
                        continue;
                    };
                    any = true;
                    let i = next[q];
                    let what = format!("phase {phase} qp{q} message {i}");
                    if w.wr_id != i as u64 {
                        return p.oob.fail(format!(
                            "{what}: completed receive WQE {} instead of {i}: {}",
                            w.wr_id,
                            fmt_wc(&w)
                        ));
                    }
                    let slot = (q * (r + 1) + i) * RBUF;
                    let res = if i == r {
                        let c = closer(q, phase);
                        check_ok(&w, sys::IBV_WC_RECV, Some(c.len() as u32), &what).and_then(|()| {
                            if w.wc_flags & sys::IBV_WC_WITH_IMM != 0 {
                                return Err(format!("{what}: a plain Send with IBV_WC_WITH_IMM"));
                            }
                            if rbuf.read(slot, c.len()) != c {
                                return Err(format!("{what}: the closing Send's payload differs"));
                            }
                            Ok(())
                        })
                    } else {
                        let m = &plans[q][i];
                        let opcode = if phase == 1 {
                            sys::IBV_WC_RECV_RDMA_WITH_IMM
                        } else {
                            sys::IBV_WC_RECV
                        };
                        check_ok(&w, opcode, Some(m.len as u32), &what).and_then(|()| {
                            if w.wc_flags & sys::IBV_WC_WITH_IMM == 0 {
                                return Err(format!("{what}: no IBV_WC_WITH_IMM: {}", fmt_wc(&w)));
                            }
                            if w.imm_data != m.imm {
                                return Err(format!(
                                    "{what}: imm_data {:#010x} instead of {:#010x}",
                                    w.imm_data, m.imm
                                ));
                            }
                            let got = if phase == 1 {
                                tgt.read(q * TGT + m.off, m.len)
                            } else {
                                rbuf.read(slot, m.len)
                            };
                            if got != payload(m.seed, m.len) {
                                let at = got
                                    .iter()
                                    .zip(payload(m.seed, m.len))
                                    .position(|(x, y)| *x != y);
                                return Err(format!(
                                    "{what}: {} bytes not in place at completion time (first \
                                     difference at byte {at:?})",
                                    m.len
                                ));
                            }
                            Ok(())
                        })
                    };
                    if let Err(e) = res {
                        return p.oob.fail(e);
                    }
                    bytes += if i < r { plans[q][i].len } else { 0 };
                    checked += 1;
                    next[q] += 1;
                }
                if !any {
                    if Instant::now() > deadline {
                        return p.oob.fail(format!(
                            "phase {phase}: timed out; next receive per QP {next:?}"
                        ));
                    }
                    std::thread::yield_now();
                }
            }
            // No stray placement: every target byte outside the messages still poisoned.
            if phase == 1 {
                for (q, plan) in plans.iter().enumerate() {
                    let all = tgt.read(q * TGT, TGT);
                    let mut covered = vec![false; TGT];
                    for m in plan {
                        covered[m.off..m.off + m.len]
                            .iter_mut()
                            .for_each(|c| *c = true);
                    }
                    if let Some(k) = (0..TGT).find(|k| !covered[*k] && all[*k] != POISON) {
                        return p
                            .oob
                            .fail(format!("phase 1 qp{q}: stray byte at target offset {k}"));
                    }
                }
            }
            for (q, cq) in rcqs.iter().enumerate() {
                expect_quiet(
                    cq,
                    Duration::from_millis(20),
                    &format!("phase {phase} qp{q} receive CQ"),
                )?;
            }
            p.oob.send("CHECKED", &[])?;
        }
        p.oob.recv("DONE")?;
        Ok(format!(
            "{checked} receives checked on {QPS} QPs (classic and extended CQ): {r} Writes with \
             Immediate and {r} Sends with Immediate per QP ({bytes} payload bytes), one WQE \
             each, data in place at completion, closing Send in the next WQE"
        ))
    }

    pub fn client(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let r = a.iters;
        let (mut oob, _hello, gid) = greet_server(
            a,
            &dev,
            &[("iters", r.to_string()), ("seed", a.seed.to_string())],
        )?;
        let cq = new_cq(&dev, (QPS * (r + 8)) as i32)?;
        let rcq = new_cq(&dev, 16)?;
        let ops = (sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
            | sys::IBV_QP_EX_WITH_SEND_WITH_IMM
            | sys::IBV_QP_EX_WITH_SEND
            | sys::IBV_QP_EX_WITH_RDMA_WRITE) as u64;
        let qps: Vec<Qp> = (0..QPS)
            .map(|_| ex_qp(&dev, &cq, &rcq, (r + 8) as u32, 16, ops))
            .collect::<Res<_>>()?;
        let mr = oob.recv("MR")?;
        let (rkey, base): (u32, u64) = (mr.get("rkey")?, mr.hex("addr")?);
        connect(&mut oob, gid, &qps.iter().collect::<Vec<_>>())?;
        let src = Mr::new(&dev.pd, TGT + RBUF, LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let mut via = [0usize; 2];
        let start = Instant::now();
        for phase in [1u64, 2] {
            let max = if phase == 1 { MAX_WRITE } else { RBUF };
            oob.recv("READY")?;
            for (q, qp) in qps.iter().enumerate() {
                let plan = plan(a.seed, q, phase, r, max);
                for m in &plan {
                    src.write(m.off, &payload(m.seed, m.len));
                }
                let c = closer(q, phase);
                src.write(TGT, &c);
                // Messages alternate between ibv_post_send and the ibv_wr_* builders.
                for (i, m) in plan.iter().enumerate() {
                    let what = format!("phase {phase} qp{q} message {i}");
                    let sges = if m.len == 0 {
                        vec![]
                    } else {
                        vec![src.sge(m.off, m.len)]
                    };
                    let addr = base + (q * TGT + m.off) as u64;
                    if i % 2 == 0 {
                        let (opcode, remote_addr) = if phase == 1 {
                            (sys::IBV_WR_RDMA_WRITE_WITH_IMM, addr)
                        } else {
                            (sys::IBV_WR_SEND_WITH_IMM, 0)
                        };
                        let wr = SendWr {
                            wr_id: i as u64,
                            opcode,
                            flags: SIG,
                            sges,
                            remote_addr,
                            rkey,
                            imm_data: m.imm,
                            ..Default::default()
                        };
                        post(qp, &[wr], &what)?;
                        via[0] += 1;
                    } else {
                        let op = if phase == 1 {
                            ExOp::WriteImm {
                                rkey,
                                addr,
                                imm: m.imm,
                            }
                        } else {
                            ExOp::SendImm { imm: m.imm }
                        };
                        post_ex(
                            qp,
                            &[ExWr {
                                wr_id: i as u64,
                                flags: SIG,
                                op,
                                sges,
                            }],
                            &what,
                        )?;
                        via[1] += 1;
                    }
                }
                let close = SendWr {
                    wr_id: r as u64,
                    opcode: sys::IBV_WR_SEND,
                    flags: SIG,
                    sges: vec![src.sge(TGT, c.len())],
                    ..Default::default()
                };
                post(qp, &[close], &format!("phase {phase} qp{q} closing Send"))?;
                // The source is rewritten next round: wait for this QP's completions.
                let wcs = wait_wcs(
                    &cq,
                    r + 1,
                    Instant::now() + WAIT,
                    &format!("phase {phase} qp{q}"),
                )?;
                for (i, w) in wcs.iter().enumerate() {
                    let what = format!("phase {phase} qp{q} requester completion {i}");
                    let want = if phase == 1 && i < r {
                        sys::IBV_WC_RDMA_WRITE
                    } else {
                        sys::IBV_WC_SEND
                    };
                    check_ok(w, want, None, &what)?;
                    if w.wr_id != i as u64 {
                        return Err(format!("{what}: wr_id {} out of order", w.wr_id));
                    }
                }
            }
            oob.recv("CHECKED")?;
        }
        oob.send("DONE", &[])?;
        Ok(format!(
            "{QPS} QPs x {r} Writes with Immediate and {r} Sends with Immediate (0 to {MAX_WRITE} \
             bytes; {} via ibv_post_send, {} via ibv_wr_*) in {:.3} s",
            via[0],
            via[1],
            start.elapsed().as_secs_f64()
        ))
    }
}

// ---- file-backed memory -------------------------------------------------------

/// A file of `len` zero bytes at `path`, made durable, mapped shared.
fn zeroed_file_mapping(path: &Path, len: usize) -> Res<(File, Mapping)> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| format!("creating {}: {e}", path.display()))?;
    f.set_len(len as u64)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("sizing {}: {e}", path.display()))?;
    let m = Mapping::file(&f, len).map_err(|e| format!("mmap of {}: {e}", path.display()))?;
    Ok((f, m))
}

/// `len` bytes at `off` of `path` as the medium holds them (O_DIRECT, so the
/// page cache is written back first and then bypassed), in aligned blocks.
fn read_medium(path: &Path, off: usize, len: usize) -> Res<Vec<u8>> {
    const BLK: usize = 4096;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("open {} with O_DIRECT: {e}", path.display()))?;
    let (start, end) = (off / BLK * BLK, (off + len).div_ceil(BLK) * BLK);
    let mut buf = AlignedBuf::new(end - start);
    f.read_exact_at(buf.as_mut(), start as u64)
        .map_err(|e| format!("O_DIRECT read of {}: {e}", path.display()))?;
    Ok(buf.as_ref()[off - start..off - start + len].to_vec())
}

/// Flips (XOR 0xff) the byte at `off` of `path` on the medium: an O_DIRECT
/// read-modify-write of its block, or pwrite + fsync where O_DIRECT is refused.
fn flip_on_medium(path: &Path, off: usize) -> Res<&'static str> {
    const BLK: usize = 4096;
    let start = off / BLK * BLK;
    let direct = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    if let Ok(f) = direct {
        let mut buf = AlignedBuf::new(BLK);
        f.read_exact_at(buf.as_mut(), start as u64)
            .map_err(|e| format!("O_DIRECT read of {}: {e}", path.display()))?;
        buf.as_mut()[off - start] ^= 0xff;
        f.write_all_at(buf.as_ref(), start as u64)
            .map_err(|e| format!("O_DIRECT write of {}: {e}", path.display()))?;
        return Ok("O_DIRECT");
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off as u64)
        .and_then(|()| f.write_all_at(&[b[0] ^ 0xff], off as u64))
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("pwrite + fsync of {}: {e}", path.display()))?;
    Ok("pwrite+fsync")
}

/// A heap buffer of `len` bytes aligned for O_DIRECT (inside a larger Vec).
struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let v = vec![0u8; len + 4096];
        let off = v.as_ptr().align_offset(4096);
        AlignedBuf { v, off, len }
    }

    fn as_ref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

fn need_file(a: &Args) -> Res<&Path> {
    a.file.as_deref().ok_or_else(|| {
        format!(
            "{} needs --file PATH (on a persistent file system)",
            a.scenario
        )
    })
}

// ---- commit -------------------------------------------------------------------

mod commit {
    use super::*;

    /// The file: the record count (u64, little-endian) at 0, records from HDR on.
    /// tests/tests/extensions.rs reads the file with the same layout.
    pub const HDR: usize = 4096;
    /// Odd-sized records straddle pages.
    pub const REC: usize = 1500;

    /// Record `i`'s bytes: its index (u64 LE), then `(i*131 + j*7 + j/256) ^ 0x5a`
    /// at byte j. tests/tests/extensions.rs computes the same.
    pub fn record(i: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (0..REC)
            .map(|j| ((i * 131 + j * 7 + j / 256) as u8) ^ 0x5a)
            .collect();
        v[..8].copy_from_slice(&(i as u64).to_le_bytes());
        v
    }

    pub fn file_len(records: usize) -> usize {
        (HDR + records * REC).div_ceil(4096) * 4096
    }

    const ACCESS: u32 = xiwdv::IBV_ACCESS_FLUSH_PERSISTENT
        | xiwdv::IBV_ACCESS_FLUSH_GLOBAL
        | sys::IBV_ACCESS_REMOTE_WRITE
        | sys::IBV_ACCESS_REMOTE_READ
        | LOCAL;

    /// Checks the count and every record it covers in `bytes` (the whole file).
    fn check_log(bytes: &[u8], records: usize, what: &str) -> Res<u64> {
        let count = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        if count as usize > records {
            return Err(format!(
                "{what}: count {count} beyond the {records} records"
            ));
        }
        for i in 0..count as usize {
            let at = HDR + i * REC;
            if bytes[at..at + REC] != record(i)[..] {
                return Err(format!(
                    "{what}: count {count}, but record {i} is not intact"
                ));
            }
        }
        Ok(count)
    }

    pub fn server(a: &Args) -> Res<String> {
        let path = need_file(a)?.to_path_buf();
        let dev = open_dev(a.dev.as_deref())?;
        let len = file_len(a.records);
        let (_f, map) = zeroed_file_mapping(&path, len)?;
        let attr = MrAttr::verifiable(HashAlg::Crc32c);
        let log = Mr::register(&dev.pd, map, ACCESS, Reg::Xiwdv(Some(attr))).map_err(|e| {
            format!(
                "xiwdv_reg_mr of {} (FLUSH_PERSISTENT, CRC32c): {e}",
                path.display()
            )
        })?;
        let mut peers = greet_clients(
            a,
            &dev,
            &[
                ("rkey", log.rkey().to_string()),
                ("addr", format!("{:x}", log.addr())),
                ("records", a.records.to_string()),
            ],
        )?;
        let p = &mut peers[0];
        let cq = new_cq(&dev, 16)?;
        let qp = plain_qp(&dev, &cq, &cq, 16, 16)?;
        connect(&mut p.oob, p.gid, &[&qp])?;
        let done = p.oob.recv("DONE")?;
        let n: usize = done.get("records")?;
        let res = check_log(&log.read(0, len), a.records, "memory")
            .and_then(|c| {
                let m = check_log(&read_medium(&path, 0, len)?, a.records, "medium (O_DIRECT)")?;
                Ok((c, m))
            })
            .and_then(|(c, m)| {
                if c as usize != n || m as usize != n {
                    return Err(format!(
                        "{n} records committed; the count is {c} in memory, {m} on the medium"
                    ));
                }
                Ok(())
            });
        if let Err(e) = res {
            return p.oob.fail(e);
        }
        p.oob.send("VERDICT", &[])?;
        Ok(format!(
            "{n} records of {REC} bytes in {} (xiwdv_reg_mr FLUSH_PERSISTENT): count {n} and every \
             record intact in memory and on the medium",
            path.display()
        ))
    }

    pub fn client(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let (mut oob, hello, gid) = greet_server(a, &dev, &[])?;
        let rkey: u32 = hello.get("rkey")?;
        let base = hello.hex("addr")?;
        let n: usize = hello.get("records")?;
        let cq = new_cq(&dev, 64)?;
        let ops = (sys::IBV_QP_EX_WITH_RDMA_WRITE | sys::IBV_QP_EX_WITH_ATOMIC_WRITE) as u64
            | xiwdv::XIWDV_QP_EX_WITH_FLUSH;
        let qp = ex_qp(&dev, &cq, &cq, 32, 16, ops)?;
        connect(&mut oob, gid, &[&qp])?;
        let src = Mr::new(&dev.pd, n * REC, LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        for i in 0..n {
            src.write(i * REC, &record(i));
        }
        let persistent = xiwdv::Placement::Persistent as u8;
        let range = xiwdv::Selectivity::Range as u8;
        let start = Instant::now();
        let mut out = std::io::stdout();
        for i in 0..n {
            let at = base + (HDR + i * REC) as u64;
            let wrs = [
                ExWr {
                    wr_id: 1,
                    flags: 0,
                    op: ExOp::Write { rkey, addr: at },
                    sges: vec![src.sge(i * REC, REC)],
                },
                ExWr {
                    wr_id: 2,
                    flags: 0,
                    op: ExOp::Flush {
                        rkey,
                        addr: at,
                        len: REC,
                        placement: persistent,
                        level: range,
                    },
                    sges: vec![],
                },
                // Published only once the record is durable.
                ExWr {
                    wr_id: 3,
                    flags: SIG,
                    op: ExOp::AtomicWrite {
                        rkey,
                        addr: base,
                        value: (i as u64 + 1).to_le_bytes(),
                    },
                    sges: vec![],
                },
                // And the count itself made durable.
                ExWr {
                    wr_id: 4,
                    flags: SIG,
                    op: ExOp::Flush {
                        rkey,
                        addr: base,
                        len: 8,
                        placement: persistent,
                        level: range,
                    },
                    sges: vec![],
                },
            ];
            let what = format!("record {i}");
            post_ex(&qp, &wrs, &what)?;
            let w = wait_wcs(&cq, 2, Instant::now() + WAIT, &what)?;
            check_ok(
                &w[0],
                sys::IBV_WC_ATOMIC_WRITE,
                Some(8),
                &format!("{what}: Atomic Write"),
            )?;
            check_ok(
                &w[1],
                xiwdv::XIWDV_WC_FLUSH,
                Some(0),
                &format!("{what}: Flush of the count"),
            )?;
            if (w[0].wr_id, w[1].wr_id) != (3, 4) {
                return Err(format!(
                    "{what}: completions {} and {} out of order",
                    w[0].wr_id, w[1].wr_id
                ));
            }
            writeln!(out, "committed {i}")
                .and_then(|()| out.flush())
                .map_err(|e| format!("stdout: {e}"))?;
        }
        let took = start.elapsed();
        oob.send("DONE", &[("records", n.to_string())])?;
        oob.recv("VERDICT")?;
        Ok(format!(
            "{n} records committed (Write, Flush, Atomic Write, Flush) in {:.3} s ({:.0}/s)",
            took.as_secs_f64(),
            per_sec(n, took)
        ))
    }
}

// ---- verify -------------------------------------------------------------------

/// The hash RDMA Verify returns for `data` with `alg`.
fn hash_of(alg: HashAlg, data: &[u8]) -> Vec<u8> {
    match alg {
        HashAlg::None => Vec::new(),
        HashAlg::Crc32c => crc32c::crc32c(data).to_be_bytes().to_vec(),
        HashAlg::Sha256 => Sha256::digest(data).to_vec(),
    }
}

/// `PREFIX.suffix`.
fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".");
    s.push(suffix);
    PathBuf::from(s)
}

mod verify {
    use super::*;

    const LEN: usize = 64 * 1024;
    /// Per hash: the data's offset and length in its MR, and the byte flipped later.
    const CASES: [(HashAlg, &str, usize, usize); 2] = [
        (HashAlg::Sha256, "sha256", 100, 12345),
        (HashAlg::Crc32c, "crc32c", 333, 5000),
    ];
    const FLIP: usize = 777;
    const ACCESS: u32 = xiwdv::IBV_ACCESS_FLUSH_PERSISTENT
        | xiwdv::IBV_ACCESS_FLUSH_GLOBAL
        | sys::IBV_ACCESS_REMOTE_WRITE
        | sys::IBV_ACCESS_REMOTE_READ
        | LOCAL;

    pub fn server(a: &Args) -> Res<String> {
        let prefix = need_file(a)?.to_path_buf();
        let dev = open_dev(a.dev.as_deref())?;
        let mut mrs = Vec::new();
        let mut kv = Vec::new();
        for (alg, name, _, _) in CASES {
            let path = with_suffix(&prefix, name);
            let (_f, map) = zeroed_file_mapping(&path, LEN)?;
            let mr = Mr::register(
                &dev.pd,
                map,
                ACCESS,
                Reg::Xiwdv(Some(MrAttr::verifiable(alg))),
            )
            .map_err(|e| format!("xiwdv_reg_mr of {} ({name}): {e}", path.display()))?;
            kv.push((name, format!("{:x}:{}", mr.addr(), mr.rkey())));
            mrs.push((path, mr));
        }
        let mut peers = greet_clients(a, &dev, &kv)?;
        let p = &mut peers[0];
        let cq = new_cq(&dev, 16)?;
        let qps = [
            plain_qp(&dev, &cq, &cq, 16, 16)?,
            plain_qp(&dev, &cq, &cq, 16, 16)?,
        ];
        connect(&mut p.oob, p.gid, &[&qps[0], &qps[1]])?;
        p.oob.recv("FLIP")?;
        let mut how = "";
        for ((_, _, off, _), (path, _)) in CASES.iter().zip(&mrs) {
            match flip_on_medium(path, off + FLIP) {
                Ok(h) => how = h,
                Err(e) => return p.oob.fail(e),
            }
        }
        p.oob.send("FLIPPED", &[("how", how.to_string())])?;
        p.oob.recv("DONE")?;
        Ok(format!(
            "SHA-256 and CRC32c MRs over files; one byte of each flipped on the medium ({how})"
        ))
    }

    fn addr_rkey(hello: &Kv, name: &str) -> Res<(u64, u32)> {
        let s = hello.str(name)?;
        let (a, r) = s.split_once(':').ok_or_else(|| format!("bad {name} {s}"))?;
        Ok((
            u64::from_str_radix(a, 16).map_err(|_| format!("bad {name} {s}"))?,
            r.parse().map_err(|_| format!("bad {name} {s}"))?,
        ))
    }

    pub fn client(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let (mut oob, hello, gid) = greet_server(a, &dev, &[])?;
        let cq = new_cq(&dev, 32)?;
        let ops = sys::IBV_QP_EX_WITH_RDMA_WRITE as u64
            | xiwdv::XIWDV_QP_EX_WITH_FLUSH
            | xiwdv::XIWDV_QP_EX_WITH_VERIFY;
        let qa = ex_qp(&dev, &cq, &cq, 16, 16, ops)?;
        let qb = ex_qp(&dev, &cq, &cq, 16, 16, ops)?;
        connect(&mut oob, gid, &[&qa, &qb])?;
        // Per case: the data at 0.., its hash landing at 64K.
        let local = Mr::new(&dev.pd, LEN + 4096, LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let hbuf = LEN;
        let persistent = xiwdv::Placement::Persistent as u8;
        let range = xiwdv::Selectivity::Range as u8;
        let mut notes = Vec::new();

        // A Verify of [off, off+len) on `qp`, returning the completion and the hash.
        let verify = |qp: &Qp,
                      alg: HashAlg,
                      (addr, rkey): (u64, u32),
                      off: usize,
                      len: usize,
                      expected: Option<Vec<u8>>,
                      what: &str|
         -> Res<(Wc, Vec<u8>)> {
            local.fill(hbuf, 64, POISON);
            let op = ExOp::Verify {
                rkey,
                addr: addr + off as u64,
                len: len as u32,
                expected,
            };
            post_ex(
                qp,
                &[ExWr {
                    wr_id: 9,
                    flags: SIG,
                    op,
                    sges: vec![local.sge(hbuf, 32)],
                }],
                what,
            )?;
            let w = wait_one(&cq, what)?;
            Ok((w, local.read(hbuf, alg.len())))
        };
        let mut olds = Vec::new();
        for (alg, name, off, len) in CASES {
            let target = addr_rkey(&hello, name)?;
            let data = payload(mix(a.seed, &[off as u64]), len);
            let want = hash_of(alg, &data);
            local.write(0, &data);
            let at = target.0 + off as u64;
            let wrs = [
                ExWr {
                    wr_id: 1,
                    flags: 0,
                    op: ExOp::Write {
                        rkey: target.1,
                        addr: at,
                    },
                    sges: vec![local.sge(0, len)],
                },
                ExWr {
                    wr_id: 2,
                    flags: 0,
                    op: ExOp::Flush {
                        rkey: target.1,
                        addr: at,
                        len,
                        placement: persistent,
                        level: range,
                    },
                    sges: vec![],
                },
            ];
            post_ex(&qa, &wrs, &format!("{name}: Write + Flush"))?;
            let what = format!("{name}: Verify without an expected hash");
            let (w, got) = verify(&qa, alg, target, off, len, None, &what)?;
            check_ok(&w, xiwdv::XIWDV_WC_VERIFY, Some(alg.len() as u32), &what)?;
            if got != want {
                return Err(format!(
                    "{what}: returned {}, the data hashes to {}",
                    hex(&got),
                    hex(&want)
                ));
            }
            let what = format!("{name}: Verify with the right expected hash");
            let (w, got) = verify(&qa, alg, target, off, len, Some(want.clone()), &what)?;
            check_ok(&w, xiwdv::XIWDV_WC_VERIFY, Some(alg.len() as u32), &what)?;
            if got != want {
                return Err(format!(
                    "{what}: returned {}, expected {}",
                    hex(&got),
                    hex(&want)
                ));
            }
            notes.push(format!("{name} {}", hex(&want)));
            olds.push((alg, name, target, off, len, data, want));
        }
        oob.send("FLIP", &[])?;
        let how = oob.recv("FLIPPED")?.str("how")?.to_string();

        // The old hash no longer matches what the medium holds.
        let (alg, name, target, off, len, _, old) = &olds[0];
        let what = format!("{name}: Verify with the old hash after the flip");
        let (w, _) = verify(&qa, *alg, *target, *off, *len, Some(old.clone()), &what)?;
        check_status(&w, sys::IBV_WC_REM_OP_ERR, &what)?;
        expect_state(&qa, sys::IBV_QPS_ERR, &what)?;
        // A fresh QP sees the new hashes, and a mismatch there too.
        for (alg, name, target, off, len, data, old) in &olds {
            let mut changed = data.clone();
            changed[FLIP] ^= 0xff;
            let want = hash_of(*alg, &changed);
            let what = format!("{name}: Verify on a fresh QP after the flip");
            let (w, got) = verify(&qb, *alg, *target, *off, *len, None, &what)?;
            check_ok(&w, xiwdv::XIWDV_WC_VERIFY, Some(alg.len() as u32), &what)?;
            if got == *old {
                return Err(format!(
                    "{what}: still the old hash {}: the flip on the medium went unseen",
                    hex(old)
                ));
            }
            if got != want {
                return Err(format!(
                    "{what}: returned {}, the flipped data hashes to {}",
                    hex(&got),
                    hex(&want)
                ));
            }
        }
        let (alg, name, target, off, len, _, old) = &olds[1];
        let what = format!("{name}: Verify with the old hash on the fresh QP");
        let (w, _) = verify(&qb, *alg, *target, *off, *len, Some(old.clone()), &what)?;
        check_status(&w, sys::IBV_WC_REM_OP_ERR, &what)?;
        expect_state(&qb, sys::IBV_QPS_ERR, &what)?;
        oob.send("DONE", &[])?;
        Ok(format!(
            "hashes returned and matched ({}); after a byte flipped on the medium ({how}) the old \
             hashes fail with IBV_WC_REM_OP_ERR (QP in error) and a fresh QP reads the new ones",
            notes.join(", ")
        ))
    }
}

// ---- errors -------------------------------------------------------------------

mod errors {
    use super::*;

    const LEN: usize = 64 * 1024;
    const FLUSH_ACCESS: u32 = xiwdv::IBV_ACCESS_FLUSH_PERSISTENT | xiwdv::IBV_ACCESS_FLUSH_GLOBAL;

    /// The cases with a remote side, in order.
    const CASES: &[&str] = &[
        "bad-rkey",
        "atomic-without-remote-atomic",
        "flush-without-flush-access",
        "verify-without-hash",
        "misaligned-atomic",
        "misaligned-atomic-write",
        "atomic-out-of-bounds",
        "flush-out-of-bounds",
        "verify-out-of-bounds",
        "atomic-write-bad-sge",
        "builder-bad-args",
        "local-invalidate-completes",
    ];

    /// The server's MRs, by name: every case must leave all of them unchanged.
    const MRS: [&str; 4] = ["atomic", "noatomic", "plainfile", "hashfile"];

    pub fn server(a: &Args) -> Res<String> {
        let prefix = need_file(a)?.to_path_buf();
        let dev = open_dev(a.dev.as_deref())?;
        let atomic =
            Mr::new(&dev.pd, LEN, REMOTE_ALL | LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let noatomic = Mr::new(
            &dev.pd,
            LEN,
            sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_REMOTE_WRITE | LOCAL,
        )
        .map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let file_mr = |suffix: &str, attr: Option<MrAttr>| -> Res<Mr> {
            let path = with_suffix(&prefix, suffix);
            let (_f, map) = zeroed_file_mapping(&path, LEN)?;
            let access = FLUSH_ACCESS | REMOTE_ALL | LOCAL;
            let mr = Mr::register(&dev.pd, map, access, Reg::Xiwdv(attr))
                .map_err(|e| format!("xiwdv_reg_mr of {}: {e}", path.display()));
            let _ = std::fs::remove_file(&path);
            mr
        };
        let plainfile = file_mr("plain", None)?;
        let hashfile = file_mr("crc32c", Some(MrAttr::verifiable(HashAlg::Crc32c)))?;
        let mrs = [&atomic, &noatomic, &plainfile, &hashfile];
        for (k, mr) in mrs.iter().enumerate() {
            mr.write(0, &payload(mix(a.seed, &[k as u64, 0xe7]), LEN));
        }
        let rkeys: Vec<u32> = mrs.iter().map(|m| m.rkey()).collect();
        let mut bogus = rkeys[0].wrapping_add(0x0010_0000);
        while rkeys.contains(&bogus) {
            bogus = bogus.wrapping_add(0x0100_0001);
        }
        let mut kv: Vec<(&str, String)> = MRS
            .iter()
            .zip(&mrs)
            .map(|(n, m)| (*n, format!("{:x}:{}", m.addr(), m.rkey())))
            .collect();
        kv.push(("bogus", bogus.to_string()));
        let mut peers = greet_clients(a, &dev, &kv)?;
        let p = &mut peers[0];
        let mut changed = Vec::new();
        let mut n = 0;
        loop {
            let msg = p.oob.recv("CASE")?;
            let name = msg.str("name")?.to_string();
            if name == "end" {
                break;
            }
            n += 1;
            let before: Vec<Vec<u8>> = mrs.iter().map(|m| m.read(0, LEN)).collect();
            let cq = new_cq(&dev, 16)?;
            let qp = plain_qp(&dev, &cq, &cq, 16, 16)?;
            connect(&mut p.oob, p.gid, &[&qp])?;
            p.oob.recv("END")?;
            let diffs: Vec<String> = mrs
                .iter()
                .zip(&before)
                .zip(MRS)
                .filter_map(|((m, b), mname)| {
                    let now = m.read(0, LEN);
                    now.iter()
                        .zip(b)
                        .position(|(x, y)| x != y)
                        .map(|k| format!("{mname}+{k}"))
                })
                .collect();
            if diffs.is_empty() {
                p.oob.send("MEM", &[("ok", "1".into())])?;
            } else {
                changed.push(format!("{name}: {}", diffs.join(",")));
                p.oob
                    .send("MEM", &[("ok", "0".into()), ("diff", diffs.join(","))])?;
            }
        }
        if !changed.is_empty() {
            return Err(format!(
                "responder memory changed by failed operations: {}",
                changed.join("; ")
            ));
        }
        Ok(format!(
            "{n} cases, the responder's memory unchanged by every one"
        ))
    }

    fn target(hello: &Kv, name: &str) -> Res<(u64, u32)> {
        let s = hello.str(name)?;
        let (a, r) = s.split_once(':').ok_or_else(|| format!("bad {name} {s}"))?;
        Ok((
            u64::from_str_radix(a, 16).map_err(|_| format!("bad {name} {s}"))?,
            r.parse().map_err(|_| format!("bad {name} {s}"))?,
        ))
    }

    /// Local checks: capabilities and the registrations xiwdv must refuse.
    fn local_checks(dev: &Dev) -> Vec<(String, Res<String>)> {
        let mut out = Vec::new();
        let caps = || -> Res<String> {
            let at = dev.attr.atomic_cap;
            if at != sys::IBV_ATOMIC_HCA && at != sys::IBV_ATOMIC_GLOB {
                return Err(format!(
                    "ibv_query_device: atomic_cap {at}, expected IBV_ATOMIC_HCA or GLOB"
                ));
            }
            if dev.attr.max_qp_rd_atom <= 0 {
                return Err(format!(
                    "ibv_query_device: max_qp_rd_atom {}",
                    dev.attr.max_qp_rd_atom
                ));
            }
            if !dev.ctx.is_xiw() {
                return Err("xiwdv_is_xiw says this is not xiw".into());
            }
            let x = dev
                .ctx
                .xiwdv_query_device()
                .map_err(|e| format!("xiwdv_query_device: {e}"))?;
            let all = xiwdv::XIWDV_CAP_ATOMICS
                | xiwdv::XIWDV_CAP_IMMEDIATE
                | xiwdv::XIWDV_CAP_FLUSH_GLOBAL
                | xiwdv::XIWDV_CAP_FLUSH_PERSISTENT
                | xiwdv::XIWDV_CAP_VERIFY
                | xiwdv::XIWDV_CAP_ATOMIC_WRITE;
            if !x.has(all) {
                return Err(format!(
                    "xiwdv_query_device: caps {:#x}, expected all of {all:#x}",
                    x.caps
                ));
            }
            if !x.supports_hash(HashAlg::Crc32c) || !x.supports_hash(HashAlg::Sha256) {
                return Err(format!(
                    "xiwdv_query_device: hashes {:#x} lack CRC32c or SHA-256",
                    x.hashes
                ));
            }
            if x.max_hash_len as usize != xiwdv::XIWDV_MAX_HASH_LEN {
                return Err(format!(
                    "xiwdv_query_device: max_hash_len {}",
                    x.max_hash_len
                ));
            }
            Ok(format!(
                "atomic_cap {at}, max_qp_rd_atom {}, xiwdv caps {:#x} hashes {:#x}",
                dev.attr.max_qp_rd_atom, x.caps, x.hashes
            ))
        };
        out.push(("caps".to_string(), caps()));
        let access = xiwdv::IBV_ACCESS_FLUSH_PERSISTENT | sys::IBV_ACCESS_REMOTE_WRITE | LOCAL;
        let refused = |what: &str, mem: Mapping, words: &[&str]| -> Res<String> {
            match Mr::register(&dev.pd, mem, access, Reg::Xiwdv(None)) {
                Ok(_) => Err(format!(
                    "xiwdv_reg_mr(FLUSH_PERSISTENT) over {what} succeeded"
                )),
                Err(xiwdv::Error::Failed { errno, reason }) => {
                    if errno != libc::EINVAL {
                        return Err(format!(
                            "{what}: errno {}, expected EINVAL",
                            ibv::errno_str(errno)
                        ));
                    }
                    let low = reason.to_lowercase();
                    if reason.is_empty() || !words.iter().any(|w| low.contains(w)) {
                        return Err(format!(
                            "{what}: xiwdv_last_error() {reason:?} does not say why (mention one of {words:?})"
                        ));
                    }
                    Ok(format!("EINVAL: {reason}"))
                }
                Err(e) => Err(format!("{what}: {e}")),
            }
        };
        let anon = Mapping::anon(8192).map_err(|e| format!("mmap: {e}"));
        out.push((
            "reg-flush-persistent-anonymous".into(),
            anon.and_then(|m| refused("anonymous memory", m, &["anonymous", "file", "persist"])),
        ));
        let shm = PathBuf::from(format!("/dev/shm/xiw-ext-check-{}", std::process::id()));
        let r = zeroed_file_mapping(&shm, 8192).and_then(|(_f, m)| {
            refused(
                "a /dev/shm file",
                m,
                &[
                    "tmpfs",
                    "shm",
                    "ram",
                    "persist",
                    "file system",
                    "filesystem",
                ],
            )
        });
        let _ = std::fs::remove_file(&shm);
        out.push(("reg-flush-persistent-tmpfs".into(), r));
        out
    }

    /// One remote case on a fresh QP; returns a note for the result line.
    fn run_case(name: &str, qp: &Qp, cq: &Cq, hello: &Kv, local: &Mr) -> Res<String> {
        let atomic = target(hello, "atomic")?;
        let noatomic = target(hello, "noatomic")?;
        let plainfile = target(hello, "plainfile")?;
        let hashfile = target(hello, "hashfile")?;
        let bogus: u32 = hello.get("bogus")?;
        let persistent = xiwdv::Placement::Persistent as u8;
        let range = xiwdv::Selectivity::Range as u8;
        let sge8 = vec![local.sge(0, 8)];
        let fetch_add = |(addr, rkey): (u64, u32)| ExWr {
            wr_id: 1,
            flags: SIG,
            op: ExOp::FetchAdd { rkey, addr, add: 1 },
            sges: sge8.clone(),
        };
        let flush = |(addr, rkey): (u64, u32), len: usize| ExWr {
            wr_id: 1,
            flags: SIG,
            op: ExOp::Flush {
                rkey,
                addr,
                len,
                placement: persistent,
                level: range,
            },
            sges: vec![],
        };
        let verify = |(addr, rkey): (u64, u32), len: u32| ExWr {
            wr_id: 1,
            flags: SIG,
            op: ExOp::Verify {
                rkey,
                addr,
                len,
                expected: None,
            },
            sges: vec![local.sge(0, 32)],
        };
        let remote_error = |wr: ExWr, status: u32| -> Res<String> {
            post_ex(qp, &[wr], name)?;
            let w = wait_one(cq, name)?;
            check_status(&w, status, name)?;
            expect_state(qp, sys::IBV_QPS_ERR, name)?;
            Ok(status_name(status))
        };
        let off = |(a, r): (u64, u32), k: usize| (a + k as u64, r);
        // Nothing was sent: no completion, the QP still works, and a Read is the
        // first thing to complete.
        let still_clean = || -> Res {
            expect_quiet(cq, Duration::from_millis(100), name)?;
            expect_state(qp, sys::IBV_QPS_RTS, name)?;
            post(
                qp,
                &[SendWr {
                    wr_id: 77,
                    opcode: sys::IBV_WR_RDMA_READ,
                    flags: SIG,
                    sges: vec![local.sge(64, 8)],
                    remote_addr: atomic.0 + 128,
                    rkey: atomic.1,
                    ..Default::default()
                }],
                name,
            )?;
            let w = wait_one(cq, name)?;
            check_ok(
                &w,
                sys::IBV_WC_RDMA_READ,
                Some(8),
                &format!("{name}: the Read after"),
            )?;
            if w.wr_id != 77 {
                return Err(format!("{name}: something else completed: {}", fmt_wc(&w)));
            }
            Ok(())
        };
        match name {
            "bad-rkey" => remote_error(fetch_add((atomic.0, bogus)), sys::IBV_WC_REM_ACCESS_ERR),
            "atomic-without-remote-atomic" => {
                remote_error(fetch_add(noatomic), sys::IBV_WC_REM_ACCESS_ERR)
            }
            "flush-without-flush-access" => {
                remote_error(flush(noatomic, 64), sys::IBV_WC_REM_ACCESS_ERR)
            }
            "verify-without-hash" => {
                remote_error(verify(plainfile, 64), sys::IBV_WC_REM_ACCESS_ERR)
            }
            "misaligned-atomic" => remote_error(fetch_add(off(atomic, 4)), sys::IBV_WC_REM_OP_ERR),
            "misaligned-atomic-write" => remote_error(
                ExWr {
                    wr_id: 1,
                    flags: SIG,
                    op: ExOp::AtomicWrite {
                        rkey: atomic.1,
                        addr: atomic.0 + 4,
                        value: [0xee; 8],
                    },
                    sges: vec![],
                },
                sys::IBV_WC_REM_OP_ERR,
            ),
            "atomic-out-of-bounds" => {
                remote_error(fetch_add(off(atomic, LEN)), sys::IBV_WC_REM_ACCESS_ERR)
            }
            "flush-out-of-bounds" => remote_error(
                flush(off(plainfile, LEN - 64), 128),
                sys::IBV_WC_REM_ACCESS_ERR,
            ),
            "verify-out-of-bounds" => remote_error(
                verify(off(hashfile, LEN - 64), 128),
                sys::IBV_WC_REM_ACCESS_ERR,
            ),
            "local-invalidate-completes" => {
                // A Local Invalidate frames nothing: it must complete at once
                // all the same, here with the error of an STag that does not
                // exist. First a Read, so that the stream is up and idle.
                still_clean()?;
                post(
                    qp,
                    &[SendWr {
                        wr_id: 9,
                        opcode: sys::IBV_WR_LOCAL_INV,
                        flags: SIG,
                        imm_data: bogus,
                        ..Default::default()
                    }],
                    name,
                )?;
                let w = wait_one(cq, name)?;
                if w.wr_id != 9 || w.opcode != sys::IBV_WC_LOCAL_INV {
                    return Err(format!("{name}: unexpected completion {}", fmt_wc(&w)));
                }
                check_status(&w, sys::IBV_WC_MW_BIND_ERR, name)?;
                Ok("an unknown STag: IBV_WC_MW_BIND_ERR".into())
            }
            "atomic-write-bad-sge" => {
                let aw = |sges: Vec<ibv::ibv_sge>| SendWr {
                    wr_id: 5,
                    opcode: sys::IBV_WR_ATOMIC_WRITE,
                    flags: SIG,
                    sges,
                    remote_addr: atomic.0 + 128,
                    rkey: atomic.1,
                    ..Default::default()
                };
                for (what, sges) in [
                    ("4 bytes", vec![local.sge(0, 4)]),
                    ("16 bytes", vec![local.sge(0, 8), local.sge(8, 8)]),
                    ("no SGE", vec![]),
                ] {
                    match qp.post_send(&[aw(sges)]) {
                        Err((_, libc::EINVAL)) => {}
                        Err((_, e)) => {
                            return Err(format!(
                                "{name} ({what}): ibv_post_send returned {}, expected EINVAL",
                                ibv::errno_str(e)
                            ))
                        }
                        Ok(()) => {
                            return Err(format!("{name} ({what}): ibv_post_send accepted it"))
                        }
                    }
                }
                still_clean()?;
                // The same word written back through ibv_post_send with 8 bytes: allowed, no change.
                post(qp, &[aw(vec![local.sge(64, 8)])], name)?;
                let w = wait_one(cq, name)?;
                check_ok(
                    &w,
                    sys::IBV_WC_ATOMIC_WRITE,
                    Some(8),
                    &format!("{name}: an 8-byte Atomic Write"),
                )?;
                Ok("EINVAL for 4, 16 and 0 bytes; 8 bytes accepted".into())
            }
            "builder-bad-args" => {
                let bad = [
                    (
                        "XIWDV_FLUSH_MR",
                        ExOp::Flush {
                            rkey: plainfile.1,
                            addr: plainfile.0,
                            len: 64,
                            placement: persistent,
                            level: xiwdv::Selectivity::Mr as u8,
                        },
                    ),
                    (
                        "len > u32::MAX",
                        ExOp::Flush {
                            rkey: plainfile.1,
                            addr: plainfile.0,
                            len: u32::MAX as usize + 1,
                            placement: persistent,
                            level: range,
                        },
                    ),
                    (
                        "expected hash of 33 bytes",
                        ExOp::Verify {
                            rkey: hashfile.1,
                            addr: hashfile.0,
                            len: 64,
                            expected: Some(vec![0; 33]),
                        },
                    ),
                ];
                for (what, op) in bad {
                    let sges = if matches!(op, ExOp::Verify { .. }) {
                        vec![local.sge(0, 32)]
                    } else {
                        vec![]
                    };
                    match qp.post_ex(&[ExWr {
                        wr_id: 6,
                        flags: SIG,
                        op,
                        sges,
                    }]) {
                        Err(libc::EINVAL) => {}
                        Err(e) => {
                            return Err(format!(
                                "{name} ({what}): ibv_wr_complete returned {}, expected EINVAL",
                                ibv::errno_str(e)
                            ))
                        }
                        Ok(()) => {
                            return Err(format!("{name} ({what}): ibv_wr_complete accepted it"))
                        }
                    }
                }
                still_clean()?;
                Ok("EINVAL from ibv_wr_complete, nothing posted".into())
            }
            _ => Err(format!("unknown case {name}")),
        }
    }

    pub fn client(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let (mut oob, hello, gid) = greet_server(a, &dev, &[])?;
        let mut passed = Vec::new();
        let mut failed = Vec::new();
        for (name, r) in local_checks(&dev) {
            match r {
                Ok(note) => passed.push(format!("{name} ({note})")),
                Err(e) => failed.push(format!("{name}: {e}")),
            }
        }
        let local = Mr::new(&dev.pd, 4096, LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let ops = (sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
            | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
            | sys::IBV_QP_EX_WITH_ATOMIC_WRITE
            | sys::IBV_QP_EX_WITH_RDMA_WRITE
            | sys::IBV_QP_EX_WITH_RDMA_READ
            | sys::IBV_QP_EX_WITH_SEND
            | sys::IBV_QP_EX_WITH_LOCAL_INV) as u64
            | xiwdv::XIWDV_QP_EX_WITH_FLUSH
            | xiwdv::XIWDV_QP_EX_WITH_VERIFY;
        for name in CASES {
            oob.send("CASE", &[("name", name.to_string())])?;
            let cq = new_cq(&dev, 16)?;
            let qp = ex_qp(&dev, &cq, &cq, 16, 16, ops)?;
            connect(&mut oob, gid, &[&qp])?;
            let r = run_case(name, &qp, &cq, &hello, &local);
            oob.send("END", &[])?;
            let mem = oob.recv("MEM")?;
            let r = r.and_then(|note| match mem.str("ok")? {
                "1" => Ok(note),
                _ => Err(format!(
                    "the responder's memory changed at {}",
                    mem.str("diff").unwrap_or("?")
                )),
            });
            match r {
                Ok(note) => passed.push(format!("{name} ({note})")),
                Err(e) => failed.push(format!("{name}: {e}")),
            }
        }
        oob.send("CASE", &[("name", "end".into())])?;
        if !failed.is_empty() {
            return Err(format!(
                "{} of {} cases failed:\n  - {}\npassed: {}",
                failed.len(),
                failed.len() + passed.len(),
                failed.join("\n  - "),
                passed.join("; ")
            ));
        }
        Ok(format!(
            "{} cases passed: {}",
            passed.len(),
            passed.join("; ")
        ))
    }
}

// ---- refuse -------------------------------------------------------------------

mod refuse {
    use super::*;

    /// Runs with XIW_EXTENSIONS=0 (set by the caller): a plain RFC 5040 RNIC.
    pub fn server(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let env = std::env::var("XIW_EXTENSIONS").unwrap_or_default();
        if env != "0" {
            return Err(format!(
                "the refuse server must run with XIW_EXTENSIONS=0 (it is {env:?})"
            ));
        }
        if dev.attr.atomic_cap != sys::IBV_ATOMIC_NONE {
            return Err(format!(
                "ibv_query_device: atomic_cap {} with the extensions off, expected IBV_ATOMIC_NONE",
                dev.attr.atomic_cap
            ));
        }
        let caps = match dev.ctx.xiwdv_query_device() {
            Ok(x) if x.caps & xiwdv::XIWDV_CAP_ATOMICS != 0 => {
                return Err(format!(
                    "xiwdv_query_device reports caps {:#x} with the extensions off",
                    x.caps
                ))
            }
            Ok(x) => format!("{:#x}", x.caps),
            Err(e) => e.to_string(),
        };
        // A device without atomics may refuse REMOTE_ATOMIC; the FetchAdd needs
        // some target either way.
        let (mr, access) = match Mr::new(&dev.pd, 4096, REMOTE_ALL | LOCAL) {
            Ok(mr) => (mr, "with REMOTE_ATOMIC"),
            Err(_) => (
                Mr::new(
                    &dev.pd,
                    4096,
                    sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_REMOTE_WRITE | LOCAL,
                )
                .map_err(|e| format!("ibv_reg_mr: {e}"))?,
                "without REMOTE_ATOMIC (refused)",
            ),
        };
        write_u64(&mr, 0, 1000);
        let mut peers = greet_clients(
            a,
            &dev,
            &[
                ("rkey", mr.rkey().to_string()),
                ("addr", format!("{:x}", mr.addr())),
            ],
        )?;
        let p = &mut peers[0];
        let cq = new_cq(&dev, 16)?;
        let qp = plain_qp(&dev, &cq, &cq, 16, 16)?;
        connect(&mut p.oob, p.gid, &[&qp])?;
        p.oob.recv("DONE")?;
        let v = read_u64(&mr, 0);
        if v != 1000 {
            return p
                .oob
                .fail(format!("the refused FetchAdd changed the word to {v}"));
        }
        p.oob.send("VERDICT", &[])?;
        let state = qp.state().map(state_name).unwrap_or("?");
        Ok(format!(
            "extensions off: atomic_cap NONE, xiwdv caps {caps}, MR {access}; the word unchanged, \
             our QP in {state}"
        ))
    }

    pub fn client(a: &Args) -> Res<String> {
        let dev = open_dev(a.dev.as_deref())?;
        let (mut oob, hello, gid) = greet_server(a, &dev, &[])?;
        let rkey: u32 = hello.get("rkey")?;
        let addr = hello.hex("addr")?;
        let cq = new_cq(&dev, 16)?;
        let qp = plain_qp(&dev, &cq, &cq, 16, 16)?;
        connect(&mut oob, gid, &[&qp])?;
        let local = Mr::new(&dev.pd, 64, LOCAL).map_err(|e| format!("ibv_reg_mr: {e}"))?;
        let what = "FetchAdd to a peer without RFC 7306";
        let wr = SendWr {
            wr_id: 1,
            opcode: sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
            flags: SIG,
            sges: vec![local.sge(0, 8)],
            remote_addr: addr,
            rkey,
            compare_add: 1,
            ..Default::default()
        };
        let r = post(&qp, &[wr], what).and_then(|()| {
            let w = wait_one(&cq, what)?;
            check_status(&w, sys::IBV_WC_REM_INV_REQ_ERR, what)?;
            expect_state(&qp, sys::IBV_QPS_ERR, what)
        });
        if let Err(e) = r {
            return oob.fail(e);
        }
        oob.send("DONE", &[])?;
        oob.recv("VERDICT")?;
        Ok(format!(
            "{what}: {}, QP in ERR",
            status_name(sys::IBV_WC_REM_INV_REQ_ERR)
        ))
    }
}
