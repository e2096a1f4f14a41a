//! Scale: `tests/c/xiw_scale.c`, a C program on the real libibverbs, run as a
//! server/client pair of processes on the shared `lo` device. They exchange
//! their GID and QP numbers over a plain TCP socket and connect in standalone
//! mode (RESET -> INIT -> RTR -> RTS).
//!
//! - `ten_thousand_qps`: 10,000 RC QPs on each side (4 send and 4 receive
//!   requests of one SGE each, one send CQ and one receive CQ shared by all),
//!   QP i of one connected to QP i of the other; one Send each way over every
//!   QP, each receive checked for its QP and its bytes, every Send for its
//!   success. Each QP's stream is a TCP socket, so each process needs more
//!   than 10,000 descriptors: the program raises RLIMIT_NOFILE itself (soft to
//!   hard, and the hard limit too when it is lower and the process may, as
//!   root can). Prints connect time, resident memory per QP and descriptors
//!   used. `XIW_SCALE_QPS` picks another count.
//! - `flood_of_sends_without_receives`: one QP pair; the receiver posts no or
//!   only a few receives and the sender posts 100,000 Sends as fast as its
//!   send queue takes them. The first Send without a receive ends the stream
//!   with a Terminate (RFC 5040): both QPs go to error, the sender's requests
//!   complete (successfully those TCP took before the Terminate came back,
//!   then in error) and neither process's memory grows with the flood.
//!
//! By hand (after `pkg/install.sh`; as root, or with a hard RLIMIT_NOFILE
//! above the QP count, e.g. under `prlimit --nofile=65536`):
//!
//! ```text
//! gcc -O2 -pthread -o xiw_scale tests/c/xiw_scale.c -libverbs
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! ./xiw_scale scale server 18600 10000 & ./xiw_scale scale client 127.0.0.1 18600 10000
//! ./xiw_scale flood server 18601 8 & ./xiw_scale flood client 127.0.0.1 18601 100000 1024
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use xiw_tests::cprog::program;
use xiw_tests::harness::{lo_device, log_files, port, run_pair, serial, Pair};

