//! Experts as units (docs/methods.md#experts-as-units): `m.expert_sweep(data)`,
//! `m.expert_importance(data)`, `m.router_stats(data)`, `m.prune_experts(experts)` and their
//! result, `ExpertGrid` (a layers x experts matrix: a row per stack layer, empty for a dense
//! one; NaN for an expert `prune_experts` removed).

use crate::analysis::ablation::{self, Metric};
use crate::analysis::experts::{self as core, ExpertAblation, ExpertId};
use crate::model::script::ScriptModel;
use crate::model::view::Needs;
use crate::output::{Output, Render};
use crate::script::convert::{err, opt_int, opt_str, OptSpec, Opts, ScriptErr, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Map};

pub const EXPERT_SWEEP_OPTIONS: &[OptSpec] = &[
    opt_str("ablation", "route", "\"route\": the expert removed from routing (the router picks among the others; what prune_experts computes); \"output\": its output zeroed where it was chosen (docs/methods.md#experts-as-units)"),
    opt_str("metric", "loss", "\"loss\" (next-token loss) or \"kl\" (to the unablated model's next-token distribution)"),
    opt_int("batch_tokens", 2048, "tokens per batch, padding included"),
];

pub const EXPERT_IMPORTANCE_OPTIONS: &[OptSpec] =
    &[opt_int("batch_tokens", 2048, "tokens per batch, padding included")];

pub const EXPERT_L0_OPTIONS: &[OptSpec] = &[
    crate::script::convert::opt_f64("lambda", 0.01, "weight of the L0 penalty (per expert)"),
    opt_int("steps", 100, "training steps"),
    crate::script::convert::opt_f64("lr", 0.1, "Adam's learning rate for the gates"),
    opt_str(
        "objective",
        "kl",
        "\"kl\": KL from the ungated model's next-token distribution; \"loss\": the next-token loss on the data",
    ),
    crate::script::convert::opt_f64("init", 2.0, "initial log_alpha of every gate (2: P(open) about 0.9)"),
    opt_int("seed", 0, "seed of the batches' order and the gates' noise"),
    opt_int("batch_tokens", 2048, "tokens per batch, padding included"),
];

pub const WITH_EXPERT_MASK_OPTIONS: &[OptSpec] = &[opt_str(
    "ablation",
    "route",
    "\"route\": the experts removed from routing (what prune_experts computes); \"output\": their output zeroed where they are chosen (docs/methods.md#experts-as-units)",
)];

pub const ROUTER_STATS_OPTIONS: &[OptSpec] = &[opt_int("batch_tokens", 2048, "tokens per batch, padding included")];

/// One statistic per expert: `values[layer][expert]`.
#[derive(Clone)]
pub struct ExpertGrid {
    pub stat: String,
    pub model: String,
    pub dataset: String,
    pub values: Vec<Vec<f64>>,
    pub options: crate::output::Echo,
}

impl ExpertGrid {
    /// One row per expert layer, one column per expert.
    pub fn table(&self) -> Table {
        let n = self.values.iter().map(Vec::len).max().unwrap_or(0);
        let mut cols = vec!["layer".to_string()];
        cols.extend((0..n).map(|e| format!("e{e}")));
        let mut t = Table::new(cols);
        t.title = Some(format!("{}: {} on {}", self.stat, self.model, self.dataset));
        t.digits = 4;
        for (l, row) in self.values.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let mut cells = vec![Cell::Int(l as i64)];
            cells.extend((0..n).map(|e| row.get(e).map_or(Cell::Empty, |v| Cell::Float(*v))));
            let _ = t.push_row(cells);
        }
        t
    }

    /// Every expert with a value, highest first (ties by expert).
    pub fn ranked(&self) -> Vec<(ExpertId, f64)> {
        let mut all: Vec<(ExpertId, f64)> = self
            .values
            .iter()
            .enumerate()
            .flat_map(|(l, row)| {
                row.iter()
                    .enumerate()
                    .filter(|(_, v)| !v.is_nan())
                    .map(move |(e, &v)| (ExpertId { layer: l, expert: e }, v))
            })
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all
    }

    fn end_table(&self, k: i64, lowest: bool) -> Table {
        let mut r = self.ranked();
        if lowest {
            r.reverse();
        }
        let mut t = Table::new(vec!["expert".into(), "value".into()]);
        t.title = Some(format!("{} {k}: {}", if lowest { "bottom" } else { "top" }, self.stat));
        t.digits = 4;
        for (id, v) in r.into_iter().take(k.max(0) as usize) {
            let _ = t.push_row(vec![Cell::Text(id.to_string()), Cell::Float(v)]);
        }
        t
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "stat": self.stat, "model": self.model, "dataset": self.dataset,
            "options": self.options.iter().cloned().collect::<serde_json::Map<_, _>>(),
            "experts": self.values,
        })
    }
}

