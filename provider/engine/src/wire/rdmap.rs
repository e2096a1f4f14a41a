//! RDMAP: the RDMA Protocol (RFC 5040), with the opcodes of RFC 7306 and
//! draft-talpey-rdma-commit-01.
//!
//! RDMAP has no header of its own on most messages: its control byte rides
//! in the first RsvdULP octet of the DDP header (see [`super::ddp`]). Only
//! a few messages add a header after the DDP header: the RDMA Read Request
//! (here), Terminate ([`super::terminate`]), the RFC 7306 messages
//! ([`super::atomic`]) and the commit draft's requests ([`super::commit`]).

use super::ddp::{QN_ATOMIC_RESPONSE, QN_READ_REQUEST, QN_SEND, QN_TERMINATE};
use super::{be, Error, Field, Result};

/// RV value of RFC 5040 (section 4.1); 0 was the RDMA Consortium's.
pub const RDMAP_VERSION: u8 = 1;

/// RV: the top two bits of the control byte.
const MASK_RV: u8 = 0xc0;
/// Opcode. RFC 5040 figure 3 draws 4 opcode bits under 2 reserved ones;
/// draft-talpey-rdma-commit-01 section 3.1 takes the lower reserved bit
/// for a 5-bit opcode (Atomic Write is 0x10 and 0x11). Senders zero the
/// reserved bits (RFC 5040 section 4.1), so reading 5 bits only turns a
/// sender's error into an unknown opcode.
const MASK_OPCODE: u8 = 0x1f;

/// The RDMAP message types (RFC 5040 figure 4, RFC 7306 figure 2,
/// draft-talpey-rdma-commit-01 table 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    Write = 0x0,
    ReadRequest = 0x1,
    ReadResponse = 0x2,
    Send = 0x3,
    SendInvalidate = 0x4,
    SendSolicited = 0x5,
    SendSolicitedInvalidate = 0x6,
    Terminate = 0x7,
    /// RFC 7306 section 6.
    ImmediateData = 0x8,
    /// RFC 7306 section 6.
    ImmediateDataSolicited = 0x9,
    /// RFC 7306 section 5.2.1.
    AtomicRequest = 0xa,
    /// RFC 7306 section 5.2.2.
    AtomicResponse = 0xb,
    /// draft-talpey-rdma-commit-01 section 3.1.1.
    FlushRequest = 0xc,
    FlushResponse = 0xd,
    /// draft-talpey-rdma-commit-01 section 3.1.2.
    VerifyRequest = 0xe,
    VerifyResponse = 0xf,
    /// draft-talpey-rdma-commit-01 section 3.1.3.
    AtomicWriteRequest = 0x10,
    AtomicWriteResponse = 0x11,
}

/// Which document defines an opcode: a peer that only speaks RFC 5040
/// (siw, for one) answers anything else with a Terminate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Extension {
    Rfc5040,
    Rfc7306,
    Commit,
}

