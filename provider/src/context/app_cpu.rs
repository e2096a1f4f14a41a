//! Where the application runs, and the progress thread kept elsewhere: the
//! CPU an application thread last posted or polled from, and the progress
//! thread's affinity away from it.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use crate::sys::{self, CpuSet};

pub struct AppCpu {
    /// [`super::Config::avoid_app_cpu`].
    avoid: bool,
    /// The CPU an application thread last posted or polled from (-1: none yet).
    last: AtomicI32,
}

impl AppCpu {
    pub(super) fn new(avoid: bool) -> AppCpu {
        AppCpu {
            avoid,
            last: AtomicI32::new(-1),
        }
    }

    /// Records the CPU the calling application thread runs on (see
    /// [`super::Config::avoid_app_cpu`]); a cheap read
    /// ([`crate::sys::current_cpu`]), and a store only on change.
    pub fn note(&self) {
        if !self.avoid {
            return;
        }
        if let Some(c) = sys::current_cpu() {
            if self.last.load(Ordering::Relaxed) != c {
                self.last.store(c, Ordering::Relaxed);
            }
        }
    }

    /// [`AppCpu::note`] on every 16th post of a QP (`posts`, its count, kept
    /// under the posting lock): a thread rarely moves, and a post should not
    /// pay for the call each time.
    pub fn note_sometimes(&self, posts: &mut u32) {
        *posts = posts.wrapping_add(1);
        if *posts % 16 == 1 {
            self.note();
        }
    }
}

/// Keeps the progress thread off the CPU the application thread last posted or
/// polled from, within the CPUs it was allowed. An application that waits by
/// spinning (on memory, as `ib_write_lat` does, or on its CQ) holds its CPU;
/// were the progress thread woken there, it would first have to preempt the
/// very thread waiting for its work, and hand the CPU back after. On another
/// CPU it places the data while the application keeps spinning, as a NIC's
/// interrupt on another core would (2 B `ib_write_lat`: 25 µs vs 6 µs here).
pub(super) struct Placement {
    allowed: Option<CpuSet>,
    avoiding: i32,
    changed: Instant,
}

impl Placement {
    pub(super) fn new() -> Placement {
        Placement {
            allowed: sys::affinity().ok(),
            avoiding: -1,
            changed: Instant::now(),
        }
    }

    /// Moves the calling thread off the CPU `app` last saw, when the
    /// context avoids it.
    pub(super) fn follow(&mut self, app: &AppCpu) {
        if app.avoid {
            self.avoid(app.last.load(Ordering::Relaxed));
        }
    }

    /// Moves off `cpu` (if allowed elsewhere); at most every 10 ms, so threads
    /// of one application on several CPUs do not make it hop on every wake.
    fn avoid(&mut self, cpu: i32) {
        let Some(allowed) = self.allowed else { return };
        if cpu == self.avoiding || self.changed.elapsed() < Duration::from_millis(10) {
            return;
        }
        self.avoiding = cpu;
        self.changed = Instant::now();
        let mut set = allowed;
        let cpu = cpu as usize;
        if cpu < CpuSet::MAX_CPU && set.is_set(cpu) && set.count() > 1 {
            set.unset(cpu);
        }
        // Failure leaves the thread where it was.
        let _ = sys::set_affinity(&set);
    }
}
