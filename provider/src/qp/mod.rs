//! Queue pairs: a [`QpCore`] with its connection setup ([`cm`]) and both
//! sides of its data path ([`rx`], [`tx`]), the state changes that span them
//! (failing, flushing, reset), and the QP as the progress thread sees it
//! ([`Endpoint`]).
//!
//! Locks, always taken in this order: `cm` → `attrs` → `rx` → `tx`. A path that
//! holds a later lock never waits for an earlier one; errors found under a lock
//! are returned and acted on ([`Qp::fail_with`]) after it is dropped.
//!
//! What a failure does, and when, is the engine's [`Lifecycle`](xiw_engine::lifecycle::Lifecycle) (in `cm`,
//! under its lock): this module carries out the actions it returns, the
//! failure itself ([`Qp::to_error`]) once `cm` is dropped again. Its
//! deadlines run on the progress thread's timers ([`Endpoint::tick`]), which
//! pass the time in; nothing here reads the clock.

pub mod cm;
pub mod core;
pub mod responder;
pub mod rx;
pub mod state;
pub mod tx;

use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

use xiw_abi::ring::{wqe_flag, SendWqe, Sge};
use xiw_abi::verbs::*;
use xiw_engine::fault::{Event, Status};
use xiw_engine::lifecycle::{Action, Step, Timings};
use xiw_engine::queue1::{Inbound, Refused};
use xiw_engine::{recv, send};

use self::core::QpCore;
use self::tx::{TxCell, TxGuard};
use crate::context::Endpoint;
use crate::error::Error;
use crate::mem::AccessError;
use crate::tcp::Request;

pub use self::core::{
    Attrs, Caps, InlineBytes, SendBody, SgeList, MAX_INLINE, MAX_QP_WR, MAX_RD_ATOMIC, MAX_SGE,
    WC_FLUSH,
};
pub use crate::queue::RecvJob;
use xiw_engine::fault::Fail;

pub struct Qp {
    core: QpCore,
    pub cm: Mutex<cm::Cm>,
    pub rx: Mutex<rx::Rx>,
    pub tx: TxCell,
}

impl std::ops::Deref for Qp {
    type Target = QpCore;
    fn deref(&self) -> &QpCore {
        &self.core
    }
}

impl Qp {
    /// The QP `core` with no connection yet.
    pub fn new(core: QpCore) -> Qp {
        let timings = Timings {
            connect_timeout: core.sh.cfg.connect_timeout,
            linger: core.sh.cfg.linger,
        };
        Qp {
            cm: Mutex::new(cm::Cm::new(timings)),
            rx: Mutex::new(rx::Rx::default()),
            tx: TxCell::new(core.sq.entries),
            core,
        }
    }

