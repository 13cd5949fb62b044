//! Head pruning with Hard Concrete gates and an L0 penalty (docs/methods.md#hard-concrete-gates-and-l0-pruning "Hard Concrete gates and
//! pruning"; Voita et al. 2019 section 6, Louizos et al. 2018).
//!
//! One `log_alpha` per gated head. Each step samples one gate per head (shared by the batch),
//! runs the model with those gates (masks go into `forward`; weights are never edited), and
//! takes an Adam step on `log_alpha` for `task + lambda * sum P(g != 0)`. The run is a pure
//! function of (model, data, options): the batch of step `t` and its noise are derived from
//! `(seed, t)`, so a run resumed from a checkpoint ends with the same gates as one that was
//! never interrupted. Nothing here prints; progress and interruption go through callbacks.

pub mod checkpoint;
pub mod duo;
pub mod experts;
pub mod physical;
pub mod strategies;

use crate::analysis::ablation::{self, Metric, Prepared};
use crate::analysis::AnalysisError;
use crate::data::Dataset;
use crate::model::nn::Gates;
use crate::model::{HeadId, Kind, Model, ModelError};
use crate::optspec::{opt_bool, opt_f64, opt_int, opt_str, OptSpec};
use std::path::PathBuf;
use tch::{Device, Kind as DType, Tensor};

/// A gate whose P(open) lies in this range has not settled (docs/methods.md#hard-concrete-gates-and-l0-pruning).
pub const UNSETTLED: std::ops::Range<f64> = 0.1..0.9;
/// The share of unsettled gates above which a result says so and suggests more steps.
pub const UNSETTLED_SHARE: f64 = 0.1;

/// The Hard Concrete distribution's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Concrete {
    /// Temperature (0.33; Louizos' 2/3 is an option).
    pub beta: f64,
    /// Stretch interval `(l, r)`.
    pub l: f64,
    pub r: f64,
    pub eps: f64,
}

impl Default for Concrete {
    fn default() -> Self {
        const BETA: f64 = BETA_OPTION.default.float();
        Concrete { beta: BETA, l: -0.1, r: 1.1, eps: 1e-6 }
    }
}

impl Concrete {
    /// A training gate from uniform noise `u` in (eps, 1-eps):
    /// `clip(sigmoid((log u - log(1-u) + log_alpha) / beta) * (r - l) + l, 0, 1)`.
    pub fn sample(&self, log_alpha: &Tensor, u: &Tensor) -> Tensor {
        let s = ((u.log() - (-u + 1.0).log() + log_alpha) / self.beta).sigmoid();
        (s * (self.r - self.l) + self.l).clamp(0.0, 1.0)
    }

    /// `P(g != 0) = sigmoid(log_alpha - beta * log(-l / r))`.
    pub fn p_open(&self, log_alpha: &Tensor) -> Tensor {
        (log_alpha - self.beta * (-self.l / self.r).ln()).sigmoid()
    }

    /// Evaluation gates.
    pub fn eval(&self, log_alpha: &Tensor, mode: EvalGates) -> Tensor {
        match mode {
            // P(g = 1) > P(g = 0): by the symmetry of the stretch (l = -0.1, r = 1.1) this is
            // log_alpha > 0; computed from the two probabilities so other limits stay right.
            EvalGates::Binary => {
                let logit = |p: f64| (p / (1.0 - p)).ln();
                // P(g=0) = P(s < -l/(r-l)), P(g=1) = P(s > (1-l)/(r-l)), with
                // P(s < x) = sigmoid(beta * logit(x) - log_alpha).
                let lo = self.beta * logit(-self.l / (self.r - self.l));
                let hi = self.beta * logit((1.0 - self.l) / (self.r - self.l));
                let p0 = (-log_alpha + lo).sigmoid();
                let p1 = -(-log_alpha + hi).sigmoid() + 1.0;
                p1.gt_tensor(&p0).to_kind(DType::Float)
            }
            EvalGates::Continuous => (log_alpha.sigmoid() * (self.r - self.l) + self.l).clamp(0.0, 1.0),
        }
    }
}

options_enum!(EvalGates, "eval_gates", { Binary = "binary", Continuous = "continuous" });
options_enum!(PenaltyScale, "penalty_scale", { PerHead = "per_head", PerLayer = "per_layer" });
options_enum!(Distill, "distill", { Cosine = "cosine", Mse = "mse" });

/// Initial `log_alpha`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// `U(-0.61, 0.61)`.
    Uniform,
    Constant(f64),
}

impl std::fmt::Display for Init {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Init::Uniform => f.write_str("uniform(-0.61, 0.61)"),
            Init::Constant(c) => write!(f, "{c}"),
        }
    }
}

