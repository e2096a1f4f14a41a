//! Shared pieces of xiw's whole-program tests: a thin safe layer over the real
//! libibverbs (`ibv`) and the harness that brings devices up and runs tool pairs.

pub mod harness;
pub mod ibv;
