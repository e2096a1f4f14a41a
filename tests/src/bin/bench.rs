//! `xiw-bench`: xiw against the floor of plain TCP on the same loopback path.
//!
//! One run measures, two processes each:
//! - xiw through unmodified perftest: ib_write_lat 2 B and 4 KB, ib_read_lat
//!   2 B and 8 B (t_typical), ib_write_bw 64 KB and 1 MB, ib_send_bw 1 MB (BW
//!   average);
//! - RFC 7306 atomics through perftest: ib_atomic_lat FETCH_AND_ADD and
//!   CMP_AND_SWAP (round trip), ib_atomic_bw FETCH_AND_ADD (MsgRate and BW
//!   average), beside the 8 B read round trip and the TCP round trip;
//! - the floor, a TCP program of its own (re-executing itself as
//!   `floor-server` / `floor-client`): ping-pong one-way latency, busy-polling
//!   and blocking, and stream bandwidth;
//! - the ratios against the targets (latency <= 1.5x floor, bandwidth >= 0.7x
//!   stream);
//! - resident memory per connected QP (`qpmem-server` / `qpmem-client`);
//! - a durable log append (`durable-server` / `durable-client`) into a
//!   flush-persistent file mapping: RDMA Write + Flush + Atomic Write (with
//!   and without a Flush of the tail) against Write + Read back + Write,
//!   records/s and latency per record, 1 and 16 records in flight.
//!
//! It prints Markdown tables and exits 0, or 1 when something could not be
//! measured. It is a benchmark, not a test: it asserts nothing.
//!
//! `--sweep` measures instead every size from 2 B to 8 MiB (perftest's `-a`)
//! and the TCP floor at the same sizes, writes the numbers as JSON
//! (tests/src/bench/sweep.rs has the schema) and draws latency and bandwidth
//! against message size (SVG and PNG); `--plot` draws the same pictures from
//! such a JSON file (the guest benchmark's too), and `--from-bench` turns the
//! guest benchmark's BENCH lines into one; `--bars` draws the one-boot guest
//! benchmark's file as grouped bars, a group per test, a bar per device.
//!
//! Needs root, the installed provider (pkg/install.sh) and perftest; it makes
//! its own device tree (`--root`, default /run/xiw/bench) and removes it after,
//! and a log file in `--log-dir` (default /var/tmp), which it removes too.

#[path = "../bench/atomic.rs"]
mod atomic;
#[path = "../bench/bars.rs"]
mod bars;
#[path = "../bench/durable.rs"]
mod durable;
#[path = "../bench/floor.rs"]
mod floor;
#[path = "../bench/inplace.rs"]
mod inplace;
#[path = "../bench/instr.rs"]
mod instr;
#[path = "../bench/perftest.rs"]
mod perftest;
#[path = "../bench/plot.rs"]
mod plot;
#[path = "../bench/qpmem.rs"]
mod qpmem;
#[path = "../bench/reactor.rs"]
mod reactor;
#[path = "../bench/sweep.rs"]
mod sweep;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use xiw_tests::harness::{self, Device};

use floor::{Mode, Spec};
use perftest::Column;

