//! The context's own connections, outside any QP: the listening ports, whose
//! numbers the QP numbers carry; accepted connections until their MPA
//! Request names a QP; and streams being closed gracefully.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::reactor::Reactor;
use super::registry::Registry;

/// How long a closing stream waits for the peer's FIN.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an accepted connection may take to send its MPA Request.
const PENDING_TIMEOUT: Duration = Duration::from_secs(10);

/// One listening port and the (up to 256) QP numbers it carries.
struct PortSlot {
    fd: OwnedFd,
    port: u16,
    used: [u64; 4],
    count: u32,
}

struct Pending {
    fd: OwnedFd,
    reader: xiw_engine::setup::FrameReader,
    since: Instant,
}

pub struct Listener {
    /// The address the listening sockets are bound to.
    addr: IpAddr,
    ports: Mutex<Vec<PortSlot>>,
    pending: Mutex<HashMap<u64, Pending>>,
    /// The id of the next accepted or closing connection.
    next_id: AtomicU64,
    closing: Mutex<HashMap<u64, (OwnedFd, Instant)>>,
    /// Bytes discarded from closing streams (to tell a quiet peer from a busy one).
    drained: AtomicU64,
}

impl Listener {
    pub(super) fn new(addr: IpAddr) -> Listener {
        Listener {
            addr,
            ports: Mutex::new(Vec::new()),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closing: Mutex::new(HashMap::new()),
            drained: AtomicU64::new(0),
        }
    }

    /// A free QP number: `port << 8 | index` on one of this context's
    /// listeners (a new one, watched by `reactor`, when all are full).
    pub fn alloc_qpn(&self, reactor: &Reactor) -> io::Result<u32> {
        let mut ports = self.ports.lock();
        // As many QPs as the device reports (max_qp), and no more.
        if ports.iter().map(|s| s.count).sum::<u32>() >= xiw_abi::limits::MAX_QP {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        if let Some(slot) = ports.iter_mut().find(|s| s.count < 256) {
            let i = (0..256)
                .find(|&i| slot.used[i / 64] & (1 << (i % 64)) == 0)
                .expect("a free index");
            slot.used[i / 64] |= 1 << (i % 64);
            slot.count += 1;
            return Ok((slot.port as u32) << 8 | i as u32);
        }
        let (fd, port) = crate::tcp::listen(self.addr)?;
        reactor.watch_listener(&fd, port)?;
        ports.push(PortSlot {
            fd,
            port,
            used: [1, 0, 0, 0],
            count: 1,
        });
        Ok((port as u32) << 8)
    }

    /// Gives QP number `qpn` back; its port's listener closes with its last
    /// number.
    pub fn free_qpn(&self, qpn: u32, reactor: &Reactor) {
        let mut ports = self.ports.lock();
        let Some(k) = ports.iter().position(|s| s.port as u32 == qpn >> 8) else {
            return;
        };
        let i = (qpn & 0xff) as usize;
        let slot = &mut ports[k];
        if slot.used[i / 64] & (1 << (i % 64)) != 0 {
            slot.used[i / 64] &= !(1 << (i % 64));
            slot.count -= 1;
        }
        if slot.count == 0 {
            reactor.unwatch(slot.fd.as_raw_fd());
            ports.swap_remove(k);
        }
    }

    /// A listener is readable: accept, and wait for each connection's MPA Request.
    pub(super) fn on_listen(&self, port: u16, reactor: &Reactor) {
        // Accepted under the lock: the listener cannot be closed (its port's
        // last QP freed) and its descriptor reused meanwhile.
        let accepted: Vec<OwnedFd> = {
            let ports = self.ports.lock();
            match ports.iter().find(|s| s.port == port) {
                Some(s) => std::iter::from_fn(|| crate::tcp::accept(&s.fd)).collect(),
                None => return,
            }
        };
        for conn in accepted {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if reactor.watch_pending(&conn, id).is_ok() {
                let p = Pending {
                    fd: conn,
                    reader: Default::default(),
                    since: Instant::now(),
                };
                self.pending.lock().insert(id, p);
            }
        }
    }

    /// An accepted connection is readable: once its MPA Request is complete,
    /// hand it to the QP of `qps` it names, or turn it away.
    pub(super) fn on_pending(&self, id: u64, reactor: &Reactor, qps: &Registry) {
        let mut p = match self.pending.lock().remove(&id) {
            Some(p) => p,
            None => return,
        };
        let frame = match crate::tcp::read_frame(p.fd.as_raw_fd(), &mut p.reader) {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.pending.lock().insert(id, p);
                return;
            }
            Err(_) => {
                reactor.unwatch(p.fd.as_raw_fd());
                return;
            }
        };
        let req = crate::tcp::parse_request(&frame);
        match req.and_then(|r| Some((qps.get(r.target)?, r))) {
            Some((qp, req)) => qp.adopt(p.fd, req),
            None => {
                crate::tcp::send_reject(p.fd.as_raw_fd());
                reactor.unwatch(p.fd.as_raw_fd());
            }
        }
    }

