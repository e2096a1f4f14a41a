//! rdma-core's own test suite (Debian's python3-pyverbs, the tests under
//! /usr/share/doc/rdma-core/tests) against an xiw device in standalone mode.
//!
//! It runs twice. With xiw's default completions every test must pass or
//! skip, except those listed in [`xiw_tests::pyverbs::MAY_FAIL`], each for a
//! reason the README gives: completion channels, which standalone mode
//! cannot have, and tests that take a Write's or Send's completion to mean
//! the responder has placed or refused it, which iWARP does not promise (RFC
//! 5040 section 5: a Write completes once handed to the stream). With
//! completions confirmed by the peer (`XIW_COMPLETION=placed`) that holds, and
//! only the completion channel tests may fail. At least [`MIN_OK`] and
//! [`MIN_OK_PLACED`] must pass; 32 huge pages are reserved for the run (three
//! tests register huge-page memory). The counts are printed.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! cp -r /usr/share/doc/rdma-core/tests /tmp/t && gunzip /tmp/t/*.gz
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! /usr/bin/python3 /tmp/t/run_tests.py --dev xiw0 --gid 0 -v
//! XIW_COMPLETION=placed /usr/bin/python3 /tmp/t/run_tests.py --dev xiw0 --gid 0 -v
//! ```

use std::path::Path;
use std::process::Command;

use xiw_tests::harness::{lo_device, serial, HugePages};
use xiw_tests::pyverbs::{check, MAY_FAIL, MAY_FAIL_PLACED};

const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// Fewest tests that must pass (as of rdma-core 44.0), with the default
/// completions and with completions confirmed by the peer.
const MIN_OK: usize = 78;
const MIN_OK_PLACED: usize = 92;

/// The suite's unittest output (stderr) for a run with `env` set.
fn run_suite(env: &[(&str, &str)]) -> String {
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
        .envs(env.iter().copied())
        .output()
        .expect("running python3");
    let _ = std::fs::remove_dir_all(&dir);
    // unittest reports on stderr.
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn rdma_core_test_suite_passes_but_for_what_iwarp_and_standalone_mode_cannot() {
    let _g = serial();
    assert!(
        Path::new(SUITE).join("run_tests.py").exists(),
        "{SUITE} missing: install python3-pyverbs (pkg/deps.sh does)"
    );
    // Three tests register huge-page memory.
    let _huge = HugePages::reserve(32);
    let text = run_suite(&[]);
    check("rdma-core 44.0 tests", &text, MIN_OK, MAY_FAIL);
    // Completions confirmed by the peer: what the suite assumes of a Write's
    // or Send's completion holds, and only completion channels fail.
    let text = run_suite(&[("XIW_COMPLETION", "placed")]);
    check(
        "rdma-core 44.0 tests, XIW_COMPLETION=placed",
        &text,
        MIN_OK_PLACED,
        MAY_FAIL_PLACED,
    );
}
