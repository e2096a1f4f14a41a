//! The direct verbs as a C programmer meets them, after `pkg/install.sh`: the
//! installed header, pkg-config file, link symlinks and xiwdv(3) man page, and
//! the example program `xiwdv/examples/durable_log.c` built with them and run
//! as a server/client pair on the shared `lo` device. The log file the server
//! exposes is then checked byte by byte, independently of the program.
//!
//! To rerun the example by hand (after `pkg/install.sh`):
//!
//! ```text
//! gcc -std=c11 -Wall -Wextra -o durable_log xiwdv/examples/durable_log.c \
//!     $(pkg-config --cflags --libs xiwdv)
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! ./durable_log --server --file /var/tmp/log --port 18515 &
//! ./durable_log --client 127.0.0.1 --port 18515 --records 100
//! ```

use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use xiw_tests::harness::{lo_device, port, run_pair, serial, wait_until, Pair};

const TIMEOUT: Duration = Duration::from_secs(60);
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The log layout of durable_log.c: 1 MiB, a header page (commit counter at
/// 0, magic at 8), then records.
const LOG_SIZE: usize = 1 << 20;
const LOG_HDR: usize = 4096;
const LOG_MAGIC: &[u8; 8] = b"xiwdvlog";

const SONAME: &str = "libxiw-rdmav34.so";
const MAN_DIR: &str = "/usr/share/man/man3";

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn pkg_config(args: &[&str]) -> String {
    let out = run(Command::new("pkg-config").args(args).arg("xiwdv"));
    assert!(
        out.status.success(),
        "pkg-config {args:?} xiwdv failed (is xiw installed? run pkg/install.sh): {}",
        text(&out.stderr)
    );
    text(&out.stdout).trim().to_string()
}

/// libibverbs' libdir, where install.sh puts the symlinks and xiwdv.pc.
fn libdir() -> String {
    let out = run(Command::new("pkg-config").args(["--variable=libdir", "libibverbs"]));
    let dir = text(&out.stdout).trim().to_string();
    if out.status.success() && !dir.is_empty() {
        dir
    } else {
        "/usr/lib/x86_64-linux-gnu".into()
    }
}

/// The functions xiwdv.h declares (`name(` after a return type on a line of
/// its own), in order.
fn header_functions(header: &str) -> Vec<String> {
    let mut v = Vec::new();
    for line in header.lines() {
        let Some(open) = line.find('(') else {
            continue;
        };
        let head = &line[..open];
        if head.starts_with(char::is_whitespace) || head.starts_with('#') {
            continue;
        }
        if let Some(name) = head
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .filter(|n| n.starts_with("xiwdv_"))
        {
            v.push(name.to_string());
        }
    }
    v
}

#[test]
fn pkg_config_gives_the_header_and_the_provider() {
    let flags = pkg_config(&["--cflags", "--libs"]);
    let words: Vec<&str> = flags.split_whitespace().collect();
    assert!(words.contains(&"-lxiw"), "{flags}");
    assert!(
        words.contains(&"-libverbs"),
        "Requires: libibverbs: {flags}"
    );
    let version = pkg_config(&["--modversion"]);
    assert!(
        version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "{version}"
    );
    let pc_libdir = pkg_config(&["--variable=libdir"]);
    assert_eq!(pc_libdir, libdir(), "xiwdv.pc names libibverbs' libdir");

    // The installed header is the repository's, where the compiler looks.
    let includedir = pkg_config(&["--variable=includedir"]);
    let installed = Path::new(&includedir).join("infiniband/xiwdv.h");
    let want = std::fs::read(format!("{REPO}/xiwdv/include/infiniband/xiwdv.h")).unwrap();
    let got = std::fs::read(&installed)
        .unwrap_or_else(|e| panic!("{}: {e} (run pkg/install.sh)", installed.display()));
    assert!(
        got == want,
        "{} differs from the repository's header",
        installed.display()
    );
}

/// `-lxiw` and the soname both resolve to the provider libibverbs loads, so a
/// program linked with the direct verbs shares the one provider instance.
#[test]
fn link_names_resolve_to_the_installed_provider() {
    let dir = PathBuf::from(libdir());
    let provider = dir.join("libibverbs").join(SONAME);
    let real = std::fs::metadata(&provider)
        .unwrap_or_else(|e| panic!("{}: {e} (run pkg/install.sh)", provider.display()));
    for name in [SONAME, "libxiw.so"] {
        let link = dir.join(name);
        let target = std::fs::read_link(&link)
            .unwrap_or_else(|e| panic!("{}: not a symlink: {e}", link.display()));
        assert_eq!(
            target,
            Path::new("libibverbs").join(SONAME),
            "{}",
            link.display()
        );
        let m = std::fs::metadata(&link).unwrap();
        assert_eq!(
            (m.dev(), m.ino()),
            (real.dev(), real.ino()),
            "{} is not the provider",
            link.display()
        );
    }
    if let Ok(out) = Command::new("readelf").arg("-d").arg(&provider).output() {
        let t = text(&out.stdout);
        assert!(
            t.lines()
                .any(|l| l.contains("(SONAME)") && l.contains(&format!("[{SONAME}]"))),
            "soname of {}:\n{t}",
            provider.display()
        );
    }
}

/// The installed man page `name` of section 3, plain or gzip-compressed (as
/// Debian's packages install man pages): its path and its source text.
fn installed_page(name: &str) -> (PathBuf, String) {
    let plain = Path::new(MAN_DIR).join(name);
    let gz = Path::new(MAN_DIR).join(format!("{name}.gz"));
    if gz.exists() {
        let out = run(Command::new("zcat").arg(&gz));
        assert!(
            out.status.success(),
            "zcat {}: {}",
            gz.display(),
            text(&out.stderr)
        );
        (gz, text(&out.stdout))
    } else {
        let src = std::fs::read_to_string(&plain).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (install the libxiwdv-dev package)",
                plain.display()
            )
        });
        (plain, src)
    }
}

