//! LRP head relevance (SPEC.md "LRP head relevance") for self-attention stacks: encoders
//! (`enc`) and decoder-only models (`dec`).
//!
//! The forward pass of each layer is traced; relevance then travels down layer by layer as
//! tensors `[B, P, T, D]`: B sentences, P predictions per sentence (every position's seed
//! travels in its own row, so normalisation per prediction is exact; `seeds: "summed"` puts
//! a sentence's seeds in one row, P = 1), T positions, D units. Every rule is applied with
//! activations fixed, and each step is rescaled per prediction so that `sum |R_in| =
//! sum |R_out|` (SPEC). A head's relevance is `sum |R|` over the positions and dimensions of
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
use crate::model::nn::{Activation, Attention, Gates, Norm, NormKind, NormPosition};
use crate::model::transformer::EncoderLayer;
use crate::model::{batch, Kind, Model, ModelError};
use std::str::FromStr;
use tch::{Device, Kind as DType, Tensor};

const EPS: f64 = 1e-5;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    Ab,
    Zplus,
}

impl FromStr for Rule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ab" => Ok(Rule::Ab),
            "zplus" => Ok(Rule::Zplus),
            other => Err(format!("unknown LRP rule '{other}' (expected \"ab\" or \"zplus\")")),
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rule::Ab => "ab",
            Rule::Zplus => "zplus",
        })
    }
}

/// Where relevance starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Seed {
    /// Each position's final hidden units, in proportion to their squared activation.
    Norm,
    /// The top-1 logit of each position's next-token prediction (models with an output head).
    Logit,
}

impl FromStr for Seed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "norm" => Ok(Seed::Norm),
            "logit" => Ok(Seed::Logit),
            other => Err(format!("unknown LRP seed '{other}' (expected \"norm\" or \"logit\")")),
        }
    }
}

impl std::fmt::Display for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Seed::Norm => "norm",
            Seed::Logit => "logit",
        })
    }
}

#[derive(Debug, Clone)]
pub struct LrpOptions {
    pub rule: Rule,
    pub seed: Seed,
    /// Each prediction propagated on its own (exact per-prediction normalisation), or a
    /// sentence's seeds summed into one (about T times cheaper; normalised per sentence).
    pub per_prediction: bool,
    pub batch_tokens: usize,
}

/// LRP head relevance of one self-attention stack.
#[derive(Debug, Clone)]
pub struct LrpResult {
    pub kind: Kind,
    /// `[layer][head]`: mean over predictions of the normalised head relevance.
    pub heads: Vec<Vec<f64>>,
    pub predictions: usize,
    /// The largest `|sum |R| / seed - 1|` over predictions and layer boundaries.
    pub max_conservation_error: f64,
    pub options: LrpOptions,
}

/// The ab rule's per-unit factors `R * alpha / Z+` and `R * beta / Z-` (alpha = beta = 0.5);
/// a unit whose contributions all have one sign gives that side its whole relevance.
fn ab_split(r: &Tensor, zp: &Tensor, zn: &Tensor) -> (Tensor, Tensor) {
    let has_p = zp.gt(1e-12).to_kind(zp.kind());
    let has_n = zn.lt(-1e-12).to_kind(zn.kind());
    let ap = (-&has_n * 0.5 + 1.0) * &has_p; // 0.5 with both signs, 1 with only positive
    let an = (-&has_p * 0.5 + 1.0) * &has_n;
    (r * ap / (zp + EPS), r * an / (zn - EPS))
}

