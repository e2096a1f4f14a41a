//! The Debian packages (`pkg/debs.sh`, which the test command runs before
//! the tests and installs on this host): what each holds, that the provider
//! and the tool in them are the release build stripped with its debug
//! symbols in xiw-dbgsym, and their whole life — install an earlier
//! version, upgrade, use, remove, purge — in clean Debian 12 and Debian 13
//! chroots (`tests/packages.sh`).
//!
//! By hand (as root, after a release build):
//!   bash pkg/debs.sh --no-build
//!   cargo test --release -p xiw-tests --test packages -- --test-threads=1

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use xiw_tests::guest::{repo, workspace_version};
use xiw_tests::harness::serial;

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { repo().join(t) })
        .unwrap_or_else(|| repo().join("target"))
}

fn arch() -> String {
    run(Command::new("dpkg").arg("--print-architecture"))
        .trim()
        .to_owned()
}

/// The packages of this build, as `pkg/debs.sh` left them in target/debian.
fn debs() -> PathBuf {
    let dir = target().join("debian");
    let v = workspace_version();
    assert!(
        dir.join(format!("xiw_{v}_{}.deb", arch())).is_file(),
        "no packages of {v} in {}: run `bash pkg/debs.sh` first (the test command does)",
        dir.display()
    );
    dir
}

/// An earlier version of the same packages to upgrade from: this build
/// packaged as VERSION~1, which sorts before VERSION.
fn earlier_debs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = target().join("debian-earlier");
        let version = format!("{}~1", workspace_version());
        run(Command::new("bash")
            .arg(repo().join("pkg/debs.sh"))
            .args(["--no-build", "--version", &version, "--out"])
            .arg(&dir));
        dir
    })
}

fn deb(name: &str) -> PathBuf {
    let v = workspace_version();
    let arch = if name == "xiw-dkms" {
        "all".into()
    } else {
        arch()
    };
    debs().join(format!("{name}_{v}_{arch}.deb"))
}

