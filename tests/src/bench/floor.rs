//! The floor: what plain TCP on the same loopback path does between two
//! processes, measured the way perftest measures xiw.
//!
//! - `lat-spin` / `lat-block`: ping-pong of `size`-byte messages, TCP_NODELAY;
//!   the client times each round trip and reports half the median (perftest's
//!   `t_typical` for ib_write_lat is the same: median round trip / 2). In
//!   `lat-spin` both ends spin on non-blocking `recv`; in `lat-block` both
//!   block in `recv`.
//! - `bw`: the client writes `iters` messages of `size` bytes (one `write`
//!   call each, TCP_NODELAY), the server reads them (reads of up to 1 MiB,
//!   whatever the message size) and answers with 8 bytes once it has them all; the client reports bytes
//!   over the time from its first write to that answer, in MiB/s (perftest's
//!   "MB/sec" is 2^20 bytes per second too).
//!
//! One pair may run a list of sizes on its one connection, in order (a
//! sweep): `SIZE` is then a comma-separated list, and `ITERS` and `WARMUP`
//! either one number for every size or a list as long (see [`plan_from_args`]).
//!
//! Both ends print nothing but errors, except the client's `RESULT` lines, one
//! per size, each ending in `size=BYTES`.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    LatSpin,
    LatBlock,
    Bw,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "lat-spin" => Some(Mode::LatSpin),
            "lat-block" => Some(Mode::LatBlock),
            "bw" => Some(Mode::Bw),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::LatSpin => "lat-spin",
            Mode::LatBlock => "lat-block",
            Mode::Bw => "bw",
        }
    }
}

/// What one floor run is told (the same on both ends).
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub mode: Mode,
    pub size: usize,
    pub iters: usize,
    pub warmup: usize,
}

impl Spec {
    /// The arguments after `floor-server PORT` / `floor-client ADDR PORT`.
    pub fn to_args(self) -> Vec<String> {
        vec![
            self.mode.name().into(),
            self.size.to_string(),
            self.iters.to_string(),
            self.warmup.to_string(),
        ]
    }
}

