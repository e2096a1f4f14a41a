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

use socket2::SockRef;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::context::Shared;
use crate::error::Error;
use crate::private_data::{parse_xiw, private_data, PD_FLAG_EXTENSIONS, PD_FLAG_IMM_PAIRS};
use crate::qp::core::{QpCore, MAX_RD_ATOMIC};
use crate::tcp::{canonical, read_frame, send_reject, socket_for, write_all, Request};
use crate::wire::mpa;
use xiw_engine::lifecycle::{Action, Lifecycle, Timings};
use xiw_engine::setup;
use xiw_engine::{recv, send};

/// What connection setup needs of the QP it works for: the QP itself, and
/// its data path, which takes the stream once MPA is done.
pub trait Link: std::ops::Deref<Target = QpCore> {
    /// The stream handed over has not yet carried the initiator's first FPDU.
    fn expects_rtr(&self) -> bool;
    /// Hands an established stream to both sides of the data path at once (a
    /// thread polling the CQ may read the peer's first FPDU the moment the
    /// receive side has it, and opens the transmit gate, which must not be
    /// closed again after it).
    fn attach_stream(&self, fd: RawFd, recv: recv::Params, send: send::Params);
    /// Takes the stream away from the data path, before the descriptor goes.
    fn detach_stream(&self);
    /// Transmits whatever can go.
    fn kick(&self);
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
///
/// The QP's [`Lifecycle`] lives here, under the same lock: the attempt's
/// deadline and retries, the linger, and how a failure ends the QP.
pub struct Cm {
    /// The connecting socket (initiator) or the answered stream (responder).
    sock: Option<OwnedFd>,
    phase: Phase,
    initiator: bool,
    /// The initiator's exchange, once its Request is sent.
    exchange: Option<setup::Initiator>,
    reader: setup::FrameReader,
    peer: Option<(IpAddr, u32)>,
    /// Requests addressed to this QP before it knew its peer, or while waiting.
    held: Vec<Held>,
    /// The stamp of the attempt this QP made (initiator) or answered (responder).
    stamp: u64,
    pub life: Lifecycle,
}

impl Cm {
    /// No connection yet; attempts take `timings`.
    pub fn new(timings: Timings) -> Cm {
        Cm {
            sock: None,
            phase: Phase::Idle,
            initiator: false,
            exchange: None,
            reader: setup::FrameReader::default(),
            peer: None,
            held: Vec::new(),
            stamp: 0,
            life: Lifecycle::new(timings),
        }
    }

    pub fn is_established(&self) -> bool {
        self.phase == Phase::Established
    }

    /// The responder's stream is up but the initiator's first FPDU has not come:
    /// the stream may still belong to an attempt that was abandoned.
    pub fn tentative(&self, qp: &impl Link) -> bool {
        self.phase == Phase::Established && !self.initiator && qp.expects_rtr()
    }

    /// RTR: start connecting to (or waiting for) the peer.
    pub fn start(&mut self, qp: &impl Link, peer_addr: IpAddr, peer_qpn: u32) -> Result<(), Error> {
        if self.phase != Phase::Idle && self.phase != Phase::AwaitRequest {
            return Ok(());
        }
        let sh = &qp.sh;
        let me = (sh.dev.addr, qp.qpn);
        if (peer_addr, peer_qpn) == me {
            return Err(Error::Connect("a QP cannot connect to itself".into()));
        }
        self.peer = Some((peer_addr, peer_qpn));
        timers(qp, self.life.connecting());
        self.initiator = me < (peer_addr, peer_qpn);
        if self.initiator {
            self.turn_away(qp, |_| true);
            self.connect(qp).map_err(|e| {
                // A failed RTR leaves nothing armed.
                self.life.start_failed();
                Error::Connect(format!("connect: {e}"))
            })
        } else {
            self.phase = Phase::AwaitRequest;
            self.answer_newest(qp)
        }
    }

    /// Connects to the peer (at RTR, and again when the lifecycle says so).
    pub fn connect(&mut self, qp: &QpCore) -> io::Result<()> {
        let (addr, qpn) = self.peer.expect("peer known");
        let sh = &qp.sh;
        let s = socket_for(addr)?;
        crate::tcp::bind_for_connect(&s, sh.dev.addr)?;
        match s.connect(&SocketAddr::new(addr, (qpn >> 8) as u16).into()) {
            Err(e) if e.raw_os_error() != Some(libc::EINPROGRESS) => return Err(e),
            _ => {}
        }
        let fd = OwnedFd::from(s);
        sh.reactor.watch_cm(fd.as_raw_fd(), qp.qpn, true, true)?;
        self.sock = Some(fd);
        self.phase = Phase::Connecting;
        Ok(())
    }

