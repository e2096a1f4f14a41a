//! Answers to the peer's requests on queue 1, in the order they came: Read
//! Responses (their source sent in place or copied), the responses on queue
//! 3 to the rest, and the requests that wait on the medium, handed to a
//! worker while this side's own work goes on.

use super::fpdu::{no_payload, tagged, untagged};
use super::{Cur, Job, SendHost, Sender, Span, BATCH};
use crate::fault::Fail;
use crate::queue1::{self, access, Inbound, Outcome, ReadResp, Response};
use crate::wire::{commit, ddp, rdmap};

/// Whether carrying out `req` touches the medium.
fn needs_media(req: &Inbound) -> bool {
    match req {
        Inbound::Flush { flags, len, .. } => *len > 0 && flags & commit::FLUSH_PERSISTENCE != 0,
        Inbound::Verify { .. } => true,
        _ => false,
    }
}

/// A Flush to persistence or a Verify waits on the disk: a worker carries it
/// out, later queue 1 requests wait their turn, this side's own work goes on.
#[derive(Debug)]
pub(super) enum Media {
    Idle,
    /// The worker has the request, under its ticket.
    Busy(u64, Inbound),
    Done(Result<Response, Fail>),
}

impl<L: Clone + Default, P> Sender<L, P> {
    /// The worker carried out request `ticket` with `outcome`; false if the
    /// QP gave up on it meanwhile.
    pub fn media_done(&mut self, ticket: u64, outcome: Outcome) -> bool {
        let Media::Busy(t, req) = &self.media else {
            return false;
        };
        if *t != ticket {
            return false;
        }
        self.media = Media::Done(queue1::answer(req, outcome));
        true
    }

    /// The next answer to the peer: a medium job finished, or the oldest
    /// request waiting (one that needs the medium goes to it).
    pub(super) fn next_answer<H>(&mut self, host: &mut H) -> Result<Option<Cur<L, P>>, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        match self.media {
            Media::Done(_) => {
                let Media::Done(r) = std::mem::replace(&mut self.media, Media::Idle) else {
                    unreachable!("the medium's job is done")
                };
                return r.map(|resp| {
                    Some(Cur {
                        job: Job::Respond(resp),
                        sent: 0,
                    })
                });
            }
            Media::Busy(..) => {}
            Media::Idle => {
                if let Some(r) = self.irq.pop_front() {
                    if !needs_media(&r) {
                        return Ok(Some(Cur {
                            job: Job::Inbound(r),
                            sent: 0,
                        }));
                    }
                    self.media = Media::Busy(host.defer(r), r);
                }
            }
        }
        Ok(None)
    }

    /// Frames as much of the Read Response to `r` as the batch allows, from
    /// `*sent` bytes on; true once its last FPDU is framed.
    pub(super) fn read_response<H>(
        &mut self,
        host: &mut H,
        r: ReadResp,
        sent: &mut u64,
    ) -> Result<bool, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        loop {
            let n = (r.len as u64 - *sent).min(self.mulpdu as u64) as usize;
            let last = *sent + n as u64 == r.len as u64;
            let to = r.sink_to.wrapping_add(*sent);
            let hdr = tagged(rdmap::Opcode::ReadResponse, r.sink_stag, to, last);
            let src = r.src_to.wrapping_add(*sent);
            let span = Span {
                stag: r.src_stag,
                to: src,
                len: n as u32,
                need: access::REMOTE_READ,
            };
            if self.in_place(n) && host.in_place(r.src_stag) {
                host.check_span(&span).map_err(|_| span.fault())?;
                self.push_fpdu_spans(&hdr, &[span], n)?;
            } else {
                self.push_fpdu(
                    &hdr,
                    &[],
                    |buf| {
                        // A zero-length Read names no memory that
                        // could be read (RFC 5040 section 5.2.1).
                        if n == 0 {
                            return Ok(());
                        }
                        host.read_source(r.src_stag, src, n, buf)
                            .map_err(|_| span.fault())
                    },
                    n,
                )?;
            }
            *sent += n as u64;
            if last {
                return Ok(true);
            }
            if self.queued() >= BATCH as u64 {
                return Ok(false);
            }
        }
    }

    /// Carries out `req` (neither a Read nor one that waits on the medium)
    /// and frames its response.
    pub(super) fn carry_out<H>(&mut self, host: &mut H, req: &Inbound) -> Result<bool, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        let resp = queue1::answer(req, host.carry_out(req))?;
        self.respond(&resp)?;
        Ok(true)
    }

    /// Frames the response to a queue 1 request on queue 3.
    pub(super) fn respond(&mut self, resp: &Response) -> Result<(), Fail> {
        let msn = self.take_msn(ddp::QN_ATOMIC_RESPONSE);
        let hdr = untagged(resp.opcode, 0, ddp::QN_ATOMIC_RESPONSE, msn, 0, true);
        self.put_fpdu(&hdr, &resp.body, 0, no_payload)
    }
}
