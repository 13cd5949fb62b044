//! Building blocks of the one Transformer: linear maps, norms, multi-head attention with
//! per-head gates and capture, feed-forward blocks, the SSRU cell. Weights are never edited
//! after loading; masks enter through [`Gates`].

use super::bias::{dense_rows, Bias};
use super::experts::ExpertGate;
use super::hooks::{self, At, GradRules, HookSlot, Point};
use super::latent::Latent;
use super::mixer::{Carry, Inside, Mixer, StepBias};
use super::{Kind, ModelError};
use tch::{Device, Kind as DType, Tensor};

/// The value of `value` with the gradient of `surrogate` (whose value must equal it).
fn with_grad_of(value: &Tensor, surrogate: &Tensor) -> Tensor {
    value.detach() + surrogate - surrogate.detach()
}

/// `x` with its gradient divided by `c` (LXT's `divide_gradient`; the uniform rule of a product
/// of `c` factors).
pub(in crate::model) fn divide_gradient(x: &Tensor, c: f64) -> Tensor {
    with_grad_of(x, &(x / c))
}

/// `f(z)` with the gradient `f(z) / (z + 1e-10)` (LXT's `identity_rule_implicit`).
pub(in crate::model) fn identity_rule(f: &Tensor, z: &Tensor) -> Tensor {
    with_grad_of(f, &(z * (f / (z + 1e-10)).detach()))
}

/// `y = x W^T + b`, with `W` stored `[out, in]` as in PyTorch.
pub struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.w, self.b.as_ref())
    }
    pub fn in_dim(&self) -> i64 {
        self.w.size()[1]
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormKind {
    Layer,
    Rms,
}

pub struct Norm {
    pub kind: NormKind,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub eps: f64,
}

impl Norm {
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_with(x, GradRules::Autograd)
    }

    /// The norm with its gradients under `rules` (AttnLRP holds the scale fixed).
    pub fn forward_with(&self, x: &Tensor, rules: GradRules) -> Tensor {
        let attn_lrp = rules == GradRules::AttnLrp;
        match self.kind {
            NormKind::Layer if attn_lrp => {
                // The standard deviation held fixed (LXT: the mean is not).
                let c = x - x.mean_dim(-1, true, x.kind());
                let std = (c.square().mean_dim(-1, true, x.kind()) + self.eps).sqrt().detach();
                let y = c / std * &self.weight;
                match &self.bias {
                    Some(b) => y + b,
                    None => y,
                }
            }
            NormKind::Layer => {
                let d = *x.size().last().unwrap_or(&1);
                x.layer_norm([d], Some(&self.weight), self.bias.as_ref(), self.eps, false)
            }
            NormKind::Rms if low_precision(x.kind()) => {
                // As transformers: normalised in float32, scaled in the model's precision.
                let xf = x.to_kind(DType::Float);
                let scale = (xf.pow_tensor_scalar(2).mean_dim(-1, true, DType::Float) + self.eps).rsqrt();
                let scale = if attn_lrp { scale.detach() } else { scale };
                (xf * scale).to_kind(x.kind()) * &self.weight
            }
            NormKind::Rms => {
                let var = x.pow_tensor_scalar(2).mean_dim(-1, true, x.kind());
                let scale = (var + self.eps).rsqrt();
                let y = x * if attn_lrp { scale.detach() } else { scale };
                if y.requires_grad() {
                    y * &self.weight
                } else {
                    // Without autograd the product just made is nobody else's.
                    let mut y = y;
                    y *= &self.weight;
                    y
                }
            }
        }
    }
}

/// `c * tanh(x / c)`, or `x` without a cap (Gemma 2's attention scores and final logits).
pub fn softcap(x: Tensor, cap: Option<f64>) -> Tensor {
    match cap {
        Some(c) => (x / c).tanh() * c,
        None => x,
    }
}

/// bfloat16 and float16: norms and softmaxes compute in float32 (as transformers does).
pub fn low_precision(kind: DType) -> bool {
    matches!(kind, DType::BFloat16 | DType::Half)
}

/// Where each sublayer's norm sits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormPosition {
    /// `x = norm(x + f(x))` (BERT, Marian).
    Post,
    /// `x = x + f(norm(x))`.
    Pre,
    /// Attention and MLP side by side on the same input: `x = x + attn(norm1(x)) +
    /// mlp(norm2(x))` (GPT-NeoX / Pythia's `use_parallel_residual`). The layer has no
    /// `hook_resid_mid`.
    Parallel,
    /// Each sublayer's output normed before its residual, no norm on its input: `x = x +
    /// norm1(attn(x)); x = x + norm2(mlp(x))` (OLMo-2). `ln1`/`ln2` are those norms' outputs.
    PostSublayer,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    Relu,
    /// Exact (erf) GELU.
    Gelu,
    /// SiLU, used with a gate: SwiGLU `down(silu(gate x) * up x)`.
    Silu,
    /// GELU with the tanh approximation (GPT-2's `gelu_new`).
    GeluTanh,
    /// The same function written out as transformers' `NewGELUActivation` computes it,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (T5 v1.1, Flan-T5, mT5: their gated
    /// MLPs amplify the last-bit differences of the fused kernel beyond 1e-5).
    GeluNew,
}

pub struct Ffn {
    pub up: Linear,
    pub down: Linear,
    pub act: Activation,
    /// The gate of a gated FFN (SwiGLU): `act(gate x) * up x`.
    pub gate: Option<Linear>,
}

impl Ffn {
    /// The up projection's output, the hidden units (after the activation or gate) and the
    /// block's output, with the MLP's hook points (`mlp.hook_pre`, `hook_pre_linear`,
    /// `hook_post`, `hook_mlp_out`) of layer `layer_idx` of `kind`.
    pub(in crate::model) fn forward_hooked(
        &self,
        x: &Tensor,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Tensor, Tensor), ModelError> {
        let at = |p| At::new(kind, layer_idx, p);
        let attn_lrp = hooks::rules(h) == GradRules::AttnLrp;
        let act = |z: &Tensor| {
            let a = self.act.apply(z);
            if attn_lrp {
                identity_rule(&a, z)
            } else {
                a
            }
        };
        let (up, hidden) = match &self.gate {
            Some(g) => {
                let pre = hooks::at(h, at(Point::MlpPre), g.forward(x))?;
                let up = hooks::at(h, at(Point::MlpPreLinear), self.up.forward(x))?;
                let hidden = if attn_lrp {
                    divide_gradient(&(act(&pre) * &up), 2.0)
                } else if unseen(h, &pre) {
                    // Nobody else holds the gate's output: the activation and the product
                    // overwrite it instead of allocating two tensors of the MLP's width.
                    let mut hidden = self.act.apply_in_place(pre)?;
                    hidden.f_mul_(&up)?
                } else {
                    act(&pre) * &up
                };
                (up, hidden)
            }
            None => {
                let up = hooks::at(h, at(Point::MlpPre), self.up.forward(x))?;
                let hidden = act(&up);
                (up, hidden)
            }
        };
        let hidden = hooks::at(h, at(Point::MlpPost), hidden)?;
        let out = hooks::at(h, at(Point::MlpOut), self.down.forward(&hidden))?;
        Ok((up, hidden, out))
    }
}

/// Whether a tensor just computed is the run's alone, free to overwrite: no hooks look at
/// the run and no gradient flows through it.
pub fn unseen(h: &HookSlot, t: &Tensor) -> bool {
    h.is_none() && !t.requires_grad()
}

impl Activation {
    /// [`Activation::apply`] overwriting `h` where the activation has an in-place kernel.
    pub fn apply_in_place(self, mut h: Tensor) -> Result<Tensor, tch::TchError> {
        match self {
            Activation::Relu => h.f_relu_(),
            Activation::Silu => h.f_silu_(),
            Activation::Gelu | Activation::GeluTanh | Activation::GeluNew => Ok(self.apply(&h)),
        }
    }

    pub fn apply(self, h: &Tensor) -> Tensor {
        match self {
            Activation::Relu => h.relu(),
            Activation::Gelu => h.gelu("none"),
            Activation::Silu => h.silu(),
            Activation::GeluTanh => h.gelu("tanh"),
            Activation::GeluNew => {
                let t = ((h + h.pow_tensor_scalar(3.0) * 0.044715) * (2.0 / std::f64::consts::PI).sqrt()).tanh();
                (h * 0.5) * (t + 1.0)
            }
        }
    }
}

/// Rotary position embedding with frequencies `base^(-2i/dim)` on pairs of each head's
/// dimensions: adjacent pairs `(2i, 2i+1)` (llama.cpp's layout: GGUF checkpoints store Q and K
/// rows permuted that way), or HF's rotate-half pairs `(i, i + dim/2)` (`half`), so that an HF
/// checkpoint's queries and keys are the checkpoint's own (`hook_q`, `hook_k`).
#[derive(Debug, Clone, PartialEq)]
pub struct Rotary {
    pub base: f64,
    /// Rotated dimensions per head: `offset..offset + dim`; the others pass unchanged.
    pub dim: i64,
    /// The first rotated dimension: 0, or after the dimensions without positions (latent
    /// attention's `qk_nope_head_dim`: its rotary part is each head's last).
    pub offset: i64,
    pub half: bool,
    /// How the frequencies are stretched for long contexts (`rope_scaling`).
    pub scaling: RopeScaling,
}

/// `rope_scaling` of HF configs (docs/methods.md#rope-scaling), as transformers'
/// `modeling_rope_utils` computes it: the inverse frequencies `inv_i = base^(-2i/dim)` changed,
/// and for YaRN the cosines and sines multiplied by an attention factor.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Position interpolation: `inv_i / factor`.
    Linear {
        factor: f64,
    },
    /// Dynamic NTK: for a sequence of `n > max_positions` positions the base becomes
    /// `base * (factor n / max_positions - (factor - 1))^(dim / (dim - 2))`; at most
    /// `max_positions` positions, the plain frequencies.
    Dynamic {
        factor: f64,
        max_positions: f64,
    },
    /// Llama 3.1: wavelengths `2 pi / inv_i` above `original / low_freq_factor` divided by
    /// `factor`, below `original / high_freq_factor` kept, between them interpolated.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original: f64,
    },
    /// YaRN: frequencies blended between `inv_i / factor` and `inv_i` by a linear ramp over the
    /// dimensions `[low, high]` found from `beta_fast`, `beta_slow` and the original context;
    /// cos and sin times `attention_factor`.
    Yarn {
        factor: f64,
        original: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
    /// LongRoPE (Phi-3): `inv_i / short_i` for a sequence of at most `original` positions,
    /// `inv_i / long_i` beyond; cos and sin times `attention_factor`.
    LongRope {
        short: std::sync::Arc<[f64]>,
        long: std::sync::Arc<[f64]>,
        original: f64,
        attention_factor: f64,
    },
}

