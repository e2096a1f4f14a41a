//! xiw's own private data in the MPA exchange of standalone mode (after the
//! RFC 6581 block): it names the two QPs and the connection attempt, and
//! says what the sender speaks.

/// Marks xiw's own private data: "xiw1", sender QPN, receiver QPN.
pub const PD_MAGIC: &[u8; 4] = b"xiw1";
pub const PD_LEN: usize = 12;
/// Then, optionally, a word of flags (older xiw sent none: all clear).
pub const PD_FLAGS_LEN: usize = 4;
/// The sender speaks RFC 7306 and the commit draft.
pub const PD_FLAG_EXTENSIONS: u32 = 1 << 0;
/// The sender sends Send with Immediate as Immediate Data directly followed by
/// its Send, and Immediate Data alone only right after an RDMA Write.
pub const PD_FLAG_IMM_PAIRS: u32 = 1 << 1;
/// Then, optionally, the connection attempt's stamp (older xiw sent none: 0).
pub const PD_STAMP_LEN: usize = 8;

/// xiw's private data: magic, sender and receiver QPN, flags, attempt stamp.
pub fn private_data(from: u32, to: u32, flags: u32, stamp: u64) -> Vec<u8> {
    let mut data = vec![0u8; PD_LEN + PD_FLAGS_LEN + PD_STAMP_LEN];
    data[0..4].copy_from_slice(PD_MAGIC);
    data[4..8].copy_from_slice(&from.to_be_bytes());
    data[8..12].copy_from_slice(&to.to_be_bytes());
    data[12..16].copy_from_slice(&flags.to_be_bytes());
    data[16..24].copy_from_slice(&stamp.to_be_bytes());
    data
}

/// What xiw's private data says.
#[derive(Clone, Copy, Debug)]
pub struct Private {
    pub from: u32,
    pub to: u32,
    pub flags: u32,
    pub stamp: u64,
}

/// xiw's own private data (after the RFC 6581 block): magic, sender and
/// receiver QPN, then optionally flags and the attempt stamp.
pub fn parse_xiw(data: &[u8]) -> Option<Private> {
    if data.len() < PD_LEN || &data[..4] != PD_MAGIC {
        return None;
    }
    let word = |at: usize| {
        data.get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
    };
    let at = PD_LEN + PD_FLAGS_LEN;
    let stamp = data
        .get(at..at + PD_STAMP_LEN)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
        .unwrap_or(0);
    Some(Private {
        from: word(4)?,
        to: word(8)?,
        flags: word(PD_LEN).unwrap_or(0),
        stamp,
    })
}
