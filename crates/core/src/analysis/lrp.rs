//! LRP head relevance (docs/methods.md#lrp-head-relevance): encoders (`enc`), decoder-only models
//! (`dec`), and translation models through their decoder (`cross`, then `enc`): seeds at each
//! target step's top-1 logit travel back in time through the SSRU states, onto the target
//! embeddings, and through cross-attention's value path onto the encoder output.
//!
//! The forward pass of each layer is traced; relevance then travels down layer by layer as
//! tensors `[B, P, T, D]`: B sentences, P predictions per sentence (every position's seed
//! travels in its own row, so normalisation per prediction is exact; `seeds: "summed"` puts
//! a sentence's seeds in one row, P = 1), T positions, D units. Every rule is applied with
//! activations fixed, and each step is rescaled per prediction so that `sum |R_in| =
//! sum |R_out|` (docs/methods.md#lrp-head-relevance). A head's relevance is `sum |R|` over the positions and dimensions of
//! its context vector (the input of W^O), normalised over the heads of its layer per
//! prediction, then averaged over predictions.
//!
//! Rules. `ab` (alpha = beta = 0.5, contributions `z_ij = x_i W_ji` with reference input 0, the
//! bias spread evenly over the inputs): `R_i = sum_j R_j (0.5 z+_ij / Z+_j + 0.5 z-_ij / Z-_j)`
//! for linear maps, LayerNorm/RMSNorm (linear in x for a fixed scale), residual sums and
//! attention (the weights fixed: the value path); `zplus`: `z+` with `W+ = max(W, eps)` and no
//! bias, attention by gradient x input with the weights fixed, norms pass relevance through,
//! `|R|` then rescale. Gated FFNs (SwiGLU) pass relevance through the up projection, the gate
//! acting as fixed weights.

use super::AnalysisError;
use crate::data::Dataset;
use crate::model::hooks::{At, Point, Record};
use crate::model::nn::{Attention, Gates, Norm, NormKind, NormPosition};
use crate::model::transformer::{StackLayer, Stop, Transformer};
use crate::model::{Batch, Kind, Model, ModelError};
use crate::optspec::{opt, opt_int_by, opt_str, str_eq, OptSpec};
use std::collections::HashMap;
use tch::{Device, Kind as DType, Tensor};

const EPS: f64 = 1e-5;

/// Below this share of a unit's total `|z|`, a side of a linear map's contributions counts as
/// empty (see [`ab_factors`]).
const LINEAR_TOL: f64 = 1e-5;

options_enum!(Rule, "LRP rule", { Ab = "ab", Zplus = "zplus" });

// The rule set a user picks: a rescaled one propagated here (`Rule`), or AttnLRP, gradient x
// input under LXT's rules (`super::attnlrp`).
options_enum!(RuleSet, "LRP rule", { Ab = "ab", Zplus = "zplus", AttnLrp = "attnlrp" });

impl From<Rule> for RuleSet {
    fn from(r: Rule) -> RuleSet {
        match r {
            Rule::Ab => RuleSet::Ab,
            Rule::Zplus => RuleSet::Zplus,
        }
    }
}

// Where relevance starts: `norm` (each position's final hidden units, in proportion to their
// squared activation) or `logit` (the top-1 logit of each output position).
options_enum!(Seed, "LRP seed", { Norm = "norm", Logit = "logit" });

/// The rule `lrp` runs without a `rule` option.
pub const DEFAULT_RULE: RuleSet = RuleSet::Ab;
/// `lrp`'s options with a fixed default, declared once: the script's option list holds them,
/// and [`LrpOptions`]'s `Default` and [`LrpOptions::summed`] read their defaults.
pub const RULE_OPTION: OptSpec = opt_str(
    "rule",
    DEFAULT_RULE.name(),
    "\"ab\", \"zplus\" (docs/methods.md#lrp-head-relevance) or \"attnlrp\" (docs/methods.md#attnlrp)",
);
pub const SEED_OPTION: OptSpec =
    opt("seed", "\"logit\" for models with an output layer, else \"norm\"", "what the relevance starts from");
pub const SEEDS_OPTION: OptSpec =
    opt_str("seeds", "each", "\"each\" prediction rescaled alone, or \"summed\" per sentence");
pub const BATCH_TOKENS_OPTION: OptSpec =
    opt_int_by("batch_tokens", "seeds", &[("each", 64), ("summed", 256)], "tokens per batch");

/// LRP's options, typed. `Default` gives what a script gets with no options.
#[derive(Debug, Clone)]
pub struct LrpOptions {
    pub rule: RuleSet,
    /// Where relevance starts; `None` leaves it to the model ([`LrpOptions::seed_for`]).
    pub seed: Option<Seed>,
    /// Each prediction propagated on its own (exact per-prediction normalisation), or a
    /// sentence's seeds summed into one (about T times cheaper; normalised per sentence).
    pub per_prediction: bool,
    pub batch_tokens: usize,
}

impl Default for LrpOptions {
    /// What `m.lrp(data)` runs with: rule "ab", seeds "each" with its batch_tokens (64), the
    /// seed left to the model ([`RULE_OPTION`], [`SEEDS_OPTION`], [`BATCH_TOKENS_OPTION`]).
    fn default() -> Self {
        const EACH: bool = str_eq(SEEDS_OPTION.default.str(), "each");
        const BATCH: i64 = BATCH_TOKENS_OPTION.default.int_by(if EACH { "each" } else { "summed" });
        LrpOptions { rule: DEFAULT_RULE, seed: None, per_prediction: EACH, batch_tokens: BATCH as usize }
    }
}

impl LrpOptions {
    /// What `m.lrp(data, #{seeds: "summed"})` runs with: a sentence's seeds propagated
    /// together, with that choice's batch_tokens default (256, [`BATCH_TOKENS_OPTION`]).
    pub fn summed() -> Self {
        const BATCH: i64 = BATCH_TOKENS_OPTION.default.int_by("summed");
        LrpOptions { per_prediction: false, batch_tokens: BATCH as usize, ..LrpOptions::default() }
    }

    /// The seed a run on `model` starts from: the one chosen, else "logit" for models with an
    /// output head and "norm" for the others; AttnLRP runs on the self-attention stack, so
    /// under rule "attnlrp" only a language model's default is "logit" (`lrp`'s option list
    /// states this default).
    pub fn seed_for(&self, model: &Model) -> Seed {
        self.seed.unwrap_or_else(|| {
            let attn = self.rule == RuleSet::AttnLrp;
            if model.net.output.is_some() && (!attn || model.is_lm()) {
                Seed::Logit
            } else {
                Seed::Norm
            }
        })
    }
}

/// LRP's shard accumulators (docs/methods.md#shards): by kind name, `[layer][head]` the sums
/// over predictions (0 for a removed head: the identity says which heads count), the
/// predictions, and the largest conservation error (merged by its maximum).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LrpAcc {
    pub sums: std::collections::BTreeMap<String, Vec<Vec<f64>>>,
    pub predictions: usize,
    pub max_conservation_error: crate::shard::Max,
}
crate::accumulate_fields!(LrpAcc { sums, predictions, max_conservation_error });

impl LrpAcc {
    pub fn of(r: &LrpResult) -> LrpAcc {
        let sums = r
            .sums
            .iter()
            .map(|(k, g)| {
                let finite =
                    g.iter().map(|row| row.iter().map(|x| if x.is_finite() { *x } else { 0.0 }).collect()).collect();
                (k.to_string(), finite)
            })
            .collect();
        LrpAcc { sums, predictions: r.predictions, max_conservation_error: crate::shard::Max(r.max_conservation_error) }
    }
}

/// LRP head relevance of one self-attention stack.
#[derive(Debug, Clone)]
pub struct LrpResult {
    /// Per kind, `[layer][head]`: mean over predictions of the normalised head relevance.
    pub kinds: crate::model::KindGrids,
    /// The sums over predictions behind `kinds` (its additive form, docs/methods.md#shards).
    pub sums: crate::model::KindGrids,
    pub predictions: usize,
    /// The largest `|sum |R| / seed - 1|` over predictions and layer boundaries.
    pub max_conservation_error: f64,
    pub options: LrpOptions,
}

/// The ab rule's per-unit factors `alpha / Z+` and `beta / Z-` (alpha = beta = 0.5), shaped
/// like the activations: `R * fp` and `R * fn` are what each unit passes per unit of positive
/// and negative contribution. A unit whose contributions all have one sign gives that side
/// its whole relevance. A side holding at most `rel_tol` of the unit's total `|z|` (and at most
/// 1e-12) counts as empty: exact sums need no tolerance, sums from the sum-and-difference
/// products of [`linear_rule`] carry float noise of about `1e-7` of that total.
fn ab_factors(zp: &Tensor, zn: &Tensor, rel_tol: f64) -> (Tensor, Tensor) {
    let tol = (zp - zn) * rel_tol + 1e-12;
    // 1 where a side holds contributions, else 0 (masks multiply: torch's `where` kernel is
    // not vectorised on CPU).
    let has_p = zp.gt_tensor(&tol).to_kind(zp.kind());
    let has_n = zn.lt_tensor(&-&tol).to_kind(zp.kind());
    // A side's share: 0.5 with both signs, 1 with only one; 0 for an empty side.
    let fp = (&has_n * -0.5 + 1.0) * &has_p / (zp + EPS);
    let fn_ = (&has_p * -0.5 + 1.0) * &has_n / (zn - EPS);
    (fp, fn_)
}

/// `R * alpha / Z+` and `R * beta / Z-` (see [`ab_factors`]).
fn ab_split(r: &Tensor, zp: &Tensor, zn: &Tensor) -> (Tensor, Tensor) {
    let (fp, fn_) = ab_factors(zp, zn, 0.0);
    (r * fp, r * fn_)
}

/// A linear map `y = x W^T + b` with its activations fixed (`x [B, 1, T, in]`, `w [out, in]`),
/// ready to spread relevance `R [B, P, T, out]` over its inputs: everything that depends only
/// on the activations is computed once, so a map met by many relevance tensors (the encoder
/// states under every decoder step's cross-attention) pays for it once.
///
/// The ab rule in two-product form: with `x` split into `x+ >= 0 >= x-` and `W` into
/// `W+ >= 0 >= W-`, `Z+ = x+ W+ + x- W- + b+` and `Z- = x+ W- + x- W+ + b-`; since
/// `Z+ + Z- = y` and `Z+ - Z- = |x| |W| + |b|`, one product gives both. Going down,
/// `x+ (sp W+ + sn W-) + x- (sp W- + sn W+) = (x ((sp + sn) W) + |x| ((sp - sn) |W|)) / 2`:
/// two products, not four.
enum LinearMap {
    /// `|x|`, `|W|`, the factors `(fp + fn) / 2` and `(fp - fn) / 2`, and the bias's share per
    /// input (all shaped like the activations, except the weights).
    Ab {
        x: Tensor,
        x_abs: Tensor,
        w: Tensor,
        w_abs: Tensor,
        f_sum: Tensor,
        f_dif: Tensor,
        f_bias: Option<Tensor>,
        bias_in: Option<Tensor>,
    },
    /// `W+ = max(W, eps)` and `x W+`, stabilised.
    Zplus { x: Tensor, w_plus: Tensor, z: Tensor },
}

