//! Activation patching on a model: `m.patch(pairs, #{...})` (docs/methods.md#activation-patching).

use crate::analysis::patching::{patch, Direction, PairIds, PatchMetric, PatchSpec, Patched, Site};
use crate::data::pairs::Pairs;
use crate::data::pairs_script::pairs_arg;
use crate::grid::Grid;
use crate::model::script::ScriptModel;
use crate::model::Model;
use crate::script::convert::{err, opt_str, OptSpec, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Map};
use serde_json::json;

pub const PATCH_OPTIONS: &[OptSpec] = &[
    opt_str("site", "z", "what is patched: \"z\" (= \"result\"), \"q\", \"k\", \"v\" (by key/value head), \"pattern\", or the residual stream's \"resid_pre\", \"attn_out\", \"mlp_out\""),
    opt_str("positions", "all", "\"all\" (every position at once) or \"each\" (one position at a time; the pairs must share one token length)"),
    opt_str("direction", "denoise", "\"denoise\" (clean values into the corrupted run) or \"noise\" (corrupted into clean)"),
    opt_str("metric", "logit_diff", "\"logit_diff\" (answer - wrong), \"prob\" (of the answer), \"kl\" (clean || run) or \"loss\" (-log p(answer)), at the last position"),
];

/// The one token of an answer (special tokens such as a BOS the tokenizer adds left out).
fn answer_id(model: &Model, text: &str, what: &str, origin: &str) -> ScriptResult<i64> {
    let e = model.tokenize(text).or_else(|e| err(format!("patch: {origin}: the {what} {text:?}: {e}")))?;
    let toks: Vec<(i64, &String)> = e.ids.iter().zip(&e.tokens).zip(&e.special).filter(|(_, s)| !**s).map(|((i, t), _)| (*i, t)).collect();
    match toks.as_slice() {
        [(id, _)] => Ok(*id),
        [] => err(format!("patch: {origin}: the {what} {text:?} has no tokens")),
        many => err(format!("patch: {origin}: the {what} {text:?} is {} tokens ({}), not one; patching reads one next token", many.len(), many.iter().map(|(_, t)| format!("{t:?}")).collect::<Vec<_>>().join(", "))),
    }
}

fn token_ids(m: &ScriptModel, pairs: &Pairs) -> ScriptResult<(Vec<PairIds>, Vec<String>)> {
    let model = &m.model;
    let mut out = Vec::with_capacity(pairs.len());
    let mut first_tokens = Vec::new();
    for p in pairs.items.iter() {
        let tok = |t: &str, what: &str| model.tokenize(t).or_else(|e| err(format!("patch: {}: the {what} prompt: {e}", p.origin)));
        let (c, k) = (tok(&p.clean, "clean")?, tok(&p.corrupted, "corrupted")?);
        if c.ids.len() != k.ids.len() {
            return err(format!("patch: {}: the clean prompt is {} tokens, the corrupted {}; a pair must have one length (positions are patched one for one)", p.origin, c.ids.len(), k.ids.len()));
        }
        if first_tokens.is_empty() {
            first_tokens = c.tokens.clone();
        }
        out.push(PairIds { clean: c.ids, corrupted: k.ids, answer: answer_id(model, &p.answer, "answer", &p.origin)?, wrong: Some(answer_id(model, &p.wrong, "wrong answer", &p.origin)?) });
    }
    Ok((out, first_tokens))
}

fn grid(m: &ScriptModel, stat: String, dataset: &str, values: Vec<Vec<f64>>, echo: &crate::output::Echo) -> Grid {
    Grid { stat, model: m.model.name(), dataset: dataset.into(), kinds: vec![(m.model.net.stack_kind, values)], options: echo.clone() }
}