    /// The context accepted a connection whose MPA Request names this QP.
    pub fn adopt(&mut self, qp: &impl Link, fd: OwnedFd, req: Request) -> Result<(), Error> {
        crate::log::debug(
            &qp.sh.log,
            format_args!(
                "qp {}: incoming connection in phase {:?}, attempt ({}, {})",
                qp.qpn, self.phase, req.initiator_qpn, req.stamp
            ),
        );
        // A QP in error (Closed) may be about to go through RESET to RTR
        // again, for a new connection with the same peer: its Request is
        // held, as for a QP not at RTR yet, and answered if the QP gets
        // there (see `Cm::reset`); the initiator's connect deadline bounds
        // the wait.
        let open = match self.phase {
            Phase::Idle | Phase::AwaitRequest | Phase::Closed => true,
            Phase::Established => self.tentative(qp),
            Phase::Connecting | Phase::AwaitReply => false,
        };
        if !open {
            refuse(qp, fd);
            return Ok(());
        }
        if qp
            .sh
            .reactor
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
        if self.phase == Phase::Idle || self.phase == Phase::Closed {
            return Ok(());
        }
        self.answer_newest(qp)
    }

    /// Kernel mode: rdma_cm's connection, MPA done by the kernel module,
    /// becomes this QP's stream.
    pub fn adopt_kernel(
        &mut self,
        qp: &impl Link,
        fd: OwnedFd,
        initiator: bool,
        agreed: &setup::Agreed,
    ) {
        if let Some(old) = self.sock.take() {
            discard(&qp.sh, old);
        }
        // In the progress thread's set (establish then watches its data).
        if let Err(e) = qp.sh.reactor.watch_cm(fd.as_raw_fd(), qp.qpn, false, true) {
            crate::log::warn(
                &qp.sh.log,
                format_args!("qp {}: cannot watch rdma_cm's stream: {e}", qp.qpn),
            );
        }
        self.peer = SockRef::from(&fd)
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| (canonical(a.ip()), 0));
        self.sock = Some(fd);
        self.initiator = initiator;
        self.stamp = 0;
        self.establish(qp, initiator, agreed, 0);
    }

