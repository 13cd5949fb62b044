//! Mamba-2's selective state-space layer (transformers' `Mamba2Mixer`, Granite-4.0-H's
//! `GraniteMoeHybridMambaLayer`) as a token mixer with heads ([`super::mixer`];
//! docs/methods.md#mixers). The input projection gives a gate `z [I]`, the convolution's
//! channels `x B C [I + 2 G N]` and a step size per head `dt [H]`; a depthwise causal
//! convolution of `K` taps and a SiLU run over `x B C`; head `h` (`P = I / H` channels of `x`)
//! reads group `h / (H / G)` of `B` and `C` (`N` numbers each). Its state `S [P, N]` follows
//!
//! `S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T`,  `y_t = S_t C_t + D_h x_t`,
//!
//! which over a whole sequence is the state-space dual form (Dao & Gu 2024, arXiv:2405.21060):
//! `y_t = sum_{s <= t} alpha_{t,s} x_s + D_h x_t` with the **effective attention**
//!
//! `alpha_{t,s} = (C_t . B_s) exp(sum_{r=s+1..t} dt_r A_h) dt_s`,
//!
//! the matrix this mixer computes and hands to `ssm.hook_alpha` (read and written: the output
//! is computed from what the hooks leave there). `attn.hook_pattern` shows each row of
//! `|alpha|` divided by its sum (read only), so the pattern statistics, head types and the head
//! view read a state-space head as they read an attention head. The output is
//! `out_proj(norm(y * silu(z)))`, the gated RMSNorm over each of `G` groups of channels
//! (`norm_groups`; none in Falcon-H1 without `mamba_rms_norm`); a head's slice of the normed
//! tensor is its `hook_z` (gates, ablation, patching).
//!
//! Continues from the convolution's last `K - 1` inputs and each head's state
//! ([`Carry::States`]): a state that does not grow with the context.

use super::hooks::{self, At, GradRules, HookSlot, Point};
use super::mixer::{Carry, Inside, Mixer, StepBias};
use super::nn::{divide_gradient, gate_contexts, heads_output, identity_rule, LayerGate, Linear, Params};
use super::{Kind, ModelError};
use std::any::Any;
use tch::{Kind as DType, Tensor};

/// The shapes of one Mamba-2 layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Heads `H`.
    pub heads: i64,
    /// Channels per head `P`.
    pub head_dim: i64,
    /// Groups `G` of `B` and `C` (heads `h * G / H` share one).
    pub groups: i64,
    /// State numbers per group `N`.
    pub state: i64,
    /// Groups of channels the gated RMSNorm normalises over separately.
    pub norm_groups: i64,
}

impl Shape {
    /// `I = H P`.
    pub fn inner(&self) -> i64 {
        self.heads * self.head_dim
    }

    /// The convolution's channels `I + 2 G N`.
    pub fn conv_channels(&self) -> i64 {
        self.inner() + 2 * self.groups * self.state
    }

    /// Checks the divisibility the layer relies on.
    pub fn check(&self) -> Result<(), String> {
        let Shape { heads, head_dim, groups, state, norm_groups } = *self;
        if heads < 1 || head_dim < 1 || groups < 1 || state < 1 || norm_groups < 1 {
            return Err(format!(
                "mamba heads {heads}, head dim {head_dim}, groups {groups}, state {state}, norm groups {norm_groups} must all be positive"
            ));
        }
        if heads % groups != 0 {
            return Err(format!("{heads} mamba heads do not fall into {groups} groups"));
        }
        if self.inner() % norm_groups != 0 {
            return Err(format!("{} mamba channels do not fall into {norm_groups} norm groups", self.inner()));
        }
        Ok(())
    }
}

/// One Mamba-2 layer's weights.
pub struct Mamba2 {
    pub shape: Shape,
    /// `[I + (I + 2 G N) + H, D]`: the rows of `z`, then `x B C`, then `dt`.
    pub in_proj: Linear,
    /// The depthwise convolution's taps `[I + 2 G N, 1, K]` (the last reads the current
    /// position).
    pub conv: Tensor,
    pub conv_bias: Option<Tensor>,
    /// `[H]` each: the step's bias, `A = -exp(A_log)`, the skip `D`.
    pub dt_bias: Tensor,
    pub a_log: Tensor,
    pub d: Tensor,
    /// The gated RMSNorm's weight `[I]` (`None`: `y * silu(z)` unnormalised) and epsilon.
    pub norm: Option<Tensor>,
    pub eps: f64,
    /// `[D, I]`.
    pub out_proj: Linear,
    /// The step size's clamp (transformers' `time_step_limit`; `(0, inf)` by default).
    pub dt_limit: (f64, f64),
}

