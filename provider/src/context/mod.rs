//! Per-device-context state shared by the verbs and the progress thread,
//! as named parts, each in its own file:
//!
//! - `reactor`: the epoll set and its wake-ups, the QPs' timers and deferred
//!   failures, and the progress thread that runs them;
//! - `registry`: the QPs by number ([`Endpoint`]);
//! - `listener`: the listening ports (whose numbers the QP numbers carry),
//!   accepted connections until their MPA Request, streams being closed;
//! - `kernel_events`: kernel mode's events page and rdma_cm eventfd;
//! - `media`: the media worker;
//! - `async_events`: raising asynchronous events;
//! - `app_cpu`: the CPU the application runs on, kept free of the progress
//!   thread;
//! - `device_memory`: device memory allocated.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xiw_engine::queue1::Inbound;

use crate::kernel::Kernel;
use crate::mem::MrTable;
use crate::sysfs_tree::DeviceInfo;
use crate::tcp::Request;

pub mod app_cpu;
pub mod async_events;
pub mod device_memory;
pub mod kernel_events;
pub mod listener;
pub mod media;
pub mod reactor;
pub mod registry;

use app_cpu::AppCpu;
use async_events::AsyncEvents;
use device_memory::DeviceMemory;
use kernel_events::KernelEvents;
use listener::Listener;
use media::Media;
use reactor::Reactor;
use registry::Registry;

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
    /// Ask for MPA CRC32c (XIW_CRC=1; off by default, as in siw: a peer asking for it gets it).
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
    /// Kernel mode: the module places incoming RDMA Writes straight from
    /// the socket of a stream, whether rdma_cm set it up or the provider
    /// connected it for modify_qp and shared it with the module
    /// (XIW_KERNEL_PLACE=0: the provider places everything itself, and
    /// keeps the streams it connects to itself).
    pub kernel_place: bool,
    /// Kernel mode: with a stream lent, the module places the Read
    /// Responses of the oldest outstanding Read too, when its sink is one
    /// span of a region (XIW_KERNEL_PLACE_READS=0: the provider places
    /// every Read Response).
    pub kernel_place_reads: bool,
    /// Kernel mode: the module may raise an armed CQ's completion event
    /// itself when a message that completes a receive comes on a lent
    /// stream (XIW_KERNEL_EVENTS=0 leaves every event to the provider).
    pub kernel_events: bool,
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
            crc: num("XIW_CRC", 0) != 0,
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
            kernel_place: num("XIW_KERNEL_PLACE", 1) != 0,
            kernel_place_reads: num("XIW_KERNEL_PLACE_READS", 1) != 0,
            kernel_events: num("XIW_KERNEL_EVENTS", 1) != 0,
            extensions: num("XIW_EXTENSIONS", 1) != 0,
            confirm: std::env::var("XIW_COMPLETION").is_ok_and(|v| v.trim() == "placed"),
        }
    }
}

pub struct Shared {
    pub dev: DeviceInfo,
    /// Kernel mode: the device's command fd, for the kernel's objects.
    pub kernel: Option<Kernel>,
    /// Kernel mode: the module's events page and rdma_cm eventfd.
    pub kernel_events: KernelEvents,
    pub cfg: Config,
    pub mrs: MrTable,
    /// The QPs by number.
    pub qps: Registry,
    /// The epoll set, its wake-ups, the QPs' timers and deferred failures.
    pub reactor: Reactor,
    pub async_events: AsyncEvents,
    /// Where diagnostics go (libibverbs' log of this context, or stderr).
    pub log: crate::log::Target,
    ids: AtomicU32,
    /// The last connection-attempt stamp handed out (see [`Shared::next_stamp`]).
    stamp: AtomicU64,
    /// The listening ports (and so the QP numbers), accepted and closing connections.
    pub listener: Listener,
    pub app_cpu: AppCpu,
    pub device_memory: DeviceMemory,
    /// The media worker, started with the first Flush to persistence or Verify.
    pub media: Media,
}

impl Shared {
    /// Returns the state and the read end of the async-event socket.
    pub fn new(
        dev: DeviceInfo,
        cfg: Config,
        kernel: Option<Kernel>,
    ) -> io::Result<(Shared, OwnedFd)> {
        let (queue, async_r) = crate::async_event::Events::new()?;
        let reactor = Reactor::new()?;
        let log = crate::log::Target::new(dev.ibdev.clone());
        let sh = Shared {
            listener: Listener::new(dev.addr),
            app_cpu: AppCpu::new(cfg.avoid_app_cpu),
            dev,
            kernel,
            kernel_events: KernelEvents::default(),
            cfg,
            mrs: MrTable::with_kernel(kernel),
            qps: Registry::default(),
            reactor,
            async_events: AsyncEvents::new(queue, kernel),
            log,
            ids: AtomicU32::new(1),
            stamp: AtomicU64::new(0),
            device_memory: DeviceMemory::default(),
            media: Media::new(),
        };
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
}
