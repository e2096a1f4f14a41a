//! `xiw status`: the xiw devices of both kinds, kernel mode's (RDMA
//! netlink, `netlink.rs`) and the standalone tree's, as a table or as JSON.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::Serialize;

use xiw::sysfs_tree::{self, DeviceInfo};

use crate::netlink::{self, KernelDevice};
use crate::{resolve_root, shell_quote, sys, Options, Record};

/// Where the kernel module shows its version and parameters.
const MODULE_DIR: &str = "/sys/module/xiw";

/// Where the kernel shows its RDMA devices.
const KERNEL_IBDEVS: &str = "/sys/class/infiniband";

/// One device, in the JSON document and a table row. Keys as `rdma -j dev`
/// and `rdma -j link` name them where they have them.
#[derive(Serialize, Debug, Default)]
struct Device {
    ifname: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ifindex: Option<u32>,
    mode: &'static str,
    port: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    physical_state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    netdev: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    netdev_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_guid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fw: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gid: Option<String>,
    /// The netdev's MTU.
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    /// The port's verbs MTU, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    active_mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chardev: Option<String>,
    chardev_exists: bool,
    /// Standalone: the tree (what SYSFS_PATH names).
    #[serde(skip_serializing_if = "Option::is_none")]
    sysfs_path: Option<String>,
    /// Kernel mode: the module.
    #[serde(skip_serializing_if = "Option::is_none")]
    module: Option<Module>,
    /// Standalone: whether `up` made device nodes for the tree (else `xiw
    /// exec` makes them); for the table only.
    #[serde(skip)]
    nodes_made: bool,
}

#[derive(Serialize, Debug, Clone, Default)]
struct Module {
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    parameters: BTreeMap<String, String>,
}

