//! Head ablation: the effect of masking heads on a metric over a dataset (docs/methods.md#masking-and-ablation "Head
//! masking and ablation"), for one mask or for every head alone (the sweep).
//!
//! The sweep computes the layers below each head once (the unmasked pass hands out every
//! layer's input and per-head contexts), removes the masked head's contribution by applying
//! W^O to the contexts with that head zeroed (the layer's attention is not recomputed), and
//! runs all of a layer's masks through the layers above as one batch: for the self-attention
//! stack's heads, and for cross heads under loss and KL (teacher forcing runs each decoder
//! layer over all steps). Cross heads under BLEU decode greedily with gates. Its numbers equal
//! masking one head at a time (tests/analyses/ablation.rs).

use super::AnalysisError;
use crate::data::Dataset;
use crate::metrics::bleu::{corpus_counts, BleuCounts};
use crate::model::fill::{FillSource, Resample};
use crate::model::hooks::{At, HookSlot, Hooks, Point, Record};
use crate::model::nn::Gates;
use crate::model::transformer::{DecStart, Start, Stop};
use crate::model::{HeadId, Kind, Model, ModelError};
use crate::optspec::{opt, opt_bool, opt_int, opt_str, OptSpec};
use tch::{Device, Kind as DType, Tensor};

options_enum!(Metric, "metric", {
    /// Token cross-entropy on the targets (references, else the full model's greedy output; a
    /// language model's next tokens).
    Loss = "loss",
    /// Mean KL(full || masked) of the output distributions over target positions.
    Kl = "kl",
    /// Corpus BLEU of greedy generations against the references (else the teacher outputs).
    Bleu = "bleu",
    /// Mean over sentences of 1 - cos(mean-pooled final encoder states, full vs masked).
    Cosine = "cosine",
});

impl Metric {
    /// The metric when none is chosen: the task loss for models that have one (language and
    /// translation models), else cosine (`ablate`'s and `ablation_sweep`'s option lists state
    /// this default).
    pub fn default_for(model: &Model) -> Metric {
        if model.has_task_loss() {
            Metric::Loss
        } else {
            Metric::Cosine
        }
    }
}

options_enum!(
    /// How a closed head is ablated (docs/methods.md#mean-ablation).
    Ablation, "ablation", {
        /// The head's context is 0.
        Zero = "zero",
        /// The head's context is its mean over a reference dataset's tokens.
        Mean = "mean",
        /// The head's context is its context on another sentence of a reference dataset,
        /// drawn by a seed (docs/methods.md#resample-ablation).
        Resample = "resample",
    }
);

/// How a closed head is ablated when no `ablation` option is given.
pub const DEFAULT_ABLATION: Ablation = Ablation::Zero;
/// The ablation options shared by `ablate`, `with_mask` and `ablation_sweep`, declared once:
/// the script's option lists hold them and [`SweepOptions`]'s `Default` reads them.
pub const ABLATION_OPTION: OptSpec = opt_str("ablation", DEFAULT_ABLATION.name(), "\"zero\" (the head's context is 0), \"mean\" (its mean over the reference dataset's tokens) or \"resample\" (its context on another sentence of the reference dataset, drawn by the seed)");
pub const REFERENCE_OPTION: OptSpec = opt(
    "reference",
    "the data being measured",
    "the Dataset whose tokens give mean ablation's means, or resample ablation's sentences",
);
/// Resample ablation's seed.
pub const SEED_OPTION: OptSpec =
    opt_int("seed", 0, "resample ablation: the seed of each sentence's draw (docs/methods.md#resample-ablation)");
/// Per-position mean ablation.
pub const PER_POSITION_OPTION: OptSpec = opt_bool("per_position", false, "mean ablation: a closed head takes its mean at the same position over the reference's sentences long enough (past the longest, its mean over every token)");
/// The sweep's batch size (its masks are stacked on each batch, so it is smaller than the
/// other functions' [`DEFAULT_BATCH_TOKENS`](crate::model::batch::DEFAULT_BATCH_TOKENS)).
pub const SWEEP_BATCH_TOKENS_OPTION: OptSpec =
    opt_int("batch_tokens", 256, "tokens per batch; the masks of a layer are stacked on it");

/// The options of the single-head sweep (`ablation_sweep`), typed. `Default` gives what a
/// script gets with no options.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// `None`: [`Metric::default_for`] the model.
    pub metric: Option<Metric>,
    /// The kinds whose heads are masked one at a time; `None`: every kind of the model.
    pub kinds: Option<Vec<Kind>>,
    /// Tokens per batch, padding included; a layer's masks are stacked on each batch.
    pub batch_tokens: usize,
    pub ablation: Ablation,
    /// Mean ablation's reference dataset; `None`: the data measured.
    pub reference: Option<Dataset>,
    /// Tokens per batch when mean ablation's means are computed.
    pub mean_batch_tokens: usize,
    /// Resample ablation's seed.
    pub seed: u64,
    /// Mean ablation per position.
    pub per_position: bool,
    /// The heads swept (the options `layers` and `heads`); `None`: every head of `kinds`.
    /// The others' cells are NaN.
    pub only: Option<Vec<HeadId>>,
}

impl Default for SweepOptions {
    /// What `m.ablation_sweep(data)` runs with: metric and kinds left to the model,
    /// batch_tokens 256, ablation "zero" (the constants above).
    fn default() -> Self {
        const BATCH: i64 = SWEEP_BATCH_TOKENS_OPTION.default.int();
        const SEED: i64 = SEED_OPTION.default.int();
        const PER_POSITION: bool = PER_POSITION_OPTION.default.bool();
        SweepOptions {
            metric: None,
            kinds: None,
            batch_tokens: BATCH as usize,
            ablation: DEFAULT_ABLATION,
            reference: None,
            mean_batch_tokens: crate::model::batch::DEFAULT_BATCH_TOKENS,
            seed: SEED as u64,
            per_position: PER_POSITION,
            only: None,
        }
    }
}

pub use crate::model::batch::PBatch;

/// A dataset prepared once by the batching service (`model::batch::Prepared`: tokens,
/// buckets, targets), with what a metric adds, to evaluate many masks on.
pub struct Prepared {
    pub metric: Metric,
    pub data: crate::model::batch::Prepared,
    /// The model as given: the gates of a masked view (none for a model as loaded). Teacher
    /// targets, KL's distribution and cosine's pooled states are taken under them.
    pub base: Gates,
    /// The output projection (loss, KL) in the model's float32, its log-softmax in float64:
    /// the logits' rounding changes with the number of rows (CPU GEMM kernels), ~1e-7 relative,
    /// far under the 1e-5 to which a sweep equals masking one head at a time; the double
    /// projection this replaces took most of a decoder LM's sweep (benches/lm.sh).
    out64: Option<crate::model::loss::OutputHead>,
    /// A fill computed per batch (resample ablation, [`set_resample`]), for every mask evaluated.
    pub source: Option<std::rc::Rc<FillSource>>,
}

