//! Registered memory beyond plain MRs, through the real libibverbs:
//! `tests/c/xiw_odp.c`, `tests/c/xiw_mw.c` and `tests/c/xiw_dm.c` on the
//! shared `lo` device.
//!
//! - On-demand paging: capabilities, an ODP MR over memory not mapped yet,
//!   implicit ODP, Send/Receive, large Write and Read, atomics, every kind of
//!   access to memory unmapped under an ODP MR (the verbs error, never a
//!   fault), and `ibv_advise_mr`.
//! - Memory windows, types 1 and 2: binding (`ibv_bind_mw`, `IBV_WR_BIND_MW`,
//!   `ibv_wr_bind_mw`), access through a window checked against its bounds,
//!   rights, key and (type 2) QP, invalidation (Local Invalidate, Send with
//!   Invalidate, unbinding, freeing) and the refusals.
//! - Device memory: allocation limits, aligned copies, zero-based MRs on it
//!   that peers write and read and Sends gather from.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! gcc -O2 -o xiw_odp tests/c/xiw_odp.c -libverbs
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! ./xiw_odp
//! gcc -O2 -o xiw_mw tests/c/xiw_mw.c -libverbs && ./xiw_mw
//! gcc -O2 -o xiw_dm tests/c/xiw_dm.c -libverbs && ./xiw_dm
//! ```

use std::time::Duration;

use xiw_tests::cprog::run;
use xiw_tests::harness::serial;

#[test]
fn on_demand_paging() {
    let _g = serial();
    run("xiw_odp", &[], Duration::from_secs(60));
}

#[test]
fn memory_windows() {
    let _g = serial();
    run("xiw_mw", &[], Duration::from_secs(60));
}

#[test]
fn device_memory() {
    let _g = serial();
    run("xiw_dm", &[], Duration::from_secs(60));
}