impl LinearMap {
    /// `y`, when the caller has it from the forward pass, saves a product.
    fn new(rule: Rule, x: &Tensor, w: &Tensor, b: Option<&Tensor>, y: Option<&Tensor>) -> LinearMap {
        Self::with_inputs(rule, x, w, b, y, None)
    }

    /// `active`: 0/1 per input unit (`[G, 1, 1, in]`), the inputs that exist: W^O of a model
    /// with masked heads spreads its bias's share over the units of the heads left open only,
    /// so a masked head gets no relevance, as a head removed by `prune_heads` gets none.
    fn with_inputs(
        rule: Rule,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        y: Option<&Tensor>,
        active: Option<&Tensor>,
    ) -> LinearMap {
        match rule {
            Rule::Ab => {
                let w_abs = w.abs();
                let x_abs = x.abs();
                let y = match y {
                    Some(y) => y.shallow_clone(),
                    None => x.linear(w, b),
                };
                let mut s = x_abs.matmul(&w_abs.tr());
                if let Some(b) = b {
                    s = s + b.abs();
                }
                // Z+ = (y + s) / 2 and Z- = (y - s) / 2. Where every unit has contributions of
                // both signs (the rule of real layers; checked with the same margin as
                // `ab_factors`), the factors are 0.5 / (Z+ + eps) = 1 / (y + s + 2 eps) and
                // 1 / (y - s - 2 eps).
                let two_sided =
                    s.numel() > 0 && (&s * (1.0 - 2.0 * LINEAR_TOL) - y.abs()).min().double_value(&[]) > 2e-12;
                let (fp, fn_) = if two_sided {
                    ((&y + &s + 2.0 * EPS).reciprocal(), (&y - &s - 2.0 * EPS).reciprocal())
                } else {
                    ab_factors(&((&y + &s) * 0.5), &((&y - &s) * 0.5), LINEAR_TOL)
                };
                // The bias's share is spread evenly over the inputs (the active ones).
                let bias_in = active.map(|a| a / a.sum_dim_intlist([-1i64].as_slice(), true, a.kind()).clamp_min(1.0));
                let n_in = if bias_in.is_some() { 1.0 } else { w.size()[1] as f64 };
                let f_bias = b.map(|b| (&fp * b.clamp_min(0.0) + &fn_ * b.clamp_max(0.0)) / n_in);
                let (f_sum, f_dif) = ((&fp + &fn_) * 0.5, (fp - fn_) * 0.5);
                LinearMap::Ab {
                    x: x.shallow_clone(),
                    x_abs,
                    w: w.shallow_clone(),
                    w_abs,
                    f_sum,
                    f_dif,
                    f_bias,
                    bias_in,
                }
            }
            Rule::Zplus => {
                let w_plus = w.clamp_min(EPS);
                let z = stabilise(&x.matmul(&w_plus.tr()));
                LinearMap::Zplus { x: x.shallow_clone(), w_plus, z }
            }
        }
    }

    /// The map restricted to `len` rows of the batch from `start` (the weights are shared).
    fn rows(&self, start: i64, len: i64) -> LinearMap {
        let cut = |t: &Tensor| t.narrow(0, start, len);
        match self {
            LinearMap::Ab { x, x_abs, w, w_abs, f_sum, f_dif, f_bias, bias_in } => LinearMap::Ab {
                x: cut(x),
                x_abs: cut(x_abs),
                w: w.shallow_clone(),
                w_abs: w_abs.shallow_clone(),
                f_sum: cut(f_sum),
                f_dif: cut(f_dif),
                f_bias: f_bias.as_ref().map(cut),
                bias_in: bias_in.as_ref().map(|t| if t.size()[0] == 1 { t.shallow_clone() } else { cut(t) }),
            },
            LinearMap::Zplus { x, w_plus, z } => {
                LinearMap::Zplus { x: cut(x), w_plus: w_plus.shallow_clone(), z: cut(z) }
            }
        }
    }

    /// The relevance of the inputs, rescaled to the total of `r` per prediction.
    fn apply(&self, r: &Tensor) -> Tensor {
        let r_in = match self {
            LinearMap::Ab { x, x_abs, w, w_abs, f_sum, f_dif, f_bias, bias_in } => {
                let out = (x * (r * f_sum).matmul(w)).addcmul(x_abs, &(r * f_dif).matmul(w_abs));
                match (f_bias, bias_in) {
                    (Some(f), None) => out + (r * f).sum_dim_intlist([-1i64].as_slice(), true, r.kind()),
                    (Some(f), Some(a)) => out + (r * f).sum_dim_intlist([-1i64].as_slice(), true, r.kind()) * a,
                    (None, _) => out,
                }
            }
            LinearMap::Zplus { x, w_plus, z } => (x * (r / z).matmul(w_plus)).abs(),
        };
        rescale(&r_in, &[r])
    }
}

/// Spreads `R [B, P, T, out]` over the inputs `x [B, 1, T, in]` of `y = x W^T + b` (see
/// [`LinearMap`]).
pub fn linear_rule(rule: Rule, x: &Tensor, w: &Tensor, b: Option<&Tensor>, y: Option<&Tensor>, r: &Tensor) -> Tensor {
    LinearMap::new(rule, x, w, b, y).apply(r)
}

/// `z + eps * sign(z)`, never 0.
fn stabilise(z: &Tensor) -> Tensor {
    z + (z.ge(0.0).to_kind(z.kind()) * 2.0 - 1.0) * EPS
}

/// Per prediction (dims 0 and 1), scales `r_in` so that its `sum |.|` equals the total of
/// `r_out`'s parts.
fn rescale(r_in: &Tensor, r_out: &[&Tensor]) -> Tensor {
    let want = r_out.iter().map(|t| abs_total(t)).reduce(|a, b| a + b).unwrap_or_else(|| abs_total(r_in));
    rescale_to(r_in, &want)
}

/// `sum |r|` per prediction: `r [B, P, T, D]` -> `[B, P]`.
fn abs_total(r: &Tensor) -> Tensor {
    r.abs().sum_dim_intlist([2i64, 3].as_slice(), false, r.kind())
}

/// Scales `r [B, P, T, D]` so that its `sum |.|` per prediction is `total` (`[B, P]`, or
/// broadcasting to it).
fn rescale_to(r: &Tensor, total: &Tensor) -> Tensor {
    r * (total / (abs_total(r) + 1e-30)).unsqueeze(-1).unsqueeze(-1)
}

/// Splits `R` of `y = a + b` over the two summands (per unit).
fn residual_rule(rule: Rule, a: &Tensor, b: &Tensor, r: &Tensor) -> (Tensor, Tensor) {
    let (ra, rb) = match rule {
        Rule::Ab => {
            let (fp, fn_) =
                ab_factors(&(a.clamp_min(0.0) + b.clamp_min(0.0)), &(a.clamp_max(0.0) + b.clamp_max(0.0)), 0.0);
            let part = |x: &Tensor| r * (x.clamp_min(0.0) * &fp + x.clamp_max(0.0) * &fn_);
            (part(a), part(b))
        }
        Rule::Zplus => {
            let z = stabilise(&(a + b));
            ((r * a / &z).abs(), (r * b / &z).abs())
        }
    };
    // Both parts rescaled together to what entered.
    let k = (abs_total(r) / (abs_total(&ra) + abs_total(&rb) + 1e-30)).unsqueeze(-1).unsqueeze(-1);
    (ra * &k, rb * &k)
}

/// Relevance through a norm `y = g * (x - mean) / s + beta` (LayerNorm) or `g * x / s`
/// (RMSNorm), with the scale `s` fixed: the linear map `W u + beta` of `u = x / s` with
/// `W = diag(g) (I - 1 1^T / d)` (LayerNorm) or `diag(g)` (RMSNorm). The ab rule runs on that
/// map's structure instead of a dense `d x d` matrix: each output's contributions are one
/// diagonal term `a_o = W_oo u_o` and off-diagonal terms `c_o u_i` (`c_o = -g_o / d`, or 0),
/// so the sums over inputs are sums of `u+` and `u-` (tests: equal to the dense rule).
fn norm_rule(rule: Rule, n: &Norm, x: &Tensor, r: &Tensor) -> Tensor {
    if rule == Rule::Zplus {
        return r.shallow_clone();
    }
    let d = *x.size().last().unwrap_or(&1);
    let g = &n.weight;
    let (a, c, u) = match n.kind {
        NormKind::Layer => {
            let mean = x.mean_dim(-1, true, x.kind());
            let var = (x - &mean).pow_tensor_scalar(2).mean_dim(-1, true, x.kind());
            let u = x / (var + n.eps).sqrt();
            (g * (1.0 - 1.0 / d as f64) * &u, g * (-1.0 / d as f64), u)
        }
        NormKind::Rms => {
            let ms = x.pow_tensor_scalar(2).mean_dim(-1, true, x.kind());
            let u = x / (ms + n.eps).sqrt();
            (g * &u, g.zeros_like(), u)
        }
    };
    let total = |t: &Tensor| t.sum_dim_intlist([-1i64].as_slice(), true, t.kind());
    let (up, un) = (u.clamp_min(0.0), u.clamp_max(0.0));
    let (s_up, s_un) = (total(&up), total(&un));
    let (cp, cn) = (c.clamp_min(0.0), c.clamp_max(0.0));
    // Off-diagonal inputs of output o: all inputs but o itself.
    let (off_p, off_n) = (&s_up - &up, &s_un - &un);
    let mut zp = a.clamp_min(0.0) + &cp * &off_p + &cn * &off_n;
    let mut zn = a.clamp_max(0.0) + &cp * &off_n + &cn * &off_p;
    let (bp, bn) = match &n.bias {
        Some(b) => (Some(b.clamp_min(0.0)), Some(b.clamp_max(0.0))),
        None => (None, None),
    };
    if let (Some(bp), Some(bn)) = (&bp, &bn) {
        zp = zp + bp;
        zn = zn + bn;
    }
    let (fp, fn_) = ab_factors(&zp, &zn, 0.0);
    // Input i: its diagonal term, plus `(c_o u_i)+ sp_o + (c_o u_i)- sn_o` over o != i, with
    // `sp = R fp`, `sn = R fn`; the factors meet R (P predictions) only at the end.
    let to_pos = r * (&cp * &fp + &cn * &fn_); // what u_i >= 0 receives from each output o
    let to_neg = r * (&cn * &fp + &cp * &fn_);
    let mut out = r * (a.clamp_min(0.0) * &fp + a.clamp_max(0.0) * &fn_)
        + &up * (total(&to_pos) - &to_pos)
        + &un * (total(&to_neg) - &to_neg);
    if let (Some(bp), Some(bn)) = (&bp, &bn) {
        out = out + total(&(r * (fp * bp + fn_ * bn))) / d as f64;
    }
    rescale(&out, &[r])
}

/// Relevance of attention contexts `r_ctx [B, P, H, T, dh]` on the values `v [B, 1, H, S, dh]`,
/// the weights `probs [B, 1, H, T, S]` fixed: contributions `A_ts v_s`.
pub fn attention_rule(rule: Rule, probs: &Tensor, v: &Tensor, r_ctx: &Tensor) -> Tensor {
    match rule {
        Rule::Ab => {
            let (vp, vn) = (v.clamp_min(0.0), v.clamp_max(0.0));
            let (sp, sn) = ab_split(r_ctx, &probs.matmul(&vp), &probs.matmul(&vn));
            let pt = probs.transpose(-2, -1);
            &vp * pt.matmul(&sp) + &vn * pt.matmul(&sn)
        }
        Rule::Zplus => (v * probs.transpose(-2, -1).matmul(&(r_ctx / stabilise(&probs.matmul(v))))).abs(),
    }
}

