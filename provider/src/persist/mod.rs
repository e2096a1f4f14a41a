//! The medium behind registered memory, for RDMA Flush and RDMA Verify
//! (draft-talpey-rdma-commit-01 sections 3.1 and 3.2).
//!
//! [`Media::probe`] finds once, at registration, what backs a range of this
//! process's memory: plain RAM, a file on a RAM file system, a file on a real
//! file system, or persistent memory mapped with `MAP_SYNC`. Flush to
//! persistence then writes the range back to that medium, and Verify hashes
//! what the medium holds rather than a volatile copy of it.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::sys;

/// What backs a registered range, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaKind {
    /// Private or anonymous memory, or anything else that is not a shared file mapping.
    Anonymous,
    /// A shared mapping of a file on tmpfs, ramfs or hugetlbfs: RAM only.
    VolatileFile,
    /// A shared mapping of a file on a real file system: `msync` makes it durable.
    File,
    /// A `MAP_SYNC` mapping: the CPU cache is the only volatile layer.
    Dax,
}

impl MediaKind {
    /// A range is only as durable as its weakest part.
    fn rank(self) -> u8 {
        match self {
            MediaKind::Anonymous => 0,
            MediaKind::VolatileFile => 1,
            MediaKind::File => 2,
            MediaKind::Dax => 3,
        }
    }
}

mod flush;
mod hash;
mod probe;

use crate::maps::{parse as parse_vma, parse_range, Vma};

use flush::cpu;
pub use flush::flush_global;
use hash::*;
pub use hash::{hash_bytes, Hash};
use probe::*;

/// What backs a registered range, found once at registration.
pub struct Media {
    kind: MediaKind,
    start: u64,
    end: u64,
    /// Why the range cannot be made durable (for the weakest part), if it cannot.
    why_not: Option<String>,
    /// The range cut where the backing changes, in address order, covering `start..end`.
    segments: Vec<Segment>,
    page: u64,
    cache: cpu::CacheOps,
}

struct Segment {
    start: u64,
    end: u64,
    kind: MediaKind,
    backing: Option<Backing>,
}

struct Backing {
    file: Arc<Opened>,
    /// File offset of the segment's first byte.
    offset: u64,
}

struct Opened {
    path: String,
    /// O_RDONLY; std opens every file with O_CLOEXEC.
    file: File,
    /// The same file opened again with O_DIRECT, where the file system allows it.
    direct: Option<File>,
    /// Offset and buffer alignment for O_DIRECT reads.
    align: u64,
}

/// Largest bounce buffer `hash` reads a file through.
const CHUNK: u64 = 1 << 20;

/// Alignment that suits O_DIRECT on every common device (logical blocks of 512 or 4096 bytes).
const DIO_ALIGN: u64 = 4096;

// statfs f_type values (linux/magic.h).
const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58f6;
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;
const BTRFS_MAGIC: u32 = 0x9123_683e;

