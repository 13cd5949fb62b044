//! The gated DeltaNet layer (Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464; transformers'
//! `Qwen3NextGatedDeltaNet`) as a token mixer with heads ([`super::mixer`];
//! docs/methods.md#mixers). The input projections give, per key head, queries and keys
//! (`dk` each) and its value heads' values and gates (`dv` each), and per value head a write
//! strength `beta = sigmoid(b)` and a log decay `g = -exp(A_log) softplus(a + dt_bias)`; a
//! depthwise causal convolution of `K` taps and a SiLU run over `q k v`; queries and keys are
//! L2-normalised and the queries scaled by `dk^-1/2`. Value head `h` reads key head
//! `h / (H / Hk)`. Its state `S [dk, dv]` follows the gated delta rule
//!
//! `S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`,  `y_t = S_t^T q_t`,
//!
//! which over a whole sequence is `y = alpha v` with the **effective attention** (the WY form
//! of Yang et al. 2024, arXiv:2406.06484, as one chunk):
//!
//! `alpha = (Q K^T o Gamma) (I + L)^-1 diag(beta)`, `L = tril(diag(beta) (K K^T o Gamma), -1)`,
//! `Gamma_{t,s} = exp(sum_{r=s+1..t} g_r)` for `s <= t` (0 above the diagonal),
//!
//! the matrix this mixer computes and hands to `delta.hook_alpha` (read and written: the output
//! is computed from what the hooks leave there); `attn.hook_pattern` shows each row of `|alpha|`
//! divided by its sum (read only), as for Mamba-2. The output is
//! `out_proj(rmsnorm(y) w silu(z))` with the norm over each head's `dv` channels; a head's slice
//! of that tensor is its `hook_z` (gates, ablation, patching).
//!
//! Continues from the convolution's last `K - 1` inputs and each head's state
//! ([`Carry::States`]): a state that does not grow with the context.

use super::hooks::{self, At, GradRules, HookSlot, Point};
use super::mamba2::{compute_kind, segment_sum};
use super::mixer::{Carry, Inside, Mixer, StepBias};
use super::nn::{divide_gradient, gate_contexts, heads_output, identity_rule, LayerGate, Linear, Params};
use super::{Kind, ModelError};
use std::any::Any;
use tch::{Kind as DType, Tensor};

/// The shapes of one gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Value heads `H` (the heads of gates and grids).
    pub heads: i64,
    /// Key heads `Hk` (value heads `h * Hk / H` share one's queries and keys).
    pub key_heads: i64,
    /// Query/key width per key head `dk`.
    pub key_dim: i64,
    /// Value width per head `dv`.
    pub head_dim: i64,
}

impl Shape {
    /// The convolution's channels `2 Hk dk + H dv`.
    pub fn conv_channels(&self) -> i64 {
        2 * self.key_heads * self.key_dim + self.heads * self.head_dim
    }

    /// Checks the divisibility the layer relies on.
    pub fn check(&self) -> Result<(), String> {
        let Shape { heads, key_heads, key_dim, head_dim } = *self;
        if heads < 1 || key_heads < 1 || key_dim < 1 || head_dim < 1 {
            return Err(format!(
                "linear value heads {heads}, key heads {key_heads}, key dim {key_dim}, value dim {head_dim} must all be positive"
            ));
        }
        if heads % key_heads != 0 {
            return Err(format!("{heads} linear value heads do not fall into {key_heads} key heads"));
        }
        Ok(())
    }
}

/// One gated DeltaNet layer's weights (HF's layout: the projections' rows grouped by key head).
pub struct DeltaNet {
    pub shape: Shape,
    /// `[Hk (2 dk + 2 r dv), D]` (`r = H / Hk`): per key head its query, key, its value heads'
    /// values, then their gates.
    pub in_qkvz: Linear,
    /// `[Hk 2 r, D]`: per key head its value heads' `b`, then their `a`.
    pub in_ba: Linear,
    /// The depthwise convolution's taps `[2 Hk dk + H dv, 1, K]` over `q k v` (no bias).
    pub conv: Tensor,
    /// `[H]` each: the decay's bias and `A = -exp(A_log)`.
    pub dt_bias: Tensor,
    pub a_log: Tensor,
    /// The gated norm's weight `[dv]` (shared by the heads) and epsilon.
    pub norm: Tensor,
    pub eps: f64,
    /// `[D, H dv]`.
    pub out_proj: Linear,
}

