//! Connection setup in standalone mode: TCP plus the MPA exchange (RFC 5044
//! section 7, RFC 6581), driven by modify_qp.
//!
//! Each device context listens on TCP ports of the device address; a QP's number
//! is `port << 8 | index`, so the peer's GID and QPN (what perftest and
//! ibv_rc_pingpong exchange) name its endpoint. Of the two ends, the one with the
//! lower (address, QPN) connects and sends the MPA Request; the other's context
//! accepts, reads the Request, and hands the stream to the QP it names. Both
//! ends identify themselves in the private data, after the RFC 6581 IRD/ORD block.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::context::Shared;
use crate::qp::{Qp, MAX_RD_ATOMIC};
use crate::rx::Rx;
use crate::tx;
use crate::wire::mpa;
use xiw_engine::setup;

/// Marks xiw's own private data: "xiw1", sender QPN, receiver QPN.
const PD_MAGIC: &[u8; 4] = b"xiw1";
const PD_LEN: usize = 12;
/// Then, optionally, a word of flags (older xiw sent none: all clear).
const PD_FLAGS_LEN: usize = 4;
/// The sender speaks RFC 7306 and the commit draft.
const PD_FLAG_EXTENSIONS: u32 = 1 << 0;
/// The sender sends Send with Immediate as Immediate Data directly followed by
/// its Send, and Immediate Data alone only right after an RDMA Write.
const PD_FLAG_IMM_PAIRS: u32 = 1 << 1;
/// Then, optionally, the connection attempt's stamp (older xiw sent none: 0).
const PD_STAMP_LEN: usize = 8;

/// A listening socket on the device address; returns it and its port.
pub fn listen(addr: IpAddr) -> io::Result<(OwnedFd, u16)> {
    let fd = socket_for(addr)?;
    bind(fd.as_raw_fd(), SocketAddr::new(addr, 0))?;
    // Many QPs may connect at once (perftest -q, MPI): use the system's limit.
    // SAFETY: plain syscall on a socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), libc::SOMAXCONN) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let port = local_addr(fd.as_raw_fd())?.port();
    Ok((fd, port))
}

