//! Durable log append: RDMA Flush and Atomic Write
//! (draft-talpey-rdma-commit-01) against the classic read-after-write.
//!
//! A pair of processes (`durable-server`, `durable-client`). The server maps
//! a file of [`FILE_BYTES`] (MAP_SHARED, on a real file system), registers it
//! flush-persistent, and otherwise only answers the client's checks: its
//! progress thread does the work. The log is a commit word (the tail: the
//! number of records, 8 bytes little-endian at offset 0, alone on the first
//! page) and records of `size` bytes from the second page on, wrapping around
//! at the end of the file.
//!
//! The client appends records over one RC QP, every record one
//! `ibv_wr_start` .. `ibv_wr_complete` batch with only its last work request
//! signalled:
//! - [`Way::New`]: RDMA Write of the record, RDMA Flush (persistent) of its
//!   range, Atomic Write of the tail. The responder places the Atomic Write
//!   only after the Flush has finished (section 4 of the draft), and answers
//!   it, so the completion means: record durable, then tail visible;
//! - [`Way::NewTailFlush`]: the same and a Flush of the tail: both durable;
//! - [`Way::Old`]: RDMA Write of the record, RDMA Read of it back into a
//!   local buffer, RDMA Write of the tail fenced behind the Read
//!   (IBV_SEND_FENCE). The Read's response proves the record was placed in the
//!   responder's memory, that is the file's page cache, and nothing more.
//!
//! Each case runs for a time budget (a tenth more as warm-up, not measured)
//! with 1 or [`DEPTH`] records in flight. The client then reads the tail back
//! (an RDMA Read returns only after every earlier write is placed) and asks
//! the server to check it: the tail equals the number of records and sampled
//! records hold what the client wrote. A case that fails a check reports no
//! numbers. The client prints one `RESULT case=...` line per case.

use std::fs::OpenOptions;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xiw_tests::check::{self, hex};
use xiw_tests::ibv::{self, sys, Context, Cq, ExOp, ExWr, Mapping, Mr, Qp, Reg};

/// The size of the server's log file.
pub const FILE_BYTES: usize = 64 << 20;
/// Offset of the first record: the tail word has the first page to itself.
const HEADER: usize = 4096;
/// Record sizes, in the order the cases run.
pub const SIZES: [usize; 2] = [64, 4096];
/// Records in flight in the pipelined cases.
pub const DEPTH: usize = 16;
/// Outstanding RDMA Read / Atomic / Flush requests per QP, both directions.
const RD_ATOMIC: u8 = 64;
/// A case that sees no completion for this long has hung.
const STALL: Duration = Duration::from_secs(10);
/// Records one case appends at most, whatever the budget.
const MAX_RECORDS: u64 = 2_000_000;

/// How a record is appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Write, Flush (record), Atomic Write (tail).
    New,
    /// Write, Flush (record), Atomic Write (tail), Flush (tail).
    NewTailFlush,
    /// Write, Read back, fenced Write (tail).
    Old,
}

impl Way {
    pub const ALL: [Way; 3] = [Way::New, Way::NewTailFlush, Way::Old];

    pub fn name(self) -> &'static str {
        match self {
            Way::New => "new",
            Way::NewTailFlush => "new-tf",
            Way::Old => "old",
        }
    }

    /// The work requests of one record, as a table row names them.
    pub fn label(self) -> &'static str {
        match self {
            Way::New => "new: write + flush + atomic write",
            Way::NewTailFlush => "new: write + flush + atomic write + flush",
            Way::Old => "old: write + read back + write (fenced)",
        }
    }

    /// The opcode of the one signalled completion of a record.
    fn last_opcode(self) -> u32 {
        match self {
            Way::New => sys::IBV_WC_ATOMIC_WRITE,
            Way::NewTailFlush => xiwdv::XIWDV_WC_FLUSH,
            Way::Old => sys::IBV_WC_RDMA_WRITE,
        }
    }
}

/// One measurement: a way, a record size and the records in flight.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub way: Way,
    pub size: usize,
    pub depth: usize,
}

