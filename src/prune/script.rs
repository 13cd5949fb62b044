//! The script API of pruning: `m.prune(data, options)`, the `PruneResult` object,
//! `m.with_gates(result)` and `m.prune_heads(result)`.

use super::{train_ablated, CurvePoint, EvalGates, Hooks, Init, PruneOptions, PruneRun};
use crate::model::script::{Head, ScriptModel};
use crate::model::view::Needs;
use crate::model::{HeadId, Kind};
use crate::output::{Output, Render};
use crate::plot::{Plot, PlotKind, Series};
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt, opt_f64, opt_int, OptSpec, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Engine, Map};
use std::path::PathBuf;
use std::rc::Rc;

/// A finished pruning run, tied to the model it was trained on.
#[derive(Clone)]
pub struct PruneResult {
    pub run: Rc<PruneRun>,
    pub model: ScriptModel,
    /// `joint: true`: the trained model, and its weights in `params_mut` order.
    pub trained: Option<(Rc<crate::model::Model>, Rc<Vec<tch::Tensor>>)>,
}

pub const OPTIONS: &[OptSpec] = &[
    super::LAMBDA_OPTION,
    super::STEPS_OPTION,
    super::LR_OPTION,
    super::MODEL_LR_OPTION,
    super::BATCH_TOKENS_OPTION,
    opt("kinds", "every kind", "the attention kinds gated"),
    super::JOINT_OPTION,
    super::SEED_OPTION,
    opt("eval", "", "the same as eval_data"),
    opt("eval_data", "", "a dataset evaluated every eval_every steps"),
    super::EVAL_EVERY_OPTION,
    opt("checkpoint", "", "a directory for checkpoints, written atomically"),
    super::RESUME_OPTION,
    super::BETA_OPTION,
    super::INIT_OPTION,
    super::PENALTY_SCALE_OPTION,
    super::DISTILL_OPTION,
    super::EVAL_GATES_OPTION,
    opt("target", "none", "heads to keep open: targeted L0 (Sheared-LLaMA's Lagrangian instead of lambda)"),
    crate::model::script::TGT_LANG,
];

/// The typed options of `prune` from a map checked against [`OPTIONS`]: what it gives, else
/// the defaults of the list (the one place they are written); `kinds` is the caller's.
pub fn options_from(o: &Opts, kinds: Vec<Kind>) -> ScriptResult<PruneOptions> {
    let f = o.func();
    let init = match o.value("init") {
        Some(v) if !v.is_string() => {
            Init::Constant(crate::script::convert::to_f64(v, &format!("{f}: option 'init' (\"uniform\" or a number)"))?)
        }
        _ => match o.string_or_default("init")?.as_str() {
            "uniform" => Init::Uniform,
            other => return err(format!("{f}: option 'init' must be \"uniform\" or a number, got \"{other}\"")),
        },
    };
    Ok(PruneOptions {
        lambda: o.f64_or_default("lambda")?,
        steps: o.usize_or_default("steps")?,
        lr: o.f64_or_default("lr")?,
        batch_tokens: o.usize_or_default("batch_tokens")?,
        kinds,
        joint: o.bool_or_default("joint")?,
        model_lr: o.f64_or_default("model_lr")?,
        seed: o.usize_or_default("seed")? as u64,
        // A dataset value: the caller reads it (`parse_options`).
        eval_data: None,
        eval_every: o.usize_or_default("eval_every")?,
        checkpoint: o.string("checkpoint")?.map(PathBuf::from),
        resume: o.bool_or_default("resume")?,
        concrete: super::Concrete { beta: o.f64_or_default("beta")?, ..Default::default() },
        init,
        penalty_scale: o.parsed_or_default("penalty_scale")?,
        distill: o.parsed_or_default("distill")?,
        eval_gates: o.parsed_or_default("eval_gates")?,
        target: match o.value("target") {
            None => None,
            Some(v) => Some(crate::script::convert::to_f64(v, &format!("{f}: option 'target' (a number of heads)"))?),
        },
        // The view's, set by `prune` ([`crate::model::view::MeanAblation`]).
        ablation: None,
    })
}

/// What `m.prune(data)` runs with given no options (the library API's `prune_options`):
/// every kind of `m` gated, the rest at [`PruneOptions::new`]'s defaults.
pub fn default_options(m: &ScriptModel) -> PruneOptions {
    PruneOptions::new(m.model.kinds().iter().map(|k| k.kind).collect())
}

fn parse_options(m: &ScriptModel, options: &Map) -> ScriptResult<PruneOptions> {
    let o = Opts::new(options, "prune", OPTIONS)?;
    let kinds = crate::model::script::kinds_option(m, &o)?;
    let mut p = options_from(&o, kinds)?;
    p.check_resume()?;
    // `eval` is a reserved word in Rhai (`#{"eval": d}` works); `eval_data` reads better.
    if let Some(v) = o.value("eval_data").or_else(|| o.value("eval")) {
        p.eval_data = Some(crate::data::script::dataset_arg(v, "prune: option 'eval_data'")?);
    }
    p.validate()?;
    Ok(p)
}

