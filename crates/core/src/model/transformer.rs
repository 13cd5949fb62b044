//! The one Transformer: embeddings, an encoder stack, a decoder stack (SSRU or attention
//! self-block, optional cross-attention) and an output projection. Checkpoint families
//! (`families/`) build it from their files.

use super::bias::Bias;
use super::experts::ExpertGate;
use super::hooks::{self, At, GradRules, HookSlot, Point};
use super::mixer::{Carry, Inside, Mixer};
use super::mlp::Mlp;
use super::nn::{
    key_bias, sinusoidal, Attention, Ffn, Gates, KeysValues, LayerGate, Linear, Norm, NormPosition, Params,
};
use super::{check_interrupt, Kind, ModelError};
use tch::{Device, Kind as DType, Tensor};

pub enum Positions {
    /// A learned table `[max_positions, D]`.
    Learned(Tensor),
    /// Marian's `[sin | cos]` sinusoids.
    Sinusoidal,
    /// None at the input (rotary positions act inside attention).
    None,
}

pub struct Embeddings {
    pub tokens: Tensor,
    /// Multiplier of token embeddings (sqrt(d) for Marian, 1 for BERT).
    pub scale: f64,
    pub positions: Positions,
    /// BERT's token-type table; type 0 is used.
    pub token_type: Option<Tensor>,
    pub norm: Option<Norm>,
}

impl Embeddings {
    pub fn vocab(&self) -> i64 {
        self.tokens.size()[0]
    }

    /// Token ids `[B, T]` at positions `start..start+T`; `None` ids mean a zero embedding
    /// (Marian's decoder start). Hook points `KIND.hook_embed`, `KIND.hook_pos_embed`.
    pub(in crate::model) fn forward(
        &self,
        ids: Option<&Tensor>,
        batch: i64,
        start: i64,
        len: i64,
        kind: Kind,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        let tok = match ids {
            Some(ids) => self.lookup(ids)?,
            None => Tensor::zeros([batch, len, self.tokens.size()[1]], (self.tokens.kind(), self.tokens.device())),
        };
        self.finish(&tok, start, kind, h)
    }

    /// The token embeddings `[B, T, D]` of `ids` (the table's rows, before scale and positions).
    pub(in crate::model) fn lookup(&self, ids: &Tensor) -> Result<Tensor, ModelError> {
        Ok(Tensor::f_embedding(&self.tokens, ids, -1, false, false)?)
    }

    /// Token embeddings `tok [B, T, D]` at positions `start..` -> the stack's input (scale,
    /// positions, token type, norm).
    pub(in crate::model) fn finish(
        &self,
        tok: &Tensor,
        start: i64,
        kind: Kind,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        let (len, d) = (tok.size()[1], tok.size()[2]);
        let device = self.tokens.device();
        let tok = hooks::at(h, At::new(kind, 0, Point::Embed), tok.shallow_clone())?;
        let mut x = if self.scale != 1.0 { &tok * self.scale } else { tok };
        let pos = match &self.positions {
            Positions::Learned(table) => {
                let max = table.size()[0];
                if start + len > max {
                    return Err(ModelError::TooLong { tokens: start + len, max });
                }
                Some(table.narrow(0, start, len).unsqueeze(0))
            }
            Positions::Sinusoidal => Some(sinusoidal(start, len, d, device, x.kind()).to_kind(x.kind()).unsqueeze(0)),
            Positions::None => None,
        };
        if let Some(pos) = pos {
            let pos = if hooks::wants(h, At::new(kind, 0, Point::PosEmbed)) {
                hooks::at(h, At::new(kind, 0, Point::PosEmbed), pos.expand_as(&x))?
            } else {
                pos
            };
            x = x + pos;
        }
        if let Some(tt) = &self.token_type {
            x = x + tt.get(0).view([1, 1, d]);
        }
        Ok(match &self.norm {
            Some(n) => n.forward_with(&x, hooks::rules(h)),
            None => x,
        })
    }
}

/// Where a stack layer's weights live and its arithmetic runs (docs/methods.md#placement): one
/// of the model's placements (`index`; 0 is the embeddings' and the unembedding's) on `device`.
/// Several placements may share a device (a split on one CPU: the stream's moves between them
/// happen and are counted, the tensors stay where they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub index: usize,
    pub device: Device,
}

pub struct StackLayer {
    /// The token mixer (attention, or another kind: [`super::mixer`]).
    mixer: Box<dyn Mixer>,
    pub(in crate::model) attn_norm: Norm,
    /// The MLP (a dense one, or another kind: [`super::mlp`]).
    ffn: Box<dyn Mlp>,
    pub(in crate::model) ffn_norm: Norm,
    pub(in crate::model) norm_position: NormPosition,
    /// Norms of the attention's and the MLP's outputs before their residuals, in a pre-norm
    /// layer (Gemma 2/3's four norms: `ln1_post`, `ln2_post`).
    pub(in crate::model) post_norms: Option<(Norm, Norm)>,
    /// This layer's own sliding window (Gemma's alternating local layers): each query sees at
    /// most this many keys, on top of the stack's bias.
    pub(in crate::model) window: Option<i64>,
    /// Llama 4's chunked attention: each query sees only the keys of its own chunk of this
    /// many positions (`0..C`, `C..2C`, ...), on top of the stack's bias.
    pub(in crate::model) chunk: Option<i64>,
    /// Where the layer runs: placement 0 on its weights' device as built
    /// ([`Transformer::place`] moves it).
    placement: Placement,
}

impl StackLayer {
    /// A layer of the self-attention stack: its attention and MLP with their norms, placed as
    /// `norm_position` says; no post-sublayer norms and no window of its own (the `with_`
    /// methods add them).
    pub fn new(
        mixer: impl Mixer + 'static,
        attn_norm: Norm,
        ffn: impl Mlp + 'static,
        ffn_norm: Norm,
        norm_position: NormPosition,
    ) -> StackLayer {
        let placement = Placement { index: 0, device: attn_norm.weight.device() };
        StackLayer {
            mixer: Box::new(mixer),
            attn_norm,
            ffn: Box::new(ffn),
            ffn_norm,
            norm_position,
            post_norms: None,
            window: None,
            chunk: None,
            placement,
        }
    }

    /// Where the layer runs.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Moves the layer's weights (and its mixer's buffers) to `to.device` and records the
    /// placement.
    fn place(&mut self, to: Placement) -> Result<(), ModelError> {
        let mut buffers = Vec::new();
        self.mixer.buffers_mut(&mut buffers);
        for t in buffers {
            if t.device() != to.device {
                *t = t.f_to_device(to.device)?;
            }
        }
        let mut params = Vec::new();
        self.params_mut("", &mut params);
        for (_, t) in params {
            if t.device() != to.device {
                *t = t.f_to_device(to.device)?;
            }
        }
        self.placement = to;
        Ok(())
    }

    /// The layer's MLP, through its one interface.
    pub fn mlp(&self) -> &dyn Mlp {
        self.ffn.as_ref()
    }

    /// The layer's MLP, to change (`prune_experts`).
    pub fn mlp_mut(&mut self) -> &mut dyn Mlp {
        self.ffn.as_mut()
    }

    /// The layer's MLP where it is a dense one (every loaded family's).
    pub fn dense(&self) -> Option<&Ffn> {
        self.ffn.as_dense()
    }

    /// The layer's token mixer, through its one interface.
    pub fn mixer(&self) -> &dyn Mixer {
        self.mixer.as_ref()
    }

    /// The layer's token mixer, to change (`prune_heads`).
    pub fn mixer_mut(&mut self) -> &mut dyn Mixer {
        self.mixer.as_mut()
    }

    /// The layer's mixer where it is multi-head attention (every loaded family's).
    pub fn attention(&self) -> Option<&Attention> {
        self.mixer.as_attention()
    }

    /// Norms of the attention's and the MLP's outputs before their residuals (Gemma 2/3).
    pub fn with_post_norms(mut self, post_norms: Option<(Norm, Norm)>) -> StackLayer {
        self.post_norms = post_norms;
        self
    }

    /// The layer's own sliding window.
    pub fn with_window(mut self, window: Option<i64>) -> StackLayer {
        self.window = window;
        self
    }

    /// The layer's attention chunks (Llama 4's chunked attention).
    pub fn with_chunk(mut self, chunk: Option<i64>) -> StackLayer {
        self.chunk = chunk;
        self
    }

    /// The layer's attention chunk size.
    pub fn chunk(&self) -> Option<i64> {
        self.chunk
    }

    /// The norm before the mixer (pre-norm, parallel) or after its residual (post-norm).
    pub fn attn_norm(&self) -> &Norm {
        &self.attn_norm
    }

    /// The norm before the MLP (pre-norm) or after its residual (post-norm).
    pub fn ffn_norm(&self) -> &Norm {
        &self.ffn_norm
    }

    pub fn norm_position(&self) -> NormPosition {
        self.norm_position
    }

    /// Norms of the mixer's and the MLP's outputs before their residuals (Gemma 2/3).
    pub fn post_norms(&self) -> Option<(&Norm, &Norm)> {
        self.post_norms.as_ref().map(|(a, b)| (a, b))
    }

    /// The layer's own sliding window.
    pub fn window(&self) -> Option<i64> {
        self.window
    }

    /// Whether what follows the attention reads each position alone (norms, a dense MLP), so
    /// that rows at different positions may run it as one flattened batch (resumed passes,
    /// `super::resume`). A mixture of experts with capacity limits would say no.
    pub fn position_wise(&self) -> bool {
        self.ffn.position_wise()
    }
}

/// Which positions' outputs a layer computes: all, or the last alone (a stack's top layer
/// when only the last position's logits are read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queries {
    All,
    Last,
}

