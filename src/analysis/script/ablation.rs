//! Ablation on a model: `m.ablate(data, heads, #{...})` and `m.ablation_sweep(data, #{...})`
//! (docs/methods.md#masking-and-ablation).

use super::sharded::{cell, echo_of, grid_from, present_heads, valid_heads};
use crate::analysis::ablation::{Ablation, Metric, SweepAcc, SweepOptions};
use crate::data::script::Plan;
use crate::data::Dataset;
use crate::grid::Grid;
use crate::metrics::bleu::BleuAcc;
use crate::model::script::kinds_option;
use crate::model::script::ScriptModel;
use crate::model::view::Needs;
use crate::model::{HeadId, Kind};
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt, opt_int, OptSpec, Opts, ScriptResult};
use rhai::plugin::*;
use rhai::{Dynamic, Map};
use serde_json::json;

/// The sweep's progress label: it counts (sentence, head) pairs swept, not batches.
pub const SWEEP_PROGRESS: &str = "ablation sweep (sentence x head)";
/// The sweep's first phase: the unmasked metric, by sentences.
pub const SWEEP_BASE_PROGRESS: &str = "ablation sweep: unmasked pass (sentences)";

pub const ABLATE_OPTIONS: &[OptSpec] = &[
    opt(
        "metric",
        "\"loss\" for language and translation models, else \"cosine\"",
        "\"loss\", \"kl\", \"bleu\" or \"cosine\" (docs/methods.md#masking-and-ablation)",
    ),
    opt("kinds", "every kind", "the attention kinds taking part"),
    opt_int("batch_tokens", crate::model::batch::DEFAULT_BATCH_TOKENS as i64, "tokens per batch, padding included"),
    ABLATION_OPTION,
    REFERENCE_OPTION,
    SEED_OPTION,
    PER_POSITION_OPTION,
    crate::model::script::TGT_LANG,
];
pub use crate::analysis::ablation::{ABLATION_OPTION, PER_POSITION_OPTION, REFERENCE_OPTION, SEED_OPTION};
/// `with_mask`'s options.
pub const WITH_MASK_OPTIONS: &[OptSpec] = &[
    ABLATION_OPTION,
    opt(
        "reference",
        "none: required with ablation \"mean\" or \"resample\"",
        "the Dataset whose tokens give mean ablation's means, or resample ablation's sentences",
    ),
    opt_int(
        "batch_tokens",
        crate::model::batch::DEFAULT_BATCH_TOKENS as i64,
        "tokens per batch when the means are computed",
    ),
    SEED_OPTION,
    PER_POSITION_OPTION,
];

/// Why a reference dataset was refused: it gives mean ablation's means.
fn reference_needs_mean(func: &str) -> String {
    format!("{func}: 'reference' gives mean ablation's means or resample ablation's sentences; it needs ablation: \"mean\" or \"resample\"")
}

/// The ablation options of a call, typed: the mode, its reference dataset, resample's seed and
/// whether means are taken per position.
pub struct AblationArgs {
    pub mode: Ablation,
    pub reference: Option<Dataset>,
    pub seed: u64,
    pub per_position: bool,
}

/// The `ablation`, `reference`, `seed` and `per_position` options (a reference refused for
/// "zero", `per_position` for anything but "mean").
fn ablation_options(o: &Opts) -> ScriptResult<AblationArgs> {
    let func = o.func();
    let mode: Ablation = o.parsed_or_default("ablation")?;
    let reference = match o.value("reference") {
        Some(_) if mode == Ablation::Zero => return err(reference_needs_mean(func)),
        Some(r) => Some(crate::data::script::dataset_arg(r, &format!("{func}: option 'reference'"))?),
        None => None,
    };
    let per_position = if o.has("per_position") { o.bool_or_default("per_position")? } else { false };
    if per_position && mode != Ablation::Mean {
        return err(format!("{func}: per_position takes means per position; it needs ablation: \"mean\""));
    }
    let seed = if o.has("seed") { o.usize_or_default("seed")? as u64 } else { 0 };
    Ok(AblationArgs { mode, reference, seed, per_position })
}

/// Tokens per batch for mean ablation's means: the call's `batch_tokens` when given, else
/// `with_mask`'s default (a sweep's own default, 256, is for its masked batches).
fn mean_batch_tokens(o: &Opts) -> ScriptResult<usize> {
    if o.has("batch_tokens") {
        o.usize_or_default("batch_tokens")
    } else {
        Ok(crate::model::batch::DEFAULT_BATCH_TOKENS)
    }
}

