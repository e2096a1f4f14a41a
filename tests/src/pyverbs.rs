//! rdma-core's own test suite (python3-pyverbs) as xiw's tests run it: the
//! tests that may fail on xiw in standalone mode, each with its reason, and
//! the parser of unittest's verbose output.

/// Tests that may fail or error on xiw in standalone mode with completions
/// confirmed by the peer (`XIW_COMPLETION=placed`), with the reason the
/// README gives.
pub const MAY_FAIL_PLACED: &[(&str, &str)] = &[
    (
        "test_cq_events_rc",
        "completion channels need the kernel module",
    ),
    (
        "test_cq_events_ud",
        "completion channels need the kernel module",
    ),
    (
        "test_get_pkey_index",
        "reads the P_Key from /sys/class/infiniband itself, not under SYSFS_PATH, where standalone mode keeps the device (the suites of 52.0 and 55.0; those of 56.1 and later ask it of InfiniBand CAs alone)",
    ),
    (
        "test_multi_process_alloc_dm",
        "Python 3.14 (Debian unstable) starts processes with forkserver, which cannot pickle pyverbs' Context: the suite fails there on any device with device memory",
    ),
    (
        "test_qp_ex_rc_flush",
        "asks for a whole-MR flush (IBV_FLUSH_MR), which has no wire form in the commit draft (section 8: still to be considered): refused with EINVAL (rdma-core 45 and later)",
    ),
];

/// Tests that may fail or error on xiw in standalone mode (by name, as
/// unittest prints it) with the default completions (once the stream takes
/// a request), with the reason the README gives.
pub const MAY_FAIL: &[(&str, &str)] = &[
    (
        "test_cq_events_rc",
        "completion channels need the kernel module",
    ),
    (
        "test_cq_events_ud",
        "completion channels need the kernel module",
    ),
    (
        "test_get_pkey_index",
        "reads the P_Key from /sys/class/infiniband itself, not under SYSFS_PATH, where standalone mode keeps the device (the suites of 52.0 and 55.0; those of 56.1 and later ask it of InfiniBand CAs alone)",
    ),
    (
        "test_qp_ex_rc_rdma_write",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_odp_rc_rdma_write",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_dm_remote_traffic",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_multi_process_alloc_dm",
        "Python 3.14 (Debian unstable) starts processes with forkserver, which cannot pickle pyverbs' Context: the suite fails there on any device with device memory",
    ),
    (
        "test_mw_type1",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_mw_ex_type1",
        "checks the responder's memory when the writer's Write completes (rdma-core 65 and later)",
    ),
    (
        "test_mw_type2",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_invalidate_mw_type1",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_mw_type2_invalidate_local",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_mw_type2_invalidate_remote",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_mw_type2_invalidate_dealloc",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_qp_ex_rc_bind_mw",
        "expects a Write the responder refuses to complete with the error; an iWARP Write completes when handed to the stream",
    ),
    (
        "test_mr_rereg_access_bad_flow",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_mr_rereg_access",
        "checks the responder's memory when the writer's Write completes",
    ),
    (
        "test_qp_ex_rc_flush",
        "checks the responder's memory when the writer's Write completes (rdma-core 45 and later)",
    ),
    (
        "test_qp_ex_rc_flush_type_violate",
        "checks the responder's memory when the writer's Write completes (rdma-core 45 and later)",
    ),
    (
        "test_mrex_rereg_access",
        "checks the responder's memory when the writer's Write completes (rdma-core 65 and later)",
    ),
    (
        "test_ro_mr_ex_traffic",
        "checks the responder's memory when the writer's Write completes (rdma-core 65 and later)",
    ),
    (
        "test_mrex_rereg_addr",
        "expects a receive that fails its local checks as IB's remote operation error at the requester (rdma-core 65 and later)",
    ),
    (
        "test_mr_rereg_pd",
        "expects a receive that fails its local checks as IB's remote operation error at the requester",
    ),
    (
        "test_mr_rereg_addr",
        "expects a receive that fails its local checks as IB's remote operation error at the requester",
    ),
];