const USAGE: &str = "\
usage: xiw-bench [--quick] [--spin-us N] [--crc] [--repeat N] [--qps N] [--root DIR]
                 [--log-dir DIR]
       xiw-bench --instr [--root DIR]
       xiw-bench --inplace [--quick] [--repeat N] [--root DIR]
       xiw-bench --reactor
       xiw-bench --sweep [--quick] [--out DIR] [--prefix NAME] [--spin-us N] [--crc]
                 [--root DIR]
       xiw-bench --plot JSON [--out DIR] [--prefix NAME]
       xiw-bench --bars JSON [--out DIR] [--prefix NAME]
       xiw-bench --from-bench LINES --json FILE [--title TEXT] [--tool TEXT]

  --quick       one round of a fifth of the iterations and 0.3 s per log
                append case (~25 s instead of 4-5 min; noisier)
  --spin-us N   XIW_SPIN_US=N for the xiw processes (progress-thread busy-poll
                budget after activity; default: inherited, else the provider's 0)
  --crc         XIW_CRC=1 for the xiw processes (MPA CRC; the default is none)
  --repeat N    rounds: every measurement N times, round-robin, report the
                median and range (default 3, with --quick 1)
  --qps N       QPs for the memory measurement (default 1000)
  --root DIR    device tree to make and remove (default /run/xiw/bench)
  --log-dir DIR where the durable log append keeps its 64 MiB file (default
                /var/tmp; a real file system: tmpfs cannot be flushed to)
  --instr       only the instructions per 2-byte message on each side of
                ib_send_bw and ib_write_bw, counted by callgrind (valgrind)
  --inplace     only large transfers with payloads copied through the
                staging buffers (XIW_INPLACE_MIN=0) and placed and sent in
                place (the default), with and without CRC: bandwidth and CPU
                seconds per GiB on each side
  --reactor     only the wake round trip of a waiting thread with raw epoll
                and with the polling crate (the reactor choice)
  --sweep       only every message size from 2 B to 8 MiB, powers of two:
                ib_write_lat, ib_send_lat, ib_read_lat and ib_write_bw with -a
                and the TCP floor (ping-pong busy-poll, stream) at the same
                sizes; writes DIR/sweep.json and draws DIR/NAME-latency.svg and
                DIR/NAME-bandwidth.svg, a .png beside each (DIR default ., NAME
                default host). Iterations per size: latency 500, bandwidth
                1000 (with --quick 100 and 200); 2-4 min (--quick about 1)
  --plot JSON   only draw the pictures of a sweep's JSON file (into DIR,
                default the file's folder; NAME default: the file's name less
                -sweep.json, or host for sweep.json)
  --bars JSON   only draw a JSON file of one value per test and device (the
                one-boot guest benchmark's, tests/vm/bench.sh --out) as
                grouped bars, DIR/NAME-latency.svg and DIR/NAME-bandwidth.svg
                and a .png beside each (DIR default: the file's folder; NAME
                default: the file's name less .json)
  --from-bench LINES
                only turn the BENCH lines of tests/vm/guest/bench.sh (in the
                file LINES, other lines ignored) into a sweep's JSON file,
                --json FILE, titled TEXT, its tool TEXT (default
                tests/vm/bench.sh --sweep)

Other XIW_* variables in the environment reach the xiw processes unchanged.";

/// Longest any one pair may run (a hang is killed and reported).
const PAIR_TIMEOUT: Duration = Duration::from_secs(120);

struct Opts {
    quick: bool,
    instr: bool,
    inplace: bool,
    reactor: bool,
    sweep: bool,
    plot: Option<PathBuf>,
    bars: Option<PathBuf>,
    from_bench: Option<PathBuf>,
    json: Option<PathBuf>,
    title: Option<String>,
    tool: Option<String>,
    out: Option<PathBuf>,
    prefix: Option<String>,
    spin_us: Option<u64>,
    crc: bool,
    repeat: usize,
    qps: usize,
    root: PathBuf,
    log_dir: PathBuf,
}

fn parse_opts(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        quick: false,
        instr: false,
        inplace: false,
        reactor: false,
        sweep: false,
        plot: None,
        bars: None,
        from_bench: None,
        json: None,
        title: None,
        tool: None,
        out: None,
        prefix: None,
        spin_us: None,
        crc: false,
        repeat: 0,
        qps: 1000,
        root: PathBuf::from("/run/xiw/bench"),
        log_dir: PathBuf::from("/var/tmp"),
    };
    let mut it = args.iter();
    let mut repeat = None;
    while let Some(a) = it.next() {
        let mut val = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{s}: {e}"));
        match a.as_str() {
            "--quick" => o.quick = true,
            "--instr" => o.instr = true,
            "--inplace" => o.inplace = true,
            "--reactor" => o.reactor = true,
            "--sweep" => o.sweep = true,
            "--plot" => o.plot = Some(PathBuf::from(val(a)?)),
            "--bars" => o.bars = Some(PathBuf::from(val(a)?)),
            "--from-bench" => o.from_bench = Some(PathBuf::from(val(a)?)),
            "--json" => o.json = Some(PathBuf::from(val(a)?)),
            "--title" => o.title = Some(val(a)?),
            "--tool" => o.tool = Some(val(a)?),
            "--out" => o.out = Some(PathBuf::from(val(a)?)),
            "--prefix" => o.prefix = Some(val(a)?),
            "--crc" => o.crc = true,
            "--spin-us" => o.spin_us = Some(num(val(a)?)?),
            "--repeat" => repeat = Some(num(val(a)?)?.max(1) as usize),
            "--qps" => o.qps = num(val(a)?)?.max(2) as usize,
            "--root" => o.root = PathBuf::from(val(a)?),
            "--log-dir" => o.log_dir = PathBuf::from(val(a)?),
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    o.repeat = repeat.unwrap_or(if o.quick { 1 } else { 3 });
    Ok(o)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// The median of `repeat` values and their range, if any run gave one.
#[derive(Clone, Copy, Default)]
struct Value {
    mid: Option<f64>,
    min: f64,
    max: f64,
    runs: usize,
}

impl Value {
    fn of(v: Vec<f64>) -> Value {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let runs = v.len();
        Value {
            mid: median(v),
            min,
            max,
            runs,
        }
    }

    fn show(&self, decimals: usize) -> String {
        match self.mid {
            None => "n/a".into(),
            Some(m) if self.runs > 1 => {
                format!(
                    "{m:.decimals$} ({:.decimals$}-{:.decimals$})",
                    self.min, self.max
                )
            }
            Some(m) => format!("{m:.decimals$}"),
        }
    }
}

/// A Markdown table, padded so that it also reads aligned as plain text.
struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(head: &[&str]) -> Table {
        Table {
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn print(&self) {
        let n = self.head.len();
        let w: Vec<usize> = (0..n)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                    .chain([self.head[i].chars().count(), 3])
                    .max()
                    .unwrap_or(3)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, wi) in w.iter().enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                let pad = wi - c.chars().count();
                if i == 0 {
                    s.push_str(&format!(" {c}{} |", " ".repeat(pad)));
                } else {
                    s.push_str(&format!(" {}{c} |", " ".repeat(pad)));
                }
            }
            s
        };
        println!("{}", line(&self.head));
        let mut sep = String::from("|");
        for (i, wi) in w.iter().enumerate() {
            if i == 0 {
                sep.push_str(&format!("{}|", "-".repeat(wi + 2)));
            } else {
                sep.push_str(&format!("{}:|", "-".repeat(wi + 1)));
            }
        }
        println!("{sep}");
        for r in &self.rows {
            println!("{}", line(r));
        }
        println!();
    }
}

struct Bench {
    o: Opts,
    dev: Device,
    exe: PathBuf,
    env: Vec<(String, String)>,
    notes: Vec<String>,
    /// Every value measured, by name (one per repetition).
    acc: BTreeMap<String, Vec<f64>>,
}

/// The result of a floor client, `key=value` pairs after `RESULT`.
fn result_field(out: &str, key: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.starts_with("RESULT "))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

impl Bench {
    fn self_cmd(&self, args: &[String]) -> Command {
        let mut c = self.dev.cmd(self.exe.to_str().expect("exe path"));
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.args(args);
        c
    }

    fn record(&mut self, key: String, v: Option<f64>) {
        let e = self.acc.entry(key).or_default();
        e.extend(v);
    }

    /// The values recorded under `key`.
    fn val(&self, key: &str) -> Value {
        Value::of(self.acc.get(key).cloned().unwrap_or_default())
    }

    /// Keys that are expected but have no value at all.
    fn missing(&self) -> Vec<&str> {
        self.acc
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// One perftest pair; records `key.typ` and `key.p99` (latency) or `key.bw`.
    fn perftest(&mut self, key: &str, tool: &'static str, size: usize, iters: usize) {
        const LAT: &[Column] = &[Column::Typical, Column::P99];
        const BW: &[Column] = &[Column::BwAverage];
        let lat = tool.ends_with("_lat");
        let columns = if lat { LAT } else { BW };
        let r = perftest::Run {
            tool,
            size,
            iters,
            columns,
        };
        let out = perftest::run(&self.dev, &self.env, harness::port(), &r);
        eprintln!("  {tool} -s {size} -n {iters}: {:?}", out.values);
        let names: &[&str] = if lat { &["typ", "p99"] } else { &["bw"] };
        for (n, v) in names.iter().zip(out.values) {
            self.record(format!("{key}.{n}"), v);
        }
        if let Some(n) = out.note {
            self.notes.push(n);
        }
    }

    /// Runs a floor pair; returns the client's RESULT line.
    fn floor_once(&mut self, spec: Spec) -> Option<String> {
        let p = harness::port();
        let mut sa = vec!["floor-server".to_string(), p.to_string()];
        sa.extend(spec.to_args());
        let mut ca = vec![
            "floor-client".to_string(),
            "127.0.0.1".into(),
            p.to_string(),
        ];
        ca.extend(spec.to_args());
        let pair = harness::run_pair(
            self.self_cmd(&sa),
            None,
            p,
            self.self_cmd(&ca),
            PAIR_TIMEOUT,
        );
        let out = pair.client_out();
        if !pair.ok() || !out.contains("RESULT ") {
            self.notes.push(format!(
                "TCP floor {} {} B failed:\n{}",
                spec.mode.name(),
                spec.size,
                pair.dump()
            ));
            return None;
        }
        Some(out)
    }

    /// Floor ping-pong; records `key.typ`, `key.p99` (one-way) and `key.rtt`.
    fn floor_lat(&mut self, key: &str, mode: Mode, size: usize, iters: usize) {
        let spec = Spec {
            mode,
            size,
            iters,
            warmup: iters / 10,
        };
        let out = self.floor_once(spec).unwrap_or_default();
        eprintln!("  TCP {} {size} B: {}", mode.name(), out.trim());
        for (n, k) in [
            ("typ", "typical_us"),
            ("p99", "p99_us"),
            ("rtt", "rtt_typical_us"),
        ] {
            self.record(format!("{key}.{n}"), result_field(&out, k));
        }
    }

    /// Floor stream; records `key.bw`.
    fn floor_bw(&mut self, key: &str, size: usize, iters: usize) {
        let spec = Spec {
            mode: Mode::Bw,
            size,
            iters,
            warmup: 0,
        };
        let out = self.floor_once(spec).unwrap_or_default();
        eprintln!("  TCP stream {size} B: {}", out.trim());
        self.record(format!("{key}.bw"), result_field(&out, "bw_mibs"));
    }

    /// (server, client) RESULT lines of a qpmem pair with `n` QPs.
    fn qpmem(&mut self, n: usize) -> Option<(String, String)> {
        let p = harness::port();
        let sa = vec!["qpmem-server".to_string(), p.to_string(), n.to_string()];
        let ca = vec![
            "qpmem-client".to_string(),
            "127.0.0.1".into(),
            p.to_string(),
            n.to_string(),
        ];
        let pair = harness::run_pair(
            self.self_cmd(&sa),
            None,
            p,
            self.self_cmd(&ca),
            PAIR_TIMEOUT,
        );
        let (so, co) = (pair.server_out(), pair.client_out());
        eprintln!("  {n} QPs: server {} / client {}", so.trim(), co.trim());
        if !pair.ok() || !so.contains("RESULT ") || !co.contains("RESULT ") {
            self.notes
                .push(format!("memory pair with {n} QPs failed:\n{}", pair.dump()));
            return None;
        }
        Some((so, co))
    }

    /// One atomic perftest pair; records `key.typ` and `key.p99` (latency),
    /// or `key.bw` and `key.mops`.
    fn atomic(&mut self, key: &str, r: atomic::Run) {
        let out = atomic::run(&self.dev, &self.env, harness::port(), &r);
        eprintln!("  {}: {:?}", r.describe(), out.values);
        let names: &[&str] = if r.bw {
            &["bw", "mops"]
        } else {
            &["typ", "p99"]
        };
        for (n, v) in names.iter().zip(out.values) {
            self.record(format!("{key}.{n}"), v);
        }
        if let Some(n) = out.note {
            self.notes.push(n);
        }
    }

    /// One durable-log pair, every case for `budget`; records `KEY.rate`,
    /// `KEY.p50` and `KEY.p99` per case (see durable::Case::key).
    fn durable(&mut self, budget: Duration) {
        let p = harness::port();
        let dir = self.o.log_dir.to_string_lossy().into_owned();
        let sa = vec!["durable-server".to_string(), p.to_string(), dir];
        let ca = vec![
            "durable-client".to_string(),
            "127.0.0.1".into(),
            p.to_string(),
            budget.as_millis().to_string(),
        ];
        let n = durable::cases().len() as u32;
        let timeout = budget * 2 * n + Duration::from_secs(60);
        let pair = harness::run_pair(self.self_cmd(&sa), None, p, self.self_cmd(&ca), timeout);
        let results = durable::parse(&pair.client_out());
        for c in durable::cases() {
            let key = c.key();
            let r = results.iter().find(|r| r.key == key);
            let st = r.and_then(|r| r.stats.as_ref().ok());
            match st {
                Some(st) => eprintln!(
                    "  {key}: {} records, {:.0}/s, median {:.1} us, p99 {:.1} us",
                    st.records, st.rate, st.p50_us, st.p99_us
                ),
                None => eprintln!("  {key}: n/a"),
            }
            self.record(format!("{key}.rate"), st.map(|s| s.rate));
            self.record(format!("{key}.p50"), st.map(|s| s.p50_us));
            self.record(format!("{key}.p99"), st.map(|s| s.p99_us));
            if let Some(Err(why)) = r.map(|r| &r.stats) {
                self.notes.push(format!("durable log append {key}: {why}"));
            }
        }
        if !pair.ok() {
            self.notes
                .push(format!("durable log append pair failed:\n{}", pair.dump()));
        }
    }
}

fn machine() -> (String, String, String) {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split(':')
                .nth(1)
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    (format!("{nproc}"), kernel, cpu)
}

/// A counter of the TcpExt section of /proc/net/netstat.
fn tcp_ext(name: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = s.lines().filter(|l| l.starts_with("TcpExt:"));
    let (head, vals) = (lines.next()?, lines.next()?);
    let i = head.split_whitespace().position(|k| k == name)?;
    vals.split_whitespace().nth(i)?.parse().ok()
}

/// The installed provider library and its modification time, to tell
/// whether it was replaced while the benchmark ran.
const PROVIDER_SO: &str = "/usr/lib/x86_64-linux-gnu/libibverbs/libxiw-rdmav34.so";

fn provider_stamp() -> Option<std::time::SystemTime> {
    std::fs::metadata(PROVIDER_SO)
        .and_then(|m| m.modified())
        .ok()
}

fn stamp_str(t: Option<std::time::SystemTime>) -> String {
    t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or("missing".into(), |d| {
            let out = Command::new("date")
                .args(["-u", "-d", &format!("@{}", d.as_secs()), "+%F %T UTC"])
                .output();
            out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_else(|_| d.as_secs().to_string())
        })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The file system `dir` lives on: source and type, as findmnt says.
fn mount_of(dir: &std::path::Path) -> String {
    Command::new("findmnt")
        .args(["-n", "-o", "SOURCE,FSTYPE", "-T"])
        .arg(dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            let s = String::from_utf8_lossy(&o.stdout);
            s.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .unwrap_or_else(|| "file system unknown".into())
}

fn pkg_version(pkg: &str) -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", pkg])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|| "?".into())
}

fn ratio(a: &Value, b: &Value) -> Option<f64> {
    match (a.mid, b.mid) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    }
}

fn ratio_row(name: &str, r: Option<f64>, target: &str, ok: impl Fn(f64) -> bool) -> Vec<String> {
    vec![
        name.into(),
        r.map_or("n/a".into(), |r| format!("{r:.2}x")),
        if target.is_empty() {
            "-".into()
        } else {
            target.into()
        },
        match r {
            _ if target.is_empty() => "-".into(),
            None => "n/a".into(),
            Some(r) if ok(r) => "yes".into(),
            Some(_) => "no".into(),
        },
    ]
}

fn bench(o: Opts) -> ExitCode {
    let started = Instant::now();
    let (lat_n, bw64_n, bw1m_n) = if o.quick {
        (2000, 4000, 400)
    } else {
        (10_000, 20_000, 2000)
    };
    // Atomics are 8 B: as many as the 64 KB writes' count five times over take well under a second.
    let atomic_bw_n = 5 * bw64_n;
    let durable_budget = Duration::from_millis(if o.quick { 300 } else { 2000 });
    let exe = std::env::current_exe().expect("current_exe");

    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(s) = o.spin_us {
        env.push(("XIW_SPIN_US".into(), s.to_string()));
    }
    if o.crc {
        env.push(("XIW_CRC".into(), "1".into()));
    }
    // The knobs the xiw processes see: ours, else inherited, else the provider's default.
    let knob = |k: &str, default: &str| -> String {
        if let Some((_, v)) = env.iter().find(|(n, _)| n == k) {
            format!("{k}={v}")
        } else if let Ok(v) = std::env::var(k) {
            format!("{k}={v} (inherited)")
        } else {
            format!("{k}={default} (default)")
        }
    };
    let mut knobs = vec![
        knob("XIW_SPIN_US", "0"),
        knob("XIW_CRC", "0"),
        knob("XIW_MULPDU", "65400"),
        knob("XIW_PROGRESS_RT", "0"),
    ];
    for (k, v) in std::env::vars() {
        if k.starts_with("XIW_")
            && !["XIW_SPIN_US", "XIW_CRC", "XIW_MULPDU", "XIW_PROGRESS_RT"].contains(&k.as_str())
        {
            knobs.push(format!("{k}={v} (inherited)"));
        }
    }

    let (nproc, kernel, cpu) = machine();
    let load0 = loadavg();
    let so0 = provider_stamp();
    eprintln!(
        "xiw-bench: bringing up xiw0 on lo under {}",
        o.root.display()
    );
    let dev = harness::device_at(&o.root, "lo", "127.0.0.1");
    let mut b = Bench {
        o,
        dev,
        exe,
        env,
        notes: Vec::new(),
        acc: BTreeMap::new(),
    };

    // Round-robin: with --repeat, every round measures everything once, so
    // xiw and its floor see the same (noisy) machine.
    for round in 1..=b.o.repeat {
        eprintln!("round {round}/{}: latency ...", b.o.repeat);
        b.floor_lat("tcp2.spin", Mode::LatSpin, 2, lat_n);
        b.floor_lat("tcp2.block", Mode::LatBlock, 2, lat_n);
        b.perftest("write_lat2", "ib_write_lat", 2, lat_n);
        b.floor_lat("tcp4k.spin", Mode::LatSpin, 4096, lat_n);
        b.floor_lat("tcp4k.block", Mode::LatBlock, 4096, lat_n);
        b.perftest("write_lat4k", "ib_write_lat", 4096, lat_n);
        b.perftest("read_lat2", "ib_read_lat", 2, lat_n);
        eprintln!("round {round}/{}: atomics ...", b.o.repeat);
        b.perftest("read_lat8", "ib_read_lat", atomic::SIZE, lat_n);
        for (key, op) in [
            ("atomic_faa", atomic::Op::FetchAdd),
            ("atomic_cas", atomic::Op::CmpSwap),
        ] {
            let iters = lat_n;
            b.atomic(
                key,
                atomic::Run {
                    bw: false,
                    op,
                    iters,
                },
            );
        }
        let (op, iters) = (atomic::Op::FetchAdd, atomic_bw_n);
        b.atomic(
            "atomic_faa_bw",
            atomic::Run {
                bw: true,
                op,
                iters,
            },
        );
        eprintln!("round {round}/{}: bandwidth ...", b.o.repeat);
        b.floor_bw("tcp64k", 65536, bw64_n);
        b.perftest("write_bw64k", "ib_write_bw", 65536, bw64_n);
        b.floor_bw("tcp1m", 1 << 20, bw1m_n);
        b.perftest("write_bw1m", "ib_write_bw", 1 << 20, bw1m_n);
        b.perftest("send_bw1m", "ib_send_bw", 1 << 20, bw1m_n);
        eprintln!(
            "round {round}/{}: durable log append, {} cases of {:.1} s ...",
            b.o.repeat,
            durable::cases().len(),
            durable_budget.as_secs_f64() * 1.1
        );
        b.durable(durable_budget);
    }
    let qps = b.o.qps;
    eprintln!("memory: 1 and {qps} QPs ...");
    let one = b.qpmem(1);
    let ovf0 = tcp_ext("ListenOverflows");
    let many = b.qpmem(qps);
    let ovf = tcp_ext("ListenOverflows")
        .zip(ovf0)
        .map(|(a, b)| a.saturating_sub(b));
    harness::device_down(&b.o.root);
    let load1 = loadavg();
    let so1 = provider_stamp();

    let v = |k: &str| b.val(k);
    let (tcp2_spin, tcp2_block, tcp4k_spin, tcp4k_block) = (
        v("tcp2.spin.typ"),
        v("tcp2.block.typ"),
        v("tcp4k.spin.typ"),
        v("tcp4k.block.typ"),
    );
    let (wl2, wl4k, rl2) = (
        v("write_lat2.typ"),
        v("write_lat4k.typ"),
        v("read_lat2.typ"),
    );
    let (tcp64k, tcp1m) = (v("tcp64k.bw"), v("tcp1m.bw"));
    let (wb64k, wb1m, sb1m) = (v("write_bw64k.bw"), v("write_bw1m.bw"), v("send_bw1m.bw"));

    // ---- report ----
    let o = &b.o;
    println!("## xiw-bench: xiw vs. plain TCP, loopback, two processes each\n");
    println!("- machine: {nproc} CPUs ({cpu}), Linux {kernel}");
    println!("- load average (1/5/15 min): {load0} at start, {load1} at end");
    println!(
        "- rdma-core {}, perftest {}",
        pkg_version("libibverbs1"),
        pkg_version("perftest")
    );
    println!("- provider: {PROVIDER_SO}, built {}", stamp_str(so0));
    if so1 != so0 {
        println!(
            "- WARNING: the provider was reinstalled during the run ({}); numbers may mix builds",
            stamp_str(so1)
        );
    }
    println!("- xiw knobs: {}", knobs.join(", "));
    println!(
        "- iterations: latency {lat_n}, bandwidth 64 KB x {bw64_n} and 1 MB x {bw1m_n}; {} round(s){}",
        o.repeat,
        if o.repeat > 1 { ", median (min-max) of the rounds" } else { "" }
    );
    println!(
        "- atomics: latency {lat_n}, ib_atomic_bw {atomic_bw_n}; durable log append: {:.1} s per case (after {:.2} s of warm-up)",
        durable_budget.as_secs_f64(),
        durable_budget.as_secs_f64() / 10.0
    );
    println!("- elapsed: {:.0} s\n", started.elapsed().as_secs_f64());

    for (title, col, d) in [
        ("Latency, one-way, median [us]", "typ", 2),
        ("Latency, one-way, p99 [us]", "p99", 1),
    ] {
        let mut t = Table::new(&[title, "xiw (perftest)", "TCP busy-poll", "TCP blocking"]);
        let row = |name: &str, xiw: &str, tcp: &str| {
            vec![
                name.to_string(),
                v(&format!("{xiw}.{col}")).show(d),
                v(&format!("{tcp}.spin.{col}")).show(d),
                v(&format!("{tcp}.block.{col}")).show(d),
            ]
        };
        t.row(row("write 2 B", "write_lat2", "tcp2"));
        t.row(row("write 4 KB", "write_lat4k", "tcp4k"));
        if col == "typ" {
            t.row(vec![
                "read 2 B, round trip (a)".into(),
                rl2.show(d),
                v("tcp2.spin.rtt").show(d),
                v("tcp2.block.rtt").show(d),
            ]);
        } else {
            let dash = || "-".to_string();
            t.row(vec![
                "read 2 B, round trip (a)".into(),
                v("read_lat2.p99").show(d),
                dash(),
                dash(),
            ]);
        }
        t.print();
    }

    let mut t = Table::new(&["Bandwidth [MB/s] (b)", "xiw (perftest)", "TCP stream"]);
    t.row(vec!["write 64 KB".into(), wb64k.show(0), tcp64k.show(0)]);
    t.row(vec!["write 1 MB".into(), wb1m.show(0), tcp1m.show(0)]);
    t.row(vec!["send 1 MB (c)".into(), sb1m.show(0), tcp1m.show(0)]);
    t.print();

    let mut t = Table::new(&["Ratio (of medians)", "measured", "target", "met"]);
    t.row(ratio_row(
        "write_lat 2 B / TCP busy-poll 2 B",
        ratio(&wl2, &tcp2_spin),
        "<= 1.5x",
        |r| r <= 1.5,
    ));
    t.row(ratio_row(
        "write_lat 2 B / TCP blocking 2 B",
        ratio(&wl2, &tcp2_block),
        "<= 1.5x",
        |r| r <= 1.5,
    ));
    t.row(ratio_row(
        "write_lat 4 KB / TCP busy-poll 4 KB",
        ratio(&wl4k, &tcp4k_spin),
        "",
        |_| true,
    ));
    t.row(ratio_row(
        "write_lat 4 KB / TCP blocking 4 KB",
        ratio(&wl4k, &tcp4k_block),
        "",
        |_| true,
    ));
    t.row(ratio_row(
        "write_bw 64 KB / TCP stream 64 KB",
        ratio(&wb64k, &tcp64k),
        "",
        |_| true,
    ));
    t.row(ratio_row(
        "write_bw 1 MB / TCP stream 1 MB",
        ratio(&wb1m, &tcp1m),
        ">= 0.7x",
        |r| r >= 0.7,
    ));
    t.print();

    let mut nofile = String::from("?");
    if let (Some((s1, c1)), Some((sn, cn))) = (&one, &many) {
        let f = |out: &str, k: &str| result_field(out, k).unwrap_or(f64::NAN);
        let per = |a: &str, b: &str, k: &str| (f(b, k) - f(a, k)) / (qps as f64 - 1.0);
        nofile = format!("{}", f(sn, "nofile"));
        let mut t = Table::new(&[
            &format!("Memory, 1 vs {qps} connected QPs (d)"),
            "server",
            "client",
        ]);
        let both =
            |name: String, g: &dyn Fn(&str, &str) -> String| vec![name, g(s1, sn), g(c1, cn)];
        t.row(both("VmRSS, 1 QP [KiB]".into(), &|a, _| {
            format!("{}", f(a, "rss_kb"))
        }));
        t.row(both(format!("VmRSS, {qps} QPs [KiB]"), &|_, b| {
            format!("{}", f(b, "rss_kb"))
        }));
        t.row(both("VmRSS per QP, connected [KiB]".into(), &|a, b| {
            format!("{:.1}", per(a, b, "rss_kb"))
        }));
        t.row(both("  of it anonymous [KiB]".into(), &|a, b| {
            format!("{:.1}", per(a, b, "rss_anon_kb"))
        }));
        t.row(both("VmRSS per QP, after traffic [KiB]".into(), &|a, b| {
            format!("{:.1}", per(a, b, "rss2_kb"))
        }));
        t.row(both(
            "VmRSS per QP, 3 s after traffic [KiB]".into(),
            &|a, b| format!("{:.1}", per(a, b, "rss3_kb")),
        ));
        t.row(both("VmSize per QP [KiB]".into(), &|a, b| {
            format!("{:.1}", per(a, b, "vm_kb"))
        }));
        t.row(both("file descriptors per QP".into(), &|a, b| {
            format!("{:.2}", per(a, b, "fds"))
        }));
        t.row(both(format!("threads, 1 / {qps} QPs"), &|a, b| {
            format!("{} / {}", f(a, "threads"), f(b, "threads"))
        }));
        t.row(both(format!("connect {qps} QPs [ms]"), &|_, b| {
            format!("{:.0}", f(b, "connect_ms"))
        }));
        t.row(both(
            format!(
                "{mib} MiB over each of {qps} QPs [ms]",
                mib = qpmem::BUF_BYTES >> 20
            ),
            &|_, b| format!("{:.0}", f(b, "traffic_ms")),
        ));
        t.print();
        let ovf = ovf.map_or("?".into(), |n| n.to_string());
        println!("TCP listen overflows during the {qps}-QP run (host-wide, (d)): {ovf}\n");
    } else {
        println!("Memory per QP: n/a (see the notes)\n");
    }

    let mut t = Table::new(&[
        "Atomics, 8 B, round trip [us] (e)",
        "median",
        "p99",
        "median / read 8 B",
    ]);
    let rl8 = v("read_lat8.typ");
    let dash = || "-".to_string();
    for (name, key) in [
        ("fetch-and-add (ib_atomic_lat)", "atomic_faa"),
        (
            "compare-and-swap (ib_atomic_lat -A CMP_AND_SWAP)",
            "atomic_cas",
        ),
    ] {
        let typ = v(&format!("{key}.typ"));
        t.row(vec![
            name.into(),
            typ.show(2),
            v(&format!("{key}.p99")).show(1),
            ratio(&typ, &rl8).map_or("n/a".into(), |r| format!("{r:.2}x")),
        ]);
    }
    t.row(vec![
        "floor: xiw read 8 B (ib_read_lat)".into(),
        rl8.show(2),
        v("read_lat8.p99").show(1),
        dash(),
    ]);
    for (name, key) in [
        ("busy-poll", "tcp2.spin.rtt"),
        ("blocking", "tcp2.block.rtt"),
    ] {
        t.row(vec![
            format!("floor: TCP ping-pong 2 B, {name} (a)"),
            v(key).show(2),
            dash(),
            dash(),
        ]);
    }
    t.print();

    let mut t = Table::new(&["Atomics, many in flight (e)", "Mops/s", "MB/s"]);
    t.row(vec![
        "fetch-and-add 8 B (ib_atomic_bw)".into(),
        v("atomic_faa_bw.mops").show(3),
        v("atomic_faa_bw.bw").show(2),
    ]);
    t.print();

    for size in durable::SIZES {
        let title = format!("Durable log append, {size} B records (f)");
        let mut t = Table::new(&[&title, "records/s", "median [us]", "p99 [us]"]);
        for c in durable::cases().iter().filter(|c| c.size == size) {
            let k = c.key();
            t.row(vec![
                format!("{} in flight, {}", c.depth, c.way.label()),
                v(&format!("{k}.rate")).show(0),
                v(&format!("{k}.p50")).show(1),
                v(&format!("{k}.p99")).show(1),
            ]);
        }
        t.print();
    }
    println!("What the completion of a record guarantees:");
    println!(
        "- new: the record is durable on the medium before the tail word changes, so before\n  \
         the completion; the tail itself is placed (visible in the file) but not yet durable."
    );
    println!("- new + flush of the tail: the record and then the tail are durable on the medium.");
    println!(
        "- old: the record is placed in the responder's memory (the file's page cache), not\n  \
         durable; the tail write's completion only says it left the requester.\n"
    );

    let warm = lat_n / 10;
    let (mr_kib, cqe) = (qpmem::BUF_BYTES / 1024, qpmem::CQ_DEPTH);
    let (swr, rwr, q1) = (qpmem::SEND_WR, qpmem::RECV_WR, qps - 1);
    print!(
        "\
(a) ib_read_lat's t_typical is a full round trip (perftest halves only write/send latency);
    the TCP columns of that row are the 2 B ping-pong's median round trip.
    TCP latency: {lat_n} ping-pongs after {warm} warm-up, TCP_NODELAY, median round trip / 2;
    busy-poll: both ends spin on non-blocking recv(); blocking: both block in recv().
(b) MB = 2^20 bytes, as perftest counts. TCP stream: one connection, TCP_NODELAY, one
    write() per message, as many messages as perftest posts, reads of up to 1 MiB;
    timed from the first write to the receiver's acknowledgement of the last byte.
(c) ib_send_bw without -R exits 1 at teardown (perftest leaks its iWARP credit MR, so
    ibv_dealloc_pd fails with EBUSY on any provider); its numbers are taken anyway.
(d) an own libibverbs program (xiw-bench qpmem-server/-client), the same in both runs but
    for the QP count: 1 PD, one {mr_kib} KiB MR, one CQ of {cqe} CQEs, RC QPs of {swr} send /
    {rwr} recv WRs. Connected: every QP has completed one signalled 8 B RDMA write each way.
    After traffic: then one {mr_kib} KiB RDMA write each way on every QP. Per QP = (VmRSS with
    {qps} QPs - VmRSS with 1) / {q1}. RLIMIT_NOFILE is raised with setrlimit in those
    processes (to 65536, or to the hard limit when that cannot be raised: {nofile} here), as
    xiw QPs hold sockets. Kernel socket memory (buffers, struct sock) is not in VmRSS and
    not counted. Listen overflows: the TcpExt ListenOverflows counter of /proc/net/netstat
    across the {qps}-QP run; each is a dropped connection request that TCP retries after 1 s.
"
    );
    let (mib, depth) = (durable::FILE_BYTES >> 20, durable::DEPTH);
    let budget = durable_budget.as_secs_f64();
    let log_dir = o.log_dir.display();
    let fs = mount_of(&o.log_dir);
    print!(
        "\
(e) perftest fixes an atomic at 8 B and, as for reads, reports the full round trip: the fair
    floors are the 8 B RDMA read round trip and the TCP ping-pong's median round trip (a).
    ib_atomic_bw: {atomic_bw_n} FetchAdds, 128 in flight; MsgRate [Mpps] is Mops/s, MB/s counts
    the 8 B operands (2^20 bytes).
(f) an own libibverbs program (xiw-bench durable-server/-client). The server maps a {mib} MiB
    file in {log_dir} ({fs}) MAP_SHARED, made with set_len (sparse: the first write to
    a page allocates its blocks, as in a growing log), and registers it with xiwdv_reg_mr,
    IBV_ACCESS_FLUSH_PERSISTENT | REMOTE_WRITE | REMOTE_READ | LOCAL_WRITE; xiw makes a
    persistent Flush durable with msync(MS_SYNC) of the pages under the range. The tail
    word has the first page; records follow and wrap around. One RC QP; every record is one
    ibv_wr_start..ibv_wr_complete batch with only its last work request signalled, and the
    client busy-polls its CQ. Latency: post to that completion; records/s over {budget:.1} s
    per case, after a tenth of that as warm-up; 1 or {depth} records in flight. After each
    case the client reads the tail back and the server checks that it counts every record
    and that 8 sampled records hold what was written; a case that fails shows n/a.
"
    );

    let expected = |n: &String| n.starts_with("ib_send_bw") && !n.contains("stderr");
    let sendbw = b.notes.iter().filter(|n| expected(n)).count();
    if sendbw > 0 {
        println!("\nib_send_bw pairs that exited 1 at teardown (expected, see (c)): {sendbw}");
    }
    let other: Vec<&String> = b.notes.iter().filter(|n| !expected(n)).collect();
    if !other.is_empty() {
        println!("\nNotes:");
        for n in other {
            println!("- {n}");
        }
    }
    let mut missing: Vec<String> = b.missing().iter().map(|s| s.to_string()).collect();
    if one.is_none() || many.is_none() {
        missing.push("memory".into());
    }
    if missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("xiw-bench: could not measure: {}", missing.join(", "));
        ExitCode::FAILURE
    }
}

/// `--reactor`: the wake round trip with each reactor, rounds interleaved.
fn reactor_bench() -> ExitCode {
    use reactor::Reactor;
    const N: usize = 20_000;
    println!(
        "## xiw-bench --reactor: wake round trip of a waiting thread [us], {N} wakes, 3 rounds\n"
    );
    println!("| wakes | raw epoll (xiw), median / p90 | polling crate, median / p90 |");
    println!("|---|--:|--:|");
    for (name, gap) in [("back to back", 0), ("30 us apart (the waiter sleeps)", 30)] {
        let gap = Duration::from_micros(gap);
        let mut cells = [Vec::new(), Vec::new()];
        for _ in 0..3 {
            for (i, r) in [Reactor::Epoll, Reactor::Polling].into_iter().enumerate() {
                let (m, p) = reactor::measure(r, gap, N);
                cells[i].push(format!("{m:.2} / {p:.2}"));
            }
        }
        println!(
            "| {name} | {} | {} |",
            cells[0].join(", "),
            cells[1].join(", ")
        );
    }
    ExitCode::SUCCESS
}

/// `--instr`: user-space instructions per 2-byte message on each side.
fn instr_bench(o: &Opts) -> ExitCode {
    const ITERS: usize = 5_000;
    let dev = harness::device_at(&o.root, "lo", "127.0.0.1");
    let dir = std::env::temp_dir().join(format!("xiw-bench-instr-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mut t = Table::new(&[
        "perftest, 2 B, callgrind",
        "configuration",
        "posting (post_send)",
        "receiving (receive path, + repost for Sends)",
        "both",
    ]);
    // The floor, in the same run: every post through the send queue ring.
    let configs: [(&str, &[(&str, &str)]); 3] = [
        (
            "CRC, through the send queue (XIW_CRC=1 XIW_POST_NOW_MAX=0)",
            &[("XIW_CRC", "1"), ("XIW_POST_NOW_MAX", "0")],
        ),
        ("CRC (XIW_CRC=1)", &[("XIW_CRC", "1")]),
        ("no CRC (default)", &[]),
    ];
    let mut failed = false;
    for tool in ["ib_send_bw", "ib_write_bw"] {
        for (label, env) in configs {
            eprintln!("  {tool} -s 2 -n {ITERS}, {label}, under callgrind ...");
            let env: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            match instr::measure(&dev, &env, tool, ITERS, &dir) {
                Ok(c) => t.row(vec![
                    format!("`{tool} -s 2`"),
                    label.to_string(),
                    format!("{:.0}", c.posting),
                    format!("{:.0}", c.receiving),
                    format!("{:.0}", c.posting + c.receiving),
                ]),
                Err(e) => {
                    eprintln!("xiw-bench: {e}");
                    failed = true;
                }
            }
        }
    }
    harness::device_down(&o.root);
    let _ = std::fs::remove_dir_all(&dir);
    println!("## xiw-bench --instr: user-space instructions per message ({ITERS} messages)\n");
    t.print();
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--inplace`: payloads through the staging buffers against in place.
fn inplace_bench(o: &Opts) -> ExitCode {
    let dev = harness::device_at(&o.root, "lo", "127.0.0.1");
    let exe = std::env::current_exe().expect("own path");
    let exe = exe.to_str().expect("utf-8 path");
    let scale = if o.quick { 5 } else { 1 };
    // (tool, size, iterations, whether the server is the receiving side)
    let cases = [
        ("ib_write_bw", 1 << 20, 3000 / scale, true),
        ("ib_read_bw", 1 << 20, 2000 / scale, false),
        ("ib_write_bw", 64 << 10, 40000 / scale, true),
    ];
    let configs = [(true, false), (true, true), (false, false), (false, true)];
    // Per case and config: bandwidth, receiver and sender CPU (user+sys, user).
    let mut acc: BTreeMap<(usize, usize), Vec<[f64; 5]>> = BTreeMap::new();
    let mut failed = false;
    for round in 0..o.repeat {
        for (ci, &(tool, size, iters, server_receives)) in cases.iter().enumerate() {
            for (ki, &(crc, inplace)) in configs.iter().enumerate() {
                let env = [
                    ("XIW_CRC", if crc { "1" } else { "0" }.to_string()),
                    (
                        "XIW_INPLACE_MIN",
                        if inplace { "8192" } else { "0" }.to_string(),
                    ),
                ];
                match inplace::measure(&dev, exe, &env, tool, size, iters) {
                    Ok(m) => {
                        let (rx, tx) = if server_receives {
                            (m.server, m.client)
                        } else {
                            (m.client, m.server)
                        };
                        eprintln!(
                            "  round {round}: {tool} -s {size} crc={crc} inplace={inplace}: \
                             {:.0} MB/s, receiver {:.2}+{:.2} s/GiB, sender {:.2}+{:.2} s/GiB",
                            m.bw, rx.0, rx.1, tx.0, tx.1
                        );
                        acc.entry((ci, ki)).or_default().push([
                            m.bw,
                            rx.0 + rx.1,
                            rx.0,
                            tx.0 + tx.1,
                            tx.0,
                        ]);
                    }
                    Err(e) => {
                        eprintln!("xiw-bench: {e}");
                        failed = true;
                    }
                }
            }
        }
    }
    harness::device_down(&o.root);
    println!(
        "## xiw-bench --inplace: payloads copied (XIW_INPLACE_MIN=0) or in place (8192), {} round(s), medians\n",
        o.repeat
    );
    println!(
        "CPU: seconds per GiB moved, user+sys (user), of the whole process \
         (its progress thread included; perftest's sender busy-polls its CQ).\n"
    );
    let mut t = Table::new(&[
        "transfer",
        "CRC",
        "payloads",
        "MB/s",
        "receiver CPU",
        "sender CPU",
    ]);
    for (ci, &(tool, size, _, _)) in cases.iter().enumerate() {
        for (ki, &(crc, inplace)) in configs.iter().enumerate() {
            let v = acc.remove(&(ci, ki)).unwrap_or_default();
            let col = |k: usize| Value::of(v.iter().map(|s| s[k]).collect());
            let mid =
                |k: usize, d: usize| col(k).mid.map_or("n/a".to_string(), |m| format!("{m:.d$}"));
            t.row(vec![
                format!("`{tool} -s {size}`"),
                if crc { "on" } else { "off" }.into(),
                if inplace { "in place" } else { "copied" }.into(),
                col(0).show(0),
                format!("{} ({})", mid(1, 2), mid(2, 2)),
                format!("{} ({})", mid(3, 2), mid(4, 2)),
            ]);
        }
    }
    t.print();
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The UTC time now, RFC 3339 (as `date` says it).
fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Writes the JSON and draws the pictures; says on stderr what it wrote.
fn write_sweep(
    s: &sweep::Sweep,
    json: Option<&std::path::Path>,
    dir: &std::path::Path,
    prefix: &str,
) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("xiw-bench: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    if let Some(json) = json {
        if let Err(e) = std::fs::write(json, s.to_json() + "\n") {
            eprintln!("xiw-bench: {}: {e}", json.display());
            return ExitCode::FAILURE;
        }
        eprintln!("xiw-bench: wrote {}", json.display());
    }
    match plot::draw_all(s, dir, prefix) {
        Ok(files) => {
            for f in files {
                eprintln!("xiw-bench: drew {}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xiw-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--sweep`: every size, xiw through perftest -a and the TCP floor.
fn sweep_bench(o: &Opts) -> ExitCode {
    use sweep::Point;
    let started = Instant::now();
    // perftest's -a runs every size with one count: the 8 MiB messages set
    // the time (n x 16 MiB moved per direction over the sweep).
    let (lat_n, bw_n) = if o.quick { (100, 200) } else { (500, 1000) };
    const TIMEOUT: Duration = Duration::from_secs(900);
    let sizes = sweep::perftest_sizes();
    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(s) = o.spin_us {
        env.push(("XIW_SPIN_US".into(), s.to_string()));
    }
    if o.crc {
        env.push(("XIW_CRC".into(), "1".into()));
    }
    let (nproc, kernel, cpu) = machine();
    let load0 = loadavg();
    eprintln!(
        "xiw-bench: bringing up xiw0 on lo under {}",
        o.root.display()
    );
    let dev = harness::device_at(&o.root, "lo", "127.0.0.1");
    // The floor pairs run through Bench as in the default run; of its
    // options only the device tree's root matters here.
    let mut b = Bench {
        o: parse_opts(&[]).expect("defaults"),
        dev,
        exe: std::env::current_exe().expect("current_exe"),
        env,
        notes: Vec::new(),
        acc: BTreeMap::new(),
    };
    b.o.root = o.root.clone();
    let mut series = Vec::new();
    let mut failed = Vec::new();

    // The floor over every size on one connection.
    let floor_sweep = |b: &mut Bench, mode: Mode, iters: usize, warmup: usize, key: &str| {
        let plan: Vec<Spec> = sizes
            .iter()
            .map(|&size| Spec {
                mode,
                size: size as usize,
                iters,
                warmup,
            })
            .collect();
        let p = harness::port();
        let args = floor::plan_to_args(&plan);
        let mut sa = vec!["floor-server".to_string(), p.to_string()];
        sa.extend(args.iter().cloned());
        let mut ca = vec![
            "floor-client".to_string(),
            "127.0.0.1".into(),
            p.to_string(),
        ];
        ca.extend(args);
        let pair = harness::run_pair(b.self_cmd(&sa), None, p, b.self_cmd(&ca), TIMEOUT);
        let out = pair.client_out();
        let points: Vec<Point> = out
            .lines()
            .filter(|l| l.starts_with("RESULT "))
            .filter_map(|l| {
                Some(Point {
                    bytes: result_field(l, "size")? as u64,
                    value: result_field(l, key)?,
                })
            })
            .collect();
        if !pair.ok() {
            b.notes.push(format!(
                "TCP floor {} sweep failed:\n{}",
                mode.name(),
                pair.dump()
            ));
        }
        points
    };

    let mut t0 = Instant::now();
    let mut lap = |what: &str, n: usize| {
        eprintln!("  {what}: {n} sizes in {:.0} s", t0.elapsed().as_secs_f64());
        t0 = Instant::now();
    };
    eprintln!("sweep: TCP ping-pong, busy-poll, {lat_n} round trips per size ...");
    let p = floor_sweep(&mut b, Mode::LatSpin, lat_n, lat_n / 10, "typical_us");
    lap("TCP ping-pong", p.len());
    series.push(sweep::series("tcp", "lat-spin", p));
    for tool in ["ib_write_lat", "ib_send_lat", "ib_read_lat"] {
        eprintln!("sweep: {tool} -a -n {lat_n} ...");
        let r = perftest::run_all(
            &b.dev,
            &b.env,
            harness::port(),
            tool,
            lat_n,
            Column::Typical,
            TIMEOUT,
        );
        lap(tool, r.points.len());
        b.notes.extend(r.note);
        let pts = r
            .points
            .iter()
            .map(|&(bytes, value)| Point { bytes, value })
            .collect();
        series.push(sweep::series("xiw-standalone", tool, pts));
    }
    eprintln!("sweep: TCP stream, {bw_n} messages per size ...");
    let p = floor_sweep(&mut b, Mode::Bw, bw_n, 0, "bw_mibs");
    lap("TCP stream", p.len());
    series.push(sweep::series("tcp", "bw", p));
    eprintln!("sweep: ib_write_bw -a -n {bw_n} ...");
    let r = perftest::run_all(
        &b.dev,
        &b.env,
        harness::port(),
        "ib_write_bw",
        bw_n,
        Column::BwAverage,
        TIMEOUT,
    );
    lap("ib_write_bw", r.points.len());
    b.notes.extend(r.note);
    let pts = r
        .points
        .iter()
        .map(|&(bytes, value)| Point { bytes, value })
        .collect();
    series.push(sweep::series("xiw-standalone", "ib_write_bw", pts));
    harness::device_down(&o.root);

    for s in &mut series {
        s.command = match s.command.as_str() {
            c if c.ends_with("_bw -a") => format!("{c} -n {bw_n} -F, two processes on lo"),
            c if c.ends_with(" -a") => format!("{c} -n {lat_n} -F, two processes on lo"),
            c if c.ends_with(" bw") => {
                format!("{c}: {bw_n} messages per size, one connection, reads of up to 1 MiB")
            }
            c => format!(
                "{c}: {lat_n} round trips per size after {} of warm-up",
                lat_n / 10
            ),
        };
        if s.points.len() < sizes.len() {
            failed.push(format!(
                "{} ({} of {} sizes)",
                s.name,
                s.points.len(),
                sizes.len()
            ));
        }
    }
    let knobs: Vec<String> = b
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .chain(
            std::env::vars()
                .filter(|(k, _)| k.starts_with("XIW_"))
                .map(|(k, v)| format!("{k}={v} (inherited)")),
        )
        .collect();
    let mut notes = vec![
        format!(
            "xiw in standalone mode on lo (xiw up under {}), every program two processes on this host; xiw knobs: {}",
            o.root.display(),
            if knobs.is_empty() { "the provider's defaults".to_string() } else { knobs.join(", ") }
        ),
        "ib_read_lat's t_typical is a full round trip; ib_write_lat's and ib_send_lat's, and the TCP ping-pong's, are half of one".into(),
        format!("elapsed: {:.0} s", started.elapsed().as_secs_f64()),
    ];
    notes.extend(b.notes.iter().cloned());
    let s = sweep::Sweep {
        schema: sweep::SCHEMA.into(),
        tool: format!("xiw-bench --sweep{}", if o.quick { " --quick" } else { "" }),
        title: "xiw standalone beside TCP, loopback".into(),
        machine: sweep::Machine {
            cpus: nproc.parse().unwrap_or(0),
            cpu,
            kernel,
            date: utc_now(),
            xiw_version: env!("CARGO_PKG_VERSION").into(),
            rdma_core: pkg_version("libibverbs1"),
            perftest: pkg_version("perftest"),
            load: format!("{load0} at start, {} at end", loadavg()),
        },
        sizes,
        series,
        notes,
    };
    let dir = o.out.clone().unwrap_or_else(|| PathBuf::from("."));
    let prefix = o.prefix.clone().unwrap_or_else(|| "host".into());
    let rc = write_sweep(&s, Some(&dir.join("sweep.json")), &dir, &prefix);
    for n in &b.notes {
        eprintln!("xiw-bench: {n}");
    }
    if !failed.is_empty() {
        eprintln!(
            "xiw-bench: could not measure every size: {}",
            failed.join(", ")
        );
        return ExitCode::FAILURE;
    }
    rc
}

/// The sweep file `json` (its error said, if it cannot be read), and where
/// its pictures go: `--out`, else beside it.
fn read_sweep(o: &Opts, json: &Path) -> Option<(sweep::Sweep, PathBuf)> {
    let s = match std::fs::read_to_string(json)
        .map_err(|e| e.to_string())
        .and_then(|t| sweep::Sweep::from_json(&t))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xiw-bench: {}: {e}", json.display());
            return None;
        }
    };
    let dir = o.out.clone().unwrap_or_else(|| {
        json.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), |p| p.to_path_buf())
    });
    Some((s, dir))
}

