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
