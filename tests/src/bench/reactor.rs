//! The reactor choice (`xiw-bench --reactor`): how fast a waiting thread
//! answers a wake, with xiw's own raw level-triggered epoll and with the
//! `polling` crate (level mode), the same eventfd ping-pong for both.
//!
//! - back to back: the next wake comes as soon as the last is answered;
//! - with a gap: the waiter goes to sleep between wakes, as xiw's progress
//!   thread does between messages.
//!
//! `polling` re-arms a timerfd and re-registers its notifier around every wait
//! (three system calls more per wake); mio is not measured because it only
//! registers edge-triggered, and xiw relies on level-triggered readiness (a
//! closed stream stays readable).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn eventfd() -> OwnedFd {
    // SAFETY: a new eventfd, owned from here on.
    unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)) }
}

fn poke(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: 8 bytes from a live u64 to our eventfd.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

fn take(fd: &OwnedFd) -> bool {
    let mut v = 0u64;
    // SAFETY: 8 bytes into a live u64 from our eventfd.
    unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) == 8 }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reactor {
    Epoll,
    Polling,
}

/// Median and 90th percentile wake round trip [µs].
pub fn measure(r: Reactor, gap: Duration, n: usize) -> (f64, f64) {
    let ping = Arc::new(eventfd());
    let pong = Arc::new(eventfd());
    let stop = Arc::new(AtomicBool::new(false));
    let (p, q, s) = (ping.clone(), pong.clone(), stop.clone());
    // The waiter uses a finite timeout, as a progress thread with timers does.
    let waiter = std::thread::spawn(move || match r {
        Reactor::Epoll => {
            // SAFETY: a new epoll instance, owned from here on.
            let ep = unsafe { OwnedFd::from_raw_fd(libc::epoll_create1(libc::EPOLL_CLOEXEC)) };
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 1,
            };
            // SAFETY: registering our eventfd with our epoll instance.
            unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, p.as_raw_fd(), &mut ev) };
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 16];
            while !s.load(Ordering::Relaxed) {
                // SAFETY: room for 16 events.
                let k = unsafe { libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), 16, 20) };
                if k > 0 && take(&p) {
                    poke(&q);
                }
            }
        }
        Reactor::Polling => {
            let poller = polling::Poller::new().expect("poller");
            // SAFETY: the eventfd outlives its registration (deleted below).
            unsafe {
                poller
                    .add_with_mode(
                        p.as_raw_fd(),
                        polling::Event::readable(1),
                        polling::PollMode::Level,
                    )
                    .expect("register")
            };
            let mut evs = polling::Events::new();
            while !s.load(Ordering::Relaxed) {
                evs.clear();
                let _ = poller.wait(&mut evs, Some(Duration::from_millis(20)));
                if !evs.is_empty() && take(&p) {
                    poke(&q);
                }
            }
            // SAFETY: still open.
            let _ = poller.delete(unsafe { BorrowedFd::borrow_raw(p.as_raw_fd()) });
        }
    });
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let g = Instant::now();
        while g.elapsed() < gap {
            std::hint::spin_loop();
        }
        let t0 = Instant::now();
        poke(&ping);
        while !take(&pong) {
            std::hint::spin_loop();
        }
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    stop.store(true, Ordering::Relaxed);
    poke(&ping);
    let _ = waiter.join();
    lat.sort_by(|a, b| a.total_cmp(b));
    (lat[n / 2], lat[n * 9 / 10])
}