/// Spreads `R [B, P, T, out]` over the inputs `x [B, 1, T, in]` of `y = x W^T + b` (the
/// activations fixed); `w [out, in]`.
pub fn linear_rule(rule: Rule, x: &Tensor, w: &Tensor, b: Option<&Tensor>, r: &Tensor) -> Tensor {
    let r_in = match rule {
        Rule::Ab => {
            let (xp, xn) = (x.clamp_min(0.0), x.clamp_max(0.0));
            let (wp, wn) = (w.clamp_min(0.0), w.clamp_max(0.0));
            let mut zp = xp.matmul(&wp.tr()) + xn.matmul(&wn.tr());
            let mut zn = xp.matmul(&wn.tr()) + xn.matmul(&wp.tr());
            let (bp, bn) = match b {
                Some(b) => (Some(b.clamp_min(0.0)), Some(b.clamp_max(0.0))),
                None => (None, None),
            };
            if let (Some(bp), Some(bn)) = (&bp, &bn) {
                zp = zp + bp;
                zn = zn + bn;
            }
            let (sp, sn) = ab_split(r, &zp, &zn);
            let mut out = &xp * (sp.matmul(&wp) + sn.matmul(&wn)) + &xn * (sp.matmul(&wn) + sn.matmul(&wp));
            if let (Some(bp), Some(bn)) = (&bp, &bn) {
                // The bias's share, spread evenly over the inputs.
                let share = (&sp * bp + &sn * bn).sum_dim_intlist([-1i64].as_slice(), true, sp.kind()) / w.size()[1] as f64;
                out = out + share;
            }
            out
        }
        Rule::Zplus => {
            let wp = w.clamp_min(EPS);
            let z = x.matmul(&wp.tr());
            let s = r / stabilise(&z);
            (x * s.matmul(&wp)).abs()
        }
    };
    rescale(&r_in, &[r])
}

/// `z + eps * sign(z)`, never 0.
fn stabilise(z: &Tensor) -> Tensor {
    z + (z.ge(0.0).to_kind(z.kind()) * 2.0 - 1.0) * EPS
}

/// Per prediction (dims 0 and 1), scales `r_in` so that its `sum |.|` equals the total of
/// `r_out`'s parts.
fn rescale(r_in: &Tensor, r_out: &[&Tensor]) -> Tensor {
    let total = |t: &Tensor| t.abs().sum_dim_intlist([2i64, 3].as_slice(), true, DType::Float);
    let want = r_out.iter().map(|t| total(t)).reduce(|a, b| a + b).unwrap_or_else(|| total(r_in));
    r_in * (want / (total(r_in) + 1e-30))
}

/// Splits `R` of `y = a + b` over the two summands (per unit).
fn residual_rule(rule: Rule, a: &Tensor, b: &Tensor, r: &Tensor) -> (Tensor, Tensor) {
    let (ra, rb) = match rule {
        Rule::Ab => {
            let (sp, sn) = ab_split(r, &(a.clamp_min(0.0) + b.clamp_min(0.0)), &(a.clamp_max(0.0) + b.clamp_max(0.0)));
            let part = |x: &Tensor| x.clamp_min(0.0) * &sp + x.clamp_max(0.0) * &sn;
            (part(a), part(b))
        }
        Rule::Zplus => {
            let z = stabilise(&(a + b));
            ((r * a / &z).abs(), (r * b / &z).abs())
        }
    };
    let both = Tensor::cat(&[&ra, &rb], 2);
    let scaled = rescale(&both, &[r]);
    let t = ra.size()[2];
    (scaled.narrow(2, 0, t), scaled.narrow(2, t, t))
}

/// Relevance through a norm `y = g * (x - mean) / s + beta` (LayerNorm) or `g * x / s`
/// (RMSNorm), with the scale `s` fixed: a linear map of `x / s`.
fn norm_rule(rule: Rule, n: &Norm, x: &Tensor, r: &Tensor) -> Tensor {
    if rule == Rule::Zplus {
        return r.shallow_clone();
    }
    let d = *x.size().last().unwrap_or(&1);
    let (opts, g) = ((x.kind(), x.device()), &n.weight);
    let (w, scaled) = match n.kind {
        NormKind::Layer => {
            let mean = x.mean_dim(-1, true, x.kind());
            let var = (x - &mean).pow_tensor_scalar(2).mean_dim(-1, true, x.kind());
            let centre = Tensor::eye(d, opts) - Tensor::full([d, d], 1.0 / d as f64, opts);
            (g.unsqueeze(1) * centre, x / (var + n.eps).sqrt())
        }
        NormKind::Rms => {
            let ms = x.pow_tensor_scalar(2).mean_dim(-1, true, x.kind());
            (Tensor::diag_embed(g, 0, -2, -1), x / (ms + n.eps).sqrt())
        }
    };
    linear_rule(rule, &scaled, &w, n.bias.as_ref(), r)
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
    attn_out: Tensor,
    /// Post-norm: the first residual sum and the normed result; pre-norm: the residual sum
    /// and the FFN's normed input.
    s1: Tensor,
    h: Tensor,
    ffn_in: Tensor,
    ffn_hidden: Tensor,
    ffn_out: Tensor,
    s2: Tensor,
}