    /// The transmit side, for work other than transmitting (see [`TxCell::lock`]).
    pub fn lock_tx(&self) -> TxGuard<'_> {
        self.tx.lock(&self.core)
    }

    pub fn lock_rx(&self) -> MutexGuard<'_, rx::Rx> {
        self.rx.lock()
    }

    pub fn lock_cm(&self) -> MutexGuard<'_, cm::Cm> {
        self.cm.lock()
    }

    /// Transmits whatever can go (see [`TxCell::kick`]).
    pub fn kick(&self) {
        self.tx.kick(&self.core)
    }

    /// Writes send WQEs into the SQ ring. `Err((index, errno))` names the first refused.
    pub fn post_send(
        &self,
        wqes: &mut dyn Iterator<Item = Result<(SendWqe, SendBody), Error>>,
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
        wqes: &mut dyn Iterator<Item = Result<(SendWqe, SendBody), Error>>,
        need_room: usize,
    ) -> Result<(), (usize, i32)> {
        let r = self.core.write_send(wqes, need_room);
        if self.state() == IBV_QPS_ERR {
            self.flush();
        } else {
            self.kick();
        }
        r
    }

    /// A lone Send or RDMA Write (`op`, whose WQE `wqe` is) whose payload, `wqe.length` bytes that
    /// `fill` gathers at post time, fits one FPDU, framed and handed to the
    /// stream on the posting thread without passing through the send queue
    /// ring, when the QP is in RTS and nothing is queued or unfinished ahead
    /// of it. False, with nothing done, when it does not qualify or `fill`
    /// fails: it then goes the usual way ([`Qp::post_send`]).
    ///
    /// Completion order holds because the send queue is empty and stays so
    /// while `sq_post` is held: the completion is reported before another
    /// request can be posted. A request the socket did not take whole is
    /// put in the ring as taken, and completes as any other.
    pub fn post_now(
        &self,
        mut wqe: SendWqe,
        op: send::NowOp,
        fill: impl FnOnce(&mut [u8]) -> Result<(), AccessError>,
    ) -> bool {
        let mut posts = self.sq_post.lock();
        self.sh.app_cpu.note_sometimes(&mut posts);
        if self.state() != IBV_QPS_RTS {
            return false;
        }
        let p = self.sq.producer();
        if p != self.sq.consumer() {
            return false;
        }
        let Some(mut tx) = self.tx.try_lock(&self.core) else {
            return false;
        };
        if self.sq_sig_all {
            wqe.flags |= wqe_flag::SIGNALED;
        }
        // A request that completes once the peer confirms it goes the usual way.
        if self.sh.cfg.confirm && wqe.flags & wqe_flag::SIGNALED != 0 {
            return false;
        }
        let r = tx.send_now(&self.core, op, wqe.length as usize, fill);
        match r {
            Ok(None) => return false,
            Ok(Some(true)) => {
                self.complete_send(&wqe, IBV_WC_SUCCESS);
                return true;
            }
            Ok(Some(false)) | Err(_) => {}
        }
        wqe.flags &= !wqe_flag::INLINE;
        wqe.num_sge = 0;
        // SAFETY: the ring is empty, so slot `p` is free; producers are
        // serialised by `sq_post`, held here.
        unsafe { self.sq.write(p, 0, wqe) };
        self.sq.publish(p.wrapping_add(1));
        tx.owe(p);
        drop(tx);
        if let Err(f) = r {
            self.defer_fail(*f);
        }
        true
    }

    pub fn post_recv<'a>(
        &self,
        wrs: impl Iterator<Item = (u64, &'a [Sge])>,
    ) -> Result<(), (usize, i32)> {
        let r = self.core.write_recv(wrs);
        if self.state() == IBV_QPS_ERR {
            self.flush();
        }
        r
    }

    /// Fails the QP for a fault of its connection setup or of the provider
    /// itself: no status, a fatal event.
    pub fn fail(&self, why: &str) {
        self.to_error(why, None, None, Some(Event::QpFatal), false)
    }

    /// Moves the QP to the error state, for a failure (`sq_status` for the
    /// oldest outstanding send WQE, `rq_status` for a receive in progress,
    /// `event` raised) or, `asked`, the application's own modify_qp to the
    /// error state (no event), which applies in any state. A failure found
    /// by another thread is dropped once the QP is back in RESET or INIT: it
    /// belongs to a connection that is gone, and must not end the next one.
    /// What the move does, in order, is the lifecycle's
    /// ([`Lifecycle::entered_error`](xiw_engine::lifecycle::Lifecycle::entered_error)). Must be called with none of this QP's
    /// locks held.
    pub fn to_error(
        &self,
        why: &str,
        sq_status: Option<Status>,
        rq_status: Option<Status>,
        event: Option<Event>,
        asked: bool,
    ) {
        // Under the transmit lock, which flushing the send queue takes: a
        // thread that finds the QP in error and flushes meanwhile also finds
        // the status of the request that failed.
        let tx = self.lock_tx();
        let prev = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (asked || (s != IBV_QPS_RESET && s != IBV_QPS_INIT)).then_some(IBV_QPS_ERR)
            });
        let Ok(prev) = prev else {
            drop(tx);
            crate::log::debug(
                &self.sh.log,
                format_args!("qp {}: ignored after a reset: {}", self.qpn, why),
            );
            return;
        };
        // Kernel mode: the module places nothing more from the stream (what
        // it handed up is not taken: nothing from the stream is any more).
        if let Some((ev, slot)) = self.stream_events() {
            let _ = ev.recall(slot);
        }
        // The first error found names the status of the oldest request, even when
        // another thread moves the QP to the error state first.
        if let Some(s) = sq_status {
            let _ = self.last_error.compare_exchange(
                IBV_WC_SUCCESS,
                crate::verbs_status::status(s),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        drop(tx);
        let fresh = prev != IBV_QPS_ERR && prev != IBV_QPS_RESET;
        if fresh {
            crate::log::debug(
                &self.sh.log,
                format_args!("qp {}: error: {}", self.qpn, why),
            );
        }
        let steps = self.lock_cm().life.entered_error(fresh, rq_status, event);
        for step in steps {
            match step {
                Step::Detach => self.detach_stream(),
                Step::Close => self.lock_cm().close(&self.sh),
                Step::Mirror => self.core.mirror_state(IBV_QPS_ERR),
                Step::FailRecv(s) => {
                    let job = self.lock_rx().engine.take_current();
                    if let Some(job) = job {
                        self.complete_recv_error(&job, crate::verbs_status::status(s));
                    }
                }
                Step::Raise(e) => {
                    if !self.destroyed.load(Ordering::Acquire) {
                        self.sh
                            .async_events
                            .qp_event(&self.handle, crate::verbs_status::event(e));
                    }
                }
                Step::Flush => self.flush(),
            }
        }
    }

    /// Data-path work done by an application thread that polls an empty CQ of
    /// this QP: finish a blocked transmission and take in whatever has arrived,
    /// so a busy-polling application moves its own data instead of waiting for
    /// the progress thread to be scheduled. Called with no locks held.
    pub fn assist(&self) {
        if self.destroyed.load(Ordering::Acquire) {
            return;
        }
        self.sh.app_cpu.note();
        if let Some((ev, slot)) = self.stream_events() {
            // The module marked what happened on the stream: nothing, and
            // there is nothing to ask the socket.
            self.recv_cq.owe_signalled(ev, slot);
            let bits = ev.take_marks(slot);
            if bits == 0 {
                self.sh
                    .kernel_events
                    .assist_marked(&self.sh.qps, &self.sh.log);
                return;
            }
            ev.hint(slot, xiw_abi::events::HINT_APP);
            // Room to send again: transmit, whether or not the transmitting
            // thread has yet noted that it was blocked (the room may have come
            // between its full write and that note, and no mark follows).
            if bits & xiw_abi::events::EV_WRITABLE != 0 {
                self.kick();
            }
            // Taken from the slot, so read here, waiting for a thread that
            // reads already: it may have found the socket empty just before.
            // The stream's end, if marked, is read to (no mark follows it).
            self.read_marked(
                bits & xiw_abi::events::EV_DATA != 0,
                bits & xiw_abi::events::EV_CLOSED != 0,
            );
            return;
        }
        if self.tx_blocked.load(Ordering::Acquire) {
            self.kick();
        }
        if let Err(f) = rx::poll_readable(&self.core, &self.rx, &self.tx) {
            self.fail_with(f);
        }
    }

    /// Reads what the stream has (`readable`), to its end if that may have
    /// come (`closed`); false if the QP failed.
    fn read_marked(&self, readable: bool, closed: bool) -> bool {
        let r = if closed {
            rx::on_closed(&self.core, &self.rx, &self.tx)
        } else if readable {
            rx::on_readable(&self.core, &self.rx, &self.tx)
        } else {
            return true;
        };
        r.map_err(|f| self.fail_with(f)).is_ok()
    }

    /// The application is about to wait for a completion event of a CQ of
    /// this QP: the progress thread must be woken for its stream at once.
    pub fn app_waits(&self) {
        if let Some((ev, slot)) = self.stream_events() {
            ev.hint(slot, xiw_abi::events::HINT_PROGRESS);
        }
    }

    /// Frees staging buffers left over from traffic once the QP has been idle
    /// for a trim period; true while it still holds large ones.
    pub fn trim(&self) -> bool {
        let rx = self.rx.try_lock().map(|mut r| r.trim()).unwrap_or(true);
        let tx = self
            .tx
            .try_lock(&self.core)
            .map(|mut t| t.trim())
            .unwrap_or(true);
        rx || tx
    }

    /// Applies a deferred failure; called with no locks held.
    pub fn apply_deferred(&self) {
        let f = self.deferred.lock().take();
        if let Some(f) = f {
            self.fail_with(f);
        }
    }

    /// Takes the stream away from the data path, before the connection manager
    /// gives up the descriptor.
    pub fn detach_stream(&self) {
        self.lock_rx().fd = None;
        self.lock_tx().fd = None;
        self.evented.store(false, Ordering::Release);
        self.unshare_stream();
    }

    /// A failure found on the QP's stream or its work: it goes as the
    /// lifecycle says ([`Lifecycle::fail`](xiw_engine::lifecycle::Lifecycle::fail)): the peer is told why (a
    /// Terminate, if the stream still works), then the QP fails. Must be
    /// called with none of this QP's locks held. Never waits: a Terminate
    /// the stream has no room for yet goes out as room comes (the stream is
    /// watched for it), and the QP fails once it has, or once the
    /// lifecycle's wait for it ends, on the progress thread's timer.
    pub fn fail_with(&self, f: Fail) {
        let mut cm = self.lock_cm();
        let first_fpdu_due = self.lock_rx().expects_rtr();
        let acts = cm.life.fail(f, first_fpdu_due);
        let fails = self.carry_out(&mut cm, acts);
        drop(cm);
        for f in fails {
            self.fail_as(f);
        }
    }

    /// Fails the QP as `f` says (its Terminate, if any, has been dealt with).
    fn fail_as(&self, f: Fail) {
        self.to_error(&f.why, f.sq_status, f.rq_status, Some(f.event), false);
    }

    /// Carries out the lifecycle's actions `acts` in order, under the
    /// connection manager's lock `cm` (held by the caller), with what they
    /// lead to; returns the failures, which the caller applies once it has
    /// dropped `cm` ([`Qp::to_error`] takes it).
    fn carry_out(&self, cm: &mut MutexGuard<'_, cm::Cm>, acts: Vec<Action>) -> Vec<Fail> {
        let mut todo = VecDeque::from(acts);
        let mut fails = Vec::new();
        // The stream a Terminate went to.
        let mut stream = None;
        while let Some(a) = todo.pop_front() {
            match a {
                Action::Timer => self.sh.reactor.add_timer(&self.sh.qps, self.qpn),
                Action::Terminate(body) => {
                    let mut tx = self.lock_tx();
                    stream = tx.fd;
                    // A full socket leaves the rest pending, and the stream
                    // watched for room (the transmitter arms it).
                    let blocked = tx.fd.is_some() && {
                        tx.engine.terminate(body);
                        tx.run(&self.core).is_ok() && tx.pending()
                    };
                    drop(tx);
                    todo.extend(if blocked {
                        cm.life.terminate_blocked()
                    } else {
                        cm.life.terminate_written()
                    });
                }
                Action::StopReading => {
                    self.lock_rx().fd = None;
                    self.rx_eof.store(true, Ordering::Release);
                    if let Some(fd) = stream {
                        self.watch_stream(fd, false, true);
                    }
                    let why = cm.life.terminating().map_or("", |f| f.why.as_str());
                    crate::log::debug(
                        &self.sh.log,
                        format_args!("qp {}: the Terminate waits for room: {}", self.qpn, why),
                    );
                }
                Action::Reopen => {
                    if let Err(why) = cm.reopen(self) {
                        fails.push(Fail::stream(why.to_string()));
                    }
                }
                Action::Connect => {
                    if let Err(e) = cm.connect(self) {
                        fails.push(Fail::stream(format!("connect: {e}")));
                    }
                }
                Action::Fail(f) => fails.push(f),
            }
        }
        fails
    }

    /// A Terminate waits for room: writes what the stream takes of it; true
    /// while some is still left for later.
    fn terminate_waits(&self) -> bool {
        let mut tx = self.lock_tx();
        tx.fd.is_some() && tx.run(&self.core).is_ok() && tx.pending()
    }

    /// Completes every outstanding WQE with IBV_WC_WR_FLUSH_ERR (the first SQ one
    /// with the recorded error status). Only in the error state.
    pub fn flush(&self) {
        if self.state() != IBV_QPS_ERR {
            return;
        }
        // The send queue first: a request that failed is reported before
        // anything flushed, also where both queues share a CQ. (A receive that
        // failed was reported when the QP failed.)
        self.lock_tx().flush(&self.core);
        if let Some(rq) = &self.rq {
            let mut rx = self.lock_rx();
            if let Some(job) = rx.engine.take_current() {
                self.complete_recv_error(&job, IBV_WC_WR_FLUSH_ERR);
            }
            let _g = self.rq_post.lock();
            while let Some(job) = crate::queue::take_recv_ring(rq) {
                self.complete_recv_error(&job, IBV_WC_WR_FLUSH_ERR);
            }
        } else if let Some(job) = self.lock_rx().engine.take_current() {
            self.complete_recv_error(&job, IBV_WC_WR_FLUSH_ERR);
        }
    }

    /// Brings the QP back to RESET: empty queues, fresh protocol state, same QPN.
    /// The state is RESET first, so that a post racing this is refused or
    /// emptied with the rest.
    pub fn reset(&self) {
        self.state.store(IBV_QPS_RESET, Ordering::Release);
        *self.deferred.lock() = None;
        self.detach_stream();
        // The lifecycle with it: no deadline, no failure pending.
        self.lock_cm().reset(&self.sh);
        let mut rx = self.lock_rx();
        *rx = rx::Rx::default();
        self.rx_eof.store(false, Ordering::Release);
        if let Some(rq) = &self.rq {
            let _g = self.rq_post.lock();
            rq.release(rq.producer());
        }
        drop(rx);
        let _g = self.sq_post.lock();
        let mut tx = self.lock_tx();
        *tx = tx::Tx::new(self.sq.entries);
        tx.next = self.sq.producer();
        self.sq.release(self.sq.producer());
        self.last_error.store(IBV_WC_SUCCESS, Ordering::Release);
        drop(tx);
        drop(_g);
        // What the QP completed and the application did not poll goes with
        // it (nothing completes on it any more: no stream, empty queues).
        self.send_cq.purge(self.qpn);
        if !std::sync::Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.purge(self.qpn);
        }
    }
}

