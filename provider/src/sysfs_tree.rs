//! The device view shared by the `xiw` CLI and the provider.
//!
//! In standalone mode there is no kernel RDMA support at all: libibverbs
//! cannot open the RDMA netlink socket and falls back to scanning a sysfs
//! tree rooted at `$SYSFS_PATH`. `xiw up` writes that tree (with the helpers
//! in this module) and the provider reads its own view of a device back with
//! [`DeviceInfo::load`].
//!
//! Layout, relative to the root (everything libibverbs v44 reads, plus our
//! own `xiw_config`):
//!
//! ```text
//! class/infiniband_verbs/abi_version            "6"
//! class/infiniband_verbs/uverbsN/{ibdev,dev,abi_version}
//! class/infiniband/<ibdev>/{node_type,node_guid,sys_image_guid,fw_ver,
//!                           hw_rev,hca_type,board_id,node_desc,xiw_config}
//! class/infiniband/<ibdev>/ports/1/{state,phys_state,rate,lid,sm_lid,
//!     lid_mask_count,sm_sl,cap_mask,link_layer,gids/0,
//!     gid_attrs/types/0,gid_attrs/ndevs/0,pkeys/0}
//! ```

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// Name prefix of our devices: xiw0, xiw1, ...
pub const IBDEV_PREFIX: &str = "xiw";
/// `class/infiniband_verbs/abi_version`: the uverbs ABI libibverbs v44
/// accepts (IB_USER_VERBS_MIN/MAX_ABI_VERSION are both 6).
pub const UVERBS_CLASS_ABI_VERSION: u32 = 6;
/// `class/infiniband_verbs/uverbsN/abi_version`: the per-device ABI that the
/// provider's `match_min/max_abi_version` are checked against.
pub const UVERBS_DEV_ABI_VERSION: u32 = 1;
/// Major:minor of the uverbs character device. 1:7 is /dev/full, so a
/// command that reaches the kernel through `write()` fails with ENOSPC
/// instead of doing anything.
pub const CDEV_MAJOR: u32 = 1;
pub const CDEV_MINOR: u32 = 7;
/// Our own key=value file inside the ibdev directory.
pub const CONFIG_FILE: &str = "xiw_config";
/// The only port of every device.
pub const PORT_NUM: u32 = 1;
/// What `ports/1/rate` says; the provider should report the matching
/// active_width (1X) and active_speed (QDR, 10 Gb/s) from query_port.
pub const PORT_RATE: &str = "10 Gb/sec (1X QDR)";
/// IBV_NODE_RNIC as the kernel prints it in `node_type`.
pub const NODE_TYPE: &str = "4: RNIC";
pub const FW_VER: &str = "0.1.0";

const DIR_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o444;

/// One xiw device as the provider sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The RDMA device name, e.g. "xiw0".
    pub ibdev: String,
    /// The network interface the device is bound to, e.g. "lo".
    pub netdev: String,
    /// The netdev's ifindex in the network namespace `xiw up` ran in.
    pub ifindex: u32,
    /// The IP address connections are made from and accepted on.
    pub addr: IpAddr,
    /// GID 0 of port 1: `gid_from_addr(addr)`.
    pub gid: [u8; 16],
    /// The netdev MTU in bytes (not an IBV_MTU enum: see [`ibv_mtu_for`]).
    pub mtu: u32,
    /// The netdev's hardware address (all zero for loopback).
    pub mac: [u8; 6],
    /// The node GUID in host order, read as written: the first group of
    /// "xxxx:xxxx:xxxx:xxxx" is the most significant. Convert with
    /// `to_be()` for the `__be64` fields of ibv_device_attr.
    pub node_guid: u64,
    /// Registered by the kernel module (kernel mode), not described by
    /// `xiw up`: port GIDs are hardware addresses, not IP addresses.
    pub kernel: bool,
}