    /// Sends FIN after what is queued, then reads and discards until the peer's
    /// FIN before closing: a socket closed with unread bytes is reset by the
    /// kernel, which would drop data this side already reported as sent.
    pub fn close_gracefully(&self, fd: OwnedFd, reactor: &Reactor) {
        let _ = rustix::net::shutdown(&fd, rustix::net::Shutdown::Write);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if reactor.watch_closing(&fd, id).is_ok() {
            self.closing.lock().insert(id, (fd, Instant::now()));
            reactor.wake();
        }
    }

    /// At `ibv_close_device`: lets streams that are still closing take in what
    /// their peer has in flight before the sockets go, until each peer's FIN,
    /// a quiet spell or a bound. Closing a socket with bytes arriving resets the
    /// connection, and the peer's send that was under way fails; an RNIC keeps
    /// acknowledging until its QPs are gone (perftest and the pingpong tools
    /// close while the peer's last, unawaited sends are still arriving).
    pub fn settle_closing(&self) {
        const QUIET: Duration = Duration::from_millis(50);
        const BOUND: Duration = Duration::from_millis(500);
        let start = Instant::now();
        let mut seen = self.drained.load(Ordering::Relaxed);
        let mut quiet_since = start;
        loop {
            if self.closing.lock().is_empty() {
                return;
            }
            let now = self.drained.load(Ordering::Relaxed);
            if now != seen {
                seen = now;
                quiet_since = Instant::now();
            }
            if quiet_since.elapsed() >= QUIET || start.elapsed() >= BOUND {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A closing stream is readable: discard, and close on the peer's FIN.
    pub(super) fn on_closing(&self, id: u64, reactor: &Reactor) {
        let mut closing = self.closing.lock();
        let Some((fd, _)) = closing.get(&id) else {
            return;
        };
        let mut sink = [0u8; 16384];
        let done = loop {
            // SAFETY: reading into a local buffer from our own socket.
            let n = unsafe {
                crate::sys::recv_raw(
                    fd.as_raw_fd(),
                    sink.as_mut_ptr(),
                    sink.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                self.drained.fetch_add(n as u64, Ordering::Relaxed);
                continue;
            }
            break n == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN);
        };
        if done {
            if let Some((fd, _)) = closing.remove(&id) {
                reactor.unwatch(fd.as_raw_fd());
            }
        }
    }

    /// Drops accepted connections that never sent a Request, and closing
    /// streams whose peer never sent its FIN; true if any remain.
    pub(super) fn expire(&self, reactor: &Reactor) -> bool {
        let mut pending = self.pending.lock();
        pending.retain(|_, p| {
            let keep = p.since.elapsed() < PENDING_TIMEOUT;
            if !keep {
                reactor.unwatch(p.fd.as_raw_fd());
            }
            keep
        });
        let mut closing = self.closing.lock();
        closing.retain(|_, (fd, since)| {
            let keep = since.elapsed() < CLOSE_TIMEOUT;
            if !keep {
                reactor.unwatch(fd.as_raw_fd());
            }
            keep
        });
        !pending.is_empty() || !closing.is_empty()
    }
}
