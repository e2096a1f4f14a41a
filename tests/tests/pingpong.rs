//! rdma-core's own example programs (`ibv_rc_pingpong`, `ibv_srq_pingpong`),
//! unmodified, between two processes on the shared `lo` device.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use xiw_tests::harness::{
    check_pingpong, lo_device, port, run_tool_pair, serial, wait_until, Pair,
};

const ITERS: u64 = 200;
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `tool` with `-n ITERS -s size` plus `extra` on both sides.
fn pingpong(tool: &str, size: u64, extra: &[&str]) -> Pair {
    let dev = lo_device();
    let (n, s) = (ITERS.to_string(), size.to_string());
    let mut args = vec!["-n", &n, "-s", &s];
    args.extend_from_slice(extra);
    run_tool_pair(tool, dev, dev, &args, TIMEOUT)
}

fn assert_pingpong(tool: &str, size: u64, extra: &[&str]) {
    let pair = pingpong(tool, size, extra);
    if let Err(e) = check_pingpong(&pair, size, ITERS) {
        panic!("{tool} -s {size} {extra:?}: {e}\n{}", pair.dump());
    }
}

#[test]
fn rc_pingpong_sizes() {
    let _g = serial();
    for size in [1, 64, 1000, 4096, 4097, 65536, 65537] {
        assert_pingpong("ibv_rc_pingpong", size, &[]);
    }
}

/// 1 MiB messages, with both send APIs. Kept apart from the smaller sizes
/// because an end-of-run race showed most often here: when one side has
/// finished and exits, the other sees its stream close while it still has
/// receives posted (ibv_rc_pingpong posts 500 for 200 exchanges); if xiw
/// flushed them at once, a flush could land in the same two-completion poll
/// batch as the last real completion, and ibv_rc_pingpong fails ("Failed
/// status Work Request Flushed Error (5) for wr_id 1", "parse WC failed 2").
/// xiw now lingers (XIW_LINGER_MS) after an orderly close by the peer.
#[test]
fn rc_pingpong_large_messages() {
    let _g = serial();
    assert_pingpong("ibv_rc_pingpong", 1 << 20, &[]);
    assert_pingpong("ibv_rc_pingpong", 1 << 20, &["-N"]);
}

/// `-N`: the ibv_wr_* (ibv_qp_ex) send API instead of ibv_post_send.
#[test]
fn rc_pingpong_new_send_api() {
    let _g = serial();
    for size in [1, 64, 4096, 65536] {
        assert_pingpong("ibv_rc_pingpong", size, &["-N"]);
    }
}

/// `-c`: the server validates the received buffer.
#[test]
fn rc_pingpong_validates_buffer() {
    let _g = serial();
    for size in [64, 4096, 65536] {
        assert_pingpong("ibv_rc_pingpong", size, &["-c"]);
        assert_pingpong("ibv_rc_pingpong", size, &["-c", "-N"]);
    }
}

/// A single receive posted at a time, and a shallow receive queue: the
/// program reposts on every completion.
#[test]
fn rc_pingpong_shallow_receive_queue() {
    let _g = serial();
    assert_pingpong("ibv_rc_pingpong", 4096, &["-r", "1"]);
    assert_pingpong("ibv_rc_pingpong", 65536, &["-r", "2"]);
    assert_pingpong("ibv_rc_pingpong", 1, &["-r", "16", "-N"]);
}

/// The path MTU is an InfiniBand notion; iWARP must accept every value.
#[test]
fn rc_pingpong_every_path_mtu() {
    let _g = serial();
    for mtu in ["256", "512", "1024", "2048", "4096"] {
        assert_pingpong("ibv_rc_pingpong", 8192, &["-m", mtu]);
    }
}

/// Sixteen QPs (the default) sharing one SRQ.
#[test]
fn srq_pingpong_sizes() {
    let _g = serial();
    for size in [1, 64, 4096, 65536] {
        assert_pingpong("ibv_srq_pingpong", size, &[]);
    }
}

/// 1 MiB messages on 16 QPs sharing an SRQ: ibv_srq_pingpong stops at a total
/// count and destroys its QPs with messages still in flight on other QPs. A
/// stream closed with unread bytes would be reset by the kernel, dropping data
/// whose send completions were already reported; xiw closes streams
/// gracefully (FIN, then drain until the peer's FIN), so nothing is lost.
#[test]
fn srq_pingpong_large_messages() {
    let _g = serial();
    for _ in 0..5 {
        assert_pingpong("ibv_srq_pingpong", 1 << 20, &[]);
    }
}