/// The arithmetic's float type: the model's where it is float32 or float64, else float32 (as
/// transformers computes the scan).
pub(super) fn compute_kind(k: DType) -> DType {
    if k == DType::Double {
        DType::Double
    } else {
        DType::Float
    }
}

/// `s[.., t, j] = sum_{r=j+1..t} a[.., r]` for `j <= t`, `-inf` above the diagonal, of
/// `a [.., T]`, by masked cumulative sums (transformers' `segment_sum`: no differences of large
/// sums).
pub(super) fn segment_sum(a: &Tensor) -> Result<Tensor, ModelError> {
    let t = *a.size().last().unwrap_or(&0);
    let mut shape = a.size();
    shape.push(t);
    let x = a.f_unsqueeze(-1)?.f_expand(&shape, false)?;
    let ones = Tensor::f_ones([t, t], (DType::Bool, a.device()))?;
    let strict = ones.f_tril(-1)?;
    let x = x.f_masked_fill(&strict.f_logical_not()?, 0.0)?;
    let s = x.f_cumsum(-2, None::<DType>)?;
    Ok(s.f_masked_fill(&ones.f_tril(0)?.f_logical_not()?, f64::NEG_INFINITY)?)
}

impl Mamba2 {
    fn taps(&self) -> i64 {
        self.conv.size()[2]
    }