impl DeviceInfo {
    /// Reads the device at `ibdev_path` (`$SYSFS_PATH/class/infiniband/<ibdev>`)
    /// from the `xiw_config` file `xiw up` wrote there.
    pub fn load(ibdev_path: &Path) -> io::Result<DeviceInfo> {
        let ibdev = ibdev_path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: not a device directory", ibdev_path.display()),
                )
            })?;
        let path = ibdev_path.join(CONFIG_FILE);
        let text = fs::read_to_string(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Self::from_config(ibdev, &text).map_err(|msg| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {msg}", path.display()),
            )
        })
    }

    /// Whether `ibdev_path` is a device `xiw up` described (standalone mode)
    /// rather than one the kernel module registered.
    pub fn is_standalone(ibdev_path: &Path) -> bool {
        ibdev_path.join(CONFIG_FILE).exists()
    }

    /// Reads a device the kernel module registered, at `ibdev_path`
    /// (`/sys/class/infiniband/<ibdev>`): the netdev it is bound to, and that
    /// netdev's address, MTU and hardware address in this network namespace.
    pub fn from_kernel(ibdev_path: &Path) -> Result<DeviceInfo, Error> {
        let ibdev = ibdev_path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                Error::Device(format!("{}: not a device directory", ibdev_path.display()))
            })?;
        let read = |rel: &str| {
            let p = ibdev_path.join(rel);
            fs::read_to_string(&p)
                .map(|s| s.trim().to_string())
                .map_err(|e| Error::Device(format!("{}: {e}", p.display())))
        };
        // The port's GID 1 is the netdev's hardware address (GID 0 its IPv4
        // address): the netdev is the one that has it (the RDMA core keeps
        // no netdev with an iWARP GID).
        let gid = read("ports/1/gids/1")?;
        let gid =
            parse_gid(&gid).ok_or_else(|| Error::Device(format!("{ibdev}: bad GID {gid:?}")))?;
        let netdev =
            netdev_with_mac(&gid[..6]).map_err(|e| Error::Device(format!("{ibdev}: {e}")))?;
        let node_guid = read("node_guid")?;
        let node_guid = parse_guid(&node_guid)
            .ok_or_else(|| Error::Device(format!("{ibdev}: bad node_guid {node_guid:?}")))?;
        let n = crate::netdev::lookup_netdev(&netdev)
            .map_err(|e| Error::Device(format!("{ibdev}: {e}")))?;
        Ok(DeviceInfo {
            ibdev: ibdev.to_string(),
            netdev,
            ifindex: n.ifindex,
            addr: n.addr,
            gid: gid_from_addr(n.addr),
            mtu: n.mtu,
            mac: n.mac,
            node_guid,
            kernel: true,
        })
    }

    /// The address of the peer a `modify_qp` names by `gid`: an IP address
    /// (GID 0, in either mode), or in kernel mode also a hardware address
    /// (GID 1, as iWARP devices have): this device's own, or that of a
    /// neighbour on its netdev (which the applications' own exchange over
    /// that interface has made known).
    pub fn peer_addr(&self, gid: &[u8; 16]) -> Result<IpAddr, Error> {
        if !self.kernel || gid[6..].iter().any(|&b| b != 0) {
            return Ok(addr_from_gid(gid));
        }
        let mac: [u8; 6] = gid[..6].try_into().expect("6 bytes");
        if mac == self.mac {
            return Ok(self.addr);
        }
        let arp = fs::read_to_string("/proc/net/arp")
            .map_err(|e| Error::Connect(format!("/proc/net/arp: {e}")))?;
        neighbour_with_mac(&arp, &self.netdev, &mac).ok_or_else(|| {
            Error::Connect(format!(
                "no neighbour on {} has the hardware address {} of the peer's GID \
                 (the peer must be reachable over {} by IPv4)",
                self.netdev,
                format_mac(&mac),
                self.netdev
            ))
        })
    }

    /// Parses the contents of an `xiw_config` file. Unknown keys are ignored
    /// so a newer CLI can add some without breaking an older provider.
    pub fn from_config(ibdev: &str, text: &str) -> Result<DeviceInfo, Error> {
        let mut netdev = None;
        let mut ifindex = None;
        let mut addr = None;
        let mut mtu = None;
        let mut mac = None;
        let mut node_guid = None;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| Error::Device(format!("line {}: expected key=value", n + 1)))?;
            let (key, value) = (key.trim(), value.trim());
            let bad = || Error::Device(format!("line {}: bad value for {key}: {value:?}", n + 1));
            match key {
                "netdev" => netdev = Some(value.to_string()),
                "ifindex" => ifindex = Some(value.parse::<u32>().map_err(|_| bad())?),
                "addr" => addr = Some(value.parse::<IpAddr>().map_err(|_| bad())?),
                "mtu" => mtu = Some(value.parse::<u32>().map_err(|_| bad())?),
                "mac" => mac = Some(parse_mac(value).ok_or_else(bad)?),
                "node_guid" => node_guid = Some(parse_guid(value).ok_or_else(bad)?),
                _ => {}
            }
        }
        let missing = |key: &str| Error::Device(format!("missing key {key}"));
        let addr = addr.ok_or_else(|| missing("addr"))?;
        Ok(DeviceInfo {
            ibdev: ibdev.to_string(),
            netdev: netdev.ok_or_else(|| missing("netdev"))?,
            ifindex: ifindex.ok_or_else(|| missing("ifindex"))?,
            addr,
            gid: gid_from_addr(addr),
            mtu: mtu.ok_or_else(|| missing("mtu"))?,
            mac: mac.ok_or_else(|| missing("mac"))?,
            node_guid: node_guid.ok_or_else(|| missing("node_guid"))?,
            kernel: false,
        })
    }

    /// The contents of the `xiw_config` file for this device.
    pub fn to_config(&self) -> String {
        let mut s = String::from("# written by `xiw up`, read by the xiw provider\n");
        // Writing to a String cannot fail.
        let _ = writeln!(s, "netdev={}", self.netdev);
        let _ = writeln!(s, "ifindex={}", self.ifindex);
        let _ = writeln!(s, "addr={}", self.addr);
        let _ = writeln!(s, "mtu={}", self.mtu);
        let _ = writeln!(s, "mac={}", format_mac(&self.mac));
        let _ = writeln!(s, "node_guid={}", format_guid(self.node_guid));
        s
    }
}

