//! Experts as units, as heads are (docs/methods.md#experts-as-units): an expert's output
//! zeroed where the router chose it, or the expert removed from routing (the router picks
//! among the others, renormalised as the family routes); the metric with each expert ablated
//! alone (a layers x experts grid), gradient importance of a gate on each expert's weight, the
//! router's statistics (load, weight, entropy, co-selection) and `prune_experts`, which removes
//! experts from the weights and equals routing around them.
//!
//! Every edit is a hook on the forward's two router points (`mlp.hook_router_logits`,
//! `mlp.hook_router_weights`): nothing here computes any part of the block.

use super::ablation::{self, MetricAcc, Prepared};
use super::AnalysisError;
use crate::data::Dataset;
use crate::model::experts::Experts;
use crate::model::hooks::{At, Hooks, Point};
use crate::model::nn::Gates;
use crate::model::{Kind, Model, ModelError};
use tch::{Device, Kind as DType, Tensor};

options_enum!(ExpertAblation, "ablation", {
    /// The expert's output zeroed where the router chose it (the other experts keep their
    /// weights: nothing is renormalised).
    Output = "output",
    /// The expert removed from routing: its router logit set to minus infinity, so the router
    /// picks among the others (what `prune_experts` computes).
    Route = "route",
});

pub use crate::model::experts::ExpertId;

/// The mixture of experts of stack layer `layer`, where its MLP is one.
pub fn layer_experts(model: &Model, layer: usize) -> Option<&Experts> {
    model.experts(layer)
}

/// Per stack layer, how many experts it had as loaded (0 for a dense layer): the width of a
/// layer's row in an expert grid.
fn loaded(model: &Model) -> Vec<usize> {
    (0..model.net.stack.len()).map(|l| layer_experts(model, l).map_or(0, Experts::loaded)).collect()
}

/// Per stack layer, the experts' numbers as loaded (empty for a dense layer).
pub fn expert_ids(model: &Model) -> Vec<Vec<usize>> {
    (0..model.net.stack.len()).map(|l| layer_experts(model, l).map_or(Vec::new(), |e| e.ids().to_vec())).collect()
}

/// The experts' numbers per stack layer ([`expert_ids`]) for an analysis over `data`: refuses
/// an empty dataset and a model without mixture-of-experts layers.
pub fn experts_over(model: &Model, data: &Dataset) -> Result<Vec<Vec<usize>>, AnalysisError> {
    if data.is_empty() {
        return Err(AnalysisError::Input(format!("the dataset {} is empty", data.name)));
    }
    let ids = expert_ids(model);
    if ids.iter().all(Vec::is_empty) {
        return Err(AnalysisError::Input(format!("{} has no mixture-of-experts layers", model.name())));
    }
    Ok(ids)
}

/// Per-layer values of the experts present, in router order, placed by the experts' numbers:
/// `[layer][expert]` as loaded, NaN for an expert removed, empty for a dense layer.
pub fn by_number(model: &Model, values: &[Vec<f64>]) -> Vec<Vec<f64>> {
    expert_ids(model)
        .iter()
        .zip(loaded(model))
        .enumerate()
        .map(|(l, (ids, width))| {
            let mut row = vec![f64::NAN; width];
            for (&e, &v) in ids.iter().zip(values.get(l).map_or(&[][..], |v| v.as_slice())) {
                row[e] = v;
            }
            row
        })
        .collect()
}

/// Refuses a model without experts, or an expert it does not have, in one line.
pub fn check_expert(model: &Model, id: ExpertId) -> Result<(), ModelError> {
    let ids = expert_ids(model);
    let Some(row) = ids.get(id.layer) else {
        return Err(ModelError::Invalid(format!(
            "expert {id}: layer {} out of range: {} has layers 0..{}",
            id.layer,
            model.name(),
            ids.len().saturating_sub(1)
        )));
    };
    if row.is_empty() {
        let moe: Vec<String> =
            ids.iter().enumerate().filter(|(_, r)| !r.is_empty()).map(|(l, _)| l.to_string()).collect();
        return Err(ModelError::Invalid(if moe.is_empty() {
            format!("{} has no mixture-of-experts layers (expert {id})", model.name())
        } else {
            format!(
                "expert {id}: layer {} of {} is dense (its expert layers: {})",
                id.layer,
                model.name(),
                moe.join(", ")
            )
        }));
    }
    if !row.contains(&id.expert) {
        let have = layer_experts(model, id.layer).map_or_else(String::new, Experts::describe_ids);
        return Err(ModelError::Invalid(format!("expert {id}: layer {} has experts {have}", id.layer)));
    }
    Ok(())
}

