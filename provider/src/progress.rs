//! The progress thread: one per device context. It accepts connections, runs
//! the MPA exchange, receives and places data, and finishes transmissions the
//! posting threads could not (socket full). It never blocks on one QP.

use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::context::*;

pub fn run(sh: Arc<Shared>) {
    if sh.cfg.rt_prio > 0 {
        let param = libc::sched_param {
            sched_priority: sh.cfg.rt_prio,
        };
        // SAFETY: changes only this thread's own scheduling; failure leaves it as it was.
        let r =
            unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
        if r != 0 {
            crate::log::warn(
                &sh.log,
                format_args!("XIW_PROGRESS_RT: cannot use SCHED_FIFO (errno {r})"),
            );
        }
    }
    let mut placement = Placement::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 128];
    let mut last_activity = Instant::now();
    let mut pending = false;
    let mut last_trim = Instant::now();
    let mut may_trim = false;
    loop {
        // Checked before every wait: the wake that follows `shutdown` may already
        // have been drained along with an earlier kick.
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        let spinning = !sh.cfg.spin.is_zero() && last_activity.elapsed() < sh.cfg.spin;
        let timeout = if spinning {
            0
        } else if sh.has_timers.load(Ordering::Acquire) {
            20
        } else if pending || may_trim {
            sh.cfg.trim.as_millis().min(i32::MAX as u128) as i32
        } else {
            -1
        };
        // Kernel mode: asleep, the module wakes this thread for stream
        // events; a mark that came meanwhile means no sleep.
        let armed = timeout != 0 && sh.stream_events.as_ref().is_some_and(|e| e.arm());
        let timeout = if timeout != 0 && sh.stream_events.is_some() && !armed {
            0
        } else {
            timeout
        };
        // SAFETY: `events` has room for `len` entries; epfd is ours.
        let n = unsafe {
            libc::epoll_wait(
                sh.epfd.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout,
            )
        };
        if armed {
            if let Some(e) = &sh.stream_events {
                e.disarm();
            }
        }
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        if sh.cfg.avoid_app_cpu {
            placement.avoid(sh.app_cpu.load(Ordering::Relaxed));
        }
        if n > 0 {
            last_activity = Instant::now();
            may_trim = true;
        }
        for ev in &events[..n.max(0) as usize] {
            let (tok, bits) = (ev.u64, ev.events);
            if tok == TOKEN_KICK {
                drain_eventfd(sh.kick.as_raw_fd());
                continue;
            }
            let r = catch_unwind(AssertUnwindSafe(|| dispatch(&sh, tok, bits)));
            if r.is_err() {
                crate::log::warn(
                    &sh.log,
                    format_args!(
                        "internal error handling an event; QP {} put in error",
                        tok >> 8
                    ),
                );
                if let Some(qp) = sh.qp((tok >> 8) as u32) {
                    qp.fail_fatal("internal error");
                }
            }
        }
        sh.on_stream_events();
        sh.apply_deferred();
        pending = sh.expire_pending();
        if last_trim.elapsed() >= sh.cfg.trim {
            last_trim = Instant::now();
            may_trim = sh.trim();
        }
        if sh.has_timers.load(Ordering::Acquire) {
            let now = Instant::now();
            let mut keep = Vec::new();
            for w in sh.take_timers() {
                let Some(qp) = w.upgrade() else { continue };
                if qp.tick(now) {
                    keep.push(w);
                }
            }
            sh.keep_timers(keep);
        }
    }
}

fn dispatch(sh: &Shared, tok: u64, bits: u32) {
    match tok & 0xff {
        KIND_LISTEN => return sh.on_listen((tok >> 8) as u16),
        KIND_PENDING => return sh.on_pending(tok >> 8),
        KIND_KERNEL_CM => return sh.on_kernel_cm(),
        KIND_CLOSING => return sh.on_closing(tok >> 8),
        _ => {}
    }
    let Some(qp) = sh.qp((tok >> 8) as u32) else {
        return;
    };
    let any = |b: i32| bits & b as u32 != 0;
    match tok & 0xff {
        KIND_CM => qp.on_connection(any(libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP)),
        // Level-triggered: an end not yet read is reported again.
        KIND_DATA => qp.on_stream(
            any(libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP),
            any(libc::EPOLLOUT),
            false,
        ),
        _ => {}
    }
}

/// Keeps the progress thread off the CPU the application thread last posted or
/// polled from, within the CPUs it was allowed. An application that waits by
/// spinning (on memory, as `ib_write_lat` does, or on its CQ) holds its CPU;
/// were the progress thread woken there, it would first have to preempt the
/// very thread waiting for its work, and hand the CPU back after. On another
/// CPU it places the data while the application keeps spinning, as a NIC's
/// interrupt on another core would (2 B `ib_write_lat`: 25 µs vs 6 µs here).
struct Placement {
    allowed: Option<libc::cpu_set_t>,
    avoiding: i32,
    changed: Instant,
}

impl Placement {
    fn new() -> Placement {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: this thread's own affinity, into a set of the right size.
        let ok =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
                == 0;
        Placement {
            allowed: ok.then_some(set),
            avoiding: -1,
            changed: Instant::now(),
        }
    }

    /// Moves off `cpu` (if allowed elsewhere); at most every 10 ms, so threads
    /// of one application on several CPUs do not make it hop on every wake.
    fn avoid(&mut self, cpu: i32) {
        let Some(allowed) = self.allowed else { return };
        if cpu == self.avoiding || self.changed.elapsed() < std::time::Duration::from_millis(10) {
            return;
        }
        self.avoiding = cpu;
        self.changed = Instant::now();
        let mut set = allowed;
        let cpu = cpu as usize;
        // SAFETY: CPU_* only touch the sets given, within their size.
        unsafe {
            if cpu < libc::CPU_SETSIZE as usize
                && libc::CPU_ISSET(cpu, &set)
                && libc::CPU_COUNT(&set) > 1
            {
                libc::CPU_CLR(cpu, &mut set);
            }
            // Failure leaves the thread where it was.
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}
