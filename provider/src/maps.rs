//! The one reader of /proc/self/maps: which mappings cover a range of this
//! process's memory, with what permissions, backed by what.

use std::io;

/// A line of /proc/self/maps.
#[derive(Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub shared: bool,
    pub offset: u64,
    pub dev: (u32, u32),
    pub inode: u64,
    pub path: String,
}

/// Parses `start-end perms offset major:minor inode [path]`.
pub fn parse(line: &str) -> Option<Vma> {
    let mut f = line.splitn(6, ' ');
    let (start, end) = parse_range(f.next()?)?;
    let perms = f.next()?;
    let offset = u64::from_str_radix(f.next()?, 16).ok()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let dev = (
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    let inode = f.next()?.parse().ok()?;
    let path = f.next().unwrap_or("").trim_start().to_string();
    Some(Vma {
        start,
        end,
        readable: perms.as_bytes().first() == Some(&b'r'),
        writable: perms.as_bytes().get(1) == Some(&b'w'),
        shared: perms.as_bytes().get(3) == Some(&b's'),
        offset,
        dev,
        inode,
        path,
    })
}

pub fn parse_range(s: &str) -> Option<(u64, u64)> {
    let (a, b) = s.split_once('-')?;
    Some((
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ))
}

/// This process's mappings, in address order.
pub fn read() -> io::Result<Vec<Vma>> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    let mut v: Vec<Vma> = text.lines().filter_map(parse).collect();
    v.sort_unstable_by_key(|m| m.start);
    Ok(v)
}

/// Whether `[addr, addr+len)` is mapped without a hole, readable and (if
/// `writable`) writable throughout.
pub fn covered(maps: &[Vma], addr: u64, len: u64, writable: bool) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut need = addr;
    for m in maps {
        if m.end <= need || m.start > need {
            continue;
        }
        if !m.readable || (writable && !m.writable) {
            return false;
        }
        need = m.end;
        if need >= end {
            return true;
        }
    }
    need >= end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let v = parse(
            "7f12a000-7f12c000 rw-s 00003000 fd:01 1234                       /data/my file (deleted)",
        )
        .unwrap();
        assert_eq!(
            v,
            Vma {
                start: 0x7f12a000,
                end: 0x7f12c000,
                readable: true,
                writable: true,
                shared: true,
                offset: 0x3000,
                dev: (0xfd, 1),
                inode: 1234,
                path: "/data/my file (deleted)".into(),
            }
        );
        let v = parse("55d0c000-55d2d000 rw-p 00000000 00:00 0                          [heap]")
            .unwrap();
        assert!(!v.shared);
        assert_eq!(v.path, "[heap]");
        let v = parse("7ffe1000-7ffe2000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((v.inode, v.path.as_str()), (0, ""));
        assert!(parse("Size:                  4 kB").is_none());
    }

    #[test]
    fn covered_needs_every_byte_and_the_rights() {
        let maps: Vec<Vma> = [
            "1000-3000 r--p 00000000 00:00 0",
            "3000-4000 rw-p 00000000 00:00 0",
            "5000-6000 rw-p 00000000 00:00 0",
        ]
        .iter()
        .filter_map(|l| parse(l))
        .collect();
        assert!(covered(&maps, 0x1000, 0x3000, false));
        assert!(!covered(&maps, 0x1000, 0x3000, true));
        assert!(covered(&maps, 0x3000, 0x1000, true));
        assert!(!covered(&maps, 0x3800, 0x2000, false), "a hole at 0x4000");
        assert!(!covered(&maps, 0x800, 0x1000, false));
        assert!(!covered(&maps, u64::MAX, 2, false));
    }
}
