//! Multi-head latent attention (DeepSeek-V2 / V3; docs/methods.md#latent-attention): the
//! queries and the keys and values come from low-rank latents, and the rotary part of every
//! head's key is one vector shared by all heads. It is [`super::nn::Attention`] with the
//! projections in front of its `W_Q`, `W_K` and `W_V` described here, as transformers'
//! `DeepseekV3Attention` computes them:
//!
//! - queries: `W_Q x` (`q_proj`), or `W_Q rms(W_Q_A x)` through a query latent of
//!   `q_lora_rank` (`q_a_proj`, `q_a_layernorm`, `q_b_proj`); each head's query is its
//!   `qk_nope_head_dim` dimensions without positions, then `qk_rope_head_dim` rotated ones;
//! - the key/value latent `c = W_KV_A x` (`kv_a_proj_with_mqa`, `kv_lora_rank + qk_rope_head_dim`
//!   wide): its first `kv_lora_rank` numbers, RMS-normed (`kv_a_layernorm`), give each head's
//!   key dimensions without positions (`W_K`, the key rows of `kv_b_proj`) and its value
//!   (`W_V`, the value rows); its last `qk_rope_head_dim` numbers are the rotary part of every
//!   head's key.
//!
//! A head is a query/output head: `hook_q`, `hook_k` (per head, the shared rotary part repeated),
//! `hook_v`, the pattern and `hook_z` (`v_head_dim` wide) are per head as in any attention, and
//! the latents are hook points of their own (`attn.hook_q_latent`, `attn.hook_kv_latent`). The
//! cache holds the latent, one per token and layer for all heads together: the layer is one
//! cache group (`Mixer::heads_per_group`), `kv_lora_rank + qk_rope_head_dim` numbers per entry.

use super::hooks::{self, At, GradRules, HookSlot, Point};
use super::nn::{Linear, Norm, Params};
use super::{Kind, ModelError};
use tch::Tensor;

/// The latent projections of one latent-attention block.
pub struct Latent {
    /// The query latent `W_Q_A` and its RMSNorm (`q_lora_rank`); `None`: `W_Q` reads `x`.
    pub q_a: Option<(Linear, Norm)>,
    /// `W_KV_A` `[kv_rank + rope, D]`.
    pub kv_a: Linear,
    /// The RMSNorm of the latent's first `kv_rank` numbers.
    pub kv_norm: Norm,
    pub kv_rank: i64,
    /// Key dimensions without positions per head (`qk_nope_head_dim`): `W_K` gives these.
    pub nope: i64,
    /// Rotary dimensions (`qk_rope_head_dim`), shared by every head's key.
    pub rope: i64,
    /// Each head's value and context width (`v_head_dim`).
    pub v_dim: i64,
}

impl Latent {
    /// What `W_Q` reads: `x`, or the normed query latent (`hook_q_latent`, before its norm).
    pub(in crate::model) fn query_input(
        &self,
        x: &Tensor,
        at: At,
        rules: GradRules,
        h: &mut HookSlot,
    ) -> Result<Tensor, ModelError> {
        match &self.q_a {
            None => Ok(x.shallow_clone()),
            Some((a, norm)) => {
                let c = hooks::at(h, At { point: Point::QLatent, ..at }, a.forward(x))?;
                Ok(norm.forward_with(&c, rules))
            }
        }
    }

    /// The keys `[B, H, T, nope + rope]` (before rotary: each head's own dimensions, then the
    /// shared rotary part) and values `[B, H, T, v_dim]` of `x [B, T, D]`, through the latent
    /// (`hook_kv_latent`, `[pos, kv_rank + rope]`, before its norm).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::model) fn keys_values(
        &self,
        x: &Tensor,
        k: &Linear,
        v: &Linear,
        n_heads: i64,
        at: At,
        rules: GradRules,
        h: &mut HookSlot,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let (b, t) = (x.size()[0], x.size()[1]);
        let c = hooks::at(h, At { point: Point::KvLatent, ..at }, self.kv_a.forward(x))?;
        let c_kv = self.kv_norm.forward_with(&c.f_narrow(-1, 0, self.kv_rank)?, rules);
        let k_own = k.forward(&c_kv).f_view([b, t, n_heads, self.nope])?;
        let k_rot =
            c.f_narrow(-1, self.kv_rank, self.rope)?.f_unsqueeze(2)?.f_expand([b, t, n_heads, self.rope], false)?;
        let keys = Tensor::f_cat(&[k_own, k_rot], -1)?.f_transpose(1, 2)?;
        let values = v.forward(&c_kv).f_view([b, t, n_heads, self.v_dim])?.f_transpose(1, 2)?;
        Ok((keys, values))
    }

    /// The numbers the cache keeps per token and layer: the latent, `kv_rank + rope`.
    pub fn numbers_per_entry(&self) -> i64 {
        self.kv_rank + self.rope
    }

    /// `W_Q_A`, `q_a_norm.w`, `W_KV_A`, `kv_a_norm.w` (and biases).
    pub(in crate::model) fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        if let Some((a, norm)) = self.q_a.as_mut() {
            a.params_mut(prefix, "Q_A", out);
            norm.params_mut(&format!("{prefix}q_a_norm."), out);
        }
        self.kv_a.params_mut(prefix, "KV_A", out);
        self.kv_norm.params_mut(&format!("{prefix}kv_a_norm."), out);
    }

    /// The latents' hook points, before the queries'.
    pub(in crate::model) fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        if self.q_a.is_some() {
            out.push(At::new(kind, layer, Point::QLatent));
        }
        out.push(At::new(kind, layer, Point::KvLatent));
    }
}