impl StackLayer {
    /// `kind`: how this stack's heads are reported (`Enc`, or `Dec` in a decoder-only model).
    /// Hook points: every per-layer point of `KIND.blocks.L`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::model) fn forward(
        &self,
        x: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        self.forward_cached(x, bias, gate, kind, layer_idx, h, None)
    }

    /// [`StackLayer::forward`] continuing a causal stack from the keys and values of earlier
    /// positions (`cache`, extended in place; `x` is at positions `cached..`).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::model) fn forward_cached(
        &self,
        x: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
        cache: Option<&mut Option<KeysValues>>,
    ) -> Result<Tensor, ModelError> {
        self.forward_queries(x, bias, gate, kind, layer_idx, h, cache, Queries::All, true)
    }

    /// [`StackLayer::forward_cached`] with `queries`: every position's output, or the last
    /// position's alone (its keys and values still from every position; hook points past the
    /// keys and values see the last position only). `keep`: the cache is kept (per query head,
    /// as [`StackCache`] holds it); otherwise it is left per key/value head.
    #[allow(clippy::too_many_arguments)]
    fn forward_queries(
        &self,
        x: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
        cache: Option<&mut Option<KeysValues>>,
        queries: Queries,
        keep: bool,
    ) -> Result<Tensor, ModelError> {
        let (x, a) = self.attention_queries(x, bias, gate, kind, layer_idx, h, cache, queries, keep)?;
        self.finish_hooked(&x, a, kind, layer_idx, h, gate.and_then(|g| g.experts.as_ref()))
    }

    /// The attention half of [`StackLayer::forward_queries`]: the residual stream at the
    /// query positions and the attention's output there, which [`StackLayer::finish_hooked`]
    /// takes (reading each position alone).
    #[allow(clippy::too_many_arguments)]
    fn attention_queries(
        &self,
        x: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
        cache: Option<&mut Option<KeysValues>>,
        queries: Queries,
        keep: bool,
    ) -> Result<(Tensor, Tensor), ModelError> {
        // A gate of the layer's experts alone leaves the heads ungated.
        let gate = gate.filter(|g| g.heads);
        let rules = hooks::rules(h);
        check_interrupt()?;
        let windowed;
        let bias = if self.window.is_some() || self.chunk.is_some() {
            let past =
                cache
                    .as_ref()
                    .and_then(|c| c.as_ref())
                    .map_or(0, |kv| if kv.k.dim() == 4 { kv.k.size()[2] } else { 0 });
            windowed = bias.with_layer(x.size()[1], past, self.window, self.chunk, x.kind(), x.device())?;
            &windowed
        } else {
            bias
        };
        let (x, attn_in) = self.mixer_input(x, kind, layer_idx, h, rules)?;
        let mut none = None;
        let a = match (cache, queries, self.mixer.as_attention()) {
            (None, Queries::All, _) => self.mixer.forward(&attn_in, bias, gate, kind, layer_idx, h, Inside(()))?,
            (slot, _, None) => {
                // A mixer without a key/value cache runs over every position (a resumed pass
                // from the first position, [`Transformer::caches_keys`]), the last kept for
                // `Queries::Last` (the hook points see every position); a prefix it cannot
                // read is refused.
                if slot.as_ref().is_some_and(|s| s.is_some()) {
                    return Err(ModelError::Invalid(format!(
                        "{kind} layer {layer_idx}: its token mixer '{}' keeps no key/value cache, so it cannot continue from earlier positions",
                        self.mixer.kind()
                    )));
                }
                let a = self.mixer.forward(&attn_in, bias, gate, kind, layer_idx, h, Inside(()))?;
                match queries {
                    Queries::All => a,
                    Queries::Last => a.f_narrow(1, a.size()[1] - 1, 1)?,
                }
            }
            (slot, _, Some(attn)) => {
                let slot = slot.unwrap_or(&mut none);
                let past = slot.as_ref().map_or(0, |kv| if kv.k.dim() == 4 { kv.k.size()[2] } else { 0 });
                let fresh = if keep {
                    attn.keys_values(&attn_in, past, kind, layer_idx, h)?
                } else {
                    attn.keys_values_grouped(&attn_in, past, kind, layer_idx, h)?
                };
                let kv = match slot.take() {
                    Some(p) if past > 0 => {
                        let p = if fresh.k.dim() == 4 { p.grouped(fresh.k.size()[1])? } else { p };
                        KeysValues { k: Tensor::f_cat(&[&p.k, &fresh.k], 2)?, v: Tensor::f_cat(&[&p.v, &fresh.v], 2)? }
                    }
                    _ => fresh,
                };
                let out = match queries {
                    Queries::All => attn.attend(&attn_in, &kv, bias, gate, past, kind, layer_idx, h)?,
                    Queries::Last => {
                        let t = attn_in.size()[1];
                        let bias = Bias::Dense(bias.rows(t - 1, 1, t)?);
                        attn.attend(
                            &attn_in.f_narrow(1, t - 1, 1)?,
                            &kv,
                            &bias,
                            gate,
                            past + t - 1,
                            kind,
                            layer_idx,
                            h,
                        )?
                    }
                };
                *slot = Some(kv);
                out
            }
        };
        match queries {
            Queries::All => Ok((x, a)),
            Queries::Last => Ok((x.f_narrow(1, x.size()[1] - 1, 1)?, a)),
        }
    }

    /// The layer's input at `hook_resid_pre` and the mixer's input: the input itself
    /// (post-norm), or its norm at `ln1.hook_normalized`.
    fn mixer_input(
        &self,
        x: &Tensor,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
        rules: GradRules,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let x = hooks::at(h, At::new(kind, layer_idx, Point::ResidPre), x.shallow_clone())?;
        let attn_in = match self.norm_position {
            NormPosition::Post | NormPosition::PostSublayer => x.shallow_clone(),
            NormPosition::Pre | NormPosition::Parallel => {
                hooks::at(h, At::new(kind, layer_idx, Point::Ln1), self.attn_norm.forward_with(&x, rules))?
            }
        };
        Ok((x, attn_in))
    }

    /// The layer over `x [B, T, D]` whose mixer continues from `carry`
    /// ([`Mixer::step`]: a short convolution's last inputs, a recurrence's state), with every
    /// hook point: the output and what the next call continues from.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::model) fn forward_carried(
        &self,
        x: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer_idx: usize,
        h: &mut HookSlot,
        carry: &Carry,
    ) -> Result<(Tensor, Carry), ModelError> {
        let heads = gate.filter(|g| g.heads);
        let rules = hooks::rules(h);
        check_interrupt()?;
        let (x, attn_in) = self.mixer_input(x, kind, layer_idx, h, rules)?;
        let (dtype, device) = bias.kind_device();
        let window = self.window;
        let step_bias = move |p: i64, t: i64| cached_window_bias(t, p, window, dtype, device);
        let (a, next) = self.mixer.step(&attn_in, carry, &step_bias, heads, kind, layer_idx, h, Inside(()))?;
        let out = self.finish_hooked(&x, a, kind, layer_idx, h, gate.and_then(|g| g.experts.as_ref()))?;
        Ok((out, next))
    }

    /// What the attention sublayer adds to the residual stream for its output `a`
    /// (`hook_attn_out`): `a` itself, or `a` through the norm a family puts after the
    /// attention (Gemma 2/3's `ln1_post`, OLMo-2's `ln1`; the hooks see it there); `None` in a
    /// post-norm layer (BERT, Marian), where the residual stream is normed after the sum and no
    /// sublayer adds alone. The forward adds exactly this ([`StackLayer::finish_hooked`]);
    /// path patching reads it ([`Transformer::attn_added_from_z`]).
    fn attn_added(
        &self,
        a: Tensor,
        kind: Kind,
        layer_idx: usize,
        hk: &mut HookSlot,
    ) -> Result<Option<Tensor>, ModelError> {
        let rules = hooks::rules(hk);
        let at = |p| At::new(kind, layer_idx, p);
        Ok(match (self.norm_position, &self.post_norms) {
            (NormPosition::Post, _) => None,
            (NormPosition::PostSublayer, _) => {
                Some(hooks::at(hk, at(Point::Ln1), self.attn_norm.forward_with(&a, rules))?)
            }
            (NormPosition::Pre, Some((post_attn, _))) => {
                Some(hooks::at(hk, at(Point::Ln1Post), post_attn.forward_with(&a, rules))?)
            }
            (NormPosition::Pre | NormPosition::Parallel, None) | (NormPosition::Parallel, Some(_)) => Some(a),
        })
    }

    /// The rest of the layer with its hook points (`hook_resid_mid`, the norms, the MLP's,
    /// `hook_resid_post`).
    fn finish_hooked(
        &self,
        x: &Tensor,
        a_out: Tensor,
        kind: Kind,
        layer_idx: usize,
        hk: &mut HookSlot,
        experts: Option<&ExpertGate>,
    ) -> Result<Tensor, ModelError> {
        let rules = hooks::rules(hk);
        let at = |p| At::new(kind, layer_idx, p);
        if self.norm_position == NormPosition::Parallel {
            // The MLP reads the layer's input, beside the attention: no resid_mid on the path.
            let ffn_in = hooks::at(hk, at(Point::Ln2), self.ffn_norm.forward_with(x, rules))?;
            let ffn_out = self.ffn.forward(&ffn_in, experts, kind, layer_idx, hk, Inside(()))?;
            let a = self.attn_added(a_out, kind, layer_idx, hk)?.ok_or_else(|| no_sum(layer_idx))?;
            let s1 = x + a;
            let s2 = hooks::at(hk, at(Point::ResidPost), &s1 + &ffn_out)?;
            return Ok(s2);
        }
        let added = match self.norm_position {
            NormPosition::Post => a_out, // the sum is normed below
            _ => self.attn_added(a_out, kind, layer_idx, hk)?.ok_or_else(|| no_sum(layer_idx))?,
        };
        let s1 = hooks::at(hk, at(Point::ResidMid), sum_into(added, x, hk)?)?;
        if self.norm_position == NormPosition::PostSublayer {
            let ffn_out = self.ffn.forward(&s1, experts, kind, layer_idx, hk, Inside(()))?;
            let f_n = hooks::at(hk, at(Point::Ln2), self.ffn_norm.forward_with(&ffn_out, rules))?;
            let s2 = hooks::at(hk, at(Point::ResidPost), &s1 + &f_n)?;
            return Ok(s2);
        }
        if let (NormPosition::Pre, Some((_, post_ffn))) = (self.norm_position, &self.post_norms) {
            let ffn_in = hooks::at(hk, at(Point::Ln2), self.ffn_norm.forward_with(&s1, rules))?;
            let ffn_out = self.ffn.forward(&ffn_in, experts, kind, layer_idx, hk, Inside(()))?;
            let f_n = hooks::at(hk, at(Point::Ln2Post), post_ffn.forward_with(&ffn_out, rules))?;
            let s2 = hooks::at(hk, at(Point::ResidPost), &s1 + &f_n)?;
            return Ok(s2);
        }
        let (h, ffn_in) = match self.norm_position {
            NormPosition::Post => {
                let h = hooks::at(hk, at(Point::Ln1), self.attn_norm.forward_with(&s1, rules))?;
                (h.shallow_clone(), h)
            }
            NormPosition::Pre | NormPosition::Parallel | NormPosition::PostSublayer => {
                let n = hooks::at(hk, at(Point::Ln2), self.ffn_norm.forward_with(&s1, rules))?;
                (s1, n)
            }
        };
        let ffn_out = self.ffn.forward(&ffn_in, experts, kind, layer_idx, hk, Inside(()))?;
        let s2 = hooks::at(hk, at(Point::ResidPost), sum_into(ffn_out, &h, hk)?)?;
        let y = match self.norm_position {
            NormPosition::Post => hooks::at(hk, at(Point::Ln2), self.ffn_norm.forward_with(&s2, rules))?,
            NormPosition::Pre | NormPosition::Parallel | NormPosition::PostSublayer => s2,
        };
        Ok(y)
    }
}

/// A layer whose attention should add to the residual stream and did not (a broken invariant
/// of [`StackLayer::attn_added`], reported rather than panicking).
fn no_sum(layer_idx: usize) -> ModelError {
    ModelError::Invalid(format!("layer {layer_idx}: its attention adds nothing to the residual stream"))
}

/// `fresh + x`: into `fresh` (a sublayer's output just computed) where nobody else sees it
/// ([`super::nn::unseen`]), else a new tensor. The same floats either way.
fn sum_into(mut fresh: Tensor, x: &Tensor, h: &HookSlot) -> Result<Tensor, ModelError> {
    if super::nn::unseen(h, &fresh) && !x.requires_grad() && fresh.size() == x.size() && fresh.kind() == x.kind() {
        return Ok(fresh.f_add_(x)?);
    }
    Ok(x.f_add(&fresh)?)
}

/// T5's relative position bias: one learned score per head for each bucket of the distance
/// `key - query` (exact up to half the buckets, logarithmic up to `max_distance`, one bucket
/// beyond; an encoder's buckets split between the two directions), added to the scores of every
/// layer of a stack (transformers computes it in the first layer and passes it on).
pub struct RelativeBias {
    /// `[num_buckets, heads]`.
    pub table: Tensor,
    pub bidirectional: bool,
    pub num_buckets: i64,
    pub max_distance: i64,
}

impl RelativeBias {
    /// The bias `[1, H, tq, tk]` of queries at positions `start..start + tq` over keys
    /// `0..tk`, with transformers' bucket arithmetic (the logarithm in float32).
    pub fn bias(&self, start: i64, tq: i64, tk: i64) -> Tensor {
        let device = self.table.device();
        let query = Tensor::arange_start(start, start + tq, (DType::Int64, device)).unsqueeze(1);
        let key = Tensor::arange(tk, (DType::Int64, device)).unsqueeze(0);
        let rel = key - query;
        let mut n = self.num_buckets;
        let (offset, rel) = if self.bidirectional {
            n /= 2;
            (rel.gt(0).to_kind(DType::Int64) * n, rel.abs())
        } else {
            (Tensor::zeros([1, 1], (DType::Int64, device)), -rel.clamp_max(0))
        };
        let max_exact = (n / 2).max(1);
        let large = (rel.to_kind(DType::Float) / max_exact as f64).log()
            / (self.max_distance as f64 / max_exact as f64).ln()
            * (n - max_exact) as f64;
        let large = (large.to_kind(DType::Int64) + max_exact).clamp_max(n - 1);
        let buckets = offset + rel.where_self(&rel.lt(max_exact), &large);
        let h = self.table.size()[1];
        self.table.index_select(0, &buckets.reshape([-1])).view([tq, tk, h]).permute([2, 0, 1]).unsqueeze(0)
    }
}

