//! The RDMAP Terminate message body (RFC 5040 section 4.8, figure 7), and
//! the error codes it reports (RFC 5040 figure 9, RFC 5041 section 7.2,
//! RFC 5044, RFC 6581; registered by RFC 6580).
//!
//! The body follows the untagged DDP header of a Terminate (QN 2):
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Layer | EType | Error Code    |M|D|R|        Reserved         |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  DDP Segment Length (if M|D)  |                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
//! |      Terminated DDP Header (if D): 14 or 18 octets            |
//! ~                               +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                               |                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
//! ~      Terminated RDMA Header (if R): 28 octets                 ~
//! ```
//!
//! Linux siw lays the control word out with little-endian bitfields: Layer
//! and EType swap nibbles, and M/D/R land in the low three bits of the third
//! octet. Decoding accepts both ([`Layout`]); encoding is always RFC 5040.

use super::{be, Error, Field, Result};

/// Terminate Control and Reserved.
pub const CTRL_LEN: usize = 4;
/// The DDP Segment Length field.
pub const SEGMENT_LEN_LEN: usize = 2;
/// The Terminated RDMA Header: a copy of an RDMA Read Request header.
pub const RDMAP_HEADER_LEN: usize = 28;

// Layers (RFC 5040 figure 9).
pub const LAYER_RDMAP: u8 = 0x0;
pub const LAYER_DDP: u8 = 0x1;
/// The lower layer protocol; for TCP, MPA.
pub const LAYER_LLP: u8 = 0x2;

// RDMAP error types and codes (RFC 5040 figure 9).
pub const RDMAP_ETYPE_LOCAL_CATASTROPHIC: u8 = 0x0;
pub const RDMAP_ETYPE_REMOTE_PROTECTION: u8 = 0x1;
pub const RDMAP_ETYPE_REMOTE_OPERATION: u8 = 0x2;

/// Remote protection error.
pub const RDMAP_ECODE_INVALID_STAG: u8 = 0x00;
/// Remote protection error.
pub const RDMAP_ECODE_BASE_BOUNDS: u8 = 0x01;
/// Remote protection error.
pub const RDMAP_ECODE_ACCESS_RIGHTS: u8 = 0x02;
/// Remote protection error: STag not associated with RDMAP stream.
pub const RDMAP_ECODE_STAG_NOT_ASSOCIATED: u8 = 0x03;
/// Remote protection error: tagged offset wrap.
pub const RDMAP_ECODE_TO_WRAP: u8 = 0x04;
/// Remote operation error.
pub const RDMAP_ECODE_INVALID_VERSION: u8 = 0x05;
/// Remote operation error.
pub const RDMAP_ECODE_UNEXPECTED_OPCODE: u8 = 0x06;
/// Remote operation error: catastrophic error localized to RDMAP stream.
pub const RDMAP_ECODE_CATASTROPHIC_STREAM: u8 = 0x07;
/// Remote operation error: catastrophic error, global.
pub const RDMAP_ECODE_CATASTROPHIC_GLOBAL: u8 = 0x08;
/// Remote protection or remote operation error.
pub const RDMAP_ECODE_STAG_CANNOT_INVALIDATE: u8 = 0x09;
/// Remote protection or remote operation error.
pub const RDMAP_ECODE_UNSPECIFIED: u8 = 0xff;

// DDP error types and codes (RFC 5041 section 7.2).
pub const DDP_ETYPE_LOCAL_CATASTROPHIC: u8 = 0x0;
pub const DDP_ETYPE_TAGGED_BUFFER: u8 = 0x1;
pub const DDP_ETYPE_UNTAGGED_BUFFER: u8 = 0x2;
/// Reserved for the LLP's use.
pub const DDP_ETYPE_RESERVED_LLP: u8 = 0x3;