/// `prune`'s options with a fixed default, declared once: its script option list holds them,
/// and [`PruneOptions::new`] (and [`Concrete`]'s `Default`) read them.
pub const LAMBDA_OPTION: OptSpec = opt_f64("lambda", 0.05, "weight of the L0 penalty");
pub const STEPS_OPTION: OptSpec = opt_int("steps", 500, "training steps");
pub const LR_OPTION: OptSpec = opt_f64("lr", 0.01, "Adam's learning rate for the gates");
pub const MODEL_LR_OPTION: OptSpec = opt_f64("model_lr", 1e-5, "Adam's learning rate for the weights (joint: true)");
pub const BATCH_TOKENS_OPTION: OptSpec = opt_int("batch_tokens", 2000, "tokens per training batch");
pub const JOINT_OPTION: OptSpec = opt_bool("joint", false, "train the model's weights too, on a copy");
pub const SEED_OPTION: OptSpec = opt_int("seed", 1, "seed of the batches and the gates' noise");
pub const EVAL_EVERY_OPTION: OptSpec = opt_int("eval_every", 50, "steps between evaluations");
pub const RESUME_OPTION: OptSpec = opt_bool("resume", false, "resume the run in 'checkpoint'");
pub const BETA_OPTION: OptSpec = opt_f64("beta", 0.33, "Hard Concrete temperature");
/// The largest `init` in size: a gate's log_alpha past it is open or shut beyond float32's
/// resolution anyway (and 1e300 does not fit a float32).
pub const MAX_INIT: f64 = 1000.0;
pub const INIT_OPTION: OptSpec = opt_str("init", "uniform", "initial log_alpha: \"uniform\" or a number");
pub const DEFAULT_PENALTY_SCALE: PenaltyScale = PenaltyScale::PerHead;
pub const PENALTY_SCALE_OPTION: OptSpec =
    opt_str("penalty_scale", DEFAULT_PENALTY_SCALE.name(), "\"per_head\" or \"per_layer\"");
pub const DEFAULT_DISTILL: Distill = Distill::Cosine;
pub const DISTILL_OPTION: OptSpec =
    opt_str("distill", DEFAULT_DISTILL.name(), "encoders' objective: \"cosine\" or \"mse\"");
pub const DEFAULT_EVAL_GATES: EvalGates = EvalGates::Binary;
pub const EVAL_GATES_OPTION: OptSpec =
    opt_str("eval_gates", DEFAULT_EVAL_GATES.name(), "\"binary\" or \"continuous\" gates after training");

/// Pruning's options, typed. [`PruneOptions::new`] gives the defaults above.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    pub lambda: f64,
    pub steps: usize,
    pub lr: f64,
    pub batch_tokens: usize,
    /// Gated kinds, in the model's order.
    pub kinds: Vec<Kind>,
    pub joint: bool,
    /// Adam's learning rate for the model's weights (`joint: true`).
    pub model_lr: f64,
    pub seed: u64,
    /// A dataset evaluated every `eval_every` steps and at the end.
    pub eval_data: Option<Dataset>,
    pub eval_every: usize,
    pub checkpoint: Option<PathBuf>,
    pub resume: bool,
    pub concrete: Concrete,
    pub init: Init,
    pub penalty_scale: PenaltyScale,
    pub distill: Distill,
    pub eval_gates: EvalGates,
    /// Targeted L0 (Sheared-LLaMA, Xia et al. 2024): the expected number of open heads the
    /// run is held to, by a Lagrangian `l1 d + l2 d^2`, `d = (s - t) / n` (n trainable heads),
    /// whose multipliers rise by gradient ascent (`lr`), instead of `lambda s`.
    pub target: Option<f64>,
    /// The view's ablation mode when closed heads are not zeroed ("mean per position of DATA
    /// (digest)", ...): echoed, and a checkpoint resumes only under the same.
    pub ablation: Option<String>,
}

impl PruneOptions {
    /// Every option at its default (the constants above), gating these kinds: what
    /// `m.prune(data)` runs with on a model whose kinds these are.
    pub fn new(kinds: Vec<Kind>) -> Self {
        const LAMBDA: f64 = LAMBDA_OPTION.default.float();
        const STEPS: i64 = STEPS_OPTION.default.int();
        const LR: f64 = LR_OPTION.default.float();
        const MODEL_LR: f64 = MODEL_LR_OPTION.default.float();
        const BATCH: i64 = BATCH_TOKENS_OPTION.default.int();
        const JOINT: bool = JOINT_OPTION.default.bool();
        const SEED: i64 = SEED_OPTION.default.int();
        const EVAL_EVERY: i64 = EVAL_EVERY_OPTION.default.int();
        const RESUME: bool = RESUME_OPTION.default.bool();
        const UNIFORM: bool = crate::optspec::str_eq(INIT_OPTION.default.str(), "uniform");
        const _: () = assert!(UNIFORM, "prune's init default is \"uniform\"");
        PruneOptions {
            lambda: LAMBDA,
            steps: STEPS as usize,
            lr: LR,
            batch_tokens: BATCH as usize,
            kinds,
            joint: JOINT,
            model_lr: MODEL_LR,
            seed: SEED as u64,
            eval_data: None,
            eval_every: EVAL_EVERY as usize,
            checkpoint: None,
            resume: RESUME,
            concrete: Concrete::default(),
            init: Init::Uniform,
            penalty_scale: DEFAULT_PENALTY_SCALE,
            distill: DEFAULT_DISTILL,
            eval_gates: DEFAULT_EVAL_GATES,
            target: None,
            ablation: None,
        }
    }

