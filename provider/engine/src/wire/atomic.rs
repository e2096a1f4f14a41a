//! RFC 7306: Atomic Operation Request/Response and Immediate Data.
//!
//! All three are untagged messages whose RDMAP header is the whole DDP
//! payload: Atomic Requests on QN 1, Atomic Responses on QN 3, Immediate
//! Data on QN 0 (RFC 7306 sections 4.1, 5.2, 6.3). Values are big-endian on
//! the wire (sections 5.1.1, 5.1.2).

use super::{be, Error, Field, Result};

/// Atomic Operation Request header (RFC 7306 figure 4).
pub const REQUEST_LEN: usize = 52;
/// Atomic Operation Response header (RFC 7306 figure 6).
pub const RESPONSE_LEN: usize = 12;
/// Immediate Data header (RFC 7306 figure 7).
pub const IMMEDIATE_LEN: usize = 8;

/// AOpCode of FetchAdd (RFC 7306 figure 5).
pub const AOPCODE_FETCH_ADD: u8 = 0x0;
/// 0x1 is reserved (RFC 7306 section 10.1); an early draft used it for an
/// unmasked Swap, which the RFC folds into CmpSwap with masks.
pub const AOPCODE_RESERVED_1: u8 = 0x1;
/// AOpCode of CmpSwap (RFC 7306 figure 5).
pub const AOPCODE_CMP_SWAP: u8 = 0x2;
/// The mask value for "not masked": Swap and Compare Masks of an unmasked
/// operation, and the Compare Mask of FetchAdd (RFC 7306 section 5.2.1).
pub const NO_MASK: u64 = u64::MAX;
/// Atomic operations target 64-bit aligned addresses (RFC 7306 section 5.1).
pub const ALIGNMENT: u64 = 8;

/// The atomic operations every RFC 7306 RNIC implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOp {
    FetchAdd = AOPCODE_FETCH_ADD,
    CmpSwap = AOPCODE_CMP_SWAP,
}

impl AtomicOp {
    /// `None` for codes RFC 7306 does not assign (section 5.2.1 rule 4: the
    /// responder surfaces an error).
    pub fn from_u8(v: u8) -> Option<AtomicOp> {
        match v {
            AOPCODE_FETCH_ADD => Some(AtomicOp::FetchAdd),
            AOPCODE_CMP_SWAP => Some(AtomicOp::CmpSwap),
            _ => None,
        }
    }
}

mod req_field {
    use super::Field;

    /// 28 reserved bits, then AOpCode in the low 4 bits of the last octet.
    pub const RSVD_AOPCODE: Field = 0..4;
    pub const AOPCODE: usize = 3;
    pub const REQUEST_ID: Field = 4..8;
    pub const STAG: Field = 8..12;
    pub const TO: Field = 12..20;
    pub const ADD_SWAP_DATA: Field = 20..28;
    pub const ADD_SWAP_MASK: Field = 28..36;
    pub const COMPARE_DATA: Field = 36..44;
    pub const COMPARE_MASK: Field = 44..52;
}

const MASK_AOPCODE: u8 = 0x0f;

/// A view over an Atomic Operation Request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RequestPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < REQUEST_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn aopcode(&self) -> u8 {
        self.buffer.as_ref()[req_field::AOPCODE] & MASK_AOPCODE
    }

    pub fn request_id(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), req_field::REQUEST_ID)
    }

    pub fn stag(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), req_field::STAG)
    }

    pub fn to(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), req_field::TO)
    }

    pub fn add_swap_data(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), req_field::ADD_SWAP_DATA)
    }

    pub fn add_swap_mask(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), req_field::ADD_SWAP_MASK)
    }

    pub fn compare_data(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), req_field::COMPARE_DATA)
    }

    pub fn compare_mask(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), req_field::COMPARE_MASK)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RequestPacket<T> {
    /// Writes AOpCode with the 28 reserved bits zero.
    pub fn set_aopcode(&mut self, v: u8) {
        be::put_u32(
            self.buffer.as_mut(),
            req_field::RSVD_AOPCODE,
            u32::from(v & MASK_AOPCODE),
        );
    }

    pub fn set_request_id(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), req_field::REQUEST_ID, v);
    }

    pub fn set_stag(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), req_field::STAG, v);
    }

    pub fn set_to(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), req_field::TO, v);
    }

    pub fn set_add_swap_data(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), req_field::ADD_SWAP_DATA, v);
    }

    pub fn set_add_swap_mask(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), req_field::ADD_SWAP_MASK, v);
    }

    pub fn set_compare_data(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), req_field::COMPARE_DATA, v);
    }

    pub fn set_compare_mask(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), req_field::COMPARE_MASK, v);
    }
}

