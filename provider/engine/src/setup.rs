//! MPA connection setup (RFC 5044 section 7, RFC 6581) as a sans-IO exchange:
//! bytes in, bytes out, and what the two sides agreed.
//!
//! - The initiator ([`Initiator`]) sends a revision 2 Request with the RFC
//!   6581 IRD/ORD block (peer-to-peer, the ready-to-receive messages it can
//!   send) and reads the Reply.
//! - The responder reads the Request ([`FrameReader`], [`Request::parse`]),
//!   lets its caller decide whom it is for, then [`accept`]s it (answering
//!   revision 1 in kind) or [`reject`]s it.
//!
//! Rules: CRC is used if either side asks for it, and a Reply that drops the
//! CRC the initiator asked for is refused (RFC 5044 section 7.1.2); markers are
//! refused both ways (xiw never places them); the responder picks one offered
//! ready-to-receive message it accepts (Write, then Read, then Send) or
//! refuses the connection; each side's ORD is bounded by the other's IRD, and
//! 0 means 0; private data is at most 512 bytes.

use crate::wire::mpa::{self, EnhancedParams, FrameKind, FrameRepr, Rtr, RtrSet};

/// What one side brings to the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// Ask for CRC32c on every FPDU.
    pub crc: bool,
    /// Inbound RDMA Reads (and other queue 1 requests) this side can take.
    pub ird: u16,
    /// Outbound ones it wants to have outstanding.
    pub ord: u16,
    /// Ready-to-receive messages this side can send (initiator) or take (responder).
    pub rtr: RtrSet,
    /// The upper layer's private data (after the IRD/ORD block).
    pub data: Vec<u8>,
}

/// The outcome both sides hold after the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    pub crc: bool,
    pub revision: u8,
    /// RFC 6581 enhanced mode (IRD/ORD exchanged).
    pub enhanced: bool,
    /// The ready-to-receive message the initiator sends first (`Rtr::None`: none;
    /// the responder may then transmit at once).
    pub rtr: Rtr,
    /// This side's IRD and ORD (ORD never above the peer's IRD).
    pub ird: u16,
    pub ord: u16,
    /// The peer's IRD and ORD as it announced them (1 each without enhanced mode).
    pub peer_ird: u16,
    pub peer_ord: u16,
    /// The peer's upper-layer private data.
    pub peer_data: Vec<u8>,
}

/// Why a connection setup failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    #[error("malformed MPA frame: {0}")]
    Malformed(#[from] crate::wire::Error),
    #[error("expected an MPA {0}")]
    WrongKind(&'static str),
    #[error("the peer rejected the connection")]
    Rejected { data: Vec<u8> },
    #[error("the peer asks for MPA markers, which xiw never uses")]
    Markers,
    #[error("the peer's Reply drops the CRC this side asked for")]
    CrcDowngrade,
    #[error("no ready-to-receive message both sides support")]
    NoRtr,
    #[error("private data longer than {} bytes", mpa::MAX_PRIVATE_DATA)]
    TooLong,
}

/// Reads exactly one MPA Request or Reply out of a stream cut anywhere.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// Takes what it needs of `input`: returns the bytes consumed and, once
    /// complete, the frame. Bytes after the frame are left to the caller.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Option<Vec<u8>>), SetupError> {
        let mut used = 0;
        loop {
            let want = self.wanted()?;
            if self.buf.len() == want {
                return Ok((used, Some(std::mem::take(&mut self.buf))));
            }
            let take = (want - self.buf.len()).min(input.len() - used);
            if take == 0 {
                return Ok((used, None));
            }
            self.buf.extend_from_slice(&input[used..used + take]);
            used += take;
        }
    }

    /// How many more bytes the frame in progress needs (known so far).
    pub fn missing(&self) -> Result<usize, SetupError> {
        Ok(self.wanted()? - self.buf.len())
    }

    /// How many bytes the frame in progress needs so far: the header, then
    /// the header and the private data it announces.
    pub fn wanted(&self) -> Result<usize, SetupError> {
        if self.buf.len() < mpa::HEADER_LEN {
            return Ok(mpa::HEADER_LEN);
        }
        let len = mpa::frame_len(&self.buf)
            .ok_or(SetupError::Malformed(crate::wire::Error::Truncated))?;
        if len - mpa::HEADER_LEN > mpa::MAX_PRIVATE_DATA {
            return Err(SetupError::TooLong);
        }
        Ok(len)
    }
}

