//! Queue pairs: work queues, state, completions and flushing.
//!
//! Locks, always taken in this order: `cm` → `attrs` → `rx` → `tx`. A path that
//! holds a later lock never waits for an earlier one; errors found under a lock
//! are returned and acted on ([`Qp::fail`]) after it is dropped.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use xiw_abi::ring::{self, Cqe, SendWqe, Sge};
use xiw_abi::verbs::*;

use crate::context::Shared;
use crate::cq::Cq;
use crate::queue::Ring;
use crate::srq::Srq;
use crate::{cm, rx, tx};

pub const MAX_QP_WR: u32 = 16384;
pub use crate::queue::MAX_SGE;
pub const MAX_INLINE: u32 = 256;
/// IRD/ORD limit (RFC 6581 allows 14 bits; this is what xiw provisions).
pub const MAX_RD_ATOMIC: u32 = 128;
/// `IBV_WC_FLUSH` of rdma-core 45 and later (absent from 44's verbs.h).
pub const WC_FLUSH: u32 = 8;

#[derive(Clone, Copy, Debug, Default)]
pub struct Caps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
}

/// Attributes set through modify_qp, reported by query_qp.
#[derive(Clone, Copy, Default)]
pub struct Attrs {
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub port_num: u8,
    pub path_mtu: u32,
    pub dest_qp_num: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub ah_attr: ibv_ah_attr,
}

pub use crate::queue::{post_recv_ring, take_recv_ring, RecvJob};

pub struct Qp {
    pub qpn: u32,
    pub sh: Arc<Shared>,
    pub pd: u32,
    pub send_cq: Arc<Cq>,
    pub recv_cq: Arc<Cq>,
    pub srq: Option<Arc<Srq>>,
    pub caps: Caps,
    pub sq_sig_all: bool,
    pub sq: Ring,
    pub rq: Option<Ring>,
    sq_post: Mutex<()>,
    rq_post: Mutex<()>,
    /// `enum ibv_qp_state`, mirrored for lock-free checks on the posting path.
    pub state: AtomicU32,
    pub attrs: Mutex<Attrs>,
    pub cm: Mutex<cm::Cm>,
    pub rx: Mutex<rx::Rx>,
    pub tx: Mutex<tx::Tx>,
    /// Someone asked for transmission while the `tx` lock was held.
    pub tx_want: AtomicBool,
    /// The socket was full last time: bytes are waiting to go out.
    pub tx_blocked: AtomicBool,
    /// The peer closed its end: nothing more to read, sending goes on.
    pub rx_eof: AtomicBool,
    /// The `ibv_qp` the application holds, for async events; 0 once destroyed.
    pub handle: AtomicUsize,
    pub destroyed: AtomicBool,
    /// First error status reported for the SQ head when the QP fails.
    pub last_error: AtomicU32,
    /// A failure found where it could not be acted on (see [`Qp::defer_fail`]).
    deferred: Mutex<Option<rx::Fail>>,
}

