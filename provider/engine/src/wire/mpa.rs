//! MPA: Marker PDU Aligned framing over TCP (RFC 5044), with the enhanced
//! connection establishment of RFC 6581.
//!
//! Two things live here:
//! - the MPA Request/Reply frames exchanged once at connection setup
//!   (RFC 5044), and the 4-byte IRD/ORD block that RFC 6581 puts at the
//!   front of their private data;
//! - FPDU framing for the data phase (RFC 5044, FPDU format): a 2-byte
//!   ULPDU_Length, the ULPDU, 0-3 pad bytes and a 4-byte CRC32c trailer.
//!
//! Markers (RFC 5044) are never used: a peer asking for them has
//! to be refused, so every FPDU helper below assumes a marker-free stream.

use super::{be, Error, Field, Rest, Result};

/// Key of an MPA Request frame (RFC 5044, MPA Request and Reply frames).
pub const REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply frame (RFC 5044, MPA Request and Reply frames).
pub const REP_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Key, flags, revision and PD_Length.
pub const HEADER_LEN: usize = 20;
/// Upper bound on PD_Length; larger frames MUST close the connection
/// (RFC 5044, MPA Request and Reply frames).
pub const MAX_PRIVATE_DATA: usize = 512;
/// Linux siw refuses frames with more private data than this, the
/// enhanced IRD/ORD block included.
pub const SIW_MAX_PRIVATE_DATA: usize = 256;
/// The revision RFC 5044 defines.
pub const REVISION_1: u8 = 1;
/// The revision RFC 6581 defines (needed for the enhanced block).
pub const REVISION_2: u8 = 2;

/// M: the sender of this frame wants markers.
pub const FLAG_MARKERS: u8 = 0x80;
/// C: the sender of this frame wants CRCs; if either side sets it both
/// sides MUST use them (RFC 5044, MPA Request and Reply frames).
pub const FLAG_CRC: u8 = 0x40;
/// R: connection rejected (only meaningful in a Reply).
pub const FLAG_REJECT: u8 = 0x20;
/// S: enhanced RDMA connection establishment (RFC 6581); the
/// private data then starts with the IRD/ORD block.
pub const FLAG_ENHANCED: u8 = 0x10;

mod field {
    use super::{Field, Rest};

    pub const KEY: Field = 0..16;
    /// M, C, R, S flags and 4 reserved bits.
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LENGTH: Field = 18..20;
    pub const PRIVATE_DATA: Rest = 20..;
}

/// Which of the two setup frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Request,
    Reply,
}

impl FrameKind {
    pub fn key(self) -> &'static [u8; 16] {
        match self {
            FrameKind::Request => REQ_KEY,
            FrameKind::Reply => REP_KEY,
        }
    }
}

/// Total length of the MPA Request/Reply frame at the head of `buf`, once
/// its fixed header has arrived; `None` before that. The announced length
/// is not validated here (see [`Packet::new_checked`]).
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    Some(HEADER_LEN + usize::from(be::u16_at(buf, field::PD_LENGTH)))
}

/// A view over an MPA Request or Reply frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking that it holds the whole frame.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// `Truncated` if the header or the announced private data is not all
    /// there; `BadLength` if PD_Length exceeds 512 (RFC 5044, MPA Request and Reply frames).
    /// Bytes beyond the frame are allowed (they belong to the next PDU).
    pub fn check_len(&self) -> Result<()> {
        let buf = self.buffer.as_ref();
        if buf.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let pd = usize::from(be::u16_at(buf, field::PD_LENGTH));
        if pd > MAX_PRIVATE_DATA {
            return Err(Error::BadLength);
        }
        if buf.len() < HEADER_LEN + pd {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn key(&self) -> &[u8] {
        &self.buffer.as_ref()[field::KEY]
    }

    /// `None` if the key is neither of the two RFC 5044 keys.
    pub fn kind(&self) -> Option<FrameKind> {
        let key = self.key();
        if key == REQ_KEY {
            Some(FrameKind::Request)
        } else if key == REP_KEY {
            Some(FrameKind::Reply)
        } else {
            None
        }
    }

    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    pub fn markers(&self) -> bool {
        self.flags() & FLAG_MARKERS != 0
    }

    pub fn crc(&self) -> bool {
        self.flags() & FLAG_CRC != 0
    }

    pub fn reject(&self) -> bool {
        self.flags() & FLAG_REJECT != 0
    }

    pub fn enhanced(&self) -> bool {
        self.flags() & FLAG_ENHANCED != 0
    }

    pub fn revision(&self) -> u8 {
        self.buffer.as_ref()[field::REV]
    }

    pub fn pd_length(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::PD_LENGTH)
    }

    /// Header plus private data.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize::from(self.pd_length())
    }

    pub fn private_data(&self) -> &[u8] {
        let end = self.total_len();
        &self.buffer.as_ref()[field::PRIVATE_DATA][..end - HEADER_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_kind(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[field::KEY].copy_from_slice(kind.key());
    }

    /// Sets the whole flags byte; the reserved bits go out as zero when
    /// built through [`FrameRepr::emit`].
    pub fn set_flags(&mut self, flags: u8) {
        self.buffer.as_mut()[field::FLAGS] = flags;
    }

    pub fn set_revision(&mut self, rev: u8) {
        self.buffer.as_mut()[field::REV] = rev;
    }

    pub fn set_pd_length(&mut self, len: u16) {
        be::put_u16(self.buffer.as_mut(), field::PD_LENGTH, len);
    }

    /// The private data area as announced by PD_Length.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let n = usize::from(self.pd_length());
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..n]
    }
}

