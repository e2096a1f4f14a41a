//! xiw: a software iWARP RNIC as an rdma-core (libibverbs) provider.
//!
//! The file names follow the RNIC's parts: `cm` (connection and MPA), `qp` and
//! `qpstate` (queue pairs), `tx` and `rx` (the data path), `mem` (STags), `cq`,
//! `srq`, `verbs` (the C surface), `dv` (the direct verbs of xiwdv.h), `persist`
//! (the medium behind flushable memory), `device` (registration), `wire` (codecs).
#![deny(unsafe_op_in_unsafe_fn)]

mod cm;
pub mod context;
pub mod cq;
pub mod crc;
pub mod device;
pub mod devinfo;
pub mod dv;
pub mod events;
pub mod ibv;
pub mod kernel;
pub mod libibverbs;
pub mod log;
pub mod maps;
pub mod mem;
pub mod netdev;
pub mod odp;
pub mod persist;
pub mod progress;
pub mod qp;
pub mod qpcore;
pub mod qpstate;
pub mod queue;
pub mod rx;
mod sock;
pub mod srq;
pub mod streamev;
pub mod tx;
pub mod verbs;
pub use xiw_engine::wire;