    pub fn echo(&self) -> crate::output::Echo {
        use serde_json::json;
        let mut v: crate::output::Echo = vec![
            ("lambda".into(), json!(self.lambda)),
            ("steps".into(), json!(self.steps)),
            ("lr".into(), json!(self.lr)),
            ("batch_tokens".into(), json!(self.batch_tokens)),
            ("kinds".into(), crate::output::echo_list(&self.kinds)),
            ("joint".into(), json!(self.joint)),
            ("model_lr".into(), json!(self.model_lr)),
            ("seed".into(), json!(self.seed)),
            ("eval_every".into(), json!(self.eval_every)),
            ("beta".into(), json!(self.concrete.beta)),
            ("init".into(), json!(self.init.to_string())),
            ("penalty_scale".into(), json!(self.penalty_scale.to_string())),
            ("distill".into(), json!(self.distill.to_string())),
            ("eval_gates".into(), json!(self.eval_gates.to_string())),
        ];
        // Only when set: checkpoints written before targeted L0 still resume.
        if let Some(t) = self.target {
            v.push(("target".into(), json!(t)));
        }
        if let Some(a) = &self.ablation {
            v.push(("ablation".into(), json!(a)));
        }
        v
    }

    /// Options that must match for a checkpoint to be resumed (steps may grow).
    pub fn run_defining(&self) -> crate::output::Echo {
        self.echo().into_iter().filter(|(k, _)| !matches!(k.as_str(), "steps" | "eval_every")).collect()
    }

    /// Refuses `resume` without a checkpoint directory to resume from.
    pub fn check_resume(&self) -> Result<(), String> {
        if self.resume && self.checkpoint.is_none() {
            return Err("prune: resume: true needs a checkpoint directory (option 'checkpoint')".into());
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), String> {
        self.check_resume()?;
        check_training("prune", self.lambda, self.lr, self.steps)?;
        if !(self.model_lr > 0.0 && self.model_lr <= MAX_LR) {
            return Err(format!("prune: model_lr must be > 0 and at most {MAX_LR:e}, got {}", self.model_lr));
        }
        if self.batch_tokens == 0 {
            return Err("prune: batch_tokens must be at least 1, got 0".into());
        }
        if self.eval_every == 0 {
            return Err("prune: eval_every must be at least 1, got 0".into());
        }
        check_beta("prune", &self.concrete)?;
        if let Init::Constant(c) = self.init {
            if !(c.is_finite() && c.abs() <= MAX_INIT) {
                return Err(format!(
                    "prune: option 'init' (a log_alpha) must be \"uniform\" or a number between -{MAX_INIT} and {MAX_INIT}, got {c:e}"
                ));
            }
        }
        if self.kinds.is_empty() {
            return Err("prune: kinds is empty: gate at least one attention kind".into());
        }
        if let Some(t) = self.target {
            if !(t >= 0.0 && t.is_finite()) {
                return Err(format!("prune: target must be a number of heads >= 0, got {t}"));
            }
        }
        Ok(())
    }
}

/// The checks every gate training shares (`prune`, `learn_duo`, `learn_prulong`; `who` names
/// the verb in the one-line error): a penalty weight `lambda >= 0`, a learning rate `lr > 0`
/// (both finite) and at least one step.
pub(crate) fn check_training(who: &str, lambda: f64, lr: f64, steps: usize) -> Result<(), String> {
    if !(0.0..=MAX_LAMBDA).contains(&lambda) {
        return Err(format!("{who}: lambda must be between 0 and {MAX_LAMBDA:e}, got {lambda}"));
    }
    if steps == 0 {
        return Err(format!("{who}: steps must be at least 1, got 0"));
    }
    if !(lr > 0.0 && lr <= MAX_LR) {
        return Err(format!("{who}: lr must be > 0 and at most {MAX_LR:e}, got {lr}"));
    }
    Ok(())
}

/// The largest penalty weight: the gates are float32, and a penalty gradient past ~1e19 squares
/// to infinity in Adam's second moment (the gates become NaN); useful values are below 10.
pub const MAX_LAMBDA: f64 = 1e6;
/// The largest learning rate (Adam's steps are about `lr` each: past this the log-alphas leave
/// any range a sigmoid distinguishes, and float32 overflows).
pub const MAX_LR: f64 = 1e3;

/// Hard Concrete's constants: a temperature in [0.01, 100] (float32 gates divide by it), a stretch `-10 <= l < 0`, `1 < r <= 11`
/// (Louizos et al.: -0.1 and 1.1; far wider, float32 gates lose their gradient) and
/// a noise margin `0 < eps < 0.5` (NaN refused everywhere).
pub(crate) fn check_beta(who: &str, concrete: &Concrete) -> Result<(), String> {
    let Concrete { beta, l, r, eps } = *concrete;
    if !(0.01..=100.0).contains(&beta) {
        return Err(format!("{who}: beta must be between 0.01 and 100, got {beta}"));
    }
    if !((-10.0..0.0).contains(&l) && r > 1.0 && r <= 11.0) {
        return Err(format!(
            "{who}: the Hard Concrete stretch must have -10 <= l < 0 and 1 < r <= 11, got l = {l}, r = {r}"
        ));
    }
    if !(eps > 0.0 && eps < 0.5) {
        return Err(format!("{who}: the Hard Concrete noise margin eps must be in (0, 0.5), got {eps}"));
    }
    Ok(())
}

/// One recorded step of the training curve.
#[derive(Debug, Clone, PartialEq)]
pub struct CurvePoint {
    pub step: usize,
    /// The task loss of the step's batch (cross-entropy or distillation).
    pub loss: f64,
    /// `L_C` (scaled as the options say).
    pub penalty: f64,
    /// `sum P(g != 0)`: the expected number of open heads.
    pub expected_open: f64,
    /// Heads open under the evaluation gates.
    pub open: usize,
    /// The evaluation metric on the eval data, at eval steps.
    pub eval: Option<f64>,
}

/// Gated kinds and their shapes, with each kind's offset into the flat parameter vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub kinds: Vec<(Kind, usize, usize)>,
    /// Heads held closed: removed by `prune_heads`, or masked by the view being pruned. Their
    /// gates stay 0 and they add nothing to the penalty, so a run on a physically pruned
    /// model equals the run on the original with those heads masked.
    pub held: Vec<HeadId>,
}