/// Resample ablation's fill source (docs/methods.md#resample-ablation): each sentence measured
/// draws one of the sentences of `reference` ([`crate::model::fill::Resample::draw`]: at least
/// its number of tokens and other ids, by a hash of its ids and `seed`); its closed heads take
/// their contexts on that sentence at the same positions, its mean past the drawn one's end.
/// The stack's own heads (an encoder's, a language model's).
pub fn resample_source(model: &Model, reference: &Dataset, seed: u64) -> Result<FillSource, AnalysisError> {
    if model.translates() {
        return Err(AnalysisError::Input(
            "resample ablation of translation models is not offered yet; use ablation \"mean\"".into(),
        ));
    }
    let refs = model
        .tokenize_all(reference.texts())
        .map_err(|e| AnalysisError::Input(format!("the reference {}: {e}", reference.name)))?;
    let kind = model.net.stack_kind;
    let mean = mean_fill(
        model,
        reference,
        &[kind],
        crate::model::batch::DEFAULT_BATCH_TOKENS,
        &Gates::none(),
        &crate::run::interrupted,
    )?
    .of(kind)
    .map(Tensor::shallow_clone)
    .ok_or_else(|| AnalysisError::Input(format!("resample ablation: {} has no heads of kind {kind}", model.name())))?;
    Ok(FillSource::Resample(Resample {
        refs: refs.into_iter().map(|e| e.ids).collect(),
        seed,
        mean,
        pad_id: model.tok.pad_id,
    }))
}

/// Sets resample ablation on a prepared dataset ([`resample_source`]); returns the reference
/// sentence each of its sentences draws, in the data's order.
pub fn set_resample(
    model: &Model,
    p: &mut Prepared,
    data: &Dataset,
    reference: &Dataset,
    seed: u64,
) -> Result<Vec<usize>, AnalysisError> {
    let src = resample_source(model, reference, seed)?;
    let draws = match &src {
        FillSource::Resample(r) => {
            model.tokenize_all(data.texts())?.iter().map(|e| r.draw(&e.ids)).collect::<Result<Vec<_>, _>>()?
        }
        FillSource::PerPosition { .. } => vec![],
    };
    p.source = Some(std::rc::Rc::new(src));
    Ok(draws)
}

impl Prepared {
    /// The gates batch `bi` runs under: `gates`, with the per-batch fill of their source or of
    /// the prepared data's (resample or per-position mean ablation) computed for that batch,
    /// `[layers, B, heads, T, dh]`.
    pub fn batch_gates(&self, model: &Model, bi: usize, gates: &Gates) -> Result<Gates, ModelError> {
        let mut g = gates.share();
        if g.source.is_none() {
            g.source = self.source.clone();
        }
        let Some(b) = self.data.batches.get(bi) else { return Ok(g) };
        Ok(model.net.resolved(&b.ids, &b.mask, &g)?.unwrap_or(g))
    }
}

impl std::ops::Deref for Prepared {
    type Target = crate::model::batch::Prepared;
    fn deref(&self) -> &Self::Target {
        &self.data
    }
}

/// Rows of double-precision logits per slice: `[rows, V]` stays near 16 MB (under the
/// allocator's mmap threshold; a sweep slice of a whole batch was ~230 MB for EN->PT and
/// page faults took a fifth of the time).
const LOGIT_BYTES: i64 = 16 << 20;
/// Rows of float32 logits per product with the output head: each product repacks the whole
/// `[V, D]` matrix (MKL copies it into panels), so a few dozen rows per product spent as long
/// packing as multiplying (a quarter of SmolLM2's sweep, perf); ~128 MB of rows makes the
/// packing a few percent, and the float64 log-softmax still runs in 16 MB slices of them.
const PRODUCT_BYTES: i64 = 128 << 20;

impl Prepared {
    /// Teacher-forced log-probabilities `[B, T, V]` in double precision.
    fn log_probs(
        &self,
        model: &Model,
        enc: &Tensor,
        mask: &Tensor,
        targets: &Tensor,
        gates: &Gates,
    ) -> Result<Tensor, ModelError> {
        let head = self.out64.as_ref().ok_or(ModelError::NoOutputHead)?;
        head.log_probs_in(&model.teacher_states(enc, mask, targets, gates)?, DType::Double)
    }

    /// Per target token `[N, T]` of the teacher-forced final decoder states `[N, T, D]`: the
    /// loss `-log p(target)`, or with `full` (the unmasked log-probabilities `[B, T, V]`, N a
    /// multiple of B) `KL(full || masked)`, at the target positions `tm [N, T]` (0 elsewhere:
    /// padding rows never reach the output head). The logits are taken in slices of rows,
    /// never all at once.
    fn token_values(
        &self,
        states: &Tensor,
        targets: &Tensor,
        tm: &Tensor,
        full: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let head = self.out64.as_ref().ok_or(ModelError::NoOutputHead)?;
        let (n, t) = (targets.size()[0], targets.size()[1]);
        let d = states.size()[2];
        let vocab = head.vocab();
        let rows = tm.f_reshape([-1])?.f_gt(0.0)?.f_nonzero()?.f_squeeze_dim(1)?;
        let states = states.f_reshape([n * t, d])?.f_index_select(0, &rows)?;
        let flat_targets = targets.f_reshape([-1])?.f_index_select(0, &rows)?;
        // For KL, row r of the N * T rows is row r mod (B * T) of the full distribution.
        let full = full.map(|f| f.reshape([-1, vocab]));
        let period = full.as_ref().map_or(n * t, |f| f.size()[0]);
        let count = rows.size()[0];
        let slice = (LOGIT_BYTES / (vocab * 8)).max(1);
        let product = (PRODUCT_BYTES / (vocab * 4)).max(slice);
        let mut parts = Vec::new();
        let mut start = 0;
        while start < count {
            let len_p = product.min(count - start);
            let logits = head.logits(&states.narrow(0, start, len_p), &mut None)?;
            let mut at = 0;
            while at < len_p {
                let len = slice.min(len_p - at);
                let logp = logits.narrow(0, at, len).f_log_softmax(-1, DType::Double)?;
                parts.push(match &full {
                    None => crate::model::loss::nll(&logp, &flat_targets.narrow(0, start + at, len)),
                    Some(f) => {
                        let f = f.f_index_select(0, &rows.narrow(0, start + at, len).f_remainder(period)?)?;
                        (f.exp() * (&f - &logp)).sum_dim_intlist([-1i64].as_slice(), false, DType::Double)
                    }
                });
                at += len;
            }
            start += len_p;
        }
        let values = if parts.is_empty() {
            Tensor::zeros([0], (DType::Double, states.device()))
        } else {
            Tensor::cat(&parts, 0)
        };
        Ok(Tensor::zeros([n * t], (DType::Double, values.device())).f_index_copy(0, &rows, &values)?.f_view([n, t])?)
    }
}