/// What a run of the suite came to.
#[derive(Default, Debug)]
pub struct Counts {
    pub ok: usize,
    pub skipped: usize,
    /// Tests that failed or erred.
    pub failed: Vec<String>,
}

/// unittest's verbose lines: `name (module.Class.name) ... ok` (or, with a
/// docstring, the name on one line and `doc ... ok` on the next). A warning
/// printed while a test runs comes between ` ... ` and the verdict, which
/// then stands alone on a later line.
pub fn parse(out: &str) -> Counts {
    let mut c = Counts::default();
    let mut last_name = String::new();
    // A test whose ` ... ` line had no verdict yet.
    let mut waiting = false;
    for line in out.lines() {
        if let Some(name) = line
            .split(" (tests.")
            .next()
            .filter(|n| n.starts_with("test") && !n.contains(' ') && line.contains(" (tests."))
        {
            last_name = name.to_string();
        }
        let verdict = match line.rsplit_once(" ... ") {
            Some((_, v)) => {
                waiting = true;
                v
            }
            None if waiting => line.trim(),
            None => continue,
        };
        if verdict == "ok" {
            c.ok += 1;
        } else if verdict.starts_with("skipped") || verdict.starts_with("expected failure") {
            c.skipped += 1;
        } else if verdict == "FAIL" || verdict == "ERROR" {
            c.failed.push(last_name.clone());
        } else {
            continue;
        }
        waiting = false;
    }
    c
}

/// Checks a run's output (unittest's stderr): no failure outside
/// `may_fail`, at least `min_ok` tests passed, and the suite ran to its end.
/// Returns the counts, for printing.
pub fn judge(text: &str, min_ok: usize, may_fail: &[(&str, &str)]) -> Result<Counts, String> {
    let c = parse(text);
    let unexpected: Vec<&String> = c
        .failed
        .iter()
        .filter(|n| !may_fail.iter().any(|(m, _)| m == n))
        .collect();
    if !unexpected.is_empty() {
        return Err(format!("tests failed that must pass: {unexpected:?}"));
    }
    if c.ok < min_ok {
        return Err(format!("only {} tests passed, {min_ok} must", c.ok));
    }
    if !text.contains("\nRan ") {
        return Err("the suite did not run to its end".into());
    }
    Ok(c)
}

/// [`judge`], then the counts on stderr under `label`; a failure panics
/// with the whole output.
pub fn check(label: &str, text: &str, min_ok: usize, may_fail: &[(&str, &str)]) {
    match judge(text, min_ok, may_fail) {
        Ok(c) => eprintln!(
            "pyverbs ({label}): {} ok, {} skipped, {} failed or errors {:?}",
            c.ok,
            c.skipped,
            c.failed.len(),
            c.failed
        ),
        Err(e) => panic!("{e}\n{text}"),
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn parses_verbose_unittest_output() {
        let out = "\
test_a (tests.test_x.X.test_a) ... ok
test_b (tests.test_x.X.test_b)
Some docstring. ... FAIL
test_c (tests.test_x.X.test_c) ... skipped 'no'
test_d (tests.test_x.X.test_d) ... ERROR
test_e (tests.test_x.X.test_e)
Doc of e. ... /tmp/t/test_x.py:9: DeprecationWarning: randrange
  n = random.randrange(1, 2.5)
ok
test_f (tests.test_x.X.test_f) ... /tmp/t/test_x.py:9: DeprecationWarning: x
ERROR
======================================================================
ERROR: test_d (tests.test_x.X.test_d)
----------------------------------------------------------------------
Ran 6 tests in 0.1s
";
        let c = parse(out);
        assert_eq!(c.ok, 2);
        assert_eq!(c.skipped, 1);
        assert_eq!(
            c.failed,
            ["test_b", "test_d", "test_f"].map(String::from).to_vec()
        );
    }
}