impl Rotary {
    /// Whether the rotation reads positions only through their differences: every scaling but
    /// those whose frequencies depend on the sequence's length (LongRope's short or long
    /// factors, dynamic NTK).
    pub fn relative(&self) -> bool {
        !matches!(self.scaling, RopeScaling::LongRope { .. } | RopeScaling::Dynamic { .. })
    }

    /// Unscaled rotary positions.
    pub fn plain(base: f64, dim: i64, half: bool) -> Rotary {
        Rotary { base, dim, offset: 0, half, scaling: RopeScaling::None }
    }

    /// The inverse frequencies `[dim / 2]` (float64) for a sequence of `n` positions, and the
    /// factor cos and sin are multiplied by.
    pub fn inv_freq(&self, n: i64, device: Device) -> (Tensor, f64) {
        let half = self.dim / 2;
        let dim = self.dim as f64;
        let i = Tensor::arange(half, (DType::Double, device));
        let plain = |base: f64| (&i * (-2.0 * base.ln() / dim)).exp();
        match self.scaling {
            RopeScaling::LongRope { ref short, ref long, original, attention_factor } => {
                let factors = if n as f64 > original { long } else { short };
                (plain(self.base) / Tensor::from_slice(factors).to_device(device), attention_factor)
            }
            RopeScaling::None => (plain(self.base), 1.0),
            RopeScaling::Linear { factor } => (plain(self.base) / factor, 1.0),
            RopeScaling::Dynamic { factor, max_positions } => {
                let n = (n as f64).max(max_positions);
                let base = self.base * (factor * n / max_positions - (factor - 1.0)).powf(dim / (dim - 2.0));
                (plain(base), 1.0)
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original } => {
                let inv = plain(self.base);
                let wavelen = inv.reciprocal() * (2.0 * std::f64::consts::PI);
                let (low_wl, high_wl) = (original / low_freq_factor, original / high_freq_factor);
                let long = wavelen.gt(low_wl);
                let scaled = inv.where_self(&long.logical_not(), &(&inv / factor));
                let smooth =
                    ((wavelen.reciprocal() * original) - low_freq_factor) / (high_freq_factor - low_freq_factor);
                let smoothed = (smooth.ones_like() - &smooth) * &scaled / factor + &smooth * &scaled;
                let medium = wavelen.lt(high_wl).logical_not().logical_and(&long.logical_not());
                (smoothed.where_self(&medium, &scaled), 1.0)
            }
            RopeScaling::Yarn { factor, original, beta_fast, beta_slow, attention_factor, truncate } => {
                let correction = |rotations: f64| {
                    dim * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * self.base.ln())
                };
                let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
                if low == high {
                    high += 0.001;
                }
                let ramp = ((&i - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation = ramp.ones_like() - ramp;
                let inv = plain(self.base);
                let blended = (&inv / factor) * (extrapolation.ones_like() - &extrapolation) + &inv * &extrapolation;
                (blended, attention_factor)
            }
        }
    }

    /// `x [B, H, T, dh]` at positions `0..T`.
    pub fn apply(&self, x: &Tensor) -> Tensor {
        self.apply_from(x, 0)
    }

    /// `x [B, H, T, dh]` at positions `start..start + T` (a cached step).
    pub fn apply_from(&self, x: &Tensor, start: i64) -> Tensor {
        let (t, dh) = (x.size()[2], x.size()[3]);
        let half = self.dim / 2;
        let device = x.device();
        let (inv, factor) = self.inv_freq(start + t, device);
        let ang = Tensor::arange_start(start, start + t, (DType::Double, device)).unsqueeze(1) * inv.unsqueeze(0); // [T, half]
        let (cos, sin) = ((ang.cos() * factor).to_kind(x.kind()), (ang.sin() * factor).to_kind(x.kind()));
        if !x.requires_grad() {
            if let Ok(out) = self.rotate_into(x, &cos, &sin) {
                return out;
            }
        }
        let r = x.narrow(3, self.offset, self.dim);
        let (a, b) = if self.half {
            (r.narrow(3, 0, half), r.narrow(3, half, half))
        } else {
            let rot = r.reshape([x.size()[0], x.size()[1], t, half, 2]);
            (rot.select(4, 0), rot.select(4, 1))
        };
        let ra = &a * &cos - &b * &sin;
        let rb = &a * &sin + &b * &cos;
        let out = if self.half {
            Tensor::cat(&[ra, rb], 3)
        } else {
            Tensor::stack(&[ra, rb], 4).reshape([x.size()[0], x.size()[1], t, self.dim])
        };
        let (o, end) = (self.offset, self.offset + self.dim);
        let mut parts = Vec::with_capacity(3);
        if o > 0 {
            parts.push(x.narrow(3, 0, o));
        }
        parts.push(out);
        if end < dh {
            parts.push(x.narrow(3, end, dh - end));
        }
        if parts.len() == 1 {
            parts.pop().unwrap_or_else(|| x.shallow_clone())
        } else {
            Tensor::cat(&parts, 3)
        }
    }

    /// The two halves (or the even and odd dimensions) of `x`'s first `dim` dimensions.
    fn pairs(&self, x: &Tensor) -> Result<(Tensor, Tensor), tch::TchError> {
        let (b, h, t) = (x.size()[0], x.size()[1], x.size()[2]);
        let (r, half) = (x.f_narrow(3, self.offset, self.dim)?, self.dim / 2);
        Ok(if self.half {
            (r.f_narrow(3, 0, half)?, r.f_narrow(3, half, half)?)
        } else {
            let rot = r.f_view([b, h, t, half, 2])?;
            (rot.f_select(4, 0)?, rot.f_select(4, 1)?)
        })
    }

    /// [`Rotary::apply_from`] without autograd, written into one new tensor: each half is a
    /// product and a fused multiply-add (`a cos - b sin`, `a sin + b cos`) instead of four
    /// products, two sums and a concatenation, each a tensor of its own.
    fn rotate_into(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, tch::TchError> {
        let dh = x.size()[3];
        let out = Tensor::f_empty(x.size(), (x.kind(), x.device()))?;
        let (a, b) = self.pairs(x)?;
        let (mut oa, mut ob) = self.pairs(&out)?;
        let _ = a.f_mul_out(&oa, cos)?;
        let _ = oa.f_addcmul_(&b, &sin.f_neg()?)?;
        let _ = a.f_mul_out(&ob, sin)?;
        let _ = ob.f_addcmul_(&b, cos)?;
        let (o, end) = (self.offset, self.offset + self.dim);
        if o > 0 {
            out.f_narrow(3, 0, o)?.f_copy_(&x.f_narrow(3, 0, o)?)?;
        }
        if end < dh {
            out.f_narrow(3, end, dh - end)?.f_copy_(&x.f_narrow(3, end, dh - end)?)?;
        }
        Ok(out)
    }
}

/// Per-head gates of every attention kind: `[G, layers, heads]` with G = 1 (one mask for the
/// whole batch) or G = batch (one mask per batch row). Absent kinds are ungated.
///
/// A gate `g` scales a head's context: `z' = g z`, or, where the kind has a fill (mean
/// ablation, docs/methods.md#mean-ablation), `z' = g z + (1 - g) fill`: a closed head then
/// carries its reference mean instead of zero.
#[derive(Default)]
pub struct Gates {
    pub enc: Option<Tensor>,
    pub dec: Option<Tensor>,
    pub cross: Option<Tensor>,
    /// Per kind `[layers, heads, d_head]`: what a closed head's context becomes (zero when absent).
    pub fill: Fills,
    /// Streaming heads of the decoder-only stack (docs/methods.md#streaming-heads).
    pub stream: Option<std::sync::Arc<Streaming>>,
    /// DuoAttention's mix of full and streaming attention in the decoder-only stack
    /// (docs/methods.md#duo-gates).
    pub duo: Option<std::rc::Rc<Duo>>,
    /// Self-attention layers bypassed (HARP, docs/methods.md#pruning-strategies).
    pub bypass: Option<std::sync::Arc<Vec<Bypass>>>,
    /// A fill computed per batch (resample or per-position mean ablation): resolved into
    /// `fill` by the stack's entry ([`super::transformer::Transformer::encode`]).
    pub source: Option<std::rc::Rc<super::fill::FillSource>>,
    /// Gates on experts (docs/methods.md#experts-as-units).
    pub experts: Option<ExpertGates>,
}

/// Gates on the experts of one stack: `g [layers, width]` in the experts' numbering as loaded
/// (`width` the most experts of a layer; a dense layer's row is read by nothing), one mask for
/// every row of the batch (docs/methods.md#experts-as-units). A gate multiplies the expert's
/// router weight (0: its output zeroed where it was chosen, the routing unchanged), or with
/// `route` a gate of 0 removes the expert from routing (its logit minus infinity).
pub struct ExpertGates {
    pub kind: Kind,
    pub g: Tensor,
    pub route: bool,
}

/// HARP's pruned attention (Liu & Liu 2025): layer `layer_idx` of `kind` skips its scores and
/// softmax; each token's context is its own value times `alpha` (`x + alpha norm(x) W_V W_O`).
/// `width`: the layer's heads as loaded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bypass {
    pub kind: Kind,
    pub layer_idx: usize,
    pub alpha: f64,
    pub width: usize,
}

/// DuoAttention's mix (docs/methods.md#duo-gates): head `h` of decoder layer `l` reads
/// `alpha[l, h] z_full + (1 - alpha[l, h]) z_streaming`, the streaming context seeing the first
/// `sink` keys and the last `recent` (regime always). `alpha [layers, heads]`, in the original
/// numbering, may carry a gradient.
pub struct Duo {
    pub alpha: Tensor,
    pub sink: i64,
    pub recent: i64,
}

/// One layer's share of a [`Duo`] mix: `alpha [heads]`.
pub struct DuoLayer {
    pub alpha: Tensor,
    pub sink: i64,
    pub recent: i64,
}

impl DuoLayer {
    /// The additive bias `[1, 1, Tq, Tk]` hiding from a streaming head the keys outside its
    /// sink and window, for queries at positions `start..start + Tq`.
    pub fn window(&self, tq: i64, tk: i64, start: i64, dtype: DType, device: tch::Device) -> Tensor {
        let (q, k) = positions(tq, start, tk, device);
        window_seen(&q, &k, self.sink, self.recent).logical_not().to_kind(dtype).view([1, 1, tq, tk]) * -1e9
    }
}

/// Query positions `start..start + tq` as `[tq, 1]` and key positions `0..tk` as `[1, tk]`.
fn positions(tq: i64, start: i64, tk: i64, device: tch::Device) -> (Tensor, Tensor) {
    (
        Tensor::arange_start(start, start + tq, (DType::Int64, device)).view([tq, 1]),
        Tensor::arange(tk, (DType::Int64, device)).view([1, tk]),
    )
}

/// Which keys a streaming head's queries see (regime always): the first `sink` and the last
/// `recent` up to each query, `j < sink or i - j < recent` (the causal mask is the bias's).
fn window_seen(q: &Tensor, k: &Tensor, sink: i64, recent: i64) -> Tensor {
    k.lt(sink).logical_or(&(q - k).lt(recent))
}

/// When streaming heads stream (docs/methods.md#streaming-heads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regime {
    /// Over the prompt and the generation alike (DuoAttention, PruLong).
    Always,
    /// Only after a prompt read in full (kvpress): `prompt` tokens, or, when `None`, the
    /// prompt of a generation (the first call on a cache); a text analysed without a cache is
    /// all prompt.
    Decode { prompt: Option<i64> },
}