/// What one layer's forward pass leaves for the relevance pass (all `[B, 1, ...]`).
struct Trace {
    x: Tensor,
    attn_in: Tensor,
    probs: Tensor,
    v: Tensor,
    ctx: Tensor,
    /// 0/1 per unit of the contexts `[G, 1, 1, H * dh]` when heads are gated.
    ctx_active: Option<Tensor>,
    attn_out: Tensor,
    /// Post-norm: the first residual sum and the normed result; pre-norm: the residual sum
    /// and the FFN's normed input.
    s1: Tensor,
    h: Tensor,
    ffn_in: Tensor,
    /// The up projection's output (before the activation or gate).
    ffn_up: Tensor,
    ffn_hidden: Tensor,
    ffn_out: Tensor,
    s2: Tensor,
}

/// The points of one stack layer that the relevance pass reads.
const TRACE_POINTS: [Point; 13] = [
    Point::ResidPre,
    Point::Ln1,
    Point::V,
    Point::Pattern,
    Point::Z,
    Point::AttnOut,
    Point::ResidMid,
    Point::Ln2,
    Point::MlpPre,
    Point::MlpPreLinear,
    Point::MlpPost,
    Point::MlpOut,
    Point::ResidPost,
];

/// The stack's forward pass over a batch, recorded at its hook points (one `encode`, the
/// model's own code): each layer's [`Trace`], the last layer's output before the final norm,
/// and the stack's output.
fn trace_stack(
    net: &Transformer,
    ids: &Tensor,
    mask: &Tensor,
    gates: &Gates,
) -> Result<(Vec<Trace>, Tensor, Tensor), ModelError> {
    let kind = net.stack_kind;
    let mut seen: HashMap<(usize, Point), Tensor> = HashMap::new();
    let y = {
        let mut on = |at: At, t: &Tensor| {
            seen.insert((at.layer, at.point), t.shallow_clone());
            Ok(())
        };
        let mut rec = Record { points: &TRACE_POINTS, kinds: &[kind], on: &mut on };
        net.encode(ids, mask, gates, Some(&mut rec))?
    };
    let mut traces = Vec::with_capacity(net.stack.len());
    let mut last = None;
    for (l, layer) in net.stack.iter().enumerate() {
        let (tr, out) = layer_trace(
            layer,
            kind,
            l,
            &mut seen,
            gates.layer(kind, l).filter(|lg| lg.heads).map(|lg| lg.g).as_ref(),
            &y,
        )?;
        traces.push(tr);
        last = Some(out);
    }
    let before_norm = last.unwrap_or_else(|| y.shallow_clone());
    Ok((traces, before_norm, y))
}

/// Layer `l`'s [`Trace`] from its recorded hook points (taken out of `seen`), and the layer's
/// output (post-norm layers end with their second norm).
fn layer_trace(
    layer: &StackLayer,
    kind: Kind,
    l: usize,
    seen: &mut HashMap<(usize, Point), Tensor>,
    gate: Option<&Tensor>,
    like: &Tensor,
) -> Result<(Trace, Tensor), ModelError> {
    let a: &Attention = layer.mixer().attention_for("LRP's rules (docs/methods.md#lrp-head-relevance)", kind, l)?;
    if a.latent.is_some() {
        return Err(ModelError::Invalid(format!(
            "LRP's rules (docs/methods.md#lrp-head-relevance) have no rule for latent attention (DeepSeek's low-rank queries, keys and values), {kind} layer {l}'s token mixer; AttnLRP runs through it (rule: \"attnlrp\")"
        )));
    }
    let f = layer.dense().ok_or_else(|| {
        ModelError::Invalid(format!(
            "LRP's rules (docs/methods.md#lrp-head-relevance) need a dense MLP, and {kind} layer {l}'s MLP is '{}'",
            layer.mlp().kind()
        ))
    })?;
    let mut take = |p: Point| seen.remove(&(l, p));
    let need = |v: Option<Tensor>, what: &str| {
        v.ok_or_else(|| ModelError::Invalid(format!("internal: layer {l} recorded no {what}")))
    };
    let missing = || Tensor::zeros([0], (like.kind(), like.device()));
    let x = need(take(Point::ResidPre), "hook_resid_pre")?;
    let (bsz, t) = (x.size()[0], x.size()[1]);
    match layer.norm_position() {
        NormPosition::Parallel => return Err(ModelError::Invalid("LRP's rules are derived for sequential layers (docs/methods.md#lrp-head-relevance); this model's layers run attention and MLP in parallel (GPT-NeoX): use AttnLRP (`rule: \"attnlrp\"`) or gradient importance".into())),
        _ if layer.post_norms().is_some() => return Err(ModelError::Invalid("LRP's rules are derived for two norms per layer (docs/methods.md#lrp-head-relevance); this model also norms each sublayer's output (Gemma 2/3): use AttnLRP (`rule: \"attnlrp\"`) or gradient importance".into())),
        NormPosition::PostSublayer => return Err(ModelError::Invalid("LRP's rules are derived for norms on a sublayer's input or on the residual sum (docs/methods.md#lrp-head-relevance); this model norms each sublayer's output (OLMo-2): use AttnLRP (`rule: \"attnlrp\"`) or gradient importance".into())),
        _ => {}
    }
    let pre = layer.norm_position() == NormPosition::Pre;
    let ln1 = take(Point::Ln1);
    let attn_in = if pre { need(ln1.as_ref().map(|t| t.shallow_clone()), "ln1")? } else { x.shallow_clone() };
    let v = take(Point::V).map(|v| {
        if a.n_kv_heads != a.n_heads && a.n_kv_heads > 0 {
            v.repeat_interleave_self_int(a.n_heads / a.n_kv_heads, Some(1), None)
        } else {
            v
        }
    });
    let ctx = take(Point::Z).map(|c| c.transpose(1, 2).reshape([bsz, t, a.n_heads * a.head_dim]));
    let s1 = need(take(Point::ResidMid), "hook_resid_mid")?;
    let ln2 = take(Point::Ln2);
    let (h, ffn_in) = if pre {
        (s1.shallow_clone(), need(ln2.as_ref().map(|t| t.shallow_clone()), "ln2")?)
    } else {
        let n = need(ln1, "ln1")?;
        (n.shallow_clone(), n)
    };
    let ffn_up = need(if f.gate.is_some() { take(Point::MlpPreLinear) } else { take(Point::MlpPre) }, "mlp.hook_pre")?;
    let s2 = need(take(Point::ResidPost), "hook_resid_post")?;
    let out = if pre { s2.shallow_clone() } else { need(ln2, "ln2")? };
    let u = |t: Tensor| t.unsqueeze(1);
    let trace = Trace {
        x: u(x),
        attn_in: u(attn_in),
        probs: u(take(Point::Pattern).unwrap_or_else(missing)),
        v: u(v.unwrap_or_else(missing)),
        ctx: u(ctx.unwrap_or_else(missing)),
        ctx_active: gate.map(|g| active_units(a, g)),
        attn_out: u(need(take(Point::AttnOut), "hook_attn_out")?),
        s1: u(s1),
        h: u(h),
        ffn_in: u(ffn_in),
        ffn_up: u(ffn_up),
        ffn_hidden: u(need(take(Point::MlpPost), "mlp.hook_post")?),
        ffn_out: u(need(take(Point::MlpOut), "hook_mlp_out")?),
        s2: u(s2),
    };
    Ok((trace, out))
}

/// Gates `[G, width]` -> 0/1 per context unit `[G, 1, 1, n_heads * dh]`: the units of the heads
/// left open.
fn active_units(a: &Attention, g: &Tensor) -> Tensor {
    let present: Vec<i64> = a.present().iter().map(|&h| h as i64).collect();
    let g = g.index_select(1, &Tensor::from_slice(&present).to_device(g.device())).ne(0.0).to_kind(DType::Float);
    let rows = g.size()[0];
    g.unsqueeze(-1).expand([rows, a.n_heads, a.head_dim], false).reshape([rows, 1, 1, a.n_heads * a.head_dim])
}

/// Relevance of the layer's output `r_y [B, P, T, D]` down to its input; also returns the
/// relevance of each head's context `[B, P, H]` (sum of |R| over positions and dims).
fn relprop_layer(rule: Rule, layer: &StackLayer, tr: &Trace, r_y: &Tensor) -> (Tensor, Tensor) {
    // layer_trace refused a layer whose mixer is not attention, or whose MLP is not dense,
    // before any relevance ran.
    let (Some(a), Some(f)) = (layer.attention(), layer.dense()) else {
        return (r_y.zeros_like(), Tensor::zeros([0], (r_y.kind(), r_y.device())));
    };
    // The FFN block; its input relevance joins the residual's.
    let r_s1 = match layer.norm_position() {
        NormPosition::Post => {
            let r_h = relprop_ffn_block(
                rule,
                f,
                layer.ffn_norm(),
                &tr.h,
                &tr.ffn_up,
                &tr.ffn_hidden,
                &tr.ffn_out,
                &tr.s2,
                r_y,
            );
            norm_rule(rule, layer.attn_norm(), &tr.s1, &r_h)
        }
        // Parallel and post-sublayer layers are refused by `layer_trace` before any relevance
        // is propagated.
        NormPosition::Pre | NormPosition::Parallel | NormPosition::PostSublayer => {
            let (r_h_res, r_f) = residual_rule(rule, &tr.h, &tr.ffn_out, r_y);
            let r_hidden = linear_rule(rule, &tr.ffn_hidden, &f.down.w, f.down.b.as_ref(), Some(&tr.ffn_out), &r_f);
            let r_ffn_in = linear_rule(rule, &tr.ffn_in, &f.up.w, f.up.b.as_ref(), Some(&tr.ffn_up), &r_hidden);
            rescale(&(r_h_res + norm_rule(rule, layer.ffn_norm(), &tr.s1, &r_ffn_in)), &[r_y])
        }
    };
    let (r_x_res, r_o) = residual_rule(rule, &tr.x, &tr.attn_out, &r_s1);
    if a.n_heads == 0 {
        // Every head removed (prune_heads): the attention's output is W^O's bias alone, a
        // constant; its share goes back to the residual's input with the final rescale.
        let head_rel = Tensor::zeros([r_y.size()[0], r_y.size()[1], 0], (DType::Float, r_y.device()));
        return (rescale(&r_x_res, &[r_y]), head_rel);
    }
    let r_ctx =
        LinearMap::with_inputs(rule, &tr.ctx, &a.o.w, a.o.b.as_ref(), Some(&tr.attn_out), tr.ctx_active.as_ref())
            .apply(&r_o); // [B, P, T, H*dh]
    let (bsz, p, t) = (r_ctx.size()[0], r_ctx.size()[1], r_ctx.size()[2]);
    let (h, hk, dh) = (a.n_heads, a.n_kv_heads, a.head_dim);
    let r_ctx = r_ctx.view([bsz, p, t, h, dh]).permute([0, 1, 3, 2, 4]); // [B, P, H, T, dh]
    let head_rel = r_ctx.abs().sum_dim_intlist([3i64, 4].as_slice(), false, r_ctx.kind()); // [B, P, H]
    let r_v = attention_rule(rule, &tr.probs, &tr.v, &r_ctx); // [B, P, H, S, dh]
    let r_v = if hk != h {
        r_v.view([bsz, p, hk, h / hk, t, dh]).sum_dim_intlist([3i64].as_slice(), false, r_v.kind())
    } else {
        r_v
    };
    let r_v = r_v.permute([0, 1, 3, 2, 4]).reshape([bsz, p, t, hk * dh]);
    let r_v = rescale(&r_v, &[&r_ctx.permute([0, 1, 3, 2, 4]).reshape([bsz, p, t, h * dh])]);
    // The value projection's output, unless grouped-query heads repeat it.
    let v_out = (hk == h).then(|| tr.v.squeeze_dim(1).transpose(1, 2).reshape([bsz, t, h * dh]).unsqueeze(1));
    let r_attn_in = linear_rule(rule, &tr.attn_in, &a.v.w, a.v.b.as_ref(), v_out.as_ref(), &r_v);
    let r_x_attn = match layer.norm_position() {
        NormPosition::Post | NormPosition::PostSublayer => r_attn_in,
        NormPosition::Pre | NormPosition::Parallel => norm_rule(rule, layer.attn_norm(), &tr.x, &r_attn_in),
    };
    (rescale(&(r_x_res + r_x_attn), &[r_y]), head_rel)
}