impl Opcode {
    /// `None` for a value no document assigns, so the caller can answer
    /// with RDMAP remote operation error / unexpected opcode.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match v {
            0x0 => Write,
            0x1 => ReadRequest,
            0x2 => ReadResponse,
            0x3 => Send,
            0x4 => SendInvalidate,
            0x5 => SendSolicited,
            0x6 => SendSolicitedInvalidate,
            0x7 => Terminate,
            0x8 => ImmediateData,
            0x9 => ImmediateDataSolicited,
            0xa => AtomicRequest,
            0xb => AtomicResponse,
            0xc => FlushRequest,
            0xd => FlushResponse,
            0xe => VerifyRequest,
            0xf => VerifyResponse,
            0x10 => AtomicWriteRequest,
            0x11 => AtomicWriteResponse,
            _ => return None,
        })
    }

    pub const fn to_u8(self) -> u8 {
        self as u8
    }

    pub fn extension(self) -> Extension {
        match self as u8 {
            0x0..=0x7 => Extension::Rfc5040,
            0x8..=0xb => Extension::Rfc7306,
            _ => Extension::Commit,
        }
    }

    /// Write and Read Response use the tagged model; everything else is
    /// untagged (RFC 5040 figure 4 and its extensions).
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// The DDP queue an untagged message must use; `None` when tagged.
    pub fn queue(self) -> Option<u32> {
        use Opcode::*;
        match self {
            Write | ReadResponse => None,
            Send
            | SendInvalidate
            | SendSolicited
            | SendSolicitedInvalidate
            | ImmediateData
            | ImmediateDataSolicited => Some(QN_SEND),
            ReadRequest | AtomicRequest | FlushRequest | VerifyRequest | AtomicWriteRequest => {
                Some(QN_READ_REQUEST)
            }
            Terminate => Some(QN_TERMINATE),
            AtomicResponse | FlushResponse | VerifyResponse | AtomicWriteResponse => {
                Some(QN_ATOMIC_RESPONSE)
            }
        }
    }

    /// The Invalidate STag field (RsvdULP bits 8..40) is meaningful. The
    /// commit draft marks it optional on its requests (table 1: "opt").
    pub fn has_invalidate_stag(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            SendInvalidate
                | SendSolicitedInvalidate
                | FlushRequest
                | VerifyRequest
                | AtomicWriteRequest
        )
    }

    /// Messages that ask for a solicited event at the receiver.
    pub fn is_solicited(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            SendSolicited | SendSolicitedInvalidate | ImmediateDataSolicited
        )
    }

    /// Messages that may carry ULP payload (RFC 5040 figure 5, RFC 7306
    /// figure 3, draft table 3); the others carry only RDMAP headers.
    pub fn carries_ulp_payload(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            Write | ReadResponse | Send | SendInvalidate | SendSolicited | SendSolicitedInvalidate
        )
    }

    /// Length of the fixed RDMAP header that follows the DDP header, or the
    /// minimum when the message is variable (Terminate, Verify).
    pub fn rdmap_header_len(self) -> usize {
        use Opcode::*;
        match self {
            ReadRequest => READ_REQUEST_LEN,
            Terminate => super::terminate::CTRL_LEN,
            ImmediateData | ImmediateDataSolicited => super::atomic::IMMEDIATE_LEN,
            AtomicRequest => super::atomic::REQUEST_LEN,
            AtomicResponse => super::atomic::RESPONSE_LEN,
            FlushRequest => super::commit::FLUSH_REQUEST_LEN,
            VerifyRequest => super::commit::VERIFY_REQUEST_MIN_LEN,
            AtomicWriteRequest => super::commit::ATOMIC_WRITE_REQUEST_LEN,
            Write
            | ReadResponse
            | Send
            | SendInvalidate
            | SendSolicited
            | SendSolicitedInvalidate
            | FlushResponse
            | VerifyResponse
            | AtomicWriteResponse => 0,
        }
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op as u8
    }
}

/// The RDMAP control byte: RV (2 bits), reserved, opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ctrl {
    pub version: u8,
    /// Raw opcode; see [`Ctrl::opcode`].
    pub opcode: u8,
}

impl Ctrl {
    /// Current version, given opcode.
    pub const fn new(op: Opcode) -> Ctrl {
        Ctrl {
            version: RDMAP_VERSION,
            opcode: op as u8,
        }
    }

    pub const fn from_byte(b: u8) -> Ctrl {
        Ctrl {
            version: (b & MASK_RV) >> 6,
            opcode: b & MASK_OPCODE,
        }
    }

    pub const fn to_byte(self) -> u8 {
        ((self.version << 6) & MASK_RV) | (self.opcode & MASK_OPCODE)
    }

    pub fn opcode(self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }

    /// `BadVersion` unless RV is 1 (RFC 5040 section 7.2: answered with
    /// remote operation error / invalid RDMAP version).
    pub fn check_version(self) -> Result<()> {
        if self.version == RDMAP_VERSION {
            Ok(())
        } else {
            Err(Error::BadVersion)
        }
    }
}

/// The RDMA Read Request header (RFC 5040 section 4.4, figure 6).
pub const READ_REQUEST_LEN: usize = 28;

mod field {
    use super::Field;

    pub const SINK_STAG: Field = 0..4;
    pub const SINK_TO: Field = 4..12;
    pub const RDMARDSZ: Field = 12..16;
    pub const SRC_STAG: Field = 16..20;
    pub const SRC_TO: Field = 20..28;
}

