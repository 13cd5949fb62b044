//! The unembedding: the one place logits are made (docs/methods.md#hook-points, `hook_logits`).
//!
//! Final states `[.., D]` go through the output projection and, where the model says so, the
//! final soft-cap (Gemma 2's `final_logit_softcapping`: `c * tanh(l / c)`), once; the result is
//! the hook point `hook_logits` (of `dec` on decoders, of the stack's kind otherwise). Generation,
//! `m.logits`, the task loss, patching's metric and LRP's seeds all take their logits here (one
//! arithmetic, one soft-cap). Hooks see `hook_logits` where a run hands them over:
//! `run_with_cache`, teacher-forced decoding and `Transformer::run` to `Stop::Logits`.

use super::hooks::{self, At, HookSlot, Point};
use super::transformer::Transformer;
use super::{Kind, ModelError};
use tch::{Kind as DType, Tensor};

/// The model's output head in one precision, converted once: loops that take
/// log-probabilities of many slices (the ablation metrics in float64) hold one instead of
/// converting the `[V, D]` matrix at every call.
pub struct OutputHead {
    w: Tensor,
    b: Option<Tensor>,
    dtype: DType,
    softcap: Option<f64>,
    at: At,
}

impl OutputHead {
    /// The projection alone, before a final soft-cap (the same as [`OutputHead::logits`] on a
    /// model without one): AttnLRP's seed (docs/methods.md#attnlrp).
    pub fn before_cap(&self, states: &Tensor) -> Result<Tensor, ModelError> {
        Ok(states.f_to_kind(self.dtype)?.f_linear(&self.w, self.b.as_ref())?)
    }

    /// Logits `[.., V]` of final states `[.., D]` in the head's precision: the projection,
    /// soft-capped where the model says so, then the hook point `hook_logits`.
    pub fn logits(&self, states: &Tensor, h: &mut HookSlot) -> Result<Tensor, ModelError> {
        let l = super::nn::softcap(self.before_cap(states)?, self.softcap);
        hooks::at(h, self.at, l)
    }

    /// Log-probabilities `[.., V]` of the final states `[.., D]`, in the head's precision.
    pub fn log_probs(&self, states: &Tensor, h: &mut HookSlot) -> Result<Tensor, ModelError> {
        Ok(self.logits(states, h)?.f_log_softmax(-1, self.dtype)?)
    }

    /// Log-probabilities `[.., V]` in `dtype` of logits taken in the head's precision: the
    /// ablation metrics' float32 products with the log-softmax accumulated in float64
    /// (docs/methods.md#masking-and-ablation).
    pub fn log_probs_in(&self, states: &Tensor, dtype: DType) -> Result<Tensor, ModelError> {
        Ok(self.logits(states, &mut None)?.f_log_softmax(-1, dtype)?)
    }

    /// The logits of the vocabulary entries `ids [R, k]` alone for final states `[R, D]`:
    /// `[R, k]`, what [`OutputHead::logits`] gives in those columns (soft-capped likewise), at
    /// `k` of its `V` products per row (a metric that reads two logits, as patching's logit
    /// difference, needs no more). No hook sees these columns: a run whose hooks ask for
    /// `hook_logits` takes the whole row through [`OutputHead::logits`].
    pub fn logits_of(&self, states: &Tensor, ids: &Tensor) -> Result<Tensor, ModelError> {
        let (r, k) = (ids.size()[0], ids.size()[1]);
        let flat = ids.f_reshape([-1])?;
        let rows = self.w.f_index_select(0, &flat)?.f_view([r, k, -1])?;
        let l = rows.f_matmul(&states.f_to_kind(self.dtype)?.f_unsqueeze(2)?)?.f_squeeze_dim(2)?;
        let l = match &self.b {
            Some(b) => l.f_add(&b.f_index_select(0, &flat)?.f_view([r, k])?)?,
            None => l,
        };
        Ok(super::nn::softcap(l, self.softcap))
    }

    /// The vocabulary size.
    pub fn vocab(&self) -> i64 {
        self.w.size()[0]
    }
}

impl Transformer {
    /// Where the logits sit on the trace: `dec.hook_logits` on a decoder (decoder-only or
    /// encoder-decoder), the stack's kind otherwise.
    pub fn logits_at(&self) -> At {
        At::new(if self.decoder.is_empty() { self.stack_kind } else { Kind::Dec }, 0, Point::Logits)
    }

    /// The output head in `dtype` (its own weights, shared, when they are already in `dtype`;
    /// `None`: the weights' own precision).
    pub fn output_head(&self, dtype: Option<DType>) -> Result<OutputHead, ModelError> {
        let out = self.output.as_ref().ok_or(ModelError::NoOutputHead)?;
        let dtype = dtype.unwrap_or(out.w.kind());
        let (w, b) = if out.w.kind() == dtype {
            (out.w.shallow_clone(), out.b.as_ref().map(|b| b.shallow_clone()))
        } else {
            (out.w.f_to_kind(dtype)?, out.b.as_ref().map(|b| b.f_to_kind(dtype)).transpose()?)
        };
        Ok(OutputHead { w, b, dtype, softcap: self.logit_softcap, at: self.logits_at() })
    }

    /// Logits `[.., V]` of final states `[.., D]` ([`OutputHead::logits`] in the weights'
    /// precision), seen by the hooks `h`.
    pub fn logits_hooked(&self, states: &Tensor, h: &mut HookSlot) -> Result<Tensor, ModelError> {
        self.output_head(None)?.logits(states, h)
    }

    /// Logits `[.., V]` of final states `[.., D]` with no hooks: the output projection,
    /// soft-capped where the model says so (as transformers caps before its argmax: where the
    /// cap saturates, ties go to the first index).
    pub fn logits(&self, states: &Tensor) -> Result<Tensor, ModelError> {
        self.logits_hooked(states, &mut None)
    }

    /// [`OutputHead::logits_of`] in the weights' precision.
    pub fn logits_of(&self, states: &Tensor, ids: &Tensor) -> Result<Tensor, ModelError> {
        self.output_head(None)?.logits_of(states, ids)
    }

    /// [`OutputHead::before_cap`] in the weights' precision: AttnLRP's seed.
    pub fn logits_before_cap(&self, states: &Tensor) -> Result<Tensor, ModelError> {
        self.output_head(None)?.before_cap(states)
    }
}
