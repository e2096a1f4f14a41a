//! draft-talpey-rdma-commit-01: RDMA Flush, RDMA Verify and Atomic Write.
//!
//! Requests are untagged messages on QN 1, responses on QN 3 (section
//! 3.1). Each request body follows the 18-byte untagged DDP header; the
//! Appendix A figures leave out the DDP Message Offset word, which every
//! untagged DDP header has (RFC 5041 section 4.4), so the bodies here are
//! placed after a complete header. Flush and Atomic Write Responses carry
//! no payload.

use super::{be, Error, Field, Rest, Result};

/// Flush Request body (section 3.1.1.1).
pub const FLUSH_REQUEST_LEN: usize = 20;
/// Verify Request body without its optional hash (section 3.1.2.1).
pub const VERIFY_REQUEST_MIN_LEN: usize = 16;
/// Atomic Write Request body (section 3.1.3.1).
pub const ATOMIC_WRITE_REQUEST_LEN: usize = 24;
/// The only Data Sink Length an Atomic Write may carry, and its alignment.
pub const ATOMIC_WRITE_DATA_LEN: u32 = 8;

/// P: flush to persistence (section 3.1.1.1).
pub const FLUSH_PERSISTENCE: u32 = 0x01;
/// G: flush to global visibility (section 3.1.1.1).
pub const FLUSH_GLOBAL_VISIBILITY: u32 = 0x02;
/// Every disposition flag the draft defines.
pub const FLUSH_KNOWN_FLAGS: u32 = FLUSH_PERSISTENCE | FLUSH_GLOBAL_VISIBILITY;

/// The Data Sink STag/Length/TO prefix is shared by all three requests.
mod field {
    use super::{Field, Rest};

    pub const STAG: Field = 0..4;
    pub const LENGTH: Field = 4..8;
    pub const TO: Field = 8..16;
    /// Flush: disposition flags (G and P in the low bits).
    pub const FLUSH_FLAGS: Field = 16..20;
    /// Verify: the expected hash, to the end of the message.
    pub const VERIFY_HASH: Rest = 16..;
    /// Atomic Write: the 64-bit value.
    pub const ATOMIC_WRITE_DATA: Field = 16..24;
}

macro_rules! request_view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            pub fn new_checked(buffer: T) -> Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            pub fn check_len(&self) -> Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err(Error::Truncated)
                } else {
                    Ok(())
                }
            }

            pub fn into_inner(self) -> T {
                self.buffer
            }

            pub fn stag(&self) -> u32 {
                be::u32_at(self.buffer.as_ref(), field::STAG)
            }

            pub fn length(&self) -> u32 {
                be::u32_at(self.buffer.as_ref(), field::LENGTH)
            }

            pub fn to(&self) -> u64 {
                be::u64_at(self.buffer.as_ref(), field::TO)
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            pub fn set_stag(&mut self, v: u32) {
                be::put_u32(self.buffer.as_mut(), field::STAG, v);
            }

            pub fn set_length(&mut self, v: u32) {
                be::put_u32(self.buffer.as_mut(), field::LENGTH, v);
            }

            pub fn set_to(&mut self, v: u64) {
                be::put_u64(self.buffer.as_mut(), field::TO, v);
            }
        }
    };
}

request_view!(
    /// A view over an RDMA Flush Request body.
    FlushRequestPacket,
    FLUSH_REQUEST_LEN
);
request_view!(
    /// A view over an RDMA Verify Request body (the hash runs to the end).
    VerifyRequestPacket,
    VERIFY_REQUEST_MIN_LEN
);
request_view!(
    /// A view over an Atomic Write Request body.
    AtomicWriteRequestPacket,
    ATOMIC_WRITE_REQUEST_LEN
);

impl<T: AsRef<[u8]>> FlushRequestPacket<T> {
    pub fn flags(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::FLUSH_FLAGS)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> FlushRequestPacket<T> {
    pub fn set_flags(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), field::FLUSH_FLAGS, v);
    }
}

impl<T: AsRef<[u8]>> VerifyRequestPacket<T> {
    /// The expected hash, possibly empty.
    pub fn hash(&self) -> &[u8] {
        &self.buffer.as_ref()[field::VERIFY_HASH]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VerifyRequestPacket<T> {
    pub fn hash_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::VERIFY_HASH]
    }
}

