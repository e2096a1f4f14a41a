//! Leaks and memory errors, through the real libibverbs on the shared `lo`
//! device.
//!
//! - `tests/c/xiw_cycles.c` opens the device, creates one of everything
//!   (PD, MRs, plain and extended CQs, SRQ, QPs), connects two QPs, moves a
//!   Write and a Send across, destroys it all and closes the device, 1,000
//!   times: open descriptors and threads must end where they were after the
//!   warm-up, resident memory and address space within a small bound.
//! - Whole programs under valgrind's memcheck (AddressSanitizer needs a
//!   nightly Rust toolchain for the provider): an `ibv_rc_pingpong` pair, an
//!   `ibv_srq_pingpong` pair, an `xiw-verbs-check integrity` pair and
//!   `xiw_cycles`. Each must succeed, and valgrind must report no error at
//!   all (invalid reads or writes, uses of uninitialised values, bad frees,
//!   and memory definitely or indirectly lost at exit), with only the
//!   suppressions of `tests/valgrind.supp`, each explained there. Blocks
//!   memcheck calls "possibly lost" are printed, not failed: they are the
//!   device libibverbs keeps on its device list for the life of the process
//!   (reached through a pointer into its middle), one of each per process.
//!
//! Valgrind runs one thread at a time. Its default lock lets a thread that
//! spins on a CQ (as these programs do) take it back before the provider's
//! progress thread runs, for seconds; `--fair-sched=yes` hands it round in
//! turn, as the kernel's scheduler would.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! gcc -O2 -o xiw_cycles tests/c/xiw_cycles.c -libverbs
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! ./xiw_cycles 1000
//! valgrind --fair-sched=yes --leak-check=full --errors-for-leak-kinds=definite,indirect \
//!     --suppressions=tests/valgrind.supp ./xiw_cycles --no-memory-check 20
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xiw_tests::cprog::{program, run};
use xiw_tests::harness::{check_pingpong, lo_device, port, run_pair, serial, wait_until, Pair};

const SUPPRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/valgrind.supp");
const VERBS_CHECK: &str = env!("CARGO_BIN_EXE_xiw-verbs-check");
/// What valgrind exits with when it found an error (the program's own
/// failures keep their codes).
const VALGRIND_ERROR_EXIT: i32 = 99;
/// Per program under valgrind: generous, as it runs 20 to 50 times slower.
const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn cycles_leave_memory_and_fds_flat() {
    let _g = serial();
    run("xiw_cycles", &["1000"], Duration::from_secs(120));
}

/// Where a valgrind run writes its report: a file of its own, so the
/// program's stderr stays the program's.
fn log_file(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join("xiw-tests-valgrind");
    std::fs::create_dir_all(&dir).expect("making the valgrind log directory");
    let p = dir.join(format!("{tag}-{}-{}.log", std::process::id(), port()));
    let _ = std::fs::remove_file(&p);
    p
}

/// `program` under memcheck on the `lo` device, reporting to `log`.
fn memcheck(program: &str, log: &Path) -> Command {
    let mut c = lo_device().cmd("valgrind");
    c.args([
        "--tool=memcheck",
        "--fair-sched=yes",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,indirect",
        "--track-origins=yes",
        "--num-callers=40",
    ])
    .arg(format!("--error-exitcode={VALGRIND_ERROR_EXIT}"))
    .arg(format!("--suppressions={SUPPRESSIONS}"))
    .arg(format!("--log-file={}", log.display()))
    .arg(program);
    c
}

/// What memcheck's closing summary says.
#[derive(Debug, Default)]
struct Summary {
    errors: u64,
    contexts: u64,
    suppressed: u64,
    definitely_lost: u64,
    indirectly_lost: u64,
    possibly_lost: u64,
}

/// The number after `key` on the last line of `text` that has `key`.
fn number_after(text: &str, key: &str) -> Option<u64> {
    text.lines().rev().find_map(|l| {
        let rest = &l[l.find(key)? + key.len()..];
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(|c| *c != ',')
            .collect();
        digits.parse().ok()
    })
}

