//! Streaming heads on a model (docs/methods.md#streaming-heads): `m.with_streaming(heads,
//! #{sink, recent, regime, prompt})`, the view every analysis, ablation and generation runs on.

use crate::analysis::streaming::{chunks, curve, group_scores, scores, CurveOptions, KvCost, ScoreOptions, Scorer};
use crate::analysis::taxonomy::ProbeOptions;
use crate::grid::Grid;
use crate::model::nn::Regime;
use crate::model::script::ScriptModel;
use crate::model::view::{regime_name, View};
use crate::model::Kind;
use crate::plot::{Plot, PlotKind, Series};
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt, opt_int, opt_str, OptSpec, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Dynamic, Map};
use serde_json::json;

pub const KV_SCORES_OPTIONS: &[OptSpec] = &[
    opt(
        "data",
        "none (required by \"duo\")",
        "the texts whose mean queries and keys the duo scorer reads (kvpress: 50 BookSum chapters)",
    ),
    opt_int("seed", 0, "seed of the probe sequences (echo, induction, razor, retrieval, headkv)"),
    opt_int("n", 20, "sequences per probe"),
    opt_int("len", 50, "length of the random segment the repeated-token probe repeats"),
    opt_int("needle", 8, "needle length of the retrieval probe"),
    opt_int("haystack", 100, "haystack length of the retrieval probe"),
    opt_int("q_len", 500, "duo: positions of the repeated mean query and key (kvpress's q_len)"),
];

pub const KV_CURVE_OPTIONS: &[OptSpec] = &[
    opt("fractions", "[0.25, 0.5, 0.75, 0.875]", "fractions of key/value groups kept full (the highest-scored), each in (0, 1]"),
    opt_int("context", 512, "tokens per sequence: the data's tokens, one text after another, cut into sequences of this length"),
    opt("prompt", "context / 2", "positions measured start here (the decode regime reads the tokens before it in full)"),
    opt_int("sink", 4, "the first tokens every streaming head keeps seeing"),
    opt_int("recent", 64, "a streaming head's recent window"),
    opt_str("regime", "always", "\"always\" or \"decode\" (docs/methods.md#streaming-heads)"),
    opt_int("induction", 4, "repeated random sequences of `context` tokens for the induction loss (0: none)"),
    opt_int("passkey", 4, "passkey sequences of `context` tokens (the data's text with a random needle at a seeded depth, repeated at the end; 0: none)"),
    opt_int("needle", 8, "the passkey's length in tokens"),
    opt_int("seed", 0, "seed of the induction and passkey sequences"),
    opt_int("chunk", 128, "prefill chunk of the KV footprint: the first `prompt` tokens read in chunks of this many, the rest generated one at a time"),
];

pub const KV_FOOTPRINT_OPTIONS: &[OptSpec] = &[
    opt_int("decode", 0, "tokens generated one at a time after the prompt"),
    opt_int("chunk", 128, "the prompt is read in chunks of this many tokens (chunked prefill)"),
];

pub const WITH_STREAMING_OPTIONS: &[OptSpec] = &[
    opt_int("sink", 4, "the first tokens every streaming head keeps seeing (attention sinks)"),
    opt_int("recent", 64, "the recent window: a streaming head's query at position i sees the keys i - recent < j <= i"),
    opt_str("regime", "always", "\"always\" (streaming over the prompt and the generation: DuoAttention, PruLong) or \"decode\" (the prompt read in full, streaming after it: kvpress)"),
    opt("prompt", "a generation's prompt; a text analysed alone is all prompt", "with regime \"decode\": the tokens read in full (of every text analysed)"),
];

options_enum!(RegimeName, "streaming regime", {
    Always = "always",
    Decode = "decode",
});

