//! RFC 7306 atomics through unmodified perftest: `ib_atomic_lat` (round trip
//! of one 8-byte FetchAdd or CmpSwap at a time) and `ib_atomic_bw` (many in
//! flight). perftest fixes the size of an atomic at 8 bytes and prints the
//! same columns as for reads: t_typical is a full round trip, not halved.

use std::process::Command;
use std::time::Duration;

use xiw_tests::harness::{self, Device};

use super::perftest::{self, Column, Outcome};

/// The operand size perftest uses for every atomic.
pub const SIZE: usize = 8;

/// The operation perftest's `-A` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    FetchAdd,
    CmpSwap,
}

impl Op {
    fn arg(self) -> &'static str {
        match self {
            Op::FetchAdd => "FETCH_AND_ADD",
            Op::CmpSwap => "CMP_AND_SWAP",
        }
    }
}

/// One run of `ib_atomic_lat` or `ib_atomic_bw -A op -n iters`.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// `ib_atomic_bw` if true, else `ib_atomic_lat`.
    pub bw: bool,
    pub op: Op,
    pub iters: usize,
}

impl Run {
    pub fn tool(&self) -> &'static str {
        if self.bw {
            "ib_atomic_bw"
        } else {
            "ib_atomic_lat"
        }
    }

    pub fn describe(&self) -> String {
        format!("{} -A {} -n {}", self.tool(), self.op.arg(), self.iters)
    }
}

/// MsgRate [Mpps] of a bandwidth tool's result line for `size` (column 5),
/// which [`perftest::parse`] does not name.
pub fn msg_rate(out: &str, size: usize) -> Option<f64> {
    let size = size.to_string();
    out.lines().find_map(|l| {
        let t: Vec<&str> = l.split_whitespace().collect();
        if t.len() > 4 && t[0] == size && t[1].parse::<u64>().is_ok() {
            t[4].parse().ok()
        } else {
            None
        }
    })
}

/// Runs the pair on `dev` with the xiw knobs `env`, the server on `port`.
/// Values: latency `[t_typical, p99]` [us]; bandwidth `[BW average [MB/s],
/// MsgRate [Mops/s]]`.
pub fn run(dev: &Device, env: &[(String, String)], port: u16, r: &Run) -> Outcome {
    let mk = |client: bool| {
        let mut c: Command = dev.cmd(r.tool());
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c.args(["-d", "xiw0", "-p", &port.to_string(), "-F"]);
        c.args(["-A", r.op.arg(), "-n", &r.iters.to_string()]);
        if client {
            c.arg(&dev.addr);
        }
        c
    };
    let pair = harness::run_pair(mk(false), None, port, mk(true), Duration::from_secs(120));
    let (cout, sout) = (pair.client_out(), pair.server_out());
    let either = |f: &dyn Fn(&str) -> Option<f64>| f(&cout).or_else(|| f(&sout));
    let values = if r.bw {
        vec![
            either(&|o| perftest::parse(o, SIZE, Column::BwAverage)),
            either(&|o| msg_rate(o, SIZE)),
        ]
    } else {
        vec![
            either(&|o| perftest::parse(o, SIZE, Column::Typical)),
            either(&|o| perftest::parse(o, SIZE, Column::P99)),
        ]
    };
    let note = (!pair.ok()).then(|| {
        let st = |o: &std::process::Output| {
            o.status
                .code()
                .map_or("killed".to_string(), |c| format!("exit {c}"))
        };
        let mut n = format!(
            "{}: server {}, client {}{}",
            r.describe(),
            st(&pair.server),
            st(&pair.client),
            if pair.timed_out { " (timed out)" } else { "" }
        );
        if values[0].is_none() {
            let tail = |b: &[u8]| {
                let s = String::from_utf8_lossy(b);
                let v: Vec<&str> = s.lines().collect();
                v[v.len().saturating_sub(3)..].join("\n      ")
            };
            n.push_str(&format!(
                "\n    server stderr: {}\n    client stderr: {}",
                tail(&pair.server.stderr),
                tail(&pair.client.stderr)
            ));
        }
        n
    });
    Outcome { values, note }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_atomic_lines() {
        // As perftest 4.5 prints them for ib_atomic_lat and ib_atomic_bw.
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 8       2000          8.42           153.24       29.75    \t       33.02       \t9.03   \t\t67.79   \t\t115.92 \n";
        assert_eq!(perftest::parse(lat, SIZE, Column::Typical), Some(29.75));
        assert_eq!(perftest::parse(lat, SIZE, Column::P99), Some(67.79));
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 8          20000            1.97               1.29   \t\t   0.168516\n";
        assert_eq!(perftest::parse(bw, SIZE, Column::BwAverage), Some(1.29));
        assert_eq!(msg_rate(bw, SIZE), Some(0.168516));
        assert_eq!(msg_rate(bw, 16), None);
    }
}
