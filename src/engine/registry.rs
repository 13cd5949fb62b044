//! The flat registration list: every script type's API (each lives beside its type) and
//! every renderer. Only the engine depends on all the types, so imports stay a DAG.

use crate::output::Output;
use crate::script::convert::OptSpec;
use rhai::{Dynamic, Engine};

/// Renders a script value into an output bundle, if it is of a type the renderer knows.
pub type Renderer = fn(&Dynamic) -> Option<Output>;

/// Every type-specific renderer; the session tries them in order.
pub const RENDERERS: &[Renderer] = &[
    crate::table::script::render,
    crate::plot::script::render,
    crate::model::script::render,
    crate::model::script::hooks::render,
    crate::data::script::render,
    crate::data::pairs_script::render,
    crate::grid::script::render,
    crate::analysis::script::render,
    crate::prune::script::render,
    crate::view::script::render,
];

/// Every function that takes an option map, with the options it accepts (each list lives
/// beside its function): `Opts` checks maps against them and takes defaults from them,
/// `:help` shows them with their defaults, completion offers them inside `#{...}`. A method
/// whose options differ from a free function of the same name is listed as `Type.name`
/// (`Model.bleu` beside `bleu`).
pub const OPTIONS: &[(&str, &[OptSpec])] = &[
    ("load_model", crate::model::script::LOAD_OPTIONS),
    ("forward", crate::model::script::FORWARD_OPTIONS),
    ("generate", crate::model::script::GENERATE_OPTIONS),
    ("translate", crate::model::script::TRANSLATE_OPTIONS),
    ("run_with_cache", crate::model::script::hooks::RUN_WITH_CACHE_OPTIONS),
    ("logits", crate::model::script::outputs::LOGITS_OPTIONS),
    ("loss", crate::model::script::outputs::LOSS_OPTIONS),
    ("heatmap", crate::plot::script::HEATMAP_OPTIONS),
    ("bar", crate::plot::script::BAR_OPTIONS),
    ("line", crate::plot::script::LINE_OPTIONS),
    ("prune", crate::prune::script::OPTIONS),
    ("prune_compare", crate::prune::script::COMPARE_OPTIONS),
    ("learn_duo", crate::prune::script_duo::LEARN_DUO_OPTIONS),
    ("learn_prulong", crate::prune::script_duo::LEARN_PRULONG_OPTIONS),
    ("bleu", crate::metrics::bleu::script::BLEU_OPTIONS),
];

/// The option families registered elsewhere in lists of their own.
pub const OPTION_FAMILIES: &[&[(&str, &[OptSpec])]] = &[OPTIONS, crate::analysis::script::OPTIONS];

/// The options `func` accepts, if it takes an option map (called as a function).
pub fn options_of(func: &str) -> Option<&'static [OptSpec]> {
    options_of_call(func, None)
}

/// The options of `func` called as a method of `receiver` (`Some("Model")`, or `Some("")`
/// when the type is unknown) or as a function (`None`): a method's own list (`Type.name`) first.
pub fn options_of_call(func: &str, receiver: Option<&str>) -> Option<&'static [OptSpec]> {
    let all = || OPTION_FAMILIES.iter().flat_map(|f| f.iter());
    if let Some(ty) = receiver {
        let own =
            all().find(|(name, _)| name.split_once('.').is_some_and(|(t, n)| n == func && (ty.is_empty() || t == ty)));
        if let Some((_, o)) = own {
            return Some(*o);
        }
    }
    all().find(|(name, _)| *name == func).map(|(_, o)| *o)
}

/// Keys that may follow `value["` (kinds of a grid or analysis), by type.
pub type IndexKeys = fn(&Dynamic) -> Option<Vec<String>>;
pub const INDEX_KEYS: &[IndexKeys] = &[crate::grid::script::index_keys, crate::analysis::script::index_keys];

/// Registers every script type and function (except the session-bound ones in `core`).
pub fn register_types(engine: &mut Engine) {
    crate::table::script::register(engine);
    crate::plot::script::register(engine);
    crate::device::script::register(engine);
    crate::assets::script::register(engine);
    crate::model::script::register(engine);
    crate::model::script::hooks::register(engine);
    crate::data::script::register(engine);
    crate::data::pairs_script::register(engine);
    crate::grid::script::register(engine);
    crate::analysis::script::register(engine);
    crate::prune::script::register(engine);
    crate::metrics::bleu::script::register(engine);
    crate::view::script::register(engine);
    super::merge::register(engine);
}