/// A pruning step as its progress bar reads it: the heads open under the deterministic
/// evaluation gates (what `closed()` would return now) beside the expected number
/// `sum P(g != 0)` of the training's stochastic gates (docs/methods.md#hard-concrete-gates-and-l0-pruning).
pub fn progress_line(label: &str, p: &CurvePoint) -> String {
    format!("{label}: loss {:.3}, penalty {:.2}, open {} (expected {:.1})", p.loss, p.penalty, p.open, p.expected_open)
}

/// Trains head gates on `data` under typed options: what `m.prune(data, #{...})` and the
/// library API run (pruning runs whole: it has no shards).
pub fn prune(m: &ScriptModel, d: &crate::data::Dataset, opts: &PruneOptions) -> Result<PruneResult, String> {
    m.require("prune", Needs::NoSoft).map_err(|e| e.to_string())?;
    m.require("prune", Needs::NoStreaming).map_err(|e| e.to_string())?;
    d.require_sentences("prune")?;
    for k in &opts.kinds {
        m.model.kind_shape(*k).map_err(|e| format!("prune: {e}"))?;
    }
    if let Some(e) = &opts.eval_data {
        e.require_sentences("prune: option 'eval_data'")?;
    }
    opts.validate()?;
    let label = format!("prune (lambda {})", opts.lambda);
    let mut progress = |p: &CurvePoint, total: usize| crate::run::progress(&progress_line(&label, p), p.step, total);
    // A view's mean, per-position mean or resample ablation holds in training and evaluation.
    let mut ablation = crate::model::nn::Gates::none();
    let mut opts = opts.clone();
    if let Some(a) = &m.ablation {
        ablation.fill = a.fills.share();
        ablation.source = a.source.clone();
        opts.ablation = Some(format!("{} of {} ({})", a.mode, a.reference, a.digest));
    }
    let opts = &opts;
    let mut run = train_ablated(
        &m.model,
        &m.closed,
        &ablation,
        d,
        opts,
        Hooks { stop: &crate::run::interrupted, progress: &mut progress },
    )
    .map_err(|e| format!("prune: {e}"))?;
    let trained = run.trained.take().map(|mut t| {
        let w: Vec<tch::Tensor> = t.net.params_mut().into_iter().map(|p| p.shallow_clone()).collect();
        (Rc::new(t), Rc::new(w))
    });
    Ok(PruneResult { run: Rc::new(run), model: m.clone(), trained })
}

use crate::grid::{kind_map, Grid};

impl PruneResult {
    fn heads(&self, ids: Vec<HeadId>) -> Array {
        ids.into_iter().map(|id| Dynamic::from(Head { model: self.model.clone(), id })).collect()
    }

    fn gates(&self) -> crate::model::KindGrids {
        self.run.layout.split(&self.run.eval_gates())
    }

    /// A note when more than [`super::UNSETTLED_SHARE`] of the gates have not settled.
    fn settle_note(&self) -> Option<String> {
        use super::{UNSETTLED, UNSETTLED_SHARE};
        let (n, of) = self.run.unsettled();
        let steps = self.run.state.step;
        (of > 0 && n as f64 > UNSETTLED_SHARE * of as f64).then(|| {
            format!(
                "note: {n} of {of} gates have not settled after {steps} steps (P(open) between {} and {}: open or closed by a small margin); more steps (#{{steps: {}}}) would decide them",
                UNSETTLED.start,
                UNSETTLED.end,
                (steps * 4).max(100)
            )
        })
    }

    fn title(&self) -> String {
        let r = &self.run;
        format!("pruning {} on {} (lambda {}, {} steps)", r.model, r.dataset, r.options.lambda, r.state.step)
    }

    /// The evaluation gates as a table, one row per kind and layer.
    pub fn table(&self) -> Table {
        let r = &self.run;
        let n_heads = r.layout.kinds.iter().map(|(_, _, h)| *h).max().unwrap_or(0);
        let mut cols = vec!["layer".to_string()];
        cols.extend((0..n_heads).map(|h| format!("h{h}")));
        cols.push("open".into());
        let mut t = Table::new(cols);
        t.title = Some(format!(
            "{}: {} gates, {} of {} heads open",
            self.title(),
            r.options.eval_gates,
            r.retained().len(),
            r.layout.trainable()
        ));
        t.digits = 2;
        for (k, m) in self.gates() {
            for (l, row) in m.iter().enumerate() {
                let mut cells = vec![Cell::Text(format!("{k}.{l}"))];
                cells.extend((0..n_heads).map(|h| row.get(h).map_or(Cell::Empty, |v| Cell::Float(*v))));
                cells.push(Cell::Int(row.iter().filter(|&&g| g != 0.0).count() as i64));
                let _ = t.push_row(cells);
            }
        }
        t
    }

