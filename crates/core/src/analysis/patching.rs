//! Activation patching (docs/methods.md#activation-patching): a clean and a corrupted prompt
//! of the same length, one run of each, and for every unit (a head of a layer, or a head at one
//! position, or a position of the residual stream) the run of one prompt with that unit's value
//! at a hook point taken from the other. Denoising patches clean values into the corrupted run,
//! noising corrupted values into the clean run; the metric is read at the last position.
//!
//! Batched as the ablation sweep is: both runs record every layer's input and the patched point
//! once; each layer's patches are rows of one batch resumed at that layer (`Transformer::run`
//! from `Start::Z` for `hook_z`, from `Start::Layer` with the point's value replaced otherwise), so the layers below a
//! patch run once per pair, not once per patch. Pairs of the same token length share a batch.
//! Numeric core: no Rhai, no printing.

use super::AnalysisError;
use crate::model::hooks::{At, Hooks, Point, Put, Record};
use crate::model::nn::{Gates, KeysValues};
use crate::model::resume::Entry;
use crate::model::transformer::{StackCache, Start, Stop};
use crate::model::{Model, ModelError};
use std::collections::BTreeMap;
use tch::{Kind as DType, Tensor};

options_enum!(Site, "patching site", {
    /// Per-head contexts, the input of W^O (`attn.hook_z`); one unit per query head.
    Z = "z",
    /// Per-head outputs at W^O (`attn.hook_result`): the same patch as `z` (W^O is linear in
    /// each head's context), run through `hook_z`.
    Result = "result",
    /// Queries (`attn.hook_q`), one unit per query head.
    Q = "q",
    /// Keys (`attn.hook_k`), one unit per key/value head.
    K = "k",
    /// Values (`attn.hook_v`), one unit per key/value head.
    V = "v",
    /// Attention probabilities (`attn.hook_pattern`), one unit per query head; per position,
    /// the query position's row.
    Pattern = "pattern",
    /// A layer's input (`hook_resid_pre`): one unit per layer (per position: per layer and position).
    ResidPre = "resid_pre",
    /// The attention block's output (`hook_attn_out`).
    AttnOut = "attn_out",
    /// The MLP block's output (`hook_mlp_out`).
    MlpOut = "mlp_out",
    /// Each expert's weighted output in a mixture of experts (`mlp.hook_expert_out`), one unit
    /// per expert (docs/methods.md#experts-as-units); dense layers have none.
    ExpertOut = "expert_out",
});

options_enum!(Direction, "patching direction", {
    /// Clean values into the corrupted run (what restores the answer).
    Denoise = "denoise",
    /// Corrupted values into the clean run (what breaks it).
    Noise = "noise",
});

options_enum!(PatchMetric, "patching metric", {
    /// logit(answer) - logit(wrong) at the last position.
    LogitDiff = "logit_diff",
    /// p(answer) at the last position.
    Prob = "prob",
    /// KL(clean || run) of the next-token distributions at the last position.
    Kl = "kl",
    /// -log p(answer) at the last position.
    Loss = "loss",
});

impl Site {
    /// The hook point a site patches.
    pub fn point(self) -> Point {
        match self {
            Site::Z | Site::Result => Point::Z,
            Site::Q => Point::Q,
            Site::K => Point::K,
            Site::V => Point::V,
            Site::Pattern => Point::Pattern,
            Site::ResidPre => Point::ResidPre,
            Site::AttnOut => Point::AttnOut,
            Site::MlpOut => Point::MlpOut,
            Site::ExpertOut => Point::ExpertOut,
        }
    }

    /// Whether the site's units are heads (else the residual stream's positions).
    pub fn per_head(self) -> bool {
        !matches!(self, Site::ResidPre | Site::AttnOut | Site::MlpOut)
    }
}

/// One clean/corrupted pair as token ids (the same length), with the answer and, for
/// `logit_diff`, the wrong answer.
#[derive(Debug, Clone)]
pub struct PairIds {
    pub clean: Vec<i64>,
    pub corrupted: Vec<i64>,
    pub answer: i64,
    pub wrong: Option<i64>,
}

#[derive(Debug, Clone, Copy)]
pub struct PatchSpec {
    pub site: Site,
    /// Patch each position alone (else all positions at once).
    pub each_position: bool,
    pub direction: Direction,
    pub metric: PatchMetric,
    /// Prompt tokens per batch of pairs (pairs of one length are split into batches of at most
    /// this many tokens, at least one pair each): what bounds the recorded runs' memory.
    pub batch_tokens: usize,
}

impl PatchSpec {
    /// A spec with the default batch size (`model::batch::DEFAULT_BATCH_TOKENS`).
    pub fn new(site: Site, each_position: bool, direction: Direction, metric: PatchMetric) -> PatchSpec {
        PatchSpec { site, each_position, direction, metric, batch_tokens: crate::model::batch::DEFAULT_BATCH_TOKENS }
    }
}

/// The result: metric means over the pairs.
#[derive(Debug, Clone)]
pub struct Patched {
    pub clean: f64,
    pub corrupted: f64,
    /// `[layer][position or 0][unit]`: the metric of the run with that unit patched. Units are
    /// heads (query heads, or key/value heads for `k` and `v`) or, for the residual sites, one.
    pub patched: Vec<Vec<Vec<f64>>>,
    /// Token length of the pairs (positions in `patched` when per position; pairs of several
    /// lengths cannot be patched per position).
    pub positions: usize,
}

/// Patching's shard accumulators (docs/methods.md#shards): the pairs and, by kind name, the
/// sums over pairs of the clean, corrupted and patched metrics (undefined where the metric is).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PatchAcc {
    pub pairs: usize,
    pub kinds: BTreeMap<String, PatchKindAcc>,
}
crate::accumulate_fields!(PatchAcc { pairs, kinds });

/// One kind's sums, `patched` as [`Patched::patched`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PatchKindAcc {
    pub clean: crate::shard::Num,
    pub corrupted: crate::shard::Num,
    pub patched: Vec<Vec<Vec<crate::shard::Num>>>,
}
crate::accumulate_fields!(PatchKindAcc { clean, corrupted, patched });

impl PatchAcc {
    /// The sums behind the means of `pairs` pairs.
    pub fn of(pairs: usize, rs: &[(crate::model::Kind, Patched)]) -> PatchAcc {
        use crate::shard::Num;
        let n = pairs as f64;
        let kinds = rs
            .iter()
            .map(|(k, r)| {
                let patched = r
                    .patched
                    .iter()
                    .map(|l| l.iter().map(|p| p.iter().map(|&v| Num(v * n)).collect()).collect())
                    .collect();
                (k.to_string(), PatchKindAcc { clean: Num(r.clean * n), corrupted: Num(r.corrupted * n), patched })
            })
            .collect();
        PatchAcc { pairs, kinds }
    }

    /// The means of one kind's sums.
    pub fn patched(&self, kind: &str) -> Result<Patched, String> {
        let a = self.kinds.get(kind).ok_or_else(|| format!("no patched sums for {kind}"))?;
        let sums: Vec<Vec<Vec<f64>>> =
            a.patched.iter().map(|l| l.iter().map(|p| p.iter().map(|v| v.0).collect()).collect()).collect();
        let positions = sums.first().map_or(0, |l| l.len());
        Ok(Patched::mean_of(sums, a.clean.0, a.corrupted.0, self.pairs, positions))
    }
}

impl Patched {
    /// Means over `n` pairs of metric sums.
    pub fn mean_of(mut sums: Vec<Vec<Vec<f64>>>, clean: f64, corrupted: f64, n: usize, positions: usize) -> Patched {
        let n = n as f64;
        for v in sums.iter_mut().flatten().flatten() {
            *v /= n;
        }
        Patched { clean: clean / n, corrupted: corrupted / n, patched: sums, positions }
    }

    /// `(patched - corrupted) / (clean - corrupted)`: 1 = the patch restores the clean metric
    /// (denoising), 0 = it changes nothing; NaN when clean and corrupted agree.
    pub fn normalized(&self, v: f64) -> f64 {
        (v - self.corrupted) / (self.clean - self.corrupted)
    }
}

/// What one run of a bucket records: each layer's input, the patched point's value, and each
/// layer's keys and values (what a patched row's later positions attend to before the patch).
struct Run {
    inputs: Vec<Tensor>,
    values: Vec<Option<Tensor>>,
    cache: Vec<Option<KeysValues>>,
    /// The last layer's output (`hook_resid_post`), before the final norm.
    last: Option<Tensor>,
    /// Last-position logits `[B, V]`, float64.
    logits: Tensor,
}

