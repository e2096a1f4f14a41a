//! The Send variants (RFC 5040 section 5.3): untagged messages on queue 0,
//! each filling the next posted receive in order; a whole Send in one
//! segment in one host step. And Immediate Data (RFC 7306 section 6), which
//! completes a receive of its own or rides with the Send that follows it.

use super::{errors, Host, Receiver, RecvCompletion, Whole};
use crate::fault::Fail;
use crate::wire::{atomic, ddp, rdmap};

/// What an Immediate Data message completes: the RDMA Write it follows (its
/// length), if any, and whether it asked for a solicited event.
#[derive(Clone, Copy)]
pub(super) struct ImmOf {
    pub(super) write: Option<u64>,
    pub(super) solicited: bool,
}

/// Whether a message is the Send that an xiw peer's Immediate Data
/// announced, which must come next: a Send or Send with Solicited Event on
/// queue 0.
pub(super) fn announced(kind: ddp::Kind, opcode: Option<rdmap::Opcode>) -> bool {
    matches!(
        kind,
        ddp::Kind::Untagged {
            qn: ddp::QN_SEND,
            ..
        }
    ) && matches!(
        opcode,
        Some(rdmap::Opcode::Send | rdmap::Opcode::SendSolicited)
    )
}

impl<R> Receiver<R> {
    /// A segment of a Send, Send with Invalidate (of `inv_stag`), Send with
    /// Solicited Event or both, at message offset `mo`. A whole Send without
    /// Invalidate in one segment, with no receive in progress, goes to the
    /// host in one step; anything else is placed segment by segment. (The
    /// failure is boxed, as for [`Receiver::whole_send`]: the steady state's
    /// fast path calls this too.)
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn send<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        op: rdmap::Opcode,
        inv_stag: u32,
        mo: u32,
        last: bool,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Box<Fail>> {
        if self.cur.is_none()
            && mo == 0
            && last
            && matches!(op, rdmap::Opcode::Send | rdmap::Opcode::SendSolicited)
        {
            return self.whole_send(host, op, payload, dhdr);
        }
        self.send_segment(host, op, inv_stag, mo, last, payload, dhdr)
            .map_err(Box::new)
    }

    /// A segment of a Send that is not whole in one, or not a plain Send:
    /// the first takes the next posted receive, each fills it at its MO in
    /// order, the last completes it.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn send_segment<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        op: rdmap::Opcode,
        inv_stag: u32,
        mo: u32,
        last: bool,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Fail> {
        if self.cur.is_none() {
            if mo != 0 {
                return Err(errors::first_mo(dhdr));
            }
            let Some(job) = host.take_recv() else {
                return Err(errors::no_receive(dhdr));
            };
            self.cur = Some(job);
            self.placed = 0;
        }
        if mo as u64 != self.placed {
            return Err(errors::mo_out_of_order(dhdr));
        }
        let job = self.cur.as_ref().expect("receive in progress");
        if self.placed + payload.len() as u64 > host.recv_len(job) {
            return Err(errors::too_long(dhdr));
        }
        if host.scatter_recv(job, self.placed, payload).is_err() {
            return Err(errors::bad_receive(dhdr));
        }
        self.placed += payload.len() as u64;
        if !last {
            return Ok(());
        }
        let mut done = RecvCompletion {
            byte_len: self.placed as u32,
            imm: self.pending_imm.take(),
            solicited: std::mem::take(&mut self.pending_se)
                || matches!(
                    op,
                    rdmap::Opcode::SendSolicited | rdmap::Opcode::SendSolicitedInvalidate
                ),
            ..Default::default()
        };
        if matches!(
            op,
            rdmap::Opcode::SendInvalidate | rdmap::Opcode::SendSolicitedInvalidate
        ) {
            if host.invalidate(inv_stag).is_err() {
                return Err(errors::cannot_invalidate(dhdr));
            }
            done.imm = None;
            done.invalidated = Some(inv_stag);
        }
        let job = self.cur.take().expect("receive in progress");
        self.msn[0] = self.msn[0].wrapping_add(1);
        host.recv_done(job, done);
        Ok(())
    }

    /// A whole Send in one segment, with no receive in progress: the host
    /// takes, fills and completes the receive in one step. (The failure is
    /// boxed so that the common outcome is returned in a register.)
    #[inline]
    pub(super) fn whole_send<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        op: rdmap::Opcode,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Box<Fail>> {
        let done = RecvCompletion {
            byte_len: payload.len() as u32,
            imm: self.pending_imm.take(),
            solicited: std::mem::take(&mut self.pending_se) || op == rdmap::Opcode::SendSolicited,
            ..Default::default()
        };
        match host.recv_whole(payload, done) {
            Ok(()) => {
                self.msn[0] = self.msn[0].wrapping_add(1);
                Ok(())
            }
            Err(w) => Err(self.whole_failed(w, dhdr)),
        }
    }

    /// Why [`Receiver::whole_send`] failed, with the receive it took (if
    /// any) kept for the failure to complete.
    #[cold]
    #[inline(never)]
    fn whole_failed(&mut self, w: Whole<R>, dhdr: &[u8]) -> Box<Fail> {
        Box::new(match w {
            Whole::NoRecv => errors::no_receive(dhdr),
            Whole::TooLong(job) => {
                self.cur = Some(job);
                errors::too_long(dhdr)
            }
            Whole::BadBuffer(job) => {
                self.cur = Some(job);
                errors::bad_receive(dhdr)
            }
        })
    }

    /// Immediate Data (RFC 7306 section 6): completes a receive of its own, or,
    /// from an xiw peer and not after an RDMA Write, rides with the Send that follows.
    pub(super) fn immediate<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        of: ImmOf,
        mo: u32,
        last: bool,
        payload: &[u8],
        dhdr: &[u8],
    ) -> Result<(), Fail> {
        // Exactly 8 bytes in one segment (section 6.3).
        if !last || mo != 0 || payload.len() != atomic::IMMEDIATE_LEN {
            return Err(Fail::operation_failed(
                dhdr,
                "Immediate Data not exactly 8 bytes",
            ));
        }
        self.msn[0] = self.msn[0].wrapping_add(1);
        let imm = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
        if of.write.is_none() && self.merge_imm {
            self.pending_imm = Some(imm);
            self.pending_se = of.solicited;
            return Ok(());
        }
        let Some(job) = host.take_recv() else {
            return Err(errors::no_receive_for_immediate(dhdr));
        };
        host.recv_done(
            job,
            RecvCompletion {
                byte_len: of.write.unwrap_or(0) as u32,
                imm: Some(imm),
                invalidated: None,
                after_write: true,
                solicited: of.solicited,
            },
        );
        Ok(())
    }
}
