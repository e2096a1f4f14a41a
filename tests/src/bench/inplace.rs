//! `xiw-bench --inplace`: large transfers with every payload copied through
//! the staging buffers (`XIW_INPLACE_MIN=0`) and with large payloads placed
//! and sent in place (the default), with and without MPA CRC, in one run on
//! the same device: perftest's bandwidth, and the CPU time each process
//! spent (user and system, from `getrusage` of the process: its
//! progress thread included) per GiB moved.
//!
//! Each perftest process runs under `xiw-bench cpu-of`, which waits for it
//! and prints its resource usage.

use std::process::{Command, ExitCode};
use std::time::Duration;

use xiw_tests::harness::{self, Device};

use crate::perftest::{self, Column};

/// `xiw-bench cpu-of PROGRAM ARGS...`: runs the program, then prints
/// `CPU user=<s> sys=<s>` for it and exits with its status.
pub fn cpu_of(args: &[String]) -> ExitCode {
    let Some((prog, rest)) = args.split_first() else {
        return ExitCode::from(2);
    };
    let status = match Command::new(prog).args(rest).status() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xiw-bench cpu-of {prog}: {e}");
            return ExitCode::from(2);
        }
    };
    // SAFETY: a zeroed rusage is valid; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_CHILDREN of this process: the one child, waited for.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    println!(
        "CPU user={:.3} sys={:.3}",
        secs(ru.ru_utime),
        secs(ru.ru_stime)
    );
    ExitCode::from(status.code().unwrap_or(1).clamp(0, 255) as u8)
}

fn cpu_line(out: &str) -> Option<(f64, f64)> {
    let l = out.lines().find(|l| l.starts_with("CPU "))?;
    let field = |k: &str| {
        l.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((field("user")?, field("sys")?))
}

/// What one pair measured.
pub struct Sample {
    /// perftest's BW average, MB/s.
    pub bw: f64,
    /// CPU seconds per GiB moved: (user, sys) of the server and of the client.
    pub server: (f64, f64),
    pub client: (f64, f64),
}

/// Runs `tool -s size -n iters` with both processes under `cpu-of`.
pub fn measure(
    dev: &Device,
    exe: &str,
    env: &[(&str, String)],
    tool: &str,
    size: usize,
    iters: usize,
) -> Result<Sample, String> {
    let port = harness::port();
    let mk = |client: bool| {
        let mut c = dev.cmd(exe);
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c.args(["cpu-of", tool, "-d", "xiw0", "-p", &port.to_string(), "-F"]);
        c.args(["-s", &size.to_string(), "-n", &iters.to_string()]);
        if client {
            c.arg(&dev.addr);
        }
        c
    };
    let pair = harness::run_pair(mk(false), None, port, mk(true), Duration::from_secs(180));
    let (so, co) = (pair.server_out(), pair.client_out());
    let bw = perftest::parse(&co, size, Column::BwAverage)
        .or_else(|| perftest::parse(&so, size, Column::BwAverage));
    let (Some(bw), Some(s), Some(c)) = (bw, cpu_line(&so), cpu_line(&co)) else {
        return Err(format!("{tool} -s {size}: no result\n{}", pair.dump()));
    };
    let gib = (size * iters) as f64 / (1u64 << 30) as f64;
    let per = |(u, s): (f64, f64)| (u / gib, s / gib);
    Ok(Sample {
        bw,
        server: per(s),
        client: per(c),
    })
}
