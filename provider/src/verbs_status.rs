//! The engine's status and event types as the verbs report them: the one
//! place they meet `ibv_wc_status` and `ibv_event_type`.

use xiw_abi::verbs::*;
use xiw_engine::fault::{Event, Status};
use xiw_engine::queue1::access;

pub fn status(s: Status) -> u32 {
    match s {
        Status::LocalLength => IBV_WC_LOC_LEN_ERR,
        Status::LocalProtection => IBV_WC_LOC_PROT_ERR,
        Status::LocalQpOperation => IBV_WC_LOC_QP_OP_ERR,
        Status::Flushed => IBV_WC_WR_FLUSH_ERR,
        Status::MemoryBind => IBV_WC_MW_BIND_ERR,
        Status::RemoteAccess => IBV_WC_REM_ACCESS_ERR,
        Status::RemoteInvalidRequest => IBV_WC_REM_INV_REQ_ERR,
        Status::RemoteOperation => IBV_WC_REM_OP_ERR,
        Status::ReceiverNotReady => IBV_WC_RNR_RETRY_EXC_ERR,
        Status::RetryExceeded => IBV_WC_RETRY_EXC_ERR,
    }
}

pub fn event(e: Event) -> u32 {
    match e {
        Event::QpFatal => IBV_EVENT_QP_FATAL,
        Event::QpAccessError => IBV_EVENT_QP_ACCESS_ERR,
    }
}

// The engine's access rights are the verbs' own bits.
const _: () = {
    assert!(access::LOCAL_WRITE == IBV_ACCESS_LOCAL_WRITE);
    assert!(access::REMOTE_WRITE == IBV_ACCESS_REMOTE_WRITE);
    assert!(access::REMOTE_READ == IBV_ACCESS_REMOTE_READ);
    assert!(access::REMOTE_ATOMIC == IBV_ACCESS_REMOTE_ATOMIC);
};
