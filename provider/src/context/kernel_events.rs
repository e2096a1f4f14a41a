//! Kernel mode: how the module reaches the context. Its events page, whose
//! slots the QPs' streams are marked in, and the eventfd it signals when
//! rdma_cm has set up a connection for one of the context's QPs (and, with
//! an events page, for stream events while the progress thread sleeps).

use parking_lot::RwLock;
use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::events_page::StreamEvents;
use crate::kernel::Kernel;

use super::reactor::{drain_eventfd, Reactor};
use super::registry::Registry;

#[derive(Default)]
pub struct KernelEvents {
    /// The eventfd the module signals for rdma_cm connections, and for
    /// stream events while the progress thread sleeps.
    cm: Option<OwnedFd>,
    /// The events page the module marks the QPs' streams in.
    pub page: Option<StreamEvents>,
    /// Its slots in use, and the QP of each.
    slots: RwLock<HashMap<u32, u32>>,
    /// The highest slot of the events page a QP of this context was given.
    last_slot: AtomicU32,
}

impl KernelEvents {
    /// Watches `ev`, the eventfd the module signals when rdma_cm has a
    /// connection for this context (see [`KernelEvents::on_cm`]).
    pub fn watch_cm(&mut self, ev: OwnedFd, reactor: &Reactor) -> io::Result<()> {
        reactor.watch_kernel_cm(&ev)?;
        self.cm = Some(ev);
        Ok(())
    }

    /// Takes every connection rdma_cm set up for this context's QPs (MPA
    /// done, the application told only once the stream is ours) and hands
    /// each to its QP in `qps`.
    pub(super) fn on_cm(&self, kernel: Option<Kernel>, qps: &Registry) {
        let (Some(k), Some(ev)) = (kernel, &self.cm) else {
            return;
        };
        // With an events page the eventfd also wakes the progress thread
        // for stream events, which cost no more system calls: it is read,
        // and the module asked, only when the module says a connection waits.
        if self.page.as_ref().is_some_and(|e| !e.take_cm()) {
            return;
        }
        drain_eventfd(ev);
        while let Ok(s) = k.take_stream() {
            // SAFETY: the module installed the descriptor for this process.
            let fd = unsafe { OwnedFd::from_raw_fd(s.fd) };
            match qps.get(s.qpn) {
                Some(qp) => qp.adopt_kernel(fd, &s),
                // The QP went meanwhile: so does the stream.
                None => drop(fd),
            }
        }
    }

    /// QP `qpn` has `slot` in the events page.
    pub fn register_slot(&self, slot: u32, qpn: u32) {
        self.last_slot.fetch_max(slot, Ordering::AcqRel);
        self.slots.write().insert(slot, qpn);
    }

    pub fn unregister_slot(&self, slot: u32) {
        self.slots.write().remove(&slot);
    }

    /// Carries out what the module marked on the streams of `qps` since the
    /// last call (the progress thread's share of it: a thread polling an
    /// empty CQ takes its QP's own).
    pub(super) fn on_stream_events(&self, qps: &Registry, log: &crate::log::Target) {
        self.take_marked(xiw_abi::events::HINT_PROGRESS, qps, log);
    }

    /// An application thread found its own CQ empty and its own QP quiet;
    /// it carries out what the module marked on the context's other streams
    /// (of `qps`), as the progress thread would. A program that busy-polls
    /// one CQ (perftest's rdma_cm exchange, say) while another QP of it
    /// serves a peer then answers that peer at once, instead of waking the
    /// progress thread and making it wait for a CPU the spinning thread holds.
    #[inline]
    pub fn assist_marked(&self, qps: &Registry, log: &crate::log::Target) {
        if self.page.as_ref().is_some_and(|e| e.any()) {
            self.take_marked(xiw_abi::events::HINT_APP, qps, log);
        }
    }

    /// Takes the marked slots and carries out their events; `hint` says
    /// who did (the module then wakes the progress thread for that slot's
    /// next marks at once, or a moment later).
    fn take_marked(&self, hint: u32, qps: &Registry, log: &crate::log::Target) {
        let Some(ev) = &self.page else {
            return;
        };
        let mut slots: smallvec::SmallVec<[u32; 8]> = smallvec::SmallVec::new();
        ev.drain(self.last_slot.load(Ordering::Acquire), |s| slots.push(s));
        for s in slots {
            let qpn = self.slots.read().get(&s).copied();
            let Some(qp) = qpn.and_then(|q| qps.get(q)) else {
                // A slot of a QP that is gone: what was marked is stale.
                ev.take(s);
                continue;
            };
            let bits = ev.take_marks(s);
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
                    log,
                    format_args!("internal error handling an event; QP {qpn:?} put in error"),
                );
                qp.fail_fatal("internal error");
            }
        }
    }
}
