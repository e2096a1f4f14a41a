//! xiw under the rdma-core of Debian 13 (56.1): the installed provider in a
//! trixie chroot made from Debian's archive (`pkg/chroot.sh`), driven by that
//! release's libibverbs, perftest, ibv_rc_pingpong and its own test suite
//! (`tests/rdma-core.sh`). The suite must pass but for the same tests as
//! rdma-core 44.0's (`xiw_tests::pyverbs::MAY_FAIL`). And under Debian
//! unstable's (65.0), which it does not serve yet, it must refuse cleanly.
//!
//! By hand (after a release build and `pkg/install.sh`):
//! `bash tests/rdma-core.sh trixie 56.1 --pyverbs /tmp/pyverbs.txt`.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use xiw_tests::harness::serial;
use xiw_tests::pyverbs::check;

/// Fewest of rdma-core 56.1's tests that must pass.
const MIN_OK_56: usize = 52;

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

#[test]
fn debian_13_rdma_core_56_1_runs_xiw_and_its_test_suite() {
    let _g = serial();
    let out_file = std::env::temp_dir().join(format!("xiw-pyverbs-56-{}.txt", std::process::id()));
    rdma_core_sh(&[
        "trixie".as_ref(),
        "56.1".as_ref(),
        "--pyverbs".as_ref(),
        out_file.as_os_str(),
    ]);
    let text = std::fs::read_to_string(&out_file).expect("the suite's output");
    let _ = std::fs::remove_file(&out_file);
    check("rdma-core 56.1 tests", &text, MIN_OK_56);
}

/// Debian unstable's rdma-core (65.0 today, private ABI 65) is not served yet: the
/// provider, installed under the name that libibverbs loads, must say so in
/// one line and list no device, and the `xiw` command must still work there
/// (it links no private ABI).
#[test]
fn debian_unstable_rdma_core_65_is_refused_in_one_line() {
    let _g = serial();
    // Whatever release unstable has by then: none past 56 is served.
    rdma_core_sh(&["sid".as_ref(), "-".as_ref(), "--refused".as_ref()]);
}
