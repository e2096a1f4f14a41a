//! Many application threads on one process's xiw objects, as MPI with
//! THREAD_MULTIPLE, SPDK or libfabric use them: `tests/c/xiw_threads.c`, a C
//! program on the real libibverbs, run on the shared `lo` device.
//!
//! - `qpex`: several threads build and post batches on one extended QP
//!   (`ibv_wr_start` .. `ibv_wr_complete` is a per-QP critical section).
//! - `churn`: threads create, connect and destroy QP pairs beside steady
//!   traffic; QP numbers are reused at once on both sides, so a connection
//!   must belong to one QP, not to a number.
//! - `tests/c/xiw_events.c`: async events against destroy (a destroy waits for
//!   the acknowledgement of every event the application read; unread events of
//!   a destroyed QP are never delivered).
//! - `tests/c/xiw_domains.c`: parent and thread domains (`ibv_alloc_td`,
//!   `ibv_alloc_parent_domain`): a QP, MR and CQ in a parent domain talking
//!   to a QP of the plain PD, and what the verbs refuse.
//!
//! By hand (after `pkg/install.sh`):
//!
//! ```text
//! gcc -O2 -pthread -o xiw_threads tests/c/xiw_threads.c -libverbs
//! eval "$(xiw up --netdev lo --root /run/xiw/mine)"
//! ./xiw_threads qpex 4 20000
//! ./xiw_threads churn 8 4
//! gcc -O2 -pthread -o xiw_events tests/c/xiw_events.c -libverbs && ./xiw_events 40
//! ```

use std::time::Duration;

use xiw_tests::cprog::run;
use xiw_tests::harness::serial;

#[test]
fn qpex_many_threads_one_qp() {
    let _g = serial();
    for (threads, batches) in [("4", "20000"), ("8", "8000"), ("16", "3000")] {
        run(
            "xiw_threads",
            &["qpex", threads, batches],
            Duration::from_secs(120),
        );
    }
}

#[test]
fn churn_beside_steady_traffic() {
    let _g = serial();
    // Four rounds: some of the races it guards against are timing-dependent
    // (the establishing race failed about one 8 s round in four).
    for _ in 0..4 {
        run("xiw_threads", &["churn", "8", "4"], Duration::from_secs(60));
    }
}

#[test]
fn async_events_against_destroy() {
    let _g = serial();
    run("xiw_events", &["40"], Duration::from_secs(60));
}

#[test]
fn parent_and_thread_domains() {
    // tests/c/xiw_domains.c: a QP, MR and CQ in a parent domain with a
    // thread domain, traffic with a QP of the plain PD, and the refusals.
    let _g = serial();
    run("xiw_domains", &[], Duration::from_secs(30));
}
