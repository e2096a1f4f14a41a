//! Checks against the C header itself, so the two cannot drift apart.

use super::*;
use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};

const HEADER: &str = include_str!("../include/infiniband/xiwdv.h");

/// Every constant the Rust side mirrors, by its C name.
fn rust_constants() -> BTreeMap<&'static str, u64> {
    BTreeMap::from([
        ("IBV_ACCESS_FLUSH_GLOBAL", IBV_ACCESS_FLUSH_GLOBAL as u64),
        (
            "IBV_ACCESS_FLUSH_PERSISTENT",
            IBV_ACCESS_FLUSH_PERSISTENT as u64,
        ),
        (
            "XIWDV_ACCESS_FLUSH_GLOBAL",
            XIWDV_ACCESS_FLUSH_GLOBAL as u64,
        ),
        (
            "XIWDV_ACCESS_FLUSH_PERSISTENT",
            XIWDV_ACCESS_FLUSH_PERSISTENT as u64,
        ),
        ("XIWDV_HASH_NONE", HashAlg::None as u64),
        ("XIWDV_HASH_CRC32C", HashAlg::Crc32c as u64),
        ("XIWDV_HASH_SHA256", HashAlg::Sha256 as u64),
        ("XIWDV_MAX_HASH_LEN", XIWDV_MAX_HASH_LEN as u64),
        ("XIWDV_MR_ATTR_VERIFY_HASH", XIWDV_MR_ATTR_VERIFY_HASH),
        ("XIWDV_CAP_ATOMICS", XIWDV_CAP_ATOMICS),
        ("XIWDV_CAP_IMMEDIATE", XIWDV_CAP_IMMEDIATE),
        ("XIWDV_CAP_FLUSH_GLOBAL", XIWDV_CAP_FLUSH_GLOBAL),
        ("XIWDV_CAP_FLUSH_PERSISTENT", XIWDV_CAP_FLUSH_PERSISTENT),
        ("XIWDV_CAP_VERIFY", XIWDV_CAP_VERIFY),
        ("XIWDV_CAP_ATOMIC_WRITE", XIWDV_CAP_ATOMIC_WRITE),
        ("XIWDV_QP_EX_WITH_FLUSH", XIWDV_QP_EX_WITH_FLUSH),
        ("XIWDV_QP_EX_WITH_VERIFY", XIWDV_QP_EX_WITH_VERIFY),
        (
            "XIWDV_QP_EX_WITH_MASKED_ATOMICS",
            XIWDV_QP_EX_WITH_MASKED_ATOMICS,
        ),
        ("XIWDV_FLUSH_GLOBAL", Placement::Global as u64),
        ("XIWDV_FLUSH_PERSISTENT", Placement::Persistent as u64),
        ("XIWDV_FLUSH_RANGE", Selectivity::Range as u64),
        ("XIWDV_FLUSH_MR", Selectivity::Mr as u64),
        ("XIWDV_WC_FLUSH", XIWDV_WC_FLUSH as u64),
        ("XIWDV_WC_VERIFY", XIWDV_WC_VERIFY as u64),
    ])
}

/// Removes `/* ... */` and `// ...` comments.
fn strip_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = match rest[i..].find("*/") {
            Some(j) => &rest[i + j + 2..],
            None => "",
        };
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Evaluates the constant expressions the header uses: integers (with U/L
/// suffixes), names, parentheses, `<<` and `|`.
struct Eval<'a> {
    toks: Vec<String>,
    pos: usize,
    names: &'a BTreeMap<String, u64>,
}