/// The view `m` under an ablation mode: itself for "zero" (its own fill kept); for "mean" a
/// view whose closed heads carry their means over `reference` (else `data`), per position with
/// `per_position`; for "resample" their contexts on a sentence of `reference` (else `data`)
/// drawn for each sentence measured; with the options this echoes. Errors start with `func`.
pub fn ablated_view(
    m: &ScriptModel,
    func: &str,
    a: &AblationArgs,
    data: Option<&Dataset>,
    batch_tokens: usize,
) -> Result<(ScriptModel, crate::output::Echo), String> {
    if a.mode == Ablation::Zero {
        if a.reference.is_some() {
            return Err(reference_needs_mean(func));
        }
        return Ok((m.clone(), vec![("ablation".into(), json!("zero"))]));
    }
    let reference = match (&a.reference, data) {
        (Some(r), _) => {
            r.require_sentences(func)?;
            r
        }
        (None, Some(d)) => d,
        (None, None) => {
            return Err(format!(
                "{func}: ablation \"{}\" needs a reference dataset: #{{ablation: \"{}\", reference: corpus(...)}}",
                a.mode, a.mode
            ))
        }
    };
    // Where the reference came from, for errors: the option, or the data measured.
    let from = if a.reference.is_some() { " (option 'reference')" } else { "" };
    let stop = crate::run::interrupted;
    let mut v = m.clone();
    let (fills, source, mode, mut echo) = if a.mode == Ablation::Resample {
        let src = crate::analysis::ablation::resample_source(&m.model, reference, a.seed)
            .map_err(|e| format!("{func}: the resampled contexts of the reference {}{from}: {e}", reference.name))?;
        (
            crate::model::nn::Fills::default(),
            Some(std::rc::Rc::new(src)),
            format!("resample (seed {})", a.seed),
            vec![
                ("ablation".into(), json!("resample")),
                ("reference".into(), json!(reference.name)),
                ("seed".into(), json!(a.seed)),
            ],
        )
    } else {
        let kinds: Vec<Kind> = m.model.kinds().iter().map(|s| s.kind).collect();
        let fills = crate::analysis::ablation::mean_fill(
            &m.model,
            reference,
            &kinds,
            batch_tokens,
            &crate::model::nn::Gates::none(),
            &stop,
        )
        .map_err(|e| format!("{func}: the means of the reference {}{from}: {e}", reference.name))?;
        let source = if a.per_position {
            Some(std::rc::Rc::new(
                crate::analysis::ablation::position_means(&m.model, reference, batch_tokens, &stop).map_err(|e| {
                    format!("{func}: the means per position of the reference {}{from}: {e}", reference.name)
                })?,
            ))
        } else {
            None
        };
        let mode = if a.per_position { "mean per position" } else { "mean" };
        (
            fills,
            source,
            mode.to_string(),
            vec![("ablation".into(), json!("mean")), ("reference".into(), json!(reference.name))],
        )
    };
    if a.per_position {
        echo.push(("per_position".into(), json!(true)));
    }
    v.ablation = Some(std::rc::Rc::new(crate::model::script::MeanAblation {
        fills,
        source,
        mode,
        reference: reference.name.clone(),
        digest: reference.digest(),
    }));
    Ok((v, echo))
}