impl Layout {
    pub fn new(model: &Model, kinds: &[Kind], masked: &[HeadId]) -> Result<Layout, ModelError> {
        let mut v = Vec::new();
        for s in model.kinds() {
            if kinds.contains(&s.kind) {
                v.push((s.kind, s.n_layers, s.n_heads));
            }
        }
        for k in kinds {
            model.kind_shape(*k)?;
        }
        let mut held: Vec<HeadId> = model
            .removed
            .iter()
            .chain(masked)
            .chain(&model.absent())
            .filter(|h| kinds.contains(&h.kind))
            .copied()
            .collect();
        held.sort();
        held.dedup();
        Ok(Layout { kinds: v, held })
    }
    /// 1 for a trainable gate, 0 for a held one, in flat order.
    pub fn keep(&self) -> Vec<f32> {
        (0..self.len()).map(|i| if self.held.contains(&self.head(i)) { 0.0 } else { 1.0 }).collect()
    }
    pub fn len(&self) -> usize {
        self.kinds.iter().map(|(_, l, h)| l * h).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The gates that can open: every gate but the held ones (removed, masked by the view, or
    /// absent from a hybrid's layers without heads).
    pub fn trainable(&self) -> usize {
        self.len() - self.held.len()
    }
    pub fn n_layers(&self) -> usize {
        self.kinds.iter().map(|(_, l, _)| l).sum()
    }
    /// Per-kind gates `[1, L, H]` from a flat vector `[N]`.
    pub fn gates(&self, flat: &Tensor) -> Gates {
        let mut g = Gates::none();
        let mut off = 0i64;
        for &(k, l, h) in &self.kinds {
            let t = flat.narrow(0, off, (l * h) as i64).view([1, l as i64, h as i64]);
            off += (l * h) as i64;
            match k {
                Kind::Enc => g.enc = Some(t),
                Kind::Dec => g.dec = Some(t),
                Kind::Cross => g.cross = Some(t),
            }
        }
        g
    }
    /// Per-kind `[layer][head]` values of a flat host vector.
    pub fn split(&self, flat: &[f64]) -> crate::model::KindGrids {
        let mut out = Vec::new();
        let mut off = 0;
        for &(k, l, h) in &self.kinds {
            out.push((k, (0..l).map(|i| flat[off + i * h..off + (i + 1) * h].to_vec()).collect()));
            off += l * h;
        }
        out
    }
    pub fn head(&self, index: usize) -> HeadId {
        let mut off = 0;
        for &(kind, l, h) in &self.kinds {
            if index < off + l * h {
                let i = index - off;
                return HeadId { kind, layer_idx: i / h, head: i % h };
            }
            off += l * h;
        }
        HeadId { kind: Kind::Enc, layer_idx: 0, head: 0 }
    }
}

/// The trainable state: everything a checkpoint holds.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainState {
    /// Steps done.
    pub step: usize,
    pub log_alpha: Vec<f32>,
    pub adam_m: Vec<f32>,
    pub adam_v: Vec<f32>,
    pub curve: Vec<CurvePoint>,
    /// Targeted L0's multipliers `(l1, l2)` (0 without a target).
    pub lagrange: [f64; 2],
}

impl TrainState {
    /// One Adam step (as torch.optim.Adam, no weight decay; on the host, moments in f32) on the
    /// parameters from their gradient, the `t`-th step; each result clipped to `clip` if given.
    pub fn adam(&mut self, grad: &[f32], lr: f64, t: usize, clip: Option<(f64, f64)>) {
        let (b1, b2, eps) = ADAM;
        let (bc1, bc2) = (1.0 - b1.powi(t as i32), 1.0 - b2.powi(t as i32));
        for (i, &g) in grad.iter().enumerate().take(self.log_alpha.len()) {
            let gi = g as f64;
            let m = b1 * self.adam_m[i] as f64 + (1.0 - b1) * gi;
            let v = b2 * self.adam_v[i] as f64 + (1.0 - b2) * gi * gi;
            self.adam_m[i] = m as f32;
            self.adam_v[i] = v as f32;
            let next = self.log_alpha[i] as f64 - lr * (m / bc1) / ((v / bc2).sqrt() + eps);
            self.log_alpha[i] = clip.map_or(next, |(lo, hi)| next.clamp(lo, hi)) as f32;
        }
    }
}

/// What a finished run returns.
pub struct PruneRun {
    pub layout: Layout,
    pub state: TrainState,
    pub options: PruneOptions,
    /// "references", "teacher" (the unpruned model's greedy output) or "distill".
    pub objective: String,
    pub eval_metric: Option<String>,
    pub resumed_from: Option<usize>,
    pub model: String,
    pub dataset: String,
    /// Wall time of each step this process ran (a resumed run's earlier steps are not here).
    pub step_seconds: Vec<f64>,
    /// With `joint: true`, the model with its trained weights (frozen again).
    pub trained: Option<Model>,
}

impl PruneRun {
    fn tensor(&self, v: &[f32]) -> Tensor {
        Tensor::from_slice(v)
    }
    pub fn log_alpha(&self) -> crate::model::KindGrids {
        self.layout.split(&self.state.log_alpha.iter().map(|&x| x as f64).collect::<Vec<_>>())
    }
    pub fn eval_gates(&self) -> Vec<f64> {
        let g = self.options.concrete.eval(&self.tensor(&self.state.log_alpha), self.options.eval_gates)
            * self.tensor(&self.layout.keep());
        Vec::<f64>::try_from(g.to_kind(DType::Double)).unwrap_or_default()
    }
    pub fn p_open(&self) -> Vec<f64> {
        let p = self.options.concrete.p_open(&self.tensor(&self.state.log_alpha)) * self.tensor(&self.layout.keep());
        Vec::<f64>::try_from(p.to_kind(DType::Double)).unwrap_or_default()
    }
    /// The gates not yet settled, of those trained: P(open) within [`UNSETTLED`] (a head open
    /// or closed by a small margin, which more steps would decide), and how many were trained.
    pub fn unsettled(&self) -> (usize, usize) {
        let keep = self.layout.keep();
        let p = self.p_open();
        let trained = keep.iter().filter(|&&k| k != 0.0).count();
        let open = p.iter().zip(&keep).filter(|(p, &k)| k != 0.0 && UNSETTLED.contains(*p)).count();
        (open, trained)
    }
    /// Heads whose evaluation gate is 0.
    pub fn closed(&self) -> Vec<HeadId> {
        self.eval_gates().iter().enumerate().filter(|(_, &g)| g == 0.0).map(|(i, _)| self.layout.head(i)).collect()
    }
    pub fn retained(&self) -> Vec<HeadId> {
        self.eval_gates().iter().enumerate().filter(|(_, &g)| g != 0.0).map(|(i, _)| self.layout.head(i)).collect()
    }
}

/// Batches, targets and (for distillation) the unpruned model's final states.
struct TrainData {
    prep: Prepared,
    distill_full: Vec<Option<Tensor>>,
}

pub(crate) fn mix(a: u64, b: u64) -> u64 {
    // splitmix64 of a combination: a well-spread seed per (seed, step).
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(b).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The batch used at `step`: each epoch visits every batch once, in an order drawn from
/// `(seed, epoch)`.
pub(crate) fn batch_at(seed: u64, step: usize, n: usize) -> usize {
    let (epoch, i) = (step / n, step % n);
    permutation(n, mix(seed, epoch as u64))[i]
}

/// A permutation of `0..n` drawn from `seed` (Fisher-Yates over splitmix64 of `(seed, j)`):
/// an epoch's batch order, the random pruning baseline's draw.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for j in (1..n).rev() {
        let r = (mix(seed, j as u64) % (j as u64 + 1)) as usize;
        p.swap(j, r);
    }
    p
}

