//! The flat registration list: every script type's API (each lives beside its type) and
//! every renderer. Only the engine depends on all the types, so imports stay a DAG.

use rhai::{Dynamic, Engine};
use crate::output::Output;

/// Renders a script value into an output bundle, if it is of a type the renderer knows.
pub type Renderer = fn(&Dynamic) -> Option<Output>;

/// Every type-specific renderer; the session tries them in order.
pub const RENDERERS: &[Renderer] = &[crate::table::script::render, crate::plot::script::render, crate::model::script::render, crate::data::script::render, crate::grid::script::render, crate::analysis::script::render, crate::prune::script::render];

/// Registers every script type and function (except the session-bound ones in `core`).
pub fn register_types(engine: &mut Engine) {
    crate::table::script::register(engine);
    crate::plot::script::register(engine);
    crate::device::script::register(engine);
    crate::assets::script::register(engine);
    crate::model::script::register(engine);
    crate::data::script::register(engine);
    crate::grid::script::register(engine);
    crate::analysis::script::register(engine);
    crate::prune::script::register(engine);
    crate::metrics::bleu::script::register(engine);
}