/// The router's column of each expert of `ids` in layer `layer` (its position among the
/// experts present).
fn columns(model: &Model, layer: usize, ids: &[usize]) -> Result<Tensor, ModelError> {
    let present = layer_experts(model, layer).map_or(&[][..], |e| e.ids());
    let cols: Vec<i64> =
        ids.iter()
            .map(|e| {
                present.iter().position(|p| p == e).map(|c| c as i64).ok_or_else(|| {
                    ModelError::Invalid(format!("expert {} is not present", ExpertId { layer, expert: *e }))
                })
            })
            .collect::<Result<_, _>>()?;
    Ok(Tensor::from_slice(&cols))
}

/// Expert edits on one run, as hooks on the router's points: experts routed around (their
/// logits minus infinity), experts whose output is zeroed (their weights zero), and gates
/// multiplying each expert's weights (`[B, 1, n]` per layer: importance's leaves, L0's
/// gates).
#[derive(Default)]
pub struct ExpertEdit {
    /// Per layer, the router columns set to minus infinity.
    route: Vec<(usize, Tensor)>,
    /// Per layer, the router columns whose weights are zeroed.
    zero: Vec<(usize, Tensor)>,
    /// Per layer, a gate `[B, 1, n]` multiplying the weights.
    gates: Vec<(usize, Tensor)>,
    kind: Option<Kind>,
}

impl ExpertEdit {
    /// The edit that ablates `experts` as `how` says.
    pub fn ablate(model: &Model, experts: &[ExpertId], how: ExpertAblation) -> Result<ExpertEdit, ModelError> {
        let mut by_layer: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for id in experts {
            check_expert(model, *id)?;
            by_layer.entry(id.layer).or_default().push(id.expert);
        }
        let mut edit = ExpertEdit { kind: Some(model.net.stack_kind), ..Default::default() };
        for (l, ids) in by_layer {
            if how == ExpertAblation::Route {
                let (present, k) = layer_experts(model, l).map_or((0, 0), |e| (e.ids().len(), e.top_k as usize));
                let mut distinct = ids.clone();
                distinct.sort();
                distinct.dedup();
                if present - distinct.len() < k {
                    return Err(ModelError::Invalid(format!(
                        "routing around {} experts of layer {l} leaves {}, fewer than the {k} it routes each token to",
                        distinct.len(),
                        present - distinct.len()
                    )));
                }
            }
            let cols = columns(model, l, &ids)?.to_device(model.device());
            match how {
                ExpertAblation::Route => edit.route.push((l, cols)),
                ExpertAblation::Output => edit.zero.push((l, cols)),
            }
        }
        Ok(edit)
    }

    /// The edit that multiplies layer `l`'s weights by `gates[l]` (`[B, 1, n]`), for every
    /// layer given.
    pub fn gated(model: &Model, gates: Vec<(usize, Tensor)>) -> ExpertEdit {
        ExpertEdit { gates, kind: Some(model.net.stack_kind), ..Default::default() }
    }

    fn find(v: &[(usize, Tensor)], layer: usize) -> Option<&Tensor> {
        v.iter().find(|(l, _)| *l == layer).map(|(_, t)| t)
    }
}

impl Hooks for ExpertEdit {
    fn wants(&self, at: At) -> bool {
        Some(at.kind) == self.kind
            && match at.point {
                Point::RouterLogits => Self::find(&self.route, at.layer).is_some(),
                Point::RouterWeights => {
                    Self::find(&self.zero, at.layer).is_some() || Self::find(&self.gates, at.layer).is_some()
                }
                _ => false,
            }
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        match at.point {
            Point::RouterLogits => match Self::find(&self.route, at.layer) {
                Some(cols) => Ok(Some(x.f_index_fill(-1, cols, f64::NEG_INFINITY)?)),
                None => Ok(None),
            },
            Point::RouterWeights => {
                let mut w = x.shallow_clone();
                if let Some(cols) = Self::find(&self.zero, at.layer) {
                    w = w.f_index_fill(-1, cols, 0.0)?;
                }
                if let Some(g) = Self::find(&self.gates, at.layer) {
                    w = w.f_mul(&g.f_to_kind(w.kind())?)?;
                }
                Ok(Some(w))
            }
            _ => Ok(None),
        }
    }
}