/// Every path in a package (symlinks as `path -> target`), without the
/// directories.
fn contents(deb: &Path) -> Vec<String> {
    run(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(|l| {
            let path = l.split_whitespace().skip(5).collect::<Vec<_>>().join(" ");
            path.trim_start_matches('.').to_owned()
        })
        .collect()
}

fn field(deb: &Path, name: &str) -> String {
    run(Command::new("dpkg-deb").arg("-f").arg(deb).arg(name))
        .trim()
        .to_owned()
}

/// The ELF file's GNU build id.
fn build_id(file: &Path) -> String {
    let notes = run(Command::new("readelf").arg("-n").arg(file));
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build id", file.display()))
        .to_owned()
}

fn sections(file: &Path) -> String {
    run(Command::new("readelf").arg("-S").arg("-W").arg(file))
}

#[test]
fn each_package_holds_its_files_and_the_binaries_are_the_build_stripped() {
    let xiw = contents(&deb("xiw"));
    let triplet = run(Command::new("gcc").arg("-print-multiarch"))
        .trim()
        .to_owned();
    let lib = format!("/usr/lib/{triplet}");
    let mut want = vec![
        "/usr/bin/xiw".to_owned(),
        format!("{lib}/libibverbs/libxiw-rdmav34.so"),
        "/etc/libibverbs.d/xiw.driver".to_owned(),
        "/usr/share/man/man7/xiw.7.gz".to_owned(),
        "/usr/share/man/man8/xiw.8.gz".to_owned(),
        format!("{lib}/libxiw-rdmav34.so -> libibverbs/libxiw-rdmav34.so"),
    ];
    for abi in [57, 59, 64, 65] {
        want.push(format!(
            "{lib}/libibverbs/libxiw-rdmav{abi}.so -> libxiw-rdmav34.so"
        ));
    }
    for w in &want {
        assert!(xiw.contains(w), "xiw lacks {w}: {xiw:#?}");
    }
    let dev = contents(&deb("libxiwdv-dev"));
    for w in [
        "/usr/include/infiniband/xiwdv.h".to_owned(),
        format!("{lib}/pkgconfig/xiwdv.pc"),
        format!("{lib}/libxiw.so -> libibverbs/libxiw-rdmav34.so"),
        "/usr/share/man/man3/xiwdv.3.gz".to_owned(),
        "/usr/share/man/man3/xiwdv_wr_flush.3.gz -> xiwdv.3.gz".to_owned(),
        "/usr/share/man/man7/xiwdv.7.gz".to_owned(),
    ] {
        assert!(dev.contains(&w), "libxiwdv-dev lacks {w}: {dev:#?}");
    }
    let v = workspace_version();
    let dkms = contents(&deb("xiw-dkms"));
    for f in [
        "dkms.conf",
        "kernel-shim/Kbuild",
        "kernel-shim/xiw_main.c",
        "kernel-shim/COPYING",
        "abi/include/xiw_abi.h",
    ] {
        let w = format!("/usr/src/xiw-{v}/{f}");
        assert!(dkms.contains(&w), "xiw-dkms lacks {w}: {dkms:#?}");
    }
    for p in ["xiw", "libxiwdv-dev", "xiw-dkms", "xiw-dbgsym"] {
        let copyright = format!("/usr/share/doc/{p}/copyright");
        let has = contents(&deb(p))
            .iter()
            .any(|c| c == &copyright || c.starts_with(&format!("/usr/share/doc/{p} -> ")));
        assert!(has, "{p} has no {copyright}");
    }
    // The provider loads under rdma-core 39 (Ubuntu 22.04) and later.
    let depends = field(&deb("xiw"), "Depends");
    assert!(
        depends.contains("libibverbs1 (>= 39)"),
        "xiw's Depends: {depends}"
    );
    assert!(
        field(&deb("xiw-dkms"), "Depends").contains("dkms"),
        "xiw-dkms does not depend on dkms"
    );

    // The binaries are this build's, stripped; their debug symbols are in
    // xiw-dbgsym under their build ids.
    let unpacked = tempdir("xiw-deb");
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb("xiw"))
        .arg(&unpacked));
    let dbg = tempdir("xiw-dbgsym");
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb("xiw-dbgsym"))
        .arg(&dbg));
    let built = target().join("release");
    for (packaged, build) in [
        (
            unpacked.join(format!("usr/lib/{triplet}/libibverbs/libxiw-rdmav34.so")),
            built.join("libxiw.so"),
        ),
        (unpacked.join("usr/bin/xiw"), built.join("xiw")),
    ] {
        let id = build_id(&packaged);
        assert_eq!(
            id,
            build_id(&build),
            "{} is not {}",
            packaged.display(),
            build.display()
        );
        let s = sections(&packaged);
        assert!(
            !s.contains(".debug_info") && !s.contains(" .symtab"),
            "{} is not stripped:\n{s}",
            packaged.display()
        );
        let debug = dbg.join(format!(
            "usr/lib/debug/.build-id/{}/{}.debug",
            &id[..2],
            &id[2..]
        ));
        assert!(
            sections(&debug).contains(".debug_line"),
            "{} holds no line tables",
            debug.display()
        );
        let size = std::fs::metadata(&packaged).expect("packaged file").len();
        let full = std::fs::metadata(&build).expect("built file").len();
        assert!(
            size < full / 2,
            "{} is {size} bytes, the build {full}: not stripped",
            packaged.display()
        );
    }
    let _ = std::fs::remove_dir_all(unpacked);
    let _ = std::fs::remove_dir_all(dbg);
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("making a temporary directory");
    d
}

/// tests/packages.sh in a clean chroot of `suite`: every step's check must
/// pass and each step is reported.
fn life_in(suite: &str) {
    let _g = serial();
    let out = Command::new("bash")
        .arg(repo().join("tests/packages.sh"))
        .arg(suite)
        .arg(debs())
        .arg(earlier_debs())
        .output()
        .expect("running tests/packages.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/packages.sh {suite} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in [
        "installed ",
        "upgraded to ",
        "ibv_devinfo opens xiw0",
        "pkg-config --cflags --libs xiwdv",
        "man pages",
        "removed: ",
        "purged, ",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("CHECK {suite}: ")) && l.contains(step)),
            "no check of '{step}' in:\n{stdout}"
        );
    }
    assert!(
        stdout.contains(&format!("PACKAGES {suite} ok")),
        "no verdict:\n{stdout}"
    );
}

#[test]
fn install_upgrade_remove_and_purge_on_debian_12() {
    life_in("bookworm");
}

#[test]
fn install_upgrade_remove_and_purge_on_debian_13() {
    life_in("trixie");
}
