//! The receive engine after a successful MPA exchange, fed arbitrary FPDUs
//! (sealed with a correct CRC, so the fuzzer reaches DDP and RDMAP) in
//! arbitrary pieces, with three regions registered: it never panics, stops at
//! its first failure, and writes nothing outside memory that allows it,
//! whether payloads are buffered or (large ones, in some configurations)
//! read from the stream straight into the memory the engine names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xiw_engine::queue1::{access, Outstanding, PendingRead};
use xiw_engine::recv::{Params, Receiver};
use xiw_engine::sim::{Sim, SimRecv};
use xiw_engine::wire::mpa;

/// Remote-writable: arena 64..1088, tagged from 0x1000.
const RW: u32 = 0x100;
/// Remote-readable only: arena 2048..3072.
const RO: u32 = 0x200;
/// Local buffer for receives and responses: arena 4096..5120.
const LOC: u32 = 0x300;

fuzz_target!(|data: &[u8]| {
    let [cfg, chunk, body @ ..] = data else {
        return;
    };
    let qp_access = [
        access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC,
        access::REMOTE_READ,
        0,
        access::REMOTE_WRITE,
    ][(cfg & 3) as usize];
    let p = Params {
        crc: cfg & 4 != 0,
        rtr: match (cfg & 8 != 0, cfg & 128 != 0) {
            (false, _) => mpa::Rtr::None,
            (true, false) => mpa::Rtr::ZeroLengthWrite,
            (true, true) => mpa::Rtr::ZeroLengthSend,
        },
        access: qp_access,
        extensions: cfg & 16 != 0,
        merge_imm: cfg & 32 != 0,
        inplace_min: if cfg & 64 != 0 { 16 } else { 0 },
    };
    let mut s = Sim::new(6144, 0xa5);
    s.register(
        RW,
        64,
        1024,
        0x1000,
        access::REMOTE_WRITE | access::REMOTE_ATOMIC,
    );
    s.register(RO, 2048, 1024, 0x2000, access::REMOTE_READ);
    s.register(LOC, 4096, 1024, 4096, access::LOCAL_WRITE);
    s.ird = 4;
    for i in 0..4 {
        s.recvs.push_back(SimRecv {
            wr_id: i,
            sges: vec![(LOC, 4096 + i * 200, 100), (LOC, 4196 + i * 200, 100)],
        });
    }
    s.orq.push_back(Outstanding::Read(PendingRead {
        sq_idx: 0,
        sink_stag: 0x77,
        sink_to: 0x9000,
        sink: vec![(LOC, 4900, 100)],
        length: 100,
        received: 0,
    }));
    s.orq.push_back(Outstanding::Atomic {
        sq_idx: 1,
        request_id: 5,
        result: vec![(LOC, 5000, 8)],
    });
    let before = s.arena.clone();

    // Records: a length byte pair, then that many ULPDU bytes, sealed as an FPDU.
    let mut stream = Vec::new();
    let mut rest = body;
    while let [hi, lo, tail @ ..] = rest {
        let n = (u16::from_be_bytes([*hi, *lo]) as usize % 2048).min(tail.len());
        let mut f = vec![0u8; n + 12];
        f[2..2 + n].copy_from_slice(&tail[..n]);
        let total = mpa::seal_fpdu(&mut f, n, p.crc).expect("room");
        stream.extend_from_slice(&f[..total]);
        rest = &tail[n..];
    }

    let mut rx = Receiver::new(p);
    let mut buf = Vec::new();
    let mut failed = false;
    'stream: for mut piece in stream.chunks(*chunk as usize + 1) {
        while !piece.is_empty() {
            // As a driver does: into the memory the engine names while it
            // places a payload in place, checked again, else into the buffer.
            if let Some((span, allowed)) = rx.direct() {
                assert!(buf.is_empty(), "placing in place with bytes buffered");
                let take = piece.len().min(span.len as usize);
                if let Err(e) = s.write_span(&span, allowed, &piece[..take]) {
                    let _ = rx.direct_lost(e);
                    failed = true;
                    break 'stream;
                }
                rx.direct_placed(&piece[..take]);
                piece = &piece[take..];
                continue;
            }
            buf.extend_from_slice(piece);
            piece = &[];
            let (used, r) = rx.handle(&mut s, &buf);
            assert!(used <= buf.len());
            buf.drain(..used);
            if r.is_err() {
                failed = true;
                break 'stream;
            }
        }
    }
    if !failed {
        assert!(buf.is_empty(), "every whole FPDU is consumed");
    }

    // Only the remote-writable region (if the QP allows remote writes or
    // atomics) and the local one may have changed.
    let rw_open = qp_access & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0;
    for (i, (a, b)) in s.arena.iter().zip(&before).enumerate() {
        if a != b {
            let in_rw = (64..1088).contains(&i) && rw_open;
            let in_loc = (4096..5120).contains(&i);
            assert!(in_rw || in_loc, "byte {i} written");
        }
    }
    assert!(s.completed.len() <= 4);
});