/// Streaming heads: each sees only the first `sink` keys and a recent window; the others see
/// every key. `heads[layer][head]` in the original numbering (whole key/value groups under
/// grouped-query attention: the view sets every query head of a streaming group).
#[derive(Debug, Clone, PartialEq)]
pub struct Streaming {
    pub heads: Vec<Vec<bool>>,
    pub sink: i64,
    pub recent: i64,
    pub regime: Regime,
}

impl Streaming {
    /// Whether a streaming group's cache keeps key `j` once positions `..end` have run
    /// (`first`: the positions of the cache's first call): the keys the last query run still
    /// sees (regime always: the first `sink` and the last `recent`), or, once the prompt is
    /// read, the keys every later query sees (decode); the rest no query to come can see.
    pub fn keeps(&self, j: i64, end: i64, first: Option<i64>) -> bool {
        match self.regime {
            Regime::Always => j < self.sink || j >= end - self.recent,
            Regime::Decode { .. } => j < self.sink || j >= self.prompt(end, first) - self.recent,
        }
    }

    /// The prompt length the decode regime uses for a run over positions `..len` whose cache
    /// was started by a call of `first` positions (`None`: no cache, the whole text).
    pub fn prompt(&self, len: i64, first: Option<i64>) -> i64 {
        match self.regime {
            Regime::Always => len,
            Regime::Decode { prompt: Some(p) } => p,
            Regime::Decode { prompt: None } => first.unwrap_or(len),
        }
    }

    /// Additive bias `[1, H, T, past + T]` (H: the heads the layer holds, `slots` after
    /// `prune_heads`) hiding from layer `layer_idx`'s streaming heads the keys they do not see,
    /// for queries at positions `past..past + T`; `None` when no head of the layer streams.
    #[allow(clippy::too_many_arguments)]
    pub fn bias(
        &self,
        layer_idx: usize,
        slots: Option<&HeadSlots>,
        n_heads: i64,
        t: i64,
        past: i64,
        prompt: i64,
        dtype: DType,
        device: tch::Device,
    ) -> Option<Tensor> {
        let row = self.heads.get(layer_idx)?;
        let own: Vec<f32> = match slots {
            None => {
                (0..n_heads as usize).map(|h| if row.get(h).copied().unwrap_or(false) { 1.0 } else { 0.0 }).collect()
            }
            Some(s) => s.index.iter().map(|&o| if row.get(o).copied().unwrap_or(false) { 1.0 } else { 0.0 }).collect(),
        };
        if !own.iter().any(|&v| v > 0.0) {
            return None;
        }
        let tk = past + t;
        let (q, k) = positions(t, past, tk, device);
        let seen = match self.regime {
            Regime::Always => window_seen(&q, &k, self.sink, self.recent),
            Regime::Decode { .. } => q.lt(prompt).logical_or(&k.lt(self.sink)).logical_or(&k.ge(prompt - self.recent)),
        };
        let hidden = seen.logical_not().to_kind(dtype).view([1, 1, t, tk]);
        let heads = Tensor::from_slice(&own).to_kind(dtype).to_device(device).view([1, own.len() as i64, 1, 1]);
        Some(hidden * heads * -1e9)
    }
}

/// The values closed heads take instead of zero, per kind `[layers, heads, d_head]` (mean
/// ablation), or `[layers, B, heads, T, d_head]` per row and position of one batch (resample
/// ablation); heads in the original numbering.
#[derive(Default)]
pub struct Fills {
    pub enc: Option<Tensor>,
    pub dec: Option<Tensor>,
    pub cross: Option<Tensor>,
}

impl Fills {
    pub fn of(&self, kind: Kind) -> Option<&Tensor> {
        match kind {
            Kind::Enc => self.enc.as_ref(),
            Kind::Dec => self.dec.as_ref(),
            Kind::Cross => self.cross.as_ref(),
        }
    }
    pub fn set(&mut self, kind: Kind, t: Tensor) {
        match kind {
            Kind::Enc => self.enc = Some(t),
            Kind::Dec => self.dec = Some(t),
            Kind::Cross => self.cross = Some(t),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.enc.is_none() && self.dec.is_none() && self.cross.is_none()
    }
    /// Whether no fill is per row and position (a resolved per-batch fill is
    /// `[layers, B, heads, T, dh]`; a mean is `[layers, heads, dh]`).
    pub fn is_position_free(&self) -> bool {
        [&self.enc, &self.dec, &self.cross].iter().all(|f| f.as_ref().is_none_or(|t| t.dim() <= 3))
    }
    pub fn share(&self) -> Fills {
        let pick = |g: &Option<Tensor>| g.as_ref().map(|t| t.shallow_clone());
        Fills { enc: pick(&self.enc), dec: pick(&self.dec), cross: pick(&self.cross) }
    }
}

/// The gates of one layer: `g [G, heads]` and the layer's fill `[heads, d_head]`, if any.
pub struct LayerGate {
    pub g: Tensor,
    pub fill: Option<Tensor>,
    /// The layer's DuoAttention mix (decoder self-attention only).
    pub duo: Option<DuoLayer>,
    /// HARP: the attention bypassed, each token's own value times this.
    pub bypass: Option<f64>,
    /// Whether `g` gates the mixer's heads (false: the layer's gate is its experts' alone).
    pub heads: bool,
    /// The layer's expert gates ([`ExpertGates`]).
    pub experts: Option<ExpertGate>,
}

impl LayerGate {
    /// The gate on `device` (its layer's placement), itself where it is there already.
    pub fn on(self, device: tch::Device) -> Result<LayerGate, ModelError> {
        if self.g.device() == device {
            return Ok(self);
        }
        let duo = match self.duo {
            Some(d) => Some(DuoLayer { alpha: d.alpha.f_to_device(device)?, ..d }),
            None => None,
        };
        let fill = match &self.fill {
            Some(f) => Some(f.f_to_device(device)?),
            None => None,
        };
        let experts = match &self.experts {
            Some(e) => Some(ExpertGate { g: e.g.f_to_device(device)?, route: e.route }),
            None => None,
        };
        Ok(LayerGate { g: self.g.f_to_device(device)?, fill, duo, bypass: self.bypass, heads: self.heads, experts })
    }
}

impl Gates {
    pub fn none() -> Self {
        Gates::default()
    }
    /// The gates of one layer, if the kind is gated.
    pub fn layer(&self, kind: Kind, layer_idx: usize) -> Option<LayerGate> {
        let duo = match (&self.duo, kind) {
            (Some(d), Kind::Dec) => {
                Some(DuoLayer { alpha: d.alpha.select(0, layer_idx as i64), sink: d.sink, recent: d.recent })
            }
            _ => None,
        };
        let bypass =
            self.bypass.as_ref().and_then(|b| b.iter().find(|b| b.kind == kind && b.layer_idx == layer_idx).copied());
        let experts = self.experts_of(kind, layer_idx);
        let (g, heads) = match (self.of(kind), &duo, &bypass, &experts) {
            (Some(g), _, _, _) => (g.select(1, layer_idx as i64), true),
            (None, Some(d), _, _) => (d.alpha.detach().ones_like().unsqueeze(0), true),
            (None, None, Some(b), _) => (Tensor::ones([1, b.width as i64], (DType::Float, tch::Device::Cpu)), true),
            (None, None, None, Some(_)) => (Tensor::ones([1, 0], (DType::Float, tch::Device::Cpu)), false),
            (None, None, None, None) => return None,
        };
        Some(LayerGate {
            g,
            fill: self.fill.of(kind).map(|f| f.select(0, layer_idx as i64)),
            duo,
            bypass: bypass.map(|b| b.alpha),
            heads,
            experts,
        })
    }

    /// The expert gates of layer `layer_idx` of `kind` (`[width]`), if any.
    pub fn experts_of(&self, kind: Kind, layer_idx: usize) -> Option<ExpertGate> {
        self.experts
            .as_ref()
            .filter(|e| e.kind == kind && (layer_idx as i64) < e.g.size()[0])
            .map(|e| ExpertGate { g: e.g.get(layer_idx as i64), route: e.route })
    }
    /// The fill of one layer of `kind` `[heads, d_head]`, if the kind has one.
    pub fn fill_of(&self, kind: Kind, layer_idx: usize) -> Option<Tensor> {
        self.fill.of(kind).map(|f| f.select(0, layer_idx as i64))
    }
    /// The gates of one kind.
    pub fn of(&self, kind: Kind) -> Option<&Tensor> {
        match kind {
            Kind::Enc => self.enc.as_ref(),
            Kind::Dec => self.dec.as_ref(),
            Kind::Cross => self.cross.as_ref(),
        }
    }

    /// Multiplies `g` (`[G, layers, heads]`) into the gates of `kind` (sets them if ungated).
    pub fn multiply(&mut self, kind: Kind, g: Tensor) {
        let slot = match kind {
            Kind::Enc => &mut self.enc,
            Kind::Dec => &mut self.dec,
            Kind::Cross => &mut self.cross,
        };
        *slot = Some(match slot.take() {
            Some(old) => old * g,
            None => g,
        });
    }

