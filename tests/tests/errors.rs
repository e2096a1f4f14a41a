//! Error behaviour through the real libibverbs: `xiw-verbs-check errors` runs as
//! a server/client pair. Each remote or local error case runs on fresh QPs and
//! must produce the right completion status on both sides, the error state
//! where iWARP says so, no stray placement, and leave a healthy QP pair (open
//! all along) working: a checked Send/Write/Read runs on it after every case.
//! The verbs' own error codes (ENOMEM on a full queue, EINVAL for too many SGEs,
//! EOPNOTSUPP for UD, ...) are checked on the way.
//!
//! To rerun by hand (after `pkg/install.sh`), with `--case NAME` to pick cases:
//!
//! ```text
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! xiw-verbs-check errors --port 18516 &
//! xiw-verbs-check errors --port 18516 --server 127.0.0.1
//! ```

use std::time::Duration;

use xiw_tests::harness::{lo_device, port, run_pair, serial, Pair};

const BIN: &str = env!("CARGO_BIN_EXE_xiw-verbs-check");
const WATCHDOG_S: u64 = 50;
const TIMEOUT: Duration = Duration::from_secs(58);

fn errors_pair(cases: &[&str]) -> Pair {
    errors_pair_within(cases, WATCHDOG_S, TIMEOUT)
}

/// With the program's watchdog at `watchdog_s` and the pair killed at `timeout`.
fn errors_pair_within(cases: &[&str], watchdog_s: u64, timeout: Duration) -> Pair {
    let dev = lo_device();
    let p = port();
    let mut args = vec!["errors".to_string(), "--port".into(), p.to_string()];
    args.extend(["--timeout".into(), watchdog_s.to_string()]);
    for c in cases {
        args.extend(["--case".to_string(), c.to_string()]);
    }
    let mut srv = dev.cmd(BIN);
    srv.args(&args);
    let mut cli = dev.cmd(BIN);
    cli.args(&args).args(["--server", &dev.addr]);
    run_pair(srv, None, p, cli, timeout)
}

fn check(pair: &Pair, what: &str) {
    assert!(pair.ok(), "{what} failed:\n{}", pair.dump());
    for (side, out) in [("server", pair.server_out()), ("client", pair.client_out())] {
        let want = format!("errors ok ({side}): ");
        assert!(
            out.lines().any(|l| l.starts_with(&want)),
            "{what}: the {side} did not report `{want}...`:\n{}",
            pair.dump()
        );
    }
    eprintln!("{what}:\n{}{}", pair.server_out(), pair.client_out());
}

/// All default cases: bad rkey (also with sends and receives on one CQ, where
/// the failing Read must still complete first), missing remote read/write permission (MR and
/// QP), out-of-bounds Reads and Writes, a Send longer than the receive, bad
/// lkeys on the send and the receive side, a Read into a read-only MR, and the
/// verbs' own error codes.
#[test]
fn error_cases_complete_in_error_and_leave_other_qps_working() {
    let _g = serial();
    let pair = errors_pair(&[]);
    check(&pair, "errors (all default cases)");
    let client = pair.client_out();
    for case in [
        "verbs",
        "bad-rkey-read",
        "bad-rkey-read-one-cq",
        "read-without-remote-read",
        "write-without-remote-write",
        "write-qp-without-remote-write",
        "read-out-of-bounds",
        "read-beyond-mr",
        "write-out-of-bounds",
        "send-too-long",
        "bad-lkey-send",
        "read-sink-not-writable",
        "bad-lkey-recv",
    ] {
        assert!(
            client.contains(case),
            "case {case} did not run:\n{}",
            pair.dump()
        );
    }
}

/// The server `_exit`s in the middle of a stream of 256 KiB RDMA Writes (and
/// some Reads); every outstanding work request of the client must complete, in
/// order, the first failure and all after it in error, within a deadline, and
/// its QP must end in the error state.
#[test]
fn peer_killed_mid_transfer_flushes_outstanding_work() {
    let _g = serial();
    let pair = errors_pair(&["peer-death"]);
    check(&pair, "errors --case peer-death");
    assert!(
        pair.client_out().contains("first error at WR"),
        "{}",
        pair.dump()
    );
}

/// As above with RDMA Reads among the Writes, twenty times over. A Read waiting
/// for its response when the server dies must complete in error like the rest.
/// (A failure found while transmitting from the receive path, with the rx lock
/// held, is applied later by the progress thread with no lock held; applying it
/// on the spot used to deadlock here.)
#[test]
fn peer_killed_with_reads_outstanding() {
    let _g = serial();
    for run in 0..20 {
        // Short limits: twenty runs must fit in a minute even when the last one hangs.
        let pair = errors_pair_within(&["peer-death-with-reads"], 15, Duration::from_secs(20));
        check(
            &pair,
            &format!("errors --case peer-death-with-reads, run {run}"),
        );
    }
}

/// A fenced Send with a bad lkey behind an RDMA Read: it is framed when the
/// Read's response arrives, on the progress thread's receive path, and must
/// complete with IBV_WC_LOC_PROT_ERR like the same error found by
/// ibv_post_send, without freezing the context (the failure is deferred out of
/// the receive path's locks).
#[test]
fn local_error_found_on_the_receive_path() {
    let _g = serial();
    let pair = errors_pair(&["fenced-bad-lkey-after-read"]);
    check(&pair, "errors --case fenced-bad-lkey-after-read");
}