fn frame(
    kind: FrameKind,
    crc: bool,
    revision: u8,
    block: Option<EnhancedParams>,
    offer: RtrSet,
    data: &[u8],
) -> Result<Vec<u8>, SetupError> {
    let mut pd = Vec::with_capacity(mpa::ENHANCED_LEN + data.len());
    if let Some(b) = block {
        pd.resize(mpa::ENHANCED_LEN, 0);
        b.emit(&mut pd);
        offer.apply(&mut pd);
    }
    pd.extend_from_slice(data);
    if pd.len() > mpa::MAX_PRIVATE_DATA {
        return Err(SetupError::TooLong);
    }
    Ok(emit(&FrameRepr {
        kind,
        markers: false,
        crc,
        reject: false,
        enhanced: block.is_some(),
        revision,
        private_data: &pd,
    }))
}

fn emit(f: &FrameRepr) -> Vec<u8> {
    let mut out = vec![0u8; f.buffer_len()];
    f.emit(&mut mpa::Packet::new_unchecked(&mut out[..]));
    out
}

/// The initiator's side of the exchange.
#[derive(Debug)]
pub struct Initiator {
    local: Local,
    reader: FrameReader,
}

impl Initiator {
    /// Starts the exchange: the Request to send first, and the state that reads the Reply.
    pub fn new(local: Local) -> Result<(Initiator, Vec<u8>), SetupError> {
        let block = EnhancedParams {
            ird: local.ird,
            ord: local.ord,
            peer_to_peer: true,
            rtr: Rtr::None,
        };
        let request = frame(
            FrameKind::Request,
            local.crc,
            mpa::REVISION_2,
            Some(block),
            local.rtr,
            &local.data,
        )?;
        Ok((
            Initiator {
                local,
                reader: FrameReader::default(),
            },
            request,
        ))
    }

    /// Feeds bytes of the Reply: the bytes consumed and, once it is complete and
    /// acceptable, the agreement. Bytes after the Reply belong to the data path.
    pub fn handle(&mut self, input: &[u8]) -> Result<(usize, Option<Agreed>), SetupError> {
        let (used, frame) = self.reader.feed(input)?;
        match frame {
            None => Ok((used, None)),
            Some(f) => self.reply(&f).map(|a| (used, Some(a))),
        }
    }

    /// The whole Reply frame, read by the caller: the agreement, or why not.
    pub fn reply(&self, bytes: &[u8]) -> Result<Agreed, SetupError> {
        let pkt = mpa::Packet::new_checked(bytes)?;
        let rep = FrameRepr::parse(&pkt)?;
        if rep.kind != FrameKind::Reply {
            return Err(SetupError::WrongKind("Reply"));
        }
        if rep.reject {
            return Err(SetupError::Rejected {
                data: rep.ulp_private_data().to_vec(),
            });
        }
        if rep.markers {
            return Err(SetupError::Markers);
        }
        if self.local.crc && !rep.crc {
            return Err(SetupError::CrcDowngrade);
        }
        let (rtr, peer_ird, peer_ord) = match rep.enhanced_params() {
            Some(p) => {
                let p = p?;
                let rtr = if p.peer_to_peer { p.rtr } else { Rtr::None };
                if !self.local.rtr.contains(rtr) {
                    return Err(SetupError::NoRtr);
                }
                (rtr, p.ird, p.ord)
            }
            None => (Rtr::None, 1, 1),
        };
        Ok(Agreed {
            // Equal to "either side asked", the downgrade being refused above.
            crc: rep.crc,
            revision: rep.revision.min(mpa::REVISION_2),
            enhanced: rep.enhanced,
            rtr,
            ird: self.local.ird,
            ord: self.local.ord.min(peer_ird),
            peer_ird,
            peer_ord,
            peer_data: rep.ulp_private_data().to_vec(),
        })
    }
}

