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

/// Copies `out.len()` bytes from this process's address `from` into `out`;
/// false if any of them is not mapped readable.
pub fn read(from: u64, out: &mut [u8]) -> bool {
    transfer(out.as_mut_ptr(), out.len(), from, false)
}

/// Copies `data` to this process's address `to`; false if any of the bytes
/// is not mapped writable (those before it may have been written).
pub fn write(to: u64, data: &[u8]) -> bool {
    transfer(data.as_ptr() as *mut u8, data.len(), to, true)
}

/// Moves `len` bytes between our buffer at `local` and this process's
/// address `remote` through the kernel (to `remote` if `to_remote`).
fn transfer(local: *mut u8, len: usize, remote: u64, to_remote: bool) -> bool {
    if len == 0 {
        return true;
    }
    let l = libc::iovec {
        iov_base: local.cast(),
        iov_len: len,
    };
    let r = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` is `len` bytes of the caller's own buffer (only read
    // when writing to `remote`); the kernel checks `remote` and fails on what
    // is not mapped (writable, if written) instead of faulting.
    let n = unsafe {
        if to_remote {
            libc::process_vm_writev(libc::getpid(), &l, 1, &r, 1, 0)
        } else {
            libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0)
        }
    };
    n == len as isize
}

/// Whether `[addr, addr+len)` is mapped now, and writable if `write`.
pub fn accessible(addr: u64, len: u64, write: bool) -> bool {
    match crate::maps::read() {
        Ok(maps) => crate::maps::covered(&maps, addr, len, write),
        // Without /proc nothing can be vouched for.
        Err(_) => false,
    }
}

/// `MADV_POPULATE_READ` and `MADV_POPULATE_WRITE` (Linux 5.14).
const POPULATE_READ: libc::c_int = 22;
const POPULATE_WRITE: libc::c_int = 23;

/// Brings the pages of `[addr, addr+len)` in (for writing if `write`), as
/// an RNIC's prefetch would; the errno if some of them are not mapped (so
/// mapped).
pub fn populate(addr: u64, len: u64, write: bool) -> Result<(), i32> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: sysconf has no preconditions.
    let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64;
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(page))
        .ok_or(libc::EINVAL)?;
    let advice = if write { POPULATE_WRITE } else { POPULATE_READ };
    // SAFETY: populating changes no mapping and no byte; the kernel checks
    // the range.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, (end - start) as usize, advice) };
    if r == 0 {
        return Ok(());
    }
    match std::io::Error::last_os_error().raw_os_error() {
        // An older kernel: check the range is mapped, and read ahead.
        Some(libc::EINVAL) => {
            if !accessible(start, end - start, write) {
                return Err(libc::EFAULT);
            }
            // SAFETY: as above; WILLNEED only starts reading pages in.
            unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    (end - start) as usize,
                    libc::MADV_WILLNEED,
                )
            };
            Ok(())
        }
        Some(libc::ENOMEM) => Err(libc::EFAULT),
        Some(e) => Err(e),
        None => Err(libc::EFAULT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies reach mapped memory, and an unmapped or read-only page is an
    /// error, not a fault.
    #[test]
    fn copies_fail_instead_of_faulting() {
        // SAFETY: a fresh anonymous mapping of three pages, ours alone.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let b = base as u64;
        assert!(write(b + 10, b"hello"));
        let mut got = [0u8; 5];
        assert!(read(b + 10, &mut got));
        assert_eq!(&got, b"hello");
        assert!(populate(b, 4096, true).is_ok());
        assert!(accessible(b, 3 * 4096, true));
        // SAFETY: the middle page of our mapping.
        unsafe {
            assert_eq!(libc::munmap((b + 4096) as *mut libc::c_void, 4096), 0);
            assert_eq!(
                libc::mprotect((b + 8192) as *mut libc::c_void, 4096, libc::PROT_READ),
                0
            );
        }
        assert!(!write(b + 4000, &[1u8; 200]), "across the hole");
        assert!(!read(b + 4096, &mut got), "in the hole");
        assert!(!write(b + 8192, b"x"), "read-only");
        assert!(read(b + 8192, &mut got), "read-only is readable");
        assert!(!accessible(b, 3 * 4096, false));
        assert!(!accessible(b + 8192, 8, true));
        assert!(accessible(b + 8192, 8, false));
        assert_eq!(populate(b + 4096, 10, false), Err(libc::EFAULT));
        // SAFETY: what is left of our mapping.
        unsafe {
            libc::munmap(base, 4096);
            libc::munmap((b + 8192) as *mut libc::c_void, 4096);
        }
    }
}
