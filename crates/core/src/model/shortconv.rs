//! LFM2's gated short convolution (transformers' `Lfm2ShortConv`) as a token mixer without
//! heads ([`super::mixer`]; docs/methods.md#mixers): the input projection splits into two gates
//! and an input, `B, C, x = in_proj(x)`; a depthwise causal convolution of `K` taps
//! (`conv_L_cache`) runs over `B * x`, and the output is `out_proj(C * conv(B * x))`. It mixes
//! each channel over the last `K` positions only, so it continues from the last `K - 1` inputs
//! of its convolution ([`Carry::State`] `[B, D, K - 1]`), a state that does not grow with the
//! context. It visits the `conv.` hook points and has no `hook_z` (gates, grids and
//! `prune_heads` have nothing to address in it).

use super::hooks::{self, At, GradRules, HookSlot, Point};
use super::mixer::{Carry, Inside, Mixer, StepBias};
use super::nn::{divide_gradient, LayerGate, Linear, Params};
use super::{Kind, ModelError};
use std::any::Any;
use tch::Tensor;

/// `B, C, x = in_proj(x)`; `y = C * conv(B * x)`; `out_proj(y)`.
pub struct ShortConv {
    /// `[3 D, D]`: the rows of `B`, then `C`, then `x`.
    pub in_proj: Linear,
    /// The depthwise convolution's taps `[D, 1, K]` (the last tap reads the current position).
    pub conv: Tensor,
    pub conv_bias: Option<Tensor>,
    pub out_proj: Linear,
}

impl ShortConv {
    /// The taps per channel (`K`).
    pub fn taps(&self) -> i64 {
        self.conv.size()[2]
    }

    fn width(&self) -> i64 {
        self.conv.size()[0]
    }

    /// The mixer over `x [B, T, D]` after the convolution inputs `state [B, D, K - 1]` of the
    /// positions before it: the output `[B, T, D]` (at `hook_attn_out`) and the state after the
    /// last position.
    fn scan(
        &self,
        x: &Tensor,
        state: &Tensor,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let at = |p| At::new(kind, layer, p);
        let bcx = self.in_proj.forward(x).f_chunk(3, -1)?;
        let [b, c, xx] = <[Tensor; 3]>::try_from(bcx).map_err(|_| {
            ModelError::Invalid(format!("{kind} layer {layer}: the conv input projection is not 3 x D"))
        })?;
        let b = hooks::at(h, at(Point::ConvB), b)?;
        let c = hooks::at(h, at(Point::ConvC), c)?;
        let xx = hooks::at(h, at(Point::ConvX), xx)?;
        // AttnLRP's uniform rule for the two products (each factor takes half the relevance,
        // as a gated MLP's product: docs/methods.md#attnlrp).
        let lrp = hooks::rules(h) == GradRules::AttnLrp;
        let product = |a: &Tensor, b: &Tensor| -> Result<Tensor, ModelError> {
            let p = a.f_mul(b)?;
            Ok(if lrp { divide_gradient(&p, 2.0) } else { p })
        };
        let bx = hooks::at(h, at(Point::ConvBx), product(&b, &xx)?)?;
        // [B, D, K - 1 + T]: the carried inputs, then this call's; a convolution without padding
        // gives one output per position of this call.
        let k = self.taps();
        let full = Tensor::f_cat(&[state, &bx.f_transpose(1, 2)?], 2)?;
        let conv = full.f_conv1d(&self.conv, self.conv_bias.as_ref(), [1], [0], [1], self.width())?;
        let y = hooks::at(h, at(Point::ConvY), product(&c, &conv.f_transpose(1, 2)?)?)?;
        let len = full.size()[2];
        let next = full.f_narrow(2, len - (k - 1), k - 1)?;
        let out = hooks::at(h, at(Point::AttnOut), self.out_proj.forward(&y))?;
        Ok((out, next))
    }
}

impl Mixer for ShortConv {
    fn kind(&self) -> &'static str {
        "shortconv"
    }
    /// No heads: nothing for gates, grids or `prune_heads` to address.
    fn width(&self) -> usize {
        0
    }
    fn present(&self) -> Vec<usize> {
        vec![]
    }
    fn head_dim(&self) -> i64 {
        0
    }
    /// The last `K - 1` convolution inputs of `d_model` numbers, whatever the context.
    fn numbers_per_entry(&self) -> i64 {
        self.width() * (self.taps() - 1)
    }
    fn entries(&self, _context: i64) -> i64 {
        1
    }
    fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
        if keep.is_empty() {
            Ok(())
        } else {
            Err("a short convolution has no heads to keep".into())
        }
    }
    fn gated(&self, z: &Tensor, _gate: &LayerGate, _: Inside) -> Tensor {
        z.shallow_clone()
    }
    fn output_from_z(
        &self,
        _z: &Tensor,
        kind: Kind,
        layer: usize,
        _h: &mut HookSlot,
        _: Inside,
    ) -> Result<Tensor, ModelError> {
        Err(ModelError::Invalid(format!(
            "{kind} layer {layer}'s token mixer 'shortconv' has no hook_z to resume from (docs/methods.md#mixers)"
        )))
    }
    /// Continues from the convolution inputs of the previous call (zeros at first).
    fn step(
        &self,
        x: &Tensor,
        carry: &Carry,
        _bias: StepBias,
        _gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<(Tensor, Carry), ModelError> {
        let state = match carry {
            Carry::State(s) => s.shallow_clone(),
            _ => Tensor::f_zeros([x.size()[0], self.width(), self.taps() - 1], (x.kind(), x.device()))?,
        };
        let (o, next) = self.scan(x, &state, kind, layer, h)?;
        Ok((o, Carry::State(next)))
    }
    /// `conv.hook_b`, `conv.hook_c`, `conv.hook_x`, `conv.hook_bx`, `conv.hook_y`, then
    /// `hook_attn_out`.
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        out.extend(
            [Point::ConvB, Point::ConvC, Point::ConvX, Point::ConvBx, Point::ConvY, Point::AttnOut]
                .map(|p| At::new(kind, layer, p)),
        );
    }
    /// `W_in` (B, C, x stacked), `W_conv` `[D, 1, K]` (and biases), `W_out`.
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.in_proj.params_mut(prefix, "in", out);
        out.push((format!("{prefix}W_conv"), &mut self.conv));
        if let Some(b) = self.conv_bias.as_mut() {
            out.push((format!("{prefix}b_conv"), b));
        }
        self.out_proj.params_mut(prefix, "out", out);
    }
    fn scope(&self) -> &'static str {
        "conv"
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
