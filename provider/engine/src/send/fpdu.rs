//! FPDUs laid out in the sender's buffer (RFC 5044 section 4.1): the
//! ULPDU_Length, the DDP/RDMAP header, the payload (copied in, or listed as
//! spans of registered memory sent in place), pad and trailer, and the
//! headers and MSNs every kind of message is framed with.

use super::{Fail, Sender, Span, Status};
use crate::wire::{ddp, mpa, rdmap};

/// Zeros a short FPDU is laid out on.
static ZEROS: [u8; 128] = [0; 128];
/// FPDUs up to this size are laid out on a block of zeros of this size.
const SHORT_FPDU: usize = 32;
/// Room for an encoded DDP/RDMAP header (the untagged one is the longer).
pub(super) const HEAD_MAX: usize = ddp::UNTAGGED_HDR_LEN;

impl<L: Clone + Default, P> Sender<L, P> {
    /// A payload of `n` bytes goes to the stream in place.
    pub(super) fn in_place(&self, n: usize) -> bool {
        !self.crc && self.inplace_min > 0 && n >= self.inplace_min
    }

    /// Appends one FPDU (no CRC) whose payload, `payload_len` bytes, is sent
    /// from `spans` in place.
    pub(super) fn push_fpdu_spans(
        &mut self,
        hdr: &ddp::HeaderRepr,
        spans: &[Span],
        payload_len: usize,
    ) -> Result<(), Fail> {
        debug_assert!(!self.crc, "a CRC must cover the bytes sent");
        if spans.iter().map(|s| s.len as usize).sum::<usize>() != payload_len {
            return Err(wrong_length());
        }
        let start = self.open_fpdu(hdr, &[], payload_len);
        let at = self.buf.len();
        self.spans
            .extend(spans.iter().filter(|s| s.len > 0).map(|&s| (at, s)));
        self.close_fpdu(start, payload_len);
        Ok(())
    }

    pub(super) fn take_msn(&mut self, qn: u32) -> u32 {
        let m = self.msn[qn as usize];
        self.msn[qn as usize] = m.wrapping_add(1);
        m
    }

    /// Appends one FPDU, laid out whole: length, DDP/RDMAP header, `extra`
    /// header bytes, `len` payload bytes that `fill` writes in place, pad and
    /// trailer (RFC 5044 section 4.1). If `fill` fails nothing is appended.
    pub(super) fn put_fpdu<E>(
        &mut self,
        hdr: &ddp::HeaderRepr,
        extra: &[u8],
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let hlen = hdr.buffer_len();
        let mut head = [0u8; HEAD_MAX];
        hdr.emit(&mut head);
        let n = extra.len();
        self.put_fpdu_head(&head, hlen, n + len, |b| {
            b[..n].copy_from_slice(extra);
            fill(&mut b[n..])
        })
    }

    /// As [`Sender::put_fpdu`], for an encoded DDP/RDMAP header: the first
    /// `hlen` bytes of `head` (the rest zeros); `fill` writes the `len`
    /// bytes after it.
    #[inline]
    pub(super) fn put_fpdu_head<E>(
        &mut self,
        head: &[u8; HEAD_MAX],
        hlen: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let start = self.buf.len();
        let h = start + mpa::LEN_FIELD_LEN;
        let at = h + hlen;
        let end = at + len + mpa::pad_len(hlen + len);
        // Appending from zeros costs less than a resize for the short
        // FPDUs of small messages.
        // The FPDU of a message of a few bytes takes a fixed-size block of
        // zeros, which is copied in line, cut to its length.
        let n = end + mpa::CRC_LEN - start;
        if n <= SHORT_FPDU {
            self.buf.extend_from_slice(&ZEROS[..SHORT_FPDU]);
            self.buf.truncate(start + n);
        } else {
            match ZEROS.get(..n) {
                Some(z) => self.buf.extend_from_slice(z),
                None => self.buf.resize(end + mpa::CRC_LEN, 0),
            }
        }
        // The whole block of `head`, in one copy of a fixed size: what lies
        // past the header is zeros, and lands on bytes that the payload,
        // pad or trailer take next (every FPDU has at least the trailer's 4
        // bytes after its header, and no header is shorter than 14).
        self.buf[h..h + HEAD_MAX].copy_from_slice(head);
        if let Err(e) = fill(&mut self.buf[at..at + len]) {
            self.buf.truncate(start);
            return Err(e);
        }
        self.buf[start..h].copy_from_slice(&((hlen + len) as u16).to_be_bytes());
        self.seal(start, end, 0);
        Ok(())
    }

