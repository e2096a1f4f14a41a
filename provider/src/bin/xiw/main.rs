//! `xiw`: sets up xiw devices in standalone mode.
//!
//! Without kernel RDMA support libibverbs finds devices by scanning a sysfs
//! tree at `$SYSFS_PATH`. `xiw up` writes such a tree (one device per
//! netdev) plus, as root on a kernel without RDMA netlink, the
//! /dev/infiniband/uverbsN nodes libibverbs insists on opening, and prints
//! the `export SYSFS_PATH=...` line that points libibverbs at it. Elsewhere
//! (a kernel with the RDMA core, or without root) `xiw exec` runs programs
//! that see the tree (`exec.rs`).

mod exec;
mod netlink;
mod status;
mod sys;

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use xiw::sysfs_tree::{self, DeviceInfo};

/// Sets up xiw devices in standalone mode (no kernel RDMA): a sysfs tree
/// that points libibverbs at them.
#[derive(Parser, Debug)]
#[command(
    name = "xiw",
    version,
    after_help = "DIR defaults to /run/xiw/sysfs (for users other than root \
                  $XDG_RUNTIME_DIR/xiw/sysfs), or .../xiw/netns-NAME/sysfs inside the network \
                  namespace NAME."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create devices: a sysfs tree that `xiw exec` (or SYSFS_PATH) finds them by
    ///
    /// Creates devices xiw0, xiw1, ... (one per --netdev, default lo) as a sysfs
    /// tree under DIR; replaces the devices of an earlier `up` with the same
    /// DIR. As root on a kernel without RDMA netlink it also makes their
    /// nodes in /dev/infiniband and prints `export SYSFS_PATH=DIR`, so that
    /// eval "$(xiw up)" points libibverbs at them. Otherwise (the kernel has
    /// the RDMA core, which hides SYSFS_PATH from libibverbs, or not root)
    /// it says so, and programs see the devices through `xiw exec`.
    Up {
        /// A network interface to put a device on (repeat for more)
        #[arg(long = "netdev", value_name = "IFACE")]
        netdevs: Vec<String>,
        /// The provider library `xiw exec` has programs load (default: the
        /// one beside this program, else the installed one)
        #[arg(long, value_name = "FILE")]
        provider: Option<PathBuf>,
        #[command(flatten)]
        root: RootArg,
    },
    /// Run PROGRAM so that libibverbs sees the devices of the tree, on any kernel
    ///
    /// Runs PROGRAM (looked up in PATH) with ARGS in place of this process,
    /// with SYSFS_PATH and RDMAV_DRIVERS pointing at the tree and its
    /// provider, under a seccomp filter that makes RDMA netlink sockets fail
    /// (so libibverbs reads the tree even where the kernel has the RDMA
    /// core), and, where the tree's device nodes are not in /dev/infiniband,
    /// in a mount namespace of its own (in a user namespace of its own when
    /// not root) that has them. Its exit status is PROGRAM's; 127 if PROGRAM
    /// cannot be run.
    Exec {
        #[command(flatten)]
        root: RootArg,
        /// The program and its arguments
        #[arg(
            value_name = "PROGRAM",
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true
        )]
        command: Vec<OsString>,
    },
    /// Remove the tree and its /dev/infiniband nodes (root, where it made nodes)
    Down {
        #[command(flatten)]
        root: RootArg,
    },
    /// List the xiw devices: the kernel module's and the tree's
    ///
    /// Lists every xiw device this host has, as a table: the kernel-mode
    /// devices the xiw module registered (`rdma link add NAME type xiw
    /// netdev IFACE`), as RDMA netlink tells them (the devices whose uverbs
    /// driver id is the module's; asked only while ib_core is loaded, so
    /// asking loads nothing), and the standalone devices of the tree at DIR
    /// (`xiw up`). A row per device: its name, mode (kernel or standalone),
    /// netdev, port state, address, GID, MTU (the netdev's, and the verbs
    /// MTU), node GUID and uverbs node; below the table the module's
    /// version and parameters (/sys/module/xiw) and the tree's SYSFS_PATH.
    ///
    /// With --json, one JSON document on stdout instead: an array of device
    /// objects with the keys of `rdma -j dev` and `rdma -j link` (ifname;
    /// ifindex, the RDMA core's device index, for kernel-mode devices;
    /// port, state, physical_state, netdev, netdev_index, node_guid, fw) and
    /// "mode" ("kernel" or "standalone"), "addr", "gid", "mtu",
    /// "active_mtu", "chardev" (the uverbs node's path) and
    /// "chardev_exists"; for standalone devices "sysfs_path" (the tree),
    /// for kernel-mode devices "module" ({"version", "parameters"}). Keys
    /// without a value are left out.
    ///
    /// No device of either kind is no error, as with `rdma dev`: the table
    /// is left out (with --json the array is empty), one line on stderr says
    /// how to create devices, and the exit status is 0. Without --root a
    /// missing tree at the default DIR is not an error either; with --root
    /// DIR, a DIR without a tree is (exit status 1). Exit status 1 also
    /// when RDMA netlink fails (the devices that could be read are listed).
    Status {
        #[command(flatten)]
        root: RootArg,
        /// Print one JSON document (an array of device objects) instead of the table
        #[arg(short, long)]
        json: bool,
        /// Indented JSON (implies --json)
        #[arg(short, long)]
        pretty: bool,
    },
}

