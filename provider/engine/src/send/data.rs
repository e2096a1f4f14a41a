//! Data messages: the Send variants and RDMA Write, in segments of at most
//! `mulpdu` payload bytes, each payload copied into the buffer or listed in
//! place as spans of registered memory; Immediate Data with them (RFC 7306
//! section 6).

use super::fpdu::{no_payload, tagged, untagged};
use super::{bad_lkey, send_buffer_lost, Cur, Job, SendHost, Sender, Wr, WrOp, BATCH};
use crate::fault::Fail;
use crate::wire::{atomic, ddp, rdmap};

/// What a Send's or Write's FPDUs carry, from its work request.
#[derive(Clone, Copy)]
struct Data {
    send: bool,
    /// The Send variant (for a Send).
    op: rdmap::Opcode,
    /// The sink of a Write.
    stag: u32,
    to: u64,
    imm: Option<u32>,
    solicited: bool,
    /// The STag a Send with Invalidate invalidates.
    inv: Option<u32>,
}

impl Data {
    fn of<L>(op: &WrOp<L>) -> Data {
        let (send, stag, to, imm, solicited, inv) = match *op {
            WrOp::Send {
                solicited,
                invalidate,
                imm,
            } => (true, 0, 0, imm, solicited, invalidate),
            WrOp::Write {
                stag,
                to,
                imm,
                solicited,
            } => (false, stag, to, imm, solicited, None),
            _ => unreachable!("frame_data takes Sends and Writes"),
        };
        Data {
            send,
            op: send_opcode(inv.is_some(), solicited),
            stag,
            to,
            imm,
            solicited,
            inv,
        }
    }

    /// The DDP/RDMAP header of the segment at message offset `off` (`msn`:
    /// a Send's).
    #[inline]
    fn header(&self, msn: u32, off: u64, last: bool) -> ddp::HeaderRepr {
        if self.send {
            untagged(
                self.op,
                self.inv.unwrap_or(0),
                ddp::QN_SEND,
                msn,
                off as u32,
                last,
            )
        } else {
            tagged(
                rdmap::Opcode::Write,
                self.stag,
                self.to.wrapping_add(off),
                last,
            )
        }
    }
}

impl<L: Clone + Default, P> Sender<L, P> {
    /// Send family and RDMA Write: segments of at most `mulpdu` payload bytes.
    pub(super) fn frame_data<H>(&mut self, host: &mut H, cur: &mut Cur<L, P>) -> Result<bool, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        let Job::Sq(wr) = &cur.job else {
            unreachable!()
        };
        let total = wr.length as u64;
        let d = Data::of(&wr.op);
        let msn = if cur.sent == 0 {
            self.open_data(host, wr, &d)?
        } else {
            self.msn[0].wrapping_sub(1)
        };
        loop {
            let n = (total - cur.sent).min(self.mulpdu as u64) as usize;
            let last = cur.sent + n as u64 == total;
            let hdr = d.header(msn, cur.sent, last);
            self.push_segment(host, &wr.payload, &hdr, cur.sent, n)?;
            cur.sent += n as u64;
            if last {
                self.close_data(wr, &d)?;
                return Ok(true);
            }
            if self.queued() >= BATCH as u64 {
                return Ok(false);
            }
        }
    }

    /// Before a message's first byte: its local buffers checked, the
    /// Immediate Data a Send carries framed ahead of it; returns its MSN.
    fn open_data<H>(&mut self, host: &mut H, wr: &Wr<L, P>, d: &Data) -> Result<u32, Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        // Local protection is checked before the message's first byte goes
        // out. A message of one FPDU is checked by gathering its payload, before
        // anything of it is framed; a longer one, or one whose Immediate Data
        // goes first, is checked whole now.
        if wr.length as u64 > self.mulpdu as u64 || (d.send && d.imm.is_some()) {
            host.check_payload(&wr.payload, 0).map_err(|_| bad_lkey())?;
        }
        if !d.send {
            // A Write has no MSN; its header names none.
            return Ok(self.msn[0].wrapping_sub(1));
        }
        if let Some(imm) = d.imm {
            // Send with Immediate: Immediate Data, then the Send it belongs
            // to, in one run of the stream (xiw's receiver gives both one
            // receive; a plain RFC 7306 receiver completes them as two
            // messages, in order).
            self.push_immediate(imm, false)?;
        }
        Ok(self.take_msn(ddp::QN_SEND))
    }

    /// One segment: `n` payload bytes from message offset `off` after `hdr`,
    /// sent in place if the payload lies in registered memory and is large
    /// enough, else gathered into the buffer.
    fn push_segment<H>(
        &mut self,
        host: &mut H,
        payload: &P,
        hdr: &ddp::HeaderRepr,
        off: u64,
        n: usize,
    ) -> Result<(), Fail>
    where
        H: SendHost<Local = L, Payload = P>,
    {
        let mut spans = std::mem::take(&mut self.scratch);
        spans.clear();
        let located = self.in_place(n)
            && host
                .locate(payload, off, n, &mut spans)
                .map_err(|_| send_buffer_lost())?;
        let r = if located {
            self.push_fpdu_spans(hdr, &spans, n)
        } else {
            self.push_fpdu(
                hdr,
                &[],
                |buf| {
                    host.gather(payload, off, n, buf)
                        .map_err(|_| send_buffer_lost())
                },
                n,
            )
        };
        self.scratch = spans;
        r
    }

    /// After a message's last segment: the Immediate Data a Write carries,
    /// then what completes the request (the zero-length Read that confirms
    /// it, or the stream taking its last byte).
    fn close_data(&mut self, wr: &Wr<L, P>, d: &Data) -> Result<(), Fail> {
        if let (false, Some(imm)) = (d.send, d.imm) {
            // RDMA Write with Immediate: the Write, then Immediate Data (RFC 7306 section 6).
            self.push_immediate(imm, d.solicited)?;
        }
        if self.confirm && wr.confirmed && self.ord_max > 0 {
            self.frame_confirm(wr.idx)
        } else {
            self.done_at.push_back((wr.idx, self.framed));
            Ok(())
        }
    }

    /// One Immediate Data message: the 32-bit immediate of the verbs in the low
    /// half of RFC 7306's 64 bits.
    fn push_immediate(&mut self, imm: u32, solicited: bool) -> Result<(), Fail> {
        let mut body = [0u8; atomic::IMMEDIATE_LEN];
        body[4..].copy_from_slice(&imm.to_ne_bytes());
        let op = if solicited {
            rdmap::Opcode::ImmediateDataSolicited
        } else {
            rdmap::Opcode::ImmediateData
        };
        let msn = self.take_msn(ddp::QN_SEND);
        let hdr = untagged(op, 0, ddp::QN_SEND, msn, 0, true);
        self.put_fpdu(&hdr, &body, 0, no_payload)
    }
}

/// The Send variant for a Send that invalidates or is solicited.
pub(super) fn send_opcode(invalidate: bool, solicited: bool) -> rdmap::Opcode {
    match (invalidate, solicited) {
        (true, false) => rdmap::Opcode::SendInvalidate,
        (true, true) => rdmap::Opcode::SendSolicitedInvalidate,
        (false, false) => rdmap::Opcode::Send,
        (false, true) => rdmap::Opcode::SendSolicited,
    }
}
