//! DDP: Direct Data Placement segments (RFC 5041).
//!
//! A DDP segment is the ULPDU of one MPA FPDU. Its header comes in two
//! layouts chosen by the T bit of the first octet (RFC 5041 section 4.2):
//!
//! ```text
//! Tagged (14 octets)                    Untagged (18 octets)
//!  0       1       2..6     6..14        0       1       2..6     6..10  10..14  14..18
//! +-------+-------+--------+--------+   +-------+-------+--------+------+-------+------+
//! |T|L|Rsv|RsvdULP|  STag  |   TO   |   |T|L|Rsv|   RsvdULP (40) |  QN  |  MSN  |  MO  |
//! |   |DV | (8)   |        |        |   |   |DV |       |        |      |       |      |
//! +-------+-------+--------+--------+   +-------+-------+--------+------+-------+------+
//! ```
//!
//! RDMAP owns the RsvdULP octets: the first carries the RDMAP control byte
//! (RFC 5040 section 4.1), the next four of an untagged header the
//! Invalidate STag or other per-message words.

use super::{be, Error, Field, Rest, Result};

/// DV field value of RFC 5041 (section 4.2).
pub const DDP_VERSION: u8 = 1;
pub const TAGGED_HDR_LEN: usize = 14;
pub const UNTAGGED_HDR_LEN: usize = 18;

/// Send, Send with Invalidate/SE, Immediate Data (RFC 5040 section 4.1,
/// RFC 7306 section 6.3).
pub const QN_SEND: u32 = 0;
/// RDMA Read Request (RFC 5040), and also Atomic Request (RFC 7306 section
/// 5.2) and Flush/Verify/Atomic Write Request (draft-talpey-rdma-commit-01
/// section 3.1), which share the IRD/ORD flow control of reads.
pub const QN_READ_REQUEST: u32 = 1;
/// Terminate (RFC 5040 section 4.1).
pub const QN_TERMINATE: u32 = 2;
/// Atomic Response (RFC 7306 section 10.2), and also the Flush/Verify/Atomic
/// Write Responses of draft-talpey-rdma-commit-01 section 3.1.
pub const QN_ATOMIC_RESPONSE: u32 = 3;
/// Alias under the name the commit draft's responses would look for.
pub const QN_RESPONSE: u32 = QN_ATOMIC_RESPONSE;

/// T: tagged buffer model.
pub const FLAG_TAGGED: u8 = 0x80;
/// L: last segment of a DDP message.
pub const FLAG_LAST: u8 = 0x40;
/// Reserved bits of the DDP control octet: sent as zero, not checked.
const MASK_RSVD: u8 = 0x3c;
/// DV: DDP version.
const MASK_DV: u8 = 0x03;

mod field {
    use super::{Field, Rest};

    /// T, L, Rsvd, DV.
    pub const DDP_CTRL: usize = 0;
    /// First RsvdULP octet: the RDMAP control byte.
    pub const RDMAP_CTRL: usize = 1;

    pub const T_STAG: Field = 2..6;
    pub const T_TO: Field = 6..14;
    pub const T_PAYLOAD: Rest = 14..;

    /// The remaining 32 RsvdULP bits of an untagged header.
    pub const U_RSVD_ULP: Field = 2..6;
    pub const U_QN: Field = 6..10;
    pub const U_MSN: Field = 10..14;
    pub const U_MO: Field = 14..18;
    pub const U_PAYLOAD: Rest = 18..;
}

/// The T bit of the segment at the head of `ulpdu`, once one byte is there.
pub fn is_tagged(ulpdu: &[u8]) -> Option<bool> {
    ulpdu.first().map(|b| b & FLAG_TAGGED != 0)
}

/// Header length for the layout the T bit selects.
pub fn header_len(ulpdu: &[u8]) -> Option<usize> {
    is_tagged(ulpdu).map(|t| if t { TAGGED_HDR_LEN } else { UNTAGGED_HDR_LEN })
}