impl Eval<'_> {
    fn tokens(s: &str) -> Vec<String> {
        let mut v = Vec::new();
        let b: Vec<char> = s.chars().collect();
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c.is_whitespace() {
                i += 1;
            } else if c.is_ascii_alphanumeric() || c == '_' {
                let st = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
                v.push(b[st..i].iter().collect());
            } else if c == '<' && b.get(i + 1) == Some(&'<') {
                v.push("<<".into());
                i += 2;
            } else {
                v.push(c.to_string());
                i += 1;
            }
        }
        v
    }

    fn eval(s: &str, names: &BTreeMap<String, u64>) -> Result<u64, String> {
        let mut e = Eval {
            toks: Self::tokens(s),
            pos: 0,
            names,
        };
        let v = e.or()?;
        if e.pos != e.toks.len() {
            return Err(format!("trailing tokens in `{s}`"));
        }
        Ok(v)
    }

    fn or(&mut self) -> Result<u64, String> {
        let mut v = self.shift()?;
        while self.toks.get(self.pos).map(String::as_str) == Some("|") {
            self.pos += 1;
            v |= self.shift()?;
        }
        Ok(v)
    }

    fn shift(&mut self) -> Result<u64, String> {
        let mut v = self.atom()?;
        while self.toks.get(self.pos).map(String::as_str) == Some("<<") {
            self.pos += 1;
            v <<= self.atom()?;
        }
        Ok(v)
    }

    fn atom(&mut self) -> Result<u64, String> {
        let t = self.toks.get(self.pos).cloned().ok_or("unexpected end")?;
        self.pos += 1;
        if t == "(" {
            let v = self.or()?;
            if self.toks.get(self.pos).map(String::as_str) != Some(")") {
                return Err("missing )".into());
            }
            self.pos += 1;
            return Ok(v);
        }
        if t.starts_with(|c: char| c.is_ascii_digit()) {
            let digits = t.trim_end_matches(['U', 'L', 'u', 'l']);
            return match digits.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => digits.parse(),
            }
            .map_err(|e| format!("bad number {t}: {e}"));
        }
        self.names
            .get(&t)
            .copied()
            .ok_or_else(|| format!("unknown name {t}"))
    }
}

/// Every `#define NAME VALUE` and every enumerator of the header, evaluated.
fn header_constants() -> BTreeMap<String, u64> {
    let text = strip_comments(HEADER);
    // Names verbs.h defines that the header refers to.
    let mut names: BTreeMap<String, u64> = BTreeMap::from([(
        "IBV_WC_DRIVER1".to_string(),
        xiw_abi::verbs::IBV_WC_DRIVER1 as u64,
    )]);
    let mut found = BTreeMap::new();
    let mut in_enum = false;
    let mut next_enum_value = 0u64;
    for line in text.lines().map(str::trim) {
        if let Some(def) = line.strip_prefix("#define ") {
            let mut it = def.splitn(2, char::is_whitespace);
            let name = it.next().unwrap_or("").to_string();
            let Some(expr) = it.next().map(str::trim).filter(|e| !e.is_empty()) else {
                continue; // the include guard
            };
            let v = Eval::eval(expr, &names).unwrap_or_else(|e| panic!("#define {name}: {e}"));
            names.insert(name.clone(), v);
            found.insert(name, v);
        } else if line.starts_with("enum ") && line.ends_with('{') {
            in_enum = true;
            next_enum_value = 0;
        } else if in_enum && line.starts_with('}') {
            in_enum = false;
        } else if in_enum && !line.is_empty() {
            let item = line.trim_end_matches(',');
            let (name, v) = match item.split_once('=') {
                Some((n, e)) => {
                    let v = Eval::eval(e.trim(), &names)
                        .unwrap_or_else(|err| panic!("enumerator {n}: {err}"));
                    (n.trim().to_string(), v)
                }
                None => (item.trim().to_string(), next_enum_value),
            };
            next_enum_value = v + 1;
            names.insert(name.clone(), v);
            found.insert(name, v);
        }
    }
    found
}

#[test]
fn constants_equal_the_header() {
    let header = header_constants();
    let rust = rust_constants();
    assert!(
        header.len() >= 20,
        "the header parser found too little: {header:?}"
    );
    for (name, v) in &header {
        match rust.get(name.as_str()) {
            Some(r) => assert_eq!(*r, *v, "{name}: Rust {r:#x}, header {v:#x}"),
            None => panic!("{name} (= {v:#x}) of xiwdv.h has no Rust counterpart"),
        }
    }
    for name in rust.keys() {
        assert!(header.contains_key(*name), "{name} is not in xiwdv.h");
    }
}

#[test]
fn the_evaluator_handles_the_header_forms() {
    let names = BTreeMap::from([("A".to_string(), 8u64)]);
    assert_eq!(Eval::eval("(1ULL << 33)", &names), Ok(1 << 33));
    assert_eq!(Eval::eval("1 << 0", &names), Ok(1));
    assert_eq!(Eval::eval("A", &names), Ok(8));
    assert_eq!(Eval::eval("(A | 0x10)", &names), Ok(0x18));
    assert!(Eval::eval("B", &names).is_err());
}

