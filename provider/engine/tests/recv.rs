//! The receive engine against hand-built frames: placement, completion and
//! ordering rules (RFC 5040 sections 5 and 7, RFC 5041, RFC 7306), and the
//! Terminate it sends for each violation (RFC 5040 section 4.8).

use xiw_engine::fault::{Event, Fail, Status};
use xiw_engine::queue1::{access, Inbound, Outstanding, PendingRead};
use xiw_engine::recv::{Params, Receiver, RecvCompletion};
use xiw_engine::sim::{RecvOutcome, Sim, SimRecv};
use xiw_engine::wire::terminate::{Cause, TerminateRepr};
use xiw_engine::wire::{atomic, commit, ddp, mpa, rdmap};

const ALL: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
/// Tagged buffer the peer may write, read and use atomically: arena 64..4160.
const BUF: u32 = 0x100;
const BUF_IOVA: u64 = 0x10000;
/// Read-only buffer: arena 8192..9216.
const RO: u32 = 0x200;
/// Local buffer for receives and responses: arena 12288..16384.
const LOC: u32 = 0x300;

fn sim() -> Sim {
    let mut s = Sim::new(16384, 0xee);
    s.register(BUF, 64, 4096, BUF_IOVA, ALL);
    s.register(RO, 8192, 1024, 0x20000, access::REMOTE_READ);
    s.register(LOC, 12288, 4096, 12288, access::LOCAL_WRITE);
    s
}

fn params(crc: bool) -> Params {
    Params {
        crc,
        rtr: mpa::Rtr::None,
        access: ALL,
        extensions: true,
        merge_imm: false,
        inplace_min: 0,
    }
}

/// Builds FPDUs as a peer would, keeping its MSNs.
struct Peer {
    crc: bool,
    msn: [u32; 4],
}

fn ctrl(op: rdmap::Opcode) -> u8 {
    rdmap::Ctrl {
        version: rdmap::RDMAP_VERSION,
        opcode: op as u8,
    }
    .to_byte()
}

impl Peer {
    fn new(crc: bool) -> Peer {
        Peer { crc, msn: [1; 4] }
    }

    fn fpdu(&self, hdr: &ddp::HeaderRepr, payload: &[u8]) -> Vec<u8> {
        let hl = hdr.buffer_len();
        let mut b = vec![0u8; 2 + hl + payload.len() + 8];
        hdr.emit(&mut b[2..2 + hl]);
        b[2 + hl..2 + hl + payload.len()].copy_from_slice(payload);
        let n = mpa::seal_fpdu(&mut b, hl + payload.len(), self.crc).unwrap();
        b.truncate(n);
        b
    }

    /// Seals a frame again after a header byte was changed.
    fn reseal(&self, mut f: Vec<u8>) -> Vec<u8> {
        let ulen = u16::from_be_bytes([f[0], f[1]]) as usize;
        mpa::seal_fpdu(&mut f, ulen, self.crc).unwrap();
        f
    }

    fn tagged(&self, op: rdmap::Opcode, stag: u32, to: u64, last: bool, payload: &[u8]) -> Vec<u8> {
        let hdr = ddp::HeaderRepr {
            last,
            version: ddp::DDP_VERSION,
            rdmap_ctrl: ctrl(op),
            kind: ddp::Kind::Tagged { stag, to },
        };
        self.fpdu(&hdr, payload)
    }

    #[allow(clippy::too_many_arguments)]
    fn untagged_at(
        &self,
        op: rdmap::Opcode,
        qn: u32,
        msn: u32,
        mo: u32,
        last: bool,
        ulp: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        let hdr = ddp::HeaderRepr {
            last,
            version: ddp::DDP_VERSION,
            rdmap_ctrl: ctrl(op),
            kind: ddp::Kind::Untagged {
                ulp_word: ulp,
                qn,
                msn,
                mo,
            },
        };
        self.fpdu(&hdr, payload)
    }

    /// A whole message on queue `qn`, cut into segments of at most `seg` bytes.
    fn message(
        &mut self,
        op: rdmap::Opcode,
        qn: u32,
        ulp: u32,
        payload: &[u8],
        seg: usize,
    ) -> Vec<u8> {
        let msn = self.msn[qn as usize];
        self.msn[qn as usize] += 1;
        let mut out = Vec::new();
        let mut mo = 0;
        loop {
            let n = (payload.len() - mo).min(seg);
            let last = mo + n == payload.len();
            out.extend(self.untagged_at(op, qn, msn, mo as u32, last, ulp, &payload[mo..mo + n]));
            mo += n;
            if last {
                return out;
            }
        }
    }

    fn send(&mut self, payload: &[u8], seg: usize) -> Vec<u8> {
        self.message(rdmap::Opcode::Send, ddp::QN_SEND, 0, payload, seg)
    }

    fn read_request(
        &mut self,
        sink_stag: u32,
        sink_to: u64,
        size: u32,
        src_stag: u32,
        src_to: u64,
    ) -> Vec<u8> {
        let req = rdmap::ReadRequestRepr {
            sink_stag,
            sink_to,
            size,
            src_stag,
            src_to,
        };
        let mut b = vec![0u8; rdmap::READ_REQUEST_LEN];
        req.emit(&mut rdmap::ReadRequestPacket::new_unchecked(&mut b[..]));
        self.message(
            rdmap::Opcode::ReadRequest,
            ddp::QN_READ_REQUEST,
            0,
            &b,
            1 << 16,
        )
    }

