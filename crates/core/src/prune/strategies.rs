//! Pruning strategies side by side (docs/methods.md#pruning-strategies): on one model, one
//! training set, one evaluation set and one seed, each strategy removes the same numbers of
//! heads (or whole attention sublayers), and every result is evaluated the same way (the
//! ablation metric: a language model's next-token loss, an encoder's cosine distance to its
//! unpruned pooled states). Nothing here prints.

use super::{train, Distill, Hooks, PruneOptions, TrainData};
use crate::analysis::ablation::{self, Metric};
use crate::analysis::AnalysisError;
use crate::data::Dataset;
use crate::model::hooks::{At, Point, Record};
use crate::model::nn::{Bypass, Gates, NormPosition};
use crate::model::{HeadId, Kind, Model, ModelError};
use std::sync::Arc;
use tch::{Device, Kind as DType, Tensor};

options_enum!(Strategy, "strategy", {
    /// Hard Concrete gates with the L0 penalty `lambda` (one run), heads ranked by `log_alpha`.
    HardConcrete = "hard_concrete",
    /// Sheared-LLaMA's targeted L0: one run per fraction held to its count by a Lagrangian.
    TargetedL0 = "targeted_l0",
    /// Michel et al.'s iterative pruning: the least important heads removed a step at a time,
    /// importance re-estimated on the pruned model between steps.
    Michel = "michel",
    /// Michel et al.'s importance estimated once.
    Importance = "importance",
    /// HARP (Liu & Liu 2025): the top layers' attention bypassed, each rescaled.
    Harp = "harp",
    /// He et al. 2024: whole attention sublayers dropped, the most similar input/output first.
    SublayerCosine = "sublayer_cosine",
    /// Heads drawn at random: the mean and spread over seeds.
    Random = "random",
});

/// Every strategy, in the order a table lists them.
pub const STRATEGIES: [Strategy; 7] = [
    Strategy::HardConcrete,
    Strategy::TargetedL0,
    Strategy::Michel,
    Strategy::Importance,
    Strategy::Harp,
    Strategy::SublayerCosine,
    Strategy::Random,
];

impl Strategy {
    /// Whether the strategy removes whole attention sublayers (a fraction of layers).
    pub fn by_layer(self) -> bool {
        matches!(self, Strategy::Harp | Strategy::SublayerCosine)
    }
}

#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Fractions of heads removed, each in (0, 1).
    pub fractions: Vec<f64>,
    pub strategies: Vec<Strategy>,
    /// Draws of the random baseline.
    pub seeds: usize,
    /// Hard Concrete and targeted L0's training (`lambda`, `steps`, `lr`, `seed`,
    /// `batch_tokens`, `kinds` = the model's self-attention kind).
    pub prune: PruneOptions,
    /// Michel's step: the fraction of all heads removed per iteration.
    pub michel_step: f64,
    /// HARP's candidate scales, searched per layer.
    pub harp_alphas: Vec<f64>,
}

impl CompareOptions {
    pub fn validate(&self) -> Result<(), String> {
        let f = "prune_compare";
        if self.fractions.is_empty() || self.fractions.iter().any(|&x| !(x > 0.0 && x < 1.0)) {
            return Err(format!("{f}: fractions must be numbers in (0, 1), got {:?}", self.fractions));
        }
        if self.strategies.is_empty() {
            return Err(format!("{f}: strategies is empty"));
        }
        if self.seeds == 0 {
            return Err(format!("{f}: seeds must be at least 1, got 0"));
        }
        if !(self.michel_step > 0.0 && self.michel_step <= 1.0) {
            return Err(format!("{f}: michel_step must be in (0, 1], got {}", self.michel_step));
        }
        if self.harp_alphas.is_empty() || self.harp_alphas.iter().any(|a| !a.is_finite()) {
            return Err(format!("{f}: harp_alphas must be a non-empty list of numbers, got {:?}", self.harp_alphas));
        }
        self.prune.validate().map_err(|e| e.replacen("prune:", &format!("{f}:"), 1))
    }
}