macro_rules! common_accessors {
    () => {
        pub const fn new_unchecked(buffer: T) -> Self {
            Self { buffer }
        }

        pub fn into_inner(self) -> T {
            self.buffer
        }

        pub fn tagged(&self) -> bool {
            self.buffer.as_ref()[field::DDP_CTRL] & FLAG_TAGGED != 0
        }

        pub fn last(&self) -> bool {
            self.buffer.as_ref()[field::DDP_CTRL] & FLAG_LAST != 0
        }

        pub fn version(&self) -> u8 {
            self.buffer.as_ref()[field::DDP_CTRL] & MASK_DV
        }

        /// The reserved bits of the DDP control octet (not checked on receive).
        pub fn reserved(&self) -> u8 {
            (self.buffer.as_ref()[field::DDP_CTRL] & MASK_RSVD) >> 2
        }

        pub fn rdmap_ctrl(&self) -> u8 {
            self.buffer.as_ref()[field::RDMAP_CTRL]
        }
    };
}

macro_rules! common_setters {
    () => {
        /// Writes T (fixed by the layout), L and DV; reserved bits go out as zero.
        pub fn set_ddp_ctrl(&mut self, last: bool, version: u8) {
            let mut b = (version & MASK_DV) | Self::T_BIT;
            if last {
                b |= FLAG_LAST;
            }
            self.buffer.as_mut()[field::DDP_CTRL] = b;
        }

        pub fn set_rdmap_ctrl(&mut self, ctrl: u8) {
            self.buffer.as_mut()[field::RDMAP_CTRL] = ctrl;
        }
    };
}

/// A view over a tagged DDP segment (RFC 5041 section 4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TaggedPacket<T> {
    const T_BIT: u8 = FLAG_TAGGED;

    common_accessors!();

    /// Checks the length and that the T bit says tagged.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let buf = self.buffer.as_ref();
        match is_tagged(buf) {
            None => Err(Error::Truncated),
            Some(false) => Err(Error::Malformed("untagged segment in a tagged view")),
            Some(true) if buf.len() < TAGGED_HDR_LEN => Err(Error::Truncated),
            Some(true) => Ok(()),
        }
    }

    pub fn stag(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::T_STAG)
    }

    pub fn to(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::T_TO)
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::T_PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TaggedPacket<T> {
    common_setters!();

    pub fn set_stag(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::T_STAG, v);
    }

    pub fn set_to(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), field::T_TO, v);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::T_PAYLOAD]
    }
}

/// A view over an untagged DDP segment (RFC 5041 section 4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UntaggedPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UntaggedPacket<T> {
    const T_BIT: u8 = 0;

    common_accessors!();

    /// Checks the length and that the T bit says untagged.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let buf = self.buffer.as_ref();
        match is_tagged(buf) {
            None => Err(Error::Truncated),
            Some(true) => Err(Error::Malformed("tagged segment in an untagged view")),
            Some(false) if buf.len() < UNTAGGED_HDR_LEN => Err(Error::Truncated),
            Some(false) => Ok(()),
        }
    }

    /// RsvdULP bits 8..40: the Invalidate STag of Send with Invalidate
    /// (RFC 5040 section 4.1), zero for most other messages.
    pub fn ulp_word(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::U_RSVD_ULP)
    }

    pub fn qn(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::U_QN)
    }

    pub fn msn(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::U_MSN)
    }

    pub fn mo(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::U_MO)
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::U_PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UntaggedPacket<T> {
    common_setters!();

    pub fn set_ulp_word(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::U_RSVD_ULP, v);
    }

    pub fn set_qn(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::U_QN, v);
    }

    pub fn set_msn(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::U_MSN, v);
    }

    pub fn set_mo(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::U_MO, v);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::U_PAYLOAD]
    }
}

/// The buffer model of a segment and its addressing fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Placement at STag + TO (RFC 5041 section 4.3).
    Tagged { stag: u32, to: u64 },
    /// Placement into the MSN-th buffer of queue QN at offset MO (RFC 5041
    /// section 4.4). `ulp_word` is RsvdULP bits 8..40 (Invalidate STag etc.).
    Untagged {
        ulp_word: u32,
        qn: u32,
        msn: u32,
        mo: u32,
    },
}

impl Kind {
    pub fn is_tagged(&self) -> bool {
        matches!(self, Kind::Tagged { .. })
    }