/// groff renders the installed page, and every name under which it is
/// installed, with all warnings on and none given; each function of the
/// header has a page name and is described.
#[test]
fn man_page_renders_cleanly_under_every_function_name() {
    let (page, src) = installed_page("xiwdv.3");
    let repo_page = std::fs::read_to_string(format!("{REPO}/xiwdv/man/xiwdv.3")).unwrap();
    assert!(
        src == repo_page,
        "{} differs from the repository's",
        page.display()
    );
    // A link's name and target carry the same compression suffix.
    let suffix = if page.extension().is_some_and(|e| e == "gz") {
        ".gz"
    } else {
        ""
    };

    let header =
        std::fs::read_to_string(format!("{REPO}/xiwdv/include/infiniband/xiwdv.h")).unwrap();
    let functions = header_functions(&header);
    assert!(
        functions.len() >= 9,
        "functions found in xiwdv.h: {functions:?}"
    );

    let render = |what: &Path, source: &str| -> String {
        use std::io::Write;
        // -P-cbou: plain text, no bold or underlining to search through.
        let mut child = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-P-cbou"])
            .env("LC_ALL", "C.UTF-8")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running groff");
        child
            .stdin
            .take()
            .expect("groff's stdin")
            .write_all(source.as_bytes())
            .expect("writing to groff");
        let out = child.wait_with_output().expect("waiting for groff");
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "groff -man -ww {}: {:?}\n{}",
            what.display(),
            out.status,
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let rendered = render(&page, &src);
    let name_section: String = src
        .split(".SH SYNOPSIS")
        .next()
        .unwrap_or_default()
        .to_string();
    for f in &functions {
        assert!(name_section.contains(f.as_str()), "{f} missing from NAME");
        assert!(
            rendered.contains(&format!("{f}(")),
            "{f} is not described in xiwdv(3)"
        );
        let alias = Path::new(MAN_DIR).join(format!("{f}.3{suffix}"));
        assert_eq!(
            std::fs::read_link(&alias).unwrap_or_else(|e| panic!("{}: {e}", alias.display())),
            Path::new(&format!("xiwdv.3{suffix}")),
            "{}",
            alias.display()
        );
        let (_, alias_src) = installed_page(&format!("{f}.3"));
        assert_eq!(render(&alias, &alias_src), rendered, "{}", alias.display());
    }
    for section in [
        "SYNOPSIS",
        "DESCRIPTION",
        "RETURN VALUE",
        "ERRORS",
        "PERSISTENCE",
        "STANDALONE MODE",
        "EXAMPLE",
        "SEE ALSO",
    ] {
        assert!(
            rendered.lines().any(|l| l == section),
            "no {section} section"
        );
    }
    // man(1), when present, must agree (it adds its own preprocessing and
    // reads compressed pages itself).
    if Command::new("man").arg("--version").output().is_ok() {
        let out = run(Command::new("man")
            .args(["--warnings", "-l"])
            .arg(&page)
            .env("MANPAGER", "cat")
            .env("LC_ALL", "C.UTF-8"));
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "man --warnings -l: {:?}\n{}",
            out.status,
            text(&out.stderr)
        );
    }
}