/// Accepts one connection, non-blocking.
pub fn accept(listener: RawFd) -> Option<OwnedFd> {
    // SAFETY: accept4 on a listening socket; no address wanted.
    let fd = unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    // SAFETY: accept4 returned a new descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The QPN an MPA Request is addressed to, from xiw's private data.
pub fn request_target(frame: &[u8]) -> Option<u32> {
    let req = setup::Request::parse(frame).ok()?;
    parse_xiw(&req.data).map(|p| p.to)
}

/// A Request xiw can take: well formed, with xiw's private data.
fn parse_request(frame: &[u8]) -> Option<Request> {
    let mpa = setup::Request::parse(frame).ok()?;
    let p = parse_xiw(&mpa.data)?;
    Some(Request {
        initiator_qpn: p.from,
        stamp: p.stamp,
        mpa,
    })
}

/// Turns a connection away with an MPA Reply carrying the Reject bit.
pub fn send_reject(fd: RawFd) {
    let _ = write_all(fd, &setup::reject(mpa::REVISION_2, &[]));
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Idle,
    Connecting,
    AwaitReply,
    AwaitRequest,
    Established,
    Closed,
}

/// At most this many Requests wait for a QP's RTR; the oldest is turned away.
const MAX_HELD: usize = 8;

/// An MPA Request as xiw reads it.
struct Request {
    mpa: setup::Request,
    initiator_qpn: u32,
    /// Which connection attempt of the initiator (0: a peer that sends none).
    stamp: u64,
}

/// A connection whose Request named this QP, not answered yet.
struct Held {
    sock: OwnedFd,
    req: Request,
    from: Option<IpAddr>,
}

/// One QP's connection setup. A connection belongs to one attempt of one QP,
/// not to a QP number (numbers are reused at once): every Request carries the
/// initiator's attempt stamp, which grows with every attempt on the host, and
/// the Reply echoes it. A responder answers only at RTR, the newest Request
/// from the peer it was given, and stays ready to drop that stream for a newer
/// attempt of the same peer until the initiator's first FPDU arrives (see
/// [`Cm::tentative`]): a Request sent by a QP that was destroyed before its
/// connection came up can then never take the place of its successor's.
pub struct Cm {
    /// The connecting socket (initiator) or the answered stream (responder).
    sock: Option<OwnedFd>,
    phase: Phase,
    initiator: bool,
    /// The initiator's exchange, once its Request is sent.
    exchange: Option<setup::Initiator>,
    reader: setup::FrameReader,
    pub deadline: Option<Instant>,
    retry_at: Option<Instant>,
    peer: Option<(IpAddr, u32)>,
    /// Requests addressed to this QP before it knew its peer, or while waiting.
    held: Vec<Held>,
    /// The stamp of the attempt this QP made (initiator) or answered (responder).
    stamp: u64,
    /// The peer closed its end: the QP fails at this time.
    linger_until: Option<Instant>,
}

impl Default for Cm {
    fn default() -> Cm {
        Cm {
            sock: None,
            phase: Phase::Idle,
            initiator: false,
            exchange: None,
            reader: setup::FrameReader::default(),
            deadline: None,
            retry_at: None,
            peer: None,
            held: Vec::new(),
            stamp: 0,
            linger_until: None,
        }
    }
}

impl Cm {
    pub fn is_established(&self) -> bool {
        self.phase == Phase::Established
    }

    /// The responder's stream is up but the initiator's first FPDU has not come:
    /// the stream may still belong to an attempt that was abandoned.
    pub fn tentative(&self, qp: &Qp) -> bool {
        self.phase == Phase::Established && !self.initiator && qp.lock_rx().expect_rtr
    }

    /// RTR: start connecting to (or waiting for) the peer.
    pub fn start(&mut self, qp: &Qp, peer_addr: IpAddr, peer_qpn: u32) -> Result<(), String> {
        if self.phase != Phase::Idle && self.phase != Phase::AwaitRequest {
            return Ok(());
        }
        let sh = &qp.sh;
        let me = (sh.dev.addr, qp.qpn);
        if (peer_addr, peer_qpn) == me {
            return Err("a QP cannot connect to itself".into());
        }
        self.peer = Some((peer_addr, peer_qpn));
        self.deadline = Some(Instant::now() + sh.cfg.connect_timeout);
        sh.add_timer(qp);
        self.initiator = me < (peer_addr, peer_qpn);
        if self.initiator {
            self.turn_away(qp, |_| true);
            self.connect(qp).map_err(|e| {
                // A failed RTR leaves nothing armed.
                self.deadline = None;
                format!("connect: {e}")
            })
        } else {
            self.phase = Phase::AwaitRequest;
            self.answer_newest(qp)
        }
    }

    fn connect(&mut self, qp: &Qp) -> io::Result<()> {
        let (addr, qpn) = self.peer.expect("peer known");
        let sh = &qp.sh;
        let fd = socket_for(addr)?;
        bind(fd.as_raw_fd(), SocketAddr::new(sh.dev.addr, 0))?;
        let sa = SocketAddr::new(addr, (qpn >> 8) as u16);
        let (storage, len) = sockaddr(sa);
        // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                &storage as *const _ as *const libc::sockaddr,
                len,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(e);
            }
        }
        sh.watch_cm(fd.as_raw_fd(), qp.qpn, true, true)?;
        self.sock = Some(fd);
        self.phase = Phase::Connecting;
        Ok(())
    }

    /// The context accepted a connection whose MPA Request names this QP.
    pub fn adopt(&mut self, qp: &Qp, fd: OwnedFd, frame: &[u8]) -> Result<(), String> {
        let req = parse_request(frame);
        crate::log::debug(
            &qp.sh.log,
            format_args!(
                "qp {}: incoming connection in phase {:?}, attempt {:?}",
                qp.qpn,
                self.phase,
                req.as_ref().map(|r| (r.initiator_qpn, r.stamp))
            ),
        );
        let open = match self.phase {
            Phase::Idle | Phase::AwaitRequest => true,
            Phase::Established => self.tentative(qp),
            _ => false,
        };
        let Some(req) = req.filter(|_| open) else {
            send_reject(fd.as_raw_fd());
            return Ok(());
        };
        if qp
            .sh
            .watch_cm(fd.as_raw_fd(), qp.qpn, false, false)
            .is_err()
        {
            return Ok(());
        }
        if self.held.len() >= MAX_HELD {
            let oldest = (0..self.held.len())
                .min_by_key(|&i| self.held[i].req.stamp)
                .expect("held is full");
            let h = self.held.swap_remove(oldest);
            refuse(qp, h.sock);
        }
        let from = peer_addr_of(fd.as_raw_fd()).map(|a| canonical(a.ip()));
        self.held.push(Held {
            sock: fd,
            req,
            from,
        });
        if self.phase == Phase::Idle {
            return Ok(());
        }
        self.answer_newest(qp)
    }

    /// The connection socket (or a held one) has an event before the QP is established.
    pub fn on_sock(&mut self, qp: &Qp, writable: bool) -> Result<(), String> {
        self.forget_dead(qp);
        match self.phase {
            Phase::Connecting if writable => {
                let fd = self.sock_fd();
                let err = get_int(fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(libc::EIO);
                if err == libc::ECONNREFUSED || err == libc::ECONNRESET {
                    // The peer may not be listening yet (or is between attempts): retry.
                    self.drop_sock(qp);
                    self.retry_at = Some(Instant::now() + Duration::from_millis(20));
                    self.phase = Phase::Idle;
                    return Ok(());
                }
                if err != 0 {
                    return Err(format!("connect: {}", io::Error::from_raw_os_error(err)));
                }
                self.send_request(qp)
                    .map_err(|e| format!("sending MPA request: {e}"))?;
                qp.sh
                    .watch_cm(fd, qp.qpn, false, false)
                    .map_err(|e| e.to_string())?;
                self.phase = Phase::AwaitReply;
                Ok(())
            }
            Phase::AwaitReply => match read_frame(self.sock_fd(), &mut self.reader) {
                Ok(Some(frame)) => self.on_reply(qp, &frame),
                Ok(None) => Ok(()),
                Err(e) => Err(format!("reading MPA reply: {e}")),
            },
            _ => Ok(()),
        }
    }

    /// Drops held connections whose initiator went away: it waits for the
    /// Reply, so anything readable is its close (or a protocol violation).
    fn forget_dead(&mut self, qp: &Qp) {
        let mut i = 0;
        while i < self.held.len() {
            let fd = self.held[i].sock.as_raw_fd();
            let mut b = [0u8; 1];
            // SAFETY: a one-byte peek into a live buffer on a socket we own.
            let n = unsafe {
                libc::recv(
                    fd,
                    b.as_mut_ptr() as *mut libc::c_void,
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            let alive = n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
            if alive {
                i += 1;
                continue;
            }
            let h = self.held.swap_remove(i);
            crate::log::debug(
                &qp.sh.log,
                format_args!(
                    "qp {}: initiator QP {} (attempt {}) went away before the reply",
                    qp.qpn, h.req.initiator_qpn, h.req.stamp
                ),
            );
            qp.sh.unwatch(fd);
            abort_stream(h.sock);
        }
    }

    /// Timers: connect retries and the overall deadline.
    pub fn tick(&mut self, qp: &Qp, now: Instant) -> Result<bool, String> {
        if let Some(t) = self.linger_until {
            if now >= t {
                self.linger_until = None;
                return Err("the peer closed the connection".into());
            }
            return Ok(true);
        }
        if self.phase == Phase::Established || self.phase == Phase::Closed {
            return Ok(false);
        }
        if let Some(d) = self.deadline {
            if now >= d {
                return Err(format!(
                    "no connection with the peer within {} ms",
                    qp.sh.cfg.connect_timeout.as_millis()
                ));
            }
        }
        if let Some(t) = self.retry_at {
            if now >= t {
                self.retry_at = None;
                self.connect(qp).map_err(|e| format!("connect: {e}"))?;
            }
        }
        Ok(self.deadline.is_some())
    }

    fn sock_fd(&self) -> RawFd {
        self.sock.as_ref().map(|s| s.as_raw_fd()).unwrap_or(-1)
    }

    fn drop_sock(&mut self, qp: &Qp) {
        if let Some(s) = self.sock.take() {
            qp.sh.unwatch(s.as_raw_fd());
            abort_stream(s);
        }
        self.reader = setup::FrameReader::default();
    }

    /// Turns away the held Requests `which` picks.
    fn turn_away(&mut self, qp: &Qp, which: impl Fn(&Held) -> bool) {
        let (gone, keep): (Vec<Held>, Vec<Held>) =
            std::mem::take(&mut self.held).into_iter().partition(which);
        self.held = keep;
        for h in gone {
            crate::log::debug(
                &qp.sh.log,
                format_args!(
                    "qp {}: refusing a connection from {:?} QP {} (attempt {})",
                    qp.qpn, h.from, h.req.initiator_qpn, h.req.stamp
                ),
            );
            refuse(qp, h.sock);
        }
    }

    /// What this QP brings to the MPA exchange: CRC as configured, its IRD
    /// and ORD, a zero-length Write as the ready-to-receive message, and xiw's
    /// private data naming both QPs and the attempt.
    fn local(qp: &Qp, to_qpn: u32, stamp: u64) -> setup::Local {
        let (ird, ord) = local_ird_ord(qp);
        let mut data = vec![0u8; PD_LEN + PD_FLAGS_LEN + PD_STAMP_LEN];
        data[0..4].copy_from_slice(PD_MAGIC);
        data[4..8].copy_from_slice(&qp.qpn.to_be_bytes());
        data[8..12].copy_from_slice(&to_qpn.to_be_bytes());
        let flags = if qp.sh.cfg.extensions {
            PD_FLAG_EXTENSIONS | PD_FLAG_IMM_PAIRS
        } else {
            0
        };
        data[12..16].copy_from_slice(&flags.to_be_bytes());
        data[16..24].copy_from_slice(&stamp.to_be_bytes());
        setup::Local {
            crc: qp.sh.cfg.crc,
            ird: ird as u16,
            ord: ord as u16,
            rtr: mpa::RtrSet {
                write: true,
                ..Default::default()
            },
            data,
        }
    }

    fn send_request(&mut self, qp: &Qp) -> Result<(), String> {
        let (_, peer_qpn) = self.peer.expect("peer known");
        self.stamp = qp.sh.next_stamp();
        let (exchange, request) = setup::Initiator::new(Self::local(qp, peer_qpn, self.stamp))
            .map_err(|e| e.to_string())?;
        self.exchange = Some(exchange);
        write_all(self.sock_fd(), &request).map_err(|e| e.to_string())
    }

    fn on_reply(&mut self, qp: &Qp, frame: &[u8]) -> Result<(), String> {
        let mut exchange = self
            .exchange
            .take()
            .ok_or("an MPA reply before the request")?;
        let agreed = match exchange.handle(frame) {
            Ok((_, Some(a))) => a,
            Ok((_, None)) => return Err("a partial MPA reply".into()),
            Err(e) => return Err(e.to_string()),
        };
        let p = parse_xiw(&agreed.peer_data)
            .filter(|p| Some(p.from) == self.peer.map(|p| p.1) && p.to == qp.qpn)
            .ok_or("the MPA reply is not from the expected QP")?;
        if p.stamp != 0 && p.stamp != self.stamp {
            return Err("the MPA reply answers another connection attempt".into());
        }
        self.establish(qp, true, &agreed, p.flags);
        Ok(())
    }

    /// Responder at RTR: turns away every held Request that is not from the
    /// peer, and answers the newest attempt of the peer (unless the stream
    /// answered already is newer), turning the older ones away.
    fn answer_newest(&mut self, qp: &Qp) -> Result<(), String> {
        let (peer_addr, peer_qpn) = self.peer.expect("peer known at RTR");
        let peer_addr = canonical(peer_addr);
        self.turn_away(qp, |h| {
            h.req.initiator_qpn != peer_qpn || h.from != Some(peer_addr)
        });
        let Some(newest) = (0..self.held.len()).max_by_key(|&i| self.held[i].req.stamp) else {
            return Ok(());
        };
        let floor = if self.phase == Phase::Established {
            self.stamp
        } else {
            0
        };
        let h = self.held.swap_remove(newest);
        self.turn_away(qp, |_| true);
        if self.phase == Phase::Established {
            if h.req.stamp <= floor {
                refuse(qp, h.sock);
                return Ok(());
            }
            crate::log::debug(
                &qp.sh.log,
                format_args!(
                    "qp {}: attempt {} of QP {peer_qpn} replaces attempt {}",
                    qp.qpn, h.req.stamp, self.stamp
                ),
            );
            self.withdraw(qp);
        }
        let req = h.req;
        let (reply, agreed) = match setup::accept(&req.mpa, &Self::local(qp, peer_qpn, req.stamp)) {
            Ok(v) => v,
            Err(e) => {
                crate::log::debug(
                    &qp.sh.log,
                    format_args!("qp {}: refusing QP {peer_qpn}: {e}", qp.qpn),
                );
                refuse(qp, h.sock);
                return Ok(());
            }
        };
        self.sock = Some(h.sock);
        self.stamp = req.stamp;
        write_all(self.sock_fd(), &reply).map_err(|e| format!("sending MPA reply: {e}"))?;
        let flags = parse_xiw(&agreed.peer_data).map_or(0, |p| p.flags);
        self.establish(qp, false, &agreed, flags);
        Ok(())
    }

    /// Drops a tentative stream and waits again for the peer (until the
    /// original deadline), answering at once if a newer attempt is held.
    fn withdraw(&mut self, qp: &Qp) {
        qp.detach_stream();
        qp.rx_eof.store(false, Ordering::Release);
        self.drop_sock(qp);
        self.phase = Phase::AwaitRequest;
        self.linger_until = None;
        qp.sh.add_timer(qp);
    }

    /// The tentative stream failed before the initiator's first FPDU: that
    /// attempt was abandoned. Wait for (or answer) the next; true if so, false
    /// if the stream was not tentative (the caller fails the QP).
    pub fn reopen(&mut self, qp: &Qp) -> Result<bool, String> {
        if !self.tentative(qp) {
            return Ok(false);
        }
        crate::log::debug(
            &qp.sh.log,
            format_args!(
                "qp {}: attempt {} ended before its first FPDU; waiting for the next",
                qp.qpn, self.stamp
            ),
        );
        self.withdraw(qp);
        self.forget_dead(qp);
        self.answer_newest(qp).map(|()| true)
    }

    /// MPA is done: hand the stream to the data path.
    fn establish(&mut self, qp: &Qp, initiator: bool, agreed: &setup::Agreed, peer_flags: u32) {
        let fd = self.sock_fd();
        let _ = set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
        let crc = agreed.crc;
        // The responder waits for the ready-to-receive message, if one was agreed.
        let await_rtr = !initiator && agreed.rtr != mpa::Rtr::None;
        {
            // Attributes first (as modify_qp takes them, before `tx`): a
            // concurrent move to RTS then sets ORD either before or after this.
            let attrs = qp.attrs.lock().unwrap_or_else(|e| e.into_inner());
            // Both sides at once: a thread polling the CQ may read the peer's
            // first FPDU the moment `rx` has the stream, and opens the transmit
            // gate, which must not be closed again after it.
            let mut rx = qp.lock_rx();
            let mut t = qp.lock_tx();
            let cur = rx.cur.take();
            *rx = Rx::established(fd, crc, await_rtr, attrs.qp_access_flags);
            rx.cur = cur;
            rx.extensions = qp.sh.cfg.extensions;
            rx.merge_imm = qp.sh.cfg.extensions && peer_flags & PD_FLAG_IMM_PAIRS != 0;
            t.fd = Some(fd);
            t.crc = crc;
            t.mulpdu = qp.sh.cfg.mulpdu;
            t.gate = await_rtr;
            t.rtr = initiator && agreed.rtr == mpa::Rtr::ZeroLengthWrite;
            t.peer_ird = u32::from(agreed.peer_ird).max(1);
            t.ord_max = t.peer_ird.min((attrs.max_rd_atomic as u32).max(1));
            t.ird_max = u32::from(agreed.ird).max(1);
        }
        self.phase = Phase::Established;
        // A responder keeps its deadline: should this attempt turn out to be an
        // abandoned one, it waits for the next until then.
        if initiator {
            self.deadline = None;
        }
        crate::log::debug(
            &qp.sh.log,
            format_args!(
                "qp {}: connected to {:?} ({}, attempt {}, CRC {})",
                qp.qpn,
                self.peer,
                if initiator { "initiator" } else { "responder" },
                self.stamp,
                if crc { "on" } else { "off" }
            ),
        );
        let _ = qp.sh.watch_data_new(fd, qp.qpn);
        tx::kick(qp);
    }

    /// The peer closed in order: fail the QP after `XIW_LINGER_MS`. False if
    /// the stream was not up, so the caller fails the QP now.
    pub fn linger(&mut self, qp: &Qp) -> bool {
        if self.phase != Phase::Established {
            return false;
        }
        if self.linger_until.is_none() {
            self.linger_until = Some(Instant::now() + qp.sh.cfg.linger);
            qp.sh.add_timer(qp);
        }
        true
    }

    /// Ends the stream: an established one gracefully (the context sends what
    /// is queued, then FIN, and keeps reading until the peer's FIN, see
    /// [`Shared::close_gracefully`], so no byte already reported sent is lost to
    /// a reset); one still being set up, and every held one, with a reset, so
    /// the peer learns at once that this attempt is over. The caller has made
    /// sure the data path no longer uses the descriptor.
    pub fn close(&mut self, sh: &Shared) {
        if let Some(s) = self.sock.take() {
            sh.unwatch(s.as_raw_fd());
            if self.phase == Phase::Established {
                sh.close_gracefully(s);
            } else {
                abort_stream(s);
            }
        }
        for h in self.held.drain(..) {
            sh.unwatch(h.sock.as_raw_fd());
            abort_stream(h.sock);
        }
        self.phase = Phase::Closed;
        self.retry_at = None;
        self.linger_until = None;
        self.deadline = None;
    }

    /// Back to RESET: forget the stream and the peer (the listener and QPN stay).
    pub fn reset(&mut self, sh: &Shared) {
        self.close(sh);
        self.phase = Phase::Idle;
        self.peer = None;
        self.stamp = 0;
        self.exchange = None;
        self.reader = setup::FrameReader::default();
    }
}

/// Turns a held connection away with the MPA reject, then drops it.
fn refuse(qp: &Qp, sock: OwnedFd) {
    send_reject(sock.as_raw_fd());
    qp.sh.unwatch(sock.as_raw_fd());
}

/// Closes a stream with a reset (SO_LINGER 0): for connections that never
/// carried data, so nothing reported sent can be lost.
fn abort_stream(sock: OwnedFd) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt with a pointer to a live struct linger of the given size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    drop(sock);
}

/// Reads exactly one MPA Request/Reply frame; `None` until it is complete.
/// Nothing behind the frame is read: it belongs to the data path.
pub fn read_frame(fd: RawFd, reader: &mut setup::FrameReader) -> io::Result<Option<Vec<u8>>> {
    let mut chunk = [0u8; mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA];
    loop {
        let want = reader
            .missing()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // SAFETY: receiving at most `want` (<= the chunk's size) bytes into a live buffer.
        let n = unsafe {
            libc::recv(
                fd,
                chunk.as_mut_ptr() as *mut libc::c_void,
                want.min(chunk.len()),
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "peer closed during MPA setup",
            ));
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(None);
            }
            return Err(e);
        }
        let (_, frame) = reader
            .feed(&chunk[..n as usize])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if frame.is_some() {
            return Ok(frame);
        }
    }
}