/// The arguments after `floor-server PORT` / `floor-client ADDR PORT` for a
/// run of every spec in `plan`, in order (all of one mode).
pub fn plan_to_args(plan: &[Spec]) -> Vec<String> {
    let list = |f: &dyn Fn(&Spec) -> usize| {
        plan.iter()
            .map(|s| f(s).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    vec![
        plan.first().map_or(Mode::LatSpin, |s| s.mode).name().into(),
        list(&|s| s.size),
        list(&|s| s.iters),
        list(&|s| s.warmup),
    ]
}

/// `MODE SIZE[,SIZE...] ITERS[,ITERS...] WARMUP[,WARMUP...]`: one spec per
/// size; a single ITERS or WARMUP holds for every size.
pub fn plan_from_args(a: &[String]) -> Result<Vec<Spec>, String> {
    let [mode, sizes, iters, warmup] = a else {
        return Err("expected MODE SIZE ITERS WARMUP".into());
    };
    let mode = Mode::parse(mode).ok_or_else(|| format!("unknown mode {mode}"))?;
    let nums = |s: &str| {
        s.split(',')
            .map(|v| v.parse::<usize>().map_err(|e| format!("{v}: {e}")))
            .collect::<Result<Vec<_>, _>>()
    };
    let sizes = nums(sizes)?;
    let n = sizes.len();
    let per_size = |v: Vec<usize>, what: &str| match v.len() {
        1 => Ok(vec![v[0]; n]),
        k if k == n => Ok(v),
        k => Err(format!("{k} {what} for {n} sizes")),
    };
    let iters = per_size(nums(iters)?, "iteration counts")?;
    let warmup = per_size(nums(warmup)?, "warm-up counts")?;
    Ok((0..n)
        .map(|i| Spec {
            mode,
            size: sizes[i].max(1),
            iters: iters[i].max(1),
            warmup: warmup[i],
        })
        .collect())
}

fn recv_exact(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn send_all(s: &mut TcpStream, buf: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    while sent < buf.len() {
        match s.write(&buf[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn prepare(s: &TcpStream, spec: Spec) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(spec.mode == Mode::LatSpin)
}

/// `floor-server PORT ...`: serves exactly one client (every spec of `plan`
/// in turn), then exits.
pub fn server(port: u16, plan: &[Spec]) -> io::Result<()> {
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
    let (mut s, _) = l.accept()?;
    drop(l);
    let Some(&first) = plan.first() else {
        return Ok(());
    };
    prepare(&s, first)?;
    // A stream receiver is not bound to the sender's message size: it reads
    // as much as there is (up to 1 MiB), as xiw's receiver does.
    let largest = plan.iter().map(|p| p.size).max().unwrap_or(1);
    let rbuf = if first.mode == Mode::Bw {
        largest.max(1 << 20)
    } else {
        largest
    };
    let mut buf = vec![0u8; rbuf];
    for &spec in plan {
        match spec.mode {
            Mode::LatSpin | Mode::LatBlock => {
                let msg = &mut buf[..spec.size];
                for _ in 0..spec.warmup + spec.iters {
                    recv_exact(&mut s, msg)?;
                    send_all(&mut s, msg)?;
                }
            }
            Mode::Bw => {
                let total = (spec.size as u64) * (spec.iters as u64);
                let mut got = 0u64;
                while got < total {
                    let want = (total - got).min(buf.len() as u64) as usize;
                    match s.read(&mut buf[..want]) {
                        Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Ok(n) => got += n as u64,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                send_all(&mut s, &got.to_le_bytes())?;
            }
        }
    }
    // Wait for the client to close first, so that the server's socket is not
    // the one left in TIME_WAIT on the port the next run may reuse.
    s.set_nonblocking(false)?;
    let _ = s.read(&mut buf[..1]);
    Ok(())
}

fn connect(addr: &str, port: u16) -> io::Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect((addr, port)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// `floor-client ADDR PORT ...`: one `RESULT key=value ...` line per spec of
/// `plan`, in order.
pub fn client(addr: &str, port: u16, plan: &[Spec]) -> io::Result<String> {
    let mut s = connect(addr, port)?;
    let Some(&first) = plan.first() else {
        return Ok(String::new());
    };
    prepare(&s, first)?;
    let largest = plan.iter().map(|p| p.size).max().unwrap_or(1);
    let mut buf = vec![0x5au8; largest];
    let mut lines = Vec::with_capacity(plan.len());
    for &spec in plan {
        lines.push(client_step(&mut s, &mut buf[..spec.size], spec)?);
    }
    Ok(lines.join("\n"))
}

fn client_step(s: &mut TcpStream, buf: &mut [u8], spec: Spec) -> io::Result<String> {
    match spec.mode {
        Mode::LatSpin | Mode::LatBlock => {
            let mut rtt = Vec::with_capacity(spec.iters);
            for i in 0..spec.warmup + spec.iters {
                let t0 = Instant::now();
                send_all(s, buf)?;
                recv_exact(s, buf)?;
                if i >= spec.warmup {
                    rtt.push(t0.elapsed().as_nanos() as f64 / 1000.0);
                }
            }
            rtt.sort_by(|a, b| a.total_cmp(b));
            let at = |q: f64| rtt[((rtt.len() as f64 - 1.0) * q).round() as usize];
            // One-way: half the round trip, as perftest reports write latency.
            Ok(format!(
                "RESULT typical_us={:.2} min_us={:.2} p99_us={:.2} rtt_typical_us={:.2} size={}",
                rtt[rtt.len() / 2] / 2.0,
                rtt[0] / 2.0,
                at(0.99) / 2.0,
                rtt[rtt.len() / 2],
                spec.size,
            ))
        }
        Mode::Bw => {
            let total = (spec.size as u64) * (spec.iters as u64);
            let t0 = Instant::now();
            for _ in 0..spec.iters {
                send_all(s, buf)?;
            }
            let mut ack = [0u8; 8];
            recv_exact(s, &mut ack)?;
            let secs = t0.elapsed().as_secs_f64();
            if u64::from_le_bytes(ack) != total {
                return Err(io::Error::other(
                    "server counted a different number of bytes",
                ));
            }
            Ok(format!(
                "RESULT bw_mibs={:.2} secs={:.3} bytes={total} size={}",
                total as f64 / secs / (1u64 << 20) as f64,
                secs,
                spec.size,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plans_one_size_or_many() {
        let one = plan_from_args(&args(&["lat-spin", "2", "1000", "100"])).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(
            (one[0].mode, one[0].size, one[0].iters),
            (Mode::LatSpin, 2, 1000)
        );
        let many = plan_from_args(&args(&["bw", "2,4,8", "10", "0,1,2"])).unwrap();
        let got: Vec<(usize, usize, usize)> =
            many.iter().map(|s| (s.size, s.iters, s.warmup)).collect();
        assert_eq!(got, [(2, 10, 0), (4, 10, 1), (8, 10, 2)]);
        assert_eq!(
            plan_to_args(&many),
            args(&["bw", "2,4,8", "10,10,10", "0,1,2"])
        );
        assert!(plan_from_args(&args(&["bw", "2,4,8", "10,20", "0"])).is_err());
        assert!(plan_from_args(&args(&["bw", "2,x", "10", "0"])).is_err());
        assert!(plan_from_args(&args(&["fast", "2", "10", "0"])).is_err());
    }
}
