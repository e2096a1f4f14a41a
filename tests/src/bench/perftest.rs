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

/// The number in `col` of the result line for `size` (first token `size`,
/// second the iteration count), as perftest prints it.
pub fn parse(out: &str, size: usize, col: Column) -> Option<f64> {
    let idx = match col {
        Column::Typical => 4,
        Column::P99 => 7,
        Column::BwAverage => 3,
    };
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

/// Runs the pair on `dev` with the xiw knobs `env`, the server on `port`.
pub fn run(dev: &Device, env: &[(String, String)], port: u16, r: &Run) -> Outcome {
    // libibverbs' log, where xiw says why a QP failed: shown when a pair fails.
    let log = |side: &str| std::env::temp_dir().join(format!("xiw-bench-{port}-{side}.log"));
    let logs = [log("server"), log("client")];
    for l in &logs {
        let _ = std::fs::write(l, b"");
    }
    let mk = |client: bool| {
        let mut c: Command = dev.cmd(r.tool);
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c.env("VERBS_LOG_LEVEL", "4")
            .env("VERBS_LOG_FILE", &logs[client as usize]);
        c.args(["-d", "xiw0", "-p", &port.to_string(), "-F"]);
        c.args(["-s", &r.size.to_string(), "-n", &r.iters.to_string()]);
        if client {
            c.arg(&dev.addr);
        }
        c
    };
    let pair = harness::run_pair(mk(false), None, port, mk(true), Duration::from_secs(120));
    let values: Vec<Option<f64>> = r
        .columns
        .iter()
        .map(|&c| {
            parse(&pair.client_out(), r.size, c).or_else(|| parse(&pair.server_out(), r.size, c))
        })
        .collect();
    let value = values[0];
    let note = if pair.ok() {
        None
    } else {
        let st = |o: &std::process::Output| match o.status.code() {
            Some(c) => format!("exit {c}"),
            None => "killed".to_string(),
        };
        let mut n = format!(
            "{} -s {}: server {}, client {}{}",
            r.tool,
            r.size,
            st(&pair.server),
            st(&pair.client),
            if pair.timed_out { " (timed out)" } else { "" }
        );
        if value.is_none() {
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
    Outcome { values, note }
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
}
