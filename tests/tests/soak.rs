//! Soak: `xiw-verbs-check soak` (tests/src/bin/verbs_check/soak.rs) with 16
//! QPs between two network namespaces joined by a veth link, both directions
//! at once, a random mix of Send, RDMA Write, RDMA Read, Fetch-and-Add,
//! Compare-and-Swap, Atomic Write and Flush in random sizes and SGE layouts,
//! every completion and every byte checked at both ends.
//!
//! Each side prints what it requested and checked; to see it:
//!
//! ```text
//! cargo test --release -p xiw-tests --test soak -- --nocapture
//! ```

use std::time::Duration;

use xiw_tests::harness::{port, run_pair, serial, NetnsPair, Pair};

const BIN: &str = env!("CARGO_BIN_EXE_xiw-verbs-check");
const QPS: usize = 16;

/// Runs the soak with `ops` operations per QP and direction; returns the
/// operations both sides requested, as they report them.
fn soak(tag: &str, net: u8, ops: usize, seed: u64, env: &[(&str, &str)], limit: Duration) -> u64 {
    let hosts = NetnsPair::new(tag, net);
    let p = port();
    let watchdog = (limit.as_secs() - 10).to_string();
    let mut srv = hosts.a.cmd(BIN);
    srv.envs(env.iter().copied());
    srv.args(["soak", "--port", &p.to_string(), "--timeout", &watchdog]);
    let mut cli = hosts.b.cmd(BIN);
    cli.envs(env.iter().copied());
    cli.args(["soak", "--port", &p.to_string(), "--server", &hosts.a.addr]);
    cli.args(["--qps", &QPS.to_string(), "--ops", &ops.to_string()]);
    cli.args(["--seed", &seed.to_string(), "--timeout", &watchdog]);
    let pair = run_pair(srv, hosts.a.netns.as_deref(), p, cli, limit);
    let mut total = 0;
    for (side, out) in [("server", pair.server_out()), ("client", pair.client_out())] {
        total += requested(&pair, side, &out);
    }
    eprintln!("{}", pair.client_out().trim());
    eprintln!("{}", pair.server_out().trim());
    total
}

/// The operations one side's result line says it requested.
fn requested(pair: &Pair, side: &str, out: &str) -> u64 {
    assert!(pair.ok(), "the soak failed:\n{}", pair.dump());
    let prefix = format!("soak ok ({side}): ");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("the {side} did not report `{prefix}...`:\n{}", pair.dump()));
    assert!(
        line.contains(", 0 corruptions,"),
        "the {side} reports corruption: {line}"
    );
    line.split_once("requested ")
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no operation count in the {side}'s line: {line}"))
}

/// 10^7 operations (about a minute here).
#[test]
fn soak_sixteen_qps_across_namespaces_ten_million_operations() {
    let _g = serial();
    let total = soak("xsk", 62, 312_500, 12, &[], Duration::from_secs(900));
    assert!(total >= 10_000_000, "only {total} operations ran");
}

/// With MPA CRC (the long soak above runs without, the default): every
/// FPDU sealed and checked, large payloads through the staging buffers
/// on their way out.
#[test]
fn soak_with_crc_a_million_operations() {
    let _g = serial();
    let env = [("XIW_CRC", "1")];
    let total = soak("xsk", 62, 31_250, 13, &env, Duration::from_secs(300));
    assert!(total >= 1_000_000, "only {total} operations ran");
}