pub(crate) fn host32(t: &Tensor) -> Result<Vec<f32>, ModelError> {
    Ok(Vec::<f32>::try_from(t.to_device(Device::Cpu).to_kind(DType::Float))?)
}

impl TrainData {
    fn new(model: &Model, data: &Dataset, batch_tokens: usize, base: Gates) -> Result<TrainData, AnalysisError> {
        // The task loss where the model has one (a language model's next-token loss, a translation
        // model's teacher-forced loss); an encoder distils its unpruned states.
        let metric = if model.has_task_loss() { Metric::Loss } else { Metric::Cosine };
        let prep = ablation::prepare(model, data, metric, batch_tokens, base)?;
        let n = prep.batches.len();
        Ok(TrainData { prep, distill_full: (0..n).map(|_| None).collect() })
    }
}

/// The task loss of one batch under `gates` (differentiable in the gates).
fn task_loss(
    model: &Model,
    original: &Model,
    td: &mut TrainData,
    bi: usize,
    gates: &Gates,
    distill: Distill,
) -> Result<Tensor, ModelError> {
    let b = &td.prep.batches[bi];
    let enc = model.net.encode(&b.ids, &b.mask, gates, None)?;
    if let Some((t, tm)) = &b.targets {
        return model.task_loss(&enc, &b.mask, t, tm, gates);
    }
    if td.distill_full[bi].is_none() {
        let _g = tch::no_grad_guard();
        td.distill_full[bi] = Some(original.net.encode(&b.ids, &b.mask, &td.prep.base, None)?);
    }
    let full = td.distill_full[bi].as_ref().ok_or(ModelError::NoOutputHead)?;
    let m = b.mask.to_kind(DType::Float);
    let per_tok = match distill {
        Distill::Cosine => -Tensor::cosine_similarity(&enc, full, -1, 1e-8) + 1.0,
        Distill::Mse => (&enc - full).pow_tensor_scalar(2).mean_dim(-1, false, DType::Float),
    };
    Ok((per_tok * &m).sum(DType::Float) / m.sum(DType::Float))
}

