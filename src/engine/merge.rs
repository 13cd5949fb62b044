//! Merging sharded results (docs/methods.md#shards): each sharded function's finisher, one
//! flat list; `merge_results` for scripts and `headscope merge` for files both go through
//! [`crate::shard::merge`], then add the shards' accumulators by their type's rule
//! ([`Merged::total`]: `SweepAcc`, `LrpAcc`, ...), then the finisher, the code a one-process
//! run goes through.

use crate::grid::Grid;
use crate::script::convert::{err, quote, ScriptResult};
use crate::shard::{merge, Merged, Partial};
use rhai::plugin::*;
use rhai::{Array, Dynamic};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Turns merged accumulators into the function's result: the script value and its JSON.
pub type Finisher = fn(&Merged) -> Result<(Dynamic, Value), String>;

fn grid(g: Result<Grid, String>) -> Result<(Dynamic, Value), String> {
    let g = g?;
    let json = g.to_json();
    Ok((Dynamic::from(g), json))
}

/// Every function that runs sharded, and its finisher.
pub const FINISHERS: &[(&str, Finisher)] = &[
    ("analyze", crate::analysis::script::finish_analysis),
    ("ablation_sweep", |m| grid(crate::analysis::script::finish_sweep(&m.identity, &m.total()?))),
    ("lrp", |m| grid(crate::analysis::script::finish_lrp(&m.identity, &m.total()?))),
    ("head_importance", |m| grid(crate::analysis::script::finish_importance(&m.identity, &m.total()?))),
    ("patch", |m| {
        let map = crate::analysis::script::finish_patch(&m.identity, &m.total()?)?;
        let json = crate::script::convert::dynamic_json(&Dynamic::from(map.clone()));
        Ok((Dynamic::from(map), json))
    }),
    ("bleu", |m| {
        let map = crate::analysis::script::finish_bleu(&m.identity, &m.total()?)?;
        let json = crate::script::convert::dynamic_json(&Dynamic::from(map.clone()));
        Ok((Dynamic::from(map), json))
    }),
];

/// The result of a complete, consistent set of shards.
pub fn finish(m: &Merged) -> Result<(Dynamic, Value), String> {
    let f = FINISHERS.iter().find(|(name, _)| *name == m.func).ok_or_else(|| {
        format!(
            "{}: no function '{}' runs sharded (those that do: {})",
            m.name,
            m.func,
            FINISHERS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )
    })?;
    (f.1)(m)
}

/// The shard record of a script value: a sharded result (Grid, Analysis, or a map with
/// `options.shard`) or the path of a result file.
fn record_of(v: &Dynamic, i: usize) -> ScriptResult<(String, Partial)> {
    let src = format!("merge_results: item {i}");
    let json: Value = if let Some(g) = v.clone().try_cast::<Grid>() {
        g.to_json()
    } else if let Some(a) = v.clone().try_cast::<crate::analysis::script::AnalysisObj>() {
        a.0.to_json()
    } else if v.is_map() {
        crate::script::convert::dynamic_json(v)
    } else if v.is_string() {
        let path = v.to_string();
        let text =
            std::fs::read_to_string(&path).or_else(|e| err(format!("merge_results: cannot read '{path}': {e}")))?;
        let json = serde_json::from_str(&text).or_else(|e| err(format!("merge_results: '{path}' is not JSON: {e}")))?;
        return match Partial::in_result(&json) {
            Some(r) => {
                Ok((path.clone(), Partial::from_json(r, &path).or_else(|e| err(format!("merge_results: {e}")))?))
            }
            None => err(format!(
                "merge_results: '{path}' holds no shard record (options.shard): was it computed with a shard?"
            )),
        };
    } else {
        return err(format!("merge_results: item {i} is not a sharded result or a file path: {}", quote(v)));
    };
    match Partial::in_result(&json) {
        Some(r) => Ok((src.clone(), Partial::from_json(r, &src).or_else(|e| err(format!("merge_results: {e}")))?)),
        None => err(format!("merge_results: item {i} is a result of the whole data, not of a shard (compute it with #{{shard: \"I/N\"}} or under `headscope run --shard`)")),
    }
}

#[export_module]
pub mod api {
    use super::*;

    /// Merges the shards of one computation into the result one process would have given
    /// (docs/methods.md#shards): `parts` holds sharded results (of `analyze`,
    /// `ablation_sweep`, `lrp`, `head_importance`, `patch` or `bleu`, computed with `#{shard: "I/N"}`
    /// or under `headscope run --shard I/N`) or paths of their JSON files. Refused, naming
    /// the shard and the field, when they belong to different models, data or options, or
    /// when a slice is missing or given twice.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let d = corpus(asset("pud_en.txt")).take(6);
    /// let parts = [];
    /// for i in 0..3 { parts.push(m.analyze(d, #{stats: ["confidence"], shard: `${i}/3`})); }
    /// let a = merge_results(parts);
    /// assert(a.sentences == 6);
    /// assert(abs(a.confidence["enc"][0][0] - m.confidence(d)["enc"][0][0]) < 1e-6);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn merge_results(parts: Array) -> ScriptResult<Dynamic> {
        let records = parts.iter().enumerate().map(|(i, v)| record_of(v, i)).collect::<ScriptResult<Vec<_>>>()?;
        let merged = merge(&records).or_else(|e| err(format!("merge_results: {e}")))?;
        finish(&merged).map(|(v, _)| v).or_else(|e| err(format!("merge_results: {e}")))
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_global_module(exported_module!(api).into());
}

/// `headscope merge`: merges every complete set of shard files found in `paths` (files, or
/// directories of `*.json`) into `out/NAME.json`, written atomically. Returns one line per
/// merged result; any inconsistent set fails the whole merge before anything is written.
pub fn merge_files(paths: &[PathBuf], out: &Path) -> Result<Vec<String>, String> {
    let (groups, skipped) = crate::shard::read_partials(paths)?;
    if groups.is_empty() {
        let looked: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(format!(
            "no shard results in {} ({} JSON file(s) without a shard record)",
            looked.join(" "),
            skipped.len()
        ));
    }
    let mut done = Vec::new();
    for (name, parts) in &groups {
        let m = merge(parts)?;
        let (_, json) = finish(&m)?;
        done.push((name.clone(), m, json));
    }
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut lines = Vec::new();
    for (name, m, json) in done {
        let path = crate::shard::merged_path(out, &name);
        let text = serde_json::to_string_pretty(&json).map_err(|e| format!("{name}: {e}"))?;
        crate::files::write_atomic(&path, text.as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        lines.push(format!("{name}: {} shards, {} sentences -> {}", m.shards, m.total, path.display()));
    }
    Ok(lines)
}
