//! `xiw exec`: runs a program that sees the xiw devices of a standalone tree
//! on any kernel, RDMA core loaded or not, with or without root.
//!
//! libibverbs lists devices through RDMA netlink and reads `$SYSFS_PATH`
//! only when it cannot open a `NETLINK_RDMA` socket. `xiw exec` therefore
//! (1) installs a seccomp filter under which exactly that socket fails
//! (`EPROTONOSUPPORT`, what a kernel without RDMA answers), so libibverbs
//! falls back to the tree; (2) points `SYSFS_PATH` at the tree and, through
//! `RDMAV_DRIVERS`, libibverbs at the provider the tree names; and (3) where
//! the tree's device nodes are not in `/dev/infiniband`, gives the program
//! a mount namespace of its own (inside a user namespace when not root) in
//! which `/dev/infiniband` holds them: bind mounts of `/dev/full`, the node
//! the tree names, which anyone may open. Then it executes the program in
//! its own place (same process, same pid), so signals, exit status and
//! terminal work as if it were run directly. Nothing outside the program
//! and its children changes: the filter, the namespaces and the mounts are
//! theirs alone and end with them.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use rustix::mount::{self, MountFlags, MountPropagationFlags};
use rustix::thread::UnshareFlags;

use xiw::sysfs_tree;

use crate::sys;

/// `NETLINK_RDMA` of `<linux/netlink.h>`.
const NETLINK_RDMA: u64 = 20;

/// What the program is run with.
pub struct Plan {
    /// The tree (`SYSFS_PATH`).
    pub root: PathBuf,
    /// `RDMAV_DRIVERS`, when the tree names a provider.
    pub drivers: Option<PathBuf>,
    /// Device nodes to provide in `/dev/infiniband`: (name, major, minor).
    pub nodes: Vec<(String, u32, u32)>,
}

/// Runs `program` with `args` under `plan`; returns only on failure, with
/// the message and the exit status to leave with (127 when the program
/// cannot be found or executed, as env(1) does).
pub fn run(plan: &Plan, program: &OsString, args: &[OsString]) -> (String, u8) {
    if let Err(e) = enter(plan) {
        return (e, 1);
    }
    let mut cmd = Command::new(program);
    cmd.args(args).env("SYSFS_PATH", &plan.root);
    if let Some(d) = &plan.drivers {
        cmd.env("RDMAV_DRIVERS", d);
    }
    let e = cmd.exec();
    (format!("{}: {e}", program.to_string_lossy()), 127)
}

/// Everything but the exec: the namespaces and mounts the nodes need, then
/// the filter.
fn enter(plan: &Plan) -> Result<(), String> {
    if !plan.nodes.is_empty() {
        private_dev(&plan.nodes)?;
    }
    hide_rdma_netlink()
}

/// The device nodes missing from `/dev/infiniband` (or not the right kind
/// there) among `nodes`.
pub fn missing_nodes(nodes: &[(String, u32, u32)]) -> Vec<(String, u32, u32)> {
    nodes
        .iter()
        .filter(|(name, major, minor)| {
            sys::char_dev_ino(&Path::new(DEV_DIR).join(name), *major, *minor).is_none()
        })
        .cloned()
        .collect()
}

const DEV_DIR: &str = "/dev/infiniband";

/// A mount namespace of our own (in a user namespace of our own unless we
/// are root) whose `/dev/infiniband` holds exactly `nodes`, each a bind
/// mount of the character device with those numbers as `/dev` has it.
fn private_dev(nodes: &[(String, u32, u32)]) -> Result<(), String> {
    let root = rustix::process::geteuid().is_root();
    let uid = rustix::process::getuid();
    let gid = rustix::process::getgid();
    let flags = if root {
        UnshareFlags::NEWNS
    } else {
        UnshareFlags::NEWNS | UnshareFlags::NEWUSER
    };
    // SAFETY: neither flag unshares the file descriptor table (FILES), the
    // one case unshare_unsafe warns of; `xiw` runs one thread.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(|e| {
        if root {
            format!("cannot make a mount namespace: {e}")
        } else {
            format!(
                "cannot make a user namespace ({e}): this kernel does not let unprivileged users \
                 make one (see the sysctls user.max_user_namespaces, \
                 kernel.unprivileged_userns_clone); run `xiw exec` as root, or have root run \
                 `xiw up` on a kernel without RDMA netlink, which puts the nodes in {DEV_DIR}"
            )
        }
    })?;
    let mounted = dev_with_nodes(nodes, root, uid.as_raw(), gid.as_raw());
    if root {
        return mounted;
    }
    mounted.map_err(|e| {
        // A user namespace can be made and grant nothing where the kernel
        // restricts them (Ubuntu's AppArmor setting).
        format!(
            "{e} (where the kernel restricts unprivileged user namespaces, as \
             kernel.apparmor_restrict_unprivileged_userns=1 does, run `xiw exec` as root)"
        )
    })
}

