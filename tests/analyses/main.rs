//! The analyses: ablation, importance, activation patching, planted heads, the head taxonomy, BLEU.
//!
//! One test binary (each binary links libtorch, so few binaries link fast): each module is
//! one former `tests/NAME.rs`; helpers and locks shared through `tests/common`.

#[path = "../common/mod.rs"]
mod common;

mod ablation;
mod bleu;
mod duo;
mod importance;
mod labels;
mod patching;
mod planted_heads;
mod sinks;
mod strategies;
mod streaming;
mod taxonomy;
mod tiles;
