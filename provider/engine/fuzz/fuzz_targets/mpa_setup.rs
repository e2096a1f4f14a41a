//! Arbitrary bytes as an MPA Request (responder) and as an MPA Reply
//! (initiator), cut at an arbitrary point: never a panic, never more consumed
//! than given, and every agreement keeps the RFC 5044 / RFC 6581 rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xiw_engine::setup::{accept, FrameReader, Initiator, Local, Request};
use xiw_engine::wire::mpa::{self, RtrSet};

fn local(flags: u8) -> Local {
    Local {
        crc: flags & 1 != 0,
        ird: u16::from(flags >> 4),
        ord: u16::from(flags & 0x0e),
        rtr: RtrSet {
            write: true,
            read: flags & 0x80 != 0,
            send: false,
        },
        data: b"xiw".to_vec(),
    }
}

fuzz_target!(|data: &[u8]| {
    let [flags, split, body @ ..] = data else {
        return;
    };
    let me = local(*flags);
    let cut = usize::from(*split).min(body.len());

    let mut reader = FrameReader::default();
    let mut frame = None;
    let mut used = 0;
    for piece in [&body[..cut], &body[cut..]] {
        match reader.feed(piece) {
            Ok((n, f)) => {
                assert!(n <= piece.len());
                used += n;
                if f.is_some() {
                    frame = f;
                    break;
                }
            }
            Err(_) => return,
        }
    }
    if let Some(f) = frame {
        assert!(used <= body.len() && f.len() <= mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA);
        if let Ok(req) = Request::parse(&f) {
            if let Ok((reply, a)) = accept(&req, &me) {
                assert_eq!(a.crc, req.crc || me.crc);
                assert!(me.rtr.contains(a.rtr) && req.offer.contains(a.rtr));
                assert!(a.ord <= me.ord && a.ord <= a.peer_ird);
                let pkt = mpa::Packet::new_checked(&reply[..]).expect("own reply");
                let rep = mpa::FrameRepr::parse(&pkt).expect("own reply parses");
                assert!(!rep.markers && !rep.reject && rep.crc == a.crc);
            }
        }
    }

    let (mut init, _) = Initiator::new(me.clone()).expect("a small request");
    let mut at = 0;
    for piece in [&body[..cut], &body[cut..]] {
        match init.handle(piece) {
            Ok((n, agreed)) => {
                assert!(n <= piece.len());
                at += n;
                if let Some(a) = agreed {
                    assert!(at <= body.len());
                    assert!(a.crc || !me.crc, "a CRC downgrade was accepted");
                    assert!(me.rtr.contains(a.rtr));
                    assert!(a.ord <= me.ord && a.ord <= a.peer_ird);
                    break;
                }
            }
            Err(_) => break,
        }
    }
});
