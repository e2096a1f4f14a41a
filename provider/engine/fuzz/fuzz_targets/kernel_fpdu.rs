//! The kernel module's FPDU parser (kernel-shim/xiw_fpdu.c, built for user
//! space by build.rs) against the receive engine. A stream of tagged RDMA
//! Writes with fuzz-chosen fields (STag, TO, lengths, control bytes, reserved
//! bits, pad, CRC right or wrong) and raw bytes, and 1 to 3 regions, is
//! walked as the module will walk it: at each FPDU boundary `xiw_fpdu_head`,
//! and while it says PLACE, the whole FPDU is there, its CRC (if negotiated)
//! is right and `xiw_fpdu_check` accepts the region the STag's index names,
//! the payload is copied into a copy of the arena; the first FPDU that is not
//! placed ends the walk (it and the rest are left for user space). The engine
//! then gets the same prefix, in arbitrary pieces, with the same regions: it
//! must take all of it without a failure and leave the arena exactly as the
//! C side did, so the module never places what the engine would refuse or
//! place elsewhere. A Read may be outstanding (its sink one SGE or two, in
//! or out of a region): if the engine lends its Read Responses
//! (`Receiver::lend_read`), the walk places those `xiw_fpdu_check_read`
//! accepts too, and what it leaves of the Read is what the engine has left
//! of it after the same bytes (none and the Read answered, after the last
//! segment). Also: the C CRC32c agrees with the engine's on arbitrary
//! bytes, and `xiw_fpdu_head` reads nothing past the 16 bytes it is given.
#![no_main]

use std::ffi::c_void;

use libfuzzer_sys::fuzz_target;
use xiw_engine::queue1::{access, Outstanding, PendingRead};
use xiw_engine::recv::{Params, Receiver};
use xiw_engine::sim::{Region, Sim};
use xiw_engine::wire::{ddp, mpa, rdmap};

const HEAD: usize = 16;
const MORE: i32 = 0;
const PLACE: i32 = 1;
const UP: i32 = 2;
const READ: i32 = 3;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Fpdu {
    total: u32,
    stag: u32,
    to: u64,
    data_len: u32,
    last: bool,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ReadLent {
    stag: u32,
    to: u64,
    left: u64,
}

#[repr(C)]
struct Mr {
    stag: u32,
    pd: *const c_void,
    iova: u64,
    len: u64,
    access: u32,
    valid: bool,
}

extern "C" {
    fn xiw_fpdu_head(hdr: *const u8, have: u32, f: *mut Fpdu) -> i32;
    fn xiw_fpdu_event(hdr: *const u8, have: u32) -> i32;
    fn xiw_fpdu_check(
        f: *const Fpdu,
        mr: *const Mr,
        qp_pd: *const c_void,
        qp_access: u32,
        off: *mut u64,
    ) -> i32;
    fn xiw_fpdu_check_read(
        f: *const Fpdu,
        rd: *const ReadLent,
        mr: *const Mr,
        qp_pd: *const c_void,
        off: *mut u64,
    ) -> i32;
    fn xiw_fpdu_read_placed(rd: *mut ReadLent, f: *const Fpdu) -> bool;
    fn xiw_fpdu_crc(crc: u32, p: *const c_void, n: usize) -> u32;
    fn xiw_fpdu_crc_ok(fpdu: *const u8, total: u32) -> bool;
}

fn crc_c(crc: u32, data: &[u8]) -> u32 {
    // SAFETY: reads `data.len()` bytes of `data`.
    unsafe { xiw_fpdu_crc(crc, data.as_ptr().cast(), data.len()) }
}

/// `xiw_fpdu_head` on a copy of `hdr` of its own, the first bytes of the
/// `have` there are.
fn head(hdr: &[u8], have: usize) -> (i32, Fpdu) {
    assert!(hdr.len() >= have.min(HEAD));
    let copy = hdr.to_vec();
    let mut f = Fpdu::default();
    // SAFETY: the parser reads at most `have` and at most XIW_FPDU_HEAD bytes.
    let r = unsafe { xiw_fpdu_head(copy.as_ptr(), have as u32, &mut f) };
    (r, f)
}

/// `xiw_fpdu_event` on a copy of the first `have` bytes of `hdr`.
fn event(hdr: &[u8], have: usize) -> i32 {
    let copy = hdr[..have.min(hdr.len())].to_vec();
    // SAFETY: the parser reads at most `have` bytes.
    unsafe { xiw_fpdu_event(copy.as_ptr(), copy.len() as u32) }
}

/// What `xiw_fpdu_event` says of the FPDU at the head of `rest` (nothing
/// past its first 16 bytes read), checked against the engine's parse: a
/// receive is claimed only for the last segment of a Send or Immediate Data
/// on queue 0, RDMAP version 1, solicited exactly when the engine says so.
fn check_event(rest: &[u8], placed: bool) {
    let k = rest.len().min(HEAD);
    let ev = event(rest, k);
    let mut padded = [0x5au8; HEAD];
    padded[..k].copy_from_slice(&rest[..k]);
    // SAFETY: reads at most `k` of the 16 bytes.
    let again = unsafe { xiw_fpdu_event(padded.as_ptr(), k as u32) };
    assert_eq!(ev, again, "reads past what it has");
    assert!((0..=2).contains(&ev), "event {ev}");
    if ev == 0 {
        return;
    }
    assert!(!placed, "a Write placed is no receive");
    if rest.len() < 2 + ddp::UNTAGGED_HDR_LEN {
        // The stream ends before the header does: nothing for the engine.
        return;
    }
    let (h, _) = ddp::HeaderRepr::parse(&rest[2..]).expect("an untagged DDP header");
    assert!(
        matches!(h.kind, ddp::Kind::Untagged { qn: 0, .. }),
        "{:?}",
        h.kind
    );
    assert!(h.last);
    let c = rdmap::Ctrl::from_byte(h.rdmap_ctrl);
    assert_eq!(c.version, rdmap::RDMAP_VERSION);
    let op = c.opcode().expect("an opcode");
    assert!(
        matches!(
            op,
            rdmap::Opcode::Send
                | rdmap::Opcode::SendInvalidate
                | rdmap::Opcode::SendSolicited
                | rdmap::Opcode::SendSolicitedInvalidate
                | rdmap::Opcode::ImmediateData
                | rdmap::Opcode::ImmediateDataSolicited
        ),
        "{op:?}"
    );
    assert_eq!(ev == 2, op.is_solicited());
}

/// A PD as the module knows it: a pointer only compared.
fn pd_token(pd: u32) -> *const c_void {
    std::ptr::without_provenance(pd as usize)
}

/// The fuzz input, read a field at a time; zeros once it is used up.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) << 8 | u16::from(self.u8())
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) << 32 | u64::from(self.u32())
    }
}

