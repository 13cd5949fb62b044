//! Mamba's selective state-space layer (Gu & Dao 2023, arXiv:2312.00752; transformers'
//! `JambaMambaMixer`, its slow path) as a token mixer whose heads are **channel groups**
//! ([`super::mixer`]; docs/methods.md#mixers). The input projection gives `x` and a gate `z`
//! (`I` channels each); a depthwise causal convolution of `K` taps and a SiLU run over `x`; the
//! selective projection gives a rank-`R` step, `B` and `C` (`N` each, shared by the channels;
//! Jamba RMS-normalises the three), the step projection `dt = softplus(W_dt dt_r + b_dt)` per
//! channel. Channel `d` keeps a state `h [N]`:
//!
//! `h_t = exp(dt_t A_d) * h_{t-1} + dt_t B_t x_t`,  `y_t = h_t . C_t + D_d x_t`,
//!
//! computed step by step as transformers does. Mamba has no heads: its `I` channels fall into
//! `G` groups of `I / G` (the model's attention heads per layer, so a hybrid's grid is as wide
//! in every layer), and a group is a unit as a head is: its slice of `y * silu(z)` is its
//! `hook_z` (gates, ablation, patching). Each channel's **effective attention** is
//! `alpha^d_{t,s} = (C_t . (exp(A_d sum_{r=s+1..t} dt_r) * B_s)) dt_s` (Ali, Zimerman & Wolf
//! 2024, arXiv:2403.01590); a group's `ssm.hook_alpha` is its channels' mean and its
//! `attn.hook_pattern` the mean of its channels' `|alpha^d|` by row, both computed only where a
//! hook asks and read only (the output is the scan's).
//!
//! Continues from the convolution's last `K - 1` inputs and each channel's state
//! ([`Carry::States`]).

use super::hooks::{self, At, GradRules, HookSlot, Point};
use super::mamba2::{compute_kind, segment_sum};
use super::mixer::{Carry, Inside, Mixer, StepBias};
use super::nn::{divide_gradient, gate_contexts, heads_output, identity_rule, LayerGate, Linear, Norm, Params};
use super::{Kind, ModelError};
use std::any::Any;
use tch::{Kind as DType, Tensor};

/// The channels the effective attention is computed for at once (its memory is
/// `B x this x T x T` numbers).
const ALPHA_CHANNELS: i64 = 16;

/// One Mamba layer's weights.
pub struct Mamba1 {
    /// Channel groups `G` (the heads of gates and grids).
    pub groups: i64,
    /// `[2 I, D]`: the rows of `x`, then `z`.
    pub in_proj: Linear,
    /// The depthwise convolution's taps `[I, 1, K]` (the last reads the current position).
    pub conv: Tensor,
    pub conv_bias: Option<Tensor>,
    /// `[R + 2 N, I]`: the step's rank-`R` input, `B`, `C`.
    pub x_proj: Linear,
    /// `[I, R]` with its bias `[I]`.
    pub dt_proj: Linear,
    /// Jamba's RMSNorms on the step's input, `B` and `C` (`None`: plain Mamba).
    pub dt_norm: Option<Norm>,
    pub b_norm: Option<Norm>,
    pub c_norm: Option<Norm>,
    /// `[I, N]`: `A = -exp(A_log)`; `[I]`: the skip `D`.
    pub a_log: Tensor,
    pub d: Tensor,
    /// `[D, I]`.
    pub out_proj: Linear,
}

impl Mamba1 {
    fn inner(&self) -> i64 {
        self.a_log.size()[0]
    }
    fn state(&self) -> i64 {
        self.a_log.size()[1]
    }
    fn rank(&self) -> i64 {
        self.dt_proj.w.size()[1]
    }
    fn taps(&self) -> i64 {
        self.conv.size()[2]
    }
    fn group_width(&self) -> i64 {
        self.inner() / self.groups
    }