    pub fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HDR_LEN
        } else {
            UNTAGGED_HDR_LEN
        }
    }
}

/// A parsed DDP header, with the RDMAP control byte it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeaderRepr {
    pub last: bool,
    pub version: u8,
    /// The RDMAP control byte, which lives in the first RsvdULP octet.
    pub rdmap_ctrl: u8,
    pub kind: Kind,
}

impl HeaderRepr {
    /// Decodes the DDP header at the start of a ULPDU and returns it with
    /// the offset of the payload.
    ///
    /// The version is checked before the length: a segment of another DDP
    /// version may not have this layout at all, and RFC 5041 section 7.2
    /// wants its own Terminate for it. `BadVersion` is returned only for
    /// that, with at least the first octet present, so [`is_tagged`] tells
    /// which of the two version error codes applies.
    #[inline]
    pub fn parse(ulpdu: &[u8]) -> Result<(HeaderRepr, usize)> {
        let ctrl = *ulpdu.first().ok_or(Error::Truncated)?;
        let tagged = ctrl & FLAG_TAGGED != 0;
        let version = ctrl & MASK_DV;
        if version != DDP_VERSION {
            return Err(Error::BadVersion);
        }
        let repr = if tagged {
            let p = TaggedPacket::new_checked(ulpdu)?;
            HeaderRepr {
                last: p.last(),
                version,
                rdmap_ctrl: p.rdmap_ctrl(),
                kind: Kind::Tagged {
                    stag: p.stag(),
                    to: p.to(),
                },
            }
        } else {
            let p = UntaggedPacket::new_checked(ulpdu)?;
            HeaderRepr {
                last: p.last(),
                version,
                rdmap_ctrl: p.rdmap_ctrl(),
                kind: Kind::Untagged {
                    ulp_word: p.ulp_word(),
                    qn: p.qn(),
                    msn: p.msn(),
                    mo: p.mo(),
                },
            }
        };
        Ok((repr, repr.buffer_len()))
    }

    pub fn buffer_len(&self) -> usize {
        self.kind.header_len()
    }