#[test]
fn srq_pingpong_qp_counts_and_depths() {
    let _g = serial();
    assert_pingpong("ibv_srq_pingpong", 4096, &["-q", "1"]);
    assert_pingpong("ibv_srq_pingpong", 4096, &["-q", "2"]);
    assert_pingpong("ibv_srq_pingpong", 1, &["-q", "4", "-c"]);
    assert_pingpong("ibv_srq_pingpong", 65536, &["-q", "8", "-c"]);
    // Fewer receives on the SRQ (16) than QPs x in-flight messages would need
    // if the program did not repost promptly.
    assert_pingpong("ibv_srq_pingpong", 4096, &["-r", "16"]);
}

/// Options that need what xiw does not offer must be refused up front, by
/// both sides and quickly, with the program's own message (never a hang, a
/// crash or a failure halfway); should xiw gain the feature, a complete run
/// is accepted instead. In standalone mode (no kernel module) completion
/// channels are unavailable (`-e`); xiw reports no completion timestamps
/// (`-t`), no ODP (`-o`, `-O`), no device memory (`-j`), no XRC and only RC QPs.
#[test]
fn unsupported_options_are_refused_cleanly() {
    let _g = serial();
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "ibv_rc_pingpong",
            &["-e"],
            "Couldn't create completion channel",
        ),
        (
            "ibv_rc_pingpong",
            &["-t"],
            "The device isn't completion timestamp capable",
        ),
        ("ibv_rc_pingpong", &["-o"], "The device isn't ODP capable"),
        ("ibv_rc_pingpong", &["-O"], "The device isn't ODP capable"),
        (
            "ibv_rc_pingpong",
            &["-j"],
            "Device doesn't support dm allocation",
        ),
        (
            "ibv_srq_pingpong",
            &["-e"],
            "Couldn't create completion channel",
        ),
        ("ibv_xsrq_pingpong", &[], "Couldn't Open the XRC Domain"),
        ("ibv_uc_pingpong", &[], "Couldn't create QP"),
        ("ibv_ud_pingpong", &[], "Couldn't create QP"),
    ];
    let refused = |out: &Output, refusal: &str| {
        out.status.code() == Some(1)
            && String::from_utf8_lossy(&out.stderr)
                .lines()
                .any(|l| l.starts_with(refusal))
    };
    for &(tool, extra, refusal) in cases {
        let pair = pingpong(tool, 4096, extra);
        if pair.ok() {
            // Supported after all: then it must be a complete, correct run.
            if tool == "ibv_rc_pingpong" || tool == "ibv_srq_pingpong" {
                if let Err(e) = check_pingpong(&pair, 4096, ITERS) {
                    panic!("{tool} {extra:?}: {e}\n{}", pair.dump());
                }
            }
            continue;
        }
        // A killed (hung) server has no exit code, so this also catches hangs.
        assert!(
            refused(&pair.server, refusal),
            "{tool} {extra:?}: expected `{refusal}`\n{}",
            pair.dump()
        );
        if pair.client.stderr == b"client never started" {
            // The server was refused before it listened (run_pair then
            // reports a time-out); the client must refuse on its own too.
            let dev = lo_device();
            let mut c = dev.cmd(tool);
            let (n, port) = (ITERS.to_string(), port().to_string());
            c.args(["-d", "xiw0", "-p", &port, "-g", "0", "-n", &n, "-s", "4096"]);
            c.args(extra).arg(&dev.addr);
            c.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child = c.spawn().expect("spawning the client");
            let (client, killed) = wait_until(child, Instant::now() + TIMEOUT);
            assert!(
                !killed && refused(&client, refusal),
                "{tool} {extra:?} client alone: expected `{refusal}`; {client:?}"
            );
        } else {
            assert!(!pair.timed_out, "{tool} {extra:?} hung\n{}", pair.dump());
            assert!(
                refused(&pair.client, refusal),
                "{tool} {extra:?}: expected `{refusal}`\n{}",
                pair.dump()
            );
        }
    }
}
