//! An in-memory driver side for the engine, for tests and fuzzing:
//! registered memory is windows of one byte arena (so a write anywhere else
//! shows), the send and receive queues and the queue 1 state are plain
//! queues, and every completion and answer is recorded in order. Requests
//! that would wait on a medium are held until the test releases them.

use std::collections::VecDeque;

use crate::fault::{AccessFault, Status};
use crate::queue1::{access, flush_need, Effect, Inbound, Outcome, Outstanding, Refused};
use crate::recv::{Host, RecvCompletion};
use crate::send::{Completion, SendHost, Span, Wr, WrClass, WrOp};
use crate::wire::commit;

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
    /// Work requests posted and not yet taken by the engine.
    pub sq: VecDeque<SimWr>,
    /// Index the next work request taken gets.
    pub next_idx: u32,
    /// Send completions, in send queue order (as a driver reports them).
    pub sq_done: Vec<(u32, Completion)>,
    /// Finished out of order, waiting for the ones before them.
    finished: std::collections::BTreeMap<u32, Completion>,
    /// Requests handed to the "media worker", with their tickets.
    pub deferred: VecDeque<(u64, Inbound)>,
    next_ticket: u64,
    /// STags whose memory the driver cannot place in place or send from in
    /// place (as on-demand paging memory in the provider).
    pub copied_only: Vec<u32>,
    /// A Flush to persistence and a Verify fail, as on a medium that
    /// reports an I/O error.
    pub media_fails: bool,
}

/// A posted send work request; `payload` is its local buffer list (also
/// where a response lands).
#[derive(Clone, Debug)]
pub struct SimWr {
    pub op: WrOp<Sges>,
    pub length: u32,
    pub payload: Sges,
    pub fence: bool,
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
            sq: VecDeque::new(),
            next_idx: 0,
            sq_done: Vec::new(),
            finished: std::collections::BTreeMap::new(),
            deferred: VecDeque::new(),
            next_ticket: 1,
            copied_only: Vec::new(),
            media_fails: false,
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

    /// Work request `idx` finished: report it, and every later one already
    /// finished, once all before it are reported (RFC 5040 section 5.5).
    pub fn finish(&mut self, idx: u32, c: Completion) {
        self.finished.entry(idx).or_insert(c);
        let mut next = self.sq_done.len() as u32;
        while let Some(c) = self.finished.remove(&next) {
            self.sq_done.push((next, c));
            next += 1;
        }
    }

    /// Posts a send work request.
    pub fn post(&mut self, op: WrOp<Sges>, payload: Sges, fence: bool) {
        let length = payload.iter().map(|s| s.2).sum();
        self.sq.push_back(SimWr {
            op,
            length,
            payload,
            fence,
        });
    }

    /// Carries out a queue 1 request on the arena as a driver would, after
    /// the STag check again. A Verify hashes with [`Sim::hash`]; with
    /// [`Sim::media_fails`] a Flush to persistence and a Verify fail.
    pub fn carry_out(&mut self, req: &Inbound) -> Outcome {
        let medium = |s: &Sim| {
            if s.media_fails {
                return Err(Refused::Failed("the medium failed".into()));
            }
            Ok(())
        };
        match *req {
            Inbound::Atomic { req, allowed, .. } => {
                let at = self.word(req.stag, req.to, access::REMOTE_ATOMIC, allowed)?;
                let old = u64::from_ne_bytes(self.arena[at..at + 8].try_into().expect("8"));
                let new = req
                    .apply(old)
                    .ok_or_else(|| Refused::Failed("atomic not performed".into()))?;
                self.arena[at..at + 8].copy_from_slice(&new.to_ne_bytes());
                Ok(Effect::Atomic { original: old })
            }
            Inbound::Flush {
                stag,
                to,
                len,
                flags,
                allowed,
                ..
            } => {
                if len > 0 {
                    self.resolve(stag, to, len as u64, flush_need(flags), allowed)?;
                    if flags & commit::FLUSH_PERSISTENCE != 0 {
                        medium(self)?;
                    }
                }
                Ok(Effect::Flushed)
            }
            Inbound::AtomicWrite {
                stag,
                to,
                value,
                allowed,
                ..
            } => {
                let at = self.word(stag, to, access::REMOTE_WRITE, allowed)?;
                self.arena[at..at + 8].copy_from_slice(&value.to_ne_bytes());
                Ok(Effect::Stored)
            }
            Inbound::Verify {
                stag,
                to,
                len,
                allowed,
                ..
            } => {
                let at = self.resolve(stag, to, len as u64, access::VERIFY, allowed)?;
                medium(self)?;
                Ok(Effect::Hashed {
                    hash: Sim::hash(&self.arena[at..at + len as usize]),
                })
            }
            Inbound::Read(_) => Err(Refused::Failed("a Read is streamed".into())),
        }
    }

    /// The hash a Verify of the sim computes: the CRC32c of the bytes, most
    /// significant byte first.
    pub fn hash(data: &[u8]) -> Vec<u8> {
        crate::wire::mpa::crc32c(0, data).to_be_bytes().to_vec()
    }