    /// The same gates (the tensors shared).
    pub fn share(&self) -> Gates {
        let pick = |g: &Option<Tensor>| g.as_ref().map(|t| t.shallow_clone());
        Gates {
            enc: pick(&self.enc),
            dec: pick(&self.dec),
            cross: pick(&self.cross),
            fill: self.fill.share(),
            stream: self.stream.clone(),
            duo: self.duo.clone(),
            bypass: self.bypass.clone(),
            source: self.source.clone(),
            experts: self.experts.as_ref().map(|e| ExpertGates {
                kind: e.kind,
                g: e.g.shallow_clone(),
                route: e.route,
            }),
        }
    }

    /// The gates of batch rows `index` (for a batch split into pieces); one shared mask stays.
    pub fn rows(&self, index: &Tensor) -> Gates {
        let pick = |g: &Option<Tensor>| {
            g.as_ref().map(|t| if t.size()[0] == 1 { t.shallow_clone() } else { t.index_select(0, index) })
        };
        Gates {
            enc: pick(&self.enc),
            dec: pick(&self.dec),
            cross: pick(&self.cross),
            fill: self.fill.share(),
            stream: self.stream.clone(),
            duo: self.duo.clone(),
            bypass: self.bypass.clone(),
            source: self.source.clone(),
            experts: self.experts.as_ref().map(|e| ExpertGates {
                kind: e.kind,
                g: e.g.shallow_clone(),
                route: e.route,
            }),
        }
    }
}

pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub n_heads: i64,
    pub n_kv_heads: i64,
    pub head_dim: i64,
    /// Rotary positions on queries and keys (self-attention over one sequence).
    pub rotary: Option<Rotary>,
    /// After `prune_heads`: which of the original heads the `n_heads` left are. `None`: the
    /// heads as loaded, numbered `0..n_heads`.
    pub slots: Option<HeadSlots>,
    /// Norms of the queries and keys before rotary (Qwen3, OLMo-2).
    pub qk_norm: Option<QkNorm>,
    /// How scores are scaled and capped (defaults: `1/sqrt(head_dim)`, no cap).
    pub score: Score,
    /// gpt-oss's learned sink logit per head `[H]` (docs/methods.md#attention-sinks): it takes
    /// part in each query's softmax and attends to no value, so a head's weights over the keys
    /// sum to less than 1.
    pub sinks: Option<Tensor>,
    /// Latent attention (DeepSeek; [`super::latent`]): `W_Q` reads a query latent, `W_K` and
    /// `W_V` the normed key/value latent, and each key's last `rope` dimensions are shared by
    /// every head. `head_dim` is then the query/key width, [`Attention::z_dim`] the value's.
    pub latent: Option<Latent>,
    /// Llama 4's attention temperature on its layers without rotary: each query at position `p`
    /// times `ln(1 + floor((p + 1) / floor_scale)) attn_scale + 1` (after `hook_q`).
    pub temperature: Option<Temperature>,
    /// Qwen3-Next's gated attention: each head's context times `sigmoid(x W_G)` `[B, H, T, dh]`
    /// (`attn.hook_out_gate`) before the gates and `hook_z`, so a head its gate closes shows it
    /// at `hook_z` (docs/methods.md#gated-attention).
    pub out_gate: Option<Linear>,
}

/// Llama 4's `attn_temperature_tuning` (`floor_scale`, `attn_scale`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Temperature {
    pub floor_scale: f64,
    pub attn_scale: f64,
}

impl Temperature {
    /// `q [B, H, T, dh]` at positions `start..` times each position's factor.
    fn apply(&self, q: &Tensor, start: i64) -> Result<Tensor, ModelError> {
        let t = q.size()[2];
        let pos = Tensor::f_arange_start(start, start + t, (DType::Double, q.device()))?;
        let f = pos.f_add_scalar(1.0)?.f_div_scalar(self.floor_scale)?.f_floor()?.f_log1p()?;
        let f = f.f_mul_scalar(self.attn_scale)?.f_add_scalar(1.0)?.f_to_kind(q.kind())?.f_view([1, 1, t, 1])?;
        Ok(q.f_mul(&f)?)
    }
}

impl Attention {
    /// An attention block of `n_heads` query heads sharing `n_kv_heads` key/value heads of
    /// `head_dim`, from its four projections: no rotary, no q/k norms, the default score
    /// (`1/sqrt(head_dim)`, no cap), the heads as loaded. The `with_` methods add the rest, so
    /// a new field gets its default here and no builder elsewhere changes.
    pub fn new(q: Linear, k: Linear, v: Linear, o: Linear, n_heads: i64, n_kv_heads: i64, head_dim: i64) -> Attention {
        Attention {
            q,
            k,
            v,
            o,
            n_heads,
            n_kv_heads,
            head_dim,
            rotary: None,
            slots: None,
            qk_norm: None,
            score: Score::default(),
            sinks: None,
            latent: None,
            temperature: None,
            out_gate: None,
        }
    }

    /// Qwen3-Next's per-head sigmoid output gate `W_G [H dh, D]` (rows in the heads' order).
    pub fn with_out_gate(mut self, out_gate: Option<Linear>) -> Attention {
        self.out_gate = out_gate;
        self
    }

    /// Llama 4's attention temperature (its layers without rotary).
    pub fn with_temperature(mut self, temperature: Option<Temperature>) -> Attention {
        self.temperature = temperature;
        self
    }

    /// The latent projections in front of `W_Q`, `W_K` and `W_V` (latent attention).
    pub fn with_latent(mut self, latent: Option<Latent>) -> Attention {
        self.latent = latent;
        self
    }

    /// The width of each head's values and contexts (`hook_v`, `hook_z`): `head_dim`, or latent
    /// attention's `v_head_dim`.
    pub fn z_dim(&self) -> i64 {
        self.latent.as_ref().map_or(self.head_dim, |l| l.v_dim)
    }

    /// Learned sink logits, one per head (gpt-oss).
    pub fn with_sinks(mut self, sinks: Option<Tensor>) -> Attention {
        self.sinks = sinks;
        self
    }

    /// Rotary positions on queries and keys.
    pub fn with_rotary(mut self, rotary: Option<Rotary>) -> Attention {
        self.rotary = rotary;
        self
    }

    /// Norms of the queries and keys before rotary.
    pub fn with_qk_norm(mut self, qk_norm: Option<QkNorm>) -> Attention {
        self.qk_norm = qk_norm;
        self
    }

    /// The scores' scale and soft-cap.
    pub fn with_score(mut self, score: Score) -> Attention {
        self.score = score;
        self
    }
}

/// The attention scores' scale and soft-cap.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Score {
    /// Instead of `1/sqrt(head_dim)` (Gemma: `query_pre_attn_scalar^-1/2`).
    pub scale: Option<f64>,
    /// Scores `c * tanh(s / c)` before the mask (Gemma 2's `attn_logit_softcapping`).
    pub softcap: Option<f64>,
}

/// RMSNorms of queries and keys, applied after their projections and before rotary.
pub struct QkNorm {
    pub q: Norm,
    pub k: Norm,
    /// Over each head's `head_dim` (Qwen3, Gemma 3), or over all heads at once, the whole
    /// projection (OLMo-2).
    pub per_head: bool,
}

impl QkNorm {
    /// `x`: a projection's output `[B, T, n * dh]`, returned as `[B, n, T, dh]`.
    fn heads(&self, norm: &Norm, x: &Tensor, n: i64, dh: i64, rules: GradRules) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        if self.per_head {
            norm.forward_with(&x.view([b, t, n, dh]), rules).transpose(1, 2)
        } else {
            norm.forward_with(x, rules).view([b, t, n, dh]).transpose(1, 2)
        }
    }
}

/// The original numbers of an attention block's heads after some were removed: physical head
/// `i` is original head `index[i]` of `width`. Gates and results keep the original numbering.
#[derive(Debug)]
pub struct HeadSlots {
    /// Heads per layer as loaded (the width of gates and result grids).
    pub width: usize,
    pub index: Vec<usize>,
    /// `index` on the model's device, to pick gate columns.
    pub index_t: Tensor,
}

impl HeadSlots {
    pub fn new(width: usize, index: Vec<usize>, device: tch::Device) -> HeadSlots {
        let idx: Vec<i64> = index.iter().map(|&i| i as i64).collect();
        HeadSlots { width, index, index_t: Tensor::from_slice(&idx).to_device(device) }
    }
}

impl Attention {
    /// Heads per layer in the original numbering (the width of gates and result grids).
    pub fn width(&self) -> usize {
        self.slots.as_ref().map_or(self.n_heads as usize, |s| s.width)
    }

    /// The original number of each head present, in physical order.
    pub fn present(&self) -> Vec<usize> {
        self.slots.as_ref().map_or_else(|| (0..self.n_heads as usize).collect(), |s| s.index.clone())
    }

    /// The physical position of original head `head`, if it is present.
    pub fn physical(&self, head: usize) -> Option<usize> {
        match &self.slots {
            None => (head < self.n_heads as usize).then_some(head),
            Some(s) => s.index.iter().position(|&h| h == head),
        }
    }