pub fn cmd_status(opts: &Options) -> Result<(), String> {
    // Kernel mode: an RDMA netlink failure still lets the tree be listed,
    // and is reported after.
    let (kernel, netlink_err) = match netlink::devices_of_driver(xiw_abi::limits::DRIVER_ID) {
        Ok(devs) => (devs, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let module = (!kernel.is_empty()).then(read_module);
    let mut devices: Vec<Device> = kernel
        .iter()
        .map(|k| kernel_device(k, module.clone()))
        .collect();

    // Standalone: the tree at --root (which must have one) or at the
    // default place (which need not).
    let tree = match (&opts.root, resolve_root(opts)) {
        (Some(_), Err(e)) => return Err(e),
        (None, Err(_)) => None,
        (_, Ok((root, _))) => {
            let has_tree = root.join("class/infiniband_verbs").is_dir();
            if !has_tree && opts.root.is_some() {
                return Err(format!(
                    "no xiw devices at {} (create them with `xiw up --root {}`)",
                    root.display(),
                    shell_quote(&root.to_string_lossy())
                ));
            }
            has_tree.then_some(root)
        }
    };
    if let Some(root) = &tree {
        devices.extend(tree_devices(root)?);
    }

    if opts.json {
        let text = if opts.pretty {
            serde_json::to_string_pretty(&devices)
        } else {
            serde_json::to_string(&devices)
        }
        .map_err(|e| format!("JSON: {e}"))?;
        println!("{text}");
    } else if !devices.is_empty() {
        print_text(&devices, module.as_ref(), tree.as_deref());
    }
    if let Some(e) = netlink_err {
        return Err(e);
    }
    if devices.is_empty() {
        eprintln!(
            "xiw status: no xiw devices: create them with `rdma link add NAME type xiw netdev \
             IFACE` (kernel mode) or `xiw up` (standalone)"
        );
    }
    Ok(())
}

fn kernel_device(k: &KernelDevice, module: Option<Module>) -> Device {
    let port_dir = Path::new(KERNEL_IBDEVS)
        .join(&k.name)
        .join(format!("ports/{}", k.port));
    let read = |rel: &str| {
        fs::read_to_string(port_dir.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let nd = k.netdev.as_deref().and_then(|n| sys::lookup_netdev(n).ok());
    let chardev = k
        .chardev_name
        .as_deref()
        .map(|n| Path::new(crate::DEV_DIR).join(n));
    let chardev_exists = match (&chardev, k.chardev) {
        (Some(path), Some((major, minor))) => sys::char_dev_ino(path, major, minor).is_some(),
        _ => false,
    };
    Device {
        ifname: k.name.clone(),
        ifindex: Some(k.index),
        mode: "kernel",
        port: k.port,
        state: k.port_state.map(netlink::port_state_name),
        physical_state: k.phys_state.map(netlink::phys_state_name),
        netdev: k.netdev.clone(),
        netdev_index: k.netdev_index,
        node_guid: k.node_guid.map(sysfs_tree::format_guid),
        fw: k.fw.clone(),
        addr: nd.as_ref().map(|n| n.addr.to_string()),
        gid: read("gids/0"),
        mtu: nd.as_ref().map(|n| n.mtu),
        // Not in sysfs: the module answers it to a verbs query only.
        active_mtu: None,
        chardev: chardev.map(|p| p.display().to_string()),
        chardev_exists,
        sysfs_path: None,
        module,
        nodes_made: true,
    }
}

fn read_module() -> Module {
    let dir = Path::new(MODULE_DIR);
    let version = fs::read_to_string(dir.join("version"))
        .ok()
        .map(|s| s.trim().to_string());
    let mut parameters = BTreeMap::new();
    if let Ok(entries) = fs::read_dir(dir.join("parameters")) {
        for e in entries.flatten() {
            if let (Some(name), Ok(value)) = (
                e.file_name().to_str().map(str::to_string),
                fs::read_to_string(e.path()),
            ) {
                parameters.insert(name, value.trim().to_string());
            }
        }
    }
    Module {
        version,
        parameters,
    }
}

/// "4: ACTIVE" (the tree's, as sysfs writes it): the number's name as for
/// kernel-mode devices, else the text.
fn state_of(text: &str, name: fn(u8) -> String) -> String {
    let text = text.trim();
    match text.split_once(": ") {
        Some((n, _)) if n.parse::<u8>().is_ok() => name(n.parse().expect("checked")),
        Some((_, rest)) => rest.to_string(),
        None => text.to_string(),
    }
}

fn tree_devices(root: &Path) -> Result<Vec<Device>, String> {
    let uverbs = sysfs_tree::list_uverbs(root).map_err(|e| e.to_string())?;
    let record = Record::load(root)?;
    let nodes_made = !record.nodes.is_empty();
    let mut out = Vec::new();
    for (uverbs_name, ibdev) in uverbs {
        let dir = sysfs_tree::ibdev_path(root, &ibdev);
        let info = DeviceInfo::load(&dir).map_err(|e| e.to_string())?;
        let port = dir.join(format!("ports/{}", sysfs_tree::PORT_NUM));
        let read = |rel: &str| fs::read_to_string(port.join(rel)).ok();
        let node = sysfs_tree::uverbs_dev_node(&uverbs_name);
        out.push(Device {
            ifname: info.ibdev.clone(),
            ifindex: None,
            mode: "standalone",
            port: sysfs_tree::PORT_NUM,
            state: read("state").map(|s| state_of(&s, netlink::port_state_name)),
            physical_state: read("phys_state").map(|s| state_of(&s, netlink::phys_state_name)),
            netdev: Some(info.netdev.clone()),
            netdev_index: Some(info.ifindex),
            node_guid: Some(sysfs_tree::format_guid(info.node_guid)),
            fw: fs::read_to_string(dir.join("fw_ver"))
                .ok()
                .map(|s| s.trim().to_string()),
            addr: Some(info.addr.to_string()),
            gid: Some(sysfs_tree::format_gid(&info.gid)),
            mtu: Some(info.mtu),
            active_mtu: Some(256u32 << (sysfs_tree::ibv_mtu_for(info.mtu) - 1)),
            chardev_exists: sys::char_dev_ino(
                &node,
                sysfs_tree::CDEV_MAJOR,
                sysfs_tree::CDEV_MINOR,
            )
            .is_some(),
            chardev: Some(node.display().to_string()),
            sysfs_path: Some(root.display().to_string()),
            module: None,
            nodes_made,
        });
    }
    Ok(out)
}

fn print_text(devices: &[Device], module: Option<&Module>, tree: Option<&Path>) {
    let dash = || "-".to_string();
    let mut rows = vec![[
        "IBDEV",
        "MODE",
        "NETDEV",
        "STATE",
        "ADDRESS",
        "GID",
        "MTU",
        "NODE GUID",
        "UVERBS NODE",
    ]
    .map(str::to_string)];
    for d in devices {
        let node = match &d.chardev {
            Some(path) if d.chardev_exists => path.clone(),
            Some(_) if !d.nodes_made => "(xiw exec makes it)".to_string(),
            Some(path) => format!("{path} (missing!)"),
            None => dash(),
        };
        let mtu = match (d.mtu, d.active_mtu) {
            (Some(m), Some(a)) => format!("{m} (ibv {a})"),
            (None, Some(a)) => format!("(ibv {a})"),
            (Some(m), None) => m.to_string(),
            (None, None) => dash(),
        };
        rows.push([
            d.ifname.clone(),
            d.mode.to_string(),
            d.netdev.clone().unwrap_or_else(dash),
            d.state.clone().unwrap_or_else(dash),
            d.addr.clone().unwrap_or_else(dash),
            d.gid.clone().unwrap_or_else(dash),
            mtu,
            d.node_guid.clone().unwrap_or_else(dash),
            node,
        ]);
    }
    print_table(&rows);
    if let Some(m) = module {
        let params: Vec<String> = m
            .parameters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!(
            "kernel module: xiw {} ({MODULE_DIR}){}{}",
            m.version.as_deref().unwrap_or("(no version)"),
            if params.is_empty() { "" } else { ": " },
            params.join(" ")
        );
    }
    if let Some(root) = tree {
        println!(
            "standalone tree: SYSFS_PATH={}",
            shell_quote(&root.to_string_lossy())
        );
    }
}

fn print_table<const N: usize>(rows: &[[String; N]]) {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_states_take_the_kernels_names() {
        assert_eq!(state_of("4: ACTIVE\n", netlink::port_state_name), "ACTIVE");
        assert_eq!(state_of("1: DOWN", netlink::port_state_name), "DOWN");
        assert_eq!(state_of("5: LinkUp", netlink::phys_state_name), "LINK_UP");
        assert_eq!(
            state_of("3: Disabled", netlink::phys_state_name),
            "DISABLED"
        );
        assert_eq!(state_of("odd", netlink::port_state_name), "odd");
    }

    #[test]
    fn absent_values_are_left_out_of_the_json() {
        let d = Device {
            ifname: "xiw0".into(),
            mode: "standalone",
            port: 1,
            ..Device::default()
        };
        let v: serde_json::Value = serde_json::to_value(&d).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["chardev_exists", "ifname", "mode", "port"]);
    }
}
