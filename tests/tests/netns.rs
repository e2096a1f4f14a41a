//! Two hosts: the same unmodified programs as `pingpong.rs` and `perftest.rs`,
//! with the server in one network namespace and the client in another, joined
//! by a veth pair (so the traffic crosses a real Ethernet-like link with a
//! 1500-byte MTU instead of `lo`). The server runs in namespace `a`, the
//! client in `b` connects to `a`'s address.
//!
//! Every perftest size of `-a` (2 B to 8 MiB) runs, with fewer iterations.

use std::time::{Duration, Instant};

use xiw_tests::harness::{
    check_perftest, check_pingpong, perftest_all_sizes, run_tool_pair, serial, wait_port_active,
    NetnsPair,
};

const TIMEOUT: Duration = Duration::from_secs(240);

/// Two namespaces with xiw devices whose ports are up (see [`wait_port_active`]).
fn two_hosts(tag: &str, net: u8) -> NetnsPair {
    let hosts = NetnsPair::new(tag, net);
    wait_port_active(&hosts.a, Duration::from_secs(10));
    wait_port_active(&hosts.b, Duration::from_secs(10));
    hosts
}

/// Runs `tool -a -n iters` from `hosts.b` to `hosts.a` and checks both reports.
fn perftest_across(hosts: &NetnsPair, tool: &str, iters: u64) {
    let n = iters.to_string();
    let args = ["-a", "-n", &n];
    let start = Instant::now();
    let pair = run_tool_pair(tool, &hosts.a, &hosts.b, &args, TIMEOUT);
    if let Err(e) = check_perftest(tool, &pair, &perftest_all_sizes(), iters) {
        panic!("{tool} {args:?} across namespaces: {e}\n{}", pair.dump());
    }
    eprintln!(
        "{tool} {args:?} across namespaces: {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

fn pingpong_across(hosts: &NetnsPair, tool: &str, size: u64, extra: &[&str]) {
    let s = size.to_string();
    let mut args = vec!["-n", "200", "-s", &s];
    args.extend_from_slice(extra);
    let pair = run_tool_pair(tool, &hosts.a, &hosts.b, &args, Duration::from_secs(60));
    if let Err(e) = check_pingpong(&pair, size, 200) {
        panic!("{tool} {args:?} across namespaces: {e}\n{}", pair.dump());
    }
}

#[test]
fn rc_pingpong_across_namespaces() {
    let _g = serial();
    let hosts = two_hosts("xnspp", 231);
    for size in [1, 64, 1500, 4096, 65536] {
        pingpong_across(&hosts, "ibv_rc_pingpong", size, &[]);
    }
    pingpong_across(&hosts, "ibv_rc_pingpong", 4096, &["-N", "-c"]);
}

/// 1 MiB messages: see `rc_pingpong_large_messages` in pingpong.rs for why
/// they have a test of their own.
#[test]
fn rc_pingpong_large_messages_across_namespaces() {
    let _g = serial();
    let hosts = two_hosts("xnsppl", 238);
    pingpong_across(&hosts, "ibv_rc_pingpong", 1 << 20, &[]);
}

#[test]
fn srq_pingpong_across_namespaces() {
    let _g = serial();
    let hosts = two_hosts("xnssrq", 232);
    for size in [1, 4096, 65536] {
        pingpong_across(&hosts, "ibv_srq_pingpong", size, &[]);
    }
}

#[test]
fn ib_write_lat_across_namespaces() {
    let _g = serial();
    let hosts = two_hosts("xnswl", 233);
    perftest_across(&hosts, "ib_write_lat", 200);
}

#[test]
fn ib_write_bw_across_namespaces() {
    let _g = serial();
    let hosts = two_hosts("xnswb", 234);
    perftest_across(&hosts, "ib_write_bw", 200);
}

#[test]
fn ib_read_bw_across_namespaces() {
    let _g = serial();
    let hosts = two_hosts("xnsrb", 235);
    perftest_across(&hosts, "ib_read_bw", 200);
}

/// Accepts only perftest's own ib_send_bw teardown failure (see
/// [`check_perftest`]).
#[test]
fn ib_send_bw_across_namespaces() {
    let _g = serial();
    let hosts = two_hosts("xnssb", 236);
    perftest_across(&hosts, "ib_send_bw", 200);
}

#[test]
fn ib_read_lat_and_send_lat_across_namespaces() {
    let _g = serial();
    let hosts = two_hosts("xnslat", 237);
    perftest_across(&hosts, "ib_read_lat", 200);
    perftest_across(&hosts, "ib_send_lat", 200);
}
