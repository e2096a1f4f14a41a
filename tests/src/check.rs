//! Small pieces the scenario programs (`xiw-verbs-check`, `xiw-ext-check`)
//! share: reproducible pseudo-random data, the hex of their out-of-band
//! messages, and readable names for statuses, states and completions.

use std::time::{Duration, Instant};

use crate::ibv::{self, sys, Context, Pd, Wc};

/// Fill byte for buffers that must show whether anything was placed in them.
pub const POISON: u8 = 0xa5;

/// SplitMix64: one step of a seedable mixing function.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from a seed and a list of labels.
pub fn mix(seed: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(splitmix(seed), |acc, p| splitmix(acc ^ splitmix(*p)))
}

/// `len` pseudo-random bytes from `seed`.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fastrand::Rng::with_seed(seed).fill(&mut v);
    v
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 == 1 {
        return Err(format!("bad hex {s}"));
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| format!("bad hex {s}")))
        .collect()
}

/// A GID in hex.
pub fn unhex16(s: &str) -> Result<[u8; 16], String> {
    unhex(s)?.try_into().map_err(|_| format!("bad GID {s}"))
}

pub fn status_name(s: u32) -> String {
    format!("{} ({s})", ibv::wc_status_str(s))
}

pub fn state_name(s: u32) -> &'static str {
    match s {
        sys::IBV_QPS_RESET => "RESET",
        sys::IBV_QPS_INIT => "INIT",
        sys::IBV_QPS_RTR => "RTR",
        sys::IBV_QPS_RTS => "RTS",
        sys::IBV_QPS_SQD => "SQD",
        sys::IBV_QPS_SQE => "SQE",
        sys::IBV_QPS_ERR => "ERR",
        _ => "?",
    }
}

/// A completion, every field that tells one from another.
pub fn fmt_wc(w: &Wc) -> String {
    format!(
        "wr_id={:#x} status={} opcode={} byte_len={} qp_num={} wc_flags={:#x} imm={:#x} vendor_err={}",
        w.wr_id,
        status_name(w.status),
        w.opcode,
        w.byte_len,
        w.qp_num,
        w.wc_flags,
        w.imm_data,
        w.vendor_err
    )
}

/// An opened device: its context, a PD, port 1's GID and the device's limits.
pub struct Dev {
    pub ctx: Context,
    pub pd: Pd,
    pub gid: [u8; 16],
    pub attr: ibv::ibv_device_attr,
}

/// Opens `name` (the first device if none) once its port is ACTIVE: a link
/// just brought up (a fresh veth) takes a moment to get its carrier, and the
/// port follows the link.
pub fn open_dev(name: Option<&str>) -> Result<Dev, String> {
    let ctx = Context::open(name).map_err(|e| {
        let names = ibv::device_names().unwrap_or_default();
        format!("opening the RDMA device: {e} (libibverbs sees {names:?}; is SYSFS_PATH set?)")
    })?;
    let wait = Duration::from_secs(10);
    let deadline = Instant::now() + wait;
    loop {
        let port = ctx
            .query_port(1)
            .map_err(|e| format!("ibv_query_port: {e}"))?;
        if port.state == sys::IBV_PORT_ACTIVE {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "port 1 of {} is not active (state {}) after {} s",
                ctx.name(),
                port.state,
                wait.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let gid = ctx
        .query_gid(1, 0)
        .map_err(|e| format!("ibv_query_gid: {e}"))?;
    let attr = ctx
        .query_device()
        .map_err(|e| format!("ibv_query_device: {e}"))?;
    let pd = ctx.alloc_pd().map_err(|e| format!("ibv_alloc_pd: {e}"))?;
    Ok(Dev { ctx, pd, gid, attr })
}