    /// Removes every head but `keep` (original numbers, ascending) from the weights: their
    /// Q/K/V row blocks and W^O column blocks kept, the rest dropped; the heads keep their
    /// numbers (`slots`). Computes what masking the others computes, so it refuses, naming
    /// why, where it could not: heads sharing keys and values (grouped-query attention), and
    /// q/k norms over all heads at once (OLMo-2's: removing a head would rescale the others).
    pub fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
        if self.n_kv_heads != self.n_heads {
            return Err(format!(
                "it uses grouped-query attention ({} query heads share {} key/value heads); removing single heads is not supported there",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.qk_norm.as_ref().is_some_and(|n| !n.per_head) {
            return Err(format!(
                "it normalises the queries and keys of all its heads together (a q/k RMSNorm over all {} heads, as OLMo-2's); removing a head would rescale every other head, so it cannot equal masking",
                self.n_heads
            ));
        }
        let width = self.width();
        if let Some(&h) = keep.iter().find(|&&h| h >= width || self.physical(h).is_none()) {
            return Err(format!("head {h} is not in this layer"));
        }
        let phys: Vec<i64> = keep.iter().filter_map(|&h| self.physical(h)).map(|p| p as i64).collect();
        // Physical row blocks of the heads kept, each projection by its own width per head
        // (latent attention's keys and values differ from its queries).
        let device = self.q.w.device();
        let blocks = |per: i64| -> Tensor {
            let rows: Vec<i64> = phys.iter().flat_map(|&p| p * per..(p + 1) * per).collect();
            Tensor::from_slice(&rows).to_device(device)
        };
        let n = self.n_heads.max(1);
        for lin in
            [Some(&mut self.q), Some(&mut self.k), Some(&mut self.v), self.out_gate.as_mut()].into_iter().flatten()
        {
            let idx = blocks(lin.w.size()[0] / n);
            lin.w = lin.w.index_select(0, &idx);
            lin.b = lin.b.as_ref().map(|b| b.index_select(0, &idx));
        }
        let idx = blocks(self.z_dim());
        self.o.w = self.o.w.index_select(1, &idx);
        if let Some(sinks) = self.sinks.as_mut() {
            *sinks = sinks.index_select(0, &Tensor::from_slice(&phys).to_device(sinks.device()));
        }
        self.n_heads = keep.len() as i64;
        self.n_kv_heads = keep.len() as i64;
        self.slots = Some(HeadSlots::new(width, keep.to_vec(), idx.device()));
        Ok(())
    }

    /// Gates `[G, width]` in the original numbering -> `[G, n_heads]` for the heads present.
    pub(in crate::model) fn own_gates(&self, g: &Tensor) -> Tensor {
        match &self.slots {
            None => g.shallow_clone(),
            Some(s) => g.index_select(1, &s.index_t),
        }
    }

    /// Contexts `[B, H, T, dh]` under one layer's gates: `g z`, or `g z + (1 - g) fill`.
    pub(in crate::model) fn gated(&self, ctx: &Tensor, lg: &LayerGate) -> Tensor {
        gate_contexts(ctx, lg, self.slots.as_ref(), self.n_heads, self.z_dim())
    }

    /// Scores `[B, H, Tq, Tk]` of queries `q [B, H, Tq, dh]` at positions `q_start..` over
    /// keys `k [B, Hk, Tk, dh]` at positions `0..`, as this block scores them: `q` and `k` as
    /// at `hook_q` / `hook_k` (after any q/k norms, before rotary); rotary applied, grouped keys
    /// repeated per query head, the score scale and soft-cap; no mask. For scorers that weigh
    /// queries and keys of their own (DuoAttention's on-the-fly scores).
    pub fn scores_of(&self, q: &Tensor, q_start: i64, k: &Tensor) -> Result<Tensor, ModelError> {
        let (h, hk) = (q.size()[1], k.size()[1]);
        if hk == 0 || h % hk != 0 {
            return Err(ModelError::Invalid(format!("scores: {h} query heads over {hk} key heads")));
        }
        let (q, k) = match &self.rotary {
            Some(r) => (r.apply_from(&q.f_contiguous()?, q_start), r.apply_from(&k.f_contiguous()?, 0)),
            None => (q.shallow_clone(), k.shallow_clone()),
        };
        let q = match &self.temperature {
            Some(t) => t.apply(&q, q_start)?,
            None => q,
        };
        let k = k.f_repeat_interleave_self_int(h / hk, Some(1), None)?;
        if self.sinks.is_some() {
            return Err(ModelError::Invalid(
                "the scores of a head with a learned attention sink (gpt-oss) are not offered to scorers: its softmax also weighs the sink (docs/methods.md#attention-sinks)".into(),
            ));
        }
        let scale = self.score.scale.unwrap_or(1.0 / (self.head_dim as f64).sqrt());
        Ok(softcap(q.f_matmul(&k.f_transpose(-2, -1)?)? * scale, self.score.softcap))
    }

    /// `xq [B, Tq, D]` attends over `xkv [B, Tk, D]`; `bias` is additive `[B, 1, Tq|1, Tk]`
    /// (0 or a large negative for masked keys). Gates `[G, H]` scale each head's context.
    /// Positions (rotary) start at 0.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::model) fn forward(
        &self,
        xq: &Tensor,
        xkv: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        // Nothing keeps these keys and values: per key/value head, as the attention reads them.
        let kv = self.keys_values_grouped(xkv, 0, kind, layer_idx, h)?;
        self.attend(xq, &kv, bias, gate, 0, kind, layer_idx, h)
    }

    /// The keys and values of `xkv [B, Tk, D]` at positions `start..`, per head `[B, H, Tk, dh]`
    /// (rotary positions applied, grouped heads repeated): what a decoder computes once per
    /// source sentence for its cross-attention, or caches step by step. Hook points `hook_k`,
    /// `hook_rot_k` and `hook_v` (per key/value head).
    pub(in crate::model) fn keys_values(
        &self,
        xkv: &Tensor,
        start: i64,
        kind: Kind,
        layer_idx: usize,
        hk_slot: &mut HookSlot,
    ) -> Result<KeysValues, ModelError> {
        self.keys_values_grouped(xkv, start, kind, layer_idx, hk_slot)?.per_query_head(self.n_heads)
    }

    /// [`Attention::keys_values`] per key/value head `[B, Hkv, Tk, dh]` (grouped-query
    /// attention's heads not repeated): what [`Attention::attend`] reads without a copy.
    pub(in crate::model) fn keys_values_grouped(
        &self,
        xkv: &Tensor,
        start: i64,
        kind: Kind,
        layer_idx: usize,
        hk_slot: &mut HookSlot,
    ) -> Result<KeysValues, ModelError> {
        if self.n_heads == 0 {
            return Ok(KeysValues::empty());
        }
        let at = |p| At::new(kind, layer_idx, p);
        if let Some(lat) = &self.latent {
            let rules = hooks::rules(hk_slot);
            let (k, v) = lat.keys_values(xkv, &self.k, &self.v, self.n_kv_heads, at(Point::K), rules, hk_slot)?;
            let mut k = hooks::at(hk_slot, at(Point::K), k)?;
            if let Some(r) = &self.rotary {
                k = hooks::at(hk_slot, at(Point::RotK), r.apply_from(&k, start))?;
            }
            let v = hooks::at(hk_slot, at(Point::V), v)?;
            return Ok(KeysValues { k, v });
        }
        let (b, tk) = (xkv.size()[0], xkv.size()[1]);
        let (hk, dh) = (self.n_kv_heads, self.head_dim);
        let k = match &self.qk_norm {
            Some(n) => n.heads(&n.k, &self.k.forward(xkv), hk, dh, hooks::rules(hk_slot)),
            None => self.k.forward(xkv).view([b, tk, hk, dh]).transpose(1, 2),
        };
        let mut k = hooks::at(hk_slot, at(Point::K), k)?;
        if let Some(r) = &self.rotary {
            k = hooks::at(hk_slot, at(Point::RotK), r.apply_from(&k, start))?;
        }
        let v = hooks::at(hk_slot, at(Point::V), self.v.forward(xkv).view([b, tk, hk, dh]).transpose(1, 2))?;
        Ok(KeysValues { k, v })
    }

    /// `xq [B, Tq, D]` (at positions `start..`) attends over keys and values from
    /// [`Attention::keys_values`] or [`Attention::keys_values_grouped`] (grouped-query heads
    /// repeated here only where the fused kernel does not read them grouped). Hook points
    /// `hook_q`, `hook_rot_q`, `hook_attn_scores`, `hook_pattern`, `hook_z`, `hook_result` and
    /// `hook_attn_out`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::model) fn attend(
        &self,
        xq: &Tensor,
        kv: &KeysValues,
        bias: &Bias,
        gate: Option<&LayerGate>,
        start: i64,
        kind: Kind,
        layer_idx: usize,
        hs: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        let at = |p| At::new(kind, layer_idx, p);
        let (b, tq) = (xq.size()[0], xq.size()[1]);
        let (h, dh) = (self.n_heads, self.head_dim);
        if h == 0 {
            // Every head removed (prune_heads): only W^O's bias is left. Empty tensors must not
            // reach the attention kernels (some divide by the head count).
            let d = self.o.w.size()[0];
            let zero = Tensor::zeros([b, tq, d], (xq.kind(), xq.device()));
            let out = match &self.o.b {
                Some(bias) => zero + bias,
                None => zero,
            };
            return hooks::at(hs, at(Point::AttnOut), out);
        }
        // A per-head bias over the heads as loaded (T5's relative positions, `[B, width, Tq,
        // Tk]`): a layer that prune_heads thinned reads its own heads' columns.
        let own_bias;
        let bias = match (&self.slots, bias) {
            (Some(s), Bias::Dense(t)) if t.dim() == 4 && t.size()[1] == s.width as i64 && s.width as i64 != h => {
                own_bias = Bias::Dense(t.f_index_select(1, &s.index_t)?);
                &own_bias
            }
            _ => bias,
        };
        let q_in = match &self.latent {
            Some(lat) => lat.query_input(xq, at(Point::Q), hooks::rules(hs), hs)?,
            None => xq.shallow_clone(),
        };
        let q = match &self.qk_norm {
            Some(n) => n.heads(&n.q, &self.q.forward(&q_in), h, dh, hooks::rules(hs)),
            None => self.q.forward(&q_in).view([b, tq, h, dh]).transpose(1, 2),
        };
        let mut q = hooks::at(hs, at(Point::Q), q)?;
        if let Some(r) = &self.rotary {
            q = hooks::at(hs, at(Point::RotQ), r.apply_from(&q, start))?;
        }
        if let Some(t) = &self.temperature {
            q = t.apply(&q, start)?;
        }
        // AttnLRP: the uniform rule on q.k^T and on A.v (as LXT applies it to llama: q and k
        // each carry a quarter of the gradient, v half; the softmax keeps its gradient).
        let lrp_kv;
        let (k, v) = if hooks::rules(hs) == GradRules::AttnLrp {
            q = divide_gradient(&q, 4.0);
            lrp_kv = (divide_gradient(&kv.k, 4.0), divide_gradient(&kv.v, 2.0));
            (&lrp_kv.0, &lrp_kv.1)
        } else {
            (&kv.k, &kv.v)
        };
        // The fused kernel reads grouped keys and values itself (without autograd: its
        // backward is left to the repeated form); every other path reads them per query head.
        // Tiles of the weights, where the run's hooks ask for them (Hooks::tile_rows).
        let tiles = hooks::tile_rows(hs, at(Point::Pattern)).filter(|_| gate.and_then(|g| g.bypass).is_none());
        let whole_wanted = hooks::wants(hs, at(Point::Scores)) || hooks::wants(hs, at(Point::Pattern));
        let fused = gate.and_then(|g| g.bypass).is_none()
            && tiles.is_none()
            && !(whole_wanted || self.score.softcap.is_some() || self.sinks.is_some());
        let grouped = k.dim() == 4 && k.size()[1] != h;
        let gqa = grouped && fused && !(q.requires_grad() || k.requires_grad() || v.requires_grad());
        let per_head;
        let (k, v) = if grouped && !gqa {
            per_head = KeysValues { k: k.shallow_clone(), v: v.shallow_clone() }.per_query_head(h)?;
            (&per_head.k, &per_head.v)
        } else {
            (k, v)
        };
        let scale = self.score.scale.unwrap_or(1.0 / (dh as f64).sqrt());
        // DuoAttention's mix (docs/methods.md#duo-gates): each head's weights are
        // `a P_full + (1 - a) P_streaming`, the streaming ones under the window's bias.
        let duo = match gate.and_then(|g| g.duo.as_ref()) {
            Some(d) => {
                let dense = bias.dense()?;
                let window = d.window(tq, k.size()[2], start, dense.kind(), dense.device());
                let a = self.own_gates(&d.alpha.unsqueeze(0)).to_kind(q.kind()).view([1, h, 1, 1]);
                Some((a, dense + window))
            }
            None => None,
        };
        // With learned sinks (gpt-oss), each row's softmax also weighs its head's sink logit,
        // whose share is then dropped (transformers' eager path: the sink as one more column).
        let sinks = self.sinks.as_ref().map(|s| s.to_kind(q.kind()).view([1, h, 1, 1]));
        let softmax = |s: &Tensor| {
            let wide = if low_precision(s.kind()) { DType::Float } else { s.kind() };
            match &sinks {
                Some(sk) => {
                    let (bq, tq, tk) = (s.size()[0], s.size()[2], s.size()[3]);
                    let col = sk.expand([bq, h, tq, 1], false).to_kind(s.kind());
                    let all = Tensor::cat(&[s, &col], -1);
                    let all = &all - all.amax([-1i64].as_slice(), true);
                    all.softmax(-1, wide).narrow(-1, 0, tk).to_kind(s.kind())
                }
                None => s.softmax(-1, wide).to_kind(s.kind()),
            }
        };
        let mut ctx = if let Some(alpha) = gate.and_then(|g| g.bypass) {
            // HARP: no scores; each query's own value (the last `tq` of the keys' positions).
            let tk = v.size()[2];
            v.f_narrow(2, tk - tq, tq)? * alpha
        } else if let (Some(rows), false, true) = (tiles, whole_wanted, tq > 0) {
            // Query rows a tile at a time: the scores and weights of one tile are all that is
            // held; each goes to the hooks (Hooks::tile), then on to the values. The same
            // arithmetic as the whole path below, row block by row block.
            let kt = k.transpose(-2, -1);
            let tk = k.size()[2];
            let mut parts = Vec::new();
            let mut q0 = 0;
            while q0 < tq {
                // An interrupt stops a long layer within a tile's work, not a layer's.
                super::check_interrupt()?;
                let n = rows.min(tq - q0);
                // The keys the bias hides from every row of the tile (a causal stack's later
                // keys, a window's earlier ones) are skipped: their weights are exactly 0.
                let tb = bias.tile(q0, n, tq, tk)?;
                let (k0, k1) = tb.keys;
                let cols = |t: &Tensor| -> Result<Tensor, ModelError> {
                    Ok(if (k0, k1) != (0, tk) && t.size().last() == Some(&tk) {
                        t.f_narrow(-1, k0, k1 - k0)?
                    } else {
                        t.shallow_clone()
                    })
                };
                // The scale on the tile's queries (n x dh values) rather than its scores.
                let raw = softcap((q.f_narrow(2, q0, n)? * scale).matmul(&cols(&kt)?), self.score.softcap);
                let (scores, probs) = match &duo {
                    Some((a, streaming)) => {
                        let scores = &raw + cols(&tb.rows()?)?;
                        let streamed = softmax(&(&raw + cols(&dense_rows(streaming, q0, n, tq)?)?));
                        let probs = softmax(&scores) * a + streamed * (a.ones_like() - a);
                        (scores, probs)
                    }
                    // The bias added where it is not 0, in place (docs/methods.md#score-tiles).
                    None => {
                        let scores = tb.add_to(raw)?;
                        let probs = softmax(&scores);
                        (scores, probs)
                    }
                };
                let tile = hooks::Tile { q0, k0, tk, pattern: &probs, scores: Some(&scores), bias: Some(&tb) };
                hooks::tile(hs, at(Point::Pattern), &tile)?;
                parts.push(probs.f_matmul(&v.f_narrow(2, k0, k1 - k0)?)?);
                q0 += n;
            }
            Tensor::f_cat(&parts, 2)?
        } else if !fused {
            let raw = q.matmul(&k.transpose(-2, -1)) * scale;
            // Soft-capping (Gemma 2) before the mask, as transformers: c * tanh(s / c).
            let raw = softcap(raw, self.score.softcap);
            let scores = hooks::at(hs, at(Point::Scores), &raw + bias.dense()?)?;
            let probs = softmax(&scores);
            let probs = match &duo {
                Some((a, streaming)) => &probs * a + softmax(&(&raw + streaming)) * (a.ones_like() - a),
                None => probs,
            };
            let probs = hooks::at(hs, at(Point::Pattern), probs)?;
            // Tiles asked for beside the whole weights: the rows of what the hooks left.
            if let Some(rows) = tiles {
                let mut q0 = 0;
                while q0 < tq {
                    let n = rows.min(tq - q0);
                    let (scores, probs) = (scores.f_narrow(2, q0, n)?, probs.f_narrow(2, q0, n)?);
                    hooks::tile(hs, at(Point::Pattern), &hooks::Tile::whole(q0, &probs, Some(&scores)))?;
                    q0 += n;
                }
            }
            probs.f_matmul(v)?
        } else {
            // The fused kernel (forward and backward) when nobody looks at the weights.
            let bias = bias.dense()?;
            let full = Tensor::f_scaled_dot_product_attention(&q, k, v, Some(&bias), 0.0, false, scale, gqa)?;
            match &duo {
                Some((a, streaming)) => {
                    &full * a
                        + Tensor::f_scaled_dot_product_attention(&q, k, v, Some(streaming), 0.0, false, scale, gqa)?
                            * (a.ones_like() - a)
                }
                None => full,
            }
        }; // [B, H, Tq, dh]
        if let Some(og) = &self.out_gate {
            // Gated attention (Qwen3-Next): sigmoid(x W_G) per head and channel; under AttnLRP
            // the identity rule on the sigmoid and the uniform rule on the product.
            let pre = og.forward(&q_in).f_view([b, tq, h, self.z_dim()])?.f_transpose(1, 2)?;
            let sig = pre.f_sigmoid()?;
            let lrp = hooks::rules(hs) == GradRules::AttnLrp;
            let sig = hooks::at(hs, at(Point::OutGate), if lrp { identity_rule(&sig, &pre) } else { sig })?;
            ctx = if lrp { divide_gradient(&ctx, 2.0).f_mul(&divide_gradient(&sig, 2.0))? } else { ctx.f_mul(&sig)? };
        }
        if let Some(lg) = gate {
            ctx = self.gated(&ctx, lg);
        }
        let ctx = hooks::at(hs, at(Point::Z), ctx)?;
        self.output_from_z(&ctx, kind, layer_idx, hs)
    }