/// `x / sqrt(sum x^2 + 1e-6)` over the last axis (transformers' `l2norm`).
fn l2norm(x: &Tensor) -> Result<Tensor, ModelError> {
    let s = x.f_pow_tensor_scalar(2)?.f_sum_dim_intlist([-1i64].as_slice(), true, None::<DType>)?;
    Ok(x.f_mul(&s.f_add_scalar(1e-6)?.f_rsqrt()?)?)
}

impl DeltaNet {
    fn taps(&self) -> i64 {
        self.conv.size()[2]
    }

    /// The mixer over `x [B, T, D]` after the convolution inputs `conv_state [B, C, K - 1]`
    /// and the heads' states `state [B, H, dk, dv]` (`None`: zero): the output `[B, T, D]` and
    /// the two states after the last position.
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &self,
        x: &Tensor,
        conv_state: &Tensor,
        state: Option<&Tensor>,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Tensor, Tensor), ModelError> {
        let at = |p| At::new(kind, layer, p);
        let Shape { heads: nh, key_heads: nk, key_dim: dk, head_dim: dv } = self.shape;
        let r = nh / nk;
        let (bsz, t) = (x.size()[0], x.size()[1]);
        let cd = self.shape.conv_channels();
        let ck = compute_kind(x.kind());
        // AttnLRP (docs/methods.md#attnlrp): the identity rule on the SiLUs, alpha (from q, k,
        // beta and g) held fixed as for Mamba-2, the uniform rule on the gate's product, the
        // norm's scale held fixed.
        let lrp = hooks::rules(h) == GradRules::AttnLrp;
        let silu = |v: &Tensor| -> Result<Tensor, ModelError> {
            let f = v.f_silu()?;
            Ok(if lrp { identity_rule(&f, v) } else { f })
        };
        // Per key head [q dk | k dk | values r dv | gates r dv]; per key head [b r | a r].
        let qkvz = self.in_qkvz.forward(x).f_view([bsz, t, nk, 2 * dk + 2 * r * dv])?;
        let part = |from: i64, n: i64, width: i64| -> Result<Tensor, ModelError> {
            Ok(qkvz.f_narrow(-1, from, n)?.f_reshape([bsz, t, width])?)
        };
        let mixed =
            Tensor::f_cat(&[part(0, dk, nk * dk)?, part(dk, dk, nk * dk)?, part(2 * dk, r * dv, nh * dv)?], -1)?;
        let z = qkvz.f_narrow(-1, 2 * dk + r * dv, r * dv)?.f_reshape([bsz, t, nh, dv])?.f_transpose(1, 2)?;
        let z = hooks::at(h, at(Point::DeltaGate), z)?;
        let ba = self.in_ba.forward(x).f_view([bsz, t, nk, 2 * r])?;
        let b = ba.f_narrow(-1, 0, r)?.f_reshape([bsz, t, nh])?;
        let a = ba.f_narrow(-1, r, r)?.f_reshape([bsz, t, nh])?;
        // [B, C, K - 1 + T]: the carried inputs, then this call's.
        let k_taps = self.taps();
        let full = Tensor::f_cat(&[conv_state, &mixed.f_transpose(1, 2)?], 2)?;
        let conv = silu(&full.f_conv1d(&self.conv, None::<&Tensor>, [1], [0], [1], cd)?)?.f_transpose(1, 2)?;
        let conv_next = full.f_narrow(2, full.size()[2] - (k_taps - 1), k_taps - 1)?;
        let heads_of = |from: i64, n: i64, w: i64| -> Result<Tensor, ModelError> {
            Ok(conv.f_narrow(-1, from, n * w)?.f_view([bsz, t, n, w])?.f_transpose(1, 2)?.f_to_kind(ck)?)
        };
        // The L2 norms as the rule reads them (held fixed under AttnLRP, as alpha is).
        let q = hooks::at(h, at(Point::DeltaQ), l2norm(&heads_of(0, nk, dk)?)?)?;
        let k = hooks::at(h, at(Point::DeltaK), l2norm(&heads_of(nk * dk, nk, dk)?)?)?;
        let v = hooks::at(h, at(Point::DeltaV), heads_of(2 * nk * dk, nh, dv)?)?;
        let beta = hooks::at(h, at(Point::DeltaBeta), b.f_sigmoid()?)?.f_to_kind(ck)?.f_transpose(1, 2)?; // [B, H, T]
                                                                                                          // In float32 at least (transformers' `.float()`: A might be -inf in float16).
        let a_pos = self.a_log.f_to_kind(ck)?.f_exp()?;
        let g = a.f_to_kind(ck)?.f_add(&self.dt_bias.f_to_kind(ck)?)?.f_softplus()?.f_mul(&a_pos)?.f_neg()?;
        let g = hooks::at(h, at(Point::DeltaG), g)?.f_to_kind(ck)?.f_transpose(1, 2)?; // [B, H, T]
                                                                                       // Each value head reads its key head's queries and keys.
        let qh = q.f_repeat_interleave_self_int(r, Some(1), Some(nh))?.f_mul_scalar((dk as f64).powf(-0.5))?;
        let kh = k.f_repeat_interleave_self_int(r, Some(1), Some(nh))?;
        let decay = segment_sum(&g)?.f_exp()?; // [B, H, T, T], 0 above the diagonal
        let kk = kh.f_matmul(&kh.f_transpose(2, 3)?)?.f_mul(&decay)?.f_mul(&beta.f_unsqueeze(-1)?)?.f_tril(-1)?;
        let eye = Tensor::f_eye(t, (ck, x.device()))?;
        // W = (I + L)^-1 diag(beta), by a unit lower-triangular solve.
        let w = kk.f_add(&eye)?.f_linalg_solve_triangular(&beta.f_diag_embed(0, -2, -1)?, false, true, true)?;
        let p = qh.f_matmul(&kh.f_transpose(2, 3)?)?.f_mul(&decay)?;
        let alpha = p.f_matmul(&w)?;
        let alpha = hooks::at(h, at(Point::DeltaAlpha), alpha)?;
        if hooks::wants(h, at(Point::Pattern)) {
            let mag = alpha.f_abs()?;
            let sum = mag.f_sum_dim_intlist([-1i64].as_slice(), true, None::<DType>)?;
            let shown = mag.f_div(&sum.f_clamp_min(f64::MIN_POSITIVE)?)?;
            if hooks::replaced(h, at(Point::Pattern), &shown)?.is_some() {
                return Err(ModelError::Invalid(format!(
                    "{kind} layer {layer} is a gated DeltaNet layer: its attn.hook_pattern shows |alpha| by row and is read only; write delta.hook_alpha (docs/methods.md#mixers)"
                )));
            }
        }
        let cum = g.f_cumsum(-1, None::<DType>)?; // [B, H, T]
        let eg = cum.f_exp()?.f_unsqueeze(-1)?;
        // What the carried state S_0 predicts of each value is taken out before the write:
        // v - (k exp(G)) S_0; the state's own part of the output is (q exp(G)) S_0.
        let vin = match state {
            Some(s0) => v.f_sub(&kh.f_mul(&eg)?.f_matmul(&s0.f_to_kind(ck)?)?)?,
            None => v.shallow_clone(),
        };
        let mut y = if lrp { alpha.f_detach()? } else { alpha.shallow_clone() }.f_matmul(&vin)?; // [B, H, T, dv]
        if let Some(s0) = state {
            y = y.f_add(&qh.f_mul(&eg)?.f_matmul(&s0.f_to_kind(ck)?)?)?;
        }
        // The state after the last position: S_0 exp(G_T) + (k exp(G_T - G))^T W vin.
        let last = cum.f_narrow(-1, t - 1, 1)?; // [B, H, 1]
        let fade = last.f_sub(&cum)?.f_exp()?.f_unsqueeze(-1)?;
        let mut s_next = kh.f_mul(&fade)?.f_transpose(2, 3)?.f_matmul(&w.f_matmul(&vin)?)?; // [B, H, dk, dv]
        if let Some(s0) = state {
            s_next = s_next.f_add(&s0.f_to_kind(ck)?.f_mul(&last.f_exp()?.f_unsqueeze(-1)?)?)?;
        }
        let y = hooks::at(h, at(Point::DeltaY), y)?;
        // The gated norm per head: rmsnorm(y) w silu(z) (the norm before the gate).
        let var = y.f_pow_tensor_scalar(2)?.f_mean_dim([-1i64].as_slice(), true, None::<DType>)?;
        let var = if lrp { var.f_detach()? } else { var };
        let normed = y.f_mul(&var.f_add_scalar(self.eps)?.f_rsqrt()?)?.f_to_kind(x.kind())?.f_mul(&self.norm)?;
        let sz = silu(&z.f_to_kind(ck)?)?;
        let mut zz = if lrp {
            divide_gradient(&normed.f_to_kind(ck)?, 2.0).f_mul(&divide_gradient(&sz, 2.0))?
        } else {
            normed.f_to_kind(ck)?.f_mul(&sz)?
        }
        .f_to_kind(x.kind())?;
        if let Some(lg) = gate {
            zz = gate_contexts(&zz, lg, None, nh, dv);
        }
        let zz = hooks::at(h, at(Point::Z), zz)?;
        let out = heads_output(&zz, &self.out_proj, nh, dv, kind, layer, h)?;
        Ok((out, conv_next, s_next.f_to_kind(x.kind())?))
    }
}

