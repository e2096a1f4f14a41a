//! Brings xiw devices up and runs pairs of real programs against each other.
//!
//! The provider must be installed (`pkg/install.sh`) so that unmodified
//! programs find it the normal way; `xiw` must be on PATH and the caller root.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// A device view made by `xiw up`.
#[derive(Debug, Clone)]
pub struct Device {
    /// `SYSFS_PATH` to give the programs.
    pub sysfs: PathBuf,
    /// Network namespace the device lives in (None: the current one).
    pub netns: Option<String>,
    /// The address of its netdev, as peers reach it.
    pub addr: String,
    /// Programs reach it through `xiw exec --root SYSFS`, as this user
    /// (`Some(None)`: as root), instead of with `SYSFS_PATH` set.
    pub exec: Option<Option<u32>>,
}

impl Device {
    /// A command that runs `program` against this device (inside its namespace, if any).
    pub fn cmd(&self, program: &str) -> Command {
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(ns) = &self.netns {
            argv.extend(["ip", "netns", "exec", ns].map(Into::into));
        }
        if let Some(user) = self.exec {
            if let Some(uid) = user {
                argv.extend(as_user(uid));
            }
            argv.extend(["xiw", "exec", "--root"].map(Into::into));
            argv.push(self.sysfs.clone().into());
            argv.push("--".into());
        }
        argv.push(program.into());
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        if self.exec.is_none() {
            c.env("SYSFS_PATH", &self.sysfs);
        }
        c
    }
}

/// The words that run a command as user (and group) `uid`, without
/// supplementary groups or any privilege.
pub fn as_user(uid: u32) -> Vec<std::ffi::OsString> {
    let id = uid.to_string();
    vec![
        "setpriv".into(),
        format!("--reuid={id}").into(),
        format!("--regid={id}").into(),
        "--clear-groups".into(),
        "--".into(),
    ]
}

fn xiw_up(root: &Path, netns: Option<&str>, netdev: &str) -> PathBuf {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "xiw"]);
            c
        }
        None => Command::new("xiw"),
    };
    let out = c
        .args(["up", "--netdev", netdev, "--root"])
        .arg(root)
        .output()
        .expect("running `xiw up` (is xiw installed? run pkg/install.sh)");
    assert!(
        out.status.success(),
        "xiw up failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let path = line
        .trim()
        .strip_prefix("export SYSFS_PATH=")
        .expect("xiw up prints the SYSFS_PATH");
    PathBuf::from(path.trim_matches('\''))
}

/// The shared device on `lo` used by most tests.
pub fn lo_device() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| Device {
        sysfs: xiw_up(Path::new("/run/xiw/tests-lo"), None, "lo"),
        netns: None,
        addr: "127.0.0.1".into(),
        exec: None,
    })
}

/// Serialises tests that measure or load the machine (it has two cores).
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// The last line of `text` that is not blank: what a failed command said
/// last, for a one-line notice.
pub fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

/// Says `line` where the test command's summary shows it: libtest keeps
/// what a passing test prints to itself, so the line is also appended to
/// the file `$XIW_NOTICES` names (`tests/run-all.sh` sets it and prints the
/// file under its summary). For what passes but needs someone to act.
pub fn notice(line: &str) {
    eprintln!("NOTICE: {line}");
    if let Some(path) = std::env::var_os("XIW_NOTICES") {
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "NOTICE: {line}"));
        if let Err(e) = written {
            panic!("writing the notice to {path:?}: {e}");
        }
    }
}

/// A TCP port for an out-of-band exchange (perftest -p, ibv_rc_pingpong -p),
/// different on every call and free when returned. It lies below the kernel's
/// ephemeral range, where the local end of some connection (xiw's QP streams
/// among them) could already hold it and the tool's listen would fail.
pub fn port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(32768)
        .clamp(12000, 65535);
    let span = low - 10000;
    loop {
        let n = std::process::id().wrapping_mul(7919) + NEXT.fetch_add(1, Ordering::Relaxed) as u32;
        let p = (10000 + n % span) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", p)).is_ok() {
            return p;
        }
    }
}

