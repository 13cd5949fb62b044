//! The script layer and the CLI: commands and exit codes, documented and example scripts, evcxr
//! display, heads by name, options, the head view in a browser, and the module graph of src/.
//!
//! One test binary (each binary links libtorch, so few binaries link fast): each module is
//! one former `tests/NAME.rs`; helpers and locks shared through `tests/common`.

#[path = "../common/mod.rs"]
mod common;

mod api_guard;
mod cli;
mod doc_examples;
mod evcxr_display;
mod examples;
mod exports;
mod fuzz_api;
mod heads_by_name;
mod hybrid;
mod module_graph;
mod options;
mod texts;
mod view_browser;