/// The IPv4 address of the complete neighbour entry on `netdev` with the
/// hardware address `mac`, in `/proc/net/arp`'s format.
fn neighbour_with_mac(arp: &str, netdev: &str, mac: &[u8; 6]) -> Option<IpAddr> {
    const ATF_COM: u32 = 0x2;
    arp.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [ip, _hw_type, flags, hw, _mask, dev] = f[..] else {
            return None;
        };
        let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
        (dev == netdev && flags & ATF_COM != 0 && parse_mac(hw)? == *mac)
            .then(|| ip.parse().ok())
            .flatten()
    })
}

/// The one network interface (in this network namespace) whose hardware
/// address is `mac`.
fn netdev_with_mac(mac: &[u8]) -> Result<String, Error> {
    let mac = mac
        .try_into()
        .map_err(|_| Error::Device("short hardware address".into()))?;
    let want = format_mac(mac);
    let mut found: Vec<String> = fs::read_dir("/sys/class/net")
        .map_err(|e| Error::Device(format!("/sys/class/net: {e}")))?
        .filter_map(|e| e.ok())
        .filter(|e| fs::read_to_string(e.path().join("address")).is_ok_and(|a| a.trim() == want))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::Device(format!(
            "no network interface has the port's address {want}"
        ))),
        _ => Err(Error::Device(format!(
            "network interfaces {} share the port's address {want}: cannot tell which",
            found.join(", ")
        ))),
    }
}

