//! Running a perftest pair against an xiw device and reading its numbers.

use std::process::Command;
use std::time::Duration;

use xiw_tests::harness::{self, Device};

/// What a perftest line reports.
#[derive(Clone, Copy, Debug)]
pub enum Column {
    /// Latency tools: t_typical [usec] (column 5).
    Typical,
    /// Latency tools: 99% percentile [usec] (column 8).
    P99,
    /// Bandwidth tools: BW average [MB/sec] (column 4).
    BwAverage,
}

/// One run of `tool -s size -n iters`.
#[derive(Clone, Debug)]
pub struct Run {
    pub tool: &'static str,
    pub size: usize,
    pub iters: usize,
    /// The first is the one that must be there.
    pub columns: &'static [Column],
}

/// The values measured (one per column), and a note when the pair did not
/// end cleanly.
pub struct Outcome {
    pub values: Vec<Option<f64>>,
    pub note: Option<String>,
}

impl Column {
    /// Where the column stands in a result line (0-based).
    fn index(self) -> usize {
        match self {
            Column::Typical => 4,
            Column::P99 => 7,
            Column::BwAverage => 3,
        }
    }
}

/// Every result line's size and number in `col`, in the order printed: the
/// table of a run over all sizes (`-a`), or of one size. Lines whose first
/// two tokens are not whole numbers (the size and the iteration count) are
/// not result lines; a result line without that column is skipped.
pub fn parse_table(out: &str, col: Column) -> Vec<(u64, f64)> {
    let idx = col.index();
    out.lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let size = t.first()?.parse::<u64>().ok()?;
            t.get(1)?.parse::<u64>().ok()?;
            Some((size, t.get(idx)?.parse::<f64>().ok()?))
        })
        .collect()
}