fn local_ird_ord(qp: &Qp) -> (u32, u32) {
    let a = qp.attrs.lock().unwrap_or_else(|e| e.into_inner());
    let ird = (a.max_dest_rd_atomic as u32).clamp(1, MAX_RD_ATOMIC);
    let ord = if a.max_rd_atomic == 0 {
        MAX_RD_ATOMIC
    } else {
        a.max_rd_atomic as u32
    };
    (ird, ord)
}

/// What xiw's private data says.
#[derive(Clone, Copy, Debug)]
struct Private {
    from: u32,
    to: u32,
    flags: u32,
    stamp: u64,
}

/// xiw's own private data (after the RFC 6581 block): magic, sender and
/// receiver QPN, then optionally flags and the attempt stamp.
fn parse_xiw(data: &[u8]) -> Option<Private> {
    if data.len() < PD_LEN || &data[..4] != PD_MAGIC {
        return None;
    }
    let word = |at: usize| {
        data.get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
    };
    let at = PD_LEN + PD_FLAGS_LEN;
    let stamp = data
        .get(at..at + PD_STAMP_LEN)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
        .unwrap_or(0);
    Some(Private {
        from: word(4)?,
        to: word(8)?,
        flags: word(PD_LEN).unwrap_or(0),
        stamp,
    })
}

fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(a),
        v4 => v4,
    }
}

fn socket_for(addr: IpAddr) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr(sa: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match sa {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut st as *mut _ as *mut libc::sockaddr_in, sin) };
            (
                st,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut st as *mut _ as *mut libc::sockaddr_in6, sin6) };
            (
                st,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

fn from_storage(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match st.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(st as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::new(
                IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(st as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::new(
                IpAddr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

fn bind(fd: RawFd, sa: SocketAddr) -> io::Result<()> {
    let (st, len) = sockaddr(sa);
    // SAFETY: `st` holds a valid sockaddr of `len` bytes.
    if unsafe { libc::bind(fd, &st as *const _ as *const libc::sockaddr, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: zeroed storage is valid; getsockname writes at most `len` bytes.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: as above.
    if unsafe { libc::getsockname(fd, &mut st as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    from_storage(&st).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

fn peer_addr_of(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: zeroed storage is valid; getpeername writes at most `len` bytes.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: as above.
    if unsafe { libc::getpeername(fd, &mut st as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return None;
    }
    from_storage(&st)
}

fn set_int(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to a live int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn get_int(fd: RawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: getsockopt into a live int of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut i32 as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Writes a small control frame on a fresh connection, waiting briefly if needed.
fn write_all(fd: RawFd, mut data: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !data.is_empty() {
        // SAFETY: sending from a live slice on our socket.
        let n = unsafe {
            libc::send(
                fd,
                data.as_ptr() as *const libc::c_void,
                data.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            data = &data[n as usize..];
            continue;
        }
        let e = io::Error::last_os_error();
        if n < 0 && e.raw_os_error() == Some(libc::EAGAIN) && Instant::now() < deadline {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 10) };
            continue;
        }
        return Err(e);
    }
    Ok(())
}
