//! On-demand paging (`IBV_ACCESS_ON_DEMAND`): memory an ODP MR covers need
//! not be mapped when it is registered, nor stay mapped while it is.
//!
//! Its bytes are therefore never touched through a pointer. They are copied
//! through the kernel (`process_vm_readv`/`process_vm_writev` on this
//! process), which answers a page that is not mapped, or not writable, with
//! an error instead of a fault, and brings in a page that is mapped but not
//! resident, as an RNIC's page fault would. The word of an atomic is checked
//! against the process's mappings just before it is done; prefetching
//! (`ibv_advise_mr`) asks the kernel to populate the pages.

use crate::error::Error;
use crate::sys;

/// Copies `out.len()` bytes from this process's address `from` into `out`;
/// false if any of them is not mapped readable.
pub fn read(from: u64, out: &mut [u8]) -> bool {
    out.is_empty() || sys::read_own(from, out).is_ok_and(|n| n == out.len())
}

/// Copies `data` to this process's address `to`; false if any of the bytes
/// is not mapped writable (those before it may have been written).
pub fn write(to: u64, data: &[u8]) -> bool {
    // SAFETY: `to` is on-demand paging memory the application registered,
    // which the provider writes as an RNIC would; no reference of the
    // provider's covers it.
    data.is_empty() || unsafe { sys::write_own(to, data) }.is_ok_and(|n| n == data.len())
}

/// Whether `[addr, addr+len)` is mapped now, and writable if `write`.
pub fn accessible(addr: u64, len: u64, write: bool) -> bool {
    match crate::maps::read() {
        Ok(maps) => crate::maps::covered(&maps, addr, len, write),
        // Without /proc nothing can be vouched for.
        Err(_) => false,
    }
}

/// Brings the pages of `[addr, addr+len)` in (for writing if `write`), as
/// an RNIC's prefetch would; an error if some of them are not mapped (so
/// mapped).
pub fn populate(addr: u64, len: u64, write: bool) -> Result<(), Error> {
    if len == 0 {
        return Ok(());
    }
    let page = sys::page_size();
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(page))
        .ok_or(Error::invalid("the range wraps around the address space"))?;
    let not_mapped = || Error::NotMapped(format!("{addr:#x}+{len} is not mapped").into());
    let Err(e) = sys::populate(start, (end - start) as usize, write) else {
        return Ok(());
    };
    match e.raw_os_error() {
        // An older kernel: check the range is mapped, and read ahead.
        Some(libc::EINVAL) => {
            if !accessible(start, end - start, write) {
                return Err(not_mapped());
            }
            let _ = sys::will_need(start, (end - start) as usize);
            Ok(())
        }
        Some(libc::ENOMEM) | None => Err(not_mapped()),
        Some(errno) => Err(Error::Kernel {
            what: "the prefetch",
            errno,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies reach mapped memory, and an unmapped or read-only page is an
    /// error, not a fault.
    #[test]
    fn copies_fail_instead_of_faulting() {
        use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};
        // SAFETY: a fresh anonymous mapping of three pages, ours alone.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                3 * 4096,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .unwrap();
        let b = base as u64;
        assert!(write(b + 10, b"hello"));
        let mut got = [0u8; 5];
        assert!(read(b + 10, &mut got));
        assert_eq!(&got, b"hello");
        assert!(populate(b, 4096, true).is_ok());
        assert!(accessible(b, 3 * 4096, true));
        // SAFETY: the middle page of our mapping.
        unsafe {
            rustix::mm::munmap((b + 4096) as *mut _, 4096).unwrap();
            rustix::mm::mprotect((b + 8192) as *mut _, 4096, MprotectFlags::READ).unwrap();
        }
        assert!(!write(b + 4000, &[1u8; 200]), "across the hole");
        assert!(!read(b + 4096, &mut got), "in the hole");
        assert!(!write(b + 8192, b"x"), "read-only");
        assert!(read(b + 8192, &mut got), "read-only is readable");
        assert!(!accessible(b, 3 * 4096, false));
        assert!(!accessible(b + 8192, 8, true));
        assert!(accessible(b + 8192, 8, false));
        assert_eq!(
            populate(b + 4096, 10, false).map_err(|e| e.errno()),
            Err(libc::EFAULT)
        );
        // SAFETY: what is left of our mapping.
        unsafe {
            rustix::mm::munmap(base, 4096).unwrap();
            rustix::mm::munmap((b + 8192) as *mut _, 4096).unwrap();
        }
    }
}
