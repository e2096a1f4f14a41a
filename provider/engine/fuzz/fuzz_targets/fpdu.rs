//! Arbitrary bytes as a stream of FPDUs, with and without CRC: cutting,
//! checking and re-sealing never panic, and a re-sealed ULPDU checks again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xiw_engine::wire::mpa;

fuzz_target!(|data: &[u8]| {
    let [flags, rest @ ..] = data else { return };
    let crc = flags & 1 != 0;
    let mut stream = rest;
    while let Some(len) = mpa::peek_fpdu_len(stream) {
        if stream.len() < len {
            assert!(mpa::check_fpdu(stream, crc).is_err());
            break;
        }
        let (fpdu, tail) = stream.split_at(len);
        stream = tail;
        let Ok(ulpdu) = mpa::check_fpdu(fpdu, crc) else {
            continue;
        };
        assert!(ulpdu.len() + mpa::LEN_FIELD_LEN + mpa::CRC_LEN <= fpdu.len());
        let mut again = vec![0u8; len];
        again[mpa::LEN_FIELD_LEN..mpa::LEN_FIELD_LEN + ulpdu.len()].copy_from_slice(ulpdu);
        let n = mpa::seal_fpdu(&mut again, ulpdu.len(), crc).expect("room for the FPDU");
        assert_eq!(n, len);
        assert_eq!(mpa::check_fpdu(&again, crc).expect("own FPDU"), ulpdu);
    }
});