/// A parsed MPA Request or Reply frame.
///
/// `private_data` is everything PD_Length covers, including the 4-byte
/// IRD/ORD block first when `enhanced` is set (see [`FrameRepr::enhanced_params`]
/// and [`FrameRepr::ulp_private_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr<'a> {
    pub kind: FrameKind,
    pub markers: bool,
    pub crc: bool,
    pub reject: bool,
    /// RFC 6581 enhanced connection establishment.
    pub enhanced: bool,
    pub revision: u8,
    pub private_data: &'a [u8],
}

impl<'a> FrameRepr<'a> {
    /// Decodes a frame. The key must be one of the two RFC 5044 keys;
    /// revision 0 is no MPA revision at all; an enhanced frame (S bit with
    /// revision 2 or later) must carry the IRD/ORD block (RFC 6581). The R
    /// bit of a Request is "not checked on reception" (RFC 5044) and reads
    /// as false. Which revisions to accept is the caller's decision.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<FrameRepr<'a>> {
        packet.check_len()?;
        let kind = packet
            .kind()
            .ok_or(Error::Malformed("unknown MPA frame key"))?;
        let revision = packet.revision();
        if revision == 0 {
            return Err(Error::BadVersion);
        }
        // Before revision 2 the S bit is one of the reserved bits that
        // RFC 5044 says not to check.
        let enhanced = revision >= REVISION_2 && packet.enhanced();
        let end = packet.total_len();
        let data: &'a T = packet.buffer;
        let private_data = &data.as_ref()[field::PRIVATE_DATA][..end - HEADER_LEN];
        if enhanced && private_data.len() < ENHANCED_LEN {
            return Err(Error::Malformed("enhanced MPA frame without IRD/ORD block"));
        }
        Ok(FrameRepr {
            kind,
            markers: packet.markers(),
            crc: packet.crc(),
            reject: kind == FrameKind::Reply && packet.reject(),
            enhanced,
            revision,
            private_data,
        })
    }

    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.private_data.len()
    }

    /// Writes the frame. The packet must be at least `buffer_len()` long and
    /// `private_data` at most [`MAX_PRIVATE_DATA`] bytes (checked in debug).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        debug_assert!(self.private_data.len() <= MAX_PRIVATE_DATA);
        let mut flags = 0;
        if self.markers {
            flags |= FLAG_MARKERS;
        }
        if self.crc {
            flags |= FLAG_CRC;
        }
        if self.reject && self.kind == FrameKind::Reply {
            flags |= FLAG_REJECT;
        }
        if self.enhanced {
            flags |= FLAG_ENHANCED;
        }
        packet.set_kind(self.kind);
        packet.set_flags(flags);
        packet.set_revision(self.revision);
        packet.set_pd_length(self.private_data.len() as u16);
        packet.private_data_mut().copy_from_slice(self.private_data);
    }

    /// The RFC 6581 IRD/ORD block, if this is an enhanced frame.
    pub fn enhanced_params(&self) -> Option<Result<EnhancedParams>> {
        self.enhanced
            .then(|| EnhancedParams::parse(self.private_data))
    }

    /// The private data that belongs to the ULP (after the IRD/ORD block
    /// of an enhanced frame).
    pub fn ulp_private_data(&self) -> &'a [u8] {
        if self.enhanced {
            self.private_data.get(ENHANCED_LEN..).unwrap_or(&[])
        } else {
            self.private_data
        }
    }
}