/// `--plot JSON`: the pictures of a sweep file.
fn plot_cmd(o: &Opts) -> ExitCode {
    let json = o.plot.as_deref().expect("--plot");
    let Some((s, dir)) = read_sweep(o, json) else {
        return ExitCode::FAILURE;
    };
    let prefix = o.prefix.clone().unwrap_or_else(|| {
        let stem = json
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned());
        match stem.strip_suffix("-sweep") {
            Some(p) if !p.is_empty() => p.to_string(),
            _ if stem == "sweep" => "host".to_string(),
            _ => stem,
        }
    });
    write_sweep(&s, None, &dir, &prefix)
}

/// `--bars JSON`: the grouped bars of a one-boot run's file.
fn bars_cmd(o: &Opts) -> ExitCode {
    let json = o.bars.as_deref().expect("--bars");
    let Some((s, dir)) = read_sweep(o, json) else {
        return ExitCode::FAILURE;
    };
    let prefix = o.prefix.clone().unwrap_or_else(|| {
        json.file_stem()
            .map_or("bench".into(), |s| s.to_string_lossy().into_owned())
    });
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("xiw-bench: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    match bars::draw_all(&s, &dir, &prefix) {
        Ok(files) => {
            for f in files {
                eprintln!("xiw-bench: drew {}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xiw-bench: {}: {e}", json.display());
            ExitCode::FAILURE
        }
    }
}

/// `--from-bench LINES --json FILE`: the guest's BENCH lines as a sweep file.
fn from_bench_cmd(o: &Opts) -> ExitCode {
    let lines = o.from_bench.as_deref().expect("--from-bench");
    let Some(json) = o.json.as_deref() else {
        eprintln!("xiw-bench: --from-bench needs --json FILE");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(lines) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("xiw-bench: {}: {e}", lines.display());
            return ExitCode::FAILURE;
        }
    };
    let machine = sweep::Machine {
        date: utc_now(),
        xiw_version: env!("CARGO_PKG_VERSION").into(),
        ..sweep::Machine::default()
    };
    let title = o.title.clone().unwrap_or_else(|| "sweep".into());
    let tool = o.tool.as_deref().unwrap_or("tests/vm/bench.sh --sweep");
    let s = sweep::Sweep::from_bench_lines(&text, tool, &title, machine);
    if s.series.is_empty() {
        eprintln!("xiw-bench: {}: no BENCH lines with sizes", lines.display());
        return ExitCode::FAILURE;
    }
    if let Err(e) = std::fs::write(json, s.to_json() + "\n") {
        eprintln!("xiw-bench: {}: {e}", json.display());
        return ExitCode::FAILURE;
    }
    eprintln!("xiw-bench: wrote {}", json.display());
    ExitCode::SUCCESS
}

