//! The provider's system calls, in one place, each as a small wrapper: safe
//! where the call cannot break memory safety, documented where it can.
//!
//! The data path's (`send_now`, `sendmsg_raw`, `recv_raw`) are bare system
//! calls: libc's wrappers of `send`, `sendmsg` and `recv` are thread
//! cancellation points, and a program cancelling a thread inside a verb
//! would leave the provider's locks held. The bare calls are no
//! cancellation points, and cost less.
//!
//! The others go through rustix where it has the same system call with the
//! same flags and effect (it too makes the call itself, with no
//! cancellation point). libc stays where rustix has none: `getifaddrs`,
//! `if_nametoindex` and `sysconf` are libc's own functions, not system
//! calls; glibc's `statx` falls back to `fstatat` on kernels without the
//! call; rustix's `poll` is `ppoll`; it has no `process_vm_readv`, no
//! `IP_BIND_ADDRESS_NO_PORT`, and no `write` of memory that need not be
//! initialised bytes (a command structure's padding). libc's `write` and
//! `poll` are cancellation points, as they were.

use std::ffi::CStr;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

// ---- the data path ---------------------------------------------------------------

/// `send(2)` of `buf` on stream `fd`, never blocking and never raising
/// SIGPIPE, made as the bare system call (rustix). libc's wrapper is a thread
/// cancellation point: a program cancelling a thread inside `ibv_post_send`
/// (or any verb) would leave the provider's locks held. The bare call is no
/// cancellation point, and costs less.
///
/// # Safety
/// `fd` is an open socket for the whole call.
pub unsafe fn send_now(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    use rustix::net::SendFlags;
    // SAFETY: as the caller promised.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
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

// ---- memory ----------------------------------------------------------------------

/// The page size (`sysconf(_SC_PAGESIZE)`, at least 4096). libc's: it has
/// the value from the auxiliary vector at hand, which rustix would read
/// from /proc/self/auxv.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (p.max(4096)) as u64
}

/// A shared mapping of `len` bytes of `fd` from `offset`, readable and
/// writable, where the kernel places it (`mmap(2)`); unmap it with [`unmap`].
pub fn map_shared(fd: BorrowedFd, offset: u64, len: usize) -> io::Result<*mut u8> {
    use rustix::mm::{MapFlags, ProtFlags};
    // SAFETY: no address is asked for, so the new mapping replaces none: no
    // memory the program uses changes.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            offset,
        )
    }?;
    Ok(p.cast())
}

/// `munmap(2)` of `[addr, addr+len)`.
///
/// # Safety
/// Nothing uses the range afterwards: it is a mapping its caller owns.
pub unsafe fn unmap(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: as the caller promised.
    Ok(unsafe { rustix::mm::munmap(addr.cast(), len) }?)
}

/// `madvise(2)` with `MADV_POPULATE_WRITE` (`write`) or
/// `MADV_POPULATE_READ` (Linux 5.14): brings the pages of `[addr, addr+len)`
/// in, as touching them would, or fails (`EFAULT`, `ENOMEM`) where they are
/// not mapped so; `EINVAL` from a kernel without the advice.
pub fn populate(addr: u64, len: usize, write: bool) -> io::Result<()> {
    use rustix::mm::Advice;
    let advice = if write {
        Advice::LinuxPopulateWrite
    } else {
        Advice::LinuxPopulateRead
    };
    // SAFETY: populating changes no mapping and no byte; the kernel checks
    // the range.
    Ok(unsafe { rustix::mm::madvise(addr as *mut _, len, advice) }?)
}

/// `madvise(2)` with `MADV_WILLNEED`: starts reading the pages of
/// `[addr, addr+len)` in.
pub fn will_need(addr: u64, len: usize) -> io::Result<()> {
    // SAFETY: WILLNEED only starts reading pages in; the kernel checks the range.
    Ok(unsafe { rustix::mm::madvise(addr as *mut _, len, rustix::mm::Advice::WillNeed) }?)
}

