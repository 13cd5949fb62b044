//! Marian's SSRU (Simpler Simple Recurrent Unit), the self-attention replacement of the
//! Firefox-Translations decoders, as a token mixer without heads ([`super::mixer`]): it
//! continues from its cell ([`Carry::State`]), visits the `ssru.` hook points, and has no
//! `hook_z` (gates, grids and `prune_heads` have nothing to address in it).

use super::hooks::{self, At, HookSlot, Point};
use super::mixer::{Carry, Inside, Mixer, StepBias};
use super::nn::{LayerGate, Linear, Params};
use super::{Kind, ModelError};
use std::any::Any;
use tch::Tensor;

/// `f = sigmoid(x Wf + bf)`, `c = f c' + (1 - f) x W`, output `relu(c)`.
pub struct Ssru {
    pub w: Linear,
    pub wf: Linear,
}

impl Ssru {
    /// The cell over `x [B, T, D]` from state `c0 [B, D]` in layer `layer_idx` of `kind`: the
    /// output `relu(c)` `[B, T, D]` and the state after the last step `[B, D]`. The
    /// projections cover every step at once, only the recurrence runs step by step;
    /// step-by-step decoding is `T = 1`. Hook points (`dec.blocks.L.`): `ssru.hook_forget` (f),
    /// `ssru.hook_candidate` (`x W`), both read by the recurrence after any change, and
    /// `ssru.hook_cell` (the states c after the recurrence: a change reaches the output and the
    /// state carried to the next call, not the later steps of the same call).
    fn scan(
        &self,
        x: &Tensor,
        c0: &Tensor,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let at = |p| At::new(kind, layer_idx, p);
        let t_len = x.size()[1];
        let f = hooks::at(h, at(Point::SsruForget), self.wf.forward(x).sigmoid())?;
        let keep = f.ones_like() - &f;
        let u = hooks::at(h, at(Point::SsruCandidate), self.w.forward(x))?;
        if t_len == 0 {
            return Ok((x.zeros_like(), c0.shallow_clone()));
        }
        let mut c = c0.shallow_clone();
        let mut cells = Vec::with_capacity(t_len as usize);
        for t in 0..t_len {
            c = f.select(1, t) * &c + keep.select(1, t) * u.select(1, t);
            cells.push(c.shallow_clone());
        }
        let cells = hooks::at(h, at(Point::SsruCell), Tensor::f_stack(&cells, 1)?)?;
        let last = cells.select(1, t_len - 1);
        Ok((cells.relu(), last))
    }
}

impl Mixer for Ssru {
    fn kind(&self) -> &'static str {
        "ssru"
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
    /// One state of `d_model` numbers, whatever the context.
    fn numbers_per_entry(&self) -> i64 {
        self.w.w.size()[0]
    }
    fn entries(&self, _context: i64) -> i64 {
        1
    }
    fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
        if keep.is_empty() {
            Ok(())
        } else {
            Err("an SSRU has no heads to keep".into())
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
            "{kind} layer {layer}'s token mixer 'ssru' has no hook_z to resume from (docs/methods.md#mixers)"
        )))
    }
    /// Continues from the cell of the previous call (a zero cell at first); the output is
    /// `hook_attn_out`, where a self-attention's would be.
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
        let cell = match carry {
            Carry::State(c) => c.shallow_clone(),
            _ => Tensor::f_zeros([x.size()[0], x.size()[2]], (x.kind(), x.device()))?,
        };
        let (o, last) = self.scan(x, &cell, kind, layer, h)?;
        let o = hooks::at(h, At::new(kind, layer, Point::AttnOut), o)?;
        Ok((o, Carry::State(last)))
    }
    /// `ssru.hook_forget`, `ssru.hook_candidate`, `ssru.hook_cell`, then `hook_attn_out`.
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        out.extend(
            [Point::SsruForget, Point::SsruCandidate, Point::SsruCell, Point::AttnOut].map(|p| At::new(kind, layer, p)),
        );
    }
    /// `W_cand` (the candidate) and `W_f` (the forget gate).
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.w.params_mut(prefix, "cand", out);
        self.wf.params_mut(prefix, "f", out);
    }
    fn scope(&self) -> &'static str {
        "ssru"
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
