//! rdma-core's own test suite (Debian's python3-pyverbs, the tests under
//! /usr/share/doc/rdma-core/tests) against an xiw device in standalone mode.
//!
//! Every test must pass or skip, except those listed in [`MAY_FAIL`], each
//! for a reason the README gives: completion channels, which standalone mode
//! cannot have; tests that read the responder's memory the moment the
//! writer's RDMA Write completes, which iWARP does not promise (RFC 5040
//! section 5: a Write completes once handed to the stream); and tests that
//! expect a receive failing its local checks to come back to the requester
//! as InfiniBand's remote operation error. At least [`MIN_OK`] must pass.
//! The counts are printed.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! cp -r /usr/share/doc/rdma-core/tests /tmp/t && gunzip /tmp/t/*.gz
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! /usr/bin/python3 /tmp/t/run_tests.py --dev xiw0 --gid 0 -v
//! ```

use std::path::Path;
use std::process::Command;

use xiw_tests::harness::{lo_device, serial};

const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// Tests that may fail or error here (by name, as unittest prints it).
const MAY_FAIL: &[(&str, &str)] = &[
    (
        "test_cq_events_rc",
        "completion channels need the kernel module",
    ),
    (
        "test_cq_events_ud",
        "completion channels need the kernel module",
    ),
    (
        "test_qp_ex_rc_rdma_write",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_mr_rereg_access_bad_flow",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_mr_rereg_access",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_mr_rereg_pd",
        "expects a receive that fails its local checks as IB's remote operation error at the requester",
    ),
    (
        "test_mr_rereg_addr",
        "expects a receive that fails its local checks as IB's remote operation error at the requester",
    ),
];

/// Fewest tests that must pass (as of rdma-core 44.0).
const MIN_OK: usize = 46;

#[derive(Default, Debug)]
struct Counts {
    ok: usize,
    skipped: usize,
    failed: Vec<String>,
}

/// unittest's verbose lines: `name (module.Class.name) ... ok` (or, with a
/// docstring, the name on one line and `doc ... ok` on the next).
fn parse(out: &str) -> Counts {
    let mut c = Counts::default();
    let mut last_name = String::new();
    for line in out.lines() {
        if let Some(name) = line
            .split(" (tests.")
            .next()
            .filter(|n| n.starts_with("test") && !n.contains(' ') && line.contains(" (tests."))
        {
            last_name = name.to_string();
        }
        let Some((_, verdict)) = line.rsplit_once(" ... ") else {
            continue;
        };
        if verdict == "ok" {
            c.ok += 1;
        } else if verdict.starts_with("skipped") || verdict.starts_with("expected failure") {
            c.skipped += 1;
        } else if verdict == "FAIL" || verdict == "ERROR" {
            c.failed.push(last_name.clone());
        }
    }
    c
}

#[test]
fn rdma_core_test_suite_passes_but_for_what_iwarp_and_standalone_mode_cannot() {
    let _g = serial();
    assert!(
        Path::new(SUITE).join("run_tests.py").exists(),
        "{SUITE} missing: install python3-pyverbs (pkg/deps.sh does)"
    );
    let dir = std::env::temp_dir().join(format!("xiw-pyverbs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let st = Command::new("cp")
        .args(["-r", SUITE])
        .arg(&dir)
        .status()
        .expect("cp");
    assert!(st.success(), "copying {SUITE}");
    // Debian compresses the larger files of /usr/share/doc.
    let gz: Vec<_> = std::fs::read_dir(&dir)
        .expect("the copy")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gz"))
        .collect();
    if !gz.is_empty() {
        let st = Command::new("gunzip")
            .arg("-f")
            .args(&gz)
            .status()
            .expect("gunzip");
        assert!(st.success(), "gunzip");
    }
    let dev = lo_device();
    let out = dev
        .cmd("/usr/bin/python3")
        .arg(dir.join("run_tests.py"))
        .args(["--dev", "xiw0", "--gid", "0", "-v"])
        .output()
        .expect("running python3");
    let _ = std::fs::remove_dir_all(&dir);
    // unittest reports on stderr.
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let c = parse(&text);
    eprintln!(
        "pyverbs (rdma-core tests): {} ok, {} skipped, {} failed or errors {:?}",
        c.ok,
        c.skipped,
        c.failed.len(),
        c.failed
    );
    let unexpected: Vec<&String> = c
        .failed
        .iter()
        .filter(|n| !MAY_FAIL.iter().any(|(m, _)| m == n))
        .collect();
    assert!(
        unexpected.is_empty(),
        "tests failed that must pass: {unexpected:?}\n{text}"
    );
    assert!(c.ok >= MIN_OK, "only {} tests passed\n{text}", c.ok);
    assert!(
        text.contains("\nRan "),
        "the suite did not run to its end\n{text}"
    );
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn parses_verbose_unittest_output() {
        let out = "\
test_a (tests.test_x.X.test_a) ... ok
test_b (tests.test_x.X.test_b)
Some docstring. ... FAIL
test_c (tests.test_x.X.test_c) ... skipped 'no'
test_d (tests.test_x.X.test_d) ... ERROR
";
        let c = parse(out);
        assert_eq!(c.ok, 1);
        assert_eq!(c.skipped, 1);
        assert_eq!(c.failed, vec!["test_b".to_string(), "test_d".to_string()]);
    }
}