    /// The mixer over `x [B, T, D]` after the convolution inputs `conv_state [B, C, K - 1]`
    /// and the heads' states `ssm [B, H, P, N]` (`None`: zero): the output `[B, T, D]` and the
    /// two states after the last position.
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &self,
        x: &Tensor,
        conv_state: &Tensor,
        ssm: Option<&Tensor>,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Tensor, Tensor), ModelError> {
        let at = |p| At::new(kind, layer, p);
        let Shape { heads: nh, head_dim: p, groups: g, state: n, norm_groups } = self.shape;
        let (bsz, t) = (x.size()[0], x.size()[1]);
        let (inner, cd) = (self.shape.inner(), self.shape.conv_channels());
        let ck = compute_kind(x.kind());
        // AttnLRP (docs/methods.md#attnlrp): the identity rule on the SiLUs, the selective
        // parameters (alpha, from B, C and dt) held fixed as MambaLRP holds them, the uniform
        // rule on the gate's product, the norm's scale held fixed.
        let lrp = hooks::rules(h) == GradRules::AttnLrp;
        let silu = |v: &Tensor| -> Result<Tensor, ModelError> {
            let f = v.f_silu()?;
            Ok(if lrp { identity_rule(&f, v) } else { f })
        };
        let proj = self.in_proj.forward(x);
        let z = hooks::at(h, at(Point::SsmGate), proj.f_narrow(-1, 0, inner)?)?;
        let xbc = proj.f_narrow(-1, inner, cd)?;
        let dt = proj.f_narrow(-1, inner + cd, nh)?;
        // [B, C, K - 1 + T]: the carried inputs, then this call's.
        let k = self.taps();
        let full = Tensor::f_cat(&[conv_state, &xbc.f_transpose(1, 2)?], 2)?;
        let conv = silu(&full.f_conv1d(&self.conv, self.conv_bias.as_ref(), [1], [0], [1], cd)?)?.f_transpose(1, 2)?;
        let conv_next = full.f_narrow(2, full.size()[2] - (k - 1), k - 1)?;
        // Per head / group, as heads are held: [B, H, T, P], [B, G, T, N].
        let xs = conv.f_narrow(-1, 0, inner)?.f_view([bsz, t, nh, p])?.f_transpose(1, 2)?;
        let bm = conv.f_narrow(-1, inner, g * n)?.f_view([bsz, t, g, n])?.f_transpose(1, 2)?;
        let cm = conv.f_narrow(-1, inner + g * n, g * n)?.f_view([bsz, t, g, n])?.f_transpose(1, 2)?;
        let xs = hooks::at(h, at(Point::SsmX), xs)?.f_to_kind(ck)?;
        let bm = hooks::at(h, at(Point::SsmB), bm)?.f_to_kind(ck)?;
        let cm = hooks::at(h, at(Point::SsmC), cm)?.f_to_kind(ck)?;
        let dt = dt.f_add(&self.dt_bias)?.f_softplus()?.f_clamp(self.dt_limit.0, self.dt_limit.1)?;
        let dt = hooks::at(h, at(Point::SsmDt), dt)?.f_to_kind(ck)?.f_transpose(1, 2)?; // [B, H, T]
        let a = self.a_log.f_to_kind(ck)?.f_exp()?.f_neg()?.f_view([1, nh, 1])?;
        let da = dt.f_mul(&a)?; // [B, H, T]
                                // Each head reads its group's B and C.
        let per = nh / g;
        let bh = bm.f_repeat_interleave_self_int(per, Some(1), Some(nh))?; // [B, H, T, N]
        let chd = cm.f_repeat_interleave_self_int(per, Some(1), Some(nh))?;
        let decay = segment_sum(&da)?.f_exp()?; // [B, H, T, T]
        let alpha = chd.f_matmul(&bh.f_transpose(2, 3)?)?.f_mul(&decay)?.f_mul(&dt.f_unsqueeze(2)?)?;
        let alpha = hooks::at(h, at(Point::SsmAlpha), alpha)?;
        if hooks::wants(h, at(Point::Pattern)) {
            let mag = alpha.f_abs()?;
            let sum = mag.f_sum_dim_intlist([-1i64].as_slice(), true, None::<DType>)?;
            let shown = mag.f_div(&sum.f_clamp_min(f64::MIN_POSITIVE)?)?;
            if hooks::replaced(h, at(Point::Pattern), &shown)?.is_some() {
                return Err(ModelError::Invalid(format!(
                    "{kind} layer {layer} is a Mamba-2 layer: its attn.hook_pattern shows |alpha| by row and is read only; write ssm.hook_alpha (docs/methods.md#mixers)"
                )));
            }
        }
        let mut y = if lrp { alpha.f_detach()? } else { alpha.shallow_clone() }.f_matmul(&xs)?; // [B, H, T, P]
        let cum = da.f_cumsum(-1, None::<DType>)?; // [B, H, T]
        if let Some(s0) = ssm {
            // The carried state's part: exp(cum_t) S_0 C_t.
            let s0 = s0.f_to_kind(ck)?;
            let from = chd.f_matmul(&s0.f_transpose(2, 3)?)?.f_mul(&cum.f_exp()?.f_unsqueeze(-1)?)?;
            y = y.f_add(&from)?;
        }
        y = y.f_add(&xs.f_mul(&self.d.f_to_kind(ck)?.f_view([1, nh, 1, 1])?)?)?;
        // The state after the last position: sum_s exp(cum_T - cum_s) dt_s x_s B_s^T (+ the
        // carried one decayed).
        let last = cum.f_narrow(-1, t - 1, 1)?; // [B, H, 1]
        let w = last.f_sub(&cum)?.f_exp()?.f_mul(&dt)?; // [B, H, T]
        let mut s_next = xs.f_mul(&w.f_unsqueeze(-1)?)?.f_transpose(2, 3)?.f_matmul(&bh)?; // [B, H, P, N]
        if let Some(s0) = ssm {
            s_next = s_next.f_add(&s0.f_to_kind(ck)?.f_mul(&last.f_exp()?.f_unsqueeze(-1)?)?)?;
        }
        let y = hooks::at(h, at(Point::SsmY), y)?;
        // The gated norm over [B, T, I].
        let yf = y.f_transpose(1, 2)?.f_reshape([bsz, t, inner])?;
        let gated = yf.f_mul(&silu(&z.f_to_kind(ck)?)?)?;
        let gated = if lrp { divide_gradient(&gated, 2.0) } else { gated };
        let normed = match &self.norm {
            Some(wt) => {
                let gg = gated.f_view([bsz, t, norm_groups, inner / norm_groups])?;
                let var = gg.f_pow_tensor_scalar(2)?.f_mean_dim([-1i64].as_slice(), true, None::<DType>)?;
                let var = if lrp { var.f_detach()? } else { var };
                let r = gg.f_mul(&var.f_add_scalar(self.eps)?.f_rsqrt()?)?.f_view([bsz, t, inner])?;
                r.f_to_kind(x.kind())?.f_mul(wt)?
            }
            None => gated.f_to_kind(x.kind())?,
        };
        let mut zz = normed.f_view([bsz, t, nh, p])?.f_transpose(1, 2)?;
        if let Some(lg) = gate {
            zz = gate_contexts(&zz, lg, None, nh, p);
        }
        let zz = hooks::at(h, at(Point::Z), zz)?;
        let out = heads_output(&zz, &self.out_proj, nh, p, kind, layer, h)?;
        Ok((out, conv_next, s_next.f_to_kind(x.kind())?))
    }
}