#[derive(Args, Debug)]
struct RootArg {
    /// Where the sysfs tree lives
    #[arg(long, value_name = "DIR", value_parser = non_empty_path)]
    root: Option<PathBuf>,
}

fn non_empty_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("needs a non-empty directory".into());
    }
    Ok(PathBuf::from(s))
}

/// The file in the tree's root recording the /dev entries `up` created, so
/// `down` removes exactly those. Its presence also marks a directory as
/// ours: `up` and `down` refuse to delete a directory without it.
const RECORD_FILE: &str = "xiw-created";

/// Where /dev nodes go; libibverbs hard-codes it (RDMA_CDEV_DIR).
const DEV_DIR: &str = "/dev/infiniband";

/// Uverbs indices tried before giving up.
const MAX_UVERBS: u32 = 1024;

struct Options {
    netdevs: Vec<String>,
    root: Option<PathBuf>,
    provider: Option<PathBuf>,
    command: Vec<OsString>,
    /// `status`: JSON, and indented.
    json: bool,
    pretty: bool,
}

impl Cmd {
    fn name(&self) -> &'static str {
        match self {
            Cmd::Up { .. } => "up",
            Cmd::Exec { .. } => "exec",
            Cmd::Down { .. } => "down",
            Cmd::Status { .. } => "status",
        }
    }

    /// The options, checked beyond what clap checks: an interface named twice.
    fn options(&self) -> Result<Options, String> {
        let (netdevs, root, provider, command) = match self {
            Cmd::Up {
                netdevs,
                provider,
                root,
            } => (netdevs.clone(), root, provider.clone(), Vec::new()),
            Cmd::Exec { root, command } => (Vec::new(), root, None, command.clone()),
            Cmd::Down { root } | Cmd::Status { root, .. } => (Vec::new(), root, None, Vec::new()),
        };
        let (json, pretty) = match self {
            Cmd::Status { json, pretty, .. } => (*json || *pretty, *pretty),
            _ => (false, false),
        };
        if let Some(dup) = netdevs
            .iter()
            .enumerate()
            .find(|(i, n)| netdevs[..*i].contains(n))
        {
            return Err(format!("--netdev {} given twice", dup.1));
        }
        Ok(Options {
            netdevs,
            root: root.root.clone(),
            provider,
            command,
            json,
            pretty,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cmd = cli.cmd.name();
    let opts = match cli.cmd.options() {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("xiw {cmd}: {msg}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.cmd {
        Cmd::Exec { .. } => return cmd_exec(&opts),
        Cmd::Up { .. } => cmd_up(&opts),
        Cmd::Down { .. } => cmd_down(&opts),
        Cmd::Status { .. } => status::cmd_status(&opts),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("xiw {cmd}: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// The tree's root: --root made absolute (SYSFS_PATH is used from any
/// directory), else the default for our network namespace: under /run/xiw
/// for root, under $XDG_RUNTIME_DIR/xiw for anyone else. The bool says
/// whether it is the default.
fn resolve_root(opts: &Options) -> Result<(PathBuf, bool), String> {
    match &opts.root {
        Some(r) if r.is_absolute() => Ok((r.clone(), false)),
        Some(r) => {
            let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
            Ok((cwd.join(r), false))
        }
        None => {
            let base = if sys::is_root() {
                PathBuf::from("/run/xiw")
            } else {
                match std::env::var_os("XDG_RUNTIME_DIR") {
                    Some(d) if Path::new(&d).is_absolute() => Path::new(&d).join("xiw"),
                    _ => {
                        return Err("no place for the tree: give --root DIR (the default for \
                                    users other than root is under $XDG_RUNTIME_DIR, which is \
                                    not set)"
                            .into())
                    }
                }
            };
            match sys::netns_name().map_err(|e| format!("network namespace: {e}"))? {
                None => Ok((base.join("sysfs"), true)),
                Some(name) => Ok((base.join(format!("netns-{name}/sysfs")), true)),
            }
        }
    }
}

fn cmd_up(opts: &Options) -> Result<(), String> {
    let names: Vec<String> = if opts.netdevs.is_empty() {
        vec!["lo".to_string()]
    } else {
        opts.netdevs.clone()
    };
    // Look every netdev up before touching anything, so a typo leaves an
    // existing tree alone.
    let netdevs = names
        .iter()
        .map(|n| sys::lookup_netdev(n).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let (root, _) = resolve_root(opts)?;
    let provider = match &opts.provider {
        Some(p) => Some(
            fs::canonicalize(p)
                .ok()
                .filter(|p| p.is_file())
                .ok_or_else(|| format!("--provider {}: no such file", p.display()))?,
        ),
        None => find_provider(),
    };

    // Root makes the device nodes in /dev/infiniband. Where the kernel has
    // the RDMA core its own nodes live there too (uverbsN), so ours take
    // names of their own; libibverbs then reads the tree only through `xiw
    // exec`, which, with the nodes in place, needs no namespace: any user
    // may run it. Without root `xiw exec` makes the nodes, in a
    // /dev/infiniband of the program's own.
    let netlink = sys::rdma_netlink();
    let make_nodes = sys::is_root();
    let prefix = if netlink.is_some() {
        sysfs_tree::SHARED_UVERBS
    } else {
        sysfs_tree::UVERBS
    };

    teardown(&root)?;
    if let Err(e) = build_tree(&root, &netdevs, make_nodes, prefix, provider.as_deref()) {
        // Leave nothing half-made behind; the original error matters more
        // than a failure to clean up.
        let _ = teardown(&root);
        return Err(e);
    }
    eprintln!("xiw up: tree at {}", root.display());
    if provider.is_none() && !Path::new(INSTALLED_DRIVER).exists() {
        eprintln!(
            "xiw up: no provider library beside {} and none installed ({INSTALLED_DRIVER}): \
             give --provider FILE, or programs will find no driver for these devices",
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "xiw".into())
        );
    }
    if make_nodes && netlink.is_none() {
        println!("export SYSFS_PATH={}", shell_quote(&root.to_string_lossy()));
        return Ok(());
    }
    let why = match netlink {
        Some(why) => format!(
            "this kernel has the RDMA core ({why}), so libibverbs lists devices through \
             RDMA netlink and never reads a SYSFS_PATH tree{}",
            if make_nodes {
                " (their nodes are in /dev/infiniband: any user may)"
            } else {
                ""
            }
        ),
        None => "without root there are no device nodes for them in /dev/infiniband".into(),
    };
    // Named always: another user's default tree is elsewhere.
    let root_arg = format!(" --root {}", shell_quote(&root.to_string_lossy()));
    eprintln!(
        "xiw up: {why}: run verbs programs as\n    xiw exec{root_arg} -- PROGRAM [ARGS...]\n\
         to have them see these devices"
    );
    Ok(())
}

/// The driver file an installed provider comes with.
const INSTALLED_DRIVER: &str = "/etc/libibverbs.d/xiw.driver";

/// The provider library for `xiw exec` when none is named: `$XIW_PROVIDER`,
/// else the one built or installed beside this program (`libxiw.so` in
/// cargo's target directory, `../lib/xiw/`), else the one the installed
/// driver file names by its path (an install under another prefix), else
/// the installed one in libibverbs' provider directory.
fn find_provider() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("XIW_PROVIDER") {
        candidates.push(PathBuf::from(p));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| fs::canonicalize(e).ok())
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        candidates.push(dir.join("libxiw.so"));
        candidates.push(dir.join("../lib/xiw/libxiw.so"));
    }
    // "driver /path/libxiw": libibverbs loads /path/libxiw-rdmavN.so.
    if let Some(prefix) = fs::read_to_string(INSTALLED_DRIVER).ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.trim().strip_prefix("driver "))
            .map(str::trim)
            .filter(|p| p.starts_with('/'))
            .map(str::to_owned)
    }) {
        let dir = Path::new(&prefix).parent().unwrap_or(Path::new("/"));
        for name in exec::provider_names() {
            candidates.push(dir.join(name));
        }
    }
    for lib in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ] {
        // Under whichever private ABI's name it was installed.
        for name in exec::provider_names() {
            candidates.push(Path::new(lib).join("libibverbs").join(name));
        }
    }
    candidates
        .into_iter()
        .filter_map(|c| fs::canonicalize(c).ok())
        .find(|c| c.is_file())
}