/// The typed streaming setting of an option map (`with_streaming`, `kv_curve`).
pub fn streaming_options(o: &Opts) -> ScriptResult<(i64, i64, Regime)> {
    let func = o.func();
    let int = |key: &str| -> ScriptResult<i64> {
        let v = o.f64_or_default(key)?;
        if v.fract() != 0.0 || !v.is_finite() {
            return err(format!("{func}: {key} must be a whole number of tokens, got {v}"));
        }
        Ok(v as i64)
    };
    let (sink, recent) = (int("sink")?, int("recent")?);
    let prompt = match o.value("prompt") {
        None => None,
        Some(v) => match v.as_int() {
            Ok(p) => Some(p),
            Err(_) => {
                return err(format!(
                    "{func}: prompt must be a number of tokens, got {}",
                    crate::script::convert::quote(v)
                ))
            }
        },
    };
    let regime = match o.parsed_or_default::<RegimeName>("regime")? {
        RegimeName::Always if prompt.is_some() => {
            return err(format!(
                "{func}: 'prompt' is the part the decode regime reads in full; it needs regime: \"decode\""
            ))
        }
        RegimeName::Always => Regime::Always,
        RegimeName::Decode => Regime::Decode { prompt },
    };
    Ok((sink, recent, regime))
}

/// The grid of a scorer's scores.
fn score_grid(m: &View, scorer: Scorer, g: Vec<Vec<f64>>, dataset: String, echo: crate::output::Echo) -> Grid {
    Grid { stat: format!("{scorer} score"), model: m.model.name(), dataset, kinds: vec![(Kind::Dec, g)], options: echo }
}

/// A cost as a script map.
fn cost_map(c: &KvCost, context: i64) -> Map {
    let mut out = Map::new();
    out.insert("context".into(), Dynamic::from(context));
    out.insert("groups".into(), Dynamic::from(c.groups));
    out.insert("streaming".into(), Dynamic::from(c.streaming));
    out.insert("entries".into(), Dynamic::from(c.entries));
    out.insert("full_entries".into(), Dynamic::from(c.full_entries));
    out.insert("bytes".into(), Dynamic::from(c.bytes));
    out.insert("full_bytes".into(), Dynamic::from(c.full_bytes));
    out.insert("fraction".into(), Dynamic::from(c.fraction()));
    out
}

/// Per layer `[layers][heads]` scores from a Grid's `dec` kind, checked against the model.
fn grid_scores(m: &View, g: &Grid, what: &str) -> ScriptResult<Vec<Vec<f64>>> {
    let f = "kv_curve";
    let Some((_, rows)) = g.kinds.iter().find(|(k, _)| *k == Kind::Dec) else {
        return err(format!("{f}: {what} has no 'dec' heads: scores of a decoder-only model's heads are needed"));
    };
    let s = m.model.kind_shape(Kind::Dec).script()?;
    if rows.len() != s.n_layers || rows.iter().any(|r| r.len() != s.n_heads) {
        return err(format!(
            "{f}: {what} is {} layers x {} heads; {} has {} x {}",
            rows.len(),
            rows.first().map_or(0, |r| r.len()),
            m.model.name(),
            s.n_layers,
            s.n_heads
        ));
    }
    Ok(rows.clone())
}

/// Latent attention caches one latent per token and layer for all its heads
/// (docs/methods.md#latent-attention): said once per call, in one line, where a streaming verb
/// runs on such a model (its groups are whole layers).
fn latent_note(m: &ScriptModel, f: &str) {
    let latent = (0..m.model.net.stack.len()).any(|l| {
        m.model.mixer(crate::model::Kind::Dec, l).and_then(|x| x.as_attention()).is_some_and(|a| a.latent.is_some())
    });
    if latent {
        crate::run::warn(&format!(
            "{f}: {} uses latent attention, whose cache holds one latent per token and layer for all its heads: streaming a head streams its whole layer, and a head alone saves no memory (docs/methods.md#latent-attention)",
            m.model.name()
        ));
    }
}

