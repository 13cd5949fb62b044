//! The task loss (docs/methods.md#task-loss), one definition for everything that measures or
//! trains on it: the ablation metrics, gradient importance and pruning. Which tokens are the
//! targets (next tokens, references, the model's own greedy output) is decided once, by
//! `Model::prepare` (`model::batch`).

use super::{Model, ModelError};
use tch::{Kind as DType, Tensor};

impl Model {
    /// Log-probabilities `[.., V]` of the final states `[.., D]` (the output projection and
    /// log-softmax computed in `dtype`).
    pub fn log_probs(&self, states: &Tensor, dtype: DType) -> Result<Tensor, ModelError> {
        let out = self.net.output.as_ref().ok_or(ModelError::NoOutputHead)?;
        let (w, b) = if out.w.kind() == dtype { (out.w.shallow_clone(), out.b.as_ref().map(|b| b.shallow_clone())) } else { (out.w.to_kind(dtype), out.b.as_ref().map(|b| b.to_kind(dtype))) };
        Ok(states.f_to_kind(dtype)?.f_linear(&w, b.as_ref())?.log_softmax(-1, dtype))
    }

    /// The task loss of one batch under `gates`: the mean over its target tokens (mask `tm`) of
    /// `-log p(y_t | context)`, float32, differentiable in the gates and weights. `enc` is the
    /// stack's output of the batch (`ids` with key mask `mask`), `targets` its targets.
    pub fn task_loss(&self, enc: &Tensor, mask: &Tensor, targets: &Tensor, tm: &Tensor, gates: &super::nn::Gates) -> Result<Tensor, ModelError> {
        let logp = self.log_probs(&self.teacher_states(enc, mask, targets, gates)?, DType::Float)?;
        let tm = tm.to_kind(DType::Float);
        Ok((nll(&logp, targets) * &tm).sum(DType::Float) / tm.sum(DType::Float))
    }
}

/// `-log p(label)` at every position: `logp [.., V]`, `labels [..]`.
pub fn nll(logp: &Tensor, labels: &Tensor) -> Tensor {
    -logp.gather(-1, &labels.unsqueeze(-1), false).squeeze_dim(-1)
}
