//! Gradient head importance on a model: `m.head_importance(data, #{...})` and the agreement of
//! two per-head grids, `agreement(a, b)` (docs/methods.md#gradient-head-importance).

use super::sharded::{cell, echo_of, valid_heads, valid_of};
use crate::analysis::ablation::{self, Metric};
use crate::analysis::importance::{
    bottom_k_overlap, finish, head_importance, spearman, ImportanceAcc, ImportanceMetric, ImportanceOptions, Normalize,
};
use crate::grid::Grid;
use crate::model::script::kinds_option;
use crate::model::script::ScriptModel;
use crate::model::view::Needs;
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, json_f64, opt, opt_bool, opt_int, opt_str, OptSpec, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Dynamic, Map};
use serde_json::json;

pub const IMPORTANCE_OPTIONS: &[OptSpec] = &[
    opt_str("metric", "loss", "\"loss\": mean |dL/dg| on the data's targets; \"fisher\": mean (dL/dg)^2 on targets sampled from the model (docs/methods.md#gradient-head-importance)"),
    opt_str("normalize", "none", "\"none\" or \"layer\" (each layer divided by its L2 norm, Michel et al. 2019)"),
    opt("kinds", "every kind", "the attention kinds whose gates are differentiated"),
    opt_int("batch_tokens", 2048, "tokens per batch, padding included (translation models also decode their teacher targets in these batches)"),
    opt_int("seed", 0, "seed of the targets \"fisher\" samples"),
    opt_bool("exact", false, "also run the exact single-head sweep (\"loss\" for metric loss, \"kl\" for fisher) and echo the agreement"),
    opt_int("k", 10, "how many least important heads the agreement compares"),
    crate::data::script::SHARD_OPTION,
    crate::model::script::TGT_LANG,
];

/// How two per-head grids agree on one kind: the heads with a value in both, Spearman's rho
/// and how many of the `k` lowest they share.
struct Agreement {
    kind: crate::model::Kind,
    heads: usize,
    spearman: f64,
    k: usize,
    overlap: usize,
}

/// Per kind both grids have (a head removed or closed, NaN in either, takes no part).
fn agreements(a: &Grid, b: &Grid, k: usize) -> Vec<Agreement> {
    a.kinds
        .iter()
        .filter_map(|(kind, ga)| {
            let (_, gb) = b.kinds.iter().find(|(k2, _)| k2 == kind)?;
            let (va, vb): (Vec<f64>, Vec<f64>) = ga
                .iter()
                .flatten()
                .zip(gb.iter().flatten())
                .filter(|(x, y)| !x.is_nan() && !y.is_nan())
                .map(|(x, y)| (*x, *y))
                .unzip();
            let k = k.min(va.len());
            Some(Agreement {
                kind: *kind,
                heads: va.len(),
                spearman: spearman(&va, &vb),
                k,
                overlap: bottom_k_overlap(&va, &vb, k),
            })
        })
        .collect()
}

fn agreement_table(a: &Grid, b: &Grid, k: usize) -> Table {
    let mut t = Table::new(vec!["kind".into(), "heads".into(), "spearman".into(), "k".into(), "overlap".into()]);
    t.title = Some(format!("agreement: {} vs {}", a.stat, b.stat));
    t.digits = 3;
    for g in agreements(a, b, k) {
        let _ = t.push_row(vec![
            Cell::Text(g.kind.to_string()),
            Cell::Int(g.heads as i64),
            Cell::Float(g.spearman),
            Cell::Int(g.k as i64),
            Cell::Int(g.overlap as i64),
        ]);
    }
    t
}

