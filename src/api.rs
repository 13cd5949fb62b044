//! headscope as a Rust library: the same models, analyses and results that scripts use, for
//! Rust programs and for [evcxr](https://github.com/evcxr/evcxr) notebooks.
//!
//! Options are the option maps of the script functions, written as JSON
//! (`json!({"stats": ["confidence"]})`): one parser checks them for scripts and for Rust, and
//! `:help analyze` (or `docs/methods.md`) lists them with their defaults. Results are the
//! script types themselves ([`Grid`], [`Analysis`], [`PruneResult`], [`Table`], [`Plot`]),
//! and each has an `evcxr_display` method, so a notebook cell that ends with one shows it as
//! HTML or an image.
//!
//! ```
//! use headscope::api::{corpus, Kind, Model};
//! use serde_json::json;
//!
//! let m = Model::load("minilm")?;
//! let data = corpus("assets/pud_en.txt")?.take(20);
//! let a = m.analyze(&data, json!({"stats": ["confidence", "positional"]}))?;
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
use crate::script::convert::{json_value, ScriptResult};
use rhai::{Dynamic, Map};
use std::path::Path;

pub use crate::analysis::script::AnalysisObj as Analysis;
pub use crate::data::Dataset;
pub use crate::grid::Grid;
pub use crate::model::script::{AttentionMatrix, Head};
pub use crate::model::{HeadId, Kind};
pub use crate::plot::Plot;
pub use crate::prune::script::PruneResult;
pub use crate::table::Table;

/// An error of the library API: one line naming the argument, option or file at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct Error(pub String);

pub type Result<T> = std::result::Result<T, Error>;

fn script<T>(r: ScriptResult<T>) -> Result<T> {
    r.map_err(|e| match *e {
        rhai::EvalAltResult::ErrorRuntime(v, _) => Error(v.to_string()),
        other => Error(other.to_string()),
    })
}

/// JSON options as the option map the script functions take; `null` is no options.
fn options(v: serde_json::Value, func: &str) -> Result<Map> {
    match json_value(&v).try_cast::<Map>() {
        Some(m) => Ok(m),
        None if v.is_null() => Ok(Map::new()),
        None => Err(Error(format!("{func}: options must be a JSON object, got {v}"))),
    }
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
    Dataset::corpus(path.as_ref()).map_err(|e| Error(e.to_string()))
}

/// A treebank: sentences with their dependency trees, from a CoNLL-U file.
pub fn treebank(path: impl AsRef<Path>) -> Result<Dataset> {
    Dataset::treebank(path.as_ref()).map_err(|e| Error(e.to_string()))
}

/// A model with the heads this view masks (none after `load`); cheap to clone, the
/// weights are shared. It wraps the core view (`model::view::View`) every analysis reads.
#[derive(Clone)]
pub struct Model(pub View);

impl Model {
    /// Loads a model from a directory or a named asset (`"minilm"`, `"enpt"`, `"smollm2"`)
    /// on the default device in f32.
    ///
    /// ```
    /// let m = headscope::api::Model::load("minilm")?;
    /// assert_eq!(m.kinds(), vec![headscope::api::Kind::Enc]);
    /// assert!(headscope::api::Model::load("no-such-model").is_err());
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn load(name_or_dir: &str) -> Result<Model> {
        Model::load_with(name_or_dir, serde_json::Value::Null)
    }

    /// Loads with options (`{"device": "cpu", "dtype": "f64"}`).
    pub fn load_with(name_or_dir: &str, opts: serde_json::Value) -> Result<Model> {
        script(crate::model::script::api::load_model_opts(name_or_dir, options(opts, "load_model")?)).map(Model)
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
        self.0.head(name, "head: ").map_err(|e| Error(e.to_string()))
    }

    /// A view with these heads masked (printed names); the weights are shared.
    pub fn with_mask(&self, heads: &[&str]) -> Result<Model> {
        let ids = heads.iter().map(|h| self.0.head(h, "with_mask: ")).collect::<std::result::Result<Vec<_>, _>>().map_err(|e| Error(e.to_string()))?;
        Ok(Model(self.0.closing(&ids)))
    }

