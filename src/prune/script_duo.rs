//! The script API of DuoAttention's learned gates and PruLong's masks (docs/methods.md#duo-gates,
//! #prulong-masks): `m.learn_duo(data, #{...})`, `m.learn_prulong(data, #{...})`, each a Grid
//! that `kv_curve` takes as scores.

use crate::grid::Grid;
use crate::model::script::ScriptModel;
use crate::model::Kind;
use crate::script::convert::{err, opt, opt_bool, opt_f64, opt_int, OptSpec, Opts, ScriptResult};
use rhai::plugin::*;
use rhai::{Dynamic, Engine, Map};
use serde_json::json;

pub const LEARN_DUO_OPTIONS: &[OptSpec] = &[
    opt_int("steps", 200, "Adam steps"),
    opt_f64("lr", 0.02, "Adam's learning rate (DuoAttention: 0.02)"),
    opt_f64("lambda", 0.05, "weight of the L1 penalty, the mean gate over the key/value groups"),
    opt_int("sink", 4, "the first tokens the streaming attention keeps seeing"),
    opt_int("recent", 64, "the streaming attention's recent window"),
    opt_int("context", 256, "tokens per passkey sequence"),
    opt_int("samples", 32, "passkey sequences drawn from the data (the training set)"),
    opt_int("needle", 8, "the passkey's length in tokens; the hidden states over its second occurrence are matched"),
    opt_int("batch", 1, "sequences per step"),
    opt_int("seed", 0, "seed of the passkeys, their depths and the order of the batches"),
    opt("checkpoint", "", "a directory for checkpoints, written atomically"),
    opt_bool("resume", false, "resume the run in 'checkpoint'"),
    opt_int("save_every", 10, "steps between checkpoints"),
];

pub const LEARN_PRULONG_OPTIONS: &[OptSpec] = &[
    opt_int("steps", 200, "Adam steps"),
    opt_f64("lr", 0.1, "Adam's learning rate of log_alpha (and the multipliers' ascent)"),
    opt(
        "target",
        "0.5",
        "the fraction of key/value groups kept full the Lagrangian holds the run to (none: lambda instead)",
    ),
    opt_f64("lambda", 0.05, "without a target: weight of the expected fraction of full groups"),
    opt_f64("beta", 0.33, "Hard Concrete temperature"),
    opt_int("sink", 4, "the first tokens the streaming attention keeps seeing"),
    opt_int("recent", 64, "the streaming attention's recent window"),
    opt_int("context", 256, "tokens per passkey sequence"),
    opt_int("samples", 32, "passkey sequences drawn from the data (the training set)"),
    opt_int("needle", 8, "the passkey's length in tokens; the next-token loss is read over its second occurrence"),
    opt_int("batch", 1, "sequences per step"),
    opt_int("seed", 0, "seed of the passkeys, their depths, the batch order and the gates' noise"),
    opt("checkpoint", "", "a directory for checkpoints, written atomically"),
    opt_bool("resume", false, "resume the run in 'checkpoint'"),
    opt_int("save_every", 10, "steps between checkpoints"),
];