impl Case {
    /// The name results are recorded under.
    pub fn key(&self) -> String {
        format!("durable.{}.q{}.{}", self.size, self.depth, self.way.name())
    }
}

/// Every case, in the order the client runs them: the three ways side by side.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for size in SIZES {
        for depth in [1, DEPTH] {
            for way in Way::ALL {
                v.push(Case { way, size, depth });
            }
        }
    }
    v
}

/// The numbers of one case.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub records: u64,
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// What the client printed for one case: its numbers, or why there are none.
pub struct CaseResult {
    pub key: String,
    pub stats: Result<Stats, String>,
}

/// The `RESULT case=...` lines of the client's output.
pub fn parse(out: &str) -> Vec<CaseResult> {
    out.lines()
        .filter_map(|l| l.strip_prefix("RESULT case="))
        .map(|l| {
            let (key, rest) = l.split_once(' ').unwrap_or((l, ""));
            let stats = match rest.strip_prefix("ok=0 why=") {
                Some(why) => Err(why.to_string()),
                None => {
                    let f = |k: &str| -> Option<f64> {
                        rest.split_whitespace()
                            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                            .and_then(|v| v.parse().ok())
                    };
                    match (f("records"), f("rate"), f("p50_us"), f("p99_us")) {
                        (Some(n), Some(rate), Some(p50_us), Some(p99_us)) => Ok(Stats {
                            records: n as u64,
                            rate,
                            p50_us,
                            p99_us,
                        }),
                        _ => Err(format!("unreadable result: {rest}")),
                    }
                }
            };
            CaseResult {
                key: key.to_string(),
                stats,
            }
        })
        .collect()
}

// ---- what both sides share ------------------------------------------------------

/// The record the client writes as number `i` of the case tagged `tag`:
/// `i` and `tag` (little-endian), then a byte that depends on both.
fn header(i: u64, tag: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&i.to_le_bytes());
    h[8..].copy_from_slice(&tag.to_le_bytes());
    h
}

fn fill_byte(i: u64, tag: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ tag).to_le_bytes()[7]
}

/// Where record `i` lives in the log (an offset into the file).
fn record_offset(i: u64, size: usize) -> usize {
    let slots = ((FILE_BYTES - HEADER) / size) as u64;
    HEADER + (i % slots) as usize * size
}

/// A line-based control connection (text, one message a line).
struct Ctl {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Ctl {
    fn new(s: TcpStream) -> io::Result<Ctl> {
        s.set_nodelay(true)?;
        Ok(Ctl {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn send(&mut self, line: &str) -> io::Result<()> {
        self.w.write_all(format!("{line}\n").as_bytes())
    }

    fn recv(&mut self) -> io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the control connection",
            ));
        }
        Ok(l.trim_end().to_string())
    }
}

/// `key=value` of a control line.
fn field<T: std::str::FromStr>(line: &str, key: &str) -> io::Result<T> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no {key}= in {line:?}")))
}

/// A GID in hex, as the out-of-band messages carry it.
fn unhex16(s: &str) -> io::Result<[u8; 16]> {
    check::unhex16(s).map_err(io::Error::other)
}

/// The device, a PD, a CQ and an RC QP in INIT that can build every
/// operation used here.
struct Endpoint {
    ctx: Context,
    pd: ibv::Pd,
    cq: Cq,
    qp: Qp,
}