/// One strategy at one fraction.
#[derive(Debug, Clone)]
pub struct Row {
    pub strategy: Strategy,
    pub fraction: f64,
    pub heads_removed: usize,
    /// Attention sublayers removed (layer strategies).
    pub layers_removed: Option<usize>,
    /// The metric on the evaluation data (random: the mean over seeds).
    pub value: f64,
    /// The random baseline's sample standard deviation, min and max over seeds.
    pub spread: Option<(f64, f64, f64)>,
    /// What was removed: heads (random: the first seed's), or HARP's `(layer, alpha)`s.
    pub removed: Vec<HeadId>,
    pub harp: Vec<(usize, f64)>,
    /// Seconds the strategy took to choose (shared work, such as one training run for every
    /// fraction, is counted at its first fraction).
    pub seconds: f64,
}

pub struct Comparison {
    pub rows: Vec<Row>,
    pub metric: Metric,
    /// The unpruned model's metric on the evaluation data.
    pub full: f64,
    pub kind: Kind,
    pub n_layers: usize,
    pub n_heads: usize,
}

struct Ctx<'a> {
    model: &'a Model,
    kind: Kind,
    layers: usize,
    heads: usize,
    eval: ablation::Prepared,
    stop: &'a dyn Fn() -> bool,
}

impl Ctx<'_> {
    fn n(&self) -> usize {
        self.layers * self.heads
    }
    fn head(&self, i: usize) -> HeadId {
        HeadId { kind: self.kind, layer_idx: i / self.heads, head: i % self.heads }
    }
    fn closing(&self, removed: &[HeadId]) -> Result<f64, AnalysisError> {
        let g = self.model.gates_closing(removed)?;
        ablation::evaluate(self.model, &self.eval, &g, self.stop)
    }
    fn count(&self, f: f64) -> usize {
        ((f * self.n() as f64).round() as usize).min(self.n())
    }
    fn layer_count(&self, f: f64) -> usize {
        ((f * self.layers as f64).round() as usize).min(self.layers)
    }
    fn layer_heads(&self, layers: &[usize]) -> Vec<HeadId> {
        layers
            .iter()
            .flat_map(|&l| (0..self.heads).map(move |h| HeadId { kind: self.kind, layer_idx: l, head: h }))
            .collect()
    }
}

/// The first `k` of `order` (lowest first).
fn lowest(order: &[usize], k: usize) -> Vec<usize> {
    order.iter().copied().take(k).collect()
}

/// Indices sorted by `score` ascending (ties: the earlier head first); NaN last.
fn ascending(score: &[f64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..score.len()).collect();
    idx.sort_by(|&a, &b| {
        let (x, y) = (score[a], score[b]);
        match (x.is_nan(), y.is_nan()) {
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            _ => x.total_cmp(&y).then(a.cmp(&b)),
        }
    });
    idx
}

/// Michel et al.'s importance of every head of `kind` over the training batches, with the
/// heads of `closed` held closed: per sentence `|d L / d g_h|` summed, `L` the batch's task
/// loss (a language model's next-token loss, an encoder's cosine distillation).
fn importance(
    model: &Model,
    kind: Kind,
    td: &mut TrainData,
    closed: &[HeadId],
    stop: &dyn Fn() -> bool,
) -> Result<Vec<f64>, AnalysisError> {
    let s = model.kind_shape(kind)?;
    let (l, h) = (s.n_layers as i64, s.n_heads as i64);
    let dev = model.device();
    let mut mask = vec![1f32; (l * h) as usize];
    for c in closed.iter().filter(|c| c.kind == kind) {
        mask[c.layer_idx * s.n_heads + c.head] = 0.0;
    }
    let mask = Tensor::from_slice(&mask).view([1, l, h]).to_device(dev);
    let mut sum = Tensor::zeros([l, h], (DType::Double, dev));
    for bi in 0..td.prep.batches.len() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let rows = td.prep.batches[bi].ids.size()[0];
        let leaf = Tensor::ones([rows, l, h], (DType::Float, dev)).set_requires_grad(true);
        let mut gates = Gates::none();
        gates.multiply(kind, &leaf * &mask);
        let loss = super::task_loss(model, model, td, bi, &gates, Distill::Cosine)?;
        let grad = Tensor::f_run_backward(&[loss], &[leaf], false, false).map_err(ModelError::from)?;
        sum += grad[0].to_kind(DType::Double).abs().sum_dim_intlist([0i64].as_slice(), false, DType::Double);
    }
    let v = Vec::<f64>::try_from(sum.to_device(Device::Cpu).reshape([-1])).map_err(ModelError::from)?;
    // Closed heads have no importance left: NaN, so they sort last and are never chosen again.
    Ok(v.into_iter()
        .enumerate()
        .map(|(i, x)| {
            if closed.contains(&HeadId { kind, layer_idx: i / s.n_heads, head: i % s.n_heads }) {
                f64::NAN
            } else {
                x
            }
        })
        .collect())
}

