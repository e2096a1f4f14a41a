//! Completion queues: a ring of [`Cqe`] filled by the engine, drained by `poll_cq`.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::lock_api::RawMutex as _;

use xiw_abi::ring::*;

use crate::error::Error;
use crate::kernel::Kernel;
use crate::queue::Ring;

const CQE_SIZE: u32 = std::mem::size_of::<Cqe>() as u32;

/// A QP whose data-path work a thread polling this CQ may do (see [`Cq::assist`]).
pub trait Assist: Send + Sync {
    fn assist(&self);
    /// The application arms the CQ to wait for an event.
    fn app_waits(&self);
    /// If `cq` is this QP's receive CQ: the messages whose completion event
    /// the module raised already, counted in the QP's events slot, are owed
    /// there from now on ([`Cq::owe_signalled`]).
    fn collect_signalled(&self, cq: &Cq);
}

pub struct Cq {
    pub id: u32,
    /// The ring in use, owned (a leaked `Box`). Read only with `produce` or
    /// `consume` held: [`Cq::resize`] replaces and frees it holding both.
    ring: AtomicPtr<Ring>,
    produce: parking_lot::Mutex<()>,
    consume: parking_lot::Mutex<()>,
    /// Set when a completion could not be stored; the CQ is then in error.
    pub overflowed: AtomicBool,
    /// Kernel mode: receive completions whose event the module raised
    /// already (it woke the channel when their message came), not stored
    /// yet: a poll that finds the CQ empty waits for them
    /// ([`Cq::poll_owed`]).
    owed: AtomicU32,
    /// Threads waiting in [`Cq::poll_owed`] (changed under `produce`), and
    /// the events the completions other threads stored meanwhile held back
    /// for them (bit 0: any; bit 1: one a solicited-only arming signals).
    waiting: AtomicU32,
    held: AtomicU32,
    /// QPs whose completions land here, for [`Cq::assist`].
    qps: Mutex<Vec<Weak<dyn Assist>>>,
    next_assist: AtomicUsize,
    /// Kernel mode: the kernel's object for this CQ (its handle), whose
    /// completion channel the module signals when a completion lands on the
    /// armed CQ.
    kernel: OnceLock<(Kernel, u32)>,
    /// Kernel mode: the module is told the ring, so that it may raise the
    /// CQ's events itself (XIW_KERNEL_EVENTS).
    kernel_events: AtomicBool,
}

impl Cq {
    pub fn new(id: u32, cqe: u32, rings: Option<Kernel>) -> std::io::Result<Cq> {
        let ring = Box::new(Ring::new(RING_KIND_CQ, cqe + 1, CQE_SIZE, id, rings)?);
        Ok(Cq {
            id,
            ring: AtomicPtr::new(Box::into_raw(ring)),
            produce: parking_lot::Mutex::new(()),
            consume: parking_lot::Mutex::new(()),
            overflowed: AtomicBool::new(false),
            owed: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            held: AtomicU32::new(0),
            qps: Mutex::new(Vec::new()),
            next_assist: AtomicUsize::new(0),
            kernel: OnceLock::new(),
            kernel_events: AtomicBool::new(false),
        })
    }

    /// The ring in use.
    ///
    /// # Safety
    /// The caller holds `produce` or `consume` while it uses the reference
    /// (so no resize frees the ring meanwhile).
    unsafe fn ring(&self) -> &Ring {
        // SAFETY: the pointer is the live owned ring, as the caller's lock
        // guarantees.
        unsafe { &*self.ring.load(Ordering::Acquire) }
    }

    /// Capacity reported to the application.
    pub fn capacity(&self) -> u32 {
        let _g = self.produce.lock();
        // SAFETY: `produce` is held.
        unsafe { self.ring() }.entries - 1
    }