impl<T: AsRef<[u8]>> AtomicWriteRequestPacket<T> {
    pub fn data(&self) -> [u8; 8] {
        let mut d = [0; 8];
        d.copy_from_slice(&self.buffer.as_ref()[field::ATOMIC_WRITE_DATA]);
        d
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicWriteRequestPacket<T> {
    pub fn set_data(&mut self, d: [u8; 8]) {
        self.buffer.as_mut()[field::ATOMIC_WRITE_DATA].copy_from_slice(&d);
    }
}

/// An RDMA Flush Request (section 3.1.1.1): make `length` bytes at
/// `stag`+`to` persistent and/or globally visible, as `flags` say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlushRequestRepr {
    pub stag: u32,
    pub length: u32,
    pub to: u64,
    /// Raw disposition flags; unknown bits are kept for the caller to judge.
    pub flags: u32,
}

impl FlushRequestRepr {
    pub fn persistence(&self) -> bool {
        self.flags & FLUSH_PERSISTENCE != 0
    }

    pub fn global_visibility(&self) -> bool {
        self.flags & FLUSH_GLOBAL_VISIBILITY != 0
    }

    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &FlushRequestPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(FlushRequestRepr {
            stag: packet.stag(),
            length: packet.length(),
            to: packet.to(),
            flags: packet.flags(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        FLUSH_REQUEST_LEN
    }

    /// The packet must be at least [`FLUSH_REQUEST_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut FlushRequestPacket<&mut T>,
    ) {
        packet.set_stag(self.stag);
        packet.set_length(self.length);
        packet.set_to(self.to);
        packet.set_flags(self.flags);
    }
}

/// An RDMA Verify Request (section 3.1.2.1): hash `length` bytes at
/// `stag`+`to`; with a non-empty `hash`, compare and Terminate on mismatch.
/// The hash algorithm is agreed out of band, so its length is whatever
/// follows the fixed fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VerifyRequestRepr<'a> {
    pub stag: u32,
    pub length: u32,
    pub to: u64,
    pub hash: &'a [u8],
}

impl<'a> VerifyRequestRepr<'a> {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &VerifyRequestPacket<&'a T>) -> Result<Self> {
        packet.check_len()?;
        let data: &'a T = packet.buffer;
        let buf = data.as_ref();
        Ok(VerifyRequestRepr {
            stag: packet.stag(),
            length: packet.length(),
            to: packet.to(),
            hash: &buf[field::VERIFY_HASH],
        })
    }

    pub fn buffer_len(&self) -> usize {
        VERIFY_REQUEST_MIN_LEN + self.hash.len()
    }

    /// The packet must be exactly `buffer_len()` bytes, since the hash
    /// runs to the end of the message.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut VerifyRequestPacket<&mut T>,
    ) {
        packet.set_stag(self.stag);
        packet.set_length(self.length);
        packet.set_to(self.to);
        packet.hash_mut()[..self.hash.len()].copy_from_slice(self.hash);
    }
}

/// An RDMA Verify Response (section 3.1.2.2): the computed hash is the
/// whole body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VerifyResponseRepr<'a> {
    pub hash: &'a [u8],
}

impl<'a> VerifyResponseRepr<'a> {
    pub fn parse(body: &'a [u8]) -> Result<Self> {
        Ok(VerifyResponseRepr { hash: body })
    }

    pub fn buffer_len(&self) -> usize {
        self.hash.len()
    }

    pub fn emit(&self, buf: &mut [u8]) {
        buf[..self.hash.len()].copy_from_slice(self.hash);
    }
}

/// An Atomic Write Request (section 3.1.3.1): place 8 bytes at
/// `stag`+`to` (8-byte aligned) in one indivisible store.
///
/// `data` keeps the 8 bytes as they are on the wire: the draft calls them
/// a big-endian 64-bit value, and [`AtomicWriteRequestRepr::value`] reads
/// them so; storing the wire bytes unchanged keeps byte-oriented verbs
/// (which hand over 8 bytes) transparent end to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicWriteRequestRepr {
    pub stag: u32,
    /// Data Sink Length: MUST be 8; kept raw so a bad value can be reported.
    pub length: u32,
    pub to: u64,
    pub data: [u8; 8],
}

impl AtomicWriteRequestRepr {
    pub const fn new(stag: u32, to: u64, data: [u8; 8]) -> Self {
        AtomicWriteRequestRepr {
            stag,
            length: ATOMIC_WRITE_DATA_LEN,
            to,
            data,
        }
    }

