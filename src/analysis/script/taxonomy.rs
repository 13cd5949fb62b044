//! The head taxonomy on a model: `m.head_types(#{...})` and its result type `HeadTypes`
//! (docs/methods.md#head-taxonomy).

use crate::analysis::taxonomy::{
    head_type_scores, labels, token_pool, HeadType, ProbeOptions, Probes, TypeGrids, HEAD_TYPES,
};
use crate::grid::Grid;
use crate::model::script::ScriptModel;
use crate::model::HeadId;
use crate::output::{Echo, Output, Render};
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt, opt_int, opt_shown, OptSpec, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Map};
use serde_json::json;

pub const HEAD_TYPES_OPTIONS: &[OptSpec] = &[
    opt_int("seed", 0, "seed of the probe sequences"),
    opt_int("n", 20, "sequences per probe"),
    opt_int("len", 50, "length of the random segment the repeated-token probe repeats"),
    opt_int("needle", 8, "needle length of the retrieval probe"),
    opt_int("haystack", 100, "haystack length of the retrieval probe"),
    opt_shown("thresholds", default_thresholds, "a map from head type to the score that labels a head with it"),
    opt("exclude_sink", "true for a decoder-only model, else false", "leave the first position (the sink) out of the other types' scores and report sink heads apart from the labels"),
];

/// The default thresholds as `:help` shows them (they live beside their type,
/// `HeadType::default_threshold`).
fn default_thresholds() -> String {
    HEAD_TYPES.iter().map(|t| format!("{t} {}", t.default_threshold())).collect::<Vec<_>>().join(", ")
}

/// Every head type's grid, the labels they give, and the probes they came from.
#[derive(Clone)]
pub struct HeadTypes {
    pub grids: Vec<(HeadType, Grid)>,
    pub labels: Vec<(HeadId, Vec<HeadType>)>,
    /// With `exclude_sink`: the heads whose sink score reaches its threshold, kept out of
    /// `labels` (`None`: sinks are labels like the other types).
    pub sinks: Option<Vec<HeadId>>,
    pub probe: Echo,
    pub model: String,
}

impl HeadTypes {
    /// One row per labelled head: its types and every score.
    pub fn table(&self) -> Table {
        let mut cols = vec!["head".to_string(), "types".to_string()];
        cols.extend(self.grids.iter().map(|(t, _)| t.to_string()));
        let mut t = Table::new(cols);
        t.title = Some(match &self.sinks {
            None => format!("head types: {} ({} heads labelled)", self.model, self.labels.len()),
            Some(s) => format!("head types: {} ({} heads labelled; sink kept apart: {} sink heads in .sinks, exclude_sink: false labels them)", self.model, self.labels.len(), s.len()),
        });
        t.digits = 3;
        for (id, types) in &self.labels {
            let mut row = vec![
                Cell::Text(id.to_string()),
                Cell::Text(types.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" ")),
            ];
            row.extend(self.grids.iter().map(|(_, g)| Cell::Float(g.kinds[0].1[id.layer_idx][id.head])));
            let _ = t.push_row(row);
        }
        t
    }
}

impl Render for HeadTypes {
    fn render(&self) -> Output {
        self.table().render()
    }
}

#[export_module]
pub mod api {
    use super::*;

