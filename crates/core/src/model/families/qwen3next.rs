//! HF Qwen3-Next (`model_type` "qwen3_next", Qwen3-Next-80B-A3B): a hybrid stack whose layers
//! are either a gated DeltaNet layer ([`DeltaNet`], `layer_types` "linear_attention":
//! `linear_attn.in_proj_qkvz`, `in_proj_ba`, `conv1d`, `dt_bias`, `A_log`, `norm`, `out_proj`)
//! or gated grouped-query attention ("full_attention": `self_attn.q_proj` holds each head's query
//! rows then its output gate's rows, split here into `W_Q` and `W_G`; per-head q/k norms;
//! rotary on the first `partial_rotary_factor` of each head), each followed by a SwiGLU MLP or,
//! on the layers `decoder_sparse_step` and `mlp_only_layers` give, experts (`mlp.gate`,
//! `mlp.experts.E.{gate,up,down}_proj`, softmax routing renormalised with `norm_topk_prob`) with a
//! sigmoid-gated shared expert (`mlp.shared_expert`, `mlp.shared_expert_gate`), as Qwen2-MoE.
//!
//! Its RMSNorms scale by `1 + weight` (zero-centred; loaded as `1 + weight`, as Gemma's), except
//! the DeltaNet's gated norm (`linear_attn.norm`, scaled by its weight).
//!
//! The attention layers' heads are attention heads; a DeltaNet layer's heads are its value
//! heads (`dec.L.H` in gates and grids, docs/methods.md#mixers).

use crate::model::deltanet::{DeltaNet, Shape};
use crate::model::experts::{Expert, Experts, Routing};
use crate::model::mlp::Mlp;
use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition, QkNorm, Rotary};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;
use tch::Tensor;

/// HF's `config.json` of Qwen3-Next (transformers' `Qwen3NextConfig`).
#[derive(Debug, Deserialize)]
pub struct Config {
    pub hidden_size: i64,
    pub num_hidden_layers: usize,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i64,
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: i64,
    #[serde(default = "default_head_dim")]
    pub head_dim: i64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_partial")]
    pub partial_rotary_factor: f64,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    pub vocab_size: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_ff")]
    pub intermediate_size: i64,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "default_interval")]
    pub full_attention_interval: usize,
    #[serde(default = "default_conv")]
    pub linear_conv_kernel_dim: i64,
    #[serde(default = "default_linear_dim")]
    pub linear_key_head_dim: i64,
    #[serde(default = "default_linear_dim")]
    pub linear_value_head_dim: i64,
    #[serde(default = "default_linear_k_heads")]
    pub linear_num_key_heads: i64,
    #[serde(default = "default_linear_v_heads")]
    pub linear_num_value_heads: i64,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default = "default_moe_ff")]
    pub moe_intermediate_size: i64,
    #[serde(default = "default_moe_ff")]
    pub shared_expert_intermediate_size: i64,
    #[serde(default = "default_top_k")]
    pub num_experts_per_tok: i64,
    #[serde(default = "default_experts")]
    pub num_experts: i64,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

// transformers' `Qwen3NextConfig` defaults.
fn default_heads() -> i64 {
    16
}
fn default_kv_heads() -> i64 {
    2
}
fn default_head_dim() -> i64 {
    256
}
fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-6
}
fn default_partial() -> f64 {
    0.25
}
fn default_ff() -> i64 {
    5632
}
fn default_interval() -> usize {
    4
}
fn default_conv() -> i64 {
    4
}
fn default_linear_dim() -> i64 {
    128
}
fn default_linear_k_heads() -> i64 {
    16
}
fn default_linear_v_heads() -> i64 {
    32
}
fn one() -> usize {
    1
}
fn default_moe_ff() -> i64 {
    512
}
fn default_top_k() -> i64 {
    10
}
fn default_experts() -> i64 {
    512
}
fn yes() -> bool {
    true
}

impl Config {
    /// Each layer's kind: `true` for attention. `layer_types` ("linear_attention" /
    /// "full_attention"), or every `full_attention_interval`-th layer attention when absent (as
    /// transformers).
    pub fn attention_layers(&self) -> Result<Vec<bool>, String> {
        let n = self.num_hidden_layers;
        match &self.layer_types {
            Some(t) => hf::attention_layer_types(t, n, "qwen3_next", "full_attention", "linear_attention"),
            None if self.full_attention_interval == 0 => Err("full_attention_interval must be at least 1".into()),
            None => Ok((0..n).map(|l| (l + 1) % self.full_attention_interval == 0).collect()),
        }
    }

