//! Large RDMA Writes and Read Responses placed in place: once the header of
//! such an FPDU has passed every check its handler makes, the driver reads
//! the rest of its payload from the stream straight into the memory named
//! here, and the CRC is checked when the trailer comes.

use std::collections::VecDeque;

use super::{errors, read, Host, Receiver};
use crate::fault::{AccessFault, Fail};
use crate::send::Span;
use crate::wire::{ddp, mpa, rdmap};

/// A large tagged payload read from the stream straight into memory.
#[derive(Debug)]
pub(super) struct Placing {
    read_response: bool,
    last: bool,
    /// Payload bytes in all, and still to come.
    len: u32,
    pub(super) left: u32,
    /// Where they go, the next first.
    spans: VecDeque<Span>,
    /// The QP's rights the spans are checked with (remote writes).
    allowed: u32,
    /// Pad and CRC bytes after the payload.
    pub(super) trailer: usize,
    crc: Option<mpa::Crc>,
    /// The DDP header, for a Terminate.
    dhdr: [u8; ddp::TAGGED_HDR_LEN],
}

/// The MPA length field and the tagged DDP header before a payload placed in place.
const HDR_END: usize = mpa::LEN_FIELD_LEN + ddp::TAGGED_HDR_LEN;

/// The header of a large tagged FPDU whose beginning has come.
struct Large {
    hdr: ddp::HeaderRepr,
    stag: u32,
    to: u64,
    opcode: Option<rdmap::Opcode>,
    payload_len: usize,
}

impl Large {
    /// The header at the start of `prefix`, the first bytes of an FPDU of
    /// `len` bytes, if it is a tagged one of this DDP and RDMAP version and
    /// its payload is at least `min` bytes; `None` for anything else, which
    /// the buffered path judges once the whole FPDU is there.
    fn parse(prefix: &[u8], len: usize, min: usize) -> Option<Large> {
        let ulpdu_len = usize::from(u16::from_be_bytes([prefix[0], prefix[1]]));
        let payload_len = ulpdu_len.checked_sub(ddp::TAGGED_HDR_LEN)?;
        if payload_len < min || prefix.len() < HDR_END {
            return None;
        }
        let (hdr, hlen) = ddp::HeaderRepr::parse(&prefix[mpa::LEN_FIELD_LEN..]).ok()?;
        let ddp::Kind::Tagged { stag, to } = hdr.kind else {
            return None;
        };
        debug_assert_eq!(hlen, ddp::TAGGED_HDR_LEN);
        debug_assert!(len >= HDR_END + payload_len);
        let c = rdmap::Ctrl::from_byte(hdr.rdmap_ctrl);
        if c.version != rdmap::RDMAP_VERSION {
            return None;
        }
        Some(Large {
            hdr,
            stag,
            to,
            opcode: rdmap::Opcode::from_u8(c.opcode),
            payload_len,
        })
    }
}

impl<R> Receiver<R> {
    /// Where the next bytes of the stream go while a payload is placed in
    /// place: at most `len` bytes into the memory of this span, which the
    /// driver checks again (rights `need`, and the QP's `allowed`) as it
    /// reads into it, then reports with [`Receiver::direct_placed`].
    pub fn direct(&self) -> Option<(Span, u32)> {
        let p = self.placing.as_ref().filter(|p| p.left > 0)?;
        Some((*p.spans.front()?, p.allowed))
    }

    /// After a payload placed in place, how many bytes the driver should read
    /// into its buffer next: its trailer and the header of the FPDU after it,
    /// so that a large payload there is placed in place too rather than read
    /// into the buffer with its header.
    pub fn read_hint(&self) -> Option<usize> {
        let p = self.placing.as_ref().filter(|p| p.left == 0)?;
        Some(p.trailer + mpa::LEN_FIELD_LEN + ddp::TAGGED_HDR_LEN)
    }

    /// The driver read `data` from the stream into the memory [`Receiver::direct`] named.
    pub fn direct_placed(&mut self, data: &[u8]) {
        let Some(p) = self.placing.as_mut() else {
            return;
        };
        let data = &data[..data.len().min(p.left as usize)];
        if let Some(c) = p.crc.as_mut() {
            c.update(data);
        }
        let mut n = data.len() as u32;
        p.left -= n;
        while n > 0 {
            let Some(s) = p.spans.front_mut() else { break };
            let t = n.min(s.len);
            s.to = s.to.wrapping_add(t as u64);
            s.len -= t;
            n -= t;
            if s.len == 0 {
                p.spans.pop_front();
            }
        }
    }