fn record(model: &Model, ids: &Tensor, point: Point, gates: &Gates) -> Result<Run, ModelError> {
    let n = model.net.stack.len();
    let mut inputs = Vec::with_capacity(n);
    let mut values: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
    let mut cache = StackCache::default();
    let mut last = None;
    let states = {
        let mut on = |at: At, x: &Tensor| {
            if at.point == Point::ResidPre {
                inputs.push(x.shallow_clone());
            }
            if at.point == Point::ResidPost && at.layer + 1 == n {
                last = Some(x.shallow_clone());
            }
            if at.point == point {
                if let Some(slot) = values.get_mut(at.layer) {
                    *slot = Some(x.shallow_clone());
                }
            }
            Ok(())
        };
        let points = [Point::ResidPre, point, Point::ResidPost];
        let mut rec = Record::new(&points, &mut on);
        if model.net.caches_keys() {
            model.net.stack_cached(ids, &mut cache, gates, Some(&mut rec as &mut dyn Hooks))?
        } else {
            // A mixer without keys and values to keep: patched rows resume from the first
            // position ([`run`]), so the plain run records all they read.
            let mask = ids.f_ones_like()?;
            model.net.run(
                Start::Tokens { ids, mask: &mask },
                Stop::FinalNorm,
                gates,
                &mut Some(&mut rec as &mut dyn Hooks),
            )?
        }
    };
    Ok(Run { inputs, values, cache: cache.layers, last, logits: last_logits(model, &states)? })
}

fn last_logits(model: &Model, states: &Tensor) -> Result<Tensor, ModelError> {
    let t = states.size()[1];
    Ok(model.net.logits(&states.f_select(1, t - 1)?)?.f_to_kind(DType::Double)?)
}

/// The metric of each row: `logits [R, V]` against the pairs' answers (repeated per unit).
fn metric(
    m: PatchMetric,
    logits: &Tensor,
    answer: &Tensor,
    wrong: &Tensor,
    clean_logp: &Tensor,
) -> Result<Tensor, ModelError> {
    Ok(match m {
        PatchMetric::LogitDiff => {
            logits.f_gather(1, answer, false)?.f_sub(&logits.f_gather(1, wrong, false)?)?.f_squeeze_dim(1)?
        }
        PatchMetric::Prob => logits.f_softmax(1, DType::Double)?.f_gather(1, answer, false)?.f_squeeze_dim(1)?,
        PatchMetric::Loss => {
            logits.f_log_softmax(1, DType::Double)?.f_gather(1, answer, false)?.f_squeeze_dim(1)?.f_neg()?
        }
        PatchMetric::Kl => {
            let logq = logits.f_log_softmax(1, DType::Double)?;
            clean_logp.f_exp()?.f_mul(&clean_logp.f_sub(&logq)?)?.f_sum_dim_intlist(
                [1i64].as_slice(),
                false,
                DType::Double,
            )?
        }
    })
}

/// Pairs of one token length, at most `PatchSpec::batch_tokens` prompt tokens (at least one
/// pair), in order of length.
type Buckets<'a> = Vec<(usize, Vec<&'a PairIds>)>;

/// The pairs checked (a decoder-only LM, pairs of one length each, wrong answers for
/// `logit_diff`, one length for per-position patching), grouped by token length and split into
/// batches of `spec.batch_tokens` tokens.
fn buckets<'a>(model: &Model, pairs: &'a [PairIds], spec: PatchSpec) -> Result<Buckets<'a>, AnalysisError> {
    let net = &model.net;
    if !net.decoder.is_empty() || net.output.is_none() {
        return Err(AnalysisError::Input(format!(
            "patch: {} is not a decoder-only language model; patching reads the next-token prediction of one stack",
            model.name()
        )));
    }
    if pairs.is_empty() {
        return Err(AnalysisError::Input("patch: no pairs".into()));
    }
    if spec.metric == PatchMetric::LogitDiff && pairs.iter().any(|p| p.wrong.is_none()) {
        return Err(AnalysisError::Input("patch: metric \"logit_diff\" needs a wrong answer for every pair".into()));
    }
    let mut by_len: BTreeMap<usize, Vec<&PairIds>> = BTreeMap::new();
    for (i, p) in pairs.iter().enumerate() {
        if p.clean.len() != p.corrupted.len() || p.clean.is_empty() {
            return Err(AnalysisError::Input(format!(
                "patch: pair {i}: the clean prompt has {} tokens, the corrupted {}; they must be equal and not 0",
                p.clean.len(),
                p.corrupted.len()
            )));
        }
        by_len.entry(p.clean.len()).or_default().push(p);
    }
    if spec.each_position && by_len.len() > 1 {
        let lens: Vec<String> = by_len.keys().map(|l| l.to_string()).collect();
        return Err(AnalysisError::Input(format!(
            "patch: per-position patching needs pairs of one token length; these have lengths {}",
            lens.join(", ")
        )));
    }
    Ok(by_len
        .into_iter()
        .flat_map(|(len, group)| {
            let per = (spec.batch_tokens / len.max(1)).max(1);
            group.chunks(per).map(|c| (len, c.to_vec())).collect::<Vec<_>>()
        })
        .collect())
}

/// One bucket's pairs as tensors on the model's device.
struct Bucket {
    b: i64,
    t: i64,
    clean: Tensor,
    corrupted: Tensor,
    mask: Tensor,
    answer: Tensor,
    wrong: Tensor,
}

impl Bucket {
    fn new(group: &[&PairIds], dev: tch::Device) -> Bucket {
        let (b, t) = (group.len() as i64, group[0].clean.len() as i64);
        let ids = |f: &dyn Fn(&PairIds) -> &[i64]| {
            Tensor::from_slice(&group.iter().flat_map(|p| f(p).to_vec()).collect::<Vec<i64>>())
                .view([b, t])
                .to_device(dev)
        };
        let col = |f: &dyn Fn(&PairIds) -> i64| {
            Tensor::from_slice(&group.iter().map(|p| f(p)).collect::<Vec<i64>>()).view([b, 1]).to_device(dev)
        };
        Bucket {
            b,
            t,
            clean: ids(&|p| &p.clean),
            corrupted: ids(&|p| &p.corrupted),
            mask: Tensor::ones([b, t], (DType::Float, dev)),
            answer: col(&|p| p.answer),
            wrong: col(&|p| p.wrong.unwrap_or(p.answer)),
        }
    }
}

/// One bucket's clean and corrupted runs, and the metric read on rows of either direction's
/// base run.
struct Runs {
    b: i64,
    t: i64,
    clean: Run,
    corrupt: Run,
    answer: Tensor,
    wrong: Tensor,
    clean_logp: Tensor,
    spec: PatchSpec,
}

impl Runs {
    fn new(
        model: &Model,
        group: &[&PairIds],
        point: Point,
        spec: PatchSpec,
        gates: &Gates,
    ) -> Result<Runs, ModelError> {
        let Bucket { b, t, clean: clean_ids, corrupted: corrupt_ids, answer, wrong, .. } =
            Bucket::new(group, model.device());
        let clean = record(model, &clean_ids, point, gates)?;
        let corrupt = record(model, &corrupt_ids, point, gates)?;
        let clean_logp = clean.logits.f_log_softmax(1, DType::Double)?;
        Ok(Runs { b, t, clean, corrupt, answer, wrong, clean_logp, spec })
    }

    /// The metric of each of `reps` groups of the bucket's rows, from last-position logits
    /// `[reps x B, V]` (row `j * B + b`).
    fn metric(&self, logits: &Tensor, reps: i64) -> Result<Tensor, ModelError> {
        metric(
            self.spec.metric,
            logits,
            &self.answer.repeat([reps, 1]),
            &self.wrong.repeat([reps, 1]),
            &self.clean_logp.repeat([reps, 1]),
        )
    }

    /// The metric summed over the bucket's pairs, per group of rows.
    fn sums(&self, logits: &Tensor, reps: i64) -> Result<Vec<f64>, ModelError> {
        let v = self.metric(logits, reps)?.f_view([reps, self.b])?.f_sum_dim_intlist(
            [1i64].as_slice(),
            false,
            DType::Double,
        )?;
        Vec::<f64>::try_from(&v).map_err(|e| ModelError::Invalid(e.to_string()))
    }