    /// The attention's output from its per-head contexts `z [B, H, T, dh]` (the value at
    /// `hook_z`): `hook_result` and `hook_attn_out`. The forward resumes here when only the
    /// contexts change (a head's ablation or patch: the attention itself is not recomputed).
    pub(in crate::model) fn output_from_z(
        &self,
        ctx: &Tensor,
        kind: Kind,
        layer_idx: usize,
        hs: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        heads_output(ctx, &self.o, self.n_heads, self.z_dim(), kind, layer_idx, hs)
    }
}

/// Per-head contexts `ctx [B, n_heads, T, dh]` under one layer's gates `[G, width]` (original
/// numbering; `slots`: which original head each physical one is, after `prune_heads`): `g z`,
/// or `g z + (1 - g) fill` (docs/methods.md#head-masking). Every kind with heads gates this way.
pub(in crate::model) fn gate_contexts(
    ctx: &Tensor,
    lg: &LayerGate,
    slots: Option<&HeadSlots>,
    n_heads: i64,
    dh: i64,
) -> Tensor {
    // A hybrid's grid is as wide as its widest layer (and its fills as its widest heads):
    // this layer's heads are the first columns.
    let width = slots.map_or(n_heads, |s| s.width as i64);
    let cut =
        |t: &Tensor, dim: i64, n: i64| if t.size()[dim as usize] > n { t.narrow(dim, 0, n) } else { t.shallow_clone() };
    let g = cut(&lg.g, 1, width).to_device(ctx.device());
    let g = match slots {
        None => g,
        Some(s) => g.index_select(1, &s.index_t),
    }
    .to_kind(ctx.kind());
    let g = g.view([g.size()[0], n_heads, 1, 1]);
    match &lg.fill {
        None => ctx * g,
        Some(f) if f.dim() == 4 => {
            // Per row and position `[B, heads, T, dh]` (resample ablation): a batch of
            // G x B rows (row j * B + b) takes row b's fill.
            let f = cut(&cut(f, 1, width), 3, dh);
            let f = match slots {
                None => f,
                Some(s) => f.index_select(1, &s.index_t),
            };
            let reps = (ctx.size()[0] / f.size()[0].max(1)).max(1);
            let f = f.to_kind(ctx.kind()).narrow(2, 0, ctx.size()[2]).repeat([reps, 1, 1, 1]);
            ctx * &g + (g.ones_like() - &g) * f
        }
        Some(f) => {
            let f = cut(&cut(f, 0, width), 1, dh);
            let f = match slots {
                None => f,
                Some(s) => f.index_select(0, &s.index_t),
            };
            let f = f.to_kind(ctx.kind()).view([1, n_heads, 1, dh]);
            ctx * &g + (g.ones_like() - &g) * f
        }
    }
}