    /// Appends one FPDU: length, DDP/RDMAP header, `extra` header bytes,
    /// `payload_len` bytes produced by `payload`, pad and CRC (RFC 5044 section 4.1).
    pub(super) fn push_fpdu(
        &mut self,
        hdr: &ddp::HeaderRepr,
        extra: &[u8],
        payload: impl FnOnce(&mut Vec<u8>) -> Result<(), Fail>,
        payload_len: usize,
    ) -> Result<(), Fail> {
        let start = self.open_fpdu(hdr, extra, payload_len);
        let end = self.buf.len() + payload_len;
        let r = payload(&mut self.buf).and_then(|()| {
            // The driver gathered another length than asked: never frame it.
            (self.buf.len() == end)
                .then_some(())
                .ok_or_else(wrong_length)
        });
        if let Err(e) = r {
            self.buf.truncate(start);
            return Err(e);
        }
        self.close_fpdu(start, 0);
        Ok(())
    }

    /// Starts an FPDU of `payload_len` payload bytes with its ULPDU_Length,
    /// the DDP/RDMAP header and `extra` header bytes; returns where it starts.
    fn open_fpdu(&mut self, hdr: &ddp::HeaderRepr, extra: &[u8], payload_len: usize) -> usize {
        let start = self.buf.len();
        let hlen = hdr.buffer_len();
        let ulpdu = hlen + extra.len() + payload_len;
        self.buf.extend_from_slice(&(ulpdu as u16).to_be_bytes());
        self.buf.resize(start + mpa::LEN_FIELD_LEN + hlen, 0);
        hdr.emit(&mut self.buf[start + mpa::LEN_FIELD_LEN..]);
        self.buf.extend_from_slice(extra);
        start
    }

    /// Ends the FPDU at `start` with pad and trailer (the CRC, or zeros
    /// without CRC); `in_place` of its payload bytes are spans, not in the buffer.
    fn close_fpdu(&mut self, start: usize, in_place: usize) {
        let ulpdu = usize::from(u16::from_be_bytes([self.buf[start], self.buf[start + 1]]));
        let end = self.buf.len() + mpa::pad_len(ulpdu);
        self.buf.resize(end + mpa::CRC_LEN, 0);
        self.seal(start, end, in_place);
    }

    /// Writes the trailer of the FPDU that runs from `start` to `end` (pad
    /// included) into the zeroed bytes after it: the CRC, or zeros without
    /// CRC; counts it framed, with `in_place` payload bytes that are spans.
    fn seal(&mut self, start: usize, end: usize, in_place: usize) {
        if self.crc {
            debug_assert_eq!(in_place, 0, "a CRC must cover the bytes sent");
            let c = (self.crc32c)(0, &self.buf[start..end]);
            self.buf[end..end + mpa::CRC_LEN].copy_from_slice(&c.to_le_bytes());
        }
        self.framed += (end + mpa::CRC_LEN - start + in_place) as u64;
    }
}

/// The fill of an FPDU that carries no payload.
pub(super) fn no_payload(_: &mut [u8]) -> Result<(), Fail> {
    Ok(())
}

/// A driver located or gathered another payload length than asked.
fn wrong_length() -> Fail {
    Fail::local(Status::LocalProtection, "payload of the wrong length")
}

fn ctrl(op: rdmap::Opcode) -> u8 {
    rdmap::Ctrl {
        version: rdmap::RDMAP_VERSION,
        opcode: op as u8,
    }
    .to_byte()
}

pub(super) fn tagged(op: rdmap::Opcode, stag: u32, to: u64, last: bool) -> ddp::HeaderRepr {
    ddp::HeaderRepr {
        last,
        version: ddp::DDP_VERSION,
        rdmap_ctrl: ctrl(op),
        kind: ddp::Kind::Tagged { stag, to },
    }
}

pub(super) fn untagged(
    op: rdmap::Opcode,
    ulp_word: u32,
    qn: u32,
    msn: u32,
    mo: u32,
    last: bool,
) -> ddp::HeaderRepr {
    ddp::HeaderRepr {
        last,
        version: ddp::DDP_VERSION,
        rdmap_ctrl: ctrl(op),
        kind: ddp::Kind::Untagged {
            ulp_word,
            qn,
            msn,
            mo,
        },
    }
}
