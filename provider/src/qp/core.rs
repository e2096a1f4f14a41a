//! What a queue pair is apart from its stream: its number, work queue rings,
//! completion queues, state and attributes, and the reporting of completions.
//! The data path (`tx`, `rx`) and connection setup (`cm`) work on it; the
//! `qp` module puts them together.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use xiw_abi::ring::{self, Cqe, SendWqe, Sge};
use xiw_abi::verbs::*;
use xiw_engine::fault::Fail;

use crate::context::Shared;
use crate::cq::Cq;
use crate::error::Error;
use crate::queue::{post_recv_ring, take_recv_ring, RecvJob, Ring};
use crate::srq::Srq;
use crate::wqe;

pub use crate::queue::MAX_SGE;
pub use crate::wqe::WC_FLUSH;
pub use xiw_abi::limits::{MAX_INLINE, MAX_QP_WR, MAX_RD_ATOMIC};

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

pub struct QpCore {
    pub qpn: u32,
    pub sh: Arc<Shared>,
    pub pd: u32,
    pub send_cq: Arc<Cq>,
    pub recv_cq: Arc<Cq>,
    pub srq: Option<Arc<Srq>>,
    pub caps: Caps,
    pub sq_sig_all: bool,
    /// Kernel mode: the handle of the kernel's QP, which mirrors its state.
    pub kernel: std::sync::OnceLock<u32>,
    /// Kernel mode: the QP's slot in the context's events page.
    pub ev_slot: std::sync::OnceLock<u32>,
    /// The module marks the stream's events in `ev_slot` (a stream it
    /// handed over, or one shared with it): nobody watches the socket itself.
    pub evented: AtomicBool,
    /// The stream is one this QP connected and shared with the module
    /// ([`QpCore::share_stream`]).
    shared: AtomicBool,
    pub sq: Ring,
    pub rq: Option<Ring>,
    /// Serialises the producers of `sq` (and a reset emptying it); holds
    /// the count of posts (see
    /// [`AppCpu::note_sometimes`](crate::context::app_cpu::AppCpu::note_sometimes)).
    pub sq_post: parking_lot::Mutex<u32>,
    /// Serialises the producers of `rq` (and those emptying it).
    pub rq_post: parking_lot::Mutex<()>,
    /// `enum ibv_qp_state`, mirrored for lock-free checks on the posting path.
    pub state: AtomicU32,
    pub attrs: Mutex<Attrs>,
    /// The socket was full last time: bytes are waiting to go out.
    pub tx_blocked: AtomicBool,
    /// Nothing more to read, sending goes on: the peer closed its end, or
    /// the QP is failing and only its Terminate still goes out.
    pub rx_eof: AtomicBool,
    /// The `ibv_qp` the application holds, for async events; 0 once destroyed.
    pub handle: AtomicUsize,
    pub destroyed: AtomicBool,
    /// First error status reported for the SQ head when the QP fails.
    pub last_error: AtomicU32,
    /// A failure found where it could not be acted on (see [`QpCore::defer_fail`]).
    pub deferred: Mutex<Option<Fail>>,
    /// Kernel mode: the Read whose Read Responses are lent with the stream.
    pub read_lend: parking_lot::Mutex<ReadLend>,
}

/// Kernel mode: the Read Responses lent to the module with the stream. The
/// receive side sets it as it lends the stream and takes it as it takes the
/// stream back; the transmit side, finding the stream lent with no Read
/// (`open`) when a Read it frames is the oldest outstanding request, lends
/// that Read's Read Responses before the request goes out.
#[derive(Debug, Default)]
pub struct ReadLend {
    /// Lent with no Read: one may be lent now.
    pub open: bool,
    /// The Read lent, as it was lent.
    pub lent: Option<xiw_engine::recv::LentRead>,
}

