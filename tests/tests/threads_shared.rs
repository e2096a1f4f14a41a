//! Every kind of thread on the same objects at once: `tests/c/xiw_shared.c`,
//! a C program on the real libibverbs, run on the shared `lo` device.
//!
//! One context and PD; A1 -> B1 (its own receive queue) and A2 -> B2 (an
//! SRQ), A1 and A2 extended QPs posted to at the same time through
//! `ibv_post_send` and through `ibv_wr_start` .. `ibv_wr_complete`; one send
//! CQ and one receive CQ for all four, polled by several threads at once
//! (one of them with `ibv_start_poll`); receives posted by several threads
//! to B1's queue and to the SRQ; and beside it MRs registered and
//! deregistered, CQs created and destroyed, QP pairs created, connected,
//! used (completing on the shared CQs) and destroyed. Every WR and receive
//! must complete exactly once with its own wr_id, every Write and Send land
//! with its bytes and nothing else change; a watchdog fails the run if a
//! thread or the traffic stops making progress for 10 s (possible deadlock).
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! gcc -O2 -pthread -o xiw_shared tests/c/xiw_shared.c -libverbs
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! ./xiw_shared 5 20000          # 5 rounds of 20000 WRs per poster, 4 posters per QP
//! ./xiw_shared 2 5000 16 4      # 16 posters per QP, 4 pollers
//! ```

use std::time::Duration;

use xiw_tests::cprog::run;
use xiw_tests::harness::serial;

#[test]
fn posters_pollers_and_churn_share_qps_srq_and_cqs() {
    let _g = serial();
    // 5 rounds of 160,000 WRs (half Sends) on the same QPs and CQs: about
    // 10 s on a 2-core machine (70 s with two busy processes beside it).
    run("xiw_shared", &["5", "20000"], Duration::from_secs(180));
}

#[test]
fn thirty_two_posters_four_pollers() {
    let _g = serial();
    // 16 posters per QP, 4 pollers: more contention on each QP's send queue
    // and on the CQs' consumers. About 5 s.
    run(
        "xiw_shared",
        &["2", "5000", "16", "4"],
        Duration::from_secs(120),
    );
}
