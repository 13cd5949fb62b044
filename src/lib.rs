//! headscope: understand and prune the attention heads of Transformer models from Rhai.
//! See ARCHITECTURE.md for the map of the code.

pub mod analysis;
pub mod assets;
pub mod data;
pub mod device;
pub mod engine;
pub mod kernel;
pub mod metrics;
pub mod model;
pub mod output;
pub mod plot;
pub mod prune;
pub mod repl;
pub mod script;
pub mod table;

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