/// The weights of joint training: a fresh copy of the model, made trainable, with Adam's
/// moments per tensor.
struct Joint {
    model: Model,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl Joint {
    fn new(original: &Model) -> Result<Joint, ModelError> {
        let mut model = Model::load(&original.path, original.opts)?;
        let net = &mut model.net;
        net.map_params(|_, p| p.detach().copy().set_requires_grad(true));
        let params = net.params_mut();
        let m = params.iter().map(|p| p.zeros_like()).collect();
        let v = params.iter().map(|p| p.zeros_like()).collect();
        Ok(Joint { model, m, v })
    }

    /// One Adam step (as torch.optim.Adam) on every weight that received a gradient.
    fn step(&mut self, lr: f64, t: usize) {
        let (b1, b2, eps) = ADAM;
        let (bc1, bc2) = (1.0 - b1.powi(t as i32), 1.0 - b2.powi(t as i32));
        let _g = tch::no_grad_guard();
        for ((p, m), v) in self.model.net.params_mut().into_iter().zip(&mut self.m).zip(&mut self.v) {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            *m = &*m * b1 + &g * (1.0 - b1);
            *v = &*v * b2 + (&g * &g) * (1.0 - b2);
            let upd = (&*m / bc1) / ((&*v / bc2).sqrt() + eps) * lr;
            let _ = p.f_sub_(&upd);
            p.zero_grad();
        }
    }

    /// The trained model, frozen.
    fn finish(mut self) -> Model {
        self.model.net.map_params(|_, p| p.detach());
        self.model
    }
}

/// Callbacks of a run.
pub struct Hooks<'a> {
    pub stop: &'a dyn Fn() -> bool,
    pub progress: &'a mut dyn FnMut(&CurvePoint, usize),
}

pub const ADAM: (f64, f64, f64) = (0.9, 0.999, 1e-8);

/// Trains the gates. `opts.eval_data` is evaluated every `eval_every` steps and at the end.
///
/// `masked`: heads of the model held closed throughout (a masked view being pruned further);
/// heads removed by `prune_heads` are held closed too.
pub fn train(
    model: &Model,
    masked: &[HeadId],
    data: &Dataset,
    opts: &PruneOptions,
    hooks: Hooks,
) -> Result<PruneRun, AnalysisError> {
    train_ablated(model, masked, &Gates::none(), data, opts, hooks)
}

