//! Relevance: LRP (conservation, the reference implementation) and AttnLRP (LXT, seeds).
//!
//! One test binary (each binary links libtorch, so few binaries link fast): each module is
//! one former `tests/NAME.rs`; helpers and locks shared through `tests/common`.

#[path = "../common/mod.rs"]
mod common;

mod attnlrp;
mod attnlrp_seeds;
mod lrp;
mod lrp_reference;