/// In the namespaces just made: the id maps (when not root), then a
/// /dev/infiniband that holds exactly `nodes`.
fn dev_with_nodes(
    nodes: &[(String, u32, u32)],
    root: bool,
    uid: u32,
    gid: u32,
) -> Result<(), String> {
    if !root {
        // The program keeps its own uid and gid (mapped onto themselves);
        // setgroups must be denied before an unprivileged gid map.
        let write = |file: &str, text: String| {
            fs::write(format!("/proc/self/{file}"), text)
                .map_err(|e| format!("/proc/self/{file}: {e}"))
        };
        write("setgroups", "deny".into())?;
        write("uid_map", format!("{uid} {uid} 1"))?;
        write("gid_map", format!("{gid} {gid} 1"))?;
    }
    // Nothing mounted here reaches the rest of the system; what the system
    // mounts later still reaches us.
    mount::mount_change(
        "/",
        MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
    )
    .map_err(|e| format!("making / a slave mount: {e}"))?;

    let dev_ib = Path::new(DEV_DIR);
    if dev_ib.is_dir() {
        // The kernel's nodes are left out: within `xiw exec` libibverbs
        // lists the tree's devices only.
        mount_tmpfs(dev_ib)?;
    } else {
        // /dev belongs to the real root, so /dev/infiniband cannot be made
        // in it: /dev becomes a tmpfs with every entry of the old one
        // bound back in, plus infiniband/.
        cover_dev()?;
        fs::create_dir(dev_ib).map_err(|e| format!("{DEV_DIR}: {e}"))?;
    }
    for (name, major, minor) in nodes {
        let node = dev_ib.join(name);
        let source = char_dev_in_dev(*major, *minor)?;
        bind_file(&source, &node)?;
    }
    // The tmpfs stays as it is from here on.
    Ok(())
}

fn mount_tmpfs(target: &Path) -> Result<(), String> {
    mount::mount(
        "xiw",
        target,
        "tmpfs",
        MountFlags::NOSUID,
        Some(c"mode=0755"),
    )
    .map_err(|e| format!("mounting a tmpfs on {}: {e}", target.display()))
}

/// Covers /dev with a tmpfs holding what /dev held: directories (and the
/// file systems mounted on them, such as /dev/pts and /dev/shm) and nodes
/// bound back, symbolic links copied.
fn cover_dev() -> Result<(), String> {
    let dev = Path::new("/dev");
    // Opened before it is covered, so its entries stay reachable through
    // /proc/self/fd after.
    let old = fs::File::open(dev).map_err(|e| format!("/dev: {e}"))?;
    let mut entries: Vec<(OsString, fs::FileType)> = fs::read_dir(dev)
        .map_err(|e| format!("/dev: {e}"))?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name(), e.file_type().ok()?)))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let old_path = PathBuf::from(format!("/proc/self/fd/{}", old.as_raw_fd()));
    mount_tmpfs(dev)?;
    for (name, kind) in entries {
        let from = old_path.join(&name);
        let to = dev.join(&name);
        if kind.is_symlink() {
            let target = fs::read_link(&from).map_err(|e| format!("{}: {e}", to.display()))?;
            std::os::unix::fs::symlink(&target, &to)
                .map_err(|e| format!("{}: {e}", to.display()))?;
        } else if kind.is_dir() {
            fs::create_dir(&to).map_err(|e| format!("{}: {e}", to.display()))?;
            mount::mount_bind_recursive(&from, &to)
                .map_err(|e| format!("binding {} back: {e}", to.display()))?;
        } else {
            bind_file(&from, &to)?;
        }
    }
    Ok(())
}