    pub fn value(&self) -> u64 {
        u64::from_be_bytes(self.data)
    }

    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &AtomicWriteRequestPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(AtomicWriteRequestRepr {
            stag: packet.stag(),
            length: packet.length(),
            to: packet.to(),
            data: packet.data(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        ATOMIC_WRITE_REQUEST_LEN
    }

    /// The packet must be at least [`ATOMIC_WRITE_REQUEST_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut AtomicWriteRequestPacket<&mut T>,
    ) {
        packet.set_stag(self.stag);
        packet.set_length(self.length);
        packet.set_to(self.to);
        packet.set_data(self.data);
    }
}

/// The body of a Flush Response (section 3.1.1.2) or Atomic Write Response
/// (section 3.1.3.2): nothing. The DDP header's MSN on QN 3 is what ties it
/// to its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EmptyResponseRepr;

impl EmptyResponseRepr {
    /// Any bytes present are ignored: the draft passes "no payload", and a
    /// stray byte is no reason to tear a connection down.
    pub fn parse(_body: &[u8]) -> Result<Self> {
        Ok(EmptyResponseRepr)
    }

    pub fn buffer_len(&self) -> usize {
        0
    }

    pub fn emit(&self, _buf: &mut [u8]) {}
}

pub type FlushResponseRepr = EmptyResponseRepr;
pub type AtomicWriteResponseRepr = EmptyResponseRepr;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ddp::{self, HeaderRepr, Kind, QN_READ_REQUEST};
    use crate::wire::rdmap::{Ctrl, Opcode};
    use proptest::prelude::*;

    /// Appendix A.1 with the DDP Message Offset restored: a Flush Request
    /// for 4096 bytes at STag 0x100, TO 0x2000, to persistence and global
    /// visibility.
    const FLUSH_SEGMENT: [u8; 38] = [
        0x41, 0x4c, // L, DV=1 | RV=1, opcode 0xC
        0x00, 0x00, 0x00, 0x00, // reserved / Invalidate STag
        0x00, 0x00, 0x00, 0x01, // QN 1
        0x00, 0x00, 0x00, 0x09, // MSN 9
        0x00, 0x00, 0x00, 0x00, // MO 0
        0x00, 0x00, 0x01, 0x00, // Data Sink STag
        0x00, 0x00, 0x10, 0x00, // Data Sink Length
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, // Data Sink TO
        0x00, 0x00, 0x00, 0x03, // G | P
    ];