    /// The head taxonomy of the self-attention stack (docs/methods.md#head-taxonomy): sink,
    /// previous-token, duplicate-token and induction scores on repeated random tokens
    /// (TransformerLens's detector scores), retrieval (copy-paste) scores on needle-in-context
    /// sequences (Wu et al. 2024), and every head labelled with all the types whose score
    /// reaches its threshold. The probes are generated from `seed` and echoed in `.probe`
    /// (their token ids included). Options: `seed` (0), `n` (20), `len` (50), `needle` (8),
    /// `haystack` (100), `thresholds` (a map by type), `exclude_sink` (true for a decoder-only
    /// model, else false: the first position, where such models park attention, is left out
    /// of the other types' scores as TransformerLens's `exclude_bos` does, and sink heads are
    /// listed apart in `.sinks` rather than among the labels; docs/methods.md#attention-sinks).
    ///
    /// ```rhai
    /// let m = load_model("smollm2");
    /// let r = m.head_types(#{n: 2, len: 20, haystack: 30});
    /// assert(r["induction"]["dec"].len() == 30 && r.probe.seed == 0 && r.probe.repeated.len() == 2);
    /// assert(r.labels.len() > 0 && r.labels.column("head").len() == r.labels.len());
    /// // A decoder-only model: the sink is kept apart; the old labels are one option away.
    /// assert(r.options.exclude_sink && r.sinks.len() > 0);
    /// let old = m.head_types(#{n: 2, len: 20, haystack: 30, exclude_sink: false});
    /// assert(old.sinks == () && old.labels.len() >= r.sinks.len());
    /// ```
    #[rhai_fn(name = "head_types", return_raw, pure)]
    pub fn head_types_opts(m: &mut ScriptModel, options: Map) -> ScriptResult<HeadTypes> {
        let f = "head_types";
        let o = Opts::new(&options, f, HEAD_TYPES_OPTIONS)?;
        let po = ProbeOptions {
            seed: o.usize_or_default("seed")? as u64,
            n: o.usize_or_default("n")?,
            len: o.usize_or_default("len")?,
            needle: o.usize_or_default("needle")?,
            haystack: o.usize_or_default("haystack")?,
        };
        let mut thresholds: Vec<(HeadType, f64)> = HEAD_TYPES.iter().map(|t| (*t, t.default_threshold())).collect();
        if let Some(v) = o.value("thresholds") {
            let Some(map) = v.clone().try_cast::<Map>() else {
                return err(format!(
                    "{f}: thresholds must be a map such as #{{induction: 0.3}}, got {}",
                    crate::script::convert::quote(v)
                ));
            };
            for (k, x) in map {
                let ty: HeadType = k.parse().or_else(|e: String| err(format!("{f}: thresholds: {e}")))?;
                let x = crate::script::convert::to_f64(&x, &format!("{f}: thresholds.{k}"))?;
                thresholds.iter_mut().filter(|(t, _)| *t == ty).for_each(|(_, v)| *v = x);
            }
        }
        let exclude_sink = o.bool("exclude_sink")?.unwrap_or_else(|| m.model.decoder_only());
        let probes = Probes::generate(&token_pool(&m.model), &po).or_else(|e| err(format!("{f}: {e}")))?;
        let grids = head_type_scores(&m.model, &probes, &m.gates().script()?, &crate::run::interrupted, exclude_sink)
            .or_else(|e| err(format!("{f}: {e}")))?;
        let kind = m.model.net.stack_kind;
        let id = |(l, h): (usize, usize)| HeadId { kind, layer_idx: l, head: h };
        let (found, sinks) = if exclude_sink {
            let (sink, others): (TypeGrids, TypeGrids) = grids.iter().cloned().partition(|(t, _)| *t == HeadType::Sink);
            let found = labels(&others, &thresholds).into_iter().map(|(lh, t)| (id(lh), t)).collect();
            (found, Some(labels(&sink, &thresholds).into_iter().map(|(lh, _)| id(lh)).collect()))
        } else {
            (labels(&grids, &thresholds).into_iter().map(|(lh, t)| (id(lh), t)).collect(), None)
        };
        let probe: Echo = vec![
            ("seed".into(), json!(po.seed)),
            ("n".into(), json!(po.n)),
            ("len".into(), json!(po.len)),
            ("needle".into(), json!(po.needle)),
            ("haystack".into(), json!(po.haystack)),
            (
                "thresholds".into(),
                serde_json::Value::Object(thresholds.iter().map(|(t, v)| (t.to_string(), json!(v))).collect()),
            ),
            ("exclude_sink".into(), json!(exclude_sink)),
            ("repeated".into(), json!(probes.repeated)),
            (
                "needles".into(),
                json!(probes.needles.iter().map(|(s, at)| json!({"ids": s, "needle_at": at})).collect::<Vec<_>>()),
            ),
        ];
        let summary: Echo =
            probe.iter().filter(|(k, _)| !matches!(k.as_str(), "repeated" | "needles")).cloned().collect();
        let grids = grids
            .into_iter()
            .map(|(ty, g)| {
                (
                    ty,
                    Grid {
                        stat: format!("{ty} score"),
                        model: m.model.name(),
                        dataset: format!(
                            "{} probe (seed {})",
                            if ty == HeadType::Retrieval { "needle" } else { "repeated tokens" },
                            po.seed
                        ),
                        kinds: vec![(kind, g)],
                        options: summary.clone(),
                    },
                )
            })
            .collect();
        Ok(HeadTypes { grids, labels: found, sinks, probe, model: m.model.name() })
    }

    /// `head_types` with the default probes.
    ///
    /// ```rhai
    /// let r = load_model("tests/fixtures/tiny_hf/gpt2").head_types();
    /// assert(r.types == ["sink", "previous_token", "duplicate_token", "induction", "retrieval"]);
    /// ```
    #[rhai_fn(name = "head_types", return_raw, pure)]
    pub fn head_types_plain(m: &mut ScriptModel) -> ScriptResult<HeadTypes> {
        head_types_opts(m, Map::new())
    }