#[export_module]
pub mod api {
    /// A view of the model whose key/value groups of `heads` stream (docs/methods.md#streaming-heads):
    /// each of their query heads sees only the first `sink` tokens and the `recent` last ones
    /// (keys keep their positions); the other heads see every token. Under grouped-query
    /// attention naming one query head streams its whole group (the cache holds a group's keys
    /// once). Every analysis, ablation, patching run and generation of the view runs with it.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let s = m.with_streaming(["dec.0.2"], #{sink: 2, recent: 3});
    /// assert(s.to_string().contains("dec.0.kv1"));
    /// let text = "the cat and the dog sat on the mat in the park all day";
    /// assert(s.loss(text) != m.loss(text));
    /// assert(m.with_streaming(["dec.0.2"], #{sink: 2, recent: 64}).loss(text) == m.loss(text));
    /// ```
    #[rhai_fn(name = "with_streaming", return_raw, pure)]
    pub fn with_streaming_opts(m: &mut ScriptModel, heads: Dynamic, options: Map) -> ScriptResult<ScriptModel> {
        let f = "with_streaming";
        latent_note(m, f);
        let o = Opts::new(&options, f, WITH_STREAMING_OPTIONS)?;
        let (sink, recent, regime) = streaming_options(&o)?;
        let ids = crate::model::script::head_ids(m, &heads, f)?;
        m.streaming(&ids, sink, recent, regime, f).script()
    }

    /// How much each head of a decoder-only model needs the whole context, by one scorer
    /// (docs/methods.md#streaming-scores): "echo" and "induction" (RazorAttention, on repeated
    /// random tokens), "razor" (the larger of the two), "retrieval" (Wu et al.'s top-1 copy on
    /// a needle in a haystack), "headkv" (attention mass on the needle while it is copied), "duo"
    /// (kvpress's on-the-fly DuoAttention score over `data`). A Grid: higher = keep full.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let g = m.kv_scores("induction", #{n: 4, len: 20});
    /// assert(g.to_string().contains("induction score") && g["dec"].len() == 2);
    /// let d = m.kv_scores("duo", #{data: corpus(asset("pud_en.txt")).take(3), q_len: 50});
    /// assert(d["dec"][0][0] == d["dec"][0][1]);
    /// ```
    #[rhai_fn(name = "kv_scores", return_raw, pure)]
    pub fn kv_scores_opts(m: &mut ScriptModel, scorer: &str, options: Map) -> ScriptResult<Grid> {
        let f = "kv_scores";
        latent_note(m, f);
        let o = Opts::new(&options, f, KV_SCORES_OPTIONS)?;
        let scorer: Scorer = scorer.parse().or_else(|e: String| err(format!("{f}: {e}")))?;
        let so = ScoreOptions {
            probes: ProbeOptions {
                seed: o.usize_or_default("seed")? as u64,
                n: o.usize_or_default("n")?,
                len: o.usize_or_default("len")?,
                needle: o.usize_or_default("needle")?,
                haystack: o.usize_or_default("haystack")?,
            },
            q_len: o.usize_or_default("q_len")?.max(1) as i64,
        };
        let data = match o.value("data") {
            Some(d) => Some(crate::data::script::dataset_arg(d, &format!("{f}: data"))?),
            None => None,
        };
        if data.is_some() && scorer != Scorer::Duo {
            return err(format!("{f}: 'data' feeds the duo scorer; \"{scorer}\" runs on its seeded probes"));
        }
        let g = scores(m, scorer, data.as_ref(), &so, &crate::run::interrupted).or_else(|e| {
            err(match &data {
                Some(d) => format!("{f}: on {} (option 'data'): {e}", d.name),
                None => format!("{f}: {e}"),
            })
        })?;
        let (dataset, echo) = match (&data, scorer) {
            (Some(d), _) => {
                (d.name.clone(), vec![("scorer".into(), json!(scorer.to_string())), ("q_len".into(), json!(so.q_len))])
            }
            (None, _) => (
                format!(
                    "{} probe (seed {})",
                    if matches!(scorer, Scorer::Retrieval | Scorer::HeadKv) { "needle" } else { "repeated tokens" },
                    so.probes.seed
                ),
                vec![
                    ("scorer".into(), json!(scorer.to_string())),
                    ("seed".into(), json!(so.probes.seed)),
                    ("n".into(), json!(so.probes.n)),
                    ("len".into(), json!(so.probes.len)),
                    ("needle".into(), json!(so.probes.needle)),
                    ("haystack".into(), json!(so.probes.haystack)),
                ],
            ),
        };
        Ok(score_grid(m, scorer, g, dataset, echo))
    }

