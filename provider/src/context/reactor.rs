//! The reactor: the context's epoll set, the eventfd that wakes it, the QPs'
//! timers and deferred failures, and the progress thread that runs them, one
//! per device context. It accepts connections, runs the MPA exchange,
//! receives and places data, and finishes transmissions the posting threads
//! could not (socket full). It never blocks on one QP.

use parking_lot::Mutex;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::event::{EventfdFlags, Timespec};

use super::app_cpu::Placement;
use super::registry::Registry;
use super::{Endpoint, Shared};

/// What an event of the epoll set is about: the low byte of its token (the
/// rest is a QP number, a port or an id).
const TOKEN_WAKE: u64 = 0;
const KIND_LISTEN: u64 = 1;
const KIND_CM: u64 = 2;
const KIND_DATA: u64 = 3;
/// An accepted connection whose MPA Request has not arrived yet.
const KIND_PENDING: u64 = 4;
/// A stream being closed: read and discard until the peer's FIN.
const KIND_CLOSING: u64 = 5;
/// Kernel mode: the eventfd the module signals when rdma_cm has a
/// connection for one of the context's QPs.
const KIND_KERNEL_CM: u64 = 6;

fn token(n: u64, kind: u64) -> u64 {
    n << 8 | kind
}

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(
        0,
        EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
    )?)
}

/// Resets the eventfd `fd` (reads its count; nothing if it is 0).
pub(super) fn drain_eventfd(fd: impl AsFd) {
    let mut v = [0u8; 8];
    let _ = rustix::io::read(fd, &mut v);
}

pub struct Reactor {
    /// The epoll set of the context's sockets and eventfds (level-triggered
    /// but for the kernel's eventfd).
    epfd: OwnedFd,
    /// The eventfd that wakes the progress thread.
    wake_fd: OwnedFd,
    /// The progress thread ends at its next turn.
    shutdown: AtomicBool,
    /// QPs whose [`Endpoint::tick`] runs on every turn.
    timers: Mutex<Vec<Weak<dyn Endpoint>>>,
    has_timers: AtomicBool,
    /// QPs with a failure waiting for the progress thread.
    failed: Mutex<Vec<u32>>,
}

impl Reactor {
    pub(super) fn new() -> io::Result<Reactor> {
        let epfd = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let wake_fd = eventfd()?;
        epoll::add(
            &epfd,
            &wake_fd,
            EventData::new_u64(TOKEN_WAKE),
            EventFlags::IN,
        )?;
        Ok(Reactor {
            epfd,
            wake_fd,
            shutdown: AtomicBool::new(false),
            timers: Mutex::new(Vec::new()),
            has_timers: AtomicBool::new(false),
            failed: Mutex::new(Vec::new()),
        })
    }

    fn add(&self, fd: impl AsFd, events: EventFlags, tok: u64) -> io::Result<()> {
        Ok(epoll::add(&self.epfd, fd, EventData::new_u64(tok), events)?)
    }