    /// The memory [`Receiver::direct`] named could not be reached (`e`):
    /// the failure to report; nothing more may be processed.
    pub fn direct_lost(&mut self, e: AccessFault) -> Fail {
        let Some(p) = self.placing.take() else {
            return errors::nothing_placed();
        };
        if p.read_response {
            errors::sink_lost()
        } else {
            *errors::write_refused(e, &p.dhdr)
        }
    }

    /// The beginning of a large FPDU is in `prefix` (`len` bytes in all): if
    /// it is an RDMA Write or Read Response whose header passes every check,
    /// places what of its payload is there and returns the bytes consumed;
    /// the rest of the payload is read into place by the driver.
    pub(super) fn start_direct<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        prefix: &[u8],
        len: usize,
    ) -> Result<Option<usize>, Fail> {
        if self.inplace_min == 0 || self.expects_rtr() || self.pending_imm.is_some() {
            return Ok(None);
        }
        let Some(large) = Large::parse(prefix, len, self.inplace_min) else {
            return Ok(None);
        };
        let Large {
            hdr,
            stag,
            to,
            opcode,
            payload_len,
        } = large;
        let mut dhdr = [0u8; ddp::TAGGED_HDR_LEN];
        dhdr.copy_from_slice(&prefix[mpa::LEN_FIELD_LEN..HDR_END]);
        let mut spans = Vec::new();
        let (read_response, allowed) = match opcode {
            Some(rdmap::Opcode::Write) => {
                let Some((span, allowed)) = self.write_in_place(host, stag, to, payload_len as u32)
                else {
                    return Ok(None);
                };
                spans.push(span);
                (false, allowed)
            }
            Some(rdmap::Opcode::ReadResponse) => {
                if !read::read_in_place(host, stag, to, payload_len, hdr.last, &dhdr, &mut spans) {
                    return Ok(None);
                }
                (true, u32::MAX)
            }
            _ => return Ok(None),
        };
        self.previous_write();
        let mut crc = self.crc.then(|| mpa::Crc::using(self.crc32c));
        if let Some(c) = crc.as_mut() {
            c.update(&prefix[..HDR_END]);
        }
        self.placing = Some(Box::new(Placing {
            read_response,
            last: hdr.last,
            len: payload_len as u32,
            left: payload_len as u32,
            spans: spans.into(),
            allowed,
            trailer: len - HDR_END - payload_len,
            crc,
            dhdr,
        }));
        // What of the payload came with the header is placed from here.
        let have = &prefix[HDR_END..prefix.len().min(HDR_END + payload_len)];
        self.place_arrived(host, have)?;
        Ok(Some(HDR_END + have.len()))
    }

    /// Places `data`, the payload that came with the header of the FPDU
    /// being placed in place, into the memory it goes to.
    fn place_arrived<H: Host<Recv = R>>(&mut self, host: &mut H, data: &[u8]) -> Result<(), Fail> {
        let mut rest = data;
        while !rest.is_empty() {
            let (s, allowed) = self.direct().expect("payload left");
            let take = rest.len().min(s.len as usize);
            if let Err(e) = host.place(s.stag, s.to, &rest[..take], s.need, allowed) {
                return Err(self.direct_lost(e));
            }
            self.direct_placed(&rest[..take]);
            rest = &rest[take..];
        }
        Ok(())
    }

    /// The trailer of a payload placed in place came: checks the CRC and
    /// completes what the payload was for, as the handler of its kind does.
    pub(super) fn finish_direct<H: Host<Recv = R>>(
        &mut self,
        host: &mut H,
        trailer: &[u8],
    ) -> Result<(), Fail> {
        let p = *self.placing.take().expect("placing");
        if let Some(mut c) = p.crc {
            let (pad, got) = trailer.split_at(trailer.len() - mpa::CRC_LEN);
            c.update(pad);
            if c.finish() != got {
                return Err(errors::crc_error());
            }
        }
        if p.read_response {
            read::arrived(host, p.len as u64, p.last)
        } else {
            self.written(p.len as u64, p.last);
            Ok(())
        }
    }
}