/// Binds the file (or node) `from` onto a new empty file `to`.
fn bind_file(from: &Path, to: &Path) -> Result<(), String> {
    fs::File::create(to).map_err(|e| format!("{}: {e}", to.display()))?;
    mount::mount_bind(from, to).map_err(|e| format!("binding {}: {e}", to.display()))
}

/// The path in /dev of the character device `major:minor`; /dev/full for
/// the tree's usual 1:7, else the /dev/char entry udev makes.
fn char_dev_in_dev(major: u32, minor: u32) -> Result<PathBuf, String> {
    [
        PathBuf::from("/dev/full"),
        PathBuf::from(format!("/dev/char/{major}:{minor}")),
    ]
    .into_iter()
    // /dev/char's entries are links to the node.
    .filter_map(|p| fs::canonicalize(p).ok())
    .find(|p| sys::char_dev_ino(p, major, minor).is_some())
    .ok_or_else(|| {
        format!("no character device {major}:{minor} in /dev to stand for the device node")
    })
}

/// Installs the filter under which `socket(AF_NETLINK, *, NETLINK_RDMA)`
/// fails with `EPROTONOSUPPORT`; every other call, and every call of a
/// program of another architecture, is allowed. It is inherited by every
/// child and cannot be removed. Unprivileged, the kernel requires
/// no_new_privs with it: set-user-ID programs run within then do not gain
/// their owner's rights. Root keeps them.
fn hide_rdma_netlink() -> Result<(), String> {
    let fail = |what: &str, e: libseccomp::error::SeccompError| format!("seccomp: {what}: {e}");
    let mut filter =
        ScmpFilterContext::new(ScmpAction::Allow).map_err(|e| fail("making a filter", e))?;
    filter
        .set_act_badarch(ScmpAction::Allow)
        .map_err(|e| fail("other architectures", e))?;
    if rustix::process::geteuid().is_root() {
        filter
            .set_ctl_nnp(false)
            .map_err(|e| fail("no_new_privs", e))?;
    }
    let socket = ScmpSyscall::from_name("socket").map_err(|e| fail("socket", e))?;
    filter
        .add_rule_conditional(
            ScmpAction::Errno(libc::EPROTONOSUPPORT),
            socket,
            &[
                ScmpArgCompare::new(0, ScmpCompareOp::Equal, libc::AF_NETLINK as u64),
                ScmpArgCompare::new(2, ScmpCompareOp::Equal, NETLINK_RDMA),
            ],
        )
        .map_err(|e| fail("the rule", e))?;
    filter.load().map_err(|e| fail("loading the filter", e))
}

/// The provider file names libibverbs of each private ABI loads for
/// `RDMAV_DRIVERS=DIR/libxiw`.
pub fn provider_names() -> impl Iterator<Item = String> {
    xiw_abi::driver::private::ABIS
        .iter()
        .map(|(abi, _, _)| format!("libxiw-rdmav{abi}.so"))
}

/// Where a tree keeps the links to its provider.
pub fn provider_dir(root: &Path) -> PathBuf {
    root.join("provider")
}

/// `RDMAV_DRIVERS` for the tree at `root`, when it has a provider whose
/// links all lead to a file.
pub fn drivers_of(root: &Path) -> Option<PathBuf> {
    let dir = provider_dir(root);
    provider_names()
        .all(|n| dir.join(n).is_file())
        .then(|| dir.join("libxiw"))
}

/// The device nodes the tree at `root` names: (uverbs name, major, minor).
pub fn nodes_of(root: &Path) -> io::Result<Vec<(String, u32, u32)>> {
    let mut nodes = Vec::new();
    for (name, _) in sysfs_tree::list_uverbs(root)? {
        let uverbs = sysfs_tree::uverbs_path(root, &name);
        let dev = fs::read_to_string(uverbs.join("dev"))?;
        let (major, minor) = dev
            .trim()
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}/dev: not MAJOR:MINOR", uverbs.display()),
                )
            })?;
        nodes.push((name, major, minor));
    }
    Ok(nodes)
}