    /// `ibv_resize_cq`: a ring for at least `cqe` completions takes the
    /// place of the one in use, with the completions not yet polled (in
    /// order) and the arm word. EINVAL if fewer than those would fit; ENOMEM
    /// if the ring cannot be had. The producers and consumers wait meanwhile.
    pub fn resize(&self, cqe: u32) -> Result<(), Error> {
        let _c = self.consume.lock();
        let _p = self.produce.lock();
        // SAFETY: both locks are held.
        let old = unsafe { self.ring() };
        let used = old.used();
        if cqe < used {
            return Err(Error::invalid(
                "fewer completions would fit than wait to be polled",
            ));
        }
        let new = Box::new(
            // Kernel mode: the new ring is the module's memory too.
            Ring::new(
                RING_KIND_CQ,
                cqe + 1,
                CQE_SIZE,
                self.id,
                self.kernel.get().map(|&(k, _)| k),
            )
            .map_err(|e| Error::ring(&e))?,
        );
        let c = old.consumer();
        for i in 0..used {
            // SAFETY: slots in [consumer, producer) of the old ring are
            // published, and both locks are held; the new ring is empty and
            // its first `used` slots fit (cqe >= used).
            unsafe {
                let cqe: Cqe = old.read(c.wrapping_add(i), 0);
                new.write(i, 0, cqe);
            }
        }
        new.publish(used);
        // The module may take the old arm word until it learns of the new
        // ring: an event it signals meanwhile leaves this one armed, which
        // costs the application one wake-up more, never one less.
        let arm = old.header().arm.load(Ordering::Acquire);
        new.header().arm.store(arm, Ordering::Release);
        let ring = new.kernel_offset();
        let old = self.ring.swap(Box::into_raw(new), Ordering::AcqRel);
        // SAFETY: the ring this CQ owned; with both locks held no one holds
        // a reference to it.
        drop(unsafe { Box::from_raw(old) });
        self.tell_ring(ring);
        Ok(())
    }

    /// Kernel mode: names the ring at `offset` to the module as this CQ's,
    /// so that it may signal the completion channel itself. A module that
    /// cannot leaves that to [`Cq::push`] alone.
    fn tell_ring(&self, offset: Option<u64>) {
        if !self.kernel_events.load(Ordering::Relaxed) {
            return;
        }
        if let (Some((k, h)), Some(off)) = (self.kernel.get(), offset) {
            let _ = k.cq_ring(*h, off);
        }
    }

    /// Removes the completions of QP `qpn` not yet polled, keeping the
    /// others in order (a QP moved to RESET: what it completed before is
    /// gone with it, as on other RNICs). The producers and consumers wait.
    pub fn purge(&self, qpn: u32) {
        let _c = self.consume.lock();
        let _p = self.produce.lock();
        // SAFETY: both locks are held.
        let ring = unsafe { self.ring() };
        let c = ring.consumer();
        let mut kept = 0u32;
        for i in 0..ring.used() {
            // SAFETY: slots in [consumer, producer) are published; both locks
            // are held, and a slot is rewritten only after it was read (kept
            // <= i).
            unsafe {
                let cqe: Cqe = ring.read(c.wrapping_add(i), 0);
                if cqe.qp_num != qpn {
                    ring.write(c.wrapping_add(kept), 0, cqe);
                    kept += 1;
                }
            }
        }
        ring.publish(c.wrapping_add(kept));
    }

    /// Before the application arms the CQ again: a completion whose event
    /// the module raised already (the application re-arms after that event,
    /// and polls next) is stored first, by this thread if it can; stored
    /// after the arming, it would raise a second event for the completion
    /// the coming poll returns.
    pub fn settle_owed(&self) {
        self.collect_signalled(true);
        if self.owed.load(Ordering::Acquire) == 0 {
            return;
        }
        self.work_owed(std::time::Duration::from_millis(10), || false);
    }

    /// Arms the CQ (`ibv_req_notify_cq`): `arm` is `CQ_ARM_NEXT` or
    /// `CQ_ARM_SOLICITED`. Under the producer lock, so no resize loses it.
    pub fn arm(&self, arm: u32) {
        let _g = self.produce.lock();
        // SAFETY: `produce` is held.
        unsafe { self.ring() }
            .header()
            .arm
            .store(arm, Ordering::Release);
    }

    /// Kernel mode: the kernel's object for this CQ.
    /// With `events`, the module may raise its events itself.
    pub fn set_kernel(&self, k: Kernel, handle: u32, events: bool) {
        let _ = self.kernel.set((k, handle));
        self.kernel_events.store(events, Ordering::Relaxed);
        let ring = {
            let _g = self.produce.lock();
            // SAFETY: `produce` is held.
            unsafe { self.ring() }.kernel_offset()
        };
        self.tell_ring(ring);
    }

    /// Kernel mode: the handle of the kernel's object for this CQ.
    pub fn kernel_handle(&self) -> Option<u32> {
        self.kernel.get().map(|&(_, h)| h)
    }

