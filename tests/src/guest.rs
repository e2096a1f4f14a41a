//! Kernel mode's tests boot Debian's own kernel under qemu
//! (`tests/vm/run.sh`) with a guest script of `tests/vm/guest/`; these are
//! the pieces every such test file shares.
//!
//! Each guest script prints `ok: CHECK` or `FAIL: CHECK` for every check and
//! exits with the number of failures; a warning or oops in the guest
//! kernel's log fails the run too.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cprog::program;

/// The repository's top directory.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// Runs the repository's bash `script` with `args`; its standard output,
/// trimmed, once it succeeded.
pub fn bash(script: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new("bash")
        .arg(repo().join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The unpacked Debian 12 kernel (`tests/vm/kernel.sh`).
pub fn kernel_root() -> PathBuf {
    PathBuf::from(bash("tests/vm/kernel.sh", &[]))
}

/// Debian 12's kernel as [`kernel_root`] unpacks it: its release (the root's
/// name) and its headers, which out-of-tree modules are built against.
pub fn kernel_headers() -> (String, PathBuf) {
    let root = kernel_root();
    let kver = root
        .file_name()
        .and_then(|n| n.to_str())
        .expect("the kernel's release")
        .to_owned();
    let headers = root.join(format!("usr/src/linux-headers-{kver}"));
    (kver, headers)
}

/// The workspace's version (Cargo.toml), which the module and its DKMS
/// package carry.
pub fn workspace_version() -> String {
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).expect("reading Cargo.toml");
    cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the workspace's version")
        .to_owned()
}

/// The module's source as the xiw-dkms package installed it on this host
/// (the test command installs the packages of this build): the package is
/// installed at the workspace's version and owns /usr/src/xiw-VERSION,
/// which DKMS knows. The version is returned, for `dkms build -m xiw -v`.
pub fn dkms_package_source() -> String {
    let version = workspace_version();
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${Version} ${Status}", "xiw-dkms"])
        .output()
        .expect("running dpkg-query");
    let installed = String::from_utf8_lossy(&installed.stdout).into_owned();
    assert_eq!(
        installed,
        format!("{version} install ok installed"),
        "xiw-dkms {version} is not installed here (bash pkg/debs.sh, then dpkg -i target/debian/*.deb)"
    );
    let conf = format!("/usr/src/xiw-{version}/dkms.conf");
    let owner = Command::new("dpkg")
        .args(["-S", &conf])
        .output()
        .expect("running dpkg -S");
    assert!(
        String::from_utf8_lossy(&owner.stdout).starts_with("xiw-dkms: "),
        "{conf} is not xiw-dkms's: {}",
        String::from_utf8_lossy(&owner.stderr)
    );
    let status = Command::new("dkms")
        .args(["status", "-m", "xiw", "-v", &version])
        .output()
        .expect("running dkms status");
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&format!("xiw/{version}")),
        "DKMS does not know xiw/{version} (dkms status: {})",
        String::from_utf8_lossy(&status.stdout)
    );
    version
}

/// `dkms build` of the package's source `version` for `kver`, against the
/// kernel headers in `dir` (a kernel not installed here).
pub fn dkms_build(version: &str, kver: &str, dir: &Path) -> std::process::Output {
    Command::new("dkms")
        .args([
            "build",
            "-m",
            "xiw",
            "-v",
            version,
            "-k",
            kver,
            "--kernelsourcedir",
        ])
        .arg(dir)
        .output()
        .expect("running dkms build")
}

/// Takes the build for `kver` out of DKMS again, leaving the package's
/// source added as its installation left it.
pub fn dkms_unbuild(version: &str, kver: &str) {
    let out = Command::new("dkms")
        .args(["remove", "-m", "xiw", "-v", version, "-k", kver])
        .output()
        .expect("running dkms remove");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || text.contains("is not"),
        "dkms remove -k {kver}: {text}"
    );
    if !String::from_utf8_lossy(
        &Command::new("dkms")
            .args(["status", "-m", "xiw", "-v", version])
            .output()
            .expect("running dkms status")
            .stdout,
    )
    .contains(&format!("xiw/{version}"))
    {
        let add = Command::new("dkms")
            .args(["add", "-m", "xiw", "-v", version])
            .output()
            .expect("running dkms add");
        assert!(
            add.status.success(),
            "dkms add: {}",
            String::from_utf8_lossy(&add.stderr)
        );
    }
}

/// Boots the guest with `script` (and the C test `programs` of `tests/c/`)
/// and checks that every one of its checks passed. Debian 12's kernel.
pub fn guest(script: &str, programs: &[&str]) -> String {
    let built: Vec<PathBuf> = programs.iter().map(|p| program(p)).collect();
    guest_on("bookworm", script, &built)
}

/// As [`guest`], on the kernel of Debian release `suite`, with the
/// programs at `programs`.
pub fn guest_on(suite: &str, script: &str, programs: &[PathBuf]) -> String {
    guest_env(suite, script, programs, &[])
}

/// As [`guest_on`], with `env` set for `tests/vm/run.sh`.
pub fn guest_env(suite: &str, script: &str, programs: &[PathBuf], env: &[(&str, &str)]) -> String {
    guest_run(suite, script, programs, env).0
}

/// As [`guest_env`]; the guest's console and what `tests/vm/run.sh` said
/// of the boot.
pub fn guest_run(
    suite: &str,
    script: &str,
    programs: &[PathBuf],
    env: &[(&str, &str)],
) -> (String, String) {
    let path = repo().join("tests/vm/guest").join(script);
    let text = std::fs::read_to_string(&path).expect("reading the guest script");
    // The script's own count (`# checks: N`) where checks run in loops;
    // otherwise one per `check` line.
    let checks = text
        .lines()
        .find_map(|l| l.strip_prefix("# checks: "))
        .map(|n| {
            n.split_whitespace()
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .expect("a number after `# checks:`")
        })
        .unwrap_or_else(|| {
            text.lines()
                .filter(|l| l.trim_start().starts_with("check \""))
                .count()
        });
    let out = Command::new("bash")
        .env("XIW_VM_SUITE", suite)
        .envs(env.iter().copied())
        .arg(repo().join("tests/vm/run.sh"))
        .arg(&path)
        .args(programs)
        .output()
        .expect("running tests/vm/run.sh");
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    let failed: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("FAIL: "))
        .collect();
    let passed = console.lines().filter(|l| l.starts_with("ok: ")).count();
    assert!(
        out.status.success() && failed.is_empty() && passed == checks,
        "guest {script} ({suite}): exit {:?}, {passed} of {checks} checks passed, failed: {failed:?}\n\
         --- console ---\n{console}\n--- run.sh ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    (console, String::from_utf8_lossy(&out.stderr).into_owned())
}