    fn atomic(&mut self, req: atomic::AtomicRequestRepr) -> Vec<u8> {
        let mut b = vec![0u8; req.buffer_len()];
        req.emit(&mut atomic::RequestPacket::new_unchecked(&mut b[..]));
        self.message(
            rdmap::Opcode::AtomicRequest,
            ddp::QN_READ_REQUEST,
            0,
            &b,
            1 << 16,
        )
    }
}

/// Feeds `stream` in pieces of `chunk` bytes, as a driver would: keeps what
/// the engine did not consume and stops at the first failure.
/// Feeds `stream` in pieces of `chunk` bytes as a driver does: into the
/// memory the engine names while it places a payload in place, into the
/// buffer otherwise. Returns the bytes placed in place.
fn feed(
    rx: &mut Receiver<SimRecv>,
    s: &mut Sim,
    stream: &[u8],
    chunk: usize,
) -> Result<usize, Fail> {
    let mut buf = Vec::new();
    let mut direct = 0;
    for mut piece in stream.chunks(chunk.max(1)) {
        while !piece.is_empty() {
            if let Some((span, allowed)) = rx.direct() {
                assert!(buf.is_empty(), "placing in place with bytes buffered");
                let take = piece.len().min(span.len as usize);
                s.write_span(&span, allowed, &piece[..take])
                    .map_err(|e| rx.direct_lost(e))?;
                rx.direct_placed(&piece[..take]);
                direct += take;
                piece = &piece[take..];
                continue;
            }
            buf.extend_from_slice(piece);
            piece = &[];
            let (used, r) = rx.handle(s, &buf);
            buf.drain(..used);
            r?;
        }
    }
    assert!(buf.is_empty(), "{} bytes left over", buf.len());
    assert!(rx.direct().is_none(), "a payload is still being placed");
    Ok(direct)
}

/// `params(crc)`, placing payloads of 16 bytes and more in place.
fn inplace(crc: bool) -> Params {
    Params {
        inplace_min: 16,
        ..params(crc)
    }
}

fn run(s: &mut Sim, p: Params, stream: &[u8]) -> Result<(), Fail> {
    let mut rx = Receiver::new(p);
    feed(&mut rx, s, stream, stream.len()).map(|_| ())
}

fn post(s: &mut Sim, wr_id: u64, sges: &[(u64, u32)]) {
    s.recvs.push_back(SimRecv {
        wr_id,
        sges: sges.iter().map(|&(to, len)| (LOC, to, len)).collect(),
    });
}