/// Length of the RFC 6581 IRD/ORD block.
pub const ENHANCED_LEN: usize = 4;
/// IRD and ORD are 14-bit fields (RFC 6581).
pub const MAX_IRD_ORD: u16 = 0x3fff;

mod enhanced_field {
    use super::Field;

    /// |A|B|  IRD (14)  |
    pub const IRD: Field = 0..2;
    /// |C|D|  ORD (14)  |
    pub const ORD: Field = 2..4;
}

/// A: peer-to-peer connection model (in the IRD half).
const CTRL_PEER_TO_PEER: u16 = 0x8000;
/// B: zero-length FULPDU (Send) as ready-to-receive (in the IRD half).
const CTRL_RTR_SEND: u16 = 0x4000;
/// C: zero-length RDMA Write as ready-to-receive (in the ORD half).
const CTRL_RTR_WRITE: u16 = 0x8000;
/// D: zero-length RDMA Read as ready-to-receive (in the ORD half).
const CTRL_RTR_READ: u16 = 0x4000;

/// The ready-to-receive message of peer-to-peer mode (RFC 6581):
/// the first FPDU the initiator sends so that the responder may start
/// transmitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Rtr {
    #[default]
    None,
    ZeroLengthSend,
    ZeroLengthWrite,
    ZeroLengthRead,
}

/// The RFC 6581 IRD/ORD block:
///
/// ```text
///  0                   1                   2                   3
///  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
/// +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
/// |A|B|           IRD             |C|D|           ORD             |
/// +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
/// ```
///
/// A = peer-to-peer, B/C/D = zero-length Send/Write/Read RTR. An initiator
/// may offer several RTR kinds and the responder answers with exactly one;
/// `rtr` holds a single choice (see [`RtrSet`] for the full offer). The RTR
/// flags are only meaningful with `peer_to_peer`; they are decoded and
/// encoded as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EnhancedParams {
    pub ird: u16,
    pub ord: u16,
    pub peer_to_peer: bool,
    pub rtr: Rtr,
}

impl EnhancedParams {
    /// Decodes the block at the start of `buf` (normally the private data
    /// of an enhanced frame). With more than one RTR flag set, `rtr` is the
    /// preferred one by [`RtrSet::preferred`].
    pub fn parse(buf: &[u8]) -> Result<EnhancedParams> {
        if buf.len() < ENHANCED_LEN {
            return Err(Error::Truncated);
        }
        let ird = be::u16_at(buf, enhanced_field::IRD);
        let ord = be::u16_at(buf, enhanced_field::ORD);
        Ok(EnhancedParams {
            ird: ird & MAX_IRD_ORD,
            ord: ord & MAX_IRD_ORD,
            peer_to_peer: ird & CTRL_PEER_TO_PEER != 0,
            rtr: RtrSet::parse(buf)?.preferred(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        ENHANCED_LEN
    }

    /// Writes the block into the first 4 bytes of `buf`. IRD and ORD are
    /// clamped to 14 bits.
    pub fn emit(&self, buf: &mut [u8]) {
        let mut ird = self.ird.min(MAX_IRD_ORD);
        let mut ord = self.ord.min(MAX_IRD_ORD);
        if self.peer_to_peer {
            ird |= CTRL_PEER_TO_PEER;
        }
        match self.rtr {
            Rtr::None => {}
            Rtr::ZeroLengthSend => ird |= CTRL_RTR_SEND,
            Rtr::ZeroLengthWrite => ord |= CTRL_RTR_WRITE,
            Rtr::ZeroLengthRead => ord |= CTRL_RTR_READ,
        }
        be::put_u16(buf, enhanced_field::IRD, ird);
        be::put_u16(buf, enhanced_field::ORD, ord);
    }
}

/// The set of RTR kinds flagged in an IRD/ORD block: what an initiator
/// offers in its Request (RFC 6581).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrSet {
    pub send: bool,
    pub write: bool,
    pub read: bool,
}

impl RtrSet {
    pub fn parse(buf: &[u8]) -> Result<RtrSet> {
        if buf.len() < ENHANCED_LEN {
            return Err(Error::Truncated);
        }
        let ird = be::u16_at(buf, enhanced_field::IRD);
        let ord = be::u16_at(buf, enhanced_field::ORD);
        Ok(RtrSet {
            send: ird & CTRL_RTR_SEND != 0,
            write: ord & CTRL_RTR_WRITE != 0,
            read: ord & CTRL_RTR_READ != 0,
        })
    }

    /// Sets these RTR flags in an already emitted block (leaving the rest).
    pub fn apply(&self, buf: &mut [u8]) {
        let mut ird = be::u16_at(buf, enhanced_field::IRD);
        let mut ord = be::u16_at(buf, enhanced_field::ORD);
        if self.send {
            ird |= CTRL_RTR_SEND;
        }
        if self.write {
            ord |= CTRL_RTR_WRITE;
        }
        if self.read {
            ord |= CTRL_RTR_READ;
        }
        be::put_u16(buf, enhanced_field::IRD, ird);
        be::put_u16(buf, enhanced_field::ORD, ord);
    }

    /// Write, then Read, then Send: a zero-length Write needs no IRD credit
    /// and no receive buffer at the peer, which is also what siw prefers.
    pub fn preferred(&self) -> Rtr {
        if self.write {
            Rtr::ZeroLengthWrite
        } else if self.read {
            Rtr::ZeroLengthRead
        } else if self.send {
            Rtr::ZeroLengthSend
        } else {
            Rtr::None
        }
    }

    pub fn contains(&self, rtr: Rtr) -> bool {
        match rtr {
            Rtr::None => true,
            Rtr::ZeroLengthSend => self.send,
            Rtr::ZeroLengthWrite => self.write,
            Rtr::ZeroLengthRead => self.read,
        }
    }
}

// ---------------------------------------------------------------------------
// FPDU framing (RFC 5044)

/// Length of the ULPDU_Length field.
pub const LEN_FIELD_LEN: usize = 2;
/// Length of the CRC trailer (present, possibly zero, even without CRC).
pub const CRC_LEN: usize = 4;
/// ULPDU_Length is 16 bits.
pub const MAX_ULPDU: usize = 65535;

const ZERO_PAD: [u8; 3] = [0; 3];

/// Pad after the ULPDU so that ULPDU_Length + ULPDU + pad is a multiple of 4
/// (RFC 5044, FPDU format).
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (LEN_FIELD_LEN + ulpdu_len) % 4) % 4
}