/// A layer of a translation model's decoder: its self-block, the cross-attention over the
/// source, and the MLP, with their norms. Built by [`DecoderLayer::new`] (and the `with_`
/// methods); its parts are read through the methods below and computed only inside the model
/// module.
pub struct DecoderLayer {
    /// The self-block: a causal token mixer (self-attention, or Marian's SSRU: [`super::mixer`]).
    pub(in crate::model) self_block: Box<dyn Mixer>,
    pub(in crate::model) self_norm: Norm,
    pub(in crate::model) cross: Option<(Attention, Norm)>,
    /// The MLP (a dense one, or another kind: [`super::mlp`]).
    pub(in crate::model) ffn: Box<dyn Mlp>,
    pub(in crate::model) ffn_norm: Norm,
    /// `Post` (BART, MarianMT: each norm after its residual) or `Pre` (M2M100, mBART: each
    /// sublayer reads its norm of the stream, `x = x + f(norm(x))`).
    pub(in crate::model) norm_position: NormPosition,
    /// A norm after this layer's output: the decoder's final norm, on its last layer
    /// (pre-norm decoders; hook point `dec.ln_final.hook_normalized`).
    pub(in crate::model) final_norm: Option<Norm>,
    /// T5's relative position bias on the self-attention's scores (the decoder's one table,
    /// shared by every layer).
    pub(in crate::model) rel_bias: Option<RelativeBias>,
}

impl DecoderLayer {
    /// A decoder layer: its self-block and norm, its cross-attention and norm (none in a
    /// decoder without a source), its MLP and norm, placed as `norm_position` says; no final
    /// norm and no relative bias (the `with_` methods add them).
    pub fn new(
        self_block: impl Mixer + 'static,
        self_norm: Norm,
        cross: Option<(Attention, Norm)>,
        ffn: impl Mlp + 'static,
        ffn_norm: Norm,
        norm_position: NormPosition,
    ) -> DecoderLayer {
        DecoderLayer {
            self_block: Box::new(self_block),
            self_norm,
            cross,
            ffn: Box::new(ffn),
            ffn_norm,
            norm_position,
            final_norm: None,
            rel_bias: None,
        }
    }

    /// The decoder's final norm, after this (its last) layer.
    pub fn with_final_norm(mut self, norm: Option<Norm>) -> DecoderLayer {
        self.final_norm = norm;
        self
    }

    /// T5's relative position bias on the self-attention's scores.
    pub fn with_rel_bias(mut self, bias: Option<RelativeBias>) -> DecoderLayer {
        self.rel_bias = bias;
        self
    }

    /// The self-block, through the mixer interface: a causal self-attention or an SSRU.
    pub fn self_block(&self) -> &dyn Mixer {
        self.self_block.as_ref()
    }

    /// The self-block where it has heads (kind `dec`): none for an SSRU.
    pub fn self_heads(&self) -> Option<&dyn Mixer> {
        (self.self_block.width() > 0).then_some(self.self_block.as_ref())
    }

    /// The self-block where it has heads, to change (`prune_heads`).
    pub fn self_heads_mut(&mut self) -> Option<&mut dyn Mixer> {
        if self.self_block.width() > 0 {
            Some(self.self_block.as_mut())
        } else {
            None
        }
    }

    /// The norm after (post-norm) or before (pre-norm) the self-block.
    pub fn self_norm(&self) -> &Norm {
        &self.self_norm
    }

    /// The cross-attention over the source and its norm.
    pub fn cross(&self) -> Option<(&Attention, &Norm)> {
        self.cross.as_ref().map(|(a, n)| (a, n))
    }

    /// The layer's MLP, through its one interface.
    pub fn mlp(&self) -> &dyn Mlp {
        self.ffn.as_ref()
    }

    /// The layer's MLP where it is a dense one (every loaded family's).
    pub fn dense(&self) -> Option<&Ffn> {
        self.ffn.as_dense()
    }

    /// The norm of the MLP's input (pre-norm) or of the layer's output (post-norm).
    pub fn ffn_norm(&self) -> &Norm {
        &self.ffn_norm
    }

    pub fn norm_position(&self) -> NormPosition {
        self.norm_position
    }

    /// The decoder's final norm, on its last layer.
    pub fn final_norm(&self) -> Option<&Norm> {
        self.final_norm.as_ref()
    }
}

/// Additive bias `[1, 1, T, P + T]` for `T` new queries after `P` cached steps: key `j` is
/// hidden from query `i` when `j > P + i`.
pub fn cached_causal_bias(t: i64, past: i64, dtype: DType, device: Device) -> Tensor {
    let hidden = Tensor::ones([t, past + t], (dtype, device)).triu(past + 1);
    hidden.view([1, 1, t, past + t]) * -1e9
}

impl DecoderLayer {
    /// The self-attention block, if the layer's self-block is one.
    pub fn self_attention(&self) -> Option<&Attention> {
        self.self_block.as_attention()
    }

    /// The layer over `x [B, T, D]`, steps `T` at once (teacher forcing; `T = 1` when decoding
    /// step by step): the self-block continues from `state` (the SSRU's cell, or the
    /// self-attention's cached keys and values); `cross` holds the keys and values of the
    /// encoder output for the cross-attention. `gates` gate both the self-attention (`dec`)
    /// and the cross-attention (`cross`) heads. Returns the output and the self-block's state
    /// after the last step.
    ///
    /// Hook points: the residual, norm and MLP points of `dec.blocks.L`, the self-attention's
    /// of `dec.blocks.L.attn` (an SSRU's of `dec.blocks.L.ssru`), the cross-attention's of
    /// `cross.blocks.L` (`hook_resid_mid` there is the stream after the cross-attention, `ln1`
    /// its norm).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::model) fn forward(
        &self,
        x: &Tensor,
        state: &Carry,
        cross: Option<&KeysValues>,
        enc_bias: &Tensor,
        gates: &Gates,
        layer_idx: usize,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Carry), ModelError> {
        let rules = hooks::rules(h);
        check_interrupt()?;
        let at = |k, p| At::new(k, layer_idx, p);
        let enc_bias = Bias::Dense(enc_bias.shallow_clone());
        let x = hooks::at(h, at(Kind::Dec, Point::ResidPre), x.shallow_clone())?;
        if self.norm_position == NormPosition::Pre {
            // x + self(norm(x)), + cross(norm(.)), + mlp(norm(.)).
            let n1 = hooks::at(h, at(Kind::Dec, Point::Ln1), self.self_norm.forward_with(&x, rules))?;
            let (o, state) = self.self_forward(&n1, state, gates, layer_idx, h)?;
            let s_a = hooks::at(h, at(Kind::Dec, Point::ResidMid), &x + &o)?;
            let a = match (&self.cross, cross) {
                (Some((attn, norm)), Some(kv)) => {
                    let n2 = hooks::at(h, at(Kind::Cross, Point::Ln1), norm.forward_with(&s_a, rules))?;
                    let g = gates.layer(Kind::Cross, layer_idx);
                    Some(attn.attend(&n2, kv, &enc_bias, g.as_ref(), 0, Kind::Cross, layer_idx, h)?)
                }
                _ => None,
            };
            return Ok((self.finish_hooked(&s_a, a.as_ref(), layer_idx, h)?, state));
        }
        let (o, state) = self.self_forward(&x, state, gates, layer_idx, h)?;
        let s_a = hooks::at(h, at(Kind::Dec, Point::ResidMid), &x + &o)?;
        let x1 = hooks::at(h, at(Kind::Dec, Point::Ln1), self.self_norm.forward_with(&s_a, rules))?;
        let a = match (&self.cross, cross) {
            (Some((attn, _)), Some(kv)) => {
                let g = gates.layer(Kind::Cross, layer_idx);
                Some(attn.attend(&x1, kv, &enc_bias, g.as_ref(), 0, Kind::Cross, layer_idx, h)?)
            }
            _ => None,
        };
        Ok((self.finish_hooked(&x1, a.as_ref(), layer_idx, h)?, state))
    }

    /// The self-block over `x [B, T, D]` from `state`: its output and the state after it. The
    /// layer owns the mask: causal over the steps so far, plus T5's relative positions.
    fn self_forward(
        &self,
        x: &Tensor,
        state: &Carry,
        gates: &Gates,
        layer_idx: usize,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Carry), ModelError> {
        let (dtype, device) = (x.kind(), x.device());
        let bias = |past: i64, t: i64| {
            let b = cached_causal_bias(t, past, dtype, device);
            match &self.rel_bias {
                Some(rb) => b + rb.bias(past, t, past + t).to_kind(dtype),
                None => b,
            }
        };
        let g = gates.layer(Kind::Dec, layer_idx);
        self.self_block.step(x, state, &bias, g.as_ref(), Kind::Dec, layer_idx, h, Inside(()))
    }

    /// The point whose value [`DecoderLayer::forward_from_cross_z`] resumes from: the stream the
    /// cross-attention's output is added to (post-norm: `dec.blocks.L.ln1.hook_normalized`,
    /// pre-norm: `dec.blocks.L.hook_resid_mid`).
    pub fn cross_resume_point(&self) -> Point {
        if self.norm_position == NormPosition::Pre {
            Point::ResidMid
        } else {
            Point::Ln1
        }
    }

    /// The layer resumed at its cross-attention's `hook_z`: `x1` is the stream the
    /// cross-attention's output is added to (at [`DecoderLayer::cross_resume_point`]), `z` its
    /// per-head contexts.
    pub(in crate::model) fn forward_from_cross_z(
        &self,
        x1: &Tensor,
        z: &Tensor,
        layer_idx: usize,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        check_interrupt()?;
        let (attn, _) = self
            .cross
            .as_ref()
            .ok_or_else(|| ModelError::Invalid(format!("decoder layer {layer_idx} has no cross-attention")))?;
        let a = attn.output_from_z(z, Kind::Cross, layer_idx, h)?;
        self.finish_hooked(x1, Some(&a), layer_idx, h)
    }

    /// The layer after its self-block and cross-attention: `x1` the self-block's normed
    /// stream, `a` the cross-attention's output.
    fn finish_hooked(
        &self,
        x1: &Tensor,
        a: Option<&Tensor>,
        layer_idx: usize,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        let rules = hooks::rules(h);
        let at = |k, p| At::new(k, layer_idx, p);
        let y = if self.norm_position == NormPosition::Pre {
            let s_b = match a {
                Some(a) if self.cross.is_some() => hooks::at(h, at(Kind::Cross, Point::ResidMid), x1 + a)?,
                _ => x1.shallow_clone(),
            };
            let n3 = hooks::at(h, at(Kind::Dec, Point::Ln2), self.ffn_norm.forward_with(&s_b, rules))?;
            let ffn_out = self.ffn.forward(&n3, None, Kind::Dec, layer_idx, h, Inside(()))?;
            hooks::at(h, at(Kind::Dec, Point::ResidPost), &s_b + &ffn_out)?
        } else {
            let x2 = match (&self.cross, a) {
                (Some((_, norm)), Some(a)) => {
                    let s_b = hooks::at(h, at(Kind::Cross, Point::ResidMid), x1 + a)?;
                    hooks::at(h, at(Kind::Cross, Point::Ln1), norm.forward_with(&s_b, rules))?
                }
                _ => x1.shallow_clone(),
            };
            let ffn_out = self.ffn.forward(&x2, None, Kind::Dec, layer_idx, h, Inside(()))?;
            let s_c = hooks::at(h, at(Kind::Dec, Point::ResidPost), &x2 + &ffn_out)?;
            hooks::at(h, at(Kind::Dec, Point::Ln2), self.ffn_norm.forward_with(&s_c, rules))?
        };
        match &self.final_norm {
            Some(n) => hooks::at(h, At::new(Kind::Dec, 0, Point::LnFinal), n.forward_with(&y, rules)),
            None => Ok(y),
        }
    }
}

/// The encoder side a decoder run reads: each decoder layer's cross-attention keys and values
/// of the encoder output (hook points `cross.blocks.L.attn.hook_k`, `hook_v`) and the source's
/// attention bias `[B, 1, 1, S]` ([`Transformer::source`]).
pub struct Source {
    pub cross: Vec<Option<KeysValues>>,
    pub enc_bias: Tensor,
}

impl Source {
    /// Every row repeated `n` times, block by block (`[r0 .. r_{B-1}, r0 ..]`): the source of a
    /// batch of `n` resumes per row.
    pub fn repeat(&self, n: i64) -> Source {
        Source {
            cross: self.cross.iter().map(|kv| kv.as_ref().map(|kv| kv.repeat(n))).collect(),
            enc_bias: self.enc_bias.repeat([n, 1, 1, 1]),
        }
    }
}

