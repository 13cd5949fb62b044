//! headscope as a Rust library: the same models, analyses and results that scripts use, for
//! Rust programs and for [evcxr](https://github.com/evcxr/evcxr) notebooks.
//!
//! Options are the typed option structs of the core, the ones the script functions build
//! from their option maps: [`LoadOptions`], [`AnalyzeOptions`], [`SweepOptions`],
//! [`LrpOptions`] and [`PruneOptions`], with enums for choices ([`Stat`], [`Metric`],
//! [`RuleSet`], ...). Their defaults are read from the script function's option list (what
//! `:help analyze` and `docs/methods.md` show), so `LrpOptions::default()` is what
//! `m.lrp(data)` runs with in a script. Where a default depends on the model or the data, a
//! method gives the options for them ([`Model::analyze_options`], [`Model::prune_options`]) or
//! a `None` field leaves it to the run (LRP's seed, the sweep's metric and kinds). Scripts and
//! these methods call the same typed functions; the library runs on the whole dataset
//! (shards are a matter of scripts and `--shard`). Results are the script types themselves
//! ([`Grid`], [`Analysis`], [`PruneResult`], [`Table`], [`Plot`]), and each has an
//! `evcxr_display` method, so a notebook cell that ends with one shows it as HTML or an
//! image.
//!
//! ```
//! use headscope::api::{corpus, AnalyzeOptions, Kind, Model, Stat};
//!
//! let m = Model::load("minilm")?;
//! let data = corpus("assets/pud_en.txt")?.take(20);
//! let opts = AnalyzeOptions { stats: vec![Stat::Confidence, Stat::Positional], ..m.analyze_options(&data) };
//! let a = m.analyze(&data, &opts)?;
//! let conf = a.stat("confidence")?;
//! println!("{}", conf.table().to_text());
//! let top = conf.top_heads(3); // the names go straight back into with_mask
//! let masked = m.with_mask(&top.iter().map(String::as_str).collect::<Vec<_>>())?;
//! assert_eq!(masked.0.closed.len(), 3);
//! let png = conf.heatmap(Kind::Enc)?.to_png()?;
//! assert_eq!(&png[..4], b"\x89PNG");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::model::view::View;
use std::path::Path;

pub use crate::analysis::ablation::{Ablation, Metric, SweepOptions};
pub use crate::analysis::lrp::{LrpOptions, RuleSet, Seed};
pub use crate::analysis::options::{ExcludeKeys, FreqSource, Options as AnalyzeOptions, Stat};
pub use crate::analysis::script::AnalysisObj as Analysis;
pub use crate::data::Dataset;
pub use crate::grid::Grid;
pub use crate::model::script::{AttentionMatrix, Head};
pub use crate::model::{HeadId, Kind, LoadOptions};
pub use crate::plot::Plot;
pub use crate::prune::script::PruneResult;
pub use crate::prune::{Distill, EvalGates, Init, PenaltyScale, PruneOptions};
pub use crate::table::Table;
/// The device and precision of [`LoadOptions`] (libtorch's).
pub use tch::{Device, Kind as DType};

/// An error of the library API: one line naming the function and the argument, option or
/// file at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct Error(pub String);

pub type Result<T> = std::result::Result<T, Error>;

/// Runs an entry of the API so that it returns an error, never panics: a panic that still
/// slips through a check (a defect; the fuzzer looks for them) becomes one line naming the
/// function, as in scripts.
fn guard<T>(func: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    crate::engine::guarded(f).unwrap_or_else(|panic| Err(Error(format!("{func}: internal error: {panic}"))))
}

/// A corpus: one sentence per line of a text file.
///
/// ```
/// let d = headscope::api::corpus("assets/pud_en.txt")?;
/// assert_eq!(d.len(), 1000);
/// assert_eq!(d.take(3).len(), 3);
/// # Ok::<(), headscope::api::Error>(())
/// ```
pub fn corpus(path: impl AsRef<Path>) -> Result<Dataset> {
    guard("corpus", || Dataset::corpus(path.as_ref()).map_err(|e| Error(e.to_string())))
}

/// A treebank: sentences with their dependency trees, from a CoNLL-U file.
pub fn treebank(path: impl AsRef<Path>) -> Result<Dataset> {
    guard("treebank", || Dataset::treebank(path.as_ref()).map_err(|e| Error(e.to_string())))
}

/// A model with the heads this view masks (none after `load`); cheap to clone, the
/// weights are shared. It wraps the core view (`model::view::View`) every analysis reads.
#[derive(Clone)]
pub struct Model(pub View);