/// He et al.'s similarity of each attention sublayer's input and output: the mean over real
/// tokens of `cos(resid_pre, resid_mid)` (the residual stream before and after the attention
/// block) over the training batches. A parallel-residual layer (GPT-NeoX, Phi) has no
/// `resid_mid` on its path; the model says what its attention alone leaves
/// (`Transformer::after_attention`).
fn sublayer_similarity(
    model: &Model,
    td: &TrainData,
    layers: usize,
    stop: &dyn Fn() -> bool,
) -> Result<Vec<f64>, AnalysisError> {
    let mut sums = vec![0f64; layers];
    let mut count = 0f64;
    let _g = tch::no_grad_guard();
    let parallel: Vec<bool> = model.net.stack.iter().map(|l| l.norm_position() == NormPosition::Parallel).collect();
    let cosine = |p: &Tensor, a: &Tensor| {
        Tensor::cosine_similarity(&p.to_kind(DType::Double), &a.to_kind(DType::Double), -1, 1e-8)
    };
    for b in &td.prep.batches {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let mut pre: Vec<Option<Tensor>> = (0..layers).map(|_| None).collect();
        let mut cos: Vec<Option<Tensor>> = (0..layers).map(|_| None).collect();
        let mut on = |at: At, a: &Tensor| -> Result<(), ModelError> {
            match at.point {
                Point::ResidPre => pre[at.layer] = Some(a.shallow_clone()),
                Point::AttnOut if parallel.get(at.layer).copied().unwrap_or(false) => {
                    if let Some(p) = pre[at.layer].take() {
                        if let Some(after) = model.net.after_attention(at.layer, &p, a)? {
                            cos[at.layer] = Some(cosine(&p, &after));
                        }
                    }
                }
                Point::ResidMid => {
                    if let Some(p) = pre[at.layer].take() {
                        cos[at.layer] = Some(cosine(&p, a));
                    }
                }
                _ => {}
            }
            Ok(())
        };
        let mut rec = Record::new(&[Point::ResidPre, Point::AttnOut, Point::ResidMid], &mut on);
        let _ = model.net.encode(&b.ids, &b.mask, &td.prep.base, Some(&mut rec))?;
        let m = b.mask.to_kind(DType::Double);
        count += m.sum(DType::Double).double_value(&[]);
        for (l, c) in cos.iter().enumerate() {
            let c = c
                .as_ref()
                .ok_or_else(|| ModelError::Invalid(format!("prune_compare: layer {l} has no resid_mid hook point")))?;
            sums[l] += (c * &m).sum(DType::Double).double_value(&[]);
        }
    }
    Ok(sums.into_iter().map(|s| s / count.max(1.0)).collect())
}

/// The gates of HARP's bypassed layers.
fn harp_gates(kind: Kind, width: usize, chosen: &[(usize, f64)]) -> Gates {
    let mut g = Gates::none();
    g.bypass =
        Some(Arc::new(chosen.iter().map(|&(layer_idx, alpha)| Bypass { kind, layer_idx, alpha, width }).collect()));
    g
}

