//! The shape of the source: the provider's modules import each other without
//! a cycle, and the protocol engine stays sans-IO (no libc, sockets, threads,
//! clock reads or rdma-core types).
//!
//! `cargo test -p xiw-tests --test layering -- --nocapture` prints the module
//! graph.

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

/// The provider's top-level modules (binaries aside) and which others each names.
fn provider_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = repo().join("provider/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
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