/// Gradient importance's grid from its accumulators (one process's, or merged shards').
pub fn finish_importance(identity: &serde_json::Value, acc: &ImportanceAcc) -> Result<Grid, String> {
    let n = acc.sentences;
    let mut echo = echo_of(&identity["options"]);
    let find = |k: &str| {
        echo.iter().find(|(key, _)| key == k).and_then(|(_, v)| v.as_str().map(str::to_string)).unwrap_or_default()
    };
    let metric: ImportanceMetric = find("metric").parse()?;
    let normalize: Normalize = find("normalize").parse()?;
    let valid = valid_of(identity)?;
    let sums = valid
        .iter()
        .map(|(k, v)| {
            Ok((
                *k,
                v.iter()
                    .enumerate()
                    .map(|(l, row)| {
                        (0..row.len())
                            .map(|h| Ok(cell(&acc.sums, &k.to_string(), l, h)?.0))
                            .collect::<Result<Vec<f64>, String>>()
                    })
                    .collect::<Result<_, _>>()?,
            ))
        })
        .collect::<Result<crate::model::KindGrids, String>>()?;
    let kinds = finish(&sums, &valid, n, normalize);
    let at = echo.iter().position(|(k, _)| k == "seed").unwrap_or(echo.len());
    echo.splice(at..at, [("sentences".to_string(), json!(n)), ("seconds".into(), json_f64(acc.seconds))]);
    let stat = match metric {
        ImportanceMetric::Loss => "gradient importance |dL/dg|",
        ImportanceMetric::Fisher => "gradient importance E[(dL/dg)^2] (Fisher)",
    };
    Ok(Grid {
        stat: stat.into(),
        model: identity["model"]["name"].as_str().unwrap_or_default().into(),
        dataset: identity["data"]["name"].as_str().unwrap_or_default().into(),
        kinds,
        options: echo,
    })
}

#[export_module]
pub mod api {
    use super::*;

