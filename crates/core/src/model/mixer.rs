//! The token mixer of a stack layer: the part of a layer that moves information between
//! positions. Every kind sits behind one interface, [`Mixer`]: its forward with the hook points
//! it visits, its parameters, and its **head layout** (what a head is: the unit gates, result
//! grids, `prune_heads`, key/value accounting and patching address). Multi-head attention
//! ([`super::nn::Attention`]) is the kind the stacks load, and Marian's SSRU ([`super::ssru`])
//! the Firefox-Translations decoders' self-block; DeepSeek's latent attention is attention with
//! latent projections in front ([`super::latent`]); linear-attention and state-space heads are
//! the kinds to come.
//!
//! Adding a kind is a file that implements [`Mixer`] and its name in [`KINDS`]: the stack
//! layer, the translation decoder's self-block, the run API (`Transformer::run`, resumes at
//! `hook_z`, step-by-step decoding), gates, `prune_heads`, the derived hook-point list, the
//! parameter walkers and the key/value accounting read a layer's mixer through this trait alone
//! (`tests/models/toy_mixer.rs` adds one this way; Marian's SSRU, `super::ssru`, is a kind
//! without heads).
//!
//! A causal mixer also continues from what its previous call left ([`Mixer::step`], a
//! [`Carry`]): attention's keys and values, or a recurrence's state. Step-by-step decoding holds
//! one `Carry` per layer and never looks inside it.
//!
//! A head's contexts are `z [B, H, T, d_head]` at the mixer's `hook_z` (physical heads in
//! order); the mixer's output is `[B, T, D]` at `hook_attn_out`. What the rest of the layer
//! does with it (norms, residual sums, the MLP) belongs to the layer, not the mixer.

use super::bias::Bias;
use super::hooks::{At, HookSlot};
use super::nn::{Attention, KeysValues, LayerGate, Params};
use super::{Kind, ModelError};
use std::any::Any;
use tch::Tensor;

/// The permission to run a mixer's arithmetic: only the model module makes one, so an analysis
/// holding a [`Mixer`] reads its heads and calls the model's services ([`Mixer::ablated_rows`],
/// `Transformer::run`) but cannot compute a piece of the forward itself (the compiler refuses:
/// the field is private). A kind implemented elsewhere receives it and passes it on.
#[derive(Clone, Copy)]
pub struct Inside(pub(in crate::model) ());

/// The mixer kinds headscope knows, by the name [`Mixer::kind`] reports: a new kind adds its
/// name here (and `describe`, errors and `:help` list them from here).
pub const KINDS: &[&str] = &["attention", "ssru", "shortconv", "mamba2", "deltanet", "mamba"];

/// What a causal mixer carries from one call to the next ([`Mixer::step`]): nothing before the
/// first call, attention's keys and values of the steps so far, or a recurrence's state (the
/// SSRU's cell `[B, D]`; a state-space head's state). Only the mixer that made it reads it.
pub enum Carry {
    /// Before the first step.
    Empty,
    /// Keys and values `[B, H, P, dh]` of the `P` steps so far.
    Keys(KeysValues),
    /// A recurrent state after the last step.
    State(Tensor),
    /// Several states after the last step (Mamba-2: the convolution's last inputs and the
    /// heads' states).
    States(Vec<Tensor>),
}

impl Carry {
    /// The tensors it holds (keys and values, or states).
    pub fn tensors(&self) -> Vec<&Tensor> {
        match self {
            Carry::Empty => vec![],
            Carry::Keys(kv) => vec![&kv.k, &kv.v],
            Carry::State(s) => vec![s],
            Carry::States(s) => s.iter().collect(),
        }
    }
}

/// The additive bias over keys for `t` new queries after `past` earlier steps (the layer's
/// causal mask and relative positions): what [`Mixer::step`] asks of its layer.
pub type StepBias<'a> = &'a dyn Fn(i64, i64) -> Tensor;

