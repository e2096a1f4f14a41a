//! The few operating-system facts `xiw` needs that std does not offer: the
//! effective uid, mknod, and whether the kernel speaks RDMA netlink
//! (interfaces are in `xiw::netdev`; `xiw exec`'s namespaces and filter in
//! `exec.rs`).

use std::ffi::CString;

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
pub use xiw::netdev::{lookup_netdev, Netdev};
use xiw::sys::socket;

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether the kernel speaks RDMA netlink, and how that is known; `None`
/// if it does not. libibverbs then enumerates devices through netlink and
/// never looks at $SYSFS_PATH, so an xiw tree is invisible outside `xiw
/// exec`. Asked without loading anything where the kernel's module lists
/// tell (opening a `NETLINK_RDMA` socket would load ib_core): only where
/// they are missing (a container) does it try the socket.
pub fn rdma_netlink() -> Option<String> {
    if Path::new("/sys/module/ib_core").exists() {
        return Some("ib_core is loaded".into());
    }
    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let modules = ["/lib/modules", "/usr/lib/modules"]
        .iter()
        .map(|d| Path::new(d).join(&release))
        .find(|d| d.is_dir());
    if let Some(dir) = modules {
        let has = |file: &str, needle: &str| {
            fs::read_to_string(dir.join(file)).is_ok_and(|t| t.contains(needle))
        };
        if has("modules.builtin", "/ib_core.ko") {
            return Some("ib_core is built in".into());
        }
        // ib_core's MODULE_ALIAS_NET_PF_PROTO(PF_NETLINK, NETLINK_RDMA).
        if has("modules.alias", "net_pf_16_proto_20 ")
            || has("modules.alias", "net-pf-16-proto-20 ")
        {
            return Some("ib_core loads on the first RDMA netlink request".into());
        }
        return None;
    }
    const NETLINK_RDMA: i32 = 20;
    socket(libc::AF_NETLINK, libc::SOCK_RAW, NETLINK_RDMA)
        .is_ok()
        .then(|| "the kernel answers RDMA netlink".into())
}

/// Creates a character device node and returns its inode number. `mode`
/// is applied exactly (mknod alone would be reduced by the umask).
pub fn mknod_char(path: &Path, mode: u32, major: u32, minor: u32) -> io::Result<u64> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: c is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | mode,
            libc::makedev(major, minor),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(fs::symlink_metadata(path)?.ino())
}

/// The inode number of `path` if it is a character device with the given
/// numbers.
pub fn char_dev_ino(path: &Path, major: u32, minor: u32) -> Option<u64> {
    use std::os::unix::fs::FileTypeExt;
    let m = fs::symlink_metadata(path).ok()?;
    (m.file_type().is_char_device() && m.rdev() == libc::makedev(major, minor)).then(|| m.ino())
}

/// The inode number of the initial network namespace on kernels that fix it
/// (PROC_NET_INIT_INO); older kernels allocate it at boot like any other.
const PROC_NET_INIT_INO: u64 = 0xEFFF_FFF9;

/// The network namespace we run in, in `ip netns identify` terms:
/// `None` in the initial namespace (that of pid 1), else the name of the
/// /run/netns entry bound to it, else its inode number.
pub fn netns_name() -> io::Result<Option<String>> {
    let ours = ns_id(Path::new("/proc/self/ns/net"))?;
    match ns_id(Path::new("/proc/1/ns/net")) {
        Ok(init) if init == ours => return Ok(None),
        Ok(_) => {}
        // Reading pid 1's namespace needs ptrace access to it, which even
        // root may lack (non-root users, some containers and sandboxes).
        // Then only a kernel with a fixed initial inode number can tell
        // us we are in the initial namespace. When unsure, never claim to
        // be: a separate tree at an unexpected path is harmless, replacing
        // the initial namespace's tree is not.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            if ours.1 == PROC_NET_INIT_INO {
                return Ok(None);
            }
        }
        Err(e) => return Err(e),
    }
    Ok(Some(
        named_netns(ours).unwrap_or_else(|| ours.1.to_string()),
    ))
}

fn named_netns(ours: (u64, u64)) -> Option<String> {
    let mut names: Vec<String> = fs::read_dir("/run/netns")
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| ns_id(&e.path()).is_ok_and(|id| id == ours))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    names.into_iter().next()
}

/// (device, inode) of a namespace file: what identifies a namespace.
fn ns_id(path: &Path) -> io::Result<(u64, u64)> {
    let m = fs::metadata(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    Ok((m.dev(), m.ino()))
}