/// Recurrent state of the decoder during step-by-step decoding ([`DecStart::Step`]).
pub struct DecoderState {
    /// Each layer's self-block carry (keys and values, or a cell).
    selfs: Vec<Carry>,
    /// Steps run so far.
    pub step: i64,
}

/// Where a [`Transformer::decode`] run of a translation model's decoder starts.
pub enum DecStart<'a> {
    /// Teacher forcing: `targets [B, T]` shifted right (after the start token, or a zero
    /// embedding), every step at once (only an SSRU's recurrence goes step by step).
    Targets(&'a Tensor),
    /// One step: the token `prev [B]` (`None`: the first step, the start token) continuing
    /// `state`, which the run advances (through every layer: a step stops at `FinalNorm` or
    /// `Logits`). The cross-attention's keys and values were visited once, by the hooks given
    /// to [`Transformer::source`].
    Step { prev: Option<&'a Tensor>, state: &'a mut DecoderState },
    /// Decoder layer `layer` resumed at its cross-attention's `hook_z` (teacher forcing, every
    /// step at once): `x` the stream the cross-attention's output is added to (at
    /// [`DecoderLayer::cross_resume_point`]), `z` the per-head contexts `[B, H, T, dh]`.
    CrossZ { layer: usize, x: &'a Tensor, z: &'a Tensor },
}

/// Where a [`Transformer::run`] of the stack starts.
#[derive(Clone, Copy)]
pub enum Start<'a> {
    /// Token ids `[B, T]` with their key mask `[B, T]` (1 = real): the embeddings first.
    Tokens { ids: &'a Tensor, mask: &'a Tensor },
    /// The input of layer `layer` (`hook_resid_pre`) `[B, T, D]`, with the stack's attention
    /// bias ([`Transformer::self_bias`]; `None`: rows without padding, the bias made here only
    /// if a layer runs); `layer` may be the number of layers (the final norm alone is left).
    Layer { layer: usize, x: &'a Tensor, bias: Option<&'a Tensor> },
    /// Layer `layer` resumed at its attention's `hook_z`: `x` the layer's input, `z` the
    /// per-head contexts `[B, H, T, dh]` (rows may be ablations or patches of one pass's); the
    /// bias as for [`Start::Layer`].
    Z { layer: usize, x: &'a Tensor, z: &'a Tensor, bias: Option<&'a Tensor> },
}

/// Where a [`Transformer::run`] of the stack stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// After layer `l` (its `hook_resid_post`, or a post-norm layer's last norm). A translation
    /// decoder's last layer ends in the decoder's final norm where it has one, so there
    /// `After(last)` is `FinalNorm`.
    After(usize),
    /// The stack's output: the final norm where the model has one (`ln_final.hook_normalized`).
    FinalNorm,
    /// The logits (`hook_logits`, [`super::unembed`]).
    Logits,
}

pub struct Transformer {
    pub embed: Embeddings,
    /// The self-attention stack: an encoder's layers, or (causal) a decoder-only model's (the
    /// stack a translation model's decoder reads is its encoder).
    pub stack: Vec<StackLayer>,
    /// `Enc` for encoders, `Dec` for a causal decoder-only stack.
    pub stack_kind: Kind,
    /// Final-logit soft-capping (Gemma 2): logits `c * tanh(logits / c)`.
    pub logit_softcap: Option<f64>,
    pub causal: bool,
    /// A causal stack's sliding window (Mistral): each query sees at most this many keys.
    pub window: Option<i64>,
    /// A norm after the stack (pre-norm models).
    pub final_norm: Option<Norm>,
    pub decoder: Vec<DecoderLayer>,
    /// Output projection (tied to the embeddings where the checkpoint says so).
    pub output: Option<Linear>,
    pub d_model: i64,
    pub eos_id: i64,
    /// The decoder's own embeddings where they differ from the encoder's (BART's learned
    /// positions and `layernorm_embedding`); the token table may be shared.
    pub dec_embed: Option<Embeddings>,
    /// The token the decoder starts from (HF's `decoder_start_token_id`); `None`: a zero
    /// embedding (Marian `.bin`).
    pub dec_start: Option<i64>,
    /// Tokens greedy decoding never emits (HF's `bad_words_ids` of single tokens: MarianMT's
    /// `<pad>`).
    pub banned: Vec<i64>,
    /// The token greedy decoding emits first whatever the logits (HF's `forced_bos_token_id`:
    /// the target language of M2M100 / NLLB-200 and mBART-50; `load_model`'s `tgt_lang`, or one
    /// call's `tgt_lang` for the length of that call: `view::CallLanguage`).
    pub forced_bos: ForcedBos,
    /// T5's relative position bias on the stack's self-attention scores (in `self_bias`).
    pub rel_bias: Option<RelativeBias>,
    /// The positions the model was trained on (`max_position_embeddings`, a GGUF's
    /// `context_length`) where its positions are rotary and nothing else bounds them: longer
    /// inputs are refused unless `budget::past_positions()` (docs/methods.md#memory-budget).
    pub max_positions: Option<i64>,
}

/// The forced first token of translations, settable through a shared model: a call with its
/// own `tgt_lang` sets it for its length (`view::CallLanguage`) and the model's own comes back
/// after, whatever the call returns.
#[derive(Debug)]
pub struct ForcedBos(std::sync::atomic::AtomicI64);

impl Default for ForcedBos {
    fn default() -> ForcedBos {
        ForcedBos::new(None)
    }
}

/// No forced token (token ids are never negative).
const NO_TOKEN: i64 = -1;

impl ForcedBos {
    pub fn new(id: Option<i64>) -> ForcedBos {
        ForcedBos(std::sync::atomic::AtomicI64::new(id.filter(|&v| v >= 0).unwrap_or(NO_TOKEN)))
    }
    pub fn get(&self) -> Option<i64> {
        Some(self.0.load(std::sync::atomic::Ordering::Relaxed)).filter(|&v| v != NO_TOKEN)
    }
    pub fn set(&self, id: Option<i64>) {
        self.0.store(id.filter(|&v| v >= 0).unwrap_or(NO_TOKEN), std::sync::atomic::Ordering::Relaxed)
    }
}

impl Transformer {
    /// A decoder-only language model: the causal stack `layers` over `embed`, a final norm and
    /// the output projection `output` (no bias), inputs bounded by `max_positions` (rotary
    /// families' `max_position_embeddings`; `None` where nothing or a learned table bounds
    /// them), everything else off (the families set a
    /// window or a logit cap on the result).
    pub fn decoder_only(
        embed: Embeddings,
        layers: Vec<StackLayer>,
        final_norm: Option<Norm>,
        output: Tensor,
        eos_id: i64,
        max_positions: Option<i64>,
    ) -> Transformer {
        let d_model = embed.tokens.size()[1];
        Transformer {
            embed,
            stack: layers,
            stack_kind: Kind::Dec,
            logit_softcap: None,
            causal: true,
            window: None,
            final_norm,
            decoder: vec![],
            output: Some(Linear { w: output, b: None }),
            d_model,
            eos_id,
            dec_embed: None,
            dec_start: None,
            banned: vec![],
            forced_bos: ForcedBos::default(),
            rel_bias: None,
            max_positions,
        }
    }

    pub fn device(&self) -> Device {
        self.embed.tokens.device()
    }

    /// The placement of the embeddings, the final norm and the unembedding.
    pub fn home(&self) -> Placement {
        Placement { index: 0, device: self.device() }
    }

    /// Places each stack layer as `plan` says (one placement per layer; docs/methods.md#placement),
    /// moving its weights. Placement 0 is the model's own device; an index names one device
    /// wherever it appears. [`Transformer::run`] moves the residual stream between placements
    /// and tells the hooks of each move. For now every placement is on the model's own device
    /// (a split on one device: the run's moves are real and counted, the tensors stay): the
    /// drivers other than `run` (generation, resumed passes) and the analyses that read weights
    /// do not yet move their operands between devices, so another device is refused.
    pub fn place(&mut self, plan: &[Placement]) -> Result<(), ModelError> {
        if plan.len() != self.stack.len() {
            return Err(ModelError::Invalid(format!(
                "a placement plan of {} layers for a stack of {}",
                plan.len(),
                self.stack.len()
            )));
        }
        let home = self.home();
        if let Some((l, p)) = plan.iter().enumerate().find(|(_, p)| p.device != home.device) {
            return Err(ModelError::Invalid(format!(
                "layer {l} placed on {:?}: a split across devices is not offered yet, every placement is on the model's {:?} (docs/methods.md#placement)",
                p.device, home.device
            )));
        }
        for (layer, &p) in self.stack.iter_mut().zip(plan) {
            layer.place(p)?;
        }
        Ok(())
    }

    /// The stack over `ids [B, S]` with key mask `[B, S]` (1 = real), to its output (after the
    /// final norm where the model has one): [`Transformer::run`] from [`Start::Tokens`] to
    /// [`Stop::FinalNorm`]. `h` sees every hook point of the stack.
    pub fn encode(&self, ids: &Tensor, mask: &Tensor, gates: &Gates, mut h: HookSlot) -> Result<Tensor, ModelError> {
        self.run(Start::Tokens { ids, mask }, Stop::FinalNorm, gates, &mut h)
    }

    /// The one driver of the self-attention stack (an encoder, or a decoder-only model's
    /// layers): from `start` (tokens, a layer's input, or a layer's `hook_z`) to `stop` (after a
    /// layer, the final norm, or the logits through the one unembedding), under `gates`, every
    /// hook point on the way seen by `h`. Resuming at a layer runs exactly the arithmetic of
    /// the whole run from there: the floats equal the whole run's where the inputs do.
    pub fn run(&self, start: Start, stop: Stop, gates: &Gates, h: &mut HookSlot) -> Result<Tensor, ModelError> {
        let (from, x, bias, z, tokens) = match start {
            Start::Tokens { ids, mask } => {
                if let Some(g) = self.resolved(ids, mask, gates)? {
                    return self.run(start, stop, &g, h);
                }
                let (b, t) = (ids.size()[0], *ids.size().get(1).unwrap_or(&0));
                if let Some(max) = self.max_positions.filter(|&m| t > m && !crate::budget::past_positions()) {
                    // Packed rows hold several sentences whose rotary positions differ only
                    // within each: the longest sentence is what the limit bounds.
                    let longest = if super::nn::is_packed(mask) { super::nn::longest_segment(mask)? } else { t };
                    if longest > max {
                        return Err(ModelError::PastPositions { tokens: longest, max });
                    }
                }
                let kind = self.stack_kind;
                let wanted = (0..self.stack.len()).any(|l| {
                    hooks::wants(h, At::new(kind, l, Point::Pattern))
                        || hooks::wants(h, At::new(kind, l, Point::Scores))
                });
                let rows = hooks::tile_rows(h, At::new(kind, 0, Point::Pattern)).filter(|_| !wanted);
                let packed = super::nn::is_packed(mask);
                crate::budget::check(
                    &format!("a forward over {b} x {t} tokens"),
                    self.forward_bytes(b, t, rows, packed, gates),
                )
                .map_err(ModelError::Invalid)?;
                let x = self.embed.finish(&self.embed.lookup(ids)?, 0, self.stack_kind, h)?;
                // A pass of score tiles describes a causal bias rather than holding its T x T
                // values (docs/methods.md#score-tiles); each tile builds its rows.
                let bias = match rows {
                    Some(_) if self.describes_bias(packed) => {
                        Bias::described(key_bias(mask, x.kind()), mask.size()[1], self.causal, self.window)
                    }
                    _ => Bias::Dense(self.self_bias(mask, x.kind())),
                };
                (0, x, Some(bias), None, true)
            }
            Start::Layer { layer, x, bias } => {
                Self::no_source(gates, "resuming the stack at a layer")?;
                if layer > self.stack.len() {
                    return Err(ModelError::Invalid(format!(
                        "layer {layer} out of range: the stack has {} layers",
                        self.stack.len()
                    )));
                }
                (layer, x.shallow_clone(), bias.map(|b| Bias::Dense(b.shallow_clone())), None, false)
            }
            Start::Z { layer, x, z, bias } => {
                Self::no_source(gates, "resuming the stack at a layer")?;
                self.stack_layer(layer)?;
                (layer, x.shallow_clone(), bias.map(|b| Bias::Dense(b.shallow_clone())), Some(z), false)
            }
        };
        let last = match stop {
            Stop::After(l) => {
                self.stack_layer(l)?;
                if l < from {
                    return Err(ModelError::Invalid(format!("a run from layer {from} cannot stop after layer {l}")));
                }
                l + 1
            }
            Stop::FinalNorm | Stop::Logits => self.stack.len(),
        };
        let kind = self.stack_kind;
        let t = x.size()[1];
        let mut x = x;
        // The stream starts on the embeddings' placement; a resume's inputs (from wherever the
        // caller computed them) are put on the placement of the layer it enters, uncounted.
        let home = self.home();
        let mut on = if tokens { home } else { self.stack.get(from).map_or(home, |l| l.placement) };
        if x.device() != on.device {
            x = x.f_to_device(on.device)?;
        }
        if from < last {
            let mut bias = match bias {
                Some(b) => b.to_device(on.device)?,
                None => Bias::Dense(self.unpadded_bias(&x)?),
            };
            for (l, layer) in self.stack.iter().enumerate().take(last).skip(from) {
                if layer.placement != on {
                    x = x.f_to_device(layer.placement.device)?;
                    bias = bias.to_device(layer.placement.device)?;
                    hooks::moved(h, on, layer.placement, l);
                    on = layer.placement;
                }
                x = match z {
                    Some(z) if l == from => {
                        check_interrupt()?;
                        let z = z.f_to_device(on.device)?;
                        let a = layer.mixer.output_from_z(&z, kind, l, h, Inside(()))?;
                        let e = gates.experts_of(kind, l).map(|e| e.on(on.device)).transpose()?;
                        layer.finish_hooked(&x, a, kind, l, h, e.as_ref())?
                    }
                    _ => {
                        let g = gates.layer(kind, l).map(|g| g.on(on.device)).transpose()?;
                        let streamed = self.streamed(gates, l, &bias, t, 0, None)?;
                        layer.forward(&x, streamed.as_ref().unwrap_or(&bias), g.as_ref(), kind, l, h)?
                    }
                };
            }
        }
        if on != home && !matches!(stop, Stop::After(_)) {
            x = x.f_to_device(home.device)?;
            hooks::moved(h, on, home, self.stack.len());
        }
        match stop {
            Stop::After(_) => Ok(x),
            Stop::FinalNorm => self.final_norm(x, h),
            Stop::Logits => {
                let y = self.final_norm(x, h)?;
                self.logits_hooked(&y, h)
            }
        }
    }

