//! Shared pieces of xiw's whole-program tests: a thin safe layer over the real
//! libibverbs (`ibv`), the harness that brings devices up and runs tool pairs,
//! and what the scenario programs share (`check`).

pub mod check;
pub mod harness;
pub mod ibv;
pub mod pyverbs;