/// The result map of a patching run.
fn result(m: &ScriptModel, pairs: &Pairs, spec: PatchSpec, r: &Patched, tokens: &[String], echo: crate::output::Echo) -> ScriptResult<Map> {
    let what = format!("{} patching of {} ({}, {})", spec.direction, spec.site, spec.metric, if spec.each_position { "per position" } else { "all positions" });
    let mut out = Map::new();
    let norm = |v: f64| r.normalized(v);
    let pos_label = |p: usize| format!("{p}:{}", tokens.get(p).map_or("", |t| t.as_str()));
    if spec.site.per_head() {
        let by_pos = |f: &dyn Fn(f64) -> f64, stat: &str| -> Dynamic {
            let n_pos = r.patched.iter().map(|l| l.len()).max().unwrap_or(0);
            let grids: Vec<Grid> = (0..n_pos)
                .map(|p| {
                    let values = r.patched.iter().map(|l| l.get(p).map_or_else(Vec::new, |row| row.iter().map(|&v| f(v)).collect())).collect();
                    let at = if spec.each_position { format!(" at position {}", pos_label(p)) } else { String::new() };
                    grid(m, format!("{stat} of {what}{at}"), &pairs.name, values, &echo)
                })
                .collect();
            if spec.each_position { Dynamic::from(grids.into_iter().map(Dynamic::from).collect::<Array>()) } else { grids.into_iter().next().map_or(Dynamic::UNIT, Dynamic::from) }
        };
        out.insert("effect".into(), by_pos(&norm, "normalised effect"));
        out.insert("patched".into(), by_pos(&|v| v, &spec.metric.to_string()));
    } else {
        let table = |f: &dyn Fn(f64) -> f64, stat: &str| -> ScriptResult<Table> {
            let n_pos = r.patched.iter().map(|l| l.len()).max().unwrap_or(0);
            let mut cols = vec!["layer".to_string()];
            cols.extend((0..n_pos).map(|p| if spec.each_position { pos_label(p) } else { "all".into() }));
            let mut t = Table::new(cols);
            t.title = Some(format!("{stat} of {what}: {} on {}", m.model.name(), pairs.name));
            t.digits = 3;
            for (l, layer) in r.patched.iter().enumerate() {
                let mut cells = vec![Cell::Text(format!("{}.{l}", m.model.net.stack_kind))];
                cells.extend(layer.iter().map(|row| row.first().map_or(Cell::Empty, |&v| Cell::Float(f(v)))));
                t.push_row(cells).or_else(|e| err(e.to_string()))?;
            }
            Ok(t)
        };
        out.insert("effect".into(), Dynamic::from(table(&norm, "normalised effect")?));
        out.insert("patched".into(), Dynamic::from(table(&|v| v, &spec.metric.to_string())?));
    }
    out.insert("clean".into(), Dynamic::from(r.clean));
    out.insert("corrupted".into(), Dynamic::from(r.corrupted));
    out.insert("pairs".into(), Dynamic::from(pairs.len() as i64));
    if spec.each_position {
        out.insert("tokens".into(), Dynamic::from(tokens.iter().cloned().map(Dynamic::from).collect::<Array>()));
    }
    out.insert("options".into(), Dynamic::from(crate::script::convert::echo_map(&echo)));
    Ok(out)
}

pub fn run_patch(m: &ScriptModel, data: &Dynamic, options: &Map) -> ScriptResult<Map> {
    const F: &str = "patch";
    let o = Opts::new(options, F, PATCH_OPTIONS)?;
    let site: Site = o.parsed_or_default("site")?;
    let each = match o.string_or_default("positions")?.as_str() {
        "all" => false,
        "each" => true,
        other => return err(format!("patch: unknown positions '{other}' (expected \"all\" or \"each\")")),
    };
    let direction: Direction = o.parsed_or_default("direction")?;
    let metric: PatchMetric = o.parsed_or_default("metric")?;
    let pairs = pairs_arg(data, F)?;
    let (ids, tokens) = token_ids(m, &pairs)?;
    let spec = PatchSpec { site, each_position: each, direction, metric };
    let gates = m.gates()?;
    let mut progress = |done: usize, total: usize| crate::run::progress("patching (layers)", done, total);
    let r = patch(&m.model, &ids, spec, &gates, &crate::run::interrupted, &mut progress).or_else(|e| err(format!("{F}: {e}")))?;
    let echo = vec![
        ("site".to_string(), json!(site.to_string())),
        ("positions".into(), json!(if each { "each" } else { "all" })),
        ("direction".into(), json!(direction.to_string())),
        ("metric".into(), json!(metric.to_string())),
        ("clean".into(), crate::script::convert::json_f64(r.clean)),
        ("corrupted".into(), crate::script::convert::json_f64(r.corrupted)),
    ];
    result(m, &pairs, spec, &r, &tokens, echo)
}

#[export_module]
pub mod api {
    use super::*;

    /// Activation patching (docs/methods.md#activation-patching): for every head of the
    /// model's stack (or every layer of the residual stream), the corrupted prompt run with that
    /// unit's activation taken from the clean run (denoising; `direction: "noise"` the reverse),
    /// the metric read at the last position and averaged over the pairs. Returns a map:
    /// `effect` (the normalised effect `(patched - corrupted) / (clean - corrupted)`, a Grid of
    /// layers x heads, per position an array of Grids, for the residual stream a Table),
    /// `patched` (the metric itself, alike), `clean`, `corrupted`, `pairs`, `tokens` (per
    /// position) and `options`. Options: `site` ("z"), `positions` ("all" | "each"),
    /// `direction` ("denoise"), `metric` ("logit_diff"). Each layer's patches run as rows of
    /// one batch above the layers computed once; the view's masks and gates apply.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let p = pairs([["a b c d", "a b x d", " c", " x"]]);
    /// let r = m.patch(p, #{site: "resid_pre", positions: "each"});
    /// // The whole residual stream of layer 0 at every position is the clean run.
    /// let all = m.patch(p, #{site: "resid_pre"});
    /// assert(abs(all.patched.column("all")[0] - all.clean) < 1e-5);
    /// let h = m.patch(p, #{site: "z", metric: "kl"});
    /// assert(h.effect.kinds == ["dec"]);
    /// ```
    #[rhai_fn(name = "patch", return_raw, pure)]
    pub fn patch_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Map> {
        run_patch(m, &data, &options)
    }

    /// `m.patch(pairs, #{})`: every head's `hook_z`, all positions, denoising, logit difference.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let r = m.patch(pairs([["a b c", "a x c", " b", " x"]]));
    /// assert(type_of(r.effect) == "Grid" && r.pairs == 1);
    /// ```
    #[rhai_fn(name = "patch", return_raw, pure)]
    pub fn patch_plain(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Map> {
        run_patch(m, &data, &Map::new())
    }
}
