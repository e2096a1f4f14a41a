//! Registered memory beyond plain MRs, through the real libibverbs:
//! `tests/c/xiw_odp.c` on the shared `lo` device.
//!
//! - On-demand paging: capabilities, an ODP MR over memory not mapped yet,
//!   implicit ODP, Send/Receive, large Write and Read, atomics, every kind of
//!   access to memory unmapped under an ODP MR (the verbs error, never a
//!   fault), and `ibv_advise_mr`.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! gcc -O2 -o xiw_odp tests/c/xiw_odp.c -libverbs
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! ./xiw_odp
//! ```

use std::path::Path;
use std::time::Duration;

use xiw_tests::cprog;
use xiw_tests::harness::serial;

fn run(name: &str, args: &[&str], limit: Duration) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("xiw-c-tests");
    cprog::run(name, &dir, args, limit);
}

#[test]
fn on_demand_paging() {
    let _g = serial();
    run("xiw_odp", &[], Duration::from_secs(60));
}