    fn modify(&self, fd: RawFd, events: EventFlags, tok: u64) -> io::Result<()> {
        // SAFETY: the callers' own sockets, open for the call.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        Ok(epoll::modify(
            &self.epfd,
            fd,
            EventData::new_u64(tok),
            events,
        )?)
    }

    /// A connection socket during MPA setup: `add` registers it (else it is
    /// re-pointed at the QP), `out` asks for writability.
    pub fn watch_cm(&self, fd: RawFd, qpn: u32, out: bool, add: bool) -> io::Result<()> {
        let mut ev = EventFlags::IN;
        if out {
            ev |= EventFlags::OUT;
        }
        let tok = token(qpn as u64, KIND_CM);
        if add {
            // SAFETY: the caller's socket, open for the call.
            self.add(unsafe { BorrowedFd::borrow_raw(fd) }, ev, tok)
        } else {
            self.modify(fd, ev, tok)
        }
    }

    /// The established stream: from now on its events go to the data path.
    pub fn watch_data_new(&self, fd: RawFd, qpn: u32) -> io::Result<()> {
        self.modify(fd, EventFlags::IN, token(qpn as u64, KIND_DATA))
    }

    pub fn watch_data(&self, fd: RawFd, qpn: u32, input: bool, out: bool) {
        let mut ev = EventFlags::empty();
        if input {
            ev |= EventFlags::IN;
        }
        if out {
            ev |= EventFlags::OUT;
        }
        let _ = self.modify(fd, ev, token(qpn as u64, KIND_DATA));
    }

    pub fn unwatch(&self, fd: RawFd) {
        // SAFETY: the caller's descriptor, open for the call.
        let _ = epoll::delete(&self.epfd, unsafe { BorrowedFd::borrow_raw(fd) });
    }

    /// A listening socket of `port`.
    pub(super) fn watch_listener(&self, fd: &OwnedFd, port: u16) -> io::Result<()> {
        self.add(fd, EventFlags::IN, token(port as u64, KIND_LISTEN))
    }

    /// An accepted connection, `id` until its MPA Request names a QP.
    pub(super) fn watch_pending(&self, fd: &OwnedFd, id: u64) -> io::Result<()> {
        self.add(fd, EventFlags::IN, token(id, KIND_PENDING))
    }

    /// A stream being closed, `id` until the peer's FIN.
    pub(super) fn watch_closing(&self, fd: &OwnedFd, id: u64) -> io::Result<()> {
        self.add(fd, EventFlags::IN, token(id, KIND_CLOSING))
    }

    /// Kernel mode: the eventfd the module signals.
    pub(super) fn watch_kernel_cm(&self, fd: &OwnedFd) -> io::Result<()> {
        self.add(
            fd,
            // Edge-triggered: each signal of the module wakes the progress
            // thread once, read or not (see `KernelEvents::on_cm`).
            EventFlags::IN | EventFlags::ET,
            KIND_KERNEL_CM,
        )
    }

    pub fn wake(&self) {
        let _ = rustix::io::write(&self.wake_fd, &1u64.to_ne_bytes());
    }

    /// Ends the progress thread: at its next turn, which this wakes it for.
    pub fn stop(&self) {
        self.shutdown.store(true, Ordering::Release);
        self.wake();
    }

    /// Queues `qpn` for [`Endpoint::apply_deferred`] on the progress thread.
    pub fn defer_fail(&self, qpn: u32) {
        self.failed.lock().push(qpn);
        self.wake();
    }

    /// Applies every deferred failure; called by the progress thread, no locks held.
    fn apply_deferred(&self, qps: &Registry) {
        let failed = std::mem::take(&mut *self.failed.lock());
        for qpn in failed {
            if let Some(qp) = qps.get(qpn) {
                qp.apply_deferred();
            }
        }
    }

    /// Runs [`Endpoint::tick`] of QP `qpn` (of `qps`) from now on, until it
    /// says no more.
    pub fn add_timer(&self, qps: &Registry, qpn: u32) {
        if let Some(arc) = qps.get(qpn) {
            self.timers.lock().push(Arc::downgrade(&arc));
            self.has_timers.store(true, Ordering::Release);
            self.wake();
        }
    }

    fn take_timers(&self) -> Vec<Weak<dyn Endpoint>> {
        std::mem::take(&mut *self.timers.lock())
    }

    fn keep_timers(&self, keep: Vec<Weak<dyn Endpoint>>) {
        let mut t = self.timers.lock();
        t.extend(keep);
        self.has_timers.store(!t.is_empty(), Ordering::Release);
    }
}

/// The progress thread of the context `sh`, until [`Reactor::stop`].
pub fn run(sh: Arc<Shared>) {
    if sh.cfg.rt_prio > 0 {
        // Failure leaves the thread as it was.
        if let Err(e) = crate::sys::set_fifo(sh.cfg.rt_prio) {
            let r = e.raw_os_error().unwrap_or(0);
            crate::log::warn(
                &sh.log,
                format_args!("XIW_PROGRESS_RT: cannot use SCHED_FIFO (errno {r})"),
            );
        }
    }
    let r = &sh.reactor;
    let mut placement = Placement::new();
    let none = epoll::Event {
        flags: EventFlags::empty(),
        data: EventData::new_u64(0),
    };
    let mut events = vec![none; 128];
    let mut last_activity = Instant::now();
    let mut pending = false;
    let mut last_trim = Instant::now();
    let mut may_trim = false;
    loop {
        // Checked before every wait: the wake that follows `shutdown` may already
        // have been drained along with an earlier kick.
        if r.shutdown.load(Ordering::Acquire) {
            return;
        }
        let spinning = !sh.cfg.spin.is_zero() && last_activity.elapsed() < sh.cfg.spin;
        let timeout = if spinning {
            0
        } else if r.has_timers.load(Ordering::Acquire) {
            20
        } else if pending || may_trim {
            sh.cfg.trim.as_millis().min(i32::MAX as u128) as i32
        } else {
            -1
        };
        // Kernel mode: asleep, the module wakes this thread for stream
        // events; a mark that came meanwhile means no sleep.
        let page = sh.kernel_events.page.as_ref();
        let armed = timeout != 0 && page.is_some_and(|e| e.arm());
        let timeout = if timeout != 0 && page.is_some() && !armed {
            0
        } else {
            timeout
        };
        let timeout = (timeout >= 0).then(|| Timespec {
            tv_sec: (timeout / 1000).into(),
            tv_nsec: (timeout % 1000 * 1_000_000).into(),
        });
        // An interrupted or failed wait is a turn without events.
        let n = epoll::wait(&r.epfd, &mut events[..], timeout.as_ref()).unwrap_or(0);
        if armed {
            if let Some(e) = page {
                e.disarm();
            }
        }
        if r.shutdown.load(Ordering::Acquire) {
            return;
        }
        placement.follow(&sh.app_cpu);
        if n > 0 {
            last_activity = Instant::now();
            may_trim = true;
        }
        for ev in &events[..n] {
            let (tok, bits) = (ev.data.u64(), ev.flags);
            if tok == TOKEN_WAKE {
                drain_eventfd(&r.wake_fd);
                continue;
            }
            let res = catch_unwind(AssertUnwindSafe(|| dispatch(&sh, tok, bits)));
            if res.is_err() {
                crate::log::warn(
                    &sh.log,
                    format_args!(
                        "internal error handling an event; QP {} put in error",
                        tok >> 8
                    ),
                );
                if let Some(qp) = sh.qps.get((tok >> 8) as u32) {
                    qp.fail_fatal("internal error");
                }
            }
        }
        sh.kernel_events.on_stream_events(&sh.qps, &sh.log);
        r.apply_deferred(&sh.qps);
        pending = sh.listener.expire(r);
        if last_trim.elapsed() >= sh.cfg.trim {
            last_trim = Instant::now();
            may_trim = sh.qps.trim();
        }
        if r.has_timers.load(Ordering::Acquire) {
            let now = Instant::now();
            let mut keep = Vec::new();
            for w in r.take_timers() {
                let Some(qp) = w.upgrade() else { continue };
                if qp.tick(now) {
                    keep.push(w);
                }
            }
            r.keep_timers(keep);
        }
    }
}

