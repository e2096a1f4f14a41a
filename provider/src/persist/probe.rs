//! Finding what backs a range of this process's memory, from
//! /proc/self/maps and /proc/self/smaps.

use super::*;

/// A mapped file as maps names it: device major, minor and inode.
pub(super) type FileId = (u32, u32, u64);

/// One mapping's part of the probed range, classified.
pub(super) struct Piece {
    pub(super) vma_start: u64,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) kind: MediaKind,
    /// A shared mapping of a file that may be in DAX mode: smaps tells whether it is `MAP_SYNC`.
    pub(super) maybe_dax: bool,
    pub(super) why_not: Option<String>,
    pub(super) backing: Option<Backing>,
}

/// The mappings covering `[addr, end)`, each with its part of it; an error names the first hole.
pub(super) fn cover(
    vmas: impl Iterator<Item = Vma>,
    addr: u64,
    end: u64,
) -> Result<Vec<(Vma, u64, u64)>, Error> {
    let mut out = Vec::new();
    let mut at = addr;
    for vma in vmas {
        if vma.end <= at {
            continue;
        }
        if vma.start > at {
            let hole = vma.start.min(end);
            return Err(Error::Media(format!(
                "{at:#x}-{hole:#x} (in {addr:#x}-{end:#x}) is not mapped"
            )));
        }
        let stop = vma.end.min(end);
        out.push((vma, at, stop));
        at = stop;
        if at == end {
            return Ok(out);
        }
    }
    Err(Error::Media(format!(
        "{at:#x}-{end:#x} (in {addr:#x}-{end:#x}) is not mapped"
    )))
}

/// Shared anonymous memory shows in maps as a deleted file of the kernel's internal shmem mount.
pub(super) fn shared_anonymous(path: &str) -> bool {
    path == "/dev/zero (deleted)" || path == "/anon_hugepage (deleted)" || path.starts_with("/SYSV")
}

pub(super) fn classify(
    vma: &Vma,
    start: u64,
    end: u64,
    files: &mut Vec<(FileId, Arc<Opened>)>,
) -> Result<Piece, Error> {
    let r = format!("{start:#x}-{end:#x}");
    let mut piece = Piece {
        vma_start: vma.start,
        start,
        end,
        kind: MediaKind::Anonymous,
        maybe_dax: false,
        why_not: None,
        backing: None,
    };
    let path = vma.path.as_str();
    if vma.inode == 0 || path.is_empty() || path.starts_with('[') {
        piece.why_not = Some(format!("{r} is anonymous memory: not durable"));
        return Ok(piece);
    }
    if !vma.shared {
        piece.why_not = Some(format!(
            "{r} is a private mapping of {path}, whose writes never reach the file: not durable"
        ));
        return Ok(piece);
    }
    if shared_anonymous(path) {
        piece.why_not = Some(format!("{r} is shared anonymous memory: not durable"));
        return Ok(piece);
    }

    let key = (vma.dev.0, vma.dev.1, vma.inode);
    let opened = match files.iter().find(|(k, _)| *k == key) {
        Some((_, o)) => Some(Arc::clone(o)),
        None => match open_mapped(vma) {
            Ok(o) => {
                let o = Arc::new(o);
                files.push((key, Arc::clone(&o)));
                Some(o)
            }
            // A memfd lives on tmpfs or hugetlbfs: RAM whatever its flags.
            Err(_) if path.starts_with("/memfd:") => None,
            Err(e) => {
                return Err(Error::Media(format!(
                    "{r} is backed by {path}, which cannot be opened: {e}"
                )))
            }
        },
    };
    let Some(opened) = opened else {
        piece.kind = MediaKind::VolatileFile;
        piece.why_not = Some(format!("{r} is backed by {path} in RAM: not durable"));
        return Ok(piece);
    };
    let shown = opened.path.clone();
    let st =
        statx(&opened.file).map_err(|e| Error::Media(format!("{r}: statx on {shown}: {e}")))?;
    let fs =
        fs_type(&opened.file).map_err(|e| Error::Media(format!("{r}: fstatfs on {shown}: {e}")))?;
    piece.backing = Some(Backing {
        file: opened,
        offset: vma.offset + (start - vma.start),
    });
    let mode = u32::from(st.stx_mode) & libc::S_IFMT;
    if mode == libc::S_IFCHR {
        if device_dax(st.stx_rdev_major, st.stx_rdev_minor) {
            piece.kind = MediaKind::Dax;
        } else {
            piece.why_not = Some(format!("{r} is a mapping of device {shown}: not durable"));
        }
        return Ok(piece);
    }
    if mode != libc::S_IFREG && mode != libc::S_IFBLK {
        piece.why_not = Some(format!(
            "{r} is a mapping of {shown}, not a file: not durable"
        ));
        return Ok(piece);
    }
    let ram = match fs {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        HUGETLBFS_MAGIC => Some("hugetlbfs"),
        _ => None,
    };
    if let Some(fs) = ram {
        piece.kind = MediaKind::VolatileFile;
        piece.why_not = Some(format!("{r} is backed by {shown} on {fs}: not durable"));
        return Ok(piece);
    }
    piece.kind = MediaKind::File;
    // MAP_SYNC needs a file in DAX mode; statx says which files are (Linux 5.8+).
    let dax_known = u64::from(libc::STATX_ATTR_DAX as u32);
    piece.maybe_dax = st.stx_attributes_mask & dax_known == 0 || st.stx_attributes & dax_known != 0;
    Ok(piece)
}