/// The view `m` under the ablation options of `o` (see [`ablated_view`]).
pub fn ablation_view(
    m: &ScriptModel,
    o: &Opts,
    data: Option<&Dataset>,
) -> ScriptResult<(ScriptModel, crate::output::Echo)> {
    let a = ablation_options(o)?;
    Ok(ablated_view(m, o.func(), &a, data, mean_batch_tokens(o)?)?)
}
pub const SWEEP_OPTIONS: &[OptSpec] = &[
    opt(
        "metric",
        "\"loss\" for language and translation models, else \"cosine\"",
        "\"loss\", \"kl\", \"bleu\" or \"cosine\" (docs/methods.md#masking-and-ablation)",
    ),
    opt("kinds", "every kind", "the kinds whose heads are masked one at a time"),
    opt("layers", "every layer", "the layers swept: an index, an array or a range (`20..30`); other cells are NaN"),
    opt(
        "heads",
        "every head",
        "the heads swept: names, Heads or a table of them (a grid's `top(k)`); other cells are NaN",
    ),
    crate::analysis::ablation::SWEEP_BATCH_TOKENS_OPTION,
    crate::data::script::SHARD_OPTION,
    ABLATION_OPTION,
    REFERENCE_OPTION,
    SEED_OPTION,
    PER_POSITION_OPTION,
    crate::model::script::TGT_LANG,
];
/// The options of the method `m.bleu(data, #{...})` (the free `bleu(hyps, refs, #{...})` has
/// its own list, `metrics::bleu::script::BLEU_OPTIONS`).
pub const BLEU_OPTIONS: &[OptSpec] = &[
    opt_int("batch_tokens", crate::model::batch::DEFAULT_BATCH_TOKENS as i64, "tokens per batch, padding included"),
    crate::data::script::SHARD_OPTION,
    crate::model::script::TGT_LANG,
];

/// The `metric` option: the one given, else `None` (the model's default).
fn metric_option(o: &Opts) -> ScriptResult<Option<Metric>> {
    let func = o.func();
    o.string("metric")?.map(|x| x.parse()).transpose().or_else(|e: String| err(format!("{func}: {e}")))
}

/// What `ablate` and `ablation_sweep` share: the data prepared for `metric` (else the model's
/// default) and the options echoed.
fn prepared(
    m: &ScriptModel,
    d: &Dataset,
    func: &str,
    metric: Option<Metric>,
    batch_tokens: usize,
) -> Result<(crate::analysis::ablation::Prepared, crate::output::Echo), String> {
    let metric = metric.unwrap_or_else(|| Metric::default_for(&m.model));
    let gates = m.gates().map_err(|e| e.to_string())?;
    let p = crate::analysis::ablation::prepare_packed(&m.model, d, metric, batch_tokens, gates)
        .map_err(|e| format!("{func}: {e}"))?;
    let echo = vec![
        ("metric".to_string(), serde_json::json!(metric.to_string())),
        ("targets".into(), serde_json::json!(p.targets_from.to_string())),
        ("batch_tokens".into(), serde_json::json!(batch_tokens)),
    ];
    Ok((p, echo))
}

/// The sweep's typed options from a map checked against [`SWEEP_OPTIONS`]: what it gives,
/// else the list's defaults. `kinds` is checked against `m`'s (every kind when not given).
fn sweep_options_from(o: &Opts, m: &ScriptModel) -> ScriptResult<SweepOptions> {
    let a = ablation_options(o)?;
    let metric = metric_option(o)?;
    let heads = match o.value("heads") {
        Some(h) => Some(crate::model::script::head_ids(m, h, &format!("{}: option 'heads'", o.func()))?),
        None => None,
    };
    // An empty list chooses no kind and no head: refused as such, not as a layer out of range.
    if heads.as_ref().is_some_and(|h| h.is_empty()) {
        return err(format!(
            "{}: option 'heads' is empty: name the heads to sweep, or leave it out for every head",
            o.func()
        ));
    }
    // Named heads choose the kinds when `kinds` is not given; given, it must hold theirs.
    let kinds = match (&heads, o.has("kinds")) {
        (Some(ids), false) => {
            let mut k: Vec<Kind> = Vec::new();
            for id in ids {
                if !k.contains(&id.kind) {
                    k.push(id.kind);
                }
            }
            k
        }
        _ => kinds_option(m, o)?,
    };
    if let Some(ids) = &heads {
        if let Some(id) = ids.iter().find(|id| !kinds.contains(&id.kind)) {
            return err(format!(
                "{}: option 'heads': {id} is not of the kinds swept ({})",
                o.func(),
                kind_names(&kinds)
            ));
        }
    }
    let only = match o.indices("layers")? {
        None => heads,
        Some(layers) => {
            let deepest =
                kinds.iter().filter_map(|k| m.model.kind_shape(*k).ok()).map(|s| s.n_layers).max().unwrap_or(0);
            if let Some(&l) = layers.iter().find(|&&l| l >= deepest) {
                return err(format!(
                    "{}: option 'layers': layer {l} is out of range: {} has {deepest} layers (0..{deepest})",
                    o.func(),
                    m.model.name()
                ));
            }
            let mut ids = Vec::new();
            for &k in &kinds {
                let Ok(shape) = m.model.kind_shape(k) else { continue };
                for &l in layers.iter().filter(|&&l| l < shape.n_layers) {
                    for head in 0..shape.n_heads {
                        let id = HeadId { kind: k, layer_idx: l, head };
                        if heads.as_ref().is_none_or(|h| h.contains(&id)) {
                            ids.push(id);
                        }
                    }
                }
            }
            Some(ids)
        }
    };
    if only.as_ref().is_some_and(|ids| ids.is_empty()) {
        return err(format!("{}: options 'layers' and 'heads' leave no head to sweep", o.func()));
    }
    let kinds = Some(kinds);
    Ok(SweepOptions {
        metric,
        kinds,
        batch_tokens: o.usize_or_default("batch_tokens")?,
        ablation: a.mode,
        reference: a.reference,
        mean_batch_tokens: mean_batch_tokens(o)?,
        seed: a.seed,
        per_position: a.per_position,
        only,
    })
}