    /// [`Transformer::run`] from layer `l`'s contexts `z` as a pass that left the layer's heads
    /// ungated recorded them (`hook_z`), under `gates`: the layer's gate applied as the forward
    /// applies it ([`Mixer::gated`]), then on as from [`Start::Z`]. `ablate` resumes its
    /// masked pass here: the layer's attention is not recomputed, and the floats are the
    /// masked forward's.
    #[allow(clippy::too_many_arguments)]
    pub fn run_from_open_z(
        &self,
        l: usize,
        x: &Tensor,
        z: &Tensor,
        bias: &Tensor,
        stop: Stop,
        gates: &Gates,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        let layer = self.stack_layer(l)?;
        let z = match gates.layer(self.stack_kind, l) {
            Some(g) if g.heads => layer.mixer.gated(z, &g.on(z.device())?, Inside(())),
            _ => z.shallow_clone(),
        };
        self.run(Start::Z { layer: l, x, z: &z, bias: Some(bias) }, stop, gates, h)
    }

    /// `gates` with their per-batch fill (resample or per-position mean ablation,
    /// [`super::fill::FillSource`]) computed for the batch `ids`: `None` when they have none.
    pub fn resolved(&self, ids: &Tensor, mask: &Tensor, gates: &Gates) -> Result<Option<Gates>, ModelError> {
        let Some(src) = &gates.source else { return Ok(None) };
        if super::nn::is_packed(mask) {
            return Err(ModelError::Invalid("resample and per-position mean ablation draw their fills per sentence: they cannot run on rows that pack several sentences (docs/methods.md#packing)".into()));
        }
        let fill = src.batch_fill(self, ids, mask)?;
        let mut g = gates.share();
        g.source = None;
        g.fill.set(self.stack_kind, fill);
        Ok(Some(g))
    }

    /// An error when `gates` still carry a per-batch fill source: a computation that does not
    /// run whole sentences through [`Self::encode`] cannot draw or place their fills.
    pub fn no_source(gates: &Gates, what: &str) -> Result<(), ModelError> {
        match gates.source {
            Some(_) => Err(ModelError::Invalid(format!("{what} is not offered under resample or per-position mean ablation (their fills are computed for each sentence measured); use ablation \"mean\" or \"zero\""))),
            None => Ok(()),
        }
    }

    /// What layer `l`'s attention adds to the residual stream when its `hook_z` holds `z`
    /// (`[B, H, T, dh]`): the attention's output from the contexts, through the norm the family
    /// puts after the attention (`StackLayer::attn_added`, the forward's own); `None` for a
    /// post-norm layer, where no sublayer adds alone. Path patching's sender effect.
    pub fn attn_added_from_z(&self, l: usize, z: &Tensor, h: &mut HookSlot) -> Result<Option<Tensor>, ModelError> {
        let layer = self.stack_layer(l)?;
        let a = layer.mixer.output_from_z(z, self.stack_kind, l, h, Inside(()))?;
        layer.attn_added(a, self.stack_kind, l, h)
    }

    /// The residual stream after layer `l`'s attention sublayer alone, from the layer's input
    /// `x` (`hook_resid_pre`) and the attention's output `a` (`hook_attn_out`): `x` plus what
    /// the attention adds ([`StackLayer::attn_added`], the forward's own). In a pre-norm
    /// layer it is `hook_resid_mid`'s value; in a parallel-residual layer (GPT-NeoX, Phi),
    /// which has no `resid_mid`, the stream the attention alone would leave. `None` for a
    /// post-norm layer, where no sublayer adds alone.
    pub fn after_attention(&self, l: usize, x: &Tensor, a: &Tensor) -> Result<Option<Tensor>, ModelError> {
        let layer = self.stack_layer(l)?;
        match layer.attn_added(a.shallow_clone(), self.stack_kind, l, &mut None)? {
            Some(added) => Ok(Some(x.f_add(&added)?)),
            None => Ok(None),
        }
    }

    /// The stack's attention bias for rows `x [B, T, ..]` without padding (every key real), a
    /// run's when [`Start::Layer`] or [`Start::Z`] gives none: one row `[1, .., T, T]`,
    /// broadcast over the batch (as a key/value cache's causal bias is).
    fn unpadded_bias(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let mask = Tensor::f_ones([1, x.size()[1]], (x.kind(), x.device()))?;
        Ok(self.self_bias(&mask, x.kind()))
    }

    /// Layer `l` of the self-attention stack, or an error naming it.
    fn stack_layer(&self, l: usize) -> Result<&StackLayer, ModelError> {
        self.stack.get(l).ok_or_else(|| {
            ModelError::Invalid(format!("layer {l} out of range: the stack has {} layers", self.stack.len()))
        })
    }