fn build_tree(
    root: &Path,
    netdevs: &[sys::Netdev],
    make_nodes: bool,
    prefix: &str,
    provider: Option<&Path>,
) -> Result<(), String> {
    sysfs_tree::create_dir(root).map_err(|e| e.to_string())?;
    // The record goes first so that even a failed `up` leaves a tree that
    // `down` (or the next `up`) recognises and cleans.
    let mut record = Record::default();
    record.save(root)?;
    sysfs_tree::write_class_abi_version(root).map_err(|e| e.to_string())?;

    if let Some(lib) = provider {
        // Links under every private ABI's file name, for RDMAV_DRIVERS.
        let dir = exec::provider_dir(root);
        sysfs_tree::create_dir(&dir).map_err(|e| e.to_string())?;
        for name in exec::provider_names() {
            std::os::unix::fs::symlink(lib, dir.join(&name))
                .map_err(|e| format!("{}: {e}", dir.join(name).display()))?;
        }
    }

    let mut guids: Vec<u64> = Vec::new();
    let mut next_free = 0;
    for (i, nd) in netdevs.iter().enumerate() {
        // Without nodes in /dev, `xiw exec` makes them, in a
        // /dev/infiniband of the program's own; the indices are those no
        // node in /dev has, so that it always does (a node of another tree
        // under the same name would do as well, but `xiw exec` would then
        // depend on that tree).
        let index = if make_nodes {
            make_dev_node(&mut record, root, prefix)?
        } else {
            while next_free < MAX_UVERBS
                && fs::symlink_metadata(sysfs_tree::uverbs_dev_node(&sysfs_tree::uverbs_name(
                    prefix, next_free,
                )))
                .is_ok()
            {
                next_free += 1;
            }
            next_free += 1;
            next_free - 1
        };
        let uverbs = sysfs_tree::uverbs_name(prefix, index);
        let node_guid = sysfs_tree::guid_from_mac(&nd.mac)
            .filter(|g| !guids.contains(g))
            // The uverbs index is unique among all xiw devices of the host
            // (they share /dev), unlike our device index.
            .unwrap_or_else(|| sysfs_tree::guid_from_addr(nd.addr, index as u16));
        guids.push(node_guid);
        let info = DeviceInfo {
            kernel: false,
            ibdev: format!("{}{i}", sysfs_tree::IBDEV_PREFIX),
            netdev: nd.name.clone(),
            ifindex: nd.ifindex,
            addr: nd.addr,
            gid: sysfs_tree::gid_from_addr(nd.addr),
            mtu: nd.mtu,
            mac: nd.mac,
            node_guid,
        };
        sysfs_tree::write_device(root, &info, &uverbs, nd.running).map_err(|e| e.to_string())?;
        eprintln!(
            "xiw up: {} on {} (ifindex {}): addr {}, GID {}, MTU {} (IBV_MTU {}), GUID {}, \
             port {}, {}",
            info.ibdev,
            info.netdev,
            info.ifindex,
            info.addr,
            sysfs_tree::format_gid(&info.gid),
            info.mtu,
            256u32 << (sysfs_tree::ibv_mtu_for(info.mtu) - 1),
            sysfs_tree::format_guid(info.node_guid),
            if nd.running { "ACTIVE" } else { "DOWN" },
            if make_nodes {
                sysfs_tree::uverbs_dev_node(&uverbs).display().to_string()
            } else {
                "its node made by xiw exec".into()
            }
        );
    }
    Ok(())
}