fn needs_decoder(model: &Model, metric: Metric) -> Result<(), AnalysisError> {
    match metric {
        Metric::Cosine => Ok(()),
        Metric::Bleu if !model.translates() => Err(AnalysisError::Input(format!("metric 'bleu' needs a translation model; {} is not one: use \"loss\" or \"kl\" for a language model, \"cosine\" for an encoder", model.name()))),
        _ if !model.has_task_loss() => Err(AnalysisError::Input(format!("metric '{metric}' needs a model with an output head (a language model or a translation model); {} is an encoder: use \"cosine\"", model.name()))),
        _ => Ok(()),
    }
}

/// `base`: the gates of the model as given (a masked view), the reference of every metric.
pub fn prepare(
    model: &Model,
    data: &Dataset,
    metric: Metric,
    batch_tokens: usize,
    base: Gates,
) -> Result<Prepared, AnalysisError> {
    prepare_with(model, data, metric, batch_tokens, base, false)
}

/// [`prepare`] for a computation that reads only the metric's sums (`ablate`, the sweep): a
/// language model's sentences packed several to a row under loss and KL where the model and
/// `base` allow it (docs/methods.md#packing), else as `prepare` batches them.
pub fn prepare_packed(
    model: &Model,
    data: &Dataset,
    metric: Metric,
    batch_tokens: usize,
    base: Gates,
) -> Result<Prepared, AnalysisError> {
    prepare_with(model, data, metric, batch_tokens, base, matches!(metric, Metric::Loss | Metric::Kl))
}

fn prepare_with(
    model: &Model,
    data: &Dataset,
    metric: Metric,
    batch_tokens: usize,
    base: Gates,
    pack: bool,
) -> Result<Prepared, AnalysisError> {
    if data.is_empty() {
        return Err(AnalysisError::Input(format!("the dataset {} is empty", data.name)));
    }
    needs_decoder(model, metric)?;
    let references: Option<Vec<&str>> = data.items.iter().map(|i| i.target.as_deref()).collect();
    let prepared = match references {
        None if pack => model.prepare_packed(&data.texts(), metric != Metric::Cosine, batch_tokens, &base)?,
        _ => model.prepare(&data.texts(), references.as_deref(), metric != Metric::Cosine, batch_tokens, &base)?,
    };
    let _g = tch::no_grad_guard();
    let out64 = match metric {
        Metric::Loss | Metric::Kl if model.net.output.is_some() => {
            // A float64 model keeps its float64 products; bf16 and float32 ones project in float32.
            let double = model.net.output.as_ref().is_some_and(|o| o.w.kind() == DType::Double);
            Some(model.output_head(if double { DType::Double } else { DType::Float })?)
        }
        _ => None,
    };
    Ok(Prepared { metric, data: prepared, out64, base, source: None })
}

/// `t` repeated `groups` times along the batch (row `j * B + b` is row `b`).
fn repeat_rows(t: &Tensor, groups: i64) -> Tensor {
    t.repeat([groups].iter().copied().chain(std::iter::repeat_n(1, t.dim() - 1)).collect::<Vec<_>>())
}

/// Per-row sums of the metric over a repeated batch: `enc [R, S, D]` is the (masked) encoder
/// output of R = groups x B rows; returns the sum over each group of B rows.
struct RowMetric<'a> {
    model: &'a Model,
    p: &'a Prepared,
    b: &'a PBatch,
    metric: Metric,
    /// Full-model log-probabilities `[B, T, V]` (KL) or pooled encoder states `[B, D]` (cosine).
    full: Option<Tensor>,
}

/// Mean over real tokens, in double precision, normalised to unit length.
fn pooled(enc: &Tensor, mask: &Tensor) -> Tensor {
    let e = enc.to_kind(DType::Double);
    let m = mask.to_kind(DType::Double).unsqueeze(-1);
    let p = (e * &m).sum_dim_intlist([1i64].as_slice(), false, DType::Double)
        / m.sum_dim_intlist([1i64].as_slice(), false, DType::Double);
    let norm = p.norm_scalaropt_dim(2, [-1i64].as_slice(), true).clamp_min(1e-12);
    p / norm
}

