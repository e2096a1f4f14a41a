//! Data integrity through the real libibverbs: `xiw-verbs-check integrity` runs
//! as a server/client pair over several QPs with a random mix of Sends, RDMA
//! Writes and RDMA Reads (0 bytes to 1 MiB, FPDU-boundary sizes, random SGE
//! layouts, signaled and unsignaled, inline) in both directions at once, and
//! checks every completion and every byte at both ends.
//!
//! The seeds are fixed so a failure reproduces; `XIW_VERBS_SEED=N` replaces them
//! for exploratory runs. To rerun one by hand (after `pkg/install.sh`):
//!
//! ```text
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! xiw-verbs-check integrity --port 18515 &
//! xiw-verbs-check integrity --port 18515 --server 127.0.0.1 --qps 4 --ops 200 --seed 1
//! ```

use std::time::Duration;

use xiw_tests::harness::{lo_device, port, run_pair, serial, Device, NetnsPair, Pair};

const BIN: &str = env!("CARGO_BIN_EXE_xiw-verbs-check");
/// The program's own watchdog, well inside the pair's timeout.
const WATCHDOG_S: u64 = 50;
const TIMEOUT: Duration = Duration::from_secs(58);

fn seed(default: u64) -> u64 {
    std::env::var("XIW_VERBS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn integrity_pair(server: &Device, client: &Device, qps: usize, ops: usize, seed: u64) -> Pair {
    integrity_pair_env(server, client, qps, ops, seed, &[])
}

fn integrity_pair_env(
    server: &Device,
    client: &Device,
    qps: usize,
    ops: usize,
    seed: u64,
    env: &[(&str, &str)],
) -> Pair {
    let p = port();
    let mut srv = server.cmd(BIN);
    srv.envs(env.iter().copied());
    srv.args(["integrity", "--port", &p.to_string()]);
    srv.args(["--timeout", &WATCHDOG_S.to_string()]);
    let mut cli = client.cmd(BIN);
    cli.envs(env.iter().copied());
    cli.args([
        "integrity",
        "--port",
        &p.to_string(),
        "--server",
        &server.addr,
    ]);
    cli.args(["--qps", &qps.to_string(), "--ops", &ops.to_string()]);
    cli.args([
        "--seed",
        &seed.to_string(),
        "--timeout",
        &WATCHDOG_S.to_string(),
    ]);
    run_pair(srv, server.netns.as_deref(), p, cli, TIMEOUT)
}

fn check(pair: &Pair, what: &str) {
    check_scenario(pair, "integrity", what)
}

/// Both sides of `scenario` succeeded and said so.
fn check_scenario(pair: &Pair, scenario: &str, what: &str) {
    assert!(pair.ok(), "{what} failed:\n{}", pair.dump());
    for (side, out) in [("server", pair.server_out()), ("client", pair.client_out())] {
        let want = format!("{scenario} ok ({side}): ");
        assert!(
            out.lines().any(|l| l.starts_with(&want)),
            "{what}: the {side} did not report `{want}...`:\n{}",
            pair.dump()
        );
    }
    eprintln!("{what}:\n{}{}", pair.server_out(), pair.client_out());
}

/// `integrity` with 4 QPs and 200 operations each on lo, the provider's
/// knobs `env` on both sides (`how` says what they are in the report).
fn four_qps_on_lo(default_seed: u64, env: &[(&str, &str)], how: &str) {
    let _g = serial();
    let dev = lo_device();
    let s = seed(default_seed);
    let pair = integrity_pair_env(dev, dev, 4, 200, s, env);
    check(
        &pair,
        &format!("integrity --qps 4 --ops 200 --seed {s} on lo{how}"),
    );
}

#[test]
fn integrity_four_qps_on_lo() {
    four_qps_on_lo(1, &[], "");
}

/// With MPA CRC (asked for by both ends, `XIW_CRC=1`): every payload goes
/// through the staging buffers on its way out and is checked at its
/// trailer on its way in.
#[test]
fn integrity_with_crc_four_qps_on_lo() {
    four_qps_on_lo(2, &[("XIW_CRC", "1")], ", CRC");
}

/// Without CRC, payloads go to the stream straight from registered memory
/// (writev of the engine's headers and the application's buffers, no
/// staging copy): every size, SGE layout and direction lands intact.
#[test]
fn integrity_without_crc_payload_sent_in_place() {
    four_qps_on_lo(
        3,
        &[("XIW_CRC", "0"), ("XIW_INPLACE_MIN", "1")],
        ", no CRC, sent in place",
    );
}

/// With completions that wait for the peer's confirmation
/// (`XIW_COMPLETION=placed`: a zero-length Read behind each signaled Send or
/// Write), every operation still lands intact and completes once, in order.
#[test]
fn integrity_with_completions_confirmed_by_the_peer() {
    four_qps_on_lo(
        5,
        &[("XIW_COMPLETION", "placed")],
        ", completions confirmed",
    );
}

#[test]
fn integrity_many_qps_on_lo() {
    let _g = serial();
    let dev = lo_device();
    let s = seed(20260);
    let pair = integrity_pair(dev, dev, 12, 60, s);
    check(
        &pair,
        &format!("integrity --qps 12 --ops 60 --seed {s} on lo"),
    );
}

#[test]
fn integrity_one_qp_long_run_on_lo() {
    let _g = serial();
    let dev = lo_device();
    let s = seed(77);
    let pair = integrity_pair(dev, dev, 1, 500, s);
    check(
        &pair,
        &format!("integrity --qps 1 --ops 500 --seed {s} on lo"),
    );
}

/// Server in namespace `a`, client in `b`: the traffic crosses a veth link with
/// a 1500-byte MTU, so FPDUs span many TCP segments.
#[test]
fn integrity_across_namespaces() {
    let _g = serial();
    let hosts = NetnsPair::new("xvc", 61);
    let s = seed(5);
    let pair = integrity_pair(&hosts.a, &hosts.b, 4, 120, s);
    check(
        &pair,
        &format!("integrity --qps 4 --ops 120 --seed {s} across namespaces"),
    );
}

/// A pair of `xiw-verbs-check SCENARIO` on `dev`, the client with `seed`.
fn scenario_pair(dev: &Device, scenario: &str, seed: u64, env: &[(&str, &str)]) -> Pair {
    let p = port();
    let mut srv = dev.cmd(BIN);
    srv.envs(env.iter().copied());
    srv.args([scenario, "--port", &p.to_string()]);
    srv.args(["--timeout", &WATCHDOG_S.to_string()]);
    let mut cli = dev.cmd(BIN);
    cli.envs(env.iter().copied());
    cli.args([scenario, "--port", &p.to_string(), "--server", &dev.addr]);
    cli.args(["--seed", &seed.to_string()]);
    cli.args(["--timeout", &WATCHDOG_S.to_string()]);
    run_pair(srv, None, p, cli, TIMEOUT)
}

#[test]
fn a_peer_that_stops_reading_gets_everything_in_order_when_it_resumes() {
    // Lone small Writes and Sends are framed on the posting thread while the
    // stream takes them; once the socket is full they queue, the send queue
    // fills (ENOMEM), and all of it must go out, complete and land in order
    // once the peer reads again. Also with every post going through the
    // send queue (XIW_POST_NOW_MAX=0), the path it is measured against.
    let _g = serial();
    let dev = lo_device();
    for env in [&[][..], &[("XIW_POST_NOW_MAX", "0")][..]] {
        let pair = scenario_pair(dev, "stall", seed(5), env);
        check_scenario(&pair, "stall", &format!("stall {env:?}"));
    }
}

#[test]
fn a_reregistered_mr_is_reached_at_its_new_place_only() {
    // ibv_rereg_mr moves the server's MR to a new buffer and adds remote
    // read: the same rkey then writes and reads the new buffer, and a Write
    // to the old range is refused (the old buffer is unmapped by then, so a
    // stray write would kill the server).
    let _g = serial();
    let pair = scenario_pair(lo_device(), "rereg", seed(9), &[]);
    check_scenario(&pair, "rereg", "rereg");
}

#[test]
fn a_resized_cq_keeps_its_completions_in_order() {
    // ibv_resize_cq with completions waiting: refused below them, kept in
    // order when grown, and the grown CQ holds more than the old one could.
    let _g = serial();
    let pair = scenario_pair(lo_device(), "resize", seed(10), &[]);
    check_scenario(&pair, "resize", "resize");
}

#[test]
fn a_qp_in_error_holds_its_peers_new_connection_until_it_is_reset() {
    // The side that connects goes back to RTS while its peer is still in
    // error from the connection before: the peer holds the Request, and the
    // new connection comes up once it follows.
    let _g = serial();
    let pair = scenario_pair(lo_device(), "reconnect", seed(11), &[]);
    check_scenario(&pair, "reconnect", "reconnect");
}
