//! The shape of the source, as rules:
//!
//! - imports flow one way, abi ← wire ← engine ← drivers ← verbs edge: the
//!   engine knows neither the provider nor rdma-core, the wire codecs know
//!   nothing of the engine above them, and the engine's own drivers (`sim`,
//!   `pair`) are known to no protocol module;
//! - every provider module belongs to one layer ([`LAYERS`]): the verbs edge
//!   (the C surface), the FFI entry (what libibverbs calls first), the
//!   drivers (QPs, the context, memory, queues) and their support (codecs of
//!   files and sockets, logging); the drivers and their support never reach
//!   the verbs edge, and nothing reaches it but the FFI entry;
//! - no import cycle among the provider's or the engine's modules;
//! - the engine stays sans-IO (no libc, sockets, threads, clock reads or
//!   rdma-core types).
//!
//! `cargo test -p xiw-tests --test layering -- --nocapture` prints the module
//! graphs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without comments and without a trailing `#[cfg(test)] mod tests`.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every name `crate::<name>` or `use crate::{<name>, ...}` refers to.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut refs = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    refs.insert(name);
                }
            }
        } else {
            refs.insert(ident(rest));
        }
    }
    refs
}

/// The top-level modules of the crate whose sources are in `src` (binaries
/// and the crate root aside), and which others each names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src");
        if rel.starts_with("bin") || rel == Path::new("lib.rs") {
            continue;
        }
        let first = rel.components().next().expect("a path");
        let top = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        let code = code_of(&std::fs::read_to_string(f).expect("readable source"));
        graph.entry(top).or_default().extend(crate_refs(&code));
    }
    let names: BTreeSet<String> = graph.keys().cloned().collect();
    for (m, deps) in graph.iter_mut() {
        deps.retain(|d| names.contains(d) && d != m);
    }
    graph
}

/// The provider's modules and which others each names.
fn provider_graph() -> BTreeMap<String, BTreeSet<String>> {
    module_graph(&repo().join("provider/src"))
}

/// The engine's modules and which others each names.
fn engine_graph() -> BTreeMap<String, BTreeSet<String>> {
    module_graph(&repo().join("provider/engine/src"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layer {
    /// The C surface: the verbs and the direct verbs, `extern "C"`.
    VerbsEdge,
    /// The provider's entry point: registration with libibverbs, which hands
    /// libibverbs the verbs edge's table.
    Ffi,
    /// What runs the engine and keeps the device's objects.
    Driver,
    /// What the drivers use that knows no QP: codecs, files, sockets, logs.
    Support,
}

/// Every provider module and its layer. A new module must be placed here.
const LAYERS: &[(&str, Layer)] = &[
    ("verbs", Layer::VerbsEdge),
    ("dv", Layer::VerbsEdge),
    ("registration", Layer::Ffi),
    ("qp", Layer::Driver),
    ("context", Layer::Driver),
    ("cq", Layer::Driver),
    ("srq", Layer::Driver),
    ("queue", Layer::Driver),
    ("mem", Layer::Driver),
    ("odp", Layer::Driver),
    ("persist", Layer::Driver),
    ("kernel", Layer::Driver),
    ("events_page", Layer::Driver),
    ("async_event", Layer::Driver),
    ("wqe", Layer::Driver),
    ("error", Layer::Support),
    ("tcp", Layer::Support),
    ("sys", Layer::Support),
    ("private_data", Layer::Support),
    ("crc", Layer::Support),
    ("log", Layer::Support),
    ("maps", Layer::Support),
    ("netdev", Layer::Support),
    ("sysfs_tree", Layer::Support),
    ("rdma_core", Layer::Support),
    ("verbs_status", Layer::Support),
];

fn layer_of(m: &str) -> Option<Layer> {
    LAYERS.iter().find(|(n, _)| *n == m).map(|(_, l)| *l)
}

/// The imports of `graph` that break the layers' rules.
fn layer_violations(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out = Vec::new();
    for (m, deps) in graph {
        let Some(from) = layer_of(m) else {
            out.push(format!("{m}: in no layer (place it in LAYERS)"));
            continue;
        };
        for d in deps {
            let Some(to) = layer_of(d) else { continue };
            let allowed = match (from, to) {
                // Nothing reaches the verbs edge but the FFI entry (and the
                // edge itself: the direct verbs build on the verbs).
                (Layer::VerbsEdge | Layer::Ffi, Layer::VerbsEdge) => true,
                (_, Layer::VerbsEdge) => false,
                // The FFI entry is reached by nothing below it.
                (Layer::VerbsEdge | Layer::Ffi, Layer::Ffi) => from == Layer::VerbsEdge,
                (_, Layer::Ffi) => false,
                // Support knows no driver.
                (Layer::Support, Layer::Driver) => false,
                _ => true,
            };
            if !allowed {
                out.push(format!("{m} ({from:?}) -> {d} ({to:?})"));
            }
        }
    }
    out
}

#[test]
fn every_provider_module_keeps_to_its_layer() {
    let graph = provider_graph();
    let bad = layer_violations(&graph);
    assert!(bad.is_empty(), "imports against the layers: {bad:#?}");
    // The table names no module that is gone.
    for (m, _) in LAYERS {
        assert!(
            graph.contains_key(*m),
            "LAYERS names {m}, which is not a provider module"
        );
    }
}

#[test]
fn the_layer_rules_catch_a_wrong_import() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert!(layer_violations(&g(&[("dv", "verbs"), ("verbs", "qp"), ("qp", "sys")])).is_empty());
    assert!(layer_violations(&g(&[("registration", "verbs")])).is_empty());
    // A driver reaching the verbs edge, support reaching a driver, and an
    // unplaced module are each caught.
    assert_eq!(layer_violations(&g(&[("qp", "verbs")])).len(), 1);
    assert_eq!(layer_violations(&g(&[("context", "dv")])).len(), 1);
    assert_eq!(layer_violations(&g(&[("tcp", "qp")])).len(), 1);
    assert_eq!(layer_violations(&g(&[("qp", "registration")])).len(), 1);
    assert_eq!(layer_violations(&g(&[("newthing", "qp")])).len(), 1);
}

/// The strongly connected components of more than one module.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Two modules are in one cycle when each reaches the other.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            for d in &graph[&m] {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in graph.keys() {
        if done.contains(m) || !reaches[m].contains(m) {
            continue;
        }
        let comp: Vec<String> = graph
            .keys()
            .filter(|o| reaches[m].contains(*o) && reaches[*o].contains(m))
            .cloned()
            .collect();
        done.extend(comp.iter().cloned());
        out.push(comp);
    }
    out
}