/// Local catastrophic error has this single code.
pub const DDP_ECODE_LOCAL_CATASTROPHIC: u8 = 0x00;
/// Tagged buffer error.
pub const DDP_ECODE_T_INVALID_STAG: u8 = 0x00;
/// Tagged buffer error.
pub const DDP_ECODE_T_BASE_BOUNDS: u8 = 0x01;
/// Tagged buffer error: STag not associated with DDP stream.
pub const DDP_ECODE_T_STAG_NOT_ASSOCIATED: u8 = 0x02;
/// Tagged buffer error.
pub const DDP_ECODE_T_TO_WRAP: u8 = 0x03;
/// Tagged buffer error.
pub const DDP_ECODE_T_INVALID_VERSION: u8 = 0x04;
/// Untagged buffer error.
pub const DDP_ECODE_U_INVALID_QN: u8 = 0x01;
/// Untagged buffer error: invalid MSN, no buffer available.
pub const DDP_ECODE_U_INVALID_MSN_NO_BUFFER: u8 = 0x02;
/// Untagged buffer error: invalid MSN, MSN range is not valid.
pub const DDP_ECODE_U_INVALID_MSN_RANGE: u8 = 0x03;
/// Untagged buffer error.
pub const DDP_ECODE_U_INVALID_MO: u8 = 0x04;
/// Untagged buffer error: DDP message too long for available buffer.
pub const DDP_ECODE_U_MSG_TOO_LONG: u8 = 0x05;
/// Untagged buffer error.
pub const DDP_ECODE_U_INVALID_VERSION: u8 = 0x06;

// LLP errors when the LLP is MPA (RFC 5044, RFC 6581).
pub const MPA_ETYPE: u8 = 0x0;
/// TCP connection closed, terminated or lost (cannot actually be sent).
pub const MPA_ECODE_TCP_LOST: u8 = 0x01;
pub const MPA_ECODE_CRC: u8 = 0x02;
/// Marker and ULPDU_Length mismatch: the framing is broken.
pub const MPA_ECODE_MARKER: u8 = 0x03;
/// Invalid MPA Request or Reply frame.
pub const MPA_ECODE_INVALID_REQ_REP: u8 = 0x04;
/// RFC 6581: local catastrophic error during enhanced setup.
pub const MPA_ECODE_LOCAL_CATASTROPHIC: u8 = 0x05;
/// RFC 6581: the initiator's IRD cannot serve the responder's ORD.
pub const MPA_ECODE_INSUFFICIENT_IRD: u8 = 0x06;
/// RFC 6581: no RTR kind in common.
pub const MPA_ECODE_NO_MATCHING_RTR: u8 = 0x07;

/// Whether RFC 5040, 5041, 5044 or 6581 assign meaning to this triple.
/// A local catastrophic error takes any code (RFC 5040 figure 9).
pub fn is_defined(layer: u8, etype: u8, ecode: u8) -> bool {
    match (layer, etype) {
        (LAYER_RDMAP, RDMAP_ETYPE_LOCAL_CATASTROPHIC) => true,
        (LAYER_RDMAP, RDMAP_ETYPE_REMOTE_PROTECTION) => {
            matches!(ecode, 0x00..=0x04 | 0x09 | 0xff)
        }
        (LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OPERATION) => matches!(ecode, 0x05..=0x09 | 0xff),
        (LAYER_DDP, DDP_ETYPE_LOCAL_CATASTROPHIC) => true,
        (LAYER_DDP, DDP_ETYPE_TAGGED_BUFFER) => ecode <= 0x04,
        (LAYER_DDP, DDP_ETYPE_UNTAGGED_BUFFER) => matches!(ecode, 0x01..=0x06),
        (LAYER_LLP, MPA_ETYPE) => matches!(ecode, 0x01..=0x07),
        _ => false,
    }
}

/// Layer, error type and code: what a Terminate reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cause {
    pub layer: u8,
    pub etype: u8,
    pub ecode: u8,
}

impl Cause {
    pub const fn new(layer: u8, etype: u8, ecode: u8) -> Cause {
        Cause {
            layer,
            etype,
            ecode,
        }
    }

    const fn rdmap(etype: u8, ecode: u8) -> Cause {
        Cause::new(LAYER_RDMAP, etype, ecode)
    }

    const fn ddp(etype: u8, ecode: u8) -> Cause {
        Cause::new(LAYER_DDP, etype, ecode)
    }

    const fn mpa(ecode: u8) -> Cause {
        Cause::new(LAYER_LLP, MPA_ETYPE, ecode)
    }