    /// Stores one completion; false if the CQ is full (an overrun). On a CQ
    /// armed for it, the completion also disarms the CQ and (kernel mode)
    /// signals its completion channel; stored by a thread inside
    /// `ibv_poll_cq` of this CQ, whose poll returns it, the event waits for
    /// the end of that poll (see [`Polling`]).
    #[inline(always)]
    pub fn push(&self, cqe: Cqe) -> bool {
        let kernel = self.kernel.get().is_some();
        let signal = kernel && !Polling::defers(self, &cqe);
        let event = {
            let _g = self.produce.lock();
            // SAFETY: `produce` is held.
            let ring = unsafe { self.ring() };
            let p = ring.producer();
            if p.wrapping_sub(ring.consumer()) >= ring.entries - 1 {
                self.overflowed.store(true, Ordering::Release);
                return false;
            }
            // SAFETY: slot `p` is free (fewer than `entries` in use) and only producers,
            // serialised by `produce`, write it.
            unsafe { ring.write(p, 0, cqe) };
            ring.publish(p.wrapping_add(1));
            if signal && self.waiting.load(Ordering::Relaxed) != 0 {
                // A poll waits for an owed completion and returns this one:
                // its event is that poll's to raise if it is left.
                self.held.fetch_or(held_bits(&cqe), Ordering::Relaxed);
                false
            } else {
                signal && disarm_for(ring, &cqe)
            }
        };
        if event {
            if let Some((k, h)) = self.kernel.get() {
                // The CQ may be on its way out (its kernel object destroyed
                // meanwhile): then there is no channel left to signal.
                let _ = k.cq_notify(*h);
            }
        }
        true
    }

    /// Takes up to `max` completions, handing each to `f`.
    pub fn poll(&self, max: usize, mut f: impl FnMut(usize, &Cqe)) -> usize {
        let _g = self.consume.lock();
        // SAFETY: `consume` is held.
        let ring = unsafe { self.ring() };
        let c = ring.consumer();
        let avail = ring.producer().wrapping_sub(c) as usize;
        let n = avail.min(max);
        for i in 0..n {
            // SAFETY: slots in [consumer, producer) are published and owned by consumers,
            // serialised by `consume`.
            let cqe: Cqe = unsafe { ring.read(c.wrapping_add(i as u32), 0) };
            f(i, &cqe);
        }
        if n > 0 {
            ring.release(c.wrapping_add(n as u32));
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
        // SAFETY: the caller holds the consumer lock.
        let ring = unsafe { self.ring() };
        let c = ring.consumer();
        if ring.producer() == c {
            return None;
        }
        // SAFETY: the slot is published and the caller holds the consumer lock.
        Some(unsafe { ring.read(c, 0) })
    }

    /// With the consumer lock held: consumes the completion at the consumer index.
    pub fn advance(&self) {
        // SAFETY: the caller holds the consumer lock.
        let ring = unsafe { self.ring() };
        ring.release(ring.consumer().wrapping_add(1));
    }

    pub fn attach<A: Assist + 'static>(&self, qp: &Arc<A>) {
        let qp: Weak<A> = Arc::downgrade(qp);
        let qp: Weak<dyn Assist> = qp;
        let mut qps = self.qps.lock();
        qps.retain(|w| w.strong_count() > 0);
        qps.push(qp);
    }

    /// The application armed this CQ and will wait for its event: no QP of
    /// it may count on the application's polling to notice its stream.
    /// Under the list's lock, as [`Cq::collect_signalled`]: a QP's part is
    /// a store to its events slot, and gathering the QPs first cost an
    /// allocation on every arming.
    pub fn app_waits(&self) {
        let qps = self.qps.lock();
        for q in qps.iter().filter_map(|q| q.upgrade()) {
            q.app_waits();
        }
    }