    /// The evaluation gates as a [`Grid`].
    fn gates_grid(&self) -> Grid {
        let r = &self.run;
        Grid {
            stat: "gates".into(),
            model: r.model.clone(),
            dataset: r.dataset.clone(),
            kinds: self.gates(),
            options: r.options.echo(),
        }
    }

    fn heatmap(&self, kind: Option<Kind>) -> ScriptResult<Plot> {
        let g = self.gates_grid();
        let Some(k) = kind.or_else(|| g.kinds.first().map(|(k, _)| *k)) else {
            return err("heatmap: this run gated no heads");
        };
        if !g.kinds.iter().any(|(x, _)| *x == k) {
            let have: Vec<String> = self.run.layout.kinds.iter().map(|(k, _, _)| k.to_string()).collect();
            return err(format!("heatmap: this run gated only {}", have.join(", ")));
        }
        let mut p = g.heatmap_range(k, Some(0.0), Some(1.0))?;
        p.title = format!("gates ({k}): {}", self.title());
        Ok(p)
    }

    fn plot(&self) -> ScriptResult<Plot> {
        let c = &self.run.state.curve;
        let x: Vec<f64> = c.iter().map(|p| p.step as f64).collect();
        let mut series = vec![
            Series { name: "loss".into(), x: x.clone(), y: c.iter().map(|p| p.loss).collect() },
            Series {
                name: "expected open heads / total".into(),
                x: x.clone(),
                y: c.iter().map(|p| p.expected_open / self.run.layout.len() as f64).collect(),
            },
        ];
        let evals: Vec<&CurvePoint> = c.iter().filter(|p| p.eval.is_some()).collect();
        if !evals.is_empty() {
            let name = format!("eval {}", self.run.eval_metric.clone().unwrap_or_default());
            series.push(Series {
                name,
                x: evals.iter().map(|p| p.step as f64).collect(),
                y: evals.iter().map(|p| p.eval.unwrap_or(f64::NAN)).collect(),
            });
        }
        let mut p = Plot::new(PlotKind::Line { series }, format!("training curve: {}", self.title()))
            .or_else(|e| err(e.to_string()))?;
        p.x_label = "step".into();
        Ok(p)
    }

    fn to_json(&self) -> serde_json::Value {
        let r = &self.run;
        let km = |v: crate::model::KindGrids| {
            v.into_iter().map(|(k, m)| (k.to_string(), serde_json::json!(m))).collect::<serde_json::Map<_, _>>()
        };
        serde_json::json!({
            "model": r.model,
            "dataset": r.dataset,
            "objective": r.objective,
            "eval_metric": r.eval_metric,
            "resumed_from": r.resumed_from,
            "options": r.options.echo().into_iter().collect::<serde_json::Map<_, _>>(),
            "steps": r.state.step,
            "gates": km(self.gates()),
            "log_alpha": km(r.log_alpha()),
            "p_open": km(r.layout.split(&r.p_open())),
            "retained": r.retained().iter().map(|h| h.to_string()).collect::<Vec<_>>(),
            "curve": r.state.curve.iter().map(|p| serde_json::json!({"step": p.step, "loss": p.loss, "penalty": p.penalty, "expected_open": p.expected_open, "open": p.open, "eval": p.eval})).collect::<Vec<_>>(),
        })
    }
}

impl Render for PruneResult {
    fn render(&self) -> Output {
        let mut o = self.table().render();
        if let Some(n) = self.settle_note() {
            o.text = format!("{}\n{n}", o.text);
        }
        if let Ok(p) = self.heatmap(None) {
            let po = p.render();
            o.png = po.png;
            o.svg = po.svg;
        }
        o
    }
}

/// `prune_compare`'s own options; the training options of Hard Concrete and targeted L0 are
/// `prune`'s ([`COMPARE_TRAINING`]), at defaults sized for a comparison.
pub const COMPARE_OPTIONS: &[OptSpec] = &[
    opt("eval_data", "required", "held-out texts every result is evaluated on"),
    opt("fractions", "[0.1, 0.25, 0.5]", "fractions of the heads removed, each in (0, 1)"),
    opt("strategies", "every strategy", "any of \"hard_concrete\", \"targeted_l0\", \"michel\", \"importance\", \"harp\", \"sublayer_cosine\", \"random\""),
    opt_int("seeds", 5, "draws of the random baseline"),
    opt_f64("michel_step", 0.05, "michel: the fraction of all heads removed per iteration"),
    opt("harp_alphas", "[0, 0.25, 0.5, 0.75, 1]", "harp: the scales searched per layer"),
    opt_f64("lambda", 0.05, "hard_concrete: weight of the L0 penalty"),
    opt_int("steps", 100, "hard_concrete and targeted_l0: training steps"),
    opt_f64("lr", 0.1, "hard_concrete and targeted_l0: Adam's learning rate for the gates"),
    opt_int("batch_tokens", 1000, "tokens per batch (training, importance, evaluation)"),
    opt_int("seed", 1, "seed of the training batches and noise, and of the random draws"),
    crate::model::script::TGT_LANG,
];

