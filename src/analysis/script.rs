//! Script API of the analyses: `m.analyze(data, #{...})`, `m.confidence(data)`, the
//! `Analysis` result and `Grid` (one statistic as layers x heads per kind).

use super::options::{FreqSource, Options, Stat};
use super::result::Analysis;
use super::{analyze, freq_table, FreqTable};
use crate::model::script::ScriptModel;
use crate::model::{HeadId, Kind};
use crate::output::{write_atomic, Output, Render};
use crate::plot::{Plot, PlotKind};
use crate::script::convert::{err, quote, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Engine, Map};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

thread_local! {
    /// Frequency tables by (model path, source, top_n): tokenizing a corpus takes a while.
    static FREQ: RefCell<HashMap<(String, String, usize), Rc<FreqTable>>> = RefCell::new(HashMap::new());
}

/// One statistic over heads: per kind a layers x heads matrix.
#[derive(Clone)]
pub struct Grid {
    pub stat: String,
    pub model: String,
    pub dataset: String,
    pub kinds: crate::model::KindGrids,
    pub options: Vec<(String, String)>,
}

impl Grid {
    fn table(&self) -> Table {
        let n_heads = self.kinds.iter().map(|(_, m)| m.first().map_or(0, |r| r.len())).max().unwrap_or(0);
        let mut cols = vec!["layer".to_string()];
        cols.extend((0..n_heads).map(|h| format!("h{h}")));
        let mut t = Table::new(cols);
        t.title = Some(format!("{}: {} on {}", self.stat, self.model, self.dataset));
        t.digits = 3;
        for (k, m) in &self.kinds {
            for (l, row) in m.iter().enumerate() {
                let mut cells = vec![Cell::Text(format!("{k}.{l}"))];
                cells.extend((0..n_heads).map(|h| row.get(h).map_or(Cell::Empty, |v| Cell::Float(*v))));
                let _ = t.push_row(cells);
            }
        }
        t
    }