fn act(a: Activation, h: &Tensor) -> Tensor {
    match a {
        Activation::Relu => h.relu(),
        Activation::Gelu => h.gelu("none"),
        Activation::Silu => h.silu(),
    }
}

fn trace_layer(layer: &EncoderLayer, x: &Tensor, bias: &Tensor, gate: Option<&Tensor>) -> (Tensor, Trace) {
    let a: &Attention = &layer.attn;
    let attn_in = layer.attn_input(x);
    let (b, t) = (x.size()[0], x.size()[1]);
    let (h, hk, dh) = (a.n_heads, a.n_kv_heads, a.head_dim);
    let mut q = a.q.forward(&attn_in).view([b, t, h, dh]).transpose(1, 2);
    let mut k = a.k.forward(&attn_in).view([b, t, hk, dh]).transpose(1, 2);
    if let Some(r) = &a.rotary {
        q = r.apply(&q);
        k = r.apply(&k);
    }
    let mut v = a.v.forward(&attn_in).view([b, t, hk, dh]).transpose(1, 2);
    if hk != h {
        k = k.repeat_interleave_self_int(h / hk, Some(1), None);
        v = v.repeat_interleave_self_int(h / hk, Some(1), None);
    }
    let probs = (q.matmul(&k.transpose(-2, -1)) * (1.0 / (dh as f64).sqrt()) + bias).softmax(-1, q.kind());
    let mut ctx = probs.matmul(&v); // [B, H, T, dh]
    if let Some(g) = gate {
        ctx = ctx * g.view([g.size()[0], h, 1, 1]);
    }
    let ctx_flat = ctx.transpose(1, 2).reshape([b, t, h * dh]);
    let attn_out = a.o.forward(&ctx_flat);
    let f = &layer.ffn;
    let (s1, hn, ffn_in) = match layer.norm_position {
        NormPosition::Post => {
            let s1 = x + &attn_out;
            let hn = layer.attn_norm.forward(&s1);
            (s1, hn.shallow_clone(), hn)
        }
        NormPosition::Pre => {
            let s1 = x + &attn_out;
            let n2 = layer.ffn_norm.forward(&s1);
            (s1.shallow_clone(), s1, n2)
        }
    };
    let up = f.up.forward(&ffn_in);
    let ffn_hidden = match &f.gate {
        Some(g) => act(f.act, &g.forward(&ffn_in)) * &up,
        None => act(f.act, &up),
    };
    let ffn_out = f.down.forward(&ffn_hidden);
    let s2 = &hn + &ffn_out;
    let y = match layer.norm_position {
        NormPosition::Post => layer.ffn_norm.forward(&s2),
        NormPosition::Pre => s2.shallow_clone(),
    };
    let u = |t: Tensor| t.unsqueeze(1);
    let trace = Trace {
        x: u(x.shallow_clone()),
        attn_in: u(attn_in),
        probs: u(probs),
        v: u(v),
        ctx: u(ctx_flat),
        attn_out: u(attn_out),
        s1: u(s1),
        h: u(hn),
        ffn_in: u(ffn_in),
        ffn_hidden: u(ffn_hidden),
        ffn_out: u(ffn_out),
        s2: u(s2),
    };
    (y, trace)
}

