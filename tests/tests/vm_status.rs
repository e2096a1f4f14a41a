//! `xiw status` in kernel mode: Debian 12's own kernel under qemu
//! (`tests/vm/guest/status.sh`) with the xiw module and Linux's siw, the
//! repository's build of `xiw` (target/release) run in the guest.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! bash tests/vm/run.sh tests/vm/guest/status.sh target/release/xiw
//! ```

use std::collections::BTreeMap;

use serde_json::Value;
use xiw_tests::guest::{guest_on, repo, workspace_version};
use xiw_tests::harness::serial;

/// What the guest printed on its `XIW-...` lines for one step.
struct Step {
    /// `xiw status -j`.
    status: Vec<Value>,
    /// `rdma -j dev show` and `rdma -j link show`, by ifname.
    rdma_dev: BTreeMap<String, Value>,
    rdma_link: BTreeMap<String, Value>,
    /// /sys/class/infiniband_verbs: entry name -> (ibdev, "major:minor").
    uverbs: BTreeMap<String, (String, String)>,
    /// /dev/infiniband: path -> (major, minor).
    nodes: BTreeMap<String, (u32, u32)>,
}

fn marker<'a>(console: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name} ");
    console
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect()
}

fn parse_json(text: &str, what: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"))
}

fn by_name(v: &Value) -> BTreeMap<String, Value> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|d| (d["ifname"].as_str().expect("ifname").to_string(), d.clone()))
        .collect()
}

fn step(console: &str, tag: u32) -> Step {
    let one = |name: &str| -> Value {
        let lines = marker(console, &format!("{name}-{tag}"));
        assert_eq!(lines.len(), 1, "one {name}-{tag} line:\n{console}");
        parse_json(lines[0], name)
    };
    let status = one("XIW-STATUS")
        .as_array()
        .expect("xiw status -j prints an array")
        .clone();
    let uverbs = marker(console, &format!("XIW-UVERBS-{tag}"))
        .iter()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.len(), 3, "{l}");
            (w[0].to_string(), (w[1].to_string(), w[2].to_string()))
        })
        .collect();
    let nodes = marker(console, &format!("XIW-NODE-{tag}"))
        .iter()
        .map(|l| {
            let (path, num) = l.split_once(' ').expect("path and number");
            let (maj, min) = num.split_once(':').expect("major:minor");
            let hex = |s: &str| u32::from_str_radix(s, 16).expect("hex");
            (path.to_string(), (hex(maj), hex(min)))
        })
        .collect();
    Step {
        status,
        rdma_dev: by_name(&one("XIW-RDMA-DEV")),
        rdma_link: by_name(&one("XIW-RDMA-LINK")),
        uverbs,
        nodes,
    }
}

/// The IPv4-mapped GID of `addr`, as sysfs writes GIDs.
fn mapped_gid(addr: &str) -> String {
    let a: std::net::Ipv4Addr = addr.parse().expect("an IPv4 address");
    let o = a.octets();
    format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        o[0], o[1], o[2], o[3]
    )
}

