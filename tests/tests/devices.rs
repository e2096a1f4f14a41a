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