/// A parsed Atomic Operation Request. `aopcode` stays raw so that an
/// unsupported code can be reported; see [`AtomicRequestRepr::op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicRequestRepr {
    pub aopcode: u8,
    pub request_id: u32,
    pub stag: u32,
    pub to: u64,
    /// Add Data (FetchAdd) or Swap Data (CmpSwap).
    pub add_swap_data: u64,
    /// Add Mask (field boundaries of FetchAdd) or Swap Mask (CmpSwap).
    pub add_swap_mask: u64,
    pub compare_data: u64,
    pub compare_mask: u64,
}

impl AtomicRequestRepr {
    /// Plain 64-bit FetchAdd: Add Mask 0 adds across all 64 bits, and the
    /// unused compare fields take their "not used" values (section 5.2.1).
    pub const fn fetch_add(request_id: u32, stag: u32, to: u64, add: u64) -> Self {
        Self::masked_fetch_add(request_id, stag, to, add, 0)
    }

    /// FetchAdd on independent fields: a bit set in `boundaries` marks the
    /// most significant bit of a field, whose carry-out is dropped
    /// (section 5.1.1).
    pub const fn masked_fetch_add(
        request_id: u32,
        stag: u32,
        to: u64,
        add: u64,
        boundaries: u64,
    ) -> Self {
        AtomicRequestRepr {
            aopcode: AOPCODE_FETCH_ADD,
            request_id,
            stag,
            to,
            add_swap_data: add,
            add_swap_mask: boundaries,
            compare_data: 0,
            compare_mask: NO_MASK,
        }
    }

    /// Plain compare-and-swap of all 64 bits.
    pub const fn cmp_swap(request_id: u32, stag: u32, to: u64, compare: u64, swap: u64) -> Self {
        Self::masked_cmp_swap(request_id, stag, to, compare, NO_MASK, swap, NO_MASK)
    }

    /// Compare under `compare_mask`, then replace the bits of `swap_mask`
    /// (section 5.1.2).
    pub const fn masked_cmp_swap(
        request_id: u32,
        stag: u32,
        to: u64,
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    ) -> Self {
        AtomicRequestRepr {
            aopcode: AOPCODE_CMP_SWAP,
            request_id,
            stag,
            to,
            add_swap_data: swap,
            add_swap_mask: swap_mask,
            compare_data: compare,
            compare_mask,
        }
    }

    pub fn op(&self) -> Option<AtomicOp> {
        AtomicOp::from_u8(self.aopcode)
    }