    /// Does the data-path work of the CQ's QPs until no completion is owed
    /// or `found` says there is one to return; false if `patience` ran
    /// out first. The clock is read only from the second round on: the
    /// first mostly pays what is owed, and a clock read is a system call
    /// where the vDSO cannot read the clock source (a guest on HPET).
    fn work_owed(&self, patience: std::time::Duration, mut found: impl FnMut() -> bool) -> bool {
        let mut start = None;
        loop {
            self.assist();
            if found() || self.owed.load(Ordering::Acquire) == 0 {
                return true;
            }
            if start.get_or_insert_with(std::time::Instant::now).elapsed() > patience {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Kernel events: the module counts the messages it raised this CQ's
    /// event for in their QP's events slot the moment it does, while the
    /// thread that stores their completions takes the count only once it
    /// reads them. An application thread about to arm the CQ, or finding it
    /// empty after an event, takes the counts itself, so that it waits for
    /// those completions instead of arming for them again (a second event)
    /// or giving up on them. `wait`: for the QP list's lock (else a thread
    /// changing the list means nothing is taken this time).
    fn collect_signalled(&self, wait: bool) {
        if !self.kernel_events.load(Ordering::Relaxed) {
            return;
        }
        let qps = if wait {
            self.qps.lock()
        } else {
            match self.qps.try_lock() {
                Some(q) => q,
                None => return,
            }
        };
        for q in qps.iter().filter_map(|q| q.upgrade()) {
            q.collect_signalled(self);
        }
    }

    /// The messages the module counted in `slot` of `ev` (a QP whose receive
    /// CQ this is) as it raised this CQ's event for them are owed here from
    /// now on. Owed before they are taken from the slot, so that no thread
    /// arming the CQ meanwhile finds them neither counted there nor owed
    /// (it would arm for them again: a second event); a thread that took
    /// fewer (another took them) gives back the difference.
    pub fn owe_signalled(&self, ev: &crate::events_page::StreamEvents, slot: u32) {
        let seen = ev.signalled(slot);
        if seen == 0 {
            return;
        }
        self.owed.fetch_add(seen, Ordering::AcqRel);
        let took = ev.take_signalled(slot);
        if took > seen {
            self.owed.fetch_add(took - seen, Ordering::AcqRel);
        } else if took < seen {
            let _ = self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    Some(n.saturating_sub(seen - took))
                });
        }
    }

    /// A receive completion was stored: one owed, if any, is no more.
    #[inline]
    pub fn paid(&self) {
        if self.owed.load(Ordering::Relaxed) != 0 {
            let _ = self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    /// An application polled this CQ, found it empty and did its QPs' work
    /// (see [`Cq::assist`]), and found it empty again: if the module raised
    /// the event of a receive completion not stored yet (another thread is
    /// storing it), waits for it a while, so that the poll that follows a
    /// completion event finds that completion. Returns what `poll` found,
    /// and the events held back meanwhile ([`HeldEvent`]), for the caller
    /// to raise once the completions it returns are consumed. `collected`:
    /// the caller's [`Cq::assist`] covered every QP of the CQ, and so took
    /// their counts of messages signalled already.
    pub fn poll_owed(
        &self,
        collected: bool,
        mut poll: impl FnMut() -> usize,
    ) -> (usize, HeldEvent) {
        const PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);
        if !collected {
            self.collect_signalled(false);
        }
        if self.owed.load(Ordering::Acquire) == 0 {
            return (0, HeldEvent::default());
        }
        {
            let _g = self.produce.lock();
            self.waiting.fetch_add(1, Ordering::Relaxed);
        }
        let mut got = 0;
        let paid = self.work_owed(PATIENCE, || {
            got = poll();
            got > 0
        });
        if got == 0 {
            if !paid {
                // Whoever holds the stream is slow, or the message failed
                // without a completion: completions raise their own events.
                self.owed.store(0, Ordering::Release);
            }
            // Stored meanwhile by the thread that held the stream, if any.
            got = poll();
        }
        let held = {
            let _g = self.produce.lock();
            if self.waiting.fetch_sub(1, Ordering::Relaxed) == 1 {
                self.held.swap(0, Ordering::Relaxed)
            } else {
                0
            }
        };
        (got, HeldEvent(held))
    }

    /// An application polled this CQ and found it empty: let that thread do
    /// the data-path work of one of the CQ's QPs (round-robin). True if
    /// that was the CQ's only QP: its assist took whatever the module
    /// counted for the CQ ([`Assist::collect_signalled`]), and nothing is
    /// left for [`Cq::poll_owed`] to collect.
    pub fn assist(&self) -> bool {
        let (qp, sole) = {
            let Some(qps) = self.qps.try_lock() else {
                return false;
            };
            if qps.is_empty() {
                return false;
            }
            let i = self.next_assist.fetch_add(1, Ordering::Relaxed) % qps.len();
            (qps[i].upgrade(), qps.len() == 1)
        };
        match qp {
            Some(qp) => {
                qp.assist();
                sole
            }
            None => false,
        }
    }
}

/// A thread inside `ibv_poll_cq`: the completions it stores on that CQ
/// while it does the data-path work (its poll returns them) raise no event
/// of their own; when the poll is over, if any is left unpolled, the event
/// is raised then (when the `Polling` is dropped). So an application woken by the
/// module's early event (the message came, its completion not stored yet)
/// and polling does not get a second event for the completion it polled,
/// nor lose the event of one it did not.
pub struct Polling<'a> {
    cq: &'a Cq,
}

thread_local! {
    /// The CQ this thread polls (its address; 0: none), and the events
    /// held back meanwhile (the `held` bits of [`HeldEvent`]).
    static POLLING: std::cell::Cell<(usize, u32)> =
        const { std::cell::Cell::new((0, 0)) };
}

impl<'a> Polling<'a> {
    pub fn begin(cq: &'a Cq) -> Polling<'a> {
        POLLING.with(|p| p.set((cq as *const Cq as usize, 0)));
        Polling { cq }
    }

    /// Whether `cq` is the CQ this thread polls: then `cqe`'s event is
    /// held back.
    fn defers(cq: &Cq, cqe: &Cqe) -> bool {
        POLLING.with(|p| {
            let (at, held) = p.get();
            if at != cq as *const Cq as usize {
                return false;
            }
            p.set((at, held | held_bits(cqe)));
            true
        })
    }
}

impl Polling<'_> {
    /// The work of the poll is over, but the completions it returns are
    /// consumed later (extended polling: at `end_poll`): the event held
    /// back, for [`Cq::raise_held`] then.
    pub fn finish(self) -> HeldEvent {
        let held = Polling::take();
        std::mem::forget(self);
        held
    }