const ARENA: usize = 4096;
/// The STag indexes regions get (the key is the low byte).
const INDEXES: [u32; 4] = [1, 2, 3, 0xab_cdef];

/// A region; zero bytes choose a valid one of the QP's PD that may be
/// written remotely.
fn region(inp: &mut Input) -> Region {
    let stag = INDEXES[(inp.u8() % 4) as usize] << 8 | u32::from(inp.u8());
    let at = usize::from(inp.u16()) % ARENA;
    let len = ARENA - at - usize::from(inp.u16()) % (ARENA - at + 1);
    let top = u64::MAX - len as u64;
    let iova = match inp.u8() % 4 {
        0 => 0x1000 * (1 + at as u64),
        1 => inp.u64().min(top),
        2 => top,
        _ => 0,
    };
    let flags = inp.u8();
    Region {
        stag,
        at,
        len,
        iova,
        access: u32::from(inp.u8() & 0x0f) ^ access::REMOTE_WRITE,
        pd: if flags & 1 != 0 { 2 } else { 1 },
        valid: flags & 2 == 0,
    }
}

/// A tagged RDMA Write, mostly well formed, aimed mostly at a region (zero
/// bytes choose a good one: a length and a TO that fit, the region's STag);
/// with `read` (the sink STag of an outstanding Read, and where its data
/// has reached so far), a Read Response aimed mostly there.
fn write_fpdu(
    inp: &mut Input,
    regions: &[Region],
    crc: bool,
    kind: u8,
    mut read: Option<&mut (u32, u64)>,
) -> Vec<u8> {
    let sel = inp.u8();
    let r = &regions[usize::from(sel >> 2) % regions.len()];
    let aimed = read.as_ref().map(|rd| **rd);
    let stag = match (sel % 4, aimed) {
        (0 | 1, Some((stag, _))) => stag,
        (0 | 1, None) => r.stag,
        (2, _) => r.stag ^ 1 << (inp.u8() % 32),
        _ => inp.u32(),
    };
    let t = inp.u8();
    let to = match (t % 4, aimed) {
        (0, Some((_, next))) => next,
        (0, None) => r.iova + u64::from(inp.u16()) % (r.len as u64 + 1),
        (1, _) => (r.iova.wrapping_add(r.len as u64)).wrapping_sub(u64::from(inp.u8())),
        (2, _) => inp.u64(),
        _ => r.iova.wrapping_sub(u64::from(inp.u8())),
    };
    let payload_len = usize::from(inp.u16() % 1500);
    if let Some(rd) = read.as_mut() {
        if rd.1 == to {
            rd.1 = to.wrapping_add(payload_len as u64);
        }
    }
    let flags = inp.u8();
    let ddp_ctrl = if flags & 0x07 == 0x07 {
        inp.u8()
    } else {
        ddp::FLAG_TAGGED | ddp::DDP_VERSION | if flags & 0x08 != 0 { ddp::FLAG_LAST } else { 0 }
    };
    let rdmap_ctrl = if flags & 0x30 == 0x30 {
        inp.u8()
    } else if aimed.is_some() {
        rdmap::RDMAP_VERSION << 6 | rdmap::Opcode::ReadResponse as u8
    } else {
        rdmap::RDMAP_VERSION << 6
    };
    let ulpdu_len = if kind & 0x80 != 0 {
        usize::from(inp.u16() % 1600)
    } else {
        ddp::TAGGED_HDR_LEN + payload_len
    };
    let mut ulpdu = vec![0u8; ulpdu_len.max(ddp::TAGGED_HDR_LEN)];
    ulpdu[0] = ddp_ctrl;
    ulpdu[1] = rdmap_ctrl;
    ulpdu[2..6].copy_from_slice(&stag.to_be_bytes());
    ulpdu[6..14].copy_from_slice(&to.to_be_bytes());
    let body = inp.bytes(ulpdu_len.saturating_sub(ddp::TAGGED_HDR_LEN));
    ulpdu[14..14 + body.len()].copy_from_slice(body);
    for (i, b) in ulpdu[14 + body.len()..].iter_mut().enumerate() {
        *b = (i as u8) ^ kind;
    }
    ulpdu.truncate(ulpdu_len);
    let mut f = seal(&ulpdu, crc, flags & 0x40 != 0);
    if flags & 0x80 != 0 && kind & 0x40 != 0 {
        // A wrong CRC (or, without CRC, a trailer nobody reads).
        let n = f.len();
        f[n - 1 - usize::from(kind & 3)] ^= 1 << (flags & 7);
    }
    f
}