/// A Request as the responder reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub crc: bool,
    pub markers: bool,
    pub revision: u8,
    /// The RFC 6581 block, if the initiator sent one.
    pub enhanced: Option<EnhancedParams>,
    /// The ready-to-receive messages offered.
    pub offer: RtrSet,
    /// The initiator's upper-layer private data.
    pub data: Vec<u8>,
}

impl Request {
    /// Decodes one whole Request frame.
    pub fn parse(bytes: &[u8]) -> Result<Request, SetupError> {
        let pkt = mpa::Packet::new_checked(bytes)?;
        let req = FrameRepr::parse(&pkt)?;
        if req.kind != FrameKind::Request {
            return Err(SetupError::WrongKind("Request"));
        }
        let enhanced = req.enhanced_params().transpose()?;
        let offer = match enhanced {
            Some(e) if e.peer_to_peer => RtrSet::parse(req.private_data)?,
            _ => RtrSet::default(),
        };
        Ok(Request {
            crc: req.crc,
            markers: req.markers,
            revision: req.revision,
            enhanced,
            offer,
            data: req.ulp_private_data().to_vec(),
        })
    }
}

/// The responder takes the connection: the Reply to send and the agreement.
/// An error means the connection must be refused (send [`reject`]).
pub fn accept(req: &Request, local: &Local) -> Result<(Vec<u8>, Agreed), SetupError> {
    if req.markers {
        return Err(SetupError::Markers);
    }
    let crc = req.crc || local.crc;
    let revision = req.revision.min(mpa::REVISION_2);
    let (block, rtr, peer_ird, peer_ord, ord) = match req.enhanced {
        Some(e) => {
            let rtr = if !e.peer_to_peer || req.offer == RtrSet::default() {
                Rtr::None
            } else {
                let both = RtrSet {
                    send: req.offer.send && local.rtr.send,
                    write: req.offer.write && local.rtr.write,
                    read: req.offer.read && local.rtr.read,
                };
                match both.preferred() {
                    Rtr::None => return Err(SetupError::NoRtr),
                    r => r,
                }
            };
            let ord = local.ord.min(e.ird);
            let block = EnhancedParams {
                ird: local.ird,
                ord,
                peer_to_peer: e.peer_to_peer,
                rtr,
            };
            (Some(block), rtr, e.ird, e.ord, ord)
        }
        None => (None, Rtr::None, 1, 1, local.ord.min(1)),
    };
    let reply = frame(
        FrameKind::Reply,
        crc,
        revision,
        block,
        RtrSet::default(),
        &local.data,
    )?;
    Ok((
        reply,
        Agreed {
            crc,
            revision,
            enhanced: block.is_some(),
            rtr,
            ird: local.ird,
            ord,
            peer_ird,
            peer_ord,
            peer_data: req.data.clone(),
        },
    ))
}