    /// [`Runs::sums`] from final states `[reps x B, T', D]`: the logit difference from the two
    /// logits it reads (`Transformer::logits_of`), the other metrics from the whole next-token
    /// distribution.
    fn state_sums(&self, model: &Model, states: &Tensor, reps: i64) -> Result<Vec<f64>, ModelError> {
        if self.spec.metric != PatchMetric::LogitDiff {
            return self.sums(&last_logits(model, states)?, reps);
        }
        let t = states.size()[1];
        let ids = Tensor::f_cat(&[&self.answer, &self.wrong], 1)?.f_repeat([reps, 1])?;
        let l = model.net.logits_of(&states.f_select(1, t - 1)?, &ids)?.f_to_kind(DType::Double)?;
        let v = l.f_select(1, 0)?.f_sub(&l.f_select(1, 1)?)?.f_view([reps, self.b])?.f_sum_dim_intlist(
            [1i64].as_slice(),
            false,
            DType::Double,
        )?;
        Vec::<f64>::try_from(&v).map_err(|e| ModelError::Invalid(e.to_string()))
    }

    fn sum(&self, run: &Run) -> Result<f64, ModelError> {
        Ok(self.sums(&run.logits, 1)?.first().copied().unwrap_or(f64::NAN))
    }

    /// The run patched and the run the values come from: (corrupted, clean) when denoising.
    fn base_source(&self) -> (&Run, &Run) {
        match self.spec.direction {
            Direction::Denoise => (&self.corrupt, &self.clean),
            Direction::Noise => (&self.clean, &self.corrupt),
        }
    }
}

/// Token rows per resumed chunk (as the ablation sweep's).
const PATCH_ROWS: i64 = 2048;

/// Patches every unit of `spec.site` in every layer of the model's stack, over `pairs`.
pub fn patch(
    model: &Model,
    pairs: &[PairIds],
    spec: PatchSpec,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Patched, AnalysisError> {
    patch_only(model, pairs, spec, None, gates, stop, progress)
}

/// A unit of a patching grid: layer, position (0 for all positions) and unit.
pub type Unit = (usize, usize, usize);

/// [`patch`] of the listed units only (`None`: every unit); the others are NaN.
pub fn patch_only(
    model: &Model,
    pairs: &[PairIds],
    spec: PatchSpec,
    only: Option<&[Unit]>,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Patched, AnalysisError> {
    let _g = tch::no_grad_guard();
    let by_len = buckets(model, pairs, spec)?;
    Ok(run(model, &by_len, pairs.len(), spec, only, gates, stop, progress)?)
}

/// Token rows (patched rows x pairs x resumed positions) per resumed pass of a causal stack:
/// as many as keep a layer's widest intermediate (tokens x the MLP's width) within 12 MiB, and
/// between 256 and 8192. The allocator then serves every pass's tensors from memory it keeps:
/// from 16 MiB up it maps each allocation afresh and faults it in page by page
/// (`bound_peak_memory`, src/main.rs), which cost SmolLM2's patching a tenth of its time at
/// 8192 tokens.
fn resume_tokens(model: &Model) -> i64 {
    let net = &model.net;
    let width = net.stack.iter().map(|l| l.mlp().width()).max().unwrap_or(1).max(1);
    let bytes = model.opts.dtype.elt_size_in_bytes() as i64;
    ((12 << 20) / (width * bytes)).clamp(256, 8192)
}

/// Exact patching of a causal stack. Each patched row resumes at its layer and only at the
/// positions its patch can change (from the first position where its value differs from the
/// base run's, or from the patched position), its queries attending to the base run's keys
/// and values of the positions before; rows that start at the same position go through the
/// layers together, a layer's rows joining the batch at that layer (so the layers above run
/// on large batches). A patch that changes nothing is the base run, not run again.
#[allow(clippy::too_many_arguments)]
fn run(
    model: &Model,
    by_len: &Buckets,
    n_pairs: usize,
    spec: PatchSpec,
    only: Option<&[Unit]>,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Patched, ModelError> {
    let net = &model.net;
    if !net.causal {
        return Err(ModelError::Invalid(format!("patch: {}'s stack is not causal", model.name())));
    }
    let point = spec.site.point();
    let n_layers = net.stack.len();
    // Whether patched rows may resume at a later position over the base run's keys and values.
    let cached = net.caches_keys();
    let positions = by_len.first().map_or(0, |b| b.0);
    let (mut clean_sum, mut corrupt_sum) = (0.0, 0.0);
    // Per layer, per position (or one), per unit: the sum over pairs.
    let mut sums: Vec<Vec<Vec<f64>>> = vec![Vec::new(); n_layers];
    let steps = by_len.len() * n_layers;
    for (bi, (_, group)) in by_len.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted);
        }
        let runs = Runs::new(model, group, point, spec, gates)?;
        let (b, t) = (runs.b, runs.t);
        clean_sum += runs.sum(&runs.clean)?;
        corrupt_sum += runs.sum(&runs.corrupt)?;
        let (base, source) = runs.base_source();
        let base_sum = runs.sum(base)?;
        // Every layer's rows, grouped by the first position they change (layers ascending).
        let mut plans: Vec<Option<LayerPlan>> = Vec::with_capacity(n_layers);
        let mut by_start: BTreeMap<i64, Vec<(usize, i64)>> = BTreeMap::new();
        for (l, slot) in sums.iter_mut().enumerate() {
            match (base.values.get(l).and_then(Option::as_ref), source.values.get(l).and_then(Option::as_ref)) {
                (Some(bv), Some(sv)) => {
                    let mut plan = plan_layer(spec, bv, sv, l, only, base_sum, slot)?;
                    if !cached {
                        // No keys and values of earlier positions to attend to: every row
                        // resumes from the first position.
                        plan.rows.iter_mut().for_each(|r| r.1 = 0);
                    }
                    for &(r, from) in &plan.rows {
                        by_start.entry(from).or_default().push((l, r));
                    }
                    plans.push(Some(plan));
                }
                // A layer without heads (prune_heads) has no attention values to patch.
                _ => {
                    *slot = Vec::new();
                    plans.push(None);
                }
            }
        }
        let total: usize = by_start.values().map(Vec::len).sum();
        let mut done = 0;
        for pass in passes(&by_start, b, t, resume_tokens(model)) {
            if stop() {
                return Err(ModelError::Interrupted);
            }
            let states = resume(model, spec, &pass, &plans, base, source, gates)?;
            for (group, states) in pass.iter().zip(states) {
                for (&(l, r), v) in
                    group.entries.iter().zip(runs.state_sums(model, &states, group.entries.len() as i64)?)
                {
                    if let Some(plan) = plans.get(l).and_then(Option::as_ref) {
                        let (p, u) = plan.cell(r);
                        sums[l][p][u] += v;
                    }
                }
                done += group.entries.len();
            }
            progress(bi * n_layers + n_layers * done / total.max(1), steps);
        }
        progress((bi + 1) * n_layers, steps);
    }
    Ok(Patched::mean_of(sums, clean_sum, corrupt_sum, n_pairs, positions))
}

/// Patched rows that all start at position `from` (`entries`: `(layer, row)`, layers
/// ascending), resumed together.
struct Group<'a> {
    from: i64,
    entries: &'a [(usize, i64)],
}

/// The passes of a bucket of `b` pairs of `t` tokens: each start position's rows in groups of
/// at most `budget` resumed tokens (rows x pairs x positions from the start); the
/// full groups one pass each, the remainders (per position, all of a late start's rows: few
/// positions each) packed together, largest first, into passes of at most `budget` tokens,
/// so that their layers still run as large batches ([`resume`] finishes every group's
/// position-wise half as one).
fn passes(by_start: &BTreeMap<i64, Vec<(usize, i64)>>, b: i64, t: i64, budget: i64) -> Vec<Vec<Group<'_>>> {
    let mut out: Vec<Vec<Group>> = Vec::new();
    let mut rest: Vec<(i64, Group)> = Vec::new();
    for (&from, entries) in by_start {
        let row_tokens = (b * (t - from)).max(1);
        let per_pass = (budget / row_tokens).max(1) as usize;
        for chunk in entries.chunks(per_pass) {
            let group = Group { from, entries: chunk };
            if chunk.len() == per_pass {
                out.push(vec![group]);
            } else {
                rest.push((chunk.len() as i64 * row_tokens, group));
            }
        }
    }
    rest.sort_by_key(|(n, _)| -n);
    let mut filled: Vec<(i64, Vec<Group>)> = Vec::new();
    for (n, group) in rest {
        match filled.iter_mut().find(|(used, _)| used + n <= budget) {
            Some((used, gs)) => {
                *used += n;
                gs.push(group);
            }
            None => filled.push((n, vec![group])),
        }
    }
    out.extend(filled.into_iter().map(|(_, gs)| gs));
    out
}

