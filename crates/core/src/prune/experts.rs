//! Hard Concrete gates with an L0 penalty on experts (docs/methods.md#expert-l0), as
//! [`super`] trains them on heads: one `log_alpha` per expert, a gate sampled per expert and
//! step multiplying the expert's router weight at every token (an [`ExpertEdit`] at
//! `mlp.hook_router_weights`), and an Adam step on `log_alpha` for
//! `objective + lambda * sum P(g != 0)`. The objective is the next-token loss on the data
//! (`"loss"`) or the KL divergence from the ungated model's next-token distribution (`"kl"`).
//! The run is a pure function of (model, data, options): step `t`'s batch and noise come
//! from `(seed, t)`.

use super::{permutation, Concrete, EvalGates, TrainState};
use crate::analysis::experts::{experts_over, ExpertEdit, ExpertId};
use crate::analysis::importance::uniform;
use crate::analysis::AnalysisError;
use crate::data::Dataset;
use crate::model::nn::Gates;
use crate::model::{Model, ModelError};
use tch::{Device, Kind as DType, Tensor};

options_enum!(ExpertObjective, "objective", {
    /// The next-token loss on the data.
    Loss = "loss",
    /// KL(ungated || gated) of the next-token distributions, per token.
    Kl = "kl",
});

#[derive(Debug, Clone)]
pub struct ExpertL0Options {
    pub lambda: f64,
    pub steps: usize,
    pub lr: f64,
    pub batch_tokens: usize,
    pub seed: u64,
    /// Initial `log_alpha` of every gate.
    pub init: f64,
    pub objective: ExpertObjective,
}

/// A finished run: per stack layer the experts' numbers and their gates (empty rows for a
/// dense layer), the experts the binary evaluation gates close, and per step the objective and
/// the expected number of open experts.
pub struct ExpertL0 {
    pub ids: Vec<Vec<usize>>,
    pub log_alpha: Vec<Vec<f64>>,
    pub p_open: Vec<Vec<f64>>,
    pub closed: Vec<ExpertId>,
    pub curve: Vec<(usize, f64, f64)>,
}

/// Trains the gates of every expert of `model` on `data` (docs/methods.md#expert-l0).
pub fn expert_l0(
    model: &Model,
    data: &Dataset,
    opts: &ExpertL0Options,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ExpertL0, AnalysisError> {
    let ids = experts_over(model, data)?;
    if !model.is_lm() {
        return Err(AnalysisError::Input(format!(
            "expert L0 gates train on a language model's next-token predictions, and {} is not one",
            model.name()
        )));
    }
    let n: usize = ids.iter().map(Vec::len).sum();
    let prepared = model.prepare(&data.texts(), None, true, opts.batch_tokens, &Gates::none())?;
    let nb = prepared.batches.len();
    let concrete = Concrete::default();
    let dev = model.device();
    let mut state = TrainState {
        step: 0,
        log_alpha: vec![opts.init as f32; n],
        adam_m: vec![0.0; n],
        adam_v: vec![0.0; n],
        curve: vec![],
        lagrange: [0.0; 2],
    };
    let mut curve = Vec::new();
    let split = |flat: &Tensor| -> Vec<(usize, Tensor)> {
        let mut at = 0;
        ids.iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .map(|(l, r)| {
                let g = flat.narrow(0, at, r.len() as i64).view([1, 1, -1]);
                at += r.len() as i64;
                (l, g)
            })
            .collect()
    };
    for t in 0..opts.steps {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let order = permutation(nb, opts.seed.wrapping_add((t / nb) as u64));
        let b = &prepared.batches[order[t % nb]];
        let eps = concrete.eps;
        let u: Vec<f32> = (0..n).map(|i| uniform(opts.seed, t as u64, i as u64).clamp(eps, 1.0 - eps) as f32).collect();
        let u = Tensor::from_slice(&u).to_device(dev);
        let la = Tensor::from_slice(&state.log_alpha).to_device(dev).set_requires_grad(true);
        let gates = concrete.sample(&la, &u);
        let (targets, tm) = b.targets.as_ref().ok_or(ModelError::NoOutputHead)?;
        let states = |edit: Option<&mut ExpertEdit>| -> Result<Tensor, ModelError> {
            let h = edit.map(|e| e as &mut dyn crate::model::hooks::Hooks);
            let enc = model.net.encode(&b.ids, &b.mask, &Gates::none(), h)?;
            model.log_probs(&model.teacher_states(&enc, &b.mask, targets, &Gates::none())?, DType::Float)
        };
        let mut edit = ExpertEdit::gated(model, split(&gates));
        let logp = states(Some(&mut edit))?;
        let tokens = tm.sum(DType::Float).clamp_min(1.0);
        let per_token = match opts.objective {
            ExpertObjective::Loss => crate::model::loss::nll(&logp, targets),
            ExpertObjective::Kl => {
                let full = {
                    let _g = tch::no_grad_guard();
                    states(None)?
                };
                (full.exp() * (&full - &logp)).sum_dim_intlist([-1i64].as_slice(), false, DType::Float)
            }
        };
        let objective = (per_token * tm).sum(DType::Float) / tokens;
        let open = concrete.p_open(&la).sum(DType::Float);
        let total = &objective + &open * opts.lambda;
        let grad = Tensor::f_run_backward(&[total], &[&la], false, false).map_err(ModelError::from)?;
        let g = Vec::<f32>::try_from(grad[0].to_device(Device::Cpu).to_kind(DType::Float)).map_err(ModelError::from)?;
        state.adam(&g, opts.lr, t + 1, None);
        state.step = t + 1;
        curve.push((t + 1, objective.double_value(&[]), open.double_value(&[])));
        progress(t + 1, opts.steps);
    }
    let la = Tensor::from_slice(&state.log_alpha);
    let flat = |t: Tensor| Vec::<f64>::try_from(t.to_kind(DType::Double)).map_err(ModelError::from);
    let (la64, p, eval) =
        (flat(la.shallow_clone())?, flat(concrete.p_open(&la))?, flat(concrete.eval(&la, EvalGates::Binary))?);
    let (mut log_alpha, mut p_open, mut closed, mut at) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for (l, r) in ids.iter().enumerate() {
        log_alpha.push(la64[at..at + r.len()].to_vec());
        p_open.push(p[at..at + r.len()].to_vec());
        for (i, &e) in r.iter().enumerate() {
            if eval[at + i] == 0.0 {
                closed.push(ExpertId { layer: l, expert: e });
            }
        }
        at += r.len();
    }
    Ok(ExpertL0 { ids, log_alpha, p_open, closed, curve })
}