fn endpoint(send_wr: u32) -> io::Result<Endpoint> {
    let ctx = Context::open(Some("xiw0"))?;
    if !ctx.is_xiw() {
        return Err(io::Error::other("xiw0 is not an xiw device"));
    }
    let caps = ctx
        .xiwdv_query_device()
        .map_err(|e| io::Error::other(format!("xiwdv_query_device: {e}")))?;
    if !caps.has(xiwdv::XIWDV_CAP_FLUSH_PERSISTENT | xiwdv::XIWDV_CAP_ATOMIC_WRITE) {
        return Err(io::Error::other(
            "the device has no Flush to persistence or no Atomic Write",
        ));
    }
    let pd = ctx.alloc_pd()?;
    let cq = Cq::new(&ctx, 2 * send_wr as i32)?;
    let cap = ibv::ibv_qp_cap {
        max_send_wr: send_wr,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ops = (sys::IBV_QP_EX_WITH_RDMA_WRITE
        | sys::IBV_QP_EX_WITH_RDMA_READ
        | sys::IBV_QP_EX_WITH_ATOMIC_WRITE) as u64
        | xiwdv::XIWDV_QP_EX_WITH_FLUSH;
    let qp = Qp::new_ex(&ctx, &pd, &cq, &cq, cap, false, ops)?;
    qp.to_init(
        sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_REMOTE_ATOMIC,
    )
    .map_err(io::Error::other)?;
    Ok(Endpoint { ctx, pd, cq, qp })
}

/// INIT -> RTR (which starts the connection) -> RTS.
fn connect(qp: &Qp, peer_gid: [u8; 16], peer_qpn: u32) -> io::Result<()> {
    qp.to_rts(peer_gid, peer_qpn, RD_ATOMIC)
        .map_err(io::Error::other)
}

// ---- server ---------------------------------------------------------------------

/// Removes the log file when the server ends, however it ends.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Checks the log after a case: the tail says `records`, and sampled records
/// (the last one, the oldest still in the file, a few between) are the ones
/// the client wrote. Then clears the tail for the next case.
fn check_log(log: &Mr, tag: u64, size: usize, records: u64) -> Result<(), String> {
    let tail = u64::from_le_bytes(log.read(0, 8).try_into().expect("8 bytes"));
    if records == 0 {
        return Err("no records appended".into());
    }
    if tail != records {
        return Err(format!("tail word is {tail}, {records} records appended"));
    }
    let slots = ((FILE_BYTES - HEADER) / size) as u64;
    let oldest = records.saturating_sub(slots);
    let span = records - oldest;
    let mut picks = vec![records - 1, oldest];
    picks.extend((1..=6u64).map(|k| oldest + span * k / 7));
    for i in picks {
        let off = record_offset(i, size);
        let got = log.read(off, size);
        let fill = fill_byte(i, tag);
        if got[..16] != header(i, tag) || got[16..].iter().any(|&b| b != fill) {
            return Err(format!(
                "record {i} (of {records}, at offset {off}) is not what was written"
            ));
        }
    }
    log.write(0, &[0u8; 8]);
    Ok(())
}

/// The server: maps and registers the log in `dir`, listens on `port`,
/// answers checks until the client is done.
pub fn server(port: u16, dir: &Path) -> io::Result<String> {
    let path = dir.join(format!("xiw-bench-durable-{}.log", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?;
    let _removed = Removed(path.clone());
    file.set_len(FILE_BYTES as u64)?;
    let mem = Mapping::file(&file, FILE_BYTES)?;
    drop(file);

    let ep = endpoint(16)?;
    let access = sys::IBV_ACCESS_LOCAL_WRITE
        | sys::IBV_ACCESS_REMOTE_WRITE
        | sys::IBV_ACCESS_REMOTE_READ
        | xiwdv::IBV_ACCESS_FLUSH_PERSISTENT;
    let log = Mr::register(&ep.pd, mem, access, Reg::Xiwdv(None)).map_err(|e| {
        io::Error::other(format!(
            "xiwdv_reg_mr of {} (MAP_SHARED, flush-persistent): {e}",
            path.display()
        ))
    })?;

    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
    let mut ctl = Ctl::new(l.accept()?.0)?;
    let gid = ep.ctx.query_gid(1, 0)?;
    ctl.send(&format!(
        "hello gid={} qpn={} addr={} rkey={} len={}",
        hex(&gid),
        ep.qp.qpn(),
        log.addr(),
        log.rkey(),
        log.len()
    ))?;
    let hello = ctl.recv()?;
    let peer_gid = unhex16(&field::<String>(&hello, "gid")?)?;
    connect(&ep.qp, peer_gid, field(&hello, "qpn")?)?;

    let mut checked = 0;
    loop {
        let line = ctl.recv()?;
        if line == "done" {
            ctl.send("bye")?;
            break;
        }
        let (tag, size, records) = (
            field(&line, "tag")?,
            field(&line, "size")?,
            field(&line, "records")?,
        );
        match check_log(&log, tag, size, records) {
            Ok(()) => ctl.send("ok")?,
            Err(why) => ctl.send(&format!("bad {why}"))?,
        }
        checked += 1;
    }
    Ok(format!("RESULT checked={checked} file={}", path.display()))
}

// ---- client ---------------------------------------------------------------------

/// The client's local buffers, in one MR: a slot per record in flight for
/// the record, for its read-back (old way) and for its tail value (old way),
/// and 8 bytes for the final read of the tail.
struct Local {
    mr: Mr,
}

impl Local {
    const REC: usize = 0;
    const BACK: usize = DEPTH * 4096;
    const TAILS: usize = 2 * DEPTH * 4096;
    const FINAL: usize = Self::TAILS + DEPTH * 8;
    const LEN: usize = Self::FINAL + 8;
}

/// The server's log, as the client reaches it.
struct Remote {
    addr: u64,
    rkey: u32,
}

struct Client {
    ep: Endpoint,
    local: Local,
    remote: Remote,
}

impl Client {
    /// The batch that appends record `i` (in slot `slot`) the way `c` says.
    fn batch(&self, c: &Case, i: u64, slot: usize) -> Vec<ExWr> {
        let (rkey, l) = (self.remote.rkey, &self.local.mr);
        let rec = self.remote.addr + record_offset(i, c.size) as u64;
        let tail = self.remote.addr;
        let persistent = xiwdv::Placement::Persistent as u8;
        let range = xiwdv::Selectivity::Range as u8;
        let wr = |op: ExOp, sges: Vec<ibv::ibv_sge>| ExWr {
            wr_id: i,
            flags: 0,
            op,
            sges,
        };
        let mut v = vec![wr(
            ExOp::Write { rkey, addr: rec },
            vec![l.sge(Local::REC + slot * 4096, c.size)],
        )];
        match c.way {
            Way::New | Way::NewTailFlush => {
                v.push(wr(
                    ExOp::Flush {
                        rkey,
                        addr: rec,
                        len: c.size,
                        placement: persistent,
                        level: range,
                    },
                    vec![],
                ));
                let value = (i + 1).to_le_bytes();
                v.push(wr(
                    ExOp::AtomicWrite {
                        rkey,
                        addr: tail,
                        value,
                    },
                    vec![],
                ));
                if c.way == Way::NewTailFlush {
                    v.push(wr(
                        ExOp::Flush {
                            rkey,
                            addr: tail,
                            len: 8,
                            placement: persistent,
                            level: range,
                        },
                        vec![],
                    ));
                }
            }
            Way::Old => {
                v.push(wr(
                    ExOp::Read { rkey, addr: rec },
                    vec![l.sge(Local::BACK + slot * 4096, c.size)],
                ));
                let t = Local::TAILS + slot * 8;
                l.write(t, &(i + 1).to_le_bytes());
                let mut w = wr(ExOp::Write { rkey, addr: tail }, vec![l.sge(t, 8)]);
                w.flags = sys::IBV_SEND_FENCE;
                v.push(w);
            }
        }
        let last = v.len() - 1;
        v[last].flags |= sys::IBV_SEND_SIGNALED;
        v
    }

    /// Waits for completions; returns their wr_ids (successful, of `opcode`).
    fn poll(&self, max: usize, opcode: u32) -> Result<Vec<u64>, String> {
        let wcs = self
            .ep
            .cq
            .poll(max)
            .map_err(|e| format!("poll_cq: {}", ibv::errno_str(-e)))?;
        wcs.iter()
            .map(|w| {
                if w.status != sys::IBV_WC_SUCCESS {
                    Err(format!(
                        "record {} completed with {} (opcode {}, vendor error {:#x})",
                        w.wr_id,
                        ibv::wc_status_str(w.status),
                        w.opcode,
                        w.vendor_err
                    ))
                } else if w.opcode != opcode {
                    Err(format!(
                        "record {} completed as opcode {}, expected {opcode}",
                        w.wr_id, w.opcode
                    ))
                } else {
                    Ok(w.wr_id)
                }
            })
            .collect()
    }

    /// Appends records for a tenth of `budget` (warm-up), then for `budget`
    /// (measured), `c.depth` in flight; returns how many in all and the stats
    /// of the measured ones.
    fn append(&self, c: &Case, tag: u64, budget: Duration) -> Result<Stats, String> {
        let q = c.depth;
        let opcode = c.way.last_opcode();
        let start = Instant::now();
        let warm_end = start + budget / 10;
        let end = warm_end + budget;
        let mut t_post = vec![start; q];
        let mut lat_us: Vec<f64> = Vec::new();
        let (mut posted, mut done) = (0u64, 0u64);
        // (when, records done then): the start of the measured part.
        let mut measured_from: Option<(Instant, u64)> = None;
        let mut last_done = start;
        loop {
            let now = Instant::now();
            if measured_from.is_none() && now >= warm_end {
                measured_from = Some((now, done));
            }
            let posting = now < end && posted < MAX_RECORDS;
            while posting && posted - done < q as u64 {
                let slot = (posted % q as u64) as usize;
                let off = Local::REC + slot * 4096;
                self.local.mr.fill(off, c.size, fill_byte(posted, tag));
                self.local.mr.write(off, &header(posted, tag));
                let wrs = self.batch(c, posted, slot);
                t_post[slot] = Instant::now();
                self.ep
                    .qp
                    .post_ex(&wrs)
                    .map_err(|e| format!("posting record {posted}: {}", ibv::errno_str(e)))?;
                posted += 1;
            }
            if !posting && done == posted {
                break;
            }
            let ids = self.poll(q, opcode)?;
            let now = Instant::now();
            for id in &ids {
                if *id != done {
                    return Err(format!("record {id} completed, expected {done}"));
                }
                let t = t_post[(id % q as u64) as usize];
                if t >= warm_end {
                    lat_us.push((now - t).as_secs_f64() * 1e6);
                }
                done += 1;
            }
            if ids.is_empty() {
                if now - last_done > STALL {
                    return Err(format!(
                        "stalled: {done} of {posted} records completed, none for {STALL:?}"
                    ));
                }
                std::hint::spin_loop();
            } else {
                last_done = now;
            }
        }
        let (t0, d0) = measured_from.ok_or("the warm-up never ended")?;
        let n = done - d0;
        if n == 0 || lat_us.is_empty() {
            return Err("no record completed in the measured time".into());
        }
        lat_us.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| lat_us[((lat_us.len() as f64 * p) as usize).min(lat_us.len() - 1)];
        Ok(Stats {
            records: done,
            rate: n as f64 / (last_done - t0).as_secs_f64(),
            p50_us: pct(0.5),
            p99_us: pct(0.99),
        })
    }

    /// Reads the tail word back; its response comes only after every earlier
    /// write was placed, so the server's check sees them all.
    fn read_tail(&self) -> Result<u64, String> {
        let wr = ExWr {
            wr_id: u64::MAX,
            flags: sys::IBV_SEND_SIGNALED,
            op: ExOp::Read {
                rkey: self.remote.rkey,
                addr: self.remote.addr,
            },
            sges: vec![self.local.mr.sge(Local::FINAL, 8)],
        };
        self.ep
            .qp
            .post_ex(&[wr])
            .map_err(|e| format!("posting the read of the tail: {}", ibv::errno_str(e)))?;
        let t0 = Instant::now();
        while self.poll(1, sys::IBV_WC_RDMA_READ)?.is_empty() {
            if t0.elapsed() > STALL {
                return Err("the read of the tail never completed".into());
            }
            std::hint::spin_loop();
        }
        let b = self.local.mr.read(Local::FINAL, 8);
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

/// The client: connects to the server at `host:port`, runs every case of
/// [`cases`] for `budget` each, prints a `RESULT case=...` line per case.
/// Ends early (with an error) once the QP has failed.
pub fn client(host: &str, port: u16, budget: Duration) -> io::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        match TcpStream::connect((host, port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e),
        }
    };
    let mut ctl = Ctl::new(s)?;
    // Up to DEPTH records of four work requests each, and the read of the tail.
    let ep = endpoint(4 * DEPTH as u32 + 8)?;
    let mr = Mr::new(&ep.pd, Local::LEN, sys::IBV_ACCESS_LOCAL_WRITE)?;
    let hello = ctl.recv()?;
    let gid = ep.ctx.query_gid(1, 0)?;
    ctl.send(&format!("hello gid={} qpn={}", hex(&gid), ep.qp.qpn()))?;
    let peer_gid = unhex16(&field::<String>(&hello, "gid")?)?;
    connect(&ep.qp, peer_gid, field(&hello, "qpn")?)?;
    let len: usize = field(&hello, "len")?;
    if len != FILE_BYTES {
        return Err(io::Error::other(format!(
            "the server's log is {len} bytes, expected {FILE_BYTES}"
        )));
    }
    let cl = Client {
        ep,
        local: Local { mr },
        remote: Remote {
            addr: field(&hello, "addr")?,
            rkey: field(&hello, "rkey")?,
        },
    };

    let nonce = u64::from(std::process::id()) << 32;
    let mut out = io::stdout().lock();
    for (n, c) in cases().iter().enumerate() {
        let tag = nonce | n as u64;
        let r = cl.append(c, tag, budget).and_then(|st| {
            let tail = cl.read_tail()?;
            if tail != st.records {
                return Err(format!(
                    "read back the tail word as {tail}, {} records appended",
                    st.records
                ));
            }
            if c.way == Way::Old {
                // The last read-back holds the last record.
                let i = st.records - 1;
                let slot = (i % c.depth as u64) as usize;
                let back = cl.local.mr.read(Local::BACK + slot * 4096, c.size);
                if back[..16] != header(i, tag) {
                    return Err(format!("record {i} read back differs"));
                }
            }
            Ok(st)
        });
        let st = match r {
            Ok(st) => st,
            Err(why) => {
                // The QP is most likely in the error state: the cases after it cannot run.
                writeln!(out, "RESULT case={} ok=0 why={why}", c.key())?;
                return Err(io::Error::other(format!("{}: {why}", c.key())));
            }
        };
        ctl.send(&format!(
            "check tag={tag} size={} records={}",
            c.size, st.records
        ))?;
        let reply = ctl.recv()?;
        if let Some(why) = reply.strip_prefix("bad ") {
            writeln!(out, "RESULT case={} ok=0 why=server check: {why}", c.key())?;
            continue;
        }
        writeln!(
            out,
            "RESULT case={} ok=1 records={} rate={:.1} p50_us={:.2} p99_us={:.2}",
            c.key(),
            st.records,
            st.rate,
            st.p50_us,
            st.p99_us
        )?;
        out.flush()?;
    }
    ctl.send("done")?;
    let _ = ctl.recv();
    Ok(String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_results() {
        let out = "RESULT case=durable.64.q1.new ok=1 records=1200 rate=612.5 p50_us=1600.25 p99_us=2900.00\nRESULT case=durable.64.q1.old ok=0 why=server check: tail word is 0, 5 records appended\n";
        let r = parse(out);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].key, "durable.64.q1.new");
        let st = r[0].stats.as_ref().unwrap();
        assert_eq!((st.records, st.rate, st.p99_us), (1200, 612.5, 2900.0));
        assert_eq!(
            r[1].stats.as_ref().err().map(String::as_str),
            Some("server check: tail word is 0, 5 records appended")
        );
    }

    #[test]
    fn records_wrap_inside_the_file() {
        for size in SIZES {
            let slots = ((FILE_BYTES - HEADER) / size) as u64;
            assert_eq!(record_offset(0, size), HEADER);
            assert_eq!(record_offset(slots, size), HEADER);
            assert!(record_offset(slots - 1, size) + size <= FILE_BYTES);
        }
    }
}