    fn take() -> HeldEvent {
        HeldEvent(POLLING.with(|p| p.replace((0, 0))).1)
    }
}

impl Drop for Polling<'_> {
    /// The poll is over: an event held back is raised if completions are
    /// left in the CQ.
    fn drop(&mut self) {
        self.cq.raise_held(Polling::take());
    }
}

/// Events a poll held back (the `held` bits: 1 any completion, 2 one that a
/// solicited-only arming signals too), raised when that poll is over if
/// completions are left.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct HeldEvent(pub u32);

impl std::ops::BitOr for HeldEvent {
    type Output = HeldEvent;
    fn bitor(self, o: HeldEvent) -> HeldEvent {
        HeldEvent(self.0 | o.0)
    }
}

impl Cq {
    /// A poll held back an event: raised if completions are left unpolled
    /// and the CQ is armed for one of them.
    pub fn raise_held(&self, held: HeldEvent) {
        if held.0 == 0 {
            return;
        }
        let solicited = held.0 & 2 != 0;
        let event = {
            let _g = self.produce.lock();
            // SAFETY: `produce` is held.
            let ring = unsafe { self.ring() };
            ring.used() != 0 && take_arm(ring, solicited)
        };
        if event {
            if let Some((k, h)) = self.kernel.get() {
                let _ = k.cq_notify(*h);
            }
        }
    }
}

/// The `held` bits of a completion whose event is held back: 1, and 2 if a
/// solicited-only arming signals it (a solicited Send, a failure).
fn held_bits(cqe: &Cqe) -> u32 {
    if cqe.wc_flags & CQE_F_SOLICITED != 0 || cqe.status != 0 {
        3
    } else {
        1
    }
}

/// Whether `cqe`, just stored, is the event the CQ is armed for (any
/// completion after `ibv_req_notify_cq(cq, 0)`; after solicited-only arming,
/// a Send that asked for a solicited event or a failed request); if so the CQ
/// is disarmed. The caller holds the producer lock, which arming takes too.
/// In kernel mode the module may take the arm word first (it signals the
/// channel when a message that completes a receive arrives): whoever swaps
/// it to `CQ_ARM_NONE` signals.
fn disarm_for(ring: &Ring, cqe: &Cqe) -> bool {
    take_arm(ring, held_bits(cqe) & 2 != 0)
}

/// Takes the arm word if the CQ is armed for a completion (`solicited`:
/// one that a solicited-only arming signals too): true if this caller
/// raises the event (the module may take it first).
fn take_arm(ring: &Ring, solicited: bool) -> bool {
    let arm = &ring.header().arm;
    let now = arm.load(Ordering::Acquire);
    let due = now == CQ_ARM_NEXT || (now == CQ_ARM_SOLICITED && solicited);
    due && arm
        .compare_exchange(now, CQ_ARM_NONE, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: the ring this CQ owns; no one else can reach it any more.
        drop(unsafe { Box::from_raw(*self.ring.get_mut()) });
    }
}