impl QpCore {
    /// This QP as it reaches registered memory.
    pub fn by(&self) -> crate::mem::By {
        crate::mem::By {
            pd: self.pd,
            qpn: self.qpn,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sh: Arc<Shared>,
        pd: u32,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        srq: Option<Arc<Srq>>,
        caps: Caps,
        sq_sig_all: bool,
    ) -> std::io::Result<QpCore> {
        let qpn = sh.listener.alloc_qpn(&sh.reactor)?;
        let guard = QpnGuard { sh: &sh, qpn };
        let sq = Ring::new(
            ring::RING_KIND_SQ,
            caps.max_send_wr.max(1),
            ring::send_stride(caps.max_send_sge, caps.max_inline),
            qpn,
            sh.kernel,
        )?;
        let rq = match srq {
            Some(_) => None,
            None => Some(Ring::new(
                ring::RING_KIND_RQ,
                caps.max_recv_wr.max(1),
                ring::recv_stride(caps.max_recv_sge),
                qpn,
                sh.kernel,
            )?),
        };
        std::mem::forget(guard);
        Ok(QpCore {
            qpn,
            pd,
            send_cq,
            recv_cq,
            srq,
            caps,
            sq_sig_all,
            kernel: std::sync::OnceLock::new(),
            ev_slot: std::sync::OnceLock::new(),
            evented: AtomicBool::new(false),
            shared: AtomicBool::new(false),
            sq,
            rq,
            sq_post: parking_lot::Mutex::new(0),
            rq_post: parking_lot::Mutex::new(()),
            // A new QP is idle, as on iWARP RNICs, whose idle state the
            // verbs call INIT (siw's query reports a new QP so, and
            // rdma-core's tests expect it of an RNIC): receives may be posted
            // at once.
            state: AtomicU32::new(IBV_QPS_INIT),
            attrs: Mutex::new(Attrs {
                port_num: 1,
                ..Attrs::default()
            }),
            tx_blocked: AtomicBool::new(false),
            rx_eof: AtomicBool::new(false),
            handle: AtomicUsize::new(0),
            destroyed: AtomicBool::new(false),
            last_error: AtomicU32::new(IBV_WC_SUCCESS),
            deferred: Mutex::new(None),
            read_lend: parking_lot::Mutex::new(ReadLend::default()),
            sh,
        })
    }

    pub fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// Writes send WQEs into the SQ ring; with `need_room`, all of them or
    /// (when the ring lacks room) none. `Err((index, errno))` names the first
    /// refused. The caller starts transmission.
    pub fn write_send(
        &self,
        wqes: &mut dyn Iterator<Item = Result<(SendWqe, SendBody), Error>>,
        need_room: usize,
    ) -> Result<(), (usize, i32)> {
        let limit = self.caps.max_send_wr.max(1).min(self.sq.entries);
        let mut posts = self.sq_post.lock();
        self.sh.app_cpu.note_sometimes(&mut posts);
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
        for (i, item) in wqes.enumerate() {
            // The error becomes its errno only here, where it is met: the
            // request itself is not moved out of a result of another shape.
            let (mut wqe, body) = item.map_err(|e| (i, e.errno()))?;
            if p.wrapping_sub(self.sq.consumer()) >= limit {
                return Err((i, libc::ENOMEM));
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
                            self.sq.write(p, wqe::sge_offset(k), *s);
                        }
                    }
                    SendBody::Inline(bytes) => {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            self.sq.slot(p).add(wqe::INLINE_OFFSET),
                            bytes.len(),
                        );
                    }
                }
            }
            p = p.wrapping_add(1);
            self.sq.publish(p);
        }
        Ok(())
    }

    /// Writes receive WQEs into the QP's own receive queue ring.
    pub fn write_recv<'a>(
        &self,
        wrs: impl Iterator<Item = (u64, &'a [Sge])>,
    ) -> Result<(), (usize, i32)> {
        let Some(rq) = &self.rq else {
            return Err((0, libc::EINVAL));
        };
        let _g = self.rq_post.lock();
        // Under the lock, as for posting sends.
        if self.state() == IBV_QPS_RESET {
            return Err((0, libc::EINVAL));
        }
        post_recv_ring(rq, self.caps.max_recv_sge, wrs).map_err(|(i, e)| (i, e.errno()))
    }

    /// Next receive WQE for an incoming Send: from the SRQ or the QP's own RQ.
    #[inline]
    pub fn take_recv(&self) -> Option<RecvJob> {
        match &self.srq {
            Some(srq) => {
                let (job, fired) = srq.take()?;
                if fired {
                    self.sh.async_events.srq_limit_event(srq.id);
                }
                Some(job)
            }
            None => take_recv_ring(self.rq.as_ref()?),
        }
    }

    /// The events page and this QP's slot in it, while the module marks
    /// its stream's events there.
    #[inline]
    pub fn stream_events(&self) -> Option<(&crate::events_page::StreamEvents, u32)> {
        if !self.evented.load(Ordering::Acquire) {
            return None;
        }
        Some((self.sh.kernel_events.page.as_ref()?, *self.ev_slot.get()?))
    }

    /// Which events of the stream `fd` the progress thread waits for (none
    /// for a stream whose events the module marks).
    pub fn watch_stream(&self, fd: i32, input: bool, out: bool) {
        if self.stream_events().is_none() {
            self.sh.reactor.watch_data(fd, self.qpn, input, out);
        }
    }

    /// The stream `fd` is established: the progress thread watches its
    /// input, or, for a stream whose events the module marks, forgets it.
    pub fn watch_stream_new(&self, fd: i32) {
        if self.stream_events().is_some() {
            self.sh.reactor.unwatch(fd);
        } else {
            let _ = self.sh.reactor.watch_data_new(fd, self.qpn);
        }
    }

    /// Kernel mode: a stream this QP connected itself (modify_qp with the
    /// peer's address) becomes the module's to watch as well, as one rdma_cm
    /// handed over is: it marks the stream's events in the QP's slot and
    /// places RDMA Writes from it while the receive side lends it
    /// (XIW_KERNEL_PLACE=0 leaves such a stream to the progress thread).
    /// A module that cannot leaves it as it is.
    pub fn share_stream(&self, fd: i32, crc: bool) {
        if self.evented.load(Ordering::Acquire) || !self.sh.cfg.kernel_place {
            return;
        }
        let (Some(k), Some(&h), Some(_), Some(_)) = (
            self.sh.kernel,
            self.kernel.get(),
            self.ev_slot.get(),
            self.sh.kernel_events.page.as_ref(),
        ) else {
            return;
        };
        match k.qp_stream(h, fd, crc) {
            Ok(()) => {
                self.shared.store(true, Ordering::Release);
                self.evented.store(true, Ordering::Release);
            }
            Err(e) => crate::log::debug(
                &self.sh.log,
                format_args!("qp {}: the module does not watch its stream: {e}", self.qpn),
            ),
        }
    }

    /// The stream goes from the data path: a stream shared with the module
    /// ([`QpCore::share_stream`]) is the module's no more.
    pub fn unshare_stream(&self) {
        if !self.shared.swap(false, Ordering::AcqRel) {
            return;
        }
        if let (Some(k), Some(&h)) = (self.sh.kernel, self.kernel.get()) {
            let _ = k.qp_unshare(h);
        }
    }

    /// Kernel mode: tells the kernel's QP the state this one moved to.
    pub fn mirror_state(&self, state: u32) {
        if let (Some(k), Some(&h)) = (self.sh.kernel, self.kernel.get()) {
            let _ = k.modify_qp_state(h, state);
        }
    }

    /// Reports a send-side completion (in order) to the send CQ.
    #[inline]
    pub fn complete_send(&self, wqe: &SendWqe, status: u32) {
        // An unsignaled request that succeeded leaves no completion.
        if status == IBV_WC_SUCCESS && wqe.flags & ring::wqe_flag::SIGNALED == 0 {
            return;
        }
        self.complete_send_len(wqe, status, None)
    }

    /// As [`QpCore::complete_send`], with `len` for byte_len when given.
    pub fn complete_send_len(&self, wqe: &SendWqe, status: u32, len: Option<u32>) {
        let signaled = wqe.flags & ring::wqe_flag::SIGNALED != 0;
        if status == IBV_WC_SUCCESS && !signaled {
            return;
        }
        let byte_len = len.unwrap_or_else(|| wqe::wc_byte_len(wqe));
        self.push_cqe(
            &self.send_cq,
            Cqe {
                wr_id: wqe.wr_id,
                byte_len,
                qp_num: self.qpn,
                opcode: wqe::wc_opcode(wqe) as u8,
                status: status as u8,
                ..Default::default()
            },
        );
    }

    #[inline]
    pub fn push_cqe(&self, cq: &Cq, cqe: Cqe) {
        if !cq.push(cqe) {
            self.sh.async_events.cq_overflow(&self.sh.log, cq.id);
        }
    }

    /// Stores a receive completion; one whose event the module raised
    /// already is owed no more ([`Cq::owe_signalled`]).
    #[inline]
    pub fn push_recv_cqe(&self, cqe: Cqe) {
        self.push_cqe(&self.recv_cq, cqe);
        self.recv_cq.paid();
    }

    pub fn complete_recv_error(&self, job: &RecvJob, status: u32) {
        self.push_recv_cqe(Cqe {
            wr_id: job.wr_id,
            qp_num: self.qpn,
            opcode: IBV_WC_RECV as u8,
            status: status as u8,
            ..Default::default()
        });
    }

    /// Records a failure for the progress thread to apply (the first one wins),
    /// for a path that holds locks failing takes.
    pub fn defer_fail(&self, f: Fail) {
        let mut d = self.deferred.lock();
        if d.is_none() {
            *d = Some(f);
            drop(d);
            self.sh.reactor.defer_fail(self.qpn);
        }
    }
}

/// Gives the QP number back if construction fails half-way.
struct QpnGuard<'a> {
    sh: &'a Shared,
    qpn: u32,
}

impl Drop for QpnGuard<'_> {
    fn drop(&mut self) {
        self.sh.listener.free_qpn(self.qpn, &self.sh.reactor);
    }
}

impl Drop for QpCore {
    fn drop(&mut self) {
        self.sh.listener.free_qpn(self.qpn, &self.sh.reactor);
    }
}

/// The payload of a send WQE as posted.
pub enum SendBody {
    Sges(SgeList),
    Inline(InlineBytes),
}

pub use crate::queue::SgeList;
/// Inline payload, copied at post time (at most `MAX_INLINE` bytes).
pub type InlineBytes = smallvec::SmallVec<[u8; 64]>;
