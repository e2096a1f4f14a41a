//! The TCP side of standalone mode before the data path takes a stream:
//! listening, accepting and connecting sockets, and the MPA frames of the
//! exchange; and what a failed read or write of a stream means for its QP.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use xiw_engine::setup;

use crate::private_data::parse_xiw;
use crate::sys::{self, recv_raw, send_now};
use crate::wire::mpa;

/// What a failed read or write of a QP's stream means for the QP: the end
/// of the stream, and for a peer that stopped acknowledging past the
/// stream's time-out (`XIW_STREAM_TIMEOUT_MS`) a retry-exceeded error for the
/// oldest outstanding request, as an InfiniBand requester reports it.
pub fn stream_error(op: &str, e: &io::Error) -> xiw_engine::fault::Fail {
    use xiw_engine::fault::Fail;
    match e.raw_os_error() {
        Some(libc::ETIMEDOUT) => {
            Fail::timed_out(format!("{op}: {e} (no acknowledgement from the peer)"))
        }
        _ => Fail::stream(format!("{op}: {e}")),
    }
}

/// A listening socket on the device address; returns it and its port.
pub fn listen(addr: IpAddr) -> io::Result<(OwnedFd, u16)> {
    let s = socket_for(addr)?;
    s.bind(&SocketAddr::new(addr, 0).into())?;
    // Many QPs may connect at once (perftest -q, MPI): use the system's limit.
    s.listen(libc::SOMAXCONN)?;
    let port = s
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?
        .port();
    Ok((s.into(), port))
}

/// Accepts one connection, non-blocking.
pub fn accept(listener: &OwnedFd) -> Option<OwnedFd> {
    let (s, _) = SockRef::from(listener).accept().ok()?;
    s.set_nonblocking(true).ok()?;
    Some(s.into())
}

/// A Request xiw can take: well formed, with xiw's private data naming the
/// QP it is for (`target`).
pub fn parse_request(frame: &[u8]) -> Option<Request> {
    let mpa = setup::Request::parse(frame).ok()?;
    let p = parse_xiw(&mpa.data)?;
    Some(Request {
        target: p.to,
        initiator_qpn: p.from,
        stamp: p.stamp,
        mpa,
    })
}

/// Turns a connection away with an MPA Reply carrying the Reject bit.
pub fn send_reject(fd: RawFd) {
    let _ = write_all(fd, &setup::reject(mpa::REVISION_2, &[]));
}

/// An MPA Request as xiw reads it.
pub struct Request {
    pub target: u32,
    pub mpa: setup::Request,
    pub initiator_qpn: u32,
    /// Which connection attempt of the initiator (0: a peer that sends none).
    pub stamp: u64,
}

/// Reads exactly one MPA Request/Reply frame; `None` until it is complete.
/// Nothing behind the frame is read: it belongs to the data path.
pub fn read_frame(fd: RawFd, reader: &mut setup::FrameReader) -> io::Result<Option<Vec<u8>>> {
    let mut chunk = [0u8; mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA];
    loop {
        let want = reader
            .missing()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // SAFETY: receiving at most `want` (<= the chunk's size) bytes into a live buffer.
        let n = unsafe {
            recv_raw(
                fd,
                chunk.as_mut_ptr(),
                want.min(chunk.len()),
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "peer closed during MPA setup",
            ));
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(None);
            }
            return Err(e);
        }
        let (_, frame) = reader
            .feed(&chunk[..n as usize])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if frame.is_some() {
            return Ok(frame);
        }
    }
}

pub fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(a),
        v4 => v4,
    }
}

/// A non-blocking TCP socket for `addr`'s family (close-on-exec, as socket2 makes every socket).
pub fn socket_for(addr: IpAddr) -> io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(SocketAddr::new(addr, 0)),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Binds an outgoing connection's socket to the device address, leaving
/// the local port for `connect` to choose (IP_BIND_ADDRESS_NO_PORT): a bind
/// to port 0 would search the whole ephemeral range for a port no socket
/// holds, TIME_WAIT ones included, which with thousands of QPs connecting
/// takes seconds, and fails once the range is crowded.
pub fn bind_for_connect(s: &Socket, local: IpAddr) -> io::Result<()> {
    // Best effort: without it the bind below still works.
    let _ = sys::set_bind_address_no_port(s.as_fd());
    s.bind(&SocketAddr::new(local, 0).into())
}

/// Writes a small control frame on a fresh connection, waiting briefly if needed.
pub fn write_all(fd: RawFd, mut data: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !data.is_empty() {
        // SAFETY: `fd` is our socket, open for the call.
        let e = match unsafe { send_now(fd, data) } {
            Ok(n) if n > 0 => {
                data = &data[n..];
                continue;
            }
            Ok(_) => io::Error::from(io::ErrorKind::WriteZero),
            Err(e) => e,
        };
        if e.raw_os_error() == Some(libc::EAGAIN) && Instant::now() < deadline {
            sys::wait_writable(fd, 10);
            continue;
        }
        return Err(e);
    }
    Ok(())
}
