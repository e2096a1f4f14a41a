//! xiw under the rdma-core of Debian 13 (56.1, private ABI 34) and of Debian
//! unstable (65.0, private ABI 65): the installed provider in a chroot of
//! each made from Debian's archive (`pkg/chroot.sh`), driven by that
//! release's libibverbs, perftest, ibv_rc_pingpong and its own test suite
//! (`tests/rdma-core.sh`). The suite must pass but for the tests listed in
//! `xiw_tests::pyverbs::MAY_FAIL`.
//!
//! By hand (after a release build and `pkg/install.sh`):
//! `bash tests/rdma-core.sh trixie 56.1 --pyverbs /tmp/pyverbs.txt`.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use xiw_tests::harness::{serial, HugePages};
use xiw_tests::pyverbs::{check, MAY_FAIL, MAY_FAIL_PLACED};

/// Fewest of rdma-core 56.1's tests that must pass, with the default
/// completions and with completions confirmed by the peer.
const MIN_OK_56: (usize, usize) = (86, 101);
/// Fewest of rdma-core 65.0's tests that must pass, likewise.
const MIN_OK_65: (usize, usize) = (101, 120);

/// Runs `tests/rdma-core.sh` with `args`; fails the test with its output
/// unless it succeeds. Prints what it printed.
fn rdma_core_sh(args: &[&OsStr]) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(repo.join("tests/rdma-core.sh"))
        .args(args)
        .output()
        .expect("running tests/rdma-core.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "tests/rdma-core.sh {args:?} failed:\n{stdout}\n{stderr}"
    );
}

/// Runs the checks and the test suite of the rdma-core `version` in the
/// chroot of `suite`, with the default completions and with completions
/// confirmed by the peer; at least `min_ok` of its tests must pass in each.
fn runs_xiw_and_its_test_suite(suite: &str, version: &str, min_ok: (usize, usize)) {
    let _g = serial();
    // Three tests register huge-page memory (the chroot shares the kernel).
    let _huge = HugePages::reserve(32);
    let out_file =
        std::env::temp_dir().join(format!("xiw-pyverbs-{suite}-{}.txt", std::process::id()));
    rdma_core_sh(&[
        suite.as_ref(),
        version.as_ref(),
        "--pyverbs".as_ref(),
        out_file.as_os_str(),
    ]);
    let placed_file = out_file.with_extension("txt.placed");
    let text = std::fs::read_to_string(&out_file).expect("the suite's output");
    let placed = std::fs::read_to_string(&placed_file).expect("the suite's output, placed");
    let _ = std::fs::remove_file(&out_file);
    let _ = std::fs::remove_file(&placed_file);
    check(
        &format!("rdma-core {version} tests"),
        &text,
        min_ok.0,
        MAY_FAIL,
    );
    check(
        &format!("rdma-core {version} tests, XIW_COMPLETION=placed"),
        &placed,
        min_ok.1,
        MAY_FAIL_PLACED,
    );
}

#[test]
fn debian_13_rdma_core_56_1_runs_xiw_and_its_test_suite() {
    runs_xiw_and_its_test_suite("trixie", "56.1", MIN_OK_56);
}

/// rdma-core 65 moved the private ABI (a new number, helpers under a new
/// symbol version, a longer ops table, `verbs_context` grown at its front).
#[test]
fn debian_unstable_rdma_core_65_0_runs_xiw_and_its_test_suite() {
    runs_xiw_and_its_test_suite("sid", "65.0", MIN_OK_65);
}
