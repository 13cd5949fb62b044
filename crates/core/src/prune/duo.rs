//! DuoAttention's learned gates (docs/methods.md#duo-gates; Xiao et al., ICLR 2025): one gate
//! `alpha` in [0, 1] per key/value group of a decoder-only model mixes each head's full
//! attention with its streaming attention (sink + recent window), `alpha z_full + (1 - alpha)
//! z_streaming`, trained on passkey sequences so that the last hidden states over the answer
//! (the needle's second occurrence) match the model's own, with an L1 penalty on the gates.
//! Groups whose gate stays high need the whole context; the rest can stream.
//!
//! Like pruning's gates ([`super::train`]) the run is a pure function of (view, data, options):
//! the batch of step `t` is drawn from `(seed, t)`, so a run resumed from its checkpoint ends
//! with the same gates as one never interrupted. Nothing here prints.

use super::checkpoint::{Checkpoint, Run};
use super::{batch_at, host32, CurvePoint, Hooks, TrainState};
use crate::analysis::streaming::{chunks, passkeys_in};
use crate::analysis::AnalysisError;
use crate::data::Dataset;
use crate::model::nn::Duo;
use crate::model::view::View;
use crate::model::{Kind, ModelError};
use serde_json::{json, Value};
use std::path::PathBuf;

use tch::{Kind as DType, Tensor};

/// The checkpoints of a DuoAttention run.
pub const DUO: Run = Run { format: "headscope-duo-checkpoint/1", who: "learn_duo", param: "alpha" };
/// The checkpoints of a PruLong run.
pub const PRULONG: Run = Run { format: "headscope-prulong-checkpoint/1", who: "learn_prulong", param: "log_alpha" };

/// Which gates a run learns (docs/methods.md#duo-gates, #prulong-masks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    /// DuoAttention: a continuous gate in [0, 1] per group, matching the model's hidden states.
    Duo,
    /// PruLong: a Hard Concrete mask per group (its `log_alpha`), on the next-token loss of the
    /// answer, held to `target` (the fraction of groups kept full) by a Lagrangian, or
    /// `lambda` x the expected fraction without a target.
    PruLong { target: Option<f64>, concrete: super::Concrete },
}

/// The options of [`train`], typed (defaults and help beside `learn_duo`'s option list).
#[derive(Debug, Clone)]
pub struct DuoOptions {
    pub steps: usize,
    pub lr: f64,
    /// Weight of the L1 penalty, the mean gate over the groups.
    pub lambda: f64,
    pub sink: i64,
    pub recent: i64,
    /// Tokens per passkey sequence.
    pub context: i64,
    /// Passkey sequences drawn (the training set).
    pub samples: usize,
    /// The passkey's length in tokens (the answer whose states are matched).
    pub needle: usize,
    /// Sequences per step.
    pub batch: usize,
    pub seed: u64,
    pub checkpoint: Option<PathBuf>,
    pub resume: bool,
    /// Steps between checkpoints.
    pub save_every: usize,
    pub method: Method,
}

impl DuoOptions {
    pub fn echo(&self) -> crate::output::Echo {
        let mut v: crate::output::Echo = vec![
            ("steps".into(), json!(self.steps)),
            ("lr".into(), json!(self.lr)),
            ("lambda".into(), json!(self.lambda)),
            ("sink".into(), json!(self.sink)),
            ("recent".into(), json!(self.recent)),
            ("context".into(), json!(self.context)),
            ("samples".into(), json!(self.samples)),
            ("needle".into(), json!(self.needle)),
            ("batch".into(), json!(self.batch)),
            ("seed".into(), json!(self.seed)),
            ("save_every".into(), json!(self.save_every)),
        ];
        if let Method::PruLong { target, concrete } = self.method {
            v.push(("target".into(), json!(target)));
            v.push(("beta".into(), json!(concrete.beta)));
        }
        v
    }

