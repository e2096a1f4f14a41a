//! Network interfaces: the address, MTU and hardware address of the one an
//! xiw device is bound to (`xiw up`, and the provider for a device the
//! kernel module registered).

use std::ffi::{CStr, CString};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// What `xiw up` needs to know about one network interface.
#[derive(Debug, Clone)]
pub struct Netdev {
    pub name: String,
    pub ifindex: u32,
    pub addr: IpAddr,
    pub mtu: u32,
    pub mac: [u8; 6],
    /// IFF_UP and IFF_RUNNING (administratively up and with carrier).
    pub running: bool,
}

/// Looks `name` up in the current network namespace. The address is the
/// interface's first IPv4 address, else its first IPv6 address that is not
/// link-local (a link-local address needs a scope id, which a GID cannot
/// carry).
pub fn lookup_netdev(name: &str) -> Result<Netdev, String> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', '\0']) {
        return Err(format!("{name:?} is not a valid network interface name"));
    }
    let cname = CString::new(name).map_err(|_| format!("{name:?}: bad name"))?;
    // SAFETY: cname is a valid NUL-terminated string for the call.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(format!(
            "no network interface named {name} in this network namespace"
        ));
    }

    let mut v4: Option<Ipv4Addr> = None;
    let mut v6: Option<Ipv6Addr> = None;
    let mut mac = [0u8; 6];
    let mut flags: u32 = 0;
    let list = IfAddrs::new().map_err(|e| format!("getifaddrs: {e}"))?;
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned; the list
        // stays alive (and unmodified) until `list` is dropped.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let ifname = unsafe { CStr::from_ptr(ifa.ifa_name) };
        if ifname.to_bytes() != name.as_bytes() {
            continue;
        }
        flags = ifa.ifa_flags;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points to a socket address that
        // starts with sa_family.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        match family {
            libc::AF_INET if v4.is_none() => {
                // SAFETY: for AF_INET, ifa_addr points to a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                v4 = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            libc::AF_INET6 if v6.is_none() => {
                // SAFETY: for AF_INET6, ifa_addr points to a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let a = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                if !a.is_unicast_link_local() && !a.is_multicast() && !a.is_unspecified() {
                    v6 = Some(a);
                }
            }
            libc::AF_PACKET => {
                // SAFETY: for AF_PACKET, ifa_addr points to a sockaddr_ll
                // (glibc allocates one with room for the full address).
                let sll = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_ll) };
                if sll.sll_halen == 6 {
                    mac.copy_from_slice(&sll.sll_addr[..6]);
                }
            }
            _ => {}
        }
    }
    drop(list);

    let addr = match (v4, v6) {
        (Some(a), _) => IpAddr::V4(a),
        (None, Some(a)) => IpAddr::V6(a),
        (None, None) => {
            return Err(format!(
                "network interface {name} has no IPv4 or non-link-local IPv6 address \
                 (add one, e.g. `ip addr add 10.0.0.1/24 dev {name}`, and bring it up)"
            ))
        }
    };
    let mtu = netdev_mtu(name).map_err(|e| format!("{name}: reading the MTU: {e}"))?;
    let up = libc::IFF_UP as u32 | libc::IFF_RUNNING as u32;
    Ok(Netdev {
        name: name.to_string(),
        ifindex,
        addr,
        mtu,
        mac,
        running: flags & up == up,
    })
}

/// Owns the list getifaddrs returns and frees it once.
struct IfAddrs(*mut libc::ifaddrs);

impl IfAddrs {
    fn new() -> io::Result<IfAddrs> {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: head is a valid out-pointer; on success we own the list.
        if unsafe { libc::getifaddrs(&mut head) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(IfAddrs(head))
    }
}

impl Drop for IfAddrs {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from getifaddrs and is freed only here.
            unsafe { libc::freeifaddrs(self.0) };
        }
    }
}

/// The MTU through SIOCGIFMTU. Unlike /sys/class/net/<if>/mtu this answers
/// for the caller's network namespace even when /sys was not remounted.
fn netdev_mtu(name: &str) -> io::Result<u32> {
    let sock = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // SAFETY: ifreq is plain old data (arrays, integers, a pointer in a
    // union); all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // The caller checked name.len() < IFNAMSIZ, so the name stays
    // NUL-terminated.
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: sock is an open socket and ifr a valid ifreq that SIOCGIFMTU
    // reads the name from and writes the MTU into.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut ifr) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFMTU succeeds the union holds ifru_mtu.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "negative MTU"))
}

pub fn socket(domain: i32, ty: i32, proto: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket has no memory-safety preconditions.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly opened descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