impl Media {
    /// Reads /proc/self/maps (and /proc/self/smaps only when a file could be
    /// mapped with `MAP_SYNC`) and classifies `[addr, addr+len)`.
    ///
    /// Adjacent mappings of the same file at contiguous offsets and of the same
    /// kind form one segment; a range made of several segments takes the kind of
    /// the weakest. Shared file mappings are opened (through
    /// /proc/self/map_files, else by path, checked to be the same inode).
    /// An empty range is [`MediaKind::Anonymous`]: there is nothing to make durable.
    pub fn probe(addr: u64, len: u64) -> Result<Media, Error> {
        let end = addr.checked_add(len).ok_or_else(|| {
            Error::Media(format!("{addr:#x}+{len:#x} wraps around the address space"))
        })?;
        let mut media = Media {
            kind: MediaKind::Anonymous,
            start: addr,
            end,
            why_not: Some(format!("{addr:#x}-{end:#x} is an empty range: not durable")),
            segments: Vec::new(),
            page: page_size(),
            cache: cpu::CacheOps::detect(),
        };
        if len == 0 {
            return Ok(media);
        }
        let maps = std::fs::read_to_string("/proc/self/maps")
            .map_err(|e| Error::Media(format!("cannot read /proc/self/maps: {e}")))?;
        let vmas = cover(maps.lines().filter_map(parse_vma), addr, end)?;

        let mut files: Vec<(FileId, Arc<Opened>)> = Vec::new();
        let mut pieces = Vec::with_capacity(vmas.len());
        for (vma, start, stop) in &vmas {
            pieces.push(classify(vma, *start, *stop, &mut files)?);
        }

        let maybe_dax: Vec<u64> = pieces
            .iter()
            .filter(|p| p.maybe_dax)
            .map(|p| p.vma_start)
            .collect();
        if !maybe_dax.is_empty() {
            let unreadable = |e| Error::Media(format!("cannot read /proc/self/smaps: {e}"));
            let smaps = File::open("/proc/self/smaps").map_err(unreadable)?;
            let sync = sync_flags(BufReader::new(smaps), &maybe_dax, end).map_err(unreadable)?;
            for p in pieces.iter_mut().filter(|p| p.maybe_dax) {
                if sync.contains(&p.vma_start) {
                    p.kind = MediaKind::Dax;
                }
            }
        }

        let weakest = pieces.iter().map(|p| p.kind).min_by_key(|k| k.rank());
        media.kind = weakest.unwrap_or(MediaKind::Anonymous);
        media.why_not = pieces
            .iter()
            .find(|p| p.kind == media.kind)
            .and_then(|p| p.why_not.clone());
        for p in pieces {
            media.push(p);
        }
        Ok(media)
    }

