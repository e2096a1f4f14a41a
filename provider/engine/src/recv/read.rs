//! RDMA Read Response (RFC 5040 section 5.2.2): tagged data for the sink of
//! the oldest Read this side sent, which it must fit exactly where that
//! Read's data has reached.

use super::{errors, Host};
use crate::fault::Fail;
use crate::queue1::{Outstanding, PendingRead};
use crate::send::Span;

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
