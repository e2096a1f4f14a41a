//! xiw: a software iWARP RNIC as an rdma-core (libibverbs) provider.
//!
//! The file names follow the RNIC's parts: `qp/` (a queue pair: its state
//! machine, connection setup, receive, transmit and the responder), `mem`
//! (STags), `cq`, `srq`, `wqe` (a work request as the send queue holds it),
//! `verbs` (the C surface), `dv` (the direct verbs of xiwdv.h), `persist`
//! (the medium behind flushable memory), `registration` (the provider's
//! registration with libibverbs), `wire` (codecs), `error` (the provider's
//! error and the errno it is for the verbs), `sys` (its system calls).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod async_event;
pub mod context;
pub mod cq;
pub mod crc;
pub mod dv;
pub mod error;
pub mod events_page;
pub mod kernel;
pub mod log;
pub mod maps;
pub mod mem;
pub mod netdev;
pub mod odp;
pub mod persist;
mod private_data;
pub mod qp;
pub mod queue;
pub mod rdma_core;
pub mod registration;
pub mod srq;
pub mod sys;
pub mod sysfs_tree;
mod tcp;
pub mod verbs;
pub mod verbs_status;
pub mod wqe;
pub use xiw_engine::wire;
