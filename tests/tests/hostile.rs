//! Every byte from the network is hostile: a raw TCP peer, speaking MPA/DDP/RDMAP
//! from frames built here by hand from the RFC figures (not with xiw's codecs),
//! connects to an unmodified `ibv_rc_pingpong` on xiw and sends malformed
//! FPDUs. Each must be answered with the RFC 5040 Terminate for that fault, the
//! stream must then close, and the victim must fail its work cleanly: an error
//! exit, never a signal, never a hang.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use xiw_tests::harness::{lo_device, port, serial, wait_until};

/// Our pretend QPN: port 1, index 0, always lower than any real xiw QPN, so the
/// victim waits for us to connect (the lower end initiates).
const OUR_QPN: u32 = 0x100;
const RECV_SIZE: usize = 64;

fn crc32c_trailer(bytes: &[u8]) -> [u8; 4] {
    crc32c::crc32c(bytes).to_le_bytes()
}

/// An FPDU: ULPDU length, ULPDU, pad to 4, CRC32c (RFC 5044 section 4).
fn fpdu(ulpdu: &[u8], crc: bool) -> Vec<u8> {
    let mut f = (ulpdu.len() as u16).to_be_bytes().to_vec();
    f.extend_from_slice(ulpdu);
    while !f.len().is_multiple_of(4) {
        f.push(0);
    }
    let t = if crc { crc32c_trailer(&f) } else { [0; 4] };
    f.extend_from_slice(&t);
    f
}

/// DDP control byte (RFC 5041 figure 3): T, L, reserved, DV.
fn ddp_ctrl(tagged: bool, last: bool, version: u8) -> u8 {
    (tagged as u8) << 7 | (last as u8) << 6 | (version & 3)
}

/// RDMAP control byte (RFC 5040 figure 3): RV, reserved, opcode; the opcode
/// takes 5 bits since draft-talpey-rdma-commit (opcodes 0x10 and 0x11).
fn rdmap_ctrl(version: u8, opcode: u8) -> u8 {
    (version & 3) << 6 | (opcode & 0x1f)
}

fn tagged(opcode: u8, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    tagged_ctrl(
        ddp_ctrl(true, true, 1),
        rdmap_ctrl(1, opcode),
        stag,
        to,
        payload,
    )
}

/// A tagged segment with the two control bytes as given.
fn tagged_ctrl(ddp: u8, rdmap: u8, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![ddp, rdmap];
    u.extend_from_slice(&stag.to_be_bytes());
    u.extend_from_slice(&to.to_be_bytes());
    u.extend_from_slice(payload);
    u
}

#[allow(clippy::too_many_arguments)]
fn untagged(
    ddp_version: u8,
    rdmap_version: u8,
    opcode: u8,
    word: u32,
    qn: u32,
    msn: u32,
    mo: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut u = vec![
        ddp_ctrl(false, true, ddp_version),
        rdmap_ctrl(rdmap_version, opcode),
    ];
    for v in [word, qn, msn, mo] {
        u.extend_from_slice(&v.to_be_bytes());
    }
    u.extend_from_slice(payload);
    u
}

/// An RDMA Read Request's fields (RFC 5040 figure 9): sink STag and TO,
/// size, source STag and TO.
fn read_request(sink: u32, size: u32, source: u32) -> Vec<u8> {
    let mut req = Vec::new();
    req.extend_from_slice(&sink.to_be_bytes());
    req.extend_from_slice(&0u64.to_be_bytes());
    req.extend_from_slice(&size.to_be_bytes());
    req.extend_from_slice(&source.to_be_bytes());
    req.extend_from_slice(&0u64.to_be_bytes());
    req
}

/// Terminate control (RFC 5040 figure 15): layer, error type, error code.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Cause(u8, u8, u8);

/// Plays the client side of ibv_rc_pingpong's address exchange.
fn exchange(port: u16) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("pingpong server never listened: {e}"),
        }
    };
    // GID ::ffff:127.0.0.1 as four big-endian words in hex.
    let msg = format!(
        "{:04x}:{:06x}:{:06x}:{}\0",
        0, OUR_QPN, 0x123456, "00000000000000000000ffff7f000001"
    );
    s.write_all(msg.as_bytes()).unwrap();
    let mut reply = [0u8; 52];
    s.read_exact(&mut reply).unwrap();
    s.write_all(b"done\0").unwrap();
    let text = String::from_utf8_lossy(&reply);
    u32::from_str_radix(text.split(':').nth(1).expect("a QPN field"), 16).expect("hex QPN")
}