#[test]
fn provider_modules_have_no_import_cycle() {
    let graph = provider_graph();
    assert!(graph.len() > 10, "found only {} modules", graph.len());
    for (m, deps) in &graph {
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        println!("{m:10} -> {}", deps.join(" "));
    }
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "import cycles among provider modules: {found:?}"
    );
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert!(cycles(&g(&[("a", "b"), ("b", "c")])).is_empty());
    assert_eq!(
        cycles(&g(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
    let refs = crate_refs("use crate::{qp::Qp, tx};\nlet x = crate::rx::f(); // crate::cm");
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        ["cm", "qp", "rx", "tx"]
    );
    assert!(!crate_refs(&code_of("let x = 1; // crate::cm")).contains("cm"));
}

#[test]
fn the_engine_knows_neither_the_provider_nor_rdma_core() {
    let manifest =
        std::fs::read_to_string(repo().join("provider/engine/Cargo.toml")).expect("manifest");
    for dep in ["xiw ", "xiw=", "xiw.", "xiw-abi", "xiw_abi"] {
        assert!(
            !manifest.lines().any(|l| l.trim_start().starts_with(dep)),
            "the engine's manifest names {dep}"
        );
    }
    let mut files = Vec::new();
    rust_files(&repo().join("provider/engine/src"), &mut files);
    for f in &files {
        let code = code_of(&std::fs::read_to_string(f).expect("readable source"));
        for name in ["xiw::", "xiw_abi", "xiw_engine::"] {
            assert!(!code.contains(name), "{}: names {name}", f.display());
        }
    }
}

#[test]
fn the_wire_codecs_know_nothing_above_them() {
    let mut files = Vec::new();
    rust_files(&repo().join("provider/engine/src/wire"), &mut files);
    assert!(files.len() > 3, "found only {} wire sources", files.len());
    for f in &files {
        let code = code_of(&std::fs::read_to_string(f).expect("readable source"));
        let above: Vec<String> = crate_refs(&code)
            .into_iter()
            .filter(|r| r != "wire")
            .collect();
        assert!(above.is_empty(), "{}: names {above:?}", f.display());
    }
}

#[test]
fn the_engine_layers_flow_one_way() {
    let graph = engine_graph();
    for (m, deps) in &graph {
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        println!("engine {m:10} -> {}", deps.join(" "));
    }
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "import cycles among engine modules: {found:?}"
    );
    // The in-memory drivers are the engine's test bench: no protocol module
    // depends on them.
    let drivers = ["sim", "pair"];
    for (m, deps) in &graph {
        if drivers.contains(&m.as_str()) {
            continue;
        }
        for d in drivers {
            assert!(
                !deps.contains(d),
                "engine module {m} depends on its driver {d}"
            );
        }
    }
}

#[test]
fn the_engine_is_sans_io() {
    let src = repo().join("provider/engine/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 5, "found only {} engine sources", files.len());
    let banned = [
        "libc::",
        "std::net",
        "std::thread",
        "std::fs",
        "std::os",
        "Instant::now",
        "SystemTime",
        "unsafe ",
        "xiw_abi::verbs",
        "ibv_",
    ];
    let mut found = Vec::new();
    for f in &files {
        let code = code_of(&std::fs::read_to_string(f).expect("readable source"));
        for b in banned {
            if code.contains(b) {
                found.push(format!("{}: {b}", f.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the engine reaches outside itself: {found:#?}"
    );
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("engine lib.rs");
    assert!(lib.contains("#![forbid(unsafe_code)]"));
    let manifest =
        std::fs::read_to_string(repo().join("provider/engine/Cargo.toml")).expect("manifest");
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .unwrap_or("");
    for crate_name in ["libc", "socket2", "nix", "mio", "polling"] {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(crate_name)),
            "the engine depends on {crate_name}"
        );
    }
}

/// A QP's deadlines are its engine lifecycle's: the QP and its connection
/// setup read no clock, the progress thread that runs the timers passes the
/// time in.
#[test]
fn the_qp_reads_no_clock() {
    let qp = repo().join("provider/src/qp");
    for f in ["mod.rs", "cm.rs"] {
        let code = code_of(&std::fs::read_to_string(qp.join(f)).expect("readable source"));
        for b in ["Instant::now", "SystemTime", "elapsed()"] {
            assert!(
                !code.contains(b),
                "provider/src/qp/{f} reads the clock: {b}"
            );
        }
    }
}