    /// Gradient head importance (Michel et al. 2019; docs/methods.md#gradient-head-importance):
    /// per kind a layers x heads grid of the mean over sentences of |dL/dg|, the gradient of
    /// the sentence's task loss (next-token loss for a language model, teacher-forced loss for a
    /// translation model) in a multiplicative gate on the head, at the model as given; one
    /// forward and one backward per batch. Options: `metric` ("loss" | "fisher": mean
    /// (dL/dg)^2 with targets sampled from the model, for comparisons with KL), `normalize`
    /// ("none" | "layer"), `kinds`, `batch_tokens` (2048), `seed` (0), `exact` (false: when
    /// true, also runs the exact sweep on the same data and echoes `agreement`, per kind
    /// Spearman's rho and the overlap of the `k` (10) least important heads, and both times).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let g = m.head_importance(corpus(asset("pud_en.txt")).take(4), #{exact: true, k: 5});
    /// assert(g.kinds == ["enc", "cross"] && g["enc"][0][0] > 0.0);
    /// assert(g.options.agreement.enc.spearman > -1.0 && g.options.agreement.cross.k == 5);
    /// ```
    #[rhai_fn(name = "head_importance", return_raw, pure)]
    pub fn head_importance_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Grid> {
        let f = "head_importance";
        let o = Opts::new(&options, f, IMPORTANCE_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let d = crate::data::script::dataset_arg(&data, f)?;
        let opts = ImportanceOptions {
            metric: o.parsed_or_default("metric")?,
            normalize: o.parsed_or_default("normalize")?,
            kinds: kinds_option(m, &o)?,
            batch_tokens: o.usize_or_default("batch_tokens")?,
            seed: o.usize_or_default("seed")? as u64,
            row_offset: 0,
        };
        let exact = o.bool_or_default("exact")?;
        if exact {
            m.require(f, Needs::NoClosed).or_else(|_| {
                err(format!(
                    "{f}: the exact sweep runs on the unmasked model (this view masks heads already): drop `exact`"
                ))
            })?;
        }
        let plan = crate::data::script::Plan::new(&d, &o, f)?;
        if exact && plan.shard.is_some() {
            return err(format!("{f}: `exact` compares rankings, which do not add over shards: merge the shards, run ablation_sweep sharded, and compare with agreement(a, b)"));
        }
        let opts = ImportanceOptions { row_offset: plan.rows.start, ..opts };
        let base = m.gates().script()?;
        let mut progress = |done: usize, total: usize| crate::run::progress(f, done, total);
        let started = std::time::Instant::now();
        let r = head_importance(&m.model, &plan.data(&d, f)?, &base, &opts, &crate::run::interrupted, &mut progress)
            .or_else(|e| err(format!("{f}: {e}")))?;
        let seconds = started.elapsed().as_secs_f64();
        let mut echo = vec![
            json!(["metric", opts.metric.to_string()]),
            json!(["normalize", opts.normalize.to_string()]),
            json!(["kinds", opts.kinds.iter().map(|k| k.to_string()).collect::<Vec<_>>()]),
            json!(["batch_tokens", opts.batch_tokens]),
            json!(["targets", r.targets_from]),
        ];
        if opts.metric == ImportanceMetric::Fisher {
            echo.push(json!(["seed", opts.seed]));
        }
        let identity = plan.identity(m.identity(), json!({"options": echo, "heads": valid_heads(&r.valid)}));
        let acc = ImportanceAcc::of(&r, seconds);
        let mut g = finish_importance(&identity, &acc).or_else(|e| err(format!("{f}: {e}")))?;
        let mut echo = std::mem::take(&mut g.options);
        if exact {
            let metric = if opts.metric == ImportanceMetric::Loss { Metric::Loss } else { Metric::Kl };
            let started = std::time::Instant::now();
            let p = ablation::prepare(&m.model, &d, metric, 256, base).or_else(|e| err(format!("{f}: {e}")))?;
            let stop = crate::run::interrupted;
            let base_value = ablation::evaluate(&m.model, &p, &p.base, &stop).or_else(|e| err(format!("{f}: {e}")))?;
            let mut progress =
                |done: usize, total: usize| crate::run::progress("exact sweep (sentence x head)", done, total);
            let grids = ablation::sweep(&m.model, &p, &opts.kinds, &stop, &mut progress)
                .or_else(|e| err(format!("{f}: {e}")))?;
            let exact_seconds = started.elapsed().as_secs_f64();
            let effect = grids
                .into_iter()
                .map(|(k, rows)| {
                    (k, rows.into_iter().map(|r| r.into_iter().map(|v| v - base_value).collect()).collect())
                })
                .collect();
            let exact = Grid {
                stat: format!("{metric} increase with the head masked"),
                model: g.model.clone(),
                dataset: g.dataset.clone(),
                kinds: effect,
                options: vec![],
            };
            let k = o.usize_or_default("k")?;
            let per_kind = agreements(&g, &exact, k)
                .into_iter()
                .map(|a| {
                    (
                        a.kind.to_string(),
                        json!({"heads": a.heads, "spearman": json_f64(a.spearman), "k": a.k, "overlap": a.overlap}),
                    )
                })
                .collect();
            echo.push((
                "exact".into(),
                json!({"metric": metric.to_string(), "base": json_f64(base_value), "seconds": json_f64(exact_seconds)}),
            ));
            echo.push(("agreement".into(), serde_json::Value::Object(per_kind)));
        }
        g.options = echo;
        Ok(plan.seal(f, identity, &acc, g, |g| &mut g.options, Grid::to_json)?)
    }

    /// `head_importance` with the default options.
    ///
    /// ```rhai
    /// let g = load_model("smollm2").head_importance(corpus(asset("pud_en.txt")).take(2));
    /// assert(g.kinds == ["dec"] && g.options.targets == "next tokens");
    /// ```
    #[rhai_fn(name = "head_importance", return_raw, pure)]
    pub fn head_importance_plain(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Grid> {
        head_importance_opts(m, data, Map::new())
    }

    /// How far two per-head grids agree (docs/methods.md#gradient-head-importance): a table
    /// with, per kind both have, the heads compared, Spearman's rho and how many of the `k`
    /// lowest of `a` are among the `k` lowest of `b`.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let d = corpus(asset("pud_en.txt")).take(3);
    /// let t = agreement(m.confidence(d), m.lrp(d), 5);
    /// assert(t.len() == 1 && t.column("k")[0] == 5);
    /// ```
    #[rhai_fn(name = "agreement", return_raw)]
    pub fn agreement(a: Grid, b: Grid, k: i64) -> ScriptResult<Table> {
        if k < 1 {
            return err(format!("agreement: k must be at least 1, got {k}"));
        }
        Ok(agreement_table(&a, &b, k as usize))
    }

    /// `agreement` of the 10 lowest.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let d = corpus(asset("pud_en.txt")).take(3);
    /// let t = agreement(m.confidence(d), m.confidence(d));
    /// assert(t.column("spearman")[0] == 1.0 && t.column("overlap")[0] == 10);
    /// ```
    #[rhai_fn(name = "agreement", return_raw)]
    pub fn agreement_10(a: Grid, b: Grid) -> ScriptResult<Table> {
        agreement(a, b, 10)
    }
}
