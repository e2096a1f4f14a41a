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
}

impl Device {
    /// A command that runs `program` against this device (inside its namespace, if any).
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        };
        c.env("SYSFS_PATH", &self.sysfs);
        c
    }
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
    assert!(out.status.success(), "xiw up failed: {}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout);
    let path = line.trim().strip_prefix("export SYSFS_PATH=").expect("xiw up prints the SYSFS_PATH");
    PathBuf::from(path.trim_matches('\''))
}

/// The shared device on `lo` used by most tests.
pub fn lo_device() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| Device {
        sysfs: xiw_up(Path::new("/run/xiw/tests-lo"), None, "lo"),
        netns: None,
        addr: "127.0.0.1".into(),
    })
}

/// Serialises tests that measure or load the machine (it has two cores).
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// A TCP port for an out-of-band exchange (perftest -p, ibv_rc_pingpong -p), unique per call.
pub fn port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    // Spread test binaries (one process each) over 20000..60000 by pid.
    let base = 20000 + (std::process::id() % 400) as u16 * 100;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 100
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

    /// Everything both printed, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "--- server (status {:?}) stdout:\n{}\n--- server stderr:\n{}\n--- client (status {:?}) stdout:\n{}\n--- client stderr:\n{}",
            self.server.status,
            String::from_utf8_lossy(&self.server.stdout),
            String::from_utf8_lossy(&self.server.stderr),
            self.client.status,
            String::from_utf8_lossy(&self.client.stdout),
            String::from_utf8_lossy(&self.client.stderr),
        )
    }
}

fn spawn(mut c: Command) -> Child {
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
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
    (Output { status, stdout, stderr }, killed)
}

/// Starts `server`, waits until it listens on `port` (in `server_ns`), starts
/// `client`, and collects both. Anything still running at `timeout` is killed,
/// so a hang fails the test instead of stalling it.
pub fn run_pair(server: Command, server_ns: Option<&str>, port: u16, client: Command, timeout: Duration) -> Pair {
    let deadline = Instant::now() + timeout;
    let mut srv = spawn(server);
    while !listening(server_ns, port) {
        if Instant::now() >= deadline || matches!(srv.try_wait(), Ok(Some(_))) {
            let _ = srv.kill();
            let (server, _) = wait_until(srv, Instant::now());
            let client = Output { status: server.status, stdout: Vec::new(), stderr: b"client never started".to_vec() };
            return Pair { server, client, timed_out: true };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let cli = spawn(client);
    let (client, ct) = wait_until(cli, deadline);
    // Give the server a moment to finish after its client; kill it if it does not.
    let (server, st) = wait_until(srv, deadline.max(Instant::now() + Duration::from_secs(5)));
    Pair { server, client, timed_out: ct || st }
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
        let _ = Command::new("ip").args(["netns", "del", &na]).status();
        let _ = Command::new("ip").args(["netns", "del", &nb]).status();
        sh(&format!("ip netns add {na} && ip netns add {nb}"));
        sh(&format!("ip link add {tag}va netns {na} type veth peer name {tag}vb netns {nb}"));
        let (aa, ab) = (format!("10.{net}.0.1"), format!("10.{net}.0.2"));
        sh(&format!("ip -n {na} addr add {aa}/24 dev {tag}va && ip -n {na} link set {tag}va up && ip -n {na} link set lo up"));
        sh(&format!("ip -n {nb} addr add {ab}/24 dev {tag}vb && ip -n {nb} link set {tag}vb up && ip -n {nb} link set lo up"));
        let a = Device {
            sysfs: xiw_up(&PathBuf::from(format!("/run/xiw/tests-{na}")), Some(&na), &format!("{tag}va")),
            netns: Some(na.clone()),
            addr: aa,
        };
        let b = Device {
            sysfs: xiw_up(&PathBuf::from(format!("/run/xiw/tests-{nb}")), Some(&nb), &format!("{tag}vb")),
            netns: Some(nb.clone()),
            addr: ab,
        };
        NetnsPair { a, b, names: [na, nb] }
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for (dev, ns) in [(&self.a, &self.names[0]), (&self.b, &self.names[1])] {
            let _ = Command::new("ip").args(["netns", "exec", ns, "xiw", "down", "--root"]).arg(&dev.sysfs).status();
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
