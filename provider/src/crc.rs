//! The CRC32c the provider's streams use: the engine's portable routine,
//! except that on x86-64 CPUs with SSE 4.2 short inputs (the FPDUs of small
//! messages, where a general routine's set-up costs more than the CRC itself)
//! go straight to the CRC32 instruction.

use xiw_engine::wire::mpa;

/// Inputs up to this many bytes take the short path.
#[cfg(target_arch = "x86_64")]
const SHORT: usize = 256;

/// The best routine for this CPU.
pub fn crc32c() -> mpa::Crc32c {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        return x86_short;
    }
    mpa::crc32c
}

#[cfg(target_arch = "x86_64")]
fn x86_short(crc: u32, data: &[u8]) -> u32 {
    if data.len() > SHORT {
        return mpa::crc32c(crc, data);
    }
    // SAFETY: `crc32c` hands this routine out only where SSE 4.2 was detected.
    unsafe { sse42(crc, data) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let n = data.len();
    let p = data.as_ptr();
    // The instruction works on the register form (no pre- or post-inversion).
    let mut c = u64::from(!crc);
    let mut i = 0;
    // SAFETY: every read lies inside the `n` bytes of `data`.
    unsafe {
        let word = |at: usize| p.add(at).cast::<u64>().read_unaligned();
        // The FPDU of a small message (up to 32 bytes) takes a few
        // instructions in a row, not a loop.
        if n <= 32 {
            if n >= 16 {
                c = _mm_crc32_u64(c, word(0));
                c = _mm_crc32_u64(c, word(8));
                i = 16;
            }
            if n - i >= 8 {
                c = _mm_crc32_u64(c, word(i));
                i += 8;
            }
            if n - i >= 8 {
                c = _mm_crc32_u64(c, word(i));
                i += 8;
            }
        } else {
            while n - i >= 8 {
                c = _mm_crc32_u64(c, word(i));
                i += 8;
            }
        }
        let mut c = c as u32;
        if n - i >= 4 {
            c = _mm_crc32_u32(c, p.add(i).cast::<u32>().read_unaligned());
            i += 4;
        }
        while i < n {
            c = _mm_crc32_u8(c, *p.add(i));
            i += 1;
        }
        !c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length up to past the short limit, from several starting
    /// values and offsets, against the crc32c crate.
    #[test]
    fn agrees_with_the_reference() {
        let f = crc32c();
        let data: Vec<u8> = (0..700u32).map(|i| (i * 131 + 7) as u8).collect();
        for off in 0..8 {
            for len in 0..(data.len() - off) {
                let d = &data[off..off + len];
                assert_eq!(f(0, d), crc32c::crc32c(d), "len {len} off {off}");
                let (a, b) = d.split_at(len / 3);
                assert_eq!(f(f(0, a), b), crc32c::crc32c(d), "split {len} off {off}");
            }
        }
        // The iSCSI check value.
        assert_eq!(f(0, b"123456789"), 0xe306_9283);
    }
}