/// `ulpdu` framed as an FPDU, with zero pad or (`junk_pad`) pad bytes that
/// are not zero, which the receiver ignores.
fn seal(ulpdu: &[u8], crc: bool, junk_pad: bool) -> Vec<u8> {
    let mut f = vec![0u8; mpa::fpdu_len(ulpdu.len())];
    f[2..2 + ulpdu.len()].copy_from_slice(ulpdu);
    let n = mpa::seal_fpdu(&mut f, ulpdu.len(), crc).expect("room");
    assert_eq!(n, f.len());
    if junk_pad && mpa::pad_len(ulpdu.len()) > 0 {
        let covered = n - mpa::CRC_LEN;
        f[2 + ulpdu.len()..covered].fill(0xaa);
        if crc {
            let c = mpa::crc32c(0, &f[..covered]);
            f[covered..].copy_from_slice(&c.to_le_bytes());
        }
    }
    f
}

fuzz_target!(|data: &[u8]| {
    // The two CRC32c implementations, over arbitrary bytes in two pieces.
    if let [s0, s1, s2, s3, cut, ..] = *data {
        let seed = u32::from_le_bytes([s0, s1, s2, s3]);
        let (a, b) = data.split_at(usize::from(cut).min(data.len()));
        let want = mpa::crc32c(mpa::crc32c(seed, a), b);
        assert_eq!(crc_c(crc_c(seed, a), b), want, "CRC32c from {seed:#x}");
        assert_eq!(crc_c(seed, data), want);
    }

    let mut inp = Input(data);
    let cfg = inp.u8();
    let chunk = usize::from(inp.u8()) + 1;
    let crc = cfg & 1 != 0;
    let qp_access = [
        access::REMOTE_WRITE,
        access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC,
        access::REMOTE_READ | access::REMOTE_ATOMIC,
        0,
    ][usize::from(cfg >> 1 & 3)];
    let mut sim = Sim::new(ARENA, 0x5a);
    for _ in 0..1 + inp.u8() % 3 {
        let r = region(&mut inp);
        sim.regions.push(r);
    }
    let regions = sim.regions.clone();
    // A Read outstanding, its sink one SGE (or two) somewhere in or around
    // a region.
    let rsel = inp.u8();
    if rsel & 1 != 0 {
        let r = &regions[usize::from(rsel >> 2) % regions.len()];
        let to = r
            .iova
            .wrapping_add(u64::from(inp.u16()) % (r.len as u64 + 2));
        let length = u64::from(inp.u16() % 3000);
        let mut sink = vec![(r.stag, to, length as u32)];
        if rsel & 2 != 0 {
            let half = length as u32 / 2;
            sink = vec![
                (r.stag, to, half),
                (r.stag, to + u64::from(half) + 1, length as u32 - half),
            ];
        }
        sim.orq.push_back(Outstanding::Read(PendingRead {
            sq_idx: 9,
            sink_stag: r.stag,
            sink_to: to,
            sink,
            length,
            received: 0,
        }));
    }
    let mut rx = Receiver::new(Params {
        crc,
        access: qp_access,
        extensions: cfg & 0x08 != 0,
        merge_imm: cfg & 0x10 != 0,
        inplace_min: if cfg & 0x20 != 0 { 16 } else { 0 },
        ..Params::default()
    });
    let lent = rx.lend_read(&mut sim);
    let mut aim = match sim.orq.front() {
        Some(Outstanding::Read(pr)) => Some((pr.sink_stag, pr.sink_to)),
        _ => None,
    };

    let mut stream = Vec::new();
    while !inp.0.is_empty() {
        let kind = inp.u8();
        match kind % 8 {
            4 if aim.is_some() => {
                stream.extend(write_fpdu(&mut inp, &regions, crc, kind, aim.as_mut()))
            }
            0..=4 => stream.extend(write_fpdu(&mut inp, &regions, crc, kind, None)),
            5 | 6 => {
                let n = usize::from(inp.u16() % 600);
                let ulpdu = inp.bytes(n).to_vec();
                stream.extend(seal(&ulpdu, crc, kind & 0x40 != 0));
            }
            _ => {
                let n = usize::from(inp.u8());
                stream.extend_from_slice(inp.bytes(n));
            }
        }
    }
    if cfg & 0x80 != 0 {
        // The last FPDU cut short.
        stream.truncate(stream.len().saturating_sub(1 + (cfg as usize >> 3 & 15)));
    }

    // The module's walk.
    let mut read = lent.map(|l| ReadLent {
        stag: l.stag,
        to: l.to,
        left: l.left,
    });
    let qp_pd = pd_token(sim.pd);
    let mut arena = sim.arena.clone();
    let mut at = 0;
    loop {
        let rest = &stream[at..];
        // Nothing past `have` (nor past 16 bytes) is looked at: the bytes it
        // has in an allocation of their own (for the address sanitizer), and
        // the same with arbitrary bytes after them.
        let k = rest.len().min(HEAD);
        let (r, f) = head(&rest[..k], rest.len());
        let mut hdr = [!(chunk as u8); HEAD];
        hdr[..k].copy_from_slice(&rest[..k]);
        assert_eq!(head(&hdr, rest.len()), (r, f), "reads past what it has");
        assert!(matches!(r, MORE | PLACE | UP | READ), "result {r}");
        check_event(rest, r == PLACE || r == READ);
        if rest.len() >= 2 {
            assert_eq!(Some(f.total as usize), mpa::peek_fpdu_len(rest));
        }
        if r == MORE {
            assert!(rest.len() < HEAD);
            break;
        }
        if r == UP {
            break;
        }
        if r == READ && read.is_none() {
            // No Read lent: left for user space.
            break;
        }
        // A tagged RDMA Write or Read Response of this DDP and RDMAP
        // version, read as the engine reads it.
        let (h, hlen) = ddp::HeaderRepr::parse(&rest[2..HEAD]).expect("a DDP header");
        assert_eq!(hlen, ddp::TAGGED_HDR_LEN);
        assert_eq!(
            h.kind,
            ddp::Kind::Tagged {
                stag: f.stag,
                to: f.to
            }
        );
        assert_eq!(h.last, f.last);
        let c = rdmap::Ctrl::from_byte(h.rdmap_ctrl);
        assert_eq!(c.version, rdmap::RDMAP_VERSION);
        let want = if r == READ {
            rdmap::Opcode::ReadResponse
        } else {
            rdmap::Opcode::Write
        };
        assert_eq!(c.opcode(), Some(want));
        assert_eq!(
            f.total as usize,
            mpa::fpdu_len(ddp::TAGGED_HDR_LEN + f.data_len as usize)
        );
        let total = f.total as usize;
        if rest.len() < total {
            break;
        }
        let fpdu = &rest[..total];
        // SAFETY: `fpdu` has `total` bytes.
        let crc_right = unsafe { xiw_fpdu_crc_ok(fpdu.as_ptr(), f.total) };
        assert_eq!(crc_right, mpa::check_fpdu(fpdu, true).is_ok());
        if crc && !crc_right {
            break;
        }
        // The module's table: one entry per STag index.
        let entry = regions
            .iter()
            .find(|r| r.stag >> 8 == f.stag >> 8)
            .map(|r| {
                (
                    r,
                    Mr {
                        stag: r.stag,
                        pd: pd_token(r.pd),
                        iova: r.iova,
                        len: r.len as u64,
                        access: r.access,
                        valid: r.valid,
                    },
                )
            });
        let mr = entry
            .as_ref()
            .map_or(std::ptr::null(), |e| &e.1 as *const Mr);
        let mut off = u64::MAX;
        let refused = match read.as_ref() {
            // SAFETY: `mr` is null or points at `entry`'s Mr, alive here;
            // `rd` is a live ReadLent.
            Some(rd) if r == READ => unsafe {
                xiw_fpdu_check_read(&f, rd, mr, qp_pd, &mut off) != 0
            },
            // SAFETY: as above.
            _ => unsafe { xiw_fpdu_check(&f, mr, qp_pd, qp_access, &mut off) != 0 },
        };
        if refused {
            break;
        }
        if r == READ {
            let rd = read.as_mut().expect("a Read lent");
            // SAFETY: both are live values of their C types.
            if unsafe { xiw_fpdu_read_placed(rd, &f) } {
                read = None;
            }
        }
        let (r, _) = entry.expect("check accepts no missing region");
        let n = f.data_len as usize;
        let dst = r.at + off as usize;
        arena[dst..dst + n].copy_from_slice(&fpdu[HEAD..HEAD + n]);
        at += total;
    }
    let placed = &stream[..at];

    // The engine, over what the module placed, in pieces.
    let mut buf = Vec::new();
    for mut piece in placed.chunks(chunk) {
        while !piece.is_empty() {
            if let Some((span, allowed)) = rx.direct() {
                let take = piece.len().min(span.len as usize);
                if let Err(e) = sim.write_span(&span, allowed, &piece[..take]) {
                    panic!("in place: {e:?}: {:?}", rx.direct_lost(e).why);
                }
                rx.direct_placed(&piece[..take]);
                piece = &piece[take..];
                continue;
            }
            buf.extend_from_slice(piece);
            piece = &[];
            let (used, r) = rx.handle(&mut sim, &buf);
            if let Err(e) = r {
                panic!("the engine refused what the module placed: {}", e.why);
            }
            buf.drain(..used);
        }
    }
    assert!(
        buf.is_empty() && rx.direct().is_none(),
        "the engine left bytes"
    );
    // What the walk left of the Read lent is what the engine has left of it.
    if lent.is_some() {
        match (read, sim.orq.front()) {
            (Some(rd), Some(Outstanding::Read(pr))) => {
                assert_eq!(rd.left, pr.length - pr.received, "bytes of the Read left");
                assert_eq!(
                    rd.to,
                    pr.sink_to + pr.received,
                    "where the Read's data reached"
                );
            }
            (None, None) => assert_eq!(sim.answered, vec![(9, None)], "the Read answered"),
            (rd, o) => panic!("walk {rd:?}, engine {o:?}"),
        }
    }
    if let Some(i) = (0..ARENA).find(|&i| arena[i] != sim.arena[i]) {
        panic!(
            "arena byte {i}: module {:#04x}, engine {:#04x}",
            arena[i], sim.arena[i]
        );
    }
});