impl Mixer for Mamba2 {
    fn kind(&self) -> &'static str {
        "mamba2"
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
    /// Each head's state `[P, N]`, whatever the context (the convolution's inputs are
    /// [`Mixer::fixed_numbers`]).
    fn numbers_per_entry(&self) -> i64 {
        self.shape.head_dim * self.shape.state
    }
    fn entries(&self, _context: i64) -> i64 {
        1
    }
    /// The convolution's last `K - 1` inputs of `I + 2 G N` channels.
    fn fixed_numbers(&self) -> i64 {
        self.shape.conv_channels() * (self.taps() - 1)
    }
    fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
        if keep.len() == self.width() {
            return Ok(());
        }
        Err(format!(
            "removing Mamba-2 heads from the weights is not built: the heads share the convolution's B and C groups and the gated norm over {} channels; mask or ablate them instead",
            self.shape.inner() / self.shape.norm_groups
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
                "{kind} layer {layer}: the Mamba-2 layer needs at least one position"
            )));
        }
        let (conv, ssm) = match carry {
            Carry::States(s) if s.len() == 2 => (s[0].shallow_clone(), Some(&s[1])),
            _ => (
                Tensor::f_zeros([x.size()[0], self.shape.conv_channels(), self.taps() - 1], (x.kind(), x.device()))?,
                None,
            ),
        };
        let (o, conv_next, ssm_next) = self.scan(x, &conv, ssm, gate, kind, layer, h)?;
        Ok((o, Carry::States(vec![conv_next, ssm_next])))
    }
    /// `ssm.hook_gate`, `ssm.hook_x`, `ssm.hook_b`, `ssm.hook_c`, `ssm.hook_dt`,
    /// `ssm.hook_alpha`, `attn.hook_pattern` (|alpha| by row), `ssm.hook_y`, `hook_z`,
    /// `hook_result`, `hook_attn_out`.
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        out.extend(
            [
                Point::SsmGate,
                Point::SsmX,
                Point::SsmB,
                Point::SsmC,
                Point::SsmDt,
                Point::SsmAlpha,
                Point::Pattern,
                Point::SsmY,
                Point::Z,
                Point::Result,
                Point::AttnOut,
            ]
            .map(|p| At::new(kind, layer, p)),
        );
    }
    /// `W_in` (z, x B C, dt stacked), `W_conv` `[C, 1, K]` (and its bias), `b_dt`, `A_log`,
    /// `D`, `w_norm`, `W_out`.
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.in_proj.params_mut(prefix, "in", out);
        out.push((format!("{prefix}W_conv"), &mut self.conv));
        if let Some(b) = self.conv_bias.as_mut() {
            out.push((format!("{prefix}b_conv"), b));
        }
        out.push((format!("{prefix}b_dt"), &mut self.dt_bias));
        out.push((format!("{prefix}A_log"), &mut self.a_log));
        out.push((format!("{prefix}D"), &mut self.d));
        if let Some(w) = self.norm.as_mut() {
            out.push((format!("{prefix}w_norm"), w));
        }
        self.out_proj.params_mut(prefix, "out", out);
    }
    fn scope(&self) -> &'static str {
        "ssm"
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