/// One decoder layer's trace with the steps in the batch dimension, step-major (row `t * B +
/// b`): all `[T * B, 1, 1, D]`, probs `[T * B, 1, H, 1, S]`.
struct DecTrace {
    x_in: Tensor,
    gate_c: Tensor,
    gate_u: Tensor,
    u: Tensor,
    c_prev: Tensor,
    o: Tensor,
    s_a: Tensor,
    x1: Tensor,
    probs: Tensor,
    ctx: Tensor,
    a: Tensor,
    s_b: Tensor,
    x2: Tensor,
    ffn_up: Tensor,
    ffn_hidden: Tensor,
    ffn_out: Tensor,
    s_c: Tensor,
}

impl DecTrace {
    /// From an SSRU layer's recorded pass over all steps (`[B, T, ...]`).
    fn new(tr: &DecLayer) -> Result<DecTrace, ModelError> {
        let (b, t) = (tr.x_in.size()[0], tr.x_in.size()[1]);
        let rows = |x: &Tensor| x.transpose(0, 1).reshape([t * b, 1, 1, -1]);
        let (f, u, cells) = tr.ssru.as_ref().ok_or_else(|| {
            ModelError::Invalid("internal: an SSRU decoder layer recorded no ssru.hook_forget".into())
        })?;
        // The state each step starts from: the teacher-forced pass starts from zero.
        let c_prev = Tensor::f_cat(&[cells.zeros_like().narrow(1, 0, 1), cells.narrow(1, 0, t - 1)], 1)?;
        let (h, s) = (tr.cross_probs.size()[1], tr.cross_probs.size()[3]);
        Ok(DecTrace {
            x_in: rows(&tr.x_in),
            gate_c: rows(f),
            gate_u: rows(&(f.ones_like() - f)),
            u: rows(u),
            c_prev: rows(&c_prev),
            o: rows(&tr.o),
            s_a: rows(&tr.s_a),
            x1: rows(&tr.x1),
            probs: tr.cross_probs.permute([2, 0, 1, 3]).reshape([t * b, 1, h, 1, s]),
            ctx: tr.cross_ctx.permute([2, 0, 1, 3]).reshape([t * b, 1, 1, -1]),
            a: rows(&tr.a),
            s_b: rows(&tr.s_b),
            x2: rows(&tr.x2),
            ffn_up: rows(&tr.ffn_up),
            ffn_hidden: rows(&tr.ffn_hidden),
            ffn_out: rows(&tr.ffn_out),
            s_c: rows(&tr.s_c),
        })
    }
}

/// What LRP through a decoder reads of one layer, recorded at its hook points in the
/// teacher-forced pass over every step: `[B, T, D]` unless said otherwise.
struct DecLayer {
    /// `dec.blocks.L.hook_resid_pre`, the self-block's output (`hook_attn_out`), their sum
    /// (`hook_resid_mid`) and its norm (`ln1.hook_normalized`, the cross-attention's queries).
    x_in: Tensor,
    o: Tensor,
    s_a: Tensor,
    x1: Tensor,
    /// `cross.blocks.L.hook_attn_out`, `hook_resid_mid` and `ln1.hook_normalized`.
    a: Tensor,
    s_b: Tensor,
    x2: Tensor,
    /// `dec.blocks.L.mlp.hook_pre` (`hook_pre_linear` in a gated MLP), `mlp.hook_post`,
    /// `hook_mlp_out`, `hook_resid_post`.
    ffn_up: Tensor,
    ffn_hidden: Tensor,
    ffn_out: Tensor,
    s_c: Tensor,
    /// The cross-attention's pattern `[B, H, T, S]`, contexts (`hook_z`) `[B, H, T, dh]` and
    /// values of the encoder output (`hook_v`) `[B, H, S, dh]`.
    cross_probs: Tensor,
    cross_ctx: Tensor,
    cross_v: Tensor,
    /// A self-attention's pattern, values and contexts (`dec.blocks.L.attn.`), when the
    /// layer has one with heads.
    self_attn: Option<(Tensor, Tensor, Tensor)>,
    /// An SSRU's forget gate, candidate and cells (`dec.blocks.L.ssru.`).
    ssru: Option<(Tensor, Tensor, Tensor)>,
}

/// The points of a decoder layer that the relevance pass reads.
const DEC_POINTS: [Point; 15] = [
    Point::ResidPre,
    Point::AttnOut,
    Point::ResidMid,
    Point::Ln1,
    Point::MlpPre,
    Point::MlpPreLinear,
    Point::MlpPost,
    Point::MlpOut,
    Point::ResidPost,
    Point::Pattern,
    Point::V,
    Point::Z,
    Point::SsruForget,
    Point::SsruCandidate,
    Point::SsruCell,
];

/// The one teacher-forced decoder pass (the model's own `Transformer::teacher`), recorded at
/// its hook points: each layer's [`DecLayer`] and the final states `[B, T, D]`.
fn trace_decoder(
    net: &Transformer,
    enc: &Tensor,
    enc_mask: &Tensor,
    targets: &Tensor,
    gates: &Gates,
) -> Result<(Vec<DecLayer>, Tensor), ModelError> {
    let mut seen: HashMap<At, Tensor> = HashMap::new();
    let states = {
        let mut on = |at: At, t: &Tensor| {
            seen.insert(at, t.shallow_clone());
            Ok(())
        };
        let mut rec = Record { points: &DEC_POINTS, kinds: &[Kind::Dec, Kind::Cross], on: &mut on };
        net.teacher(enc, enc_mask, targets, Stop::FinalNorm, gates, Some(&mut rec))?
    };
    let mut layers = Vec::with_capacity(net.decoder.len());
    for (l, layer) in net.decoder.iter().enumerate() {
        let mut opt = |kind: Kind, p: Point| seen.remove(&At::new(kind, l, p));
        let mut take = |kind: Kind, p: Point| {
            opt(kind, p).ok_or_else(|| {
                ModelError::Invalid(format!("internal: the decoder pass recorded no {}", At::new(kind, l, p)))
            })
        };
        let ffn_up = if dense_of(layer, l)?.gate.is_some() {
            take(Kind::Dec, Point::MlpPreLinear)?
        } else {
            take(Kind::Dec, Point::MlpPre)?
        };
        let self_attn = match (take(Kind::Dec, Point::Pattern), take(Kind::Dec, Point::V), take(Kind::Dec, Point::Z)) {
            (Ok(p), Ok(v), Ok(z)) => Some((p, v, z)),
            _ => None,
        };
        let ssru = match (
            take(Kind::Dec, Point::SsruForget),
            take(Kind::Dec, Point::SsruCandidate),
            take(Kind::Dec, Point::SsruCell),
        ) {
            (Ok(f), Ok(u), Ok(c)) => Some((f, u, c)),
            _ => None,
        };
        layers.push(DecLayer {
            x_in: take(Kind::Dec, Point::ResidPre)?,
            o: take(Kind::Dec, Point::AttnOut)?,
            s_a: take(Kind::Dec, Point::ResidMid)?,
            x1: take(Kind::Dec, Point::Ln1)?,
            a: take(Kind::Cross, Point::AttnOut)?,
            s_b: take(Kind::Cross, Point::ResidMid)?,
            x2: take(Kind::Cross, Point::Ln1)?,
            ffn_up,
            ffn_hidden: take(Kind::Dec, Point::MlpPost)?,
            ffn_out: take(Kind::Dec, Point::MlpOut)?,
            s_c: take(Kind::Dec, Point::ResidPost)?,
            cross_probs: take(Kind::Cross, Point::Pattern)?,
            cross_ctx: take(Kind::Cross, Point::Z)?,
            cross_v: take(Kind::Cross, Point::V)?,
            self_attn,
            ssru,
        });
    }
    Ok((layers, states))
}

/// A decoder layer's MLP where it is dense: LRP's rules are the dense MLP's.
fn dense_of(layer: &crate::model::transformer::DecoderLayer, l: usize) -> Result<&crate::model::nn::Ffn, ModelError> {
    layer.dense().ok_or_else(|| {
        ModelError::Invalid(format!(
            "LRP: decoder layer {l}'s MLP is of kind '{}'; LRP's rules know the dense MLP",
            layer.mlp().kind()
        ))
    })
}

/// Relevance through a post-norm FFN block `y = norm(x + ffn(x))` down to `x`: through the
/// activation unchanged (a gated FFN's gate acts as fixed weights on the up projection); the
/// merge of the two branches is rescaled to what entered the block, since relevance of
/// opposite signs may cancel in the sum.
#[allow(clippy::too_many_arguments)]
fn relprop_ffn_block(
    rule: Rule,
    ffn: &crate::model::nn::Ffn,
    norm: &Norm,
    x: &Tensor,
    up: &Tensor,
    hidden: &Tensor,
    out: &Tensor,
    s: &Tensor,
    r_y: &Tensor,
) -> Tensor {
    let r_s = norm_rule(rule, norm, s, r_y);
    let (r_res, r_f) = residual_rule(rule, x, out, &r_s);
    let r_hidden = linear_rule(rule, hidden, &ffn.down.w, ffn.down.b.as_ref(), Some(out), &r_f);
    let r_in = linear_rule(rule, x, &ffn.up.w, ffn.up.b.as_ref(), Some(up), &r_hidden);
    rescale(&(r_res + r_in), &[&r_s])
}