    /// Appends a piece, merging it into the last segment when both are one
    /// stretch of the same backing.
    fn push(&mut self, p: Piece) {
        if let Some(last) = self.segments.last_mut() {
            let same = match (&last.backing, &p.backing) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    Arc::ptr_eq(&a.file, &b.file) && a.offset + (last.end - last.start) == b.offset
                }
                _ => false,
            };
            if same && last.end == p.start && last.kind == p.kind {
                last.end = p.end;
                return;
            }
        }
        self.segments.push(Segment {
            start: p.start,
            end: p.end,
            kind: p.kind,
            backing: p.backing,
        });
    }

    pub fn kind(&self) -> MediaKind {
        self.kind
    }

    /// Durable after [`Media::flush_persistent`]: File or Dax.
    pub fn durable(&self) -> bool {
        matches!(self.kind, MediaKind::File | MediaKind::Dax)
    }

    /// Why the range cannot be made durable, naming the part that is not; `None` if it can.
    pub fn why_not_durable(&self) -> Option<&str> {
        if self.durable() {
            None
        } else {
            self.why_not.as_deref()
        }
    }

    /// The file behind the first byte of the range and its offset there, if it is a file.
    pub fn backing_file(&self) -> Option<(&str, u64)> {
        let seg = self.segments.first()?;
        let b = seg.backing.as_ref()?;
        Some((b.file.path.as_str(), b.offset))
    }

    /// Makes `[addr, addr+len)` (inside the probed range) durable on the medium
    /// before returning: Dax writes back every cache line, File calls
    /// `msync(MS_SYNC)` (which also flushes the device's write cache).
    /// The caller keeps the range mapped for the duration of the call.
    pub fn flush_persistent(&self, addr: u64, len: u64) -> io::Result<()> {
        let end = self.check(addr, len)?;
        if !self.durable() {
            let why = self.why_not.clone().unwrap_or_else(|| "not durable".into());
            return Err(io::Error::new(io::ErrorKind::Unsupported, why));
        }
        for (seg, a, e) in self.overlapping(addr, end) {
            match seg.kind {
                MediaKind::Dax => {
                    // SAFETY: [a, e) lies in the probed range, which the caller keeps mapped.
                    unsafe { self.cache.write_back(a, e - a) }?
                }
                _ => self.msync(a, e - a)?,
            }
        }
        Ok(())
    }

    /// Hashes `[addr, addr+len)` as read back from the medium: a file through
    /// O_DIRECT, persistent memory after evicting its cache lines, RAM directly.
    /// Bytes of a file mapping past end-of-file hash as zero, as the mapping shows them.
    /// The caller keeps the range mapped for the duration of the call.
    pub fn hash(&self, alg: Hash, addr: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = self.check(addr, len)?;
        let mut h = Hasher::new(alg);
        let mut bounce = Vec::new();
        for (seg, a, e) in self.overlapping(addr, end) {
            match (seg.kind, &seg.backing) {
                (MediaKind::File, Some(b)) => {
                    let off = b.offset + (a - seg.start);
                    self.hash_file(&b.file, a, off, e - a, &mut bounce, &mut h)?;
                }
                (MediaKind::Dax, _) => {
                    // SAFETY: [a, e) lies in the probed range, which the caller keeps mapped.
                    unsafe { self.cache.evict(a, e - a) };
                    // SAFETY: as above; the lines were just evicted, so the loads come from the medium.
                    unsafe { hash_memory(a, e - a, &mut h) };
                }
                _ => {
                    // SAFETY: [a, e) lies in the probed range, which the caller keeps mapped.
                    unsafe { hash_memory(a, e - a, &mut h) };
                }
            }
        }
        Ok(h.finish())
    }

    /// The end of `[addr, addr+len)` if the range lies inside the probed one.
    fn check(&self, addr: u64, len: u64) -> io::Result<u64> {
        match addr.checked_add(len) {
            Some(end) if addr >= self.start && end <= self.end => Ok(end),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{addr:#x}+{len:#x} is outside the probed range {:#x}-{:#x}",
                    self.start, self.end
                ),
            )),
        }
    }

    /// The segments meeting `[addr, end)`, each with its part of the range.
    fn overlapping(&self, addr: u64, end: u64) -> impl Iterator<Item = (&Segment, u64, u64)> {
        self.segments
            .iter()
            .filter(move |s| s.start < end && s.end > addr)
            .map(move |s| (s, s.start.max(addr), s.end.min(end)))
    }

    /// `msync(MS_SYNC)` on the page-aligned cover of `[addr, addr+len)`.
    fn msync(&self, addr: u64, len: u64) -> io::Result<()> {
        let start = addr & !(self.page - 1);
        let end = (addr + len).div_ceil(self.page) * self.page;
        // Mappings are page aligned, so the cover stays inside the probed
        // mappings (ENOMEM otherwise).
        sys::msync(start, (end - start) as usize)
    }

    /// Hashes `len` bytes of `file` at `off`, which the mapping shows at `addr`.
    fn hash_file(
        &self,
        file: &Opened,
        addr: u64,
        off: u64,
        len: u64,
        bounce: &mut Vec<u8>,
        h: &mut Hasher,
    ) -> io::Result<()> {
        if let Some(direct) = &file.direct {
            let before = h.clone();
            match read_hashed(direct, off, len, file.align, true, bounce, h) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => *h = before,
                r => return r,
            }
        }
        // Without O_DIRECT the page cache stands between us and the medium:
        // write the range back (msync), drop the file's clean cached pages
        // (posix_fadvise DONTNEED; pages still mapped stay cached, and they now
        // match what was written), then read normally.
        self.msync(addr, len)?;
        let start = off - off % file.align;
        sys::drop_cached(file.file.as_fd(), start, off + len - start)?;
        read_hashed(&file.file, off, len, file.align, false, bounce, h)
    }
}

#[cfg(test)]
mod tests {
    use super::flush::*;
    use super::hash::*;
    use super::probe::*;
    use super::*;
    use memmap2::{MmapMut, MmapOptions};
    use rustix::mm::{MapFlags, ProtFlags};
    use std::io::Write;
    use std::path::{Path, PathBuf};

