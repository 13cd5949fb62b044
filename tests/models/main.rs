//! Numerics of the models: forwards equal to transformers (parity, every HF family, seq2seq), the
//! hook points, masking, parameter counts.
//!
//! One test binary (each binary links libtorch, so few binaries link fast): each module is
//! one former `tests/NAME.rs`; helpers and locks shared through `tests/common`.

#[path = "../common/mod.rs"]
mod common;

mod config_keys;
mod deepseek;
mod deltanet;
mod experts;
mod gguf_real;
mod hf_2025;
mod hf_cache;
mod hf_families;
mod hf_seq2seq;
mod hf_seq2seq_2026;
mod hf_tf5;
mod hooks;
mod hybrid_golden;
mod hybrids;
mod jamba;
mod llama4;
mod mamba2;
mod masking;
mod packing;
mod param_count;
mod parity;
mod placement;
mod run;
mod tiles;
mod toy_mixer;
