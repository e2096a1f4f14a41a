//! The immediate path: a Send or RDMA Write without Immediate Data whose one
//! FPDU completes it, framed the moment it is posted when nothing waits
//! ahead of it ([`Sender::frame_now`]), byte for byte what the queued path
//! frames for it.

use super::data::send_opcode;
use super::fpdu::HEAD_MAX;
use super::{Sender, WrOp};
use crate::wire::{ddp, rdmap};

/// A request [`Sender::frame_now`] frames: a Send or an RDMA Write without
/// Immediate Data, whose one FPDU completes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NowOp {
    Send {
        solicited: bool,
        invalidate: Option<u32>,
    },
    Write {
        stag: u32,
        to: u64,
    },
}

impl<L> WrOp<L> {
    /// The request as [`Sender::frame_now`] takes it, if it is one it frames.
    pub fn now_op(&self) -> Option<NowOp> {
        match *self {
            WrOp::Send {
                solicited,
                invalidate,
                imm: None,
            } => Some(NowOp::Send {
                solicited,
                invalidate,
            }),
            WrOp::Write {
                stag,
                to,
                imm: None,
                ..
            } => Some(NowOp::Write { stag, to }),
            _ => None,
        }
    }
}

impl<L: Clone + Default, P> Sender<L, P> {
    /// Frames a Send or RDMA Write (without Immediate Data) of `len` payload
    /// bytes, which fit one FPDU, the moment it is posted: the driver need not
    /// queue it when nothing waits ahead of it. `fill` writes the payload in
    /// place; if it fails, nothing is framed and its error is returned.
    /// `Ok(false)`, with nothing changed, if the sender is not
    /// [idle](Sender::idle) or the request does not qualify; it then goes the
    /// usual way. The FPDU is the one [`Sender::frame_more`] would frame for
    /// the same request. The request is complete once the stream has taken
    /// every pending byte; if the driver leaves some for later it names the
    /// request with [`Sender::complete_at`].
    pub fn frame_now<E>(
        &mut self,
        op: NowOp,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<bool, E> {
        if len > self.mulpdu || !self.idle() {
            return Ok(false);
        }
        // The header, encoded here: the one `untagged` or `tagged` would
        // give for the request, with fewer steps (tests/now.rs compares the
        // two byte for byte).
        const RV: u8 = rdmap::RDMAP_VERSION << 6;
        const LAST: u8 = ddp::FLAG_LAST | ddp::DDP_VERSION;
        let mut hdr = [0u8; HEAD_MAX];
        let (hlen, send) = match op {
            NowOp::Send {
                solicited,
                invalidate,
            } => {
                let op = send_opcode(invalidate.is_some(), solicited);
                let msn = self.msn[ddp::QN_SEND as usize];
                hdr[0] = LAST;
                hdr[1] = RV | op as u8;
                hdr[2..6].copy_from_slice(&invalidate.unwrap_or(0).to_be_bytes());
                // Queue number 0 (bytes 6..10) and MO 0 (14..18) stay zero.
                hdr[10..14].copy_from_slice(&msn.to_be_bytes());
                (ddp::UNTAGGED_HDR_LEN, true)
            }
            NowOp::Write { stag, to } => {
                hdr[0] = ddp::FLAG_TAGGED | LAST;
                hdr[1] = RV | rdmap::Opcode::Write as u8;
                hdr[2..6].copy_from_slice(&stag.to_be_bytes());
                hdr[6..14].copy_from_slice(&to.to_be_bytes());
                (ddp::TAGGED_HDR_LEN, false)
            }
        };
        self.put_fpdu_head(&hdr, hlen, len, fill)?;
        if send {
            self.take_msn(ddp::QN_SEND);
        }
        Ok(true)
    }
}
