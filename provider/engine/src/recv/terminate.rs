//! The peer's Terminate (RFC 5040 section 5.4): the stream ends, and what
//! it reports decides the status of the oldest request still outstanding.

use crate::fault::{self, Fail};

/// The peer terminated the stream with `body`: nothing is answered, the
/// oldest outstanding request fails with the status the body names.
pub(super) fn peer_terminated(body: &[u8]) -> Fail {
    let (status, event) = fault::peer_terminate(body);
    Fail {
        sq_status: Some(status),
        event,
        ..Fail::stream("peer sent a Terminate")
    }
}