/// The number in `col` of the result line for `size` (first token `size`,
/// second the iteration count), as perftest prints it.
pub fn parse(out: &str, size: usize, col: Column) -> Option<f64> {
    let idx = col.index();
    let size = size.to_string();
    out.lines().find_map(|l| {
        let t: Vec<&str> = l.split_whitespace().collect();
        if t.len() > idx && t[0] == size && t[1].parse::<u64>().is_ok() {
            t[idx].parse().ok()
        } else {
            None
        }
    })
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// A pair that ran: both sides' output, and a note when it did not end
/// cleanly.
struct Ran {
    client: String,
    server: String,
    note: Option<String>,
}

/// Runs `tool -d xiw0 -p PORT -F ARGS` as server and client on `dev` with the
/// xiw knobs `env`; `what` names the run in a note, and `found` tells whether
/// the output has the result wanted (when not, the note has both sides' last
/// words).
#[allow(clippy::too_many_arguments)]
fn run_pair(
    dev: &Device,
    env: &[(String, String)],
    port: u16,
    tool: &str,
    args: &[String],
    timeout: Duration,
    what: &str,
    found: &dyn Fn(&str, &str) -> bool,
) -> Ran {
    // libibverbs' log, where xiw says why a QP failed: shown when a pair fails.
    let log = |side: &str| std::env::temp_dir().join(format!("xiw-bench-{port}-{side}.log"));
    let logs = [log("server"), log("client")];
    for l in &logs {
        let _ = std::fs::write(l, b"");
    }
    let mk = |client: bool| {
        let mut c: Command = dev.cmd(tool);
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c.env("VERBS_LOG_LEVEL", "4")
            .env("VERBS_LOG_FILE", &logs[client as usize]);
        c.args(["-d", "xiw0", "-p", &port.to_string(), "-F"]);
        c.args(args);
        if client {
            c.arg(&dev.addr);
        }
        c
    };
    let pair = harness::run_pair(mk(false), None, port, mk(true), timeout);
    let (client, server) = (pair.client_out(), pair.server_out());
    let note = if pair.ok() {
        None
    } else {
        let st = |o: &std::process::Output| match o.status.code() {
            Some(c) => format!("exit {c}"),
            None => "killed".to_string(),
        };
        let mut n = format!(
            "{what}: server {}, client {}{}",
            st(&pair.server),
            st(&pair.client),
            if pair.timed_out { " (timed out)" } else { "" }
        );
        if !found(&client, &server) {
            n.push_str(&format!(
                "\n    server stderr: {}\n    client stderr: {}",
                tail(&String::from_utf8_lossy(&pair.server.stderr), 3).replace('\n', "\n      "),
                tail(&String::from_utf8_lossy(&pair.client.stderr), 3).replace('\n', "\n      "),
            ));
        }
        for (side, l) in ["server", "client"].iter().zip(&logs) {
            let text = std::fs::read_to_string(l).unwrap_or_default();
            let errors: Vec<&str> = text.lines().filter(|l| l.contains("error")).collect();
            if !errors.is_empty() {
                n.push_str(&format!("\n    {side} log: {}", errors.join("\n      ")));
            }
        }
        Some(n)
    };
    for l in &logs {
        let _ = std::fs::remove_file(l);
    }
    Ran {
        client,
        server,
        note,
    }
}

/// Runs the pair on `dev` with the xiw knobs `env`, the server on `port`.
pub fn run(dev: &Device, env: &[(String, String)], port: u16, r: &Run) -> Outcome {
    let args = [
        "-s".to_string(),
        r.size.to_string(),
        "-n".into(),
        r.iters.to_string(),
    ];
    let what = format!("{} -s {}", r.tool, r.size);
    let (size, first) = (r.size, r.columns[0]);
    let found = |c: &str, s: &str| {
        parse(c, size, first)
            .or_else(|| parse(s, size, first))
            .is_some()
    };
    let ran = run_pair(
        dev,
        env,
        port,
        r.tool,
        &args,
        Duration::from_secs(120),
        &what,
        &found,
    );
    let values = r
        .columns
        .iter()
        .map(|&c| parse(&ran.client, r.size, c).or_else(|| parse(&ran.server, r.size, c)))
        .collect();
    Outcome {
        values,
        note: ran.note,
    }
}

/// A run over every size perftest knows (`-a`: 2 B to 8 MiB, powers of two).
pub struct Sweep {
    /// (size, value) per result line, in the order printed.
    pub points: Vec<(u64, f64)>,
    pub note: Option<String>,
}

/// Runs `tool -a -n iters EXTRA` (every size with `iters` iterations each)
/// and reads `col` of its table: the client's, else the server's.
pub fn run_all(
    dev: &Device,
    env: &[(String, String)],
    port: u16,
    tool: &str,
    iters: usize,
    col: Column,
    timeout: Duration,
) -> Sweep {
    let args = ["-a".to_string(), "-n".into(), iters.to_string()];
    let what = format!("{tool} -a -n {iters}");
    let found =
        |c: &str, s: &str| !parse_table(c, col).is_empty() || !parse_table(s, col).is_empty();
    let ran = run_pair(dev, env, port, tool, &args, timeout, &what, &found);
    let mut points = parse_table(&ran.client, col);
    if points.is_empty() {
        points = parse_table(&ran.server, col);
    }
    Sweep {
        points,
        note: ran.note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perftest_lines() {
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]\n 2       10000          10.45          9814.20      25.04    \t       150.00\n";
        assert_eq!(parse(lat, 2, Column::Typical), Some(25.04));
        let lat = " 2       10000          10.45          9814.20      25.04    \t       150.00      \t721.14 \t\t4001.10 \t\t7309.24\n";
        assert_eq!(parse(lat, 2, Column::P99), Some(4001.10));
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      5000             1234.56            1230.12\t\t   0.019682\n";
        assert_eq!(parse(bw, 65536, Column::BwAverage), Some(1230.12));
        assert_eq!(parse(bw, 2, Column::BwAverage), None);
    }

    /// A table as `ib_write_lat -a` and `ib_write_bw -a` print it (shortened):
    /// headers, dashes and the info block are no result lines.
    #[test]
    fn parses_all_sizes_tables() {
        let lat = "\
---------------------------------------------------------------------------------------
                    RDMA_Write Latency Test
 Dual-port       : OFF\t\tDevice         : xiw0
 Number of qps   : 1\t\tTransport type : IW
 Mtu             : 1024[B]
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       1000          4.10           22.35        4.48     \t       4.61        \t0.73   \t\t6.02    \t\t22.35  
 4       1000          4.12           19.02        4.50     \t       4.66        \t0.80   \t\t6.91    \t\t19.02  
 8388608 1000          2790.01        4112.90      2893.77  \t       2911.50     \t80.11  \t\t3301.45 \t\t4112.90
---------------------------------------------------------------------------------------
";
        assert_eq!(
            parse_table(lat, Column::Typical),
            vec![(2, 4.48), (4, 4.50), (8388608, 2893.77)]
        );
        assert_eq!(parse_table(lat, Column::P99)[2], (8388608, 3301.45));
        let bw = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 2          2000             1.23               1.20   \t\t   0.629145
 65536      2000             1801.11            1795.40\t\t   0.028726
---------------------------------------------------------------------------------------
";
        assert_eq!(
            parse_table(bw, Column::BwAverage),
            vec![(2, 1.20), (65536, 1795.40)]
        );
        // A result line cut short has no value for a later column.
        assert!(parse_table(" 2 1000 1.0 2.0\n", Column::Typical).is_empty());
        assert!(parse_table("", Column::BwAverage).is_empty());
    }
}