    /// The value the target holds afterwards, given its original value
    /// (section 5.1.1 and 5.1.2 pseudo code); `None` for an unknown op.
    pub fn apply(&self, original: u64) -> Option<u64> {
        Some(match self.op()? {
            AtomicOp::FetchAdd => masked_add(original, self.add_swap_data, self.add_swap_mask),
            AtomicOp::CmpSwap => {
                if (self.compare_data ^ original) & self.compare_mask == 0 {
                    (original & !self.add_swap_mask) | (self.add_swap_data & self.add_swap_mask)
                } else {
                    original
                }
            }
        })
    }

    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &RequestPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(AtomicRequestRepr {
            aopcode: packet.aopcode(),
            request_id: packet.request_id(),
            stag: packet.stag(),
            to: packet.to(),
            add_swap_data: packet.add_swap_data(),
            add_swap_mask: packet.add_swap_mask(),
            compare_data: packet.compare_data(),
            compare_mask: packet.compare_mask(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        REQUEST_LEN
    }

    /// The packet must be at least [`REQUEST_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut RequestPacket<&mut T>) {
        packet.set_aopcode(self.aopcode);
        packet.set_request_id(self.request_id);
        packet.set_stag(self.stag);
        packet.set_to(self.to);
        packet.set_add_swap_data(self.add_swap_data);
        packet.set_add_swap_mask(self.add_swap_mask);
        packet.set_compare_data(self.compare_data);
        packet.set_compare_mask(self.compare_mask);
    }
}

/// Addition where the carry out of every bit set in `boundaries` is lost.
fn masked_add(a: u64, b: u64, boundaries: u64) -> u64 {
    if boundaries == 0 {
        return a.wrapping_add(b);
    }
    // Add each field on its own: a field spans from just above one
    // boundary bit up to and including the next.
    let mut result = 0u64;
    let mut low = 0u32;
    while low < 64 {
        let above = boundaries & (u64::MAX << low);
        let high = if above == 0 {
            63
        } else {
            above.trailing_zeros()
        };
        let width = high - low + 1;
        let field = if width == 64 {
            u64::MAX
        } else {
            ((1u64 << width) - 1) << low
        };
        result |= ((a & field).wrapping_add(b & field)) & field;
        low = high + 1;
    }
    result
}

mod resp_field {
    use super::Field;

    pub const REQUEST_ID: Field = 0..4;
    pub const ORIGINAL_VALUE: Field = 4..12;
}

/// A view over an Atomic Operation Response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponsePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ResponsePacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < RESPONSE_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn request_id(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), resp_field::REQUEST_ID)
    }

    pub fn original_value(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), resp_field::ORIGINAL_VALUE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ResponsePacket<T> {
    pub fn set_request_id(&mut self, v: u32) {
        be::put_u32(self.buffer.as_mut(), resp_field::REQUEST_ID, v);
    }

    pub fn set_original_value(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), resp_field::ORIGINAL_VALUE, v);
    }
}

/// A parsed Atomic Operation Response: the request's identifier echoed and
/// the target's value before the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicResponseRepr {
    pub request_id: u32,
    pub original_value: u64,
}

impl AtomicResponseRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &ResponsePacket<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(AtomicResponseRepr {
            request_id: packet.request_id(),
            original_value: packet.original_value(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        RESPONSE_LEN
    }

    /// The packet must be at least [`RESPONSE_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut ResponsePacket<&mut T>) {
        packet.set_request_id(self.request_id);
        packet.set_original_value(self.original_value);
    }
}

/// A view over the Immediate Data header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmediatePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ImmediatePacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < IMMEDIATE_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn data(&self) -> [u8; IMMEDIATE_LEN] {
        let mut d = [0; IMMEDIATE_LEN];
        d.copy_from_slice(&self.buffer.as_ref()[..IMMEDIATE_LEN]);
        d
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmediatePacket<T> {
    pub fn set_data(&mut self, data: [u8; IMMEDIATE_LEN]) {
        self.buffer.as_mut()[..IMMEDIATE_LEN].copy_from_slice(&data);
    }
}

/// The eight opaque bytes of an Immediate Data (with SE) message.
///
/// RFC 7306 section 6.3 makes the receiver check that the message holds
/// exactly 8 bytes; that is a message-level check ([`super::rdmap::Opcode`]
/// says no ULP payload follows), so `parse` only requires the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmediateDataRepr {
    pub data: [u8; IMMEDIATE_LEN],
}

