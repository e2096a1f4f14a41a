//! Kernel-mode devices as the RDMA core tells them through RDMA netlink
//! (`NETLINK_RDMA`, its NLDEV client, the one `rdma dev` and `rdma link`
//! ask): the devices, each device's uverbs node and driver id, and its
//! port's state and netdev.
//!
//! The messages are plain netlink: a `nlmsghdr` whose type is the client
//! and command (`RDMA_NL_GET_TYPE`), then attributes, no family header.
//! Numbers from the kernel's include/uapi/rdma/rdma_netlink.h.

use std::path::Path;
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::sockopt::{self, Timeout};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// The NLDEV client (`RDMA_NL_NLDEV`).
const RDMA_NL_NLDEV: u16 = 5;

const CMD_GET: u16 = 1;
const CMD_PORT_GET: u16 = 5;
const CMD_GET_CHARDEV: u16 = 15;

const ATTR_DEV_INDEX: u16 = 1;
const ATTR_DEV_NAME: u16 = 2;
const ATTR_PORT_INDEX: u16 = 3;
const ATTR_FW_VERSION: u16 = 5;
const ATTR_NODE_GUID: u16 = 6;
const ATTR_PORT_STATE: u16 = 12;
const ATTR_PORT_PHYS_STATE: u16 = 13;
const ATTR_NDEV_INDEX: u16 = 50;
const ATTR_NDEV_NAME: u16 = 51;
const ATTR_CHARDEV_TYPE: u16 = 69;
const ATTR_CHARDEV_NAME: u16 = 70;
const ATTR_CHARDEV: u16 = 72;
const ATTR_UVERBS_DRIVER_ID: u16 = 73;

/// The largest reply we take; the kernel's dump messages fit a page.
const RECV_BUF: usize = 64 * 1024;

/// How long the kernel may take to answer one request.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// One RDMA device as the kernel lists it, with its first port.
#[derive(Debug, Default, Clone)]
pub struct KernelDevice {
    /// The RDMA core's device index (`rdma dev`'s ifindex).
    pub index: u32,
    pub name: String,
    pub node_guid: Option<u64>,
    pub fw: Option<String>,
    /// The uverbs driver id (`enum rdma_driver_id`, or the module's own).
    pub driver_id: Option<u32>,
    /// The uverbs node's name in /dev/infiniband, and its device number.
    pub chardev_name: Option<String>,
    pub chardev: Option<(u32, u32)>,
    pub port: u32,
    pub port_state: Option<u8>,
    pub phys_state: Option<u8>,
    /// The port's netdev, where it is in our network namespace.
    pub netdev: Option<String>,
    pub netdev_index: Option<u32>,
}

