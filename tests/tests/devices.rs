//! Discovery through unmodified rdma-core tools.

use xiw_tests::harness::lo_device;

#[test]
fn ibv_devices_lists_xiw0() {
    let dev = lo_device();
    let out = dev.cmd("ibv_devices").output().expect("ibv_devices");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().next() == Some("xiw0")),
        "{text}"
    );
}

#[test]
fn ibv_devinfo_reports_iwarp_and_an_active_port() {
    let dev = lo_device();
    let out = dev
        .cmd("ibv_devinfo")
        .args(["-d", "xiw0", "-v"])
        .output()
        .expect("ibv_devinfo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("transport:\t\t\tiWARP (1)"), "{text}");
    assert!(text.contains("PORT_ACTIVE (4)"), "{text}");
    assert!(text.contains("link_layer:\t\tEthernet"), "{text}");
    assert!(
        text.contains("GID[  0]:\t\t0000:0000:0000:0000:0000:ffff:7f00:0001"),
        "{text}"
    );
}

/// Neither the installed provider nor the `xiw` command links libibverbs'
/// private ABI (`IBVERBS_PRIVATE_*`): the provider looks its helpers up when
/// it registers, so both load under any rdma-core, and the provider can say
/// itself why it does not register under one it does not serve.
#[test]
fn nothing_links_the_private_abi_of_libibverbs() {
    let provider = "/usr/lib/x86_64-linux-gnu/libibverbs/libxiw-rdmav34.so";
    let xiw = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/xiw");
    for file in [provider, xiw] {
        let out = std::process::Command::new("objdump")
            .args(["-T", file])
            .output()
            .expect("objdump");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{file}:\n{text}");
        // The provider does call public functions (the check reads symbols).
        assert!(
            file != provider || text.contains("IBVERBS_1."),
            "{file}:\n{text}"
        );
        let private: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("IBVERBS_PRIVATE"))
            .collect();
        assert!(
            private.is_empty(),
            "{file} links private symbols: {private:?}"
        );
    }
}

/// Under a libibverbs the provider does not serve it registers nothing and
/// says why in exactly one line on stderr. Debian 12's libibverbs (44.0) is
/// loaded from a copy under other file names (the file name is one of three
/// things the release is read from): as 66.0, a release not served; as 56.1,
/// a served one whose probe symbol (`ibv_wr_opcode_str`, 49 and later) it
/// lacks; as 59.0, one whose private ABI (59) it does not export; as 44.0 of
/// library version 1.15, a name that contradicts itself.
#[test]
fn an_rdma_core_not_served_is_refused_in_one_line() {
    let dev = lo_device();
    let lib = std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")
        .expect("Debian's libibverbs");
    let named = |v: &str| {
        format!("libibverbs is named as rdma-core {v}, but its symbols are not that release's")
    };
    for (file_version, why) in [
        (
            "1.14.66.0",
            "running with rdma-core 66.0; this provider serves rdma-core 39.0 to 65.x".to_owned(),
        ),
        ("1.14.56.1", named("56.1")),
        ("1.15.59.0", named("59.0")),
        ("1.15.44.0", named("44.0")),
    ] {
        let version = file_version;
        let dir =
            std::env::temp_dir().join(format!("xiw-libibverbs-{version}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let name = format!("libibverbs.so.{file_version}");
        std::fs::copy(&lib, dir.join(&name)).expect("copy libibverbs");
        std::os::unix::fs::symlink(&name, dir.join("libibverbs.so.1")).expect("symlink");
        let out = dev
            .cmd("ibv_devices")
            .env("LD_LIBRARY_PATH", &dir)
            .output()
            .expect("ibv_devices");
        let _ = std::fs::remove_dir_all(&dir);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stdout.contains("xiw0"),
            "{version}: listed\n{stdout}\n{stderr}"
        );
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("xiw")).collect();
        assert_eq!(
            lines,
            [format!("xiw: not registering: {why}")],
            "{version}:\n{stderr}"
        );
    }
}