impl crate::cq::Assist for Qp {
    fn assist(&self) {
        Qp::assist(self)
    }

    fn app_waits(&self) {
        Qp::app_waits(self)
    }

    fn collect_signalled(&self, cq: &crate::cq::Cq) {
        if !std::ptr::eq(std::sync::Arc::as_ptr(&self.recv_cq), cq) {
            return;
        }
        if let Some((ev, slot)) = self.stream_events() {
            cq.owe_signalled(ev, slot);
        }
    }
}

impl cm::Link for Qp {
    fn expects_rtr(&self) -> bool {
        self.lock_rx().expects_rtr()
    }

    fn attach_stream(&self, fd: RawFd, recv: recv::Params, send: send::Params) {
        let mut rx = self.lock_rx();
        let mut tx = self.lock_tx();
        // Kernel mode: a stream this QP connected itself is shared with the
        // module here, under the receive lock. The module marks what the
        // stream holds already (the peer's ready-to-receive message, say)
        // at once, and a thread polling a CQ that takes those marks then
        // waits for this lock and reads them from the attached stream:
        // taken before it, they would be read from no stream, and nothing
        // the peer sends next would come to mark them again.
        self.share_stream(fd, recv.crc);
        // The module places RDMA Writes from a stream whose events it
        // marks, while the receive side lends it the stream.
        let lendable = self.sh.cfg.kernel_place && self.stream_events().is_some();
        rx.establish(fd, recv, lendable);
        tx.fd = Some(fd);
        tx.engine.establish(send);
        tx.engine.set_confirm(self.sh.cfg.confirm);
    }