/// Relevance of the layer's output `r_y [B, P, T, D]` down to its input; also returns the
/// relevance of each head's context `[B, P, H]` (sum of |R| over positions and dims).
fn relprop_layer(rule: Rule, layer: &EncoderLayer, tr: &Trace, r_y: &Tensor) -> (Tensor, Tensor) {
    let f = &layer.ffn;
    let a = &layer.attn;
    // Top: the second residual (and its norm, post-norm).
    let r_s2 = match layer.norm_position {
        NormPosition::Post => norm_rule(rule, &layer.ffn_norm, &tr.s2, r_y),
        NormPosition::Pre => r_y.shallow_clone(),
    };
    let (r_h_res, r_f) = residual_rule(rule, &tr.h, &tr.ffn_out, &r_s2);
    let r_hidden = linear_rule(rule, &tr.ffn_hidden, &f.down.w, f.down.b.as_ref(), &r_f);
    // Through the activation unchanged (a gated FFN's gate acts as fixed weights on the up
    // projection), then the up projection.
    let r_ffn_in = linear_rule(rule, &tr.ffn_in, &f.up.w, f.up.b.as_ref(), &r_hidden);
    // The FFN's input relevance joins the residual's; relevance of opposite signs may cancel
    // in the sum, so the merge is rescaled to what entered the block.
    let r_s1 = match layer.norm_position {
        NormPosition::Post => {
            let r_h = rescale(&(r_h_res + r_ffn_in), &[&r_s2]);
            norm_rule(rule, &layer.attn_norm, &tr.s1, &r_h)
        }
        NormPosition::Pre => rescale(&(r_h_res + norm_rule(rule, &layer.ffn_norm, &tr.s1, &r_ffn_in)), &[&r_s2]),
    };
    let (r_x_res, r_o) = residual_rule(rule, &tr.x, &tr.attn_out, &r_s1);
    let r_ctx = linear_rule(rule, &tr.ctx, &a.o.w, a.o.b.as_ref(), &r_o); // [B, P, T, H*dh]
    let (bsz, p, t) = (r_ctx.size()[0], r_ctx.size()[1], r_ctx.size()[2]);
    let (h, hk, dh) = (a.n_heads, a.n_kv_heads, a.head_dim);
    let r_ctx = r_ctx.view([bsz, p, t, h, dh]).permute([0, 1, 3, 2, 4]); // [B, P, H, T, dh]
    let head_rel = r_ctx.abs().sum_dim_intlist([3i64, 4].as_slice(), false, DType::Float); // [B, P, H]
    let r_v = attention_rule(rule, &tr.probs, &tr.v, &r_ctx); // [B, P, H, S, dh]
    let r_v = if hk != h { r_v.view([bsz, p, hk, h / hk, t, dh]).sum_dim_intlist([3i64].as_slice(), false, r_v.kind()) } else { r_v };
    let r_v = r_v.permute([0, 1, 3, 2, 4]).reshape([bsz, p, t, hk * dh]);
    let r_v = rescale(&r_v, &[&r_ctx.permute([0, 1, 3, 2, 4]).reshape([bsz, p, t, h * dh])]);
    let r_attn_in = linear_rule(rule, &tr.attn_in, &a.v.w, a.v.b.as_ref(), &r_v);
    let r_x_attn = match layer.norm_position {
        NormPosition::Post => r_attn_in,
        NormPosition::Pre => norm_rule(rule, &layer.attn_norm, &tr.x, &r_attn_in),
    };
    (rescale(&(r_x_res + r_x_attn), &[r_y]), head_rel)
}

