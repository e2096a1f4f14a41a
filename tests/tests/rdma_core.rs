//! xiw under the rdma-core of Debian 13 (56.x, private ABI 34) and of Debian
//! unstable (65.0 when written, private ABI 65): the installed provider in a
//! chroot of each made from Debian's archive (`pkg/chroot.sh`), driven by
//! that release's libibverbs, perftest, ibv_rc_pingpong and its own test
//! suite (`tests/rdma-core.sh`). The suite must pass but for the tests listed
//! in `xiw_tests::pyverbs::MAY_FAIL`.
//!
//! The archive moves: whatever release a chroot has, if xiw serves it, every
//! check is a hard one. A release newer than any xiw serves (unstable moving
//! on) is not a failure of the change under test: the test checks that the
//! provider refuses that release with its one line, and says loudly, in the
//! test command's summary, which release it is and what to do.
//!
//! Releases no Debian suite has run from libibverbs built from the source
//! trees that crates.io and PyPI carry (52.0, 55.0, 57.0, 59.0; 57.0 and
//! 59.0 also with the pyverbs and test suite of the same tree, judged as the
//! chroots' are), or from the builds PyPI wheels carry (39.0, 48.0), which
//! carry no test suite of their release.
//!
//! By hand (after a release build and `pkg/install.sh`):
//! `bash tests/rdma-core.sh trixie 56.1 --pyverbs /tmp/pyverbs.txt`,
//! `bash tests/rdma-core.sh --built 59.0 --pyverbs /tmp/pyverbs.txt`.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use xiw_abi::driver::{Layout, NEWEST};
use xiw_tests::harness::{last_line, notice, serial, HugePages};
use xiw_tests::pyverbs::{check, MAY_FAIL, MAY_FAIL_PLACED};

/// Fewest of each release's tests that must pass, with the default
/// completions and with completions confirmed by the peer, by rdma-core's
/// major version: as measured with 56.1 and 65.0 in the chroots; for 52.0,
/// 55.0, 57.0 and 59.0, built from source, the tests that neither skip nor
/// are in the lists of those that may fail (some of those pass in one run
/// and not the next: 84 to 90 passed with the default completions).
const MIN_OK: &[(u32, (usize, usize))] = &[
    (52, (83, 98)),
    (55, (84, 99)),
    (56, (86, 101)),
    (57, (85, 100)),
    (59, (85, 100)),
    (65, (101, 120)),
];

/// [`MIN_OK`] of rdma-core `major`.
fn min_ok(major: u32) -> (usize, usize) {
    MIN_OK
        .iter()
        .find(|(m, _)| *m == major)
        .map(|(_, n)| *n)
        .unwrap_or_else(|| panic!("no pass counts for rdma-core {major} in MIN_OK"))
}