/// One pass of groups of patched rows ([`Group`]), resumed by the model
/// ([`crate::model::transformer::Transformer::resume_pass`]): each layer's rows enter at their
/// layer over positions `from..` (the base run's keys and values before), as `hook_z` values
/// (the attention not recomputed), a replaced layer input, or the layer run with the point's
/// value replaced. Returns each group's final states `[rows x B, 1, D]`, rows in `entries`
/// order.
#[allow(clippy::too_many_arguments)]
fn resume(
    model: &Model,
    spec: PatchSpec,
    pass: &[Group],
    plans: &[Option<LayerPlan>],
    base: &Run,
    source: &Run,
    gates: &Gates,
) -> Result<Vec<Tensor>, ModelError> {
    let net = &model.net;
    let point = spec.site.point();
    let missing = |l: usize| ModelError::Invalid(format!("patch: layer {l} was not recorded"));
    let b = base.logits.size()[0];
    let n_layers = net.stack.len();
    let first = pass.iter().filter_map(|g| g.entries.first().map(|e| e.0)).min().unwrap_or(n_layers);
    let from: Vec<i64> = pass.iter().map(|g| g.from).collect();
    let mut cursor = vec![0usize; pass.len()];
    // Group `gi`'s rows that enter at layer `l` (its entries are in ascending layer order).
    let mut entries = |gi: usize, l: usize| -> Result<Option<Entry>, ModelError> {
        let group = &pass[gi];
        let start = cursor[gi];
        while cursor[gi] < group.entries.len() && group.entries[cursor[gi]].0 == l {
            cursor[gi] += 1;
        }
        if cursor[gi] == start {
            return Ok(None);
        }
        let plan = plans.get(l).and_then(Option::as_ref).ok_or_else(|| missing(l))?;
        let (Some(bv), Some(sv)) =
            (base.values.get(l).and_then(Option::as_ref), source.values.get(l).and_then(Option::as_ref))
        else {
            return Err(missing(l));
        };
        let rows: Vec<i64> = group.entries[start..cursor[gi]].iter().map(|e| e.1).collect();
        let n = rows.len() as i64;
        let len = plan.t - group.from;
        let patched = patched_rows(spec, plan, &rows, bv, sv)?.f_narrow(plan.pos_axis as i64, group.from, len)?;
        let x = base.inputs.get(l).ok_or_else(|| missing(l))?.f_narrow(1, group.from, len)?.f_repeat([n, 1, 1])?;
        Ok(Some(match point {
            Point::Z => Entry::Z { x, z: patched },
            Point::ResidPre => Entry::Input(patched),
            _ => Entry::Put { x, point, value: patched },
        }))
    };
    net.resume_pass(&from, first, &base.cache, b, &mut entries, gates)
}

/// Runs `n` rows of patched values and returns each row group's metric summed over its pairs.
type RunRows<'a> = dyn FnMut(&Tensor, i64) -> Result<Vec<f64>, ModelError> + 'a;

/// The patches of one layer: row `r` is unit `r % units` at position `r / units` (per
/// position) or unit `r` (all positions).
struct LayerPlan {
    units: i64,
    /// Positions, and their axis in the site's value (`[B, H, P, X]` per head, `[B, P, D]`).
    t: i64,
    pos_axis: usize,
    /// The rows that change something, each with the first position its patch changes.
    rows: Vec<(i64, i64)>,
}

impl LayerPlan {
    /// Row `r`'s place in a layer's sums: `(position or 0, unit)`.
    fn cell(&self, r: i64) -> (usize, usize) {
        ((r / self.units) as usize, (r % self.units) as usize)
    }
}

/// Plans layer `l`'s patches: `bv`, `sv` are the base and source values at the site. `sums`
/// (`[position or 0][unit]`) is shaped on first use (NaN for units outside `only`); a patch
/// that changes nothing (a position before the first token where the prompts differ, in a
/// causal model) gets `base_sum` and no row.
fn plan_layer(
    spec: PatchSpec,
    bv: &Tensor,
    sv: &Tensor,
    l: usize,
    only: Option<&[Unit]>,
    base_sum: f64,
    sums: &mut Vec<Vec<f64>>,
) -> Result<LayerPlan, ModelError> {
    let size = bv.size();
    let (units, pos_axis) = if spec.site.per_head() { (size[1], 2usize) } else { (1, 1usize) };
    let t = size[pos_axis];
    let n_pos = if spec.each_position { t } else { 1 };
    if sums.is_empty() {
        let fill = if only.is_some() { f64::NAN } else { 0.0 };
        *sums = vec![vec![fill; units as usize]; n_pos as usize];
    }
    // Where the source differs from the base, per unit and position, over the batch and the
    // features: [units][P].
    let differs = {
        let ne = sv.f_ne_tensor(bv)?;
        let per = if spec.site.per_head() {
            ne.f_any_dims([0i64, 3].as_slice(), false)?
        } else {
            ne.f_any_dims([0i64, 2].as_slice(), false)?.f_unsqueeze(0)?
        };
        Vec::<Vec<bool>>::try_from(&per.f_to_kind(DType::Int8)?.f_ne(0)?)
            .map_err(|e| ModelError::Invalid(e.to_string()))?
    };
    // The first position row r's patch changes, if any.
    let first = |r: i64| -> Option<i64> {
        let row = differs.get((r % units) as usize)?;
        if spec.each_position {
            let p = r / units;
            row.get(p as usize).copied().unwrap_or(false).then_some(p)
        } else {
            row.iter().position(|&d| d).map(|p| p as i64)
        }
    };
    let wanted: Vec<i64> = match only {
        None => (0..units * n_pos).collect(),
        Some(list) => {
            (0..units * n_pos).filter(|r| list.contains(&(l, (r / units) as usize, (r % units) as usize))).collect()
        }
    };
    let mut rows = Vec::new();
    for r in wanted {
        let slot = &mut sums[(r / units) as usize][(r % units) as usize];
        if only.is_some() && slot.is_nan() {
            *slot = 0.0;
        }
        match first(r) {
            Some(from) => rows.push((r, from)),
            None => *slot += base_sum,
        }
    }
    Ok(LayerPlan { units, t, pos_axis, rows })
}

/// The site's values for `rows` of a plan: row `j * B + b` is the base value with row
/// `rows[j]`'s unit (at its position) taken from the source.
fn patched_rows(
    spec: PatchSpec,
    plan: &LayerPlan,
    rows: &[i64],
    bv: &Tensor,
    sv: &Tensor,
) -> Result<Tensor, ModelError> {
    let size = bv.size();
    let (b, n, units, t) = (size[0], rows.len() as i64, plan.units, plan.t);
    // sel[j]: which entries row j takes from the source run.
    let mut sel_shape = vec![1i64; size.len() + 1];
    sel_shape[0] = n;
    if spec.site.per_head() {
        sel_shape[2] = units;
    }
    if spec.each_position {
        sel_shape[plan.pos_axis + 1] = t;
    }
    let numel: i64 = sel_shape.iter().product();
    let mut sel = vec![false; numel as usize];
    let per_row = (numel / n.max(1)) as usize;
    for (j, &r) in rows.iter().enumerate() {
        let (unit, pos) = (r % units, r / units);
        // Index within the row's selection: [units?, pos?] in that order.
        let idx = if spec.each_position { unit * t + pos } else { unit };
        sel[j * per_row + idx as usize] = true;
    }
    let sel = Tensor::from_slice(&sel).view(sel_shape.as_slice()).to_device(bv.device());
    let mut rows_shape = size.clone();
    rows_shape[0] = n * b;
    Ok(sv.f_unsqueeze(0)?.f_where_self(&sel, &bv.f_unsqueeze(0)?)?.f_reshape(rows_shape.as_slice())?)
}