/// The zero pad bytes a sender puts after a ULPDU of this length.
pub fn pad_bytes(ulpdu_len: usize) -> &'static [u8] {
    &ZERO_PAD[..pad_len(ulpdu_len)]
}

/// On-wire FPDU length: ULPDU_Length, ULPDU, pad and CRC.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    LEN_FIELD_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// Total on-wire length of the FPDU starting at `buf`, from its first two
/// bytes; `None` until they have arrived.
pub fn peek_fpdu_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < LEN_FIELD_LEN {
        return None;
    }
    Some(fpdu_len(usize::from(u16::from_be_bytes([buf[0], buf[1]]))))
}

const CRC32C: crc_fast::CrcAlgorithm = crc_fast::CrcAlgorithm::Crc32Iscsi;

/// A CRC32c routine: the CRC32c of the bytes a finished value `crc` covers
/// followed by `data` (from `crc` 0, the CRC32c of `data`). A driver may hand
/// the engine one made for its machine; [`crc32c`] is the portable one.
pub type Crc32c = fn(crc: u32, data: &[u8]) -> u32;

/// The portable [`Crc32c`] (crc-fast: hardware CRC or carry-less multiply
/// where the CPU has them, tables elsewhere).
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    // The running value is the whole state: from 0 (nothing covered, or
    // bytes whose CRC happens to be 0) a one-shot CRC continues it, and
    // that is the cheaper call.
    if crc == 0 {
        crc_fast::crc32_iscsi(data)
    } else {
        let mut d = crc_fast::Digest::new_with_init_state(CRC32C, u64::from(!crc));
        d.update(data);
        d.finalize() as u32
    }
}

/// Streaming CRC32c (Castagnoli) over ULPDU_Length, ULPDU and pad
/// (RFC 5044, CRC calculation), so that a header and a payload that live in
/// different buffers can be covered without copying.
#[derive(Debug, Clone, Copy)]
pub struct Crc {
    value: u32,
    f: Crc32c,
}

impl Default for Crc {
    fn default() -> Crc {
        Crc::new()
    }
}

impl Crc {
    pub const fn new() -> Crc {
        Crc::using(crc32c)
    }

    /// A CRC computed by `f`.
    pub const fn using(f: Crc32c) -> Crc {
        Crc { value: 0, f }
    }

