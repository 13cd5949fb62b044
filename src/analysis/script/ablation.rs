//! Ablation on a model: `m.ablate(data, heads, #{...})` and `m.ablation_sweep(data, #{...})`
//! (docs/methods.md#masking-and-ablation).

use super::kinds_option;
use crate::grid::Grid;
use crate::model::script::ScriptModel;
use crate::model::Kind;
use crate::script::convert::{err, opt, OptSpec, Opts, ScriptResult};
use rhai::plugin::*;
use rhai::{Dynamic, Map};

pub const ABLATE_OPTIONS: &[OptSpec] = &[
    opt("metric", "\"loss\" for language and translation models, else \"cosine\"", "\"loss\", \"kl\", \"bleu\" or \"cosine\" (docs/methods.md#masking-and-ablation)"),
    opt("kinds", "every kind", "the attention kinds taking part"),
    opt("batch_tokens", "1024", "tokens per batch, padding included"),
];
pub const SWEEP_OPTIONS: &[OptSpec] = &[
    opt("metric", "\"loss\" for language and translation models, else \"cosine\"", "\"loss\", \"kl\", \"bleu\" or \"cosine\" (docs/methods.md#masking-and-ablation)"),
    opt("kinds", "every kind", "the kinds whose heads are masked one at a time"),
    opt("batch_tokens", "256", "tokens per batch; the masks of a layer are stacked on it"),
];

/// What `ablate` and `ablation_sweep` share: the prepared data, the kinds, the options echoed.
type AblationSetup = (crate::analysis::ablation::Prepared, Vec<Kind>, crate::output::Echo);

fn ablation_setup(m: &ScriptModel, data: &Dynamic, options: &Map, func: &'static str, default_batch_tokens: usize) -> ScriptResult<AblationSetup> {
    let o = Opts::new(options, func, if func == "ablate" { ABLATE_OPTIONS } else { SWEEP_OPTIONS })?;
    let d = crate::data::script::dataset_arg(data, func)?;
    let generates = m.model.has_task_loss();
    let metric: crate::analysis::ablation::Metric = match o.string("metric")? {
        Some(x) => x.parse().or_else(|e: String| err(format!("{func}: {e}")))?,
        None if generates => crate::analysis::ablation::Metric::Loss,
        None => crate::analysis::ablation::Metric::Cosine,
    };
    let kinds = kinds_option(m, options, func)?;
    let bt = o.usize("batch_tokens")?.unwrap_or(default_batch_tokens);
    let p = crate::analysis::ablation::prepare(&m.model, &d, metric, bt, m.gates()?).or_else(|e| err(format!("{func}: {e}")))?;
    let echo = vec![("metric".to_string(), serde_json::json!(metric.to_string())), ("targets".into(), serde_json::json!(p.targets_from.to_string())), ("batch_tokens".into(), serde_json::json!(bt))];
    Ok((p, kinds, echo))
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
    #[rhai_fn(name = "ablate", return_raw, pure)]
    pub fn ablate_opts(m: &mut ScriptModel, data: Dynamic, heads: Dynamic, options: Map) -> ScriptResult<Map> {
        let ids = crate::model::script::head_ids(m, &heads, "ablate")?;
        let (p, _, echo) = ablation_setup(m, &data, &options, "ablate", crate::model::batch::DEFAULT_BATCH_TOKENS)?;
        let mut all = m.closed.as_ref().clone();
        all.extend(ids.iter().copied());
        let gates = m.model.gates_closing(&all).or_else(|e| err(format!("ablate: {e}")))?;
        let base_gates = m.gates()?;
        let stop = crate::run::interrupted;
        let base = crate::analysis::ablation::evaluate(&m.model, &p, &base_gates, &stop).or_else(|e| err(format!("ablate: {e}")))?;
        let value = crate::analysis::ablation::evaluate(&m.model, &p, &gates, &stop).or_else(|e| err(format!("ablate: {e}")))?;
        let mut r = Map::new();
        r.extend(crate::script::convert::echo_map(&echo));
        r.insert("value".into(), Dynamic::from(value));
        r.insert("base".into(), Dynamic::from(base));
        r.insert("delta".into(), Dynamic::from(value - base));
        r.insert("heads".into(), Dynamic::from(crate::analysis::ablation::head_list(&ids)));
        Ok(r)
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
    /// masks of a layer are stacked on them), plus `kinds`.
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let g = m.ablation_sweep(corpus(asset("pud_en.txt")).take(3), #{metric: "loss", kinds: ["cross"]});
    /// assert(g["cross"].len() == 2 && g["cross"][0].len() == 8);
    /// ```
    #[rhai_fn(name = "ablation_sweep", return_raw, pure)]
    pub fn ablation_sweep_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Grid> {
        if !m.closed.is_empty() {
            return err("ablation_sweep: run it on the unmasked model (this view masks heads already)");
        }
        let (p, kinds, mut echo) = ablation_setup(m, &data, &options, "ablation_sweep", 256)?;
        let stop = crate::run::interrupted;
        let base = crate::analysis::ablation::evaluate(&m.model, &p, &p.base, &stop).or_else(|e| err(format!("ablation_sweep: {e}")))?;
        let mut progress = |done: usize, total: usize| crate::run::progress("ablation sweep", done, total);
        let grids = crate::analysis::ablation::sweep(&m.model, &p, &kinds, &stop, &mut progress).or_else(|e| err(format!("ablation_sweep: {e}")))?;
        echo.push(("base".into(), crate::script::convert::json_f64(base)));
        let d = data.clone().try_cast::<crate::data::Dataset>().map(|d| d.name).unwrap_or_default();
        Ok(Grid { stat: format!("{} with the head masked (base {base:.4})", p.metric), model: m.model.name(), dataset: d, kinds: grids, options: echo })
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
