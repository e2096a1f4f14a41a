//! RDMA Write (RFC 5040 section 5.1): tagged placement at STag and TO, in
//! the memory the peer was given the right to write.

use super::{errors, Host, Receiver};
use crate::fault::Fail;
use crate::queue1::access;
use crate::send::Span;

impl<R> Receiver<R> {
    /// A segment of an RDMA Write: its payload placed at `to` of `stag`,
    /// its length counted for the Immediate Data that may follow the last
    /// segment. (The failure is boxed, as for [`Receiver::whole_send`]: the
    /// steady state's fast path calls this too.)
    #[inline]
    pub(super) fn write<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        stag: u32,
        to: u64,
        last: bool,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Box<Fail>> {
        // A zero-length Write touches no memory, so its STag is not checked.
        if !payload.is_empty() {
            host.place(stag, to, payload, access::REMOTE_WRITE, self.access)
                .map_err(|e| errors::write_refused(e, dhdr))?;
        }
        self.written(payload.len() as u64, last);
        Ok(())
    }

    /// `n` more bytes of the RDMA Write being received were placed; with
    /// `last`, the Write is whole.
    #[inline]
    pub(super) fn written(&mut self, n: u64, last: bool) {
        self.write_len += n;
        if last {
            self.after_write = Some(std::mem::take(&mut self.write_len));
        }
    }

    /// Where a Write's payload of `len` bytes at `to` of `stag` goes when
    /// the driver reads it from the stream in place, checked as
    /// [`Receiver::write`] places it, and the QP's rights it is checked
    /// with; `None` if the driver cannot reach that memory in place or the
    /// Write is refused (the buffered path then reports it).
    pub(super) fn write_in_place<H: Host<Recv = R>>(
        &self,
        host: &mut H,
        stag: u32,
        to: u64,
        len: u32,
    ) -> Option<(Span, u32)> {
        let need = access::REMOTE_WRITE;
        if !host.in_place(stag) || host.check(stag, to, len as u64, need, self.access).is_err() {
            return None;
        }
        Some((
            Span {
                stag,
                to,
                len,
                need,
            },
            self.access,
        ))
    }
}
