//! Shared receive queues.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use xiw_abi::ring::*;

use crate::error::Error;
use crate::queue::{post_recv_ring, take_recv_ring, RecvJob, Ring};

pub struct Srq {
    pub id: u32,
    pub pd: u32,
    pub max_sge: u32,
    pub ring: Ring,
    post: Mutex<()>,
    take: Mutex<()>,
    /// `srq_limit`: armed when non-zero; fires IBV_EVENT_SRQ_LIMIT_REACHED once.
    pub limit: AtomicU32,
}

impl Srq {
    pub fn new(
        id: u32,
        pd: u32,
        max_wr: u32,
        max_sge: u32,
        kernel: Option<crate::kernel::Kernel>,
    ) -> std::io::Result<Srq> {
        Ok(Srq {
            id,
            pd,
            max_sge,
            ring: Ring::new(RING_KIND_SRQ, max_wr, recv_stride(max_sge), id, kernel)?,
            post: Mutex::new(()),
            take: Mutex::new(()),
            limit: AtomicU32::new(0),
        })
    }

    pub fn capacity(&self) -> u32 {
        self.ring.entries
    }

    /// Posts receive WQEs; `Err((index, why))` names the first one refused.
    pub fn post<'a>(
        &self,
        wrs: impl Iterator<Item = (u64, &'a [Sge])>,
    ) -> Result<(), (usize, Error)> {
        let _g = self.post.lock();
        post_recv_ring(&self.ring, self.max_sge, wrs)
    }

    /// Takes the next receive WQE; the second value is true when the SRQ limit fired.
    pub fn take(&self) -> Option<(RecvJob, bool)> {
        let _g = self.take.lock();
        let job = take_recv_ring(&self.ring)?;
        let limit = self.limit.load(Ordering::Acquire);
        let fired = limit != 0
            && self.ring.used() < limit
            && self
                .limit
                .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        Some((job, fired))
    }
}