/// Reads the report at `log`: `Err` with the whole report unless memcheck
/// finished it (an `ERROR SUMMARY` line), found no error, and lost no memory
/// definitely or indirectly.
fn read_log(log: &Path) -> Result<Summary, String> {
    let text = std::fs::read_to_string(log)
        .map_err(|e| format!("no valgrind report at {}: {e}", log.display()))?;
    let Some(errors) = number_after(&text, "ERROR SUMMARY:") else {
        return Err(format!("memcheck did not finish its report:\n{text}"));
    };
    let s = Summary {
        errors,
        contexts: number_after(&text, "errors from").unwrap_or(0),
        suppressed: number_after(&text, "(suppressed:").unwrap_or(0),
        // No LEAK SUMMARY when every block was freed.
        definitely_lost: number_after(&text, "definitely lost:").unwrap_or(0),
        indirectly_lost: number_after(&text, "indirectly lost:").unwrap_or(0),
        possibly_lost: number_after(&text, "possibly lost:").unwrap_or(0),
    };
    if s.errors != 0 || s.definitely_lost != 0 || s.indirectly_lost != 0 {
        let provider = text.matches("libxiw-rdmav").count() + text.matches(" xiw::").count();
        return Err(format!(
            "memcheck found {} error(s) in {} context(s) ({provider} stack frame(s) in the \
             provider), {} bytes definitely and {} indirectly lost:\n{text}",
            s.errors, s.contexts, s.definitely_lost, s.indirectly_lost
        ));
    }
    let _ = std::fs::remove_file(log);
    Ok(s)
}

fn report(what: &str, took: Duration, sides: &[(&str, Summary)]) {
    for (side, s) in sides {
        eprintln!(
            "{what}: {side}: {:.1} s under memcheck, {} errors ({} suppressed), {} bytes \
             possibly lost",
            took.as_secs_f64(),
            s.errors,
            s.suppressed,
            s.possibly_lost
        );
    }
}

/// A server/client pair on `port`, each under memcheck with `env`: both
/// succeed, both reports are clean. Returns the pair (for its own checks),
/// after printing the reports' figures as `what`.
fn memcheck_pair(
    what: &str,
    server: &[&str],
    client: &[&str],
    env: &[(&str, &str)],
    port: u16,
) -> Pair {
    let tag: String = what
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let logs = [
        log_file(&format!("{tag}-server")),
        log_file(&format!("{tag}-client")),
    ];
    let mut srv = memcheck(server[0], &logs[0]);
    srv.args(&server[1..]).envs(env.iter().copied());
    let mut cli = memcheck(client[0], &logs[1]);
    cli.args(&client[1..]).envs(env.iter().copied());
    let t0 = Instant::now();
    let pair = run_pair(srv, None, port, cli, TIMEOUT);
    let took = t0.elapsed();
    let reports: Vec<_> = logs.iter().map(|l| read_log(l)).collect();
    if !pair.ok() || reports.iter().any(|r| r.is_err()) {
        let mut msg = format!("{what} under memcheck failed:\n{}", pair.dump());
        for (side, r) in ["server", "client"].iter().zip(&reports) {
            if let Err(e) = r {
                msg.push_str(&format!("\n--- {side} valgrind: {e}"));
            }
        }
        panic!("{msg}");
    }
    let sums: Vec<_> = ["server", "client"]
        .into_iter()
        .zip(reports.into_iter().map(Result::unwrap))
        .collect();
    report(what, took, &sums);
    pair
}

