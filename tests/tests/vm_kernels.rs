//! The kernels the module is built for: the smoke test (`tests/vm/guest/smoke.sh`:
//! load, `rdma link add`, `ibv_rc_pingpong -e`, rping over rdma_cm, `rdma
//! link delete`, `rmmod`, and a kernel log without a warning or oops) on
//! each kernel Debian's archive offers besides Debian 12's own 6.1 (which
//! every test of `tests/tests/vm.rs` boots), and the refusal, at build
//! time, of kernels older than the oldest one tested (6.1).
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! XIW_VM_SUITE=trixie bash tests/vm/run.sh tests/vm/guest/smoke.sh
//! XIW_VM_SUITE=sid bash tests/vm/run.sh tests/vm/guest/smoke.sh
//! XIW_VM_SUITE=bookworm-backports bash tests/vm/run.sh tests/vm/guest/smoke.sh
//! ```

use std::path::Path;
use std::process::Command;

use xiw_tests::guest::{bash, dkms_build, dkms_package_source, guest_on, kernel_headers, repo};
use xiw_tests::harness::{last_line, notice, serial};

/// The release (`uname -r`) of the kernel `tests/vm/kernel.sh` fetches for
/// `suite`, which `tests/vm/run.sh` then boots.
fn kernel_of(suite: &str) -> String {
    let root = bash("tests/vm/kernel.sh", &[suite.as_ref()]);
    Path::new(&root)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("the kernel's release")
        .to_owned()
}

/// The upstream major and minor version of a kernel release ("6.12" of
/// "6.12.95+deb12-amd64").
fn major_minor(kver: &str) -> (u32, u32) {
    let mut parts = kver.split(|c: char| !c.is_ascii_digit());
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("a kernel release: {kver}"))
    };
    (next(), next())
}

/// Boots `suite`'s kernel with the smoke test; the kernel it booted.
fn smoke(suite: &str) -> String {
    let kver = kernel_of(suite);
    let console = guest_on(suite, "smoke.sh", &[]);
    assert!(
        console
            .lines()
            .any(|l| l.trim() == format!("kernel {kver}")),
        "the guest did not boot {suite}'s kernel {kver}:\n{console}"
    );
    kver
}

/// Debian 13's kernel (6.12): the module builds for it in the Debian 13
/// chroot, with that release's compiler.
#[test]
fn debian_13_kernel_smoke() {
    let _g = serial();
    let kver = smoke("trixie");
    assert!(
        kver.contains("+deb13-") && major_minor(&kver) == (6, 12),
        "not Debian 13's 6.12 kernel: {kver}"
    );
}

/// Debian 12's backports (bookworm-backports): a newer kernel built for
/// Debian 12 (today 6.12), whose build tools run on this host.
#[test]
fn bookworm_backports_kernel_smoke() {
    let _g = serial();
    let kver = smoke("bookworm-backports");
    assert!(
        kver.contains("+deb12-") && major_minor(&kver) > (6, 1),
        "not a backported kernel of Debian 12, newer than its 6.1: {kver}"
    );
}

/// Debian unstable's kernel (today 7.2), newer than any Debian release's:
/// the module builds for it in the unstable chroot (its compiler) and runs
/// the smoke test. Unstable itself may be not installable for a day or two
/// (a transition under way): then a notice instead.
#[test]
fn unstable_kernel_smoke() {
    let _g = serial();
    let out = Command::new("bash")
        .arg(repo().join("pkg/chroot.sh"))
        .arg("sid")
        .output()
        .expect("running pkg/chroot.sh");
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        let last = last_line(&why);
        return notice(&format!(
            "Debian unstable could not be installed today, so its kernel was not booted: {last} \
             (pkg/chroot.sh sid; a transition in unstable usually ends within days)"
        ));
    }
    let kver = smoke("sid");
    assert!(
        major_minor(&kver) > (6, 12),
        "unstable's kernel {kver} is not newer than Debian 13's 6.12"
    );
}