fn kind_names(kinds: &[Kind]) -> String {
    kinds.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", ")
}

/// Every head masked alone, on the rows of `plan`, under typed options: what
/// `m.ablation_sweep(data, #{...})` and the library API run.
pub fn ablation_sweep_planned(m: &ScriptModel, d: &Dataset, opts: &SweepOptions, plan: &Plan) -> Result<Grid, String> {
    let f = "ablation_sweep";
    m.require(f, Needs::NoClosed).map_err(|e| e.to_string())?;
    d.require_sentences(f)?;
    let kinds = match &opts.kinds {
        Some(kinds) => {
            for k in kinds {
                m.model.kind_shape(*k).map_err(|e| format!("{f}: {e}"))?;
            }
            kinds.clone()
        }
        None => m.model.kinds().iter().map(|k| k.kind).collect(),
    };
    // Mean ablation's means, and resample ablation's sentences, come from the whole reference
    // (not one shard's part of it); a sentence draws by its own ids, as it does unsharded.
    let args = AblationArgs {
        mode: opts.ablation,
        reference: opts.reference.clone(),
        seed: opts.seed,
        per_position: opts.per_position,
    };
    let (mv, ablation) = ablated_view(m, f, &args, Some(d), opts.mean_batch_tokens)?;
    let m = &mv;
    let part = plan.data(d, f)?;
    let (p, mut echo) = prepared(m, &part, f, opts.metric, opts.batch_tokens)?;
    echo.extend(ablation);
    let stop = crate::run::interrupted;
    let mut first = |done: usize, total: usize| crate::run::progress(SWEEP_BASE_PROGRESS, done, total);
    let base = crate::analysis::ablation::evaluate_reporting(&m.model, &p, &p.base, &stop, &mut first)
        .map_err(|e| format!("{f}: {e}"))?;
    let mut progress = |done: usize, total: usize| crate::run::progress(SWEEP_PROGRESS, done, total);
    let only = opts.only.as_deref();
    let accs = crate::analysis::ablation::sweep_acc(&m.model, &p, &kinds, only, &stop, &mut progress)
        .map_err(|e| format!("{f}: {e}"))?;
    // Cells of heads not swept are NaN, as a removed head's.
    let mut valid = present_heads(&m.model, &kinds);
    if let Some(only) = only {
        for (k, rows) in valid.iter_mut() {
            for (l, row) in rows.iter_mut().enumerate() {
                for (h, ok) in row.iter_mut().enumerate() {
                    *ok &= only.contains(&HeadId { kind: *k, layer_idx: l, head: h });
                }
            }
        }
        echo.push(("heads".into(), json!(only.iter().map(|id| id.to_string()).collect::<Vec<_>>())));
    }
    let identity = plan.identity(m.identity(), json!({"options": echo, "heads": valid_heads(&valid)}));
    let acc = SweepAcc::new(base, accs);
    let g = finish_sweep(&identity, &acc).map_err(|e| format!("{f}: {e}"))?;
    plan.seal(f, identity, &acc, g, |g| &mut g.options, Grid::to_json)
}

/// The sweep over the whole of `data` (the library API's `Model::ablation_sweep`).
pub fn ablation_sweep(m: &ScriptModel, d: &Dataset, opts: &SweepOptions) -> Result<Grid, String> {
    ablation_sweep_planned(m, d, opts, &Plan::whole(d))
}