/// One layer's token mixer. Heads are numbered as loaded (`0..width`); after `prune_heads` a
/// layer holds fewer (`present`), and gates and grids keep the original numbering.
pub trait Mixer: Send {
    /// The kind's name, one of [`KINDS`] (or a test's own).
    fn kind(&self) -> &'static str;

    /// Heads per layer in the original numbering (the width of gates and result grids).
    fn width(&self) -> usize;

    /// The original number of each head present, in physical order.
    fn present(&self) -> Vec<usize>;

    /// The physical position of original head `head`, if it is present.
    fn physical(&self, head: usize) -> Option<usize> {
        self.present().iter().position(|&h| h == head)
    }

    /// The width of one head's contexts at `hook_z` (`d_head`).
    fn head_dim(&self) -> i64;

    /// Heads sharing one cache group (grouped-query attention's query heads per key/value
    /// head); 1 where each head keeps its own.
    fn heads_per_group(&self) -> usize {
        1
    }

    /// The numbers one cache group keeps per entry (attention: a key and a value, `2 d_head`).
    fn numbers_per_entry(&self) -> i64 {
        2 * self.head_dim()
    }

    /// The entries one cache group holds after `context` tokens: every position for
    /// attention; a constant for a mixer whose state does not grow (a recurrent or
    /// state-space head).
    fn entries(&self, context: i64) -> i64 {
        context
    }

    /// Numbers the layer keeps beside its groups' entries whatever the context (a
    /// convolution's last inputs in front of a state-space layer's heads).
    fn fixed_numbers(&self) -> i64 {
        0
    }

    /// Removes every head but `keep` (original numbers, ascending) from the weights, computing
    /// what masking the others computes; refuses, saying why, where it cannot.
    fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String>;

    /// The mixer over `x [B, T, D]` (its queries and keys both `x`), `bias` additive over keys
    /// (a tensor `[B|1, 1|H, T, T]`, or in a pass of score tiles described: [`Bias::dense`]
    /// builds the tensor, [`Bias::rows`] a block of query rows), under one layer's gates:
    /// `[B, T, D]`, every hook point of [`Mixer::points`] seen by `h`. By default a recurrent
    /// mixer's: [`Mixer::step`] over the whole sequence from [`Carry::Empty`] (`bias` is not read:
    /// a key after the query is never in reach, and padding follows a row's real positions).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        inside: Inside,
    ) -> Result<Tensor, ModelError> {
        let _ = bias;
        Ok(self.step(x, &Carry::Empty, &|_, _| Tensor::new(), gate, kind, layer, h, inside)?.0)
    }

    /// Contexts `z [B, H, T, dh]` (physical heads) under one layer's gates: `g z`, or
    /// `g z + (1 - g) fill` (docs/methods.md#head-masking); the gates are `[G, width]` in the
    /// original numbering.
    fn gated(&self, z: &Tensor, gate: &LayerGate, inside: Inside) -> Tensor;

    /// The mixer's output from its contexts `z` (the value at `hook_z`), with the hook points
    /// after `hook_z`: where a run resumes when only the contexts change.
    fn output_from_z(
        &self,
        z: &Tensor,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        inside: Inside,
    ) -> Result<Tensor, ModelError>;

    /// The hook points [`Mixer::forward`] visits at `(kind, layer)`, in order, through
    /// `hook_attn_out`.
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>);

    /// The mixer's parameters under `prefix`, in a fixed order (TransformerLens's names).
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>);

    /// Tensors the mixer keeps beside its parameters (indices, tables): what moves with them
    /// when its layer is placed on another device (docs/methods.md#placement).
    fn buffers_mut<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
        let _ = out;
    }

    /// A causal mixer continued from `carry` (what its previous call returned, or
    /// [`Carry::Empty`]): the output over `x [B, T, D]` (the steps after those carried) and what
    /// the next call continues from, every hook point of [`Mixer::points`] seen by `h`. A mixer
    /// with scores asks `bias(past, T)` for its additive bias over the keys. Decoding step by
    /// step is `T = 1`; a teacher-forced pass is every step at once from `Empty`. A kind that
    /// cannot continue refuses, naming itself.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        x: &Tensor,
        carry: &Carry,
        bias: StepBias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        inside: Inside,
    ) -> Result<(Tensor, Carry), ModelError> {
        let _ = (x, carry, bias, gate, h, inside);
        Err(ModelError::Invalid(format!(
            "{kind} layer {layer}'s token mixer '{}' cannot continue from earlier steps (docs/methods.md#mixers)",
            self.kind()
        )))
    }

    /// The name its parameters sit under in a layer (`blocks.L.attn.W_Q`, `blocks.L.ssru.W_f`;
    /// its hook points are named in the hook table, `hooks::POINTS`).
    fn scope(&self) -> &'static str {
        "attn"
    }

    /// Whether the mixer hands its attention weights tile by tile to hooks that ask
    /// ([`super::hooks::Hooks::tile_rows`]): statistics computed without the `T x T` pattern.
    /// A mixer without scores (recurrent, state-space) hands none, and a consumer refuses it.
    fn hands_tiles(&self) -> bool {
        false
    }

    /// Whether its output reads positions only through their differences (rotary, or no
    /// positions), so that sentences packed into one row behind a segment mask compute as
    /// each alone (docs/methods.md#packing). `false` unless a kind says so.
    fn relative_positions(&self) -> bool {
        false
    }

    /// The mixer as multi-head attention, where it is one: key/value caches (generation,
    /// patching's resumed passes), streaming heads, score-based scorers and LRP's rules read
    /// attention's own parts, and refuse other kinds by name.
    fn as_attention(&self) -> Option<&Attention> {
        None
    }

    /// The mixer as its own type, for an analysis that knows that kind's parts (LRP's SSRU
    /// rule reads the SSRU's weights); `None` where a kind offers none.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}