    pub const RDMAP_LOCAL_CATASTROPHIC: Cause = Cause::rdmap(RDMAP_ETYPE_LOCAL_CATASTROPHIC, 0);
    pub const RDMAP_PROT_INVALID_STAG: Cause =
        Cause::rdmap(RDMAP_ETYPE_REMOTE_PROTECTION, RDMAP_ECODE_INVALID_STAG);
    pub const RDMAP_PROT_BASE_BOUNDS: Cause =
        Cause::rdmap(RDMAP_ETYPE_REMOTE_PROTECTION, RDMAP_ECODE_BASE_BOUNDS);
    pub const RDMAP_PROT_ACCESS_RIGHTS: Cause =
        Cause::rdmap(RDMAP_ETYPE_REMOTE_PROTECTION, RDMAP_ECODE_ACCESS_RIGHTS);
    pub const RDMAP_PROT_STAG_NOT_ASSOCIATED: Cause = Cause::rdmap(
        RDMAP_ETYPE_REMOTE_PROTECTION,
        RDMAP_ECODE_STAG_NOT_ASSOCIATED,
    );
    pub const RDMAP_PROT_TO_WRAP: Cause =
        Cause::rdmap(RDMAP_ETYPE_REMOTE_PROTECTION, RDMAP_ECODE_TO_WRAP);
    pub const RDMAP_PROT_STAG_CANNOT_INVALIDATE: Cause = Cause::rdmap(
        RDMAP_ETYPE_REMOTE_PROTECTION,
        RDMAP_ECODE_STAG_CANNOT_INVALIDATE,
    );
    pub const RDMAP_PROT_UNSPECIFIED: Cause =
        Cause::rdmap(RDMAP_ETYPE_REMOTE_PROTECTION, RDMAP_ECODE_UNSPECIFIED);
    pub const RDMAP_OP_INVALID_VERSION: Cause =
        Cause::rdmap(RDMAP_ETYPE_REMOTE_OPERATION, RDMAP_ECODE_INVALID_VERSION);
    pub const RDMAP_OP_UNEXPECTED_OPCODE: Cause =
        Cause::rdmap(RDMAP_ETYPE_REMOTE_OPERATION, RDMAP_ECODE_UNEXPECTED_OPCODE);
    pub const RDMAP_OP_CATASTROPHIC_STREAM: Cause = Cause::rdmap(
        RDMAP_ETYPE_REMOTE_OPERATION,
        RDMAP_ECODE_CATASTROPHIC_STREAM,
    );
    pub const RDMAP_OP_CATASTROPHIC_GLOBAL: Cause = Cause::rdmap(
        RDMAP_ETYPE_REMOTE_OPERATION,
        RDMAP_ECODE_CATASTROPHIC_GLOBAL,
    );
    pub const RDMAP_OP_STAG_CANNOT_INVALIDATE: Cause = Cause::rdmap(
        RDMAP_ETYPE_REMOTE_OPERATION,
        RDMAP_ECODE_STAG_CANNOT_INVALIDATE,
    );
    pub const RDMAP_OP_UNSPECIFIED: Cause =
        Cause::rdmap(RDMAP_ETYPE_REMOTE_OPERATION, RDMAP_ECODE_UNSPECIFIED);

    pub const DDP_LOCAL_CATASTROPHIC: Cause =
        Cause::ddp(DDP_ETYPE_LOCAL_CATASTROPHIC, DDP_ECODE_LOCAL_CATASTROPHIC);
    pub const DDP_T_INVALID_STAG: Cause =
        Cause::ddp(DDP_ETYPE_TAGGED_BUFFER, DDP_ECODE_T_INVALID_STAG);
    pub const DDP_T_BASE_BOUNDS: Cause =
        Cause::ddp(DDP_ETYPE_TAGGED_BUFFER, DDP_ECODE_T_BASE_BOUNDS);
    pub const DDP_T_STAG_NOT_ASSOCIATED: Cause =
        Cause::ddp(DDP_ETYPE_TAGGED_BUFFER, DDP_ECODE_T_STAG_NOT_ASSOCIATED);
    pub const DDP_T_TO_WRAP: Cause = Cause::ddp(DDP_ETYPE_TAGGED_BUFFER, DDP_ECODE_T_TO_WRAP);
    pub const DDP_T_INVALID_VERSION: Cause =
        Cause::ddp(DDP_ETYPE_TAGGED_BUFFER, DDP_ECODE_T_INVALID_VERSION);
    pub const DDP_U_INVALID_QN: Cause =
        Cause::ddp(DDP_ETYPE_UNTAGGED_BUFFER, DDP_ECODE_U_INVALID_QN);
    pub const DDP_U_INVALID_MSN_NO_BUFFER: Cause =
        Cause::ddp(DDP_ETYPE_UNTAGGED_BUFFER, DDP_ECODE_U_INVALID_MSN_NO_BUFFER);
    pub const DDP_U_INVALID_MSN_RANGE: Cause =
        Cause::ddp(DDP_ETYPE_UNTAGGED_BUFFER, DDP_ECODE_U_INVALID_MSN_RANGE);
    pub const DDP_U_INVALID_MO: Cause =
        Cause::ddp(DDP_ETYPE_UNTAGGED_BUFFER, DDP_ECODE_U_INVALID_MO);
    pub const DDP_U_MSG_TOO_LONG: Cause =
        Cause::ddp(DDP_ETYPE_UNTAGGED_BUFFER, DDP_ECODE_U_MSG_TOO_LONG);
    pub const DDP_U_INVALID_VERSION: Cause =
        Cause::ddp(DDP_ETYPE_UNTAGGED_BUFFER, DDP_ECODE_U_INVALID_VERSION);

