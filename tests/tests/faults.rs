//! Faults, each a whole-program test: `xiw-verbs-check fault`
//! (tests/src/bin/verbs_check/fault.rs) streams one kind of operation on a QP
//! to its peer while the fault strikes, with a QP pair inside the client's
//! own process carrying checked traffic beside it. Every work request must
//! complete exactly once, in order, the first failure with the status the
//! fault calls for and the rest flushed; nothing may hang; the bystander pair
//! must go on.
//!
//! - the peer killed with SIGKILL during each kind of operation;
//! - memory the peer's Writes aim at deregistered while they are in flight:
//!   no byte may land after `ibv_dereg_mr` returns;
//! - a TCP reset injected by nftables in both namespaces;
//! - the link down for longer than the stream's time-out
//!   (`XIW_STREAM_TIMEOUT_MS`): the oldest request fails with
//!   IBV_WC_RETRY_EXC_ERR; and down for less: nothing fails;
//! - packet loss (nftables dropping 1% of the TCP segments each way) and
//!   queueing delay (a 200 Mbit/s tbf rate limit each way) during the soak, whose every byte is
//!   checked, and during `ib_write_bw`. (This machine's kernel has no netem;
//!   those two stand in for it.)

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;

use xiw_tests::harness::{
    lo_device, port, run_pair, run_tool_pair_env, serial, Device, NetnsPair, Pair,
};

const BIN: &str = env!("CARGO_BIN_EXE_xiw-verbs-check");

fn sh(cmd: &str) {
    let st = Command::new("sh").arg("-c").arg(cmd).status().expect("sh");
    assert!(st.success(), "failed: {cmd}");
}

/// A `fault` pair, server on `server`, client on `client`, with `opts` as
/// `--case` values on both sides; `inject` runs beside it.
fn fault_pair(
    server: &Device,
    client: &Device,
    opts: &[&str],
    env: &[(&str, &str)],
    inject: impl FnOnce(u16) + Send,
) -> Pair {
    let p = port();
    let mk = |dev: &Device| {
        let mut c = dev.cmd(BIN);
        c.envs(env.iter().copied());
        c.args(["fault", "--port", &p.to_string(), "--timeout", "80"]);
        for o in opts {
            c.args(["--case", o]);
        }
        c
    };
    let srv = mk(server);
    let mut cli = mk(client);
    cli.args(["--server", &server.addr]);
    std::thread::scope(|s| {
        s.spawn(|| inject(p));
        run_pair(
            srv,
            server.netns.as_deref(),
            p,
            cli,
            Duration::from_secs(90),
        )
    })
}

/// The client reported success; so did the server, or it was killed.
fn check(pair: &Pair, what: &str, server_killed: bool) {
    assert!(!pair.timed_out, "{what}: hung\n{}", pair.dump());
    let cli = pair.client_out();
    assert!(
        pair.client.status.success() && cli.contains("fault ok (client): "),
        "{what}: the client failed\n{}",
        pair.dump()
    );
    if server_killed {
        assert_eq!(
            pair.server.status.signal(),
            Some(libc::SIGKILL),
            "{what}: the server was to kill itself\n{}",
            pair.dump()
        );
    } else {
        assert!(
            pair.server.status.success() && pair.server_out().contains("fault ok (server): "),
            "{what}: the server failed\n{}",
            pair.dump()
        );
    }
    eprintln!("{what}:\n{}{}", cli, pair.server_out());
}

#[test]
fn peer_killed_with_sigkill_during_each_operation() {
    let _g = serial();
    let dev = lo_device();
    for op in ["send", "write", "read", "atomic", "flush", "atomic-write"] {
        let o = format!("op={op}");
        let pair = fault_pair(dev, dev, &["kill", &o], &[], |_| {});
        check(&pair, &format!("peer killed during {op}"), true);
    }
}

/// Large Writes are placed straight from the socket into the target; both
/// those and small ones are refused from the moment `ibv_dereg_mr` returns.
/// With completions confirmed by the peer (`XIW_COMPLETION=placed`) the
/// refused Write itself completes with IBV_WC_REM_ACCESS_ERR.
#[test]
fn memory_deregistered_while_remote_writes_are_in_flight() {
    let _g = serial();
    let dev = lo_device();
    let pair = fault_pair(dev, dev, &["dereg", "op=write"], &[], |_| {});
    check(&pair, "dereg under Writes", false);
    let env = [("XIW_COMPLETION", "placed")];
    let pair = fault_pair(
        dev,
        dev,
        &["dereg", "op=write", "expect=access"],
        &env,
        |_| {},
    );
    check(&pair, "dereg under Writes, completions confirmed", false);
}