    /// Layer `l` of a causal stack over `x [B, T, D]` at positions `past..`, its attention
    /// half, its queries also attending to the earlier positions' keys and values `prefix`
    /// (`[B, H, past, d_head]`; `None` when `past` is 0 or the layer has no heads), at `queries` (with
    /// [`Queries::Last`], the last position alone, its keys and values still from every
    /// position: patching's top layer, whose other positions no logit reads): `(x, a)`, the
    /// residual stream at the query positions and the attention's output there. [`Transformer::layer_finish`]
    /// completes the layer reading each position alone, so that the halves of several calls
    /// (other rows, other positions) may finish as one batch, flattened.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer_attention(
        &self,
        l: usize,
        x: &Tensor,
        past: i64,
        prefix: Option<KeysValues>,
        gates: &Gates,
        h: &mut HookSlot,
        queries: Queries,
    ) -> Result<(Tensor, Tensor), ModelError> {
        Self::no_source(gates, "resuming a layer over cached keys and values")?;
        let layer = self.stack_layer(l)?;
        if !self.causal {
            return Err(ModelError::Invalid("a key/value cache needs a causal (decoder-only) stack".into()));
        }
        let bias = Bias::Dense(cached_window_bias(x.size()[1], past, self.window, x.kind(), x.device()));
        let bias = self.streamed(gates, l, &bias, x.size()[1], past, None)?.unwrap_or(bias);
        let mut slot = prefix;
        let g = gates.layer(self.stack_kind, l);
        layer.attention_queries(x, &bias, g.as_ref(), self.stack_kind, l, h, Some(&mut slot), queries, false)
    }

    /// The half of layer `l` after its attention ([`Transformer::layer_attention`]), from the
    /// residual stream `x` and the attention's output `a` (both `[.., D]`, of one shape; each
    /// position is read alone).
    pub(super) fn layer_finish(
        &self,
        l: usize,
        x: &Tensor,
        a: Tensor,
        gates: &Gates,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        let layer = self.stack_layer(l)?;
        let e = gates.experts_of(self.stack_kind, l).map(|e| e.on(x.device())).transpose()?;
        layer.finish_hooked(x, a, self.stack_kind, l, h, e.as_ref())
    }

    /// Layer `l` resumed at its attention's `hook_z` (`x` its input, `z` the contexts, at any
    /// positions), its attention half: `(x, a)` with `a` the attention's output from the
    /// contexts, for [`Transformer::layer_finish`] (what follows `hook_z` reads each position
    /// alone).
    pub(super) fn layer_attention_from_z(
        &self,
        l: usize,
        x: &Tensor,
        z: &Tensor,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let layer = self.stack_layer(l)?;
        check_interrupt()?;
        Ok((x.shallow_clone(), layer.mixer.output_from_z(z, self.stack_kind, l, h, Inside(()))?))
    }

    /// The stack's final norm (`ln_final.hook_normalized`), where the model has one.
    fn final_norm(&self, x: Tensor, h: &mut HookSlot) -> Result<Tensor, ModelError> {
        match &self.final_norm {
            Some(n) => {
                let y = n.forward_with(&x, hooks::rules(h));
                hooks::at(h, At::new(self.stack_kind, 0, Point::LnFinal), y)
            }
            None => Ok(x),
        }
    }

    /// A causal stack continued from cached keys and values: `ids [B, T]` at positions
    /// `cache.len()..`, returning the final states `[B, T, D]` and extending the cache. Equal to
    /// running the whole prefix again (`tests`: generation with and without the cache).
    pub fn stack_cached(
        &self,
        ids: &Tensor,
        cache: &mut StackCache,
        gates: &Gates,
        mut h: HookSlot,
    ) -> Result<Tensor, ModelError> {
        Self::no_source(gates, "generation")?;
        if !self.causal {
            return Err(ModelError::Invalid("a key/value cache needs a causal (decoder-only) stack".into()));
        }
        let (b, t) = (ids.size()[0], *ids.size().get(1).unwrap_or(&0));
        let kind = self.stack_kind;
        let past = cache.len;
        // As a whole run: past the model's positions refused (unless allowed), and the step's
        // memory (activations, scores over every cached key, the bias) within the budget.
        if let Some(max) = self.max_positions.filter(|&m| past + t > m && !crate::budget::past_positions()) {
            return Err(ModelError::PastPositions { tokens: past + t, max });
        }
        crate::budget::check(
            &format!("a forward over {b} x {t} tokens after {past} cached"),
            self.cached_bytes(b, t, past),
        )
        .map_err(ModelError::Invalid)?;
        let mut x = self.embed.forward(Some(ids), b, past, t, kind, &mut h)?;
        let bias = Bias::Dense(cached_window_bias(t, past, self.window, x.kind(), x.device()));
        if cache.layers.len() != self.stack.len() {
            cache.layers = (0..self.stack.len()).map(|_| None).collect();
        }
        if past == 0 {
            cache.prompt = Some(t);
        }
        if cache.packed.len() != self.stack.len() {
            cache.packed = (0..self.stack.len()).map(|_| None).collect();
        }
        if cache.carries.len() != self.stack.len() {
            cache.carries = (0..self.stack.len()).map(|_| Carry::Empty).collect();
        }
        let StackCache { layers, packed, prompt, compress, carries, .. } = cache;
        for ((((l, layer), slot), pack), carry) in
            self.stack.iter().enumerate().zip(layers.iter_mut()).zip(packed.iter_mut()).zip(carries.iter_mut())
        {
            let g = gates.layer(kind, l);
            if layer.attention().is_none() {
                // A mixer without keys and values continues from what it carried (a kind that
                // cannot refuses, naming itself).
                let (y, next) = layer.forward_carried(&x, &bias, g.as_ref(), kind, l, &mut h, carry)?;
                x = y;
                *carry = next;
                continue;
            }
            let streamed = self.streamed(gates, l, &bias, t, past, *prompt)?;
            // A generation holds each layer packed (docs/methods.md#streaming-heads): one key and
            // value per key/value group, a streaming group's only at the positions a later
            // query can still see; the attention reads them unpacked.
            let grouping = match (*compress, layer.attention()) {
                (true, Some(attn)) => Grouping::of(gates.stream.as_deref(), l, attn),
                _ => None,
            };
            if let (Some(_), Some(p)) = (&grouping, pack.take()) {
                *slot = Some(p.unpack(past)?);
            }
            x = layer.forward_cached(
                &x,
                streamed.as_ref().unwrap_or(&bias),
                g.as_ref(),
                kind,
                l,
                &mut h,
                Some(slot),
            )?;
            if let Some(gr) = grouping {
                if let Some(kv) = slot.take() {
                    let end = past + t;
                    let keep: Vec<i64> = match &gates.stream {
                        Some(st) if !gr.streaming.is_empty() => {
                            (0..end).filter(|&j| st.keeps(j, end, *prompt)).collect()
                        }
                        _ => vec![],
                    };
                    *pack = Some(Packed::pack(&kv, gr, &keep)?);
                }
            }
        }
        cache.len += t;
        self.final_norm(x, &mut h)
    }

    /// Layer `l`'s attention bias with the keys its streaming heads do not see hidden
    /// (docs/methods.md#streaming-heads), for `t` queries after `past` positions; `None` when no
    /// head of the layer streams. `first`: the positions of a cache's first call (the prompt of
    /// a generation).
    fn streamed(
        &self,
        gates: &Gates,
        l: usize,
        bias: &Bias,
        t: i64,
        past: i64,
        first: Option<i64>,
    ) -> Result<Option<Bias>, ModelError> {
        let Some((s, attn)) = gates.stream.as_ref().zip(self.stack.get(l).and_then(|l| l.attention())) else {
            return Ok(None);
        };
        let prompt = s.prompt(past + t, first);
        let (dtype, device) = bias.kind_device();
        match s.bias(l, attn.slots.as_ref(), attn.n_heads, t, past, prompt, dtype, device) {
            Some(extra) => Ok(Some(Bias::Dense(bias.dense()? + extra))),
            None => Ok(None),
        }
    }

    /// The working memory of a forward over `b` sequences of `t` tokens, estimated: a layer's
    /// activations (the stream, queries, keys, values and the MLP's hidden units, a few copies
    /// of each) and its attention scores `[b, heads, t, t]` (float32), as a hook recording the
    /// pattern holds them (docs/methods.md#memory-budget). With score tiles of `rows` query
    /// rows (docs/methods.md#score-tiles) a layer holds a tile's scores and weights instead,
    /// beside the attention bias. The bias is described, not held ([`Bias::described`]), unless
    /// the stack adds a relative position bias or the rows are `packed`: then `[b, 1, t, t]`,
    /// per head (`[b, heads, t, t]`) with a relative position bias, three of them where a
    /// layer adds a window or chunks. Streaming heads hold two per head (three beside a layer's
    /// window or chunks), DuoAttention three (four). 8 bytes a value in a float64 model.
    pub fn forward_bytes(&self, b: i64, t: i64, rows: Option<i64>, packed: bool, gates: &Gates) -> f64 {
        let (d, heads, hidden) = self.widths();
        let scores = match rows {
            Some(n) => {
                let value = if self.embed.tokens.kind() == DType::Double { 8.0 } else { 4.0 };
                let per_head = if self.rel_bias.is_some() || gates.stream.is_some() { heads } else { 1.0 };
                let layers_add = self.stack.iter().any(|l| l.window.is_some() || l.chunk().is_some());
                // Streaming heads: the stack's bias, then per head the sum with the keys they
                // hide (and with a layer's window or chunks one more); DuoAttention: the bias, its
                // streaming window and their sum (and a layer's own beside).
                let more = if layers_add { 1.0 } else { 0.0 };
                let copies = match (self.describes_bias(packed), gates.duo.is_some(), gates.stream.is_some()) {
                    (_, true, _) => 3.0 + more,
                    (_, false, true) => 2.0 + more,
                    (true, false, false) => 0.0,
                    (false, false, false) => 1.0 + 2.0 * more,
                };
                let n = n.clamp(1, t.max(1));
                value * per_head * copies * (b * t * t) as f64
                    + value * (b * t) as f64
                    + 4.0 * value * heads * (b * n * t) as f64
            }
            None => 4.0 * heads * (b * t * t) as f64,
        };
        let (b, t) = (b as f64, t as f64);
        4.0 * b * t * (8.0 * d + 3.0 * hidden) + scores
    }

    /// The working memory of one step over cached keys ([`Transformer::stack_cached`]): `t`
    /// new positions of `b` sequences after `past` cached: the activations as
    /// [`Transformer::forward_bytes`] counts them, the scores of every head over all `past + t`
    /// keys, the bias over them (float32) and the cache itself (keys and values of every layer).
    pub fn cached_bytes(&self, b: i64, t: i64, past: i64) -> f64 {
        let (d, heads, hidden) = self.widths();
        let (b, t, keys) = (b as f64, t as f64, (past + t) as f64);
        let cache = 2.0 * 4.0 * self.stack.len() as f64 * b * keys * d;
        4.0 * b * t * (8.0 * d + 3.0 * hidden) + 4.0 * (heads + 1.0) * b * t * keys + cache
    }

    /// The model width, the most heads of a layer (at least 1) and the widest MLP (at least the
    /// model width): what the memory estimates scale with.
    pub fn widths(&self) -> (f64, f64, f64) {
        let d = self.embed.tokens.size().get(1).copied().unwrap_or(0) as f64;
        let (mut heads, mut hidden) = (1.0f64, d);
        for l in &self.stack {
            heads = heads.max(l.mixer().width() as f64);
            hidden = hidden.max(l.mlp().width() as f64);
        }
        (d, heads, hidden)
    }

    /// Whether a pass of score tiles over rows (`packed` or not) describes its attention bias
    /// ([`Bias::described`]) rather than holding it: not under a relative position bias (per
    /// head and learned) nor with sentences packed into a row (a segment per sentence).
    pub fn describes_bias(&self, packed: bool) -> bool {
        self.rel_bias.is_none() && !packed
    }

    /// Whether sentences may be packed into one row behind a segment mask
    /// (docs/methods.md#packing) under `gates`, each computing as it would alone: a causal
    /// decoder-only stack without positions at its input or a relative position bias, whose
    /// mixers read positions only through differences ([`Mixer::relative_positions`]) and
    /// whose layers have no chunks (fixed absolute blocks); and gates that place nothing by
    /// position (streaming heads, DuoAttention, per-sentence or per-position fills).
    pub fn packs(&self, gates: &Gates) -> bool {
        self.causal
            && self.decoder.is_empty()
            && matches!(self.embed.positions, Positions::None)
            && self.embed.token_type.is_none()
            && self.rel_bias.is_none()
            && self.stack.iter().all(|l| l.chunk().is_none() && l.mixer().relative_positions())
            && gates.stream.is_none()
            && gates.duo.is_none()
            && gates.source.is_none()
            && gates.fill.is_position_free()
    }

    /// Whether every layer of the stack keeps keys and values a later position can read (every
    /// mixer is attention): generation and resumed passes from a later position need it; a
    /// stack with another kind of mixer resumes from the first position.
    pub fn caches_keys(&self) -> bool {
        self.stack.iter().all(|l| l.attention().is_some())
    }

    /// The stack's attention bias: padding, plus the causal mask for a decoder-only model, plus
    /// a relative position bias (T5; then per head, `[B, H, S, S]`).
    pub fn self_bias(&self, mask: &Tensor, dtype: tch::Kind) -> Tensor {
        let bias = key_bias(mask, dtype);
        let bias = if self.causal {
            bias + super::nn::causal_bias(mask.size()[1], self.window, dtype, mask.device())
        } else {
            bias
        };
        // Sentences packed into a row (docs/methods.md#packing) see only their own keys.
        let bias = if super::nn::is_packed(mask) { bias + super::nn::segment_bias(mask, dtype) } else { bias };
        match &self.rel_bias {
            Some(rb) => {
                let s = mask.size()[1];
                bias + rb.bias(0, s, s).to_kind(dtype)
            }
            None => bias,
        }
    }

    /// The decoder's state before the first step of [`DecStart::Step`] (each self-block
    /// starts empty and takes its batch from the first step).
    pub fn start_state(&self) -> DecoderState {
        DecoderState { selfs: self.initial_states(), step: 0 }
    }

    /// Each decoder layer's self-block carry before the first step.
    fn initial_states(&self) -> Vec<Carry> {
        self.decoder.iter().map(|_| Carry::Empty).collect()
    }

    /// The decoder's embeddings (its own, else the encoder's).
    pub fn dec_embeddings(&self) -> &Embeddings {
        self.dec_embed.as_ref().unwrap_or(&self.embed)
    }

    /// The decoder's input embeddings of `ids [B, T]` at positions `start..`, or of the start
    /// token when `ids` is `None` (`T = 1`).
    fn dec_inputs(
        &self,
        ids: Option<&Tensor>,
        batch: i64,
        start: i64,
        len: i64,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        let e = self.dec_embeddings();
        match (ids, self.dec_start) {
            (None, Some(id)) => {
                let first = Tensor::full([batch, len], id, (DType::Int64, self.device()));
                e.forward(Some(&first), batch, start, len, Kind::Dec, h)
            }
            (ids, _) => e.forward(ids, batch, start, len, Kind::Dec, h),
        }
    }

    /// The encoder side of decoder runs over the encoder output `enc [B, S, D]` with its key
    /// mask `[B, S]`: each layer's cross-attention keys and values (hook points
    /// `cross.blocks.L.attn.hook_k`, `hook_v`) and the source bias. Computed once per source;
    /// every [`Transformer::decode`] run over it (teacher forcing, each generated step, each
    /// resume) reads it.
    pub fn source(&self, enc: &Tensor, mask: &Tensor, h: &mut HookSlot) -> Result<Source, ModelError> {
        let cross = self
            .decoder
            .iter()
            .enumerate()
            .map(|(l, layer)| layer.cross.as_ref().map(|(a, _)| a.keys_values(enc, 0, Kind::Cross, l, h)).transpose())
            .collect::<Result<_, _>>()?;
        Ok(Source { cross, enc_bias: key_bias(mask, enc.kind()) })
    }

    /// The decoder's input embeddings for teacher forcing `[B, T, D]`: the start (the start
    /// token, or a zero embedding) and `targets [B, T]` shifted right.
    fn teacher_inputs(&self, targets: &Tensor, h: &mut HookSlot) -> Result<Tensor, ModelError> {
        let (b, t) = (targets.size()[0], targets.size()[1]);
        if t <= 1 {
            return Ok(self.dec_inputs(None, b, 0, 1, h)?.narrow(1, 0, t.max(0)));
        }
        // One embedding call over the whole sequence, so that `dec.hook_embed` sees `[B, T, D]`:
        // the start token's embedding (or a zero one) first, the targets shifted right after.
        let e = self.dec_embeddings();
        let shifted = targets.narrow(1, 0, t - 1);
        let tok = match self.dec_start {
            Some(id) => {
                e.lookup(&Tensor::cat(&[Tensor::full([b, 1], id, (DType::Int64, self.device())), shifted], 1))?
            }
            None => Tensor::cat(
                &[Tensor::zeros([b, 1, e.tokens.size()[1]], (e.tokens.kind(), e.tokens.device())), e.lookup(&shifted)?],
                1,
            ),
        };
        e.finish(&tok, 0, Kind::Dec, h)
    }

    /// The one driver of a translation model's decoder, as [`Transformer::run`] is the
    /// stack's: from `start` (teacher-forced targets, one generation step, or a layer's
    /// cross-attention `hook_z`) over `src` ([`Transformer::source`]) to `stop` (after a
    /// layer: its output as the layer gives it, the last one's after the decoder's final norm;
    /// the final states `[B, T, D]`; or the logits `[B, T, V]` through the one unembedding),
    /// under `gates` (`dec` and `cross` heads), every hook point on the way seen by `h`.
    /// Teacher forcing runs each layer over every step at once, so attention capture reports
    /// `[B, H, T, S]` (cross) and `[B, H, T, T]` (dec) once per layer; a step reports `T = 1`.
    pub fn decode(
        &self,
        start: DecStart,
        stop: Stop,
        src: &Source,
        gates: &Gates,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        let n = self.decoder.len();
        let last = match stop {
            Stop::After(l) if l >= n => {
                return Err(ModelError::Invalid(format!("decoder layer {l} out of range: the decoder has {n} layers")))
            }
            Stop::After(l) => l + 1,
            Stop::FinalNorm | Stop::Logits => n,
        };
        let out_of_range =
            |l: usize| ModelError::Invalid(format!("decoder layer {l} out of range: the decoder has {n} layers"));
        let x = match start {
            DecStart::Targets(targets) => {
                let mut x = self.teacher_inputs(targets, h)?;
                let starts = self.initial_states();
                for (l, layer) in self.decoder.iter().enumerate().take(last) {
                    let cross = src.cross.get(l).and_then(Option::as_ref);
                    x = layer.forward(&x, &starts[l], cross, &src.enc_bias, gates, l, h)?.0;
                }
                x
            }
            DecStart::Step { prev, state } => {
                // A step advances every layer's state: one stopped below the top would leave
                // the layers above a step behind.
                if last < n {
                    return Err(ModelError::Invalid(format!(
                        "a decoder step runs every layer: it cannot stop after layer {} of {n}",
                        last - 1
                    )));
                }
                let b = src.enc_bias.size()[0];
                let ids = prev.map(|p| p.view([b, 1]));
                let mut x = self.dec_inputs(ids.as_ref(), b, state.step, 1, h)?; // [B, 1, D]
                for (l, layer) in self.decoder.iter().enumerate().take(last) {
                    let cross = src.cross.get(l).and_then(Option::as_ref);
                    let (y, c) = layer.forward(&x, &state.selfs[l], cross, &src.enc_bias, gates, l, h)?;
                    state.selfs[l] = c;
                    x = y;
                }
                state.step += 1;
                x
            }
            DecStart::CrossZ { layer, x, z } => {
                let first = self.decoder.get(layer).ok_or_else(|| out_of_range(layer))?;
                if layer >= last {
                    return Err(ModelError::Invalid(format!(
                        "a decoder run from layer {layer} cannot stop after layer {}",
                        last - 1
                    )));
                }
                let mut y = first.forward_from_cross_z(x, z, layer, h)?;
                let starts = self.initial_states();
                for (k, above) in self.decoder.iter().enumerate().take(last).skip(layer + 1) {
                    let cross = src.cross.get(k).and_then(Option::as_ref);
                    y = above.forward(&y, &starts[k], cross, &src.enc_bias, gates, k, h)?.0;
                }
                y
            }
        };
        match stop {
            Stop::Logits => self.logits_hooked(&x, h),
            Stop::After(_) | Stop::FinalNorm => Ok(x),
        }
    }

    /// Teacher forcing from the encoder output: [`Transformer::source`] of `enc` then
    /// [`Transformer::decode`] from `targets [B, T]` to `stop` (`Stop::Logits`: `[B, T, V]`
    /// for predicting each target; `Stop::FinalNorm`: the final states `[B, T, D]`).
    pub fn teacher(
        &self,
        enc: &Tensor,
        mask: &Tensor,
        targets: &Tensor,
        stop: Stop,
        gates: &Gates,
        mut h: HookSlot,
    ) -> Result<Tensor, ModelError> {
        let src = self.source(enc, mask, &mut h)?;
        self.decode(DecStart::Targets(targets), stop, &src, gates, &mut h)
    }

    /// Greedy decoding of a batch; each row stops at EOS or `max_len[row]` tokens. The model's
    /// forced first token (`forced_bos`), where it has one, is the first token of every row.
    pub fn greedy(
        &self,
        enc: &Tensor,
        mask: &Tensor,
        max_len: &[i64],
        gates: &Gates,
    ) -> Result<Vec<Vec<i64>>, ModelError> {
        self.greedy_forced(enc, mask, max_len, gates, self.forced_bos.get())
    }

    /// [`Transformer::greedy`] with `forced` as the first token (as transformers'
    /// `ForcedBOSTokenLogitsProcessor`; it counts towards `max_len`), or none. Each step is a
    /// [`Transformer::decode`] run from [`DecStart::Step`] to the logits.
    pub fn greedy_forced(
        &self,
        enc: &Tensor,
        mask: &Tensor,
        max_len: &[i64],
        gates: &Gates,
        forced: Option<i64>,
    ) -> Result<Vec<Vec<i64>>, ModelError> {
        let b = enc.size()[0] as usize;
        let mut none: HookSlot = None;
        let src = self.source(enc, mask, &mut none)?;
        let mut state = self.start_state();
        let mut out: Vec<Vec<i64>> = vec![Vec::new(); b];
        let mut done = vec![false; b];
        let limit = max_len.iter().copied().max().unwrap_or(0);
        let mut prev: Option<Tensor> = None;
        for t in 0..limit {
            // Each step reads every source position: a long source is minutes (Ctrl-C stops it).
            check_interrupt()?;
            let step = DecStart::Step { prev: prev.as_ref(), state: &mut state };
            let logits = self.decode(step, Stop::Logits, &src, gates, &mut none)?.f_squeeze_dim(1)?;
            for &id in &self.banned {
                let _ = logits.f_narrow(1, id, 1)?.f_fill_(f64::NEG_INFINITY)?;
            }
            let next = match forced {
                Some(id) if t == 0 => Tensor::full([b as i64], id, (DType::Int64, logits.device())),
                _ => super::nn::top1(&logits),
            };
            let ids = Vec::<i64>::try_from(&next)?;
            for (i, &id) in ids.iter().enumerate() {
                if done[i] {
                    continue;
                }
                if id == self.eos_id || t >= max_len[i] {
                    done[i] = true;
                } else {
                    out[i].push(id);
                }
            }
            if done.iter().all(|d| *d) {
                break;
            }
            prev = Some(next);
        }
        Ok(out)
    }
}