    pub const MPA_CRC: Cause = Cause::mpa(MPA_ECODE_CRC);
    pub const MPA_MARKER: Cause = Cause::mpa(MPA_ECODE_MARKER);
    pub const MPA_INVALID_REQ_REP: Cause = Cause::mpa(MPA_ECODE_INVALID_REQ_REP);
    pub const MPA_LOCAL_CATASTROPHIC: Cause = Cause::mpa(MPA_ECODE_LOCAL_CATASTROPHIC);
    pub const MPA_INSUFFICIENT_IRD: Cause = Cause::mpa(MPA_ECODE_INSUFFICIENT_IRD);
    pub const MPA_NO_MATCHING_RTR: Cause = Cause::mpa(MPA_ECODE_NO_MATCHING_RTR);

    /// RFC 7306 section 8.2: an Atomic Request whose target is not 64-bit
    /// aligned. RFC 7306 adds no new codes; it names this existing one.
    pub const ATOMIC_MISALIGNED: Cause = Cause::RDMAP_OP_CATASTROPHIC_STREAM;
    /// draft-talpey-rdma-commit-01 sections 3.1.3 and 5 demand a Terminate
    /// for an Atomic Write that cannot be placed atomically, a Flush that
    /// cannot reach the disposition and a Verify hash mismatch, but assign
    /// no codes; these follow RFC 7306's choice for a misaligned atomic.
    pub const ATOMIC_WRITE_FAILED: Cause = Cause::RDMAP_OP_CATASTROPHIC_STREAM;
    pub const FLUSH_FAILED: Cause = Cause::RDMAP_OP_CATASTROPHIC_STREAM;
    pub const VERIFY_FAILED: Cause = Cause::RDMAP_OP_CATASTROPHIC_STREAM;

    /// The DDP version error for a segment of the given model.
    pub const fn ddp_bad_version(tagged: bool) -> Cause {
        if tagged {
            Cause::DDP_T_INVALID_VERSION
        } else {
            Cause::DDP_U_INVALID_VERSION
        }
    }

    pub fn is_defined(&self) -> bool {
        is_defined(self.layer, self.etype, self.ecode)
    }
}

/// How the Terminate Control word is laid out by its sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// RFC 5040 figure 8.
    Rfc5040,
    /// Linux siw: nibbles of the first octet swapped, M/D/R in bits 0/1/2
    /// of the third octet.
    Siw,
}

/// RFC 5040 places M, D, R in the top bits of the third octet.
const RFC_M: u8 = 0x80;
const RFC_D: u8 = 0x40;
const RFC_R: u8 = 0x20;
const RFC_FLAGS: u8 = RFC_M | RFC_D | RFC_R;
/// siw places them in the bottom bits.
const SIW_M: u8 = 0x01;
const SIW_D: u8 = 0x02;
const SIW_R: u8 = 0x04;
const SIW_FLAGS: u8 = SIW_M | SIW_D | SIW_R;

/// Guesses the sender's layout from a control word. Flags found only where
/// siw puts them (RFC 5040 reserved bits) mean siw; with no flags, siw is
/// chosen only when the RFC reading names no defined error and the swapped
/// reading does, since otherwise the two cannot be told apart (RFC wins).
pub fn detect_layout(ctrl: [u8; 4]) -> Layout {
    let flags = ctrl[2];
    if flags & RFC_FLAGS != 0 {
        return Layout::Rfc5040;
    }
    if flags & SIW_FLAGS != 0 {
        return Layout::Siw;
    }
    let (hi, lo) = (ctrl[0] >> 4, ctrl[0] & 0x0f);
    if !is_defined(hi, lo, ctrl[1]) && is_defined(lo, hi, ctrl[1]) {
        Layout::Siw
    } else {
        Layout::Rfc5040
    }
}

mod field {
    use super::Field;

    /// Layer (high nibble), EType (low nibble).
    pub const LAYER_ETYPE: usize = 0;
    pub const ECODE: usize = 1;
    /// M, D, R and the first reserved bits.
    pub const HDRCT: usize = 2;
    pub const CTRL: Field = 0..4;
    pub const SEGMENT_LEN: Field = 4..6;
}