/// [`train`] with closed heads ablated as `ablation`'s fill and per-batch fill source say
/// (mean, per-position mean or resample ablation of a `with_mask` view,
/// docs/methods.md#mean-ablation): in the training's gates, the evaluation's and the base the
/// metrics are taken under.
pub fn train_ablated(
    model: &Model,
    masked: &[HeadId],
    ablation: &Gates,
    data: &Dataset,
    opts: &PruneOptions,
    hooks: Hooks,
) -> Result<PruneRun, AnalysisError> {
    let carry = |mut g: Gates| {
        g.fill = ablation.fill.share();
        g.source = ablation.source.clone();
        g
    };
    opts.validate().map_err(AnalysisError::Input)?;
    if opts.joint && model.pruned_physically() {
        return Err(AnalysisError::Input(format!("joint training needs the original weights: {} had heads or experts removed (prune_heads, prune_experts); train on the original with those heads masked", model.name())));
    }
    let layout = Layout::new(model, &opts.kinds, masked)?;
    let n = layout.len();
    if let Some(t) = opts.target.filter(|&t| t > n as f64) {
        return Err(AnalysisError::Input(format!("prune: target must be at most the {n} heads gated, got {t}")));
    }
    let ckpt = match &opts.checkpoint {
        Some(dir) => Some(checkpoint::Checkpoint::open(dir, model, data, opts, &layout).map_err(AnalysisError::Input)?),
        None => None,
    };
    let resumed = match &ckpt {
        Some(c) if opts.resume => c.load().map_err(AnalysisError::Input)?,
        _ => None,
    };
    let resumed_from = resumed.as_ref().map(|s| s.step);
    // Joint training works on a copy of the weights; the model passed in is never edited.
    let mut joint = if opts.joint { Some(Joint::new(model)?) } else { None };
    if let (Some(j), Some(c), Some(s)) = (joint.as_mut(), &ckpt, &resumed) {
        c.load_weights(s.step, &mut j.model, &mut j.m, &mut j.v).map_err(AnalysisError::Input)?;
    }
    let mut state = match resumed {
        Some(s) => s,
        None => {
            tch::manual_seed(mix(opts.seed, u64::MAX) as i64);
            let la = match opts.init {
                Init::Uniform => Tensor::rand([n as i64], (DType::Float, Device::Cpu)) * 1.22 - 0.61,
                Init::Constant(c) => Tensor::full([n as i64], c, (DType::Float, Device::Cpu)),
            };
            TrainState {
                step: 0,
                log_alpha: host32(&la)?,
                adam_m: vec![0.0; n],
                adam_v: vec![0.0; n],
                curve: vec![],
                lagrange: [0.0; 2],
            }
        }
    };
    let mut td = TrainData::new(model, data, opts.batch_tokens, carry(model.gates_closing(masked)?))?;
    let eval_prep = match &opts.eval_data {
        Some(e) => {
            Some(ablation::prepare(model, e, td.prep.metric, opts.batch_tokens, carry(model.gates_closing(masked)?))?)
        }
        None => None,
    };
    let objective = if td.prep.metric == Metric::Cosine {
        format!("distill ({})", opts.distill)
    } else {
        td.prep.targets_from.to_string()
    };
    let save =
        |c: &checkpoint::Checkpoint, state: &TrainState, joint: &mut Option<Joint>| -> Result<(), AnalysisError> {
            if let Some(j) = joint.as_mut() {
                c.save_weights(state.step, &mut j.model, &j.m, &j.v).map_err(AnalysisError::Input)?;
            }
            c.save(state).map_err(AnalysisError::Input)
        };
    if let Some(c) = &ckpt {
        if state.step == 0 {
            save(c, &state, &mut joint)?;
        }
    }
    let dev = model.device();
    let keep = Tensor::from_slice(&layout.keep()).to_device(dev);
    let c = opts.concrete;
    let trainable = layout.keep().iter().map(|&k| k as f64).sum::<f64>().max(1.0);
    let penalty_div = if opts.penalty_scale == PenaltyScale::PerLayer { layout.n_layers() as f64 } else { 1.0 };
    let nb = td.prep.batches.len();
    let mut step_seconds = Vec::new();
    while state.step < opts.steps {
        let started = std::time::Instant::now();
        if (hooks.stop)() {
            if let Some(ck) = &ckpt {
                save(ck, &state, &mut joint)?;
            }
            return Err(ModelError::Interrupted.into());
        }
        let step = state.step;
        let la = Tensor::from_slice(&state.log_alpha).to_device(dev).set_requires_grad(true);
        tch::manual_seed(mix(opts.seed, step as u64) as i64);
        let u = Tensor::rand([n as i64], (DType::Float, Device::Cpu)).to_device(dev) * (1.0 - 2.0 * c.eps) + c.eps;
        let g = c.sample(&la, &u) * &keep;
        let gates = carry(layout.gates(&g));
        let bi = batch_at(opts.seed, step, nb);
        let net: &Model = joint.as_ref().map_or(model, |j| &j.model);
        // An interrupt inside the step's forward (checked at every layer) leaves the state as
        // it was before the step: saved as at the check above.
        let loss = match task_loss(net, model, &mut td, bi, &gates, opts.distill) {
            Err(ModelError::Interrupted) => {
                if let Some(ck) = &ckpt {
                    save(ck, &state, &mut joint)?;
                }
                return Err(ModelError::Interrupted.into());
            }
            r => r?,
        };
        let p_open = c.p_open(&la) * &keep;
        let (penalty, total) = match opts.target {
            None => {
                let penalty = p_open.sum(DType::Float) / penalty_div;
                let total = &loss + &penalty * opts.lambda;
                (penalty, total)
            }
            Some(t) => {
                // The gap as a fraction of the trainable heads (Sheared-LLaMA constrains the
                // expected size as a fraction of the model).
                let gap = (p_open.sum(DType::Float) - t) / trainable;
                let penalty = &gap * state.lagrange[0] + gap.square() * state.lagrange[1];
                let total = &loss + &penalty;
                // The multipliers ascend: l1 by the gap, l2 by its square.
                let g = gap.double_value(&[]);
                state.lagrange[0] += opts.lr * g;
                state.lagrange[1] += opts.lr * g * g;
                (penalty, total)
            }
        };
        total.backward();
        let grad = host32(&la.grad())?;
        if let Some(j) = joint.as_mut() {
            j.step(opts.model_lr, step + 1);
        }
        state.adam(&grad, opts.lr, step + 1, None);
        state.step += 1;
        step_seconds.push(started.elapsed().as_secs_f64());
        let la_now = Tensor::from_slice(&state.log_alpha);
        let la_now = la_now.to_device(dev);
        let eval_now = c.eval(&la_now, opts.eval_gates) * &keep;
        let open = host32(&eval_now)?.iter().filter(|&&x| x != 0.0).count();
        let at_eval = state.step % opts.eval_every == 0 || state.step == opts.steps;
        let eval_value = match (&eval_prep, at_eval) {
            (Some(p), true) => {
                let eg = carry(layout.gates(&eval_now));
                Some(ablation::evaluate(joint.as_ref().map_or(model, |j| &j.model), p, &eg, hooks.stop)?)
            }
            _ => None,
        };
        let point = CurvePoint {
            step: state.step,
            loss: loss.double_value(&[]),
            penalty: penalty.double_value(&[]),
            expected_open: p_open.sum(DType::Double).double_value(&[]),
            open,
            eval: eval_value,
        };
        (hooks.progress)(&point, opts.steps);
        state.curve.push(point);
        if at_eval {
            if let Some(ck) = &ckpt {
                save(ck, &state, &mut joint)?;
            }
        }
    }
    Ok(PruneRun {
        layout,
        state,
        options: opts.clone(),
        objective,
        eval_metric: eval_prep.map(|p| p.metric.to_string()),
        resumed_from,
        model: model.name(),
        dataset: data.name.clone(),
        step_seconds,
        trained: joint.map(|j| j.finish()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_slice(v)
    }
    fn host(x: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(x.to_kind(DType::Double)).unwrap()
    }

    #[test]
    fn p_open_matches_the_closed_form() {
        let c = Concrete::default();
        for la in [-3.0f64, -0.5, 0.0, 0.7, 4.0] {
            let want = 1.0 / (1.0 + (-(la - 0.33 * (0.1f64 / 1.1).ln())).exp());
            let got = host(&c.p_open(&t(&[la as f32])))[0];
            assert!((got - want).abs() < 1e-6, "{la}: {got} vs {want}");
        }
    }

    #[test]
    fn sample_is_the_stretched_clipped_sigmoid() {
        let c = Concrete::default();
        for (la, u) in [(0.0f64, 0.5f64), (1.0, 0.2), (-2.0, 0.9), (5.0, 0.99), (-5.0, 0.01)] {
            let s = 1.0 / (1.0 + (-((u.ln() - (1.0 - u).ln() + la) / 0.33)).exp());
            let want = (s * 1.2 - 0.1).clamp(0.0, 1.0);
            let got = host(&c.sample(&t(&[la as f32]), &t(&[u as f32])))[0];
            assert!((got - want).abs() < 1e-6, "la {la} u {u}: {got} vs {want}");
        }
        // The stretch reaches exact 0 and 1.
        assert_eq!(host(&c.sample(&t(&[-5.0]), &t(&[0.01])))[0], 0.0);
        assert_eq!(host(&c.sample(&t(&[5.0]), &t(&[0.99])))[0], 1.0);
    }

    #[test]
    fn binary_evaluation_is_log_alpha_positive_and_continuous_is_clipped() {
        let c = Concrete::default();
        let la = t(&[-2.0, -0.01, 0.01, 3.0]);
        assert_eq!(host(&c.eval(&la, EvalGates::Binary)), vec![0.0, 0.0, 1.0, 1.0]);
        let cont = host(&c.eval(&la, EvalGates::Continuous));
        for (x, g) in [-2.0f64, -0.01, 0.01, 3.0].iter().zip(cont) {
            let want = (1.0 / (1.0 + (-x).exp()) * 1.2 - 0.1).clamp(0.0, 1.0);
            assert!((g - want).abs() < 1e-6);
        }
        // Louizos' temperature does not move the binary threshold (symmetric stretch).
        let c2 = Concrete { beta: 2.0 / 3.0, ..c };
        assert_eq!(host(&c2.eval(&la, EvalGates::Binary)), vec![0.0, 0.0, 1.0, 1.0]);
    }

    #[test]
    fn gradients_reach_log_alpha_through_gate_and_penalty() {
        let c = Concrete::default();
        let la = t(&[0.3, -0.2]).set_requires_grad(true);
        let u = t(&[0.5, 0.6]);
        let g = c.sample(&la, &u);
        let loss = (&g * t(&[2.0, -1.0])).sum(DType::Float) + c.p_open(&la).sum(DType::Float);
        loss.backward();
        let grad = host(&la.grad());
        assert!(grad.iter().all(|x| x.abs() > 1e-4), "{grad:?}");
        // Finite differences agree.
        let f = |a: f32, b: f32| {
            let la = t(&[a, b]);
            ((c.sample(&la, &u) * t(&[2.0, -1.0])).sum(DType::Float) + c.p_open(&la).sum(DType::Float))
                .double_value(&[])
        };
        let h = 1e-3f32;
        let fd0 = (f(0.3 + h, -0.2) - f(0.3 - h, -0.2)) / (2.0 * h as f64);
        assert!((fd0 - grad[0]).abs() < 1e-2, "{fd0} vs {}", grad[0]);
    }

    #[test]
    fn batch_order_is_a_permutation_per_epoch_and_reproducible() {
        let n = 7;
        for epoch in 0..3 {
            let mut seen: Vec<usize> = (0..n).map(|i| batch_at(5, epoch * n + i, n)).collect();
            seen.sort();
            assert_eq!(seen, (0..n).collect::<Vec<_>>());
        }
        assert_eq!(batch_at(5, 10, n), batch_at(5, 10, n));
        assert_ne!(
            (0..n).map(|i| batch_at(5, i, n)).collect::<Vec<_>>(),
            (0..n).map(|i| batch_at(6, i, n)).collect::<Vec<_>>()
        );
    }
}
