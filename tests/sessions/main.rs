//! Long sessions and sharded runs: memory over a session, shards merged, a Slurm cluster.
//!
//! One test binary (each binary links libtorch, so few binaries link fast): each module is
//! one former `tests/NAME.rs`; helpers and locks shared through `tests/common`.

#[path = "../common/mod.rs"]
mod common;

mod sessions;
mod shards;
mod slurm;
mod writes;