/// `tool` (`ibv_rc_pingpong`, `ibv_srq_pingpong`) on both sides under
/// memcheck, `iters` exchanges of `size` bytes, with `extra` options.
fn pingpong_under_memcheck(tool: &str, size: u64, iters: u64, extra: &[&str]) {
    let (p, n, s) = (port().to_string(), iters.to_string(), size.to_string());
    let mut server = vec![tool, "-d", "xiw0", "-g", "0", "-p", &p, "-n", &n, "-s", &s];
    server.extend_from_slice(extra);
    let mut client = server.clone();
    client.push("127.0.0.1");
    let what = format!("{tool} -n {iters} -s {size} {}", extra.join(" "));
    let pair = memcheck_pair(&what, &server, &client, &[], p.parse().unwrap());
    if let Err(e) = check_pingpong(&pair, size, iters) {
        panic!("{what} under memcheck: {e}\n{}", pair.dump());
    }
}

#[test]
fn rc_pingpong_under_memcheck() {
    let _g = serial();
    // -c: the server checks every byte it receives.
    pingpong_under_memcheck("ibv_rc_pingpong", 4096, 100, &["-c"]);
    // Messages of many FPDUs, placed straight from the socket.
    pingpong_under_memcheck("ibv_rc_pingpong", 1 << 20, 10, &["-c"]);
}

#[test]
fn srq_pingpong_under_memcheck() {
    let _g = serial();
    pingpong_under_memcheck("ibv_srq_pingpong", 8192, 100, &["-q", "4"]);
}

#[test]
fn verbs_integrity_under_memcheck() {
    // Sends, Writes and Reads of 0 bytes to 1 MiB on several QPs in both
    // directions, every byte checked (tests/tests/integrity.rs runs more):
    // with MPA CRC, then without (the default) with every payload sent
    // straight from registered memory, then with completions that wait for
    // the peer's confirmation.
    let _g = serial();
    let variants: [(&str, &[(&str, &str)]); 3] = [
        (", CRC", &[("XIW_CRC", "1")]),
        (
            ", no CRC, sent in place",
            &[("XIW_CRC", "0"), ("XIW_INPLACE_MIN", "1")],
        ),
        (", completions confirmed", &[("XIW_COMPLETION", "placed")]),
    ];
    for (label, env) in variants {
        let p = port().to_string();
        let server = [VERBS_CHECK, "integrity", "--port", &p, "--timeout", "100"];
        let client = [
            VERBS_CHECK,
            "integrity",
            "--port",
            &p,
            "--server",
            "127.0.0.1",
            "--qps",
            "3",
            "--ops",
            "100",
            "--seed",
            "1",
            "--timeout",
            "100",
        ];
        let what = format!("xiw-verbs-check integrity --qps 3 --ops 100{label}");
        let pair = memcheck_pair(&what, &server, &client, env, p.parse().unwrap());
        for (side, out) in [("server", pair.server_out()), ("client", pair.client_out())] {
            let want = format!("integrity ok ({side}): ");
            assert!(
                out.lines().any(|l| l.starts_with(&want)),
                "{what} under memcheck: the {side} did not report `{want}...`:\n{}",
                pair.dump()
            );
        }
        eprint!("{}{}", pair.server_out(), pair.client_out());
    }
}

#[test]
fn cycles_under_memcheck() {
    // Fewer cycles than the flat-memory test: every object's whole life is
    // in each one, and memcheck's leak check at exit counts what is left.
    let _g = serial();
    let log = log_file("xiw_cycles");
    let bin = program("xiw_cycles");
    let mut c = memcheck(bin.to_str().unwrap(), &log);
    c.args(["--no-memory-check", "50"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let (out, killed) = wait_until(c.spawn().expect("starting valgrind"), t0 + TIMEOUT);
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = read_log(&log);
    assert!(
        !killed && out.status.success() && summary.is_ok(),
        "xiw_cycles under memcheck: {:?}{}\nstdout:\n{stdout}\nstderr:\n{stderr}\nvalgrind: {}",
        out.status,
        if killed { " (killed: hung)" } else { "" },
        summary.err().unwrap_or_default()
    );
    eprint!("{stdout}");
    report("xiw_cycles 50", took, &[("the process", summary.unwrap())]);
}