/// The options of `prune_compare` that are `prune`'s.
const COMPARE_TRAINING: [&str; 5] = ["lambda", "steps", "lr", "batch_tokens", "seed"];

/// The typed options of `prune_compare` (`kinds`: the model's self-attention kind).
pub fn compare_options(o: &Opts, options: &Map, kinds: Vec<Kind>) -> ScriptResult<super::strategies::CompareOptions> {
    use super::strategies::{Strategy, STRATEGIES};
    let f = o.func();
    let mut sub = Map::new();
    for k in COMPARE_TRAINING {
        let v = match options.get(k) {
            Some(v) if !v.is_unit() => v.clone(),
            _ => match o.f64_or_default(k) {
                Ok(x) if k == "lambda" || k == "lr" => Dynamic::from(x),
                Ok(x) => Dynamic::from(x as i64),
                Err(e) => return Err(e),
            },
        };
        sub.insert(k.into(), v);
    }
    let po = Opts::new(&sub, f, OPTIONS).and_then(|p| options_from(&p, kinds))?;
    let strategies = match o.strings("strategies")? {
        None => STRATEGIES.to_vec(),
        Some(v) => v
            .iter()
            .map(|s| s.parse::<Strategy>().or_else(|e: String| err(format!("{f}: option 'strategies': {e}"))))
            .collect::<ScriptResult<_>>()?,
    };
    let c = super::strategies::CompareOptions {
        fractions: o.numbers("fractions")?.unwrap_or_else(|| vec![0.1, 0.25, 0.5]),
        strategies,
        seeds: o.usize_or_default("seeds")?,
        prune: po,
        michel_step: o.f64_or_default("michel_step")?,
        harp_alphas: o.numbers("harp_alphas")?.unwrap_or_else(|| vec![0.0, 0.25, 0.5, 0.75, 1.0]),
    };
    c.validate()?;
    Ok(c)
}

/// A comparison as a table: one row per strategy and fraction.
pub fn compare_table(c: &super::strategies::Comparison, model: &str, data: &str, eval: &str) -> Table {
    let metric = c.metric.to_string();
    let n = (c.n_layers * c.n_heads) as f64;
    let mut t = Table::new(vec![
        "strategy".into(),
        "fraction".into(),
        "heads_removed".into(),
        "layers_removed".into(),
        "heads_kept".into(),
        metric.clone(),
        "sd".into(),
        "min".into(),
        "max".into(),
        "seconds".into(),
    ]);
    t.title = Some(format!(
        "prune_compare: {model} ({} x {} {} heads), chosen on {data}, {metric} on {eval} (full model {})",
        c.n_layers,
        c.n_heads,
        c.kind,
        crate::output::fixed(c.full, 4)
    ));
    t.digits = 4;
    let opt = |x: Option<f64>| x.map_or(Cell::Empty, Cell::Float);
    for r in &c.rows {
        let _ = t.push_row(vec![
            Cell::Text(r.strategy.to_string()),
            Cell::Float(r.fraction),
            Cell::Int(r.heads_removed as i64),
            r.layers_removed.map_or(Cell::Empty, |l| Cell::Int(l as i64)),
            Cell::Float(1.0 - r.heads_removed as f64 / n),
            Cell::Float(r.value),
            opt(r.spread.map(|s| s.0)),
            opt(r.spread.map(|s| s.1)),
            opt(r.spread.map(|s| s.2)),
            Cell::Float(r.seconds),
        ]);
    }
    t
}

#[export_module]
pub mod api {
    use super::*;

