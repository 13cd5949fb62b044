//! LRP head relevance on a model: `m.lrp(data, #{...})` (docs/methods.md#lrp-head-relevance).

use crate::analysis::lrp::{self, LrpOptions, RuleSet};
use crate::data::script::Plan;
use crate::data::Dataset;
use crate::grid::Grid;
use crate::model::script::ScriptModel;
use crate::model::view::View;
use crate::script::convert::{err, OptSpec, Opts, ScriptResult};

pub const LRP_OPTIONS: &[OptSpec] = &[
    lrp::RULE_OPTION,
    lrp::SEED_OPTION,
    lrp::SEEDS_OPTION,
    lrp::BATCH_TOKENS_OPTION,
    crate::data::script::SHARD_OPTION,
    crate::model::script::TGT_LANG,
];

/// LRP's grid from its accumulators (one process's, or merged shards').
pub fn finish_lrp(identity: &serde_json::Value, acc: &crate::analysis::lrp::LrpAcc) -> Result<Grid, String> {
    use super::sharded::{cell, echo_of, grid_from};
    let predictions = acc.predictions;
    let n = predictions.max(1) as f64;
    let kinds = grid_from(identity, |k, l, h| Ok(cell(&acc.sums, k, l, h)? / n))?;
    let mut options = echo_of(&identity["options"]);
    let rule =
        options.iter().find(|(k, _)| k == "rule").and_then(|(_, v)| v.as_str().map(str::to_string)).unwrap_or_default();
    options.push(("predictions".into(), serde_json::json!(predictions)));
    options.push(("max_conservation_error".into(), crate::script::convert::json_f64(acc.max_conservation_error.0)));
    Ok(Grid {
        stat: format!("lrp ({rule})"),
        model: identity["model"]["name"].as_str().unwrap_or_default().into(),
        dataset: identity["data"]["name"].as_str().unwrap_or_default().into(),
        kinds,
        options,
    })
}
/// `lrp`'s typed options from a map checked against [`LRP_OPTIONS`]: what it gives, else the
/// list's defaults; a seed not given is left to the model (`LrpOptions::seed_for`).
fn options_from(o: &Opts) -> ScriptResult<LrpOptions> {
    let rule: RuleSet = o.parsed_or_default("rule")?;
    let per_prediction = match o.string_or_default("seeds")?.as_str() {
        "each" => true,
        "summed" => false,
        other => return err(format!("lrp: unknown seeds '{other}' (expected \"each\" or \"summed\")")),
    };
    Ok(LrpOptions {
        rule,
        seed: o.string("seed")?.map(|s| s.parse()).transpose().or_else(|e: String| err(format!("lrp: {e}")))?,
        per_prediction,
        batch_tokens: o.usize_or_default("batch_tokens")?,
    })
}

/// LRP head relevance on the rows of `plan` under typed options: what `m.lrp(data, #{...})`
/// and the library API run.
pub fn lrp_planned(m: &View, d: &Dataset, opts: &LrpOptions, plan: &Plan) -> Result<Grid, String> {
    let f = "lrp";
    d.require_sentences(f)?;
    m.require(f, crate::model::view::Needs::NoStreaming).map_err(|e| e.to_string())?;
    let gates = m.gates().map_err(|e| e.to_string())?;
    let mut progress = |done: usize, total: usize| crate::run::progress("lrp", done, total);
    let r =
        crate::analysis::lrp::lrp(&m.model, &plan.data(d, f)?, opts, &gates, &crate::run::interrupted, &mut progress)
            .map_err(|e| format!("lrp: {e}"))?;
    let kinds: Vec<crate::model::Kind> = r.sums.iter().map(|(k, _)| *k).collect();
    let echo = serde_json::json!([
        ["rule", r.options.rule.to_string()],
        ["seed", r.options.seed_for(&m.model).to_string()],
        ["seeds", if r.options.per_prediction { "each" } else { "summed" }],
        ["batch_tokens", r.options.batch_tokens],
    ]);
    let heads = crate::analysis::script::sharded::present_heads(&m.model, &kinds);
    let identity = plan.identity(
        m.identity(),
        serde_json::json!({"options": echo, "heads": crate::analysis::script::sharded::valid_heads(&heads)}),
    );
    let acc = crate::analysis::lrp::LrpAcc::of(&r);
    let g = finish_lrp(&identity, &acc).map_err(|e| format!("{f}: {e}"))?;
    plan.seal(f, identity, &acc, g, |g| &mut g.options, Grid::to_json)
}

/// LRP head relevance over the whole of `data` (the library API's `Model::lrp`).
pub fn lrp(m: &View, d: &Dataset, opts: &LrpOptions) -> Result<Grid, String> {
    lrp_planned(m, d, opts, &Plan::whole(d))
}