/// `learn_duo` and `learn_prulong`: options parsed at the edge, the training, the Grid.
fn learn_gates(m: &ScriptModel, data: Dynamic, options: Map, prulong: bool) -> ScriptResult<Grid> {
    use crate::prune::duo::{DuoOptions, Method};
    let (f, specs) = if prulong { ("learn_prulong", LEARN_PRULONG_OPTIONS) } else { ("learn_duo", LEARN_DUO_OPTIONS) };
    let o = Opts::new(&options, f, specs)?;
    let d = crate::data::script::dataset_arg(&data, f)?;
    let int = |k: &str| -> ScriptResult<i64> {
        let v = o.f64_or_default(k)?;
        if v.fract() != 0.0 || !v.is_finite() || v < 0.0 {
            return err(format!("{f}: {k} must be a whole number 0 or more, got {v}"));
        }
        Ok(v as i64)
    };
    let method = if prulong {
        let target = match o.value("target") {
            Some(v) if v.is_string() && v.clone().cast::<rhai::ImmutableString>() == "none" => None,
            Some(v) => Some(crate::script::convert::to_f64(
                v,
                &format!("{f}: option 'target' (a fraction in (0, 1], or \"none\")"),
            )?),
            None => Some(0.5),
        };
        Method::PruLong {
            target,
            concrete: crate::prune::Concrete { beta: o.f64_or_default("beta")?, ..Default::default() },
        }
    } else {
        Method::Duo
    };
    let opts = DuoOptions {
        steps: int("steps")? as usize,
        lr: o.f64_or_default("lr")?,
        lambda: o.f64_or_default("lambda")?,
        sink: int("sink")?,
        recent: int("recent")?,
        context: int("context")?,
        samples: int("samples")? as usize,
        needle: int("needle")? as usize,
        batch: int("batch")? as usize,
        seed: int("seed")? as u64,
        checkpoint: o.string("checkpoint")?.filter(|s| !s.is_empty()).map(std::path::PathBuf::from),
        resume: o.bool_or_default("resume")?,
        save_every: int("save_every")? as usize,
        method,
    };
    opts.validate()?;
    let label = format!("{f} (lambda {})", opts.lambda);
    let mut progress = |p: &crate::prune::CurvePoint, total: usize| {
        crate::run::progress(
            &format!("{label}: loss {:.4}, full groups {} (expected {:.1})", p.loss, p.open, p.expected_open),
            p.step,
            total,
        )
    };
    let hooks = crate::prune::Hooks { stop: &crate::run::interrupted, progress: &mut progress };
    let run = crate::prune::duo::train(m, &d, &opts, hooks).or_else(|e| {
        let s = e.to_string();
        err(if s.starts_with(f) { s } else { format!("{f}: {s}") })
    })?;
    let n = run.state.log_alpha.len().max(1) as f64;
    let mut echo = opts.echo();
    let last = run.state.curve.last();
    echo.push(("loss".into(), json!(last.map(|p| p.loss))));
    if prulong {
        echo.push(("full_groups".into(), json!(last.map(|p| p.open))));
        echo.push(("expected_full".into(), json!(last.map(|p| p.expected_open))));
    } else {
        echo.push(("mean_gate".into(), json!(run.state.log_alpha.iter().map(|&a| a as f64).sum::<f64>() / n)));
    }
    echo.push(("resumed_from".into(), json!(run.resumed_from)));
    echo.push((
        "step_seconds".into(),
        json!(run.step_seconds.iter().sum::<f64>() / run.step_seconds.len().max(1) as f64),
    ));
    echo.push((
        "curve".into(),
        json!(run.state.curve.iter().map(|p| json!([p.step, p.loss, p.expected_open / n])).collect::<Vec<_>>()),
    ));
    let stat = if prulong { "prulong log_alpha" } else { "duo gate" };
    Ok(Grid {
        stat: stat.into(),
        model: m.model.name(),
        dataset: d.name.clone(),
        kinds: vec![(Kind::Dec, run.per_head())],
        options: echo,
    })
}

#[export_module]
pub mod api {
    use super::*;

    /// DuoAttention's learned gates (docs/methods.md#duo-gates): one gate per key/value group,
    /// mixing full and streaming attention, trained on passkey sequences built from `data` to
    /// keep the last hidden states over the answer, with an L1 penalty. A Grid (`dec`, each
    /// query head showing its group's gate) that `kv_curve` takes as scores; its options echo
    /// the run, the last step's `loss`, the `mean_gate`, `resumed_from` and `curve` (per step:
    /// `[step, loss, mean gate]`). Resumable from `checkpoint` with identical gates.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let g = m.learn_duo(corpus(asset("pud_en.txt")).take(30), #{steps: 3, context: 64, samples: 2, recent: 8});
    /// assert(g["dec"].len() == 2 && g["dec"][0][0] == g["dec"][0][1] && g["dec"][0][0] <= 1.0);
    /// assert(g.options.curve.len() == 3 && g.options.steps == 3);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn learn_duo(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Grid> {
        learn_gates(m, data, options, false)
    }

    /// PruLong's Hard Concrete masks (docs/methods.md#prulong-masks): one mask per key/value
    /// group choosing full or streaming attention, trained on the next-token loss of passkey
    /// answers built from `data`, held by a Lagrangian to `target`, the fraction of groups kept
    /// full. A Grid of each group's `log_alpha` (on each of its query heads; > 0: full) that
    /// `kv_curve` takes as scores; options as `learn_duo`'s plus the last step's `full_groups`
    /// and `expected_full`. Resumable from `checkpoint` with identical masks.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let g = m.learn_prulong(corpus(asset("pud_en.txt")).take(30), #{steps: 3, context: 64, samples: 2, recent: 8, target: 0.5});
    /// assert(g["dec"].len() == 2 && g["dec"][1][0] == g["dec"][1][1] && g.options.curve.len() == 3);
    /// assert(g.to_string().contains("prulong log_alpha"));
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn learn_prulong(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Grid> {
        learn_gates(m, data, options, true)
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_global_module(exported_module!(api).into());
}