impl Qp {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sh: Arc<Shared>,
        pd: u32,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        srq: Option<Arc<Srq>>,
        caps: Caps,
        sq_sig_all: bool,
    ) -> std::io::Result<Qp> {
        let qpn = sh.alloc_qpn()?;
        let guard = QpnGuard { sh: &sh, qpn };
        let sq = Ring::new(
            ring::RING_KIND_SQ,
            caps.max_send_wr.max(1),
            ring::send_stride(caps.max_send_sge, caps.max_inline),
            qpn,
        )?;
        let rq = match srq {
            Some(_) => None,
            None => Some(Ring::new(
                ring::RING_KIND_RQ,
                caps.max_recv_wr.max(1),
                ring::recv_stride(caps.max_recv_sge),
                qpn,
            )?),
        };
        let entries = sq.entries;
        std::mem::forget(guard);
        Ok(Qp {
            qpn,
            pd,
            send_cq,
            recv_cq,
            srq,
            caps,
            sq_sig_all,
            sq,
            rq,
            sq_post: Mutex::new(()),
            rq_post: Mutex::new(()),
            state: AtomicU32::new(IBV_QPS_RESET),
            attrs: Mutex::new(Attrs::default()),
            cm: Mutex::new(cm::Cm::default()),
            rx: Mutex::new(rx::Rx::default()),
            tx: Mutex::new(tx::Tx::new(entries)),
            tx_want: AtomicBool::new(false),
            tx_blocked: AtomicBool::new(false),
            rx_eof: AtomicBool::new(false),
            handle: AtomicUsize::new(0),
            destroyed: AtomicBool::new(false),
            last_error: AtomicU32::new(IBV_WC_SUCCESS),
            deferred: Mutex::new(None),
            sh,
        })
    }

    pub fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// The transmit side, for work other than transmitting. Whoever holds it
    /// makes [`tx::kick`] give up on other threads (it only try-locks and leaves
    /// `tx_want` set), so the guard transmits on their behalf when released.
    pub fn lock_tx(&self) -> TxGuard<'_> {
        TxGuard {
            g: Some(self.tx.lock().unwrap_or_else(|e| e.into_inner())),
            qp: self,
        }
    }

    /// [`Qp::lock_tx`] if nobody holds it now.
    pub fn try_lock_tx(&self) -> Option<TxGuard<'_>> {
        let g = match self.tx.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::WouldBlock) => return None,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        Some(TxGuard {
            g: Some(g),
            qp: self,
        })
    }

    pub fn lock_rx(&self) -> MutexGuard<'_, rx::Rx> {
        self.rx.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lock_cm(&self) -> MutexGuard<'_, cm::Cm> {
        self.cm.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes send WQEs into the SQ ring. `Err((index, errno))` names the first refused.
    pub fn post_send(
        &self,
        wqes: &mut dyn Iterator<Item = Result<(SendWqe, SendBody), i32>>,
    ) -> Result<(), (usize, i32)> {
        self.post_send_with(wqes, 0)
    }

    /// Posts all of `items` or, when the queue lacks room or the QP is in RESET,
    /// none of them (`ibv_wr_complete`).
    pub fn post_batch(&self, items: Vec<(SendWqe, SendBody)>) -> Result<(), (usize, i32)> {
        let n = items.len();
        self.post_send_with(&mut items.into_iter().map(Ok), n)
    }

    fn post_send_with(
        &self,
        wqes: &mut dyn Iterator<Item = Result<(SendWqe, SendBody), i32>>,
        need_room: usize,
    ) -> Result<(), (usize, i32)> {
        self.sh.note_app_cpu();
        let limit = self.caps.max_send_wr.max(1).min(self.sq.entries);
        let guard = self.sq_post.lock().unwrap_or_else(|e| e.into_inner());
        // Posting is allowed from INIT on; the WQEs wait for the connection (IB
        // verbs 11.4.1.1). Checked under the lock: a reset sets RESET before it
        // empties the ring under it, so nothing posted here outlives the reset.
        if self.state() == IBV_QPS_RESET {
            return Err((0, libc::EINVAL));
        }
        let mut p = self.sq.producer();
        let free = limit.saturating_sub(p.wrapping_sub(self.sq.consumer()));
        if need_room > free as usize {
            return Err((0, libc::ENOMEM));
        }
        let mut result = Ok(());
        for (i, item) in wqes.enumerate() {
            let (mut wqe, body) = match item {
                Ok(v) => v,
                Err(e) => {
                    result = Err((i, e));
                    break;
                }
            };
            if p.wrapping_sub(self.sq.consumer()) >= limit {
                result = Err((i, libc::ENOMEM));
                break;
            }
            if self.sq_sig_all {
                wqe.flags |= ring::wqe_flag::SIGNALED;
            }
            // SAFETY: slot `p` is free (fewer than `entries` in use) and producers are
            // serialised by `sq_post`; the body fits the stride (checked by the caller
            // against max_send_sge / max_inline, which sized the stride).
            unsafe {
                self.sq.write(p, 0, wqe);
                match &body {
                    SendBody::Sges(sges) => {
                        for (k, s) in sges.iter().enumerate() {
                            self.sq
                                .write(p, size_of::<SendWqe>() + k * size_of::<Sge>(), *s);
                        }
                    }
                    SendBody::Inline(bytes) => {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            self.sq.slot(p).add(size_of::<SendWqe>()),
                            bytes.len(),
                        );
                    }
                }
            }
            p = p.wrapping_add(1);
            self.sq.publish(p);
        }
        drop(guard);
        if self.state() == IBV_QPS_ERR {
            self.flush();
        } else {
            tx::kick(self);
        }
        result
    }

    pub fn post_recv(&self, jobs: &[RecvJob]) -> Result<(), (usize, i32)> {
        let Some(rq) = &self.rq else {
            return Err((0, libc::EINVAL));
        };
        let g = self.rq_post.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock, as for post_send.
        if self.state() == IBV_QPS_RESET {
            return Err((0, libc::EINVAL));
        }
        let r = post_recv_ring(rq, self.caps.max_recv_sge, jobs);
        drop(g);
        if self.state() == IBV_QPS_ERR {
            self.flush();
        }
        r
    }

    /// Next receive WQE for an incoming Send: from the SRQ or the QP's own RQ.
    pub fn take_recv(&self) -> Option<RecvJob> {
        match &self.srq {
            Some(srq) => {
                let (job, fired) = srq.take()?;
                if fired {
                    self.sh.srq_limit_event(srq.id);
                }
                Some(job)
            }
            None => take_recv_ring(self.rq.as_ref()?),
        }
    }

    /// Reports a send-side completion (in order) to the send CQ.
    pub fn complete_send(&self, wqe: &SendWqe, status: u32) {
        self.complete_send_len(wqe, status, None)
    }

    /// As [`Qp::complete_send`], with `len` for byte_len when given.
    pub fn complete_send_len(&self, wqe: &SendWqe, status: u32, len: Option<u32>) {
        let signaled = wqe.flags & ring::wqe_flag::SIGNALED != 0;
        if status == IBV_WC_SUCCESS && !signaled {
            return;
        }
        let opcode = match wqe.opcode {
            ring::op::SEND | ring::op::SEND_INV | ring::op::SEND_IMM => IBV_WC_SEND,
            ring::op::WRITE | ring::op::WRITE_IMM => IBV_WC_RDMA_WRITE,
            ring::op::READ => IBV_WC_RDMA_READ,
            ring::op::ATOMIC_CMP_SWP | ring::op::ATOMIC_MASKED_CMP_SWP | ring::op::ATOMIC_SWAP => {
                IBV_WC_COMP_SWAP
            }
            ring::op::ATOMIC_FETCH_ADD | ring::op::ATOMIC_MASKED_FETCH_ADD => IBV_WC_FETCH_ADD,
            ring::op::LOCAL_INV => IBV_WC_LOCAL_INV,
            ring::op::ATOMIC_WRITE => IBV_WC_ATOMIC_WRITE,
            ring::op::FLUSH => WC_FLUSH,
            ring::op::VERIFY => IBV_WC_DRIVER1,
            _ => IBV_WC_SEND,
        };
        let byte_len = match wqe.opcode {
            ring::op::READ => wqe.length,
            ring::op::ATOMIC_CMP_SWP
            | ring::op::ATOMIC_FETCH_ADD
            | ring::op::ATOMIC_MASKED_CMP_SWP
            | ring::op::ATOMIC_MASKED_FETCH_ADD
            | ring::op::ATOMIC_SWAP
            | ring::op::ATOMIC_WRITE => 8,
            _ => 0,
        };
        let byte_len = len.unwrap_or(byte_len);
        self.push_cqe(
            &self.send_cq,
            Cqe {
                wr_id: wqe.wr_id,
                byte_len,
                qp_num: self.qpn,
                opcode: opcode as u8,
                status: status as u8,
                ..Default::default()
            },
        );
    }

    pub fn push_cqe(&self, cq: &Cq, cqe: Cqe) {
        if !cq.push(cqe) {
            self.sh.cq_overflow(cq.id);
        }
    }

    /// Moves the QP to the error state, closes the stream, reports `sq_status` for
    /// the oldest outstanding send WQE and `rq_status` for a receive in progress,
    /// flushes everything else, and raises `event`.
    pub fn fail(&self, why: &str, sq_status: Option<u32>, rq_status: Option<u32>, event: u32) {
        self.to_error(why, sq_status, rq_status, event, false)
    }

    /// `fail`, or (`asked`) the application's own modify_qp to the error state,
    /// which applies in any state. A failure found by another thread is dropped
    /// once the QP is back in RESET or INIT: it belongs to a connection that is
    /// gone, and must not end the next one.
    pub fn to_error(
        &self,
        why: &str,
        sq_status: Option<u32>,
        rq_status: Option<u32>,
        event: u32,
        asked: bool,
    ) {
        let prev = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (asked || (s != IBV_QPS_RESET && s != IBV_QPS_INIT)).then_some(IBV_QPS_ERR)
            });
        let Ok(prev) = prev else {
            crate::log::debug(
                &self.sh.log,
                format_args!("qp {}: ignored after a reset: {}", self.qpn, why),
            );
            return;
        };
        // The first error found names the status of the oldest request, even when
        // another thread moves the QP to the error state first.
        if let Some(s) = sq_status {
            let _ = self.last_error.compare_exchange(
                IBV_WC_SUCCESS,
                s,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        if prev != IBV_QPS_ERR && prev != IBV_QPS_RESET {
            crate::log::debug(
                &self.sh.log,
                format_args!("qp {}: error: {}", self.qpn, why),
            );
            self.detach_stream();
            self.lock_cm().close(&self.sh);
            if let Some(s) = rq_status {
                let job = self.lock_rx().engine.take_current();
                if let Some(job) = job {
                    self.complete_recv_error(&job, s);
                }
            }
            if !self.destroyed.load(Ordering::Acquire) {
                self.sh.qp_event(self, event);
            }
        }
        self.flush();
    }

    /// Data-path work done by an application thread that polls an empty CQ of
    /// this QP: finish a blocked transmission and take in whatever has arrived,
    /// so a busy-polling application moves its own data instead of waiting for
    /// the progress thread to be scheduled. Called with no locks held.
    pub fn assist(&self) {
        if self.destroyed.load(Ordering::Acquire) {
            return;
        }
        self.sh.note_app_cpu();
        if self.tx_blocked.load(Ordering::Acquire) {
            tx::kick(self);
        }
        if let Err(f) = rx::poll_readable(self) {
            self.fail_with(f);
        }
    }

    /// Frees staging buffers left over from traffic once the QP has been idle
    /// for a trim period; true while it still holds large ones.
    pub fn trim(&self) -> bool {
        let rx = self.rx.try_lock().map(|mut r| r.trim()).unwrap_or(true);
        let tx = self.try_lock_tx().map(|mut t| t.trim()).unwrap_or(true);
        rx || tx
    }

    /// Records a failure for the progress thread to apply (the first one wins).
    pub fn defer_fail(&self, f: rx::Fail) {
        let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_none() {
            *d = Some(f);
            drop(d);
            self.sh.defer_fail(self.qpn);
        }
    }

    /// Applies a deferred failure; called with no locks held.
    pub fn apply_deferred(&self) {
        let f = self
            .deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(f) = f {
            self.fail_with(f);
        }
    }

    /// Takes the stream away from the data path, before the connection manager
    /// gives up the descriptor.
    pub fn detach_stream(&self) {
        self.lock_rx().fd = None;
        self.lock_tx().fd = None;
    }

    /// Tells the peer why (a Terminate, if the stream still works), then fails the QP.
    /// Must be called with none of this QP's locks held.
    pub fn fail_with(&self, f: rx::Fail) {
        if f.term.is_none() {
            // A responder's stream that ends before the initiator's first FPDU
            // belonged to an abandoned attempt: wait for the next one instead.
            let r = self.lock_cm().reopen(self);
            match r {
                Ok(true) => return,
                Ok(false) => {}
                Err(why) => return self.fail(&why, None, None, IBV_EVENT_QP_FATAL),
            }
        }
        if f.linger && self.lock_cm().linger(self) {
            return;
        }
        if let Some(body) = f.term {
            let mut tx = self.lock_tx();
            if let Some(fd) = tx.fd {
                tx.engine.terminate(body);
                for _ in 0..20 {
                    if tx.run(self).is_err() || !tx.pending() {
                        break;
                    }
                    let mut pfd = libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd; the fd stays open while the QP lives.
                    unsafe { libc::poll(&mut pfd, 1, 5) };
                }
            }
        }
        self.fail(
            &f.why,
            f.sq_status.map(crate::ibv::status),
            f.rq_status.map(crate::ibv::status),
            crate::ibv::event(f.event),
        );
    }

    pub(crate) fn complete_recv_error(&self, job: &RecvJob, status: u32) {
        self.push_cqe(
            &self.recv_cq,
            Cqe {
                wr_id: job.wr_id,
                qp_num: self.qpn,
                opcode: IBV_WC_RECV as u8,
                status: status as u8,
                ..Default::default()
            },
        );
    }

    /// Completes every outstanding WQE with IBV_WC_WR_FLUSH_ERR (the first SQ one
    /// with the recorded error status). Only in the error state.
    pub fn flush(&self) {
        if self.state() != IBV_QPS_ERR {
            return;
        }
        if let Some(rq) = &self.rq {
            let mut rx = self.lock_rx();
            if let Some(job) = rx.engine.take_current() {
                self.complete_recv_error(&job, IBV_WC_WR_FLUSH_ERR);
            }
            let _g = self.rq_post.lock().unwrap_or_else(|e| e.into_inner());
            while let Some(job) = take_recv_ring(rq) {
                self.complete_recv_error(&job, IBV_WC_WR_FLUSH_ERR);
            }
        } else if let Some(job) = self.lock_rx().engine.take_current() {
            self.complete_recv_error(&job, IBV_WC_WR_FLUSH_ERR);
        }
        let mut tx = self.lock_tx();
        tx.flush(self);
    }

    /// Brings the QP back to RESET: empty queues, fresh protocol state, same QPN.
    /// The state is RESET first, so that a post racing this is refused or
    /// emptied with the rest.
    pub fn reset(&self) {
        self.state.store(IBV_QPS_RESET, Ordering::Release);
        *self.deferred.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.detach_stream();
        self.lock_cm().reset(&self.sh);
        let mut rx = self.lock_rx();
        *rx = rx::Rx::default();
        self.rx_eof.store(false, Ordering::Release);
        if let Some(rq) = &self.rq {
            let _g = self.rq_post.lock().unwrap_or_else(|e| e.into_inner());
            rq.release(rq.producer());
        }
        drop(rx);
        let _g = self.sq_post.lock().unwrap_or_else(|e| e.into_inner());
        let mut tx = self.lock_tx();
        *tx = tx::Tx::new(self.sq.entries);
        tx.next = self.sq.producer();
        self.sq.release(self.sq.producer());
        self.last_error.store(IBV_WC_SUCCESS, Ordering::Release);
    }
}

