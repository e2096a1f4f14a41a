//! The C test programs of `tests/c/`, built from the repository's source
//! with the installed libibverbs headers (warnings as errors) and run on the
//! shared `lo` device.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::harness::{lo_device, wait_until};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Where the programs are built.
fn build_dir() -> PathBuf {
    Path::new(REPO).join("target/xiw-c-tests")
}

/// `tests/c/NAME.c`, built once per test process.
pub fn program(name: &str) -> PathBuf {
    build("gcc", name, &["-libverbs", "-lrdmacm"])
}

/// `tests/c/NAME.c`, an MPI program, built once per test process with Open
/// MPI's compiler wrapper.
pub fn mpi_program(name: &str) -> PathBuf {
    build("mpicc", name, &[])
}

/// `tests/c/NAME.c`, a test of kernel module code that also builds in user
/// space, built once per test process with `kernel-shim/FILE.c` for each
/// `FILE` of `module` (and that directory's headers), no libraries.
pub fn module_program(name: &str, module: &[&str]) -> PathBuf {
    let mut args = vec![format!("-I{REPO}/kernel-shim")];
    args.extend(module.iter().map(|m| format!("{REPO}/kernel-shim/{m}.c")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    build("gcc", name, &args)
}

/// `tests/c/NAME.c` built with `compiler`, followed by `libs` (libraries,
/// or more sources and flags).
fn build(compiler: &str, name: &str, libs: &[&str]) -> PathBuf {
    let dir = build_dir();
    let dir = dir.as_path();
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let bin = dir.join(name);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|b| b == name) {
        return bin;
    }
    std::fs::create_dir_all(dir).unwrap();
    let out = Command::new(compiler)
        .args([
            "-std=gnu11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
        ])
        .arg("-o")
        .arg(&bin)
        .arg(format!("{REPO}/tests/c/{name}.c"))
        .args(libs)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "building {name}.c failed ({:?}):\n{}",
        out.status,
        text(&out.stderr)
    );
    built.push(name.to_string());
    bin
}

/// Runs `tests/c/NAME.c` with `args` on the `lo` device; fails the test
/// with its output unless it exits 0 within `limit`. Prints what it printed.
pub fn run(name: &str, args: &[&str], limit: Duration) {
    let dev = lo_device();
    let mut c = dev.cmd(program(name).to_str().unwrap());
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("starting the test program");
    let (out, killed) = wait_until(child, Instant::now() + limit);
    let report = format!(
        "{name} {args:?}: {:?}{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        if killed { " (killed: hung)" } else { "" },
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(!killed && out.status.success(), "{report}");
    eprintln!("{}", text(&out.stdout).trim());
}