/// Connects to the victim QP and runs the MPA exchange as initiator; returns
/// the stream and whether CRC is in use.
fn mpa_connect(victim_qpn: u32, ask_crc: bool) -> (TcpStream, bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", (victim_qpn >> 8) as u16)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("victim QP not reachable: {e}"),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    // RFC 6581 IRD/ORD block: peer-to-peer, zero-length Write as ready-to-receive.
    let mut pd = Vec::new();
    pd.extend_from_slice(&(0x8000u16 | 4).to_be_bytes());
    pd.extend_from_slice(&(0x8000u16 | 4).to_be_bytes());
    pd.extend_from_slice(b"xiw1");
    pd.extend_from_slice(&OUR_QPN.to_be_bytes());
    pd.extend_from_slice(&victim_qpn.to_be_bytes());
    let mut req = b"MPA ID Req Frame".to_vec();
    req.push(if ask_crc { 0x40 } else { 0 } | 0x10);
    req.push(2);
    req.extend_from_slice(&(pd.len() as u16).to_be_bytes());
    req.extend_from_slice(&pd);
    s.write_all(&req).unwrap();
    let mut hdr = [0u8; 20];
    s.read_exact(&mut hdr).expect("an MPA reply");
    assert_eq!(&hdr[..16], b"MPA ID Rep Frame");
    assert_eq!(hdr[16] & 0x20, 0, "the victim rejected the connection");
    assert_eq!(hdr[16] & 0x80, 0, "markers must never be used");
    let crc = hdr[16] & 0x40 != 0;
    let n = u16::from_be_bytes([hdr[18], hdr[19]]) as usize;
    let mut rest = vec![0u8; n];
    s.read_exact(&mut rest).unwrap();
    // Ready-to-receive: a zero-length RDMA Write.
    s.write_all(&fpdu(&tagged(0, 0, 0, &[]), crc)).unwrap();
    (s, crc)
}

/// Starts an unmodified `ibv_rc_pingpong` server on xiw with `args` (and
/// `env`) and connects to its QP from here as initiator; returns the
/// victim, the stream, whether CRC is in use and the victim's QPN.
fn connect_victim(
    args: &[&str],
    env: &[(&str, &str)],
    ask_crc: bool,
) -> (std::process::Child, TcpStream, bool, u32) {
    let dev = lo_device();
    let p = port();
    let mut victim = dev.cmd("ibv_rc_pingpong");
    victim
        .args(["-g", "0", "-p", &p.to_string()])
        .args(args)
        .env("XIW_CONNECT_TIMEOUT_MS", "5000")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = victim.spawn().expect("ibv_rc_pingpong");
    let victim_qpn = exchange(p);
    let (s, crc) = mpa_connect(victim_qpn, ask_crc);
    (child, s, crc, victim_qpn)
}

/// Waits for the victim to end and checks that it failed cleanly (no hang,
/// no signal, an error exit); returns `what` with its output, for messages.
fn victim_failed(child: std::process::Child, what: String) -> String {
    let (out, killed) = wait_until(child, Instant::now() + Duration::from_secs(15));
    let log = format!(
        "{what}\nvictim stdout:\n{}\nvictim stderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!killed, "victim hung: {log}");
    assert_eq!(out.status.signal(), None, "victim died by a signal: {log}");
    assert!(
        !out.status.success(),
        "victim claims success after a protocol attack: {log}"
    );
    log
}

/// Reads until the victim closes; returns the Terminate causes it sent.
fn read_terminates(s: &mut TcpStream) -> Vec<Cause> {
    read_terminates_after(s).0
}

/// As [`read_terminates`], with the number of bytes before the first Terminate.
fn read_terminates_after(s: &mut TcpStream) -> (Vec<Cause>, usize) {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("the victim neither terminated nor closed within 10 s")
            }
            Err(_) => break,
        }
    }
    let mut causes = Vec::new();
    let mut first = all.len();
    let mut at = 0;
    while at + 2 <= all.len() {
        let len = u16::from_be_bytes([all[at], all[at + 1]]) as usize;
        let total = (2 + len).div_ceil(4) * 4 + 4;
        if at + total > all.len() || len < 18 {
            break;
        }
        let u = &all[at + 2..at + 2 + len];
        let is_untagged = u[0] & 0x80 == 0;
        let qn = u32::from_be_bytes(u[6..10].try_into().unwrap());
        if is_untagged && u[1] & 0x0f == 7 && qn == 2 {
            let t = &u[18..];
            causes.push(Cause(t[0] >> 4, t[0] & 0x0f, t[1]));
            first = first.min(at);
        }
        at += total;
    }
    (causes, first)
}

