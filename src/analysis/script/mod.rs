//! Script API of the analyses, one file per script type or family of functions:
//! `analysis.rs` (the `Analysis` type, `analyze`, `confidence`), `ablation.rs` (`ablate`,
//! `ablation_sweep`), `diversity.rs` (the `Diversity` type), `lrp.rs` (`lrp`), `importance.rs`
//! (`head_importance`, `agreement`), `taxonomy.rs` (`head_types`, the `HeadTypes` type). Their results
//! share one grid type, [`crate::grid::Grid`].

mod ablation;
mod analysis;
mod diversity;
mod experts;
mod importance;
mod lrp;
mod needle;
mod patching;
mod sharded;
mod streaming;
mod taxonomy;

/// The options of this family's functions, for `:help` and completion (`Model.bleu`: the
/// method `m.bleu(data, #{...})`, whose options differ from the free `bleu(hyps, refs, #{...})`).
pub const OPTIONS: &[(&str, &[crate::script::convert::OptSpec])] = &[
    ("analyze", analysis::OPTIONS),
    ("ablate", ablation::ABLATE_OPTIONS),
    ("ablation_sweep", ablation::SWEEP_OPTIONS),
    ("with_mask", ablation::WITH_MASK_OPTIONS),
    ("diversity", diversity::DIVERSITY_OPTIONS),
    ("lrp", lrp::LRP_OPTIONS),
    ("head_importance", importance::IMPORTANCE_OPTIONS),
    ("expert_sweep", experts::EXPERT_SWEEP_OPTIONS),
    ("expert_importance", experts::EXPERT_IMPORTANCE_OPTIONS),
    ("router_stats", experts::ROUTER_STATS_OPTIONS),
    ("with_expert_mask", experts::WITH_EXPERT_MASK_OPTIONS),
    ("expert_l0", experts::EXPERT_L0_OPTIONS),
    ("Model.bleu", ablation::BLEU_OPTIONS),
    ("head_types", taxonomy::HEAD_TYPES_OPTIONS),
    ("patch", patching::PATCH_OPTIONS),
    ("with_streaming", streaming::WITH_STREAMING_OPTIONS),
    ("kv_scores", streaming::KV_SCORES_OPTIONS),
    ("kv_curve", streaming::KV_CURVE_OPTIONS),
    ("kv_footprint", streaming::KV_FOOTPRINT_OPTIONS),
    ("needle_test", needle::NEEDLE_TEST_OPTIONS),
];

/// What `a["` may be followed by: an analysis is indexed by its kinds.
pub fn index_keys(v: &Dynamic) -> Option<Vec<String>> {
    if let Some(k) = taxonomy::index_keys(v) {
        return Some(k);
    }
    v.clone().try_cast::<AnalysisObj>().map(|a| a.0.kinds.iter().map(|k| k.kind.to_string()).collect())
}

pub use ablation::{ablation_sweep, ablation_sweep_planned, finish_bleu, finish_sweep};
pub use analysis::finish_merged as finish_analysis;
pub use analysis::{analyze, analyze_planned, confidence, default_options, AnalysisObj, OPTIONS as ANALYZE_OPTIONS};
pub use diversity::DiversityObj;
pub use importance::finish_importance;
pub use lrp::{finish_lrp, lrp, lrp_planned};
pub use patching::finish_patch;
pub use taxonomy::HeadTypes;

use crate::output::{Output, Render};
use rhai::{Dynamic, Engine};

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<DiversityObj>("Diversity");
    engine.register_type_with_name::<AnalysisObj>("Analysis");
    engine.register_global_module(rhai::exported_module!(analysis::api).into());
    engine.register_global_module(rhai::exported_module!(ablation::api).into());
    engine.register_global_module(rhai::exported_module!(diversity::api).into());
    engine.register_global_module(rhai::exported_module!(lrp::api).into());
    engine.register_global_module(rhai::exported_module!(importance::api).into());
    engine.register_type_with_name::<experts::ExpertGrid>("ExpertGrid");
    engine.register_global_module(rhai::exported_module!(experts::api).into());
    engine.register_global_module(rhai::exported_module!(patching::api).into());
    engine.register_global_module(rhai::exported_module!(streaming::api).into());
    engine.register_global_module(rhai::exported_module!(needle::api).into());
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
    if let Some(g) = v.clone().try_cast::<experts::ExpertGrid>() {
        return Some(g.render());
    }
    v.clone().try_cast::<AnalysisObj>().map(|a| a.render())
}
