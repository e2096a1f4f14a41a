//! Kernel mode, several RDMA devices on one host: the xiw kernel module in
//! Debian's own kernel, booted under qemu by `tests/vm/run.sh` (see
//! `tests/tests/vm.rs`), with another RDMA device beside it in the same
//! network namespace.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! bash tests/vm/run.sh tests/vm/guest/two_devices.sh
//! ```

use xiw_tests::guest::guest;
use xiw_tests::harness::serial;

/// Two RDMA devices in one network namespace (`two_devices.sh`): xiw0 on
/// dummy0 (10.77.0.1) and, on dummy1 (10.78.0.1), a second xiw device
/// (xiw1), then Linux's siw (siw0, built from the kernel's source), so that
/// a connection between the two devices' addresses runs through the
/// loopback. Checked in both directions, each device as server and as
/// client: between xiw0 and xiw1, rping -v -V with 200 pings (every ping's
/// data verified by both sides), ib_write_lat -R (2 B x 1000, its server
/// listening on the wildcard address, its client bound with --source_ip)
/// and ibv_rc_pingpong -c (4 KiB x 200, data checked); between xiw0 and
/// siw0, rping as above, with an address-bound server and with a wildcard
/// server that xiw0 and siw0 listen for on one port, and ib_write_lat -R.
/// For each connection, xiw's provider (XIW_DEBUG) must report the stream
/// of its QP connected with the other device's address, as initiator or
/// responder as expected. Then xiw0's connects that do not come up, once
/// rdma_connect has returned: to a port nobody listens on, rping gets the
/// REJECTED event with ECONNREFUSED; to an address that never answers, the
/// UNREACHABLE event with ETIMEDOUT after 9 to 40 s; an rping killed with
/// SIGKILL while its connect is pending (its rdma_cm id seen in state
/// CONNECT) is gone within 20 s with its rdma_cm id; `rmmod xiw` with a
/// connect pending succeeds within 30 s. No rdma_cm id is left, siw0 is
/// deleted, and the guest kernel logs no warning or oops.
#[test]
fn two_devices_on_one_host_connect_both_ways_in_the_guest() {
    let _g = serial();
    guest("two_devices.sh", &[]);
}