    /// The gated DeltaNet layers' shape.
    pub fn linear_shape(&self) -> Result<Shape, String> {
        let shape = Shape {
            heads: self.linear_num_value_heads,
            key_heads: self.linear_num_key_heads,
            key_dim: self.linear_key_head_dim,
            head_dim: self.linear_value_head_dim,
        };
        shape.check()?;
        Ok(shape)
    }

    /// Whether layer `l` holds experts (transformers' `Qwen3NextDecoderLayer`).
    fn sparse(&self, l: usize) -> bool {
        !self.mlp_only_layers.contains(&l) && self.num_experts > 0 && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None))
}

/// A SwiGLU under `at` (`gate_proj`, `up_proj`, `down_proj`, no biases).
fn swiglu(w: &mut Weights, at: &str, width: i64, d: i64) -> Result<Ffn, ModelError> {
    let mut s = w.scoped(at);
    Ok(Ffn {
        gate: Some(s.linear("gate_proj", width, d, false)?),
        up: s.linear("up_proj", width, d, false)?,
        down: s.linear("down_proj", d, width, false)?,
        act: Activation::Silu,
    })
}

/// The query rows and the output gate's rows of Qwen3-Next's `q_proj [H 2 dh, D]` (per head
/// its `dh` query rows, then its `dh` gate rows).
fn split_queries(q: Linear, h: i64, dh: i64) -> Result<(Linear, Linear), ModelError> {
    let half = |t: &Tensor, first: i64| -> Result<Tensor, ModelError> {
        let rest = t.size()[1..].to_vec();
        let mut shape = vec![h, 2, dh];
        shape.extend(&rest);
        let mut out = vec![h * dh];
        out.extend(&rest);
        Ok(t.f_reshape(&shape)?.f_select(1, first)?.f_reshape(&out)?.f_contiguous()?)
    };
    let bias = |first: i64| q.b.as_ref().map(|b| half(b, first)).transpose();
    Ok((Linear { w: half(&q.w, 0)?, b: bias(0)? }, Linear { w: half(&q.w, 1)?, b: bias(1)? }))
}

