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
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::context::Shared;
use crate::qp::{Qp, MAX_RD_ATOMIC};
use crate::tx;
use crate::wire::mpa;
use xiw_engine::setup;
use xiw_engine::{recv, send};

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
    let s = socket_for(addr)?;
    s.bind(&SocketAddr::new(addr, 0).into())?;
    // Many QPs may connect at once (perftest -q, MPI): use the system's limit.
    s.listen(libc::SOMAXCONN)?;
    let port = s
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?
        .port();
    Ok((s.into(), port))
}

/// Accepts one connection, non-blocking.
pub fn accept(listener: &OwnedFd) -> Option<OwnedFd> {
    let (s, _) = SockRef::from(listener).accept().ok()?;
    s.set_nonblocking(true).ok()?;
    Some(s.into())
}

/// A Request xiw can take: well formed, with xiw's private data naming the
/// QP it is for (`target`).
pub fn parse_request(frame: &[u8]) -> Option<Request> {
    let mpa = setup::Request::parse(frame).ok()?;
    let p = parse_xiw(&mpa.data)?;
    Some(Request {
        target: p.to,
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
pub struct Request {
    pub target: u32,
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
        self.phase == Phase::Established && !self.initiator && qp.lock_rx().expects_rtr()
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
        let s = socket_for(addr)?;
        s.bind(&SocketAddr::new(sh.dev.addr, 0).into())?;
        match s.connect(&SocketAddr::new(addr, (qpn >> 8) as u16).into()) {
            Err(e) if e.raw_os_error() != Some(libc::EINPROGRESS) => return Err(e),
            _ => {}
        }
        let fd = OwnedFd::from(s);
        sh.watch_cm(fd.as_raw_fd(), qp.qpn, true, true)?;
        self.sock = Some(fd);
        self.phase = Phase::Connecting;
        Ok(())
    }

    /// The context accepted a connection whose MPA Request names this QP.
    pub fn adopt(&mut self, qp: &Qp, fd: OwnedFd, req: Request) -> Result<(), String> {
        crate::log::debug(
            &qp.sh.log,
            format_args!(
                "qp {}: incoming connection in phase {:?}, attempt ({}, {})",
                qp.qpn, self.phase, req.initiator_qpn, req.stamp
            ),
        );
        let open = match self.phase {
            Phase::Idle | Phase::AwaitRequest => true,
            Phase::Established => self.tentative(qp),
            _ => false,
        };
        if !open {
            refuse(qp, fd);
            return Ok(());
        }
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
        let from = SockRef::from(&fd)
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| canonical(a.ip()));
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
                let err = match self.sock.as_ref().map(|s| SockRef::from(s).take_error()) {
                    Some(Ok(None)) => 0,
                    Some(Ok(Some(e))) | Some(Err(e)) => e.raw_os_error().unwrap_or(libc::EIO),
                    None => libc::EIO,
                };
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
            let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 1];
            let peek = SockRef::from(&self.held[i].sock)
                .recv_with_flags(&mut b, libc::MSG_PEEK | libc::MSG_DONTWAIT);
            let alive = matches!(peek, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
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
            discard(&qp.sh, h.sock);
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
            discard(&qp.sh, s);
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
        let exchange = self
            .exchange
            .take()
            .ok_or("an MPA reply before the request")?;
        let agreed = exchange.reply(frame).map_err(|e| e.to_string())?;
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
        let h = self.held.swap_remove(newest);
        self.turn_away(qp, |_| true);
        if self.phase == Phase::Established {
            // Tentative: only a newer attempt replaces the one answered.
            if h.req.stamp <= self.stamp {
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
        if let Some(s) = &self.sock {
            let _ = SockRef::from(s).set_tcp_nodelay(true);
        }
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
            rx.establish(
                fd,
                recv::Params {
                    crc,
                    expect_rtr: await_rtr,
                    access: attrs.qp_access_flags,
                    extensions: qp.sh.cfg.extensions,
                    merge_imm: qp.sh.cfg.extensions && peer_flags & PD_FLAG_IMM_PAIRS != 0,
                },
            );
            t.fd = Some(fd);
            t.engine.establish(send::Params {
                crc,
                mulpdu: qp.sh.cfg.mulpdu,
                gate: await_rtr,
                rtr: initiator && agreed.rtr == mpa::Rtr::ZeroLengthWrite,
                peer_ird: u32::from(agreed.peer_ird),
                ord: attrs.max_rd_atomic as u32,
                ird: u32::from(agreed.ird),
            });
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
            if self.phase == Phase::Established {
                sh.unwatch(s.as_raw_fd());
                sh.close_gracefully(s);
            } else {
                discard(sh, s);
            }
        }
        for h in self.held.drain(..) {
            discard(sh, h.sock);
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

/// Stops watching a stream and closes it with a reset (SO_LINGER 0): for
/// connections that never carried data, so nothing reported sent can be lost.
fn discard(sh: &Shared, sock: OwnedFd) {
    sh.unwatch(sock.as_raw_fd());
    let _ = SockRef::from(&sock).set_linger(Some(Duration::ZERO));
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

/// A non-blocking TCP socket for `addr`'s family (close-on-exec, as socket2 makes every socket).
fn socket_for(addr: IpAddr) -> io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(SocketAddr::new(addr, 0)),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.set_nonblocking(true)?;
    Ok(s)
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
