//! The `Diversity` type: `m.diversity(data, #{...})` (docs/methods.md#head-diversity).

use crate::grid::matrix;
use crate::model::script::ScriptModel;
use crate::model::view::Needs;
use crate::model::Kind;
use crate::output::{Output, Render};
use crate::plot::{Plot, PlotKind};
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt, opt_int, OptSpec, Opts, ScriptResult};

pub const DIVERSITY_OPTIONS: &[OptSpec] = &[
    opt("kinds", "every kind", "the attention kinds measured"),
    opt_int("batch_tokens", crate::model::batch::DEFAULT_BATCH_TOKENS as i64, "tokens per batch, padding included"),
    crate::model::script::TGT_LANG,
];
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Map};
use std::rc::Rc;

/// Head diversity of a model on a dataset.
#[derive(Clone)]
pub struct DiversityObj(pub Rc<crate::analysis::diversity::Diversity>);

const DIVERSITY_METRICS: [&str; 4] = ["query", "context", "output", "intra"];

impl DiversityObj {
    fn summary(&self) -> Table {
        use crate::analysis::diversity::off_diagonal_mean;
        let mut t = Table::new(
            [
                "layer",
                "query orthogonality",
                "context non-orthogonality",
                "output dissimilarity",
                "intra-head variance",
                "tokens",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        );
        t.title = Some(format!("Head diversity (off-diagonal means): {} on {}", self.0.model, self.0.dataset));
        for (k, layers) in &self.0.kinds {
            for (l, d) in layers.iter().enumerate() {
                let present: Vec<f64> = d.intra.iter().copied().filter(|v| !v.is_nan()).collect();
                let intra =
                    if present.is_empty() { f64::NAN } else { present.iter().sum::<f64>() / present.len() as f64 };
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

    fn layer(&self, func: &str, kind: &str, layer: i64) -> ScriptResult<&crate::analysis::diversity::LayerDiversity> {
        let k: Kind = kind.parse().or_else(|e: String| err(format!("{func}: {e}")))?;
        let Some((_, layers)) = self.0.kinds.iter().find(|(x, _)| *x == k) else {
            return err(format!("{func}: no '{kind}' in this result"));
        };
        if layer < 0 || layer as usize >= layers.len() {
            return err(format!("{func}: layer {layer} out of range: '{kind}' has layers 0..{}", layers.len() - 1));
        }
        Ok(&layers[layer as usize])
    }

    fn matrix(&self, func: &str, metric: &str, kind: &str, layer: i64) -> ScriptResult<Vec<Vec<f64>>> {
        let d = self.layer(func, kind, layer)?;
        Ok(match metric {
            "query" => d.query.clone(),
            "context" => d.context.clone(),
            "output" => d.output.clone(),
            "intra" => vec![d.intra.clone()],
            other => {
                return err(format!("{func}: unknown metric '{other}' (expected {})", DIVERSITY_METRICS.join(", ")))
            }
        })
    }
}

impl Render for DiversityObj {
    fn render(&self) -> Output {
        self.summary().render()
    }
}

#[export_module]
pub mod api {
    use super::*;

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
        let o = Opts::new(&options, "diversity", DIVERSITY_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let d = crate::data::script::dataset_arg(&data, "diversity")?;
        let kinds = crate::model::script::kinds_option(m, &o)?;
        m.require("diversity", Needs::NoClosed).script()?;
        let mut progress = |done: usize, total: usize| crate::run::progress("diversity", done, total);
        let gates = m.gates().script()?;
        let r = crate::analysis::diversity::diversity(
            &m.model,
            &d,
            &kinds,
            &gates,
            o.usize_or_default("batch_tokens")?,
            &crate::run::interrupted,
            &mut progress,
        )
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
        Ok(matrix(&d.matrix("matrix", metric, kind, layer)?).cast::<Array>())
    }

    /// A heatmap of one H x H matrix.
    ///
    /// ```rhai
    /// let d = load_model("enpt").diversity(corpus(asset("pud_en.txt")).take(3), #{kinds: ["enc"]});
    /// assert(d.heatmap("output", "enc", 5).to_svg().contains("h7"));
    /// ```
    #[rhai_fn(name = "heatmap", return_raw, pure)]
    pub fn diversity_heatmap(d: &mut DiversityObj, metric: &str, kind: &str, layer: i64) -> ScriptResult<Plot> {
        let m = d.matrix("heatmap", metric, kind, layer)?;
        let labels: Vec<String> = (0..m[0].len()).map(|h| format!("h{h}")).collect();
        let rows = if m.len() == 1 { vec![format!("{kind}.{layer}")] } else { labels.clone() };
        Plot::new(
            PlotKind::Heatmap {
                values: m,
                row_labels: rows,
                col_labels: labels,
                show_values: true,
                vmin: None,
                vmax: None,
            },
            format!("{metric} diversity, {kind}.{layer}: {} on {}", d.0.model, d.0.dataset),
        )
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
        crate::grid::write_json(path, &v, "to_json")
    }
}
