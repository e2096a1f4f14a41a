//! Async events (`ibv_get_async_event`) without a kernel: records go to the
//! application through a socket pair whose read end is the context's
//! `async_fd`, one at a time; the rest wait here. So destroying a QP, CQ or
//! SRQ can take back what the application has not read yet, and knows how
//! many of its events the application did read, which it must acknowledge
//! (`ibv_ack_async_event`) before the destroy returns, as
//! ibv_get_async_event(3) promises: the object's memory stays valid until then.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use socket2::{Domain, SockRef, Socket, Type};

/// One record as libibverbs reads it: `{u64 element; u32 event_type; u32 reserved}`.
const RECORD: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Event {
    element: u64,
    event_type: u32,
}

#[derive(Default)]
struct State {
    /// The record in the socket, not yet read (as far as we know).
    in_socket: Option<Event>,
    waiting: VecDeque<Event>,
    /// Events of each object the application has read.
    delivered: HashMap<u64, u32>,
}

pub struct Events {
    w: OwnedFd,
    /// The read end, owned by libibverbs once handed over (closed with the context).
    r: RawFd,
    state: Mutex<State>,
}

/// At most this many events wait; past it, new ones are dropped (a CQ that
/// keeps overrunning must not grow memory without bound).
const MAX_WAITING: usize = 4096;

impl Events {
    /// The queue and the read end for `async_fd`.
    pub fn new() -> io::Result<(Events, OwnedFd)> {
        // SEQPACKET keeps each 16-byte record whole; socket2 makes both ends close-on-exec.
        let (r, w) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None)?;
        // The application only reads; shutting our reading side makes sure
        // nothing it writes can pile up.
        w.shutdown(std::net::Shutdown::Read)?;
        let (r, w) = (OwnedFd::from(r), OwnedFd::from(w));
        let ev = Events {
            r: r.as_raw_fd(),
            w,
            state: Mutex::new(State::default()),
        };
        Ok((ev, r))
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Posts an event of the object `element` names (0: the object is gone, no
    /// event). `element` is evaluated under the queue's lock, so an event can
    /// never slip in after the object's [`Events::retire`].
    pub fn post(&self, element: impl FnOnce() -> usize, event_type: u32) {
        let mut st = self.lock();
        let element = element() as u64;
        if element == 0 {
            return;
        }
        let ev = Event {
            element,
            event_type,
        };
        if st.in_socket.is_none() {
            self.send(&mut st, ev);
        } else if st.waiting.len() < MAX_WAITING {
            st.waiting.push_back(ev);
        }
    }

    fn send(&self, st: &mut State, ev: Event) {
        let mut rec = [0u8; RECORD];
        rec[..8].copy_from_slice(&ev.element.to_ne_bytes());
        rec[8..12].copy_from_slice(&ev.event_type.to_ne_bytes());
        // With at most one record in it, the socket never fills.
        let sent =
            SockRef::from(&self.w).send_with_flags(&rec, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        if matches!(sent, Ok(RECORD)) {
            st.in_socket = Some(ev);
        }
    }

    fn refill(&self, st: &mut State) {
        if st.in_socket.is_none() {
            if let Some(ev) = st.waiting.pop_front() {
                self.send(st, ev);
            }
        }
    }

    /// Runs `f` under the queue's lock, which [`Events::retire`] takes too (so
    /// an object `f` finds is not destroyed before `f` returns).
    pub fn locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let _st = self.lock();
        f()
    }

    /// libibverbs read this event (the provider's `async_event` op): count it
    /// as delivered and put the next one in the socket.
    pub fn read_by_app(&self, element: u64, event_type: u32) {
        let mut st = self.lock();
        let ev = Event {
            element,
            event_type,
        };
        // Unless a destroy has already accounted for it.
        if st.in_socket == Some(ev) {
            st.in_socket = None;
            *st.delivered.entry(element).or_insert(0) += 1;
        }
        self.refill(&mut st);
    }

    /// The object `element` is being destroyed: its unread events are dropped.
    /// Returns how many the application read, which it must acknowledge.
    pub fn retire(&self, element: u64) -> u32 {
        let mut st = self.lock();
        st.waiting.retain(|e| e.element != element);
        if st.in_socket.is_some_and(|e| e.element == element) {
            let mut rec = [0u8; RECORD];
            // SAFETY: a non-blocking receive into a live 16-byte buffer from the
            // socket's read end, which stays open while the context (and so
            // the object being destroyed) lives.
            let n = unsafe {
                crate::sys::recv_raw(self.r, rec.as_mut_ptr(), RECORD, libc::MSG_DONTWAIT)
            };
            st.in_socket = None;
            if n != RECORD as isize {
                // The application took it first: it is delivered.
                *st.delivered.entry(element).or_insert(0) += 1;
            }
        }
        let n = st.delivered.remove(&element).unwrap_or(0);
        self.refill(&mut st);
        n
    }
}

/// An object's acknowledgement counter (`events_completed` of libibverbs),
/// guarded by `mutex` and signalled on `cond` by `ibv_ack_async_event`.
pub struct Acks {
    pub mutex: *mut libc::pthread_mutex_t,
    pub cond: *mut libc::pthread_cond_t,
    pub completed: *const u32,
}

impl Acks {
    /// Waits until the counter reaches `want`.
    ///
    /// # Safety
    /// The three pointers are the initialised fields of one live verbs object.
    pub unsafe fn wait(&self, want: u32) {
        if want == 0 {
            return;
        }
        // SAFETY: per the caller; the counter is read under its mutex.
        unsafe {
            libc::pthread_mutex_lock(self.mutex);
            while std::ptr::read_volatile(self.completed) < want {
                libc::pthread_cond_wait(self.cond, self.mutex);
            }
            libc::pthread_mutex_unlock(self.mutex);
        }
    }
}