/// The `key=value` fields of the line of `out` that starts with `prefix`.
fn fields(out: &str, prefix: &str) -> Option<HashMap<String, String>> {
    let line = out.lines().find(|l| l.starts_with(prefix))?;
    Some(
        line[prefix.len()..]
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// Field `key` of `f` as a number; panics with `ctx` if it is missing.
fn num(f: &HashMap<String, String>, key: &str, ctx: &str) -> f64 {
    f.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number `{key}` in the result line:\n{ctx}"))
}

/// What a log of thousands of QPs says, short: every kind of line (numbers
/// taken out) with its count, and the first lines that are not about a
/// connection coming up.
fn summarise_log(path: &PathBuf) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let routine = |l: &str| {
        l.contains("connected to")
            || l.contains("incoming connection in phase")
            || l.contains("the peer's first FPDU came")
    };
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for l in text.lines() {
        let k: String = l
            .split_whitespace()
            .map(|w| {
                if w.chars().any(|c| c.is_ascii_digit()) {
                    "N"
                } else {
                    w
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        *kinds.entry(k).or_default() += 1;
    }
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    let mut s = format!("{} ({} lines):\n", path.display(), text.lines().count());
    for (k, n) in kinds.iter().take(15) {
        s.push_str(&format!("  {n:>6}  {k}\n"));
    }
    for l in text.lines().filter(|l| !routine(l)).take(20) {
        s.push_str(&format!("  | {l}\n"));
    }
    s
}

/// Runs `xiw_scale scale` with `n` QPs on each side of a pair.
fn scale_pair(n: u32, depth: u32) -> (Pair, (PathBuf, PathBuf)) {
    let dev = lo_device();
    let bin = program("xiw_scale");
    let bin = bin.to_str().unwrap();
    let p = port();
    let (sl, cl) = log_files("xiw_scale", p);
    let mut srv = dev.cmd(bin);
    srv.args(["scale", "server", &p.to_string()]);
    let mut cli = dev.cmd(bin);
    cli.args(["scale", "client", &dev.addr, &p.to_string()]);
    for (c, log) in [(&mut srv, &sl), (&mut cli, &cl)] {
        c.args([n.to_string(), depth.to_string()]);
        c.env("VERBS_LOG_LEVEL", "4").env("VERBS_LOG_FILE", log);
    }
    let pair = run_pair(srv, None, p, cli, Duration::from_secs(110));
    (pair, (sl, cl))
}

#[test]
fn ten_thousand_qps() {
    let _g = serial();
    let n: u32 = std::env::var("XIW_SCALE_QPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let depth = 4;
    let t0 = Instant::now();
    let (pair, (sl, cl)) = scale_pair(n, depth);
    let wall = t0.elapsed();
    let report = || {
        format!(
            "{}\n--- server log summary: {}--- client log summary: {}",
            pair.dump(),
            summarise_log(&sl),
            summarise_log(&cl)
        )
    };
    assert!(
        pair.ok(),
        "xiw_scale scale with {n} QPs failed:\n{}",
        report()
    );
    for (side, out) in [("server", pair.server_out()), ("client", pair.client_out())] {
        let prefix = format!("scale ok ({side}): ");
        let f = fields(&out, &prefix)
            .unwrap_or_else(|| panic!("the {side} printed no `{prefix}...`:\n{}", report()));
        let ctx = out.trim();
        assert_eq!(num(&f, "qps", ctx), f64::from(n), "{ctx}");
        assert_eq!(num(&f, "depth", ctx), f64::from(depth), "{ctx}");
        // Every QP has its own stream: at least one descriptor each, and not
        // many more (a listener carries 256 QP numbers).
        let fds = num(&f, "fds_after", ctx) - num(&f, "fds_before", ctx);
        assert!(
            fds >= f64::from(n) && fds <= f64::from(n) * 1.1 + 16.0,
            "{side}: {fds} descriptors for {n} QPs: {ctx}"
        );
        // Resident memory per connected idle QP (about 15 KiB today): a
        // regression that made it grow tenfold fails here.
        let per_qp = num(&f, "idle_bytes_per_qp", ctx);
        assert!(
            per_qp > 0.0 && per_qp < 160.0 * 1024.0,
            "{side}: {per_qp} bytes per idle QP: {ctx}"
        );
        assert!(num(&f, "connect_ms", ctx) > 0.0, "{ctx}");
    }
    eprintln!(
        "{n} QPs ({depth} send and receive requests each), {:.1} s in all:\n{}\n{}",
        wall.as_secs_f64(),
        pair.server_out().trim(),
        pair.client_out().trim()
    );
    let _ = std::fs::remove_file(sl);
    let _ = std::fs::remove_file(cl);
}

/// One flood: the receiver posts `recvs` receives, the sender `sends` Sends of
/// `size` bytes; checks what happened and that neither side's resident memory
/// grew by `bound_kb` or more (the flood itself is `sends * size` bytes).
fn flood(recvs: u32, sends: u64, size: u32, bound_kb: f64) {
    let dev = lo_device();
    let bin = program("xiw_scale");
    let bin = bin.to_str().unwrap();
    let p = port();
    let (sl, cl) = log_files("xiw_scale_flood", p);
    let mut srv = dev.cmd(bin);
    srv.args(["flood", "server", &p.to_string(), &recvs.to_string()]);
    let mut cli = dev.cmd(bin);
    cli.args(["flood", "client", &dev.addr, &p.to_string()])
        .args([sends.to_string(), size.to_string(), "30".to_string()]);
    for (c, log) in [(&mut srv, &sl), (&mut cli, &cl)] {
        c.env("VERBS_LOG_LEVEL", "4").env("VERBS_LOG_FILE", log);
    }
    let mut pair = run_pair(srv, None, p, cli, Duration::from_secs(60));
    pair.logs = Some((sl.clone(), cl.clone()));
    let what = format!("flood: {recvs} receives, {sends} Sends of {size} B");
    assert!(pair.ok(), "{what} failed:\n{}", pair.dump());
    let (so, co) = (pair.server_out(), pair.client_out());
    let r = fields(&so, "flood ok (receiver): ")
        .unwrap_or_else(|| panic!("{what}: no receiver line:\n{}", pair.dump()));
    let s = fields(&co, "flood ok (sender): ")
        .unwrap_or_else(|| panic!("{what}: no sender line:\n{}", pair.dump()));
    let ctx = format!("{what}:\n{}\n{}", so.trim(), co.trim());

    // The receiver: every receive it posted took a Send (checked byte for
    // byte by the program), then the Send with none ended its QP, which
    // raised IBV_EVENT_QP_FATAL.
    assert_eq!(num(&r, "recvs_ok", &ctx), f64::from(recvs), "{ctx}");
    assert_eq!(r["qp_state"], "ERR", "{ctx}");
    assert!(
        r["events"].contains("catastrophic"),
        "receiver: no IBV_EVENT_QP_FATAL: {ctx}"
    );
    // The sender: all posted, each completed once (the program checks the
    // order and that no success follows an error); at least the Sends that
    // were received succeeded, then the Terminate put the QP in error and
    // everything after completed in error.
    let (ok, flushed, other) = (
        num(&s, "ok", &ctx),
        num(&s, "flushed", &ctx),
        num(&s, "other_err", &ctx),
    );
    assert_eq!(num(&s, "posted", &ctx), sends as f64, "{ctx}");
    assert_eq!(ok + flushed + other, sends as f64, "{ctx}");
    assert!(ok >= f64::from(recvs) && ok < sends as f64, "{ctx}");
    assert!(flushed > 0.0 && other <= 1.0, "{ctx}");
    assert!(
        ["Work_Request_Flushed_Error", "RNR_retry_counter_exceeded"]
            .contains(&s["first_err_status"].as_str()),
        "{ctx}"
    );
    assert_eq!(s["qp_state"], "ERR", "{ctx}");
    assert!(
        s["events"].contains("catastrophic"),
        "sender: no IBV_EVENT_QP_FATAL: {ctx}"
    );
    // Bounded memory on both sides.
    for (side, f) in [("receiver", &r), ("sender", &s)] {
        let peak = num(f, "rss_peak_growth_kb", &ctx);
        assert!(
            peak < bound_kb,
            "{side}: resident memory grew by {peak} kB during the flood (bound {bound_kb} kB): {ctx}"
        );
    }
    let log = |p: &PathBuf| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        text.lines()
            .map(|l| format!("\n    {l}"))
            .collect::<String>()
    };
    eprintln!(
        "{ctx}\n  Sends that completed successfully at the sender but found no receive: {}\n  receiver log:{}\n  sender log:{}",
        ok - f64::from(recvs),
        log(&sl),
        log(&cl)
    );
}

#[test]
fn flood_of_sends_without_receives() {
    let _g = serial();
    // A few receives, then 100,000 Sends of 1 KiB (100 MB if kept).
    flood(8, 100_000, 1024, 32.0 * 1024.0);
    // No receive at all.
    flood(0, 100_000, 1024, 32.0 * 1024.0);
    // 64 KiB Sends (1.3 GB if kept): the sender stages what its 128-deep
    // send queue holds, about 8.5 MiB.
    flood(8, 20_000, 65536, 64.0 * 1024.0);
}

/// As many QPs as `max_qp` says, and then ENOMEM.
#[test]
fn the_qp_count_stops_at_max_qp() {
    let _g = serial();
    xiw_tests::cprog::run("xiw_scale", &["limit"], Duration::from_secs(120));
}