/// The Qwen3-Next Transformer from a config and tensors under HF's names.
pub fn build(cfg: &Config, cfg_file: &str, mut w: Weights) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let (d, h, dh) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim);
    let (hk, _) =
        super::llama::silu_heads(&cfg.hidden_act, d, h, Some(cfg.num_key_value_heads), Some(dh)).map_err(bad)?;
    let attention = cfg.attention_layers().map_err(bad)?;
    let shape = if attention.iter().all(|&a| a) { None } else { Some(cfg.linear_shape().map_err(bad)?) };
    let taps = cfg.linear_conv_kernel_dim;
    if taps < 1 {
        return Err(bad(format!("linear_conv_kernel_dim {taps} must be at least 1")));
    }
    let f = cfg.partial_rotary_factor;
    if !(0.0..=1.0).contains(&f) {
        return Err(bad(format!("partial_rotary_factor {f} must be in [0, 1]")));
    }
    let rope_dim = (dh as f64 * f) as i64;
    if rope_dim % 2 != 0 {
        return Err(bad(format!("{rope_dim} rotary dimensions per head (partial_rotary_factor of {dh}) is not even")));
    }
    let rope = hf::rope_settings(
        None,
        hf::Rope4 { theta: cfg.rope_theta, scaling: cfg.rope_scaling.as_ref(), partial_rotary_factor: Some(f) },
        "full_attention",
    )
    .map_err(bad)?;
    let scaling = rope.scaling_for(cfg.max_position_embeddings, None, rope_dim).map_err(bad)?;
    let rotary = Rotary { base: rope.theta.unwrap_or(10000.0), dim: rope_dim, offset: 0, half: true, scaling };
    let (n_exp, top_k) = (cfg.num_experts, cfg.num_experts_per_tok);
    if n_exp > 0 && !(1..=n_exp).contains(&top_k) {
        return Err(bad(format!("num_experts_per_tok {top_k} must be between 1 and num_experts {n_exp}")));
    }
    if cfg.decoder_sparse_step == 0 {
        return Err(bad("decoder_sparse_step 0: no layer could have experts".into()));
    }
    let eps = cfg.rms_norm_eps;
    // Zero-centred RMSNorms: scaled by 1 + weight.
    let norm = |w: &mut Weights, name: String, width: i64| -> Result<Norm, ModelError> {
        let weight = w.get(&name, &[width])?;
        Ok(Norm { kind: NormKind::Rms, weight: weight.f_add_scalar(1.0)?, bias: None, eps })
    };
    let mut layers = Vec::new();
    for (l, &attends) in attention.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let attn_norm = norm(&mut w, format!("{p}.input_layernorm.weight"), d)?;
        let ffn_norm = norm(&mut w, format!("{p}.post_attention_layernorm.weight"), d)?;
        let mlp: Box<dyn Mlp> = if cfg.sparse(l) {
            let block = format!("{p}.mlp");
            let router = w.scoped(&block).linear("gate", n_exp, d, false)?;
            let experts = (0..n_exp)
                .map(|e| {
                    Ok(Expert::SwiGlu(swiglu(&mut w, &format!("{block}.experts.{e}"), cfg.moe_intermediate_size, d)?))
                })
                .collect::<Result<Vec<_>, ModelError>>()?;
            let shared = (
                swiglu(&mut w, &format!("{block}.shared_expert"), cfg.shared_expert_intermediate_size, d)?,
                Some(w.scoped(&block).linear("shared_expert_gate", 1, d, false)?),
            );
            let routing = Routing::Softmax { renormalise: cfg.norm_topk_prob };
            Box::new(Experts::new(router, experts, top_k, routing, Some(shared)))
        } else {
            Box::new(swiglu(&mut w, &format!("{p}.mlp"), cfg.intermediate_size, d)?)
        };
        let layer = match shape {
            Some(shape) if !attends => {
                let mut s = w.scoped(&format!("{p}.linear_attn"));
                let (nk, dk, nv, dv) = (shape.key_heads, shape.key_dim, shape.heads, shape.head_dim);
                let delta = DeltaNet {
                    shape,
                    in_qkvz: s.linear("in_proj_qkvz", 2 * nk * dk + 2 * nv * dv, d, false)?,
                    in_ba: s.linear("in_proj_ba", 2 * nv, d, false)?,
                    conv: s.get("conv1d.weight", &[shape.conv_channels(), 1, taps])?,
                    dt_bias: s.get("dt_bias", &[nv])?,
                    a_log: s.get("A_log", &[nv])?,
                    norm: s.get("norm.weight", &[dv])?,
                    eps,
                    out_proj: s.linear("out_proj", d, nv * dv, false)?,
                };
                StackLayer::new(delta, attn_norm, mlp, ffn_norm, NormPosition::Pre)
            }
            _ => {
                let ab = cfg.attention_bias;
                let qk_norm = QkNorm {
                    q: norm(&mut w, format!("{p}.self_attn.q_norm.weight"), dh)?,
                    k: norm(&mut w, format!("{p}.self_attn.k_norm.weight"), dh)?,
                    per_head: true,
                };
                let mut s = w.scoped(&p);
                let (q, gate) = split_queries(s.linear("self_attn.q_proj", 2 * h * dh, d, ab)?, h, dh)?;
                let attn = Attention::new(
                    q,
                    s.linear("self_attn.k_proj", hk * dh, d, ab)?,
                    s.linear("self_attn.v_proj", hk * dh, d, ab)?,
                    s.linear("self_attn.o_proj", d, h * dh, ab)?,
                    h,
                    hk,
                    dh,
                )
                .with_rotary(Some(rotary.clone()))
                .with_qk_norm(Some(qk_norm))
                .with_out_gate(Some(gate));
                StackLayer::new(attn, attn_norm, mlp, ffn_norm, NormPosition::Pre)
            }
        };
        layers.push(layer);
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let output = w.output_or_tied("lm_head.weight", &tokens, cfg.tie_word_embeddings)?;
    let embed = Embeddings { tokens, scale: 1.0, positions: Positions::None, token_type: None, norm: None };
    let final_norm = norm(&mut w, "model.norm.weight".into(), d)?;
    Ok(Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        cfg.max_position_embeddings,
    ))
}