    /// Trains Hard Concrete head gates with an L0 penalty (docs/methods.md#hard-concrete-gates-and-l0-pruning "Hard Concrete gates and
    /// pruning"): the model is frozen, only the gates learn. The objective is token
    /// cross-entropy on the references (or on the unpruned model's greedy translations) for
    /// models that generate, and distillation of the final hidden states for encoders.
    /// Options: `lambda` (0.05), `steps` (500), `lr` (0.01), `batch_tokens` (2000), `kinds`
    /// (all), `seed` (1), `eval_data` (a Dataset; `"eval"` too), `eval_every` (50), `checkpoint` (a directory),
    /// `resume` (false), `beta` (0.33), `init` ("uniform" or a number), `penalty_scale`
    /// ("per_head" | "per_layer"), `distill` ("cosine" | "mse"), `eval_gates` ("binary" |
    /// "continuous"), `joint` (false: gates only; true: the model's weights train too, the
    /// paper's setting, with Adam at `model_lr`, 1e-5, on a copy: the model itself is unchanged
    /// and `with_gates(result)` gives the trained copy).
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(16), #{lambda: 0.5, steps: 4, batch_tokens: 400});
    /// assert(r.steps == 4 && r.curve.len() == 4 && r.objective == "distill (cosine)");
    /// ```
    #[rhai_fn(name = "prune", return_raw, pure)]
    pub fn prune_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<PruneResult> {
        m.require("prune", Needs::NoSoft).script()?;
        let d = crate::data::script::dataset_arg(&data, "prune")?;
        let opts = parse_options(m, &options)?;
        let _lang = crate::model::script::call_language(m, &Opts::new(&options, "prune", OPTIONS)?)?;
        Ok(prune(m, &d, &opts)?)
    }