/// nftables in both namespaces answers every segment between the two hosts
/// but the out-of-band connection's with a TCP reset.
fn reset_rules(ns: &str, peer: &str, oob: u16) {
    let nft = |rule: &str| sh(&format!("ip netns exec {ns} nft {rule}"));
    nft("add table inet xiwfault");
    nft("add chain inet xiwfault out '{ type filter hook output priority 0 ; }'");
    nft(&format!(
        "add rule inet xiwfault out tcp sport {oob} accept"
    ));
    nft(&format!(
        "add rule inet xiwfault out tcp dport {oob} accept"
    ));
    nft(&format!(
        "add rule inet xiwfault out ip daddr {peer} meta l4proto tcp reject with tcp reset"
    ));
}

#[test]
fn tcp_reset_injected_in_the_middle_of_the_stream() {
    let _g = serial();
    let hosts = NetnsPair::new("xfr", 63);
    let pair = fault_pair(&hosts.a, &hosts.b, &["op=mixed"], &[], |oob| {
        std::thread::sleep(Duration::from_millis(1500));
        reset_rules("xfra", &hosts.b.addr, oob);
        reset_rules("xfrb", &hosts.a.addr, oob);
    });
    check(&pair, "TCP reset", false);
}

#[test]
fn link_down_longer_than_the_stream_timeout() {
    let _g = serial();
    let hosts = NetnsPair::new("xfl", 64);
    let env = [("XIW_STREAM_TIMEOUT_MS", "2000")];
    let pair = fault_pair(
        &hosts.a,
        &hosts.b,
        &["op=mixed", "expect=retry"],
        &env,
        |_| {
            std::thread::sleep(Duration::from_millis(1500));
            sh("ip -n xfla link set xflva down");
            std::thread::sleep(Duration::from_secs(8));
            sh("ip -n xfla link set xflva up");
        },
    );
    check(&pair, "link down 8 s, stream time-out 2 s", false);
}

#[test]
fn link_down_shorter_than_the_stream_timeout() {
    let _g = serial();
    let hosts = NetnsPair::new("xfb", 65);
    let env = [("XIW_STREAM_TIMEOUT_MS", "10000")];
    let opts = ["op=mixed", "expect=survive", "secs=6"];
    let pair = fault_pair(&hosts.a, &hosts.b, &opts, &env, |_| {
        std::thread::sleep(Duration::from_millis(1500));
        sh("ip -n xfba link set xfbva down");
        std::thread::sleep(Duration::from_millis(2000));
        sh("ip -n xfba link set xfbva up");
    });
    check(&pair, "link down 2 s, stream time-out 10 s", false);
}

/// Drops 1% of the TCP segments leaving each namespace at random (one
/// segment a packet: no segmentation offload on the veth link) and queues
/// what leaves each side behind a 200 Mbit/s token bucket.
fn lossy(tag: &str) {
    for side in ["a", "b"] {
        let (ns, dev) = (format!("{tag}{side}"), format!("{tag}v{side}"));
        let nft = |rule: &str| sh(&format!("ip netns exec {ns} nft {rule}"));
        nft("add table inet xiwloss");
        nft("add chain inet xiwloss out '{ type filter hook output priority 0 ; }'");
        nft("add rule inet xiwloss out meta l4proto tcp numgen random mod 100 lt 1 drop");
        sh(&format!(
            "ip -n {ns} link set {dev} down && ip -n {ns} link set {dev} gso_max_segs 1 && \
             ip -n {ns} link set {dev} up && \
             tc -n {ns} qdisc add dev {dev} root tbf rate 200mbit burst 64kb latency 20ms"
        ));
    }
}

#[test]
fn soak_and_bandwidth_through_loss_and_delay() {
    let _g = serial();
    let hosts = NetnsPair::new("xfs", 66);
    lossy("xfs");
    let p = port();
    let mut srv = hosts.a.cmd(BIN);
    srv.args(["soak", "--port", &p.to_string(), "--timeout", "170"]);
    let mut cli = hosts.b.cmd(BIN);
    cli.args(["soak", "--port", &p.to_string(), "--server", &hosts.a.addr]);
    cli.args([
        "--qps",
        "4",
        "--ops",
        "4000",
        "--seed",
        "21",
        "--timeout",
        "170",
    ]);
    let pair = run_pair(
        srv,
        hosts.a.netns.as_deref(),
        p,
        cli,
        Duration::from_secs(180),
    );
    assert!(
        pair.ok()
            && pair.client_out().contains("soak ok (client): ")
            && pair.server_out().contains("soak ok (server): "),
        "the soak through loss and delay failed:\n{}",
        pair.dump()
    );
    eprintln!(
        "soak through 1% loss and a 200 Mbit/s bucket:\n{}{}",
        pair.client_out(),
        pair.server_out()
    );
    let pair = run_tool_pair_env(
        "ib_write_bw",
        &hosts.a,
        &hosts.b,
        &["-s", "65536", "-n", "2000"],
        &[],
        Duration::from_secs(120),
    );
    assert!(
        pair.ok() && pair.client_out().contains("65536"),
        "ib_write_bw through loss and delay failed:\n{}",
        pair.dump()
    );
    eprintln!("ib_write_bw through 1% loss:\n{}", pair.client_out());
}