    /// A file removed when the test ends.
    struct TempFile(PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// A new file named after the test (`name`) and this process.
    fn temp_file(dir: &Path, name: &str, contents: &[u8]) -> (TempFile, File) {
        let path = dir.join(format!("xiw-persist-{}-{name}", std::process::id()));
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        f.write_all(contents).unwrap();
        f.sync_all().unwrap();
        (TempFile(path), f)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// An mmap'd region unmapped on drop.
    struct Region {
        addr: *mut std::ffi::c_void,
        len: usize,
    }

    impl Region {
        fn anonymous(len: usize, flags: MapFlags) -> Region {
            // SAFETY: a fresh mapping, which replaces none.
            let addr = unsafe {
                rustix::mm::mmap_anonymous(
                    std::ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    flags,
                )
            }
            .unwrap();
            Region { addr, len }
        }

        fn base(&self) -> u64 {
            self.addr as u64
        }

        /// Maps `len` bytes of `f` at `off` over `base() + at`.
        fn place(&self, at: usize, len: usize, f: &File, off: u64) {
            assert!(at + len <= self.len);
            // SAFETY: the target lies inside this region, which the test owns.
            unsafe {
                rustix::mm::mmap(
                    self.addr.cast::<u8>().add(at).cast(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED | MapFlags::FIXED,
                    f,
                    off,
                )
            }
            .unwrap();
        }

        fn bytes(&self, at: usize, len: usize) -> Vec<u8> {
            // SAFETY: the range lies inside this mapped region.
            unsafe { std::slice::from_raw_parts(self.addr.cast::<u8>().add(at), len) }.to_vec()
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            // SAFETY: the region was mapped by Region::anonymous and is not used after.
            let _ = unsafe { rustix::mm::munmap(self.addr, self.len) };
        }
    }

    fn page() -> usize {
        page_size() as usize
    }

    fn file_map(f: &File) -> MmapMut {
        // SAFETY: the file is private to the test.
        unsafe { MmapMut::map_mut(f) }.unwrap()
    }

    /// Writes `data` at `off` of `path` with O_DIRECT (both block aligned), bypassing the page cache.
    fn direct_write(path: &Path, off: u64, data: &[u8]) {
        let f = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .unwrap();
        let mut v = vec![0u8; data.len() + DIO_ALIGN as usize];
        let skip = v.as_ptr().align_offset(DIO_ALIGN as usize);
        v[skip..skip + data.len()].copy_from_slice(data);
        f.write_all_at(&v[skip..skip + data.len()], off).unwrap();
    }

    /// As `probe`, with every file's O_DIRECT fd dropped so that `hash` takes the fallback path.
    fn without_direct(mut m: Media) -> Media {
        for seg in &mut m.segments {
            if let Some(b) = &mut seg.backing {
                b.file = Arc::new(Opened {
                    path: b.file.path.clone(),
                    file: b.file.file.try_clone().unwrap(),
                    direct: None,
                    align: b.file.align,
                });
            }
        }
        m
    }

    #[test]
    fn media_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Media>();
    }

    #[test]
    fn hash_ids_lengths_and_vectors() {
        assert_eq!(Hash::from_id(0), None);
        assert_eq!(Hash::from_id(1), Some(Hash::Crc32c));
        assert_eq!(Hash::from_id(2), Some(Hash::Sha256));
        assert_eq!(Hash::from_id(3), None);
        for alg in [Hash::Crc32c, Hash::Sha256] {
            assert_eq!(Hash::from_id(alg.id()), Some(alg));
            assert_eq!(hash_bytes(alg, b"xyz").len(), alg.len());
        }
        assert_eq!(
            hash_bytes(Hash::Crc32c, b"123456789"),
            [0xe3, 0x06, 0x92, 0x83]
        );
        assert_eq!(hash_bytes(Hash::Crc32c, b""), [0, 0, 0, 0]);
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let hex: String = hash_bytes(Hash::Sha256, b"abc")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, abc);
        // Hashing in pieces gives the hash of the whole.
        let mut h = Hasher::new(Hash::Sha256);
        h.update(b"a");
        h.update(b"bc");
        assert_eq!(h.finish(), hash_bytes(Hash::Sha256, b"abc"));
    }

    #[test]
    fn reads_sync_flags_from_smaps_up_to_the_range_end() {
        let smaps = "\
1000-2000 rw-s 00000000 fd:01 7 /pmem/a
Size:                  4 kB
VmFlags: rd wr sh mr mw me ms sf
2000-3000 rw-s 00001000 fd:01 7 /pmem/a
AnonHugePages:         0 kB
VmFlags: rd wr sh mr mw me ms
3000-4000 rw-s 00000000 fd:01 8 /pmem/b
VmFlags: rd wr sh sf
9000-a000 rw-s 00000000 fd:01 9 /pmem/c
VmFlags: rd wr sh sf
";
        let sync = sync_flags(smaps.as_bytes(), &[0x1000, 0x2000, 0x3000, 0x9000], 0x4000).unwrap();
        assert_eq!(sync, [0x1000, 0x3000]);
    }

    #[test]
    fn empty_and_wrapping_ranges() {
        let m = Media::probe(0x1000, 0).unwrap();
        assert_eq!(m.kind(), MediaKind::Anonymous);
        assert_eq!(
            m.hash(Hash::Crc32c, 0x1000, 0).unwrap(),
            hash_bytes(Hash::Crc32c, b"")
        );
        let e = Media::probe(u64::MAX - 10, 100).err().unwrap();
        assert_eq!(e.errno(), libc::EINVAL);
        let e = e.to_string();
        assert!(e.contains("wraps"), "{e}");
    }

    #[test]
    fn heap_memory_is_anonymous() {
        let v = pattern(1 << 20, 3);
        let addr = v.as_ptr() as u64;
        let m = Media::probe(addr, v.len() as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::Anonymous);
        assert!(!m.durable());
        let why = m.why_not_durable().unwrap();
        assert!(why.contains("anonymous memory: not durable"), "{why}");
        assert!(m.backing_file().is_none());
        let e = m.flush_persistent(addr, 64).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        for alg in [Hash::Crc32c, Hash::Sha256] {
            assert_eq!(
                m.hash(alg, addr + 13, 10000).unwrap(),
                hash_bytes(alg, &v[13..10013])
            );
        }
        // Outside the probed range.
        let e = m.hash(Hash::Crc32c, addr + 1, v.len() as u64).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn shared_anonymous_memory_is_anonymous() {
        let r = Region::anonymous(4 * page(), MapFlags::SHARED);
        let m = Media::probe(r.base(), r.len as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::Anonymous);
        let why = m.why_not_durable().unwrap();
        assert!(why.contains("shared anonymous memory"), "{why}");
    }

    #[test]
    fn tmpfs_file_is_volatile() {
        let (tmp, f) = temp_file(Path::new("/dev/shm"), "shm", &pattern(3 * page(), 1));
        let map = file_map(&f);
        let addr = map.as_ptr() as u64;
        let m = Media::probe(addr, map.len() as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::VolatileFile);
        assert!(!m.durable());
        let why = m.why_not_durable().unwrap();
        assert!(
            why.contains(&format!(
                "backed by {} on tmpfs: not durable",
                tmp.0.display()
            )),
            "{why}"
        );
        assert!(m.flush_persistent(addr, 1).is_err());
        assert_eq!(
            m.hash(Hash::Sha256, addr + 13, 100).unwrap(),
            hash_bytes(Hash::Sha256, &map[13..113])
        );
    }

    #[test]
    fn private_file_mapping_is_anonymous() {
        let (_tmp, f) = temp_file(&std::env::temp_dir(), "private", &pattern(2 * page(), 2));
        // SAFETY: the file is private to the test.
        let map = unsafe { MmapOptions::new().map_copy(&f) }.unwrap();
        let m = Media::probe(map.as_ptr() as u64, map.len() as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::Anonymous);
        let why = m.why_not_durable().unwrap();
        assert!(why.contains("private mapping"), "{why}");
    }

    #[test]
    fn shared_file_mapping_is_durable_and_flushes() {
        let (tmp, f) = temp_file(&std::env::temp_dir(), "shared", &pattern(4 * page(), 4));
        // Map from the second page on, so the recorded file offset is not zero.
        // SAFETY: the file is private to the test.
        let mut map = unsafe {
            MmapOptions::new()
                .offset(page() as u64)
                .len(3 * page())
                .map_mut(&f)
        }
        .unwrap();
        let addr = map.as_ptr() as u64;
        let m = Media::probe(addr + 13, 10000).unwrap();
        assert_eq!(m.kind(), MediaKind::File);
        assert!(m.durable());
        assert!(m.why_not_durable().is_none());
        let (path, off) = m.backing_file().unwrap();
        assert_eq!(path, tmp.0.to_str().unwrap());
        assert_eq!(off, page() as u64 + 13);

        map[100..110].copy_from_slice(b"persistent");
        m.flush_persistent(addr + 100, 10).unwrap();
        let disk = std::fs::read(&tmp.0).unwrap();
        assert_eq!(&disk[page() + 100..page() + 110], b"persistent");
        // Zero bytes, and the whole range.
        m.flush_persistent(addr + 13, 0).unwrap();
        m.flush_persistent(addr + 13, 10000).unwrap();
    }

    #[test]
    fn opens_by_path_only_the_mapped_inode() {
        let (tmp, f) = temp_file(&std::env::temp_dir(), "bypath", &pattern(page(), 13));
        let map = file_map(&f);
        let addr = map.as_ptr() as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let (mut vma, _, _) = cover(maps.lines().filter_map(parse_vma), addr, addr + 1)
            .unwrap()
            .remove(0);
        assert_eq!(vma.path, tmp.0.to_str().unwrap());
        let opened = open_by_path(&vma).unwrap();
        assert_eq!(statx(&opened).unwrap().stx_ino, vma.inode);
        vma.inode += 1;
        let e = open_by_path(&vma).unwrap_err();
        assert!(e.to_string().contains("another file"), "{e}");

        // No MAP_SYNC on an ordinary mapping, as the process's own smaps shows.
        let smaps = BufReader::new(File::open("/proc/self/smaps").unwrap());
        assert!(sync_flags(smaps, &[vma.start], vma.end).unwrap().is_empty());
    }

    #[test]
    fn hash_of_a_file_at_unaligned_offsets() {
        let (_tmp, f) = temp_file(&std::env::temp_dir(), "unaligned", &pattern(5 * page(), 5));
        let map = file_map(&f);
        let addr = map.as_ptr() as u64;
        let m = Media::probe(addr, map.len() as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::File);
        let fallback = without_direct(Media::probe(addr, map.len() as u64).unwrap());
        for alg in [Hash::Crc32c, Hash::Sha256] {
            for (off, len) in [
                (13, 10000),
                (13, 0),
                (0, map.len()),
                (4095, 2),
                (8192, 4096),
            ] {
                let want = hash_bytes(alg, &map[off..off + len]);
                let (a, l) = (addr + off as u64, len as u64);
                assert_eq!(m.hash(alg, a, l).unwrap(), want, "{alg:?} {off}+{len}");
                assert_eq!(
                    fallback.hash(alg, a, l).unwrap(),
                    want,
                    "{alg:?} {off}+{len}"
                );
            }
        }
    }

    #[test]
    fn bytes_past_end_of_file_hash_as_zero() {
        let data = pattern(10000, 6);
        let (_tmp, f) = temp_file(&std::env::temp_dir(), "eof", &data);
        let map = file_map(&f);
        let addr = map.as_ptr() as u64;
        // The mapping's last page runs past end-of-file.
        let cover = 10000u64.div_ceil(page() as u64) * page() as u64;
        let m = Media::probe(addr, cover).unwrap();
        let mut want = data[9990..].to_vec();
        want.resize(want.len() + (cover - 10000) as usize, 0);
        for m in [&m, &without_direct(Media::probe(addr, cover).unwrap())] {
            assert_eq!(
                m.hash(Hash::Sha256, addr + 9990, cover - 9990).unwrap(),
                hash_bytes(Hash::Sha256, &want)
            );
        }
    }

    #[test]
    fn hash_reads_the_medium() {
        let old = pattern(4 * page(), 7);
        let (tmp, f) = temp_file(&std::env::temp_dir(), "medium", &old);
        let mut map = file_map(&f);
        let addr = map.as_ptr() as u64;
        let m = Media::probe(addr, map.len() as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::File);
        let backing = m.segments[0].backing.as_ref().unwrap();
        assert!(
            backing.file.direct.is_some(),
            "no O_DIRECT on {}",
            tmp.0.display()
        );
        let (a, len) = (addr + 13, 10000u64);
        let range = 13..10013;

        let new = pattern(old.len(), 8);
        map.copy_from_slice(&new);
        // The kernel may write dirty pages back at any time (and an O_DIRECT read
        // writes back the range it reads first), so before the flush the medium
        // holds the old bytes or the new ones.
        let before = m.hash(Hash::Sha256, a, len).unwrap();
        assert!(
            before == hash_bytes(Hash::Sha256, &old[range.clone()])
                || before == hash_bytes(Hash::Sha256, &new[range.clone()])
        );
        m.flush_persistent(addr, map.len() as u64).unwrap();
        assert_eq!(
            m.hash(Hash::Sha256, a, len).unwrap(),
            hash_bytes(Hash::Sha256, &new[range.clone()])
        );

        // Flip a byte on disk behind the page cache: hash sees it, whatever the
        // mapping shows (the kernel usually drops the cached page, so it may show it too).
        let mut block = new[..DIO_ALIGN as usize].to_vec();
        block[100] ^= 0xff;
        direct_write(&tmp.0, 0, &block);
        let mut disk = new.clone();
        disk[100] ^= 0xff;
        for alg in [Hash::Crc32c, Hash::Sha256] {
            assert_eq!(
                m.hash(alg, a, len).unwrap(),
                hash_bytes(alg, &disk[range.clone()])
            );
        }
    }

    #[test]
    fn file_segments_hash_the_file_not_the_memory() {
        let data = pattern(3 * page(), 14);
        let (_tmp, f) = temp_file(&std::env::temp_dir(), "notmem", &data);
        let map = file_map(&f);
        // The same file behind memory that holds something else.
        let other = vec![0xa5u8; data.len()];
        let addr = other.as_ptr() as u64;
        for direct in [true, false] {
            let m = if direct {
                Media::probe(map.as_ptr() as u64, map.len() as u64).unwrap()
            } else {
                without_direct(Media::probe(map.as_ptr() as u64, map.len() as u64).unwrap())
            };
            let m = Media {
                start: addr,
                end: addr + other.len() as u64,
                segments: m
                    .segments
                    .into_iter()
                    .map(|s| Segment {
                        start: addr,
                        end: addr + other.len() as u64,
                        ..s
                    })
                    .collect(),
                ..m
            };
            assert_eq!(m.segments.len(), 1);
            for alg in [Hash::Crc32c, Hash::Sha256] {
                let h = m.hash(alg, addr + 13, 5000).unwrap();
                assert_eq!(h, hash_bytes(alg, &data[13..5013]), "direct {direct}");
                assert_ne!(h, hash_bytes(alg, &other[13..5013]));
            }
        }
    }

    #[test]
    fn range_over_two_files_takes_the_weakest_kind() {
        let p = page();
        let a = pattern(2 * p, 9);
        let b = pattern(2 * p, 10);
        let (_ta, fa) = temp_file(&std::env::temp_dir(), "a", &a);
        let (_tb, fb) = temp_file(&std::env::temp_dir(), "b", &b);
        let (_tc, fc) = temp_file(Path::new("/dev/shm"), "shm2", &a);
        let r = Region::anonymous(8 * p, MapFlags::PRIVATE);
        r.place(0, 2 * p, &fa, 0);
        r.place(2 * p, 2 * p, &fb, 0);
        r.place(4 * p, 2 * p, &fc, 0);
        // Pages 6 and 7 stay anonymous.

        let m = Media::probe(r.base() + 100, 4 * p as u64 - 200).unwrap();
        assert_eq!(m.kind(), MediaKind::File);
        assert_eq!(m.segments.len(), 2);
        let want = [&a[100..], &b[..2 * p - 100]].concat();
        for alg in [Hash::Crc32c, Hash::Sha256] {
            assert_eq!(
                m.hash(alg, r.base() + 100, want.len() as u64).unwrap(),
                hash_bytes(alg, &want)
            );
        }
        m.flush_persistent(r.base() + 100, want.len() as u64)
            .unwrap();

        let m = Media::probe(r.base(), 6 * p as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::VolatileFile);
        assert!(m.why_not_durable().unwrap().contains("tmpfs"));

        let m = Media::probe(r.base() + p as u64, 7 * p as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::Anonymous);
        let why = m.why_not_durable().unwrap();
        let anon = format!(
            "{:#x}-{:#x} is anonymous memory",
            r.base() + 6 * p as u64,
            r.base() + 8 * p as u64
        );
        assert!(why.contains(&anon), "{why}");
        assert_eq!(
            m.hash(Hash::Crc32c, r.base(), 8 * p as u64)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn same_file_out_of_order_is_two_segments() {
        let p = page();
        let data = pattern(2 * p, 11);
        let (_t, f) = temp_file(&std::env::temp_dir(), "order", &data);
        let r = Region::anonymous(2 * p, MapFlags::PRIVATE);
        // The file's second page first, then its first page.
        r.place(0, p, &f, p as u64);
        r.place(p, p, &f, 0);
        let m = Media::probe(r.base(), 2 * p as u64).unwrap();
        assert_eq!(m.kind(), MediaKind::File);
        assert_eq!(m.segments.len(), 2);
        assert_eq!(m.backing_file().unwrap().1, p as u64);
        let want = [&data[p + 7..], &data[..p - 7]].concat();
        assert_eq!(r.bytes(7, want.len()), want);
        assert_eq!(
            m.hash(Hash::Sha256, r.base() + 7, want.len() as u64)
                .unwrap(),
            hash_bytes(Hash::Sha256, &want)
        );

        // In order: the kernel may merge the two mappings or not; either way one segment.
        r.place(0, p, &f, 0);
        r.place(p, p, &f, p as u64);
        let m = Media::probe(r.base(), 2 * p as u64).unwrap();
        assert_eq!(m.segments.len(), 1);
        assert_eq!(
            m.hash(Hash::Sha256, r.base() + 7, 2 * p as u64 - 14)
                .unwrap(),
            hash_bytes(Hash::Sha256, &data[7..2 * p - 7])
        );
    }

    #[test]
    fn holes_are_errors() {
        let p = page();
        let r = Region::anonymous(3 * p, MapFlags::PRIVATE);
        // SAFETY: the middle page belongs to this region and nothing refers to it.
        unsafe { rustix::mm::munmap(r.addr.cast::<u8>().add(p).cast(), p) }.unwrap();
        let e = Media::probe(r.base(), 3 * p as u64)
            .err()
            .unwrap()
            .to_string();
        let hole = format!("{:#x}-{:#x}", r.base() + p as u64, r.base() + 2 * p as u64);
        assert!(e.contains(&hole) && e.contains("not mapped"), "{e}");
    }

    #[test]
    fn dax_segments_write_back_and_evict_cache_lines() {
        // No persistent memory here: drive the Dax paths over ordinary memory.
        let v = pattern(10000, 12);
        let addr = v.as_ptr() as u64;
        let m = Media {
            kind: MediaKind::Dax,
            start: addr,
            end: addr + v.len() as u64,
            why_not: None,
            segments: vec![Segment {
                start: addr,
                end: addr + v.len() as u64,
                kind: MediaKind::Dax,
                backing: None,
            }],
            page: page_size(),
            cache: cpu::CacheOps::detect(),
        };
        assert!(m.durable());
        #[cfg(target_arch = "x86_64")]
        {
            assert!(m.cache.line >= 32 && m.cache.line.is_power_of_two());
            m.flush_persistent(addr + 13, 1000).unwrap();
            m.flush_persistent(addr, v.len() as u64).unwrap();
        }
        for alg in [Hash::Crc32c, Hash::Sha256] {
            assert_eq!(
                m.hash(alg, addr + 13, 5000).unwrap(),
                hash_bytes(alg, &v[13..5013])
            );
        }
    }

    #[test]
    fn flush_global_returns() {
        flush_global();
    }
}