    #[test]
    fn flush_both_ways() {
        let (h, off) = HeaderRepr::parse(&FLUSH_SEGMENT).unwrap();
        assert_eq!(
            Ctrl::from_byte(h.rdmap_ctrl).opcode(),
            Some(Opcode::FlushRequest)
        );
        assert_eq!(
            h.kind,
            Kind::Untagged {
                ulp_word: 0,
                qn: QN_READ_REQUEST,
                msn: 9,
                mo: 0
            }
        );
        let p = FlushRequestPacket::new_checked(&FLUSH_SEGMENT[off..]).unwrap();
        let f = FlushRequestRepr::parse(&p).unwrap();
        assert_eq!(
            f,
            FlushRequestRepr {
                stag: 0x100,
                length: 4096,
                to: 0x2000,
                flags: FLUSH_PERSISTENCE | FLUSH_GLOBAL_VISIBILITY
            }
        );
        assert!(f.persistence() && f.global_visibility());

        let mut out = [0u8; 38];
        let n = h.emit(&mut out);
        f.emit(&mut FlushRequestPacket::new_unchecked(&mut out[n..]));
        assert_eq!(out, FLUSH_SEGMENT);
        assert_eq!(
            FlushRequestPacket::new_checked(&FLUSH_SEGMENT[off..37]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn verify_both_ways() {
        let body = [
            0x00, 0x00, 0x00, 0x07, // STag
            0x00, 0x00, 0x02, 0x00, // Length 512
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, // TO
            0xde, 0xad, 0xbe, 0xef, // hash
        ];
        let p = VerifyRequestPacket::new_checked(&body[..]).unwrap();
        let v = VerifyRequestRepr::parse(&p).unwrap();
        assert_eq!(
            v,
            VerifyRequestRepr {
                stag: 7,
                length: 512,
                to: 0x40,
                hash: &[0xde, 0xad, 0xbe, 0xef]
            }
        );
        let mut out = [0u8; 20];
        v.emit(&mut VerifyRequestPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, body);

        // Without a hash: no comparison requested.
        let v = VerifyRequestRepr::parse(&VerifyRequestPacket::new_checked(&body[..16]).unwrap())
            .unwrap();
        assert!(v.hash.is_empty());
        assert!(VerifyRequestPacket::new_checked(&body[..15]).is_err());

        let r = VerifyResponseRepr::parse(&body[16..]).unwrap();
        let mut out = [0u8; 4];
        r.emit(&mut out);
        assert_eq!(out, [0xde, 0xad, 0xbe, 0xef]);
    }

    #[test]
    fn atomic_write_both_ways() {
        let body = [
            0x00, 0x00, 0x00, 0x09, // STag
            0x00, 0x00, 0x00, 0x08, // Length 8
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, // TO
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // Data
        ];
        let p = AtomicWriteRequestPacket::new_checked(&body[..]).unwrap();
        let a = AtomicWriteRequestRepr::parse(&p).unwrap();
        assert_eq!(
            a,
            AtomicWriteRequestRepr::new(9, 0x108, [1, 2, 3, 4, 5, 6, 7, 8])
        );
        assert_eq!(a.value(), 0x0102_0304_0506_0708);
        let mut out = [0u8; 24];
        a.emit(&mut AtomicWriteRequestPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, body);
        assert_eq!(
            AtomicWriteRequestRepr::parse(&AtomicWriteRequestPacket::new_unchecked(&body[..23]))
                .unwrap_err(),
            Error::Truncated
        );
    }

    /// Appendix A.2 / A.6: a response is just the untagged DDP header.
    #[test]
    fn empty_responses() {
        let h = HeaderRepr {
            last: true,
            version: 1,
            rdmap_ctrl: Ctrl::new(Opcode::AtomicWriteResponse).to_byte(),
            kind: Kind::Untagged {
                ulp_word: 0,
                qn: ddp::QN_RESPONSE,
                msn: 1,
                mo: 0,
            },
        };
        let mut out = [0u8; 18];
        assert_eq!(h.emit(&mut out), 18);
        assert_eq!(&out[..2], &[0x41, 0x51]);
        assert_eq!(&out[6..10], &[0, 0, 0, 3]);
        let r = AtomicWriteResponseRepr::parse(&[]).unwrap();
        assert_eq!(r.buffer_len(), 0);
        assert_eq!(FlushResponseRepr::parse(&[1]).unwrap(), EmptyResponseRepr);
    }

    proptest! {
        #[test]
        fn flush_round_trip(stag in any::<u32>(), length in any::<u32>(), to in any::<u64>(),
                            flags in any::<u32>()) {
            let f = FlushRequestRepr { stag, length, to, flags };
            let mut buf = [0u8; FLUSH_REQUEST_LEN];
            f.emit(&mut FlushRequestPacket::new_unchecked(&mut buf[..]));
            let back = FlushRequestRepr::parse(&FlushRequestPacket::new_checked(&buf[..]).unwrap());
            prop_assert_eq!(back.unwrap(), f);
        }

        #[test]
        fn verify_round_trip(stag in any::<u32>(), length in any::<u32>(), to in any::<u64>(),
                             hash in proptest::collection::vec(any::<u8>(), 0..64)) {
            let v = VerifyRequestRepr { stag, length, to, hash: &hash };
            let mut buf = vec![0u8; v.buffer_len()];
            v.emit(&mut VerifyRequestPacket::new_unchecked(&mut buf[..]));
            let p = VerifyRequestPacket::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(VerifyRequestRepr::parse(&p).unwrap(), v);

            let r = VerifyResponseRepr { hash: &hash };
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&mut buf);
            prop_assert_eq!(VerifyResponseRepr::parse(&buf).unwrap(), r);
        }

        #[test]
        fn atomic_write_round_trip(stag in any::<u32>(), length in any::<u32>(),
                                   to in any::<u64>(), data in any::<[u8; 8]>()) {
            let a = AtomicWriteRequestRepr { stag, length, to, data };
            let mut buf = [0u8; ATOMIC_WRITE_REQUEST_LEN];
            a.emit(&mut AtomicWriteRequestPacket::new_unchecked(&mut buf[..]));
            let back = AtomicWriteRequestRepr::parse(
                &AtomicWriteRequestPacket::new_checked(&buf[..]).unwrap());
            prop_assert_eq!(back.unwrap(), a);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            // Repr::parse re-checks the length even on an unchecked view.
            let _ = FlushRequestRepr::parse(&FlushRequestPacket::new_unchecked(&bytes[..]));
            let _ = VerifyRequestRepr::parse(&VerifyRequestPacket::new_unchecked(&bytes[..]));
            let _ = AtomicWriteRequestRepr::parse(
                &AtomicWriteRequestPacket::new_unchecked(&bytes[..]));
            let _ = VerifyResponseRepr::parse(&bytes);
            let _ = EmptyResponseRepr::parse(&bytes);
            if let Ok(p) = VerifyRequestPacket::new_checked(&bytes[..]) {
                let _ = (p.stag(), p.length(), p.to(), p.hash());
            }
            if let Ok(p) = FlushRequestPacket::new_checked(&bytes[..]) {
                let _ = p.flags();
            }
            if let Ok(p) = AtomicWriteRequestPacket::new_checked(&bytes[..]) {
                let _ = p.data();
            }
        }
    }
}