    fn heatmap(&self, kind: Kind) -> ScriptResult<Plot> {
        let Some((_, m)) = self.kinds.iter().find(|(k, _)| *k == kind) else {
            let have: Vec<String> = self.kinds.iter().map(|(k, _)| k.to_string()).collect();
            return err(format!("heatmap: no '{kind}' in this result (it has: {})", have.join(", ")));
        };
        let rows = (0..m.len()).map(|l| format!("{kind}.{l}")).collect();
        let cols = (0..m.first().map_or(0, |r| r.len())).map(|h| format!("h{h}")).collect();
        let mut p = Plot::new(
            PlotKind::Heatmap { values: m.clone(), row_labels: rows, col_labels: cols, show_values: true, vmin: None, vmax: None },
            format!("{} ({kind}): {} on {}", self.stat, self.model, self.dataset),
        )
        .or_else(|e| err(e.to_string()))?;
        p.x_label = "head".into();
        p.y_label = "layer".into();
        Ok(p)
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "stat": self.stat, "model": self.model, "dataset": self.dataset,
            "options": self.options.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "kinds": self.kinds.iter().map(|(k, m)| (k.to_string(), serde_json::json!(m))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

impl Render for Grid {
    fn render(&self) -> Output {
        let mut o = self.table().render();
        if let Some((k, _)) = self.kinds.first() {
            if let Ok(p) = self.heatmap(*k) {
                let po = p.render();
                o.png = po.png;
                o.svg = po.svg;
            }
        }
        o
    }
}

#[derive(Clone)]
pub struct AnalysisObj(pub Rc<Analysis>);

/// Head diversity of a model on a dataset.
#[derive(Clone)]
pub struct DiversityObj(pub Rc<super::diversity::Diversity>);

const DIVERSITY_METRICS: [&str; 4] = ["query", "context", "output", "intra"];

impl DiversityObj {
    fn summary(&self) -> Table {
        use super::diversity::off_diagonal_mean;
        let mut t = Table::new(
            ["layer", "query orthogonality", "context non-orthogonality", "output dissimilarity", "intra-head variance", "tokens"].iter().map(|s| s.to_string()).collect(),
        );
        t.title = Some(format!("Head diversity (off-diagonal means): {} on {}", self.0.model, self.0.dataset));
        for (k, layers) in &self.0.kinds {
            for (l, d) in layers.iter().enumerate() {
                let present: Vec<f64> = d.intra.iter().copied().filter(|v| !v.is_nan()).collect();
                let intra = if present.is_empty() { f64::NAN } else { present.iter().sum::<f64>() / present.len() as f64 };
                let _ = t.push_row(vec![
                    Cell::Text(format!("{k}.{l}")),
                    Cell::Float(off_diagonal_mean(&d.query)),
                    Cell::Float(off_diagonal_mean(&d.context)),
                    Cell::Float(off_diagonal_mean(&d.output)),
                    Cell::Float(intra),
                    Cell::Int(d.tokens as i64),
                ]);
            }
        }
        t
    }

    fn layer(&self, kind: &str, layer: i64) -> ScriptResult<&super::diversity::LayerDiversity> {
        let k: Kind = kind.parse().or_else(|e: String| err(e))?;
        let Some((_, layers)) = self.0.kinds.iter().find(|(x, _)| *x == k) else { return err(format!("diversity: no '{kind}' in this result")) };
        if layer < 0 || layer as usize >= layers.len() {
            return err(format!("diversity: layer {layer} out of range: '{kind}' has layers 0..{}", layers.len() - 1));
        }
        Ok(&layers[layer as usize])
    }

    fn matrix(&self, metric: &str, kind: &str, layer: i64) -> ScriptResult<Vec<Vec<f64>>> {
        let d = self.layer(kind, layer)?;
        Ok(match metric {
            "query" => d.query.clone(),
            "context" => d.context.clone(),
            "output" => d.output.clone(),
            "intra" => vec![d.intra.clone()],
            other => return err(format!("diversity: unknown metric '{other}' (expected {})", DIVERSITY_METRICS.join(", "))),
        })
    }
}

impl Render for DiversityObj {
    fn render(&self) -> Output {
        self.summary().render()
    }
}

impl AnalysisObj {
    fn grid(&self, stat: &str, f: impl Fn(&super::result::KindResult) -> Option<Vec<Vec<f64>>>) -> ScriptResult<Grid> {
        let kinds: crate::model::KindGrids = self.0.kinds.iter().filter_map(|k| f(k).map(|m| (k.kind, m))).collect();
        if kinds.is_empty() {
            return err(format!("this analysis did not compute '{stat}' (stats: {})", self.0.options.iter().find(|(k, _)| k == "stats").map_or("", |(_, v)| v.as_str())));
        }
        Ok(Grid { stat: stat.into(), model: self.0.model.clone(), dataset: self.0.dataset.clone(), kinds, options: self.0.options.clone() })
    }
}

impl Render for AnalysisObj {
    fn render(&self) -> Output {
        let a = &self.0;
        let mut text = a.summary();
        let mut html = format!("<p>{}</p>", crate::output::html_escape(&a.summary()));
        let f = a.functions_table();
        if !f.rows.is_empty() {
            text += &format!("\n{}", f.to_text());
            html += &f.to_html();
        }
        if let Some(t) = a.syntactic_table() {
            text += &format!("\n{}", t.to_text());
            html += &t.to_html();
        }
        Output { text, html: Some(html), ..Default::default() }
    }
}

fn strings(v: &Dynamic, what: &str) -> ScriptResult<Vec<String>> {
    let Some(a) = v.clone().try_cast::<Array>() else { return err(format!("analyze: option '{what}' must be an array of strings, got {}", quote(v))) };
    a.iter().map(|x| if x.is_string() { Ok(x.to_string()) } else { err(format!("analyze: option '{what}' has a non-string item {}", quote(x))) }).collect()
}

const OPTIONS: &[&str] = &[
    "stats", "kinds", "batch_tokens", "exclude_keys", "positional_threshold", "rare_top_n", "rare_threshold", "freq", "freq_counts", "relations",
    "subtypes", "margin", "treebank",
];

fn parse_options(m: &ScriptModel, data: &crate::data::Dataset, options: &Map) -> ScriptResult<(Options, crate::data::Dataset)> {
    let o = Opts::new(options, "analyze", OPTIONS)?;
    let is_tb = data.items.iter().all(|i| i.tree.is_some());
    let stats: Vec<Stat> = match options.get("stats") {
        Some(v) => strings(v, "stats")?.iter().map(|s| s.parse().or_else(|e: String| err(format!("analyze: {e}")))).collect::<ScriptResult<_>>()?,
        None if is_tb || options.contains_key("treebank") => vec![Stat::Confidence, Stat::Positional, Stat::Rare, Stat::Syntactic],
        None => vec![Stat::Confidence, Stat::Positional, Stat::Rare],
    };
    let kinds: Vec<Kind> = match options.get("kinds") {
        Some(v) => strings(v, "kinds")?.iter().map(|s| s.parse().or_else(|e: String| err(format!("analyze: {e}")))).collect::<ScriptResult<_>>()?,
        None => m.model.kinds().iter().map(|k| k.kind).collect(),
    };
    let brown = crate::assets::asset_path("brown.txt").unwrap_or_else(|_| "assets/brown.txt".into());
    let mut opts = Options::new(stats, kinds, brown);
    if let Some(b) = o.usize("batch_tokens")? {
        opts.batch_tokens = b.max(1);
    }
    if let Some(x) = o.string("exclude_keys")? {
        opts.exclude_keys = x.parse().or_else(|e: String| err(format!("analyze: {e}")))?;
    }
    let frac = |name: &str, v: Option<f64>| -> ScriptResult<Option<f64>> {
        match v {
            Some(x) if !(0.0..=1.0).contains(&x) => err(format!("analyze: option '{name}' must be between 0 and 1, got {x}")),
            other => Ok(other),
        }
    };
    if let Some(x) = frac("positional_threshold", o.f64("positional_threshold")?)? {
        opts.positional_threshold = x;
    }
    if let Some(x) = frac("rare_threshold", o.f64("rare_threshold")?)? {
        opts.rare_threshold = x;
    }
    if let Some(x) = frac("margin", o.f64("margin")?)? {
        opts.margin = x;
    }
    if let Some(x) = o.usize("rare_top_n")? {
        opts.rare_top_n = x;
    }
    match (o.string("freq")?, o.string("freq_counts")?) {
        (Some(_), Some(_)) => return err("analyze: give either 'freq' (a text file) or 'freq_counts' (token<TAB>count lines), not both"),
        (Some(p), None) => opts.freq = FreqSource::Text(p.into()),
        (None, Some(p)) => opts.freq = FreqSource::Counts(p.into()),
        (None, None) => {}
    }
    if let Some(v) = options.get("relations") {
        opts.relations = strings(v, "relations")?;
        if opts.relations.is_empty() {
            return err("analyze: option 'relations' is empty");
        }
    }
    if let Some(s) = o.bool("subtypes")? {
        opts.subtypes = s;
    }
    // A treebank given beside a corpus must match it sentence by sentence.
    let mut data = data.clone();
    if let Some(tb) = options.get("treebank") {
        let tb = crate::data::script::dataset_arg(tb, "analyze: option 'treebank'")?;
        if tb.items.iter().any(|i| i.tree.is_none()) {
            return err(format!("analyze: option 'treebank': {} is not a treebank", tb.name));
        }
        if tb.len() != data.len() {
            return err(format!("analyze: the treebank {} has {} sentences but the dataset {} has {}", tb.name, tb.len(), data.name, data.len()));
        }
        let mut items = Vec::with_capacity(data.len());
        for (i, (d, t)) in data.items.iter().zip(tb.items.iter()).enumerate() {
            if d.text != t.text {
                return err(format!("analyze: sentence {i} of the treebank {} does not match the dataset {}: {:?} vs {:?}", tb.name, data.name, t.text, d.text));
            }
            items.push(crate::data::Item { tree: t.tree.clone(), ..d.clone() });
        }
        data = crate::data::Dataset::new(data.name.clone(), items);
    }
    Ok((opts, data))
}

fn freq_for(m: &ScriptModel, opts: &Options) -> ScriptResult<Option<Rc<FreqTable>>> {
    if !opts.wants(Stat::Rare) {
        return Ok(None);
    }
    let src = format!("{:?}", opts.freq);
    let key = (m.model.path.display().to_string(), src, opts.rare_top_n);
    if let Some(f) = FREQ.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(Some(f));
    }
    let f = Rc::new(freq_table(&m.model, &opts.freq, opts.rare_top_n).or_else(|e| err(format!("analyze: {e}")))?);
    FREQ.with(|c| c.borrow_mut().insert(key, f.clone()));
    Ok(Some(f))
}

fn run(m: &ScriptModel, data: Dynamic, options: Map) -> ScriptResult<AnalysisObj> {
    let d = crate::data::script::dataset_arg(&data, "analyze")?;
    let (opts, d) = parse_options(m, &d, &options)?;
    let freq = freq_for(m, &opts)?;
    let gates = m.gates()?;
    let mut progress = |done: usize, total: usize| crate::run::progress("analyze", done, total);
    let a = analyze(&m.model, &d, &opts, freq.as_deref(), &gates, &crate::run::interrupted, &mut progress).or_else(|e| err(format!("analyze: {e}")))?;
    Ok(AnalysisObj(Rc::new(a)))
}

fn matrix(m: &[Vec<f64>]) -> Dynamic {
    Dynamic::from(m.iter().map(|r| Dynamic::from(r.iter().map(|&v| Dynamic::from(v)).collect::<Array>())).collect::<Array>())
}

/// What `ablate` and `ablation_sweep` share: the prepared data, the kinds, the options echoed.
type AblationSetup = (super::ablation::Prepared, Vec<Kind>, Vec<(String, String)>);

fn ablation_setup(m: &ScriptModel, data: &Dynamic, options: &Map, func: &'static str, default_batch_tokens: usize) -> ScriptResult<AblationSetup> {
    let o = Opts::new(options, func, &["metric", "kinds", "batch_tokens"])?;
    let d = crate::data::script::dataset_arg(data, func)?;
    let generates = m.model.net.output.is_some() && !m.model.net.decoder.is_empty();
    let metric: super::ablation::Metric = match o.string("metric")? {
        Some(x) => x.parse().or_else(|e: String| err(format!("{func}: {e}")))?,
        None if generates => super::ablation::Metric::Loss,
        None => super::ablation::Metric::Cosine,
    };
    let kinds: Vec<Kind> = match options.get("kinds") {
        Some(v) => strings(v, "kinds")?.iter().map(|s| s.parse().or_else(|e: String| err(format!("{func}: {e}")))).collect::<ScriptResult<_>>()?,
        None => m.model.kinds().iter().map(|k| k.kind).collect(),
    };
    let bt = o.usize("batch_tokens")?.unwrap_or(default_batch_tokens);
    let p = super::ablation::prepare(&m.model, &d, metric, bt, m.gates()?).or_else(|e| err(format!("{func}: {e}")))?;
    let echo = vec![("metric".to_string(), metric.to_string()), ("targets".into(), p.targets_from.to_string()), ("batch_tokens".into(), bt.to_string())];
    Ok((p, kinds, echo))
}

#[export_module]
pub mod api {
    use super::*;

    /// The effect of masking `heads` together on a metric over a dataset: a map with `metric`,
    /// `value` (masked), `base` (unmasked), `delta`, `heads` and `targets` ("references" or
    /// "teacher": the full model's greedy outputs). Options: `metric` ("loss" | "kl" | "bleu"
    /// | "cosine"; default loss for models that generate, cosine for encoders),
    /// `batch_tokens` (1024).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let r = m.ablate(corpus(asset("pud_en.txt")).take(5), [m.head("enc", 0, 1)], #{metric: "kl"});
    /// assert(r.base == 0.0 && r.value > 0.0 && r.targets == "teacher");
    /// ```
    #[rhai_fn(name = "ablate", return_raw, pure)]
    pub fn ablate_opts(m: &mut ScriptModel, data: Dynamic, heads: Array, options: Map) -> ScriptResult<Map> {
        let (p, _, echo) = ablation_setup(m, &data, &options, "ablate", crate::model::batch::DEFAULT_BATCH_TOKENS)?;
        let mut ids = Vec::new();
        for (i, h) in heads.iter().enumerate() {
            let Some(h) = h.clone().try_cast::<crate::model::script::Head>() else { return err(format!("ablate: heads[{i}] is not a Head: {}", quote(h))) };
            ids.push(h.id);
        }
        let mut all = m.closed.as_ref().clone();
        all.extend(ids.iter().copied());
        let gates = m.model.gates_closing(&all).or_else(|e| err(format!("ablate: {e}")))?;
        let base_gates = m.gates()?;
        let stop = crate::run::interrupted;
        let base = super::super::ablation::evaluate(&m.model, &p, &base_gates, &stop).or_else(|e| err(format!("ablate: {e}")))?;
        let value = super::super::ablation::evaluate(&m.model, &p, &gates, &stop).or_else(|e| err(format!("ablate: {e}")))?;
        let mut r = Map::new();
        for (k, v) in echo {
            r.insert(k.into(), Dynamic::from(v));
        }
        r.insert("value".into(), Dynamic::from(value));
        r.insert("base".into(), Dynamic::from(base));
        r.insert("delta".into(), Dynamic::from(value - base));
        r.insert("heads".into(), Dynamic::from(super::super::ablation::head_list(&ids)));
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
    pub fn ablate(m: &mut ScriptModel, data: Dynamic, heads: Array) -> ScriptResult<Map> {
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
        let base = super::super::ablation::evaluate(&m.model, &p, &p.base, &stop).or_else(|e| err(format!("ablation_sweep: {e}")))?;
        let mut progress = |done: usize, total: usize| crate::run::progress("ablation sweep", done, total);
        let grids = super::super::ablation::sweep(&m.model, &p, &kinds, &stop, &mut progress).or_else(|e| err(format!("ablation_sweep: {e}")))?;
        echo.push(("base".into(), base.to_string()));
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

    /// Head diversity (docs/methods.md#head-diversity): per layer, H x H matrices of query orthogonality, context
    /// non-orthogonality and output dissimilarity, and each head's intra-head attention
    /// variance, over the dataset's real tokens. Options: `kinds`, `batch_tokens` (1024).
    ///
    /// ```rhai
    /// let d = load_model("enpt").diversity(corpus(asset("pud_en.txt")).take(10));
    /// assert(d.summary().len() == 8);
    /// let q = d.matrix("query", "enc", 0);
    /// // Symmetric, in [0, 1]; a head with itself is 1 only for rank-1 queries.
    /// assert(q.len() == 8 && abs(q[2][5] - q[5][2]) < 1e-9 && q[3][3] > 0.0 && q[3][3] <= 1.0);
    /// ```
    #[rhai_fn(name = "diversity", return_raw, pure)]
    pub fn diversity_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<DiversityObj> {
        let o = Opts::new(&options, "diversity", &["kinds", "batch_tokens"])?;
        let d = crate::data::script::dataset_arg(&data, "diversity")?;
        let kinds: Vec<Kind> = match options.get("kinds") {
            Some(v) => strings(v, "kinds")?.iter().map(|s| s.parse().or_else(|e: String| err(format!("diversity: {e}")))).collect::<ScriptResult<_>>()?,
            None => m.model.kinds().iter().map(|k| k.kind).collect(),
        };
        if !m.closed.is_empty() {
            return err("diversity: run it on the unmasked model");
        }
        let mut progress = |done: usize, total: usize| crate::run::progress("diversity", done, total);
        let r = super::super::diversity::diversity(&m.model, &d, &kinds, o.usize("batch_tokens")?.unwrap_or(crate::model::batch::DEFAULT_BATCH_TOKENS), &crate::run::interrupted, &mut progress)
            .or_else(|e| err(format!("diversity: {e}")))?;
        Ok(DiversityObj(Rc::new(r)))
    }

    /// `diversity` over every attention kind.
    ///
    /// ```rhai
    /// let d = load_model("minilm").diversity(corpus(asset("pud_en.txt")).take(5));
    /// assert(d.matrix("output", "enc", 5)[0][0] < -0.999);
    /// ```
    #[rhai_fn(name = "diversity", return_raw, pure)]
    pub fn diversity(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<DiversityObj> {
        diversity_opts(m, data, Map::new())
    }

    /// The off-diagonal means of every metric, one row per kind and layer.
    ///
    /// ```rhai
    /// let d = load_model("enpt").diversity(corpus(asset("pud_en.txt")).take(3), #{kinds: ["cross"]});
    /// assert(d.summary()[0].layer == "cross.0");
    /// ```
    #[rhai_fn(name = "summary", pure)]
    pub fn diversity_summary(d: &mut DiversityObj) -> Table {
        d.summary()
    }

    /// One H x H matrix: metric "query", "context" or "output" ("intra": one row of H values).
    ///
    /// ```rhai
    /// let d = load_model("enpt").diversity(corpus(asset("pud_en.txt")).take(3), #{kinds: ["enc"]});
    /// assert(d.matrix("intra", "enc", 2)[0].len() == 8);
    /// ```
    #[rhai_fn(name = "matrix", return_raw, pure)]
    pub fn diversity_matrix(d: &mut DiversityObj, metric: &str, kind: &str, layer: i64) -> ScriptResult<Array> {
        Ok(matrix(&d.matrix(metric, kind, layer)?).cast::<Array>())
    }

    /// A heatmap of one H x H matrix.
    ///
    /// ```rhai
    /// let d = load_model("enpt").diversity(corpus(asset("pud_en.txt")).take(3), #{kinds: ["enc"]});
    /// assert(d.heatmap("output", "enc", 5).to_svg().contains("h7"));
    /// ```
    #[rhai_fn(name = "heatmap", return_raw, pure)]
    pub fn diversity_heatmap(d: &mut DiversityObj, metric: &str, kind: &str, layer: i64) -> ScriptResult<Plot> {
        let m = d.matrix(metric, kind, layer)?;
        let labels: Vec<String> = (0..m[0].len()).map(|h| format!("h{h}")).collect();
        let rows = if m.len() == 1 { vec![format!("{kind}.{layer}")] } else { labels.clone() };
        Plot::new(PlotKind::Heatmap { values: m, row_labels: rows, col_labels: labels, show_values: true, vmin: None, vmax: None }, format!("{metric} diversity, {kind}.{layer}: {} on {}", d.0.model, d.0.dataset))
            .or_else(|e| err(e.to_string()))
    }

    /// Writes every matrix as JSON, atomically.
    ///
    /// ```rhai
    /// let d = load_model("enpt").diversity(corpus(asset("pud_en.txt")).take(2), #{kinds: ["cross"]});
    /// let p = temp_path("d.json");
    /// d.to_json(p);
    /// assert(read_text(p).contains("\"output\""));
    /// ```
    #[rhai_fn(name = "to_json", return_raw, pure)]
    pub fn diversity_to_json(d: &mut DiversityObj, path: &str) -> ScriptResult<()> {
        let kinds: serde_json::Map<String, serde_json::Value> = d
            .0
            .kinds
            .iter()
            .map(|(k, layers)| {
                (k.to_string(), serde_json::json!(layers.iter().map(|l| serde_json::json!({"query": l.query, "context": l.context, "output": l.output, "intra": l.intra, "tokens": l.tokens})).collect::<Vec<_>>()))
            })
            .collect();
        let v = serde_json::json!({"model": d.0.model, "dataset": d.0.dataset, "kinds": kinds});
        write_atomic(std::path::Path::new(path), serde_json::to_string_pretty(&v).unwrap_or_default().as_bytes()).or_else(|e| err(format!("to_json: cannot write '{path}': {e}")))
    }

    /// The options and counts behind a grid (metric, targets, base value, thresholds...).
    ///
    /// ```rhai
    /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(2));
    /// assert(g.options.exclude_keys == "eos");
    /// ```
    #[rhai_fn(get = "options", pure)]
    pub fn grid_options(g: &mut Grid) -> Map {
        g.options.iter().map(|(k, v)| (k.as_str().into(), Dynamic::from(v.clone()))).collect()
    }

    /// The analyses of Voita et al. (2019) in one streaming pass over a dataset, for every
    /// attention kind of the model. Options (defaults in docs/methods.md, all echoed in the result):
    /// `stats` (any of "confidence", "positional", "rare", "syntactic"; syntactic needs a
    /// treebank), `kinds`, `batch_tokens` (1024), `exclude_keys` ("eos" | "special" | "none";
    /// "special" also keeps BOS/CLS sinks out of a head's argmax),
    /// `positional_threshold` (0.9), `rare_top_n` (500), `rare_threshold` (0.5), `freq` (a
    /// text file; default the Brown corpus) or `freq_counts` (token<TAB>count), `relations`
    /// (["nsubj", "dobj", "amod", "advmod"]), `subtypes` (false), `margin` (0.10),
    /// `treebank` (trees for a corpus dataset, matched sentence by sentence).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let a = m.analyze(treebank(asset("pud_en.conllu")).take(20), #{stats: ["confidence", "positional", "syntactic"]});
    /// assert(a.sentences == 20);
    /// assert(a.confidence["enc"].len() == 6 && a.confidence["cross"][1].len() == 8);
    /// ```
    #[rhai_fn(name = "analyze", return_raw, pure)]
    pub fn analyze_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<AnalysisObj> {
        run(m, data, options)
    }

    /// `analyze` with the default statistics for the dataset.
    ///
    /// ```rhai
    /// let a = load_model("minilm").analyze(corpus(asset("pud_en.txt")).take(10));
    /// assert(a.rare["enc"][0].len() == 12);
    /// ```
    #[rhai_fn(name = "analyze", return_raw, pure)]
    pub fn analyze_plain(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<AnalysisObj> {
        run(m, data, Map::new())
    }

    /// Head confidence alone: per kind, a layers x heads grid of the mean maximum attention
    /// weight (EOS/SEP keys excluded) over real query tokens.
    ///
    /// ```rhai
    /// let c = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(10));
    /// assert(c["enc"][2][5] > 0.0 && c["enc"][2][5] <= 1.0);
    /// ```
    #[rhai_fn(name = "confidence", return_raw, pure)]
    pub fn confidence_of(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Grid> {
        let mut o = Map::new();
        o.insert("stats".into(), Dynamic::from(vec![Dynamic::from("confidence")]));
        run(m, data, o)?.grid("confidence", |k| k.confidence.clone())
    }

    /// LRP head relevance of the self-attention stack (docs/methods.md#lrp-head-relevance): per layer,
    /// each head's share of the relevance reaching the layer's heads, averaged over
    /// predictions (each layer's row sums to 1). Options: `rule` ("ab" | "zplus"), `seed`
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
    /// assert(abs(total - 1.0) < 1e-6 && parse_float(g.options.max_conservation_error) < 1e-3);
    /// ```
    #[rhai_fn(name = "lrp", return_raw, pure)]
    pub fn lrp_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Grid> {
        use super::super::lrp::{lrp, LrpOptions, Seed};
        let o = Opts::new(&options, "lrp", &["rule", "seed", "seeds", "batch_tokens"])?;
        let d = crate::data::script::dataset_arg(&data, "lrp")?;
        let net = &m.model.net;
        let default_seed = if net.output.is_some() { Seed::Logit } else { Seed::Norm };
        let per_prediction = match o.string("seeds")?.as_deref() {
            None | Some("each") => true,
            Some("summed") => false,
            Some(other) => return err(format!("lrp: unknown seeds '{other}' (expected \"each\" or \"summed\")")),
        };
        let opts = LrpOptions {
            rule: o.string("rule")?.map_or(Ok(super::super::lrp::Rule::Ab), |s| s.parse()).or_else(|e: String| err(format!("lrp: {e}")))?,
            seed: o.string("seed")?.map_or(Ok(default_seed), |s| s.parse()).or_else(|e: String| err(format!("lrp: {e}")))?,
            per_prediction,
            batch_tokens: o.usize("batch_tokens")?.unwrap_or(if per_prediction { 64 } else { 256 }),
        };
        let gates = m.gates()?;
        let mut progress = |done: usize, total: usize| crate::run::progress("lrp", done, total);
        let r = lrp(&m.model, &d, &opts, &gates, &crate::run::interrupted, &mut progress).or_else(|e| err(format!("lrp: {e}")))?;
        Ok(Grid {
            stat: format!("lrp ({})", r.options.rule),
            model: m.model.name(),
            dataset: d.name.clone(),
            kinds: r.kinds.clone(),
            options: vec![
                ("rule".into(), r.options.rule.to_string()),
                ("seed".into(), r.options.seed.to_string()),
                ("seeds".into(), if r.options.per_prediction { "each" } else { "summed" }.into()),
                ("batch_tokens".into(), r.options.batch_tokens.to_string()),
                ("predictions".into(), r.predictions.to_string()),
                ("max_conservation_error".into(), format!("{:e}", r.max_conservation_error)),
            ],
        })
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

    /// Confidence grid of an analysis.
    ///
    /// ```rhai
    /// let a = load_model("minilm").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["confidence"]});
    /// assert(a.confidence.kinds == ["enc"]);
    /// ```
    #[rhai_fn(get = "confidence", return_raw, pure)]
    pub fn get_confidence(a: &mut AnalysisObj) -> ScriptResult<Grid> {
        a.grid("confidence", |k| k.confidence.clone())
    }

    /// Positional grid: the fraction of queries at each head's most frequent offset.
    ///
    /// ```rhai
    /// // With BOS/CLS keys excluded too, a sink head's confidence drops.
    /// let m = load_model("minilm");
    /// let d = corpus(asset("pud_en.txt")).take(5);
    /// let all = m.analyze(d, #{stats: ["confidence"]}).confidence["enc"];
    /// let no_special = m.analyze(d, #{stats: ["confidence"], exclude_keys: "special"}).confidence["enc"];
    /// assert(no_special[5][0] <= all[5][0]);
    /// ```
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["positional"], kinds: ["enc"]});
    /// assert(a.positional["enc"][0][0] > 0.0);
    /// ```
    #[rhai_fn(get = "positional", return_raw, pure)]
    pub fn get_positional(a: &mut AnalysisObj) -> ScriptResult<Grid> {
        a.grid("positional fraction", |k| k.positional.as_ref().map(|p| p.iter().map(|r| r.iter().map(|x| x.fraction).collect()).collect()))
    }

    /// Each head's most frequent offset `argmax(t) - t`.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["positional"], kinds: ["enc"]});
    /// let d = a.offsets["enc"][0][0];
    /// assert(d >= -127.0 && d <= 127.0);
    /// ```
    #[rhai_fn(get = "offsets", return_raw, pure)]
    pub fn get_offsets(a: &mut AnalysisObj) -> ScriptResult<Grid> {
        a.grid("most frequent offset", |k| k.positional.as_ref().map(|p| p.iter().map(|r| r.iter().map(|x| x.offset as f64).collect()).collect()))
    }

    /// Rare-word grid: the fraction of queries whose argmax is the sentence's rarest token.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["rare"]});
    /// assert(a.rare["cross"][0][0] >= 0.0);
    /// ```
    #[rhai_fn(get = "rare", return_raw, pure)]
    pub fn get_rare(a: &mut AnalysisObj) -> ScriptResult<Grid> {
        a.grid("rare-word score", |k| k.rare.as_ref().map(|r| r.score.clone()))
    }

    /// Syntactic accuracy grid of one relation and direction ("v->s", or "g->d" / "d->g").
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(treebank(asset("pud_en.conllu")).take(20), #{stats: ["syntactic"], kinds: ["enc"]});
    /// let g = a.syntactic("nsubj", "v->s");
    /// assert(g["enc"].len() == 6);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn syntactic(a: &mut AnalysisObj, relation: &str, direction: &str) -> ScriptResult<Grid> {
        let k = a.0.kinds.iter().find(|k| k.syntactic.is_some());
        let Some(k) = k else { return err("syntactic: this analysis has no syntactic statistic") };
        let rels = k.syntactic.as_deref().unwrap_or_default();
        let Some(rd) = rels.iter().find(|r| r.relation == relation && (r.label == direction || r.direction == direction)) else {
            let have: Vec<String> = rels.iter().map(|r| format!("{} {}", r.relation, r.label)).collect();
            return err(format!("syntactic: no '{relation}' '{direction}' (have: {})", have.join(", ")));
        };
        Ok(Grid {
            stat: format!("syntactic accuracy {relation} {} (baseline {:.3})", rd.label, rd.baseline),
            model: a.0.model.clone(),
            dataset: a.0.dataset.clone(),
            kinds: vec![(k.kind, rd.accuracy.clone())],
            options: a.0.options.clone(),
        })
    }

    /// Table 1 of the paper: per relation and direction the best head, its accuracy, the
    /// most-frequent-offset baseline and whether it clears the +10 point rule.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(treebank(asset("pud_en.conllu")).take(20), #{stats: ["syntactic"], kinds: ["enc"]});
    /// assert(a.syntactic_table().len() == 8);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn syntactic_table(a: &mut AnalysisObj) -> ScriptResult<Table> {
        a.0.syntactic_table().ok_or_else(|| err::<()>("syntactic_table: this analysis has no syntactic statistic").unwrap_err())
    }

    /// Heads with a function (the paper's Figure 1c): positional +-d, syntactic relation and
    /// direction, rare; with their confidence.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(30), #{kinds: ["enc"]});
    /// let f = a.functions();
    /// assert(f.columns == ["head", "function", "confidence"]);
    /// ```
    #[rhai_fn(pure)]
    pub fn functions(a: &mut AnalysisObj) -> Table {
        a.0.functions_table()
    }

    /// The functions of every head as an array of maps `#{head, functions}`.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(10), #{kinds: ["enc"]});
    /// assert(a.function_list.len() == 48);
    /// ```
    #[rhai_fn(get = "function_list", pure)]
    pub fn function_list(a: &mut AnalysisObj) -> Array {
        a.0.functions()
            .into_iter()
            .map(|(id, f)| {
                let mut m = Map::new();
                m.insert("head".into(), Dynamic::from(id.to_string()));
                m.insert("functions".into(), Dynamic::from(f.iter().map(|x| Dynamic::from(x.to_string())).collect::<Array>()));
                Dynamic::from(m)
            })
            .collect()
    }

    /// Per kind, a map of statistic -> layers x heads matrix: `a["enc"].confidence[2][5]`.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["confidence"]});
    /// assert(a["enc"].confidence[2][5] == a.confidence["enc"][2][5]);
    /// ```
    #[rhai_fn(index_get, return_raw, pure)]
    pub fn by_kind(a: &mut AnalysisObj, kind: &str) -> ScriptResult<Map> {
        let k: Kind = kind.parse().or_else(|e: String| err(e))?;
        let Some(r) = a.0.kind(k) else { return err(format!("this analysis has no '{kind}'")) };
        let mut m = Map::new();
        if let Some(c) = &r.confidence {
            m.insert("confidence".into(), matrix(c));
        }
        if let Some(p) = &r.positional {
            m.insert("positional".into(), matrix(&p.iter().map(|r| r.iter().map(|x| x.fraction).collect::<Vec<_>>()).collect::<Vec<_>>()));
            m.insert("offsets".into(), matrix(&p.iter().map(|r| r.iter().map(|x| x.offset as f64).collect::<Vec<_>>()).collect::<Vec<_>>()));
        }
        if let Some(x) = &r.rare {
            m.insert("rare".into(), matrix(&x.score));
            m.insert("rare_two".into(), matrix(&x.two));
        }
        m.insert("queries".into(), Dynamic::from(r.queries as i64));
        Ok(m)
    }

    /// Options and counts: `model`, `dataset`, `sentences`, `tokens`, `seconds` and every option.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(3), #{stats: ["confidence"]});
    /// assert(a.meta.sentences == 3 && a.meta.exclude_keys == "eos");
    /// ```
    #[rhai_fn(get = "meta", pure)]
    pub fn meta(a: &mut AnalysisObj) -> Map {
        let mut m = Map::new();
        m.insert("model".into(), Dynamic::from(a.0.model.clone()));
        m.insert("dataset".into(), Dynamic::from(a.0.dataset.clone()));
        m.insert("sentences".into(), Dynamic::from(a.0.sentences as i64));
        m.insert("tokens".into(), Dynamic::from(a.0.tokens as i64));
        m.insert("seconds".into(), Dynamic::from(a.0.seconds));
        for (k, v) in &a.0.options {
            m.insert(k.as_str().into(), Dynamic::from(v.clone()));
        }
        m
    }

    /// Number of sentences analysed.
    ///
    /// ```rhai
    /// assert(load_model("minilm").analyze(corpus(asset("pud_en.txt")).take(4), #{stats: ["confidence"]}).sentences == 4);
    /// ```
    #[rhai_fn(get = "sentences", pure)]
    pub fn sentences(a: &mut AnalysisObj) -> i64 {
        a.0.sentences as i64
    }

    /// Writes the whole result (options, counts, every grid, head functions) as JSON, atomically.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(3), #{stats: ["confidence"]});
    /// let p = temp_path("a.json");
    /// a.to_json(p);
    /// assert(read_text(p).contains("\"confidence\""));
    /// ```
    #[rhai_fn(name = "to_json", return_raw, pure)]
    pub fn analysis_to_json(a: &mut AnalysisObj, path: &str) -> ScriptResult<()> {
        let s = serde_json::to_string_pretty(&a.0.to_json()).unwrap_or_default();
        write_atomic(std::path::Path::new(path), s.as_bytes()).or_else(|e| err(format!("to_json: cannot write '{path}': {e}")))
    }

    /// A grid's matrix for one kind: `g["enc"][layer][head]`.
    ///
    /// ```rhai
    /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
    /// assert(g["cross"].len() == 2);
    /// ```
    #[rhai_fn(index_get, return_raw, pure)]
    pub fn grid_kind(g: &mut Grid, kind: &str) -> ScriptResult<Array> {
        let k: Kind = kind.parse().or_else(|e: String| err(e))?;
        match g.kinds.iter().find(|(x, _)| *x == k) {
            Some((_, m)) => Ok(matrix(m).cast::<Array>()),
            None => err(format!("this grid has no '{kind}' (it has: {})", g.kinds.iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>().join(", "))),
        }
    }

    /// The kinds in a grid.
    ///
    /// ```rhai
    /// assert(load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(2)).kinds == ["enc", "cross"]);
    /// ```
    #[rhai_fn(get = "kinds", pure)]
    pub fn grid_kinds(g: &mut Grid) -> Array {
        g.kinds.iter().map(|(k, _)| Dynamic::from(k.to_string())).collect()
    }

    /// The grid as a table (one row per kind and layer, one column per head).
    ///
    /// ```rhai
    /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
    /// assert(g.table().len() == 8);
    /// ```
    #[rhai_fn(pure)]
    pub fn table(g: &mut Grid) -> Table {
        g.table()
    }

    /// A heatmap of the first kind (layers x heads).
    ///
    /// ```rhai
    /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
    /// assert(g.heatmap().to_svg().contains("enc.5"));
    /// ```
    #[rhai_fn(name = "heatmap", return_raw, pure)]
    pub fn grid_heatmap(g: &mut Grid) -> ScriptResult<Plot> {
        let k = g.kinds.first().map(|(k, _)| *k).unwrap_or(Kind::Enc);
        g.heatmap(k)
    }

    /// A heatmap of one kind.
    ///
    /// ```rhai
    /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
    /// assert(g.heatmap("cross").to_svg().contains("cross.1"));
    /// ```
    #[rhai_fn(name = "heatmap", return_raw, pure)]
    pub fn grid_heatmap_kind(g: &mut Grid, kind: &str) -> ScriptResult<Plot> {
        let k: Kind = kind.parse().or_else(|e: String| err(e))?;
        g.heatmap(k)
    }

    /// The `k` highest heads over all kinds, as a table (head, value).
    ///
    /// ```rhai
    /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
    /// let t = g.top(5);
    /// assert(t.len() == 5 && t[0].value >= t[4].value);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn top(g: &mut Grid, k: i64) -> ScriptResult<Table> {
        if k < 1 {
            return err(format!("top: k must be >= 1, got {k}"));
        }
        let mut all: Vec<(HeadId, f64)> = Vec::new();
        for (kind, m) in &g.kinds {
            for (l, row) in m.iter().enumerate() {
                // NaN: a head removed by prune_heads, which has no value to rank.
                for (h, &v) in row.iter().enumerate().filter(|(_, v)| !v.is_nan()) {
                    all.push((HeadId { kind: *kind, layer_idx: l, head: h }, v));
                }
            }
        }
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut t = Table::new(vec!["head".into(), "value".into()]);
        t.title = Some(format!("top {k}: {}", g.stat));
        for (id, v) in all.into_iter().take(k as usize) {
            let _ = t.push_row(vec![Cell::Text(id.to_string()), Cell::Float(v)]);
        }
        Ok(t)
    }

    /// Writes the grid as CSV rows `kind,layer,head,value`, atomically.
    ///
    /// ```rhai
    /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
    /// let p = temp_path("c.csv");
    /// g.to_csv(p);
    /// assert(read_lines(p).len() == 1 + 48 + 16);
    /// ```
    #[rhai_fn(name = "to_csv", return_raw, pure)]
    pub fn grid_to_csv(g: &mut Grid, path: &str) -> ScriptResult<()> {
        let mut s = String::from("kind,layer,head,value\n");
        for (k, m) in &g.kinds {
            for (l, row) in m.iter().enumerate() {
                for (h, v) in row.iter().enumerate() {
                    s += &format!("{k},{l},{h},{v}\n");
                }
            }
        }
        write_atomic(std::path::Path::new(path), s.as_bytes()).or_else(|e| err(format!("to_csv: cannot write '{path}': {e}")))
    }

    /// Writes the grid with its options as JSON, atomically.
    ///
    /// ```rhai
    /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
    /// let p = temp_path("c.json");
    /// g.to_json(p);
    /// assert(read_text(p).contains("\"exclude_keys\""));
    /// ```
    #[rhai_fn(name = "to_json", return_raw, pure)]
    pub fn grid_to_json(g: &mut Grid, path: &str) -> ScriptResult<()> {
        let s = serde_json::to_string_pretty(&g.to_json()).unwrap_or_default();
        write_atomic(std::path::Path::new(path), s.as_bytes()).or_else(|e| err(format!("to_json: cannot write '{path}': {e}")))
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn grid_to_string(g: &mut Grid) -> String {
        g.table().to_text()
    }
    #[rhai_fn(name = "to_string", pure)]
    pub fn analysis_to_string(a: &mut AnalysisObj) -> String {
        a.render().text
    }
    #[rhai_fn(name = "to_debug", pure)]
    pub fn analysis_to_debug(a: &mut AnalysisObj) -> String {
        a.0.summary()
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<DiversityObj>("Diversity");
    engine.register_type_with_name::<Grid>("Grid");
    engine.register_type_with_name::<AnalysisObj>("Analysis");
    engine.register_global_module(exported_module!(api).into());
}

pub fn render(v: &Dynamic) -> Option<Output> {
    if let Some(d) = v.clone().try_cast::<DiversityObj>() {
        return Some(d.render());
    }
    if let Some(g) = v.clone().try_cast::<Grid>() {
        return Some(g.render());
    }
    v.clone().try_cast::<AnalysisObj>().map(|a| a.render())
}