impl ImmediateDataRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &ImmediatePacket<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(ImmediateDataRepr {
            data: packet.data(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        IMMEDIATE_LEN
    }

    /// The packet must be at least [`IMMEDIATE_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut ImmediatePacket<&mut T>,
    ) {
        packet.set_data(self.data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 7306 figure 4: a masked CmpSwap.
    const CMP_SWAP: [u8; 52] = [
        0x00, 0x00, 0x00, 0x02, // reserved | AOpCode 2
        0x00, 0x00, 0x00, 0x2a, // Request Identifier 42
        0x00, 0x01, 0x02, 0x03, // Remote STag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x08, // Remote TO
        0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x22, 0x22, // Swap Data
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, // Swap Mask
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // Compare Data
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, // Compare Mask
    ];

    #[test]
    fn request_both_ways() {
        let r =
            AtomicRequestRepr::parse(&RequestPacket::new_checked(&CMP_SWAP[..]).unwrap()).unwrap();
        let want = AtomicRequestRepr::masked_cmp_swap(
            42,
            0x0001_0203,
            0x1008,
            7,
            0xff,
            0x1111_1111_2222_2222,
            0xffff_ffff_0000_0000,
        );
        assert_eq!(r, want);
        assert_eq!(r.op(), Some(AtomicOp::CmpSwap));
        let mut out = [0xeeu8; REQUEST_LEN];
        r.emit(&mut RequestPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, CMP_SWAP);
        // Reserved bits are ignored on receive.
        let mut rsvd = CMP_SWAP;
        rsvd[0] = 0xff;
        rsvd[3] |= 0xf0;
        let r2 = AtomicRequestRepr::parse(&RequestPacket::new_checked(&rsvd[..]).unwrap()).unwrap();
        assert_eq!(r2, want);
        assert_eq!(
            RequestPacket::new_checked(&CMP_SWAP[..51]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn fetch_add_fields() {
        let r = AtomicRequestRepr::fetch_add(1, 2, 8, 5);
        let mut out = [0u8; REQUEST_LEN];
        r.emit(&mut RequestPacket::new_unchecked(&mut out[..]));
        assert_eq!(&out[..4], &[0, 0, 0, 0]);
        assert_eq!(&out[28..36], &[0; 8]); // Add Mask 0: one 64-bit field
        assert_eq!(&out[36..44], &[0; 8]); // Compare Data zero
        assert_eq!(&out[44..52], &[0xff; 8]); // Compare Mask all ones
        assert_eq!(r.apply(u64::MAX), Some(4));
    }

    #[test]
    fn response_both_ways() {
        let bytes = [
            0x00, 0x00, 0x00, 0x2a, // Original Request Identifier
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // Original Remote Data Value
        ];
        let r =
            AtomicResponseRepr::parse(&ResponsePacket::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            AtomicResponseRepr {
                request_id: 42,
                original_value: 0x0123_4567_89ab_cdef
            }
        );
        let mut out = [0u8; RESPONSE_LEN];
        r.emit(&mut ResponsePacket::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn immediate_both_ways() {
        let bytes = [1, 2, 3, 4, 5, 6, 7, 8];
        let r =
            ImmediateDataRepr::parse(&ImmediatePacket::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.data, bytes);
        let mut out = [0u8; 8];
        r.emit(&mut ImmediatePacket::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(ImmediatePacket::new_checked(&bytes[..7]).is_err());
    }

    #[test]
    fn op_codes() {
        assert_eq!(AtomicOp::from_u8(0), Some(AtomicOp::FetchAdd));
        assert_eq!(AtomicOp::from_u8(AOPCODE_RESERVED_1), None);
        assert_eq!(AtomicOp::from_u8(2), Some(AtomicOp::CmpSwap));
        assert_eq!(AtomicOp::from_u8(3), None);
        let mut r = AtomicRequestRepr::fetch_add(0, 0, 0, 1);
        r.aopcode = 1;
        assert_eq!(r.apply(0), None);
    }

    #[test]
    fn masked_operations() {
        // Two 32-bit counters: the carry of the low one stays in it.
        let r = AtomicRequestRepr::masked_fetch_add(0, 0, 0, 0x0000_0001_0000_0001, 1 << 31);
        assert_eq!(r.apply(0x0000_0005_ffff_ffff), Some(0x0000_0006_0000_0000));
        // Boundary at the top bit too: the whole-word carry is dropped anyway.
        let r = AtomicRequestRepr::masked_fetch_add(0, 0, 0, 1, (1 << 63) | (1 << 7));
        assert_eq!(r.apply(0xff), Some(0x00));
        // Masked CmpSwap: compare only the low byte, swap only the top half.
        let r =
            AtomicRequestRepr::masked_cmp_swap(0, 0, 0, 0x07, 0xff, u64::MAX, 0xffff_ffff << 32);
        assert_eq!(r.apply(0x1234_0007), Some(0xffff_ffff_1234_0007));
        assert_eq!(r.apply(0x1234_0008), Some(0x1234_0008));
        let r = AtomicRequestRepr::cmp_swap(0, 0, 0, 5, 9);
        assert_eq!(r.apply(5), Some(9));
        assert_eq!(r.apply(6), Some(6));
    }

    /// The RFC 7306 section 5.1.1 pseudo code, bit by bit.
    fn reference_masked_add(orig: u64, add: u64, mask: u64) -> u64 {
        let mut out = 0u64;
        let mut carry = 0u64;
        for bit in 0..64 {
            let loc = 1u64 << bit;
            let sum = carry + ((orig & loc) >> bit) + ((add & loc) >> bit);
            carry = (sum & 2) >> 1;
            if sum & 1 != 0 {
                out |= loc;
            }
            if mask & loc != 0 {
                carry = 0;
            }
        }
        out
    }

    fn arb_request() -> impl Strategy<Value = AtomicRequestRepr> {
        (
            0u8..16,
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(|(aopcode, request_id, stag, to, asd, asm, cd, cm)| {
                AtomicRequestRepr {
                    aopcode,
                    request_id,
                    stag,
                    to,
                    add_swap_data: asd,
                    add_swap_mask: asm,
                    compare_data: cd,
                    compare_mask: cm,
                }
            })
    }

    proptest! {
        #[test]
        fn masked_add_matches_pseudo_code(a in any::<u64>(), b in any::<u64>(), m in any::<u64>()) {
            prop_assert_eq!(masked_add(a, b, m), reference_masked_add(a, b, m));
        }

        #[test]
        fn request_round_trip(r in arb_request()) {
            let mut buf = [0u8; REQUEST_LEN];
            r.emit(&mut RequestPacket::new_unchecked(&mut buf[..]));
            let back = AtomicRequestRepr::parse(&RequestPacket::new_checked(&buf[..]).unwrap());
            prop_assert_eq!(back.unwrap(), r);
        }

        #[test]
        fn response_round_trip(request_id in any::<u32>(), original_value in any::<u64>()) {
            let r = AtomicResponseRepr { request_id, original_value };
            let mut buf = [0u8; RESPONSE_LEN];
            r.emit(&mut ResponsePacket::new_unchecked(&mut buf[..]));
            let back = AtomicResponseRepr::parse(&ResponsePacket::new_checked(&buf[..]).unwrap());
            prop_assert_eq!(back.unwrap(), r);
        }

        #[test]
        fn immediate_round_trip(data in any::<[u8; 8]>()) {
            let r = ImmediateDataRepr { data };
            let mut buf = [0u8; IMMEDIATE_LEN];
            r.emit(&mut ImmediatePacket::new_unchecked(&mut buf[..]));
            let back = ImmediateDataRepr::parse(&ImmediatePacket::new_checked(&buf[..]).unwrap());
            prop_assert_eq!(back.unwrap(), r);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(p) = RequestPacket::new_checked(&bytes[..]) {
                let r = AtomicRequestRepr::parse(&p).unwrap();
                let _ = r.apply(0);
            }
            if let Ok(p) = ResponsePacket::new_checked(&bytes[..]) {
                let _ = AtomicResponseRepr::parse(&p);
            }
            if let Ok(p) = ImmediatePacket::new_checked(&bytes[..]) {
                let _ = ImmediateDataRepr::parse(&p);
            }
        }
    }
}
