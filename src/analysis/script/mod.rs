//! Script API of the analyses, one file per script type or family of functions:
//! `analysis.rs` (the `Analysis` type, `analyze`, `confidence`), `ablation.rs` (`ablate`,
//! `ablation_sweep`), `diversity.rs` (the `Diversity` type), `lrp.rs` (`lrp`), `importance.rs`
//! (`head_importance`, `agreement`), `taxonomy.rs` (`head_types`, the `HeadTypes` type). Their results
//! share one grid type, [`crate::grid::Grid`].

mod ablation;
mod analysis;
mod diversity;
mod importance;
mod lrp;
mod sharded;
mod taxonomy;

/// The options of this family's functions, for `:help` and completion.
pub const OPTIONS: &[(&str, &[crate::script::convert::OptSpec])] = &[
    ("analyze", analysis::OPTIONS),
    ("ablate", ablation::ABLATE_OPTIONS),
    ("ablation_sweep", ablation::SWEEP_OPTIONS),
    ("diversity", diversity::DIVERSITY_OPTIONS),
    ("lrp", lrp::LRP_OPTIONS),
    ("head_importance", importance::IMPORTANCE_OPTIONS),
    ("bleu", ablation::BLEU_OPTIONS),
    ("head_types", taxonomy::HEAD_TYPES_OPTIONS),
];

/// What `a["` may be followed by: an analysis is indexed by its kinds.
pub fn index_keys(v: &Dynamic) -> Option<Vec<String>> {
    if let Some(k) = taxonomy::index_keys(v) {
        return Some(k);
    }
    v.clone().try_cast::<AnalysisObj>().map(|a| a.0.kinds.iter().map(|k| k.kind.to_string()).collect())
}

pub use ablation::api::{ablate_opts, ablation_sweep_opts};
pub use ablation::{finish_bleu, finish_sweep};
pub use analysis::finish_merged as finish_analysis;
pub use importance::finish_importance;
pub use lrp::finish_lrp;
pub use analysis::api::{analyze_opts, confidence_of};
pub use analysis::AnalysisObj;
pub use lrp::api::lrp_opts;
pub use diversity::DiversityObj;
pub use taxonomy::HeadTypes;

use crate::output::{Output, Render};
use crate::script::convert::{err, quote, ScriptResult};
use rhai::{Array, Dynamic, Engine};

fn strings(v: &Dynamic, what: &str) -> ScriptResult<Vec<String>> {
    let Some(a) = v.clone().try_cast::<Array>() else { return err(format!("analyze: option '{what}' must be an array of strings, got {}", quote(v))) };
    a.iter().map(|x| if x.is_string() { Ok(x.to_string()) } else { err(format!("analyze: option '{what}' has a non-string item {}", quote(x))) }).collect()
}

/// The `kinds` option of `func`: names parsed into kinds, else every kind the model has.
fn kinds_option(m: &crate::model::script::ScriptModel, options: &rhai::Map, func: &str) -> ScriptResult<Vec<crate::model::Kind>> {
    match options.get("kinds") {
        Some(v) => strings(v, "kinds")?.iter().map(|s| s.parse().or_else(|e: String| err(format!("{func}: {e}")))).collect(),
        None => Ok(m.model.kinds().iter().map(|k| k.kind).collect()),
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<DiversityObj>("Diversity");
    engine.register_type_with_name::<AnalysisObj>("Analysis");
    engine.register_global_module(rhai::exported_module!(analysis::api).into());
    engine.register_global_module(rhai::exported_module!(ablation::api).into());
    engine.register_global_module(rhai::exported_module!(diversity::api).into());
    engine.register_global_module(rhai::exported_module!(lrp::api).into());
    engine.register_global_module(rhai::exported_module!(importance::api).into());
    engine.register_type_with_name::<HeadTypes>("HeadTypes");
    engine.register_global_module(rhai::exported_module!(taxonomy::api).into());
}

pub fn render(v: &Dynamic) -> Option<Output> {
    if let Some(d) = v.clone().try_cast::<DiversityObj>() {
        return Some(d.render());
    }
    if let Some(r) = v.clone().try_cast::<HeadTypes>() {
        return Some(r.render());
    }
    v.clone().try_cast::<AnalysisObj>().map(|a| a.render())
}