/// The sweep's grid from its accumulators (one process's, or merged shards').
pub fn finish_sweep(identity: &serde_json::Value, acc: &SweepAcc) -> Result<Grid, String> {
    let mut echo = echo_of(&identity["options"]);
    let metric =
        echo.iter().find(|(k, _)| k == "metric").and_then(|(_, v)| v.as_str().map(str::to_string)).unwrap_or_default();
    let base = acc.base.value();
    let kinds = grid_from(identity, |k, l, h| Ok(cell(&acc.kinds, k, l, h)?.value()))?;
    echo.push(("base".into(), crate::script::convert::json_f64(base)));
    Ok(Grid {
        stat: format!("{metric} with the head masked (base {})", crate::output::fixed(base, 4)),
        model: identity["model"]["name"].as_str().unwrap_or_default().into(),
        dataset: identity["data"]["name"].as_str().unwrap_or_default().into(),
        kinds,
        options: echo,
    })
}

/// `m.bleu(data)` from its accumulators.
pub fn finish_bleu(identity: &serde_json::Value, acc: &BleuAcc) -> Result<Map, String> {
    let mut r = crate::metrics::bleu::script::bleu_map(&acc.counts.bleu());
    // `bleu(hyps, refs)` has no model and no dataset name.
    if let Some(model) = identity["model"]["name"].as_str() {
        r.insert("model".into(), Dynamic::from(model.to_string()));
        r.insert("dataset".into(), Dynamic::from(identity["data"]["name"].as_str().unwrap_or_default().to_string()));
    }
    r.insert("sentences".into(), Dynamic::from(acc.sentences as i64));
    Ok(r)
}

#[export_module]
pub mod api {
    use super::*;

