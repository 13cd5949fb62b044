//! `Grid`: one statistic per head, a layers x heads matrix per attention kind. Every per-head
//! result shares it (confidence, positional and rare-word scores, syntactic accuracy, LRP
//! relevance, ablation sweeps): one table, one heatmap, one CSV and one JSON writer.
//! Heads keep their original numbers; a head removed by `prune_heads` is NaN
//! (docs/methods.md#terms).

use crate::files::write_atomic;
use crate::model::{HeadId, Kind};
use crate::output::{Output, Render};
use crate::plot::{Plot, PlotKind};
use crate::script::convert::{err, ScriptResult};
use crate::table::{Cell, Table};
use rhai::{Array, Dynamic, Map};

/// One statistic over heads: per kind a layers x heads matrix.
#[derive(Clone)]
pub struct Grid {
    pub stat: String,
    pub model: String,
    pub dataset: String,
    pub kinds: crate::model::KindGrids,
    pub options: crate::output::Echo,
}

impl Grid {
    /// One row per kind and layer, one column per head.
    pub fn table(&self) -> Table {
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

    /// Every head with a value, highest first (ties by head); a head removed by
    /// `prune_heads` (NaN) has no value to rank.
    pub fn ranked(&self) -> Vec<(HeadId, f64)> {
        let mut all: Vec<(HeadId, f64)> = Vec::new();
        for (kind, m) in &self.kinds {
            for (l, row) in m.iter().enumerate() {
                all.extend(
                    row.iter()
                        .enumerate()
                        .filter(|(_, v)| !v.is_nan())
                        .map(|(h, &v)| (HeadId { kind: *kind, layer_idx: l, head: h }, v)),
                );
            }
        }
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all
    }

    /// The value of one head, or an error naming the head and the grid's shape.
    pub fn value(&self, id: HeadId) -> Result<f64, String> {
        let Some((_, m)) = self.kinds.iter().find(|(k, _)| *k == id.kind) else {
            return Err(format!(
                "this grid has no '{}' (it has: {})",
                id.kind,
                self.kinds.iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>().join(", ")
            ));
        };
        let row = m.get(id.layer_idx).ok_or_else(|| {
            format!(
                "{id}: layer {} out of range: '{}' has layers 0..{}",
                id.layer_idx,
                id.kind,
                m.len().saturating_sub(1)
            )
        })?;
        row.get(id.head).copied().ok_or_else(|| {
            format!(
                "{id}: head {} out of range: layer {} has heads 0..{}",
                id.head,
                id.layer_idx,
                row.len().saturating_sub(1)
            )
        })
    }

    /// The `k` heads at one end of the ranking as a table (head, value): the highest
    /// (`lowest` false) or the lowest, lowest first (`top`, `bottom`; the library API's
    /// `top_table`).
    pub fn end_table(&self, k: i64, lowest: bool, func: &str) -> Result<Table, String> {
        if k < 1 {
            return Err(format!("{func}: k must be >= 1, got {k}"));
        }
        let mut all = self.ranked();
        if lowest {
            all.reverse();
        }
        let mut t = Table::new(vec!["head".into(), "value".into()]);
        t.title = Some(format!("{func} {k}: {}", self.stat));
        for (id, v) in all.into_iter().take(k as usize) {
            let _ = t.push_row(vec![Cell::Text(id.to_string()), Cell::Float(v)]);
        }
        Ok(t)
    }

    /// A heatmap of one kind, coloured over the values' range.
    pub fn heatmap(&self, kind: Kind) -> Result<Plot, String> {
        self.heatmap_range(kind, None, None)
    }

    /// A heatmap of one kind, coloured over `[vmin, vmax]` where given.
    pub fn heatmap_range(&self, kind: Kind, vmin: Option<f64>, vmax: Option<f64>) -> Result<Plot, String> {
        let Some((_, m)) = self.kinds.iter().find(|(k, _)| *k == kind) else {
            let have: Vec<String> = self.kinds.iter().map(|(k, _)| k.to_string()).collect();
            return Err(format!("heatmap: no '{kind}' in this result (it has: {})", have.join(", ")));
        };
        let rows = (0..m.len()).map(|l| format!("{kind}.{l}")).collect();
        let cols = (0..m.first().map_or(0, |r| r.len())).map(|h| format!("h{h}")).collect();
        let mut p = Plot::new(
            PlotKind::Heatmap { values: m.clone(), row_labels: rows, col_labels: cols, show_values: true, vmin, vmax },
            format!("{} ({kind}): {} on {}", self.stat, self.model, self.dataset),
        )
        .map_err(|e| e.to_string())?;
        p.x_label = "head".into();
        p.y_label = "layer".into();
        Ok(p)
    }

    /// The provenance an exported grid carries (docs/methods.md#export): its statistic, model
    /// (with the asset it names, where it names one), dataset and options.
    pub fn provenance(&self) -> String {
        let mut m = serde_json::Map::new();
        m.insert("stat".into(), serde_json::json!(self.stat));
        m.insert("model".into(), serde_json::json!(self.model));
        let source = crate::assets::ASSETS.iter().find(|a| a.name == self.model).map(|a| a.what);
        m.insert("model_source".into(), serde_json::json!(source.unwrap_or(&self.model)));
        m.insert("dataset".into(), serde_json::json!(self.dataset));
        m.insert("options".into(), serde_json::Value::Object(self.options.iter().cloned().collect()));
        crate::export::provenance(m)
    }

    /// Long format, as TransformerLens users index heads: `kind`, `layer`, `head`, `value`
    /// (NaN where a head was removed or not swept).
    pub fn long_columns(&self) -> Vec<(String, crate::export::Column)> {
        use crate::export::Column;
        let (mut kind, mut layer, mut head, mut value) = (vec![], vec![], vec![], vec![]);
        for (k, m) in &self.kinds {
            for (l, row) in m.iter().enumerate() {
                for (h, &v) in row.iter().enumerate() {
                    kind.push(Some(k.to_string()));
                    layer.push(Some(l as i64));
                    head.push(Some(h as i64));
                    value.push(Some(v));
                }
            }
        }
        vec![
            ("kind".into(), Column::Texts(kind)),
            ("layer".into(), Column::Ints(layer)),
            ("head".into(), Column::Ints(head)),
            ("value".into(), Column::Floats(value)),
        ]
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "stat": self.stat, "model": self.model, "dataset": self.dataset,
            "options": self.options.iter().cloned().collect::<serde_json::Map<_, _>>(),
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

/// A matrix as a Rhai array of arrays.
pub fn matrix(m: &[Vec<f64>]) -> Dynamic {
    Dynamic::from(
        m.iter().map(|r| Dynamic::from(r.iter().map(|&v| Dynamic::from(v)).collect::<Array>())).collect::<Array>(),
    )
}

/// Per-kind matrices as a Rhai map `kind -> [[...]]`.
pub fn kind_map(values: crate::model::KindGrids) -> Map {
    values.into_iter().map(|(k, m)| (k.to_string().into(), matrix(&m))).collect()
}

/// The one JSON writer of results (beside the script layer's conversions, so tables use it too).
pub use crate::script::convert::write_json;

/// The one CSV writer of results: a header line, then one line per row, written atomically.
pub fn write_csv(path: &str, header: &str, rows: impl IntoIterator<Item = String>, func: &str) -> ScriptResult<()> {
    let mut s = format!("{header}\n");
    for r in rows {
        s += &r;
        s.push('\n');
    }
    write_atomic(std::path::Path::new(path), s.as_bytes())
        .or_else(|e| err(format!("{func}: cannot write '{path}': {e}")))
}

pub mod script {
    use super::*;
    use rhai::plugin::*;
    use rhai::Engine;

    #[export_module]
    pub mod api {
        use super::*;

        /// The options and counts behind a grid (metric, targets, base value, thresholds...), each
        /// keeping its type: numbers are numbers, lists are lists.
        ///
        /// ```rhai
        /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(2));
        /// assert(g.options.exclude_keys == "eos");
        /// ```
        #[rhai_fn(get = "options", pure)]
        pub fn grid_options(g: &mut Grid) -> Map {
            crate::script::convert::echo_map(&g.options)
        }

        /// A grid's matrix for one kind, `g["enc"][layer][head]`, or one head's value by its
        /// name, `g["enc.2.5"]`.
        ///
        /// ```rhai
        /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
        /// assert(g["cross"].len() == 2);
        /// assert(g["enc.2.5"] == g["enc"][2][5]);
        /// ```
        #[rhai_fn(index_get, return_raw, pure)]
        pub fn grid_kind(g: &mut Grid, key: &str) -> ScriptResult<Dynamic> {
            if key.contains('.') {
                let id: HeadId = key.parse().or_else(|e: String| err(e))?;
                return g.value(id).map(Dynamic::from).or_else(err);
            }
            let k: Kind = key.parse().or_else(|e: String| err(e))?;
            match g.kinds.iter().find(|(x, _)| *x == k) {
                Some((_, m)) => Ok(matrix(m)),
                None => err(format!(
                    "this grid has no '{key}' (it has: {})",
                    g.kinds.iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>().join(", ")
                )),
            }
        }

        /// One head's value: `g[m.head("enc.2.5")]`.
        ///
        /// ```rhai
        /// let m = load_model("enpt");
        /// let g = m.confidence(corpus(asset("pud_en.txt")).take(3));
        /// assert(g[m.head("cross.1.3")] == g["cross"][1][3]);
        /// ```
        #[rhai_fn(index_get, return_raw, pure)]
        pub fn grid_head(g: &mut Grid, head: crate::model::script::Head) -> ScriptResult<f64> {
            g.value(head.id).or_else(err)
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
            Ok(g.heatmap(k)?)
        }

        /// A heatmap of one kind.
        ///
        /// ```rhai
        /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
        /// assert(g.heatmap("cross").to_svg().contains("cross.1"));
        /// ```
        #[rhai_fn(name = "heatmap", return_raw, pure)]
        pub fn grid_heatmap_kind(g: &mut Grid, kind: &str) -> ScriptResult<Plot> {
            let k: Kind = kind.parse().or_else(|e: String| err(format!("heatmap: {e}")))?;
            Ok(g.heatmap(k)?)
        }

        /// The `k` highest heads over all kinds, as a table (head, value). The table goes
        /// straight into anything that takes heads (`m.ablate(d, g.top(3))`, `with_mask`,
        /// `with_gates`), and each `head` is a name `m.head` accepts.
        ///
        /// ```rhai
        /// let m = load_model("enpt");
        /// let g = m.confidence(corpus(asset("pud_en.txt")).take(3));
        /// let t = g.top(5);
        /// assert(t.len() == 5 && t[0].value >= t[4].value);
        /// assert(m.with_mask(t).masked.len() == 5 && m.head(t[0].head).to_string() == t[0].head);
        /// ```
        #[rhai_fn(return_raw, pure)]
        pub fn top(g: &mut Grid, k: i64) -> ScriptResult<Table> {
            Ok(g.end_table(k, false, "top")?)
        }

        /// The `k` lowest heads over all kinds, lowest first, as a table (head, value): the
        /// candidates for pruning. Removed heads (NaN) are left out, as in `top`.
        ///
        /// ```rhai
        /// let m = load_model("enpt");
        /// let g = m.confidence(corpus(asset("pud_en.txt")).take(3));
        /// let b = g.bottom(4);
        /// assert(b.len() == 4 && b[0].value <= b[3].value && b[0].value <= g.top(1)[0].value);
        /// assert(m.with_mask(b).masked.len() == 4);
        /// ```
        #[rhai_fn(return_raw, pure)]
        pub fn bottom(g: &mut Grid, k: i64) -> ScriptResult<Table> {
            Ok(g.end_table(k, true, "bottom")?)
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
            let rows = g.kinds.iter().flat_map(|(k, m)| {
                m.iter()
                    .enumerate()
                    .flat_map(move |(l, row)| row.iter().enumerate().map(move |(h, v)| format!("{k},{l},{h},{v}")))
            });
            write_csv(path, "kind,layer,head,value", rows, "to_csv")
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
            write_json(path, &g.to_json(), "to_json")
        }

        /// Writes the grid as Parquet, atomically, in long format: columns `kind`, `layer`,
        /// `head`, `value` (NaN for a head removed or not swept), with the statistic, model,
        /// dataset, options and headscope's version as JSON under the file's metadata key
        /// `headscope` (docs/methods.md#export). pandas: `pd.read_parquet(path)`.
        ///
        /// ```rhai
        /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
        /// let p = temp_path("c.parquet");
        /// g.to_parquet(p);
        /// assert(file_size(p) > 500);
        /// ```
        #[rhai_fn(name = "to_parquet", return_raw, pure)]
        pub fn grid_to_parquet(g: &mut Grid, path: &str) -> ScriptResult<()> {
            let bytes = crate::export::parquet_bytes(&g.long_columns(), &g.provenance())
                .or_else(|e| err(format!("to_parquet: {e}")))?;
            crate::export::write(path, &bytes).or_else(|e| err(format!("to_parquet: {e}")))
        }

        /// Writes the grid as an `.npz`, atomically: one float64 array `[layers, heads]` per
        /// kind, named by the kind (NaN for a head removed or not swept), and
        /// `headscope_metadata`, the provenance as UTF-8 JSON bytes (docs/methods.md#export).
        /// numpy: `z = np.load(path); z["dec"]`.
        ///
        /// ```rhai
        /// let g = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(3));
        /// let p = temp_path("c.npz");
        /// g.to_npz(p);
        /// assert(file_size(p) > 48 * 8);
        /// ```
        #[rhai_fn(name = "to_npz", return_raw, pure)]
        pub fn grid_to_npz(g: &mut Grid, path: &str) -> ScriptResult<()> {
            let arrays: Vec<crate::export::NpArray> = g
                .kinds
                .iter()
                .map(|(k, m)| crate::export::NpArray {
                    name: k.to_string(),
                    shape: vec![m.len(), m.first().map_or(0, |r| r.len())],
                    values: m.iter().flatten().copied().collect(),
                })
                .collect();
            let bytes = crate::export::npz_bytes(&arrays, &g.provenance()).or_else(|e| err(format!("to_npz: {e}")))?;
            crate::export::write(path, &bytes).or_else(|e| err(format!("to_npz: {e}")))
        }

        /// The view with each head's box coloured by a grid's value (a patching effect, a
        /// confidence, a sweep): a row of boxes per layer shown, red above 0, blue below, white
        /// at 0, on one scale per kind; the grid's statistic names it. Kinds the grid lacks stay
        /// uncoloured; a grid of another shape is refused. (Beside Grid, not the view: the view
        /// knows no grids, so the module graph stays a DAG.)
        ///
        /// ```rhai
        /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
        /// let r = m.patch(pairs([["a b c d", "a b e d", " c", " e"]]));
        /// let v = m.view("a b c d").colour_by(r.effect);
        /// assert(v.html.contains("\"scores\":[") && v.to_string().contains("coloured by normalised effect"));
        /// ```
        #[rhai_fn(return_raw, pure)]
        pub fn colour_by(v: &mut crate::view::HeadView, grid: Grid) -> ScriptResult<crate::view::HeadView> {
            let scores: Vec<(String, Vec<Vec<f64>>)> =
                grid.kinds.iter().map(|(k, g)| (k.to_string(), g.clone())).collect();
            v.colour_by(&scores, &grid.stat).or_else(err)
        }

        #[rhai_fn(name = "to_string", pure)]
        pub fn grid_to_string(g: &mut Grid) -> String {
            g.table().to_text()
        }

        /// A grid inside a map or an array: `<Grid head_importance of gpt2: dec 2x4>`.
        #[rhai_fn(name = "to_debug", pure)]
        pub fn grid_to_debug(g: &mut Grid) -> String {
            let kinds: Vec<String> =
                g.kinds.iter().map(|(k, v)| format!("{k} {}x{}", v.len(), v.first().map_or(0, Vec::len))).collect();
            format!("<Grid {} of {}: {}>", g.stat, g.model, kinds.join(", "))
        }
    }

    pub fn register(engine: &mut Engine) {
        engine.register_type_with_name::<Grid>("Grid");
        engine.register_global_module(exported_module!(api).into());
    }

    pub fn render(v: &Dynamic) -> Option<Output> {
        v.clone().try_cast::<Grid>().map(|g| g.render())
    }

    /// What `g["` may be followed by: a grid is indexed by its kinds.
    pub fn index_keys(v: &Dynamic) -> Option<Vec<String>> {
        v.clone().try_cast::<Grid>().map(|g| g.kinds.iter().map(|(k, _)| k.to_string()).collect())
    }
}