/// Runs one case: a fresh victim, the MPA exchange, then `attack`.
fn case(
    name: &str,
    ask_crc: bool,
    attack: impl FnOnce(&mut TcpStream, bool, u32),
    expect: Option<Cause>,
) {
    let size = RECV_SIZE.to_string();
    let (child, mut s, crc, victim_qpn) =
        connect_victim(&["-n", "1", "-s", &size, "-r", "1"], &[], ask_crc);
    attack(&mut s, crc, victim_qpn);
    let causes = read_terminates(&mut s);
    let log = victim_failed(child, format!("{name}: terminates {causes:?}"));
    if let Some(c) = expect {
        assert_eq!(
            causes.first(),
            Some(&c),
            "wrong or missing Terminate: {log}"
        );
    }
}

#[test]
fn hostile_frames_get_the_right_terminate() {
    let _g = serial();
    // MPA: CRC mismatch (RFC 5044: LLP layer, MPA error, CRC error).
    case(
        "bad CRC",
        true,
        |s, crc, _| {
            assert!(crc, "CRC was asked for and must be on");
            let mut f = fpdu(&untagged(1, 1, 3, 0, 0, 1, 0, b"hello"), true);
            let n = f.len();
            f[n - 1] ^= 0xff;
            s.write_all(&f).unwrap();
        },
        Some(Cause(2, 0, 2)),
    );
    // DDP version 2: untagged buffer error, invalid DDP version.
    case(
        "DDP version",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&untagged(2, 1, 3, 0, 0, 1, 0, b"x"), crc))
                .unwrap()
        },
        Some(Cause(1, 2, 6)),
    );
    // A tagged RDMA Write of DDP version 2, and of version 3: tagged buffer
    // error, invalid DDP version (before its STag is looked at). The
    // kernel-mode guest test (tests/vm/guest/hostile.sh) expects the same.
    for version in [2, 3] {
        case(
            &format!("tagged DDP version {version}"),
            true,
            |s, crc, _| {
                let u = tagged_ctrl(
                    ddp_ctrl(true, true, version),
                    rdmap_ctrl(1, 0),
                    0x4242_4200,
                    0x1000,
                    b"stray",
                );
                s.write_all(&fpdu(&u, crc)).unwrap()
            },
            Some(Cause(1, 1, 4)),
        );
    }
    // An RDMA Write of RDMAP version 0: invalid RDMAP version.
    case(
        "Write of RDMAP version 0",
        true,
        |s, crc, _| {
            let u = tagged_ctrl(
                ddp_ctrl(true, true, 1),
                rdmap_ctrl(0, 0),
                0x4242_4200,
                0,
                b"x",
            );
            s.write_all(&fpdu(&u, crc)).unwrap()
        },
        Some(Cause(0, 2, 5)),
    );
    // The reserved bits of both control bytes are not checked on receive
    // (RFC 5041 section 4.2, RFC 5040 section 4.1): a Write with all of them
    // set reaches its STag check.
    case(
        "Write with reserved bits set",
        true,
        |s, crc, _| {
            let u = tagged_ctrl(
                ddp_ctrl(true, true, 1) | 0x3c,
                rdmap_ctrl(1, 0) | 0x20,
                0x4242_4200,
                0x1000,
                b"stray",
            );
            s.write_all(&fpdu(&u, crc)).unwrap()
        },
        Some(Cause(1, 1, 0)),
    );
    // RDMAP version 0: remote operation error, invalid RDMAP version.
    case(
        "RDMAP version",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&untagged(1, 0, 3, 0, 0, 1, 0, b"x"), crc))
                .unwrap()
        },
        Some(Cause(0, 2, 5)),
    );
    // RDMA Write to an STag never advertised: DDP tagged buffer error, invalid STag.
    case(
        "unknown STag",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&tagged(0, 0x4242_4200, 0x1000, b"stray"), crc))
                .unwrap()
        },
        Some(Cause(1, 1, 0)),
    );
    // Send with the wrong MSN: untagged buffer error, MSN out of range.
    case(
        "MSN",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&untagged(1, 1, 3, 0, 0, 5, 0, b"x"), crc))
                .unwrap()
        },
        Some(Cause(1, 2, 3)),
    );
    // Send on a queue that does not exist: invalid QN.
    case(
        "QN",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&untagged(1, 1, 3, 0, 9, 1, 0, b"x"), crc))
                .unwrap()
        },
        Some(Cause(1, 2, 1)),
    );
    // Send longer than the posted receive: message too long.
    case(
        "too long",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(
                &untagged(1, 1, 3, 0, 0, 1, 0, &[7u8; RECV_SIZE + 1]),
                crc,
            ))
            .unwrap()
        },
        Some(Cause(1, 2, 5)),
    );
    // First segment with a non-zero MO: invalid MO.
    case(
        "MO",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&untagged(1, 1, 3, 0, 0, 1, 8, b"x"), crc))
                .unwrap()
        },
        Some(Cause(1, 2, 4)),
    );
    // RDMA Read Request for an unknown source STag: remote protection error, invalid STag.
    case(
        "read STag",
        true,
        |s, crc, _| {
            let mut req = Vec::new();
            req.extend_from_slice(&0x100u32.to_be_bytes()); // sink STag
            req.extend_from_slice(&0u64.to_be_bytes()); // sink TO
            req.extend_from_slice(&4096u32.to_be_bytes()); // size
            req.extend_from_slice(&0x4242_4200u32.to_be_bytes()); // source STag
            req.extend_from_slice(&0u64.to_be_bytes()); // source TO
            s.write_all(&fpdu(&untagged(1, 1, 1, 0, 1, 1, 0, &req), crc))
                .unwrap()
        },
        Some(Cause(0, 1, 0)),
    );
    // A Read Request with bytes behind its fixed fields (RFC 5040 section
    // 4.4): refused before anything in it is looked at.
    case(
        "read request with bytes behind it",
        true,
        |s, crc, _| {
            let mut req = read_request(0x100, 4096, 0x4242_4200);
            req.extend_from_slice(b"more");
            s.write_all(&fpdu(&untagged(1, 1, 1, 0, 1, 1, 0, &req), crc))
                .unwrap()
        },
        Some(Cause(1, 0, 0)),
    );
    // A zero-length Read names a source that is never checked (RFC 5040
    // section 7.2 validates it only for Reads of non-zero length): even an
    // STag that does not exist gets its zero-length Read Response. Then an
    // unknown opcode ends the connection as usual.
    case(
        "zero-length read of an unknown STag",
        true,
        |s, crc, _| {
            let req = read_request(0x100, 0, 0x4242_4200);
            s.write_all(&fpdu(&untagged(1, 1, 1, 0, 1, 1, 0, &req), crc))
                .unwrap();
            // The Read Response: DDP and RDMAP control, sink STag, sink TO, no payload.
            let mut resp = [0u8; 20];
            s.read_exact(&mut resp)
                .expect("a Read Response to the zero-length Read");
            assert_eq!(u16::from_be_bytes([resp[0], resp[1]]), 14, "{resp:02x?}");
            assert_eq!(resp[2], ddp_ctrl(true, true, 1), "{resp:02x?}");
            assert_eq!(resp[3], rdmap_ctrl(1, 2), "{resp:02x?}");
            assert_eq!(&resp[4..8], &0x100u32.to_be_bytes(), "{resp:02x?}");
            s.write_all(&fpdu(&untagged(1, 1, 0xf, 0, 0, 1, 0, b"x"), crc))
                .unwrap()
        },
        Some(Cause(0, 2, 6)),
    );
    // Send with Invalidate (opcode 4) naming an STag this stream may not
    // invalidate (here one that does not exist; RFC 5040 section 8.1.1 rule
    // 7 forbids a region other streams may use too): remote protection
    // error, STag cannot be invalidated.
    case(
        "send with invalidate",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&untagged(1, 1, 4, 0x4242_4200, 0, 1, 0, b"x"), crc))
                .unwrap()
        },
        Some(Cause(0, 1, 9)),
    );
    // An opcode that is not RDMAP's (0xF) on an untagged queue: unexpected opcode.
    case(
        "opcode",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&untagged(1, 1, 0xf, 0, 0, 1, 0, b"x"), crc))
                .unwrap()
        },
        Some(Cause(0, 2, 6)),
    );
    // A Read Response nobody asked for: unexpected opcode.
    case(
        "stray read response",
        true,
        |s, crc, _| s.write_all(&fpdu(&tagged(2, 0x100, 0, b"x"), crc)).unwrap(),
        Some(Cause(0, 2, 6)),
    );
    // A ULPDU too short to hold a DDP header: DDP local catastrophic.
    case(
        "short ULPDU",
        true,
        |s, crc, _| s.write_all(&fpdu(&[0x41, 0x43, 0, 0], crc)).unwrap(),
        Some(Cause(1, 0, 0)),
    );
}

