//! Kernel mode: the xiw kernel module (`kernel-shim/`) in Debian's own
//! kernel, booted under qemu by `tests/vm/run.sh` with the installed
//! provider and unmodified rdma-core tools in the guest.
//!
//! Each guest script (`tests/vm/guest/`) prints `ok: CHECK` or `FAIL: CHECK`
//! for every check and exits with the number of failures; a warning or oops
//! in the guest kernel's log fails the run too.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! bash tests/vm/run.sh tests/vm/guest/device.sh
//! gcc -O2 -o /tmp/xiw_channel tests/c/xiw_channel.c -libverbs
//! gcc -O2 -o /tmp/xiw_async tests/c/xiw_async.c -libverbs
//! gcc -O2 -pthread -o /tmp/xiw_events tests/c/xiw_events.c -libverbs
//! bash tests/vm/run.sh tests/vm/guest/modify_qp.sh /tmp/xiw_channel /tmp/xiw_async /tmp/xiw_events
//! ```

use std::path::PathBuf;
use std::process::Command;

use std::time::Duration;
use xiw_tests::cprog;
use xiw_tests::guest::{
    dkms_build, dkms_package_source, dkms_unbuild, guest, guest_env, guest_on, guest_run,
    kernel_headers, kernel_root, repo,
};
use xiw_tests::harness::serial;

/// The guest kernel's packages are chosen from what the archive has that
/// day (`tests/vm/kernel-choice.sh`): for each archive recorded under
/// `tests/vm/kernel-choice/` (Debian 12's of 2026-11-28, with its kbuild
/// tools republished at a later revision than the image; Debian 13's of that
/// day, whose packages name their ABI and ask for gcc-14; one in step; one
/// whose newest kernel is half published; one with no kbuild tools at all;
/// unstable's of 2026-12-01, whose image is a metapackage naming the
/// kernel's binary and module packages),
/// the chosen set, or the one line saying what is missing, is the one
/// expected.
#[test]
fn the_guest_kernel_is_chosen_from_what_the_archive_has() {
    let dir = repo().join("tests/vm/kernel-choice");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/vm/kernel-choice/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(cases.len() >= 5, "recorded archives: {cases:?}");
    for case in cases {
        let out = Command::new("bash")
            .arg(repo().join("tests/vm/kernel-choice.sh"))
            .arg("--from")
            .arg(&case)
            .output()
            .expect("running kernel-choice.sh");
        let got = format!(
            "{}{}exit {}\n",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            out.status.code().unwrap_or(-1)
        );
        let want = std::fs::read_to_string(case.join("expect.txt")).expect("expect.txt");
        assert_eq!(got, want, "the choice from {}", case.display());
    }
}

/// run.sh's boot watchdog stops only a kernel that never reaches init: a
/// guest script that runs half a minute longer than the boot may take runs
/// to its end, on the first boot, wherever the firmware's terminal codes
/// leave init's marker on its line.
#[test]
fn a_long_guest_script_outlives_the_boot_watchdog() {
    let _g = serial();
    let (_, log) = guest_run("bookworm", "long.sh", &[], &[("XIW_VM_BOOT_TIMEOUT", "60")]);
    assert!(
        log.contains("the guest reached init in") && !log.contains("booting again"),
        "not one boot that reached init:\n{log}"
    );
}