/// Teacher-forced decoder LRP: seeds at each target step's top-1 logit, propagated back in
/// time through the SSRU states and down to the target embeddings and (through
/// cross-attention's value path) the encoder output. Returns the relevance on the encoder
/// output `[B, P, S, D]`, cross-attention head relevance `[L][B, P, H]`, the largest
/// conservation error over the decoder's layer boundaries, and the relevance left on the
/// target side (the target embeddings) `[B, P]`. With `per_prediction` false, P = 1.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn relprop_decoder(
    rule: Rule,
    model: &Model,
    enc: &Tensor,
    enc_mask: &Tensor,
    targets: &Tensor,
    weight: &Tensor,
    gates: &Gates,
    per_prediction: bool,
) -> Result<DecoderRelevance, ModelError> {
    if model.net.decoder.iter().any(|l| l.self_attention().is_some()) {
        return relprop_decoder_attn(rule, model, enc, enc_mask, targets, weight, gates, per_prediction);
    }
    // Otherwise every self-block must be an SSRU, the other kind whose rule is written here.
    if let Some((l, layer)) = model.net.decoder.iter().enumerate().find(|(_, l)| l.self_block().kind() != "ssru") {
        return Err(ModelError::Invalid(format!(
            "LRP through the decoder has rules for attention and SSRU self-blocks; decoder layer {l}'s is '{}'",
            layer.self_block().kind()
        )));
    }
    let net = &model.net;
    let out = net.output.as_ref().ok_or(ModelError::NoOutputHead)?;
    let (bsz, t_len) = (targets.size()[0], targets.size()[1]);
    let s_len = enc.size()[1];
    let n_layers = net.decoder.len();
    let tb = t_len * bsz;
    // Forward over every step at once, layer by layer (the model's own decoder layers),
    // keeping what the relevance pass needs.
    let mut v_enc = Vec::new(); // every cross-attention's values [B, 1, H, S, dh]
    let mut v_maps = Vec::new();
    let enc_in = enc.unsqueeze(1);
    for (l, layer) in net.decoder.iter().enumerate() {
        let (a, _) = layer
            .cross()
            .ok_or_else(|| ModelError::Invalid("LRP needs cross-attention in every decoder layer".into()))?;
        if a.n_heads == 0 {
            return Err(ModelError::Invalid(format!("LRP through the decoder needs cross-attention heads in every layer; prune_heads removed every head of cross layer {l} (use seed \"norm\" for the encoder alone)")));
        }
        if a.n_kv_heads != a.n_heads {
            return Err(ModelError::Invalid("LRP through grouped-query cross-attention is not supported".into()));
        }
    }
    // The one teacher-forced pass, recorded at the hook points the rules read.
    let (recorded, x) = trace_decoder(net, enc, enc_mask, targets, gates)?;
    let mut stacked: Vec<DecTrace> = Vec::with_capacity(n_layers);
    for (l, tr) in recorded.iter().enumerate() {
        let Some((a, _)) = net.decoder[l].cross() else {
            return Err(ModelError::Invalid("LRP needs cross-attention in every decoder layer".into()));
        };
        v_enc.push(tr.cross_v.unsqueeze(1));
        // Every step's cross-attention relevance reaches the encoder states through this map.
        let v_out = tr.cross_v.transpose(1, 2).reshape([bsz, 1, s_len, -1]);
        v_maps.push(LinearMap::new(rule, &enc_in, &a.v.w, a.v.b.as_ref(), Some(&v_out)));
        stacked.push(DecTrace::new(tr)?);
    }
    drop(recorded);
    let finals = x.transpose(0, 1).reshape([tb, -1]); // [T * B, D]

    // The steps go into the batch dimension for the relevance pass: row `t * B + b` is
    // sentence b at step t, so every rule sees the shapes (and rescales per prediction and
    // step) of a single step, while one op covers all steps. Only the SSRU state's path back
    // in time runs step by step.
    let p_len = if per_prediction { t_len } else { 1 };
    let opts = (enc.kind(), enc.device());
    // Relevance on each layer's cross-attention values `[B, P, S, D]`, summed over the steps.
    let mut v_rel: Vec<Tensor> = net
        .decoder
        .iter()
        .map(|l| Tensor::zeros([bsz, p_len, s_len, l.cross().map_or(0, |(a, _)| a.n_heads * a.head_dim)], opts))
        .collect();
    let mut head_rel: Vec<Tensor> = Vec::with_capacity(n_layers);
    // Per layer boundary (below layer l): relevance that left layer l downward, and to the source.
    let mut down_total: Vec<Tensor> =
        (0..=n_layers).map(|_| Tensor::zeros([bsz, p_len], (enc.kind(), enc.device()))).collect();
    let mut enc_from: Vec<Tensor> =
        (0..n_layers).map(|_| Tensor::zeros([bsz, p_len], (enc.kind(), enc.device()))).collect();
    // Runs of at most `size` (at least 1) steps: (first step, steps).
    let chunks = |size: i64| {
        let size = size.clamp(1, t_len.max(1));
        (0..t_len).step_by(size as usize).map(move |start| (start, size.min(t_len - start)))
    };
    // `[T * B, P]` -> `[B, P]`, summed over the steps.
    let over_steps = |t: &Tensor| t.view([t_len, bsz, -1]).sum_dim_intlist([0i64].as_slice(), false, t.kind());
    // Seeds: prediction p is step p's top-1 logit (or all of a sentence's real steps in one
    // row), entering at the top of its step.
    let y = finals;
    let top = crate::model::nn::top1(&model.net.logits(&y)?);
    let w_row = out.w.index_select(0, &top).view([tb, 1, 1, -1]);
    let b_top = out.b.as_ref().map(|b| b.index_select(0, &top).view([tb, 1, 1, 1]));
    let onehot = if per_prediction {
        Tensor::eye(t_len, opts)
            .view([t_len, 1, p_len, 1, 1])
            .expand([t_len, bsz, p_len, 1, 1], false)
            .reshape([tb, p_len, 1, 1])
    } else {
        weight.transpose(0, 1).reshape([tb, 1, 1, 1])
    };
    let yy = y.view([tb, 1, 1, -1]) * &onehot;
    let mut r = top_logit_rule(rule, &yy, &w_row, b_top.as_ref(), &onehot); // [T * B, P, 1, D]
    down_total[n_layers] = over_steps(&abs_total(&r));
    for l in (0..n_layers).rev() {
        let tr = &stacked[l];
        let layer = &net.decoder[l];
        let (attn, cross_norm) = layer.cross().ok_or(ModelError::NoOutputHead)?;
        let (h, dh) = (attn.n_heads, attn.head_dim);
        // Many steps at once (chunks whose FFN relevance stays near 16 MB): the FFN and
        // cross-attention blocks, the self-attention norm.
        let from_above = abs_total(&r);
        let (mut parts_ctx, mut parts_a, mut parts_res, mut parts_o) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (start, n) in chunks((4i64 << 20) / (bsz * p_len * dense_of(layer, l)?.up.w.size()[0]).max(1)) {
            let rows = |t: &Tensor| t.narrow(0, start * bsz, n * bsz);
            let r_x2 = relprop_ffn_block(
                rule,
                dense_of(layer, l)?,
                layer.ffn_norm(),
                &rows(&tr.x2),
                &rows(&tr.ffn_up),
                &rows(&tr.ffn_hidden),
                &rows(&tr.ffn_out),
                &rows(&tr.s_c),
                &rows(&r),
            );
            let r_sb = norm_rule(rule, cross_norm, &rows(&tr.s_b), &r_x2);
            let (r_x1, r_a) = residual_rule(rule, &rows(&tr.x1), &rows(&tr.a), &r_sb);
            let active = gates.layer(Kind::Cross, l).filter(|g| g.heads).map(|g| {
                let a = active_units(attn, &g.g);
                // Rows are `t * B + b`: per-sentence gates repeat over the steps.
                if a.size()[0] == 1 {
                    a
                } else {
                    a.repeat([n, 1, 1, 1])
                }
            });
            parts_ctx.push(
                LinearMap::with_inputs(
                    rule,
                    &rows(&tr.ctx),
                    &attn.o.w,
                    attn.o.b.as_ref(),
                    Some(&rows(&tr.a)),
                    active.as_ref(),
                )
                .apply(&r_a),
            );
            let r_sa = norm_rule(rule, layer.self_norm(), &rows(&tr.s_a), &r_x1);
            let (r_xin_res, r_o) = residual_rule(rule, &rows(&tr.x_in), &rows(&tr.o), &r_sa);
            parts_a.push(r_a);
            parts_res.push(r_xin_res);
            parts_o.push(r_o);
        }
        let (r_a, r_xin_res, r_o) = (Tensor::cat(&parts_a, 0), Tensor::cat(&parts_res, 0), Tensor::cat(&parts_o, 0));
        let r_ctx = Tensor::cat(&parts_ctx, 0).view([tb, p_len, 1, h, dh]).permute([0, 1, 3, 2, 4]); // [T*B, P, H, 1, dh]
        head_rel.push(
            over_steps(&r_ctx.abs().sum_dim_intlist([3i64, 4].as_slice(), false, r_ctx.kind())).view([bsz, p_len, h]),
        );
        // What reaches the encoder states: the attention rule's output, rescaled to r_a.
        let src_total = abs_total(&r_a);
        // Back in time through c = f c' + (1 - f) u, the gate f fixed: relevance on c comes
        // from this step and the next.
        let Some(cell) = layer.self_block().as_any().and_then(|a| a.downcast_ref::<crate::model::ssru::Ssru>()) else {
            return Err(ModelError::Invalid(format!(
                "internal: decoder layer {l}'s self-block '{}' in the SSRU relevance pass",
                layer.self_block().kind()
            )));
        };
        let (kept, fresh) = (&tr.gate_c * &tr.c_prev, &tr.gate_u * &tr.u);
        let w_map = LinearMap::new(rule, &tr.x_in, &cell.w.w, cell.w.b.as_ref(), Some(&tr.u));
        let mut r_future = Tensor::zeros([bsz, p_len, 1, net.d_model], opts);
        let mut r_down: Vec<Tensor> = Vec::with_capacity(t_len as usize);
        let mut ks: Vec<Tensor> = Vec::with_capacity(t_len as usize);
        for step in (0..t_len).rev() {
            let rows = |t: &Tensor| t.narrow(0, step * bsz, bsz);
            let incoming = rows(&from_above) + abs_total(&r_future);
            let r_c = rows(&r_o) + &r_future;
            let (r_cprev, r_uu) = residual_rule(rule, &rows(&kept), &rows(&fresh), &r_c);
            let r_xin = rows(&r_xin_res) + w_map.rows(step * bsz, bsz).apply(&r_uu);
            // The block's parts leave with what entered it (ab relevance of both signs may
            // cancel where branches merge).
            let outgoing = abs_total(&r_xin) + abs_total(&r_cprev) + rows(&src_total);
            let k = &incoming / (outgoing + 1e-30); // [B, P]
            let k4 = k.view([bsz, p_len, 1, 1]);
            r_down.push(r_xin * &k4);
            r_future = r_cprev * &k4;
            ks.push(k);
        }
        r_down.reverse();
        ks.reverse();
        let k = Tensor::cat(&ks, 0); // [T*B, P]
        r = Tensor::cat(&r_down, 0);
        down_total[l] = over_steps(&abs_total(&r));
        enc_from[l] = over_steps(&(&src_total * &k));
        // The attention rule onto the values, in chunks of steps that keep `[rows, P, S, D]`
        // near 16 MB; each step's part rescaled to its r_a and scaled by its k.
        for (start, n) in chunks((4i64 << 20) / (bsz * p_len * s_len * net.d_model).max(1)) {
            let rows = |t: &Tensor| t.narrow(0, start * bsz, n * bsz);
            let values = v_enc[l].repeat([n, 1, 1, 1, 1]);
            let r_v = attention_rule(rule, &rows(&tr.probs), &values, &rows(&r_ctx)); // [n*B, P, H, S, dh]
            let r_v = r_v.permute([0, 1, 3, 2, 4]).reshape([n * bsz, p_len, s_len, h * dh]);
            let r_v = rescale(&r_v, &[&rows(&r_a)]) * rows(&k).view([n * bsz, p_len, 1, 1]);
            v_rel[l] = &v_rel[l]
                + r_v.view([n, bsz, p_len, s_len, h * dh]).sum_dim_intlist([0i64].as_slice(), false, r_v.kind());
        }
    }
    head_rel.reverse();
    // The value maps onto the encoder states, once per layer for all steps (the rule is linear
    // in the relevance for fixed activations; one rescale per prediction to what the steps
    // sent down, instead of one per step, which cost a [B, P, S, D] x [D, D] product per step).
    let mut r_enc = Tensor::zeros([bsz, p_len, s_len, net.d_model], (enc.kind(), enc.device()));
    for (l, map) in v_maps.iter().enumerate() {
        let r_src = map.apply(&v_rel[l]);
        r_enc = r_enc + rescale_to(&r_src, &enc_from[l]);
    }
    // Below layer l, the relevance is that of the decoder states there plus what reached the
    // source from layers l and above (the initial SSRU states are 0 and take none).
    let seed = &down_total[n_layers];
    let mut worst = 0f64;
    let w = if per_prediction {
        weight.shallow_clone()
    } else {
        weight.sum_dim_intlist([1i64].as_slice(), true, DType::Float).clamp_max(1.0)
    };
    for l in 0..n_layers {
        let src: Tensor = enc_from[l..].iter().fold(Tensor::zeros_like(seed), |a, b| a + b);
        let err = ((&down_total[l] + src) / (seed + 1e-30) - 1.0).abs() * &w;
        worst = worst.max(err.max().double_value(&[]));
    }
    Ok(DecoderRelevance { enc: r_enc, cross: head_rel, dec: vec![], worst, target: down_total[0].shallow_clone() })
}