/// Gives the QP number back if construction fails half-way.
struct QpnGuard<'a> {
    sh: &'a Shared,
    qpn: u32,
}

impl Drop for QpnGuard<'_> {
    fn drop(&mut self) {
        self.sh.free_qpn(self.qpn);
    }
}

impl crate::cq::Assist for Qp {
    fn assist(&self) {
        Qp::assist(self)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.sh.free_qpn(self.qpn);
    }
}

/// The payload of a send WQE as posted.
pub enum SendBody {
    Sges(SgeList),
    Inline(InlineBytes),
}

/// A work request's SGEs: a few without a heap allocation.
pub type SgeList = smallvec::SmallVec<[Sge; 4]>;
/// Inline payload, copied at post time (at most `MAX_INLINE` bytes).
pub type InlineBytes = smallvec::SmallVec<[u8; 64]>;

/// See [`Qp::lock_tx`].
pub struct TxGuard<'a> {
    g: Option<MutexGuard<'a, tx::Tx>>,
    qp: &'a Qp,
}

impl std::ops::Deref for TxGuard<'_> {
    type Target = tx::Tx;
    fn deref(&self) -> &tx::Tx {
        self.g.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for TxGuard<'_> {
    fn deref_mut(&mut self) -> &mut tx::Tx {
        self.g.as_mut().expect("held until dropped")
    }
}

impl Drop for TxGuard<'_> {
    fn drop(&mut self) {
        drop(self.g.take());
        if self.qp.tx_want.load(Ordering::SeqCst) {
            tx::kick(self.qp);
        }
    }
}