/// A causal stack's keys and values of the positions run so far, per layer.
#[derive(Default)]
pub struct StackCache {
    pub layers: Vec<Option<KeysValues>>,
    /// Positions cached.
    pub len: i64,
    /// The positions of the first call (a generation's prompt: the decode regime of streaming
    /// heads reads it in full).
    pub prompt: Option<i64>,
    /// Hold layers packed ([`Packed`]: one key and value per key/value group, a streaming
    /// group's only where a later query can see them; what a generation keeps); off, every
    /// layer stays in `layers` as attention reads it (what patching resumes from).
    pub compress: bool,
    /// Per layer, the packed keys and values (instead of `layers`) under a streaming view.
    pub packed: Vec<Option<Packed>>,
    /// Per layer, what a mixer without keys and values continues from (a short convolution's
    /// last inputs, a recurrence's state: [`Mixer::step`]); [`Carry::Empty`] for attention.
    pub carries: Vec<Carry>,
}

impl StackCache {
    /// Bytes of the keys and values the cache holds, and of the states a mixer without them
    /// carries (its tensors' sizes).
    pub fn bytes(&self) -> i64 {
        let t = |x: &Tensor| if x.defined() { x.numel() as i64 * x.kind().elt_size_in_bytes() as i64 } else { 0 };
        let dense: i64 = self.layers.iter().flatten().map(|kv| t(&kv.k) + t(&kv.v)).sum();
        let packed: i64 =
            self.packed.iter().flatten().map(|p| t(&p.full_k) + t(&p.full_v) + t(&p.stream_k) + t(&p.stream_v)).sum();
        let carried: i64 = self.carries.iter().flat_map(|c| c.tensors()).map(t).sum();
        dense + packed + carried
    }
}

/// Which key/value groups of one layer stream: the query heads per group and the groups of
/// each kind.
#[derive(Clone)]
pub struct Grouping {
    per: i64,
    groups: i64,
    full: Vec<i64>,
    streaming: Vec<i64>,
}

impl Grouping {
    /// The grouping of layer `l` under the streaming heads `st`; `None` (the layer's cache stays
    /// as attention reads it) when no group of the layer streams and no grouped-query heads
    /// share keys (packing would keep the same tensors), or the layer was thinned by
    /// `prune_heads` (the mask still applies).
    fn of(st: Option<&super::nn::Streaming>, l: usize, attn: &Attention) -> Option<Grouping> {
        if attn.slots.is_some() || attn.n_heads == 0 {
            return None;
        }
        let groups = attn.n_kv_heads.max(1);
        let per = attn.n_heads / groups;
        let row = st.and_then(|s| s.heads.get(l));
        let (streaming, full): (Vec<i64>, Vec<i64>) =
            (0..groups).partition(|&g| row.and_then(|r| r.get((g * per) as usize)).copied().unwrap_or(false));
        if streaming.is_empty() && per == 1 {
            return None;
        }
        Some(Grouping { per, groups, full, streaming })
    }
}

/// One layer's keys and values as a streaming view's generation holds them: the full groups'
/// `[B, Gf, len, dh]` and the streaming groups' `[B, Gs, kept, dh]` at positions `kept`
/// (one key and value per group: grouped-query heads are not repeated).
pub struct Packed {
    pub full_k: Tensor,
    pub full_v: Tensor,
    pub stream_k: Tensor,
    pub stream_v: Tensor,
    pub kept: Vec<i64>,
    grouping: Grouping,
}

impl Packed {
    /// Packs a layer's keys and values `[B, H, len, dh]` (grouped heads repeated), keeping the
    /// streaming groups' positions `keep`.
    fn pack(kv: &KeysValues, gr: Grouping, keep: &[i64]) -> Result<Packed, ModelError> {
        let dev = kv.k.device();
        let idx = |v: &[i64]| Tensor::from_slice(v).to_device(dev);
        let first: Vec<i64> = (0..gr.groups).map(|g| g * gr.per).collect();
        let one = |x: &Tensor| x.f_index_select(1, &idx(&first));
        let (k, v) = (one(&kv.k)?, one(&kv.v)?);
        let pick =
            |x: &Tensor, groups: &[i64]| -> Result<Tensor, ModelError> { Ok(x.f_index_select(1, &idx(groups))?) };
        let (sk, sv) = (
            pick(&k, &gr.streaming)?.f_index_select(2, &idx(keep))?,
            pick(&v, &gr.streaming)?.f_index_select(2, &idx(keep))?,
        );
        Ok(Packed {
            full_k: pick(&k, &gr.full)?,
            full_v: pick(&v, &gr.full)?,
            stream_k: sk,
            stream_v: sv,
            kept: keep.to_vec(),
            grouping: gr,
        })
    }

    /// The layer's keys and values `[B, H, len, dh]` again, zeros where a streaming group let
    /// a position go (the streaming mask hides it from every query that comes).
    fn unpack(&self, len: i64) -> Result<KeysValues, ModelError> {
        let gr = &self.grouping;
        let dev = self.full_k.device();
        let idx = |v: &[i64]| Tensor::from_slice(v).to_device(dev);
        let dense = |full: &Tensor, stream: &Tensor| -> Result<Tensor, ModelError> {
            let like = if full.numel() > 0 || !stream.defined() { full } else { stream };
            let (b, dh) = (like.size()[0], like.size()[3]);
            let mut out = Tensor::zeros([b, gr.groups, len, dh], (like.kind(), dev));
            if !gr.full.is_empty() {
                let _ = out.f_index_copy_(1, &idx(&gr.full), full)?;
            }
            if !gr.streaming.is_empty() {
                let mut s = Tensor::zeros([b, gr.streaming.len() as i64, len, dh], (like.kind(), dev));
                let _ = s.f_index_copy_(2, &idx(&self.kept), stream)?;
                let _ = out.f_index_copy_(1, &idx(&gr.streaming), &s)?;
            }
            Ok(if gr.per > 1 { out.repeat_interleave_self_int(gr.per, Some(1), None) } else { out })
        };
        Ok(KeysValues { k: dense(&self.full_k, &self.stream_k)?, v: dense(&self.full_v, &self.stream_v)? })
    }
}