/// The Reply that refuses a connection (R bit), in the Request's revision.
pub fn reject(revision: u8, data: &[u8]) -> Vec<u8> {
    let data = &data[..data.len().min(mpa::MAX_PRIVATE_DATA)];
    emit(&FrameRepr {
        kind: FrameKind::Reply,
        markers: false,
        crc: false,
        reject: true,
        enhanced: false,
        revision: revision.clamp(mpa::REVISION_1, mpa::REVISION_2),
        private_data: data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn local(crc: bool, ird: u16, ord: u16, rtr: RtrSet) -> Local {
        Local {
            crc,
            ird,
            ord,
            rtr,
            data: b"ulp".to_vec(),
        }
    }

    const WRITE: RtrSet = RtrSet {
        send: false,
        write: true,
        read: false,
    };

    /// Runs the whole exchange, feeding bytes in pieces of `cut`.
    fn exchange(i: Local, r: Local, cut: usize) -> (Result<Agreed, SetupError>, Option<Agreed>) {
        let (mut init, request) = Initiator::new(i).unwrap();
        let mut reader = FrameReader::default();
        let mut frame = None;
        for chunk in request.chunks(cut.max(1)) {
            let (used, f) = reader.feed(chunk).unwrap();
            assert_eq!(used, chunk.len());
            if f.is_some() {
                frame = f;
            }
        }
        let req = Request::parse(&frame.expect("a whole Request")).unwrap();
        let (reply, responder) = match accept(&req, &r) {
            Ok((reply, a)) => (reply, Some(a)),
            Err(_) => (reject(req.revision, &[]), None),
        };
        let mut out = None;
        for chunk in reply.chunks(cut.max(1)) {
            match init.handle(chunk) {
                Ok((_, Some(a))) => out = Some(Ok(a)),
                Ok((_, None)) => {}
                Err(e) => {
                    out = Some(Err(e));
                    break;
                }
            }
        }
        (out.expect("the Reply is complete"), responder)
    }

    #[test]
    fn write_rtr_crc_and_ird_ord() {
        let (i, r) = exchange(local(true, 16, 8, WRITE), local(false, 4, 32, WRITE), 7);
        let i = i.unwrap();
        let r = r.unwrap();
        assert!(i.crc && r.crc);
        assert_eq!((i.rtr, r.rtr), (Rtr::ZeroLengthWrite, Rtr::ZeroLengthWrite));
        assert_eq!((i.ord, r.ord), (4, 16));
        assert_eq!((i.peer_ird, r.peer_ird), (4, 16));
        assert_eq!(i.peer_data, b"ulp");
        assert_eq!(r.peer_data, b"ulp");
    }

    #[test]
    fn ird_zero_means_no_reads() {
        let (i, r) = exchange(local(false, 0, 4, WRITE), local(false, 0, 4, WRITE), 64);
        assert_eq!(i.unwrap().ord, 0);
        assert_eq!(r.unwrap().ord, 0);
    }

    #[test]
    fn only_offered_rtr_is_chosen() {
        let read = RtrSet {
            read: true,
            ..Default::default()
        };
        let (i, r) = exchange(local(false, 1, 1, read), local(false, 1, 1, WRITE), 64);
        assert_eq!(i, Err(SetupError::Rejected { data: vec![] }));
        assert!(r.is_none());
        let both = RtrSet {
            read: true,
            write: true,
            send: true,
        };
        let (i, _) = exchange(local(false, 1, 1, read), local(false, 1, 1, both), 64);
        assert_eq!(i.unwrap().rtr, Rtr::ZeroLengthRead);
    }

    #[test]
    fn crc_downgrade_is_refused() {
        let (mut init, _) = Initiator::new(local(true, 1, 1, WRITE)).unwrap();
        let req = Request {
            crc: false,
            markers: false,
            revision: 2,
            enhanced: Some(EnhancedParams {
                ird: 1,
                ord: 1,
                peer_to_peer: true,
                rtr: Rtr::None,
            }),
            offer: WRITE,
            data: vec![],
        };
        // A responder that ignores the initiator's C bit.
        let (reply, _) = accept(&req, &local(false, 1, 1, WRITE)).unwrap();
        assert_eq!(init.handle(&reply), Err(SetupError::CrcDowngrade));
    }

    #[test]
    fn markers_refused() {
        let mut req = frame(FrameKind::Request, false, 2, None, RtrSet::default(), b"").unwrap();
        req[16] |= mpa::FLAG_MARKERS;
        let r = Request::parse(&req).unwrap();
        assert_eq!(
            accept(&r, &local(false, 1, 1, WRITE)).unwrap_err(),
            SetupError::Markers
        );
    }

    #[test]
    fn revision_1_answered_in_kind() {
        let req = frame(FrameKind::Request, true, 1, None, RtrSet::default(), b"hi").unwrap();
        let r = Request::parse(&req).unwrap();
        let (reply, a) = accept(&r, &local(false, 8, 8, WRITE)).unwrap();
        let pkt = mpa::Packet::new_checked(&reply[..]).unwrap();
        let rep = FrameRepr::parse(&pkt).unwrap();
        assert_eq!((rep.revision, rep.enhanced, rep.crc), (1, false, true));
        assert_eq!(rep.private_data, b"ulp");
        assert_eq!((a.rtr, a.peer_data.as_slice()), (Rtr::None, &b"hi"[..]));
    }

    #[test]
    fn private_data_limit() {
        let mut l = local(false, 1, 1, WRITE);
        l.data = vec![0; 600];
        assert_eq!(Initiator::new(l).unwrap_err(), SetupError::TooLong);
        let mut hdr = frame(FrameKind::Request, false, 2, None, RtrSet::default(), b"").unwrap();
        hdr[18..20].copy_from_slice(&600u16.to_be_bytes());
        assert_eq!(FrameReader::default().feed(&hdr), Err(SetupError::TooLong));
    }

    #[test]
    fn bytes_behind_the_reply_are_left() {
        let (mut init, _) = Initiator::new(local(false, 1, 1, WRITE)).unwrap();
        let r = Request::parse(&Initiator::new(local(false, 1, 1, WRITE)).unwrap().1).unwrap();
        let (mut reply, _) = accept(&r, &local(false, 1, 1, WRITE)).unwrap();
        let n = reply.len();
        reply.extend_from_slice(b"FPDU");
        let (used, a) = init.handle(&reply).unwrap();
        assert_eq!(used, n);
        assert!(a.is_some());
    }

    fn rtr_set() -> impl Strategy<Value = RtrSet> {
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(send, write, read)| RtrSet {
            send,
            write,
            read,
        })
    }

    proptest! {
        /// The whole matrix: both sides agree on CRC, the RTR message and each
        /// other's IRD/ORD, at any segmentation, or the initiator is refused.
        #[test]
        fn both_sides_agree(
            icrc in any::<bool>(), rcrc in any::<bool>(),
            iird in 0u16..200, iord in 0u16..200, rird in 0u16..200, rord in 0u16..200,
            ioffer in rtr_set(), raccept in rtr_set(), cut in 1usize..40,
        ) {
            let (i, r) = exchange(local(icrc, iird, iord, ioffer), local(rcrc, rird, rord, raccept), cut);
            match (i, r) {
                (Ok(i), Some(r)) => {
                    prop_assert_eq!(i.crc, icrc || rcrc);
                    prop_assert_eq!(r.crc, icrc || rcrc);
                    prop_assert_eq!(i.rtr, r.rtr);
                    prop_assert!(ioffer.contains(i.rtr) && raccept.contains(r.rtr));
                    prop_assert_eq!(i.ord, iord.min(rird));
                    prop_assert_eq!(r.ord, rord.min(iird));
                    prop_assert_eq!(i.peer_ird, rird);
                    prop_assert_eq!(r.peer_ird, iird);
                }
                (Err(SetupError::Rejected { .. }), None) => {
                    // Refused only when no offered RTR is accepted.
                    let common = (ioffer.send && raccept.send)
                        || (ioffer.write && raccept.write)
                        || (ioffer.read && raccept.read);
                    prop_assert!(ioffer != RtrSet::default() && !common);
                }
                (i, r) => prop_assert!(false, "disagreement: {:?} / {:?}", i, r),
            }
        }
    }
}
