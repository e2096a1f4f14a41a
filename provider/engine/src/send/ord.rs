//! What ORD, IRD and fences let go: the requests this side has outstanding
//! on queue 1 (at most ORD, answered oldest first), the peer's requests
//! waiting for their answers (at most IRD), and which work request of the
//! send queue may start now.

use super::{bad_lkey, Cur, Job, ReadArrival, SendHost, Sender, WrClass, WrOp};
use crate::fault::Fail;
use crate::queue1::{access, Inbound, Outstanding};

impl<L: Clone + Default, P> Sender<L, P> {
    /// `n` more bytes of the oldest request (a Read) arrived; with `last` it
    /// is answered.
    pub fn read_arrived(&mut self, n: u64, last: bool) -> ReadArrival {
        match self.orq.front_mut() {
            Some(Outstanding::Read(r)) => r.received += n,
            _ => return ReadArrival::Gone,
        }
        if !last {
            return ReadArrival::More;
        }
        match self.answer_oldest() {
            Some(idx) => ReadArrival::Answered(idx),
            None => ReadArrival::Gone,
        }
    }

    /// The oldest request is answered: its send queue index.
    pub fn answer_oldest(&mut self) -> Option<u32> {
        self.orq.pop_front().map(|o| o.sq_idx())
    }

    /// Queues a request from the peer behind the earlier ones; false if IRD
    /// of them wait already (RFC 6581: the peer has no buffer for it).
    pub fn queue_request(&mut self, req: Inbound) -> bool {
        if self.irq.len() as u32 >= self.ird_max {
            return false;
        }
        self.irq.push_back(req);
        true
    }

    /// Sets ORD (modify_qp's `max_rd_atomic`), within the peer's IRD.
    pub fn set_ord(&mut self, ord: u32) {
        self.ord_max = self.peer_ird.min(ord);
    }

    /// The next work request of the send queue that may start now.
    pub(super) fn next_request<H>(&mut self, host: &mut H) -> Result<Option<Cur<L, P>>, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        let (outstanding, ord) = (self.orq.len() as u32, self.ord_max);
        // A fenced request waits for every Read before it; a queue 1 request for
        // room in ORD.
        let confirm = self.confirm && ord > 0;
        // With ORD 0 a queue 1 request is taken, to fail: it can never go.
        let admit = |c: WrClass| {
            let fenced = c.fence && outstanding > 0;
            let full = (c.queue1 || (confirm && c.confirmed)) && outstanding >= ord && ord > 0;
            !fenced && !full
        };
        let Some(wr) = host.next_wr(admit) else {
            return Ok(None);
        };
        // Local protection is checked before the request goes out: a Read's
        // data, an atomic's original and a hash land in the local buffers. (A
        // Send's or Write's payload is checked as it is framed, in frame_data.)
        let lands = matches!(
            wr.op,
            WrOp::Read { .. } | WrOp::Atomic { .. } | WrOp::Verify { .. }
        );
        if lands
            && host
                .check_payload(&wr.payload, access::LOCAL_WRITE)
                .is_err()
        {
            return Err(bad_lkey());
        }
        Ok(Some(Cur {
            job: Job::Sq(wr),
            sent: 0,
        }))
    }
}
