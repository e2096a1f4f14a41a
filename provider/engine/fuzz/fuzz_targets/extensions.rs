//! Arbitrary bytes as the bodies of RFC 7306 atomics and immediate data and
//! of the commit draft's Flush, Verify and Atomic Write: decoding never
//! panics, and what decodes re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xiw_engine::wire::{atomic, commit};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = atomic::RequestPacket::new_checked(data) {
        if let Ok(r) = atomic::AtomicRequestRepr::parse(&p) {
            let mut out = data.to_vec();
            r.emit(&mut atomic::RequestPacket::new_unchecked(&mut out[..]));
            let again = atomic::AtomicRequestRepr::parse(
                &atomic::RequestPacket::new_checked(&out[..]).unwrap(),
            );
            assert_eq!(again, Ok(r));
        }
    }
    if let Ok(p) = atomic::ResponsePacket::new_checked(data) {
        let _ = atomic::AtomicResponseRepr::parse(&p);
    }
    if let Ok(p) = atomic::ImmediatePacket::new_checked(data) {
        let _ = atomic::ImmediateDataRepr::parse(&p);
    }
    if let Ok(p) = commit::FlushRequestPacket::new_checked(data) {
        let _ = commit::FlushRequestRepr::parse(&p);
    }
    if let Ok(p) = commit::VerifyRequestPacket::new_checked(data) {
        let _ = commit::VerifyRequestRepr::parse(&p);
    }
    if let Ok(p) = commit::AtomicWriteRequestPacket::new_checked(data) {
        let _ = commit::AtomicWriteRequestRepr::parse(&p);
    }
    let _ = commit::VerifyResponseRepr::parse(data);
});
