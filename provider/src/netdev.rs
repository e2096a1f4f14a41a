//! Network interfaces: the address, MTU and hardware address of the one an
//! xiw device is bound to (`xiw up`, and the provider for a device the
//! kernel module registered).

use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;

use crate::error::Error;
use crate::sys::{self, IfAddress, IfAddrs};

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
pub fn lookup_netdev(name: &str) -> Result<Netdev, Error> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', '\0']) {
        return Err(Error::Device(format!(
            "{name:?} is not a valid network interface name"
        )));
    }
    let cname = CString::new(name).map_err(|_| Error::Device(format!("{name:?}: bad name")))?;
    let Some(ifindex) = sys::if_index(&cname) else {
        return Err(Error::Device(format!(
            "no network interface named {name} in this network namespace"
        )));
    };

    let mut v4: Option<Ipv4Addr> = None;
    let mut v6: Option<Ipv6Addr> = None;
    let mut mac = [0u8; 6];
    let mut flags: u32 = 0;
    let list = IfAddrs::new().map_err(|e| Error::Device(format!("getifaddrs: {e}")))?;
    for ifa in list.iter() {
        if ifa.name.to_bytes() != name.as_bytes() {
            continue;
        }
        flags = ifa.flags;
        match ifa.addr {
            Some(IfAddress::V4(a)) if v4.is_none() => v4 = Some(a),
            Some(IfAddress::V6(a))
                if v6.is_none()
                    && !a.is_unicast_link_local()
                    && !a.is_multicast()
                    && !a.is_unspecified() =>
            {
                v6 = Some(a)
            }
            Some(IfAddress::Link(hw)) if hw.len() == 6 => mac.copy_from_slice(hw),
            _ => {}
        }
    }
    drop(list);

    let addr = match (v4, v6) {
        (Some(a), _) => IpAddr::V4(a),
        (None, Some(a)) => IpAddr::V6(a),
        (None, None) => {
            return Err(Error::Device(format!(
                "network interface {name} has no IPv4 or non-link-local IPv6 address \
                 (add one, e.g. `ip addr add 10.0.0.1/24 dev {name}`, and bring it up)"
            )))
        }
    };
    let mtu =
        netdev_mtu(name).map_err(|e| Error::Device(format!("{name}: reading the MTU: {e}")))?;
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

/// The MTU through SIOCGIFMTU. Unlike /sys/class/net/<if>/mtu this answers
/// for the caller's network namespace even when /sys was not remounted.
fn netdev_mtu(name: &str) -> io::Result<u32> {
    let sock = sys::socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let mtu = sys::if_mtu(sock.as_fd(), name)?;
    u32::try_from(mtu).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "negative MTU"))
}
