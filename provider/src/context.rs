//! Per-device-context state shared by the verbs and the progress thread.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

use xiw_abi::verbs::*;

use xiw_engine::queue1::Inbound;

use crate::kernel::EventObject;
use crate::mem::MrTable;
use crate::sysfs_tree::DeviceInfo;
use crate::tcp::Request;

/// What the progress thread and the media worker ask of a QP, which the
/// context knows by number only.
pub trait Endpoint: Send + Sync {
    /// The protection domain the QP belongs to.
    fn pd(&self) -> u32;
    /// An event on the connection socket, before the stream is established.
    fn on_connection(&self, writable: bool);
    /// An event on the established stream.
    /// `closed`: its end may have come (read to the end of what it has).
    fn on_stream(&self, readable: bool, writable: bool, closed: bool);
    /// Runs the QP's timers (connection deadline and retries, linger); false
    /// once it has none left.
    fn tick(&self, now: Instant) -> bool;
    /// An accepted connection whose MPA Request names this QP.
    fn adopt(&self, fd: OwnedFd, req: Request);
    /// Kernel mode: a connection rdma_cm set up for this QP, MPA done.
    fn adopt_kernel(&self, fd: OwnedFd, s: &xiw_abi::kernel::Stream);
    /// Applies a failure recorded for the progress thread (no locks held).
    fn apply_deferred(&self);
    /// Frees staging buffers of an idle QP; true while it holds large ones.
    fn trim(&self) -> bool;
    /// Carries out a queue 1 request given to the media worker, and answers it.
    fn media(&self, ticket: u64, req: &Inbound);
    /// Puts the QP in error (fatal), for a fault outside its own paths.
    fn fail_fatal(&self, why: &str);
}

/// Knobs, read once per context from the environment.
#[derive(Clone, Debug)]
pub struct Config {
    /// Ask for MPA CRC32c (XIW_CRC=0 turns it off; a peer asking for it still gets it).
    pub crc: bool,
    /// How long RTR waits for the peer (XIW_CONNECT_TIMEOUT_MS).
    pub connect_timeout: Duration,
    /// How long the progress thread polls after activity before it sleeps (XIW_SPIN_US).
    pub spin: Duration,
    /// Largest DDP payload per FPDU (XIW_MULPDU).
    pub mulpdu: usize,
    /// Payloads of at least this many bytes skip the staging buffers: placed
    /// straight into registered memory as they arrive, and sent from it on
    /// streams without CRC (XIW_INPLACE_MIN, 0: always copied).
    pub inplace_min: usize,
    /// Largest payload of a lone Send or RDMA Write that is framed and handed
    /// to the stream by the posting thread itself when nothing is queued
    /// ahead of it, bypassing the send queue ring (XIW_POST_NOW_MAX, 0: never).
    pub post_now_max: u64,
    /// How long a QP whose peer closed in order stays up before it fails
    /// (XIW_LINGER_MS).
    pub linger: Duration,
    /// How long bytes sent on a stream may stay unacknowledged before the QP
    /// fails with a retry-exceeded error (XIW_STREAM_TIMEOUT_MS, 0: TCP's
    /// own retries, about 15 minutes).
    pub stream_timeout: Duration,
    /// SCHED_FIFO priority for the progress thread (XIW_PROGRESS_RT, 0 = normal scheduling).
    pub rt_prio: i32,
    /// How often idle QPs give back their staging buffers (XIW_TRIM_MS).
    pub trim: Duration,
    /// Keep the progress thread off the CPU the application last posted or
    /// polled from (XIW_PROGRESS_AFFINITY, on by default).
    pub avoid_app_cpu: bool,
    /// RFC 7306 atomics and immediate data, and the RDMA Flush / Verify / Atomic
    /// Write of draft-talpey-rdma-commit (XIW_EXTENSIONS=0: behave as a plain
    /// RFC 5040 RNIC, answering them with a Terminate).
    pub extensions: bool,
    /// A signaled Send or Write completes once the peer confirms it has taken
    /// it (XIW_COMPLETION=placed; see `Sender::set_confirm`), not once the
    /// stream takes it (`sent`, the default, as RFC 5040 section 5 allows).
    pub confirm: bool,
}

