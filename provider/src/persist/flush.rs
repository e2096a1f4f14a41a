//! Making stores visible and durable: the global fence, and writing CPU
//! cache lines back to persistent memory.

use super::*;

/// Global visibility: every store made before this call is visible to every CPU.
pub fn flush_global() {
    // x86-64 is TSO with coherent caches: a full fence drains the store buffer, after which all earlier stores are visible.
    fence(Ordering::SeqCst);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod cpu {
    use std::arch::asm;
    use std::arch::x86_64::{_mm_clflush, _mm_mfence, _mm_sfence};
    use std::io;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(in crate::persist) enum LineOp {
        Clwb,
        Clflushopt,
        Clflush,
    }

    /// The cache-line instructions this CPU has.
    #[derive(Clone, Copy, Debug)]
    pub(in crate::persist) struct CacheOps {
        pub(in crate::persist) line: u64,
        /// Writes a line back, keeping it cached if it can.
        pub(in crate::persist) write_back: LineOp,
        /// Writes a line back and invalidates it.
        pub(in crate::persist) evict: LineOp,
    }

    impl CacheOps {
        // cpuid became a safe function in later Rust versions than the workspace's.
        #[allow(unused_unsafe)]
        pub(in crate::persist) fn detect() -> CacheOps {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            // SAFETY: every x86-64 CPU has cpuid, and leaf 7 reads as zeros where absent.
            let (leaf1, leaf7) = unsafe { (__cpuid(1), __cpuid_count(7, 0)) };
            // CPUID.1:EBX[15:8] is the clflush line size in 8-byte units.
            let line = u64::from((leaf1.ebx >> 8) & 0xff) * 8;
            let clflushopt = leaf7.ebx & (1 << 23) != 0;
            let clwb = leaf7.ebx & (1 << 24) != 0;
            let evict = if clflushopt {
                LineOp::Clflushopt
            } else {
                LineOp::Clflush
            };
            CacheOps {
                line: if line.is_power_of_two() { line } else { 64 },
                write_back: if clwb { LineOp::Clwb } else { evict },
                evict,
            }
        }

        /// Writes every cache line of `[addr, addr+len)` back to memory, then sfence.
        ///
        /// # Safety
        /// The range is mapped for the duration of the call.
        pub(in crate::persist) unsafe fn write_back(&self, addr: u64, len: u64) -> io::Result<()> {
            // SAFETY: forwarded from the caller.
            unsafe { self.each_line(addr, len, self.write_back) };
            // SAFETY: sse is part of x86-64.
            unsafe { _mm_sfence() };
            Ok(())
        }

        /// Writes back and invalidates every cache line of `[addr, addr+len)`, then
        /// mfence, so that later loads come from memory.
        ///
        /// # Safety
        /// The range is mapped for the duration of the call.
        pub(in crate::persist) unsafe fn evict(&self, addr: u64, len: u64) {
            // SAFETY: forwarded from the caller.
            unsafe { self.each_line(addr, len, self.evict) };
            // SAFETY: sse2 is part of x86-64.
            unsafe { _mm_mfence() };
        }

        /// # Safety
        /// The range is mapped.
        unsafe fn each_line(&self, addr: u64, len: u64, op: LineOp) {
            let end = addr + len;
            let mut p = addr & !(self.line - 1);
            while p < end {
                let at = p as *const u8;
                // SAFETY: `at` is in a line of the caller's mapped range; the
                // instructions only move the line between cache and memory.
                unsafe {
                    match op {
                        LineOp::Clwb => {
                            asm!("clwb [{}]", in(reg) at, options(nostack, preserves_flags))
                        }
                        LineOp::Clflushopt => {
                            asm!("clflushopt [{}]", in(reg) at, options(nostack, preserves_flags))
                        }
                        LineOp::Clflush => _mm_clflush(at),
                    }
                }
                p += self.line;
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) mod cpu {
    use std::io;
    use std::sync::atomic::{fence, Ordering};

    /// Cache-line write-back is implemented for x86-64 only: elsewhere a fence.
    #[derive(Clone, Copy, Debug)]
    pub(in crate::persist) struct CacheOps;

    impl CacheOps {
        pub(in crate::persist) fn detect() -> CacheOps {
            CacheOps
        }

        /// # Safety
        /// None: nothing is dereferenced.
        pub(in crate::persist) unsafe fn write_back(
            &self,
            _addr: u64,
            _len: u64,
        ) -> io::Result<()> {
            fence(Ordering::SeqCst);
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "writing back CPU cache lines is implemented for x86-64 only",
            ))
        }

        /// # Safety
        /// None: nothing is dereferenced.
        pub(in crate::persist) unsafe fn evict(&self, _addr: u64, _len: u64) {
            fence(Ordering::SeqCst);
        }
    }
}
