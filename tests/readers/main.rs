//! Checked readers of untrusted bytes: GGUF, torch pickles, sentencepiece, declared-size limits,
//! the fuzz targets and their corpus.
//!
//! One test binary (each binary links libtorch, so few binaries link fast): each module is
//! one former `tests/NAME.rs`; helpers and locks shared through `tests/common`.

#[path = "../common/mod.rs"]
mod common;

mod fuzz;
mod fuzz_corpus;
mod gguf;
mod gguf_tokenizer;
mod limits;
mod m2m100_tokenizer;
mod marian_tokenizer;
mod token_counts;
mod torch_pickle;
