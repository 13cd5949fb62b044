//! headscope: understand and prune the attention heads of Transformer models from Rhai.
//! See ARCHITECTURE.md for the map of the code.

/// A typed option: an enum parsed once at the edge from its script name (with a one-line
/// error listing the accepted names) and printed back by the same name.
macro_rules! options_enum {
    ($name:ident, $what:literal, { $($v:ident = $s:literal),* $(,)? }) => {
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum $name { $($v),* }
        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($s => Ok($name::$v),)*
                    other => Err(format!(concat!("unknown ", $what, " '{}' (expected {})"), other, [$(concat!("\"", $s, "\"")),*].join(" or "))),
                }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $($name::$v => $s),* })
            }
        }
    };
}

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