    pub fn update(&mut self, data: &[u8]) {
        self.value = (self.f)(self.value, data);
    }

    /// The CRC as a number (the usual CRC32c value, with its final
    /// inversion already applied).
    pub fn value(&self) -> u32 {
        self.value
    }

    /// The four trailer bytes as they go on the wire: the CRC32c value in
    /// little-endian byte order, which is what siw sends and accepts
    /// (checked on the wire against Linux 6.1).
    pub fn finish(self) -> [u8; 4] {
        self.value.to_le_bytes()
    }
}

/// Validates one complete FPDU (exactly `fpdu_len` bytes: callers cut the
/// stream with [`peek_fpdu_len`]) and returns its ULPDU.
///
/// The pad contents are not checked: RFC 5044 has the receiver
/// ignore them (they are still covered by the CRC). Without CRC the trailer
/// is ignored whatever it holds.
pub fn check_fpdu(fpdu: &[u8], crc_enabled: bool) -> Result<&[u8]> {
    check_fpdu_with(fpdu, crc_enabled.then_some(crc32c as Crc32c))
}

/// [`check_fpdu`], with the CRC (if any) computed by `crc`.
#[inline]
pub fn check_fpdu_with(fpdu: &[u8], crc: Option<Crc32c>) -> Result<&[u8]> {
    let total = peek_fpdu_len(fpdu).ok_or(Error::Truncated)?;
    if fpdu.len() < total {
        return Err(Error::Truncated);
    }
    if fpdu.len() > total {
        return Err(Error::BadLength);
    }
    let ulpdu_len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
    let (covered, trailer) = fpdu.split_at(total - CRC_LEN);
    if let Some(f) = crc {
        if f(0, covered).to_le_bytes() != trailer {
            return Err(Error::BadCrc);
        }
    }
    Ok(&fpdu[LEN_FIELD_LEN..LEN_FIELD_LEN + ulpdu_len])
}

