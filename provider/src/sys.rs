//! The bare system calls of the data path. libc's wrappers of `send`,
//! `sendmsg` and `recv` are thread cancellation points: a program cancelling
//! a thread inside a verb would leave the provider's locks held. These are
//! made as the system calls themselves, which are no cancellation points and
//! cost less.

use std::os::fd::RawFd;

/// `send(2)` of `buf` on stream `fd`, never blocking and never raising
/// SIGPIPE, made as the bare system call (rustix). libc's wrapper is a thread
/// cancellation point: a program cancelling a thread inside `ibv_post_send`
/// (or any verb) would leave the provider's locks held. The bare call is no
/// cancellation point, and costs less.
///
/// # Safety
/// `fd` is an open socket for the whole call.
pub unsafe fn send_now(fd: RawFd, buf: &[u8]) -> std::io::Result<usize> {
    use rustix::net::SendFlags;
    // SAFETY: as the caller promised.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    Ok(rustix::net::send(
        fd,
        buf,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    )?)
}

/// `sendmsg(2)` as the bare system call, for the reason [`send_now`] gives.
///
/// # Safety
/// `msg` must describe readable memory.
pub unsafe fn sendmsg_raw(fd: RawFd, msg: *const libc::msghdr, flags: i32) -> isize {
    // SAFETY: as the caller promised.
    unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg, flags) as isize }
}

/// `recv(2)` as the bare system call, for the reason [`send_now`] gives.
///
/// # Safety
/// `buf` must be `len` writable bytes.
pub unsafe fn recv_raw(fd: RawFd, buf: *mut u8, len: usize, flags: i32) -> isize {
    // SAFETY: as the caller promised; no source address is asked for.
    unsafe { libc::syscall(libc::SYS_recvfrom, fd, buf, len, flags, 0usize, 0usize) as isize }
}
