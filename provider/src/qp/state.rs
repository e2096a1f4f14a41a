//! modify_qp: the QP state machine (IB verbs semantics, as iWARP verbs use them).

use std::sync::atomic::Ordering;

use xiw_abi::verbs::*;

use crate::error::Error;
use crate::log;
use crate::qp::{Qp, MAX_RD_ATOMIC};
use crate::sysfs_tree;

/// Whether `cur` -> `new` is a transition. In kernel mode, rdma_cm's too:
/// its move to RTS of an iWARP QP names no state (the RNIC moves it once the
/// stream is up), so attributes change in any state; rdma_disconnect moves
/// the QP to SQD, the graceful close (the connection manager then ends the
/// stream after what is queued, and the QP goes on to the error state).
fn allowed(cur: u32, new: u32, kernel: bool) -> bool {
    matches!(
        (cur, new),
        (_, IBV_QPS_RESET)
            | (_, IBV_QPS_ERR)
            | (IBV_QPS_RESET, IBV_QPS_INIT)
            | (IBV_QPS_INIT, IBV_QPS_INIT)
            | (IBV_QPS_INIT, IBV_QPS_RTR)
            | (IBV_QPS_RTR, IBV_QPS_RTS)
            | (IBV_QPS_RTS, IBV_QPS_RTS)
    ) || kernel && (cur == new || new == IBV_QPS_SQD && matches!(cur, IBV_QPS_RTS | IBV_QPS_SQD))
}

/// Moves the QP from `cur` to `new`, unless another thread changed its state
/// (a failure found by the progress thread) since `cur` was read.
fn advance(qp: &Qp, cur: u32, new: u32) -> Result<(), Error> {
    qp.state
        .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
        .map(drop)
        .map_err(|_| Error::invalid("the QP's state changed meanwhile"))
}

/// Applies `attr` under `mask`; returns the new state.
pub fn modify(qp: &Qp, attr: &ibv_qp_attr, mask: u32) -> Result<u32, Error> {
    let sh = &qp.sh;
    let (cur, new) = transition_of(qp, attr, mask)?;
    check_attrs(attr, mask)?;
    let to_rtr = cur == IBV_QPS_INIT && new == IBV_QPS_RTR;
    // Kernel mode: RTR without the peer's address is rdma_cm's (librdmacm
    // moves the QP through RTR and RTS as the connection manager says); the
    // stream then comes from the kernel module.
    let by_cm = sh.kernel.is_some() && mask & IBV_QP_AV == 0;
    if to_rtr && !by_cm {
        check_peer(qp, attr, mask)?;
    }
    apply_attrs(qp, attr, mask);
    if new == cur {
        return Ok(new);
    }
    enter(qp, attr, cur, new, by_cm)
}

/// The QP's state and the one `attr` moves it to, checked to be a
/// transition the QP may make.
fn transition_of(qp: &Qp, attr: &ibv_qp_attr, mask: u32) -> Result<(u32, u32), Error> {
    let sh = &qp.sh;
    let cur = qp.state();
    let new = if mask & IBV_QP_STATE != 0 {
        attr.qp_state
    } else {
        cur
    };
    if mask & IBV_QP_CUR_STATE != 0 && attr.cur_qp_state != cur {
        return Err(Error::invalid("cur_qp_state is not the QP's state"));
    }
    if !allowed(cur, new, sh.kernel.is_some()) {
        log::debug(
            &sh.log,
            format_args!("modify_qp: {cur} -> {new} is not a valid transition"),
        );
        return Err(Error::invalid(format!(
            "{cur} -> {new} is not a valid transition"
        )));
    }
    Ok((cur, new))
}

/// Checks the attributes `mask` names against what the device has.
fn check_attrs(attr: &ibv_qp_attr, mask: u32) -> Result<(), Error> {
    if mask & IBV_QP_PORT != 0 && attr.port_num != 1 {
        return Err(Error::invalid("the device has port 1 only"));
    }
    if mask & IBV_QP_PKEY_INDEX != 0 && attr.pkey_index != 0 {
        return Err(Error::invalid("the port has P_Key index 0 only"));
    }
    if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 && attr.max_rd_atomic as u32 > MAX_RD_ATOMIC {
        return Err(Error::invalid("max_rd_atomic exceeds the device's"));
    }
    if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 && attr.max_dest_rd_atomic as u32 > MAX_RD_ATOMIC {
        return Err(Error::invalid("max_dest_rd_atomic exceeds the device's"));
    }
    let unsupported =
        IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY | IBV_QP_RATE_LIMIT;
    if mask & unsupported != 0 {
        return Err(Error::unsupported(
            "alternate paths, path migration, SQD events and rate limits",
        ));
    }
    Ok(())
}

