//! The interactive frontends as users drive them: the Jupyter kernel (real client, hostile client)
//! and the REPL in a terminal.
//!
//! One test binary (each binary links libtorch, so few binaries link fast): each module is
//! one former `tests/NAME.rs`; helpers and locks shared through `tests/common`.

#[path = "../common/mod.rs"]
mod common;

mod habits;
mod kernel;
mod kernel_hostile;
mod repl_pty;