/// Patches every unit (and position) of layer `l` whose source value differs from the base's,
/// `chunk` rows per `run_rows(patched, n)` call (which runs `n` rows of patched values, row
/// `j * B + b`, and returns each row group's metric summed over the bucket).
#[allow(clippy::too_many_arguments)]
fn patch_layer(
    spec: PatchSpec,
    l: usize,
    bv: &Tensor,
    sv: &Tensor,
    chunk: i64,
    only: Option<&[Unit]>,
    base_sum: f64,
    sums: &mut Vec<Vec<f64>>,
    run_rows: &mut RunRows,
) -> Result<(), ModelError> {
    let plan = plan_layer(spec, bv, sv, l, only, base_sum, sums)?;
    let rows: Vec<i64> = plan.rows.iter().map(|r| r.0).collect();
    for part in rows.chunks(chunk.max(1) as usize) {
        let patched = patched_rows(spec, &plan, part, bv, sv)?;
        for (&r, v) in part.iter().zip(run_rows(&patched, part.len() as i64)?) {
            let (p, u) = plan.cell(r);
            sums[p][u] += v;
        }
    }
    Ok(())
}

options_enum!(PathInput, "receiver_input", {
    /// The receiver head's query input.
    Q = "q",
    /// Its key input: the key/value head serving it (shared by its group under grouped-query
    /// attention).
    K = "k",
    /// Its value input: likewise.
    V = "v",
});

/// Where path patching's paths end (docs/methods.md#path-patching).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Receiver {
    /// One head's query, key or value input: the layer, the query head, the input.
    Head { layer: usize, head: usize, input: PathInput },
    /// The logits: the final residual stream, before the final norm.
    Logits,
}

