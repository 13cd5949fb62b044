//! Pruning: gate training, physically pruned models, soft gates.
//!
//! One test binary (each binary links libtorch, so few binaries link fast): each module is
//! one former `tests/NAME.rs`; helpers and locks shared through `tests/common`.

#[path = "../common/mod.rs"]
mod common;

mod prune;
mod pruned;
mod soft_gates;