    /// Pruning strategies side by side (docs/methods.md#pruning-strategies): each strategy
    /// chooses on `data` which self-attention heads (or whole attention sublayers) to remove at
    /// every fraction, and each result is evaluated on `eval_data` with the ablation metric (a
    /// language model's next-token loss; an encoder's cosine distance to its unpruned states).
    /// A Table: strategy, fraction, heads_removed, layers_removed, heads_kept, the metric, the
    /// random baseline's sd/min/max over seeds, seconds; `prune_plot` draws it.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let d = corpus(asset("pud_en.txt"));
    /// let t = m.prune_compare(d.take(6), #{eval_data: d.skip(6).take(6), fractions: [0.25, 0.5], steps: 3, seeds: 2});
    /// assert(t.len() == 7 * 2 && t.columns.contains("loss"));
    /// assert(prune_plot(t).to_svg().contains("michel"));
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn prune_compare(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Table> {
        let f = "prune_compare";
        m.require(f, Needs::Unmasked).script()?;
        let o = Opts::new(&options, f, COMPARE_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let d = crate::data::script::dataset_arg(&data, f)?;
        let eval = match o.value("eval_data") {
            Some(v) => crate::data::script::dataset_arg(v, &format!("{f}: option 'eval_data'"))?,
            None => {
                return err(format!(
                    "{f}: eval_data is required: held-out texts every strategy's result is evaluated on"
                ))
            }
        };
        let kind = if m.model.decoder_only() { Kind::Dec } else { Kind::Enc };
        let c = compare_options(&o, &options, vec![kind])?;
        let mut progress = |s: &str, done: usize, total: usize| crate::run::progress(&format!("{f}: {s}"), done, total);
        // A forward refused for its length or memory ran over the longest text of the data or
        // of eval_data: say which (the longer one).
        let longest = |d: &crate::data::Dataset| d.items.iter().map(|i| i.text.chars().count()).max().unwrap_or(0);
        let (train_len, eval_len) = (longest(&d), longest(&eval));
        let r = super::super::strategies::compare(&m.model, &d, &eval, &c, &crate::run::interrupted, &mut progress)
            .or_else(|e| {
                let s = e.to_string();
                let s = if s.starts_with(f) { s } else { format!("{f}: {s}") };
                let sized = s.contains("over the budget") || s.contains("positions");
                err(match sized {
                    true if eval_len > train_len => {
                        format!("{s} (option 'eval_data': its longest text, {eval_len} characters)")
                    }
                    true => format!("{s} (argument 1, the data: its longest text, {train_len} characters)"),
                    false => s,
                })
            })?;
        Ok(compare_table(&r, &m.model.name(), &d.name, &eval.name))
    }

    /// A `prune_compare` table as a line chart: the metric against the fraction of heads kept,
    /// one line per strategy (the random baseline's mean).
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let d = corpus(asset("pud_en.txt"));
    /// let t = m.prune_compare(d.take(4), #{eval_data: d.skip(4).take(4), strategies: ["random", "importance"], fractions: [0.25]});
    /// assert(prune_plot(t).to_svg().contains("importance"));
    /// ```
    #[rhai_fn(return_raw)]
    pub fn prune_plot(t: Table) -> ScriptResult<Plot> {
        let f = "prune_plot";
        let col = |name: &str| {
            t.column_index(name)
                .or_else(|_| err(format!("{f}: the table has no '{name}' column: pass a prune_compare table")))
        };
        let metric = if t.column_index("loss").is_ok() { "loss" } else { "cosine" };
        let series = Series::by(&t, col("strategy")?, col("heads_kept")?, col(metric)?);
        let mut p = Plot::new(PlotKind::Line { series }, "").or_else(|e| err(format!("{f}: {e}")))?;
        p.x_label = "attention heads kept".into();
        p.y_label = metric.into();
        p.title = t.title.clone().unwrap_or_default().split(", chosen on").next().unwrap_or_default().to_string();
        Ok(p)
    }

    /// `prune` with the default options.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let data = corpus(asset("pud_en.txt")).take(8);
    /// let r = m.prune(data, #{steps: 2, batch_tokens: 300});
    /// assert(r.options.lambda == 0.05 && r.options.eval_gates == "binary");
    /// ```
    #[rhai_fn(name = "prune", return_raw, pure)]
    pub fn prune_plain(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<PruneResult> {
        prune_opts(m, data, Map::new())
    }

    /// A view of the model with the result's evaluation gates (binary: closed heads masked;
    /// continuous: every head scaled by its gate). Weights are shared, not edited.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(8), #{lambda: 20.0, steps: 30, lr: 0.1, batch_tokens: 300});
    /// let g = m.with_gates(r);
    /// assert(g.masked.len() == r.closed.len() && r.closed.len() > 0);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn with_gates(m: &mut ScriptModel, result: PruneResult) -> ScriptResult<ScriptModel> {
        if !Rc::ptr_eq(&m.model, &result.model.model) {
            return err(format!(
                "with_gates: this result was trained on {}, not on this model object",
                result.run.model
            ));
        }
        // Joint training changed the weights: the gates go with the trained model.
        let model = result.trained.as_ref().map_or_else(|| m.model.clone(), |(t, _)| t.clone());
        Ok(match result.run.options.eval_gates {
            EvalGates::Binary => {
                let mut closed = m.closed.as_ref().clone();
                closed.extend(result.run.closed());
                closed.sort();
                closed.dedup();
                ScriptModel { model, closed: Rc::new(closed), ..m.clone() }
            }
            EvalGates::Continuous => ScriptModel { model, soft: Some(Rc::new(result.gates())), ..m.clone() },
        })
    }

    /// A view of the model with these heads' gates closed: heads as `Head`s, printed names
    /// (`"enc.1.2"`) or a table of heads (`g.top(k)`); the same as `with_mask`.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// assert(m.with_gates(["enc.1.2", m.head("enc", 3, 0)]).masked.len() == 2);
    /// ```
    #[rhai_fn(name = "with_gates", return_raw, pure)]
    pub fn with_gates_heads(m: &mut ScriptModel, heads: Dynamic) -> ScriptResult<ScriptModel> {
        Ok(m.closing(&crate::model::script::head_ids(m, &heads, "with_gates")?))
    }

    /// A new model with these heads removed from the weights (heads as `Head`s, printed
    /// names or a table of heads); it computes what `m.with_mask(heads)` computes.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let small = m.prune_heads(["enc.0.0", "enc.0.1"]);
    /// assert(small.params < m.params);
    /// assert(`${small}`.contains("heads: enc 6x12 (70 kept), 2 removed by prune_heads"));
    /// ```
    #[rhai_fn(name = "prune_heads", return_raw, pure)]
    pub fn prune_heads_named(m: &mut ScriptModel, heads: Dynamic) -> ScriptResult<ScriptModel> {
        let ids = crate::model::script::head_ids(m, &heads, "prune_heads")?;
        m.require("prune_heads", Needs::Unmasked).script()?;
        let pruned =
            super::super::physical::prune_heads(&m.model, &ids, None).or_else(|e| err(format!("prune_heads: {e}")))?;
        Ok(ScriptModel::new(pruned))
    }

    /// A new model with the result's closed heads removed from the weights (smaller Q/K/V and
    /// W^O); it computes what `m.with_gates(result)` computes, with fewer operations. Every
    /// analysis runs on it; heads keep their numbers and removed ones are NaN in grids
    /// (docs/methods.md#terms).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let d = corpus(asset("pud_en.txt")).take(6);
    /// let r = m.prune(d, #{lambda: 20.0, steps: 30, lr: 0.1, kinds: ["enc"], batch_tokens: 300});
    /// let small = m.prune_heads(r);
    /// assert(small.params < m.params);
    /// assert(small.translate("Hello.") == m.with_gates(r).translate("Hello."));
    /// let c = small.confidence(d)["enc"];
    /// assert(c.len() == 6 && c[0].len() == 8);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn prune_heads(m: &mut ScriptModel, result: PruneResult) -> ScriptResult<ScriptModel> {
        if !Rc::ptr_eq(&m.model, &result.model.model) {
            return err(format!(
                "prune_heads: this result was trained on {}, not on this model object",
                result.run.model
            ));
        }
        if result.run.options.eval_gates == EvalGates::Continuous {
            return err("prune_heads: the result has continuous gates; removing heads needs binary ones (eval_gates: \"binary\")");
        }
        let weights = result.trained.as_ref().map(|(_, w)| w.as_slice());
        let pruned = super::super::physical::prune_heads(&m.model, &result.run.closed(), weights)
            .or_else(|e| err(format!("prune_heads: {e}")))?;
        Ok(ScriptModel::new(pruned))
    }

    /// The evaluation gates, per kind a layers x heads matrix.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300});
    /// assert(r.gates.enc.len() == 6 && r.gates.enc[0].len() == 12);
    /// ```
    #[rhai_fn(get = "gates", pure)]
    pub fn gates(r: &mut PruneResult) -> Map {
        kind_map(r.gates())
    }

    /// The learnt `log_alpha` of every gated head, per kind.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300, init: 2.0});
    /// assert(r.log_alpha.enc[3][4] > 1.9);
    /// ```
    #[rhai_fn(get = "log_alpha", pure)]
    pub fn log_alpha(r: &mut PruneResult) -> Map {
        kind_map(r.run.log_alpha())
    }

    /// `P(g != 0)` of every gated head, per kind.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300});
    /// assert(r.p_open.enc[0][0] > 0.0 && r.p_open.enc[0][0] < 1.0);
    /// ```
    #[rhai_fn(get = "p_open", pure)]
    pub fn p_open(r: &mut PruneResult) -> Map {
        kind_map(r.run.layout.split(&r.run.p_open()))
    }

    /// The heads kept (evaluation gate not 0).
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300, init: 3.0});
    /// assert(r.retained.len() == 72 && r.closed.len() == 0);
    /// ```
    #[rhai_fn(get = "retained", pure)]
    pub fn retained(r: &mut PruneResult) -> Array {
        r.heads(r.run.retained())
    }

    /// The heads pruned (evaluation gate 0).
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300, init: -3.0});
    /// assert(r.closed.len() == 72 && r.closed[0].to_string() == "enc.0.0");
    /// ```
    #[rhai_fn(get = "closed", pure)]
    pub fn closed(r: &mut PruneResult) -> Array {
        r.heads(r.run.closed())
    }

    /// The training curve as a table, one row per step: `step`, `loss`, `penalty`,
    /// `expected_open`, `open` and `eval_value` (the eval metric at eval steps, else empty).
    /// A row reads as a map (`r.curve[3].loss`, `r.curve.column("loss")`); it prints as a
    /// table and goes to CSV, JSON or Parquet (`r.curve.to_parquet(path)`).
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let d = corpus(asset("pud_en.txt"));
    /// let r = m.prune(d.take(4), #{steps: 2, batch_tokens: 300, eval_data: d.take(2), eval_every: 2});
    /// assert(r.curve[0].eval_value == () && type_of(r.curve[1].eval_value) == "f64" && r.curve[1].open <= 72);
    /// assert(r.curve.len() == 2 && r.curve.columns[0] == "step" && r.curve.to_string().contains("expected_open"));
    /// ```
    #[rhai_fn(get = "curve", pure)]
    pub fn curve(r: &mut PruneResult) -> Table {
        let cols = ["step", "loss", "penalty", "expected_open", "open", "eval_value"];
        let mut t = Table::new(cols.iter().map(|c| c.to_string()).collect());
        t.title = Some(format!("pruning curve ({} steps)", r.run.state.curve.len()));
        for p in &r.run.state.curve {
            let _ = t.push_row(vec![
                Cell::Int(p.step as i64),
                Cell::Float(p.loss),
                Cell::Float(p.penalty),
                Cell::Float(p.expected_open),
                Cell::Int(p.open as i64),
                p.eval.map_or(Cell::Empty, Cell::Float),
            ]);
        }
        t
    }

    /// Seconds each training step took in this run (a resumed run lists only its own steps).
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 2, batch_tokens: 300});
    /// assert(r.step_seconds.len() == 2 && r.step_seconds[1] > 0.0);
    /// ```
    #[rhai_fn(get = "step_seconds", pure)]
    pub fn step_seconds(r: &mut PruneResult) -> Array {
        r.run.step_seconds.iter().map(|&s| Dynamic::from(s)).collect()
    }

    /// Steps trained.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// assert(m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 3, batch_tokens: 300}).steps == 3);
    /// ```
    #[rhai_fn(get = "steps", pure)]
    pub fn steps(r: &mut PruneResult) -> i64 {
        r.run.state.step as i64
    }

    /// What the task loss was: "references", "teacher" (the unpruned model's greedy
    /// outputs) or "distill (cosine|mse)".
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// assert(m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300, distill: "mse"}).objective == "distill (mse)");
    /// ```
    #[rhai_fn(get = "objective", pure)]
    pub fn objective(r: &mut PruneResult) -> String {
        r.run.objective.clone()
    }

    /// The options of the run, every default included, each keeping its type.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300, seed: 7});
    /// assert(r.options.seed == 7 && r.options.beta == 0.33 && r.options.kinds == ["enc"]);
    /// ```
    #[rhai_fn(get = "options", pure)]
    pub fn options(r: &mut PruneResult) -> Map {
        crate::script::convert::echo_map(&r.run.options.echo())
    }

    /// The last evaluation metric (with the `eval_data` option), else `()`.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let d = corpus(asset("pud_en.txt"));
    /// let r = m.prune(d.take(4), #{steps: 2, batch_tokens: 300, "eval": d.take(2)});
    /// assert(r.final_eval >= 0.0);
    /// ```
    #[rhai_fn(get = "final_eval", pure)]
    pub fn eval(r: &mut PruneResult) -> Dynamic {
        r.run.state.curve.iter().rev().find_map(|p| p.eval).map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// The gates as a table: one row per layer, with the number of open heads.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let t = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300}).table();
    /// assert(t.len() == 6);
    /// ```
    #[rhai_fn(name = "table", pure)]
    pub fn table(r: &mut PruneResult) -> Table {
        r.table()
    }

    /// A heatmap of the gates of the first gated kind.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let p = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300}).heatmap();
    /// assert(p.to_svg().contains("enc.5"));
    /// ```
    #[rhai_fn(name = "heatmap", return_raw, pure)]
    pub fn heatmap(r: &mut PruneResult) -> ScriptResult<Plot> {
        r.heatmap(None)
    }

    /// A heatmap of the gates of one kind.
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300});
    /// assert(r.heatmap("cross").to_svg().contains("cross.1"));
    /// ```
    #[rhai_fn(name = "heatmap", return_raw, pure)]
    pub fn heatmap_kind(r: &mut PruneResult, kind: &str) -> ScriptResult<Plot> {
        let k: Kind = kind.parse().or_else(|e: String| err(format!("heatmap: {e}")))?;
        r.heatmap(Some(k))
    }

    /// The training curve as a line plot: loss, the expected fraction of open heads, and the
    /// eval metric when there is one.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let p = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 3, batch_tokens: 300}).plot();
    /// assert(p.to_svg().contains("loss"));
    /// ```
    #[rhai_fn(name = "plot", return_raw, pure)]
    pub fn plot(r: &mut PruneResult) -> ScriptResult<Plot> {
        r.plot()
    }

    /// Writes the result (options, gates, log_alpha, P(open), retained heads, curve) as JSON,
    /// atomically.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.prune(corpus(asset("pud_en.txt")).take(4), #{steps: 1, batch_tokens: 300});
    /// let p = temp_path("prune.json");
    /// r.to_json(p);
    /// assert(read_text(p).contains("\"log_alpha\""));
    /// ```
    #[rhai_fn(name = "to_json", return_raw, pure)]
    pub fn to_json(r: &mut PruneResult, path: &str) -> ScriptResult<()> {
        crate::grid::write_json(path, &r.to_json(), "to_json")
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn to_string(r: &mut PruneResult) -> String {
        let s = format!(
            "<PruneResult {}: {} of {} heads open>",
            r.title(),
            r.run.retained().len(),
            r.run.layout.trainable()
        );
        match r.settle_note() {
            Some(n) => format!("{s}\n{n}"),
            None => s,
        }
    }

    /// The gates not settled yet (P(open) between 0.1 and 0.9) and how many were trained: a
    /// result with many unsettled gates needs more steps.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let r = m.prune(["The cat sat on the mat."], #{steps: 1});
    /// let u = r.unsettled;
    /// assert(u.trained == 8 && u.unsettled <= 8);
    /// assert(r.to_string().contains("have not settled") == (u.unsettled > 0));
    /// ```
    #[rhai_fn(get = "unsettled", pure)]
    pub fn unsettled(r: &mut PruneResult) -> Map {
        let (n, of) = r.run.unsettled();
        let mut m = Map::new();
        m.insert("unsettled".into(), Dynamic::from(n as i64));
        m.insert("trained".into(), Dynamic::from(of as i64));
        m
    }

    #[rhai_fn(name = "to_debug", pure)]
    pub fn to_debug(r: &mut PruneResult) -> String {
        format!("<PruneResult {}: {} of {} heads open>", r.title(), r.run.retained().len(), r.run.layout.trainable())
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<PruneResult>("PruneResult");
    engine.register_global_module(exported_module!(api).into());
    super::script_duo::register(engine);
}

pub fn render(v: &Dynamic) -> Option<Output> {
    v.clone().try_cast::<PruneResult>().map(|r| r.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_shows_the_deterministic_open_count() {
        let p = CurvePoint { step: 7, loss: 2.5, penalty: 13.04, expected_open: 13.04, open: 0, eval: None };
        assert_eq!(
            progress_line("prune (lambda 0.1)", &p),
            "prune (lambda 0.1): loss 2.500, penalty 13.04, open 0 (expected 13.0)"
        );
        let p = CurvePoint { open: 12, ..p };
        assert!(progress_line("x", &p).contains("open 12 (expected 13.0)"));
    }
}
