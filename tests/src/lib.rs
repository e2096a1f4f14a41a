//! Shared pieces of xiw's whole-program tests: a thin safe layer over the real
//! libibverbs (`ibv`), the harness that brings devices up and runs tool pairs,
//! what the scenario programs share (`check`), and the C test programs
//! (`cprog`).

pub mod check;
pub mod cprog;
pub mod guest;
pub mod harness;
pub mod ibv;
pub mod pyverbs;
