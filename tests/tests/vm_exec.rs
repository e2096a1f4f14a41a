//! `xiw exec` on a kernel with the RDMA core: Debian 12's own kernel under
//! qemu (`tests/vm/guest/exec.sh`), ib_core and the RDMA modules loaded and
//! a kernel-mode xiw device present.

use xiw_tests::guest::guest;
use xiw_tests::harness::serial;

/// With ib_core loaded (so libibverbs lists devices through RDMA netlink):
/// `xiw up` says to use `xiw exec` and makes no node; through `xiw exec`,
/// as root and as an unprivileged user (whose provider comes from their own
/// directory, with no driver file in /etc/libibverbs.d), `ibv_devices`
/// lists the tree's device and not the kernel's, `rdma` (RDMA netlink)
/// fails while `ip` (route netlink) works, and `ib_write_lat` and
/// `ibv_rc_pingpong` run between two such processes; outside, the
/// kernel-mode device is still listed and opened and /dev/infiniband is as
/// it was.
#[test]
fn xiw_exec_with_the_rdma_core_loaded_in_the_guest() {
    let _g = serial();
    guest("exec.sh", &[]);
}