impl Config {
    pub fn from_env() -> Config {
        fn num(name: &str, default: u64) -> u64 {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(default)
        }
        Config {
            crc: num("XIW_CRC", 1) != 0,
            connect_timeout: Duration::from_millis(num("XIW_CONNECT_TIMEOUT_MS", 10_000)),
            spin: Duration::from_micros(num("XIW_SPIN_US", 0)),
            mulpdu: (num("XIW_MULPDU", 65_400) as usize).clamp(256, 65_400),
            inplace_min: num("XIW_INPLACE_MIN", 8192) as usize,
            post_now_max: num("XIW_POST_NOW_MAX", 512),
            linger: Duration::from_millis(num("XIW_LINGER_MS", 1000)),
            stream_timeout: Duration::from_millis(num("XIW_STREAM_TIMEOUT_MS", 30_000)),
            rt_prio: num("XIW_PROGRESS_RT", 0).min(99) as i32,
            trim: Duration::from_millis(num("XIW_TRIM_MS", 1000)),
            avoid_app_cpu: num("XIW_PROGRESS_AFFINITY", 1) != 0,
            extensions: num("XIW_EXTENSIONS", 1) != 0,
            confirm: std::env::var("XIW_COMPLETION").is_ok_and(|v| v.trim() == "placed"),
        }
    }
}

pub const TOKEN_KICK: u64 = 0;
pub const KIND_LISTEN: u64 = 1;
pub const KIND_CM: u64 = 2;
pub const KIND_DATA: u64 = 3;
/// An accepted connection whose MPA Request has not arrived yet.
pub const KIND_PENDING: u64 = 4;
/// Kernel mode: the eventfd the module signals when rdma_cm has a
/// connection for one of the context's QPs.
pub const KIND_KERNEL_CM: u64 = 6;
/// A stream being closed: read and discard until the peer's FIN.
pub const KIND_CLOSING: u64 = 5;

/// How long a closing stream waits for the peer's FIN.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// One listening port and the (up to 256) QP numbers it carries.
struct PortSlot {
    fd: OwnedFd,
    port: u16,
    used: [u64; 4],
    count: u32,
}

/// How long an accepted connection may take to send its MPA Request.
const PENDING_TIMEOUT: Duration = Duration::from_secs(10);

