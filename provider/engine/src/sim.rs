//! An in-memory driver side for the receive engine, for tests and fuzzing:
//! registered memory is windows of one byte arena (so a write anywhere else
//! shows), receives and queue 1 state are plain queues, and every completion
//! and answer is recorded in order.

use std::collections::VecDeque;

use crate::fault::{AccessFault, Status};
use crate::queue1::{Inbound, Outstanding};
use crate::recv::{Host, RecvCompletion};

/// A registered region: `len` bytes of the arena from `at`, reached by the
/// peer at tagged offsets from `iova`.
#[derive(Clone, Debug)]
pub struct Region {
    pub stag: u32,
    pub at: usize,
    pub len: usize,
    pub iova: u64,
    pub access: u32,
    pub pd: u32,
    pub valid: bool,
}

/// A local buffer list: (lkey, tagged offset, length) per element.
pub type Sges = Vec<(u32, u64, u32)>;

/// A posted receive.
#[derive(Clone, Debug)]
pub struct SimRecv {
    pub wr_id: u64,
    pub sges: Sges,
}

/// What a receive ended with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvOutcome {
    Done(RecvCompletion),
    Failed(Status),
}

#[derive(Debug)]
pub struct Sim {
    pub arena: Vec<u8>,
    pub regions: Vec<Region>,
    pub pd: u32,
    pub recvs: VecDeque<SimRecv>,
    pub completed: Vec<(u64, RecvOutcome)>,
    pub orq: VecDeque<Outstanding<Sges>>,
    pub irq: Vec<Inbound>,
    pub ird: u32,
    /// Send queue indexes answered, in order, with the byte count reported.
    pub answered: Vec<(u32, Option<u32>)>,
    pub may_transmit: bool,
}

impl Sim {
    /// An arena of `size` bytes filled with `fill`, nothing registered.
    pub fn new(size: usize, fill: u8) -> Sim {
        Sim {
            arena: vec![fill; size],
            regions: Vec::new(),
            pd: 1,
            recvs: VecDeque::new(),
            completed: Vec::new(),
            orq: VecDeque::new(),
            irq: Vec::new(),
            ird: 16,
            answered: Vec::new(),
            may_transmit: false,
        }
    }

    /// Registers `len` bytes at arena offset `at` as `stag`, tagged from `iova`.
    pub fn register(&mut self, stag: u32, at: usize, len: usize, iova: u64, access: u32) {
        assert!(at + len <= self.arena.len(), "region outside the arena");
        self.regions.push(Region {
            stag,
            at,
            len,
            iova,
            access,
            pd: self.pd,
            valid: true,
        });
    }

    /// The arena bytes of `[to, to+len)` of `stag`, unchecked (for assertions).
    pub fn bytes(&self, stag: u32, to: u64, len: usize) -> &[u8] {
        let r = self.regions.iter().find(|r| r.stag == stag).expect("stag");
        let off = r.at + (to - r.iova) as usize;
        &self.arena[off..off + len]
    }

    fn resolve(
        &self,
        stag: u32,
        to: u64,
        len: u64,
        need: u32,
        allowed: u32,
    ) -> Result<usize, AccessFault> {
        let r = self
            .regions
            .iter()
            .find(|r| r.stag == stag && r.valid)
            .ok_or(AccessFault::InvalidStag)?;
        if r.pd != self.pd {
            return Err(AccessFault::WrongPd);
        }
        let end = to.checked_add(len).ok_or(AccessFault::Wrap)?;
        if to < r.iova || end > r.iova + r.len as u64 {
            return Err(AccessFault::Bounds);
        }
        if r.access & allowed & need != need {
            return Err(AccessFault::Access);
        }
        Ok(r.at + (to - r.iova) as usize)
    }

    fn scatter_sges(
        &mut self,
        sges: &Sges,
        mut off: u64,
        mut data: &[u8],
    ) -> Result<(), AccessFault> {
        for &(lkey, to, len) in sges {
            if data.is_empty() {
                break;
            }
            if off >= len as u64 {
                off -= len as u64;
                continue;
            }
            let take = ((len as u64 - off) as usize).min(data.len());
            let at = self.resolve(
                lkey,
                to + off,
                take as u64,
                crate::queue1::access::LOCAL_WRITE,
                u32::MAX,
            )?;
            self.arena[at..at + take].copy_from_slice(&data[..take]);
            data = &data[take..];
            off = 0;
        }
        Ok(())
    }
}

impl Host for Sim {
    type Recv = SimRecv;
    type Local = Sges;

    fn place(
        &mut self,
        stag: u32,
        to: u64,
        data: &[u8],
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessFault> {
        let at = self.resolve(stag, to, data.len() as u64, need, allowed)?;
        self.arena[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn check(
        &mut self,
        stag: u32,
        to: u64,
        len: u64,
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessFault> {
        self.resolve(stag, to, len, need, allowed).map(|_| ())
    }

    fn aligned8(
        &mut self,
        stag: u32,
        to: u64,
        need: u32,
        allowed: u32,
    ) -> Result<bool, AccessFault> {
        self.resolve(stag, to, 8, need, allowed)
            .map(|at| at % 8 == 0)
    }

    fn invalidate(&mut self, stag: u32) -> Result<(), AccessFault> {
        let pd = self.pd;
        let r = self
            .regions
            .iter_mut()
            .find(|r| r.stag == stag && r.valid)
            .ok_or(AccessFault::InvalidStag)?;
        if r.pd != pd {
            return Err(AccessFault::WrongPd);
        }
        r.valid = false;
        Ok(())
    }

    fn take_recv(&mut self) -> Option<SimRecv> {
        self.recvs.pop_front()
    }

    fn recv_len(&self, r: &SimRecv) -> u64 {
        r.sges.iter().map(|s| s.2 as u64).sum()
    }

    fn scatter_recv(&mut self, r: &SimRecv, off: u64, data: &[u8]) -> Result<(), AccessFault> {
        self.scatter_sges(&r.sges, off, data)
    }

    fn recv_done(&mut self, r: SimRecv, c: RecvCompletion) {
        self.completed.push((r.wr_id, RecvOutcome::Done(c)));
    }

    fn recv_failed(&mut self, r: SimRecv, status: Status) {
        self.completed.push((r.wr_id, RecvOutcome::Failed(status)));
    }

    fn scatter(&mut self, l: &Sges, off: u64, data: &[u8]) -> Result<(), AccessFault> {
        self.scatter_sges(l, off, data)
    }

    fn local_len(&self, l: &Sges) -> u64 {
        l.iter().map(|s| s.2 as u64).sum()
    }

    fn oldest_outstanding(&mut self) -> Option<Outstanding<Sges>> {
        self.orq.front().cloned()
    }

    fn read_arrived(&mut self, n: u64) -> Option<u64> {
        match self.orq.front_mut() {
            Some(Outstanding::Read(r)) => {
                r.received += n;
                Some(r.received)
            }
            _ => None,
        }
    }

    fn answered(&mut self, len: Option<u32>) {
        if let Some(o) = self.orq.pop_front() {
            self.answered.push((o.sq_idx(), len));
        }
    }

    fn queue_request(&mut self, req: Inbound) -> bool {
        if self.irq.len() as u32 >= self.ird {
            return false;
        }
        self.irq.push(req);
        true
    }

    fn may_transmit(&mut self) {
        self.may_transmit = true;
    }
}