fn dispatch(sh: &Shared, tok: u64, bits: EventFlags) {
    let r = &sh.reactor;
    match tok & 0xff {
        KIND_LISTEN => return sh.listener.on_listen((tok >> 8) as u16, r),
        KIND_PENDING => return sh.listener.on_pending(tok >> 8, r, &sh.qps),
        KIND_KERNEL_CM => return sh.kernel_events.on_cm(sh.kernel, &sh.qps),
        KIND_CLOSING => return sh.listener.on_closing(tok >> 8, r),
        _ => {}
    }
    let Some(qp) = sh.qps.get((tok >> 8) as u32) else {
        return;
    };
    let any = |b: EventFlags| bits.intersects(b);
    match tok & 0xff {
        KIND_CM => qp.on_connection(any(EventFlags::OUT | EventFlags::ERR | EventFlags::HUP)),
        // Level-triggered: an end not yet read is reported again.
        KIND_DATA => qp.on_stream(
            any(EventFlags::IN | EventFlags::ERR | EventFlags::HUP),
            any(EventFlags::OUT),
            false,
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn wait(r: &Reactor) -> Vec<(u64, EventFlags)> {
        let none = epoll::Event {
            flags: EventFlags::empty(),
            data: EventData::new_u64(0),
        };
        let mut events = [none; 8];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let n = epoll::wait(&r.epfd, &mut events[..], Some(&zero)).expect("epoll_wait");
        events[..n]
            .iter()
            .map(|e| (e.data.u64(), e.flags))
            .collect()
    }

    #[test]
    fn a_wake_is_seen_until_drained() {
        let r = Reactor::new().expect("reactor");
        assert!(wait(&r).is_empty());
        r.wake();
        r.wake();
        // Level-triggered: seen on every wait until read.
        for _ in 0..2 {
            let ev = wait(&r);
            assert_eq!(ev.len(), 1);
            assert_eq!(ev[0].0, TOKEN_WAKE);
            assert!(ev[0].1.contains(EventFlags::IN));
        }
        drain_eventfd(&r.wake_fd);
        assert!(wait(&r).is_empty());
    }

    #[test]
    fn tokens_and_interest_follow_the_watch() {
        let r = Reactor::new().expect("reactor");
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        r.watch_cm(a.as_raw_fd(), 7, true, true).expect("add");
        let ev = wait(&r);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].0, token(7, KIND_CM));
        assert!(ev[0].1.contains(EventFlags::OUT));
        r.watch_data_new(a.as_raw_fd(), 7).expect("modify");
        assert!(wait(&r).is_empty(), "only input is asked for");
        std::io::Write::write_all(&mut &b, b"x").expect("write");
        let ev = wait(&r);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].0, token(7, KIND_DATA));
        assert!(ev[0].1.contains(EventFlags::IN));
        r.unwatch(a.as_raw_fd());
        assert!(wait(&r).is_empty());
    }

    #[test]
    fn the_kernel_eventfd_is_edge_triggered() {
        let r = Reactor::new().expect("reactor");
        let ev = eventfd().expect("eventfd");
        r.watch_kernel_cm(&ev).expect("add");
        let _ = rustix::io::write(&ev, &1u64.to_ne_bytes());
        assert_eq!(wait(&r).len(), 1);
        // Not read, yet not reported again until the next signal.
        assert!(wait(&r).is_empty());
        let _ = rustix::io::write(&ev, &1u64.to_ne_bytes());
        assert_eq!(wait(&r)[0].0, KIND_KERNEL_CM);
    }
}