/// Runs the repository's bash `script` with `args`.
fn bash(script: &str, args: &[&OsStr]) -> Output {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    Command::new("bash")
        .arg(repo.join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"))
}

/// Runs `tests/rdma-core.sh` with `args`; fails the test with its output
/// unless it succeeds. Prints what it printed.
fn rdma_core_sh(args: &[&OsStr]) {
    let out = bash("tests/rdma-core.sh", args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "tests/rdma-core.sh {args:?} failed:\n{stdout}\n{stderr}"
    );
}

/// The rdma-core release in the chroot of `suite` (made if need be), from
/// its libibverbs' file name, as (major, minor); or why the chroot could not
/// be made.
fn release_in(suite: &str) -> Result<(u32, u32), String> {
    let out = bash("pkg/chroot.sh", &[suite.as_ref()]);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let root = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let lib = Path::new(&root).join("usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    let real = std::fs::canonicalize(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    let name = real.file_name().and_then(|n| n.to_str()).unwrap_or("");
    // libibverbs.so.1.<library minor>.<major>.<minor>
    let parts: Vec<u32> = name
        .strip_prefix("libibverbs.so.1.")
        .map(|v| v.split('.').filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default();
    match parts[..] {
        [_, major, minor] => Ok((major, minor)),
        _ => panic!("cannot read the rdma-core release of {}", real.display()),
    }
}

/// xiw under the rdma-core of the chroot of `suite` (`what` names the
/// suite for messages): every check and the release's own test suite if xiw
/// serves the release; if the release is newer than any xiw serves, the
/// provider's refusal of it, and a notice. A suite that is `unstable` may
/// also be not installable on the day (a notice too); any other must be.
fn runs_xiw_under(suite: &str, what: &str, unstable: bool) {
    let _g = serial();
    let (major, minor) = match release_in(suite) {
        Ok(r) => r,
        Err(why) if unstable => {
            let last = last_line(&why);
            return notice(&format!(
                "{what} could not be installed today, so xiw was not run under its rdma-core: \
                 {last} (pkg/chroot.sh {suite}; a transition in unstable usually ends within days)"
            ));
        }
        Err(why) => panic!("pkg/chroot.sh {suite}: {why}"),
    };
    let version = format!("{major}.{minor}");
    if Layout::of(major).is_some() {
        return runs_xiw_and_its_test_suite(&[suite, &version], &version, min_ok(major));
    }
    assert!(
        major > NEWEST,
        "{what} has rdma-core {version}, which xiw does not serve ({}) and which is not newer",
        Layout::known()
    );
    rdma_core_sh(&[suite.as_ref(), version.as_ref(), "--refused".as_ref()]);
    notice(&format!(
        "{what} now has rdma-core {version}, newer than any release xiw serves ({}): the \
         provider refuses it (checked), and its checks did not run. To serve it, add its \
         private layout (docs/rdma-core.md, \"To add a release\").",
        Layout::known()
    ));
}

/// Runs `tests/rdma-core.sh` with `which` (a chroot's suite and the
/// release expected there, or `--built` and a release) and `--pyverbs`: the
/// checks and the test suite of the rdma-core `version`, with the default
/// completions and with completions confirmed by the peer; at least `min_ok`
/// of its tests must pass in each.
fn runs_xiw_and_its_test_suite(which: &[&str], version: &str, min_ok: (usize, usize)) {
    // Three tests register huge-page memory (a chroot shares the kernel).
    let _huge = HugePages::reserve(32);
    let out_file = std::env::temp_dir().join(format!(
        "xiw-pyverbs-{}-{}.txt",
        which.join("-").trim_start_matches('-'),
        std::process::id()
    ));
    let mut args: Vec<&OsStr> = which.iter().map(OsStr::new).collect();
    args.extend([OsStr::new("--pyverbs"), out_file.as_os_str()]);
    rdma_core_sh(&args);
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

/// Debian 13's rdma-core (56.1 at its release; a point release may bring
/// another 56.x, which xiw serves alike).
#[test]
fn debian_13_rdma_core_runs_xiw_and_its_test_suite() {
    runs_xiw_under("trixie", "Debian 13 (trixie)", false);
}

/// Debian unstable's rdma-core (65.0 when written: it moved the private ABI
/// to a new number, helpers under a new symbol version, a longer ops table,
/// `verbs_context` grown at its front).
#[test]
fn debian_unstable_rdma_core_runs_xiw_and_its_test_suite() {
    runs_xiw_under("sid", "Debian unstable (sid)", true);
}

/// The releases built from source whose own test suite (the tree's pyverbs
/// and tests/) runs too: all four. 57.0's and 59.0's layouts (57-58, 59-61)
/// no chroot's suite covers; 52.0's and 55.0's is 56.1's, whose suite the
/// Debian 13 chroot runs, but their own suites differ from it. Their
/// pyverbs builds cost about a minute each from empty caches.
const BUILT_WITH_SUITE: &[&str] = &["52.0", "55.0", "57.0", "59.0"];

/// rdma-core releases no Debian suite has, built from the source trees that
/// crates.io and PyPI carry or taken from the builds PyPI wheels carry
/// (`tests/rdma-core-build.sh`), run by Debian 12's own perftest,
/// ibv_rc_pingpong and the integrity check (`tests/rdma-core.sh --built`);
/// those in [`BUILT_WITH_SUITE`] also run their tree's test suite with the
/// pyverbs built beside the library, judged as the chroots' are. The wheels
/// carry no test suite (rdma-core's tests/), and the pyverbs one of them
/// carries is another release's (56.0rc1), built for Python 3.10.
fn runs_xiw_built(version: &str) {
    let _g = serial();
    if BUILT_WITH_SUITE.contains(&version) {
        let major = version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .expect("a release MAJOR.MINOR");
        return runs_xiw_and_its_test_suite(&["--built", version], version, min_ok(major));
    }
    rdma_core_sh(&["--built".as_ref(), version.as_ref()]);
}

/// 39.0 (Ubuntu 22.04's build, carried by a PyPI wheel): `ibv_qp_ex` ends
/// with `wr_abort`, so libibverbs reads `verbs_qp.comp_mask` at 344.
#[test]
fn rdma_core_39_0_prebuilt_runs_xiw() {
    runs_xiw_built("39.0");
}

/// 48.0 (a RHEL 8 build, carried by a PyPI wheel): `wr_flush`, no
/// `ibv_wr_opcode_str`.
#[test]
fn rdma_core_48_0_prebuilt_runs_xiw() {
    runs_xiw_built("48.0");
}

/// 52.0 (crates.io, ibverbs-sys 0.2.1): private ABI 34, with `wr_flush`
/// and `ibv_wr_opcode_str`.
#[test]
fn rdma_core_52_0_built_from_source_runs_xiw() {
    runs_xiw_built("52.0");
}

/// 55.0 (crates.io, ibverbs-sys 0.3.2): private ABI 34, with
/// `ibv_cmd_create_cq_ex2`.
#[test]
fn rdma_core_55_0_built_from_source_runs_xiw() {
    runs_xiw_built("55.0");
}

/// 57.0 (PyPI, pyverbs 57.0): private ABI 57, `ibv_cmd_get_context` with
/// its `fd_arr`.
#[test]
fn rdma_core_57_0_built_from_source_runs_xiw() {
    runs_xiw_built("57.0");
}

/// 59.0 (PyPI, pyverbs 59.0): private ABI 59, library version 1.15,
/// `verbs_context` three entries longer at its front, 79 ops.
#[test]
fn rdma_core_59_0_built_from_source_runs_xiw() {
    runs_xiw_built("59.0");
}
