//! headscope: understand and prune the attention heads of Transformer models from Rhai.
//! The numeric core is the `headscope-core` crate (no Rhai); this crate is the script layer
//! (each type's script API), the engine and its frontends. See ARCHITECTURE.md.

// `t += u` on a tch Tensor is the in-place `add_`: it writes through shallow clones and breaks
// autograd (the gates' graph in pruning). Tensors are combined out of place, `t = t + u`.
#![allow(clippy::assign_op_pattern)]

#[macro_use]
extern crate headscope_core;

#[doc(hidden)]
pub use headscope_core::fuzz;
pub use headscope_core::{budget, export, files, one_of, output, run, shard, suggest};

/// The core's modules, each with its script API beside it (`model::script`, ...).
pub mod analysis {
    pub use headscope_core::analysis::*;
    pub mod script;
}
pub mod data {
    pub use headscope_core::data::*;
    pub mod pairs_script;
    pub mod script;
}
pub mod device {
    pub use headscope_core::device::*;
    pub mod script;
}
/// Evaluation metrics.
pub mod metrics {
    pub mod bleu {
        pub use headscope_core::metrics::bleu::*;
        pub mod script;
    }
}
pub mod model {
    pub use headscope_core::model::*;
    pub mod script;
}
pub mod plot {
    pub use headscope_core::plot::*;
    pub mod script;
}
pub mod prune {
    pub use headscope_core::prune::*;
    pub mod script;
    pub mod script_duo;
}
pub mod table {
    pub use headscope_core::table::*;
    pub mod script;
}
pub mod view {
    pub use headscope_core::view::*;
    pub mod script;
}

pub mod api;
pub mod assets;
pub mod engine;
pub mod grid;
pub mod kernel;
pub mod repl;
pub mod script;
/// Routes Ctrl-C to the running evaluation's interrupt (installed once per process). A
/// second Ctrl-C while the first is still pending ends the process (exit 130), for native
/// code that never checks the flag.
pub fn install_ctrlc(interrupt: engine::Interrupt) {
    let _ = ctrlc::set_handler(move || {
        if interrupt.is_set() {
            eprintln!("\ninterrupted twice: exiting");
            std::process::exit(130);
        }
        interrupt.trigger();
    });
}