struct Pending {
    fd: OwnedFd,
    reader: xiw_engine::setup::FrameReader,
    since: Instant,
}

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: a plain system call making a new descriptor.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor, ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Resets the eventfd `fd` (reads its count; nothing if it is 0).
pub fn drain_eventfd(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes from an eventfd into a live u64.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

pub fn token(qpn: u32, kind: u64) -> u64 {
    (qpn as u64) << 8 | kind
}

pub fn token_pending(id: u64) -> u64 {
    id << 8 | KIND_PENDING
}

pub struct Shared {
    pub dev: DeviceInfo,
    /// Kernel mode: the device's command fd, for the kernel's objects.
    pub kernel: Option<crate::kernel::Kernel>,
    /// Kernel mode: the eventfd the module signals for rdma_cm connections,
    /// and for stream events while the progress thread sleeps.
    kernel_cm: Option<OwnedFd>,
    /// Kernel mode: the events page the module marks the QPs' streams in.
    pub stream_events: Option<crate::events_page::StreamEvents>,
    /// Its slots in use, and the QP of each.
    ev_slots: RwLock<HashMap<u32, u32>>,
    /// The highest slot of the events page a QP of this context was given.
    last_ev_slot: AtomicU32,
    pub cfg: Config,
    pub mrs: MrTable,
    qps: RwLock<HashMap<u32, Arc<dyn Endpoint>>>,
    pub epfd: OwnedFd,
    pub kick: OwnedFd,
    pub events: crate::async_event::Events,
    /// Where diagnostics go (libibverbs' log of this context, or stderr).
    pub log: crate::log::Target,
    pub shutdown: AtomicBool,
    timers: Mutex<Vec<Weak<dyn Endpoint>>>,
    pub has_timers: AtomicBool,
    /// Application handles of CQs and SRQs, for async events.
    handles: Mutex<HashMap<u32, usize>>,
    ids: AtomicU32,
    /// The last connection-attempt stamp handed out (see [`Shared::next_stamp`]).
    stamp: AtomicU64,
    media_tickets: AtomicU64,
    ports: Mutex<Vec<PortSlot>>,
    /// QPs with a failure waiting for the progress thread.
    failed: Mutex<Vec<u32>>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_pending: AtomicU64,
    closing: Mutex<HashMap<u64, (OwnedFd, Instant)>>,
    /// Bytes discarded from closing streams (to tell a quiet peer from a busy one).
    drained: AtomicU64,
    /// The CPU an application thread last posted or polled from (-1: none yet).
    pub app_cpu: AtomicI32,
    /// Bytes of device memory (`ibv_alloc_dm`) allocated.
    pub dm_bytes: AtomicU64,
    /// The media worker, started with the first Flush to persistence or Verify.
    media: Mutex<Option<MediaWorker>>,
}

struct MediaWorker {
    jobs: mpsc::Sender<MediaJob>,
    thread: std::thread::JoinHandle<()>,
}

struct MediaJob {
    qpn: u32,
    ticket: u64,
    req: Inbound,
}

/// Hands a Flush to persistence or a Verify of `qpn` to the context's media
/// worker, which answers through [`Endpoint::media`].
pub fn submit_media(sh: &Arc<Shared>, qpn: u32, ticket: u64, req: Inbound) {
    let mut m = sh.media.lock();
    if m.is_none() {
        let (jobs, rx) = mpsc::channel::<MediaJob>();
        let weak = Arc::downgrade(sh);
        let spawned = std::thread::Builder::new()
            .name("xiw-media".into())
            .spawn(move || media_worker(weak, rx));
        match spawned {
            Ok(thread) => *m = Some(MediaWorker { jobs, thread }),
            Err(e) => {
                drop(m);
                if let Some(qp) = sh.qp(qpn) {
                    qp.fail_fatal(&format!("no media worker: {e}"));
                }
                return;
            }
        }
    }
    let job = MediaJob { qpn, ticket, req };
    if let Some(w) = m.as_ref() {
        let _ = w.jobs.send(job);
    }
}

fn media_worker(sh: Weak<Shared>, jobs: mpsc::Receiver<MediaJob>) {
    while let Ok(job) = jobs.recv() {
        let Some(sh) = sh.upgrade() else { return };
        let Some(qp) = sh.qp(job.qpn) else { continue };
        qp.media(job.ticket, &job.req);
    }
}

impl Shared {
    /// Returns the state and the read end of the async-event socket.
    pub fn new(dev: DeviceInfo, cfg: Config) -> io::Result<(Shared, OwnedFd)> {
        let (events, async_r) = crate::async_event::Events::new()?;
        // SAFETY: plain syscalls returning new descriptors.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor.
        let epfd = unsafe { OwnedFd::from_raw_fd(epfd) };
        let kick = eventfd()?;
        let log = crate::log::Target::new(dev.ibdev.clone());
        let sh = Shared {
            dev,
            kernel: None,
            kernel_cm: None,
            stream_events: None,
            ev_slots: RwLock::new(HashMap::new()),
            last_ev_slot: AtomicU32::new(0),
            cfg,
            mrs: MrTable::default(),
            qps: RwLock::new(HashMap::new()),
            epfd,
            kick,
            events,
            log,
            shutdown: AtomicBool::new(false),
            timers: Mutex::new(Vec::new()),
            has_timers: AtomicBool::new(false),
            handles: Mutex::new(HashMap::new()),
            ids: AtomicU32::new(1),
            stamp: AtomicU64::new(0),
            media_tickets: AtomicU64::new(1),
            dm_bytes: AtomicU64::new(0),
            ports: Mutex::new(Vec::new()),
            failed: Mutex::new(Vec::new()),
            pending: Mutex::new(HashMap::new()),
            next_pending: AtomicU64::new(1),
            closing: Mutex::new(HashMap::new()),
            drained: AtomicU64::new(0),
            app_cpu: AtomicI32::new(-1),
            media: Mutex::new(None),
        };
        sh.epoll(
            libc::EPOLL_CTL_ADD,
            sh.kick.as_raw_fd(),
            libc::EPOLLIN as u32,
            TOKEN_KICK,
        )?;
        Ok((sh, async_r))
    }

    pub fn next_id(&self) -> u32 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// A stamp for a new connection attempt: larger than every earlier one of
    /// this context, and (from the wall clock, in microseconds) than those of
    /// contexts that came before it, so of two attempts by one QP number the
    /// later one always has the larger stamp.
    pub fn next_stamp(&self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let prev = self
            .stamp
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                Some(now.max(s + 1))
            })
            .expect("always Some");
        now.max(prev + 1)
    }

    /// A media worker job's ticket, unique in the context.
    pub fn media_ticket(&self) -> u64 {
        self.media_tickets.fetch_add(1, Ordering::Relaxed)
    }

    pub fn qp(&self, qpn: u32) -> Option<Arc<dyn Endpoint>> {
        self.qps.read().get(&qpn).cloned()
    }

    pub fn qp_count(&self) -> usize {
        self.qps.read().len()
    }

    /// Some QP of protection domain `pd` exists.
    /// How many QPs protection domain `pd` has.
    pub fn pd_qp_count(&self, pd: u32) -> usize {
        self.qps.read().values().filter(|q| q.pd() == pd).count()
    }

    pub fn pd_has_qps(&self, pd: u32) -> bool {
        self.pd_qp_count(pd) > 0
    }

    /// Trims idle QPs' buffers; true while some QP still holds large ones.
    pub fn trim(&self) -> bool {
        let qps: Vec<Arc<dyn Endpoint>> = self.qps.read().values().cloned().collect();
        qps.iter().fold(false, |big, qp| qp.trim() | big)
    }

    /// Makes a new QP reachable by number.
    pub fn register_qp(&self, qpn: u32, qp: Arc<dyn Endpoint>) {
        self.qps.write().insert(qpn, qp);
    }

    /// Kernel mode: QP `qpn` has `slot` in the events page.
    pub fn register_ev_slot(&self, slot: u32, qpn: u32) {
        self.last_ev_slot.fetch_max(slot, Ordering::AcqRel);
        self.ev_slots.write().insert(slot, qpn);
    }

    pub fn unregister_ev_slot(&self, slot: u32) {
        self.ev_slots.write().remove(&slot);
    }

    /// Kernel mode: carries out what the module marked on the QPs' streams
    /// since the last call (the progress thread's share of it: a thread
    /// polling an empty CQ takes its QP's own).
    pub fn on_stream_events(&self) {
        self.take_marked(xiw_abi::events::HINT_PROGRESS);
    }

    /// Kernel mode: an application thread found its own CQ empty and its own
    /// QP quiet; it carries out what the module marked on the context's
    /// other streams, as the progress thread would. A program that busy-polls
    /// one CQ (perftest's rdma_cm exchange, say) while another QP of it
    /// serves a peer then answers that peer at once, instead of waking the
    /// progress thread and making it wait for a CPU the spinning thread holds.
    #[inline]
    pub fn assist_marked(&self) {
        if self.stream_events.as_ref().is_some_and(|e| e.any()) {
            self.take_marked(xiw_abi::events::HINT_APP);
        }
    }

    /// Takes the marked slots and carries out their events; `hint` says
    /// who did (the module then wakes the progress thread for that slot's
    /// next marks at once, or a moment later).
    fn take_marked(&self, hint: u32) {
        let Some(ev) = &self.stream_events else {
            return;
        };
        let mut slots: smallvec::SmallVec<[u32; 8]> = smallvec::SmallVec::new();
        ev.drain(self.last_ev_slot.load(Ordering::Acquire), |s| slots.push(s));
        for s in slots {
            let qpn = self.ev_slots.read().get(&s).copied();
            let Some(qp) = qpn.and_then(|q| self.qp(q)) else {
                // A slot of a QP that is gone: what was marked is stale.
                ev.take(s);
                continue;
            };
            let bits = ev.take(s);
            if bits == 0 {
                continue;
            }
            ev.hint(s, hint);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                qp.on_stream(
                    bits & xiw_abi::events::EV_DATA != 0,
                    bits & xiw_abi::events::EV_WRITABLE != 0,
                    bits & xiw_abi::events::EV_CLOSED != 0,
                )
            }));
            if r.is_err() {
                crate::log::warn(
                    &self.log,
                    format_args!("internal error handling an event; QP {qpn:?} put in error"),
                );
                qp.fail_fatal("internal error");
            }
        }
    }

    pub fn unregister_qp(&self, qpn: u32) {
        self.qps.write().remove(&qpn);
    }

    /// A free QP number: `port << 8 | index` on one of this context's listeners.
    pub fn alloc_qpn(&self) -> io::Result<u32> {
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
        let (fd, port) = crate::tcp::listen(self.dev.addr)?;
        self.epoll(
            libc::EPOLL_CTL_ADD,
            fd.as_raw_fd(),
            libc::EPOLLIN as u32,
            token(port as u32, KIND_LISTEN),
        )?;
        ports.push(PortSlot {
            fd,
            port,
            used: [1, 0, 0, 0],
            count: 1,
        });
        Ok((port as u32) << 8)
    }

    pub fn free_qpn(&self, qpn: u32) {
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
            self.unwatch(slot.fd.as_raw_fd());
            ports.swap_remove(k);
        }
    }

    /// A listener is readable: accept, and wait for each connection's MPA Request.
    pub fn on_listen(&self, port: u16) {
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
            let id = self.next_pending.fetch_add(1, Ordering::Relaxed);
            if self
                .epoll(
                    libc::EPOLL_CTL_ADD,
                    conn.as_raw_fd(),
                    libc::EPOLLIN as u32,
                    token_pending(id),
                )
                .is_ok()
            {
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
    /// hand it to the QP it names, or turn it away.
    /// Kernel mode: watches `ev`, the eventfd the module signals when rdma_cm
    /// has a connection for this context (see [`Shared::on_kernel_cm`]).
    pub fn watch_kernel_cm(&mut self, ev: OwnedFd) -> io::Result<()> {
        self.epoll(
            libc::EPOLL_CTL_ADD,
            ev.as_raw_fd(),
            // Edge-triggered: each signal of the module wakes the progress
            // thread once, read or not (see `on_kernel_cm`).
            (libc::EPOLLIN | libc::EPOLLET) as u32,
            KIND_KERNEL_CM,
        )?;
        self.kernel_cm = Some(ev);
        Ok(())
    }

    /// Kernel mode: takes every connection rdma_cm set up for this context's
    /// QPs (MPA done, the application told only once the stream is ours)
    /// and hands each to its QP.
    pub fn on_kernel_cm(&self) {
        let (Some(k), Some(ev)) = (self.kernel, &self.kernel_cm) else {
            return;
        };
        // With an events page the eventfd also wakes the progress thread
        // for stream events, which cost no more system calls: it is read,
        // and the module asked, only when the module says a connection waits.
        if self.stream_events.as_ref().is_some_and(|e| !e.take_cm()) {
            return;
        }
        drain_eventfd(ev.as_raw_fd());
        while let Ok(s) = k.take_stream() {
            // SAFETY: the module installed the descriptor for this process.
            let fd = unsafe { OwnedFd::from_raw_fd(s.fd) };
            match self.qp(s.qpn) {
                Some(qp) => qp.adopt_kernel(fd, &s),
                // The QP went meanwhile: so does the stream.
                None => drop(fd),
            }
        }
    }

    pub fn on_pending(&self, id: u64) {
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
                self.unwatch(p.fd.as_raw_fd());
                return;
            }
        };
        let req = crate::tcp::parse_request(&frame);
        match req.and_then(|r| Some((self.qp(r.target)?, r))) {
            Some((qp, req)) => qp.adopt(p.fd, req),
            None => {
                crate::tcp::send_reject(p.fd.as_raw_fd());
                self.unwatch(p.fd.as_raw_fd());
            }
        }
    }

    /// Sends FIN after what is queued, then reads and discards until the peer's
    /// FIN before closing: a socket closed with unread bytes is reset by the
    /// kernel, which would drop data this side already reported as sent.
    pub fn close_gracefully(&self, fd: OwnedFd) {
        // SAFETY: shutdown on a socket we own.
        unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) };
        let id = self.next_pending.fetch_add(1, Ordering::Relaxed);
        let tok = id << 8 | KIND_CLOSING;
        if self
            .epoll(
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                libc::EPOLLIN as u32,
                tok,
            )
            .is_ok()
        {
            self.closing.lock().insert(id, (fd, Instant::now()));
            self.wake();
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
    pub fn on_closing(&self, id: u64) {
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
                self.unwatch(fd.as_raw_fd());
            }
        }
    }

    /// Drops accepted connections that never sent a Request; true if any remain.
    pub fn expire_pending(&self) -> bool {
        let mut pending = self.pending.lock();
        pending.retain(|_, p| {
            let keep = p.since.elapsed() < PENDING_TIMEOUT;
            if !keep {
                self.unwatch(p.fd.as_raw_fd());
            }
            keep
        });
        let mut closing = self.closing.lock();
        closing.retain(|_, (fd, since)| {
            let keep = since.elapsed() < CLOSE_TIMEOUT;
            if !keep {
                self.unwatch(fd.as_raw_fd());
            }
            keep
        });
        !pending.is_empty() || !closing.is_empty()
    }

    pub fn set_handle(&self, id: u32, handle: usize) {
        let mut h = self.handles.lock();
        if handle == 0 {
            h.remove(&id);
        } else {
            h.insert(id, handle);
        }
    }

    fn epoll(&self, op: i32, fd: RawFd, events: u32, tok: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: tok };
        // SAFETY: epoll_ctl with a live event struct on descriptors we own.
        if unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// A connection socket during MPA setup: `add` registers it (else it is
    /// re-pointed at the QP), `out` asks for writability.
    pub fn watch_cm(&self, fd: RawFd, qpn: u32, out: bool, add: bool) -> io::Result<()> {
        let ev = libc::EPOLLIN as u32 | if out { libc::EPOLLOUT as u32 } else { 0 };
        let op = if add {
            libc::EPOLL_CTL_ADD
        } else {
            libc::EPOLL_CTL_MOD
        };
        self.epoll(op, fd, ev, token(qpn, KIND_CM))
    }

    /// The established stream: from now on its events go to the data path.
    pub fn watch_data_new(&self, fd: RawFd, qpn: u32) -> io::Result<()> {
        self.epoll(
            libc::EPOLL_CTL_MOD,
            fd,
            libc::EPOLLIN as u32,
            token(qpn, KIND_DATA),
        )
    }

    pub fn watch_data(&self, fd: RawFd, qpn: u32, input: bool, out: bool) {
        let ev = if input { libc::EPOLLIN as u32 } else { 0 }
            | if out { libc::EPOLLOUT as u32 } else { 0 };
        let _ = self.epoll(libc::EPOLL_CTL_MOD, fd, ev, token(qpn, KIND_DATA));
    }

    pub fn unwatch(&self, fd: RawFd) {
        let _ = self.epoll(libc::EPOLL_CTL_DEL, fd, 0, 0);
    }

    /// Queues `qpn` for [`Endpoint::apply_deferred`] on the progress thread.
    pub fn defer_fail(&self, qpn: u32) {
        self.failed.lock().push(qpn);
        self.wake();
    }

    /// Applies every deferred failure; called by the progress thread, no locks held.
    pub fn apply_deferred(&self) {
        let failed = std::mem::take(&mut *self.failed.lock());
        for qpn in failed {
            if let Some(qp) = self.qp(qpn) {
                qp.apply_deferred();
            }
        }
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe {
            libc::write(
                self.kick.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }

    /// Runs [`Endpoint::tick`] of QP `qpn` from now on, until it says no more.
    pub fn add_timer(&self, qpn: u32) {
        if let Some(arc) = self.qp(qpn) {
            self.timers.lock().push(Arc::downgrade(&arc));
            self.has_timers.store(true, Ordering::Release);
            self.wake();
        }
    }

    pub fn take_timers(&self) -> Vec<Weak<dyn Endpoint>> {
        std::mem::take(&mut *self.timers.lock())
    }

    pub fn keep_timers(&self, keep: Vec<Weak<dyn Endpoint>>) {
        let mut t = self.timers.lock();
        t.extend(keep);
        self.has_timers.store(!t.is_empty(), Ordering::Release);
    }

    /// Raises `event` for the QP whose `ibv_qp` is in `handle` (0 once destroyed).
    pub fn qp_event(&self, handle: &std::sync::atomic::AtomicUsize, event: u32) {
        if event != NO_EVENT {
            self.raise(EventObject::Qp, || handle.load(Ordering::Acquire), event);
        }
    }

    /// Raises `event` on the object `element` names (0: gone): through the
    /// provider's own async fd, or in kernel mode on the kernel's object
    /// (whose handle the object's verbs struct holds), which reaches the
    /// kernel's async fd.
    fn raise(&self, kind: EventObject, element: impl FnOnce() -> usize, event: u32) {
        let Some(k) = self.kernel else {
            return self.events.post(element, event);
        };
        // Read under the queue's lock, which a destroy takes before the
        // object is freed.
        let handle = self.events.locked(|| {
            let p = element();
            // SAFETY: a live object of this context (not yet retired): its
            // verbs struct, whose handle is the kernel's in kernel mode.
            (p != 0).then(|| unsafe {
                match kind {
                    EventObject::Qp => (*(p as *const ibv_qp)).handle,
                    EventObject::Cq => (*(p as *const ibv_cq)).handle,
                    EventObject::Srq => (*(p as *const ibv_srq)).handle,
                }
            })
        });
        if let Some(h) = handle {
            // A destroy that got there first: no object left to tell.
            let _ = k.raise_event(kind, h, event);
        }
    }

    /// The application handle of CQ or SRQ `id` (0 once destroyed).
    fn handle(&self, id: u32) -> usize {
        self.handles.lock().get(&id).copied().unwrap_or(0)
    }

    /// Records the CPU the calling application thread runs on (see
    /// [`Config::avoid_app_cpu`]); a vDSO call, and a store only on change.
    pub fn note_app_cpu(&self) {
        if !self.cfg.avoid_app_cpu {
            return;
        }
        // SAFETY: sched_getcpu has no preconditions.
        let c = unsafe { libc::sched_getcpu() };
        if c >= 0 && self.app_cpu.load(Ordering::Relaxed) != c {
            self.app_cpu.store(c, Ordering::Relaxed);
        }
    }

    /// [`Shared::note_app_cpu`] on every 16th post of a QP (`posts`, its
    /// count, kept under the posting lock): a thread rarely moves, and a post
    /// should not pay for the call each time.
    pub fn note_app_cpu_sometimes(&self, posts: &mut u32) {
        *posts = posts.wrapping_add(1);
        if *posts % 16 == 1 {
            self.note_app_cpu();
        }
    }

    /// Stops the media worker (at context close), after its current job.
    pub fn stop_media(&self) {
        let w = self.media.lock().take();
        if let Some(w) = w {
            drop(w.jobs);
            let _ = w.thread.join();
        }
    }

    pub fn cq_overflow(&self, cq_id: u32) {
        crate::log::warn(&self.log, format_args!("completion queue overrun"));
        self.raise(EventObject::Cq, || self.handle(cq_id), IBV_EVENT_CQ_ERR);
    }

    pub fn srq_limit_event(&self, srq_id: u32) {
        self.raise(
            EventObject::Srq,
            || self.handle(srq_id),
            IBV_EVENT_SRQ_LIMIT_REACHED,
        );
    }
}

/// `Qp::fail` without an async event (the application asked for the error state).
pub const NO_EVENT: u32 = u32::MAX;
