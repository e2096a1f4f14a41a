//! The responder: carries out what the peer asks of this side's memory on
//! queue 1 (RFC 7306 atomics, RDMA Flush, RDMA Verify, Atomic Write) and
//! returns the response to send. An RDMA Read Request is answered by the
//! transmit side instead, which streams the source memory as the Read
//! Response ([`super::tx`], `SqHost::read_source`).

use std::sync::atomic::Ordering;

use xiw_abi::verbs::*;
use xiw_engine::fault::Fail;
use xiw_engine::queue1::{flush_need, Inbound};

use crate::mem;
use crate::qp::core::QpCore;
use crate::wire::{atomic, commit, rdmap};

/// Why a queue 1 request could not be carried out.
enum Refused {
    /// The STag check failed at execution (the MR changed since the request came).
    Access(mem::AccessError),
    /// The operation itself failed.
    Failed(String),
}

impl From<mem::AccessError> for Refused {
    fn from(e: mem::AccessError) -> Refused {
        Refused::Access(e)
    }
}

/// Carries out a queue 1 request from the peer (other than a Read) and returns
/// its response; a failure ends in a Terminate that names the request
/// (draft-talpey-rdma-commit section 5, RFC 7306 section 8).
pub fn execute(qp: &QpCore, req: &Inbound) -> Result<(rdmap::Opcode, Vec<u8>), Fail> {
    carry_out(qp, req).map_err(|r| match r {
        Refused::Access(e) => Fail::protection(e, req.ddp_header(), None, "request refused"),
        Refused::Failed(why) => Fail::operation_failed(req.ddp_header(), &why),
    })
}

fn carry_out(qp: &QpCore, req: &Inbound) -> Result<(rdmap::Opcode, Vec<u8>), Refused> {
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
            let resp = atomic::AtomicResponseRepr {
                request_id: req.request_id,
                original_value: original,
            };
            let mut b = vec![0u8; resp.buffer_len()];
            resp.emit(&mut atomic::ResponsePacket::new_unchecked(&mut b[..]));
            (rdmap::Opcode::AtomicResponse, b)
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
            (rdmap::Opcode::FlushResponse, Vec::new())
        }
        Inbound::Verify {
            stag,
            to,
            len,
            expected,
            expected_len,
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
            if expected_len > 0 && expected[..expected_len as usize] != hash[..] {
                // A hash was given and does not match: Terminate, no response
                // (draft-talpey-rdma-commit sections 3.1.2.1 and 3.1.2.2).
                return Err(failed("RDMA Verify: hash mismatch"));
            }
            (rdmap::Opcode::VerifyResponse, hash)
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
            (rdmap::Opcode::AtomicWriteResponse, Vec::new())
        }
    })
}
