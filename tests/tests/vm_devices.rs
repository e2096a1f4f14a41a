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
/// dummy0 (10.77.0.1) and, on dummy1 (10.78.0.1), first a second xiw device
/// (xiw1), then Linux's siw (siw0, built from the kernel's source), so that
/// a connection between the two devices' addresses runs through the
/// loopback. Checked in both directions, each device as server and as
/// client, the server listening on its own address and the client bound to
/// the other device's: between xiw0 and xiw1, rping -v -V with 200 pings
/// (every ping's data verified by both sides) and ibv_rc_pingpong -c
/// (4 KiB x 200, data checked; connected by modify_qp, each side naming its
/// device); between xiw0 and siw0, rping as above and ucmatose (4
/// connections x 50 messages). For each rdma_cm connection, xiw's provider
/// (XIW_DEBUG) must report its QP's stream connected with the expected
/// address, as initiator or responder. A wildcard rping server, which both
/// devices listen for on one port (xiw0 and xiw1, then xiw0 and siw0),
/// serves a client on each device's own address. Then xiw0's connects that
/// do not come up, once rdma_connect has returned: to a port nobody listens
/// on, rping gets the REJECTED event with ECONNREFUSED; to an address that
/// never answers, the UNREACHABLE event with ETIMEDOUT after 9 to 40 s; an
/// rping killed with SIGKILL while its connect is pending (its rdma_cm id
/// seen in state CONNECT) is gone within 20 s with its rdma_cm id; `rmmod
/// xiw` with a connect pending succeeds within 30 s. No rdma_cm id is left,
/// siw0 is deleted, and the guest kernel logs no warning or oops. (A client
/// on another local netdev than a wildcard listener's is not answered, by
/// xiw's listener as by siw's: the script says what it saw, unchecked.)
#[test]
fn two_devices_on_one_host_connect_both_ways_in_the_guest() {
    let _g = serial();
    guest("two_devices.sh", &[]);
}
