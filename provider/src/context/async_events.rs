//! Raising asynchronous events: on the provider's own queue behind the
//! context's async fd ([`crate::async_event`]), or in kernel mode on the
//! kernel's object, which reaches the kernel's async fd.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use xiw_abi::verbs::*;

use crate::kernel::{EventObject, Kernel};

/// `Qp::fail` without an async event (the application asked for the error state).
pub const NO_EVENT: u32 = u32::MAX;

pub struct AsyncEvents {
    /// Standalone mode: the events waiting for the application.
    pub queue: crate::async_event::Events,
    /// Kernel mode: the command fd the events are raised through instead.
    kernel: Option<Kernel>,
    /// Application handles of CQs and SRQs, for async events.
    handles: Mutex<HashMap<u32, usize>>,
}

impl AsyncEvents {
    pub(super) fn new(queue: crate::async_event::Events, kernel: Option<Kernel>) -> AsyncEvents {
        AsyncEvents {
            queue,
            kernel,
            handles: Mutex::new(HashMap::new()),
        }
    }

    /// Records the application handle of CQ or SRQ `id` (0: destroyed).
    pub fn set_handle(&self, id: u32, handle: usize) {
        let mut h = self.handles.lock();
        if handle == 0 {
            h.remove(&id);
        } else {
            h.insert(id, handle);
        }
    }

    /// The application handle of CQ or SRQ `id` (0 once destroyed).
    fn handle(&self, id: u32) -> usize {
        self.handles.lock().get(&id).copied().unwrap_or(0)
    }

    /// Raises `event` for the QP whose `ibv_qp` is in `handle` (0 once destroyed).
    pub fn qp_event(&self, handle: &AtomicUsize, event: u32) {
        if event != NO_EVENT {
            self.raise(EventObject::Qp, || handle.load(Ordering::Acquire), event);
        }
    }

    /// CQ `cq_id` overran: said in `log`, and raised on the CQ.
    pub fn cq_overflow(&self, log: &crate::log::Target, cq_id: u32) {
        crate::log::warn(log, format_args!("completion queue overrun"));
        self.raise(EventObject::Cq, || self.handle(cq_id), IBV_EVENT_CQ_ERR);
    }

    pub fn srq_limit_event(&self, srq_id: u32) {
        self.raise(
            EventObject::Srq,
            || self.handle(srq_id),
            IBV_EVENT_SRQ_LIMIT_REACHED,
        );
    }

    /// Raises `event` on the object `element` names (0: gone): through the
    /// provider's own async fd, or in kernel mode on the kernel's object
    /// (whose handle the object's verbs struct holds), which reaches the
    /// kernel's async fd.
    fn raise(&self, kind: EventObject, element: impl FnOnce() -> usize, event: u32) {
        let Some(k) = self.kernel else {
            return self.queue.post(element, event);
        };
        // Read under the queue's lock, which a destroy takes before the
        // object is freed.
        let handle = self.queue.locked(|| {
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
}
