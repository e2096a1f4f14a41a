//! RDMA Read Response (RFC 5040 section 5.2.2): tagged data for the sink of
//! the oldest Read this side sent, which it must fit exactly where that
//! Read's data has reached.

use super::{errors, Host};
use crate::fault::{AccessFault, Fail};
use crate::queue1::{Outstanding, PendingRead};
use crate::send::Span;

/// The Read Responses of the oldest outstanding Read, lent with the stream
/// to another that places them (the kernel module): a whole segment for
/// `stag` at exactly `to`, of at most `left` bytes and of exactly `left`
/// if it is the last, checked against a region that grants local writes,
/// is placed at that TO of that region, which is where [`read_response`]
/// places it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LentRead {
    pub stag: u32,
    pub to: u64,
    pub left: u64,
}

impl LentRead {
    /// Whether a segment of `n` bytes for `stag` at `to`, the last with
    /// `last`, is one the holder may place: as [`answered_read`] judges.
    pub fn fits(&self, stag: u32, to: u64, n: u64, last: bool) -> bool {
        stag == self.stag && to == self.to && n <= self.left && (!last || n == self.left)
    }

    /// Such a segment was placed: the next one goes after it.
    pub fn placed(&mut self, n: u64) {
        self.to = self.to.wrapping_add(n);
        self.left -= n;
    }

    /// The Read Responses of Read `pr` (the oldest outstanding), if what is
    /// left of its sink is one span of the region its sink STag names,
    /// starting where its data has reached (so a Read Response's STag and
    /// TO locate its bytes by themselves), that the driver reaches in
    /// place: `locate` is [`Host::locate_local`].
    pub fn of<L>(
        pr: &PendingRead<L>,
        locate: impl FnOnce(&L, u64, usize, &mut Vec<Span>) -> Result<bool, AccessFault>,
    ) -> Option<LentRead> {
        let left = pr.length.checked_sub(pr.received)?;
        let n = u32::try_from(left).ok().filter(|&n| n > 0)?;
        let to = pr.sink_to.wrapping_add(pr.received);
        let mut spans = Vec::with_capacity(1);
        if locate(&pr.sink, pr.received, n as usize, &mut spans) != Ok(true) {
            return None;
        }
        let one = matches!(*spans, [s] if s.stag == pr.sink_stag && s.to == to && s.len == n);
        one.then_some(LentRead {
            stag: pr.sink_stag,
            to,
            left,
        })
    }
}

/// The oldest outstanding request's Read Responses, if it is a Read that
/// [`LentRead::of`] finds lendable.
pub(super) fn lendable<H: Host>(host: &mut H) -> Option<LentRead> {
    let Some(Outstanding::Read(pr)) = host.oldest_outstanding() else {
        return None;
    };
    LentRead::of(&pr, |l, off, n, spans| host.locate_local(l, off, n, spans))
}

/// The stream is back from the holder of `lent`, with `left` bytes of the
/// Read still to come, and `done` if it placed the last segment: the bytes
/// it placed arrived (with the last, the Read is answered).
pub(super) fn read_back<H: Host>(
    host: &mut H,
    lent: LentRead,
    left: u64,
    done: bool,
) -> Result<(), Fail> {
    let left = if done { 0 } else { left.min(lent.left) };
    let n = lent.left - left;
    if n == 0 && !done {
        return Ok(());
    }
    arrived(host, n, done)
}

/// The Read that `n` bytes of a Read Response (to `stag` at `to`, the last
/// of it with `last`) answer: the oldest outstanding request, which must be
/// a Read whose sink they fit exactly where its data has reached. Only the
/// receive path advances `received`, so the copy is current.
fn answered_read<H: Host>(
    host: &mut H,
    stag: u32,
    to: u64,
    n: u64,
    last: bool,
    dhdr: &[u8],
) -> Result<PendingRead<H::Local>, Fail> {
    let Some(Outstanding::Read(pr)) = host.oldest_outstanding() else {
        return Err(errors::unexpected(dhdr));
    };
    if stag != pr.sink_stag {
        return Err(errors::unknown_sink(dhdr));
    }
    let received = pr.received + n;
    if to != pr.sink_to.wrapping_add(pr.received)
        || received > pr.length
        || (last && received != pr.length)
    {
        return Err(errors::outside_sink(dhdr));
    }
    Ok(pr)
}

/// A segment of an RDMA Read Response, for the oldest outstanding request.
pub(super) fn read_response<H: Host>(
    host: &mut H,
    stag: u32,
    to: u64,
    last: bool,
    payload: &[u8],
    dhdr: &[u8],
) -> Result<(), Fail> {
    let pr = answered_read(host, stag, to, payload.len() as u64, last, dhdr)?;
    if host.scatter(&pr.sink, pr.received, payload).is_err() {
        return Err(errors::sink_lost());
    }
    arrived(host, payload.len() as u64, last)
}

/// `n` more bytes of the oldest Read were placed; with `last` it is answered.
pub(super) fn arrived<H: Host>(host: &mut H, n: u64, last: bool) -> Result<(), Fail> {
    if !host.read_arrived(n, last) {
        return Err(errors::read_flushed());
    }
    Ok(())
}

/// The spans of the sink that `len` bytes of a Read Response go to when the
/// driver reads them from the stream in place, appended to `spans`, checked
/// as [`read_response`] places them; false if the response does not answer
/// the oldest Read as it must or the driver cannot reach its sink in place
/// (the buffered path then reports it).
pub(super) fn read_in_place<H: Host>(
    host: &mut H,
    stag: u32,
    to: u64,
    len: usize,
    last: bool,
    dhdr: &[u8],
    spans: &mut Vec<Span>,
) -> bool {
    let Ok(pr) = answered_read(host, stag, to, len as u64, last, dhdr) else {
        return false;
    };
    matches!(
        host.locate_local(&pr.sink, pr.received, len, spans),
        Ok(true)
    )
}
