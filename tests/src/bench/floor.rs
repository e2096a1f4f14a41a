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
//! Both ends print nothing but errors, except the client's one `RESULT` line.

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

    pub fn from_args(a: &[String]) -> Result<Spec, String> {
        let [mode, size, iters, warmup] = a else {
            return Err("expected MODE SIZE ITERS WARMUP".into());
        };
        let num = |s: &str| s.parse::<usize>().map_err(|e| format!("{s}: {e}"));
        Ok(Spec {
            mode: Mode::parse(mode).ok_or_else(|| format!("unknown mode {mode}"))?,
            size: num(size)?.max(1),
            iters: num(iters)?.max(1),
            warmup: num(warmup)?,
        })
    }
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

/// `floor-server PORT ...`: serves exactly one client, then exits.
pub fn server(port: u16, spec: Spec) -> io::Result<()> {
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
    let (mut s, _) = l.accept()?;
    drop(l);
    prepare(&s, spec)?;
    // A stream receiver is not bound to the sender's message size: it reads
    // as much as there is (up to 1 MiB), as xiw's receiver does.
    let rbuf = if spec.mode == Mode::Bw {
        spec.size.max(1 << 20)
    } else {
        spec.size
    };
    let mut buf = vec![0u8; rbuf];
    match spec.mode {
        Mode::LatSpin | Mode::LatBlock => {
            for _ in 0..spec.warmup + spec.iters {
                recv_exact(&mut s, &mut buf)?;
                send_all(&mut s, &buf)?;
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

/// `floor-client ADDR PORT ...`: prints one `RESULT key=value ...` line.
pub fn client(addr: &str, port: u16, spec: Spec) -> io::Result<String> {
    let mut s = connect(addr, port)?;
    prepare(&s, spec)?;
    let mut buf = vec![0x5au8; spec.size];
    match spec.mode {
        Mode::LatSpin | Mode::LatBlock => {
            let mut rtt = Vec::with_capacity(spec.iters);
            for i in 0..spec.warmup + spec.iters {
                let t0 = Instant::now();
                send_all(&mut s, &buf)?;
                recv_exact(&mut s, &mut buf)?;
                if i >= spec.warmup {
                    rtt.push(t0.elapsed().as_nanos() as f64 / 1000.0);
                }
            }
            rtt.sort_by(|a, b| a.total_cmp(b));
            let at = |q: f64| rtt[((rtt.len() as f64 - 1.0) * q).round() as usize];
            // One-way: half the round trip, as perftest reports write latency.
            Ok(format!(
                "RESULT typical_us={:.2} min_us={:.2} p99_us={:.2} rtt_typical_us={:.2}",
                rtt[rtt.len() / 2] / 2.0,
                rtt[0] / 2.0,
                at(0.99) / 2.0,
                rtt[rtt.len() / 2],
            ))
        }
        Mode::Bw => {
            let total = (spec.size as u64) * (spec.iters as u64);
            let t0 = Instant::now();
            for _ in 0..spec.iters {
                send_all(&mut s, &buf)?;
            }
            let mut ack = [0u8; 8];
            recv_exact(&mut s, &mut ack)?;
            let secs = t0.elapsed().as_secs_f64();
            if u64::from_le_bytes(ack) != total {
                return Err(io::Error::other(
                    "server counted a different number of bytes",
                ));
            }
            Ok(format!(
                "RESULT bw_mibs={:.2} secs={:.3} bytes={total}",
                total as f64 / secs / (1u64 << 20) as f64,
                secs
            ))
        }
    }
}
