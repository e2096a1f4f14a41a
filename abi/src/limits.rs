//! The device's identity and limits, which the provider reports to
//! applications and the kernel module reports to the RDMA core (the
//! connection manager reads IRD/ORD limits from it): `include/xiw_abi.h`
//! holds the same values, checked by `tests/c_header.rs`.

/// The driver id the kernel module registers its devices under (RDMA core
/// ids of in-tree drivers are small numbers; this one is xiw's own) and the
/// provider's match table claims.
pub const DRIVER_ID: u32 = 0x7869;
/// The uverbs ABI version of an xiw device (`uverbsN/abi_version`).
pub const UVERBS_ABI_VERSION: u32 = 1;
/// Vendor and part ids a device reports.
pub const VENDOR_ID: u32 = 0x787769;
pub const VENDOR_PART_ID: u32 = 1;

pub const MAX_QP: u32 = 16384;
pub const MAX_QP_WR: u32 = 16384;
/// SGEs per work request.
pub const MAX_SGE: u32 = 16;
pub const MAX_INLINE: u32 = 256;
pub const MAX_CQE: u32 = 1 << 20;
pub const MAX_MR: u32 = 1 << 24;
pub const MAX_SRQ: u32 = 16384;
pub const MAX_PD: u32 = 65536;
pub const MAX_MSG_SZ: u32 = 1 << 31;
/// IRD/ORD limit (RFC 6581 allows 14 bits; this is what xiw provisions).
pub const MAX_RD_ATOMIC: u32 = 128;