/// A view over an RDMA Read Request header (the payload of the untagged
/// DDP segment on QN 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequestPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ReadRequestPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < READ_REQUEST_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn sink_stag(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::SINK_STAG)
    }

    pub fn sink_to(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::SINK_TO)
    }

    /// RDMARDSZ: bytes to read, 0 to 2^32-1.
    pub fn size(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::RDMARDSZ)
    }

    pub fn src_stag(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::SRC_STAG)
    }

    pub fn src_to(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::SRC_TO)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReadRequestPacket<T> {
    pub fn set_sink_stag(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::SINK_STAG, v);
    }

    pub fn set_sink_to(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), field::SINK_TO, v);
    }

    pub fn set_size(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::RDMARDSZ, v);
    }

    pub fn set_src_stag(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::SRC_STAG, v);
    }

    pub fn set_src_to(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), field::SRC_TO, v);
    }
}

/// A parsed RDMA Read Request. The sink fields are copied untouched into
/// the Read Response's tagged DDP header (RFC 5040 section 4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadRequestRepr {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub src_stag: u32,
    pub src_to: u64,
}

impl ReadRequestRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &ReadRequestPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(ReadRequestRepr {
            sink_stag: packet.sink_stag(),
            sink_to: packet.sink_to(),
            size: packet.size(),
            src_stag: packet.src_stag(),
            src_to: packet.src_to(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }

    /// The packet must be at least [`READ_REQUEST_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut ReadRequestPacket<&mut T>,
    ) {
        packet.set_sink_stag(self.sink_stag);
        packet.set_sink_to(self.sink_to);
        packet.set_size(self.size);
        packet.set_src_stag(self.src_stag);
        packet.set_src_to(self.src_to);
    }

    /// The header a Terminate carries back for a read that failed after
    /// `done` bytes (RFC 5040 section 4.8): both offsets advanced, size
    /// reduced to what is left.
    pub fn advanced(&self, done: u32) -> ReadRequestRepr {
        ReadRequestRepr {
            sink_to: self.sink_to.wrapping_add(u64::from(done)),
            size: self.size.saturating_sub(done),
            src_to: self.src_to.wrapping_add(u64::from(done)),
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ddp::{HeaderRepr, Kind};
    use proptest::prelude::*;

    /// RFC 5040 figure 12: a whole Read Request segment (DDP header, then
    /// the 28-byte Read Request header).
    const READ_REQ_SEGMENT: [u8; 46] = [
        0x41, 0x41, // L, DV=1 | RV=1, opcode 1
        0x00, 0x00, 0x00, 0x00, // reserved
        0x00, 0x00, 0x00, 0x01, // QN 1
        0x00, 0x00, 0x00, 0x05, // MSN 5
        0x00, 0x00, 0x00, 0x00, // MO 0
        0x00, 0x00, 0xab, 0xcd, // SinkSTag
        0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x50, 0x00, // SinkTO
        0x00, 0x01, 0x00, 0x00, // RDMARDSZ 65536
        0x10, 0x20, 0x30, 0x40, // SrcSTag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // SrcTO
    ];

    const READ_REQ: ReadRequestRepr = ReadRequestRepr {
        sink_stag: 0xabcd,
        sink_to: 0x7f00_1234_5000,
        size: 65536,
        src_stag: 0x1020_3040,
        src_to: 0x1000,
    };

    #[test]
    fn read_request_both_ways() {
        let (ddp, off) = HeaderRepr::parse(&READ_REQ_SEGMENT).unwrap();
        assert_eq!(
            ddp.kind,
            Kind::Untagged {
                ulp_word: 0,
                qn: QN_READ_REQUEST,
                msn: 5,
                mo: 0
            }
        );
        let ctrl = Ctrl::from_byte(ddp.rdmap_ctrl);
        assert_eq!(ctrl, Ctrl::new(Opcode::ReadRequest));
        assert_eq!(ctrl.opcode(), Some(Opcode::ReadRequest));
        assert!(ctrl.check_version().is_ok());

        let p = ReadRequestPacket::new_checked(&READ_REQ_SEGMENT[off..]).unwrap();
        let r = ReadRequestRepr::parse(&p).unwrap();
        assert_eq!(r, READ_REQ);

        let mut buf = [0u8; 46];
        let n = ddp.emit(&mut buf);
        r.emit(&mut ReadRequestPacket::new_unchecked(&mut buf[n..]));
        assert_eq!(buf, READ_REQ_SEGMENT);
        assert_eq!(
            ReadRequestPacket::new_checked(&READ_REQ_SEGMENT[off + 1..]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn ctrl_bytes() {
        // RV=1, opcode: RFC 5040 values, RFC 7306 values, commit draft.
        let cases: [(u8, Opcode); 8] = [
            (0x40, Opcode::Write),
            (0x43, Opcode::Send),
            (0x47, Opcode::Terminate),
            (0x48, Opcode::ImmediateData),
            (0x4b, Opcode::AtomicResponse),
            (0x4c, Opcode::FlushRequest),
            (0x50, Opcode::AtomicWriteRequest),
            (0x51, Opcode::AtomicWriteResponse),
        ];
        for (byte, op) in cases {
            let c = Ctrl::from_byte(byte);
            assert_eq!(c.opcode(), Some(op));
            assert_eq!(c.version, 1);
            assert_eq!(Ctrl::new(op).to_byte(), byte);
        }
        // RDMA Consortium version 0, reserved bit 0x20 ignored.
        let c = Ctrl::from_byte(0x23);
        assert_eq!(c.version, 0);
        assert_eq!(c.opcode(), Some(Opcode::Send));
        assert_eq!(c.check_version(), Err(Error::BadVersion));
        assert_eq!(Ctrl::from_byte(0x52).opcode(), None);
        assert_eq!(Ctrl::from_byte(0x5f).opcode(), None);
    }

    #[test]
    fn opcode_table() {
        for v in 0..=u8::MAX {
            if let Some(op) = Opcode::from_u8(v) {
                assert_eq!(op.to_u8(), v);
                assert_eq!(op.is_tagged(), op.queue().is_none());
            }
        }
        assert_eq!(Opcode::from_u8(0x12), None);
        assert_eq!(Opcode::SendSolicitedInvalidate.queue(), Some(QN_SEND));
        assert_eq!(Opcode::AtomicRequest.queue(), Some(QN_READ_REQUEST));
        assert_eq!(Opcode::VerifyResponse.queue(), Some(QN_ATOMIC_RESPONSE));
        assert_eq!(Opcode::Terminate.extension(), Extension::Rfc5040);
        assert_eq!(Opcode::ImmediateData.extension(), Extension::Rfc7306);
        assert_eq!(Opcode::AtomicWriteResponse.extension(), Extension::Commit);
    }

    #[test]
    fn advanced_read() {
        let r = READ_REQ.advanced(2048);
        assert_eq!(r.sink_to, READ_REQ.sink_to + 2048);
        assert_eq!(r.src_to, 0x1800);
        assert_eq!(r.size, 65536 - 2048);
        assert_eq!(r.sink_stag, READ_REQ.sink_stag);
    }

    proptest! {
        #[test]
        fn read_request_round_trip(sink_stag in any::<u32>(), sink_to in any::<u64>(),
                                   size in any::<u32>(), src_stag in any::<u32>(),
                                   src_to in any::<u64>()) {
            let r = ReadRequestRepr { sink_stag, sink_to, size, src_stag, src_to };
            let mut buf = [0u8; READ_REQUEST_LEN];
            r.emit(&mut ReadRequestPacket::new_unchecked(&mut buf[..]));
            let back = ReadRequestRepr::parse(&ReadRequestPacket::new_checked(&buf[..]).unwrap());
            prop_assert_eq!(back.unwrap(), r);
        }

        #[test]
        fn ctrl_round_trip(version in 0u8..4, opcode in 0u8..0x20) {
            let c = Ctrl { version, opcode };
            prop_assert_eq!(Ctrl::from_byte(c.to_byte()), c);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = ReadRequestPacket::new_checked(&bytes[..]) {
                let _ = ReadRequestRepr::parse(&p);
            }
            for &b in &bytes {
                let c = Ctrl::from_byte(b);
                let _ = c.opcode().map(|op| (op.queue(), op.rdmap_header_len()));
            }
        }
    }
}