    /// The connection socket (or a held one) has an event before the QP is established.
    pub fn on_sock(&mut self, qp: &impl Link, writable: bool) -> Result<(), Error> {
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
                    self.life.refused();
                    self.phase = Phase::Idle;
                    return Ok(());
                }
                if err != 0 {
                    return Err(Error::Connect(format!(
                        "connect: {}",
                        io::Error::from_raw_os_error(err)
                    )));
                }
                self.send_request(qp)
                    .map_err(|e| Error::Connect(format!("sending MPA request: {e}")))?;
                qp.sh
                    .reactor
                    .watch_cm(fd, qp.qpn, false, false)
                    .map_err(|e| Error::Connect(e.to_string()))?;
                self.phase = Phase::AwaitReply;
                Ok(())
            }
            Phase::AwaitReply => match read_frame(self.sock_fd(), &mut self.reader) {
                Ok(Some(frame)) => self.on_reply(qp, &frame),
                Ok(None) => Ok(()),
                Err(e) => Err(Error::Connect(format!("reading MPA reply: {e}"))),
            },
            _ => Ok(()),
        }
    }

    /// Drops held connections whose initiator went away: it waits for the
    /// Reply, so anything readable is its close (or a protocol violation).
    fn forget_dead(&mut self, qp: &QpCore) {
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

    fn sock_fd(&self) -> RawFd {
        self.sock.as_ref().map(|s| s.as_raw_fd()).unwrap_or(-1)
    }

    fn drop_sock(&mut self, qp: &QpCore) {
        if let Some(s) = self.sock.take() {
            discard(&qp.sh, s);
        }
        self.reader = setup::FrameReader::default();
    }

    /// Turns away the held Requests `which` picks.
    fn turn_away(&mut self, qp: &QpCore, which: impl Fn(&Held) -> bool) {
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
    fn local(qp: &QpCore, to_qpn: u32, stamp: u64) -> setup::Local {
        let (ird, ord) = local_ird_ord(qp);
        let flags = if qp.sh.cfg.extensions {
            PD_FLAG_EXTENSIONS | PD_FLAG_IMM_PAIRS
        } else {
            0
        };
        let data = private_data(qp.qpn, to_qpn, flags, stamp);
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

    fn send_request(&mut self, qp: &QpCore) -> Result<(), Error> {
        let (_, peer_qpn) = self.peer.expect("peer known");
        self.stamp = qp.sh.next_stamp();
        let (exchange, request) = setup::Initiator::new(Self::local(qp, peer_qpn, self.stamp))
            .map_err(|e| Error::Connect(e.to_string()))?;
        self.exchange = Some(exchange);
        write_all(self.sock_fd(), &request).map_err(|e| Error::Connect(e.to_string()))
    }

    fn on_reply(&mut self, qp: &impl Link, frame: &[u8]) -> Result<(), Error> {
        let exchange = self
            .exchange
            .take()
            .ok_or_else(|| Error::Connect("an MPA reply before the request".into()))?;
        let agreed = exchange
            .reply(frame)
            .map_err(|e| Error::Connect(e.to_string()))?;
        let p = parse_xiw(&agreed.peer_data)
            .filter(|p| Some(p.from) == self.peer.map(|p| p.1) && p.to == qp.qpn)
            .ok_or_else(|| Error::Connect("the MPA reply is not from the expected QP".into()))?;
        if p.stamp != 0 && p.stamp != self.stamp {
            return Err(Error::Connect(
                "the MPA reply answers another connection attempt".into(),
            ));
        }
        self.establish(qp, true, &agreed, p.flags);
        Ok(())
    }

    /// Responder at RTR: turns away every held Request that is not from the
    /// peer, and answers the newest attempt of the peer (unless the stream
    /// answered already is newer), turning the older ones away.
    fn answer_newest(&mut self, qp: &impl Link) -> Result<(), Error> {
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
        write_all(self.sock_fd(), &reply)
            .map_err(|e| Error::Connect(format!("sending MPA reply: {e}")))?;
        let flags = parse_xiw(&agreed.peer_data).map_or(0, |p| p.flags);
        self.establish(qp, false, &agreed, flags);
        Ok(())
    }

    /// Drops a tentative stream and waits again for the peer (until the
    /// original deadline), answering at once if a newer attempt is held.
    fn withdraw(&mut self, qp: &impl Link) {
        qp.detach_stream();
        qp.rx_eof.store(false, Ordering::Release);
        self.drop_sock(qp);
        self.phase = Phase::AwaitRequest;
        timers(qp, self.life.withdrawn());
    }

    /// The tentative stream failed before the initiator's first FPDU: that
    /// attempt was abandoned (the lifecycle's [`Action::Reopen`]). Wait for
    /// (or answer) the next.
    pub fn reopen(&mut self, qp: &impl Link) -> Result<(), Error> {
        crate::log::debug(
            &qp.sh.log,
            format_args!(
                "qp {}: attempt {} ended before its first FPDU; waiting for the next",
                qp.qpn, self.stamp
            ),
        );
        self.withdraw(qp);
        self.forget_dead(qp);
        self.answer_newest(qp)
    }

    /// MPA is done: hand the stream to the data path.
    fn establish(
        &mut self,
        qp: &impl Link,
        initiator: bool,
        agreed: &setup::Agreed,
        peer_flags: u32,
    ) {
        let fd = self.sock_fd();
        if let Some(s) = &self.sock {
            let s = SockRef::from(s);
            let _ = s.set_tcp_nodelay(true);
            // How long sent bytes may go unacknowledged before the stream
            // fails (XIW_STREAM_TIMEOUT_MS; 0 keeps TCP's own retries).
            let t = qp.sh.cfg.stream_timeout;
            if !t.is_zero() {
                let _ = s.set_tcp_user_timeout(Some(t));
            }
        }
        let crc = agreed.crc;
        // The responder waits for the ready-to-receive message, if one was agreed.
        let await_rtr = !initiator && agreed.rtr != mpa::Rtr::None;
        {
            // Attributes first (as modify_qp takes them, before `tx`): a
            // concurrent move to RTS then sets ORD either before or after this.
            let attrs = qp.attrs.lock();
            qp.attach_stream(
                fd,
                recv::Params {
                    crc,
                    rtr: if initiator {
                        mpa::Rtr::None
                    } else {
                        agreed.rtr
                    },
                    access: attrs.qp_access_flags,
                    extensions: qp.sh.cfg.extensions,
                    merge_imm: qp.sh.cfg.extensions && peer_flags & PD_FLAG_IMM_PAIRS != 0,
                    inplace_min: qp.sh.cfg.inplace_min,
                },
                send::Params {
                    crc,
                    mulpdu: qp.sh.cfg.mulpdu,
                    gate: await_rtr,
                    rtr: initiator && agreed.rtr == mpa::Rtr::ZeroLengthWrite,
                    peer_ird: u32::from(agreed.peer_ird),
                    ord: ord_of(attrs.max_rd_atomic),
                    ird: u32::from(agreed.ird),
                    inplace_min: qp.sh.cfg.inplace_min,
                },
            );
        }
        self.phase = Phase::Established;
        // A responder keeps its deadline: should this attempt turn out to be an
        // abandoned one, it waits for the next until then.
        self.life.established(initiator);
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
        qp.watch_stream_new(fd);
        qp.kick();
    }

    /// Ends the stream: an established one gracefully (the context sends what
    /// is queued, then FIN, and keeps reading until the peer's FIN, see
    /// [`Listener::close_gracefully`](crate::context::listener::Listener::close_gracefully),
    /// so no byte already reported sent is lost to a reset); one still being
    /// set up, and every held one, with a reset, so the peer learns at once
    /// that this attempt is over. The caller has made sure the data path no
    /// longer uses the descriptor.
    pub fn close(&mut self, sh: &Shared) {
        if let Some(s) = self.sock.take() {
            if self.phase == Phase::Established {
                sh.reactor.unwatch(s.as_raw_fd());
                sh.listener.close_gracefully(s, &sh.reactor);
            } else {
                discard(sh, s);
            }
        }
        for h in self.held.drain(..) {
            discard(sh, h.sock);
        }
        self.phase = Phase::Closed;
        self.life.close();
    }

    /// Back to RESET: forget the stream and the peer (the listener and QPN stay).
    pub fn reset(&mut self, sh: &Shared) {
        // Requests held since the QP's stream closed are for its next
        // connection, not the one that ended: they stay.
        let later = if self.phase == Phase::Closed {
            std::mem::take(&mut self.held)
        } else {
            Vec::new()
        };
        self.close(sh);
        self.held = later;
        self.phase = Phase::Idle;
        self.peer = None;
        self.stamp = 0;
        self.exchange = None;
        self.reader = setup::FrameReader::default();
        self.life.reset();
    }
}

/// Carries out what the lifecycle asks of connection setup itself: only
/// ever to run the QP's timers.
fn timers(qp: &QpCore, acts: Vec<Action>) {
    for a in acts {
        debug_assert!(matches!(a, Action::Timer), "{a:?}");
        if let Action::Timer = a {
            qp.sh.reactor.add_timer(&qp.sh.qps, qp.qpn);
        }
    }
}

/// Turns a held connection away with the MPA reject, then drops it.
fn refuse(qp: &QpCore, sock: OwnedFd) {
    send_reject(sock.as_raw_fd());
    qp.sh.reactor.unwatch(sock.as_raw_fd());
}

/// Stops watching a stream and closes it with a reset (SO_LINGER 0): for
/// connections that never carried data, so nothing reported sent can be lost.
fn discard(sh: &Shared, sock: OwnedFd) {
    sh.reactor.unwatch(sock.as_raw_fd());
    let _ = SockRef::from(&sock).set_linger(Some(Duration::ZERO));
}

fn local_ird_ord(qp: &QpCore) -> (u32, u32) {
    let a = qp.attrs.lock();
    let ird = (a.max_dest_rd_atomic as u32).clamp(1, MAX_RD_ATOMIC);
    (ird, ord_of(a.max_rd_atomic))
}

/// The ORD a QP asks for: its `max_rd_atomic`, where 0 (never set) is the
/// most xiw allows. The connection may agree on less, down to 0.
pub fn ord_of(max_rd_atomic: u8) -> u32 {
    match max_rd_atomic {
        0 => MAX_RD_ATOMIC,
        n => u32::from(n),
    }
}