/// The GID for an address: IPv4 becomes IPv4-mapped IPv6 (::ffff:a.b.c.d),
/// IPv6 is used as is.
pub fn gid_from_addr(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The inverse of [`gid_from_addr`]: an IPv4-mapped GID gives the IPv4
/// address, anything else the IPv6 address.
pub fn addr_from_gid(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The largest IBV_MTU value (1 = 256 ... 5 = 4096) whose size fits in a
/// netdev MTU once the IP (40 bytes, enough for IPv6) and TCP (20) headers
/// are taken off; at least 1 (IBV_MTU_256).
pub fn ibv_mtu_for(netdev_mtu: u32) -> u32 {
    let payload = netdev_mtu.saturating_sub(40 + 20);
    (1..=5u32)
        .rev()
        .find(|&m| (128u32 << m) <= payload)
        .unwrap_or(1)
}

/// A GUID as sysfs prints it: "xxxx:xxxx:xxxx:xxxx".
pub fn format_guid(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

/// Parses "xxxx:xxxx:xxxx:xxxx" (the format of [`format_guid`]).
pub fn parse_guid(s: &str) -> Option<u64> {
    let groups = parse_hex_groups::<4>(s)?;
    Some(
        groups
            .iter()
            .fold(0u64, |acc, &g| (acc << 16) | u64::from(g)),
    )
}

/// A GID as sysfs prints it: 8 colon-separated groups of 4 hex digits,
/// e.g. "0000:0000:0000:0000:0000:ffff:7f00:0001". libibverbs parses it at
/// fixed offsets (every 5 characters), so the groups must not be shortened.
pub fn format_gid(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|pair| format!("{:02x}{:02x}", pair[0], pair[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses the format of [`format_gid`].
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let groups = parse_hex_groups::<8>(s)?;
    let mut gid = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        gid[2 * i..2 * i + 2].copy_from_slice(&g.to_be_bytes());
    }
    Some(gid)
}

fn parse_hex_groups<const N: usize>(s: &str) -> Option<[u16; N]> {
    let mut out = [0u16; N];
    let mut parts = s.trim().split(':');
    for slot in out.iter_mut() {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 4 {
            return None;
        }
        *slot = u16::from_str_radix(part, 16).ok()?;
    }
    match parts.next() {
        Some(_) => None,
        None => Some(out),
    }
}

/// "aa:bb:cc:dd:ee:ff".
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses the format of [`format_mac`].
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for slot in mac.iter_mut() {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 2 {
            return None;
        }
        *slot = u8::from_str_radix(part, 16).ok()?;
    }
    match parts.next() {
        Some(_) => None,
        None => Some(mac),
    }
}

/// The EUI-64 GUID of a MAC address (flip the universal/local bit, insert
/// ff:fe in the middle), as RoCE and iWARP NICs derive theirs; `None` for an
/// all-zero MAC (loopback), which would give every such device the same GUID.
pub fn guid_from_mac(mac: &[u8; 6]) -> Option<u64> {
    if mac.iter().all(|&b| b == 0) {
        return None;
    }
    let eui = [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    Some(u64::from_be_bytes(eui))
}

/// A GUID for a device without a MAC address: 02:78 ('x'), a 16-bit device
/// index, then the IPv4 address (or, for IPv6, the XOR of its four 32-bit
/// words). The index makes devices of one host distinct even when they
/// share an address (127.0.0.1 in several network namespaces) as long as
/// the caller passes an index unique on the host, such as the uverbs minor.
pub fn guid_from_addr(addr: IpAddr, index: u16) -> u64 {
    let tail: u32 = match addr {
        IpAddr::V4(v4) => u32::from(v4),
        IpAddr::V6(v6) => v6
            .octets()
            .chunks(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .fold(0, |acc, w| acc ^ w),
    };
    (0x0278u64 << 48) | (u64::from(index) << 32) | u64::from(tail)
}

/// `<root>/class/infiniband/<ibdev>`: the path libibverbs calls ibdev_path
/// and passes to the provider.
pub fn ibdev_path(root: &Path, ibdev: &str) -> PathBuf {
    root.join("class/infiniband").join(ibdev)
}

/// The usual name of a uverbs entry and its node: `uverbs<index>`.
pub const UVERBS: &str = "uverbs";

/// The name of a standalone device's uverbs entry and node where they sit
/// beside the kernel's own in /dev/infiniband (a kernel with the RDMA core,
/// which names its nodes `uverbs<N>`): `xiw_uverbs<index>`, which no kernel
/// driver takes.
pub const SHARED_UVERBS: &str = "xiw_uverbs";

/// `<prefix><index>`: a uverbs entry's name.
pub fn uverbs_name(prefix: &str, index: u32) -> String {
    format!("{prefix}{index}")
}

/// The index of a uverbs entry named by [`UVERBS`] or [`SHARED_UVERBS`].
pub fn uverbs_index(name: &str) -> Option<u32> {
    let digits = name
        .strip_prefix(SHARED_UVERBS)
        .or_else(|| name.strip_prefix(UVERBS))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `<root>/class/infiniband_verbs/<name>`.
pub fn uverbs_path(root: &Path, name: &str) -> PathBuf {
    root.join("class/infiniband_verbs").join(name)
}

/// `/dev/infiniband/<name>`, the node libibverbs opens for the sysfs entry
/// `<name>` (the two names must match).
pub fn uverbs_dev_node(name: &str) -> PathBuf {
    Path::new("/dev/infiniband").join(name)
}

/// Creates `dir` and its missing parents with mode 0755 (whatever the umask).
pub fn create_dir(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.as_os_str().is_empty() || d.is_dir() {
            break;
        }
        missing.push(d);
        cur = d.parent();
    }
    for d in missing.into_iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => continue,
            Err(e) => return Err(with_path(e, d)),
        }
        fs::set_permissions(d, fs::Permissions::from_mode(DIR_MODE))
            .map_err(|e| with_path(e, d))?;
    }
    Ok(())
}

/// Writes one sysfs-style attribute file: the value plus a newline (as the
/// kernel prints them), mode 0444. Parent directories are created.
pub fn write_attr(path: &Path, value: &str) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        create_dir(parent)?;
    }
    // A previous file is 0444; remove it rather than rely on root's
    // permission override to truncate it.
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(with_path(e, path)),
    }
    fs::write(path, format!("{value}\n")).map_err(|e| with_path(e, path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(FILE_MODE)).map_err(|e| with_path(e, path))
}

/// Writes `class/infiniband_verbs/abi_version`, needed once per tree.
pub fn write_class_abi_version(root: &Path) -> io::Result<()> {
    write_attr(
        &root.join("class/infiniband_verbs/abi_version"),
        &UVERBS_CLASS_ABI_VERSION.to_string(),
    )
}

/// Writes everything libibverbs reads for one device, and our `xiw_config`:
/// the ibdev directory and the uverbs entry `uverbs` pointing at it.
/// `link_up` decides the port state (ACTIVE or DOWN).
pub fn write_device(root: &Path, info: &DeviceInfo, uverbs: &str, link_up: bool) -> io::Result<()> {
    let dev = ibdev_path(root, &info.ibdev);
    let guid = format_guid(info.node_guid);
    let attrs: [(&str, &str); 8] = [
        ("node_type", NODE_TYPE),
        ("node_guid", &guid),
        ("sys_image_guid", &guid),
        ("fw_ver", FW_VER),
        ("hw_rev", "0"),
        ("hca_type", "xiw"),
        ("board_id", "xiw"),
        ("node_desc", &format!("xiw {}", info.netdev)),
    ];
    for (name, value) in attrs {
        write_attr(&dev.join(name), value)?;
    }

    let port = dev.join(format!("ports/{PORT_NUM}"));
    let (state, phys_state) = if link_up {
        ("4: ACTIVE", "5: LinkUp")
    } else {
        ("1: DOWN", "3: Disabled")
    };
    let port_attrs: [(&str, &str); 13] = [
        ("state", state),
        ("phys_state", phys_state),
        ("rate", PORT_RATE),
        ("lid", "0x0"),
        ("sm_lid", "0x0"),
        ("lid_mask_count", "0"),
        ("sm_sl", "0"),
        ("cap_mask", "0x00000000"),
        ("link_layer", "Ethernet"),
        ("gids/0", &format_gid(&info.gid)),
        // libibverbs only knows "IB/RoCE v1" and "RoCE v2"; v1 plus an
        // Ethernet link layer is what the kernel shows for iWARP devices.
        ("gid_attrs/types/0", "IB/RoCE v1"),
        ("gid_attrs/ndevs/0", &info.netdev),
        ("pkeys/0", "0xffff"),
    ];
    for (name, value) in port_attrs {
        write_attr(&port.join(name), value)?;
    }
    write_attr(&dev.join(CONFIG_FILE), info.to_config().trim_end())?;

    // The uverbs entry last: libibverbs discovers devices through it, so a
    // scan running concurrently never sees a half-written ibdev directory.
    let uv = uverbs_path(root, uverbs);
    write_attr(&uv.join("ibdev"), &info.ibdev)?;
    write_attr(&uv.join("dev"), &format!("{CDEV_MAJOR}:{CDEV_MINOR}"))?;
    write_attr(&uv.join("abi_version"), &UVERBS_DEV_ABI_VERSION.to_string())?;
    Ok(())
}

/// The uverbs entries of a tree: (entry name, ibdev name), sorted by index.
pub fn list_uverbs(root: &Path) -> io::Result<Vec<(String, String)>> {
    let class = root.join("class/infiniband_verbs");
    let mut out = Vec::new();
    for entry in fs::read_dir(&class).map_err(|e| with_path(e, &class))? {
        let entry = entry.map_err(|e| with_path(e, &class))?;
        let Some((index, name)) = entry
            .file_name()
            .to_str()
            .and_then(|n| Some((uverbs_index(n)?, n.to_string())))
        else {
            continue;
        };
        let ibdev_file = entry.path().join("ibdev");
        let ibdev = fs::read_to_string(&ibdev_file).map_err(|e| with_path(e, &ibdev_file))?;
        out.push((index, name, ibdev.trim().to_string()));
    }
    out.sort();
    Ok(out.into_iter().map(|(_, n, i)| (n, i)).collect())
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn sample() -> DeviceInfo {
        let addr: IpAddr = "192.168.7.3".parse().unwrap();
        DeviceInfo {
            ibdev: "xiw0".into(),
            netdev: "eth0".into(),
            ifindex: 2,
            addr,
            gid: gid_from_addr(addr),
            mtu: 1500,
            mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            node_guid: guid_from_mac(&[0x52, 0x54, 0x00, 0x12, 0x34, 0x56]).unwrap(),
            kernel: false,
        }
    }

    fn scratch_dir() -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "xiw-devinfo-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn kernel_mode_gids_are_hardware_addresses() {
        let arp =
            "IP address       HW type     Flags       HW address            Mask     Device\n\
                   10.0.0.9         0x1         0x0         52:54:00:00:00:09     *        eth0\n\
                   10.0.0.2         0x1         0x2         52:54:00:00:00:02     *        eth1\n\
                   10.0.0.3         0x1         0x2         52:54:00:00:00:02     *        eth0\n";
        let mac = [0x52, 0x54, 0, 0, 0, 2];
        assert_eq!(
            neighbour_with_mac(arp, "eth0", &mac),
            Some("10.0.0.3".parse().unwrap())
        );
        assert_eq!(
            neighbour_with_mac(arp, "eth1", &mac),
            Some("10.0.0.2".parse().unwrap())
        );
        // Incomplete entries do not count.
        assert_eq!(
            neighbour_with_mac(arp, "eth0", &[0x52, 0x54, 0, 0, 0, 9]),
            None
        );
        let mut d = sample();
        d.kernel = true;
        let mut own = [0u8; 16];
        own[..6].copy_from_slice(&d.mac);
        assert_eq!(d.peer_addr(&own), Ok(d.addr));
        // An IP-shaped GID is taken as an address in either mode.
        let v4 = gid_from_addr("10.1.2.3".parse().unwrap());
        assert_eq!(d.peer_addr(&v4), Ok("10.1.2.3".parse().unwrap()));
    }

    #[test]
    fn gid_of_ipv4_is_v4_mapped() {
        let gid = gid_from_addr("127.0.0.1".parse().unwrap());
        assert_eq!(format_gid(&gid), "0000:0000:0000:0000:0000:ffff:7f00:0001");
        assert_eq!(addr_from_gid(&gid), "127.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn gid_of_ipv6_is_the_address() {
        let addr: IpAddr = "fd00::1:2".parse().unwrap();
        let gid = gid_from_addr(addr);
        assert_eq!(format_gid(&gid), "fd00:0000:0000:0000:0000:0000:0001:0002");
        assert_eq!(addr_from_gid(&gid), addr);
        // ::1 is not v4-mapped and must stay IPv6.
        let lo6: IpAddr = "::1".parse().unwrap();
        assert_eq!(addr_from_gid(&gid_from_addr(lo6)), lo6);
    }

    #[test]
    fn gid_text_round_trips() {
        let gid = gid_from_addr("2001:db8::abcd".parse().unwrap());
        let s = format_gid(&gid);
        assert_eq!(s.len(), 39);
        assert_eq!(parse_gid(&s), Some(gid));
        assert_eq!(parse_gid("0000:0000"), None);
        assert_eq!(parse_gid(&format!("{s}:0000")), None);
    }

    #[test]
    fn mtu_mapping() {
        assert_eq!(ibv_mtu_for(0), 1);
        assert_eq!(ibv_mtu_for(300), 1);
        assert_eq!(ibv_mtu_for(1500), 3); // 1440 bytes of payload: 1024
        assert_eq!(ibv_mtu_for(2108), 4); // exactly 2048 + 60
        assert_eq!(ibv_mtu_for(2107), 3);
        assert_eq!(ibv_mtu_for(9000), 5);
        assert_eq!(ibv_mtu_for(65536), 5);
        assert_eq!(ibv_mtu_for(4156), 5);
        assert_eq!(ibv_mtu_for(4155), 4);
    }

    #[test]
    fn guid_formats() {
        assert_eq!(format_guid(0x0123_4567_89ab_cdef), "0123:4567:89ab:cdef");
        assert_eq!(
            parse_guid("0123:4567:89ab:cdef"),
            Some(0x0123_4567_89ab_cdef)
        );
        assert_eq!(parse_guid("0123:4567:89ab"), None);
        assert_eq!(parse_guid("0123:4567:89ab:cdef:0"), None);
        assert_eq!(parse_guid("01234:4567:89ab:cdef"), None);
    }

    #[test]
    fn guid_from_mac_is_eui64() {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        assert_eq!(
            format_guid(guid_from_mac(&mac).unwrap()),
            "5054:00ff:fe12:3456"
        );
        assert_eq!(guid_from_mac(&[0; 6]), None);
    }

    #[test]
    fn guid_from_addr_differs_by_index_and_addr() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(format_guid(guid_from_addr(lo, 0)), "0278:0000:7f00:0001");
        assert_ne!(guid_from_addr(lo, 0), guid_from_addr(lo, 1));
        assert_ne!(
            guid_from_addr(lo, 0),
            guid_from_addr("127.0.0.2".parse().unwrap(), 0)
        );
        assert_ne!(
            guid_from_addr("::1".parse().unwrap(), 0),
            guid_from_addr("::2".parse().unwrap(), 0)
        );
    }

    #[test]
    fn mac_text_round_trips() {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        assert_eq!(format_mac(&mac), "52:54:00:12:34:56");
        assert_eq!(parse_mac("52:54:00:12:34:56"), Some(mac));
        assert_eq!(parse_mac("52:54:00:12:34"), None);
    }

    #[test]
    fn config_round_trips() {
        let info = sample();
        let back = DeviceInfo::from_config("xiw0", &info.to_config()).unwrap();
        assert_eq!(back, info);
    }

    #[test]
    fn config_errors_name_the_problem() {
        let err = DeviceInfo::from_config("xiw0", "netdev=lo\n").unwrap_err();
        assert_eq!(err.errno(), libc::ENODEV);
        let err = err.to_string();
        assert!(err.contains("missing key"), "{err}");
        let err = DeviceInfo::from_config("xiw0", "mtu=big\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mtu"), "{err}");
        // Unknown keys are fine.
        let text = format!("{}future=1\n", sample().to_config());
        assert!(DeviceInfo::from_config("xiw0", &text).is_ok());
    }

    #[test]
    fn written_tree_loads_back() {
        let root = scratch_dir();
        let info = sample();
        write_class_abi_version(&root).unwrap();
        write_device(&root, &info, "uverbs3", true).unwrap();

        let loaded = DeviceInfo::load(&ibdev_path(&root, "xiw0")).unwrap();
        assert_eq!(loaded, info);

        let read = |p: &str| fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("class/infiniband_verbs/abi_version"), "6\n");
        assert_eq!(read("class/infiniband_verbs/uverbs3/ibdev"), "xiw0\n");
        assert_eq!(read("class/infiniband_verbs/uverbs3/dev"), "1:7\n");
        assert_eq!(read("class/infiniband_verbs/uverbs3/abi_version"), "1\n");
        assert_eq!(read("class/infiniband/xiw0/node_type"), "4: RNIC\n");
        assert_eq!(
            read("class/infiniband/xiw0/node_guid"),
            "5054:00ff:fe12:3456\n"
        );
        assert_eq!(read("class/infiniband/xiw0/node_desc"), "xiw eth0\n");
        assert_eq!(read("class/infiniband/xiw0/ports/1/state"), "4: ACTIVE\n");
        assert_eq!(
            read("class/infiniband/xiw0/ports/1/gids/0"),
            "0000:0000:0000:0000:0000:ffff:c0a8:0703\n"
        );
        assert_eq!(
            read("class/infiniband/xiw0/ports/1/gid_attrs/ndevs/0"),
            "eth0\n"
        );
        assert_eq!(read("class/infiniband/xiw0/ports/1/pkeys/0"), "0xffff\n");

        let mode = |p: &str| fs::metadata(root.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("class/infiniband/xiw0/ports/1/gids"), 0o755);
        assert_eq!(mode("class/infiniband/xiw0/ports/1/gids/0"), 0o444);

        assert_eq!(
            list_uverbs(&root).unwrap(),
            vec![("uverbs3".to_string(), "xiw0".to_string())]
        );

        // Rewriting over an existing tree works (files are 0444).
        write_device(&root, &info, "uverbs3", false).unwrap();
        assert_eq!(read("class/infiniband/xiw0/ports/1/state"), "1: DOWN\n");

        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn uverbs_names() {
        assert_eq!(uverbs_index("uverbs0"), Some(0));
        assert_eq!(uverbs_index("uverbs12"), Some(12));
        assert_eq!(uverbs_index("xiw_uverbs3"), Some(3));
        for bad in [
            "uverbs",
            "xiw_uverbs",
            "uverbs1x",
            "uverbs-1",
            "abi_version",
            "xuverbs1",
        ] {
            assert_eq!(uverbs_index(bad), None, "{bad}");
        }
        assert_eq!(uverbs_name(SHARED_UVERBS, 2), "xiw_uverbs2");
        assert_eq!(
            uverbs_dev_node("xiw_uverbs2"),
            Path::new("/dev/infiniband/xiw_uverbs2")
        );
    }

    #[test]
    fn load_reports_the_path() {
        let root = scratch_dir();
        let err = DeviceInfo::load(&ibdev_path(&root, "xiw9")).unwrap_err();
        assert!(err.to_string().contains("xiw_config"), "{err}");
    }
}
