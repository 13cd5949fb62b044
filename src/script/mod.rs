//! Rhai glue shared by the script APIs. Each type's API lives beside the type (`table::script`,
//! `plot::script`, ...); this module holds the conversions and the flat registration list.

pub mod convert;
pub mod core;

use crate::output::Output;
use rhai::{Dynamic, Engine};

/// Renders a script value into an output bundle, if it is of a type the renderer knows.
pub type Renderer = fn(&Dynamic) -> Option<Output>;

/// Every type-specific renderer; the session tries them in order.
pub const RENDERERS: &[Renderer] = &[crate::table::script::render, crate::plot::script::render, crate::model::script::render, crate::data::script::render, crate::analysis::script::render, crate::prune::script::render];

/// Registers every script type and function (except the session-bound ones in `core`).
pub fn register_types(engine: &mut Engine) {
    crate::table::script::register(engine);
    crate::plot::script::register(engine);
    crate::device::script::register(engine);
    crate::assets::script::register(engine);
    crate::model::script::register(engine);
    crate::data::script::register(engine);
    crate::analysis::script::register(engine);
    crate::prune::script::register(engine);
    crate::metrics::bleu::script::register(engine);
}