/// The metric of the model with `experts` ablated as `how` says (one edit for the whole
/// dataset), in additive form.
pub fn evaluate_ablated(
    model: &Model,
    p: &Prepared,
    experts: &[ExpertId],
    how: ExpertAblation,
    stop: &dyn Fn() -> bool,
) -> Result<MetricAcc, AnalysisError> {
    let mut edit = ExpertEdit::ablate(model, experts, how)?;
    ablation::evaluate_hooked(model, p, &p.base, Some(&mut edit), stop)
}

/// The metric with each expert ablated alone, `[layer][expert]` by the experts' numbers as
/// loaded (an empty row for a dense layer, NaN for an expert `prune_experts` removed), in
/// additive form; one pass over the data per expert.
pub fn expert_sweep_acc(
    model: &Model,
    p: &Prepared,
    how: ExpertAblation,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Vec<Option<MetricAcc>>>, AnalysisError> {
    let ids = expert_ids(model);
    let widths = loaded(model);
    let total: usize = ids.iter().map(Vec::len).sum();
    if total == 0 {
        return Err(AnalysisError::Input(format!("{} has no mixture-of-experts layers to sweep", model.name())));
    }
    let mut done = 0;
    let mut out: Vec<Vec<Option<MetricAcc>>> = widths.iter().map(|&w| vec![None; w]).collect();
    for (l, row) in ids.iter().enumerate() {
        for &e in row {
            out[l][e] = Some(evaluate_ablated(model, p, &[ExpertId { layer: l, expert: e }], how, stop)?);
            done += 1;
            progress(done, total);
        }
    }
    Ok(out)
}

/// [`expert_sweep_acc`]'s values.
pub fn expert_sweep(
    model: &Model,
    p: &Prepared,
    how: ExpertAblation,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Vec<f64>>, AnalysisError> {
    Ok(expert_sweep_acc(model, p, how, stop, progress)?
        .into_iter()
        .map(|row| row.into_iter().map(|a| a.map_or(f64::NAN, |a| a.value())).collect())
        .collect())
}

/// Gradient importance of every expert (docs/methods.md#experts-as-units): per sentence, a
/// gate `g` multiplying each expert's router weight at every token, and the mean over sentences
/// of `|dL/dg|` at `g = 1` (the sentence's mean next-token loss), `[layer][expert]` by the
/// experts' numbers (NaN for one removed). One forward and one backward per batch.
pub fn expert_importance(
    model: &Model,
    data: &Dataset,
    base: &Gates,
    batch_tokens: usize,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Vec<f64>>, AnalysisError> {
    let ids = experts_over(model, data)?;
    if !model.is_lm() {
        return Err(AnalysisError::Input(format!(
            "expert_importance measures a language model's next-token loss, and {} is not one",
            model.name()
        )));
    }
    let prepared = model.prepare(&data.texts(), None, true, batch_tokens, base)?;
    let dev = model.device();
    let mut sums: Vec<Option<Tensor>> =
        ids.iter().map(|r| (!r.is_empty()).then(|| Tensor::zeros([r.len() as i64], (DType::Double, dev)))).collect();
    let n_batches = prepared.batches.len();
    for (bi, b) in prepared.batches.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let rows = b.ids.size()[0];
        let leaves: Vec<(usize, Tensor)> = ids
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .map(|(l, r)| (l, Tensor::ones([rows, 1, r.len() as i64], (DType::Float, dev)).set_requires_grad(true)))
            .collect();
        let mut edit = ExpertEdit::gated(model, leaves.iter().map(|(l, t)| (*l, t.shallow_clone())).collect());
        let (t, tm) = b.targets.as_ref().ok_or(ModelError::NoOutputHead)?;
        let enc = model.net.encode(&b.ids, &b.mask, base, Some(&mut edit))?;
        let logp = model.log_probs(&model.teacher_states(&enc, &b.mask, t, base)?, DType::Float)?;
        let nll = crate::model::loss::nll(&logp, t);
        let per_sentence = (nll * tm).sum_dim_intlist([1i64].as_slice(), false, DType::Float)
            / tm.sum_dim_intlist([1i64].as_slice(), false, DType::Float).clamp_min(1.0);
        let tensors: Vec<Tensor> = leaves.iter().map(|(_, t)| t.shallow_clone()).collect();
        let grads = Tensor::f_run_backward(&[per_sentence.sum(DType::Float)], &tensors, false, false)
            .map_err(ModelError::from)?;
        for ((l, leaf), g) in leaves.iter().zip(grads) {
            if let Some(s) = sums[*l].as_mut() {
                // Every leaf multiplies its layer's weights, so each has a gradient (zero for an
                // expert no token chose); an undefined one is taken as zero.
                let g =
                    if g.defined() { g.to_kind(DType::Double).abs() } else { leaf.zeros_like().to_kind(DType::Double) };
                *s += g.sum_dim_intlist([0i64, 1].as_slice(), false, DType::Double);
            }
        }
        progress(bi + 1, n_batches);
    }
    let n = prepared.n_sentences as f64;
    let means = sums
        .into_iter()
        .map(|sum| match sum {
            Some(s) => Ok(Vec::<f64>::try_from(s.to_device(Device::Cpu))
                .map_err(ModelError::from)?
                .iter()
                .map(|x| x / n)
                .collect()),
            None => Ok(Vec::new()),
        })
        .collect::<Result<Vec<Vec<f64>>, AnalysisError>>()?;
    Ok(by_number(model, &means))
}

/// The router's statistics over a dataset, per expert layer (docs/methods.md#router-statistics).
#[derive(Debug, Clone, PartialEq)]
pub struct RouterStats {
    pub layer: usize,
    /// The experts' numbers, in the order of every per-expert vector here.
    pub experts: Vec<usize>,
    /// Real (unpadded) tokens routed.
    pub tokens: usize,
    /// Per expert, the fraction of tokens that chose it (the fractions sum to `top_k`).
    pub load: Vec<f64>,
    /// Per expert, its mean weight over all tokens (zero where it was not chosen).
    pub weight: Vec<f64>,
    /// The mean over tokens of the entropy (nats) of the router's softmax over every expert.
    pub entropy: f64,
    /// `[i][j]`: the fraction of tokens that chose both experts `i` and `j` (the diagonal is
    /// `load`).
    pub co_selection: Vec<Vec<f64>>,
}

/// Reads the router's two points on every expert layer, counting real tokens only.
struct RouterReader {
    kind: Kind,
    /// The batch's token mask `[B, T]` as float64.
    mask: Tensor,
    /// Per layer, the logits of the current batch (until its weights arrive).
    logits: Option<Tensor>,
    /// Per layer: tokens, chosen counts `[n]`, weight sums `[n]`, entropy sum, co-selection `[n, n]`.
    sums: std::collections::BTreeMap<usize, (f64, Tensor, Tensor, f64, Tensor)>,
}

impl Hooks for RouterReader {
    fn wants(&self, at: At) -> bool {
        at.kind == self.kind && matches!(at.point, Point::RouterLogits | Point::RouterWeights)
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        let _g = tch::no_grad_guard();
        let m = self.mask.f_reshape([-1, 1])?;
        let n = *x.size().last().unwrap_or(&0);
        let x = x.f_to_kind(DType::Double)?.f_reshape([-1, n])?;
        if at.point == Point::RouterLogits {
            self.logits = Some(x);
            return Ok(None);
        }
        let logits = self.logits.take().ok_or_else(|| ModelError::Invalid("router weights without logits".into()))?;
        let logp = logits.f_log_softmax(-1, DType::Double)?;
        // 0 * log 0 = 0 for an expert with probability 0.
        let plogp = logp.f_exp()?.f_mul(&logp.f_nan_to_num(0.0, Some(0.0), Some(0.0))?)?;
        let entropy = plogp.f_sum_dim_intlist([-1i64].as_slice(), true, DType::Double)?.f_neg()?.f_mul(&m)?;
        let chosen = x.f_ne(0.0)?.f_to_kind(DType::Double)?.f_mul(&m)?;
        let (tokens, entropy) =
            (m.f_sum(DType::Double)?.double_value(&[]), entropy.f_sum(DType::Double)?.double_value(&[]));
        let count = chosen.f_sum_dim_intlist([0i64].as_slice(), false, DType::Double)?;
        let weight = x.f_mul(&m)?.f_sum_dim_intlist([0i64].as_slice(), false, DType::Double)?;
        let co = chosen.f_transpose(0, 1)?.f_matmul(&chosen)?;
        match self.sums.get_mut(&at.layer) {
            Some(s) => {
                s.0 += tokens;
                s.1 = s.1.f_add(&count)?;
                s.2 = s.2.f_add(&weight)?;
                s.3 += entropy;
                s.4 = s.4.f_add(&co)?;
            }
            None => {
                self.sums.insert(at.layer, (tokens, count, weight, entropy, co));
            }
        }
        Ok(None)
    }
}

/// The router's statistics on every expert layer over `data` (every real token of every
/// sentence, the model as given by `base`).
pub fn router_stats(
    model: &Model,
    data: &Dataset,
    base: &Gates,
    batch_tokens: usize,
    stop: &dyn Fn() -> bool,
) -> Result<Vec<RouterStats>, AnalysisError> {
    let ids = experts_over(model, data)?;
    let prepared = model.prepare(&data.texts(), None, false, batch_tokens, base)?;
    let _g = tch::no_grad_guard();
    let mut r = RouterReader {
        kind: model.net.stack_kind,
        mask: Tensor::zeros([0], (DType::Double, Device::Cpu)),
        logits: None,
        sums: Default::default(),
    };
    for b in prepared.batches.iter() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        r.mask = b.mask.to_kind(DType::Double);
        let _ = model.net.encode(&b.ids, &b.mask, base, Some(&mut r))?;
    }
    let vec = |t: &Tensor| Vec::<f64>::try_from(t.to_device(Device::Cpu)).map_err(ModelError::from);
    let mut out = Vec::new();
    for (layer, (tokens, count, weight, entropy, co)) in r.sums {
        let n = tokens.max(1.0);
        let co = (0..co.size()[0])
            .map(|i| Ok(vec(&co.get(i))?.iter().map(|x| x / n).collect()))
            .collect::<Result<_, ModelError>>()?;
        out.push(RouterStats {
            layer,
            experts: ids[layer].clone(),
            tokens: tokens as usize,
            load: vec(&count)?.iter().map(|x| x / n).collect(),
            weight: vec(&weight)?.iter().map(|x| x / n).collect(),
            entropy: entropy / n,
            co_selection: co,
        });
    }
    Ok(out)
}

/// A fresh copy of `model` (reloaded from its files) without the experts `drop`: each layer's
/// router loses their rows and picks among the others, which equals routing around them
/// (docs/methods.md#experts-as-units). Refused where a layer would keep fewer experts than it
/// routes each token to, or the model was pruned already.
pub fn prune_experts(model: &Model, drop: &[ExpertId]) -> Result<Model, ModelError> {
    if model.pruned_physically() {
        return Err(ModelError::Invalid(format!(
            "{} was already pruned physically; prune the original model",
            model.name()
        )));
    }
    for id in drop {
        check_expert(model, *id)?;
    }
    let mut m = Model::load(&model.path, model.opts)?;
    m.id = model.id.clone();
    for l in 0..m.net.stack.len() {
        let gone: Vec<usize> = drop.iter().filter(|d| d.layer == l).map(|d| d.expert).collect();
        if gone.is_empty() {
            continue;
        }
        let experts = m.net.stack[l]
            .mlp_mut()
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<Experts>())
            .ok_or_else(|| ModelError::Invalid(format!("prune_experts: layer {l} has no experts")))?;
        experts.remove(&gone, l).map_err(|e| ModelError::Invalid(format!("prune_experts: {e}")))?;
    }
    m.n_params = m.count_params();
    Ok(m)
}