/// Path patching (Wang et al. 2022; TransformerLens's direct path patching): for every sender
/// head `s` below the receiver, the base run in which only the receiver's input (its query,
/// key or value input, or the logits) sees `s`'s output from the source run, through the
/// residual stream and nothing else: the receiver's input becomes the base input plus what
/// `s`'s patched output adds to the residual (`(z_src - z_base)_s W^O_s`, through a norm the
/// family puts after the attention); every other head and MLP reads the base run, and the
/// receiver's changed output flows on as usual. `patched[l][0][h]` is sender `l.h`'s metric;
/// layers at and above the receiver are NaN (they send nothing to it).
pub fn path_patch(
    model: &Model,
    pairs: &[PairIds],
    spec: PatchSpec,
    receiver: Receiver,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Patched, AnalysisError> {
    let _g = tch::no_grad_guard();
    if !matches!(spec.site, Site::Z | Site::Result) || spec.each_position {
        return Err(AnalysisError::Input(format!(
            "patch: path patching sends each head's whole output (site \"z\", all positions); got site \"{}\"{}",
            spec.site,
            if spec.each_position { " per position" } else { "" }
        )));
    }
    let net = &model.net;
    let limit = match receiver {
        Receiver::Logits => net.stack.len(),
        Receiver::Head { layer, head, .. } => {
            let attn = model.attention(net.stack_kind, layer).ok_or_else(|| {
                AnalysisError::Input(format!(
                    "patch: receiver layer {layer} out of range: the model has {} layers",
                    net.stack.len()
                ))
            })?;
            if !attn.present().contains(&head) {
                return Err(AnalysisError::Input(format!(
                    "patch: the receiver {}.{layer}.{head} is not a head of this model",
                    net.stack_kind
                )));
            }
            if layer == 0 {
                return Err(AnalysisError::Input(format!(
                    "patch: the receiver {}.0.{head} is in the first layer; no head sends to it",
                    net.stack_kind
                )));
            }
            layer
        }
    };
    if let Some(l) = net.stack.iter().position(|l| l.norm_position() == crate::model::nn::NormPosition::Post) {
        return Err(AnalysisError::Input(format!("patch: path patching needs each attention to add its output to the residual stream; layer {l} norms after the sum (a post-norm layer)")));
    }
    let by_len = buckets(model, pairs, spec)?;
    Ok(path_runs(model, &by_len, pairs.len(), spec, receiver, limit, gates, stop, progress)?)
}

#[allow(clippy::too_many_arguments)]
fn path_runs(
    model: &Model,
    by_len: &Buckets,
    n_pairs: usize,
    spec: PatchSpec,
    receiver: Receiver,
    limit: usize,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Patched, ModelError> {
    let net = &model.net;
    let n_layers = net.stack.len();
    let positions = by_len.first().map_or(0, |b| b.0);
    let dev = model.device();
    let missing = |l: usize| ModelError::Invalid(format!("patch: layer {l} was not recorded"));
    let (mut clean_sum, mut corrupt_sum) = (0.0, 0.0);
    let mut sums: Vec<Vec<Vec<f64>>> = vec![Vec::new(); n_layers];
    let steps = by_len.len() * limit;
    for (bi, (_, group)) in by_len.iter().enumerate() {
        let runs = Runs::new(model, group, Point::Z, spec, gates)?;
        let (b, t) = (runs.b, runs.t);
        clean_sum += runs.sum(&runs.clean)?;
        corrupt_sum += runs.sum(&runs.corrupt)?;
        let (base, source) = runs.base_source();
        let base_sum = runs.sum(base)?;
        // The receiver's layer: its base input and the base value at the receiver's input.
        let recv = match receiver {
            Receiver::Logits => None,
            Receiver::Head { layer, head, input } => {
                let point = match input {
                    PathInput::Q => Point::Q,
                    PathInput::K => Point::K,
                    PathInput::V => Point::V,
                };
                let attn = model.attention(net.stack_kind, layer).ok_or_else(|| missing(layer))?;
                let slot = attn.present().iter().position(|&h| h == head).ok_or_else(|| missing(layer))? as i64;
                let unit = if point == Point::Q { slot } else { slot / (attn.n_heads / attn.n_kv_heads.max(1)).max(1) };
                let x = base.inputs.get(layer).ok_or_else(|| missing(layer))?.shallow_clone();
                let v = layer_value(model, layer, &x, point, gates)?;
                Some((layer, point, unit, x, v))
            }
        };
        for (l, slot) in sums.iter_mut().enumerate() {
            if stop() {
                return Err(ModelError::Interrupted);
            }
            let (Some(bv), Some(sv)) =
                (base.values.get(l).and_then(Option::as_ref), source.values.get(l).and_then(Option::as_ref))
            else {
                *slot = Vec::new();
                continue;
            };
            if l >= limit {
                *slot = vec![vec![f64::NAN; bv.size()[1] as usize]];
                continue;
            }
            let plan = plan_layer(spec, bv, sv, l, None, base_sum, slot)?;
            let rows: Vec<i64> = plan.rows.iter().map(|r| r.0).collect();
            let chunk = (resume_tokens(model) / (b * t)).max(1) as usize;
            // What the layer's attention adds to the residual in the base run.
            let r_base = net.attn_added_from_z(l, bv, &mut None)?.ok_or_else(|| missing(l))?;
            for part in rows.chunks(chunk) {
                let n = part.len() as i64;
                let z = patched_rows(spec, &plan, part, bv, sv)?;
                let delta = net
                    .attn_added_from_z(l, &z, &mut None)?
                    .ok_or_else(|| missing(l))?
                    .f_sub(&r_base.f_repeat([n, 1, 1])?)?;
                let states = match &recv {
                    None => {
                        let x = base
                            .last
                            .as_ref()
                            .ok_or_else(|| missing(n_layers - 1))?
                            .f_repeat([n, 1, 1])?
                            .f_add(&delta)?;
                        net.run(Start::Layer { layer: n_layers, x: &x, bias: None }, Stop::FinalNorm, gates, &mut None)?
                    }
                    Some((lr, point, unit, x, v)) => {
                        let xs = x.f_repeat([n, 1, 1])?;
                        // The receiver's input as the sender's path changes it, and the value
                        // there of the receiver's unit alone.
                        let seen = layer_value(model, *lr, &xs.f_add(&delta)?, *point, gates)?;
                        let mut sel = vec![false; v.size()[1] as usize];
                        if let Some(s) = sel.get_mut(*unit as usize) {
                            *s = true;
                        }
                        let sel = Tensor::from_slice(&sel).view([1, -1, 1, 1]).to_device(dev);
                        let value = seen.f_where_self(&sel, &v.f_repeat([n, 1, 1, 1])?)?;
                        let mut put = Put { at: At::new(net.stack_kind, *lr, *point), value: &value };
                        net.run(
                            Start::Layer { layer: *lr, x: &xs, bias: None },
                            Stop::FinalNorm,
                            gates,
                            &mut Some(&mut put as &mut dyn Hooks),
                        )?
                    }
                };
                for (&r, v) in part.iter().zip(runs.state_sums(model, &states, n)?) {
                    let (p, u) = plan.cell(r);
                    slot[p][u] += v;
                }
            }
            progress(bi * limit + l + 1, steps);
        }
    }
    Ok(Patched::mean_of(sums, clean_sum, corrupt_sum, n_pairs, positions))
}

/// The value at `point` of layer `l` (a query, key or value hook) when the layer reads `x`.
fn layer_value(model: &Model, l: usize, x: &Tensor, point: Point, gates: &Gates) -> Result<Tensor, ModelError> {
    let mut seen = None;
    let mut on = |at: At, v: &Tensor| {
        if at.layer == l && at.point == point {
            seen = Some(v.shallow_clone());
        }
        Ok(())
    };
    let points = [point];
    let mut rec = Record::new(&points, &mut on);
    let _output = model.net.run(
        Start::Layer { layer: l, x, bias: None },
        Stop::After(l),
        gates,
        &mut Some(&mut rec as &mut dyn Hooks),
    )?;
    seen.ok_or_else(|| ModelError::Invalid(format!("patch: layer {l} has no {point:?} value")))
}

/// A hook adding a zero that requires grad to each layer's value at one point: the gradient
/// of the metric with respect to that zero is its gradient with respect to the value, through
/// every path (a detached leaf in its place would cut the paths through later layers).
/// It also keeps each layer's value itself (detached): the base run's values.
struct Leaves {
    kind: crate::model::Kind,
    point: Point,
    leaves: Vec<Option<Tensor>>,
    values: Vec<Option<Tensor>>,
}

impl Hooks for Leaves {
    fn wants(&self, at: At) -> bool {
        at.kind == self.kind && at.point == self.point
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        let zero = x.f_zeros_like()?.set_requires_grad(true);
        if let (Some(slot), Some(value)) = (self.leaves.get_mut(at.layer), self.values.get_mut(at.layer)) {
            *slot = Some(zero.shallow_clone());
            *value = Some(x.f_detach()?);
        }
        Ok(Some(x.f_add(&zero)?))
    }
}

impl Leaves {
    /// The gradient of `m` with respect to each layer's value (`None` for a layer without one).
    fn gradients(&self, m: &Tensor) -> Result<Vec<Option<Tensor>>, ModelError> {
        let present: Vec<&Tensor> = self.leaves.iter().flatten().collect();
        let mut it = Tensor::f_run_backward(&[m], &present, false, false)?.into_iter();
        Ok(self.leaves.iter().map(|l| l.as_ref().and_then(|_| it.next())).collect())
    }
}

impl Direction {
    /// The clean and corrupted metrics from the source run's and the base run's.
    fn clean_corrupted(self, source: f64, base: f64) -> (f64, f64) {
        match self {
            Direction::Denoise => (source, base),
            Direction::Noise => (base, source),
        }
    }
}

/// Attribution patching (Nanda 2023; Syed et al. 2023; docs/methods.md#attribution-patching):
/// the first-order estimate of each patch's change of the metric,
/// `(a_source - a_base) . d metric / d a` at the base run, for every unit of `spec.site`: one
/// forward without gradients (the source run), and the base run's forward (which records its
/// values) and one backward, per bucket of pairs. Returned like [`patch`]: `patched` holds `base metric + estimate`, so that the
/// normalised effect reads as exact patching's.
pub fn attribute(
    model: &Model,
    pairs: &[PairIds],
    spec: PatchSpec,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
) -> Result<Patched, AnalysisError> {
    let by_len = buckets(model, pairs, spec)?;
    Ok(attribute_runs(model, &by_len, pairs.len(), spec, gates, stop)?)
}

fn attribute_runs(
    model: &Model,
    by_len: &Buckets,
    n_pairs: usize,
    spec: PatchSpec,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
) -> Result<Patched, ModelError> {
    let net = &model.net;
    let point = spec.site.point();
    let n_layers = net.stack.len();
    let positions = by_len.first().map_or(0, |b| b.0);
    let dev = model.device();
    let (mut clean_sum, mut corrupt_sum) = (0.0, 0.0);
    let mut sums: Vec<Vec<Vec<f64>>> = vec![Vec::new(); n_layers];
    for (_, group) in by_len.iter() {
        if stop() {
            return Err(ModelError::Interrupted);
        }
        let Bucket { clean: clean_ids, corrupted: corrupt_ids, mask, answer, wrong, .. } = Bucket::new(group, dev);
        let (base_ids, source_ids) = match spec.direction {
            Direction::Denoise => (&corrupt_ids, &clean_ids),
            Direction::Noise => (&clean_ids, &corrupt_ids),
        };
        let source = {
            let _g = tch::no_grad_guard();
            record(model, source_ids, point, gates)?
        };
        // The base run, with gradients at the point of every layer (and its values kept).
        let mut leaves = Leaves {
            kind: net.stack_kind,
            point,
            leaves: (0..n_layers).map(|_| None).collect(),
            values: (0..n_layers).map(|_| None).collect(),
        };
        let (grads, base_metric, clean_logp) =
            tch::with_grad(|| -> Result<(Vec<Option<Tensor>>, f64, Tensor), ModelError> {
                let states = net.encode(base_ids, &mask, gates, Some(&mut leaves as &mut dyn Hooks))?;
                let logits = last_logits(model, &states)?;
                // KL's reference: the clean run's distribution (the base run itself when noising).
                let clean_logits = match spec.direction {
                    Direction::Denoise => source.logits.shallow_clone(),
                    Direction::Noise => logits.f_detach()?,
                };
                let clean_logp = clean_logits.f_log_softmax(1, DType::Double)?;
                let m = metric(spec.metric, &logits, &answer, &wrong, &clean_logp)?.f_sum(DType::Double)?;
                Ok((leaves.gradients(&m)?, m.double_value(&[]), clean_logp))
            })?;
        let source_metric =
            metric(spec.metric, &source.logits, &answer, &wrong, &clean_logp)?.f_sum(DType::Double)?.double_value(&[]);
        let (c, k) = spec.direction.clean_corrupted(source_metric, base_metric);
        clean_sum += c;
        corrupt_sum += k;
        add_estimates(&mut sums, &grads, &leaves.values, &source.values, spec, base_metric)?;
    }
    Ok(Patched::mean_of(sums, clean_sum, corrupt_sum, n_pairs, positions))
}

/// Adds one bucket's first-order estimates to `sums` (`[layer][position][unit]`): per layer,
/// `(source - base) . grad` summed over the bucket's rows, the features and (for all positions)
/// the positions, plus the bucket's base metric sum, so that the means read as exact
/// patching's `patched`.
fn add_estimates(
    sums: &mut [Vec<Vec<f64>>],
    grads: &[Option<Tensor>],
    base: &[Option<Tensor>],
    source: &[Option<Tensor>],
    spec: PatchSpec,
    base_metric: f64,
) -> Result<(), ModelError> {
    for (l, slot) in sums.iter_mut().enumerate() {
        let (Some(g), Some(bv), Some(sv)) = (
            grads.get(l).and_then(|g| g.as_ref()),
            base.get(l).and_then(|v| v.as_ref()),
            source.get(l).and_then(|v| v.as_ref()),
        ) else {
            *slot = Vec::new();
            continue;
        };
        let prod = sv.f_sub(bv)?.f_mul(g)?.f_to_kind(DType::Double)?;
        let per = if spec.site.per_head() {
            // [B, H, T, X] -> [H, T]
            prod.f_sum_dim_intlist([0i64, 3].as_slice(), false, DType::Double)?
        } else {
            // [B, T, D] -> [1, T]
            prod.f_sum_dim_intlist([0i64, 2].as_slice(), false, DType::Double)?.f_unsqueeze(0)?
        };
        let per = if spec.each_position { per } else { per.f_sum_dim_intlist([1i64].as_slice(), true, DType::Double)? };
        // [units, P] -> [P][units]
        let m: Vec<Vec<f64>> = Vec::<Vec<f64>>::try_from(&per.f_transpose(0, 1)?.f_contiguous()?)
            .map_err(|e| ModelError::Invalid(e.to_string()))?;
        if slot.is_empty() {
            *slot = vec![vec![0.0; m.first().map_or(0, |r| r.len())]; m.len()];
        }
        for (acc, row) in slot.iter_mut().zip(&m) {
            for (a, v) in acc.iter_mut().zip(row) {
                *a += v + base_metric;
            }
        }
    }
    Ok(())
}

/// A pair of source sentences for a translation model, with the target both are scored on
/// (the clean source's translation), as token ids.
#[derive(Debug, Clone)]
pub struct SourcePair {
    pub clean: Vec<i64>,
    pub corrupted: Vec<i64>,
    pub target: Vec<i64>,
}

/// One teacher-forced run of a translation model over a bucket: the encoder's layer inputs,
/// the site's values of `kind` per layer, the encoder output, and the target log-probabilities.
struct SeqRun {
    inputs: Vec<Tensor>,
    values: Vec<Option<Tensor>>,
    enc: Tensor,
    logp: Tensor,
}

fn seq_record(
    model: &Model,
    src: &Tensor,
    mask: &Tensor,
    tgt: &Tensor,
    kind: crate::model::Kind,
    point: Point,
    gates: &Gates,
) -> Result<SeqRun, ModelError> {
    let net = &model.net;
    let n = if kind == crate::model::Kind::Enc { net.stack.len() } else { net.decoder.len() };
    let mut inputs = Vec::new();
    let mut values: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
    let mut on = |at: At, x: &Tensor| {
        if at.kind == crate::model::Kind::Enc && at.point == Point::ResidPre {
            inputs.push(x.shallow_clone());
        }
        if at.kind == kind && at.point == point {
            if let Some(slot) = values.get_mut(at.layer) {
                *slot = Some(x.shallow_clone());
            }
        }
        Ok(())
    };
    let points = [Point::ResidPre, point];
    let mut rec = Record::new(&points, &mut on);
    let enc = net.encode(src, mask, gates, Some(&mut rec as &mut dyn Hooks))?;
    let states = net.teacher(&enc, mask, tgt, Stop::FinalNorm, gates, Some(&mut rec as &mut dyn Hooks))?;
    Ok(SeqRun { inputs, values, enc, logp: seq_log_probs(model, &states)? })
}

/// Target log-probabilities `[R, T, V]`: float32, float64 for a float64 model.
fn seq_log_probs(model: &Model, states: &Tensor) -> Result<Tensor, ModelError> {
    model.log_probs(states, if states.kind() == DType::Double { DType::Double } else { DType::Float })
}

/// Per row, the metric over the target tokens: `logp [R, T, V]`, `tgt [R, T]`, the clean
/// run's `clean [R, T, V]` (for KL): the mean over the row's target tokens.
fn seq_metric(m: PatchMetric, logp: &Tensor, tgt: &Tensor, clean: &Tensor) -> Result<Tensor, ModelError> {
    let per_token = match m {
        PatchMetric::Loss => logp.f_gather(2, &tgt.f_unsqueeze(2)?, false)?.f_squeeze_dim(2)?.f_neg()?,
        PatchMetric::Kl => clean.f_exp()?.f_mul(&clean.f_sub(logp)?)?.f_sum_dim_intlist([2i64].as_slice(), false, logp.kind())?,
        other => return Err(ModelError::Invalid(format!("patch: metric \"{other}\" reads an answer token; a translation model's patching reads \"loss\" or \"kl\" over the clean translation"))),
    };
    Ok(per_token.f_to_kind(DType::Double)?.f_mean_dim([1i64].as_slice(), false, DType::Double)?)
}

/// A translation model's pairs by (source length, target length), checked: the metric reads
/// the clean translation, the residual stream is the encoder's or the decoder's, the sources of
/// a pair share one length. With the positions a per-position grid has and the layers of `kind`.
type SourceBuckets<'a> = BTreeMap<(usize, usize), Vec<&'a SourcePair>>;

fn source_buckets<'a>(
    model: &Model,
    pairs: &'a [SourcePair],
    spec: PatchSpec,
    kind: crate::model::Kind,
) -> Result<(SourceBuckets<'a>, usize, usize), AnalysisError> {
    use crate::model::Kind;
    let net = &model.net;
    if !model.translates() {
        return Err(AnalysisError::Input(format!("patch: {} is not a translation model", model.name())));
    }
    if !matches!(spec.metric, PatchMetric::Loss | PatchMetric::Kl) {
        return Err(AnalysisError::Input(format!("patch: metric \"{}\" reads an answer token; a translation model's patching reads \"loss\" or \"kl\" over the clean translation", spec.metric)));
    }
    if kind == Kind::Cross && !spec.site.per_head() {
        return Err(AnalysisError::Input(
            "patch: the residual stream belongs to the encoder (\"enc\") or the decoder (\"dec\"), not to \"cross\""
                .into(),
        ));
    }
    if pairs.is_empty() {
        return Err(AnalysisError::Input("patch: no pairs".into()));
    }
    let mut by_len: SourceBuckets = BTreeMap::new();
    for (i, p) in pairs.iter().enumerate() {
        if p.clean.len() != p.corrupted.len() || p.clean.is_empty() || p.target.is_empty() {
            return Err(AnalysisError::Input(format!("patch: pair {i}: the clean source has {} tokens, the corrupted {} (target {}); the sources must be of one length and none empty", p.clean.len(), p.corrupted.len(), p.target.len())));
        }
        by_len.entry((p.clean.len(), p.target.len())).or_default().push(p);
    }
    if spec.each_position && by_len.len() > 1 {
        return Err(AnalysisError::Input(
            "patch: per-position patching needs pairs of one source length and one target length".into(),
        ));
    }
    let n_layers = if kind == Kind::Enc { net.stack.len() } else { net.decoder.len() };
    let positions = by_len.keys().next().map_or(0, |&(s, t)| if kind == Kind::Enc { s } else { t });
    Ok((by_len, positions, n_layers))
}

/// One bucket of a translation model's pairs as tensors: clean and corrupted sources
/// `[B, S]`, targets `[B, T]`, the source mask.
fn source_tensors(group: &[&SourcePair], dev: tch::Device) -> (Tensor, Tensor, Tensor, Tensor) {
    let (b, s, t) = (group.len() as i64, group[0].clean.len() as i64, group[0].target.len() as i64);
    let ids = |f: &dyn Fn(&SourcePair) -> &[i64], n: i64| {
        Tensor::from_slice(&group.iter().flat_map(|p| f(p).to_vec()).collect::<Vec<i64>>()).view([b, n]).to_device(dev)
    };
    (
        ids(&|p| &p.clean, s),
        ids(&|p| &p.corrupted, s),
        ids(&|p| &p.target, t),
        Tensor::ones([b, s], (DType::Float, dev)),
    )
}

/// Attribution patching of a translation model's `kind` (docs/methods.md#attribution-patching):
/// as [`attribute`], both sources teacher-forced on the clean translation, the metric (`loss`,
/// `kl`) the mean over its tokens: one forward without gradients (the source run), the base
/// run's forward through encoder and decoder and one backward, per bucket of pairs.
pub fn attribute_translation(
    model: &Model,
    pairs: &[SourcePair],
    spec: PatchSpec,
    kind: crate::model::Kind,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
) -> Result<Patched, AnalysisError> {
    let net = &model.net;
    let (by_len, positions, n_layers) = source_buckets(model, pairs, spec, kind)?;
    let point = spec.site.point();
    let dev = model.device();
    let (mut clean_sum, mut corrupt_sum) = (0.0, 0.0);
    let mut sums: Vec<Vec<Vec<f64>>> = vec![Vec::new(); n_layers];
    for group in by_len.values() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let (src_c, src_k, tgt, mask) = source_tensors(group, dev);
        let (base_src, source_src) = match spec.direction {
            Direction::Denoise => (&src_k, &src_c),
            Direction::Noise => (&src_c, &src_k),
        };
        let source = {
            let _g = tch::no_grad_guard();
            seq_record(model, source_src, &mask, &tgt, kind, point, gates)?
        };
        let mut leaves = Leaves {
            kind,
            point,
            leaves: (0..n_layers).map(|_| None).collect(),
            values: (0..n_layers).map(|_| None).collect(),
        };
        let (grads, base_metric, clean_lp) =
            tch::with_grad(|| -> Result<(Vec<Option<Tensor>>, f64, Tensor), ModelError> {
                let enc = net.encode(base_src, &mask, gates, Some(&mut leaves as &mut dyn Hooks))?;
                let states =
                    net.teacher(&enc, &mask, &tgt, Stop::FinalNorm, gates, Some(&mut leaves as &mut dyn Hooks))?;
                let logp = seq_log_probs(model, &states)?;
                // KL's reference: the clean run's distribution (the base run itself when noising).
                let clean_lp = match spec.direction {
                    Direction::Denoise => source.logp.shallow_clone(),
                    Direction::Noise => logp.f_detach()?,
                };
                let m = seq_metric(spec.metric, &logp, &tgt, &clean_lp)?.f_sum(DType::Double)?;
                Ok((leaves.gradients(&m)?, m.double_value(&[]), clean_lp))
            })?;
        let source_metric =
            seq_metric(spec.metric, &source.logp, &tgt, &clean_lp)?.f_sum(DType::Double)?.double_value(&[]);
        let (c, k) = spec.direction.clean_corrupted(source_metric, base_metric);
        clean_sum += c;
        corrupt_sum += k;
        add_estimates(&mut sums, &grads, &leaves.values, &source.values, spec, base_metric)?;
    }
    Ok(Patched::mean_of(sums, clean_sum, corrupt_sum, pairs.len(), positions))
}

