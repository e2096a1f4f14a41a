//! Arbitrary bytes as a DDP segment with its RDMAP header: decoding never
//! panics, and what decodes re-encodes to the same header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xiw_engine::wire::{ddp, rdmap, terminate};

fuzz_target!(|data: &[u8]| {
    let _ = ddp::is_tagged(data);
    let _ = ddp::header_len(data);
    if let Ok((hdr, len)) = ddp::HeaderRepr::parse(data) {
        assert!(len <= data.len());
        let mut out = vec![0u8; len];
        assert_eq!(hdr.emit(&mut out), len);
        let (again, len2) = ddp::HeaderRepr::parse(&out).expect("own header");
        assert_eq!((again, len2), (hdr, len));
        let ctrl = rdmap::Ctrl::from_byte(hdr.rdmap_ctrl);
        let _ = rdmap::Opcode::from_u8(ctrl.opcode);
        let body = &data[len..];
        if let Ok(p) = rdmap::ReadRequestPacket::new_checked(body) {
            let _ = rdmap::ReadRequestRepr::parse(&p);
        }
        let _ = terminate::TerminateRepr::parse_bytes(body);
    }
});