/// The kernel's RDMA devices whose uverbs driver id is `driver_id`; an
/// empty list where the RDMA core is not loaded (asked only then: opening
/// an RDMA netlink socket would load ib_core) or does not answer RDMA
/// netlink (`xiw exec`'s filter, say).
pub fn devices_of_driver(driver_id: u32) -> Result<Vec<KernelDevice>, String> {
    if !Path::new("/sys/module/ib_core").exists() {
        return Ok(Vec::new());
    }
    let sock = match Socket::open() {
        Ok(s) => s,
        Err(Errno::PROTONOSUPPORT | Errno::AFNOSUPPORT) => return Ok(Vec::new()),
        Err(e) => return Err(format!("RDMA netlink socket: {e}")),
    };
    let mut out = Vec::new();
    let listed = sock
        .request(CMD_GET, true, &[])
        .map_err(|e| format!("RDMA netlink: listing devices: {e}"))?;
    for msg in listed {
        let attrs = Attrs::parse(&msg);
        let (Some(index), Some(name)) = (attrs.u32(ATTR_DEV_INDEX), attrs.string(ATTR_DEV_NAME))
        else {
            continue;
        };
        let listed_driver_id = attrs.u32(ATTR_UVERBS_DRIVER_ID);
        let mut dev = KernelDevice {
            index,
            name,
            node_guid: attrs.u64(ATTR_NODE_GUID),
            fw: attrs.string(ATTR_FW_VERSION),
            port: 1,
            ..KernelDevice::default()
        };
        // The uverbs node and the driver id; a device without one (its
        // uverbs client not loaded, a device going away) is not ours to
        // show.
        let index_attr = index.to_ne_bytes();
        let chardev = match sock.request(
            CMD_GET_CHARDEV,
            false,
            &[
                (ATTR_DEV_INDEX, &index_attr),
                (ATTR_CHARDEV_TYPE, b"uverbs\0"),
            ],
        ) {
            Ok(replies) => replies,
            Err(_) => continue,
        };
        let Some(reply) = chardev.first() else {
            continue;
        };
        let attrs = Attrs::parse(reply);
        // uverbs adds the driver id to its chardev reply.
        dev.driver_id = attrs.u32(ATTR_UVERBS_DRIVER_ID).or(listed_driver_id);
        if dev.driver_id != Some(driver_id) {
            continue;
        }
        dev.chardev_name = attrs.string(ATTR_CHARDEV_NAME);
        dev.chardev = attrs.u64(ATTR_CHARDEV).map(decode_dev);

        let port_attr = dev.port.to_ne_bytes();
        if let Ok(replies) = sock.request(
            CMD_PORT_GET,
            false,
            &[(ATTR_DEV_INDEX, &index_attr), (ATTR_PORT_INDEX, &port_attr)],
        ) {
            if let Some(reply) = replies.first() {
                let attrs = Attrs::parse(reply);
                dev.port_state = attrs.u8(ATTR_PORT_STATE);
                dev.phys_state = attrs.u8(ATTR_PORT_PHYS_STATE);
                dev.netdev = attrs.string(ATTR_NDEV_NAME);
                dev.netdev_index = attrs.u32(ATTR_NDEV_INDEX);
            }
        }
        out.push(dev);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A port state's name as `rdma link` prints it (`enum ib_port_state`).
pub fn port_state_name(state: u8) -> String {
    match state {
        0 => "NOP".into(),
        1 => "DOWN".into(),
        2 => "INIT".into(),
        3 => "ARMED".into(),
        4 => "ACTIVE".into(),
        5 => "ACTIVE_DEFER".into(),
        n => format!("UNKNOWN({n})"),
    }
}

/// A physical port state's name as `rdma link` prints it (`enum
/// ib_port_phys_state`).
pub fn phys_state_name(state: u8) -> String {
    match state {
        0 => "NOP".into(),
        1 => "SLEEP".into(),
        2 => "POLLING".into(),
        3 => "DISABLED".into(),
        4 => "TRAINING".into(),
        5 => "LINK_UP".into(),
        6 => "LINK_ERROR_RECOVERY".into(),
        7 => "PHY_TEST".into(),
        n => format!("UNKNOWN({n})"),
    }
}

/// The (major, minor) of a device number as the kernel sends it
/// (`huge_encode_dev`: minor's low byte, then major, then minor's rest).
fn decode_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) as u32;
    let minor = ((dev & 0xff) | ((dev >> 12) & 0xfff_ff00)) as u32;
    (major, minor)
}

struct Socket {
    fd: rustix::fd::OwnedFd,
}

impl Socket {
    fn open() -> Result<Socket, Errno> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(netlink::RDMA),
        )?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 0))?;
        sockopt::set_socket_timeout(&fd, Timeout::Recv, Some(REPLY_TIMEOUT))?;
        Ok(Socket { fd })
    }

    /// Sends one request and collects the payloads (attributes) of its
    /// replies: all of a dump's, or the one a plain request gets before
    /// its acknowledgement.
    fn request(
        &self,
        cmd: u16,
        dump: bool,
        attrs: &[(u16, &[u8])],
    ) -> Result<Vec<Vec<u8>>, String> {
        let seq = next_seq();
        let flags = libc::NLM_F_REQUEST as u16
            | if dump {
                libc::NLM_F_DUMP as u16
            } else {
                libc::NLM_F_ACK as u16
            };
        let msg = encode((RDMA_NL_NLDEV << 10) + cmd, flags, seq, attrs);
        rustix::net::sendto(
            &self.fd,
            &msg,
            SendFlags::empty(),
            &SocketAddrNetlink::new(0, 0),
        )
        .map_err(|e| format!("send: {e}"))?;
        let mut replies = Vec::new();
        let mut buf = vec![0u8; RECV_BUF];
        loop {
            let (n, full) = rustix::net::recv(&self.fd, &mut buf[..], RecvFlags::empty()).map_err(
                |e| match e {
                    Errno::AGAIN => "no answer from the kernel".to_string(),
                    e => format!("receive: {e}"),
                },
            )?;
            if full > n {
                return Err(format!("a reply of {full} bytes, more than {n}"));
            }
            for m in Messages(&buf[..n]) {
                if m.seq != seq {
                    continue;
                }
                match i32::from(m.kind) {
                    libc::NLMSG_DONE => {
                        return match error_code(m.payload) {
                            Some(e) if e < 0 => Err(Errno::from_raw_os_error(-e).to_string()),
                            _ => Ok(replies),
                        }
                    }
                    libc::NLMSG_ERROR => {
                        return match error_code(m.payload) {
                            Some(0) => Ok(replies),
                            Some(e) => Err(Errno::from_raw_os_error(-e).to_string()),
                            None => Err("a malformed error message".into()),
                        }
                    }
                    libc::NLMSG_NOOP => {}
                    _ => replies.push(m.payload.to_vec()),
                }
            }
        }
    }
}

