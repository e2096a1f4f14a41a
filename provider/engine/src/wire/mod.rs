//! Sans-IO codecs for the iWARP wire: MPA framing (RFC 5044, RFC 6581), DDP
//! segments (RFC 5041), RDMAP messages (RFC 5040), the RDMAP extensions of
//! RFC 7306 (atomics, immediate data) and draft-talpey-rdma-commit-01 (Flush,
//! Verify, Atomic Write).
//!
//! Each header has a typed view over bytes (`Packet`-style, length checked
//! once so every accessor is panic-free) and a `Repr` of parsed values with
//! `parse`, `emit` and `buffer_len`. Nothing here allocates or does I/O.
//!
//! Offsets in the `field` modules are relative to the start of the header
//! they describe. In particular, DDP offsets start at the DDP control byte,
//! i.e. right after the 2-byte MPA ULPDU_Length: the RFC 5040/5041 figures
//! draw the DDP header shifted by 16 bits to make room for that length.

pub mod atomic;
pub mod commit;
pub mod ddp;
pub mod mpa;
pub mod rdmap;
pub mod terminate;

/// A byte range of a header, as drawn in the RFC figures.
pub type Field = core::ops::Range<usize>;
/// The bytes from an offset to the end of the buffer.
pub type Rest = core::ops::RangeFrom<usize>;

/// Why a buffer could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Fewer bytes than the header (or the length it announces) needs.
    #[error("truncated")]
    Truncated,
    /// An MPA revision, DDP version or RDMAP version this implementation
    /// does not speak. From [`ddp::HeaderRepr::parse`] it always means the
    /// DDP version, whose Terminate code depends on the buffer model
    /// ([`ddp::is_tagged`], [`terminate::Cause::ddp_bad_version`]).
    #[error("unsupported protocol version or revision")]
    BadVersion,
    /// A length field is out of range or disagrees with the buffer.
    #[error("bad length")]
    BadLength,
    /// The MPA CRC32c trailer does not match (RFC 5044 error semantics: answered
    /// with Terminate layer LLP, MPA CRC error).
    #[error("MPA CRC mismatch")]
    BadCrc,
    /// Anything else that is structurally wrong.
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

pub type Result<T> = core::result::Result<T, Error>;

/// Big-endian accessors: every iWARP field is in network byte order.
pub(crate) mod be {
    use super::Field;

    #[inline(always)]
    pub fn u16_at(buf: &[u8], f: Field) -> u16 {
        let b = &buf[f];
        u16::from_be_bytes([b[0], b[1]])
    }

    #[inline(always)]
    pub fn u32_at(buf: &[u8], f: Field) -> u32 {
        let b = &buf[f];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    #[inline(always)]
    pub fn u64_at(buf: &[u8], f: Field) -> u64 {
        let b = &buf[f];
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        u64::from_be_bytes(a)
    }

    #[inline(always)]
    pub fn put_u16(buf: &mut [u8], f: Field, v: u16) {
        buf[f].copy_from_slice(&v.to_be_bytes());
    }

    #[inline(always)]
    pub fn put_u32(buf: &mut [u8], f: Field, v: u32) {
        buf[f].copy_from_slice(&v.to_be_bytes());
    }

    #[inline(always)]
    pub fn put_u64(buf: &mut [u8], f: Field, v: u64) {
        buf[f].copy_from_slice(&v.to_be_bytes());
    }
}