/// Additive bias `[1, 1, T, P + T]` for `T` new queries after `P` cached positions: key `j`
/// is hidden from query `i` (at position `P + i`) when `j > P + i`, or, with a sliding
/// `window`, when `j <= P + i - window` (the same keys [`super::nn::causal_bias`] leaves).
pub fn cached_window_bias(t: i64, past: i64, window: Option<i64>, dtype: DType, device: Device) -> Tensor {
    let causal = Tensor::ones([t, past + t], (dtype, device)).triu(past + 1).view([1, 1, t, past + t]) * -1e9;
    match window {
        Some(w) => causal + window_bias(t, past, w, dtype, device),
        None => causal,
    }
}

/// Additive bias `[1, 1, T, P + T]` hiding from query `i` (at position `P + i`) the keys
/// `j <= P + i - window`: a layer's own sliding window.
pub fn window_bias(t: i64, past: i64, window: i64, dtype: DType, device: Device) -> Tensor {
    Tensor::ones([t, past + t], (dtype, device)).tril(past - window.max(1)).view([1, 1, t, past + t]) * -1e9
}

/// Additive bias `[1, 1, T, P + T]` hiding from query `i` (at position `P + i`) the keys
/// before its chunk, `j < floor((P + i) / chunk) chunk`: Llama 4's chunked attention (the causal
/// bias hides those after it).
pub fn chunk_bias(t: i64, past: i64, chunk: i64, dtype: DType, device: Device) -> Result<Tensor, ModelError> {
    let c = chunk.max(1);
    let q =
        Tensor::f_arange_start(past, past + t, (DType::Int64, device))?.f_floor_divide_scalar(c)?.f_mul_scalar(c)?;
    let k = Tensor::f_arange(past + t, (DType::Int64, device))?;
    let hidden = k.f_unsqueeze(0)?.f_lt_tensor(&q.f_unsqueeze(1)?)?;
    Ok(hidden.f_to_kind(dtype)?.f_mul_scalar(-1e9)?.f_view([1, 1, t, past + t])?)
}

/// Float tensors of a checkpoint are converted to the model's dtype and device here.
pub fn place(t: Tensor, device: Device, dtype: DType) -> Tensor {
    if t.is_floating_point() {
        t.to_device(device).to_kind(dtype)
    } else {
        t.to_device(device)
    }
}

// What each part of the stack says about itself: the hook points its forward visits, in
// order, and its weights (`nn::Params`). `Model::hook_points` and the parameter count are
// these walks; tests/models/hooks.rs checks the points against a recording run on every
// family, tests/models/param_count.rs the counts against transformers.

impl Embeddings {
    /// `KIND.hook_embed`, then `KIND.hook_pos_embed` where positions are added at the input.
    pub fn points(&self, kind: Kind, out: &mut Vec<At>) {
        out.push(At::new(kind, 0, Point::Embed));
        if !matches!(self.positions, Positions::None) {
            out.push(At::new(kind, 0, Point::PosEmbed));
        }
    }

    /// `W_E`, a learned `W_pos`, the token-type table `W_token_type`, the embedding norm.
    pub fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        out.push((format!("{prefix}embed.W_E"), &mut self.tokens));
        if let Positions::Learned(t) = &mut self.positions {
            out.push((format!("{prefix}pos_embed.W_pos"), t));
        }
        if let Some(t) = self.token_type.as_mut() {
            out.push((format!("{prefix}embed.W_token_type"), t));
        }
        if let Some(n) = self.norm.as_mut() {
            n.params_mut(&format!("{prefix}embed.ln."), out);
        }
    }
}

impl StackLayer {
    /// The hook points [`StackLayer::forward`] visits as layer `layer` of `kind`, in order:
    /// where the norms sit follows `norm_position` and the post-sublayer norms.
    pub fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        use Point as P;
        let push = |ps: &[P], out: &mut Vec<At>| out.extend(ps.iter().map(|&p| At::new(kind, layer, p)));
        if self.norm_position == NormPosition::PostSublayer {
            // Each sublayer's output normed: ln1 after the attention, ln2 after the MLP.
            push(&[P::ResidPre], out);
            self.mixer.points(kind, layer, out);
            push(&[P::Ln1, P::ResidMid], out);
            self.ffn.points(kind, layer, out);
            push(&[P::Ln2, P::ResidPost], out);
            return;
        }
        if self.post_norms.is_some() {
            // Four norms (Gemma): ln1 before the attention, ln1_post after it, ln2 before the
            // MLP, ln2_post after it.
            push(&[P::ResidPre, P::Ln1], out);
            self.mixer.points(kind, layer, out);
            push(&[P::Ln1Post, P::ResidMid, P::Ln2], out);
            self.ffn.points(kind, layer, out);
            push(&[P::Ln2Post, P::ResidPost], out);
            return;
        }
        let pre = self.norm_position != NormPosition::Post;
        push(&[P::ResidPre], out);
        if pre {
            push(&[P::Ln1], out);
        }
        self.mixer.points(kind, layer, out);
        if self.norm_position != NormPosition::Parallel {
            push(&[P::ResidMid], out);
        }
        push(&[if pre { P::Ln2 } else { P::Ln1 }], out);
        self.ffn.points(kind, layer, out);
        push(&[P::ResidPost], out);
        if !pre {
            push(&[P::Ln2], out);
        }
    }

    /// The attention, its norm (`ln1`), the MLP, its norm (`ln2`), Gemma's post-sublayer
    /// norms (`ln1_post`, `ln2_post`).
    pub fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        let scope = self.mixer.scope();
        self.mixer.params_mut(&format!("{prefix}{scope}."), out);
        self.attn_norm.params_mut(&format!("{prefix}ln1."), out);
        self.ffn.params_mut(&format!("{prefix}mlp."), out);
        self.ffn_norm.params_mut(&format!("{prefix}ln2."), out);
        if let Some((a, f)) = self.post_norms.as_mut() {
            a.params_mut(&format!("{prefix}ln1_post."), out);
            f.params_mut(&format!("{prefix}ln2_post."), out);
        }
    }
}

impl DecoderLayer {
    /// The hook points [`DecoderLayer::forward`] visits as decoder layer `layer`, in order
    /// (the cross-attention's under kind `cross`).
    pub fn points(&self, layer: usize, out: &mut Vec<At>) {
        use Point as P;
        let dec = |ps: &[P], out: &mut Vec<At>| out.extend(ps.iter().map(|&p| At::new(Kind::Dec, layer, p)));
        let cross = |ps: &[P], out: &mut Vec<At>| out.extend(ps.iter().map(|&p| At::new(Kind::Cross, layer, p)));
        if self.norm_position == NormPosition::Pre {
            // Each sublayer reads its norm of the stream: ln1 (self), cross ln1, ln2 (MLP).
            dec(&[P::ResidPre, P::Ln1], out);
            self.self_block.points(Kind::Dec, layer, out);
            dec(&[P::ResidMid], out);
            if let Some((a, _)) = &self.cross {
                cross(&[P::Ln1], out);
                a.points(Kind::Cross, layer, out);
                cross(&[P::ResidMid], out);
            }
            dec(&[P::Ln2], out);
            self.ffn.points(Kind::Dec, layer, out);
            dec(&[P::ResidPost], out);
            if self.final_norm.is_some() {
                out.push(At::new(Kind::Dec, 0, P::LnFinal));
            }
            return;
        }
        dec(&[P::ResidPre], out);
        self.self_block.points(Kind::Dec, layer, out);
        dec(&[P::ResidMid, P::Ln1], out);
        if let Some((a, _)) = &self.cross {
            a.points(Kind::Cross, layer, out);
            cross(&[P::ResidMid, P::Ln1], out);
        }
        self.ffn.points(Kind::Dec, layer, out);
        dec(&[P::ResidPost, P::Ln2], out);
    }

    /// The self-block (`attn.` or `ssru.`), its norm, the cross-attention and its norm, the
    /// MLP and its norm, the final norm, T5's relative bias table.
    pub fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        let scope = self.self_block.scope();
        self.self_block.params_mut(&format!("{prefix}{scope}."), out);
        self.self_norm.params_mut(&format!("{prefix}ln1."), out);
        if let Some((a, n)) = self.cross.as_mut() {
            a.params_mut(&format!("{prefix}cross_attn."), out);
            n.params_mut(&format!("{prefix}cross_ln."), out);
        }
        self.ffn.params_mut(&format!("{prefix}mlp."), out);
        self.ffn_norm.params_mut(&format!("{prefix}ln2."), out);
        if let Some(n) = self.final_norm.as_mut() {
            n.params_mut("dec.ln_final.", out);
        }
        if let Some(rb) = self.rel_bias.as_mut() {
            out.push(("dec.rel_bias.table".into(), &mut rb.table));
        }
    }
}

impl Transformer {
    /// Every hook point the forward meets, in order (docs/methods.md#hook-points): each part's
    /// own list ([`StackLayer::points`], [`DecoderLayer::points`], ...), then `hook_logits`.
    pub fn hook_points(&self) -> Vec<At> {
        let mut v = Vec::new();
        let stack = self.stack_kind;
        if !self.stack.is_empty() {
            self.embed.points(stack, &mut v);
        }
        for (l, layer) in self.stack.iter().enumerate() {
            layer.points(stack, l, &mut v);
        }
        if self.final_norm.is_some() {
            v.push(At::new(stack, 0, Point::LnFinal));
        }
        if !self.decoder.is_empty() {
            self.dec_embeddings().points(Kind::Dec, &mut v);
        }
        for (l, layer) in self.decoder.iter().enumerate() {
            layer.points(l, &mut v);
        }
        if self.output.is_some() {
            v.push(self.logits_at());
        }
        v
    }

    /// Every weight tensor with its name, in a fixed order (joint training and its
    /// checkpoints, copying weights, the parameter count). A tensor shared by two places
    /// (tied output embeddings, T5's one bias table per stack) appears once, under its first
    /// name.
    pub fn named_params_mut(&mut self) -> Params<'_> {
        let mut v = Vec::new();
        let stack = self.stack_kind;
        self.embed.params_mut(&format!("{stack}."), &mut v);
        for (l, layer) in self.stack.iter_mut().enumerate() {
            layer.params_mut(&format!("{stack}.blocks.{l}."), &mut v);
        }
        if let Some(n) = self.final_norm.as_mut() {
            n.params_mut(&format!("{stack}.ln_final."), &mut v);
        }
        if let Some(rb) = self.rel_bias.as_mut() {
            v.push((format!("{stack}.rel_bias.table"), &mut rb.table));
        }
        if let Some(e) = self.dec_embed.as_mut() {
            e.params_mut("dec.", &mut v);
        }
        for (l, layer) in self.decoder.iter_mut().enumerate() {
            layer.params_mut(&format!("dec.blocks.{l}."), &mut v);
        }
        if let Some(o) = self.output.as_mut() {
            o.params_mut("unembed.", "U", &mut v);
        }
        let mut seen = std::collections::HashSet::new();
        v.retain(|(_, t)| seen.insert(t.data_ptr() as usize));
        v
    }

    /// [`Transformer::named_params_mut`] without the names.
    pub fn params_mut(&mut self) -> Vec<&mut Tensor> {
        self.named_params_mut().into_iter().map(|(_, t)| t).collect()
    }

    /// Replaces every weight tensor `p` (the `i`-th of [`Transformer::params_mut`]) by
    /// `f(i, p)`, keeping a tied output projection tied: the token table it shares is replaced
    /// once, and the output is that same tensor again.
    pub fn map_params(&mut self, mut f: impl FnMut(usize, &Tensor) -> Tensor) {
        let same = |a: &Tensor, b: &Tensor| a.data_ptr() == b.data_ptr() && a.size() == b.size();
        // Which token table the output is (the decoder's own, or the stack's), if any.
        let tied = self
            .output
            .as_ref()
            .map(|o| (self.dec_embed.as_ref().is_some_and(|d| same(&o.w, &d.tokens)), same(&o.w, &self.embed.tokens)));
        for (i, p) in self.params_mut().into_iter().enumerate() {
            *p = f(i, p);
        }
        let table = match tied {
            Some((true, _)) => self.dec_embed.as_ref().map(|d| d.tokens.shallow_clone()),
            Some((false, true)) => Some(self.embed.tokens.shallow_clone()),
            _ => None,
        };
        if let (Some(o), Some(t)) = (self.output.as_mut(), table) {
            o.w = t;
        }
    }
}