impl RowMetric<'_> {
    fn new<'a>(model: &'a Model, p: &'a Prepared, b: &'a PBatch) -> Result<RowMetric<'a>, ModelError> {
        let full = match p.metric {
            Metric::Kl | Metric::Cosine => {
                Self::reference(model, p, b, &model.net.encode(&b.ids, &b.mask, &p.base, None)?)?
            }
            Metric::Loss | Metric::Bleu => None,
        };
        Ok(RowMetric { model, p, b, metric: p.metric, full })
    }

    /// As [`RowMetric::new`], given the unmasked encoder output of the batch (the sweep's
    /// capture pass computes it anyway).
    fn with_full<'a>(
        model: &'a Model,
        p: &'a Prepared,
        b: &'a PBatch,
        enc: &Tensor,
    ) -> Result<RowMetric<'a>, ModelError> {
        Ok(RowMetric { model, p, b, metric: p.metric, full: Self::reference(model, p, b, enc)? })
    }

    /// What masked rows are compared with, from the unmasked encoder output: the full model's
    /// log-probabilities (KL) or pooled states (cosine).
    fn reference(model: &Model, p: &Prepared, b: &PBatch, enc: &Tensor) -> Result<Option<Tensor>, ModelError> {
        Ok(match p.metric {
            Metric::Kl => {
                let (t, _) = b.targets.as_ref().ok_or(ModelError::NoOutputHead)?;
                Some(p.log_probs(model, enc, &b.mask, t, &p.base)?)
            }
            Metric::Cosine => Some(pooled(enc, &b.mask)),
            Metric::Loss | Metric::Bleu => None,
        })
    }

    /// Sum of the metric for each of `groups` groups of rows; BLEU returns nothing here.
    fn sums(&self, enc: &Tensor, gates: &Gates, groups: i64) -> Result<Vec<f64>, ModelError> {
        let per_row = match self.metric {
            Metric::Cosine => {
                // 1 - cos(a, b) = |a/|a| - b/|b||^2 / 2: no cancellation for close vectors.
                let p = pooled(enc, &repeat_rows(&self.b.mask, groups));
                let full = repeat_rows(self.full.as_ref().ok_or(ModelError::NoOutputHead)?, groups);
                (p - full).pow_tensor_scalar(2).sum_dim_intlist([-1i64].as_slice(), false, DType::Double) * 0.5
            }
            Metric::Loss | Metric::Kl => {
                let (t, _) = self.b.targets.as_ref().ok_or(ModelError::NoOutputHead)?;
                let states = self.model.teacher_states(
                    enc,
                    &repeat_rows(&self.b.mask, groups),
                    &repeat_rows(t, groups),
                    gates,
                )?;
                return self.state_sums(&states, groups);
            }
            Metric::Bleu => return Ok(vec![]),
        };
        self.group_totals(&per_row, groups)
    }

    /// `sums` for loss and KL from the final decoder states `[groups x B, T, D]`.
    fn state_sums(&self, states: &Tensor, groups: i64) -> Result<Vec<f64>, ModelError> {
        let (t, tm) = self.b.targets.as_ref().ok_or(ModelError::NoOutputHead)?;
        let full =
            if self.metric == Metric::Kl { Some(self.full.as_ref().ok_or(ModelError::NoOutputHead)?) } else { None };
        let tm_rows = repeat_rows(tm, groups);
        let per_tok = self.p.token_values(states, &repeat_rows(t, groups), &tm_rows, full)?;
        let per_row =
            (per_tok * tm_rows.to_kind(DType::Double)).sum_dim_intlist([1i64].as_slice(), false, DType::Double);
        self.group_totals(&per_row, groups)
    }

    /// Per-row values `[groups x B]` summed over each group's B rows.
    fn group_totals(&self, per_row: &Tensor, groups: i64) -> Result<Vec<f64>, ModelError> {
        let bsz = self.b.ids.size()[0];
        Ok(Vec::<f64>::try_from(
            per_row.view([groups, bsz]).sum_dim_intlist([1i64].as_slice(), false, DType::Double).to_device(Device::Cpu),
        )?)
    }

    /// Greedy outputs of each row (BLEU).
    fn generate(&self, enc: &Tensor, gates: &Gates, groups: i64) -> Result<Vec<Vec<i64>>, ModelError> {
        let mask = self.b.mask.repeat([groups, 1]);
        let lens =
            Vec::<f32>::try_from(mask.sum_dim_intlist([1i64].as_slice(), false, DType::Float).to_device(Device::Cpu))?;
        let max_len: Vec<i64> = lens.iter().map(|&l| self.model.max_output_len(l as usize)).collect();
        self.model.net.greedy(enc, &mask, &max_len, gates)
    }
}

/// Normaliser of summed values: target tokens (loss, KL) or sentences (cosine).
fn denominator(p: &Prepared) -> f64 {
    match p.metric {
        Metric::Loss | Metric::Kl => p
            .batches
            .iter()
            .filter_map(|b| b.targets.as_ref())
            .map(|(_, m)| m.sum(DType::Double).double_value(&[]))
            .sum(),
        _ => p.n_sentences as f64,
    }
}

/// A metric over a set of sentences in additive form (docs/methods.md#shards): the sum of
/// per-token (loss, KL) or per-sentence (cosine) values and their count, or BLEU's counts.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MetricAcc {
    pub sum: f64,
    pub denom: f64,
    pub bleu: Option<BleuCounts>,
}

impl MetricAcc {
    pub fn value(&self) -> f64 {
        match &self.bleu {
            Some(c) => c.bleu().score,
            None => self.sum / self.denom.max(1e-12),
        }
    }
}

fn bleu_counts(p: &Prepared, hyps: &[String]) -> Result<BleuCounts, AnalysisError> {
    corpus_counts(hyps, std::slice::from_ref(&p.refs)).map_err(|e| AnalysisError::Input(e.to_string()))
}

/// The metric of the model under `gates` (one mask for the whole dataset).
pub fn evaluate(model: &Model, p: &Prepared, gates: &Gates, stop: &dyn Fn() -> bool) -> Result<f64, AnalysisError> {
    Ok(evaluate_acc(model, p, gates, stop)?.value())
}

/// [`evaluate`] in additive form.
pub fn evaluate_acc(
    model: &Model,
    p: &Prepared,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
) -> Result<MetricAcc, AnalysisError> {
    evaluate_hooked(model, p, gates, None, stop)
}

/// The metric under the prepared data's own gates (`p.base`) and under `closed` together
/// (`ablate`: `closed` is `p.base` with more heads closed, all in the stack's layers
/// `from_layer` and up). Per batch the unmasked
/// pass records the input of layer `from_layer`, and the masked pass resumes there: the layers
/// below run once for both (the same floats, so the pair equals two [`evaluate_acc`] calls).
/// BLEU, and heads outside the stack (`from_layer` `None`), take two whole passes.
pub fn evaluate_closing(
    model: &Model,
    p: &Prepared,
    closed: &Gates,
    from_layer: Option<usize>,
    stop: &dyn Fn() -> bool,
) -> Result<(MetricAcc, MetricAcc), AnalysisError> {
    let from = match from_layer {
        Some(l) if p.metric != Metric::Bleu && l < model.net.stack.len() => l,
        _ => return Ok((evaluate_acc(model, p, &p.base, stop)?, evaluate_acc(model, p, closed, stop)?)),
    };
    let _g = tch::no_grad_guard();
    let (mut total_base, mut total_closed) = (0.0, 0.0);
    for (bi, b) in p.batches.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let base_b = p.batch_gates(model, bi, &p.base)?;
        let closed_b = p.batch_gates(model, bi, closed)?;
        let kind = model.net.stack_kind;
        // Where the base leaves layer `from`'s heads ungated, its contexts (`hook_z`) are the
        // masked pass's before the closing gate: the masked pass resumes there, the layer's
        // attention not recomputed (the same floats: `Mixer::gated`, then the rest of the layer).
        let via_z = open_layer(&base_b, kind, from)?
            && closed_b.duo.is_none()
            && closed_b.bypass.is_none()
            && closed_b.stream.is_none()
            && model.net.stack.get(from).is_some_and(|l| l.mixer().as_attention().is_some());
        let (mut x, mut z) = (None, None);
        let enc = {
            let mut on = |at: At, t: &Tensor| {
                if at.kind == kind && at.layer == from {
                    match at.point {
                        Point::Z => z = Some(t.shallow_clone()),
                        _ => x = Some(t.shallow_clone()),
                    }
                }
                Ok(())
            };
            let points: &[Point] = if via_z { &[Point::ResidPre, Point::Z] } else { &[Point::ResidPre] };
            let mut rec = Record::new(points, &mut on);
            model.net.encode(&b.ids, &b.mask, &base_b, Some(&mut rec as &mut dyn Hooks))?
        };
        let x = x.ok_or_else(|| ModelError::Invalid(format!("no input recorded at layer {from}")))?;
        let bias = model.net.self_bias(&b.mask, x.kind());
        let masked = match (z, closed_b.layer(kind, from)) {
            (Some(z), Some(_)) if via_z => {
                model.net.run_from_open_z(from, &x, &z, &bias, Stop::FinalNorm, &closed_b, &mut None)?
            }
            _ => model.net.run(
                Start::Layer { layer: from, x: &x, bias: Some(&bias) },
                Stop::FinalNorm,
                &closed_b,
                &mut None,
            )?,
        };
        // KL's and cosine's reference is the unmasked pass just made.
        let rm = RowMetric::with_full(model, p, b, &enc)?;
        total_base += rm.sums(&enc, &base_b, 1)?[0];
        total_closed += rm.sums(&masked, &closed_b, 1)?[0];
    }
    let denom = denominator(p);
    Ok((MetricAcc { sum: total_base, denom, bleu: None }, MetricAcc { sum: total_closed, denom, bleu: None }))
}