impl Model {
    /// Loads a model from a directory or a named asset (`"minilm"`, `"enpt"`, `"smollm2"`)
    /// with `LoadOptions::default()`: CUDA when available, else the CPU, in f32.
    ///
    /// ```
    /// use headscope::api::{Device, DType, Kind, LoadOptions, Model};
    /// let m = Model::load("minilm")?;
    /// assert_eq!(m.kinds(), vec![Kind::Enc]);
    /// let cpu = Model::load_with("minilm", &LoadOptions { device: Device::Cpu, ..Default::default() })?;
    /// assert_eq!(cpu.0.model.device(), Device::Cpu);
    /// assert!(Model::load("no-such-model").is_err());
    /// let half = Model::load_with("minilm", &LoadOptions { device: Device::Cpu, dtype: DType::Half, allow_unknown_config: false });
    /// assert!(half.err().unwrap().0.starts_with("load_model: dtype 'f16' is only supported on CUDA"));
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn load(name_or_dir: &str) -> Result<Model> {
        guard("load", || Model::load_with(name_or_dir, &LoadOptions::default()))
    }

    /// Loads on a chosen device and precision (`load_model(path, #{device, dtype})`).
    pub fn load_with(name_or_dir: &str, opts: &LoadOptions) -> Result<Model> {
        guard("load_with", || crate::model::script::load(name_or_dir, *opts).map(Model).map_err(Error))
    }

    /// The attention kinds of the model, in its order.
    pub fn kinds(&self) -> Vec<Kind> {
        self.0.model.kinds().iter().map(|k| k.kind).collect()
    }

    /// One head by its printed name (`"enc.2.5"`), checked against the model.
    ///
    /// ```
    /// let m = headscope::api::Model::load("minilm")?;
    /// assert_eq!(m.head("enc.2.5")?.layer_idx, 2);
    /// assert!(m.head("enc.9.0").unwrap_err().0.contains("layer 9 out of range"));
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn head(&self, name: &str) -> Result<HeadId> {
        guard("head", || self.0.head(name, "head: ").map_err(|e| Error(e.to_string())))
    }