    fn detach_stream(&self) {
        Qp::detach_stream(self)
    }

    fn kick(&self) {
        Qp::kick(self)
    }
}

impl Endpoint for Qp {
    fn pd(&self) -> u32 {
        self.pd
    }

    fn on_connection(&self, writable: bool) {
        let r = self.lock_cm().on_sock(self, writable);
        if let Err(why) = r {
            self.fail(&why.to_string());
        }
    }

    fn on_stream(&self, readable: bool, writable: bool, closed: bool) {
        if let Some((ev, slot)) = self.stream_events() {
            self.recv_cq.owe_signalled(ev, slot);
        }
        if !self.read_marked(readable, closed) {
            return;
        }
        if writable {
            self.kick();
        }
    }

    fn tick(&self, now: Instant) -> bool {
        let mut cm = self.lock_cm();
        let mut acts = Vec::new();
        // A Terminate waiting for room: what the stream takes of it now,
        // and whether that was the last of it.
        if cm.life.awaits_room() && !self.terminate_waits() {
            acts = cm.life.terminate_written();
        }
        acts.extend(cm.life.handle_timeout(now));
        let fails = self.carry_out(&mut cm, acts);
        let keep = cm.life.poll_timeout().is_some();
        drop(cm);
        for f in fails {
            self.fail_as(f);
        }
        keep
    }