    /// `kv_scores` with the default options.
    ///
    /// ```rhai
    /// let g = load_model("tests/fixtures/tiny_hf/gpt2").kv_scores("echo");
    /// assert(g["dec"][1].len() == 4);
    /// ```
    #[rhai_fn(name = "kv_scores", return_raw, pure)]
    pub fn kv_scores(m: &mut ScriptModel, scorer: &str) -> ScriptResult<Grid> {
        kv_scores_opts(m, scorer, Map::new())
    }

    /// The key/value cache of this view for one sequence of `context` tokens, counted from
    /// shapes (docs/methods.md#streaming-heads): `groups`, `streaming` (groups), `entries` and
    /// `full_entries` (a group's key and value at one position), `bytes`, `full_bytes` (in the
    /// model's dtype) and `fraction` (entries kept).
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let c = m.with_streaming(["dec.0.0"], #{sink: 2, recent: 6}).kv_cost(100);
    /// assert(c.groups == 4 && c.streaming == 1 && c.entries == 3 * 100 + 8);
    /// assert(c.full_bytes == 4 * 100 * 2 * 8 * 4);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn kv_cost(m: &mut ScriptModel, context: i64) -> ScriptResult<Map> {
        if context < 1 {
            return err(format!("kv_cost: context must be 1 or more tokens, got {context}"));
        }
        if !m.model.decoder_only() {
            return err(format!(
                "kv_cost: {} is not a decoder-only model: it keeps no key/value cache",
                m.model.name()
            ));
        }
        Ok(cost_map(&crate::analysis::streaming::kv_cost(m, context, None), context))
    }

    /// PruLong's KV footprint of this view for one sequence (docs/methods.md#kv-footprint):
    /// a prompt of `prompt` tokens read in chunks of `chunk`, then `decode` tokens generated one
    /// at a time; each query holds the entries its key/value groups keep while it runs.
    /// `footprint` (entry-steps over those of the full cache), `peak` (the most entries held at
    /// once, over the full cache's), and the counts `entry_steps`, `full_entry_steps`,
    /// `peak_entries`, `full_peak_entries`.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let f = m.with_streaming(["dec.0.0"], #{sink: 2, recent: 6}).kv_footprint(100, #{decode: 20, chunk: 30});
    /// assert(f.footprint < 1.0 && f.full_entry_steps == 4 * 120 * 121 / 2);
    /// assert(m.kv_footprint(100, #{decode: 20}).footprint == 1.0);
    /// ```
    #[rhai_fn(name = "kv_footprint", return_raw, pure)]
    pub fn kv_footprint_opts(m: &mut ScriptModel, prompt: i64, options: Map) -> ScriptResult<Map> {
        let f = "kv_footprint";
        latent_note(m, f);
        let o = Opts::new(&options, f, KV_FOOTPRINT_OPTIONS)?;
        if prompt < 1 {
            return err(format!("{f}: prompt must be 1 or more tokens, got {prompt}"));
        }
        if !m.model.decoder_only() {
            return err(format!("{f}: {} is not a decoder-only model: it keeps no key/value cache", m.model.name()));
        }
        let decode = o.usize_or_default("decode")? as i64;
        let chunk = o.usize_or_default("chunk")? as i64;
        if chunk < 1 {
            return err(format!("{f}: chunk must be 1 or more tokens, got {chunk}"));
        }
        // One entry per prompt chunk and decoded token, for the full and the streaming groups.
        let steps = prompt as f64 / chunk as f64 + decode as f64;
        crate::budget::check(&format!("{f}: prompt {prompt} and decode {decode} ({steps:.0} steps)"), steps * 64.0)
            .or_else(err)?;
        let fp = crate::analysis::streaming::kv_footprint(m, prompt, decode, chunk);
        let mut out = Map::new();
        out.insert("prompt".into(), Dynamic::from(prompt));
        out.insert("decode".into(), Dynamic::from(decode));
        out.insert("chunk".into(), Dynamic::from(chunk));
        out.insert("footprint".into(), Dynamic::from(fp.fraction()));
        out.insert("peak".into(), Dynamic::from(fp.peak_fraction()));
        out.insert("entry_steps".into(), Dynamic::from(fp.entry_steps));
        out.insert("full_entry_steps".into(), Dynamic::from(fp.full_entry_steps));
        out.insert("peak_entries".into(), Dynamic::from(fp.peak));
        out.insert("full_peak_entries".into(), Dynamic::from(fp.full_peak));
        Ok(out)
    }