impl Render for ExpertGrid {
    fn render(&self) -> Output {
        self.table().render()
    }
}

/// Experts given as `"L.eE"` strings or `[layer, expert]` pairs, checked against the model.
fn expert_ids(m: &ScriptModel, v: &Dynamic, f: &str) -> ScriptResult<Vec<ExpertId>> {
    let items: Array = match v.clone().try_cast::<Array>() {
        Some(a) if a.first().is_some_and(|x| x.is_int()) => vec![v.clone()],
        Some(a) => a,
        None => vec![v.clone()],
    };
    let mut out = Vec::new();
    for x in items {
        let id = if let Some(s) = x.clone().try_cast::<String>() {
            let parsed = s.split_once(".e").and_then(|(l, e)| Some((l.parse().ok()?, e.parse().ok()?)));
            let Some((layer, expert)) = parsed else {
                return err(format!(
                    "{f}: '{s}' is not an expert: write \"LAYER.eEXPERT\" (\"0.e3\") or [LAYER, EXPERT]"
                ));
            };
            ExpertId { layer, expert }
        } else if let Some(a) = x.clone().try_cast::<Array>() {
            let ints: Vec<i64> = a.iter().filter_map(|i| i.as_int().ok()).collect();
            match ints[..] {
                [l, e] if a.len() == 2 && l >= 0 && e >= 0 => ExpertId { layer: l as usize, expert: e as usize },
                _ => {
                    return err(format!(
                        "{f}: {a:?} is not an expert: write [LAYER, EXPERT] with two non-negative integers"
                    ))
                }
            }
        } else {
            return err(format!(
                "{f}: expected experts (\"0.e3\" or [0, 3], or an array of them), got {}",
                x.type_name()
            ));
        };
        core::check_expert(&m.model, id).or_else(|e| err(format!("{f}: {e}")))?;
        out.push(id);
    }
    Ok(out)
}

fn grid(
    m: &ScriptModel,
    stat: String,
    data: &crate::data::Dataset,
    values: Vec<Vec<f64>>,
    options: crate::output::Echo,
) -> ExpertGrid {
    ExpertGrid { stat, model: m.model.name(), dataset: data.name.clone(), values, options }
}

#[export_module]
pub mod api {
    use super::*;

    /// The metric with each expert ablated alone (docs/methods.md#experts-as-units): a row per
    /// stack layer (empty for a dense one), a column per expert. Options: `ablation` ("route":
    /// removed from routing, the router picking among the others as `prune_experts` does;
    /// "output": its output zeroed where it was chosen), `metric` ("loss" | "kl"),
    /// `batch_tokens` (2048). One pass over the data per expert.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/mixtral");
    /// let d = corpus(asset("pud_en.txt")).take(3);
    /// let g = m.expert_sweep(d, #{ablation: "output"});
    /// assert(g.values.len() == 2 && g.values[0].len() == 4);
    /// assert(g.values[0][1] != g.options.base);
    /// assert(g.top(1).len() == 1);
    /// ```
    #[rhai_fn(name = "expert_sweep", return_raw, pure)]
    pub fn expert_sweep_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<ExpertGrid> {
        let f = "expert_sweep";
        let o = Opts::new(&options, f, EXPERT_SWEEP_OPTIONS)?;
        let d = crate::data::script::dataset_arg(&data, f)?;
        m.require(f, Needs::Unmasked).script()?;
        let how: ExpertAblation = o.parsed_or_default("ablation")?;
        let metric: Metric = o.parsed_or_default("metric")?;
        if !matches!(metric, Metric::Loss | Metric::Kl) {
            return err(format!("{f}: metric '{metric}' is not one of \"loss\", \"kl\""));
        }
        let batch = o.usize_or_default("batch_tokens")?;
        let p = ablation::prepare(&m.model, &d, metric, batch, crate::model::nn::Gates::none())
            .or_else(|e| err(format!("{f}: {e}")))?;
        let stop = crate::run::interrupted;
        let base = ablation::evaluate(&m.model, &p, &p.base, &stop).or_else(|e| err(format!("{f}: {e}")))?;
        let mut progress = |done: usize, total: usize| crate::run::progress(f, done, total);
        let values =
            core::expert_sweep(&m.model, &p, how, &stop, &mut progress).or_else(|e| err(format!("{f}: {e}")))?;
        let options = vec![
            ("ablation".to_string(), serde_json::json!(how.to_string())),
            ("metric".into(), serde_json::json!(metric.to_string())),
            ("batch_tokens".into(), serde_json::json!(batch)),
            ("base".into(), crate::script::convert::json_f64(base)),
        ];
        let stat = format!("{metric} with the expert ablated ({how}; base {})", crate::output::fixed(base, 4));
        Ok(grid(m, stat, &d, values, options))
    }