    fn adopt(&self, fd: OwnedFd, req: Request) {
        let r = self.lock_cm().adopt(self, fd, req);
        if let Err(why) = r {
            self.fail(&why.to_string());
        }
    }

    fn adopt_kernel(&self, fd: OwnedFd, s: &xiw_abi::kernel::Stream) {
        use xiw_abi::kernel::{RTR_READ, RTR_SEND, RTR_WRITE};
        let agreed = xiw_engine::setup::Agreed {
            crc: s.crc != 0,
            revision: 2,
            enhanced: true,
            rtr: match s.rtr {
                RTR_SEND => crate::wire::mpa::Rtr::ZeroLengthSend,
                RTR_WRITE => crate::wire::mpa::Rtr::ZeroLengthWrite,
                RTR_READ => crate::wire::mpa::Rtr::ZeroLengthRead,
                _ => crate::wire::mpa::Rtr::None,
            },
            ird: s.ird,
            ord: s.ord,
            peer_ird: s.peer_ird,
            peer_ord: s.peer_ord,
            peer_data: Vec::new(),
        };
        let initiator = s.initiator != 0;
        {
            // The ORD agreed, unless the application set its own (RTS).
            let mut a = self.attrs.lock();
            if a.max_rd_atomic == 0 {
                a.max_rd_atomic = s.ord.min(u16::from(u8::MAX)) as u8;
            }
            // A connected iWARP QP takes remote Reads and Writes, as the
            // connection manager's QP attributes say (librdmacm gives the
            // active side's QP none before it connects, and no more after).
            // With RFC 7306 it takes atomics too where it answers Reads (IRD
            // above 0), as InfiniBand's connection manager grants them with
            // responder resources; the MR's own rights still decide.
            a.qp_access_flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            if self.sh.cfg.extensions && s.ird > 0 {
                a.qp_access_flags |= IBV_ACCESS_REMOTE_ATOMIC;
            }
        }
        // The module marks this stream's events in the QP's slot, if it has one.
        self.evented
            .store(self.ev_slot.get().is_some(), Ordering::Release);
        self.lock_cm().adopt_kernel(self, fd, initiator, &agreed);
        // On iWARP the connection manager never moves a QP to RTS: the RNIC
        // does once the stream is up (the active side's QP is still INIT).
        let moved = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                matches!(s, IBV_QPS_INIT | IBV_QPS_RTR).then_some(IBV_QPS_RTS)
            })
            .is_ok();
        if moved {
            {
                let a = self.attrs.lock();
                let mut t = self.lock_tx();
                t.engine.set_ord(crate::qp::cm::ord_of(a.max_rd_atomic));
            }
            self.mirror_state(IBV_QPS_RTS);
        }
        self.kick();
        // The module marked the stream at the handover, and a thread polling
        // a CQ may have taken those marks before the stream was attached or
        // the QP in RTS, when there was nothing to read them for: what came
        // before now is read here, what comes later is marked anew.
        self.on_stream(true, false, true);
    }

    fn apply_deferred(&self) {
        Qp::apply_deferred(self)
    }

    fn trim(&self) -> bool {
        Qp::trim(self)
    }

    fn media(&self, ticket: u64, req: &Inbound) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            responder::carry_out(&self.core, req)
        }))
        .unwrap_or_else(|_| Err(Refused::Broken("internal error in the media worker".into())));
        let taken = self.lock_tx().media_done(ticket, r);
        if taken {
            self.kick();
        }
    }

    fn fail_fatal(&self, why: &str) {
        self.fail(why)
    }
}