use rhai::plugin::*;
use rhai::{Dynamic, Map};

/// The token id a `token_relevance` target names: an id inside the vocabulary, a vocabulary
/// piece, or a text the tokenizer makes exactly one (non-special) token of.
fn target_id(m: &ScriptModel, target: &Dynamic) -> Result<i64, String> {
    let f = "token_relevance";
    let tok = &m.model.tok;
    let vocab = tok.vocab_size() as i64;
    if let Ok(id) = target.as_int() {
        if !(0..vocab).contains(&id) {
            return Err(format!("{f}: target id {id} is outside the vocabulary (0 to {})", vocab - 1));
        }
        return Ok(id);
    }
    let Some(text) = target.clone().try_cast::<rhai::ImmutableString>() else {
        return Err(format!(
            "{f}: target must be a token id or a one-token text, got {}",
            crate::script::convert::quote(target)
        ));
    };
    if text.is_empty() {
        return Err(format!("{f}: target is empty; give one token (its text or id)"));
    }
    if let Some(id) = tok.token_to_id(&text) {
        return Ok(id);
    }
    let enc = tok.encode(&text).map_err(|e| format!("{f}: target: {e}"))?;
    let pieces: Vec<(i64, &String)> =
        enc.ids.iter().zip(&enc.tokens).zip(&enc.special).filter(|(_, &sp)| !sp).map(|((&id, t), _)| (id, t)).collect();
    match pieces.as_slice() {
        [(id, _)] => Ok(*id),
        [] => Err(format!("{f}: target {:?} is no token of {}'s vocabulary", text.as_str(), m.model.name())),
        many => Err(format!(
            "{f}: target {:?} is {} tokens ({}), not one; give one token (its text or id)",
            text.as_str(),
            many.len(),
            many.iter().map(|(id, t)| format!("{t:?} {id}")).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// `token_relevance` with an optional target token id (checked by the caller).
fn token_relevance_of(m: &ScriptModel, text: &str, target: Option<i64>) -> Result<crate::table::Table, String> {
    use crate::analysis::lrp::Seed;
    use crate::table::{Cell, Table};
    let f = |e: crate::model::ModelError| format!("token_relevance: {e}");
    if target.is_some() && !m.model.is_lm() {
        return Err(format!(
            "token_relevance: a target token needs a language model; {} has no next-token output head",
            m.model.name()
        ));
    }
    let b = m.model.batch(&[text]).map_err(f)?;
    let t = b.ids.size()[1];
    let seed = if m.model.is_lm() { Seed::Logit } else { Seed::Norm };
    let seed_at = match seed {
        Seed::Logit => tch::Tensor::zeros([1, t], (tch::Kind::Float, m.model.device())).index_fill(
            1,
            &tch::Tensor::from_slice(&[t - 1]).to_device(m.model.device()),
            1.0,
        ),
        Seed::Norm => b.mask.to_kind(tch::Kind::Float),
    };
    let r = crate::analysis::attnlrp::relevance(
        &m.model,
        &b.ids,
        &b.mask,
        &seed_at,
        seed,
        &m.gates().map_err(|e| e.to_string())?,
        target,
    )
    .map_err(f)?;
    let rel = Vec::<f64>::try_from(r.input.get(0).to_kind(tch::Kind::Double).to_device(tch::Device::Cpu))
        .map_err(|e| f(e.into()))?;
    let total: f64 = rel.iter().map(|x| x.abs()).sum::<f64>().max(1e-30);
    let mut table = Table::new(vec!["token".into(), "relevance".into(), "share".into()]);
    // The token explained: the target, else the top-1 prediction after the text.
    let top = r.top.as_ref().map(|top| top.get(0).int64_value(&[t - 1]));
    let name = |id: i64| {
        format!("{:?} (id {id}, text {:?})", m.model.tok.id_to_token(id), m.model.tok.decode(&[id]).unwrap_or_default())
    };
    let explains = match (target, top) {
        (Some(id), Some(top)) => format!("explains {} (the given target; the top-1 is {})", name(id), name(top)),
        (None, Some(top)) => format!("explains {} (the top-1 next token)", name(top)),
        _ => "explains the final hidden states (no output head)".to_string(),
    };
    table.title = Some(format!("AttnLRP token relevance ({seed} seed): {}; {explains}", m.model.name()));
    table.digits = 4;
    for (tok, x) in b.encoded[0].tokens.iter().zip(&rel) {
        let _ = table.push_row(vec![Cell::Text(tok.clone()), Cell::Float(*x), Cell::Float(x.abs() / total)]);
    }
    Ok(table)
}

#[export_module]
pub mod api {
    use super::*;

    /// LRP head relevance of the self-attention stack (docs/methods.md#lrp-head-relevance): per layer,
    /// each head's share of the relevance reaching the layer's heads, averaged over
    /// predictions (each layer's row sums to 1). Options: `rule` ("ab" | "zplus" | "attnlrp":
    /// AttnLRP as LXT computes it, docs/methods.md#attnlrp, on the self-attention stack), `seed`
    /// ("logit": each output position's top-1 logit, the default for models with an output
    /// head: teacher-forced on the references, else on the model's greedy translation, giving
    /// encoder and cross-attention heads for translation models; "norm": each position's final
    /// hidden units by squared activation, the default for encoders, and for a translation
    /// model the encoder alone), `seeds` ("each": one propagation per prediction, as docs/methods.md
    /// normalises; "summed": a sentence's seeds together, about T times cheaper),
    /// `batch_tokens` (padded tokens per batch: 256 with "summed", 64 with "each", whose
    /// relevance tensors are P predictions deep: larger batches leave the cache and fault in
    /// fresh pages, 1.4-1.7x slower at 256). The options echo `predictions` and `max_conservation_error` (the
    /// largest deviation of the total relevance from the seed's at any layer boundary).
    ///
    /// ```rhai
    /// let g = load_model("minilm").lrp(corpus(asset("pud_en.txt")).take(4), #{rule: "ab"});
    /// let row = g["enc"][3];
    /// let total = 0.0;
    /// for v in row { total += v; }
    /// assert(abs(total - 1.0) < 1e-6 && g.options.max_conservation_error < 1e-3);
    /// ```
    #[rhai_fn(name = "lrp", return_raw, pure)]
    pub fn lrp_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Grid> {
        let o = Opts::new(&options, "lrp", LRP_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let d = crate::data::script::dataset_arg(&data, "lrp")?;
        let opts = options_from(&o)?;
        let plan = Plan::new(&d, &o, "lrp")?;
        Ok(lrp_planned(m, &d, &opts, &plan)?)
    }

    /// AttnLRP's input-token relevance of one text (docs/methods.md#attnlrp): a table of the
    /// tokens with their relevance (signed) and share of the total `|R|`. The seed is a
    /// language model's top-1 logit after the text (its next-token prediction), else the final
    /// hidden states (`h * h`, every position). One forward and one backward. The title names
    /// the token explained: its vocabulary piece, id and text.
    ///
    /// ```rhai
    /// let t = load_model("smollm2").token_relevance("The capital of France is");
    /// assert(t.columns == ["token", "relevance", "share"] && t.len() == 6);
    /// assert(t.title.contains("explains") && t.title.contains("top-1"));
    /// let s = 0.0;
    /// for x in t.column("share") { s += x; }
    /// assert(abs(s - 1.0) < 1e-6);
    /// ```
    #[rhai_fn(name = "token_relevance", return_raw, pure)]
    pub fn token_relevance(m: &mut ScriptModel, text: &str) -> ScriptResult<crate::table::Table> {
        Ok(token_relevance_of(m, text, None)?)
    }

    /// `token_relevance` explaining a chosen next token instead of the top-1: `target` is a
    /// token id (an integer) or a text that is exactly one token (a vocabulary piece such as
    /// `"ĠParis"`, or a text the tokenizer makes one token of, such as `" Paris"`). Language
    /// models only; an id outside the vocabulary, or a text of several tokens, is an error.
    ///
    /// ```rhai
    /// let m = load_model("smollm2");
    /// let t = m.token_relevance("The capital of France is", " London");
    /// assert(t.title.contains("the given target") && t.title.contains("London"));
    /// let id = m.token_relevance("The capital of France is", 4052);
    /// assert(id.title.contains("id 4052"));
    /// ```
    ///
    /// ```rhai,error
    /// load_model("smollm2").token_relevance("The capital of France is", " Parisian pastry")
    /// ```
    #[rhai_fn(name = "token_relevance", return_raw, pure)]
    pub fn token_relevance_target(
        m: &mut ScriptModel,
        text: &str,
        target: Dynamic,
    ) -> ScriptResult<crate::table::Table> {
        let id = target_id(m, &target)?;
        Ok(token_relevance_of(m, text, Some(id))?)
    }

    /// `lrp` with the default options.
    ///
    /// ```rhai
    /// let g = load_model("enpt").lrp(corpus(asset("pud_en.txt")).take(3));
    /// assert(g.kinds == ["enc", "cross"] && g.options.seed == "logit" && g.options.rule == "ab");
    /// ```
    #[rhai_fn(name = "lrp", return_raw, pure)]
    pub fn lrp_plain(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Grid> {
        lrp_opts(m, data, Map::new())
    }
}
