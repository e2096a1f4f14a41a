//! Many application threads on one process's xiw objects, as MPI with
//! THREAD_MULTIPLE, SPDK or libfabric use them: `tests/c/xiw_threads.c`, a C
//! program on the real libibverbs, run on the shared `lo` device.
//!
//! - `qpex`: several threads build and post batches on one extended QP
//!   (`ibv_wr_start` .. `ibv_wr_complete` is a per-QP critical section).
//! - `churn`: threads create, connect and destroy QP pairs beside steady
//!   traffic; QP numbers are reused at once on both sides, so a connection
//!   must belong to one QP, not to a number.
//! - `tests/c/xiw_events.c`: async events against destroy (a destroy waits for
//!   the acknowledgement of every event the application read; unread events of
//!   a destroyed QP are never delivered).
//! - `tests/c/xiw_domains.c`: parent and thread domains (`ibv_alloc_td`,
//!   `ibv_alloc_parent_domain`): a QP, MR and CQ in a parent domain talking
//!   to a QP of the plain PD, and what the verbs refuse.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! gcc -O2 -pthread -o xiw_threads tests/c/xiw_threads.c -libverbs
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! ./xiw_threads qpex 4 20000
//! ./xiw_threads churn 8 4
//! gcc -O2 -pthread -o xiw_events tests/c/xiw_events.c -libverbs && ./xiw_events 40
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use xiw_tests::harness::{lo_device, serial, wait_until};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `tests/c/NAME.c`, built once from the repository's source, warnings as errors.
fn program(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("xiw-c-tests");
    let bin = dir.join(name);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|b| b == name) {
        return bin;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("gcc")
        .args([
            "-std=gnu11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
        ])
        .arg("-o")
        .arg(&bin)
        .arg(format!("{REPO}/tests/c/{name}.c"))
        .arg("-libverbs")
        .output()
        .expect("running gcc");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "building {name}.c failed ({:?}):\n{}",
        out.status,
        text(&out.stderr)
    );
    built.push(name.to_string());
    bin
}

/// Runs `tests/c/NAME.c` with `args` on the `lo` device; fails the test with
/// its output unless it exits 0 within `limit`.
fn run(name: &str, args: &[&str], limit: Duration) {
    let dev = lo_device();
    let mut c = dev.cmd(program(name).to_str().unwrap());
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("starting the test program");
    let (out, killed) = wait_until(child, Instant::now() + limit);
    let report = format!(
        "{name} {args:?}: {:?}{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        if killed { " (killed: hung)" } else { "" },
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(!killed && out.status.success(), "{report}");
    eprintln!("{}", text(&out.stdout).trim());
}

#[test]
fn qpex_many_threads_one_qp() {
    let _g = serial();
    for (threads, batches) in [("4", "20000"), ("8", "8000"), ("16", "3000")] {
        run(
            "xiw_threads",
            &["qpex", threads, batches],
            Duration::from_secs(120),
        );
    }
}

#[test]
fn churn_beside_steady_traffic() {
    let _g = serial();
    // Four rounds: some of the races it guards against are timing-dependent
    // (the establishing race failed about one 8 s round in four).
    for _ in 0..4 {
        run("xiw_threads", &["churn", "8", "4"], Duration::from_secs(60));
    }
}

#[test]
fn async_events_against_destroy() {
    let _g = serial();
    run("xiw_events", &["40"], Duration::from_secs(60));
}

#[test]
fn parent_and_thread_domains() {
    // tests/c/xiw_domains.c: a QP, MR and CQ in a parent domain with a
    // thread domain, traffic with a QP of the plain PD, and the refusals.
    let _g = serial();
    run("xiw_domains", &[], Duration::from_secs(30));
}