/// A view over a Terminate message body, decoding the control word in a
/// given [`Layout`] (by default the detected one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
    layout: Layout,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Assumes the RFC 5040 layout; see [`Packet::with_layout`].
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet {
            buffer,
            layout: Layout::Rfc5040,
        }
    }

    /// Checks that the control word is there and detects the layout.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let mut p = Self::new_unchecked(buffer);
        p.check_len()?;
        p.layout = detect_layout(p.ctrl());
        Ok(p)
    }

    /// Overrides the layout, e.g. when the peer is known to be siw.
    pub fn with_layout(self, layout: Layout) -> Packet<T> {
        Packet { layout, ..self }
    }

    /// Only the control word is required; the rest depends on the flags
    /// and is checked by [`TerminateRepr::parse`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < CTRL_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn ctrl(&self) -> [u8; 4] {
        let mut c = [0; 4];
        c.copy_from_slice(&self.buffer.as_ref()[field::CTRL]);
        c
    }

    pub fn layer(&self) -> u8 {
        let b = self.buffer.as_ref()[field::LAYER_ETYPE];
        match self.layout {
            Layout::Rfc5040 => b >> 4,
            Layout::Siw => b & 0x0f,
        }
    }

    pub fn etype(&self) -> u8 {
        let b = self.buffer.as_ref()[field::LAYER_ETYPE];
        match self.layout {
            Layout::Rfc5040 => b & 0x0f,
            Layout::Siw => b >> 4,
        }
    }

    pub fn ecode(&self) -> u8 {
        self.buffer.as_ref()[field::ECODE]
    }

    fn flag(&self, rfc: u8, siw: u8) -> bool {
        let b = self.buffer.as_ref()[field::HDRCT];
        match self.layout {
            Layout::Rfc5040 => b & rfc != 0,
            Layout::Siw => b & siw != 0,
        }
    }

    /// M: the DDP Segment Length is valid.
    pub fn hdrct_m(&self) -> bool {
        self.flag(RFC_M, SIW_M)
    }

    /// D: the DDP header of the offending segment is included.
    pub fn hdrct_d(&self) -> bool {
        self.flag(RFC_D, SIW_D)
    }

    /// R: the RDMA Read Request header is included.
    pub fn hdrct_r(&self) -> bool {
        self.flag(RFC_R, SIW_R)
    }

    /// Everything after the control word.
    pub fn rest(&self) -> &[u8] {
        &self.buffer.as_ref()[CTRL_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the control word in the RFC 5040 layout, reserved bits zero.
    pub fn set_ctrl(&mut self, cause: Cause, m: bool, d: bool, r: bool) {
        let mut flags = 0;
        if m {
            flags |= RFC_M;
        }
        if d {
            flags |= RFC_D;
        }
        if r {
            flags |= RFC_R;
        }
        let buf = self.buffer.as_mut();
        buf[field::LAYER_ETYPE] = (cause.layer << 4) | (cause.etype & 0x0f);
        buf[field::ECODE] = cause.ecode;
        buf[field::HDRCT] = flags;
        buf[field::HDRCT + 1] = 0;
        self.layout = Layout::Rfc5040;
    }

    pub fn set_segment_len(&mut self, len: u16) {
        be::put_u16(self.buffer.as_mut(), field::SEGMENT_LEN, len);
    }

    pub fn rest_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[CTRL_LEN..]
    }
}

/// A parsed Terminate body.
///
/// `ddp_segment_len` is `Some` exactly when M is set; the field is also on
/// the wire (but meaningless) when only D is set. `ddp_header` is the whole
/// copied DDP header (14 or 18 octets per its T bit) when D is set, else
/// empty; `rdmap_header` the 28-octet Read Request header when R is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateRepr<'a> {
    pub layer: u8,
    pub etype: u8,
    pub ecode: u8,
    pub hdrct_m: bool,
    pub hdrct_d: bool,
    pub hdrct_r: bool,
    pub ddp_segment_len: Option<u16>,
    pub ddp_header: &'a [u8],
    pub rdmap_header: &'a [u8],
}