    /// The training's checkpoint kind and function name.
    pub fn run(&self) -> Run {
        match self.method {
            Method::Duo => DUO,
            Method::PruLong { .. } => PRULONG,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        let f = self.run().who;
        if let Method::PruLong { target, concrete } = self.method {
            if let Some(t) = target {
                if !(t > 0.0 && t <= 1.0) {
                    return Err(format!("{f}: target must be a fraction of the key/value groups in (0, 1], got {t}"));
                }
            }
            super::check_beta(f, &concrete)?;
        }
        if self.resume && self.checkpoint.is_none() {
            return Err(format!("{f}: resume: true needs a checkpoint directory (option 'checkpoint')"));
        }
        super::check_training(f, self.lambda, self.lr, self.steps)?;
        for (name, v) in [("samples", self.samples), ("batch", self.batch), ("save_every", self.save_every)] {
            if v == 0 {
                return Err(format!("{f}: {name} must be at least 1, got 0"));
            }
        }
        // A step's sequences are allocated at once: their ids and masks (8 bytes a token each)
        // at least, before any activation.
        let tokens = self.batch as f64 * self.context.max(1) as f64;
        crate::budget::check(&format!("{f}: batch {} of context {} tokens", self.batch, self.context), tokens * 16.0)?;
        if self.needle < 2 {
            return Err(format!("{f}: needle must be at least 2 tokens, got {}", self.needle));
        }
        if self.sink < 0 || self.recent < 1 {
            return Err(format!(
                "{f}: sink must be 0 or more and recent 1 or more, got sink {} and recent {}",
                self.sink, self.recent
            ));
        }
        if self.sink + self.recent >= self.context {
            return Err(format!("{f}: sink + recent ({} + {}) must be less than the context ({}): a streaming head would see every token", self.sink, self.recent, self.context));
        }
        Ok(())
    }
}

/// A finished run: one gate per key/value group, in layer order (`groups` per layer).
pub struct DuoRun {
    pub state: TrainState,
    pub options: DuoOptions,
    /// Key/value groups per layer and query heads per group.
    pub groups: usize,
    pub per: usize,
    pub layers: usize,
    pub resumed_from: Option<usize>,
    /// Wall time of each step this process ran.
    pub step_seconds: Vec<f64>,
}

impl DuoRun {
    /// The gates per layer and query head (a group's gate on each of its heads).
    pub fn per_head(&self) -> Vec<Vec<f64>> {
        (0..self.layers)
            .map(|l| {
                (0..self.groups * self.per)
                    .map(|h| self.state.log_alpha[l * self.groups + h / self.per] as f64)
                    .collect()
            })
            .collect()
    }
}

/// Trains the gates of `v`'s decoder-only model on passkey sequences built from `data`.
pub fn train(v: &View, data: &Dataset, o: &DuoOptions, hooks: Hooks) -> Result<DuoRun, AnalysisError> {
    let f = o.run().who;
    o.validate().map_err(AnalysisError::Input)?;
    let m = &v.model;
    if !m.decoder_only() {
        return Err(AnalysisError::Input(format!("{f}: {} is not a decoder-only model: DuoAttention's gates mix the attention of a decoder that keeps a key/value cache", m.name())));
    }
    if v.streaming.is_some() {
        return Err(AnalysisError::Input(format!(
            "{f}: this view has streaming heads already; train the gates on the model without them"
        )));
    }
    if !m.removed.is_empty() {
        return Err(AnalysisError::Input(format!(
            "{f}: {} had heads removed by prune_heads; train on the original",
            m.name()
        )));
    }
    m.refuse_headless(Kind::Dec, &format!("{f} (its gates cover every layer's key/value groups)"))?;
    let shape = m.kind_shape(Kind::Dec)?;
    let (layers, heads) = (shape.n_layers, shape.n_heads);
    let per = v.group_size(Kind::Dec, 0);
    if (0..layers).any(|l| v.group_size(Kind::Dec, l) != per) || heads % per != 0 {
        return Err(AnalysisError::Input(format!("{f}: {} has layers of different key/value grouping", m.name())));
    }
    let groups = heads / per;
    let n = layers * groups;
    // The training set: passkeys in the data's text (kv_curve's construction).
    crate::analysis::streaming::passkey_room(f, o.needle, o.context)?;
    let texts = chunks(m, data, o.context).map_err(|e| match e {
        AnalysisError::Input(s) => AnalysisError::Input(s.replacen("kv_curve", f, 1)),
        e => e,
    })?;
    let seqs: Vec<Vec<i64>> = passkeys_in(m, (f, "samples"), &texts, o.samples, o.needle, o.context, o.seed)?
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    let dev = m.device();
    let base = v.gates()?;
    let t = o.context;
    let answer = o.needle as i64;
    // The model's own last hidden states over each answer, computed once.
    let mut targets: Vec<Option<Tensor>> = (0..seqs.len()).map(|_| None).collect();
    let ckpt = match &o.checkpoint {
        Some(dir) => {
            let identity = json!({
                "model": m.name(),
                "family": m.family.to_string(),
                "gated": [format!("dec {layers}x{groups} key/value groups")],
                "dataset": data.name,
                "sentences": data.len(),
                "options": o.echo().into_iter().filter(|(k, _)| !matches!(k.as_str(), "steps" | "save_every")).map(|(k, v)| (k, Value::String(crate::output::echo_text(&v)))).collect::<serde_json::Map<_, _>>(),
            });
            Some(Checkpoint::open_run(dir, o.run(), identity, n, o.resume).map_err(AnalysisError::Input)?)
        }
        None => None,
    };
    let resumed = match &ckpt {
        Some(c) if o.resume => c.load().map_err(AnalysisError::Input)?,
        _ => None,
    };
    let resumed_from = resumed.as_ref().map(|s| s.step);
    // Every group starts full: DuoAttention's gates at 1, PruLong's log_alpha at 3 (P(g != 0)
    // about 0.99).
    let init = if o.method == Method::Duo { 1.0 } else { 3.0 };
    let mut state = resumed.unwrap_or_else(|| TrainState {
        step: 0,
        log_alpha: vec![init; n],
        adam_m: vec![0.0; n],
        adam_v: vec![0.0; n],
        curve: vec![],
        lagrange: [0.0; 2],
    });
    if let Some(c) = &ckpt {
        if state.step == 0 {
            c.save(&state).map_err(AnalysisError::Input)?;
        }
    }
    let mut step_seconds = Vec::new();
    while state.step < o.steps {
        let started = std::time::Instant::now();
        if (hooks.stop)() {
            if let Some(c) = &ckpt {
                c.save(&state).map_err(AnalysisError::Input)?;
            }
            return Err(ModelError::Interrupted.into());
        }
        let step = state.step;
        let rows: Vec<usize> = (0..o.batch).map(|i| batch_at(o.seed, step * o.batch + i, seqs.len())).collect();
        for &r in &rows {
            if targets[r].is_none() && o.method == Method::Duo {
                let _g = tch::no_grad_guard();
                let ids = Tensor::from_slice(&seqs[r]).view([1, t]).to_device(dev);
                let mask = Tensor::ones([1, t], (DType::Float, dev));
                targets[r] =
                    Some(m.net.encode(&ids, &mask, &base, None)?.narrow(1, t - answer, answer).to_kind(DType::Float));
            }
        }
        let flat: Vec<i64> = rows.iter().flat_map(|&r| seqs[r].iter().copied()).collect();
        let ids = Tensor::from_slice(&flat).view([rows.len() as i64, t]).to_device(dev);
        let mask = Tensor::ones([rows.len() as i64, t], (DType::Float, dev));
        let alpha = Tensor::from_slice(&state.log_alpha).to_device(dev).set_requires_grad(true);
        // The gate of each group: DuoAttention's alpha itself; PruLong's a Hard Concrete sample
        // (noise from (seed, step), drawn on the CPU).
        let gate = match o.method {
            Method::Duo => alpha.shallow_clone(),
            Method::PruLong { concrete, .. } => {
                tch::manual_seed(super::mix(o.seed, step as u64) as i64);
                let u = Tensor::rand([n as i64], (DType::Float, tch::Device::Cpu)).to_device(dev)
                    * (1.0 - 2.0 * concrete.eps)
                    + concrete.eps;
                concrete.sample(&alpha, &u)
            }
        };
        let per_head = gate
            .view([layers as i64, groups as i64, 1])
            .expand([layers as i64, groups as i64, per as i64], false)
            .reshape([layers as i64, heads as i64]);
        let mut gates = base.share();
        gates.duo = Some(std::rc::Rc::new(Duo { alpha: per_head, sink: o.sink, recent: o.recent }));
        let states = match m.net.encode(&ids, &mask, &gates, None) {
            Err(ModelError::Interrupted) => {
                if let Some(c) = &ckpt {
                    c.save(&state).map_err(AnalysisError::Input)?;
                }
                return Err(ModelError::Interrupted.into());
            }
            r => r?,
        };
        let (loss, penalty, total) = match o.method {
            Method::Duo => {
                let want = Tensor::cat(
                    &rows
                        .iter()
                        .map(|&r| targets[r].as_ref().map_or_else(Tensor::new, |x| x.shallow_clone()))
                        .collect::<Vec<_>>(),
                    0,
                );
                let got = states.narrow(1, t - answer, answer).to_kind(DType::Float);
                let loss = (&got - &want).pow_tensor_scalar(2).mean(DType::Float);
                let penalty = alpha.abs().mean(DType::Float);
                let total = &loss + &penalty * o.lambda;
                (loss, penalty, total)
            }
            Method::PruLong { target, concrete } => {
                // The next-token loss of the answer's tokens after its first.
                let logp = m.log_probs(&states.narrow(1, t - answer, answer - 1), DType::Float)?;
                let loss =
                    crate::model::loss::nll(&logp, &ids.narrow(1, t - answer + 1, answer - 1)).mean(DType::Float);
                let frac = concrete.p_open(&alpha).mean(DType::Float);
                let penalty = match target {
                    None => &frac * o.lambda,
                    Some(tf) => {
                        // Sheared-LLaMA's Lagrangian on the expected fraction kept full.
                        let d = &frac - tf;
                        let pen = &d * state.lagrange[0] + d.square() * state.lagrange[1];
                        let g = d.double_value(&[]);
                        state.lagrange[0] += o.lr * g;
                        state.lagrange[1] += o.lr * g * g;
                        pen
                    }
                };
                let total = &loss + &penalty;
                (loss, penalty, total)
            }
        };
        total.backward();
        let grad = host32(&alpha.grad())?;
        // Adam; DuoAttention's gates then clipped to [0, 1] (its clamp).
        state.adam(&grad, o.lr, step + 1, (o.method == Method::Duo).then_some((0.0, 1.0)));
        state.step += 1;
        step_seconds.push(started.elapsed().as_secs_f64());
        // DuoAttention: the sum of the gates and those >= 0.5; PruLong: the expected number of
        // full groups and those whose evaluation mask is 1 (log_alpha > 0).
        let (sum, open) = match o.method {
            Method::Duo => {
                (state.log_alpha.iter().map(|&a| a as f64).sum(), state.log_alpha.iter().filter(|&&a| a >= 0.5).count())
            }
            Method::PruLong { concrete, .. } => (
                concrete.p_open(&Tensor::from_slice(&state.log_alpha)).sum(DType::Double).double_value(&[]),
                state.log_alpha.iter().filter(|&&a| a > 0.0).count(),
            ),
        };
        let point = CurvePoint {
            step: state.step,
            loss: loss.double_value(&[]),
            penalty: penalty.double_value(&[]),
            expected_open: sum,
            open,
            eval: None,
        };
        (hooks.progress)(&point, o.steps);
        state.curve.push(point);
        if state.step % o.save_every == 0 || state.step == o.steps {
            if let Some(c) = &ckpt {
                c.save(&state).map_err(AnalysisError::Input)?;
            }
        }
    }
    Ok(DuoRun { state, options: o.clone(), groups, per, layers, resumed_from, step_seconds })
}