    /// The mixer over `x [B, T, D]` after the convolution inputs `conv_state [B, I, K - 1]` and
    /// the channels' states `state [B, I, N]` (`None`: zero): the output and both states after
    /// the last position.
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
        let (inner, n, r, g, p) = (self.inner(), self.state(), self.rank(), self.groups, self.group_width());
        let (bsz, t) = (x.size()[0], x.size()[1]);
        let ck = compute_kind(x.kind());
        // AttnLRP (docs/methods.md#attnlrp): the identity rule on the SiLUs, the selective
        // parameters (dt, B, C) held fixed as MambaLRP holds them, the uniform rule on the
        // gate's product.
        let rules = hooks::rules(h);
        let lrp = rules == GradRules::AttnLrp;
        let silu = |v: &Tensor| -> Result<Tensor, ModelError> {
            let f = v.f_silu()?;
            Ok(if lrp { identity_rule(&f, v) } else { f })
        };
        let fixed = |v: Tensor| -> Result<Tensor, ModelError> { Ok(if lrp { v.f_detach()? } else { v }) };
        let proj = self.in_proj.forward(x);
        let z = hooks::at(h, at(Point::SsmGate), proj.f_narrow(-1, inner, inner)?)?;
        let xin = proj.f_narrow(-1, 0, inner)?;
        let k = self.taps();
        let full = Tensor::f_cat(&[conv_state, &xin.f_transpose(1, 2)?], 2)?;
        let conv = silu(&full.f_conv1d(&self.conv, self.conv_bias.as_ref(), [1], [0], [1], inner)?)?; // [B, I, T]
        let conv_next = full.f_narrow(2, full.size()[2] - (k - 1), k - 1)?;
        // The channels by group, as heads are held: [B, G, T, P].
        let xs = conv.f_view([bsz, g, p, t])?.f_transpose(2, 3)?;
        let xs = hooks::at(h, at(Point::SsmX), xs)?;
        let xc = xs.f_transpose(2, 3)?.f_reshape([bsz, inner, t])?; // [B, I, T]
        let sel = self.x_proj.forward(&xc.f_transpose(1, 2)?); // [B, T, R + 2N]
        let normed = |v: Tensor, norm: &Option<Norm>| match norm {
            Some(nm) => nm.forward_with(&v, rules),
            None => v,
        };
        let dtr = normed(sel.f_narrow(-1, 0, r)?, &self.dt_norm);
        let bm = normed(sel.f_narrow(-1, r, n)?, &self.b_norm);
        let cm = normed(sel.f_narrow(-1, r + n, n)?, &self.c_norm);
        let bm = hooks::at(h, at(Point::SsmB), bm.f_unsqueeze(1)?)?.f_squeeze_dim(1)?; // [B, T, N]
        let cm = hooks::at(h, at(Point::SsmC), cm.f_unsqueeze(1)?)?.f_squeeze_dim(1)?;
        let dt = self.dt_proj.forward(&dtr).f_softplus()?;
        let dt = hooks::at(h, at(Point::SsmDt), dt)?; // [B, T, I]
        let a = self.a_log.f_to_kind(ck)?.f_exp()?.f_neg()?; // [I, N] (transformers: at least float32)
        let dtc = fixed(dt.f_to_kind(ck)?.f_transpose(1, 2)?)?; // [B, I, T]
        let (bc, cc) = (fixed(bm.f_to_kind(ck)?)?, fixed(cm.f_to_kind(ck)?)?);
        let da = dtc.f_unsqueeze(-1)?.f_mul(&a.f_unsqueeze(1)?)?.f_exp()?; // [B, I, T, N]
        let db = dtc.f_unsqueeze(-1)?.f_mul(&bc.f_unsqueeze(1)?)?; // [B, I, T, N]
        let dbu = db.f_mul(&xc.f_to_kind(ck)?.f_unsqueeze(-1)?)?;
        let mut s = match state {
            Some(s0) => s0.f_to_kind(ck)?,
            None => Tensor::f_zeros([bsz, inner, n], (ck, x.device()))?,
        };
        let mut outs = Vec::with_capacity(t as usize);
        for i in 0..t {
            s = da.f_select(2, i)?.f_mul(&s)?.f_add(&dbu.f_select(2, i)?)?;
            outs.push(s.f_matmul(&cc.f_select(1, i)?.f_unsqueeze(-1)?)?.f_squeeze_dim(-1)?);
            // [B, I]
        }
        let y = Tensor::f_stack(&outs, -1)?
            .f_add(&xc.f_to_kind(ck)?.f_mul(&self.d.f_to_kind(ck)?.f_view([1, inner, 1])?)?)?;
        let y = y.f_view([bsz, g, p, t])?.f_transpose(2, 3)?; // [B, G, T, P]
        if hooks::wants(h, at(Point::SsmAlpha)) || hooks::wants(h, at(Point::Pattern)) {
            self.effective_attention(&dtc, &bc, &cc, &a, kind, layer, h)?;
        }
        let y = hooks::at(h, at(Point::SsmY), y)?;
        let zs = z.f_view([bsz, t, g, p])?.f_transpose(1, 2)?.f_to_kind(ck)?;
        let sz = silu(&zs)?;
        let mut zz = if lrp { divide_gradient(&y, 2.0).f_mul(&divide_gradient(&sz, 2.0))? } else { y.f_mul(&sz)? }
            .f_to_kind(x.kind())?;
        if let Some(lg) = gate {
            zz = gate_contexts(&zz, lg, None, g, p);
        }
        let zz = hooks::at(h, at(Point::Z), zz)?;
        let out = heads_output(&zz, &self.out_proj, g, p, kind, layer, h)?;
        Ok((out, conv_next, s.f_to_kind(x.kind())?))
    }

    /// Each group's mean effective attention (`ssm.hook_alpha`) and the mean of its channels'
    /// `|alpha^d|` by row (`attn.hook_pattern`), `[B, G, T, T]`, both read only; computed
    /// `ALPHA_CHANNELS` channels at a time.
    #[allow(clippy::too_many_arguments)]
    fn effective_attention(
        &self,
        dt: &Tensor,
        b: &Tensor,
        c: &Tensor,
        a: &Tensor,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
    ) -> Result<(), ModelError> {
        let at = |p| At::new(kind, layer, p);
        let (g, p, n) = (self.groups, self.group_width(), self.state());
        let (bsz, t) = (dt.size()[0], dt.size()[2]);
        let lower = Tensor::f_ones([t, t], (DType::Bool, dt.device()))?.f_tril(0)?;
        let (mut alpha, mut shown) = (Vec::new(), Vec::new());
        for grp in 0..g {
            let (mut sum, mut share) = (Tensor::f_zeros([bsz, t, t], (dt.kind(), dt.device()))?, None::<Tensor>);
            let mut c0 = 0;
            while c0 < p {
                super::check_interrupt()?;
                let m = ALPHA_CHANNELS.min(p - c0);
                let ch = grp * p + c0;
                let dtc = dt.f_narrow(1, ch, m)?; // [B, m, T]
                let seg = segment_sum(&dtc)?.f_masked_fill(&lower.f_logical_not()?, 0.0)?; // [B, m, T, T]
                let mut al = Tensor::f_zeros([bsz, m, t, t], (dt.kind(), dt.device()))?;
                for j in 0..n {
                    let cb = c.f_select(2, j)?.f_unsqueeze(-1)?.f_mul(&b.f_select(2, j)?.f_unsqueeze(1)?)?; // [B, T, T]
                    let decay = seg.f_mul(&a.f_narrow(0, ch, m)?.f_select(1, j)?.f_view([1, m, 1, 1])?)?.f_exp()?;
                    al = al.f_add(&decay.f_mul(&cb.f_unsqueeze(1)?)?)?;
                }
                let al = al.f_mul(&dtc.f_unsqueeze(2)?)?.f_masked_fill(&lower.f_logical_not()?, 0.0)?;
                sum = sum.f_add(&al.f_sum_dim_intlist([1i64].as_slice(), false, None::<DType>)?)?;
                let mag = al.f_abs()?;
                let rows = mag.f_sum_dim_intlist([-1i64].as_slice(), true, None::<DType>)?;
                let part = mag.f_div(&rows.f_clamp_min(f64::MIN_POSITIVE)?)?.f_sum_dim_intlist(
                    [1i64].as_slice(),
                    false,
                    None::<DType>,
                )?;
                share = Some(match share {
                    Some(s) => s.f_add(&part)?,
                    None => part,
                });
                c0 += m;
            }
            alpha.push(sum.f_div_scalar(p as f64)?);
            if let Some(s) = share {
                shown.push(s.f_div_scalar(p as f64)?);
            }
        }
        let alpha = Tensor::f_stack(&alpha, 1)?;
        if hooks::replaced(h, at(Point::SsmAlpha), &alpha)?.is_some() {
            return Err(ModelError::Invalid(format!(
                "{kind} layer {layer} is a Mamba layer: its ssm.hook_alpha is each channel group's mean effective attention and is read only; write ssm.hook_x, ssm.hook_dt, ssm.hook_b or ssm.hook_c (docs/methods.md#mixers)"
            )));
        }
        let shown = Tensor::f_stack(&shown, 1)?;
        if hooks::replaced(h, at(Point::Pattern), &shown)?.is_some() {
            return Err(ModelError::Invalid(format!(
                "{kind} layer {layer} is a Mamba layer: its attn.hook_pattern shows its channels' |alpha| by row and is read only (docs/methods.md#mixers)"
            )));
        }
        Ok(())
    }
}

