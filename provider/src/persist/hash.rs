//! RDMA Verify's hashes, over memory or a file read back from the medium.

use super::*;
use xiw_engine::wire::mpa::Crc;

/// Hash algorithms of RDMA Verify, with the ids of `enum xiwdv_hash`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Crc32c,
    Sha256,
}

impl Hash {
    /// `XIWDV_HASH_CRC32C` is 1, `XIWDV_HASH_SHA256` is 2; anything else (0 included) is none.
    pub fn from_id(id: u32) -> Option<Hash> {
        match id {
            1 => Some(Hash::Crc32c),
            2 => Some(Hash::Sha256),
            _ => None,
        }
    }

    pub fn id(self) -> u32 {
        match self {
            Hash::Crc32c => 1,
            Hash::Sha256 => 2,
        }
    }

    /// Length of the hash value in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(self) -> usize {
        match self {
            Hash::Crc32c => 4,
            Hash::Sha256 => 32,
        }
    }
}

/// Hash of a byte slice: CRC32c as 4 bytes big-endian, or SHA-256.
pub fn hash_bytes(alg: Hash, data: &[u8]) -> Vec<u8> {
    let mut h = Hasher::new(alg);
    h.update(data);
    h.finish()
}

#[derive(Clone)]
pub enum Hasher {
    Crc32c(Crc),
    Sha256(Sha256),
}

impl Hasher {
    pub(super) fn new(alg: Hash) -> Hasher {
        match alg {
            Hash::Crc32c => Hasher::Crc32c(Crc::using(crate::crc::crc32c())),
            Hash::Sha256 => Hasher::Sha256(Sha256::new()),
        }
    }

    pub(super) fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Crc32c(crc) => crc.update(data),
            Hasher::Sha256(sha) => sha.update(data),
        }
    }

    pub(super) fn finish(self) -> Vec<u8> {
        match self {
            Hasher::Crc32c(crc) => crc.value().to_be_bytes().to_vec(),
            Hasher::Sha256(sha) => sha.finalize().to_vec(),
        }
    }
}

/// Hashes memory directly.
///
/// # Safety
/// `[addr, addr+len)` is mapped and readable for the duration of the call.
pub(super) unsafe fn hash_memory(addr: u64, len: u64, h: &mut Hasher) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller guarantees the range is mapped; the peer and the
    // application may write it meanwhile, which only changes the value hashed.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    h.update(bytes);
}

/// Reads the aligned cover of `[off, off+len)` of `file` in chunks and hashes
/// the requested bytes; bytes past end-of-file hash as zero.
pub(super) fn read_hashed(
    file: &File,
    off: u64,
    len: u64,
    align: u64,
    direct: bool,
    bounce: &mut Vec<u8>,
    h: &mut Hasher,
) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let first = off - off % align;
    let last = (off + len).div_ceil(align) * align;
    let chunk = (last - first).min(CHUNK.max(align)) as usize;
    if bounce.len() < chunk + align as usize {
        bounce.resize(chunk + align as usize, 0);
    }
    let skip = bounce.as_ptr().align_offset(align as usize);
    let buf = &mut bounce[skip..skip + chunk];

    let mut pos = first;
    let mut eof = false;
    while pos < last {
        let want = (last - pos).min(chunk as u64) as usize;
        let mut got = 0;
        while !eof && got < want {
            match file.read_at(&mut buf[got..want], pos + got as u64) {
                Ok(0) => eof = true,
                Ok(n) => {
                    got += n;
                    // O_DIRECT reads whole blocks except the one holding end-of-file.
                    eof = direct && got % align as usize != 0;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf[got..want].fill(0);
        let lo = (off.max(pos) - pos) as usize;
        let hi = ((off + len).min(pos + want as u64) - pos) as usize;
        h.update(&buf[lo..hi]);
        pos += want as u64;
    }
    Ok(())
}
