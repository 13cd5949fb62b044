//! headscope-core: the numeric core of headscope (models, their one forward and its trace,
//! the analyses, pruning, tables and plots). It knows nothing of the script language: the
//! compiler keeps Rhai out (this crate does not depend on it); the `headscope` crate adds the
//! script API beside each type. See ARCHITECTURE.md for the map of the code.

// `t += u` on a tch Tensor is the in-place `add_`: it writes through shallow clones and breaks
// autograd (the gates' graph in pruning). Tensors are combined out of place, `t = t + u`.
#![allow(clippy::assign_op_pattern)]

/// A typed option: an enum parsed once at the edge from its script name (with a one-line
/// error listing the accepted names) and printed back by the same name.
#[macro_export]
macro_rules! options_enum {
    ($(#[$attr:meta])* $name:ident, $what:literal, { $($(#[$vattr:meta])* $v:ident = $s:literal),* $(,)? }) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum $name { $($(#[$vattr])* $v),* }
        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($s => Ok($name::$v),)*
                    other => Err(format!(concat!("unknown ", $what, " '{}' (expected {})"), other, $crate::one_of(&[$($s),*]))),
                }
            }
        }
        impl $name {
            /// The option's name for this value (what scripts write), usable in `const` items.
            pub const fn name(self) -> &'static str {
                match self { $($name::$v => $s),* }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

/// The accepted names of an option, quoted, for error messages: `"a", "b" or "c"`.
pub fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

pub mod analysis;
pub mod budget;
pub mod data;
pub mod device;
pub mod export;
pub mod files;
#[doc(hidden)]
pub mod fuzz;
pub mod metrics;
pub mod model;
pub mod optspec;
pub mod output;
pub mod plot;
pub mod prune;
pub mod run;
pub mod shard;
pub mod suggest;
pub mod table;
pub mod view;