/// Whether `gates` leave layer `l` of `kind` as loaded: no gate there, or one of ones with no
/// DuoAttention mix or bypass (a context times 1, plus its fill times 0, is itself).
fn open_layer(gates: &Gates, kind: Kind, l: usize) -> Result<bool, ModelError> {
    Ok(match gates.layer(kind, l) {
        None => true,
        Some(g) => g.duo.is_none() && g.bypass.is_none() && (!g.heads || g.g.f_eq(1.0)?.f_all()?.int64_value(&[]) == 1),
    })
}

/// [`evaluate_acc`] with the stack's hook points seen (and replaced) by `h` on every batch:
/// the metric under an edit that is not a gate (an expert ablated, docs/methods.md#experts-as-units);
/// KL's and cosine's references are taken without `h`.
pub fn evaluate_hooked(
    model: &Model,
    p: &Prepared,
    gates: &Gates,
    h: crate::model::hooks::HookSlot,
    stop: &dyn Fn() -> bool,
) -> Result<MetricAcc, AnalysisError> {
    evaluate_with(model, p, gates, h, stop, &mut |_, _| {})
}

/// [`evaluate_acc`] reporting `(sentences done, sentences)` after each batch: the sweep's
/// first phase, its unmasked pass, shows progress as the masks do.
pub fn evaluate_reporting(
    model: &Model,
    p: &Prepared,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<MetricAcc, AnalysisError> {
    evaluate_with(model, p, gates, None, stop, progress)
}

fn evaluate_with(
    model: &Model,
    p: &Prepared,
    gates: &Gates,
    mut h: crate::model::hooks::HookSlot,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<MetricAcc, AnalysisError> {
    let _g = tch::no_grad_guard();
    let mut done = 0;
    progress(0, p.n_sentences);
    let mut total = 0.0;
    let mut hyps = vec![String::new(); p.n_sentences];
    for (bi, b) in p.batches.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let gates = &p.batch_gates(model, bi, gates)?;
        let rm = RowMetric::new(model, p, b)?;
        let slot: crate::model::hooks::HookSlot = match h.as_mut() {
            Some(x) => Some(&mut **x),
            None => None,
        };
        let enc = model.net.encode(&b.ids, &b.mask, gates, slot)?;
        if p.metric == Metric::Bleu {
            for (&i, o) in b.rows.iter().zip(rm.generate(&enc, gates, 1)?) {
                hyps[i] = model.detokenize(&o)?;
            }
        } else {
            total += rm.sums(&enc, gates, 1)?[0];
        }
        done += b.rows.len();
        progress(done, p.n_sentences);
    }
    if p.metric == Metric::Bleu {
        return Ok(MetricAcc { sum: 0.0, denom: 0.0, bleu: Some(bleu_counts(p, &hyps)?) });
    }
    Ok(MetricAcc { sum: total, denom: denominator(p), bleu: None })
}

/// Token rows per pass of a chunk of masks through the layers above: on CPU, chunks larger
/// than a few thousand rows fall out of cache and run slower (benches/analysis.sh: 2048 rows
/// beat 4096 and unbounded chunks by 10-20% on MiniLM).
const SWEEP_ROWS: i64 = 2048;

/// The metric with each head of `kinds` masked alone: per kind, `[layer][head]` (NaN for a
/// head prune_heads removed).
pub fn sweep(
    model: &Model,
    p: &Prepared,
    kinds: &[Kind],
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<crate::model::KindGrids, AnalysisError> {
    let accs = sweep_acc(model, p, kinds, None, stop, progress)?;
    Ok(accs
        .into_iter()
        .map(|(kind, grid)| {
            let g = grid.into_iter().enumerate().map(|(l, row)| {
                let present = model.present(kind, l);
                row.into_iter()
                    .enumerate()
                    .map(|(h, a)| if present.contains(&h) { a.value() } else { f64::NAN })
                    .collect()
            });
            (kind, g.collect())
        })
        .collect())
}

/// Per kind, `[layer][head]` accumulators of a sweep.
pub type SweepGrids = Vec<(Kind, Vec<Vec<MetricAcc>>)>;

crate::accumulate_fields!(MetricAcc { sum, denom, bleu });

/// A sweep's shard accumulators (docs/methods.md#shards): the unmasked model's metric and, by
/// kind name, `[layer][head]` the metric with that head masked.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepAcc {
    pub base: MetricAcc,
    pub kinds: std::collections::BTreeMap<String, Vec<Vec<MetricAcc>>>,
}
crate::accumulate_fields!(SweepAcc { base, kinds });

impl SweepAcc {
    pub fn new(base: MetricAcc, grids: SweepGrids) -> SweepAcc {
        SweepAcc { base, kinds: grids.into_iter().map(|(k, g)| (k.to_string(), g)).collect() }
    }
}

/// [`sweep`] in additive form: per kind, `[layer][head]` accumulators (empty for a removed
/// head).
pub fn sweep_acc(
    model: &Model,
    p: &Prepared,
    kinds: &[Kind],
    only: Option<&[HeadId]>,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SweepGrids, AnalysisError> {
    let _g = tch::no_grad_guard();
    let shapes: Vec<_> = kinds.iter().map(|k| model.kind_shape(*k)).collect::<Result<_, _>>()?;
    // The heads swept in layer `l` of `kind`: those present, and of `only` when it is given
    // (the others' sums stay 0; the caller marks them unswept).
    let chosen = |kind: Kind, l: usize| -> Vec<usize> {
        let mut heads = model.present(kind, l);
        if let Some(only) = only {
            heads.retain(|&h| only.contains(&HeadId { kind, layer_idx: l, head: h }));
        }
        heads
    };
    let mut sums: Vec<Vec<Vec<f64>>> = shapes.iter().map(|s| vec![vec![0.0; s.n_heads]; s.n_layers]).collect();
    let mut hyps: Vec<Vec<Vec<Vec<String>>>> =
        shapes.iter().map(|s| vec![vec![vec![String::new(); p.n_sentences]; s.n_heads]; s.n_layers]).collect();
    // Progress counts (sentence, head) pairs swept, reported after each chunk of heads: a
    // sweep over one or two batches still moves head by head; the label names the unit.
    let n_heads: usize = shapes.iter().map(|s| (0..s.n_layers).map(|l| chosen(s.kind, l).len()).sum::<usize>()).sum();
    let total: usize = p.batches.iter().map(|b| b.ids.size()[0] as usize * n_heads).sum();
    let mut done = 0usize;
    progress(0, total);
    for (bi, b) in p.batches.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        // The view's gates, with resample ablation's fills of this batch when it is set.
        let base = p.batch_gates(model, bi, &p.base)?;
        let bsz = b.ids.size()[0];
        let tlen = b.targets.as_ref().map_or(1, |(t, _)| t.size()[1]);
        // Heads per chunk: keep the repeated states near 256 MB (the logits are taken in
        // slices, `Prepared::token_values`).
        let per_group = (bsz * tlen.max(b.ids.size()[1]) * model.net.d_model * 8).max(1);
        // One unmasked pass: the encoder output (the metric's reference, and the input of the
        // decoder-side sweeps) and, when the stack's own heads are swept, every layer's input
        // and per-head contexts.
        let mut inputs = Vec::new();
        // By layer: a layer without heads (prune_heads) hands out no contexts.
        let mut ctx: Vec<Option<Tensor>> = (0..model.net.stack.len()).map(|_| None).collect();
        let full_enc = {
            let mut on = |at: At, x: &Tensor| {
                match at.point {
                    Point::ResidPre => inputs.push(x.shallow_clone()),
                    _ => {
                        if let Some(slot) = ctx.get_mut(at.layer) {
                            *slot = Some(x.shallow_clone());
                        }
                    }
                }
                Ok(())
            };
            let stack = shapes.iter().any(|s| s.kind == model.net.stack_kind);
            let mut rec = Record::new(&[Point::ResidPre, Point::Z], &mut on);
            model.net.encode(&b.ids, &b.mask, &base, if stack { Some(&mut rec as &mut dyn Hooks) } else { None })?
        };
        let rm = RowMetric::with_full(model, p, b, &full_enc)?;
        for (ki, s) in shapes.iter().enumerate() {
            // Heads are swept in physical order (`present[l][j]` is head j's original number):
            // a physically pruned model's layers differ in width.
            let present: Vec<Vec<usize>> = (0..s.n_layers).map(|l| chosen(s.kind, l)).collect();
            let chunk_of =
                |h: i64| ((256 << 20) / per_group).min(SWEEP_ROWS / (bsz * b.ids.size()[1])).clamp(1, h.max(1));
            match s.kind {
                k if k == model.net.stack_kind => {
                    let bias = inputs.first().map(|x| model.net.self_bias(&b.mask, x.kind()));
                    for l in 0..s.n_layers {
                        let h = present[l].len() as i64;
                        let (Some(bias), true) = (bias.as_ref(), h > 0) else { continue };
                        let chunk = chunk_of(h);
                        // x [B, T, D], c [B, H, T, dh]. Masking head j = the stack resumed at
                        // this layer's `hook_z` with head j zeroed: the attention itself (Q, K,
                        // softmax, AV) is not recomputed, and the floats are those of the gated
                        // forward pass.
                        let (Some(x), Some(c)) = (inputs.get(l), ctx[l].as_ref()) else { continue };
                        for start in (0..h).step_by(chunk as usize) {
                            let n = chunk.min(h - start);
                            let heads = &present[l][start as usize..(start + n) as usize];
                            let attn = model.mixer(s.kind, l).ok_or_else(|| no_attention(s.kind, l))?;
                            let z = attn.ablated_rows(c, heads, base.fill_of(s.kind, l))?;
                            let (x, bias) = (x.repeat([n, 1, 1]), bias.repeat([n, 1, 1, 1]));
                            let enc = model.net.run(
                                Start::Z { layer: l, x: &x, z: &z, bias: Some(&bias) },
                                Stop::FinalNorm,
                                &base,
                                &mut None,
                            )?;
                            collect(
                                p.metric,
                                &rm,
                                &enc,
                                &base,
                                &present[l][start as usize..(start + n) as usize],
                                l,
                                &mut sums[ki],
                                &mut hyps[ki],
                                b,
                                model,
                            )?;
                            done += (n * bsz) as usize;
                            progress(done, total);
                        }
                    }
                }
                Kind::Cross if matches!(p.metric, Metric::Loss | Metric::Kl) => {
                    // As for the stack's heads: one unmasked teacher-forced pass records each
                    // decoder layer's stream under the cross-attention (`dec.blocks.L.ln1`
                    // post-norm, `dec.blocks.L.hook_resid_mid` pre-norm:
                    // `DecoderLayer::cross_resume_point`) and contexts
                    // (`cross.blocks.L.attn.hook_z`); masking head j resumes the decoder at that
                    // `hook_z` with head j zeroed, the masks stacked as rows.
                    let net = &model.net;
                    let (tgt, _) = b.targets.as_ref().ok_or(ModelError::NoOutputHead)?;
                    // By layer: a layer without heads (prune_heads) hands out no contexts; it
                    // has nothing to sweep.
                    let mut ctx: Vec<(Option<Tensor>, Option<Tensor>)> =
                        (0..s.n_layers).map(|_| (None, None)).collect();
                    let src = {
                        let mut on = |at: At, t: &Tensor| {
                            let resume = net.decoder.get(at.layer).map(|l| l.cross_resume_point());
                            match (at.kind, at.point, ctx.get_mut(at.layer)) {
                                (Kind::Dec, p, Some(slot)) if Some(p) == resume => slot.0 = Some(t.shallow_clone()),
                                (Kind::Cross, Point::Z, Some(slot)) => slot.1 = Some(t.shallow_clone()),
                                _ => {}
                            }
                            Ok(())
                        };
                        let mut rec = Record {
                            points: &[Point::Ln1, Point::ResidMid, Point::Z],
                            kinds: &[Kind::Dec, Kind::Cross],
                            on: &mut on,
                        };
                        let mut h: HookSlot = Some(&mut rec);
                        let src = net.source(&full_enc, &b.mask, &mut h)?;
                        let _ = net.decode(DecStart::Targets(tgt), Stop::FinalNorm, &src, &base, &mut h)?;
                        src
                    };
                    for (l, slot) in ctx.iter().enumerate() {
                        let (Some(x1), Some(c)) = slot else { continue };
                        let h = present[l].len() as i64;
                        let chunk = chunk_of(h);
                        for start in (0..h).step_by(chunk as usize) {
                            let n = chunk.min(h - start);
                            let heads = &present[l][start as usize..(start + n) as usize];
                            let attn = model.mixer(Kind::Cross, l).ok_or_else(|| no_attention(Kind::Cross, l))?;
                            let z = attn.ablated_rows(c, heads, base.fill_of(Kind::Cross, l))?;
                            let resume = DecStart::CrossZ { layer: l, x: &x1.repeat([n, 1, 1]), z: &z };
                            let y = net.decode(resume, Stop::FinalNorm, &src.repeat(n), &base, &mut None)?;
                            for (j, v) in rm.state_sums(&y, n)?.into_iter().enumerate() {
                                sums[ki][l][present[l][start as usize + j]] += v;
                            }
                            done += (n * bsz) as usize;
                            progress(done, total);
                        }
                    }
                }
                _ => {
                    let enc = &full_enc;
                    for l in 0..s.n_layers {
                        let h = present[l].len() as i64;
                        let chunk = chunk_of(h);
                        for start in (0..h).step_by(chunk as usize) {
                            let n = chunk.min(h - start);
                            let heads = &present[l][start as usize..(start + n) as usize];
                            // Rows of group j carry a mask closing head `heads[j]` of layer l.
                            let mut g = vec![1f32; (n * bsz) as usize * s.n_layers * s.n_heads];
                            for (j, &head) in heads.iter().enumerate() {
                                for r in 0..bsz as usize {
                                    g[((j * bsz as usize + r) * s.n_layers + l) * s.n_heads + head] = 0.0;
                                }
                            }
                            let gt = Tensor::from_slice(&g)
                                .view([n * bsz, s.n_layers as i64, s.n_heads as i64])
                                .to_device(model.device());
                            // On top of the view's own gates (soft gates too).
                            let mut gates = base.share();
                            gates.multiply(s.kind, gt);
                            collect(
                                p.metric,
                                &rm,
                                &enc.repeat([n, 1, 1]),
                                &gates,
                                heads,
                                l,
                                &mut sums[ki],
                                &mut hyps[ki],
                                b,
                                model,
                            )?;
                            done += (n * bsz) as usize;
                            progress(done, total);
                        }
                    }
                }
            }
        }
    }
    let denom = denominator(p);
    let mut out = Vec::new();
    for (ki, s) in shapes.iter().enumerate() {
        let grid: Vec<Vec<MetricAcc>> = if p.metric == Metric::Bleu {
            hyps[ki]
                .iter()
                .map(|layer| {
                    layer
                        .iter()
                        .map(|h| Ok(MetricAcc { sum: 0.0, denom: 0.0, bleu: Some(bleu_counts(p, h)?) }))
                        .collect::<Result<_, AnalysisError>>()
                })
                .collect::<Result<_, _>>()?
        } else {
            sums[ki]
                .iter()
                .map(|layer| layer.iter().map(|&v| MetricAcc { sum: v, denom, bleu: None }).collect())
                .collect()
        };
        out.push((s.kind, grid));
    }
    Ok(out)
}

/// A layer the sweep found heads in has no attention block (a broken invariant, reported).
fn no_attention(kind: Kind, l: usize) -> ModelError {
    ModelError::Invalid(format!("sweep: layer {l} of '{kind}' has no attention"))
}

#[allow(clippy::too_many_arguments)]
fn collect(
    metric: Metric,
    rm: &RowMetric,
    enc: &Tensor,
    gates: &Gates,
    heads: &[usize],
    l: usize,
    sums: &mut [Vec<f64>],
    hyps: &mut [Vec<Vec<String>>],
    b: &PBatch,
    model: &Model,
) -> Result<(), ModelError> {
    let n = heads.len() as i64;
    if metric == Metric::Bleu {
        let outs = rm.generate(enc, gates, n)?;
        for (k, o) in outs.iter().enumerate() {
            let (j, r) = (k / b.rows.len(), k % b.rows.len());
            hyps[l][heads[j]][b.rows[r]] = model.detokenize(o)?;
        }
    } else {
        for (j, v) in rm.sums(enc, gates, n)?.into_iter().enumerate() {
            sums[l][heads[j]] += v;
        }
    }
    Ok(())
}

/// Heads closed by an ablation, by id; used by the script layer.
pub fn head_list(heads: &[HeadId]) -> String {
    heads.iter().map(|h| h.to_string()).collect::<Vec<_>>().join(" ")
}

/// Mean ablation's reference values (docs/methods.md#mean-ablation): for every head of
/// `kinds`, its context `hook_z` averaged over the non-padding tokens of `data` (decoder kinds:
/// over the target tokens, teacher-forced as the task loss is), `[layers, heads, d_head]` per
/// kind in the original head numbering, under the model as given (`base`: the view's own gates).
pub fn mean_fill(
    model: &Model,
    data: &Dataset,
    kinds: &[Kind],
    batch_tokens: usize,
    base: &Gates,
    stop: &dyn Fn() -> bool,
) -> Result<crate::model::nn::Fills, AnalysisError> {
    let needs_targets = kinds.iter().any(|k| model.in_decoder(*k));
    let metric = if needs_targets { Metric::Loss } else { Metric::Cosine };
    if needs_targets && !model.translates() {
        return Err(AnalysisError::Input(format!(
            "mean ablation of decoder heads needs a translation model; {} has none",
            model.name()
        )));
    }
    let p = prepare(model, data, metric, batch_tokens, base.share())?;
    let _g = tch::no_grad_guard();
    let shapes: Vec<_> = kinds.iter().map(|k| model.kind_shape(*k)).collect::<Result<_, _>>()?;
    // Per kind, the widest head (a hybrid's layers without heads have none): every layer's
    // sum is `[W, dh]` of the kind, a narrower layer's heads and contexts in its first rows
    // and columns (what `nn::gate_contexts` reads).
    let widest: Vec<i64> = shapes
        .iter()
        .map(|s| (0..s.n_layers).filter_map(|l| model.mixer(s.kind, l)).map(|a| a.head_dim()).max().unwrap_or(1))
        .collect();
    // Per kind, per layer: the sum of contexts [W, dh] (original numbering) and the count.
    let mut sums: Vec<Vec<Option<Tensor>>> = shapes.iter().map(|s| (0..s.n_layers).map(|_| None).collect()).collect();
    let mut counts = vec![0.0f64; kinds.len()];
    for b in &p.batches {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let tm = b.targets.as_ref().map(|(_, m)| m.shallow_clone());
        let mut on = |at: At, z: &Tensor| -> Result<(), ModelError> {
            let Some(ki) = kinds.iter().position(|k| *k == at.kind) else { return Ok(()) };
            let m = if model.in_decoder(at.kind) {
                tm.as_ref().ok_or(ModelError::NoOutputHead)?.shallow_clone()
            } else {
                b.mask.shallow_clone()
            };
            let m = m.f_to_kind(DType::Double)?;
            // [B, H, T, dh] x [B, 1, T, 1] summed over batch and positions -> [H, dh].
            let s = z.f_to_kind(DType::Double)?.f_mul(&m.f_unsqueeze(1)?.f_unsqueeze(-1)?)?.f_sum_dim_intlist(
                [0i64, 2].as_slice(),
                false,
                DType::Double,
            )?;
            let attn = model
                .mixer(at.kind, at.layer)
                .ok_or_else(|| ModelError::Invalid(format!("{}.{} has no attention", at.kind, at.layer)))?;
            let (w, dh) = (shapes[ki].n_heads as i64, widest[ki]);
            let full = Tensor::zeros([w, dh], (DType::Double, s.device()));
            let idx =
                Tensor::from_slice(&attn.present().iter().map(|&h| h as i64).collect::<Vec<_>>()).to_device(s.device());
            let s = if s.size()[1] < dh { s.f_constant_pad_nd([0, dh - s.size()[1]])? } else { s };
            let full = full.f_index_add(0, &idx, &s)?;
            if let Some(slot) = sums.get_mut(ki).and_then(|v| v.get_mut(at.layer)) {
                *slot = Some(match slot.take() {
                    Some(acc) => acc + full,
                    None => full,
                });
            }
            Ok(())
        };
        let points = [Point::Z];
        let mut rec = Record { points: &points, kinds, on: &mut on };
        let enc = model.net.encode(&b.ids, &b.mask, &p.base, Some(&mut rec as &mut dyn Hooks))?;
        if let (true, Some((targets, _))) = (needs_targets, b.targets.as_ref()) {
            let _ = model.net.teacher(&enc, &b.mask, targets, Stop::FinalNorm, &p.base, Some(&mut rec))?;
        }
        for (ki, k) in kinds.iter().enumerate() {
            let m = if model.in_decoder(*k) {
                tm.as_ref().map_or(0.0, |m| m.sum(DType::Double).double_value(&[]))
            } else {
                b.mask.sum(DType::Double).double_value(&[])
            };
            counts[ki] += m;
        }
    }
    let mut fills = crate::model::nn::Fills::default();
    for (ki, s) in shapes.iter().enumerate() {
        let dh = widest[ki];
        let layers: Vec<Tensor> = sums[ki]
            .iter()
            .map(|t| {
                t.as_ref().map_or_else(
                    || Tensor::zeros([s.n_heads as i64, dh], (DType::Double, model.device())),
                    |t| t / counts[ki].max(1.0),
                )
            })
            .collect();
        fills.set(s.kind, Tensor::f_stack(&layers, 0)?);
    }
    Ok(fills)
}

/// Per-position mean ablation's fill source (docs/methods.md#mean-ablation, `per_position`):
/// each head of the stack's own kind, its context at position `t` averaged over the sentences
/// of `data` that have a position `t` (`[layers, heads, T_max, d_head]`), and past the longest
/// its mean over every token. The stack's own heads (an encoder's, a language model's).
pub fn position_means(
    model: &Model,
    data: &Dataset,
    batch_tokens: usize,
    stop: &dyn Fn() -> bool,
) -> Result<FillSource, AnalysisError> {
    if model.translates() {
        return Err(AnalysisError::Input("per-position mean ablation of translation models is not offered yet; use ablation \"mean\" without per_position".into()));
    }
    let kind = model.net.stack_kind;
    let overall = mean_fill(model, data, &[kind], batch_tokens, &Gates::none(), stop)?
        .of(kind)
        .map(Tensor::shallow_clone)
        .ok_or_else(|| {
            AnalysisError::Input(format!("per-position mean ablation: {} has no heads of kind {kind}", model.name()))
        })?;
    let p = prepare(model, data, Metric::Cosine, batch_tokens, Gates::none())?;
    let _g = tch::no_grad_guard();
    let t_max = p.batches.iter().map(|b| b.ids.size()[1]).max().unwrap_or(1);
    let (n_layers, width, dh) = (overall.size()[0], overall.size()[1], overall.size()[2]);
    let dev = model.device();
    let sums = Tensor::zeros([n_layers, width, t_max, dh], (DType::Double, dev));
    let counts = Tensor::zeros([t_max], (DType::Double, dev));
    for b in &p.batches {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let t = b.ids.size()[1];
        let m = b.mask.f_to_kind(DType::Double)?;
        let mut layers: Vec<Option<Tensor>> = (0..n_layers).map(|_| None).collect();
        {
            let mut on = |at: At, z: &Tensor| -> Result<(), ModelError> {
                if at.kind != kind {
                    return Ok(());
                }
                // [B, H, T, dh] x [B, 1, T, 1] summed over the batch -> [H, T, dh], placed in the
                // original numbering.
                let s = z.f_to_kind(DType::Double)?.f_mul(&m.f_unsqueeze(1)?.f_unsqueeze(-1)?)?.f_sum_dim_intlist(
                    [0i64].as_slice(),
                    false,
                    DType::Double,
                )?;
                let attn = model
                    .mixer(at.kind, at.layer)
                    .ok_or_else(|| ModelError::Invalid(format!("{}.{} has no attention", at.kind, at.layer)))?;
                let idx =
                    Tensor::from_slice(&attn.present().iter().map(|&h| h as i64).collect::<Vec<_>>()).to_device(dev);
                // A layer whose heads are narrower than the widest (a hybrid's channel groups
                // beside attention heads) fills its own first columns.
                let full = Tensor::zeros([width, t, dh], (DType::Double, dev));
                let mut own = full.f_narrow(2, 0, s.size()[2].min(dh))?;
                let _ = own.f_index_add_(0, &idx, &s)?;
                if let Some(slot) = layers.get_mut(at.layer) {
                    *slot = Some(full);
                }
                Ok(())
            };
            let points = [Point::Z];
            let kinds = [kind];
            let mut rec = Record { points: &points, kinds: &kinds, on: &mut on };
            let _ = model.net.encode(&b.ids, &b.mask, &Gates::none(), Some(&mut rec as &mut dyn Hooks))?;
        }
        for (l, s) in layers.iter().enumerate() {
            if let Some(s) = s {
                let mut part = sums.f_select(0, l as i64)?.f_narrow(1, 0, t)?;
                part += s;
            }
        }
        let mut c = counts.f_narrow(0, 0, t)?;
        c += m.f_sum_dim_intlist([0i64].as_slice(), false, DType::Double)?;
    }
    let means = sums.f_div(&counts.f_clamp_min(1.0)?.view([1, 1, t_max, 1]))?;
    Ok(FillSource::PerPosition { means, overall })
}