/// Runs every strategy of `o` on `model`'s self-attention heads: chosen on `data`, evaluated on
/// `eval`. `progress(done, total)` after each evaluation.
pub fn compare(
    model: &Model,
    data: &Dataset,
    eval: &Dataset,
    o: &CompareOptions,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Comparison, AnalysisError> {
    let f = "prune_compare";
    o.validate().map_err(AnalysisError::Input)?;
    let kind = if model.decoder_only() {
        Kind::Dec
    } else if model.net.decoder.is_empty() {
        Kind::Enc
    } else {
        return Err(AnalysisError::Input(format!("{f}: {} is an encoder-decoder; the strategies compare the self-attention heads of decoder-only and encoder-only models", model.name())));
    };
    if !model.removed.is_empty() {
        return Err(AnalysisError::Input(format!(
            "{f}: {} had heads removed by prune_heads; compare on the original",
            model.name()
        )));
    }
    model.refuse_headless(kind, &format!("{f} (the strategies rank every layer's heads)"))?;
    let shape = model.kind_shape(kind)?;
    let metric = if model.has_task_loss() { Metric::Loss } else { Metric::Cosine };
    let prep = ablation::prepare(model, eval, metric, o.prune.batch_tokens, Gates::none())?;
    let cx = Ctx { model, kind, layers: shape.n_layers, heads: shape.n_heads, eval: prep, stop };
    let full = ablation::evaluate(model, &cx.eval, &Gates::none(), stop)?;
    let mut td = TrainData::new(model, data, o.prune.batch_tokens, Gates::none())?;
    let mut fr = o.fractions.clone();
    fr.sort_by(|a, b| a.total_cmp(b));
    fr.dedup();
    let total = o.strategies.len() * fr.len();
    let mut done = 0;
    let mut rows = Vec::new();
    let mut push = |rows: &mut Vec<Row>, row: Row, progress: &mut dyn FnMut(&str, usize, usize)| {
        done += 1;
        progress(&row.strategy.to_string(), done, total);
        rows.push(row);
    };
    let row = |strategy, fraction, removed: Vec<HeadId>, value, seconds| Row {
        strategy,
        fraction,
        heads_removed: removed.len(),
        layers_removed: None,
        value,
        spread: None,
        removed,
        harp: vec![],
        seconds,
    };
    for &s in &o.strategies {
        let started = std::time::Instant::now();
        match s {
            Strategy::HardConcrete | Strategy::Importance => {
                let score = match s {
                    Strategy::HardConcrete => {
                        let po = PruneOptions {
                            kinds: vec![kind],
                            checkpoint: None,
                            resume: false,
                            eval_data: None,
                            joint: false,
                            target: None,
                            ..o.prune.clone()
                        };
                        let mut quiet = |_: &super::CurvePoint, _: usize| {};
                        let run = train(model, &[], data, &po, Hooks { stop, progress: &mut quiet })?;
                        run.state.log_alpha.iter().map(|&x| x as f64).collect::<Vec<_>>()
                    }
                    _ => importance(model, kind, &mut td, &[], stop)?,
                };
                let order = ascending(&score);
                let mut seconds = started.elapsed().as_secs_f64();
                for &x in &fr {
                    let removed: Vec<HeadId> = lowest(&order, cx.count(x)).into_iter().map(|i| cx.head(i)).collect();
                    let v = cx.closing(&removed)?;
                    push(&mut rows, row(s, x, removed, v, seconds), progress);
                    seconds = 0.0;
                }
            }
            Strategy::TargetedL0 => {
                for &x in &fr {
                    let t0 = std::time::Instant::now();
                    let k = cx.count(x);
                    let po = PruneOptions {
                        kinds: vec![kind],
                        checkpoint: None,
                        resume: false,
                        eval_data: None,
                        joint: false,
                        target: Some((cx.n() - k) as f64),
                        ..o.prune.clone()
                    };
                    let mut quiet = |_: &super::CurvePoint, _: usize| {};
                    let run = train(model, &[], data, &po, Hooks { stop, progress: &mut quiet })?;
                    let score: Vec<f64> = run.state.log_alpha.iter().map(|&x| x as f64).collect();
                    let removed: Vec<HeadId> = lowest(&ascending(&score), k).into_iter().map(|i| cx.head(i)).collect();
                    let v = cx.closing(&removed)?;
                    push(&mut rows, row(s, x, removed, v, t0.elapsed().as_secs_f64()), progress);
                }
            }
            Strategy::Michel => {
                let step = ((o.michel_step * cx.n() as f64).round() as usize).max(1);
                let mut closed: Vec<HeadId> = Vec::new();
                for &x in &fr {
                    let t0 = std::time::Instant::now();
                    let k = cx.count(x);
                    while closed.len() < k {
                        let score = importance(model, kind, &mut td, &closed, stop)?;
                        let take = step.min(k - closed.len());
                        let next: Vec<HeadId> =
                            lowest(&ascending(&score), take).into_iter().map(|i| cx.head(i)).collect();
                        closed.extend(next);
                    }
                    let v = cx.closing(&closed)?;
                    push(&mut rows, row(s, x, closed.clone(), v, t0.elapsed().as_secs_f64()), progress);
                }
            }
            Strategy::SublayerCosine => {
                let sim = sublayer_similarity(model, &td, cx.layers, stop)?;
                // The most similar (least changing) sublayers first.
                let order: Vec<usize> = ascending(&sim.iter().map(|x| -x).collect::<Vec<_>>());
                let mut seconds = started.elapsed().as_secs_f64();
                for &x in &fr {
                    let m = cx.layer_count(x);
                    let mut layers: Vec<usize> = order.iter().copied().take(m).collect();
                    layers.sort();
                    let removed = cx.layer_heads(&layers);
                    let v = cx.closing(&removed)?;
                    let mut r = row(s, x, removed, v, seconds);
                    r.layers_removed = Some(m);
                    push(&mut rows, r, progress);
                    seconds = 0.0;
                }
            }
            Strategy::Harp => {
                // Greedy from the top layer down: each layer's scale the candidate with the
                // lowest metric on the training data, the layers above already bypassed.
                let width = cx.heads;
                let train_prep = ablation::prepare(model, data, metric, o.prune.batch_tokens, Gates::none())?;
                let most = fr.iter().map(|&x| cx.layer_count(x)).max().unwrap_or(0);
                let mut chosen: Vec<(usize, f64)> = Vec::new();
                let mut at_count: Vec<(usize, f64)> = Vec::new();
                for j in 0..most {
                    let layer = cx.layers - 1 - j;
                    let mut best = (f64::INFINITY, o.harp_alphas[0]);
                    for &a in &o.harp_alphas {
                        let mut c = chosen.clone();
                        c.push((layer, a));
                        let v = ablation::evaluate(model, &train_prep, &harp_gates(kind, width, &c), stop)?;
                        if v < best.0 {
                            best = (v, a);
                        }
                    }
                    chosen.push((layer, best.1));
                    at_count.push((j + 1, started.elapsed().as_secs_f64()));
                }
                let mut last = 0.0;
                for &x in &fr {
                    let m = cx.layer_count(x);
                    let c: Vec<(usize, f64)> = chosen[..m].to_vec();
                    let v = ablation::evaluate(model, &cx.eval, &harp_gates(kind, width, &c), stop)?;
                    let upto = at_count.get(m.max(1) - 1).map_or(0.0, |p| p.1);
                    let mut layers: Vec<usize> = c.iter().map(|p| p.0).collect();
                    layers.sort();
                    let mut r = row(s, x, cx.layer_heads(&layers), v, upto - last);
                    last = upto;
                    r.layers_removed = Some(m);
                    r.harp = c;
                    push(&mut rows, r, progress);
                }
            }
            Strategy::Random => {
                for &x in &fr {
                    let t0 = std::time::Instant::now();
                    let k = cx.count(x);
                    let mut values = Vec::new();
                    let mut first = Vec::new();
                    for d in 0..o.seeds {
                        let perm = super::permutation(cx.n(), super::mix(o.prune.seed, d as u64));
                        let removed: Vec<HeadId> = perm[..k].iter().map(|&i| cx.head(i)).collect();
                        values.push(cx.closing(&removed)?);
                        if d == 0 {
                            first = removed;
                        }
                    }
                    let mean = values.iter().sum::<f64>() / values.len() as f64;
                    let sd = if values.len() > 1 {
                        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64).sqrt()
                    } else {
                        0.0
                    };
                    let (lo, hi) =
                        values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
                    let mut r = row(s, x, first, mean, t0.elapsed().as_secs_f64());
                    r.heads_removed = k;
                    r.spread = Some((sd, lo, hi));
                    push(&mut rows, r, progress);
                }
            }
        }
    }
    Ok(Comparison { rows, metric, full, kind, n_layers: cx.layers, n_heads: cx.heads })
}