/// The cause of the Terminate a failure carries, and its body.
fn cause(f: &Fail) -> (Cause, TerminateRepr<'_>) {
    let body = f
        .term
        .as_deref()
        .unwrap_or_else(|| panic!("no Terminate: {f:?}"));
    let t = TerminateRepr::parse_bytes(body).expect("a well-formed Terminate");
    // Nothing follows what the Terminate's fields say it holds.
    assert_eq!(body.len(), t.buffer_len(), "the Terminate's length: {f:?}");
    (Cause::new(t.layer, t.etype, t.ecode), t)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_send_in_segments_fills_its_sges_in_order_and_completes_once() {
    for crc in [false, true] {
        let mut s = sim();
        post(&mut s, 7, &[(12288, 100), (13000, 2000)]);
        let data = pattern(1500, 3);
        let mut peer = Peer::new(crc);
        run(&mut s, params(crc), &peer.send(&data, 333)).unwrap();
        assert_eq!(s.bytes(LOC, 12288, 100), &data[..100]);
        assert_eq!(s.bytes(LOC, 13000, 1400), &data[100..]);
        assert_eq!(
            s.bytes(LOC, 14400, 4),
            &[0xee; 4],
            "nothing past the message"
        );
        assert_eq!(
            s.completed,
            vec![(
                7,
                RecvOutcome::Done(RecvCompletion {
                    byte_len: 1500,
                    ..Default::default()
                })
            )]
        );
    }
}

#[test]
fn any_segmentation_of_the_stream_gives_the_same_result() {
    let mut peer = Peer::new(true);
    let mut stream = peer.send(&pattern(300, 1), 100);
    stream.extend(peer.tagged(
        rdmap::Opcode::Write,
        BUF,
        BUF_IOVA + 10,
        true,
        &pattern(200, 2),
    ));
    stream.extend(peer.send(&pattern(10, 3), 100));
    let whole = {
        let mut s = sim();
        post(&mut s, 1, &[(12288, 512)]);
        post(&mut s, 2, &[(13000, 512)]);
        run(&mut s, params(true), &stream).unwrap();
        s
    };
    for p in [params(true), inplace(true)] {
        let mut direct = 0;
        for chunk in 1..40 {
            let mut s = sim();
            post(&mut s, 1, &[(12288, 512)]);
            post(&mut s, 2, &[(13000, 512)]);
            let mut rx = Receiver::new(p);
            direct += feed(&mut rx, &mut s, &stream, chunk).unwrap();
            assert_eq!(s.arena, whole.arena, "chunk {chunk}");
            assert_eq!(s.completed, whole.completed, "chunk {chunk}");
        }
        // The Write's payload went in place once its header was there.
        assert_eq!(direct > 0, p.inplace_min > 0);
    }
}

#[test]
fn memory_the_driver_cannot_place_in_place_takes_the_buffered_path() {
    // A large Write to a buffer the driver reaches only by copying
    // (on-demand paging memory in the provider): nothing of it is placed in
    // place, and it lands all the same, in any segmentation.
    let peer = Peer::new(true);
    let write = pattern(900, 4);
    let stream = peer.tagged(rdmap::Opcode::Write, BUF, BUF_IOVA + 5, true, &write);
    for chunk in [1, 37, 5000] {
        let mut s = sim();
        s.copied_only.push(BUF);
        let mut rx = Receiver::new(inplace(true));
        let direct = feed(&mut rx, &mut s, &stream, chunk).unwrap();
        assert_eq!(direct, 0, "chunk {chunk}");
        assert_eq!(s.bytes(BUF, BUF_IOVA + 5, 900), &write[..], "chunk {chunk}");
    }
}

#[test]
fn a_payload_placed_in_place_is_checked_against_its_crc_and_its_read() {
    // A Write and the Read Response of a pending Read, placed in place, each
    // delivered in pieces: they land as buffered ones do, the Read completes.
    let peer = Peer::new(true);
    let write = pattern(900, 4);
    let resp = pattern(600, 6);
    let mut stream = peer.tagged(rdmap::Opcode::Write, BUF, BUF_IOVA + 5, true, &write);
    stream.extend(peer.tagged(rdmap::Opcode::ReadResponse, 0x999, 0x5000, true, &resp));
    let pending = || {
        Outstanding::Read(PendingRead {
            sq_idx: 7,
            sink_stag: 0x999,
            sink_to: 0x5000,
            sink: vec![(LOC, 12288, 100), (LOC, 14000, 500)],
            length: 600,
            received: 0,
        })
    };
    let mut s = sim();
    s.orq.push_back(pending());
    let mut rx = Receiver::new(inplace(true));
    let direct = feed(&mut rx, &mut s, &stream, 37).unwrap();
    assert!(direct > 1000, "{direct} bytes placed in place");
    assert_eq!(s.bytes(BUF, BUF_IOVA + 5, 900), &write[..]);
    assert_eq!(s.bytes(LOC, 12288, 100), &resp[..100]);
    assert_eq!(s.bytes(LOC, 14000, 500), &resp[100..]);
    assert_eq!(s.answered, vec![(7, None)]);

    // A payload byte corrupted: the CRC at the trailer catches it, and the
    // stream ends with the MPA CRC Terminate; the Read is not answered.
    let mut bad = stream.clone();
    bad[40] ^= 0x10;
    let mut s = sim();
    s.orq.push_back(pending());
    let mut rx = Receiver::new(inplace(true));
    let f = feed(&mut rx, &mut s, &bad, 37).unwrap_err();
    assert_eq!(cause(&f).0, Cause::MPA_CRC, "{}", f.why);
    assert!(s.answered.is_empty());

    // Sink memory gone while the payload comes: a local protection error.
    let write_len = mpa::peek_fpdu_len(&stream).unwrap();
    let mut s = sim();
    s.orq.push_back(pending());
    let mut rx = Receiver::new(inplace(true));
    let mut buf = stream[..write_len + 100].to_vec();
    let (used, r) = rx.handle(&mut s, &buf);
    r.unwrap();
    buf.drain(..used);
    assert!(buf.is_empty());
    let (span, allowed) = rx.direct().expect("the response is being placed");
    assert_eq!(span.stag, LOC);
    xiw_engine::recv::Host::invalidate(&mut s, LOC).unwrap();
    let e = s.write_span(&span, allowed, &[0; 4]).unwrap_err();
    let f = rx.direct_lost(e);
    assert_eq!(f.sq_status, Some(Status::LocalProtection));
    assert!(rx.direct().is_none());
}

#[test]
fn messages_complete_in_the_order_they_arrive() {
    let mut s = sim();
    for i in 0..5 {
        post(&mut s, i, &[(12288 + i * 100, 100)]);
    }
    let mut peer = Peer::new(false);
    let mut stream = Vec::new();
    for i in 0..5 {
        stream.extend(peer.send(&[i as u8; 10], 4));
    }
    run(&mut s, params(false), &stream).unwrap();
    let ids: Vec<u64> = s.completed.iter().map(|c| c.0).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
}

/// A Send with Solicited Event (and Immediate Data with Solicited Event)
/// completes its receive marked solicited; a plain Send does not.
#[test]
fn solicited_sends_are_marked() {
    let mut s = sim();
    for i in 0..3 {
        post(&mut s, i, &[(12288 + i * 100, 100)]);
    }
    let mut peer = Peer::new(false);
    let mut stream = peer.send(&[1; 10], 4);
    stream.extend(peer.message(rdmap::Opcode::SendSolicited, ddp::QN_SEND, 0, &[2; 10], 4));
    let mut imm = [0u8; 8];
    imm[4..].copy_from_slice(&7u32.to_ne_bytes());
    stream.extend(peer.message(
        rdmap::Opcode::ImmediateDataSolicited,
        ddp::QN_SEND,
        0,
        &imm,
        64,
    ));
    run(&mut s, params(false), &stream).unwrap();
    let se: Vec<(u64, bool)> = s
        .completed
        .iter()
        .map(|(id, c)| match c {
            RecvOutcome::Done(d) => (*id, d.solicited),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(se, vec![(0, false), (1, true), (2, true)]);
}

#[test]
fn an_rdma_write_lands_only_where_it_was_aimed() {
    let mut s = sim();
    let before = s.arena.clone();
    let peer = Peer::new(false);
    let data = pattern(700, 9);
    run(
        &mut s,
        params(false),
        &peer.tagged(rdmap::Opcode::Write, BUF, BUF_IOVA + 100, true, &data),
    )
    .unwrap();
    assert_eq!(s.bytes(BUF, BUF_IOVA + 100, 700), &data[..]);
    let at = 64 + 100;
    assert_eq!(&s.arena[..at], &before[..at]);
    assert_eq!(&s.arena[at + 700..], &before[at + 700..]);
    assert!(s.completed.is_empty(), "a Write consumes no receive");
}

#[test]
fn write_with_immediate_completes_a_receive_with_the_write_length() {
    let mut s = sim();
    post(&mut s, 42, &[(12288, 16)]);
    let mut peer = Peer::new(false);
    let mut stream = peer.tagged(rdmap::Opcode::Write, BUF, BUF_IOVA, false, &[1; 64]);
    stream.extend(peer.tagged(rdmap::Opcode::Write, BUF, BUF_IOVA + 64, true, &[2; 36]));
    let mut imm = [0u8; 8];
    imm[4..].copy_from_slice(&0xabcd_u32.to_ne_bytes());
    stream.extend(peer.message(rdmap::Opcode::ImmediateData, ddp::QN_SEND, 0, &imm, 64));
    run(&mut s, params(false), &stream).unwrap();
    assert_eq!(
        s.completed,
        vec![(
            42,
            RecvOutcome::Done(RecvCompletion {
                byte_len: 100,
                imm: Some(0xabcd),
                invalidated: None,
                after_write: true,
                solicited: false,
            })
        )]
    );
}

#[test]
fn an_xiw_peers_immediate_rides_with_the_send_that_follows() {
    let mut s = sim();
    post(&mut s, 1, &[(12288, 64)]);
    let mut peer = Peer::new(false);
    let mut imm = [0u8; 8];
    imm[4..].copy_from_slice(&77u32.to_ne_bytes());
    let mut stream = peer.message(rdmap::Opcode::ImmediateData, ddp::QN_SEND, 0, &imm, 64);
    stream.extend(peer.send(b"hello", 64));
    run(
        &mut s,
        Params {
            merge_imm: true,
            ..params(false)
        },
        &stream,
    )
    .unwrap();
    assert_eq!(
        s.completed,
        vec![(
            1,
            RecvOutcome::Done(RecvCompletion {
                byte_len: 5,
                imm: Some(77),
                ..Default::default()
            })
        )]
    );
}

/// Responses that carry no payload (Flush, Atomic Write) and the Atomic
/// Response of RFC 7306 are refused with anything behind their fields.
#[test]
fn responses_of_a_fixed_size_carry_nothing_more() {
    for (op, extra, outstanding) in [
        (
            rdmap::Opcode::FlushResponse,
            2,
            Outstanding::Flush { sq_idx: 4 },
        ),
        (
            rdmap::Opcode::AtomicWriteResponse,
            8,
            Outstanding::AtomicWrite { sq_idx: 4 },
        ),
        (
            rdmap::Opcode::AtomicResponse,
            atomic::RESPONSE_LEN + 4,
            Outstanding::Atomic {
                sq_idx: 4,
                request_id: 0,
                result: vec![(LOC, 12288, 8)],
            },
        ),
    ] {
        let mut s = sim();
        s.orq.push_back(outstanding);
        let mut p = Peer::new(true);
        p.msn[3] = 1;
        let frame = p.message(op, ddp::QN_ATOMIC_RESPONSE, 0, &vec![0; extra], 64);
        let f = run(&mut s, params(true), &frame).unwrap_err();
        assert_eq!(
            cause(&f).0,
            Cause::DDP_LOCAL_CATASTROPHIC,
            "{op:?}: {}",
            f.why
        );
        assert!(s.answered.is_empty(), "{op:?} answered");
    }
}

#[test]
fn read_responses_fill_the_oldest_read_and_complete_it() {
    let mut s = sim();
    s.orq.push_back(Outstanding::Read(PendingRead {
        sq_idx: 3,
        sink_stag: 0x999,
        sink_to: 0x5000,
        sink: vec![(LOC, 12288, 300), (LOC, 14000, 300)],
        length: 600,
        received: 0,
    }));
    s.orq.push_back(Outstanding::Flush { sq_idx: 4 });
    let peer = Peer::new(true);
    let data = pattern(600, 5);
    let mut stream = peer.tagged(
        rdmap::Opcode::ReadResponse,
        0x999,
        0x5000,
        false,
        &data[..250],
    );
    stream.extend(peer.tagged(
        rdmap::Opcode::ReadResponse,
        0x999,
        0x5000 + 250,
        true,
        &data[250..],
    ));
    let mut p2 = Peer::new(true);
    p2.msn[3] = 1;
    stream.extend(p2.message(
        rdmap::Opcode::FlushResponse,
        ddp::QN_ATOMIC_RESPONSE,
        0,
        &[],
        64,
    ));
    run(&mut s, params(true), &stream).unwrap();
    assert_eq!(s.bytes(LOC, 12288, 300), &data[..300]);
    assert_eq!(s.bytes(LOC, 14000, 300), &data[300..]);
    assert_eq!(s.answered, vec![(3, None), (4, None)]);
    assert!(s.orq.is_empty());
}

#[test]
fn queue1_requests_are_checked_then_queued_in_order_within_ird() {
    let mut s = sim();
    s.ird = 2;
    let mut peer = Peer::new(false);
    let mut stream = peer.read_request(0x77, 0, 100, BUF, BUF_IOVA);
    stream.extend(peer.atomic(atomic::AtomicRequestRepr::fetch_add(
        9,
        BUF,
        BUF_IOVA + 8,
        1,
    )));
    run(&mut s, params(false), &stream).unwrap();
    assert!(matches!(s.irq[0], Inbound::Read(r) if r.len == 100 && r.sink_stag == 0x77));
    assert!(matches!(s.irq[1], Inbound::Atomic { req, .. } if req.request_id == 9));
    // A third one exceeds the IRD the peer was given.
    let mut rx = Receiver::new(params(false));
    let mut s2 = sim();
    s2.ird = 2;
    let mut p = Peer::new(false);
    let mut st = Vec::new();
    for _ in 0..3 {
        st.extend(p.read_request(0x77, 0, 8, BUF, BUF_IOVA));
    }
    let f = feed(&mut rx, &mut s2, &st, st.len()).unwrap_err();
    assert_eq!(cause(&f).0, Cause::DDP_U_INVALID_MSN_NO_BUFFER);
}

#[test]
fn a_zero_length_read_needs_no_valid_source() {
    let mut s = sim();
    let mut peer = Peer::new(false);
    run(
        &mut s,
        params(false),
        &peer.read_request(0x77, 0, 0, 0xdead, 0),
    )
    .unwrap();
    assert!(matches!(s.irq[0], Inbound::Read(r) if r.len == 0));
}

#[test]
fn a_responders_first_fpdu_opens_its_transmit_side() {
    let mut s = sim();
    let peer = Peer::new(true);
    let rtr = peer.tagged(rdmap::Opcode::Write, 0, 0, true, &[]);
    run(
        &mut s,
        Params {
            rtr: mpa::Rtr::ZeroLengthWrite,
            ..params(true)
        },
        &rtr,
    )
    .unwrap();
    assert!(s.may_transmit);
    assert!(s.completed.is_empty());
}

#[test]
fn an_agreed_zero_length_send_is_taken_by_the_stream_not_a_receive() {
    let mut s = sim();
    post(&mut s, 9, &[(12288, 100)]);
    let mut peer = Peer::new(true);
    // The ready-to-receive message takes MSN 1 of queue 0; the application's
    // first Send is MSN 2 and lands in the first receive.
    let mut stream = peer.send(&[], 64);
    stream.extend(peer.send(&pattern(40, 5), 64));
    let p = Params {
        rtr: mpa::Rtr::ZeroLengthSend,
        ..params(true)
    };
    run(&mut s, p, &stream).unwrap();
    assert!(s.may_transmit);
    assert_eq!(s.bytes(LOC, 12288, 40), &pattern(40, 5)[..]);
    assert_eq!(
        s.completed,
        vec![(
            9,
            RecvOutcome::Done(RecvCompletion {
                byte_len: 40,
                ..Default::default()
            })
        )]
    );
}

#[test]
fn a_first_fpdu_other_than_the_agreed_zero_length_send_is_refused() {
    let p = Params {
        rtr: mpa::Rtr::ZeroLengthSend,
        ..params(true)
    };
    for (name, frame) in [
        (
            "a zero-length Write",
            Peer::new(true).tagged(rdmap::Opcode::Write, 0, 0, true, &[]),
        ),
        ("a Send with payload", Peer::new(true).send(b"data", 64)),
        (
            "a zero-length Send at MSN 2",
            Peer::new(true).untagged_at(rdmap::Opcode::Send, ddp::QN_SEND, 2, 0, true, 0, &[]),
        ),
    ] {
        let mut s = sim();
        post(&mut s, 1, &[(12288, 100)]);
        let f = run(&mut s, p, &frame).expect_err(name);
        assert_eq!(cause(&f).0, Cause::MPA_NO_MATCHING_RTR, "{name}");
        assert!(s.completed.is_empty(), "{name}: no receive taken");
    }
}

#[test]
fn a_peer_terminate_names_the_status_of_the_oldest_request() {
    let mut s = sim();
    let mut peer = Peer::new(false);
    // An access rights violation, as the peer found it.
    let body = Fail::terminate(Cause::RDMAP_PROT_ACCESS_RIGHTS, None, None, "")
        .term
        .unwrap();
    let stream = peer.message(rdmap::Opcode::Terminate, ddp::QN_TERMINATE, 0, &body, 64);
    let f = run(&mut s, params(false), &stream).unwrap_err();
    assert!(f.term.is_none(), "a Terminate is not answered with one");
    assert_eq!(f.sq_status, Some(Status::RemoteAccess));
    assert_eq!(f.event, Event::QpAccessError);
}

/// One bad frame after a good Send: the Terminate's cause, what it copies,
/// and what the receive in progress ends with.
#[derive(Clone)]
struct Case {
    name: &'static str,
    cause: Cause,
    frame: fn(&mut Peer) -> Vec<u8>,
    ddp_copied: bool,
    rdmap_copied: bool,
    recv: Option<Status>,
}

fn cases() -> Vec<Case> {
    use rdmap::Opcode as Op;
    let c = |name, cause, frame: fn(&mut Peer) -> Vec<u8>| Case {
        name,
        cause,
        frame,
        ddp_copied: true,
        rdmap_copied: false,
        recv: None,
    };
    vec![
        Case {
            ddp_copied: false,
            ..c("bad CRC", Cause::MPA_CRC, |p| {
                let mut f = p.send(b"x", 64);
                let n = f.len();
                f[n - 1] ^= 1;
                f
            })
        },
        c("tagged DDP version", Cause::DDP_T_INVALID_VERSION, |p| {
            let mut f = p.tagged(Op::Write, BUF, BUF_IOVA, true, b"x");
            f[2] ^= 0x01;
            p.reseal(f)
        }),
        c(
            "tagged DDP version 0, not last",
            Cause::DDP_T_INVALID_VERSION,
            |p| {
                // The control byte of a Write's header: T set, L clear, DV 0.
                let mut f = p.tagged(Op::Write, BUF, BUF_IOVA, false, b"x");
                f[2] = ddp::FLAG_TAGGED;
                p.reseal(f)
            },
        ),
        c("untagged DDP version", Cause::DDP_U_INVALID_VERSION, |p| {
            let mut f = p.send(b"x", 64);
            f[2] ^= 0x01;
            p.reseal(f)
        }),
        c("RDMAP version", Cause::RDMAP_OP_INVALID_VERSION, |p| {
            let mut f = p.send(b"x", 64);
            f[3] ^= 0x80;
            p.reseal(f)
        }),
        c("queue number", Cause::DDP_U_INVALID_QN, |p| {
            p.untagged_at(Op::Send, 4, 1, 0, true, 0, b"x")
        }),
        c("MSN", Cause::DDP_U_INVALID_MSN_RANGE, |p| {
            p.untagged_at(Op::Send, 0, 9, 0, true, 0, b"x")
        }),
        c("first MO", Cause::DDP_U_INVALID_MO, |p| {
            p.untagged_at(Op::Send, 0, p.msn[0], 4, true, 0, b"x")
        }),
        c("no receive", Cause::DDP_U_INVALID_MSN_NO_BUFFER, |p| {
            p.send(b"x", 64)
        }),
        Case {
            recv: Some(Status::LocalLength),
            ..c("too long", Cause::DDP_U_MSG_TOO_LONG, |p| {
                p.send(&[1; 300], 100)
            })
        },
        c("write STag", Cause::DDP_T_INVALID_STAG, |p| {
            p.tagged(Op::Write, 0x4242, 0, true, b"x")
        }),
        c("write bounds", Cause::DDP_T_BASE_BOUNDS, |p| {
            p.tagged(Op::Write, BUF, BUF_IOVA + 4090, true, b"12345678")
        }),
        c("write rights", Cause::RDMAP_PROT_ACCESS_RIGHTS, |p| {
            p.tagged(Op::Write, RO, 0x20000, true, b"x")
        }),
        c("write wrap", Cause::DDP_T_TO_WRAP, |p| {
            p.tagged(Op::Write, BUF, u64::MAX - 1, true, b"1234")
        }),
        Case {
            rdmap_copied: true,
            ..c("read source", Cause::RDMAP_PROT_INVALID_STAG, |p| {
                p.read_request(1, 0, 8, 0x4242, 0)
            })
        },
        Case {
            rdmap_copied: true,
            ..c("read rights", Cause::RDMAP_PROT_ACCESS_RIGHTS, |p| {
                p.read_request(1, 0, 8, LOC, 12288)
            })
        },
        c(
            "unexpected read response",
            Cause::RDMAP_OP_UNEXPECTED_OPCODE,
            |p| p.tagged(Op::ReadResponse, 1, 0, true, b"x"),
        ),
        c(
            "misaligned atomic",
            Cause::RDMAP_OP_CATASTROPHIC_STREAM,
            |p| {
                p.atomic(atomic::AtomicRequestRepr::fetch_add(
                    1,
                    BUF,
                    BUF_IOVA + 4,
                    1,
                ))
            },
        ),
        c("atomic rights", Cause::RDMAP_PROT_ACCESS_RIGHTS, |p| {
            p.atomic(atomic::AtomicRequestRepr::fetch_add(1, RO, 0x20000, 1))
        }),
        c(
            "immediate length",
            Cause::RDMAP_OP_CATASTROPHIC_STREAM,
            |p| p.message(Op::ImmediateData, 0, 0, &[0; 4], 64),
        ),
        c(
            "atomic write length",
            Cause::RDMAP_OP_CATASTROPHIC_STREAM,
            |p| {
                let req = commit::AtomicWriteRequestRepr {
                    stag: BUF,
                    length: 4,
                    to: BUF_IOVA,
                    data: [0; 8],
                };
                let mut b = vec![0u8; req.buffer_len()];
                req.emit(&mut commit::AtomicWriteRequestPacket::new_unchecked(
                    &mut b[..],
                ));
                p.message(Op::AtomicWriteRequest, 1, 0, &b, 64)
            },
        ),
        c("read request length", Cause::DDP_LOCAL_CATASTROPHIC, |p| {
            // A valid Read Request of 8 bytes, with 4 more behind it.
            let req = rdmap::ReadRequestRepr {
                sink_stag: 1,
                sink_to: 0,
                size: 8,
                src_stag: BUF,
                src_to: BUF_IOVA,
            };
            let mut b = vec![0u8; rdmap::READ_REQUEST_LEN + 4];
            req.emit(&mut rdmap::ReadRequestPacket::new_unchecked(&mut b[..]));
            p.message(Op::ReadRequest, ddp::QN_READ_REQUEST, 0, &b, 64)
        }),
        c(
            "atomic request length",
            Cause::DDP_LOCAL_CATASTROPHIC,
            |p| {
                let req = atomic::AtomicRequestRepr::fetch_add(1, BUF, BUF_IOVA, 1);
                let mut b = vec![0u8; req.buffer_len() + 8];
                req.emit(&mut atomic::RequestPacket::new_unchecked(&mut b[..]));
                p.message(Op::AtomicRequest, ddp::QN_READ_REQUEST, 0, &b, 1 << 16)
            },
        ),
        c(
            "unexpected flush response",
            Cause::RDMAP_OP_UNEXPECTED_OPCODE,
            |p| p.message(Op::FlushResponse, 3, 0, &[], 64),
        ),
        Case {
            recv: Some(Status::RemoteAccess),
            ..c(
                "invalidate",
                Cause::RDMAP_PROT_STAG_CANNOT_INVALIDATE,
                |p| p.message(Op::SendInvalidate, 0, 0x4242, b"x", 64),
            )
        },
    ]
}

#[test]
fn every_violation_ends_in_its_terminate_with_the_headers_copied() {
    // Whole, and in pieces with payloads placed in place: the same Terminate.
    for (case, inplace_min, chunk) in cases()
        .into_iter()
        .flat_map(|c| [(c.clone(), 0, usize::MAX), (c, 1, 5)])
    {
        let mut s = sim();
        post(&mut s, 1, &[(12288, 16)]);
        if case.recv.is_some() {
            post(&mut s, 2, &[(12400, 200)]);
        }
        let mut peer = Peer::new(true);
        let stream = peer.send(b"good", 64);
        let bad = (case.frame)(&mut peer);
        let crc = peer.crc;
        let before = s.arena.clone();
        let mut rx = Receiver::new(Params {
            inplace_min,
            ..params(crc)
        });
        feed(&mut rx, &mut s, &stream, stream.len()).unwrap();
        let f = feed(&mut rx, &mut s, &bad, chunk).unwrap_err();
        let (got, t) = cause(&f);
        assert_eq!(got, case.cause, "{}: {}", case.name, f.why);
        assert_eq!(
            t.hdrct_d, case.ddp_copied,
            "{}: DDP header copied",
            case.name
        );
        assert_eq!(
            t.hdrct_r, case.rdmap_copied,
            "{}: RDMAP header copied",
            case.name
        );
        if case.ddp_copied {
            // The copy is the offending (last) segment's own DDP header.
            let mut at = 0;
            while at + mpa::peek_fpdu_len(&bad[at..]).unwrap() < bad.len() {
                at += mpa::peek_fpdu_len(&bad[at..]).unwrap();
            }
            let ulpdu = &bad[at + 2..];
            // The header alone, as long as its T bit says (RFC 5041 section
            // 7.2): never payload.
            let hlen = if ulpdu[0] & ddp::FLAG_TAGGED != 0 {
                ddp::TAGGED_HDR_LEN
            } else {
                ddp::UNTAGGED_HDR_LEN
            };
            assert_eq!(t.ddp_header, &ulpdu[..hlen], "{}", case.name);
        }
        assert_eq!(
            s.completed[0],
            (
                1,
                RecvOutcome::Done(RecvCompletion {
                    byte_len: 4,
                    ..Default::default()
                })
            )
        );
        match case.recv {
            Some(st) => assert_eq!(
                s.completed.get(1),
                Some(&(2, RecvOutcome::Failed(st))),
                "{}",
                case.name
            ),
            None => assert_eq!(s.completed.len(), 1, "{}", case.name),
        }
        // Nothing but the good Send and (for the long one) the failed receive
        // touched memory.
        for (i, (a, b)) in s.arena.iter().zip(&before).enumerate() {
            if a != b {
                assert!(
                    (12288..12288 + 4).contains(&i) || (12400..12600).contains(&i),
                    "{}: byte {i} changed",
                    case.name
                );
            }
        }
    }
}

/// The opcodes of messages that reference a tagged buffer (RFC 5040
/// sections 5.1 and 5.2.2), and of those that reference an untagged one on
/// the queue their opcode names (sections 5.2.1, 5.3 and 5.4, RFC 7306
/// sections 5.2 and 6, draft-talpey-rdma-commit section 3.1).
const TAGGED_OPS: [rdmap::Opcode; 2] = [rdmap::Opcode::Write, rdmap::Opcode::ReadResponse];
const UNTAGGED_OPS: [rdmap::Opcode; 16] = {
    use rdmap::Opcode as Op;
    [
        Op::Send,
        Op::SendInvalidate,
        Op::SendSolicited,
        Op::SendSolicitedInvalidate,
        Op::ReadRequest,
        Op::Terminate,
        Op::ImmediateData,
        Op::ImmediateDataSolicited,
        Op::AtomicRequest,
        Op::AtomicResponse,
        Op::FlushRequest,
        Op::FlushResponse,
        Op::VerifyRequest,
        Op::VerifyResponse,
        Op::AtomicWriteRequest,
        Op::AtomicWriteResponse,
    ]
};

/// An RDMA Write whose DDP header has the tagged flag clear, built by hand:
/// MPA framing (with or without CRC) around an untagged DDP header on queue
/// 0 with the MSN the queue expects, MO 0, and the Write opcode in the
/// RDMAP control byte. Answered with the RDMAP error "unexpected opcode"
/// (layer RDMAP, remote operation error), the whole 18-octet header it came
/// with copied (D set), never as a tagged buffer error: in the steady state
/// (where the commonest headers are known by their bytes), after a Send and
/// after a ready-to-receive message, as that message itself where a
/// zero-length Write was agreed, with payloads from none to ones placed in
/// place, delivered whole or in pieces. Nothing is placed and no receive or
/// Read completes.
#[test]
fn an_untagged_rdma_write_is_an_unexpected_opcode_with_its_18_octet_header() {
    for (phase, rtr, msn) in [
        ("steady state", mpa::Rtr::None, 1),
        ("after a Send", mpa::Rtr::None, 2),
        (
            "after the agreed zero-length Write",
            mpa::Rtr::ZeroLengthWrite,
            1,
        ),
        (
            "after the agreed zero-length Send",
            mpa::Rtr::ZeroLengthSend,
            2,
        ),
        (
            "as the first FPDU, a zero-length Write agreed",
            mpa::Rtr::ZeroLengthWrite,
            1,
        ),
        (
            "as the first FPDU, a zero-length Read agreed",
            mpa::Rtr::ZeroLengthRead,
            1,
        ),
    ] {
        for crc in [false, true] {
            for n in [0, 1, 2, 8, 15, 16, 17, 100, 1000, 3000] {
                for last in [true, false] {
                    let peer = Peer::new(crc);
                    let mut head = Vec::new();
                    match phase {
                        "after a Send" => head = Peer::new(crc).send(b"good", 64),
                        "after the agreed zero-length Write" => {
                            head = peer.tagged(rdmap::Opcode::Write, 0, 0, true, &[])
                        }
                        "after the agreed zero-length Send" => head = Peer::new(crc).send(&[], 64),
                        _ => {}
                    }
                    let frame = peer.untagged_at(
                        rdmap::Opcode::Write,
                        ddp::QN_SEND,
                        msn,
                        0,
                        last,
                        0,
                        &pattern(n, 7),
                    );
                    let sent = &frame[mpa::LEN_FIELD_LEN..][..ddp::UNTAGGED_HDR_LEN];
                    assert_eq!(sent[0], (last as u8) << 6 | ddp::DDP_VERSION, "T clear");
                    assert_eq!(sent[1], ctrl(rdmap::Opcode::Write));
                    let name = format!("{phase}, crc {crc}, {n} bytes, last {last}");
                    wrong_model(crc, rtr, &head, &frame, sent, &name);
                }
            }
        }
    }
}

/// Every other opcode on a segment of the buffer model its message does not
/// use: a Read Response untagged, and a Send (each variant), Read Request,
/// Terminate, Immediate Data, atomic or commit request or response tagged.
/// Each is the RDMAP "unexpected opcode" error with the whole DDP header it
/// came with copied: 18 octets untagged, 14 tagged (RFC 5040 section 7.2:
/// the opcode must be valid; 4.8: the Terminated DDP Header is the
/// segment's own).
#[test]
fn any_opcode_on_a_segment_of_the_other_buffer_model_is_unexpected() {
    for crc in [false, true] {
        for n in [0, 8, 28, 100, 1000] {
            for op in TAGGED_OPS {
                let frame = Peer::new(crc).untagged_at(op, 0, 1, 0, true, 0, &pattern(n, 3));
                let sent = &frame[2..2 + ddp::UNTAGGED_HDR_LEN];
                wrong_model(
                    crc,
                    mpa::Rtr::None,
                    &[],
                    &frame,
                    sent,
                    &format!("untagged {op:?}"),
                );
            }
            for op in UNTAGGED_OPS {
                let frame = Peer::new(crc).tagged(op, BUF, BUF_IOVA, true, &pattern(n, 3));
                let sent = &frame[2..2 + ddp::TAGGED_HDR_LEN];
                assert_eq!(sent[0] & ddp::FLAG_TAGGED, ddp::FLAG_TAGGED);
                wrong_model(
                    crc,
                    mpa::Rtr::None,
                    &[],
                    &frame,
                    sent,
                    &format!("tagged {op:?}"),
                );
            }
        }
    }
}

/// Feeds `head` (good frames) then `frame` to a receiver with `rtr` awaited
/// (and CRCs if `crc`),
/// whole and in pieces, with payloads placed in place and buffered, a
/// receive posted and a Read outstanding whose sink a tagged segment names,
/// and checks that `frame` ends the stream with the RDMAP "unexpected
/// opcode" Terminate copying `sent`, having placed and completed nothing.
fn wrong_model(crc: bool, rtr: mpa::Rtr, head: &[u8], frame: &[u8], sent: &[u8], name: &str) {
    for inplace_min in [0, 16] {
        for chunk in [usize::MAX, 1, 7, 20] {
            let mut s = sim();
            post(&mut s, 1, &[(12288, 4096)]);
            s.orq.push_back(Outstanding::Read(PendingRead {
                sq_idx: 7,
                sink_stag: BUF,
                sink_to: BUF_IOVA,
                sink: vec![(LOC, 12288, 4000)],
                length: 4000,
                received: 0,
            }));
            let mut rx = Receiver::new(Params {
                rtr,
                inplace_min,
                ..params(crc)
            });
            feed(&mut rx, &mut s, head, chunk).unwrap();
            let (completed, before) = (s.completed.clone(), s.arena.clone());
            let name = format!("{name}, in place from {inplace_min}, pieces of {chunk}");
            let f = feed(&mut rx, &mut s, frame, chunk).expect_err(&name);
            let (got, t) = cause(&f);
            assert_eq!(got, Cause::RDMAP_OP_UNEXPECTED_OPCODE, "{name}: {}", f.why);
            assert_eq!(t.layer, xiw_engine::wire::terminate::LAYER_RDMAP);
            assert_eq!(
                t.etype,
                xiw_engine::wire::terminate::RDMAP_ETYPE_REMOTE_OPERATION
            );
            assert_eq!(
                t.ecode,
                xiw_engine::wire::terminate::RDMAP_ECODE_UNEXPECTED_OPCODE
            );
            assert!(t.hdrct_d, "{name}: the DDP header is copied");
            assert!(!t.hdrct_r, "{name}: no RDMA header is copied");
            assert_eq!(t.ddp_header, sent, "{name}: the header as it came");
            assert_eq!(s.arena, before, "{name}: nothing placed");
            assert_eq!(s.completed, completed, "{name}: nothing completed");
            assert!(s.answered.is_empty(), "{name}: the Read is not answered");
            assert!(s.irq.is_empty(), "{name}: nothing queued");
        }
    }
}