/// A mixer's output from its per-head contexts `ctx [B, H, T, dh]` (the value at `hook_z`)
/// through the output projection `o` (`[D, H dh]`): `hook_result` (each head's product, where
/// a hook looks) and `hook_attn_out`. Where a run resumes when only the contexts change.
pub(in crate::model) fn heads_output(
    ctx: &Tensor,
    o: &Linear,
    h: i64,
    dh: i64,
    kind: Kind,
    layer_idx: usize,
    hs: &mut HookSlot,
) -> Result<Tensor, ModelError> {
    let at = |p| At::new(kind, layer_idx, p);
    let (b, tq) = (ctx.size()[0], ctx.size()[2]);
    let mut out = None;
    if hooks::wants(hs, at(Point::Result)) {
        // C_h W^O_h^T for each head: [B, H, Tq, dh] x [H, dh, D].
        let d = o.w.size()[0];
        let wo = o.w.f_view([d, h, dh])?.f_permute([1, 2, 0])?;
        let result = ctx.f_matmul(&wo)?;
        // A changed result is what the output sums; an unchanged one leaves W^O's own
        // product (the floats of the plain forward).
        if let Some(seen) = hooks::replaced(hs, at(Point::Result), &result)? {
            let sum = seen.f_sum_dim_intlist([1i64].as_slice(), false, seen.kind())?;
            out = Some(match &o.b {
                Some(bias) => sum.f_add(bias)?,
                None => sum,
            });
        }
    }
    let out = match out {
        Some(o) => o,
        None => o.forward(&ctx.f_transpose(1, 2)?.f_reshape([b, tq, h * dh])?),
    };
    hooks::at(hs, at(Point::AttnOut), out)
}

/// Per-head keys and values `[B, H, Tk, dh]` of one attention over one key sequence.
pub struct KeysValues {
    pub k: Tensor,
    pub v: Tensor,
}

impl KeysValues {
    /// For an attention with no heads left, which reads neither.
    pub fn empty() -> KeysValues {
        KeysValues { k: Tensor::new(), v: Tensor::new() }
    }

    /// Per query head of an attention with `n_heads`: grouped-query keys and values (fewer
    /// heads) each repeated for the query heads of its group (head `h` reads `h / group`).
    pub fn per_query_head(self, n_heads: i64) -> Result<KeysValues, ModelError> {
        if self.k.dim() != 4 || self.k.size()[1] == n_heads || n_heads == 0 {
            return Ok(self);
        }
        let group = n_heads / self.k.size()[1];
        Ok(KeysValues {
            k: self.k.f_repeat_interleave_self_int(group, Some(1), None)?,
            v: self.v.f_repeat_interleave_self_int(group, Some(1), None)?,
        })
    }

    /// Per key/value head (`n_kv` of them) from per query head: each group's first head (the
    /// others repeat it); unchanged where already so.
    pub fn grouped(self, n_kv: i64) -> Result<KeysValues, ModelError> {
        if self.k.dim() != 4 || self.k.size()[1] == n_kv || n_kv == 0 {
            return Ok(self);
        }
        let (h, group) = (self.k.size()[1], self.k.size()[1] / n_kv);
        Ok(KeysValues { k: self.k.f_slice(1, 0, h, group)?, v: self.v.f_slice(1, 0, h, group)? })
    }

    /// The batch repeated `n` times (row `j * B + b` is row `b`).
    pub fn repeat(&self, n: i64) -> KeysValues {
        let rep = |t: &Tensor| if t.dim() == 4 { t.repeat([n, 1, 1, 1]) } else { t.shallow_clone() };
        KeysValues { k: rep(&self.k), v: rep(&self.v) }
    }
}

/// The index of the largest logit over the last dimension (the first on ties, as `argmax`).
/// `max_dim` is about 3x faster than `argmax` on CPU for vocabulary-sized rows (torch 2.11:
/// 0.30 ms against 0.87 ms for `[40, 32000]`, a third of the output projection's time).
pub fn top1(logits: &Tensor) -> Tensor {
    logits.max_dim(-1, false).1
}

/// The keys `k0 .. k1` some query row of a tile's bias rows (`[B, 1 or H, n, Tk]`) sees: the
/// others are hidden from every row (a bias of -1e9 or less), their weights exactly 0, so a
/// tile may skip them (docs/methods.md#score-tiles). Every key when a row sees none (its
/// softmax is then over all of them) or the bias is not per key.
pub fn visible_keys(row_bias: &Tensor, tk: i64) -> Result<(i64, i64), ModelError> {
    if row_bias.dim() != 4 || row_bias.size()[3] != tk || tk == 0 {
        return Ok((0, tk));
    }
    let seen = row_bias.f_gt(-1e8)?.f_reshape([-1, tk])?;
    if !bool::try_from(seen.f_any_dim(1, false)?.f_all()?)? {
        return Ok((0, tk));
    }
    let cols = seen.f_any_dim(0, false)?.f_nonzero()?;
    if cols.numel() == 0 {
        return Ok((0, tk));
    }
    Ok((cols.f_min()?.int64_value(&[]), cols.f_max()?.int64_value(&[]) + 1))
}

/// Additive causal bias `[1, 1, T, T]`: key `k` is hidden from query `q` when `k > q`.
/// With a sliding `window` (Mistral), query `i` sees only keys `i - window < j <= i`.
pub fn causal_bias(t: i64, window: Option<i64>, dtype: DType, device: tch::Device) -> Tensor {
    let mut hidden = Tensor::ones([t, t], (dtype, device)).triu(1);
    if let Some(w) = window {
        hidden = hidden + Tensor::ones([t, t], (dtype, device)).tril(-w.max(1));
    }
    hidden.view([1, 1, t, t]) * -1e9
}

/// Additive attention bias from a key mask `[B, Tk]` (0 = padding, else a real token: 1, or
/// in a packed row the number of its sentence): `[B, 1, 1, Tk]`.
pub fn key_bias(mask: &Tensor, dtype: DType) -> Tensor {
    let m = mask.gt(0.0).to_kind(dtype);
    let b: Tensor = (m.ones_like() - m) * -1e9;
    b.view([mask.size()[0], 1, 1, mask.size()[1]])
}

/// Whether a key mask numbers sentences packed into rows (docs/methods.md#packing): a value
/// above 1 somewhere.
pub fn is_packed(mask: &Tensor) -> bool {
    mask.numel() > 0 && mask.max().double_value(&[]) > 1.0
}

/// The longest sentence of a mask `[B, T]` (a packed row's sentences counted apart; an
/// unpacked row's real tokens, or `T` for a mask without padding).
pub fn longest_segment(mask: &Tensor) -> Result<i64, tch::TchError> {
    let (b, t) = (mask.size()[0], *mask.size().get(1).unwrap_or(&0));
    if b == 0 || t == 0 {
        return Ok(0);
    }
    let ids = mask.f_to_kind(DType::Int64)?;
    let real = ids.f_gt(0)?;
    let offset = Tensor::f_arange(b, (DType::Int64, mask.device()))?.f_mul_scalar(t + 1)?.f_view([b, 1])?;
    let keyed = ids.f_add(&offset)?.f_masked_select(&real)?;
    if keyed.numel() == 0 {
        return Ok(0);
    }
    Ok(keyed.f_bincount::<Tensor>(None, 0)?.f_max()?.int64_value(&[]))
}

/// Additive bias `[B, 1, T, T]` of a packed row's mask `[B, T]` (each real token numbered by
/// its sentence, 1, 2, ..., padding 0; docs/methods.md#packing): a real query does not see
/// the real keys of another sentence. A padding query is left as the padding of an unpacked
/// row is (it sees the real keys; nothing reads it).
pub fn segment_bias(mask: &Tensor, dtype: DType) -> Tensor {
    let (b, t) = (mask.size()[0], mask.size()[1]);
    let q = mask.view([b, t, 1]);
    let k = mask.view([b, 1, t]);
    let other = q.ne_tensor(&k).logical_and(&q.gt(0.0)).logical_and(&k.gt(0.0));
    other.to_kind(dtype).view([b, 1, t, t]) * -1e9
}

/// Sinusoidal positions `[n, d]` laid out `[sin | cos]`, inverse frequencies
/// `exp(-i ln(10000) / (half - 1))` (Marian's layout), starting at position `start`.
/// Computed in `kind` (float32 models get float32 arithmetic, float64 models float64).
pub fn sinusoidal(start: i64, n: i64, d: i64, device: tch::Device, kind: DType) -> Tensor {
    let kind = if kind == DType::Double { DType::Double } else { DType::Float };
    let half = d / 2;
    let i = Tensor::arange(half, (kind, device));
    let inv = (i * (-(10000f64.ln()) / (half - 1) as f64)).exp();
    let pos = Tensor::arange_start(start, start + n, (kind, device));
    let ang = pos.unsqueeze(1) * inv.unsqueeze(0);
    Tensor::cat(&[ang.sin(), ang.cos()], 1)
}

/// A block's weights with their names, in a fixed order: what parameter counts, joint
/// training and its checkpoints, and physical pruning walk ([`super::Transformer::params_mut`]).
/// Names follow TransformerLens (`blocks.L.attn.W_Q`, `mlp.W_in`, `ln1.w`) under the prefix
/// the caller gives. Each block's walker sits beside its forward: a new block kind lists its
/// own weights and nothing else changes.
pub type Params<'a> = Vec<(String, &'a mut Tensor)>;

impl Linear {
    /// `{prefix}W_{name}` and `{prefix}b_{name}`.
    pub fn params_mut<'a>(&'a mut self, prefix: &str, name: &str, out: &mut Params<'a>) {
        out.push((format!("{prefix}W_{name}"), &mut self.w));
        if let Some(b) = self.b.as_mut() {
            out.push((format!("{prefix}b_{name}"), b));
        }
    }
}

impl Norm {
    /// `{prefix}w` and `{prefix}b`.
    pub fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        out.push((format!("{prefix}w"), &mut self.weight));
        if let Some(b) = self.bias.as_mut() {
            out.push((format!("{prefix}b"), b));
        }
    }
}