/// An RFC 7306 Atomic Request body (figure 4): AOpCode, request id, STag, TO,
/// add/swap data and mask, compare data and mask.
fn atomic_request(aopcode: u8, stag: u32, to: u64) -> Vec<u8> {
    let mut b = (aopcode as u32 & 0xf).to_be_bytes().to_vec();
    b.extend_from_slice(&7u32.to_be_bytes());
    b.extend_from_slice(&stag.to_be_bytes());
    b.extend_from_slice(&to.to_be_bytes());
    for v in [1u64, 0, 0, u64::MAX] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b
}

/// A commit-draft request body (appendix A): STag, length, TO, then `rest`.
fn commit_request(stag: u32, len: u32, to: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = stag.to_be_bytes().to_vec();
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(&to.to_be_bytes());
    b.extend_from_slice(rest);
    b
}

/// What the victim's only MR (ibv_rc_pingpong's, local write access only)
/// would be if STags were handed out in order: the first slot, the first key.
/// They are not (RFC 5040 section 8.1.1 rule 8), so a peer that guesses
/// this names no STag.
const VICTIM_STAG: u32 = 0x101;

#[test]
fn hostile_extension_frames_get_the_right_terminate() {
    let _g = serial();
    // Atomic Request (opcode 0xA, QN 1) on an STag never advertised:
    // RDMAP remote protection error, invalid STag (RFC 7306 section 8.2).
    case(
        "atomic STag",
        true,
        |s, crc, _| {
            let body = atomic_request(0, 0x4242_4200, 0);
            s.write_all(&fpdu(&untagged(1, 1, 0xa, 0, 1, 1, 0, &body), crc))
                .unwrap()
        },
        Some(Cause(0, 1, 0)),
    );
    // Atomic Request naming the STag an in-order provider would have given
    // the victim's MR: STags are hard to predict, so it is an invalid STag.
    // (Bounds and rights of atomics: the engine's receive tests.)
    case(
        "atomic on a guessed STag",
        true,
        |s, crc, _| {
            let body = atomic_request(0, VICTIM_STAG, 0);
            s.write_all(&fpdu(&untagged(1, 1, 0xa, 0, 1, 1, 0, &body), crc))
                .unwrap()
        },
        Some(Cause(0, 1, 0)),
    );
    // The reserved AOpCode 1: unexpected operation.
    case(
        "AOpCode",
        true,
        |s, crc, _| {
            let body = atomic_request(1, VICTIM_STAG, 0);
            s.write_all(&fpdu(&untagged(1, 1, 0xa, 0, 1, 1, 0, &body), crc))
                .unwrap()
        },
        Some(Cause(0, 2, 6)),
    );
    // An Atomic Request cut short: DDP local catastrophic.
    case(
        "short atomic",
        true,
        |s, crc, _| {
            let body = atomic_request(0, VICTIM_STAG, 0);
            s.write_all(&fpdu(&untagged(1, 1, 0xa, 0, 1, 1, 0, &body[..20]), crc))
                .unwrap()
        },
        Some(Cause(1, 0, 0)),
    );
    // Immediate Data (0x8) of 4 bytes instead of 8 (RFC 7306 section 6.3):
    // remote operation error, catastrophic error localized to the stream.
    case(
        "immediate length",
        true,
        |s, crc, _| {
            s.write_all(&fpdu(&untagged(1, 1, 0x8, 0, 0, 1, 0, &[1, 2, 3, 4]), crc))
                .unwrap()
        },
        Some(Cause(0, 2, 7)),
    );
    // An Atomic Response (0xB, QN 3) nobody asked for: unexpected opcode.
    case(
        "stray atomic response",
        true,
        |s, crc, _| {
            let mut body = 7u32.to_be_bytes().to_vec();
            body.extend_from_slice(&0u64.to_be_bytes());
            s.write_all(&fpdu(&untagged(1, 1, 0xb, 0, 3, 1, 0, &body), crc))
                .unwrap()
        },
        Some(Cause(0, 2, 6)),
    );
    // An Atomic Request sent on queue 3: unexpected opcode.
    case(
        "atomic on QN 3",
        true,
        |s, crc, _| {
            let body = atomic_request(0, VICTIM_STAG, 0);
            s.write_all(&fpdu(&untagged(1, 1, 0xa, 0, 3, 1, 0, &body), crc))
                .unwrap()
        },
        Some(Cause(0, 2, 6)),
    );
    // Atomic Write (0x10) of 4 bytes: the draft's section 3.1.3.1 allows 8 only.
    case(
        "atomic write length",
        true,
        |s, crc, _| {
            let body = commit_request(VICTIM_STAG, 4, 0, &[0; 8]);
            s.write_all(&fpdu(&untagged(1, 1, 0x10, 0, 1, 1, 0, &body), crc))
                .unwrap()
        },
        Some(Cause(0, 2, 7)),
    );
    // RDMA Verify (0xE) of an STag never advertised: invalid STag.
    case(
        "verify STag",
        true,
        |s, crc, _| {
            let body = commit_request(0x4242_4200, 64, 0, &[0xab; 4]);
            s.write_all(&fpdu(&untagged(1, 1, 0xe, 0, 1, 1, 0, &body), crc))
                .unwrap()
        },
        Some(Cause(0, 1, 0)),
    );
    // RDMA Flush naming the guessed STag: invalid STag. (Bounds of a Flush:
    // the engine's receive tests.)
    case(
        "flush on a guessed STag",
        true,
        |s, crc, _| {
            let body = commit_request(VICTIM_STAG, 64, 1 << 40, &2u32.to_be_bytes());
            s.write_all(&fpdu(&untagged(1, 1, 0xc, 0, 1, 1, 0, &body), crc))
                .unwrap()
        },
        Some(Cause(0, 1, 0)),
    );
}