/// Checks the kernel-mode devices `xiw status -j` listed at `s` against
/// what the kernel says: exactly `expect` (name, netdev, address), each
/// with the rdma tool's index, node GUID, netdev, netdev index and port
/// states, its uverbs node the one the kernel made for it, and the module's
/// version and parameters.
fn check_kernel(s: &Step, expect: &[(&str, &str, &str)], module: (&str, &str)) {
    let kernel: Vec<&Value> = s.status.iter().filter(|d| d["mode"] == "kernel").collect();
    let names: Vec<&str> = kernel
        .iter()
        .map(|d| d["ifname"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = expect.iter().map(|e| e.0).collect();
    assert_eq!(names, want, "kernel-mode devices: {:?}", s.status);
    assert!(
        s.rdma_dev.contains_key("siw0"),
        "siw0 is there for the kernel: {:?}",
        s.rdma_dev
    );
    for (d, (name, netdev, addr)) in kernel.iter().zip(expect) {
        let dev = s
            .rdma_dev
            .get(*name)
            .unwrap_or_else(|| panic!("rdma dev shows {name}: {:?}", s.rdma_dev));
        let link = s
            .rdma_link
            .get(*name)
            .unwrap_or_else(|| panic!("rdma link shows {name}: {:?}", s.rdma_link));
        assert_eq!(d["ifindex"], dev["ifindex"], "{d}\n{dev}");
        assert_eq!(d["node_guid"], dev["node_guid"], "{d}\n{dev}");
        assert_eq!(d["netdev"], *netdev, "{d}");
        assert_eq!(d["netdev"], link["netdev"], "{d}\n{link}");
        assert_eq!(d["netdev_index"], link["netdev_index"], "{d}\n{link}");
        assert_eq!(d["port"], link["port"], "{d}\n{link}");
        assert_eq!(d["state"], "ACTIVE", "{d}");
        assert_eq!(d["state"], link["state"], "{d}\n{link}");
        assert_eq!(d["physical_state"], link["physical_state"], "{d}\n{link}");
        assert_eq!(d["addr"], *addr, "{d}");
        assert_eq!(d["gid"], mapped_gid(addr).as_str(), "{d}");
        assert!(d.get("sysfs_path").is_none(), "{d}");
        // The uverbs node: the kernel's entry for this device, and the node
        // in /dev/infiniband with its number.
        let (entry, (_, num)) = s
            .uverbs
            .iter()
            .find(|(_, (ibdev, _))| ibdev == name)
            .unwrap_or_else(|| panic!("a uverbs entry for {name}: {:?}", s.uverbs));
        let path = format!("/dev/infiniband/{entry}");
        assert_eq!(d["chardev"], path.as_str(), "{d}");
        let (maj, min) = num.split_once(':').expect("major:minor");
        let num = (maj.parse::<u32>().unwrap(), min.parse::<u32>().unwrap());
        assert_eq!(s.nodes.get(&path), Some(&num), "{path}: {:?}", s.nodes);
        assert_eq!(d["chardev_exists"], true, "{d}");
        assert_eq!(d["module"]["version"], module.0, "{d}");
        assert_eq!(d["module"]["parameters"]["mpa_crc"], module.1, "{d}");
    }
}

/// The standalone devices `xiw status -j` listed at `s`: exactly xiw0 on
/// lo of the default tree, its node (`xiw up` as root beside the kernel's)
/// in /dev/infiniband.
fn check_tree(s: &Step) {
    let tree: Vec<&Value> = s
        .status
        .iter()
        .filter(|d| d["mode"] == "standalone")
        .collect();
    assert_eq!(tree.len(), 1, "{:?}", s.status);
    let d = tree[0];
    assert_eq!(d["ifname"], "xiw0", "{d}");
    assert_eq!(d["netdev"], "lo", "{d}");
    assert_eq!(d["addr"], "127.0.0.1", "{d}");
    assert_eq!(d["gid"], mapped_gid("127.0.0.1").as_str(), "{d}");
    assert_eq!(d["state"], "ACTIVE", "{d}");
    assert_eq!(d["sysfs_path"], "/run/xiw/sysfs", "{d}");
    assert!(d.get("ifindex").is_none(), "{d}");
    let node = d["chardev"].as_str().expect("chardev");
    assert_eq!(s.nodes.get(node), Some(&(1, 7)), "{node}: {:?}", s.nodes);
    assert_eq!(d["chardev_exists"], true, "{d}");
}

/// In the guest (`status.sh`): with nothing, `xiw status -j` prints `[]`
/// and exits 0; with xiw0 on dummy0, xiw1 on dummy1 (kernel mode) and siw0
/// on dummy2, it lists xiw0 and xiw1, not siw0, each as the rdma tool and
/// sysfs show it (index, node GUID, netdev and its index, port state, GID
/// of the netdev's address, uverbs node with the kernel's device number)
/// with the module's version and its changed parameter (mpa_crc=Y); with a
/// standalone tree at the default place too, that tree's device beside
/// them; after `rdma link delete xiw1`, xiw1 no longer; after it all goes,
/// `[]` again. The table's rows are checked in the guest.
#[test]
fn xiw_status_lists_kernel_mode_devices_in_the_guest() {
    let _g = serial();
    let xiw = repo().join("target/release/xiw");
    let console = guest_on("bookworm", "status.sh", &[xiw]);
    let version = workspace_version();

    let module = marker(&console, "XIW-MODULE");
    assert_eq!(
        module,
        [format!("{version} mpa_crc=Y").as_str()],
        "{console}"
    );
    let module = (version.as_str(), "Y");
    let both = [
        ("xiw0", "dummy0", "10.77.0.1"),
        ("xiw1", "dummy1", "10.78.0.1"),
    ];

    let s1 = step(&console, 1);
    check_kernel(&s1, &both, module);
    assert!(
        s1.status.iter().all(|d| d["mode"] == "kernel"),
        "no tree yet: {:?}",
        s1.status
    );

    let s2 = step(&console, 2);
    check_kernel(&s2, &both, module);
    check_tree(&s2);
    assert_eq!(s2.status.len(), 3, "{:?}", s2.status);

    let s3 = step(&console, 3);
    assert!(!s3.rdma_dev.contains_key("xiw1"), "{:?}", s3.rdma_dev);
    check_kernel(&s3, &both[..1], module);
    check_tree(&s3);
    assert_eq!(s3.status.len(), 2, "{:?}", s3.status);
}