    /// `kv_footprint` of the prompt alone (no tokens generated), read in chunks of 128: a
    /// prompt of one chunk is held whole.
    ///
    /// ```rhai
    /// let s = load_model("tests/fixtures/tiny_hf/gpt2").with_streaming(["dec.1.3"], #{sink: 1, recent: 4});
    /// assert(s.kv_footprint(300).footprint < 1.0 && s.kv_footprint(64).footprint == 1.0);
    /// ```
    #[rhai_fn(name = "kv_footprint", return_raw, pure)]
    pub fn kv_footprint(m: &mut ScriptModel, prompt: i64) -> ScriptResult<Map> {
        kv_footprint_opts(m, prompt, Map::new())
    }

    /// The key/value cache a generation of `n` tokens after `text` leaves, measured on its
    /// tensors: the cache holds one key and value per key/value group, a streaming group's
    /// only at the positions a later query can see. `bytes` (the
    /// tensors' sizes) beside `counted` (`kv_cost` at the same context: equal), `context`,
    /// `prompt`, `full_bytes`.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let c = m.with_streaming(["dec.0.0"], #{sink: 2, recent: 4}).kv_cache("the cat and the dog sat on the mat", 8);
    /// assert(c.bytes == c.counted && c.bytes < c.full_bytes);
    /// let plain = m.kv_cache("the cat", 3);
    /// assert(plain.bytes == plain.full_bytes);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn kv_cache(m: &mut ScriptModel, text: &str, n: i64) -> ScriptResult<Map> {
        let f = "kv_cache";
        if n < 0 {
            return err(format!("{f}: n must be 0 or more tokens, got {n}"));
        }
        if !m.model.decoder_only() {
            return err(format!("{f}: {} is not a decoder-only model: it keeps no key/value cache", m.model.name()));
        }
        let (_, cache) =
            m.model.generate_run(text, n as usize, &m.gates().script()?, true).or_else(|e| err(format!("{f}: {e}")))?;
        let counted = crate::analysis::streaming::kv_cost(m, cache.len, cache.prompt);
        let mut out = Map::new();
        out.insert("context".into(), Dynamic::from(cache.len));
        out.insert("prompt".into(), Dynamic::from(cache.prompt.unwrap_or(0)));
        out.insert("bytes".into(), Dynamic::from(cache.bytes()));
        out.insert("counted".into(), Dynamic::from(counted.bytes));
        out.insert("full_bytes".into(), Dynamic::from(counted.full_bytes));
        Ok(out)
    }

    /// Quality against the key/value cache kept (docs/methods.md#kv-curve): for each fraction,
    /// the key/value groups with the highest scores stay full and the rest stream; over the
    /// data cut into sequences of `context` tokens, the next-token loss and the KL to this model
    /// on the positions from `prompt` on, the induction loss on repeated random tokens, the
    /// synthetic passkey's accuracy, and the cache kept, counted exactly. `scores`: a Grid (`kv_scores`, `head_types`, any per-head
    /// grid) or a map of them (one curve each). A Table, one row per scorer and fraction
    /// (`kv_plot` draws it).
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let d = corpus(asset("pud_en.txt")).take(20);
    /// let t = m.kv_curve(#{echo: m.kv_scores("echo", #{n: 2, len: 10}), retrieval: m.kv_scores("retrieval", #{n: 2})}, d,
    ///                    #{fractions: [0.5, 1.0], context: 64, sink: 2, recent: 8, induction: 0});
    /// assert(t.len() == 4);
    /// assert(t[1].kl == 0.0 && t[0].kv_kept < 1.0);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn kv_curve(m: &mut ScriptModel, scores: Dynamic, data: Dynamic, options: Map) -> ScriptResult<Table> {
        let f = "kv_curve";
        latent_note(m, f);
        let o = Opts::new(&options, f, KV_CURVE_OPTIONS)?;
        m.require(f, crate::model::view::Needs::NoStreaming).script()?;
        if !m.model.decoder_only() {
            return err(format!("{f}: {} is not a decoder-only model: it keeps no key/value cache", m.model.name()));
        }
        let named: Vec<(String, Grid)> = if let Some(g) = scores.clone().try_cast::<Grid>() {
            vec![(g.stat.trim_end_matches(" score").to_string(), g)]
        } else if let Some(map) = scores.clone().try_cast::<Map>() {
            map.iter()
                .map(|(k, v)| match v.clone().try_cast::<Grid>() {
                    Some(g) => Ok((k.to_string(), g)),
                    None => err(format!(
                        "{f}: scores.{k} must be a Grid of per-head scores, got {}",
                        crate::script::convert::quote(v)
                    )),
                })
                .collect::<ScriptResult<_>>()?
        } else {
            return err(format!(
                "{f}: scores must be a Grid or a map of Grids, got {}",
                crate::script::convert::quote(&scores)
            ));
        };
        let fractions = o.numbers("fractions")?.unwrap_or_else(|| vec![0.25, 0.5, 0.75, 0.875]);
        if let Some(bad) = fractions.iter().find(|x| !(**x > 0.0 && **x <= 1.0)) {
            return err(format!("{f}: fractions must lie in (0, 1], got {bad}"));
        }
        let context = o.usize_or_default("context")? as i64;
        let prompt = match o.value("prompt") {
            Some(_) => o.usize("prompt")?.unwrap_or(0) as i64,
            None => context / 2,
        };
        if prompt < 1 || prompt >= context {
            return err(format!(
                "{f}: prompt must lie in 1..{} (the positions measured start there), got {prompt}",
                context - 1
            ));
        }
        let sink = o.usize_or_default("sink")? as i64;
        let recent = o.usize_or_default("recent")? as i64;
        if recent < 1 {
            return err(format!("{f}: recent must be 1 or more, got {recent}"));
        }
        if sink + recent >= context {
            return err(format!(
                "{f}: sink + recent = {} covers the whole context of {context}: nothing would stream",
                sink + recent
            ));
        }
        let regime = match o.parsed_or_default::<RegimeName>("regime")? {
            RegimeName::Always => Regime::Always,
            RegimeName::Decode if sink + recent >= prompt => return err(format!("{f}: sink + recent = {} covers the prompt of {prompt} the decode regime reads in full: nothing would stream", sink + recent)),
            RegimeName::Decode => Regime::Decode { prompt: Some(prompt) },
        };
        let d = crate::data::script::dataset_arg(&data, &format!("{f}: data"))?;
        let seqs = chunks(&m.model, &d, context).or_else(|e| err(e.to_string()))?;
        let chunk = o.usize_or_default("chunk")? as i64;
        if chunk < 1 {
            return err(format!("{f}: chunk must be 1 or more tokens, got {chunk}"));
        }
        let co = CurveOptions {
            fractions: fractions.clone(),
            context,
            measure_from: prompt,
            sink,
            recent,
            regime,
            chunk,
            induction: o.usize_or_default("induction")?,
            seed: o.usize_or_default("seed")? as u64,
            passkey: o.usize_or_default("passkey")?,
            needle: o.usize_or_default("needle")?,
        };
        if co.passkey > 0 && (co.needle < 2 || 2 * co.needle as i64 >= context) {
            return err(format!(
                "{f}: a passkey of {} tokens must have 2 or more and fit twice in the context of {context}",
                co.needle
            ));
        }
        let mut t = Table::new(
            [
                "scorer",
                "groups_full",
                "kv_kept",
                "kv_bytes",
                "footprint",
                "peak",
                "loss",
                "kl",
                "induction_loss",
                "passkey",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        );
        t.title = Some(format!("kv_curve: {} on {} ({} sequences of {context}, measured from {prompt}, footprint chunk {}; sink {sink}, recent {recent}, regime {})", m.model.name(), d.name, seqs.len(), co.chunk, regime_name(regime)));
        let groups: Vec<Vec<Vec<f64>>> = named
            .iter()
            .map(|(name, g)| Ok(group_scores(m, &grid_scores(m, g, &format!("scores '{name}'"))?)))
            .collect::<ScriptResult<_>>()?;
        let mut progress = |done: usize, total: usize| crate::run::progress(f, done, total);
        let curves = curve(m, &groups, &seqs, &co, &crate::run::interrupted, &mut progress)
            .or_else(|e| err(format!("{f}: {e}")))?;
        for ((name, _), points) in named.iter().zip(curves) {
            for p in points {
                t.push_row(vec![
                    Cell::Text(name.clone()),
                    Cell::Float(p.fraction),
                    Cell::Float(p.cost.fraction()),
                    Cell::Int(p.cost.bytes),
                    Cell::Float(p.footprint.fraction()),
                    Cell::Float(p.footprint.peak_fraction()),
                    Cell::Float(p.loss),
                    Cell::Float(p.kl),
                    if p.induction_loss.is_finite() { Cell::Float(p.induction_loss) } else { Cell::Empty },
                    if p.passkey.is_finite() { Cell::Float(p.passkey) } else { Cell::Empty },
                ])
                .or_else(|e| err(format!("{f}: {e}")))?;
            }
        }
        Ok(t)
    }

    /// A `kv_curve` table as a line chart: `metric` ("kl", "loss", "induction_loss" or "passkey") against
    /// the key/value cache kept, one line per scorer.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let t = m.kv_curve(m.kv_scores("echo", #{n: 2, len: 10}), corpus(asset("pud_en.txt")).take(20), #{fractions: [0.5, 1.0], context: 64, sink: 2, recent: 8, induction: 0});
    /// assert(kv_plot(t, "kl").to_svg().contains("echo"));
    /// ```
    #[rhai_fn(name = "kv_plot", return_raw)]
    pub fn kv_plot(t: Table, metric: &str) -> ScriptResult<Plot> {
        kv_plot_against(t, metric, "kv_kept")
    }

    /// `kv_plot` against another measure of the cache: `x` "kv_kept" (the cache at the end of
    /// a sequence), "footprint" (PruLong's, over the whole sequence) or "peak".
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let t = m.kv_curve(m.kv_scores("echo", #{n: 2, len: 10}), corpus(asset("pud_en.txt")).take(20), #{fractions: [0.5, 1.0], context: 64, sink: 2, recent: 8, induction: 0, chunk: 16});
    /// assert(kv_plot(t, "kl", "footprint").to_svg().contains("KV footprint"));
    /// ```
    #[rhai_fn(name = "kv_plot", return_raw)]
    pub fn kv_plot_against(t: Table, metric: &str, x: &str) -> ScriptResult<Plot> {
        let f = "kv_plot";
        let x_label = match x {
            "kv_kept" => "key/value cache kept",
            "footprint" => "KV footprint (entries x lifespan)",
            "peak" => "peak key/value entries",
            other => return err(format!("{f}: x must be \"kv_kept\", \"footprint\" or \"peak\", got {other:?}")),
        };
        let col = |name: &str| {
            t.column_index(name)
                .or_else(|_| err(format!("{f}: the table has no '{name}' column: pass a kv_curve table")))
        };
        if !["kl", "loss", "induction_loss", "passkey"].contains(&metric) {
            return err(format!(
                "{f}: metric must be \"kl\", \"loss\", \"induction_loss\" or \"passkey\", got {metric:?}"
            ));
        }
        let series = Series::by(&t, col("scorer")?, col(x)?, col(metric)?);
        let mut p = Plot::new(PlotKind::Line { series }, "").or_else(|e| err(format!("{f}: {e}")))?;
        p.x_label = x_label.into();
        p.y_label = metric.into();
        // The table's title without its counts: "kv_curve: MODEL on DATA, sink S, recent R, regime G".
        let title = t.title.clone().unwrap_or_default();
        p.title = match (title.split_once(" ("), title.rsplit_once("; ")) {
            (Some((head, _)), Some((_, setting))) => format!("{head}, {}", setting.trim_end_matches(')')),
            _ => title,
        };
        Ok(p)
    }

    /// `with_streaming` with the default sink (4) and recent window (64), regime "always".
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// assert(m.with_streaming(["dec.1.3"]).to_string().contains("4 sink, 64 recent"));
    /// ```
    #[rhai_fn(name = "with_streaming", return_raw, pure)]
    pub fn with_streaming(m: &mut ScriptModel, heads: Dynamic) -> ScriptResult<ScriptModel> {
        with_streaming_opts(m, heads, Map::new())
    }
}