impl<'a> TerminateRepr<'a> {
    /// A Terminate that reports only its cause (RFC 5040 section 7.1 case
    /// 1, and every local catastrophic or LLP error per figure 10).
    pub const fn new(cause: Cause) -> TerminateRepr<'a> {
        TerminateRepr {
            layer: cause.layer,
            etype: cause.etype,
            ecode: cause.ecode,
            hdrct_m: false,
            hdrct_d: false,
            hdrct_r: false,
            ddp_segment_len: None,
            ddp_header: &[],
            rdmap_header: &[],
        }
    }

    /// Adds the offending segment's length and DDP header (M and D).
    pub const fn with_ddp(self, segment_len: u16, ddp_header: &'a [u8]) -> TerminateRepr<'a> {
        TerminateRepr {
            hdrct_m: true,
            hdrct_d: true,
            ddp_segment_len: Some(segment_len),
            ddp_header,
            ..self
        }
    }

    /// Adds the (possibly advanced) Read Request header (R).
    pub const fn with_rdmap(self, rdmap_header: &'a [u8]) -> TerminateRepr<'a> {
        TerminateRepr {
            hdrct_r: true,
            rdmap_header,
            ..self
        }
    }

    pub fn cause(&self) -> Cause {
        Cause::new(self.layer, self.etype, self.ecode)
    }

    /// Decodes the body in the packet's layout.
    ///
    /// Missing length or DDP header despite M/D is `Truncated`. An R flag
    /// without a full 28-octet header yields an empty `rdmap_header`: siw
    /// sets R on protection errors of Send with Invalidate but copies only
    /// the DDP header. Bytes after the flagged parts are ignored (RFC 5040
    /// section 7.1 lets senders zero-fill the unused fields).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<TerminateRepr<'a>> {
        packet.check_len()?;
        let m = packet.hdrct_m();
        let d = packet.hdrct_d();
        let r = packet.hdrct_r();
        let data: &'a T = packet.buffer;
        let mut rest = &data.as_ref()[CTRL_LEN..];

        let mut ddp_segment_len = None;
        if m || d {
            if rest.len() < SEGMENT_LEN_LEN {
                return Err(Error::Truncated);
            }
            if m {
                ddp_segment_len = Some(u16::from_be_bytes([rest[0], rest[1]]));
            }
            rest = &rest[SEGMENT_LEN_LEN..];
        }

        let mut ddp_header: &'a [u8] = &[];
        if d {
            let len = super::ddp::header_len(rest).ok_or(Error::Truncated)?;
            if rest.len() < len {
                return Err(Error::Truncated);
            }
            (ddp_header, rest) = rest.split_at(len);
        }

        let rdmap_header: &'a [u8] = if r && rest.len() >= RDMAP_HEADER_LEN {
            &rest[..RDMAP_HEADER_LEN]
        } else {
            &[]
        };

        Ok(TerminateRepr {
            layer: packet.layer(),
            etype: packet.etype(),
            ecode: packet.ecode(),
            hdrct_m: m,
            hdrct_d: d,
            hdrct_r: r,
            ddp_segment_len,
            ddp_header,
            rdmap_header,
        })
    }

    /// Detects the layout and decodes.
    pub fn parse_bytes(body: &'a [u8]) -> Result<TerminateRepr<'a>> {
        Self::parse(&Packet::new_checked(body)?)
    }

    pub fn buffer_len(&self) -> usize {
        let mut n = CTRL_LEN;
        if self.hdrct_m || self.hdrct_d {
            n += SEGMENT_LEN_LEN;
        }
        if self.hdrct_d {
            n += self.ddp_header.len();
        }
        if self.hdrct_r {
            n += self.rdmap_header.len();
        }
        n
    }

    /// Writes the body in the RFC 5040 layout. The packet must be at least
    /// `buffer_len()` bytes; headers are written only if their flag is set.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_ctrl(self.cause(), self.hdrct_m, self.hdrct_d, self.hdrct_r);
        let rest = packet.rest_mut();
        let mut off = 0;
        if self.hdrct_m || self.hdrct_d {
            let len = self.ddp_segment_len.unwrap_or(0);
            rest[..SEGMENT_LEN_LEN].copy_from_slice(&len.to_be_bytes());
            off += SEGMENT_LEN_LEN;
        }
        if self.hdrct_d {
            rest[off..off + self.ddp_header.len()].copy_from_slice(self.ddp_header);
            off += self.ddp_header.len();
        }
        if self.hdrct_r {
            rest[off..off + self.rdmap_header.len()].copy_from_slice(self.rdmap_header);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ddp::{self, HeaderRepr, Kind};
    use proptest::prelude::*;

    /// The RFC 5040 example from the siw notes: DDP layer, untagged buffer
    /// error (2), code 5 (message too long), M set.
    #[test]
    fn rfc_control_word() {
        let body = [0x12, 0x05, 0x80, 0x00, 0x00, 0x20];
        let p = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(p.layout(), Layout::Rfc5040);
        let t = TerminateRepr::parse(&p).unwrap();
        assert_eq!(t.cause(), Cause::DDP_U_MSG_TOO_LONG);
        assert_eq!((t.layer, t.etype, t.ecode), (1, 2, 5));
        assert!(t.hdrct_m && !t.hdrct_d && !t.hdrct_r);
        assert_eq!(t.ddp_segment_len, Some(0x20));

        let mut out = [0u8; 6];
        t.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, body);
    }

    /// The same Terminate as siw sends it: `21 05 01 00`.
    #[test]
    fn siw_control_word() {
        let body = [0x21, 0x05, 0x01, 0x00, 0x00, 0x20];
        let p = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(p.layout(), Layout::Siw);
        let t = TerminateRepr::parse(&p).unwrap();
        assert_eq!((t.layer, t.etype, t.ecode), (1, 2, 5));
        assert!(t.hdrct_m && !t.hdrct_d && !t.hdrct_r);
        assert_eq!(t.ddp_segment_len, Some(0x20));
        // Re-emitted in the RFC layout.
        let mut out = [0u8; 6];
        t.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x12, 0x05, 0x80, 0x00, 0x00, 0x20]);
    }

    /// What siw sent for an RDMA Write to an unknown STag (siw notes):
    /// DDP layer, tagged buffer error, invalid STag, M and D, then the
    /// segment length and the 14-byte tagged header of the offending Write.
    #[test]
    fn siw_invalid_stag_with_ddp_header() {
        let mut body = vec![0x11, 0x00, 0x03, 0x00, 0x00, 0x10];
        let write = HeaderRepr {
            last: true,
            version: 1,
            rdmap_ctrl: 0x40,
            kind: Kind::Tagged {
                stag: 0xdead_0001,
                to: 0x1000,
            },
        };
        let mut hdr = [0u8; ddp::TAGGED_HDR_LEN];
        write.emit(&mut hdr);
        body.extend_from_slice(&hdr);
        let t = TerminateRepr::parse_bytes(&body).unwrap();
        assert_eq!(t.cause(), Cause::DDP_T_INVALID_STAG);
        assert!(t.hdrct_m && t.hdrct_d && !t.hdrct_r);
        assert_eq!(t.ddp_segment_len, Some(16));
        assert_eq!(t.ddp_header, &hdr);
        assert_eq!(HeaderRepr::parse(t.ddp_header).unwrap().0, write);
        assert!(t.rdmap_header.is_empty());
    }

    /// A remote protection error on a Read Request, RFC layout, with all
    /// three parts (RFC 5040 figure 10).
    #[test]
    fn read_request_error_full() {
        let ddp_hdr = [0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0];
        let rdma_hdr: Vec<u8> = (0..28).collect();
        let t = TerminateRepr::new(Cause::RDMAP_PROT_BASE_BOUNDS)
            .with_ddp(46, &ddp_hdr)
            .with_rdmap(&rdma_hdr);
        assert_eq!(t.buffer_len(), 4 + 2 + 18 + 28);
        let mut out = vec![0u8; t.buffer_len()];
        t.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(&out[..6], &[0x01, 0x01, 0xe0, 0x00, 0x00, 46]);
        assert_eq!(&out[6..24], &ddp_hdr);
        assert_eq!(&out[24..], &rdma_hdr[..]);
        assert_eq!(TerminateRepr::parse_bytes(&out).unwrap(), t);
    }

    #[test]
    fn layout_detection() {
        // No flags: symmetric nibbles are read the RFC way.
        assert_eq!(detect_layout([0x00, 0x00, 0, 0]), Layout::Rfc5040);
        assert_eq!(detect_layout([0x11, 0x04, 0, 0]), Layout::Rfc5040);
        // siw's MPA CRC error (layer 2, etype 0, code 2) reads as RDMAP
        // remote operation code 2 the RFC way, which does not exist.
        assert_eq!(detect_layout([0x02, 0x02, 0, 0]), Layout::Siw);
        // siw's DDP untagged version error: RFC reading "LLP etype 1".
        assert_eq!(detect_layout([0x21, 0x06, 0, 0]), Layout::Siw);
        // Both readings valid: RFC wins.
        assert_eq!(detect_layout([0x20, 0x06, 0, 0]), Layout::Rfc5040);
        // Flags decide.
        assert_eq!(detect_layout([0x10, 0x00, 0x07, 0]), Layout::Siw);
        assert_eq!(detect_layout([0x01, 0x00, 0xe0, 0]), Layout::Rfc5040);
        // Explicit override.
        let body = [0x20, 0x06, 0x00, 0x00];
        let p = Packet::new_checked(&body[..])
            .unwrap()
            .with_layout(Layout::Siw);
        let t = TerminateRepr::parse(&p).unwrap();
        assert_eq!(t.cause(), Cause::RDMAP_OP_UNEXPECTED_OPCODE);
    }

    #[test]
    fn lenient_and_strict_parts() {
        // siw: R set on a Send with Invalidate, only the DDP header follows.
        let mut body = vec![0x10, 0x00, 0x07, 0x00, 0x00, 0x12];
        body.extend_from_slice(&[0x41, 0x44, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
        let t = TerminateRepr::parse_bytes(&body).unwrap();
        assert_eq!(t.cause(), Cause::RDMAP_PROT_INVALID_STAG);
        assert!(t.hdrct_r);
        assert!(t.rdmap_header.is_empty());
        assert_eq!(t.ddp_header.len(), 18);

        // D without the header is truncated.
        assert_eq!(
            TerminateRepr::parse_bytes(&body[..10]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            TerminateRepr::parse_bytes(&body[..5]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            TerminateRepr::parse_bytes(&body[..3]).unwrap_err(),
            Error::Truncated
        );
        // Zero-filled unused fields after a flag-less control word.
        let t = TerminateRepr::parse_bytes(&[0x00, 0x00, 0x00, 0x00, 0, 0, 0, 0]).unwrap();
        assert_eq!(t, TerminateRepr::new(Cause::RDMAP_LOCAL_CATASTROPHIC));
    }

    #[test]
    fn code_table() {
        assert!(Cause::RDMAP_OP_UNSPECIFIED.is_defined());
        assert!(Cause::MPA_NO_MATCHING_RTR.is_defined());
        assert!(Cause::DDP_U_INVALID_VERSION.is_defined());
        assert!(!Cause::new(LAYER_DDP, DDP_ETYPE_UNTAGGED_BUFFER, 0).is_defined());
        assert!(!Cause::new(LAYER_RDMAP, RDMAP_ETYPE_REMOTE_OPERATION, 0x02).is_defined());
        assert!(!Cause::new(3, 0, 0).is_defined());
        assert_eq!(Cause::ddp_bad_version(true).ecode, 0x04);
        assert_eq!(Cause::ddp_bad_version(false).ecode, 0x06);
        assert_eq!(Cause::ATOMIC_MISALIGNED.ecode, 0x07);
    }

    fn arb_terminate() -> impl Strategy<Value = (Cause, bool, bool, bool, u16, bool, Vec<u8>)> {
        (
            (0u8..16, 0u8..16, any::<u8>()).prop_map(|(l, e, c)| Cause::new(l, e, c)),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<u16>(),
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), RDMAP_HEADER_LEN),
        )
    }

    proptest! {
        #[test]
        fn round_trip((cause, m, d, r, seg, tagged, rdma) in arb_terminate()) {
            let mut ddp_hdr = vec![0x5au8; if tagged { 14 } else { 18 }];
            ddp_hdr[0] = if tagged { 0xc1 } else { 0x41 };
            let t = TerminateRepr {
                layer: cause.layer,
                etype: cause.etype,
                ecode: cause.ecode,
                hdrct_m: m,
                hdrct_d: d,
                hdrct_r: r,
                ddp_segment_len: m.then_some(seg),
                ddp_header: if d { &ddp_hdr } else { &[] },
                rdmap_header: if r { &rdma } else { &[] },
            };
            let mut out = vec![0u8; t.buffer_len()];
            t.emit(&mut Packet::new_unchecked(&mut out[..]));
            // The emitted RFC layout is read back as such whatever the cause.
            let p = Packet::new_checked(&out[..]).unwrap().with_layout(Layout::Rfc5040);
            prop_assert_eq!(TerminateRepr::parse(&p).unwrap(), t);
            // Detection agrees whenever a flag is set or the cause is defined.
            if m || d || r || cause.is_defined() {
                prop_assert_eq!(TerminateRepr::parse_bytes(&out).unwrap(), t);
            }
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = TerminateRepr::parse(&p);
                let _ = TerminateRepr::parse(&p.with_layout(Layout::Siw));
                let _ = TerminateRepr::parse(&p.with_layout(Layout::Rfc5040));
            }
        }
    }
}