impl dyn Mixer + '_ {
    /// `z [B, H, T, dh]` (this mixer's `hook_z` in a run) with each of `heads` (original
    /// numbers) ablated in turn, stacked `[n * B, H, T, dh]`: row `j * B + b` is row `b` with
    /// head `heads[j]` set to `fill` (`None`: zero; `[width, dh]`: a mean; `[B, width, T, dh]`:
    /// row `b`'s resample), by the arithmetic of [`Mixer::gated`]. Where a sweep resumes
    /// (`Start::Z`): the floats of a gated forward closing that head.
    pub fn ablated_rows(&self, z: &Tensor, heads: &[usize], fill: Option<Tensor>) -> Result<Tensor, ModelError> {
        let (bsz, width, n) = (z.size()[0], self.width(), heads.len());
        let mut g = vec![1f32; n * bsz as usize * width];
        for (j, &head) in heads.iter().enumerate() {
            if head >= width || self.physical(head).is_none() {
                return Err(ModelError::Invalid(format!("head {head} is not in this layer (width {width})")));
            }
            for b in 0..bsz as usize {
                g[(j * bsz as usize + b) * width + head] = 0.0;
            }
        }
        let g = Tensor::f_from_slice(&g)?.f_view([n as i64 * bsz, width as i64])?.f_to_device(z.device())?;
        let lg = LayerGate { g, fill, duo: None, bypass: None, heads: true, experts: None };
        Ok(self.gated(&z.f_repeat([n as i64, 1, 1, 1])?, &lg, Inside(())))
    }

    /// The physical heads present (after `prune_heads`, fewer than [`Mixer::width`]).
    pub fn n_present(&self) -> usize {
        self.present().len()
    }

    /// The mixer as attention, or an error naming the layer, the kind and what needed it.
    pub fn attention_for(&self, what: &str, kind: Kind, layer: usize) -> Result<&Attention, ModelError> {
        self.as_attention().ok_or_else(|| {
            ModelError::Invalid(format!(
                "{what} needs attention, and {kind} layer {layer}'s token mixer is '{}' (docs/methods.md#mixers)",
                self.kind()
            ))
        })
    }
}
