//! `xiw status` on this host (standalone mode): the tree's devices as a
//! table and as JSON (`-j`, `-p`), what it says with no device at all, and
//! the error for a --root without a tree. The repository's build of `xiw`
//! (target/release) runs, in a network namespace of the test's own with lo
//! and one end of a veth pair whose hardware address is fixed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use xiw_tests::harness::serial;

const XIW: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/xiw");
const NS: &str = "xiwstatus";
const VETH: &str = "xstv0";
const PEER: &str = "xstv1";
const VETH_MAC: &str = "52:54:00:12:34:56";

/// The namespace with its netdevs, and the tree; both go when dropped.
struct Setup {
    root: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let root = PathBuf::from(format!("/run/xiw/tests-{NS}"));
        let _ = Command::new("ip").args(["netns", "del", NS]).output();
        for cmd in [
            format!("ip netns add {NS}"),
            format!("ip -n {NS} link set lo up"),
            format!("ip -n {NS} link add {VETH} type veth peer name {PEER}"),
            format!("ip -n {NS} link set {VETH} address {VETH_MAC}"),
            format!("ip -n {NS} addr add 10.91.0.1/24 dev {VETH}"),
            format!("ip -n {NS} link set {PEER} up"),
            format!("ip -n {NS} link set {VETH} up"),
        ] {
            let st = Command::new("sh").arg("-c").arg(&cmd).status().expect("sh");
            assert!(st.success(), "failed: {cmd}");
        }
        Setup { root }
    }

    /// `xiw ARGS` in the namespace.
    fn xiw(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", NS, XIW])
            .args(args)
            .output()
            .expect("running xiw")
    }

    /// A file of the namespace's own /sys (ip netns exec mounts it).
    fn sys(&self, path: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", NS, "cat", path])
            .output()
            .expect("cat");
        assert!(out.status.success(), "cat {path}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let root = self.root.to_string_lossy().into_owned();
        let _ = self.xiw(&["down", "--root", &root]);
        let _ = Command::new("ip").args(["netns", "del", NS]).output();
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> Vec<Value> {
    let stdout = text(&out.stdout);
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{stdout}"));
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {stdout}"))
        .clone()
}

fn standalone(devs: &[Value]) -> Vec<&Value> {
    devs.iter().filter(|d| d["mode"] == "standalone").collect()
}

/// Two devices (lo, and one end of the veth pair) in a tree at --root: `xiw status
/// -j` lists exactly those, with the netdev, its index and MTU, the
/// address and GID (IPv4-mapped), the node GUID (EUI-64 from the veth's
/// hardware address), the port ACTIVE and the uverbs node `xiw up` made
/// (a character device, named as the tree's uverbs entry for the device
/// says); `-p` is the same document indented; the table has a row each
/// and names the tree. Before `up`, with nothing anywhere, the array is
/// empty, the exit status 0 and stderr says how to make devices.
#[test]
fn xiw_status_lists_the_trees_devices_as_a_table_and_as_json() {
    let _g = serial();
    let s = Setup::new();
    let root = s.root.to_string_lossy().into_owned();

    // Nothing yet: the namespace's default tree does not exist.
    let out = s.xiw(&["status", "-j"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let devs = json(&out);
    assert!(standalone(&devs).is_empty(), "{devs:?}");
    if !Path::new("/sys/module/ib_core").exists() {
        assert!(
            devs.is_empty(),
            "no RDMA core, so no kernel devices: {devs:?}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("xiw status: no xiw devices: "), "{err}");
        let out = s.xiw(&["status"]);
        assert_eq!(out.status.code(), Some(0));
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }

    let out = s.xiw(&["up", "--root", &root, "--netdev", "lo", "--netdev", VETH]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = s.xiw(&["status", "-j", "--root", &root]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all = json(&out);
    let devs = standalone(&all);
    assert_eq!(devs.len(), 2, "{all:?}");
    let ifindex = |n: &str| -> u64 {
        s.sys(&format!("/sys/class/net/{n}/ifindex"))
            .parse()
            .unwrap()
    };
    let expect = [
        (
            "xiw0",
            "lo",
            "127.0.0.1",
            "0000:0000:0000:0000:0000:ffff:7f00:0001",
            65536,
        ),
        (
            "xiw1",
            VETH,
            "10.91.0.1",
            "0000:0000:0000:0000:0000:ffff:0a5b:0001",
            1500,
        ),
    ];
    for (d, (name, netdev, addr, gid, mtu)) in devs.iter().zip(expect) {
        assert_eq!(d["ifname"], name, "{d}");
        assert_eq!(d["netdev"], netdev, "{d}");
        assert_eq!(d["netdev_index"], ifindex(netdev), "{d}");
        assert_eq!(d["addr"], addr, "{d}");
        assert_eq!(d["gid"], gid, "{d}");
        assert_eq!(d["mtu"], mtu, "{d}");
        assert_eq!(d["port"], 1, "{d}");
        assert_eq!(d["state"], "ACTIVE", "{d}");
        assert_eq!(d["physical_state"], "LINK_UP", "{d}");
        assert_eq!(d["sysfs_path"], root.as_str(), "{d}");
        assert!(
            d.get("ifindex").is_none(),
            "standalone has no RDMA index: {d}"
        );
        assert!(d.get("module").is_none(), "{d}");
        // The node: the one the tree's uverbs entry for this device names,
        // there as a character device.
        let node = d["chardev"].as_str().expect("chardev");
        let entry = Path::new(node)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let ibdev = std::fs::read_to_string(
            s.root
                .join("class/infiniband_verbs")
                .join(&entry)
                .join("ibdev"),
        )
        .unwrap_or_else(|e| panic!("{entry}: {e}"));
        assert_eq!(ibdev.trim(), name, "{d}");
        use std::os::unix::fs::FileTypeExt;
        let is_char = std::fs::metadata(node).is_ok_and(|m| m.file_type().is_char_device());
        assert!(is_char, "{node} is not a character device");
        assert_eq!(d["chardev_exists"], true, "{d}");
    }
    // The veth's GUID is its hardware address made EUI-64.
    assert_eq!(devs[1]["node_guid"], "5054:00ff:fe12:3456");
    assert_eq!(
        devs[0]["node_guid"].as_str().unwrap(),
        std::fs::read_to_string(s.root.join("class/infiniband/xiw0/node_guid"))
            .unwrap()
            .trim()
    );

    // -p: the same document, indented.
    let pretty = s.xiw(&["status", "-p", "--root", &root]);
    assert!(pretty.status.success());
    assert!(
        text(&pretty.stdout).lines().count() > 2 * 10,
        "{}",
        text(&pretty.stdout)
    );
    assert_eq!(json(&pretty), all);

    // The table: a header, a row per device, then the tree.
    let out = s.xiw(&["status", "--root", &root]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        words(lines[0])[..6],
        ["IBDEV", "MODE", "NETDEV", "STATE", "ADDRESS", "GID"],
        "{table}"
    );
    let rows: Vec<Vec<String>> = lines
        .iter()
        .skip(1)
        .map(|l| words(l))
        .filter(|w| w.get(1).map(String::as_str) == Some("standalone"))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    for (row, (name, netdev, addr, gid, mtu)) in rows.iter().zip(expect) {
        assert_eq!(
            row[..6],
            [name, "standalone", netdev, "ACTIVE", addr, gid],
            "{table}"
        );
        assert_eq!(row[6], mtu.to_string(), "{table}");
    }
    assert_eq!(
        lines.last().copied(),
        Some(format!("standalone tree: SYSFS_PATH={root}").as_str()),
        "{table}"
    );
}

/// An explicit --root without a tree is an error, in either form: exit
/// status 1, nothing on stdout, one line on stderr naming the directory.
#[test]
fn xiw_status_with_a_root_that_has_no_tree_fails() {
    let dir = std::env::temp_dir().join(format!("xiw-status-none-{}", std::process::id()));
    let dir_s = dir.to_string_lossy().into_owned();
    for args in [
        &["status", "--root", &dir_s][..],
        &["status", "-j", "--root", &dir_s][..],
    ] {
        let out = Command::new(XIW).args(args).output().expect("xiw");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("xiw status: no xiw devices at {dir_s} ")),
            "{err}"
        );
    }
    assert!(!dir.exists(), "status made {dir_s}");
}