impl Mixer for DeltaNet {
    fn kind(&self) -> &'static str {
        "deltanet"
    }
    fn width(&self) -> usize {
        self.shape.heads as usize
    }
    fn present(&self) -> Vec<usize> {
        (0..self.width()).collect()
    }
    fn head_dim(&self) -> i64 {
        self.shape.head_dim
    }
    /// Each head's state `[dk, dv]`, whatever the context (the convolution's inputs are
    /// [`Mixer::fixed_numbers`]).
    fn numbers_per_entry(&self) -> i64 {
        self.shape.key_dim * self.shape.head_dim
    }
    fn entries(&self, _context: i64) -> i64 {
        1
    }
    /// The convolution's last `K - 1` inputs of `2 Hk dk + H dv` channels.
    fn fixed_numbers(&self) -> i64 {
        self.shape.conv_channels() * (self.taps() - 1)
    }
    fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
        if keep.len() == self.width() {
            return Ok(());
        }
        Err(format!(
            "removing gated DeltaNet heads from the weights is not built: {} value heads share each key head's queries, keys and convolution; mask or ablate them instead",
            self.shape.heads / self.shape.key_heads
        ))
    }
    fn gated(&self, z: &Tensor, gate: &LayerGate, _: Inside) -> Tensor {
        gate_contexts(z, gate, None, self.shape.heads, self.shape.head_dim)
    }
    fn output_from_z(
        &self,
        z: &Tensor,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<Tensor, ModelError> {
        heads_output(z, &self.out_proj, self.shape.heads, self.shape.head_dim, kind, layer, h)
    }
    /// Continues from the convolution's inputs and the heads' states of the previous call
    /// (zeros at first).
    fn step(
        &self,
        x: &Tensor,
        carry: &Carry,
        _bias: StepBias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<(Tensor, Carry), ModelError> {
        if x.size()[1] == 0 {
            return Err(ModelError::Invalid(format!(
                "{kind} layer {layer}: the gated DeltaNet layer needs at least one position"
            )));
        }
        let (conv, state) = match carry {
            Carry::States(s) if s.len() == 2 => (s[0].shallow_clone(), Some(&s[1])),
            _ => (
                Tensor::f_zeros([x.size()[0], self.shape.conv_channels(), self.taps() - 1], (x.kind(), x.device()))?,
                None,
            ),
        };
        let (o, conv_next, state_next) = self.scan(x, &conv, state, gate, kind, layer, h)?;
        Ok((o, Carry::States(vec![conv_next, state_next])))
    }
    /// `delta.hook_gate`, `delta.hook_q`, `delta.hook_k`, `delta.hook_v`, `delta.hook_beta`,
    /// `delta.hook_g`, `delta.hook_alpha`, `attn.hook_pattern` (|alpha| by row),
    /// `delta.hook_y`, `hook_z`, `hook_result`, `hook_attn_out`.
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        out.extend(
            [
                Point::DeltaGate,
                Point::DeltaQ,
                Point::DeltaK,
                Point::DeltaV,
                Point::DeltaBeta,
                Point::DeltaG,
                Point::DeltaAlpha,
                Point::Pattern,
                Point::DeltaY,
                Point::Z,
                Point::Result,
                Point::AttnOut,
            ]
            .map(|p| At::new(kind, layer, p)),
        );
    }
    /// `W_in` (q k v z by key head), `W_ba`, `W_conv` `[C, 1, K]`, `b_dt`, `A_log`, `w_norm`,
    /// `W_out`.
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.in_qkvz.params_mut(prefix, "in", out);
        self.in_ba.params_mut(prefix, "ba", out);
        out.push((format!("{prefix}W_conv"), &mut self.conv));
        out.push((format!("{prefix}b_dt"), &mut self.dt_bias));
        out.push((format!("{prefix}A_log"), &mut self.a_log));
        out.push((format!("{prefix}w_norm"), &mut self.norm));
        self.out_proj.params_mut(prefix, "out", out);
    }
    fn scope(&self) -> &'static str {
        "delta"
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