/// The fields of `struct NAME { ... };` in the header, as (type, name).
fn header_struct(name: &str) -> Vec<(String, String)> {
    let text = strip_comments(HEADER);
    let start = text
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("struct {name} not in the header"));
    let body = &text[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
    body.split(';')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (ty, name) = f.rsplit_once(char::is_whitespace).expect("type and name");
            (ty.trim().to_string(), name.trim().to_string())
        })
        .collect()
}

/// Offsets and size of a C struct made of fixed-width integers and arrays of them.
fn c_layout(fields: &[(String, String)]) -> (Vec<(String, usize)>, usize) {
    let mut off = 0usize;
    let mut align = 1usize;
    let mut out = Vec::new();
    for (ty, name) in fields {
        let size = match ty.as_str() {
            "uint64_t" => 8,
            "uint32_t" => 4,
            "uint16_t" => 2,
            "uint8_t" => 1,
            t => panic!("unexpected field type {t}"),
        };
        let (base, count) = match name.split_once('[') {
            Some((b, n)) => (
                b.to_string(),
                n.trim_end_matches(']').parse::<usize>().unwrap(),
            ),
            None => (name.clone(), 1),
        };
        off = off.next_multiple_of(size);
        align = align.max(size);
        out.push((base, off));
        off += size * count;
    }
    (out, off.next_multiple_of(align))
}

#[test]
fn mr_attr_has_the_c_layout() {
    let (fields, size) = c_layout(&header_struct("xiwdv_mr_attr"));
    assert_eq!(size_of::<MrAttr>(), size);
    assert_eq!(align_of::<MrAttr>(), 8);
    let rust = [
        ("comp_mask", offset_of!(MrAttr, comp_mask)),
        ("verify_hash", offset_of!(MrAttr, verify_hash)),
        ("reserved", offset_of!(MrAttr, reserved)),
    ];
    let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(rust, fields);
}

#[test]
fn device_attr_has_the_c_layout() {
    let (fields, size) = c_layout(&header_struct("xiwdv_device_attr"));
    assert_eq!(size_of::<DeviceAttr>(), size);
    let rust = [
        ("caps", offset_of!(DeviceAttr, caps)),
        ("hashes", offset_of!(DeviceAttr, hashes)),
        ("max_hash_len", offset_of!(DeviceAttr, max_hash_len)),
        ("reserved", offset_of!(DeviceAttr, reserved)),
    ];
    let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(rust, fields);
}

#[test]
fn hash_lengths_and_helpers() {
    assert_eq!(HashAlg::Crc32c.len(), 4);
    assert_eq!(HashAlg::Sha256.len(), XIWDV_MAX_HASH_LEN);
    assert!(HashAlg::None.is_empty());
    for h in [HashAlg::None, HashAlg::Crc32c, HashAlg::Sha256] {
        assert_eq!(HashAlg::from_u32(h as u32), Some(h));
    }
    assert_eq!(HashAlg::from_u32(3), None);
    let a = MrAttr::verifiable(HashAlg::Sha256);
    assert_eq!((a.comp_mask, a.verify_hash), (XIWDV_MR_ATTR_VERIFY_HASH, 2));
    let d = DeviceAttr {
        caps: XIWDV_CAP_ATOMICS | XIWDV_CAP_VERIFY,
        hashes: 1 << XIWDV_HASH_CRC32C,
        ..Default::default()
    };
    assert!(d.has(XIWDV_CAP_ATOMICS | XIWDV_CAP_VERIFY));
    assert!(!d.has(XIWDV_CAP_ATOMIC_WRITE));
    assert!(d.supports_hash(HashAlg::Crc32c));
    assert!(!d.supports_hash(HashAlg::Sha256));
}

/// The lookup either finds the installed provider or explains why not; it
/// never crashes, and the errors name what is missing.
#[test]
fn loading_reports_instead_of_crashing() {
    match library_path() {
        Ok(p) => assert!(p.contains(LIBRARY), "{p}"),
        Err(Error::Unavailable(why)) => assert!(why.contains(LIBRARY), "{why}"),
        Err(e) => panic!("unexpected {e:?}"),
    }
    // last_error never fails, with or without the library.
    let _ = last_error();
    let e = Error::Failed {
        errno: libc::EINVAL,
        reason: "anonymous memory cannot be made persistent".into(),
    };
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.to_string().contains("anonymous memory"));
    assert_eq!(Error::NotXiw.errno(), libc::EOPNOTSUPP);
}