/// Checks that a move to RTR the provider connects names the peer: its
/// address (a GID, as iWARP has no LIDs) and its QP number.
fn check_peer(qp: &Qp, attr: &ibv_qp_attr, mask: u32) -> Result<(), Error> {
    let sh = &qp.sh;
    if mask & IBV_QP_AV == 0 || mask & IBV_QP_DEST_QPN == 0 {
        log::warn(
            &sh.log,
            format_args!("modify_qp to RTR needs the peer's address (IBV_QP_AV) and QPN"),
        );
        return Err(Error::invalid("RTR needs the peer's address and QPN"));
    }
    if attr.ah_attr.is_global == 0 {
        log::warn(&sh.log,
            format_args!("iWARP needs the peer's GID in ah_attr.grh (e.g. ibv_rc_pingpong -g 0); LIDs mean nothing here"),
        );
        return Err(Error::invalid("iWARP needs the peer's GID"));
    }
    if attr.dest_qp_num >> 8 == 0 || attr.dest_qp_num > 0xff_ffff {
        return Err(Error::invalid("dest_qp_num is no QP number"));
    }
    Ok(())
}

/// Stores the attributes `mask` names; the access flags reach the engine too.
fn apply_attrs(qp: &Qp, attr: &ibv_qp_attr, mask: u32) {
    let sh = &qp.sh;
    {
        let mut a = qp.attrs.lock();
        if mask & IBV_QP_ACCESS_FLAGS != 0 {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask & IBV_QP_PKEY_INDEX != 0 {
            a.pkey_index = attr.pkey_index;
        }
        if mask & IBV_QP_PORT != 0 {
            a.port_num = attr.port_num;
        }
        if mask & IBV_QP_PATH_MTU != 0 {
            a.path_mtu = attr.path_mtu;
        }
        if mask & IBV_QP_DEST_QPN != 0 {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask & IBV_QP_RQ_PSN != 0 {
            a.rq_psn = attr.rq_psn;
        }
        if mask & IBV_QP_SQ_PSN != 0 {
            a.sq_psn = attr.sq_psn;
        }
        if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask & IBV_QP_MIN_RNR_TIMER != 0 {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask & IBV_QP_TIMEOUT != 0 {
            a.timeout = attr.timeout;
        }
        if mask & IBV_QP_RETRY_CNT != 0 {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask & IBV_QP_RNR_RETRY != 0 {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask & IBV_QP_AV != 0 {
            a.ah_attr = attr.ah_attr;
        }
        if a.path_mtu == 0 {
            a.path_mtu = sysfs_tree::ibv_mtu_for(sh.dev.mtu);
        }
    }
    if mask & IBV_QP_ACCESS_FLAGS != 0 {
        let mut rx = qp.lock_rx();
        rx.engine.set_access(attr.qp_access_flags);
        // Lent to the module with the rights before: taken back (the next
        // pass lends it again if the rights still allow).
        rx.recall(&qp.core);
    }
}

/// What entering `new` from `cur` does; returns the state the QP is then in.
fn enter(qp: &Qp, attr: &ibv_qp_attr, cur: u32, new: u32, by_cm: bool) -> Result<u32, Error> {
    match new {
        IBV_QPS_RESET => qp.reset(),
        IBV_QPS_ERR => qp.to_error(
            "moved to the error state by the application",
            None,
            None,
            None,
            true,
        ),
        IBV_QPS_RTR => {
            // From the state `modify` checked only: a failure found meanwhile by
            // another thread stands (the QP stays in error, EINVAL).
            advance(qp, cur, IBV_QPS_RTR)?;
            if by_cm {
                return Ok(qp.state());
            }
            connect(qp, attr)?;
        }
        IBV_QPS_RTS => {
            {
                let a = qp.attrs.lock();
                let mut t = qp.lock_tx();
                t.engine.set_ord(crate::qp::cm::ord_of(a.max_rd_atomic));
            }
            advance(qp, cur, IBV_QPS_RTS)?;
            qp.kick();
        }
        s => qp.state.store(s, Ordering::Release),
    }
    Ok(qp.state())
}

/// Starts the connection to the peer `attr` names, the QP now in RTR; if
/// that fails the QP goes back to INIT.
fn connect(qp: &Qp, attr: &ibv_qp_attr) -> Result<(), Error> {
    let sh = &qp.sh;
    // SAFETY: reading the raw bytes of the GID union.
    let gid = unsafe { attr.ah_attr.grh.dgid.raw };
    let r = sh
        .dev
        .peer_addr(&gid)
        .and_then(|peer| qp.lock_cm().start(qp, peer, attr.dest_qp_num));
    if let Err(e) = &r {
        log::warn(&sh.log, format_args!("qp {}: {}", qp.qpn, e));
        qp.state.store(IBV_QPS_INIT, Ordering::Release);
    }
    r
}