/// Completes an FPDU in place: `buf[2..2 + ulpdu_len]` already holds the
/// ULPDU; this writes ULPDU_Length, zero pad and the trailer (the CRC, or
/// four zero bytes without CRC) and returns the FPDU length.
pub fn seal_fpdu(buf: &mut [u8], ulpdu_len: usize, crc_enabled: bool) -> Result<usize> {
    if ulpdu_len > MAX_ULPDU {
        return Err(Error::BadLength);
    }
    let total = fpdu_len(ulpdu_len);
    if buf.len() < total {
        return Err(Error::Truncated);
    }
    buf[..LEN_FIELD_LEN].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
    let pad_start = LEN_FIELD_LEN + ulpdu_len;
    let crc_start = total - CRC_LEN;
    buf[pad_start..crc_start].fill(0);
    let trailer = if crc_enabled {
        let mut crc = Crc::new();
        crc.update(&buf[..crc_start]);
        crc.finish()
    } else {
        [0; 4]
    };
    buf[crc_start..total].copy_from_slice(&trailer);
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A Request as siw sends it: revision 2, enhanced, CRC wanted, the
    /// IRD/ORD block 16/16 followed by 3 bytes of ULP private data.
    const REQUEST: [u8; 27] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, // "MPA ID R"
        0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, // "eq Frame"
        0x50, 0x02, 0x00, 0x07, // C + S, rev 2, PD_Length 7
        0x00, 0x10, 0x00, 0x10, // IRD 16, ORD 16
        0xaa, 0xbb, 0xcc,
    ];

    #[test]
    fn request_parse() {
        let p = Packet::new_checked(&REQUEST[..]).unwrap();
        let r = FrameRepr::parse(&p).unwrap();
        assert_eq!(r.kind, FrameKind::Request);
        assert!(!r.markers);
        assert!(r.crc);
        assert!(!r.reject);
        assert!(r.enhanced);
        assert_eq!(r.revision, 2);
        assert_eq!(r.private_data.len(), 7);
        assert_eq!(r.ulp_private_data(), &[0xaa, 0xbb, 0xcc]);
        let e = r.enhanced_params().unwrap().unwrap();
        assert_eq!(
            e,
            EnhancedParams {
                ird: 16,
                ord: 16,
                peer_to_peer: false,
                rtr: Rtr::None
            }
        );
    }

    #[test]
    fn request_emit() {
        let pd = [0x00, 0x10, 0x00, 0x10, 0xaa, 0xbb, 0xcc];
        let r = FrameRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            reject: false,
            enhanced: true,
            revision: 2,
            private_data: &pd,
        };
        let mut buf = vec![0xffu8; r.buffer_len()];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_pd_length(pd.len() as u16);
        r.emit(&mut p);
        assert_eq!(buf, REQUEST);
    }

    #[test]
    fn reply_reject() {
        let mut frame = [0u8; 20];
        frame[..16].copy_from_slice(REP_KEY);
        frame[16] = FLAG_REJECT;
        frame[17] = 1;
        let r = FrameRepr::parse(&Packet::new_checked(&frame[..]).unwrap()).unwrap();
        assert_eq!(r.kind, FrameKind::Reply);
        assert!(r.reject);
        assert!(!r.enhanced);
        assert_eq!(r.revision, 1);
        assert!(r.private_data.is_empty());
        // The same bit in a Request is not looked at.
        frame[..16].copy_from_slice(REQ_KEY);
        let r = FrameRepr::parse(&Packet::new_checked(&frame[..]).unwrap()).unwrap();
        assert!(!r.reject);
    }

    #[test]
    fn frame_errors() {
        let mut frame = [0u8; 20];
        frame[..16].copy_from_slice(REQ_KEY);
        frame[17] = 1;
        assert_eq!(
            Packet::new_checked(&frame[..19]).unwrap_err(),
            Error::Truncated
        );
        // PD_Length 513.
        frame[18] = 0x02;
        frame[19] = 0x01;
        assert_eq!(
            Packet::new_checked(&frame[..]).unwrap_err(),
            Error::BadLength
        );
        // PD_Length 1 but no private data.
        frame[18] = 0;
        frame[19] = 1;
        assert_eq!(
            Packet::new_checked(&frame[..]).unwrap_err(),
            Error::Truncated
        );
        frame[19] = 0;
        // Revision 0.
        frame[17] = 0;
        let p = Packet::new_checked(&frame[..]).unwrap();
        assert_eq!(FrameRepr::parse(&p).unwrap_err(), Error::BadVersion);
        frame[17] = 2;
        // Enhanced without the block.
        frame[16] = FLAG_ENHANCED;
        let p = Packet::new_checked(&frame[..]).unwrap();
        assert!(matches!(FrameRepr::parse(&p), Err(Error::Malformed(_))));
        // The same bit in a revision 1 frame is reserved and ignored.
        frame[17] = 1;
        let p = Packet::new_checked(&frame[..]).unwrap();
        assert!(!FrameRepr::parse(&p).unwrap().enhanced);
        frame[17] = 2;
        // Wrong key.
        frame[16] = 0;
        frame[0] = b'X';
        let p = Packet::new_checked(&frame[..]).unwrap();
        assert!(matches!(FrameRepr::parse(&p), Err(Error::Malformed(_))));
    }

    #[test]
    fn frame_len_peek() {
        assert_eq!(frame_len(&REQUEST[..19]), None);
        assert_eq!(frame_len(&REQUEST[..20]), Some(27));
    }

    #[test]
    fn enhanced_block_bits() {
        // A=1 B=0 IRD=128 | C=1 D=1 ORD=0x3fff
        let block = [0x80, 0x80, 0xff, 0xff];
        let e = EnhancedParams::parse(&block).unwrap();
        assert_eq!(e.ird, 128);
        assert_eq!(e.ord, 0x3fff);
        assert!(e.peer_to_peer);
        assert_eq!(e.rtr, Rtr::ZeroLengthWrite);
        assert_eq!(
            RtrSet::parse(&block).unwrap(),
            RtrSet {
                send: false,
                write: true,
                read: true
            }
        );

        let cases = [
            (Rtr::None, [0x80, 0x01, 0x00, 0x02]),
            (Rtr::ZeroLengthSend, [0xc0, 0x01, 0x00, 0x02]),
            (Rtr::ZeroLengthWrite, [0x80, 0x01, 0x80, 0x02]),
            (Rtr::ZeroLengthRead, [0x80, 0x01, 0x40, 0x02]),
        ];
        for (rtr, bytes) in cases {
            let e = EnhancedParams {
                ird: 1,
                ord: 2,
                peer_to_peer: true,
                rtr,
            };
            let mut out = [0u8; 4];
            e.emit(&mut out);
            assert_eq!(out, bytes);
            assert_eq!(EnhancedParams::parse(&bytes).unwrap(), e);
        }

        let mut out = [0u8; 4];
        EnhancedParams {
            ird: 0xffff,
            ord: 5,
            peer_to_peer: false,
            rtr: Rtr::None,
        }
        .emit(&mut out);
        assert_eq!(out, [0x3f, 0xff, 0x00, 0x05]);
        RtrSet {
            send: true,
            write: false,
            read: true,
        }
        .apply(&mut out);
        assert_eq!(out, [0x7f, 0xff, 0x40, 0x05]);
        assert_eq!(
            EnhancedParams::parse(&out[..3]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn pad_and_lengths() {
        assert_eq!(pad_len(0), 2);
        assert_eq!(pad_len(1), 1);
        assert_eq!(pad_len(2), 0);
        assert_eq!(pad_len(3), 3);
        assert_eq!(pad_len(18), 0);
        assert_eq!(fpdu_len(18), 24);
        assert_eq!(fpdu_len(14), 20);
        assert_eq!(fpdu_len(MAX_ULPDU), 2 + 65535 + 3 + 4);
        assert_eq!(pad_bytes(1), &[0]);
        assert_eq!(peek_fpdu_len(&[0x00]), None);
        assert_eq!(peek_fpdu_len(&[0x00, 0x12, 0x99]), Some(24));
    }

    #[test]
    fn crc_in_pieces_is_the_crc_of_the_whole() {
        // Against an independent implementation, over splits of lengths
        // that cover the short and the long code paths of both ways of
        // continuing (one-shot from 0, and from a running value).
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for len in (0..200).chain([1000, 4096, 4999]) {
            let whole = crc32c::crc32c(&data[..len]);
            for cut in [0, 1, 3, 8, 17, len / 2, len] {
                let cut = cut.min(len);
                let mut c = Crc::new();
                c.update(&data[..cut]);
                c.update(&data[cut..len]);
                assert_eq!(c.value(), whole, "len {len}, cut {cut}");
            }
        }
    }

    #[test]
    fn crc_check_value() {
        let mut crc = Crc::new();
        crc.update(b"1234");
        crc.update(b"56789");
        assert_eq!(crc.value(), 0xE306_9283);
        // Little-endian on the wire, as siw does it.
        assert_eq!(crc.finish(), [0x83, 0x92, 0x06, 0xe3]);
    }

    /// An untagged Send (QN 0, MSN 1, MO 0, last) carrying "abc", framed by
    /// hand: length 21, 18-byte DDP header, payload, 1 pad byte, CRC.
    fn send_fpdu() -> Vec<u8> {
        let mut f = vec![
            0x00, 0x15, // ULPDU_Length 21
            0x41, 0x43, // DDP: L, DV=1 | RDMAP: RV=1, Send
            0x00, 0x00, 0x00, 0x00, // RsvdULP
            0x00, 0x00, 0x00, 0x00, // QN 0
            0x00, 0x00, 0x00, 0x01, // MSN 1
            0x00, 0x00, 0x00, 0x00, // MO 0
            b'a', b'b', b'c', // payload
            0x00, // pad
        ];
        assert_eq!(f.len() % 4, 0);
        let crc = crc32c::crc32c(&f);
        f.extend_from_slice(&crc.to_le_bytes());
        f
    }

    #[test]
    fn fpdu_by_hand() {
        let f = send_fpdu();
        assert_eq!(peek_fpdu_len(&f), Some(f.len()));
        let ulpdu = check_fpdu(&f, true).unwrap();
        assert_eq!(ulpdu.len(), 21);
        assert_eq!(&ulpdu[18..], b"abc");

        for i in 0..f.len() {
            let mut bad = f.clone();
            bad[i] ^= 0x01;
            let r = check_fpdu(&bad, true);
            if i < 2 {
                // A damaged length no longer matches the buffer.
                assert!(r.is_err(), "flip at {i}");
            } else {
                assert_eq!(r.unwrap_err(), Error::BadCrc, "flip at {i}");
            }
        }

        // Without CRC the trailer is not looked at.
        let mut no_crc = f.clone();
        let n = no_crc.len();
        no_crc[n - 4..].copy_from_slice(&[1, 2, 3, 4]);
        assert!(check_fpdu(&no_crc, false).is_ok());
        assert_eq!(check_fpdu(&no_crc, true).unwrap_err(), Error::BadCrc);

        assert_eq!(
            check_fpdu(&f[..f.len() - 1], true).unwrap_err(),
            Error::Truncated
        );
        let mut long = f.clone();
        long.push(0);
        assert_eq!(check_fpdu(&long, true).unwrap_err(), Error::BadLength);
        assert_eq!(check_fpdu(&f[..1], true).unwrap_err(), Error::Truncated);
    }

    #[test]
    fn seal_matches_hand_built() {
        let want = send_fpdu();
        let mut buf = vec![0xeeu8; want.len() + 5];
        buf[2..23].copy_from_slice(&want[2..23]);
        let n = seal_fpdu(&mut buf, 21, true).unwrap();
        assert_eq!(&buf[..n], &want[..]);

        let n = seal_fpdu(&mut buf, 21, false).unwrap();
        assert_eq!(&buf[n - 4..n], &[0, 0, 0, 0]);
        assert_eq!(
            seal_fpdu(&mut buf[..20], 21, true).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            seal_fpdu(&mut buf, MAX_ULPDU + 1, true).unwrap_err(),
            Error::BadLength
        );
    }

    fn arb_frame() -> impl Strategy<Value = (FrameKind, bool, bool, bool, bool, u8, Vec<u8>)> {
        (
            prop_oneof![Just(FrameKind::Request), Just(FrameKind::Reply)],
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            1u8..=255,
            proptest::collection::vec(any::<u8>(), 0..=MAX_PRIVATE_DATA),
        )
            .prop_map(|mut t| {
                // The S bit only exists from revision 2 on.
                t.4 &= t.5 >= REVISION_2;
                t
            })
            .prop_filter("enhanced needs the block", |t| !t.4 || t.6.len() >= 4)
    }

    fn arb_rtr() -> impl Strategy<Value = Rtr> {
        prop_oneof![
            Just(Rtr::None),
            Just(Rtr::ZeroLengthSend),
            Just(Rtr::ZeroLengthWrite),
            Just(Rtr::ZeroLengthRead),
        ]
    }

    proptest! {
        #[test]
        fn frame_round_trip((kind, markers, crc, reject, enhanced, revision, pd) in arb_frame()) {
            let r = FrameRepr {
                kind,
                markers,
                crc,
                reject: reject && kind == FrameKind::Reply,
                enhanced,
                revision,
                private_data: &pd,
            };
            let mut buf = vec![0u8; r.buffer_len()];
            let mut p = Packet::new_unchecked(&mut buf[..]);
            p.set_pd_length(pd.len() as u16);
            r.emit(&mut p);
            let p = Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(FrameRepr::parse(&p).unwrap(), r);
        }

        #[test]
        fn enhanced_round_trip(ird in 0..=MAX_IRD_ORD, ord in 0..=MAX_IRD_ORD,
                               p2p in any::<bool>(), rtr in arb_rtr()) {
            let e = EnhancedParams { ird, ord, peer_to_peer: p2p, rtr };
            let mut buf = [0u8; ENHANCED_LEN];
            e.emit(&mut buf);
            prop_assert_eq!(EnhancedParams::parse(&buf).unwrap(), e);
        }

        #[test]
        fn fpdu_round_trip(payload in proptest::collection::vec(any::<u8>(), 0..300),
                           crc in any::<bool>()) {
            let mut buf = vec![0u8; fpdu_len(payload.len())];
            buf[2..2 + payload.len()].copy_from_slice(&payload);
            let n = seal_fpdu(&mut buf, payload.len(), crc).unwrap();
            prop_assert_eq!(n, buf.len());
            prop_assert_eq!(n % 4, 0);
            prop_assert_eq!(check_fpdu(&buf, crc).unwrap(), &payload[..]);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600),
                              crc in any::<bool>()) {
            let _ = frame_len(&bytes);
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = p.private_data();
                if let Ok(r) = FrameRepr::parse(&p) {
                    let _ = r.enhanced_params();
                    let _ = r.ulp_private_data();
                }
            }
            let _ = EnhancedParams::parse(&bytes);
            let _ = RtrSet::parse(&bytes);
            let _ = peek_fpdu_len(&bytes);
            let _ = check_fpdu(&bytes, crc);
        }

        #[test]
        fn frame_parse_on_valid_header(key in prop_oneof![Just(*REQ_KEY), Just(*REP_KEY)],
                                       flags in any::<u8>(), rev in any::<u8>(),
                                       pd in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut buf = Vec::new();
            buf.extend_from_slice(&key);
            buf.push(flags);
            buf.push(rev);
            buf.extend_from_slice(&(pd.len() as u16).to_be_bytes());
            buf.extend_from_slice(&pd);
            let p = Packet::new_checked(&buf[..]).unwrap();
            let _ = FrameRepr::parse(&p);
        }
    }
}