    /// The arena offset of the 64-bit word at `to` of `stag`, checked.
    fn word(&self, stag: u32, to: u64, need: u32, allowed: u32) -> Result<usize, Refused> {
        let at = self.resolve(stag, to, 8, need, allowed)?;
        if at % 8 != 0 {
            return Err(Refused::Failed("target not 64-bit aligned".into()));
        }
        Ok(at)
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

    /// Writes `data` into the memory of `s`, checked again (as a driver does
    /// when it reads the stream into it).
    pub fn write_span(&mut self, s: &Span, allowed: u32, data: &[u8]) -> Result<(), AccessFault> {
        let at = self.resolve(s.stag, s.to, data.len() as u64, s.need, allowed)?;
        self.arena[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Appends the bytes of `s`, checked again (as a driver does when it
    /// hands the span to the stream).
    pub fn read_span(&self, s: &Span, out: &mut Vec<u8>) -> Result<(), AccessFault> {
        let at = self.resolve(s.stag, s.to, s.len as u64, s.need, u32::MAX)?;
        out.extend_from_slice(&self.arena[at..at + s.len as usize]);
        Ok(())
    }

    /// The spans of `n` bytes of `sges` from offset `off`, each checked for
    /// `need`: the one walk of an SGE list.
    fn spans(
        &self,
        sges: &Sges,
        mut off: u64,
        mut n: usize,
        need: u32,
    ) -> Result<Vec<Span>, AccessFault> {
        let mut out = Vec::new();
        for &(lkey, to, len) in sges {
            if n == 0 {
                break;
            }
            if off >= len as u64 {
                off -= len as u64;
                continue;
            }
            let take = ((len as u64 - off) as usize).min(n);
            self.resolve(lkey, to + off, take as u64, need, u32::MAX)?;
            out.push(Span {
                stag: lkey,
                to: to + off,
                len: take as u32,
                need,
            });
            n -= take;
            off = 0;
        }
        if n > 0 {
            return Err(AccessFault::Bounds);
        }
        Ok(out)
    }

    pub fn gather_sges(
        &self,
        sges: &Sges,
        off: u64,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessFault> {
        for s in self.spans(sges, off, n, 0)? {
            self.read_span(&s, out)?;
        }
        Ok(())
    }

    fn scatter_sges(&mut self, sges: &Sges, off: u64, mut data: &[u8]) -> Result<(), AccessFault> {
        for s in self.spans(sges, off, data.len(), access::LOCAL_WRITE)? {
            let (now, rest) = data.split_at(s.len as usize);
            self.write_span(&s, u32::MAX, now)?;
            data = rest;
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

    fn in_place(&mut self, stag: u32) -> bool {
        !self.copied_only.contains(&stag)
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

    fn locate_local(
        &mut self,
        l: &Sges,
        off: u64,
        n: usize,
        spans: &mut Vec<Span>,
    ) -> Result<bool, AccessFault> {
        spans.extend(self.spans(l, off, n, access::LOCAL_WRITE)?);
        Ok(true)
    }

    fn oldest_outstanding(&mut self) -> Option<Outstanding<Sges>> {
        self.orq.front().cloned()
    }

    fn read_arrived(&mut self, n: u64, last: bool) -> bool {
        match self.orq.front_mut() {
            Some(Outstanding::Read(r)) => r.received += n,
            _ => return false,
        }
        if last {
            self.answered(None);
        }
        true
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

impl SendHost for Sim {
    type Local = Sges;
    type Payload = Sges;

    fn next_wr(&mut self, admit: impl FnOnce(WrClass) -> bool) -> Option<Wr<Sges, Sges>> {
        let w = self.sq.front()?;
        // Every request of the sim reports its completion.
        let confirmed = matches!(w.op, WrOp::Send { .. } | WrOp::Write { .. });
        let class = WrClass {
            queue1: w.op.is_queue1(),
            fence: w.fence,
            confirmed,
        };
        if !admit(class) {
            return None;
        }
        let w = self.sq.pop_front()?;
        let idx = self.next_idx;
        self.next_idx += 1;
        Some(Wr {
            idx,
            op: w.op,
            length: w.length,
            payload: w.payload,
            confirmed,
        })
    }

    fn in_place(&mut self, stag: u32) -> bool {
        !self.copied_only.contains(&stag)
    }

    fn check_payload(&mut self, p: &Sges, need: u32) -> Result<(), AccessFault> {
        for &(lkey, to, len) in p.iter().filter(|s| s.2 > 0) {
            self.resolve(lkey, to, len as u64, need, u32::MAX)?;
        }
        Ok(())
    }

    fn gather(
        &mut self,
        p: &Sges,
        off: u64,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessFault> {
        self.gather_sges(p, off, n, out)
    }

    fn read_source(
        &mut self,
        stag: u32,
        to: u64,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessFault> {
        let at = self.resolve(stag, to, n as u64, access::REMOTE_READ, u32::MAX)?;
        out.extend_from_slice(&self.arena[at..at + n]);
        Ok(())
    }

    fn locate(
        &mut self,
        p: &Sges,
        off: u64,
        n: usize,
        spans: &mut Vec<Span>,
    ) -> Result<bool, AccessFault> {
        spans.extend(self.spans(p, off, n, 0)?);
        Ok(true)
    }

    fn check_span(&mut self, s: &Span) -> Result<(), AccessFault> {
        self.resolve(s.stag, s.to, s.len as u64, s.need, u32::MAX)
            .map(|_| ())
    }

    fn carry_out(&mut self, req: &Inbound) -> Outcome {
        Sim::carry_out(self, req)
    }

    fn defer(&mut self, req: Inbound) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        self.deferred.push_back((t, req));
        t
    }

    fn invalidate_local(&mut self, stag: u32) -> Result<(), AccessFault> {
        Host::invalidate(self, stag)
    }

    fn completed(&mut self, idx: u32, c: Completion) {
        self.finish(idx, c);
    }
}

/// Flush flags for tests: to persistence.
pub const FLUSH_PERSISTENCE: u32 = commit::FLUSH_PERSISTENCE;