/// Below 6.1 the build stops in `kernel-shim/Kbuild` with one line naming
/// the kernel, before anything is compiled: the kernel's own build system
/// (Debian 12's headers) told that it is 4.19, 5.10 or 6.0 through its
/// VERSION and PATCHLEVEL.
#[test]
fn the_module_build_refuses_kernels_below_6_1() {
    let (_, headers) = kernel_headers();
    for (version, patchlevel) in [("4", "19"), ("5", "10"), ("6", "0")] {
        let work = tempdir();
        let build = work.join("build");
        std::fs::create_dir_all(&build).expect("the build directory");
        std::fs::create_dir_all(work.join("abi/include")).expect("abi/include");
        for e in std::fs::read_dir(repo().join("kernel-shim")).expect("kernel-shim/") {
            let p = e.expect("kernel-shim/").path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name == "Kbuild"
                || name == "Makefile"
                || name.ends_with(".c")
                || name.ends_with(".h")
            {
                std::fs::copy(&p, build.join(name)).expect("copying the module's source");
            }
        }
        std::fs::copy(
            repo().join("abi/include/xiw_abi.h"),
            work.join("abi/include/xiw_abi.h"),
        )
        .expect("copying xiw_abi.h");
        let out = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(&headers)
            .arg(format!("M={}", build.display()))
            .arg(format!("VERSION={version}"))
            .arg(format!("PATCHLEVEL={patchlevel}"))
            .arg("modules")
            .output()
            .expect("running make");
        let err = String::from_utf8_lossy(&out.stderr);
        let ours: Vec<&str> = err.lines().filter(|l| l.contains("*** xiw:")).collect();
        let want = format!("xiw: Linux {version}.{patchlevel} is older than 6.1");
        assert!(
            !out.status.success() && ours.len() == 1 && ours[0].contains(&want),
            "{version}.{patchlevel}: not one line saying \"{want}\" (exit {:?}):\n{err}",
            out.status.code()
        );
        let objects: Vec<String> = std::fs::read_dir(&build)
            .expect("the build directory")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".o") || n.ends_with(".ko"))
            .collect();
        assert!(
            objects.is_empty() && !err.contains("error:"),
            "{version}.{patchlevel}: something was compiled before the refusal: {objects:?}\n{err}"
        );
        std::fs::remove_dir_all(&work).expect("removing the build directory");
    }
}

/// DKMS (Debian 12's, with the xiw-dkms package's dkms.conf) refuses to build
/// for a kernel below 6.1 (exit 77, its BUILD_EXCLUSIVE answer), and has no
/// upper bound: for 6.1 and for kernels newer than any tested it goes on to
/// look for their headers (here absent, so it fails there, not at the
/// exclusion).
#[test]
fn dkms_refuses_kernels_below_6_1_and_no_newer_ones() {
    let _g = serial();
    let (kver, headers) = kernel_headers();
    let version = dkms_package_source();
    let build = |k: &str, dir: &Path| {
        let out = dkms_build(&version, k, dir);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    for old in ["4.19.0-27-amd64", "5.10.0-30-amd64", "6.0.12-1-amd64"] {
        let (code, text) = build(old, &headers);
        assert!(
            code == Some(77) && text.contains("BUILD_EXCLUSIVE"),
            "dkms built for {old} (exit {code:?}):\n{text}"
        );
    }
    let absent = Path::new("/nonexistent/xiw-kernel-headers");
    for newer in [
        kver.as_str(),
        "6.12.95+deb12-amd64",
        "7.2.13+deb14-amd64",
        "10.0.0-1-amd64",
    ] {
        let (code, text) = build(newer, absent);
        assert!(
            code != Some(77)
                && code != Some(0)
                && !text.contains("BUILD_EXCLUSIVE")
                && text.contains("cannot be found"),
            "dkms did not go on to look for {newer}'s headers (exit {code:?}):\n{text}"
        );
    }
}

/// A fresh directory under /tmp.
fn tempdir() -> std::path::PathBuf {
    let out = Command::new("mktemp")
        .args(["-d", "/tmp/xiw-kbuild.XXXXXX"])
        .output()
        .expect("running mktemp");
    assert!(out.status.success(), "mktemp -d failed");
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
