//! The responder: carries out what the peer asks of this side's memory on
//! queue 1 (RFC 7306 atomics, RDMA Flush, RDMA Verify, Atomic Write) and
//! says what it did to memory, or why it could not; the engine turns that
//! into the response or the Terminate. An RDMA Read Request is answered by the
//! transmit side instead, which streams the source memory as the Read
//! Response ([`super::tx`], `SqHost::read_source`).

use std::sync::atomic::Ordering;

use xiw_abi::verbs::*;
use xiw_engine::queue1::{flush_need, Effect, Inbound, Outcome, Refused};

use crate::mem;
use crate::qp::core::QpCore;
use crate::wire::commit;

/// Carries out a queue 1 request from the peer (other than a Read) on this
/// side's memory, after the STag check again, and says what it did; the
/// engine makes the response, or the Terminate that names the request.
pub fn carry_out(qp: &QpCore, req: &Inbound) -> Outcome {
    let mrs = &qp.sh.mrs;
    let pd = qp.by();
    let failed = |why: &str| Refused::Failed(why.into());
    Ok(match *req {
        Inbound::Read(_) => unreachable!("reads are streamed by frame_job"),
        Inbound::Atomic { req, allowed, .. } => {
            let original = mrs
                .atomic(
                    req.stag,
                    pd,
                    req.to,
                    IBV_ACCESS_REMOTE_ATOMIC,
                    allowed,
                    |word| {
                        let mut old = word.load(Ordering::SeqCst);
                        loop {
                            let new = req.apply(old)?;
                            if new == old {
                                break Some(old);
                            }
                            match word.compare_exchange_weak(
                                old,
                                new,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            ) {
                                Ok(_) => break Some(old),
                                Err(now) => old = now,
                            }
                        }
                    },
                )?
                .flatten()
                .ok_or_else(|| failed("atomic operation not performed"))?;
            Effect::Atomic { original }
        }
        Inbound::Flush {
            stag,
            to,
            len,
            flags,
            allowed,
            ..
        } => {
            if len > 0 {
                let need = flush_need(flags);
                mrs.with_mr_allowed(stag, pd, to, len as usize, need, allowed, |host, mr| {
                    if flags & commit::FLUSH_PERSISTENCE == 0 {
                        return Ok(());
                    }
                    match &mr.ext {
                        Some(ext) => ext.media.flush_persistent(host, len as u64),
                        None => Err(std::io::Error::other("MR has no durable medium")),
                    }
                })?
                .map_err(|e| Refused::Failed(format!("RDMA Flush failed: {e}")))?;
            }
            if flags & commit::FLUSH_GLOBAL_VISIBILITY != 0 {
                crate::persist::flush_global();
            }
            Effect::Flushed
        }
        Inbound::Verify {
            stag,
            to,
            len,
            allowed,
            ..
        } => {
            let hash = mrs
                .with_mr_allowed(
                    stag,
                    pd,
                    to,
                    len as usize,
                    mem::ACCESS_VERIFY,
                    allowed,
                    |host, mr| match mr.ext.as_deref() {
                        Some(mem::MrExt {
                            media,
                            hash: Some(alg),
                        }) => media.hash(*alg, host, len as u64),
                        _ => Err(std::io::Error::other("MR is not verifiable")),
                    },
                )?
                .map_err(|e| Refused::Failed(format!("RDMA Verify failed: {e}")))?;
            Effect::Hashed { hash }
        }
        Inbound::AtomicWrite {
            stag,
            to,
            value,
            allowed,
            ..
        } => {
            mrs.atomic(stag, pd, to, IBV_ACCESS_REMOTE_WRITE, allowed, |word| {
                word.store(value, Ordering::SeqCst)
            })?
            .ok_or_else(|| failed("Atomic Write target not aligned"))?;
            Effect::Stored
        }
    })
}