    /// One type's scores as a grid: `r["induction"]`.
    ///
    /// ```rhai
    /// let r = load_model("tests/fixtures/tiny_hf/gpt2").head_types(#{n: 2, len: 10, haystack: 20});
    /// assert(r["sink"]["dec"][0].len() == 4);
    /// ```
    #[rhai_fn(index_get, return_raw, pure)]
    pub fn head_type_grid(r: &mut HeadTypes, ty: &str) -> ScriptResult<Grid> {
        let t: HeadType = ty.parse().or_else(|e: String| err(e))?;
        r.grids.iter().find(|(x, _)| *x == t).map(|(_, g)| g.clone()).ok_or_else(|| format!("no '{ty}' scores").into())
    }

    /// The head types scored, in order.
    ///
    /// ```rhai
    /// assert(load_model("tests/fixtures/tiny_hf/gpt2").head_types(#{n: 1, len: 4, haystack: 4}).types.len() == 5);
    /// ```
    #[rhai_fn(get = "types", pure)]
    pub fn types(r: &mut HeadTypes) -> Array {
        r.grids.iter().map(|(t, _)| Dynamic::from(t.to_string())).collect()
    }

    /// The labelled heads: a table with `head`, `types` and every score (goes straight into
    /// functions that take heads, such as `ablate`).
    ///
    /// ```rhai
    /// let r = load_model("tests/fixtures/tiny_hf/gpt2").head_types(#{n: 2, len: 10, haystack: 20, thresholds: #{sink: 0.0}, exclude_sink: false});
    /// assert(r.labels.len() == 8);
    /// ```
    #[rhai_fn(get = "labels", pure)]
    pub fn labels_table(r: &mut HeadTypes) -> Table {
        r.table()
    }

    /// The probes: seed, sizes, thresholds and the token ids of every sequence.
    ///
    /// ```rhai
    /// let p = load_model("tests/fixtures/tiny_hf/gpt2").head_types(#{n: 1, len: 5, haystack: 6, needle: 3}).probe;
    /// assert(p.repeated[0].len() == 10 && p.needles[0].ids.len() == 12);
    /// ```
    #[rhai_fn(get = "probe", pure)]
    pub fn probe(r: &mut HeadTypes) -> Map {
        crate::script::convert::echo_map(&r.probe)
    }

    /// The options the taxonomy ran with (the probes' sizes, thresholds, `exclude_sink`),
    /// without the probes' token ids (those are in `.probe`).
    ///
    /// ```rhai
    /// let r = load_model("tests/fixtures/tiny_hf/gpt2").head_types(#{n: 1, len: 4, haystack: 4});
    /// assert(r.options.exclude_sink == true && r.options.n == 1);
    /// assert(load_model("minilm").head_types(#{n: 1, len: 4, haystack: 4}).options.exclude_sink == false);
    /// ```
    #[rhai_fn(get = "options", pure)]
    pub fn options(r: &mut HeadTypes) -> Map {
        let summary: Echo =
            r.probe.iter().filter(|(k, _)| !matches!(k.as_str(), "repeated" | "needles")).cloned().collect();
        crate::script::convert::echo_map(&summary)
    }

    /// With `exclude_sink` (a decoder-only model's default): the names of the heads whose sink
    /// score reaches its threshold, kept apart from `.labels`; `()` when sinks are labels.
    ///
    /// ```rhai
    /// let r = load_model("tests/fixtures/tiny_hf/gpt2").head_types(#{n: 2, len: 10, haystack: 20, thresholds: #{sink: 0.0}});
    /// assert(r.sinks.len() == 8 && type_of(r.sinks[0]) == "string");
    /// assert(load_model("tests/fixtures/tiny_hf/gpt2").head_types(#{n: 2, len: 10, haystack: 20, exclude_sink: false}).sinks == ());
    /// ```
    #[rhai_fn(get = "sinks", pure)]
    pub fn sinks(r: &mut HeadTypes) -> Dynamic {
        match &r.sinks {
            Some(s) => Dynamic::from(s.iter().map(|h| Dynamic::from(h.to_string())).collect::<Array>()),
            None => Dynamic::UNIT,
        }
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn to_string(r: &mut HeadTypes) -> String {
        r.table().render().text
    }
}

/// What `r["` may be followed by: the head types.
pub fn index_keys(v: &Dynamic) -> Option<Vec<String>> {
    v.clone().try_cast::<HeadTypes>().map(|r| r.grids.iter().map(|(t, _)| t.to_string()).collect())
}