    /// Every analysis of docs/methods.md in one pass (confidence, positional, rare-word,
    /// syntactic on a treebank); options as `m.analyze(data, #{...})` in scripts.
    ///
    /// ```
    /// use headscope::api::{corpus, Model};
    /// let m = Model::load("minilm")?;
    /// let a = m.analyze(&corpus("assets/pud_en.txt")?.take(4), serde_json::json!({"stats": ["confidence"]}))?;
    /// let g = a.stat("confidence")?;
    /// assert_eq!(g.kinds[0].1.len(), 6);
    /// let bad = m.analyze(&corpus("assets/pud_en.txt")?, serde_json::json!({"stat": 1}));
/// assert!(bad.err().unwrap().0.contains("unknown option 'stat'"));
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn analyze(&self, data: &Dataset, opts: serde_json::Value) -> Result<Analysis> {
        script(crate::analysis::script::analyze_opts(&mut self.0.clone(), Dynamic::from(data.clone()), options(opts, "analyze")?))
    }

    /// The confidence grid alone.
    pub fn confidence(&self, data: &Dataset) -> Result<Grid> {
        script(crate::analysis::script::confidence_of(&mut self.0.clone(), Dynamic::from(data.clone())))
    }

    /// Every head masked alone (docs/methods.md#masking-and-ablation); options as
    /// `m.ablation_sweep(data, #{...})`.
    ///
    /// ```
    /// use headscope::api::{corpus, Model};
    /// let m = Model::load("minilm")?;
    /// let g = m.ablation_sweep(&corpus("assets/pud_en.txt")?.take(2), serde_json::json!({"metric": "cosine"}))?;
    /// assert_eq!(g.kinds[0].1.len(), 6); // layers
    /// assert!(g.options.iter().any(|(k, v)| k == "base" && v.is_number()));
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn ablation_sweep(&self, data: &Dataset, opts: serde_json::Value) -> Result<Grid> {
        script(crate::analysis::script::ablation_sweep_opts(&mut self.0.clone(), Dynamic::from(data.clone()), options(opts, "ablation_sweep")?))
    }

    /// LRP head relevance (docs/methods.md#lrp-head-relevance).
    pub fn lrp(&self, data: &Dataset, opts: serde_json::Value) -> Result<Grid> {
        script(crate::analysis::script::lrp_opts(&mut self.0.clone(), Dynamic::from(data.clone()), options(opts, "lrp")?))
    }

    /// Hard Concrete gates trained with an L0 penalty; options as `m.prune(data, #{...})`.
    ///
    /// ```
    /// use headscope::api::{corpus, Model};
    /// let m = Model::load("minilm")?;
    /// let r = m.prune(&corpus("assets/pud_en.txt")?.take(8), serde_json::json!({"steps": 2, "batch_tokens": 300}))?;
    /// assert_eq!(r.run.state.curve.len(), 2);
    /// assert!(r.gates_table().to_text().contains("enc.5"));
    /// # Ok::<(), headscope::api::Error>(())
    /// ```
    pub fn prune(&self, data: &Dataset, opts: serde_json::Value) -> Result<PruneResult> {
        script(crate::prune::script::api::prune_opts(&mut self.0.clone(), Dynamic::from(data.clone()), options(opts, "prune")?))
    }

    /// One head's attention on a sentence, as a heatmap-able matrix.
    pub fn attention(&self, head: &str, text: &str) -> Result<AttentionMatrix> {
        script(crate::model::script::api_attention(&mut self.0.clone(), Dynamic::from(head.to_string()), text))
    }
}

impl Analysis {
    /// One statistic as a grid: `"confidence"`, `"positional"`, `"rare"`.
    pub fn stat(&self, stat: &str) -> Result<Grid> {
        self.stat_grid(stat).map_err(Error)
    }
}

impl Grid {
    /// The `k` highest heads over all kinds, as a table (head, value).
    pub fn top_table(&self, k: usize) -> Result<Table> {
        script(crate::grid::script::api::top(&mut self.clone(), k as i64))
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

/// Shows a value in an evcxr notebook: `EVCXR_BEGIN_CONTENT` blocks for each representation
/// its output bundle has (text/plain always; text/html, image/png, image/svg+xml when it has
/// them). A cell ending in the value calls it.
macro_rules! evcxr {
    ($($t:ty),* $(,)?) => {$(
        impl $t {
            /// Shows the value in an evcxr notebook (HTML or an image, with a text fallback).
            pub fn evcxr_display(&self) {
                print!("{}", self.evcxr_content());
            }
            /// What `evcxr_display` writes: the value's output bundle in evcxr's markers.
            pub fn evcxr_content(&self) -> String {
                crate::output::evcxr_content(&crate::output::Render::render(self))
            }
        }
    )*};
}
evcxr!(Table, Plot, Grid, Analysis, AttentionMatrix, PruneResult);

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