/// True once something listens on TCP `port` in `netns` (read from /proc/net/tcp{,6}).
pub fn listening(netns: Option<&str>, port: u16) -> bool {
    let read = |file: &str| -> String {
        match netns {
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "cat", file])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default(),
            None => std::fs::read_to_string(file).unwrap_or_default(),
        }
    };
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        read(f).lines().skip(1).any(|l| {
            let mut it = l.split_whitespace();
            let local = it.nth(1).unwrap_or("");
            let state = it.nth(1).unwrap_or("");
            local.ends_with(&want) && state == "0A"
        })
    })
}

/// The outputs of a server/client pair.
#[derive(Debug)]
pub struct Pair {
    pub server: Output,
    pub client: Output,
    pub timed_out: bool,
    /// libibverbs log files of the two sides (server, client), if they were
    /// given one: xiw writes every QP failure and its reason there.
    pub logs: Option<(PathBuf, PathBuf)>,
}

impl Pair {
    pub fn ok(&self) -> bool {
        !self.timed_out && self.server.status.success() && self.client.status.success()
    }

    pub fn server_out(&self) -> String {
        String::from_utf8_lossy(&self.server.stdout).into_owned()
    }

    pub fn client_out(&self) -> String {
        String::from_utf8_lossy(&self.client.stdout).into_owned()
    }

    /// Everything both printed (and logged, see [`Pair::logs`]), for assertion messages.
    pub fn dump(&self) -> String {
        let mut s = format!(
            "--- server (status {:?}) stdout:\n{}\n--- server stderr:\n{}\n--- client (status {:?}) stdout:\n{}\n--- client stderr:\n{}",
            self.server.status,
            String::from_utf8_lossy(&self.server.stdout),
            String::from_utf8_lossy(&self.server.stderr),
            self.client.status,
            String::from_utf8_lossy(&self.client.stdout),
            String::from_utf8_lossy(&self.client.stderr),
        );
        if let Some((sl, cl)) = &self.logs {
            for (side, path) in [("server", sl), ("client", cl)] {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                s.push_str(&format!(
                    "\n--- {side} libibverbs log ({}):\n{text}",
                    path.display()
                ));
            }
        }
        s
    }
}

impl Drop for Pair {
    /// The log files go with the pair: a failure has shown them by then, in [`Pair::dump`].
    fn drop(&mut self) {
        if let Some((sl, cl)) = self.logs.take() {
            let _ = std::fs::remove_file(sl);
            let _ = std::fs::remove_file(cl);
        }
    }
}

/// Where the programs of a pair that uses `port` log (server, client): files
/// made empty now, that both sides may write from inside any namespace.
pub fn log_files(tag: &str, port: u16) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join("xiw-tests-logs");
    let _ = std::fs::create_dir_all(&dir);
    let make = |side: &str| {
        let p = dir.join(format!("{tag}-{port}-{side}.log"));
        let _ = std::fs::write(&p, b"");
        // Programs run as another user (`xiw exec` tests) write them too.
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666));
        p
    };
    (make("server"), make("client"))
}

fn spawn(mut c: Command) -> Child {
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().unwrap_or_else(|e| panic!("spawning {c:?}: {e}"))
}

/// Waits for `child` until `deadline`; kills it after. Returns its output and whether it was killed.
pub fn wait_until(mut child: Child, deadline: Instant) -> (Output, bool) {
    let mut killed = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                killed = true;
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break,
        }
    }
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_end(&mut stdout);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_end(&mut stderr);
    }
    let status = child.wait().expect("wait");
    (
        Output {
            status,
            stdout,
            stderr,
        },
        killed,
    )
}

/// Starts `server`, waits until it listens on `port` (in `server_ns`), starts
/// `client`, and collects both. Anything still running at `timeout` is killed,
/// so a hang fails the test instead of stalling it.
pub fn run_pair(
    server: Command,
    server_ns: Option<&str>,
    port: u16,
    client: Command,
    timeout: Duration,
) -> Pair {
    run_pair_with(server, server_ns, port, client, timeout, None)
}