    #[rhai_fn(name = "expert_sweep", return_raw, pure)]
    pub fn expert_sweep(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<ExpertGrid> {
        expert_sweep_opts(m, data, Map::new())
    }

    /// Gradient importance of every expert (docs/methods.md#experts-as-units): the mean over
    /// sentences of |dL/dg|, the gradient of the sentence's next-token loss in a gate `g`
    /// multiplying the expert's router weight at every token, at `g = 1`. Options:
    /// `batch_tokens` (2048). One forward and one backward per batch.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/olmoe");
    /// let g = m.expert_importance(corpus(asset("pud_en.txt")).take(3));
    /// assert(g.values[1].len() == 4 && g.values[1][0] >= 0.0);
    /// ```
    #[rhai_fn(name = "expert_importance", return_raw, pure)]
    pub fn expert_importance_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<ExpertGrid> {
        let f = "expert_importance";
        let o = Opts::new(&options, f, EXPERT_IMPORTANCE_OPTIONS)?;
        let d = crate::data::script::dataset_arg(&data, f)?;
        m.require(f, Needs::Unmasked).script()?;
        let batch = o.usize_or_default("batch_tokens")?;
        let mut progress = |done: usize, total: usize| crate::run::progress(f, done, total);
        let base = crate::model::nn::Gates::none();
        let values = core::expert_importance(&m.model, &d, &base, batch, &crate::run::interrupted, &mut progress)
            .or_else(|e| err(format!("{f}: {e}")))?;
        let options = vec![("batch_tokens".to_string(), serde_json::json!(batch))];
        Ok(grid(m, "expert importance |dL/dg|".into(), &d, values, options))
    }

    #[rhai_fn(name = "expert_importance", return_raw, pure)]
    pub fn expert_importance(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<ExpertGrid> {
        expert_importance_opts(m, data, Map::new())
    }

    /// Hard Concrete gates with an L0 penalty on every expert (docs/methods.md#expert-l0): a
    /// gate per expert multiplying its router weight, trained for `objective + lambda *
    /// sum P(g != 0)`; returns each expert's P(gate open) as a grid, with the experts the
    /// binary gates close in `options.closed` (for `prune_experts`) and the last step's
    /// objective and expected open experts. Options: `lambda` (0.01), `steps` (100), `lr`
    /// (0.1), `objective` ("kl" | "loss"), `init` (2.0), `seed` (0), `batch_tokens` (2048).
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/mixtral");
    /// let g = m.expert_l0(corpus(asset("pud_en.txt")).take(3), #{lambda: 0.5, steps: 20});
    /// assert(g.values[1].len() == 4 && g.values[0][0] > 0.0 && g.values[0][0] < 1.0);
    /// assert(g.options.expected_open < 8.0);
    /// let small = m.prune_experts(g.options.closed);
    /// ```
    #[rhai_fn(name = "expert_l0", return_raw, pure)]
    pub fn expert_l0_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<ExpertGrid> {
        let f = "expert_l0";
        let o = Opts::new(&options, f, EXPERT_L0_OPTIONS)?;
        let d = crate::data::script::dataset_arg(&data, f)?;
        m.require(f, Needs::Unmasked).script()?;
        let opts = crate::prune::experts::ExpertL0Options {
            lambda: o.f64_or_default("lambda")?,
            steps: o.usize_or_default("steps")?,
            lr: o.f64_or_default("lr")?,
            batch_tokens: o.usize_or_default("batch_tokens")?,
            seed: o.usize_or_default("seed")? as u64,
            init: o.f64_or_default("init")?,
            objective: o.parsed_or_default("objective")?,
        };
        let mut progress = |done: usize, total: usize| crate::run::progress(f, done, total);
        let r = crate::prune::experts::expert_l0(&m.model, &d, &opts, &crate::run::interrupted, &mut progress)
            .or_else(|e| err(format!("{f}: {e}")))?;
        let values = core::by_number(&m.model, &r.p_open);
        let (_, objective, open) = r.curve.last().copied().unwrap_or((0, f64::NAN, f64::NAN));
        let options = vec![
            ("lambda".to_string(), serde_json::json!(opts.lambda)),
            ("steps".into(), serde_json::json!(opts.steps)),
            ("lr".into(), serde_json::json!(opts.lr)),
            ("objective".into(), serde_json::json!(opts.objective.to_string())),
            ("init".into(), serde_json::json!(opts.init)),
            ("seed".into(), serde_json::json!(opts.seed)),
            ("batch_tokens".into(), serde_json::json!(opts.batch_tokens)),
            ("closed".into(), serde_json::json!(r.closed.iter().map(|c| c.to_string()).collect::<Vec<_>>())),
            ("last_objective".into(), crate::script::convert::json_f64(objective)),
            ("expected_open".into(), crate::script::convert::json_f64(open)),
        ];
        Ok(grid(m, "P(gate open) after L0 training".into(), &d, values, options))
    }

    #[rhai_fn(name = "expert_l0", return_raw, pure)]
    pub fn expert_l0(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<ExpertGrid> {
        expert_l0_opts(m, data, Map::new())
    }

    /// The router's statistics per expert layer over every real token of `data`
    /// (docs/methods.md#router-statistics): an array of maps `#{layer, tokens, experts, load,
    /// weight, entropy, co_selection}`: per expert the fraction of tokens that chose it (the
    /// loads sum to the experts per token) and its mean weight, the mean entropy (nats) of the
    /// router's softmax, and the fraction of tokens choosing both of two experts.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/mixtral");
    /// let s = m.router_stats(corpus(asset("pud_en.txt")).take(3));
    /// assert(s.len() == 2 && s[0].load.len() == 4);
    /// let total = 0.0;
    /// for x in s[0].load { total += x; }
    /// assert(total > 1.999 && total < 2.001 && s[0].co_selection[1][1] == s[0].load[1]);
    /// ```
    #[rhai_fn(name = "router_stats", return_raw, pure)]
    pub fn router_stats_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Array> {
        let f = "router_stats";
        let o = Opts::new(&options, f, ROUTER_STATS_OPTIONS)?;
        let d = crate::data::script::dataset_arg(&data, f)?;
        m.require(f, Needs::Unmasked).script()?;
        let batch = o.usize_or_default("batch_tokens")?;
        let stats = core::router_stats(&m.model, &d, &crate::model::nn::Gates::none(), batch, &crate::run::interrupted)
            .or_else(|e| err(format!("{f}: {e}")))?;
        let floats = |v: &[f64]| Dynamic::from(v.iter().map(|&x| Dynamic::from(x)).collect::<Array>());
        Ok(stats
            .into_iter()
            .map(|s| {
                let mut r = Map::new();
                r.insert("layer".into(), Dynamic::from(s.layer as i64));
                r.insert("tokens".into(), Dynamic::from(s.tokens as i64));
                r.insert(
                    "experts".into(),
                    Dynamic::from(s.experts.iter().map(|&e| Dynamic::from(e as i64)).collect::<Array>()),
                );
                r.insert("load".into(), floats(&s.load));
                r.insert("weight".into(), floats(&s.weight));
                r.insert("entropy".into(), Dynamic::from(s.entropy));
                r.insert("co_selection".into(), crate::grid::matrix(&s.co_selection));
                Dynamic::from(r)
            })
            .collect())
    }

    #[rhai_fn(name = "router_stats", return_raw, pure)]
    pub fn router_stats(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Array> {
        router_stats_opts(m, data, Map::new())
    }

    /// A new model without these experts (`"L.eE"` strings or `[layer, expert]` pairs): each
    /// layer's router loses their rows and picks among the others, which is what routing
    /// around them computes (`expert_sweep`'s "route"); the others keep their numbers.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/mixtral");
    /// let small = m.prune_experts(["0.e1", [1, 3]]);
    /// assert(small.params < m.params);
    /// ```
    #[rhai_fn(name = "prune_experts", return_raw, pure)]
    pub fn prune_experts(m: &mut ScriptModel, experts: Dynamic) -> ScriptResult<ScriptModel> {
        let f = "prune_experts";
        let ids = expert_ids(m, &experts, f)?;
        m.require(f, Needs::Unmasked).script()?;
        let pruned = core::prune_experts(&m.model, &ids).or_else(|e| err(format!("{f}: {e}")))?;
        Ok(ScriptModel::new(pruned))
    }

    /// A view of the model with these experts closed (`"L.eE"` strings or `[layer, expert]`
    /// pairs), in every analysis run on it (docs/methods.md#experts-as-units): routed around
    /// (`ablation: "route"`, the default: what `prune_experts` computes, without a copy of the
    /// weights) or their output zeroed where they are chosen (`"output"`). One way per view;
    /// heads may be masked beside them.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/mixtral");
    /// let d = corpus(asset("pud_en.txt")).take(3);
    /// let v = m.with_expert_mask(["0.e1", [1, 3]]);
    /// assert(v.masked_experts == ["0.e1", "1.e3"]);
    /// assert(v.loss(d) != m.loss(d));
    /// let z = m.with_expert_mask(["0.e1"], #{ablation: "output"});
    /// assert(`${z}`.contains("experts output zeroed: 0.e1"));
    /// ```
    #[rhai_fn(name = "with_expert_mask", return_raw, pure)]
    pub fn with_expert_mask_opts(m: &mut ScriptModel, experts: Dynamic, options: Map) -> ScriptResult<ScriptModel> {
        let f = "with_expert_mask";
        let o = Opts::new(&options, f, WITH_EXPERT_MASK_OPTIONS)?;
        let how: ExpertAblation = o.parsed_or_default("ablation")?;
        let ids = expert_ids(m, &experts, f)?;
        m.closing_experts(&ids, how == ExpertAblation::Route, f).script()
    }

    #[rhai_fn(name = "with_expert_mask", return_raw, pure)]
    pub fn with_expert_mask(m: &mut ScriptModel, experts: Dynamic) -> ScriptResult<ScriptModel> {
        with_expert_mask_opts(m, experts, Map::new())
    }

    /// The experts this view closes, as `"L.eE"` strings.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/olmoe");
    /// assert(m.masked_experts == []);
    /// assert(m.with_expert_mask([0, 2]).masked_experts == ["0.e2"]);
    /// ```
    #[rhai_fn(get = "masked_experts", pure)]
    pub fn masked_experts(m: &mut ScriptModel) -> Array {
        m.experts.iter().flat_map(|e| e.closed.iter()).map(|x| Dynamic::from(x.to_string())).collect()
    }

    /// The grid's values: a row per stack layer (empty for a dense one), a column per expert.
    #[rhai_fn(get = "values", pure)]
    pub fn values(g: &mut ExpertGrid) -> Dynamic {
        crate::grid::matrix(&g.values)
    }

    /// The options the grid was computed with (and `base`, the unablated metric, for a sweep).
    #[rhai_fn(get = "options", pure)]
    pub fn options(g: &mut ExpertGrid) -> Map {
        crate::script::convert::echo_map(&g.options)
    }

    #[rhai_fn(name = "table", pure)]
    pub fn table(g: &mut ExpertGrid) -> Table {
        g.table()
    }

    /// The `k` experts with the highest values.
    #[rhai_fn(name = "top", pure)]
    pub fn top(g: &mut ExpertGrid, k: i64) -> Table {
        g.end_table(k, false)
    }

    /// The `k` experts with the lowest values.
    #[rhai_fn(name = "bottom", pure)]
    pub fn bottom(g: &mut ExpertGrid, k: i64) -> Table {
        g.end_table(k, true)
    }

    /// Writes the grid as JSON (atomically).
    #[rhai_fn(name = "to_json", return_raw, pure)]
    pub fn to_json(g: &mut ExpertGrid, path: &str) -> ScriptResult<()> {
        crate::grid::write_json(path, &g.to_json(), "to_json")
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn to_string(g: &mut ExpertGrid) -> String {
        g.table().to_text()
    }
}
