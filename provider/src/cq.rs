//! Completion queues: a ring of [`Cqe`] filled by the engine, drained by `poll_cq`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use parking_lot::lock_api::RawMutex as _;

use xiw_abi::ring::*;

use crate::queue::Ring;

/// A QP whose data-path work a thread polling this CQ may do (see [`Cq::assist`]).
pub trait Assist: Send + Sync {
    fn assist(&self);
}

pub struct Cq {
    pub id: u32,
    pub ring: Ring,
    produce: parking_lot::Mutex<()>,
    consume: parking_lot::Mutex<()>,
    /// Set when a completion could not be stored; the CQ is then in error.
    pub overflowed: AtomicBool,
    /// QPs whose completions land here, for [`Cq::assist`].
    qps: Mutex<Vec<Weak<dyn Assist>>>,
    next_assist: AtomicUsize,
}

impl Cq {
    pub fn new(id: u32, cqe: u32) -> std::io::Result<Cq> {
        Ok(Cq {
            id,
            ring: Ring::new(RING_KIND_CQ, cqe + 1, std::mem::size_of::<Cqe>() as u32, id)?,
            produce: parking_lot::Mutex::new(()),
            consume: parking_lot::Mutex::new(()),
            overflowed: AtomicBool::new(false),
            qps: Mutex::new(Vec::new()),
            next_assist: AtomicUsize::new(0),
        })
    }

    /// Capacity reported to the application.
    pub fn capacity(&self) -> u32 {
        self.ring.entries - 1
    }

    /// Stores one completion; false if the CQ is full (an overrun).
    pub fn push(&self, cqe: Cqe) -> bool {
        let _g = self.produce.lock();
        let p = self.ring.producer();
        if p.wrapping_sub(self.ring.consumer()) >= self.capacity() {
            self.overflowed.store(true, Ordering::Release);
            return false;
        }
        // SAFETY: slot `p` is free (fewer than `entries` in use) and only producers,
        // serialised by `produce`, write it.
        unsafe { self.ring.write(p, 0, cqe) };
        self.ring.publish(p.wrapping_add(1));
        true
    }

    /// Takes up to `max` completions, handing each to `f`.
    pub fn poll(&self, max: usize, mut f: impl FnMut(usize, &Cqe)) -> usize {
        let _g = self.consume.lock();
        let c = self.ring.consumer();
        let avail = self.ring.producer().wrapping_sub(c) as usize;
        let n = avail.min(max);
        for i in 0..n {
            // SAFETY: slots in [consumer, producer) are published and owned by consumers,
            // serialised by `consume`.
            let cqe: Cqe = unsafe { self.ring.read(c.wrapping_add(i as u32), 0) };
            f(i, &cqe);
        }
        if n > 0 {
            self.ring.release(c.wrapping_add(n as u32));
        }
        n
    }

    /// Extended-CQ polling (`start_poll` .. `end_poll`) holds the consumer lock
    /// across calls: take it here and release it with [`Cq::unlock_consumer`].
    pub fn lock_consumer(&self) {
        // SAFETY: the raw lock is only released by `unlock_consumer`, by its holder.
        unsafe { self.consume.raw() }.lock();
    }

    /// # Safety
    /// The caller took the lock with [`Cq::lock_consumer`].
    pub unsafe fn unlock_consumer(&self) {
        // SAFETY: per the function contract.
        unsafe { self.consume.raw().unlock() }
    }

    /// With the consumer lock held: the completion at the consumer index, if any.
    pub fn head(&self) -> Option<Cqe> {
        let c = self.ring.consumer();
        if self.ring.producer() == c {
            return None;
        }
        // SAFETY: the slot is published and the caller holds the consumer lock.
        Some(unsafe { self.ring.read(c, 0) })
    }

    /// With the consumer lock held: consumes the completion at the consumer index.
    pub fn advance(&self) {
        self.ring.release(self.ring.consumer().wrapping_add(1));
    }

    pub fn attach<A: Assist + 'static>(&self, qp: &Arc<A>) {
        let qp: Weak<A> = Arc::downgrade(qp);
        let qp: Weak<dyn Assist> = qp;
        let mut qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        qps.retain(|w| w.strong_count() > 0);
        qps.push(qp);
    }

    /// An application polled this CQ and found it empty: let that thread do
    /// the data-path work of one of the CQ's QPs (round-robin).
    pub fn assist(&self) {
        let qp = {
            let Ok(qps) = self.qps.try_lock() else { return };
            if qps.is_empty() {
                return;
            }
            let i = self.next_assist.fetch_add(1, Ordering::Relaxed) % qps.len();
            qps[i].upgrade()
        };
        if let Some(qp) = qp {
            qp.assist();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ring.used() == 0
    }
}