/// What LRP through a decoder hands to the encoder and the head grids.
struct DecoderRelevance {
    /// Relevance on the encoder output `[B, P, S, D]`.
    enc: Tensor,
    /// Head relevance `[L][B, P, H]` of the cross-attention and (decoders with
    /// self-attention) the decoder's self-attention.
    cross: Vec<Tensor>,
    dec: Vec<Tensor>,
    /// The largest conservation error over the decoder's layer boundaries.
    worst: f64,
    /// The relevance left on the target side (the decoder's input embeddings) `[B, P]`.
    target: Tensor,
}

/// Teacher-forced LRP through a decoder with causal self-attention (HF MarianMT, BART): all
/// steps at once, relevance per prediction over the target positions `[B, P, T, D]`
/// (docs/methods.md, "Translation decoder with self-attention"). Each layer sends its
/// cross-attention share to the encoder output and the rest down, through the
/// self-attention's value path, to the layer's input.
#[allow(clippy::too_many_arguments)]
fn relprop_decoder_attn(
    rule: Rule,
    model: &Model,
    enc: &Tensor,
    enc_mask: &Tensor,
    targets: &Tensor,
    weight: &Tensor,
    gates: &Gates,
    per_prediction: bool,
) -> Result<DecoderRelevance, ModelError> {
    let net = &model.net;
    let out = net.output.as_ref().ok_or(ModelError::NoOutputHead)?;
    let (bsz, t_len) = (targets.size()[0], targets.size()[1]);
    let s_len = enc.size()[1];
    let n_layers = net.decoder.len();
    for (l, layer) in net.decoder.iter().enumerate() {
        let (a, _) = layer
            .cross()
            .ok_or_else(|| ModelError::Invalid("LRP needs cross-attention in every decoder layer".into()))?;
        if a.n_heads == 0 {
            return Err(ModelError::Invalid(format!("LRP through the decoder needs cross-attention heads in every layer; prune_heads removed every head of cross layer {l} (use seed \"norm\" for the encoder alone)")));
        }
        let s = layer
            .self_attention()
            .ok_or_else(|| ModelError::Invalid("LRP: a decoder mixes SSRU and self-attention layers".into()))?;
        if a.n_kv_heads != a.n_heads || s.n_kv_heads != s.n_heads {
            return Err(ModelError::Invalid("LRP through grouped-query decoder attention is not supported".into()));
        }
    }
    // The one teacher-forced pass, recorded at the hook points the rules read (grouped-query
    // decoder attention is refused above, so `hook_v` is per query head).
    let (recorded, states) = trace_decoder(net, enc, enc_mask, targets, gates)?;
    let opts = (enc.kind(), enc.device());
    // Seeds: prediction p is position p's top-1 logit; summed, every real position's seed in
    // one prediction.
    let y = &states;
    let top = crate::model::nn::top1(&model.net.logits(y)?).view([-1]);
    let w_rows = out.w.index_select(0, &top).view([bsz, 1, t_len, -1]);
    let b_top = out.b.as_ref().map(|b| b.index_select(0, &top).view([bsz, 1, t_len, 1]));
    let eye = Tensor::eye(t_len, opts).view([1, t_len, t_len, 1]);
    let mut r = top_logit_rule(rule, &(y.unsqueeze(1) * &eye), &w_rows, b_top.as_ref(), &eye);
    if !per_prediction {
        r = (r * weight.to_kind(opts.0).view([bsz, t_len, 1, 1])).sum_dim_intlist([1i64].as_slice(), true, opts.0);
    }
    let p_len = r.size()[1];
    let seed_total = abs_total(&r);
    let w = if per_prediction {
        weight.shallow_clone()
    } else {
        weight.sum_dim_intlist([1i64].as_slice(), true, DType::Float).clamp_max(1.0)
    };
    let u = |t: &Tensor| t.unsqueeze(1);
    let missing =
        |what: &str, l: usize| ModelError::Invalid(format!("internal: decoder layer {l} handed out no {what}"));
    // Per-head relevance of one attention's contexts `[B, H, T, dh]` from the relevance of its
    // output `r_out [B, P, T, D]`: `[B, P, H, T, dh]`.
    let through_wo = |a: &Attention, kind: Kind, l: usize, ctx: &Tensor, out_act: &Tensor, r_out: &Tensor| {
        let (h, dh) = (a.n_heads, a.head_dim);
        let ctx_flat = ctx.transpose(1, 2).reshape([bsz, t_len, h * dh]).unsqueeze(1);
        let active = gates.layer(kind, l).filter(|g| g.heads).map(|g| active_units(a, &g.g));
        let r_ctx = LinearMap::with_inputs(rule, &ctx_flat, &a.o.w, a.o.b.as_ref(), Some(&u(out_act)), active.as_ref())
            .apply(r_out);
        r_ctx.view([bsz, p_len, t_len, h, dh]).permute([0, 1, 3, 2, 4])
    };
    let head_sums = |r_ctx: &Tensor| r_ctx.abs().sum_dim_intlist([3i64, 4].as_slice(), false, r_ctx.kind());
    let mut r_enc = Tensor::zeros([bsz, p_len, s_len, net.d_model], opts);
    let mut to_source = Tensor::zeros([bsz, p_len], opts);
    let (mut cross_rel, mut dec_rel) = (Vec::with_capacity(n_layers), Vec::with_capacity(n_layers));
    let mut worst = 0f64;
    for l in (0..n_layers).rev() {
        let layer = &net.decoder[l];
        let tr = &recorded[l];
        let (cattn, cnorm) = layer.cross().ok_or_else(|| missing("cross-attention", l))?;
        let (a, s_b) = (&tr.a, &tr.s_b);
        let r_x2 = relprop_ffn_block(
            rule,
            dense_of(layer, l)?,
            layer.ffn_norm(),
            &u(&tr.x2),
            &u(&tr.ffn_up),
            &u(&tr.ffn_hidden),
            &u(&tr.ffn_out),
            &u(&tr.s_c),
            &r,
        );
        let r_sb = norm_rule(rule, cnorm, &u(s_b), &r_x2);
        let (r_x1, r_a) = residual_rule(rule, &u(&tr.x1), &u(a), &r_sb);
        // Source side: W^O, the attention's value path (steps summed), W^V on the encoder output.
        let r_ctx = through_wo(cattn, Kind::Cross, l, &tr.cross_ctx, a, &r_a);
        cross_rel.push(head_sums(&r_ctx));
        let (h, dh) = (cattn.n_heads, cattn.head_dim);
        let r_v = attention_rule(rule, &u(&tr.cross_probs), &u(&tr.cross_v), &r_ctx)
            .permute([0, 1, 3, 2, 4])
            .reshape([bsz, p_len, s_len, h * dh]);
        let r_v = rescale(&r_v, &[&r_a]);
        let v_out = tr.cross_v.transpose(1, 2).reshape([bsz, s_len, h * dh]).unsqueeze(1);
        let r_src = LinearMap::new(rule, &enc.unsqueeze(1), &cattn.v.w, cattn.v.b.as_ref(), Some(&v_out)).apply(&r_v);
        r_enc = r_enc + rescale(&r_src, &[&r_a]);
        to_source = to_source + abs_total(&r_a);
        // Target side: the self-attention block down to the layer's input.
        let sattn = layer.self_attention().ok_or_else(|| missing("self-attention", l))?;
        let r_sa = norm_rule(rule, layer.self_norm(), &u(&tr.s_a), &r_x1);
        let (r_xres, r_o) = residual_rule(rule, &u(&tr.x_in), &u(&tr.o), &r_sa);
        let r_x = if sattn.n_heads == 0 {
            // Every head removed (prune_heads): the block's output is W^O's bias, a constant.
            dec_rel.push(Tensor::zeros([bsz, p_len, 0], opts));
            rescale(&r_xres, &[&r_x1])
        } else {
            let (dp, dv, dc) =
                tr.self_attn.as_ref().ok_or_else(|| missing("self-attention pattern, values and contexts", l))?;
            let (h, dh) = (sattn.n_heads, sattn.head_dim);
            let r_ctx = through_wo(sattn, Kind::Dec, l, dc, &tr.o, &r_o);
            dec_rel.push(head_sums(&r_ctx));
            let r_v = attention_rule(rule, &u(dp), &u(dv), &r_ctx).permute([0, 1, 3, 2, 4]).reshape([
                bsz,
                p_len,
                t_len,
                h * dh,
            ]);
            let r_v = rescale(&r_v, &[&r_o]);
            let v_out = dv.transpose(1, 2).reshape([bsz, t_len, h * dh]).unsqueeze(1);
            let r_in = linear_rule(rule, &u(&tr.x_in), &sattn.v.w, sattn.v.b.as_ref(), Some(&v_out), &r_v);
            rescale(&(r_xres + r_in), &[&r_x1])
        };
        r = r_x;
        let err = ((abs_total(&r) + &to_source) / (&seed_total + 1e-30) - 1.0).abs() * &w;
        worst = worst.max(err.max().double_value(&[]));
    }
    cross_rel.reverse();
    dec_rel.reverse();
    Ok(DecoderRelevance { enc: r_enc, cross: cross_rel, dec: dec_rel, worst, target: abs_total(&r) })
}