/// Creates /dev/infiniband/<prefix>N for the lowest N not taken (trees of
/// other network namespaces share /dev) and records it.
fn make_dev_node(record: &mut Record, root: &Path, prefix: &str) -> Result<u32, String> {
    let dev_dir = Path::new(DEV_DIR);
    let mut index = 0;
    while index < MAX_UVERBS {
        if !dev_dir.is_dir() {
            sysfs_tree::create_dir(dev_dir).map_err(|e| e.to_string())?;
            record.created_dir = true;
            record.save(root)?;
        }
        let node = sysfs_tree::uverbs_dev_node(&sysfs_tree::uverbs_name(prefix, index));
        match sys::mknod_char(&node, 0o666, sysfs_tree::CDEV_MAJOR, sysfs_tree::CDEV_MINOR) {
            Ok(ino) => {
                record.nodes.push((node, ino));
                record.save(root)?;
                return Ok(index);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => index += 1,
            // A concurrent `xiw down` of another tree removed the (then
            // empty) directory: make it again and retry the same index.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("mknod {}: {e}", node.display())),
        }
    }
    Err(format!(
        "no free uverbs index below {MAX_UVERBS} in {DEV_DIR}"
    ))
}

fn cmd_down(opts: &Options) -> Result<(), String> {
    let (root, is_default) = resolve_root(opts)?;
    if !root.exists() {
        eprintln!("xiw down: nothing at {}", root.display());
        return Ok(());
    }
    teardown(&root)?;
    if is_default && sys::is_root() {
        // Also drop the now empty /run/xiw/netns-NAME and /run/xiw; rmdir
        // fails harmlessly on a directory that still holds other trees.
        let mut dir = root.parent();
        while let Some(d) = dir {
            if d == Path::new("/run") || fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
    eprintln!("xiw down: removed {}", root.display());
    Ok(())
}

/// Removes the tree at `root` and the /dev entries it recorded. A missing
/// or empty `root` is fine; a non-empty directory without our record is
/// refused, so a mistyped --root cannot delete anything else.
fn teardown(root: &Path) -> Result<(), String> {
    let entries = match fs::read_dir(root) {
        Ok(rd) => rd.count(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", root.display())),
    };
    let record_path = root.join(RECORD_FILE);
    if !record_path.exists() {
        if entries == 0 {
            return Ok(());
        }
        return Err(format!(
            "{} is not empty and has no {RECORD_FILE} file, so it was not made by xiw; \
             refusing to replace it",
            root.display()
        ));
    }
    let record = Record::load(root)?;
    if (record.created_dir || !record.nodes.is_empty()) && !sys::is_root() {
        return Err(format!(
            "must be run as root: the tree at {} has device nodes in {DEV_DIR}",
            root.display()
        ));
    }
    for (node, ino) in &record.nodes {
        // Remove only what is still the very node we made (same inode): a
        // node another tree or a real driver made under that name since
        // must survive.
        if sys::char_dev_ino(node, sysfs_tree::CDEV_MAJOR, sysfs_tree::CDEV_MINOR) == Some(*ino) {
            fs::remove_file(node).map_err(|e| format!("{}: {e}", node.display()))?;
        } else if node.exists() {
            eprintln!(
                "xiw: leaving {}: it is no longer the node xiw created",
                node.display()
            );
        }
    }
    if record.created_dir || !record.nodes.is_empty() {
        // The directory exists only for xiw on a machine without RDMA
        // hardware; drop it once the last tree is gone. This fails
        // (harmlessly) while other trees or real devices have nodes there.
        let _ = fs::remove_dir(DEV_DIR);
    }
    fs::remove_dir_all(root).map_err(|e| format!("{}: {e}", root.display()))
}

/// What `up` created outside the tree. File format, one entry a line:
/// `node /dev/infiniband/uverbsN INODE` and `dir /dev/infiniband`.
#[derive(Default)]
struct Record {
    nodes: Vec<(PathBuf, u64)>,
    created_dir: bool,
}

impl Record {
    fn load(root: &Path) -> Result<Record, String> {
        let path = root.join(RECORD_FILE);
        let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut record = Record::default();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                [] => {}
                ["dir", DEV_DIR] => record.created_dir = true,
                // Accept only our own kind of path, whatever the file says.
                ["node", p, ino] if is_uverbs_node_path(p) => match ino.parse::<u64>() {
                    Ok(ino) => record.nodes.push((PathBuf::from(p), ino)),
                    Err(_) => eprintln!("xiw: {}: ignoring line {line:?}", path.display()),
                },
                _ => eprintln!("xiw: {}: ignoring line {line:?}", path.display()),
            }
        }
        Ok(record)
    }

    fn save(&self, root: &Path) -> Result<(), String> {
        let mut text = String::new();
        if self.created_dir {
            text.push_str(&format!("dir {DEV_DIR}\n"));
        }
        for (node, ino) in &self.nodes {
            text.push_str(&format!("node {} {ino}\n", node.display()));
        }
        sysfs_tree::write_attr(&root.join(RECORD_FILE), text.trim_end()).map_err(|e| e.to_string())
    }
}

fn is_uverbs_node_path(p: &str) -> bool {
    p.strip_prefix("/dev/infiniband/")
        .is_some_and(|n| sysfs_tree::uverbs_index(n).is_some())
}

/// Runs the program under `xiw exec`'s plan for the tree; returns only if
/// that fails.
fn cmd_exec(opts: &Options) -> ExitCode {
    let fail = |msg: String, code: u8| {
        eprintln!("xiw exec: {msg}");
        ExitCode::from(code)
    };
    let root = match resolve_root(opts) {
        Ok((root, _)) => root,
        Err(e) => return fail(e, 1),
    };
    let all = match exec::nodes_of(&root) {
        Ok(nodes) if !nodes.is_empty() => nodes,
        Ok(_) | Err(_) => {
            return fail(
                format!(
                    "no xiw devices at {} (create them with `xiw up{}`)",
                    root.display(),
                    opts.root.as_ref().map_or(String::new(), |_| format!(
                        " --root {}",
                        shell_quote(&root.to_string_lossy())
                    ))
                ),
                1,
            )
        }
    };
    let drivers = exec::drivers_of(&root);
    if drivers.is_none() && !Path::new(INSTALLED_DRIVER).exists() {
        return fail(
            format!(
                "the tree at {} names no provider library and none is installed \
                 ({INSTALLED_DRIVER}): run `xiw up --provider FILE` again",
                root.display()
            ),
            1,
        );
    }
    let plan = exec::Plan {
        root,
        drivers,
        nodes: exec::missing_nodes(&all),
    };
    let (program, args) = opts.command.split_first().expect("clap requires a program");
    let (msg, code) = exec::run(&plan, program, args);
    fail(msg, code)
}

/// Quotes `s` for a POSIX shell, leaving ordinary paths as they are.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:,@%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<Options, String> {
        let cli = Cli::try_parse_from(std::iter::once("xiw").chain(a.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.cmd.options()
    }

    #[test]
    fn parses_options() {
        let o = parse(&["up", "--netdev", "lo", "--netdev=eth0", "--root", "/x"]).unwrap();
        assert_eq!(o.netdevs, ["lo", "eth0"]);
        assert_eq!(o.root, Some(PathBuf::from("/x")));
        assert!(parse(&["up", "--netdev"]).is_err());
        assert!(parse(&["up", "--netdev", "lo", "--netdev", "lo"]).is_err());
        assert!(parse(&["up", "--root="]).is_err());
        assert!(parse(&["down", "--netdev", "lo"]).is_err());
        assert!(parse(&["sideways"]).is_err());
        let o = parse(&["status", "-j"]).unwrap();
        assert!(o.json && !o.pretty);
        let o = parse(&["status", "--pretty", "--root", "/x"]).unwrap();
        assert!(o.json && o.pretty, "--pretty implies --json");
        assert!(!parse(&["status"]).unwrap().json);
        assert!(parse(&["up", "-j"]).is_err());
        assert!(parse(&[]).is_err());
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("/run/xiw/sysfs"), "/run/xiw/sysfs");
        assert_eq!(shell_quote("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quote("/tmp/it's"), "'/tmp/it'\\''s'");
    }

    #[test]
    fn record_paths_are_checked() {
        assert!(is_uverbs_node_path("/dev/infiniband/uverbs0"));
        assert!(is_uverbs_node_path("/dev/infiniband/uverbs12"));
        assert!(is_uverbs_node_path("/dev/infiniband/xiw_uverbs1"));
        assert!(!is_uverbs_node_path(
            "/dev/infiniband/xiw_uverbs1/../../sda"
        ));
        assert!(!is_uverbs_node_path("/dev/infiniband/uverbs"));
        assert!(!is_uverbs_node_path("/dev/infiniband/uverbs0/../../sda"));
        assert!(!is_uverbs_node_path("/etc/passwd"));
    }
}