impl Attention {
    /// The hook points [`Attention::forward`] visits at `(kind, layer)`, in order, through
    /// `hook_attn_out` (the rotated queries and keys only where the block has rotary).
    pub fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        use Point as P;
        if let Some(lat) = &self.latent {
            lat.points(kind, layer, out);
        }
        let rot = self.rotary.is_some();
        let og = self.out_gate.is_some();
        for p in [P::Q, P::K, P::V, P::RotQ, P::RotK, P::Scores, P::Pattern, P::OutGate, P::Z, P::Result, P::AttnOut] {
            if (rot || !matches!(p, P::RotQ | P::RotK)) && (og || p != P::OutGate) {
                out.push(At::new(kind, layer, p));
            }
        }
    }

    /// `W_Q`, `W_K`, `W_V`, `W_O` (and biases), then the q/k norms (`q_norm.w`, `k_norm.w`).
    pub fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.q.params_mut(prefix, "Q", out);
        self.k.params_mut(prefix, "K", out);
        self.v.params_mut(prefix, "V", out);
        self.o.params_mut(prefix, "O", out);
        if let Some(g) = self.out_gate.as_mut() {
            g.params_mut(prefix, "G", out);
        }
        if let Some(n) = self.qk_norm.as_mut() {
            n.q.params_mut(&format!("{prefix}q_norm."), out);
            n.k.params_mut(&format!("{prefix}k_norm."), out);
        }
        if let Some(s) = self.sinks.as_mut() {
            out.push((format!("{prefix}sinks"), s));
        }
        if let Some(lat) = self.latent.as_mut() {
            lat.params_mut(prefix, out);
        }
    }
}

impl Mixer for Attention {
    fn kind(&self) -> &'static str {
        "attention"
    }
    fn width(&self) -> usize {
        Attention::width(self)
    }
    fn present(&self) -> Vec<usize> {
        Attention::present(self)
    }
    fn physical(&self, head: usize) -> Option<usize> {
        Attention::physical(self, head)
    }
    fn head_dim(&self) -> i64 {
        self.z_dim()
    }
    /// Query heads per key/value head (grouped-query attention); a thinned layer
    /// (`prune_heads`, which refuses grouped layers) keeps one per head. Latent attention
    /// caches one latent for all its heads: the layer is one group.
    fn heads_per_group(&self) -> usize {
        if self.latent.is_some() {
            return self.width().max(1);
        }
        match &self.slots {
            Some(_) => 1,
            None => (self.n_heads / self.n_kv_heads.max(1)).max(1) as usize,
        }
    }
    /// Attention keeps a key and a value per head (`2 d_head`); latent attention the latent.
    fn numbers_per_entry(&self) -> i64 {
        match &self.latent {
            Some(l) => l.numbers_per_entry(),
            None => 2 * self.head_dim,
        }
    }
    fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
        Attention::keep_heads(self, keep)
    }
    fn forward(
        &self,
        x: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<Tensor, ModelError> {
        Attention::forward(self, x, x, bias, gate, kind, layer, h)
    }
    fn gated(&self, z: &Tensor, gate: &LayerGate, _: Inside) -> Tensor {
        Attention::gated(self, z, gate)
    }
    fn output_from_z(
        &self,
        z: &Tensor,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<Tensor, ModelError> {
        Attention::output_from_z(self, z, kind, layer, h)
    }
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        Attention::points(self, kind, layer, out)
    }
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        Attention::params_mut(self, prefix, out)
    }
    /// After `prune_heads`, the original numbers of the heads left (to pick gate columns).
    fn buffers_mut<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
        if let Some(s) = self.slots.as_mut() {
            out.push(&mut s.index_t);
        }
    }
    fn hands_tiles(&self) -> bool {
        true
    }
    /// Rotary (not a length-dependent scaling) or no positions, and no Llama 4 temperature
    /// (a factor of the absolute position).
    fn relative_positions(&self) -> bool {
        self.temperature.is_none() && self.rotary.as_ref().is_none_or(Rotary::relative)
    }
    fn step(
        &self,
        x: &Tensor,
        carry: &Carry,
        bias: StepBias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<(Tensor, Carry), ModelError> {
        let t = x.size()[1];
        let past = match carry {
            Carry::Keys(kv) if self.n_heads > 0 => Some(kv),
            _ => None,
        };
        let p_len = past.map_or(0, |p| p.k.size()[2]);
        let fresh = self.keys_values(x, p_len, kind, layer, h)?;
        let kv = match past {
            Some(p) => KeysValues { k: Tensor::f_cat(&[&p.k, &fresh.k], 2)?, v: Tensor::f_cat(&[&p.v, &fresh.v], 2)? },
            None => fresh,
        };
        let o = self.attend(x, &kv, &Bias::Dense(bias(p_len, t)), gate, p_len, kind, layer, h)?;
        Ok((o, if self.n_heads > 0 { Carry::Keys(kv) } else { Carry::Empty }))
    }
    fn as_attention(&self) -> Option<&Attention> {
        Some(self)
    }
}

impl Ffn {
    /// A dense MLP reads each position alone.
    pub fn position_wise(&self) -> bool {
        true
    }

    /// The hook points [`Ffn::forward_hooked`] visits, in order.
    pub fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        out.push(At::new(kind, layer, Point::MlpPre));
        if self.gate.is_some() {
            out.push(At::new(kind, layer, Point::MlpPreLinear));
        }
        out.extend([Point::MlpPost, Point::MlpOut].map(|p| At::new(kind, layer, p)));
    }

    /// `W_in`, `W_out`, then the gate's `W_gate` (and biases).
    pub fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.up.params_mut(prefix, "in", out);
        self.down.params_mut(prefix, "out", out);
        if let Some(g) = self.gate.as_mut() {
            g.params_mut(prefix, "gate", out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn lin(w: &[f32], out: i64, inp: i64) -> Linear {
        Linear { w: Tensor::from_slice(w).view([out, inp]), b: None }
    }

    #[test]
    fn gates_scale_only_their_head() {
        // Two heads of dim 1, identity projections: context of head h is its own value.
        let eye = [1.0f32, 0.0, 0.0, 1.0];
        let a = Attention::new(lin(&eye, 2, 2), lin(&eye, 2, 2), lin(&eye, 2, 2), lin(&eye, 2, 2), 2, 2, 1);
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([1, 2, 2]);
        let bias = Bias::Dense(Tensor::zeros([1, 1, 1, 2], (DType::Float, Device::Cpu)));
        let mut none = None;
        let full = a.forward(&x, &x, &bias, None, Kind::Enc, 0, &mut none).unwrap();
        let ones = Tensor::ones([1, 2], (DType::Float, Device::Cpu));
        let same = a
            .forward(
                &x,
                &x,
                &bias,
                Some(&LayerGate { g: ones, fill: None, duo: None, bypass: None, heads: true, experts: None }),
                Kind::Enc,
                0,
                &mut none,
            )
            .unwrap();
        assert!(full.equal(&same), "all-one gates must give exactly the ungated output");
        let g = Tensor::from_slice(&[1.0f32, 0.0]).view([1, 2]);
        let masked = a
            .forward(
                &x,
                &x,
                &bias,
                Some(&LayerGate {
                    g: g.shallow_clone(),
                    fill: None,
                    duo: None,
                    bypass: None,
                    heads: true,
                    experts: None,
                }),
                Kind::Enc,
                0,
                &mut none,
            )
            .unwrap();
        // Output dim 0 comes from head 0 only (unchanged); dim 1 from head 1 (zeroed).
        assert!(masked.select(2, 0).equal(&full.select(2, 0)));
        assert_eq!(masked.select(2, 1).abs().sum(DType::Float).double_value(&[]), 0.0);
        // Under mean ablation a closed head carries its fill: head 1's context becomes 7.
        let fill = Tensor::from_slice(&[5.0f32, 7.0]).view([2, 1]);
        let mean = a
            .forward(
                &x,
                &x,
                &bias,
                Some(&LayerGate { g, fill: Some(fill), duo: None, bypass: None, heads: true, experts: None }),
                Kind::Enc,
                0,
                &mut none,
            )
            .unwrap();
        assert!(mean.select(2, 0).equal(&full.select(2, 0)), "an open head ignores its fill");
        assert_eq!(Vec::<f32>::try_from(&mean.select(2, 1).flatten(0, -1)).unwrap(), vec![7.0, 7.0]);
    }

    #[test]
    fn sinusoidal_layout_is_sin_then_cos() {
        let p = sinusoidal(0, 3, 4, Device::Cpu, DType::Float);
        assert_eq!(p.size(), [3, 4]);
        // position 0: sin = 0, cos = 1
        assert_eq!(Vec::<f32>::try_from(p.get(0)).unwrap(), vec![0.0, 0.0, 1.0, 1.0]);
        // position 1, i = 1 of half = 2: inv = exp(-ln 10000) = 1e-4
        let v = p.double_value(&[1, 1]);
        assert!((v - (1e-4f64).sin()).abs() < 1e-7, "{v}");
    }

    #[test]
    fn rotary_rotates_adjacent_pairs_by_position() {
        let r = Rotary::plain(10000.0, 4, false);
        // One head, two positions, dh = 4: pairs (0,1) at freq 1, (2,3) at freq 1e-2.
        let x = Tensor::from_slice(&[1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]).view([1, 1, 2, 4]);
        let y = r.apply(&x);
        let got = Vec::<f32>::try_from(y.reshape([-1])).unwrap();
        let want = [1.0, 0.0, 1.0, 0.0, 1f32.cos(), 1f32.sin(), 0.01f32.cos(), 0.01f32.sin()];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?}");
        }
    }

    #[test]
    fn rotate_half_equals_adjacent_pairs_on_permuted_dimensions() {
        // HF's pairs (i, i + dim/2) are llama.cpp's (2i, 2i + 1) after the converter's permutation.
        let x = Tensor::randn([1, 2, 3, 6], (DType::Double, Device::Cpu));
        let perm = Tensor::from_slice(&[0i64, 3, 1, 4, 2, 5]);
        let half = Rotary::plain(100.0, 6, true).apply_from(&x, 2);
        let adj = Rotary::plain(100.0, 6, false).apply_from(&x.index_select(3, &perm), 2);
        assert!(half.index_select(3, &perm).allclose(&adj, 1e-12, 1e-12, false));
    }

    #[test]
    fn rms_norm_matches_hand_computation() {
        let n = Norm { kind: NormKind::Rms, weight: Tensor::from_slice(&[1.0f32, 2.0]), bias: None, eps: 0.0 };
        let y = n.forward(&Tensor::from_slice(&[3.0f32, 4.0]).view([1, 2]));
        let rms = (12.5f64).sqrt();
        assert!((y.double_value(&[0, 0]) - 3.0 / rms).abs() < 1e-6);
        assert!((y.double_value(&[0, 1]) - 8.0 / rms).abs() < 1e-6);
    }
}