/// A peer that stops reading backs up the victim's stream; a Terminate the
/// victim then owes it waits for room, without holding up the victim's
/// threads, and goes out once the peer reads again, after everything sent
/// before it; the victim's QP fails after it. A peer that stays silent past
/// the wait (1 s) gets no Terminate: the QP fails then, and the stream ends.
#[test]
fn a_terminate_waits_for_a_peer_that_stopped_reading() {
    let _g = serial();
    let (causes, before, log) = backed_up_terminate(Duration::from_millis(100));
    assert_eq!(causes.first(), Some(&Cause(1, 1, 0)), "no Terminate: {log}");
    // More than the victim's first Send came before it: the stream had
    // backed up when the Terminate was owed.
    assert!(
        before > BACKED_UP_SEND,
        "too little sent before the Terminate: {log}"
    );
    let (causes, _, log) = backed_up_terminate(Duration::from_secs(2));
    assert!(causes.is_empty(), "a Terminate after the wait: {log}");
}

const BACKED_UP_SEND: usize = 1 << 20;

/// Backs up a victim's stream with its own 1 MiB Sends, makes it owe a
/// Terminate, reads again after `pause`; returns the Terminate causes, the
/// bytes before the first, and the victim's log (it has failed cleanly).
fn backed_up_terminate(pause: Duration) -> (Vec<Cause>, usize, String) {
    let size = BACKED_UP_SEND.to_string();
    let (child, mut s, crc, _) = connect_victim(
        &["-n", "1000", "-s", &size, "-r", "100"],
        // Its diagnostics say whether the Terminate had to wait.
        &[("XIW_DEBUG", "1")],
        false,
    );
    // The victim answers each of these with a 1 MiB Send, which this side
    // does not read: its stream backs up. (pingpong sends once its last
    // Send has completed and another message has come, so they are spaced.)
    for msn in 1..=24 {
        s.write_all(&fpdu(&untagged(1, 1, 3, 0, 0, msn, 0, b"ping"), crc))
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    // A Write to an STag never advertised: the victim owes a Terminate.
    s.write_all(&fpdu(&tagged(0, 0x4242_4200, 0x1000, b"stray"), crc))
        .unwrap();
    std::thread::sleep(pause);
    let (causes, before) = read_terminates_after(&mut s);
    let log = victim_failed(
        child,
        format!("pause {pause:?}: terminates {causes:?} after {before} bytes"),
    );
    assert!(
        log.contains("the Terminate waits for room"),
        "the victim's stream was not backed up when it owed the Terminate: {log}"
    );
    (causes, before, log)
}

#[test]
fn random_garbage_never_crashes_the_victim() {
    let _g = serial();
    for seed in 1..=12u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        case(
            &format!("garbage seed {seed}"),
            rng.bool(),
            |s, crc, _| {
                // Mostly plausible frames with random fields, sometimes raw noise.
                let mut out = Vec::new();
                for _ in 0..rng.usize(1..8) {
                    if rng.u8(..) < 40 {
                        out.extend((0..rng.usize(1..200)).map(|_| rng.u8(..)));
                    } else {
                        let mut u: Vec<u8> = (0..rng.usize(2..120)).map(|_| rng.u8(..)).collect();
                        u[0] = (u[0] & 0xc0) | 1;
                        u[1] = (u[1] & 0x0f) | 0x40;
                        out.extend(fpdu(&u, crc));
                    }
                }
                let _ = s.write_all(&out);
                // Half-close so a victim waiting for more bytes sees the end.
                let _ = s.shutdown(std::net::Shutdown::Write);
            },
            None,
        );
    }
}