/// Activation patching of a translation model's heads of `kind` (`enc`, `dec`, `cross`; or the
/// residual stream of the encoder (`enc`) or decoder (`dec`)): the corrupted source run with one
/// unit's value from the clean source's run (denoising), both teacher-forced on the pair's
/// target (the clean translation), the metric (`loss`, `kl`) the mean over its tokens, averaged
/// over the pairs. Encoder patches resume the encoder at the patched layer and run the decoder
/// on every row; decoder-side patches run the decoder over the encoder output computed once.
#[allow(clippy::too_many_arguments)]
pub fn patch_translation(
    model: &Model,
    pairs: &[SourcePair],
    spec: PatchSpec,
    kind: crate::model::Kind,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Patched, AnalysisError> {
    use crate::model::Kind;
    let _g = tch::no_grad_guard();
    let net = &model.net;
    let (by_len, positions, n_layers) = source_buckets(model, pairs, spec, kind)?;
    let point = spec.site.point();
    let dev = model.device();
    let (mut clean_sum, mut corrupt_sum) = (0.0, 0.0);
    let mut sums: Vec<Vec<Vec<f64>>> = vec![Vec::new(); n_layers];
    let total = by_len.len() * n_layers;
    let mut done = 0;
    for group in by_len.values() {
        let (b, s, t) = (group.len() as i64, group[0].clean.len() as i64, group[0].target.len() as i64);
        let (src_c, src_k, tgt, mask) = source_tensors(group, dev);
        let clean = seq_record(model, &src_c, &mask, &tgt, kind, point, gates)?;
        let corrupt = seq_record(model, &src_k, &mask, &tgt, kind, point, gates)?;
        let sum_of = |logp: &Tensor, reps: i64| -> Result<Tensor, ModelError> {
            seq_metric(spec.metric, logp, &tgt.repeat([reps, 1]), &clean.logp.repeat([reps, 1, 1]))
        };
        clean_sum += sum_of(&clean.logp, 1)?.f_sum(DType::Double)?.double_value(&[]);
        corrupt_sum += sum_of(&corrupt.logp, 1)?.f_sum(DType::Double)?.double_value(&[]);
        let (base, source) = match spec.direction {
            Direction::Denoise => (&corrupt, &clean),
            Direction::Noise => (&clean, &corrupt),
        };
        let base_sum = sum_of(&base.logp, 1)?.f_sum(DType::Double)?.double_value(&[]);
        let bias = net.self_bias(&mask, base.enc.kind());
        // Rows per chunk: about PATCH_ROWS token rows, and the log-probabilities of a chunk
        // (rows x T x V floats, twice with KL's clean copy) near 256 MB.
        let v = net.output.as_ref().map_or(1, |o| o.w.size()[0]);
        let chunk = (PATCH_ROWS / (b * s.max(t))).min((256 << 20) / (b * t * v * 8).max(1)).max(1);
        for (l, slot) in sums.iter_mut().enumerate() {
            if stop() {
                return Err(ModelError::Interrupted.into());
            }
            let (Some(bv), Some(sv)) =
                (base.values.get(l).and_then(|v| v.as_ref()), source.values.get(l).and_then(|v| v.as_ref()))
            else {
                *slot = Vec::new();
                done += 1;
                progress(done, total);
                continue;
            };
            let mut run_rows = |patched: &Tensor, n: i64| -> Result<Vec<f64>, ModelError> {
                let masks = mask.repeat([n, 1]);
                let tgts = tgt.repeat([n, 1]);
                let at = At::new(kind, l, point);
                let mut put = Put { at, value: patched };
                let states = if kind == Kind::Enc {
                    let x = base
                        .inputs
                        .get(l)
                        .ok_or_else(|| ModelError::Invalid(format!("encoder layer {l}: no recorded input")))?
                        .repeat([n, 1, 1]);
                    let biases = bias.repeat([n, 1, 1, 1]);
                    let enc = match point {
                        Point::Z => net.run(
                            Start::Z { layer: l, x: &x, z: patched, bias: Some(&biases) },
                            Stop::FinalNorm,
                            gates,
                            &mut None,
                        )?,
                        Point::ResidPre => net.run(
                            Start::Layer { layer: l, x: patched, bias: Some(&biases) },
                            Stop::FinalNorm,
                            gates,
                            &mut None,
                        )?,
                        _ => net.run(
                            Start::Layer { layer: l, x: &x, bias: Some(&biases) },
                            Stop::FinalNorm,
                            gates,
                            &mut Some(&mut put as &mut dyn Hooks),
                        )?,
                    };
                    net.teacher(&enc, &masks, &tgts, Stop::FinalNorm, gates, None)?
                } else {
                    net.teacher(
                        &base.enc.repeat([n, 1, 1]),
                        &masks,
                        &tgts,
                        Stop::FinalNorm,
                        gates,
                        Some(&mut put as &mut dyn Hooks),
                    )?
                };
                let vals = sum_of(&seq_log_probs(model, &states)?, n)?.f_view([n, b])?.f_sum_dim_intlist(
                    [1i64].as_slice(),
                    false,
                    DType::Double,
                )?;
                Vec::<f64>::try_from(&vals).map_err(|e| ModelError::Invalid(e.to_string()))
            };
            patch_layer(spec, l, bv, sv, chunk, None, base_sum, slot, &mut run_rows)?;
            done += 1;
            progress(done, total);
        }
    }
    Ok(Patched::mean_of(sums, clean_sum, corrupt_sum, pairs.len(), positions))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row lands in exactly one pass, in its start's order; no pass exceeds the budget;
    /// the remainders of late starts share passes.
    #[test]
    fn passes_cover_every_row_once_within_the_budget() {
        let mut by_start: BTreeMap<i64, Vec<(usize, i64)>> = BTreeMap::new();
        for (from, rows) in [(0i64, 9usize), (2, 9), (4, 9), (5, 9)] {
            by_start.insert(from, (0..rows).map(|r| (r / 3, r as i64)).collect());
        }
        let (b, t, budget) = (2, 6, 30);
        let ps = passes(&by_start, b, t, budget);
        let mut seen: BTreeMap<i64, Vec<(usize, i64)>> = BTreeMap::new();
        for p in &ps {
            let tokens: i64 = p.iter().map(|g| g.entries.len() as i64 * b * (t - g.from)).sum();
            assert!(tokens <= budget, "a pass of {tokens} tokens over the budget {budget}");
            for g in p {
                seen.entry(g.from).or_default().extend_from_slice(g.entries);
            }
        }
        // Start 0: 12 tokens a row, 2 rows a pass (4 full passes, a remainder of 1 row).
        assert_eq!(ps.iter().filter(|p| p.len() == 1 && p[0].from == 0 && p[0].entries.len() == 2).count(), 4);
        // Start 5: 2 tokens a row, all 9 rows a remainder that shares a pass.
        assert!(ps.iter().any(|p| p.len() > 1 && p.iter().any(|g| g.from == 5)));
        assert_eq!(seen, by_start);
    }
}