#[test]
fn the_module_is_checkpatch_clean() {
    let root = kernel_root();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("kernel-shim"))
        .expect("kernel-shim/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c" || x == "h"))
        // Not what a build in the tree generates.
        .filter(|p| !p.to_string_lossy().ends_with(".mod.c"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let out = Command::new("perl")
        .arg(root.join("src/scripts/checkpatch.pl"))
        .args(["--no-tree", "--strict", "--terse", "-f"])
        .args(&files)
        .output()
        .expect("running checkpatch.pl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.trim().is_empty(),
        "checkpatch.pl --strict on {} files:\n{text}{}",
        files.len(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `rdma link add/show/delete`, the port following its netdev, the GIDs
/// (IPv4 address, hardware address) following the netdev, `ibv_devices` and
/// `ibv_devinfo` opening the device through the kernel, removal with the
/// netdev, `rmmod` with a device present, and `rdma link delete` and `rmmod`
/// while a process holds the device open.
#[test]
fn a_device_is_added_seen_and_removed_in_the_guest() {
    let _g = serial();
    guest("device.sh", &[]);
}

/// Programs that connect by `modify_qp` (ibv_rc_pingpong, perftest without
/// `-R`) on a kernel-registered device, with completion channels the module
/// signals (`-e`, and `tests/c/xiw_channel.c`: arming, solicited-only
/// events, failed requests, two CQs on one channel), and async events
/// through the kernel (`xiw_async.c`: port down and up; `xiw_events.c`: QP
/// fatal events against destroy); the provider's own streams shared with
/// the module, which places their RDMA Writes (its count of FPDUs placed
/// grows under `ib_write_lat` and `ib_write_bw`, and not with
/// `XIW_KERNEL_PLACE=0`).
#[test]
fn modify_qp_programs_and_completion_channels_in_the_guest() {
    let _g = serial();
    guest("modify_qp.sh", &["xiw_channel", "xiw_async", "xiw_events"]);
}

/// rdma_cm in kernel mode: the module's connection manager (TCP and the MPA
/// exchange, the socket handed to the provider) under unmodified programs:
/// `rping -v -C 1000`, `ucmatose` with 4 connections, rsockets' `rstream`,
/// `riostream` and `rcopy` with data verified, a plain TCP program under
/// `LD_PRELOAD=librspreload.so` (`tests/c/xiw_tcp_echo.c`), perftest `-R`
/// (write and read latency, send and write bandwidth, atomics, and with
/// completion events), without MPA CRC (the default) and, for rping,
/// rstream and perftest, with it (the CRC both ends agreed checked, Writes
/// placed and small Sends handed up by the module with it on); MPA Replies
/// to a hand-written initiator
/// (`tests/c/xiw_mpa_peer.c`) of revision 1 and 2, with and without RFC
/// 6581, IRD 0, and each ready-to-receive message; processes killed in the
/// middle of transfers; no connection left behind, and the device and
/// module removed after.
#[test]
fn rdma_cm_programs_in_the_guest() {
    let _g = serial();
    guest("rdma_cm.sh", &["xiw_mpa_peer", "xiw_tcp_echo"]);
}

/// Every byte from the network is hostile in kernel mode too: a raw TCP
/// peer (`tests/c/xiw_hostile_peer.c`, MPA/DDP/RDMAP frames built by hand)
/// against an rdma_cm target (`tests/c/xiw_cm_target.c`, regions between
/// guard bytes), while the module places Writes from the socket. Each
/// faulty Write (unknown STag or key, one byte out of bounds either way, a
/// wrapping TO, a bad CRC, DDP version 2 and 3, RDMAP version 0, no remote
/// write right, another PD, a bad one behind or before a good one in the
/// same send) gets the Terminate standalone mode sends for it, the stream
/// ends and the target's receives are flushed; good Writes (across pages,
/// in two segments, to the region's last byte, with reserved bits set,
/// split over two TCP sends) land where they should, the module's count of
/// placed FPDUs grows for the clean ones, and no byte outside changes. With
/// CRC and, for five of them, without; no kernel warning.
#[test]
fn hostile_peers_against_kernel_placement_in_the_guest() {
    let _g = serial();
    guest("hostile.sh", &["xiw_cm_target", "xiw_hostile_peer"]);
}

/// Data integrity with the module placing Writes (`xiw-verbs-check
/// integrity`, every byte of Sends, Writes and Reads of 0 B to 1 MiB
/// checked), then the fault tests (tests/tests/faults.rs) in kernel mode: two
/// `xiw-verbs-check fault` processes on a device the module registered,
/// whose streams the provider shares with the module, which places their
/// RDMA Writes. The peer killed with SIGKILL during each kind of
/// operation; the target's region deregistered under Writes in flight (no
/// byte lands after `ibv_dereg_mr`, with and without completions confirmed
/// by the peer); the victim's TCP connection reset mid-stream (`ss -K`);
/// the victim's stream silent (nftables dropping its segments, as a link
/// down) for longer than the stream time-out (the oldest request fails with
/// IBV_WC_RETRY_EXC_ERR) and for less (nothing fails); 1% of the TCP
/// segments dropped during a checked soak and during `ib_write_bw`.
/// Every request completes once and in order with the status the fault
/// calls for, the bystander pair keeps carrying checked traffic, the module
/// placed Writes meanwhile, and the kernel logs no warning.
#[test]
fn faults_in_kernel_mode_in_the_guest() {
    let _g = serial();
    guest_on(
        "bookworm",
        "faults.sh",
        &[PathBuf::from(env!("CARGO_BIN_EXE_xiw-verbs-check"))],
    );
}

/// Wire interop with Linux's own siw (built from the kernel's source, which
/// Debian does not ship built) over a veth pair, siw in the initial network
/// namespace and xiw in another: rping with data verified and perftest -R
/// (write and read latency, send bandwidth) with each side as server and as
/// client, with MPA CRC on and off (the CRC agreed checked); the RFC 7306
/// and commit-draft operations siw does not speak fail cleanly, and the
/// requests behind them are flushed.
#[test]
fn interop_with_linux_siw_in_the_guest() {
    let _g = serial();
    guest("siw.sh", &["xiw_cm_ext", "xiw_cm_reconnect"]);
}

/// Unmodified programs through rdma_cm: fio's rdma engine (RDMA Write,
/// RDMA Read, and Send with the receiver verifying every block, plus a
/// mismatch it must catch), libfabric's fi_pingpong over the verbs provider
/// (MSG endpoints with its data checks, RDM endpoints through ofi_rxm), and
/// a two-rank MPI ping-pong with every byte checked, Open MPI 4.1 over
/// libfabric on xiw0.
#[test]
fn fio_libfabric_and_mpi_in_the_guest() {
    let _g = serial();
    guest_on(
        "bookworm",
        "programs.sh",
        &[cprog::mpi_program("xiw_mpi_pingpong")],
    );
}

/// The module from the xiw-dkms package: DKMS builds it from the source the
/// package installed on this host, for Debian 12's kernel from its headers
/// (a kernel not installed here), and the guest loads that very module (its
/// srcversion) and runs the smoke test.
#[test]
fn the_module_builds_from_the_dkms_package_and_runs() {
    let _g = serial();
    let (kver, headers) = kernel_headers();
    let version = dkms_package_source();
    let out = dkms_build(&version, &kver, &headers);
    assert!(
        out.status.success(),
        "dkms build for {kver}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let arch = std::env::consts::ARCH;
    let ko = format!("/var/lib/dkms/xiw/{version}/{kver}/{arch}/module/xiw.ko");
    let info = |field: &str| {
        let o = Command::new("modinfo")
            .args(["-F", field, &ko])
            .output()
            .expect("running modinfo");
        assert!(
            o.status.success(),
            "modinfo {ko}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let vermagic = info("vermagic");
    assert!(
        vermagic.starts_with(&format!("{kver} ")),
        "DKMS built for another kernel: {vermagic}"
    );
    assert_eq!(
        info("version"),
        version,
        "MODULE_VERSION is not the package's version"
    );
    let srcversion = info("srcversion");
    assert!(!srcversion.is_empty(), "no srcversion");
    let console = guest_env("bookworm", "smoke.sh", &[], &[("XIW_VM_MODULE", &ko)]);
    assert!(
        console.contains(&format!("xiw srcversion {srcversion}")),
        "the guest did not load DKMS's module ({srcversion}):\n{console}"
    );
    dkms_unbuild(&version, &kver);
}

/// Standalone mode has no completion channels: a CQ with one is refused
/// cleanly (or the channel itself cannot be made), on the host.
#[test]
fn standalone_mode_refuses_completion_channels() {
    let _g = serial();
    cprog::run("xiw_channel", &["standalone"], Duration::from_secs(30));
}