impl Mixer for Mamba1 {
    fn kind(&self) -> &'static str {
        "mamba"
    }
    fn width(&self) -> usize {
        self.groups as usize
    }
    fn present(&self) -> Vec<usize> {
        (0..self.width()).collect()
    }
    fn head_dim(&self) -> i64 {
        self.group_width()
    }
    /// Each group's channels' states `[I / G, N]`, whatever the context.
    fn numbers_per_entry(&self) -> i64 {
        self.group_width() * self.state()
    }
    fn entries(&self, _context: i64) -> i64 {
        1
    }
    /// The convolution's last `K - 1` inputs of `I` channels.
    fn fixed_numbers(&self) -> i64 {
        self.inner() * (self.taps() - 1)
    }
    fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
        if keep.len() == self.width() {
            return Ok(());
        }
        Err("removing Mamba channel groups from the weights is not built: the channels share the selective projection's B, C and step; mask or ablate them instead".into())
    }
    fn gated(&self, z: &Tensor, gate: &LayerGate, _: Inside) -> Tensor {
        gate_contexts(z, gate, None, self.groups, self.group_width())
    }
    fn output_from_z(
        &self,
        z: &Tensor,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<Tensor, ModelError> {
        heads_output(z, &self.out_proj, self.groups, self.group_width(), kind, layer, h)
    }
    /// Continues from the convolution's inputs and the channels' states of the previous call
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
                "{kind} layer {layer}: the Mamba layer needs at least one position"
            )));
        }
        let (conv, state) = match carry {
            Carry::States(s) if s.len() == 2 => (s[0].shallow_clone(), Some(&s[1])),
            _ => (Tensor::f_zeros([x.size()[0], self.inner(), self.taps() - 1], (x.kind(), x.device()))?, None),
        };
        let (o, conv_next, state_next) = self.scan(x, &conv, state, gate, kind, layer, h)?;
        Ok((o, Carry::States(vec![conv_next, state_next])))
    }
    /// `ssm.hook_gate`, `ssm.hook_x`, `ssm.hook_b`, `ssm.hook_c`, `ssm.hook_dt`,
    /// `ssm.hook_alpha` and `attn.hook_pattern` (read only), `ssm.hook_y`, `hook_z`,
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
    /// `W_in` (x, z stacked), `W_conv` `[I, 1, K]` (and its bias), `W_x`, `W_dt`, `b_dt`,
    /// the three norms' `w`, `A_log`, `D`, `W_out`.
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.in_proj.params_mut(prefix, "in", out);
        out.push((format!("{prefix}W_conv"), &mut self.conv));
        if let Some(b) = self.conv_bias.as_mut() {
            out.push((format!("{prefix}b_conv"), b));
        }
        self.x_proj.params_mut(prefix, "x", out);
        self.dt_proj.params_mut(prefix, "dt", out);
        for (name, norm) in
            [("dt_norm.", &mut self.dt_norm), ("b_norm.", &mut self.b_norm), ("c_norm.", &mut self.c_norm)]
        {
            if let Some(nm) = norm.as_mut() {
                nm.params_mut(&format!("{prefix}{name}"), out);
            }
        }
        out.push((format!("{prefix}A_log"), &mut self.a_log));
        out.push((format!("{prefix}D"), &mut self.d));
        self.out_proj.params_mut(prefix, "out", out);
    }
    fn scope(&self) -> &'static str {
        "ssm"
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