fn next_seq() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(1);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A request: header, then each attribute padded to 4 bytes.
fn encode(kind: u16, flags: u16, seq: u32, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    for (ty, value) in attrs {
        let len = 4 + value.len();
        m.extend_from_slice(&(len as u16).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(value);
        m.resize(align4(m.len()), 0);
    }
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills in ours.
    m
}

/// The error code that begins an NLMSG_ERROR (and a dump's NLMSG_DONE).
fn error_code(payload: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?))
}

struct Message<'a> {
    kind: u16,
    seq: u32,
    payload: &'a [u8],
}

/// The netlink messages of one datagram.
struct Messages<'a>(&'a [u8]);

impl<'a> Iterator for Messages<'a> {
    type Item = Message<'a>;

    fn next(&mut self) -> Option<Message<'a>> {
        let b = self.0;
        if b.len() < 16 {
            return None;
        }
        let len = u32::from_ne_bytes(b[0..4].try_into().ok()?) as usize;
        if len < 16 || len > b.len() {
            return None;
        }
        let msg = Message {
            kind: u16::from_ne_bytes(b[4..6].try_into().ok()?),
            seq: u32::from_ne_bytes(b[8..12].try_into().ok()?),
            payload: &b[16..len],
        };
        self.0 = &b[align4(len).min(b.len())..];
        Some(msg)
    }
}

/// A message's attributes (the top level; RDMA netlink's device and port
/// facts are not nested).
struct Attrs<'a>(Vec<(u16, &'a [u8])>);

impl<'a> Attrs<'a> {
    fn parse(mut b: &'a [u8]) -> Attrs<'a> {
        let mut out = Vec::new();
        while b.len() >= 4 {
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            let ty = u16::from_ne_bytes([b[2], b[3]]) & libc::NLA_TYPE_MASK as u16;
            if len < 4 || len > b.len() {
                break;
            }
            out.push((ty, &b[4..len]));
            b = &b[align4(len).min(b.len())..];
        }
        Attrs(out)
    }

    fn get(&self, ty: u16) -> Option<&'a [u8]> {
        self.0.iter().find(|(t, _)| *t == ty).map(|(_, v)| *v)
    }

    fn u8(&self, ty: u16) -> Option<u8> {
        self.get(ty)?.first().copied()
    }

    /// A u32, or a u64 that fits (the kernel has sent some ids either way).
    fn u32(&self, ty: u16) -> Option<u32> {
        let v = self.get(ty)?;
        match v.len() {
            4 => Some(u32::from_ne_bytes(v.try_into().ok()?)),
            8 => u32::try_from(u64::from_ne_bytes(v.try_into().ok()?)).ok(),
            _ => None,
        }
    }

    fn u64(&self, ty: u16) -> Option<u64> {
        Some(u64::from_ne_bytes(self.get(ty)?.try_into().ok()?))
    }

    fn string(&self, ty: u16) -> Option<String> {
        let v = self.get(ty)?;
        let v = v.split(|&c| c == 0).next().unwrap_or(v);
        Some(String::from_utf8_lossy(v).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_laid_out_as_netlink_wants() {
        let idx = 7u32.to_ne_bytes();
        let m = encode(
            (RDMA_NL_NLDEV << 10) + CMD_GET_CHARDEV,
            1 | 4,
            9,
            &[(ATTR_DEV_INDEX, &idx), (ATTR_CHARDEV_TYPE, b"uverbs\0")],
        );
        // 16 header + 8 (u32 attribute) + 12 (4 + 7 bytes, padded).
        assert_eq!(m.len(), 36);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 36);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x140f);
        let msgs: Vec<Message> = Messages(&m).collect();
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].seq, 9);
        let attrs = Attrs::parse(msgs[0].payload);
        assert_eq!(attrs.u32(ATTR_DEV_INDEX), Some(7));
        assert_eq!(attrs.string(ATTR_CHARDEV_TYPE).as_deref(), Some("uverbs"));
        assert_eq!(attrs.u64(ATTR_NODE_GUID), None);
    }

    #[test]
    fn device_numbers_decode() {
        // 231:192, the first uverbs node.
        assert_eq!(decode_dev((231 << 8) | 192), (231, 192));
        assert_eq!(decode_dev((1 << 8) | 0x34 | (0x12 << 20)), (1, 0x1234));
    }

    #[test]
    fn truncated_attributes_stop_the_parse() {
        let mut b = vec![8, 0, 1, 0, 5, 0, 0, 0];
        b.extend_from_slice(&[200, 0, 2, 0, b'x']);
        let attrs = Attrs::parse(&b);
        assert_eq!(attrs.u32(ATTR_DEV_INDEX), Some(5));
        assert_eq!(attrs.get(ATTR_DEV_NAME), None);
    }
}