fn sub(r: std::io::Result<String>) -> ExitCode {
    match r {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xiw-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port_of = |s: &String| s.parse::<u16>().unwrap_or(0);
    let spec = |a: &[String]| {
        floor::plan_from_args(a).unwrap_or_else(|e| {
            eprintln!("xiw-bench: {e}");
            std::process::exit(2)
        })
    };
    match args.first().map(String::as_str) {
        Some("floor-server") if args.len() == 6 => {
            sub(floor::server(port_of(&args[1]), &spec(&args[2..])).map(|()| String::new()))
        }
        Some("floor-client") if args.len() == 7 => sub(floor::client(
            &args[1],
            port_of(&args[2]),
            &spec(&args[3..]),
        )),
        Some("qpmem-server") if args.len() == 3 => {
            let n = args[2].parse().unwrap_or(1);
            sub(qpmem::run("xiw0", port_of(&args[1]), None, n))
        }
        Some("durable-server") if args.len() == 3 => sub(durable::server(
            port_of(&args[1]),
            std::path::Path::new(&args[2]),
        )),
        Some("durable-client") if args.len() == 4 => {
            let ms = args[3].parse().unwrap_or(2000);
            sub(durable::client(
                &args[1],
                port_of(&args[2]),
                Duration::from_millis(ms),
            ))
        }
        Some("cpu-of") if args.len() >= 2 => inplace::cpu_of(&args[1..]),
        Some("qpmem-client") if args.len() == 4 => {
            let n = args[3].parse().unwrap_or(1);
            sub(qpmem::run("xiw0", port_of(&args[2]), Some(&args[1]), n))
        }
        _ => match parse_opts(&args) {
            Ok(o) if o.instr => instr_bench(&o),
            Ok(o) if o.inplace => inplace_bench(&o),
            Ok(o) if o.reactor => reactor_bench(),
            Ok(o) if o.sweep => sweep_bench(&o),
            Ok(o) if o.plot.is_some() => plot_cmd(&o),
            Ok(o) if o.bars.is_some() => bars_cmd(&o),
            Ok(o) if o.from_bench.is_some() => from_bench_cmd(&o),
            Ok(o) => bench(o),
            Err(e) => {
                if !e.is_empty() {
                    eprintln!("xiw-bench: {e}");
                }
                eprintln!("{USAGE}");
                if e.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(2)
                }
            }
        },
    }
}