    /// A view with these heads masked (printed names); the weights are shared.
    pub fn with_mask(&self, heads: &[&str]) -> Result<Model> {
        guard("with_mask", || {
            let ids = heads
                .iter()
                .map(|h| self.0.head(h, "with_mask: "))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error(e.to_string()))?;
            Ok(Model(self.0.closing(&ids)))
        })
    }

    /// The options `m.analyze(data)` runs with in a script: the statistics for this dataset
    /// (syntactic too on a treebank), every kind of the model, the rest from `analyze`'s
    /// option list. Change fields with struct update syntax.
    pub fn analyze_options(&self, data: &Dataset) -> AnalyzeOptions {
        crate::analysis::script::default_options(&self.0, data)
    }

    /// Every analysis of docs/methods.md in one pass (confidence, positional, rare-word,
    /// syntactic on a treebank), as `m.analyze(data, #{...})` in scripts. A corpus takes the
    /// trees of a matching treebank with `data.with_trees(&tb, "analyze")`.
    ///
    /// ```
    /// use headscope::api::{corpus, AnalyzeOptions, Model, Stat};
    /// let m = Model::load("minilm")?;
    /// let d = corpus("assets/pud_en.txt")?.take(4);
    /// let a = m.analyze(&d, &AnalyzeOptions { stats: vec![Stat::Confidence], ..m.analyze_options(&d) })?;
    /// let g = a.stat("confidence")?;
    /// assert_eq!(g.kinds[0].1.len(), 6);
    /// let bad = m.analyze(&d, &AnalyzeOptions { positional_threshold: 1.5, ..m.analyze_options(&d) });
    /// assert_eq!(bad.err().unwrap().0, "analyze: option 'positional_threshold' must be between 0 and 1, got 1.5");
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn analyze(&self, data: &Dataset, opts: &AnalyzeOptions) -> Result<Analysis> {
        guard("analyze", || crate::analysis::script::analyze(&self.0, data, opts).map_err(Error))
    }

    /// The confidence grid alone, with `analyze`'s other defaults.
    pub fn confidence(&self, data: &Dataset) -> Result<Grid> {
        guard("confidence", || {
            crate::analysis::script::confidence(&self.0, data, &self.analyze_options(data)).map_err(Error)
        })
    }

    /// Every head masked alone (docs/methods.md#masking-and-ablation), as
    /// `m.ablation_sweep(data, #{...})`; `SweepOptions::default()` is a script's defaults.
    ///
    /// ```
    /// use headscope::api::{corpus, Metric, Model, SweepOptions};
    /// let m = Model::load("minilm")?;
    /// let g = m.ablation_sweep(&corpus("assets/pud_en.txt")?.take(2), &SweepOptions { metric: Some(Metric::Cosine), ..Default::default() })?;
    /// assert_eq!(g.kinds[0].1.len(), 6); // layers
    /// assert!(g.options.iter().any(|(k, v)| k == "base" && v.is_number()));
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn ablation_sweep(&self, data: &Dataset, opts: &SweepOptions) -> Result<Grid> {
        guard("ablation_sweep", || crate::analysis::script::ablation_sweep(&self.0, data, opts).map_err(Error))
    }

    /// LRP head relevance (docs/methods.md#lrp-head-relevance), as `m.lrp(data, #{...})`;
    /// `LrpOptions::default()` is a script's defaults (the seed left to the model),
    /// `LrpOptions::summed()` those of `seeds: "summed"`.
    ///
    /// ```
    /// use headscope::api::{corpus, LrpOptions, Model};
    /// let m = Model::load("minilm")?;
    /// let g = m.lrp(&corpus("assets/pud_en.txt")?.take(2), &LrpOptions::summed())?;
    /// let seed = g.options.iter().find(|(k, _)| k == "seed").map(|(_, v)| v.clone());
    /// assert_eq!(seed, Some(serde_json::json!("norm"))); // an encoder has no output head
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn lrp(&self, data: &Dataset, opts: &LrpOptions) -> Result<Grid> {
        guard("lrp", || crate::analysis::script::lrp(&self.0, data, opts).map_err(Error))
    }

    /// The options `m.prune(data)` runs with in a script: every kind of the model gated, the
    /// rest from `prune`'s option list.
    pub fn prune_options(&self) -> PruneOptions {
        crate::prune::script::default_options(&self.0)
    }

    /// Hard Concrete gates trained with an L0 penalty, as `m.prune(data, #{...})`.
    ///
    /// ```
    /// use headscope::api::{corpus, Model, PruneOptions};
    /// let m = Model::load("minilm")?;
    /// let r = m.prune(&corpus("assets/pud_en.txt")?.take(8), &PruneOptions { steps: 2, batch_tokens: 300, ..m.prune_options() })?;
    /// assert_eq!(r.run.state.curve.len(), 2);
    /// assert!(r.gates_table().to_text().contains("enc.5"));
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn prune(&self, data: &Dataset, opts: &PruneOptions) -> Result<PruneResult> {
        guard("prune", || crate::prune::script::prune(&self.0, data, opts).map_err(Error))
    }

    /// One head's attention on a sentence, as a heatmap-able matrix.
    pub fn attention(&self, head: &str, text: &str) -> Result<AttentionMatrix> {
        guard("attention", || {
            let id = self.0.head(head, "attention: ").map_err(|e| Error(e.to_string()))?;
            crate::model::script::attention_of(&self.0, id, text).map_err(Error)
        })
    }
}

impl Analysis {
    /// One statistic as a grid: `"confidence"`, `"positional"`, `"rare"`.
    pub fn stat(&self, stat: &str) -> Result<Grid> {
        guard("stat", || self.stat_grid(stat).map_err(Error))
    }
}

impl Grid {
    /// The `k` highest heads over all kinds, as a table (head, value).
    pub fn top_table(&self, k: usize) -> Result<Table> {
        guard("top_table", || self.end_table(i64::try_from(k).unwrap_or(i64::MAX), false, "top").map_err(Error))
    }

    /// The names of the `k` highest heads (`"enc.2.5"`), highest first; removed heads
    /// (NaN) are left out.
    pub fn top_heads(&self, k: usize) -> Vec<String> {
        self.ranked().into_iter().take(k).map(|(id, _)| id.to_string()).collect()
    }
}

impl PruneResult {
    /// The evaluation gates as a table.
    pub fn gates_table(&self) -> Table {
        self.table()
    }
}

evcxr_display!(Grid, Analysis, AttentionMatrix, PruneResult);

impl Model {
    /// Shows the model's description in an evcxr notebook.
    pub fn evcxr_display(&self) {
        print!("{}", self.evcxr_content());
    }
    /// What `evcxr_display` writes.
    pub fn evcxr_content(&self) -> String {
        crate::output::evcxr_content(&crate::output::Output::text(self.to_string()))
    }
}

impl std::fmt::Display for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.describe())
    }
}