// ---- the example program -------------------------------------------------------

/// durable_log, built once from the repository's source with the installed
/// header and pkg-config file, warnings as errors.
fn durable_log() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("xiwdv-example");
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("durable_log");
        let flags = pkg_config(&["--cflags", "--libs"]);
        let out = run(Command::new("gcc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-o"])
            .arg(&bin)
            .arg(format!("{REPO}/xiwdv/examples/durable_log.c"))
            .args(flags.split_whitespace()));
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "building durable_log.c with `{flags}` failed ({:?}):\n{}",
            out.status,
            text(&out.stderr)
        );
        bin
    })
}

/// Byte `k` of record `r` as durable_log.c fills it.
fn record(r: u64, size: usize) -> Vec<u8> {
    let seq = r + 1;
    (0..size)
        .map(|k| {
            if k < 8 {
                (seq >> (8 * k)) as u8
            } else {
                seq.wrapping_mul(131).wrapping_add(k as u64) as u8
            }
        })
        .collect()
}

/// A fresh directory for log files on a file system that msync makes durable
/// (not tmpfs, whose files the server may not register for persistence).
struct LogDir(PathBuf);

impl LogDir {
    fn new(tag: &str) -> LogDir {
        let base = ["/var/tmp", env!("CARGO_TARGET_TMPDIR")]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir() && !ram_backed(p))
            .expect("a directory on a disk-backed file system");
        let dir = base.join(format!("xiw-tests-xiwdv-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        LogDir(dir)
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        // Kept when the test failed, for a look at the log file.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// True for tmpfs and ramfs (linux/magic.h), and for what cannot be asked.
fn ram_backed(p: &Path) -> bool {
    const TMPFS_MAGIC: libc::__fsword_t = 0x0102_1994;
    const RAMFS_MAGIC: libc::__fsword_t = 0x8584_58f6;
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: struct statfs is plain integers, for which all zeroes is valid.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a structure we own, which statfs fills.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return true;
    }
    matches!(s.f_type, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// One server/client run appending `records` records of `size` bytes to `log`.
fn append(log: &Path, records: u64, size: usize) -> Pair {
    let dev = lo_device();
    let bin = durable_log().to_str().unwrap();
    let p = port();
    let mut srv = dev.cmd(bin);
    srv.arg("--server")
        .arg("--file")
        .arg(log)
        .args(["--port", &p.to_string(), "--dev", "xiw0"]);
    let mut cli = dev.cmd(bin);
    cli.args(["--client", &dev.addr, "--port", &p.to_string()])
        .args([
            "--records",
            &records.to_string(),
            "--size",
            &size.to_string(),
        ]);
    // libibverbs' log: xiw writes there why a QP failed.
    let dir = log.parent().unwrap();
    let (sl, cl) = (dir.join("server.verbs.log"), dir.join("client.verbs.log"));
    for (c, l) in [(&mut srv, &sl), (&mut cli, &cl)] {
        let _ = std::fs::write(l, b"");
        c.env("VERBS_LOG_LEVEL", "4").env("VERBS_LOG_FILE", l);
    }
    let mut pair = run_pair(srv, None, p, cli, TIMEOUT);
    pair.logs = Some((sl, cl));
    pair
}

/// Checks a successful run that appended records `first..first + n`.
fn check_run(pair: &Pair, first: u64, n: u64, size: usize) {
    let what = format!("durable_log --records {n} --size {size} (from record {first})");
    assert!(pair.ok(), "{what} failed:\n{}", pair.dump());
    for out in [&pair.server, &pair.client] {
        assert!(out.stderr.is_empty(), "{what}: stderr:\n{}", pair.dump());
    }
    let client = pair.client_out();
    let done = format!("durable_log: {n} records durable, verify ok");
    assert!(
        client.lines().any(|l| l == done),
        "{what}: no `{done}`:\n{}",
        pair.dump()
    );
    let server = format!(
        "durable_log: server: client done, commit counter {}",
        first + n
    );
    assert!(
        pair.server_out().lines().any(|l| l == server),
        "{what}: no `{server}`:\n{}",
        pair.dump()
    );
    // The CRC32c the client verified with, against an independent one.
    let mut bytes = Vec::new();
    for r in first..first + n {
        bytes.extend(record(r, size));
    }
    let want = format!(
        "durable_log: records {first}..{} of {size} bytes, crc32c {:08x}",
        first + n - 1,
        crc32c::crc32c(&bytes)
    );
    assert!(
        client.lines().any(|l| l == want),
        "{what}: no `{want}`:\n{}",
        pair.dump()
    );
}

/// Reads the log file behind the server's back: commit counter `committed`,
/// records `0..committed` exactly as the client wrote them, nothing after.
fn check_file(log: &Path, committed: u64, size: usize) {
    let f = std::fs::read(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    assert_eq!(f.len(), LOG_SIZE, "size of {}", log.display());
    // The counter is placed as the client held it: native byte order.
    let counter = u64::from_ne_bytes(f[..8].try_into().unwrap());
    assert_eq!(counter, committed, "commit counter of {}", log.display());
    assert_eq!(&f[8..16], LOG_MAGIC, "magic of {}", log.display());
    assert!(
        f[16..LOG_HDR].iter().all(|&b| b == 0),
        "header page beyond the magic"
    );
    for r in 0..committed {
        let at = LOG_HDR + r as usize * size;
        let got = &f[at..at + size];
        if got != record(r, size).as_slice() {
            let k = got
                .iter()
                .zip(record(r, size))
                .position(|(a, b)| *a != b)
                .unwrap();
            panic!(
                "record {r} of {} differs at byte {k}: {:#04x}, expected {:#04x}",
                log.display(),
                got[k],
                record(r, size)[k]
            );
        }
    }
    let end = LOG_HDR + committed as usize * size;
    assert!(
        f[end..].iter().all(|&b| b == 0),
        "bytes after the last record of {} are not zero",
        log.display()
    );
}

#[test]
fn durable_log_appends_records_and_verifies_them() {
    let _g = serial();
    let dir = LogDir::new("append");
    for (i, (n, size)) in [(100u64, 256usize), (3, 5000), (1, 8)]
        .into_iter()
        .enumerate()
    {
        let log = dir.0.join(format!("log{i}"));
        let pair = append(&log, n, size);
        check_run(&pair, 0, n, size);
        check_file(&log, n, size);
    }
}

/// A second client appends after the first one's commit counter, which the
/// server reads from the file it reopens.
#[test]
fn durable_log_appends_across_runs() {
    let _g = serial();
    let dir = LogDir::new("reopen");
    let log = dir.0.join("log");
    let size = 512;
    let mut committed = 0;
    for n in [20u64, 7, 1] {
        let pair = append(&log, n, size);
        check_run(&pair, committed, n, size);
        committed += n;
        check_file(&log, committed, size);
    }
}

/// A log on tmpfs cannot be made durable: registering it for
/// IBV_ACCESS_FLUSH_PERSISTENT fails, and the server says why with
/// xiwdv_last_error() before it ever listens.
#[test]
fn durable_log_refuses_a_log_on_tmpfs() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() || !ram_backed(shm) {
        eprintln!("skipped: no tmpfs at /dev/shm");
        return;
    }
    let _g = serial();
    let log = shm.join(format!("xiw-tests-xiwdv-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let dev = lo_device();
    let child = dev
        .cmd(durable_log().to_str().unwrap())
        .arg("--server")
        .arg("--file")
        .arg(&log)
        .args(["--port", &port().to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning durable_log");
    let (out, killed) = wait_until(child, Instant::now() + Duration::from_secs(20));
    let _ = std::fs::remove_file(&log);
    let err = text(&out.stderr);
    assert!(
        !killed,
        "the server did not refuse the tmpfs log; stderr: {err}"
    );
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    // "durable_log: xiwdv_reg_mr(PATH): <strerror>: <xiwdv_last_error()>"
    let prefix = format!("durable_log: xiwdv_reg_mr({}): ", log.display());
    let reason = err
        .lines()
        .next()
        .and_then(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split_once(": "))
        .filter(|(errno, why)| !errno.is_empty() && !why.trim().is_empty());
    assert!(
        reason.is_some(),
        "expected the refusal with xiwdv_last_error()'s reason, got: {err}"
    );
}