    /// The effect of masking `heads` together on a metric over a dataset: a map with `metric`,
    /// `value` (masked), `base` (unmasked), `delta`, `heads` and `targets` ("references" or
    /// "teacher": the full model's greedy outputs). Options: `metric` ("loss" | "kl" | "bleu"
    /// | "cosine"; default loss for models that generate, cosine for encoders),
    /// `batch_tokens` (1024). `heads` may be `Head`s, printed names (`"enc.0.1"`) or a table
    /// of heads such as `g.top(k)`.
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let r = m.ablate(corpus(asset("pud_en.txt")).take(5), [m.head("enc", 0, 1)], #{metric: "kl"});
    /// assert(r.base == 0.0 && r.value > 0.0 && r.targets == "teacher");
    /// let d = corpus(asset("pud_en.txt")).take(3);
    /// let g = m.confidence(d);
    /// assert(m.ablate(d, g.top(2), #{metric: "kl"}).heads == m.ablate(d, [g.top(2)[0].head, g.top(2)[1].head], #{metric: "kl"}).heads);
    /// ```
    ///
    /// `ablation`: "zero" (default), "mean" (each closed head's mean context over
    /// `reference`'s tokens) or "resample" (its context on a sentence of `reference` drawn for
    /// each sentence by `seed`; docs/methods.md#resample-ablation).
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let d = corpus(asset("pud_en.txt")).take(6);
    /// let r = m.ablate(d, ["dec.1.2"], #{ablation: "resample", seed: 1});
    /// assert(r.ablation == "resample" && r.seed == 1 && r.value != m.ablate(d, ["dec.1.2"]).value);
    /// ```
    #[rhai_fn(name = "ablate", return_raw, pure)]
    pub fn ablate_opts(m: &mut ScriptModel, data: Dynamic, heads: Dynamic, options: Map) -> ScriptResult<Map> {
        let ids = crate::model::script::head_ids(m, &heads, "ablate")?;
        let d = crate::data::script::dataset_arg(&data, "ablate")?;
        let o = Opts::new(&options, "ablate", ABLATE_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let (m, ablation) = ablation_view(m, &o, Some(&d))?;
        let metric = metric_option(&o)?;
        kinds_option(&m, &o)?;
        let (p, mut echo) = prepared(&m, &d, "ablate", metric, o.usize_or_default("batch_tokens")?)?;
        echo.extend(ablation);
        // The view's own gates (closed heads, continuous gates, means) with `heads` closed too.
        let gates = m.closing(&ids).gates().script()?;
        let stop = crate::run::interrupted;
        // Heads all in the self-attention stack: the layers below the lowest run once for both.
        let stack = m.model.net.stack_kind;
        let from = if ids.iter().all(|h| h.kind == stack) { ids.iter().map(|h| h.layer_idx).min() } else { None };
        let (base, value) = crate::analysis::ablation::evaluate_closing(&m.model, &p, &gates, from, &stop)
            .or_else(|e| err(format!("ablate: {e}")))?;
        let (base, value) = (base.value(), value.value());
        let mut r = Map::new();
        r.extend(crate::script::convert::echo_map(&echo));
        r.insert("value".into(), Dynamic::from(value));
        r.insert("base".into(), Dynamic::from(base));
        r.insert("delta".into(), Dynamic::from(value - base));
        r.insert("heads".into(), Dynamic::from(crate::analysis::ablation::head_list(&ids)));
        Ok(r)
    }

    /// `with_mask` with options: `ablation` ("zero"; "mean": each closed head's context is
    /// its mean over the tokens of `reference`, a Dataset, per position with `per_position`;
    /// "resample": its context on a sentence of `reference` drawn for each sentence measured by
    /// `seed`; docs/methods.md#mean-ablation, #resample-ablation) and `batch_tokens` for
    /// computing the means. Every analysis, ablation, generation and patching of the view sees
    /// the means in place of zeros; under "resample" or per-position means, the verbs that run
    /// whole sentences (ablations, losses, analyses, pruning) measure it, and generation and
    /// patching refuse in one line.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let d = corpus(asset("pud_en.txt")).take(4);
    /// let zero = m.with_mask(["dec.1.2"]);
    /// let mean = m.with_mask(["dec.1.2"], #{ablation: "mean", reference: d});
    /// assert(zero.ablate(d, []).value != mean.ablate(d, []).value);
    /// assert(m.with_mask(["dec.1.2"], #{ablation: "zero"}).ablate(d, []).value == zero.ablate(d, []).value);
    /// let drawn = m.with_mask(["dec.1.2"], #{ablation: "resample", reference: d, seed: 3});
    /// assert(drawn.ablate(d, []).value == m.ablate(d, ["dec.1.2"], #{ablation: "resample", reference: d, seed: 3}).value);
    /// let per = m.with_mask(["dec.1.2"], #{ablation: "mean", reference: d, per_position: true});
    /// assert(per.ablate(d, []).value != mean.ablate(d, []).value);
    /// ```
    #[rhai_fn(name = "with_mask", return_raw, pure)]
    pub fn with_mask_opts(m: &mut ScriptModel, heads: Dynamic, options: Map) -> ScriptResult<ScriptModel> {
        let o = Opts::new(&options, "with_mask", WITH_MASK_OPTIONS)?;
        let (v, _) = ablation_view(m, &o, None)?;
        Ok(v.closing(&crate::model::script::head_ids(m, &heads, "with_mask")?))
    }

    /// `ablate` with the default metric.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.ablate(corpus(asset("pud_en.txt")).take(4), [m.head("enc", 5, 0)]);
    /// assert(r.metric == "cosine" && r.value > 0.0);
    /// ```
    #[rhai_fn(name = "ablate", return_raw, pure)]
    pub fn ablate(m: &mut ScriptModel, data: Dynamic, heads: Dynamic) -> ScriptResult<Map> {
        ablate_opts(m, data, heads, Map::new())
    }

    /// Every head masked alone: per kind a layers x heads grid of the metric with that head
    /// masked (the unmasked value is in `.options.base`). Equals `ablate` head by head, but
    /// computes the layers below each head once and batches the masks. Options as `ablate`
    /// (but `batch_tokens` defaults to 256: small length-sorted batches waste no padding, and the
    /// masks of a layer are stacked on them), plus `kinds`, and `layers` / `heads` to sweep part
    /// of the model (the other cells are NaN, as a removed head's).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let g = m.ablation_sweep(corpus(asset("pud_en.txt")).take(3), #{metric: "loss", kinds: ["cross"]});
    /// assert(g["cross"].len() == 2 && g["cross"][0].len() == 8);
    /// // Part of a model: some layers, or some heads (names, or a grid's top k); other cells NaN.
    /// let lm = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let d = corpus(asset("pud_en.txt")).take(2);
    /// let top = lm.ablation_sweep(d, #{layers: 1});
    /// assert(top["dec"][1][2] > 0.0 && top["dec"][0][2].is_nan);
    /// let two = lm.ablation_sweep(d, #{heads: top.top(2)});
    /// assert(two.top(5).len() == 2);
    /// ```
    #[rhai_fn(name = "ablation_sweep", return_raw, pure)]
    pub fn ablation_sweep_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Grid> {
        let f = "ablation_sweep";
        m.require(f, Needs::NoClosed).script()?;
        let d = crate::data::script::dataset_arg(&data, f)?;
        let o = Opts::new(&options, f, SWEEP_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let plan = Plan::new(&d, &o, f)?;
        let opts = sweep_options_from(&o, m)?;
        Ok(ablation_sweep_planned(m, &d, &opts, &plan)?)
    }

    /// Corpus BLEU of the model's greedy translations of `data` against its references (a
    /// parallel dataset), as sacreBLEU scores them: the map `bleu(hyps, refs)` gives, with
    /// `model`, `dataset` and `sentences`. Options: `batch_tokens` (1024), `shard` ("I/N":
    /// one slice of the data; BLEU's counts add, docs/methods.md#shards).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let p = temp_path("enpt.tsv");
    /// write_text(p, "The cat is sleeping.\tO gato está dormindo.\nI like green tea.\tEu gosto de chá verde.\nWhere is the station?\tOnde fica a estação?\nIt is raining today.\tEstá chovendo hoje.\n");
    /// let d = parallel(p);
    /// let b = m.bleu(d);
    /// assert(b.score > 0.0 && b.sentences == 4);
    /// let parts = [m.bleu(d, #{shard: "0/2"}), m.bleu(d, #{shard: "1/2"})];
    /// assert(abs(merge_results(parts).score - b.score) < 1e-9);
    /// ```
    #[rhai_fn(name = "bleu", return_raw, pure)]
    pub fn model_bleu_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Map> {
        let f = "bleu";
        let o = Opts::new(&options, f, BLEU_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let d = crate::data::script::dataset_arg(&data, f)?;
        if d.items.iter().any(|i| i.target.is_none()) {
            return err(format!(
                "bleu: the dataset {} has no references (load a parallel corpus: parallel(src, tgt) or a TSV)",
                d.name
            ));
        }
        let plan = Plan::new(&d, &o, f)?;
        let bt = o.usize_or_default("batch_tokens")?;
        let p = crate::analysis::ablation::prepare(&m.model, &plan.data(&d, f)?, Metric::Bleu, bt, m.gates().script()?)
            .or_else(|e| err(format!("{f}: {e}")))?;
        let a = crate::analysis::ablation::evaluate_acc(&m.model, &p, &p.base, &crate::run::interrupted)
            .or_else(|e| err(format!("{f}: {e}")))?;
        let identity = plan.identity(m.identity(), json!({"options": {"batch_tokens": bt}}));
        let acc = BleuAcc { counts: a.bleu.unwrap_or_default(), sentences: p.n_sentences };
        let r = finish_bleu(&identity, &acc).or_else(|e| err(format!("{f}: {e}")))?;
        // A sharded result's options hold its shard record, as for the grid functions.
        let echo = plan.seal(
            f,
            identity,
            &acc,
            Vec::new(),
            |e| e,
            |e| json!({"options": e.iter().cloned().collect::<serde_json::Map<_, _>>()}),
        )?;
        let mut r = r;
        if !echo.is_empty() {
            r.insert("options".into(), Dynamic::from(crate::script::convert::echo_map(&echo)));
        }
        Ok(r)
    }

    /// `m.bleu(data)` with the default options.
    ///
    /// ```rhai
    /// let p = temp_path("hello.tsv");
    /// write_text(p, "Hello, my friend.\tOlá, meu amigo.\n");
    /// assert(load_model("enpt").bleu(parallel(p)).sys_len > 0);
    /// ```
    #[rhai_fn(name = "bleu", return_raw, pure)]
    pub fn model_bleu(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Map> {
        model_bleu_opts(m, data, Map::new())
    }

    /// `ablation_sweep` with the default metric.
    ///
    /// ```rhai
    /// let g = load_model("minilm").ablation_sweep(corpus(asset("pud_en.txt")).take(2));
    /// assert(g["enc"].len() == 6);
    /// ```
    #[rhai_fn(name = "ablation_sweep", return_raw, pure)]
    pub fn ablation_sweep(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Grid> {
        ablation_sweep_opts(m, data, Map::new())
    }
}