/// LRP head relevance of `model`'s self-attention stack over `data`.
pub fn lrp(model: &Model, data: &Dataset, opts: &LrpOptions, gates: &Gates, stop: &dyn Fn() -> bool, progress: &mut dyn FnMut(usize, usize)) -> Result<LrpResult, AnalysisError> {
    if data.is_empty() {
        return Err(AnalysisError::Input(format!("the dataset {} is empty", data.name)));
    }
    let net = &model.net;
    if !net.decoder.is_empty() && opts.seed == Seed::Logit {
        return Err(AnalysisError::Input(format!(
            "LRP through a decoder is not implemented yet: {} has one, so its cross-attention heads and a logit seed are out of reach; seed: \"norm\" gives the encoder's heads",
            model.name()
        )));
    }
    if opts.seed == Seed::Logit && net.output.is_none() {
        return Err(AnalysisError::Input(format!("seed \"logit\" needs an output head; {} has none: use seed \"norm\"", model.name())));
    }
    let kind = net.stack_kind;
    let n_layers = net.encoder.len();
    let n_heads = net.encoder.first().map_or(0, |l| l.attn.n_heads as usize);
    let _g = tch::no_grad_guard();
    let encoded = data.items.iter().map(|i| model.tokenize(&i.text)).collect::<Result<Vec<_>, _>>()?;
    let lengths: Vec<usize> = encoded.iter().map(|e| e.ids.len()).collect();
    let groups = batch::by_length(&lengths, opts.batch_tokens.max(1));
    let mut sums = vec![vec![0f64; n_heads]; n_layers];
    let mut predictions = 0usize;
    let mut worst = 0f64;
    for (gi, group) in groups.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let b = model.batch_encoded(group.iter().map(|&i| encoded[i].clone()).collect());
        let (bsz, t) = (b.ids.size()[0], b.ids.size()[1]);
        let mut x = net.embed.forward(Some(&b.ids), bsz, 0, t)?;
        let bias = net.self_bias(&b.mask, x.kind());
        let mut traces = Vec::with_capacity(n_layers);
        for (l, layer) in net.encoder.iter().enumerate() {
            let g = gates.layer(kind, l);
            let (y, tr) = trace_layer(layer, &x, &bias, g.as_ref());
            traces.push(tr);
            x = y;
        }
        // Predictions: the real (non-special, non-padding) positions.
        let real: Vec<f32> = b.encoded.iter().flat_map(|e| (0..t as usize).map(move |i| if e.special.get(i) == Some(&false) { 1.0 } else { 0.0 })).collect();
        let real = Tensor::from_slice(&real).view([bsz, t]).to_device(x.device());
        // Seeds [B, T(pred), T, D].
        let (final_in, seed_vec) = match (&net.final_norm, opts.seed) {
            (_, Seed::Norm) => {
                let y = if let Some(n) = &net.final_norm { n.forward(&x) } else { x.shallow_clone() };
                let sq = y.pow_tensor_scalar(2);
                (None, &sq / sq.sum_dim_intlist([-1i64].as_slice(), true, sq.kind()))
            }
            (fnorm, Seed::Logit) => {
                let y = if let Some(n) = fnorm { n.forward(&x) } else { x.shallow_clone() };
                let out = net.output.as_ref().ok_or(ModelError::NoOutputHead)?;
                let logits = out.forward(&y);
                let top = logits.argmax(-1, false); // [B, T]
                let w_rows = out.w.index_select(0, &top.view([-1])).view([bsz, t, -1]); // [B, T, D]
                let b_top = out.b.as_ref().map(|bb| bb.index_select(0, &top.view([-1])).view([bsz, t, 1]));
                (Some((y, w_rows, b_top)), Tensor::zeros([1], (x.kind(), x.device())))
            }
        };
        let eye = Tensor::eye(t, (x.kind(), x.device())); // prediction p seeds position p
        let mut r = match &final_in {
            None => seed_vec.unsqueeze(1) * eye.view([1, t, t, 1]),
            Some((y, w_rows, b_top)) => {
                // One output unit per position: its contributions y_i w_i (+ bias share).
                let yy = y.unsqueeze(1) * eye.view([1, t, t, 1]);
                let r_top = eye.view([1, t, t]).unsqueeze(-1); // relevance 1 at each position's top logit
                let w = w_rows.unsqueeze(1); // [B, 1, T, D]
                let bb = b_top.as_ref().map(|b| b.unsqueeze(1));
                top_logit_rule(opts.rule, &yy, &w, bb.as_ref(), &r_top)
            }
        };
        if !opts.per_prediction {
            r = (r * real.view([bsz, t, 1, 1])).sum_dim_intlist([1i64].as_slice(), true, DType::Float);
        }
        if let Some(n) = &net.final_norm {
            r = norm_rule(opts.rule, n, &x.unsqueeze(1), &r);
        }
        let seed_total = r.abs().sum_dim_intlist([2i64, 3].as_slice(), false, DType::Float); // [B, P]
        let weight = if opts.per_prediction { real.shallow_clone() } else { real.sum_dim_intlist([1i64].as_slice(), true, DType::Float).clamp_max(1.0) };
        for l in (0..n_layers).rev() {
            let (r_in, head_rel) = relprop_layer(opts.rule, &net.encoder[l], &traces[l], &r);
            r = r_in;
            let total = r.abs().sum_dim_intlist([2i64, 3].as_slice(), false, DType::Float);
            let err = ((&total / (&seed_total + 1e-30)) - 1.0).abs() * &weight;
            worst = worst.max(err.max().double_value(&[]));
            let norm = &head_rel / (head_rel.sum_dim_intlist([-1i64].as_slice(), true, DType::Float) + 1e-30);
            let per_head = (norm * weight.unsqueeze(-1)).sum_dim_intlist([0i64, 1].as_slice(), false, DType::Double);
            let v = Vec::<f64>::try_from(per_head.to_device(Device::Cpu)).map_err(ModelError::from)?;
            for (h, val) in v.into_iter().enumerate() {
                sums[l][h] += val;
            }
        }
        predictions += weight.sum(DType::Double).double_value(&[]) as usize;
        progress(gi + 1, groups.len());
    }
    let n = predictions.max(1) as f64;
    Ok(LrpResult { kind, heads: sums.into_iter().map(|r| r.into_iter().map(|v| v / n).collect()).collect(), predictions, max_conservation_error: worst, options: opts.clone() })
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
        let got = host(&linear_rule(Rule::Ab, &x, &w, Some(&b), &r));
        let want = [1.0 / 3.0 + 1.0 / 12.0, 0.5 + 1.0 / 12.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn zplus_rule_on_a_linear_map_equals_the_hand_computation() {
        // x = (1, 2), W = [[2, -1]] (one output), R = 1. W+ = (2, eps): z = (2, 2 eps).
        let x = t(&[1.0, 2.0], &[1, 1, 1, 2]);
        let w = t(&[2.0, -1.0], &[1, 2]);
        let r = t(&[1.0], &[1, 1, 1, 1]);
        let got = host(&linear_rule(Rule::Zplus, &x, &w, None, &r));
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
        use crate::model::nn::{Ffn, Linear, Norm};
        let eye = || Tensor::eye(2, (DType::Float, Device::Cpu));
        let zeros = |s: &[i64]| Tensor::zeros(s, (DType::Float, Device::Cpu));
        let lin = |w: Tensor| Linear { w, b: None };
        let norm = || Norm { kind: NormKind::Layer, weight: Tensor::ones([2], (DType::Float, Device::Cpu)), bias: Some(zeros(&[2])), eps: 1e-5 };
        let layer = EncoderLayer {
            attn: Attention { q: lin(zeros(&[2, 2])), k: lin(zeros(&[2, 2])), v: lin(eye()), o: lin(eye()), n_heads: 2, n_kv_heads: 2, head_dim: 1, rotary: None },
            attn_norm: norm(),
            ffn: Ffn { up: lin(zeros(&[2, 2])), down: lin(zeros(&[2, 2])), act: Activation::Relu, gate: None },
            ffn_norm: norm(),
            norm_position: NormPosition::Post,
        };
        let x = t(&[1.0, 2.0, 3.0, 4.0], &[1, 2, 2]);
        let bias = zeros(&[1, 1, 1, 2]);
        let (_, tr) = trace_layer(&layer, &x, &bias, None);
        let r_y = t(&[0.0, 0.0, 0.25, 0.75], &[1, 1, 2, 2]);
        let (r_x, heads) = relprop_layer(Rule::Zplus, &layer, &tr, &r_y);
        let got = host(&r_x);
        let (h0, h1) = (0.25 * 2.0 / 5.0, 0.75 * 3.0 / 7.0);
        let want = [0.5 * 1.0 / 2.0 * h0, 0.5 * 2.0 / 3.0 * h1, 0.25 * 3.0 / 5.0 + 0.5 * 3.0 / 2.0 * h0, 0.75 * 4.0 / 7.0 + 0.5 * 4.0 / 3.0 * h1];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{got:?} vs {want:?}");
        }
        let hr = host(&heads);
        assert!((hr[0] - h0).abs() < 1e-4 && (hr[1] - h1).abs() < 1e-4, "{hr:?}");
        assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-5);
    }
}
