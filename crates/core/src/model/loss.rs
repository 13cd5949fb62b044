//! The task loss (docs/methods.md#task-loss), one definition for everything that measures or
//! trains on it: the ablation metrics, gradient importance and pruning. Which tokens are the
//! targets (next tokens, references, the model's own greedy output) is decided once, by
//! `Model::prepare` (`model::batch`).

pub use super::unembed::OutputHead;
use super::{Model, ModelError};
use tch::{Kind as DType, Tensor};

impl Model {
    /// The output head in `dtype` (shared with the model's when it is already in `dtype`):
    /// the one unembedding ([`super::unembed`]).
    pub fn output_head(&self, dtype: DType) -> Result<OutputHead, ModelError> {
        self.net.output_head(Some(dtype))
    }

    /// Log-probabilities `[.., V]` of the final states `[.., D]` in `dtype`. The projection runs
    /// in the wider of `dtype` and the states' precision: a float64 model's logits stay float64
    /// before the float32 log-softmax of the task loss (float32 products would round
    /// differently with each batch's composition, and sharded merges must equal one run).
    pub fn log_probs(&self, states: &Tensor, dtype: DType) -> Result<Tensor, ModelError> {
        let work = if states.kind() == DType::Double { DType::Double } else { dtype };
        let logp = self.output_head(work)?.log_probs(states, &mut None)?;
        Ok(if work == dtype { logp } else { logp.f_to_kind(dtype)? })
    }

    /// The task loss of one batch under `gates`: the mean over its target tokens (mask `tm`) of
    /// `-log p(y_t | context)`, float32, differentiable in the gates and weights. `enc` is the
    /// stack's output of the batch (`ids` with key mask `mask`), `targets` its targets.
    pub fn task_loss(
        &self,
        enc: &Tensor,
        mask: &Tensor,
        targets: &Tensor,
        tm: &Tensor,
        gates: &super::nn::Gates,
    ) -> Result<Tensor, ModelError> {
        // Only the target positions reach the output head (padding rows are most of a batch's
        // head products when its sentences differ in length).
        let states = self.teacher_states(enc, mask, targets, gates)?;
        let rows = tm.f_reshape([-1])?.f_gt(0.0)?.f_nonzero()?.f_squeeze_dim(1)?;
        let d = states.size()[2];
        let states = states.f_reshape([-1, d])?.f_index_select(0, &rows)?;
        let logp = self.log_probs(&states, DType::Float)?;
        let labels = targets.f_reshape([-1])?.f_index_select(0, &rows)?;
        let tm = tm.f_to_kind(DType::Float)?;
        let weights = tm.f_reshape([-1])?.f_index_select(0, &rows)?;
        Ok((nll(&logp, &labels) * weights).f_sum(DType::Float)? / tm.f_sum(DType::Float)?)
    }
}

/// `-log p(label)` at every position: `logp [.., V]`, `labels [..]`.
pub fn nll(logp: &Tensor, labels: &Tensor) -> Tensor {
    -logp.gather(-1, &labels.unsqueeze(-1), false).squeeze_dim(-1)
}

/// A language model's predictions over one text (docs/methods.md#model-outputs).
pub struct TextPredictions {
    pub encoded: super::tokenize::tokenizer::Encoded,
    /// Logits `[T, V]` at every position (float64 for a float64 model, else float32).
    pub logits: Tensor,
}

impl TextPredictions {
    /// `-log p(x_{t+1} | x_<=t)` for `t = 0..T-2`, float64.
    pub fn next_token_losses(&self) -> Result<Vec<f64>, ModelError> {
        let t = self.logits.size()[0];
        if t < 2 {
            return Ok(Vec::new());
        }
        let logp = self.logits.f_narrow(0, 0, t - 1)?.f_to_kind(DType::Double)?.f_log_softmax(-1, DType::Double)?;
        let next = Tensor::from_slice(&self.encoded.ids[1..]).to_device(logp.device());
        let l = nll(&logp, &next);
        Vec::<f64>::try_from(&l).map_err(|e| ModelError::Invalid(e.to_string()))
    }
}

impl Model {
    /// The logits at every position of `text` under `gates`: a decoder-only language model's
    /// next-token predictions, from the one forward (`Transformer::encode` and
    /// `Transformer::logits`, soft-capped where the model says so).
    pub fn predictions(&self, text: &str, gates: &super::nn::Gates) -> Result<TextPredictions, ModelError> {
        if !self.net.decoder.is_empty() {
            return Err(ModelError::Invalid(format!("{} is a translation model: its predictions need a target (use m.loss(data) over references, or m.translate)", self.name())));
        }
        if self.net.output.is_none() {
            return Err(ModelError::NoOutputHead);
        }
        let encoded = self.tokenize(text)?;
        if encoded.ids.is_empty() {
            return Err(ModelError::Invalid("the text has no tokens".into()));
        }
        let _g = tch::no_grad_guard();
        let n = encoded.ids.len() as i64;
        let ids = Tensor::from_slice(&encoded.ids).view([1, n]).to_device(self.device());
        let mask = Tensor::ones([1, n], (DType::Float, self.device()));
        let states = self.net.encode(&ids, &mask, gates, None)?;
        let logits = self.net.logits(&states.f_select(0, 0)?)?;
        let logits = if logits.kind() == DType::Double { logits } else { logits.f_to_kind(DType::Float)? };
        Ok(TextPredictions { encoded, logits })
    }
}

impl Model {
    /// The task loss over many sentences (docs/methods.md#task-loss): the mean over all their
    /// target tokens, with the targets `Model::prepare` chooses (next tokens, references, else
    /// the model's greedy output); returns the loss, the target tokens and where they came from.
    pub fn dataset_loss(
        &self,
        texts: &[&str],
        references: Option<&[&str]>,
        batch_tokens: usize,
        gates: &super::nn::Gates,
        stop: &dyn Fn() -> bool,
    ) -> Result<(f64, f64, &'static str), ModelError> {
        if !self.has_task_loss() {
            return Err(ModelError::NoOutputHead);
        }
        // A language model's sentences go several to a row (the loss reads tokens, not rows).
        let p = match references {
            None => self.prepare_packed(texts, true, batch_tokens, gates)?,
            Some(_) => self.prepare(texts, references, true, batch_tokens, gates)?,
        };
        let _g = tch::no_grad_guard();
        let (mut total, mut count) = (0.0, 0.0);
        for b in &p.batches {
            if stop() {
                return Err(ModelError::Interrupted);
            }
            let Some((targets, tm)) = b.targets.as_ref() else { continue };
            let enc = self.net.encode(&b.ids, &b.mask, gates, None)?;
            let n = tm.f_to_kind(DType::Double)?.f_sum(DType::Double)?.double_value(&[]);
            total += self.task_loss(&enc, &b.mask, targets, tm, gates)?.f_to_kind(DType::Double)?.double_value(&[]) * n;
            count += n;
        }
        Ok((total / count.max(1.0), count, p.targets_from))
    }
}