/// Opens the file behind a shared mapping: through /proc/self/map_files (which
/// needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE, and works for deleted files),
/// else by its path, which must still name the mapped inode.
pub(super) fn open_mapped(vma: &Vma) -> io::Result<Opened> {
    let via_proc = format!("/proc/self/map_files/{:x}-{:x}", vma.start, vma.end);
    let file = match File::open(&via_proc) {
        Ok(f) => f,
        Err(_) if vma.path.ends_with(" (deleted)") => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "deleted, and /proc/self/map_files needs CAP_SYS_ADMIN",
            ))
        }
        Err(_) => open_by_path(vma)?,
    };
    let st = statx(&file)?;
    let mut align = DIO_ALIGN;
    if st.stx_mask & libc::STATX_DIOALIGN != 0 {
        align = align
            .max(u64::from(st.stx_dio_offset_align))
            .max(u64::from(st.stx_dio_mem_align));
    }
    // Reopening the fd itself gets the same file whatever its path does meanwhile.
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok();
    Ok(Opened {
        path: vma.path.clone(),
        file,
        direct,
        align,
    })
}

/// Opens a mapped file by its path, which must still name the mapped inode.
pub(super) fn open_by_path(vma: &Vma) -> io::Result<File> {
    let f = File::open(&vma.path)?;
    let st = statx(&f)?;
    let same_dev = (st.stx_dev_major, st.stx_dev_minor) == vma.dev
        // btrfs reports a subvolume's own device to stat, not the one maps shows.
        || fs_type(&f)? == BTRFS_MAGIC;
    if st.stx_ino != vma.inode || !same_dev {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the path now names another file",
        ));
    }
    Ok(f)
}

pub(super) fn statx(f: &File) -> io::Result<libc::statx> {
    sys::statx(f.as_fd(), libc::STATX_BASIC_STATS | libc::STATX_DIOALIGN)
}

pub(super) fn fs_type(f: &File) -> io::Result<u32> {
    sys::fs_type(f.as_fd())
}

/// A character device of the dax subsystem (/dev/daxX.Y) maps persistent memory with no page cache.
pub(super) fn device_dax(major: u32, minor: u32) -> bool {
    std::fs::read_link(format!("/sys/dev/char/{major}:{minor}/subsystem"))
        .map(|p| p.file_name().is_some_and(|n| n == "dax"))
        .unwrap_or(false)
}

/// Which of the mappings starting at `starts` have VmFlags `sf` (`MAP_SYNC`).
/// Stops at the first mapping at or past `end`: smaps walks the page tables
/// of every mapping it prints, which is slow in a big process.
pub(super) fn sync_flags(smaps: impl BufRead, starts: &[u64], end: u64) -> io::Result<Vec<u64>> {
    let mut sync = Vec::new();
    let mut current = None;
    for line in smaps.lines() {
        let line = line?;
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(start) = current.take() {
                if flags.split_whitespace().any(|f| f == "sf") {
                    sync.push(start);
                }
            }
            continue;
        }
        let Some((start, _)) = line.split(' ').next().and_then(parse_range) else {
            continue;
        };
        if start >= end {
            break;
        }
        current = starts.contains(&start).then_some(start);
    }
    Ok(sync)
}

pub(super) fn page_size() -> u64 {
    sys::page_size()
}