/// LRP head relevance of `model` over `data`: the self-attention stack, and for models with
/// a decoder (seed "logit") the cross-attention heads too.
pub fn lrp(
    model: &Model,
    data: &Dataset,
    opts: &LrpOptions,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<LrpResult, AnalysisError> {
    if !gates.fill.is_empty() {
        return Err(AnalysisError::Input("this view mean-ablates its closed heads; LRP's rules propagate through gates that scale a context, not through a mean put in its place: run it on a zero-ablated view".into()));
    }
    if data.is_empty() {
        return Err(AnalysisError::Input(format!("the dataset {} is empty", data.name)));
    }
    // The result echoes the seed the run started from.
    let seed = opts.seed_for(model);
    let opts = &LrpOptions { seed: Some(seed), ..opts.clone() };
    let rule = match opts.rule {
        RuleSet::Ab => Rule::Ab,
        RuleSet::Zplus => Rule::Zplus,
        RuleSet::AttnLrp => return super::attnlrp::lrp(model, data, opts, gates, stop, progress),
    };
    let net = &model.net;
    if seed == Seed::Logit && net.output.is_none() {
        return Err(AnalysisError::Input(format!(
            "seed \"logit\" needs an output head; {} has none: use seed \"norm\"",
            model.name()
        )));
    }
    let through_decoder = !net.decoder.is_empty() && seed == Seed::Logit;
    if through_decoder && net.decoder.iter().any(|l| l.norm_position() == NormPosition::Pre) {
        return Err(AnalysisError::Input(format!("LRP's decoder rules are derived for post-norm decoder layers (docs/methods.md#lrp-head-relevance); {}'s decoder norms each sublayer's input (M2M100, mBART, T5): use seed \"norm\" for its encoder, or gradient importance", model.name())));
    }
    let kind = net.stack_kind;
    let n_layers = net.stack.len();
    let cross_heads = net.decoder.first().and_then(|l| l.cross()).map_or(0, |(a, _)| a.width());
    let _g = tch::no_grad_guard();
    // Batches: for a decoder, teacher-forced targets come along (references, else greedy).
    let prep = if through_decoder {
        let references: Option<Vec<&str>> = data.items.iter().map(|i| i.target.as_deref()).collect();
        Some(model.prepare(&data.texts(), references.as_deref(), true, opts.batch_tokens, gates)?)
    } else {
        None
    };
    // One tokenization: the prepared batches (with their targets) through a decoder, else the
    // sentences bucketed.
    let plain: Vec<(Vec<usize>, Batch)> = if prep.is_some() {
        vec![]
    } else {
        model.batches(&model.tokenize_all(data.texts())?, opts.batch_tokens).collect()
    };
    let n_batches = prep.as_ref().map_or(plain.len(), |p| p.batches.len());
    // Per layer, one slot per head present (layers of a pruned model differ in width).
    let mut sums: Vec<Vec<f64>> = model.layer_heads(kind).into_iter().map(|h| vec![0f64; h]).collect();
    let mut cross_sums: Vec<Vec<f64>> = if cross_heads > 0 {
        model.layer_heads(Kind::Cross).into_iter().map(|h| vec![0f64; h]).collect()
    } else {
        vec![]
    };
    // Decoder self-attention heads (HF MarianMT, BART).
    let dec_in_decoder =
        through_decoder && model.in_decoder(Kind::Dec) && model.kinds().iter().any(|k| k.kind == Kind::Dec);
    let mut dec_sums: Vec<Vec<f64>> =
        if dec_in_decoder { model.layer_heads(Kind::Dec).into_iter().map(|h| vec![0f64; h]).collect() } else { vec![] };
    let mut predictions = 0usize;
    let mut worst = 0f64;
    let add_heads =
        |sums: &mut Vec<Vec<f64>>, l: usize, head_rel: &Tensor, weight: &Tensor| -> Result<(), ModelError> {
            let norm = head_rel / (head_rel.sum_dim_intlist([-1i64].as_slice(), true, head_rel.kind()) + 1e-30);
            let per_head = (norm * weight.unsqueeze(-1)).sum_dim_intlist([0i64, 1].as_slice(), false, DType::Double);
            for (h, val) in Vec::<f64>::try_from(per_head.to_device(Device::Cpu))?.into_iter().enumerate() {
                sums[l][h] += val;
            }
            Ok(())
        };
    #[allow(clippy::needless_range_loop, reason = "gi indexes whichever of the two batch lists this run has")]
    for gi in 0..n_batches {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let (ids, mask) = match &prep {
            Some(p) => (&p.batches[gi].ids, &p.batches[gi].mask),
            None => (&plain[gi].1.ids, &plain[gi].1.mask),
        };
        let (bsz, t) = (ids.size()[0], ids.size()[1]);
        let (traces, x, y) = trace_stack(net, ids, mask, gates)?;
        // Relevance at the stack's output, per prediction: [B, P, T, D].
        let (mut r, weight, target_part) = if let Some(p) = &prep {
            let pb = &p.batches[gi];
            let (tgt, tm) = pb.targets.as_ref().ok_or(ModelError::NoOutputHead)?;
            let weight = tm.to_kind(x.kind());
            let d = relprop_decoder(rule, model, &x, mask, tgt, &weight, gates, opts.per_prediction)?;
            worst = worst.max(d.worst);
            let weight = if opts.per_prediction {
                weight
            } else {
                weight.sum_dim_intlist([1i64].as_slice(), true, DType::Float).clamp_max(1.0)
            };
            for (l, rel) in d.cross.iter().enumerate() {
                add_heads(&mut cross_sums, l, rel, &weight)?;
            }
            if dec_in_decoder {
                for (l, rel) in d.dec.iter().enumerate() {
                    add_heads(&mut dec_sums, l, rel, &weight)?;
                }
            }
            (d.enc, weight, Some(d.target))
        } else {
            // Predictions: the real (non-special, non-padding) positions.
            let real: Vec<f32> = plain[gi]
                .1
                .encoded
                .iter()
                .flat_map(|e| (0..t as usize).map(move |i| if e.special.get(i) == Some(&false) { 1.0 } else { 0.0 }))
                .collect();
            let real = Tensor::from_slice(&real).view([bsz, t]).to_device(x.device());
            let eye = Tensor::eye(t, (x.kind(), x.device())); // prediction p seeds position p
            let mut r = match seed {
                Seed::Norm => {
                    let sq = y.pow_tensor_scalar(2);
                    (&sq / sq.sum_dim_intlist([-1i64].as_slice(), true, sq.kind())).unsqueeze(1)
                        * eye.view([1, t, t, 1])
                }
                Seed::Logit => {
                    let out = net.output.as_ref().ok_or(ModelError::NoOutputHead)?;
                    let top = crate::model::nn::top1(&net.logits(&y)?); // [B, T]
                    let w_rows = out.w.index_select(0, &top.view([-1])).view([bsz, 1, t, -1]);
                    let b_top = out.b.as_ref().map(|bb| bb.index_select(0, &top.view([-1])).view([bsz, 1, t, 1]));
                    let yy = y.unsqueeze(1) * eye.view([1, t, t, 1]);
                    top_logit_rule(rule, &yy, &w_rows, b_top.as_ref(), &eye.view([1, t, t, 1]))
                }
            };
            if !opts.per_prediction {
                let kind = r.kind();
                r = (r * real.view([bsz, t, 1, 1])).sum_dim_intlist([1i64].as_slice(), true, kind);
            }
            if let Some(n) = &net.final_norm {
                r = norm_rule(rule, n, &x.unsqueeze(1), &r);
            }
            let weight = if opts.per_prediction {
                real
            } else {
                real.sum_dim_intlist([1i64].as_slice(), true, DType::Float).clamp_max(1.0)
            };
            (r, weight, None)
        };
        // Seed total per prediction: what reached the stack's output, plus (for a decoder)
        // what stayed on the target side.
        let target_total = target_part.unwrap_or_else(|| Tensor::zeros([1], (x.kind(), x.device())));
        let seed_total = abs_total(&r) + &target_total;
        for l in (0..n_layers).rev() {
            let (r_in, head_rel) = relprop_layer(rule, &net.stack[l], &traces[l], &r);
            r = r_in;
            let total = abs_total(&r) + &target_total;
            let err = ((&total / (&seed_total + 1e-30)) - 1.0).abs() * &weight;
            worst = worst.max(err.max().double_value(&[]));
            add_heads(&mut sums, l, &head_rel, &weight)?;
        }
        predictions += weight.sum(DType::Double).double_value(&[]) as usize;
        progress(gi + 1, n_batches);
    }
    let n = predictions.max(1) as f64;
    let mut totals = vec![(kind, model.spread_grid(kind, sums))];
    if dec_in_decoder {
        totals.push((Kind::Dec, model.spread_grid(Kind::Dec, dec_sums)));
    }
    if through_decoder {
        totals.push((Kind::Cross, model.spread_grid(Kind::Cross, cross_sums)));
    }
    let kinds =
        totals.iter().map(|(k, g)| (*k, g.iter().map(|r| r.iter().map(|x| x / n).collect()).collect())).collect();
    Ok(LrpResult { kinds, sums: totals, predictions, max_conservation_error: worst, options: opts.clone() })
}

/// The rule for a single output unit per position (a top-1 logit): `r [B, P, T, 1]`,
/// `y [B, P, T, D]` the final states of the seeded positions, `w [B, 1, T, D]` each
/// position's weight row.
fn top_logit_rule(rule: Rule, y: &Tensor, w: &Tensor, b: Option<&Tensor>, r: &Tensor) -> Tensor {
    let d = *y.size().last().unwrap_or(&1) as f64;
    let z = y * w;
    let out = match rule {
        Rule::Ab => {
            let zero = || Tensor::zeros([1], (z.kind(), z.device()));
            let bp = b.map_or_else(zero, |b| b.clamp_min(0.0));
            let bn = b.map_or_else(zero, |b| b.clamp_max(0.0));
            let zp_sum = z.clamp_min(0.0).sum_dim_intlist([-1i64].as_slice(), true, z.kind()) + &bp;
            let zn_sum = z.clamp_max(0.0).sum_dim_intlist([-1i64].as_slice(), true, z.kind()) + &bn;
            let (sp, sn) = ab_split(r, &zp_sum, &zn_sum);
            z.clamp_min(0.0) * &sp + z.clamp_max(0.0) * &sn + (&sp * bp + &sn * bn) / d
        }
        Rule::Zplus => {
            let zp = y * w.clamp_min(EPS);
            (r * &zp / stabilise(&zp.sum_dim_intlist([-1i64].as_slice(), true, zp.kind()))).abs()
        }
    };
    rescale(&out, &[r])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32], shape: &[i64]) -> Tensor {
        Tensor::from_slice(v).view(shape)
    }
    fn host(x: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(x.to_kind(DType::Double).view([-1])).unwrap()
    }

    /// A 2-in, 2-out linear map by hand: x = (1, -2), W = [[2, 1], [-1, 3]], b = (1, 0),
    /// relevance (1, 0) on y_0 only.
    #[test]
    fn ab_rule_on_a_linear_map_equals_the_hand_computation() {
        let x = t(&[1.0, -2.0], &[1, 1, 1, 2]);
        let w = t(&[2.0, 1.0, -1.0, 3.0], &[2, 2]);
        let b = t(&[1.0, 0.0], &[2]);
        let r = t(&[1.0, 0.0], &[1, 1, 1, 2]);
        // y_0 = 1*2 + (-2)*1 + 1: contributions z_00 = 2, z_10 = -2, bias 1.
        // Z+ = 2 + 1 = 3, Z- = -2. R_0 = 0.5 * 2/3, R_1 = 0.5 * (-2)/(-2) = 0.5; the bias's
        // share 0.5 * 1/3 spread over 2 inputs: + 1/12 each.
        let got = host(&linear_rule(Rule::Ab, &x, &w, Some(&b), None, &r));
        let want = [1.0 / 3.0 + 1.0 / 12.0, 0.5 + 1.0 / 12.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{got:?} vs {want:?}");
        }
    }

    /// The ab rule from its definition, contribution by contribution (`[.., out, in]`), as the
    /// reference for the two-product form of `linear_rule` and the structured `norm_rule`.
    fn ab_by_definition(x: &Tensor, w: &Tensor, b: &Tensor, r: &Tensor) -> Tensor {
        let z = x.unsqueeze(-2) * w; // [B, P, T, out, in]
        let (zp, zn) = (z.clamp_min(0.0), z.clamp_max(0.0));
        let d_in = w.size()[1] as f64;
        let sum = |t: &Tensor| t.sum_dim_intlist([-1i64].as_slice(), false, t.kind());
        let (bp, bn) = (b.clamp_min(0.0), b.clamp_max(0.0));
        let (big_p, big_n) = (sum(&zp) + &bp, sum(&zn) + &bn);
        let (sp, sn) = ab_split(r, &big_p, &big_n);
        let per = zp * sp.unsqueeze(-1) + zn * sn.unsqueeze(-1) + ((&sp * &bp + &sn * &bn) / d_in).unsqueeze(-1);
        rescale(&per.sum_dim_intlist([-2i64].as_slice(), false, per.kind()), &[r])
    }

    #[test]
    fn ab_rule_equals_its_definition_on_random_maps() {
        tch::manual_seed(7);
        let opts = (DType::Double, Device::Cpu);
        for (din, dout) in [(5, 3), (16, 16), (7, 29)] {
            let x = Tensor::randn([2, 1, 3, din], opts);
            let w = Tensor::randn([dout, din], opts);
            let b = Tensor::randn([dout], opts);
            let r = Tensor::randn([2, 4, 3, dout], opts);
            let got = linear_rule(Rule::Ab, &x, &w, Some(&b), None, &r);
            let with_y = linear_rule(Rule::Ab, &x, &w, Some(&b), Some(&x.linear(&w, Some(&b))), &r);
            assert!((&got - &with_y).abs().max().double_value(&[]) < 1e-12);
            let want = ab_by_definition(&x, &w, &b, &r);
            let err = (&got - &want).abs().max().double_value(&[]);
            assert!(err < 1e-9, "{din}x{dout}: {err}");
        }
        // Inputs of one sign (ReLU outputs) and a one-signed unit.
        let x = Tensor::rand([1, 1, 2, 6], opts);
        let w = Tensor::randn([4, 6], opts).abs();
        let b = Tensor::zeros([4], opts);
        let r = Tensor::randn([1, 1, 2, 4], opts);
        let err = (linear_rule(Rule::Ab, &x, &w, Some(&b), None, &r) - ab_by_definition(&x, &w, &b, &r))
            .abs()
            .max()
            .double_value(&[]);
        assert!(err < 1e-9, "one-signed: {err}");
    }

    /// The structured norm rule equals the ab rule on the norm's dense matrix, for LayerNorm
    /// (with gains of both signs) and RMSNorm.
    #[test]
    fn norm_rule_equals_the_dense_map() {
        tch::manual_seed(11);
        let opts = (DType::Double, Device::Cpu);
        let d = 9;
        for kind in [NormKind::Layer, NormKind::Rms] {
            let g = Tensor::randn([d], opts);
            let beta = Tensor::randn([d], opts) * 0.1;
            let n = Norm { kind, weight: g.shallow_clone(), bias: Some(beta.shallow_clone()), eps: 1e-5 };
            let x = Tensor::randn([2, 1, 4, d], opts) * 3.0 + 0.5;
            let r = Tensor::randn([2, 3, 4, d], opts);
            let (w, u) = match kind {
                NormKind::Layer => {
                    let centre = Tensor::eye(d, opts) - Tensor::full([d, d], 1.0 / d as f64, opts);
                    let var = x.var_dim([-1i64].as_slice(), false, true);
                    (g.unsqueeze(1) * centre, &x / (var + 1e-5).sqrt())
                }
                NormKind::Rms => (
                    Tensor::diag_embed(&g, 0, -2, -1),
                    &x / (x.pow_tensor_scalar(2).mean_dim(-1, true, x.kind()) + 1e-5).sqrt(),
                ),
            };
            let want = ab_by_definition(&u, &w, &beta, &r);
            let got = norm_rule(Rule::Ab, &n, &x, &r);
            let err = (&got - &want).abs().max().double_value(&[]);
            assert!(err < 1e-9, "{kind:?}: {err}");
        }
    }

    #[test]
    fn zplus_rule_on_a_linear_map_equals_the_hand_computation() {
        // x = (1, 2), W = [[2, -1]] (one output), R = 1. W+ = (2, eps): z = (2, 2 eps).
        let x = t(&[1.0, 2.0], &[1, 1, 1, 2]);
        let w = t(&[2.0, -1.0], &[1, 2]);
        let r = t(&[1.0], &[1, 1, 1, 1]);
        let got = host(&linear_rule(Rule::Zplus, &x, &w, None, None, &r));
        let z = [2.0, 2.0 * EPS];
        let s = z[0] + z[1];
        assert!((got[0] - z[0] / s).abs() < 1e-5 && (got[1] - z[1] / s).abs() < 1e-5, "{got:?}");
    }

    #[test]
    fn residual_and_attention_rules_conserve() {
        let a = t(&[1.0, -1.0, 2.0], &[1, 1, 1, 3]);
        let b = t(&[0.5, 3.0, -1.0], &[1, 1, 1, 3]);
        let r = t(&[0.2, -0.3, 0.5], &[1, 1, 1, 3]);
        for rule in [Rule::Ab, Rule::Zplus] {
            let (ra, rb) = residual_rule(rule, &a, &b, &r);
            let total = host(&(ra.abs().sum(DType::Float) + rb.abs().sum(DType::Float)))[0];
            assert!((total - 1.0).abs() < 1e-5, "{rule}: {total}");
        }
        // ab on a residual by hand, unit 0: a = 1, b = 0.5, R = 0.2: all positive, split 2:1.
        let (ra, rb) = residual_rule(Rule::Ab, &a, &b, &r);
        let (ra0, rb0) = (host(&ra)[0], host(&rb)[0]);
        assert!((ra0 / rb0 - 2.0).abs() < 1e-3, "{ra0} {rb0}");
    }

    /// Two positions, one head of one dimension: A = [[1, 0], [0.5, 0.5]], v = (2, 4),
    /// relevance 1 on the second context (= 0.5*2 + 0.5*4 = 3): contributions 1 and 2, so the
    /// values get 1/3 and 2/3 under both rules.
    #[test]
    fn attention_rule_splits_by_contribution() {
        let probs = t(&[1.0, 0.0, 0.5, 0.5], &[1, 1, 1, 2, 2]);
        let v = t(&[2.0, 4.0], &[1, 1, 1, 2, 1]);
        let r = t(&[0.0, 1.0], &[1, 1, 1, 2, 1]);
        for rule in [Rule::Ab, Rule::Zplus] {
            let got = host(&attention_rule(rule, &probs, &v, &r));
            assert!((got[0] - 1.0 / 3.0).abs() < 1e-4 && (got[1] - 2.0 / 3.0).abs() < 1e-4, "{rule}: {got:?}");
        }
    }

    /// A one-layer network small enough to propagate by hand (zplus): D = 2, two heads of one
    /// dimension, Q = K = 0 (uniform attention), V = O = I, a zero FFN, x = [[1, 2], [3, 4]],
    /// relevance (0.25, 0.75) on position 1's output. Norms pass relevance through; the FFN
    /// gets none. Residual at position 1: x = (3, 4), attention output (2, 3):
    /// R_x = (0.25*3/5, 0.75*4/7), R_o = (0.25*2/5, 0.75*3/7) = (0.1, 0.3214) = the heads.
    /// Values: head h gets R_o[h] * 0.5 * v_s / ctx, ctx = (2, 3).
    #[test]
    fn one_layer_by_hand() {
        use crate::model::nn::{Activation, Ffn, Linear, Norm};
        let eye = || Tensor::eye(2, (DType::Float, Device::Cpu));
        let zeros = |s: &[i64]| Tensor::zeros(s, (DType::Float, Device::Cpu));
        let lin = |w: Tensor| Linear { w, b: None };
        let norm = || Norm {
            kind: NormKind::Layer,
            weight: Tensor::ones([2], (DType::Float, Device::Cpu)),
            bias: Some(zeros(&[2])),
            eps: 1e-5,
        };
        let layer = StackLayer::new(
            Attention::new(lin(zeros(&[2, 2])), lin(zeros(&[2, 2])), lin(eye()), lin(eye()), 2, 2, 1),
            norm(),
            Ffn { up: lin(zeros(&[2, 2])), down: lin(zeros(&[2, 2])), act: Activation::Relu, gate: None },
            norm(),
            NormPosition::Post,
        );
        let x = t(&[1.0, 2.0, 3.0, 4.0], &[1, 2, 2]);
        let bias = zeros(&[1, 1, 1, 2]);
        // The layer's forward, recorded at its hook points.
        let mut seen = HashMap::new();
        let mut on = |at: crate::model::hooks::At, t: &Tensor| {
            seen.insert((at.layer, at.point), t.shallow_clone());
            Ok(())
        };
        let mut rec = crate::model::hooks::Record::new(&TRACE_POINTS, &mut on);
        let embed = crate::model::transformer::Embeddings {
            tokens: zeros(&[3, 2]),
            scale: 1.0,
            positions: crate::model::transformer::Positions::None,
            token_type: None,
            norm: None,
        };
        let mut net = Transformer::decoder_only(embed, vec![layer], None, zeros(&[3, 2]), 0, None);
        (net.stack_kind, net.causal) = (Kind::Enc, false);
        let start = crate::model::transformer::Start::Layer { layer: 0, x: &x, bias: Some(&bias) };
        let stop = crate::model::transformer::Stop::After(0);
        let y = net.run(start, stop, &Gates::none(), &mut Some(&mut rec)).unwrap();
        let layer = &net.stack[0];
        let (tr, out) = layer_trace(layer, Kind::Enc, 0, &mut seen, None, &y).unwrap();
        assert!(out.equal(&y));
        let r_y = t(&[0.0, 0.0, 0.25, 0.75], &[1, 1, 2, 2]);
        let (r_x, heads) = relprop_layer(Rule::Zplus, layer, &tr, &r_y);
        let got = host(&r_x);
        let (h0, h1) = (0.25 * 2.0 / 5.0, 0.75 * 3.0 / 7.0);
        let want = [
            0.5 * 1.0 / 2.0 * h0,
            0.5 * 2.0 / 3.0 * h1,
            0.25 * 3.0 / 5.0 + 0.5 * 3.0 / 2.0 * h0,
            0.75 * 4.0 / 7.0 + 0.5 * 4.0 / 3.0 * h1,
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{got:?} vs {want:?}");
        }
        let hr = host(&heads);
        assert!((hr[0] - h0).abs() < 1e-4 && (hr[1] - h1).abs() < 1e-4, "{hr:?}");
        assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-5);
    }
}
