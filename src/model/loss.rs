//! The task loss (docs/methods.md#task-loss), one definition for everything that measures or
//! trains on it: the ablation metrics, gradient importance and pruning. Which tokens are the
//! targets (next tokens, references, the model's own greedy output) is decided once, by
//! `Model::prepare` (`model::batch`).

use super::{Model, ModelError};
use tch::{Kind as DType, Tensor};

/// The model's output head in one precision, converted once: loops that take log-probabilities
/// of many slices (the ablation metrics in float64) hold one instead of converting the
/// `[V, D]` matrix at every call.
pub struct OutputHead {
    w: Tensor,
    b: Option<Tensor>,
    dtype: DType,
    softcap: Option<f64>,
}

impl OutputHead {
    /// Log-probabilities `[.., V]` of the final states `[.., D]`, in the head's precision.
    pub fn log_probs(&self, states: &Tensor) -> Result<Tensor, ModelError> {
        let logits = super::nn::softcap(states.f_to_kind(self.dtype)?.f_linear(&self.w, self.b.as_ref())?, self.softcap);
        Ok(logits.log_softmax(-1, self.dtype))
    }

    /// The vocabulary size.
    pub fn vocab(&self) -> i64 {
        self.w.size()[0]
    }
}

impl Model {
    /// The output head in `dtype` (shared with the model's when it is already in `dtype`).
    pub fn output_head(&self, dtype: DType) -> Result<OutputHead, ModelError> {
        let out = self.net.output.as_ref().ok_or(ModelError::NoOutputHead)?;
        let (w, b) = if out.w.kind() == dtype { (out.w.shallow_clone(), out.b.as_ref().map(|b| b.shallow_clone())) } else { (out.w.f_to_kind(dtype)?, out.b.as_ref().map(|b| b.f_to_kind(dtype)).transpose()?) };
        Ok(OutputHead { w, b, dtype, softcap: self.net.logit_softcap })
    }

    /// Log-probabilities `[.., V]` of the final states `[.., D]` in `dtype`. The projection runs
    /// in the wider of `dtype` and the states' precision: a float64 model's logits stay float64
    /// before the float32 log-softmax of the task loss (float32 products would round
    /// differently with each batch's composition, and sharded merges must equal one run).
    pub fn log_probs(&self, states: &Tensor, dtype: DType) -> Result<Tensor, ModelError> {
        let work = if states.kind() == DType::Double { DType::Double } else { dtype };
        let logp = self.output_head(work)?.log_probs(states)?;
        Ok(if work == dtype { logp } else { logp.f_to_kind(dtype)? })
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