/// `msync(2)` with `MS_SYNC` of the page-aligned `[addr, addr+len)`: the
/// shared file mappings there are written back before it returns (`ENOMEM`
/// where it is not mapped).
pub fn msync(addr: u64, len: usize) -> io::Result<()> {
    // SAFETY: msync reads and changes no memory through the pointer; the
    // kernel checks the range.
    Ok(unsafe { rustix::mm::msync(addr as *mut _, len, rustix::mm::MsyncFlags::SYNC) }?)
}

/// Copies `out.len()` bytes from this process's address `from` into `out`
/// through the kernel (`process_vm_readv(2)` on this process, libc's), which
/// fails on what is not mapped readable instead of faulting; how many it
/// copied.
pub fn read_own(from: u64, out: &mut [u8]) -> io::Result<usize> {
    let l = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: out.len(),
    };
    let r = libc::iovec {
        iov_base: from as *mut libc::c_void,
        iov_len: out.len(),
    };
    // SAFETY: the kernel writes only into `out`, which is `out.len()` bytes of
    // ours, and checks `from`, failing on what is not mapped.
    let n = unsafe { libc::process_vm_readv(own_pid(), &l, 1, &r, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Copies `data` to this process's address `to` through the kernel
/// (`process_vm_writev(2)` on this process, libc's), which fails on what is
/// not mapped writable instead of faulting; how many bytes it copied.
///
/// # Safety
/// No Rust reference covers `[to, to+data.len())`: it is memory the
/// application handed over (a registered region), written as an RNIC would.
pub unsafe fn write_own(to: u64, data: &[u8]) -> io::Result<usize> {
    let l = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let r = libc::iovec {
        iov_base: to as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: the kernel only reads `data`; `to` is the caller's to write, and
    // the kernel fails on what is not mapped writable.
    let n = unsafe { libc::process_vm_writev(own_pid(), &l, 1, &r, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn own_pid() -> libc::pid_t {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// A private anonymous mapping of `len` zeroed bytes, readable and writable,
/// where the kernel places it (`mmap(2)`); unmap it with [`unmap`].
pub fn map_anonymous(len: usize) -> io::Result<*mut u8> {
    use rustix::mm::{MapFlags, ProtFlags};
    // SAFETY: no address is asked for, so the new mapping replaces none: no
    // memory the program uses changes.
    let p = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }?;
    Ok(p.cast())
}

// ---- threads and CPUs ------------------------------------------------------------

/// A set of CPUs, as the affinity calls take it (1024 of them, as libc's
/// `cpu_set_t`).
pub use rustix::thread::CpuSet;

/// The CPU the calling thread runs on (`sched_getcpu(3)`); `None` if it
/// cannot say. libc's: glibc reads it from the thread's rseq area, with no
/// call at all, where rustix calls the vDSO's `getcpu`.
#[inline]
pub fn current_cpu() -> Option<i32> {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    (c >= 0).then_some(c)
}

/// The CPUs the calling thread may run on (`sched_getaffinity(2)`).
pub fn affinity() -> io::Result<CpuSet> {
    Ok(rustix::thread::sched_getaffinity(None)?)
}

/// Lets the calling thread run on the CPUs of `set` only
/// (`sched_setaffinity(2)`).
pub fn set_affinity(set: &CpuSet) -> io::Result<()> {
    Ok(rustix::thread::sched_setaffinity(None, set)?)
}

/// Runs the calling thread under `SCHED_FIFO` at `priority`
/// (`pthread_setschedparam(3)` on `pthread_self()`, libc's: a pthread
/// function, which keeps glibc's own record of the thread's policy). A
/// failure leaves the thread as it was.
pub fn set_fifo(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: changes only this thread's own scheduling, from a live
    // sched_param.
    let r = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

// ---- files -----------------------------------------------------------------------

/// `statx(2)` of the open file `f` itself (`AT_EMPTY_PATH`) for `mask`.
/// libc's: glibc answers from `fstatat` on a kernel without statx.
pub fn statx(f: BorrowedFd, mask: u32) -> io::Result<libc::statx> {
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the path is a valid C string, st is large enough for struct statx.
    let r = unsafe {
        libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            mask,
            st.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx filled the struct; it was zeroed beforehand, and all its
    // fields are integers.
    Ok(unsafe { st.assume_init() })
}

/// The type (magic number) of the file system the open file `f` is on
/// (`fstatfs(2)`'s `f_type`, which is 32 bits wide whatever the field's width).
pub fn fs_type(f: BorrowedFd) -> io::Result<u32> {
    Ok(rustix::fs::fstatfs(f)?.f_type as u32)
}

/// `posix_fadvise(2)` with `POSIX_FADV_DONTNEED` for `len` bytes of `f`
/// from `offset` (0: to the end of the file): the file's clean cached pages
/// there are dropped.
pub fn drop_cached(f: BorrowedFd, offset: u64, len: u64) -> io::Result<()> {
    let len = std::num::NonZeroU64::new(len);
    Ok(rustix::fs::fadvise(
        f,
        offset,
        len,
        rustix::fs::Advice::DontNeed,
    )?)
}

// ---- sockets and network interfaces ----------------------------------------------

/// A socket of `domain`, type `ty` and protocol `proto` (0: the default),
/// close-on-exec (`socket(2)`).
pub fn socket(domain: i32, ty: i32, proto: i32) -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, Protocol, SocketFlags, SocketType};
    let proto = std::num::NonZeroU32::new(proto as u32).map(Protocol::from_raw);
    Ok(rustix::net::socket_with(
        AddressFamily::from_raw(domain as u16),
        SocketType::from_raw(ty as u32),
        SocketFlags::CLOEXEC,
        proto,
    )?)
}

/// Sets `IP_BIND_ADDRESS_NO_PORT` on socket `s` (`setsockopt(2)`, libc's:
/// rustix lacks the option): a bind leaves the port for `connect` to choose.
pub fn set_bind_address_no_port(s: BorrowedFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a socket option set on a live socket, from a live int of the
    // size given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits up to `timeout_ms` for `fd` to take more bytes (`poll(2)` for
/// `POLLOUT`, libc's); whether it said so in time. An `fd` that is not open
/// is answered at once.
pub fn wait_writable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    (unsafe { libc::poll(&mut pfd, 1, timeout_ms) }) > 0
}

/// The index of the network interface `name` in this network namespace
/// (`if_nametoindex(3)`, libc's); `None` if there is none.
pub fn if_index(name: &CStr) -> Option<u32> {
    // SAFETY: `name` is a NUL-terminated string for the call.
    let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (i != 0).then_some(i)
}

/// The MTU of network interface `name` (`SIOCGIFMTU` on socket `s`).
/// `name` is shorter than `IFNAMSIZ`.
pub fn if_mtu(s: BorrowedFd, name: &str) -> io::Result<i32> {
    // SAFETY: ifreq is plain old data (arrays, integers, a pointer in a
    // union); all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // The caller checked name.len() < IFNAMSIZ, so the name stays
    // NUL-terminated.
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src as libc::c_char;
    }
    const SIOCGIFMTU: rustix::ioctl::Opcode = libc::SIOCGIFMTU as rustix::ioctl::Opcode;
    // SAFETY: SIOCGIFMTU reads the name from an ifreq and writes the MTU into it.
    unsafe {
        rustix::ioctl::ioctl(
            s,
            rustix::ioctl::Updater::<SIOCGIFMTU, libc::ifreq>::new(&mut ifr),
        )
    }?;
    // SAFETY: after SIOCGIFMTU succeeds the union holds ifru_mtu.
    Ok(unsafe { ifr.ifr_ifru.ifru_mtu })
}

/// The network interfaces of this network namespace and their addresses
/// (`getifaddrs(3)`, libc's: it asks the kernel through netlink), freed
/// once when dropped.
pub struct IfAddrs(*mut libc::ifaddrs);

/// One entry of [`IfAddrs`]: an interface and one of its addresses.
pub struct IfAddr<'a> {
    pub name: &'a CStr,
    /// `IFF_*`.
    pub flags: u32,
    pub addr: Option<IfAddress<'a>>,
}

pub enum IfAddress<'a> {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    /// A hardware address (`AF_PACKET`): its `sll_halen` bytes.
    Link(&'a [u8]),
    Other,
}

impl IfAddrs {
    pub fn new() -> io::Result<IfAddrs> {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: head is a valid out-pointer; on success we own the list.
        if unsafe { libc::getifaddrs(&mut head) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(IfAddrs(head))
    }

    /// The entries that name an interface, in the kernel's order.
    pub fn iter(&self) -> impl Iterator<Item = IfAddr<'_>> {
        let mut cur = self.0;
        std::iter::from_fn(move || loop {
            if cur.is_null() {
                return None;
            }
            // SAFETY: cur is a node of the list getifaddrs returned; the list
            // stays alive (and unmodified) while `self` is borrowed.
            let ifa = unsafe { &*cur };
            cur = ifa.ifa_next;
            if ifa.ifa_name.is_null() {
                continue;
            }
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
            // SAFETY: ifa_addr is null or a socket address of the list, of
            // the family it starts with.
            let addr = unsafe { if_address(ifa.ifa_addr) };
            return Some(IfAddr {
                name,
                flags: ifa.ifa_flags,
                addr,
            });
        })
    }
}

/// The address at `sa`, if any.
///
/// # Safety
/// `sa` is null or a socket address of the family it starts with, which
/// outlives `'a`.
unsafe fn if_address<'a>(sa: *const libc::sockaddr) -> Option<IfAddress<'a>> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per the contract: a socket address starts with sa_family.
    let family = i32::from(unsafe { (*sa).sa_family });
    Some(match family {
        libc::AF_INET => {
            // SAFETY: per the contract, an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(sa as *const libc::sockaddr_in) };
            IfAddress::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        }
        libc::AF_INET6 => {
            // SAFETY: per the contract, an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
            IfAddress::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
        }
        libc::AF_PACKET => {
            // SAFETY: per the contract, an AF_PACKET address is a
            // sockaddr_ll (glibc allocates one with room for the full address).
            let sll = unsafe { &*(sa as *const libc::sockaddr_ll) };
            let n = usize::from(sll.sll_halen).min(sll.sll_addr.len());
            IfAddress::Link(&sll.sll_addr[..n])
        }
        _ => IfAddress::Other,
    })
}

impl Drop for IfAddrs {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from getifaddrs and is freed only here.
            unsafe { libc::freeifaddrs(self.0) };
        }
    }
}

// ---- the device's command fd -----------------------------------------------------

/// `write(2)` of `len` bytes at `buf` to `fd` (libc's: rustix writes only
/// initialised bytes, and a command structure may have padding); how many
/// were taken.
///
/// # Safety
/// `buf` is `len` readable bytes; what the kernel does with them (a
/// command naming buffers to fill) is the caller's to allow.
pub unsafe fn write_raw(fd: RawFd, buf: *const u8, len: usize) -> io::Result<usize> {
    // SAFETY: as the caller promised.
    let n = unsafe { libc::write(fd, buf.cast(), len) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The `ioctl(2)` request `OPCODE` on `fd` with `arg`, which the kernel reads
/// and may write back (rustix's, as the system call).
///
/// # Safety
/// `fd` is open for the call; `T` is what the kernel takes for `OPCODE`, and
/// what it does with it (buffers it names) is the caller's to allow.
pub unsafe fn ioctl_update<const OPCODE: rustix::ioctl::Opcode, T>(
    fd: RawFd,
    arg: &mut T,
) -> io::Result<()> {
    // SAFETY: as the caller promised.
    unsafe {
        let fd = BorrowedFd::borrow_raw(fd);
        rustix::ioctl::ioctl(fd, rustix::ioctl::Updater::<OPCODE, T>::new(arg))?;
    }
    Ok(())
}