    /// Writes the header at the start of `buf` (at least `buffer_len()`
    /// bytes) and returns its length, i.e. where the payload goes.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        match self.kind {
            Kind::Tagged { stag, to } => {
                let mut p = TaggedPacket::new_unchecked(&mut buf[..TAGGED_HDR_LEN]);
                p.set_ddp_ctrl(self.last, self.version);
                p.set_rdmap_ctrl(self.rdmap_ctrl);
                p.set_stag(stag);
                p.set_to(to);
            }
            Kind::Untagged {
                ulp_word,
                qn,
                msn,
                mo,
            } => {
                let mut p = UntaggedPacket::new_unchecked(&mut buf[..UNTAGGED_HDR_LEN]);
                p.set_ddp_ctrl(self.last, self.version);
                p.set_rdmap_ctrl(self.rdmap_ctrl);
                p.set_ulp_word(ulp_word);
                p.set_qn(qn);
                p.set_msn(msn);
                p.set_mo(mo);
            }
        }
        self.buffer_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RDMA Write, last segment, STag 0x11223344, TO 0x0102030405060708,
    /// then two payload bytes (RFC 5040 figure 11 layout).
    const WRITE: [u8; 16] = [
        0xc1, 0x40, // T L DV=1 | RV=1 opcode 0
        0x11, 0x22, 0x33, 0x44, // STag
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // TO
        0xde, 0xad,
    ];

    /// Send with Invalidate, not last: invalidate STag 0xcafef00d, QN 0,
    /// MSN 7, MO 0x1000 (RFC 5040 figure 15 layout).
    const SEND_INV: [u8; 18] = [
        0x01, 0x44, // DV=1 | RV=1 opcode 4
        0xca, 0xfe, 0xf0, 0x0d, // Invalidate STag
        0x00, 0x00, 0x00, 0x00, // QN
        0x00, 0x00, 0x00, 0x07, // MSN
        0x00, 0x00, 0x10, 0x00, // MO
    ];

    #[test]
    fn tagged_both_ways() {
        let (h, off) = HeaderRepr::parse(&WRITE).unwrap();
        assert_eq!(off, TAGGED_HDR_LEN);
        assert_eq!(
            h,
            HeaderRepr {
                last: true,
                version: 1,
                rdmap_ctrl: 0x40,
                kind: Kind::Tagged {
                    stag: 0x1122_3344,
                    to: 0x0102_0304_0506_0708
                },
            }
        );
        let mut buf = [0xffu8; 14];
        assert_eq!(h.emit(&mut buf), 14);
        assert_eq!(buf, WRITE[..14]);
        let p = TaggedPacket::new_checked(&WRITE[..]).unwrap();
        assert_eq!(p.payload(), &[0xde, 0xad]);
    }

    #[test]
    fn untagged_both_ways() {
        let (h, off) = HeaderRepr::parse(&SEND_INV).unwrap();
        assert_eq!(off, UNTAGGED_HDR_LEN);
        assert_eq!(
            h,
            HeaderRepr {
                last: false,
                version: 1,
                rdmap_ctrl: 0x44,
                kind: Kind::Untagged {
                    ulp_word: 0xcafe_f00d,
                    qn: QN_SEND,
                    msn: 7,
                    mo: 0x1000
                },
            }
        );
        let mut buf = [0xffu8; 18];
        assert_eq!(h.emit(&mut buf), 18);
        assert_eq!(buf, SEND_INV);
        assert!(UntaggedPacket::new_checked(&SEND_INV[..])
            .unwrap()
            .payload()
            .is_empty());
    }

    #[test]
    fn errors() {
        assert_eq!(HeaderRepr::parse(&[]).unwrap_err(), Error::Truncated);
        assert_eq!(
            HeaderRepr::parse(&WRITE[..13]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            HeaderRepr::parse(&SEND_INV[..17]).unwrap_err(),
            Error::Truncated
        );
        let mut w = WRITE;
        w[0] = 0xc2; // DV = 2
        assert_eq!(HeaderRepr::parse(&w).unwrap_err(), Error::BadVersion);
        assert_eq!(is_tagged(&w), Some(true));
        // Version is judged before length.
        assert_eq!(HeaderRepr::parse(&[0x00]).unwrap_err(), Error::BadVersion);
        assert_eq!(is_tagged(&[0x00]), Some(false));
        // Reserved bits are ignored.
        let mut s = SEND_INV;
        s[0] |= 0x3c;
        assert!(HeaderRepr::parse(&s).is_ok());
        assert!(TaggedPacket::new_checked(&SEND_INV[..]).is_err());
        assert!(UntaggedPacket::new_checked(&WRITE[..]).is_err());
    }

    fn arb_header() -> impl Strategy<Value = HeaderRepr> {
        let kind = prop_oneof![
            (any::<u32>(), any::<u64>()).prop_map(|(stag, to)| Kind::Tagged { stag, to }),
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
                |(ulp_word, qn, msn, mo)| Kind::Untagged {
                    ulp_word,
                    qn,
                    msn,
                    mo
                }
            ),
        ];
        (any::<bool>(), any::<u8>(), kind).prop_map(|(last, rdmap_ctrl, kind)| HeaderRepr {
            last,
            version: DDP_VERSION,
            rdmap_ctrl,
            kind,
        })
    }

    proptest! {
        #[test]
        fn round_trip(h in arb_header(), extra in proptest::collection::vec(any::<u8>(), 0..8)) {
            let mut buf = vec![0u8; h.buffer_len()];
            let n = h.emit(&mut buf);
            buf.extend_from_slice(&extra);
            let (back, off) = HeaderRepr::parse(&buf).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(off, n);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = HeaderRepr::parse(&bytes);
            let _ = header_len(&bytes);
            if let Ok(p) = TaggedPacket::new_checked(&bytes[..]) {
                let _ = (p.stag(), p.to(), p.payload(), p.reserved(), p.version(), p.last());
            }
            if let Ok(p) = UntaggedPacket::new_checked(&bytes[..]) {
                let _ = (p.ulp_word(), p.qn(), p.msn(), p.mo(), p.payload(), p.rdmap_ctrl());
            }
        }
    }
}