/// Two hosts: network namespaces joined by a veth pair, each with an xiw device.
pub struct NetnsPair {
    pub a: Device,
    pub b: Device,
    names: [String; 2],
}

impl NetnsPair {
    /// Creates namespaces `<tag>a`/`<tag>b` with 10.<net>.0.1/2 on a veth pair.
    pub fn new(tag: &str, net: u8) -> NetnsPair {
        let (na, nb) = (format!("{tag}a"), format!("{tag}b"));
        let sh = |args: &str| {
            let st = Command::new("sh").arg("-c").arg(args).status().expect("sh");
            assert!(st.success(), "failed: {args}");
        };
        // Leftovers of an interrupted run, if any (quietly: usually there are none).
        for ns in [&na, &nb] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
        sh(&format!("ip netns add {na} && ip netns add {nb}"));
        sh(&format!(
            "ip link add {tag}va netns {na} type veth peer name {tag}vb netns {nb}"
        ));
        let (aa, ab) = (format!("10.{net}.0.1"), format!("10.{net}.0.2"));
        sh(&format!("ip -n {na} addr add {aa}/24 dev {tag}va && ip -n {na} link set {tag}va up && ip -n {na} link set lo up"));
        sh(&format!("ip -n {nb} addr add {ab}/24 dev {tag}vb && ip -n {nb} link set {tag}vb up && ip -n {nb} link set lo up"));
        let a = Device {
            sysfs: xiw_up(
                &PathBuf::from(format!("/run/xiw/tests-{na}")),
                Some(&na),
                &format!("{tag}va"),
            ),
            netns: Some(na.clone()),
            addr: aa,
            exec: None,
        };
        let b = Device {
            sysfs: xiw_up(
                &PathBuf::from(format!("/run/xiw/tests-{nb}")),
                Some(&nb),
                &format!("{tag}vb"),
            ),
            netns: Some(nb.clone()),
            addr: ab,
            exec: None,
        };
        NetnsPair {
            a,
            b,
            names: [na, nb],
        }
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for (dev, ns) in [(&self.a, &self.names[0]), (&self.b, &self.names[1])] {
            let _ = Command::new("ip")
                .args(["netns", "exec", ns, "xiw", "down", "--root"])
                .arg(&dev.sysfs)
                .status();
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// A device on `netdev` (current namespace) in a tree of the caller's own at
/// `root`, reached at `addr`: for programs that must not share (and so must
/// not replace) the tree of [`lo_device`]. `xiw up` replaces an earlier tree at
/// the same `root`.
pub fn device_at(root: &Path, netdev: &str, addr: &str) -> Device {
    Device {
        sysfs: xiw_up(root, None, netdev),
        netns: None,
        addr: addr.into(),
        exec: None,
    }
}

/// Removes the tree at `root` made by [`device_at`] (errors ignored).
pub fn device_down(root: &Path) {
    let _ = Command::new("xiw")
        .args(["down", "--root"])
        .arg(root)
        .stdout(Stdio::null())
        .status();
}

// ---- Tool pairs: ibv_*_pingpong and perftest --------------------------------

/// Runs `tool` as a server on `server` and as a client on `client` that
/// connects to `server.addr`, via [`run_pair_quick`] (10 s grace for the
/// server of a failed client). Both get `-d xiw0 -p PORT` (a fresh [`port`]),
/// `-g 0` for the `ibv_*_pingpong` tools (iWARP has no GID-less mode), then
/// `args`.
pub fn run_tool_pair(
    tool: &str,
    server: &Device,
    client: &Device,
    args: &[&str],
    timeout: Duration,
) -> Pair {
    run_tool_pair_env(tool, server, client, args, &[], timeout)
}

/// [`run_tool_pair`] with environment variables (xiw's knobs) for both sides.
pub fn run_tool_pair_env(
    tool: &str,
    server: &Device,
    client: &Device,
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Pair {
    let port = port();
    let (server_log, client_log) = log_files(tool, port);
    let build = |dev: &Device, peer: Option<&str>, log: &Path| {
        // Line-buffered stdout (stdbuf execs the tool, same pid): a tool killed
        // at the time-out still shows how far it got.
        let mut c = dev.cmd("stdbuf");
        // libibverbs' own log, where xiw reports why a QP failed, kept off
        // stderr (which the checks expect clean).
        c.env("VERBS_LOG_LEVEL", "4").env("VERBS_LOG_FILE", log);
        c.envs(env.iter().copied());
        c.args(["-oL", tool, "-d", "xiw0", "-p", &port.to_string()]);
        if tool.starts_with("ibv_") {
            c.args(["-g", "0"]);
        }
        c.args(args);
        if let Some(addr) = peer {
            c.arg(addr);
        }
        c
    };
    let mut pair = run_pair_quick(
        build(server, None, &server_log),
        server.netns.as_deref(),
        port,
        build(client, Some(&server.addr), &client_log),
        timeout,
        Duration::from_secs(10),
    );
    pair.logs = Some((server_log, client_log));
    pair
}

/// [`run_pair`], except that a server whose client failed gets only `grace`
/// more to finish (then it is killed) instead of the rest of `timeout`: a
/// client that dies at start-up, before it connects, then costs seconds
/// instead of the whole time-out.
pub fn run_pair_quick(
    server: Command,
    server_ns: Option<&str>,
    port: u16,
    client: Command,
    timeout: Duration,
    grace: Duration,
) -> Pair {
    run_pair_with(server, server_ns, port, client, timeout, Some(grace))
}

/// Both: with `grace`, a server whose client failed gets only that long more.
fn run_pair_with(
    server: Command,
    server_ns: Option<&str>,
    port: u16,
    client: Command,
    timeout: Duration,
    grace: Option<Duration>,
) -> Pair {
    let deadline = Instant::now() + timeout;
    let mut srv = spawn(server);
    while !listening(server_ns, port) {
        if Instant::now() >= deadline || matches!(srv.try_wait(), Ok(Some(_))) {
            let _ = srv.kill();
            let (server, _) = wait_until(srv, Instant::now());
            let client = Output {
                status: server.status,
                stdout: Vec::new(),
                stderr: b"client never started".to_vec(),
            };
            return Pair {
                server,
                client,
                timed_out: true,
                logs: None,
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let cli = spawn(client);
    let (client, ct) = wait_until(cli, deadline);
    // Give the server a moment to finish after its client; kill it if it does not.
    let server_deadline = match grace {
        Some(g) if !client.status.success() => Instant::now() + g,
        _ => deadline.max(Instant::now() + Duration::from_secs(5)),
    };
    let (server, st) = wait_until(srv, server_deadline);
    Pair {
        server,
        client,
        timed_out: ct || st,
        logs: None,
    }
}

/// Waits until libibverbs reports `dev`'s port ACTIVE: a veth link gets its
/// carrier asynchronously, a moment after `ip link set up`, and perftest
/// refuses a port that is down. Panics after `timeout`.
pub fn wait_port_active(dev: &Device, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let out = dev
            .cmd("ibv_devinfo")
            .args(["-d", "xiw0"])
            .output()
            .expect("running ibv_devinfo");
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("PORT_ACTIVE") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the port of {:?} is not active after {timeout:?}:\n{text}",
            dev.sysfs
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks a successful `ibv_{rc,srq}_pingpong` pair of `iters` exchanges of
/// `size` bytes: both exit 0, print nothing on stderr, and report
/// `<2*size*iters> bytes in ...` and `<iters> iters in ... usec/iter` with a
/// positive time per iteration; the server saw no invalid data (`-c`).
pub fn check_pingpong(pair: &Pair, size: u64, iters: u64) -> Result<(), String> {
    if pair.timed_out {
        return Err("timed out (killed)".into());
    }
    let bytes = format!("{} bytes in ", 2 * size * iters);
    let iters_in = format!("{iters} iters in ");
    for (side, out) in [("server", &pair.server), ("client", &pair.client)] {
        if !out.status.success() {
            return Err(format!("{side} exited with {:?}", out.status));
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !stderr.trim().is_empty() {
            return Err(format!("{side} wrote to stderr: {stderr}"));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("invalid data") {
            return Err(format!("{side} reported invalid data"));
        }
        if !text.lines().any(|l| l.starts_with(&bytes)) {
            return Err(format!("{side} did not print `{bytes}...`"));
        }
        let line = text
            .lines()
            .find(|l| l.starts_with(&iters_in))
            .ok_or_else(|| format!("{side} did not print `{iters_in}...`"))?;
        // "200 iters in 0.03 seconds = 161.83 usec/iter"
        let usec = line
            .split_whitespace()
            .nth(6)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("{side}: cannot parse `{line}`"))?;
        if !usec.is_finite() || usec <= 0.0 || !line.ends_with("usec/iter") {
            return Err(format!("{side}: bad iteration line `{line}`"));
        }
    }
    Ok(())
}

/// The message sizes `perftest -a` runs: 2 B to 8 MiB, powers of two (23).
pub fn perftest_all_sizes() -> Vec<u64> {
    (1..=23).map(|k| 1u64 << k).collect()
}

/// The result rows of a perftest report: lines that start with a space and a
/// digit, as numbers.
pub fn perftest_rows(text: &str) -> Result<Vec<Vec<f64>>, String> {
    text.lines()
        .filter(|l| l.starts_with(' ') && l[1..].starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            l.split_whitespace()
                .map(|v| {
                    v.parse::<f64>()
                        .map_err(|_| format!("unparsable row `{l}`"))
                })
                .collect()
        })
        .collect()
}

/// Benign stderr lines of perftest: it does not know xiw's vendor id, so the
/// read tests turn inline data off (they would not use it anyway).
const PERFTEST_BENIGN: &[&str] =
    &["Device not recognized to implement inline feature. Disabling it"];

/// Checks one perftest table: rows for exactly `sizes` (in order), each with
/// `iters` in the #iterations column and positive numbers elsewhere, except
/// the columns in `may_be_zero`.
///
/// Bandwidth rows (`bw`: bytes, iterations, BW peak, BW average [MiB/s],
/// MsgRate [Mpps]) print two decimals of MiB/s, so a slow run of tiny
/// messages shows a BW average of 0.00: there the message rate must be
/// positive and the average must agree with it (up to rounding) instead.
fn check_rows(
    text: &str,
    sizes: &[u64],
    iters: u64,
    may_be_zero: &[usize],
    bw: bool,
) -> Result<(), String> {
    let rows = perftest_rows(text)?;
    let got: Vec<u64> = rows.iter().map(|r| r[0] as u64).collect();
    if got != sizes {
        return Err(format!("rows for sizes {got:?}, expected {sizes:?}"));
    }
    for r in &rows {
        if r.len() < 5 || r[1] as u64 != iters {
            return Err(format!(
                "row {r:?}: expected {iters} iterations and >= 5 columns"
            ));
        }
        for (i, v) in r.iter().enumerate() {
            // perftest derives t_stdev (latency column 6) as the square root of a
            // difference of large sums, which rounding can make NaN; it measures
            // nothing of its own.
            if !bw && i == 6 && v.is_nan() {
                continue;
            }
            let zero_ok = may_be_zero.contains(&i) || bw && i == 3;
            if !(*v > 0.0 || zero_ok && *v == 0.0) {
                return Err(format!("row {r:?}: column {i} is not positive"));
            }
        }
        if bw {
            // MiB/s from the message rate; MsgRate has 6 decimals (of Mpps).
            let mib = r[0] / (1u64 << 20) as f64;
            let (avg, expect) = (r[3], r[4] * 1e6 * mib);
            let slack = 0.01 + 0.5 * mib + expect * 1e-3;
            if (avg - expect).abs() > slack {
                return Err(format!(
                    "row {r:?}: BW average {avg} disagrees with MsgRate ({expect:.3} MiB/s)"
                ));
            }
        }
    }
    Ok(())
}

/// Checks a perftest pair run with message `sizes` (all of
/// [`perftest_all_sizes`] for `-a`) and `iters` in the #iterations column
/// (`-n` times the number of QPs for the bandwidth tests).
///
/// The client must print a row per size. Servers differ: the latency tests
/// of write and send print every row, `ib_read_lat`'s server prints none, and
/// the servers of `ib_write_bw`/`ib_read_bw` print only the last size;
/// `ib_send_bw`'s server prints every row with 0.00 in "BW peak" (it does
/// not measure it). stderr may hold only [`PERFTEST_BENIGN`] lines.
///
/// KNOWN perftest bug, not xiw's: over iWARP without `-R`, `ib_send_bw`
/// registers a credit MR that it never deregisters, so its teardown fails on
/// any provider (the kernel answers EBUSY too): it prints
/// "Failed to deallocate PD - <strerror(errno)>" and
/// "Couldn't destroy all SEND resources" and exits 1. For `ib_send_bw` exactly
/// that (on either side) is accepted after a complete table; nothing else.
pub fn check_perftest(tool: &str, pair: &Pair, sizes: &[u64], iters: u64) -> Result<(), String> {
    if pair.timed_out {
        return Err("timed out (killed)".into());
    }
    let lat = tool.ends_with("_lat");
    // Latency rows: t_stdev (column 6) may be 0 for a perfectly steady size.
    let stdev: &[usize] = if lat { &[6] } else { &[] };
    let server_sizes: &[u64] = match tool {
        "ib_write_lat" | "ib_send_lat" | "ib_send_bw" => sizes,
        "ib_read_lat" => &[],
        _ => &sizes[sizes.len() - 1..],
    };
    let server_zero: &[usize] = if tool == "ib_send_bw" { &[2] } else { stdev };
    for (side, out, want, zero) in [
        ("client", &pair.client, sizes, stdev),
        ("server", &pair.server, server_sizes, server_zero),
    ] {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let errs: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty() && !PERFTEST_BENIGN.contains(l))
            .collect();
        let teardown_bug = tool == "ib_send_bw"
            && out.status.code() == Some(1)
            && errs.len() == 2
            && errs[0].starts_with("Failed to deallocate PD - ")
            && errs[1] == "Couldn't destroy all SEND resources";
        if !(out.status.success() && errs.is_empty() || teardown_bug) {
            return Err(format!(
                "{side} failed ({:?}); stderr: {errs:?}",
                out.status
            ));
        }
        for bad in ["Couldn't", "Failed", "rror", "Unable", "failed"] {
            if let Some(l) = stdout.lines().find(|l| l.contains(bad)) {
                return Err(format!("{side} printed `{l}`"));
            }
        }
        check_rows(&stdout, want, iters, zero, !lat).map_err(|e| format!("{side}: {e}"))?;
    }
    Ok(())
}

/// Huge pages reserved while it lives (`vm.nr_hugepages`), as a deployment
/// that registers huge-page memory would have them; the reservation before
/// comes back when it is dropped. Panics if the kernel will not reserve them.
pub struct HugePages {
    before: Option<String>,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

impl HugePages {
    pub fn reserve(n: u64) -> HugePages {
        let before = std::fs::read_to_string(NR_HUGEPAGES).expect(NR_HUGEPAGES);
        let had: u64 = before.trim().parse().unwrap_or(0);
        if had >= n {
            return HugePages { before: None };
        }
        let _ = std::fs::write(NR_HUGEPAGES, n.to_string());
        let now: u64 = std::fs::read_to_string(NR_HUGEPAGES)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let guard = HugePages {
            before: Some(before),
        };
        assert!(now >= n, "only {now} of {n} huge pages could be reserved");
        guard
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        if let Some(b) = &self.before {
            let _ = std::fs::write(NR_HUGEPAGES, b.trim());
        }
    }
}