#[test]
fn a_listener_is_not_an_open_door() {
    // Connections that never speak MPA, or ask for another QP, are turned away
    // without disturbing the QP.
    let _g = serial();
    let dev = lo_device();
    let p = port();
    let mut victim = dev.cmd("ibv_rc_pingpong");
    victim
        .args(["-g", "0", "-p", &p.to_string(), "-n", "1", "-s", "64"])
        .env("XIW_CONNECT_TIMEOUT_MS", "5000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = victim.spawn().expect("ibv_rc_pingpong");
    let victim_qpn = exchange(p);
    // A request naming a QP that does not exist is rejected.
    let mut s = TcpStream::connect(("127.0.0.1", (victim_qpn >> 8) as u16)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = b"MPA ID Req Frame".to_vec();
    req.extend_from_slice(&[0x10, 2, 0, 16]);
    req.extend_from_slice(&[0x80, 4, 0x80, 4]);
    req.extend_from_slice(b"xiw1");
    req.extend_from_slice(&OUR_QPN.to_be_bytes());
    req.extend_from_slice(&(victim_qpn ^ 0x7f).to_be_bytes());
    s.write_all(&req).unwrap();
    let mut hdr = [0u8; 20];
    s.read_exact(&mut hdr).expect("a reply");
    assert_eq!(&hdr[..16], b"MPA ID Rep Frame");
    assert_ne!(
        hdr[16] & 0x20,
        0,
        "a request for an unknown QP must be rejected"
    );
    // Noise on the listener is dropped.
    let mut junk = TcpStream::connect(("127.0.0.1", (victim_qpn >> 8) as u16)).unwrap();
    junk.write_all(&[0xffu8; 64]).unwrap();
    drop(junk);
    // The real peer still gets through, and a well-formed Send is delivered:
    // the victim then completes its one iteration's receive.
    let (mut s, crc) = mpa_connect(victim_qpn, false);
    s.write_all(&fpdu(&untagged(1, 1, 3, 0, 0, 1, 0, &[1u8; 64]), crc))
        .unwrap();
    // Its own Send comes back to us; we have nothing posted, but we only read it.
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).expect("the victim's Send");
    assert!(
        n >= 2 + 18 + 64,
        "expected the victim's 64-byte Send, got {n} bytes"
    );
    assert_eq!(buf[2] & 0x80, 0, "a Send is untagged");
    assert_eq!(buf[3] & 0x0f, 3, "RDMAP opcode Send");
    drop(s);
    let (out, killed) = wait_until(child, Instant::now() + Duration::from_secs(15));
    assert!(!killed, "victim hung");
    assert_eq!(out.status.signal(), None);
}
