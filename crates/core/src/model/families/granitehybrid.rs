//! HF Granite-4.0-H (`model_type` "granitemoehybrid", IBM's granite-4.0-h-350m/1b/micro/tiny/
//! small): a hybrid stack whose layers are either a Mamba-2 layer ([`Mamba2`], `layer_types`
//! "mamba": `mamba.in_proj`, `conv1d`, `dt_bias`, `A_log`, `D`, `norm`, `out_proj`) or
//! grouped-query attention (`self_attn.q_proj` .. `o_proj`, scores scaled by
//! `attention_multiplier`, rotary only where `position_embedding_type` is "rope"), each followed
//! by a shared SwiGLU MLP (`shared_mlp.input_linear` holds the gate's rows then the up rows,
//! `output_linear`) and, with `num_local_experts > 0`, experts beside it
//! (`block_sparse_moe.router.layer`, `input_linear [E, 2F, D]`, `output_linear [E, D, F]`; the
//! top-k logits softmaxed). RMSNorm before both sublayers (`input_layernorm`,
//! `post_attention_layernorm`) and at the end (`model.norm`).
//!
//! Granite's multipliers fold into the weights as loaded, so hook values carry them:
//! `embedding_multiplier` is the embeddings' scale; `residual_multiplier` scales every
//! sublayer's last projection (`o_proj`, `out_proj`, `output_linear`, each expert's
//! `output_linear`), so `hook_attn_out` and `hook_mlp_out` are what the residual adds; the
//! logits' divisor `logits_scaling` divides the final norm's weight (`ln_final.hook_normalized`
//! is the unembedding's input).
//!
//! Only the attention layers have attention heads; a Mamba-2 layer's heads are its
//! state-space heads (`dec.L.H` in gates and grids, docs/methods.md#mixers).

use crate::model::experts::{Expert, Experts, Routing};
use crate::model::mamba2::{Mamba2, Shape};
use crate::model::mlp::Mlp;
use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition, Rotary, Score};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;

/// HF's `config.json` of Granite-4.0-H (transformers' `GraniteMoeHybridConfig`).
#[derive(Debug, Deserialize)]
pub struct Config {
    pub hidden_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    pub vocab_size: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "one")]
    pub embedding_multiplier: f64,
    #[serde(default = "one")]
    pub logits_scaling: f64,
    #[serde(default = "one")]
    pub residual_multiplier: f64,
    #[serde(default = "one")]
    pub attention_multiplier: f64,
    #[serde(default = "default_experts")]
    pub num_local_experts: i64,
    #[serde(default = "default_top_k")]
    pub num_experts_per_tok: i64,
    #[serde(default = "default_ff")]
    pub intermediate_size: i64,
    #[serde(default = "default_shared")]
    pub shared_intermediate_size: i64,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "default_mamba_heads")]
    pub mamba_n_heads: i64,
    #[serde(default = "one_i")]
    pub mamba_n_groups: i64,
    #[serde(default = "default_state")]
    pub mamba_d_state: i64,
    /// An integer, or "auto" (`mamba_expand * hidden_size / mamba_n_heads`).
    #[serde(default)]
    pub mamba_d_head: Option<serde_json::Value>,
    #[serde(default = "default_conv")]
    pub mamba_d_conv: i64,
    #[serde(default = "default_expand")]
    pub mamba_expand: f64,
    #[serde(default = "yes")]
    pub mamba_conv_bias: bool,
    #[serde(default)]
    pub mamba_proj_bias: bool,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

// transformers' `GraniteMoeHybridConfig` defaults.
fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn one() -> f64 {
    1.0
}
fn one_i() -> i64 {
    1
}
fn yes() -> bool {
    true
}
fn default_experts() -> i64 {
    8
}
fn default_top_k() -> i64 {
    2
}
fn default_ff() -> i64 {
    11008
}
fn default_shared() -> i64 {
    1024
}
fn default_mamba_heads() -> i64 {
    128
}
fn default_state() -> i64 {
    256
}
fn default_conv() -> i64 {
    4
}
fn default_expand() -> f64 {
    2.0
}

impl Config {
    /// Each layer's kind: `true` for attention. `layer_types` ("mamba" / "attention"; every
    /// layer attention when absent, as transformers' `layers_block_type`).
    pub fn attention_layers(&self) -> Result<Vec<bool>, String> {
        let n = self.num_hidden_layers;
        let Some(t) = &self.layer_types else { return Ok(vec![true; n]) };
        hf::attention_layer_types(t, n, "granitemoehybrid", "attention", "mamba")
    }

    /// The Mamba-2 layers' shape (the gated norm over all `I` channels at once, as
    /// transformers' `GraniteMoeHybridRMSNormGated`).
    pub fn mamba_shape(&self) -> Result<Shape, String> {
        let inner = (self.mamba_expand * self.hidden_size as f64) as i64;
        let heads = self.mamba_n_heads;
        if heads < 1 || inner % heads != 0 {
            return Err(format!("mamba_n_heads {heads} must divide mamba_expand * hidden_size = {inner}"));
        }
        let head_dim = match &self.mamba_d_head {
            None => inner / heads,
            Some(serde_json::Value::String(s)) if s == "auto" => inner / heads,
            Some(v) => v.as_i64().ok_or_else(|| format!("mamba_d_head is {v}: an integer or \"auto\""))?,
        };
        if head_dim * heads != inner {
            return Err(format!(
                "mamba_d_head {head_dim} x mamba_n_heads {heads} is not mamba_expand * hidden_size = {inner}"
            ));
        }
        let shape = Shape { heads, head_dim, groups: self.mamba_n_groups, state: self.mamba_d_state, norm_groups: 1 };
        shape.check()?;
        Ok(shape)
    }
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None))
}

/// `lin` with its output scaled by `m` (a multiplier folded in).
fn scaled(lin: Linear, m: f64) -> Result<Linear, ModelError> {
    if m == 1.0 {
        return Ok(lin);
    }
    Ok(Linear { w: lin.w.f_mul_scalar(m)?, b: lin.b.map(|b| b.f_mul_scalar(m)).transpose()? })
}

/// Rows `[from, from + n)` of a stacked projection, as its own linear layer.
fn rows(w: &tch::Tensor, from: i64, n: i64) -> Result<Linear, ModelError> {
    Ok(Linear { w: w.f_narrow(0, from, n)?.f_contiguous()?, b: None })
}

/// A SwiGLU from Granite's fused `input_linear [2F, D]` (the gate's rows first) and
/// `output_linear [D, F]` (times the residual multiplier).
fn fused_swiglu(input: &tch::Tensor, output: &tch::Tensor, f: i64, m: f64) -> Result<Ffn, ModelError> {
    Ok(Ffn {
        gate: Some(rows(input, 0, f)?),
        up: rows(input, f, f)?,
        down: scaled(Linear { w: output.shallow_clone(), b: None }, m)?,
        act: Activation::Silu,
    })
}

/// The Granite-4.0-H Transformer from a config and tensors under HF's names.
pub fn build(cfg: &Config, cfg_file: &str, mut w: Weights) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
    let (hk, dh) = super::llama::silu_heads(&cfg.hidden_act, d, h, cfg.num_key_value_heads, None).map_err(bad)?;
    let attention = cfg.attention_layers().map_err(bad)?;
    let shape = if attention.iter().all(|&a| a) { None } else { Some(cfg.mamba_shape().map_err(bad)?) };
    let k = cfg.mamba_d_conv;
    if k < 1 {
        return Err(bad(format!("mamba_d_conv {k} must be at least 1")));
    }
    let rotary = match cfg.position_embedding_type.as_deref() {
        Some("rope") => {
            let rope = hf::rope_settings(
                None,
                hf::Rope4 {
                    theta: Some(cfg.rope_theta),
                    scaling: cfg.rope_scaling.as_ref(),
                    partial_rotary_factor: None,
                },
                "full_attention",
            )
            .map_err(bad)?;
            let scaling = rope.scaling_for(cfg.max_position_embeddings, None, dh).map_err(bad)?;
            Some(Rotary { base: rope.theta.unwrap_or(cfg.rope_theta), dim: dh, offset: 0, half: true, scaling })
        }
        None | Some("nope") => None,
        Some(other) => return Err(bad(format!("position_embedding_type is '{other}': 'rope' or 'nope'"))),
    };
    let (eps, m) = (cfg.rms_norm_eps, cfg.residual_multiplier);
    let (n_exp, top_k) = (cfg.num_local_experts, cfg.num_experts_per_tok);
    if n_exp > 0 && !(1..=n_exp).contains(&top_k) {
        return Err(bad(format!("num_experts_per_tok {top_k} must be between 1 and num_local_experts {n_exp}")));
    }
    let rms = |w: &mut Weights, name: String| -> Result<Norm, ModelError> {
        Ok(Norm { kind: NormKind::Rms, weight: w.get(&name, &[d])?, bias: None, eps })
    };
    let mut layers = Vec::new();
    for (l, &attends) in attention.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let attn_norm = rms(&mut w, format!("{p}.input_layernorm.weight"))?;
        let ffn_norm = rms(&mut w, format!("{p}.post_attention_layernorm.weight"))?;
        let fs = cfg.shared_intermediate_size;
        let shared = {
            let mut s = w.scoped(&p);
            let input = s.get("shared_mlp.input_linear.weight", &[2 * fs, d])?;
            let output = s.get("shared_mlp.output_linear.weight", &[d, fs])?;
            fused_swiglu(&input, &output, fs, m)?
        };
        let mlp: Box<dyn Mlp> = if n_exp > 0 {
            let f = cfg.intermediate_size;
            let mut s = w.scoped(&format!("{p}.block_sparse_moe"));
            let router = s.linear("router.layer", n_exp, d, false)?;
            let input = s.get("input_linear.weight", &[n_exp, 2 * f, d])?;
            let output = s.get("output_linear.weight", &[n_exp, d, f])?;
            let experts = (0..n_exp)
                .map(|e| Ok(Expert::SwiGlu(fused_swiglu(&input.f_get(e)?, &output.f_get(e)?, f, m)?)))
                .collect::<Result<Vec<_>, ModelError>>()?;
            Box::new(Experts::new(router, experts, top_k, Routing::TopKSoftmax, Some((shared, None))))
        } else {
            Box::new(shared)
        };
        let mut s = w.scoped(&p);
        let layer = match shape {
            Some(shape) if !attends => {
                let (inner, cd) = (shape.inner(), shape.conv_channels());
                let bias = cfg.mamba_proj_bias;
                let mamba = Mamba2 {
                    shape,
                    in_proj: s.linear("mamba.in_proj", inner + cd + shape.heads, d, bias)?,
                    conv: s.get("mamba.conv1d.weight", &[cd, 1, k])?,
                    conv_bias: if cfg.mamba_conv_bias { Some(s.get("mamba.conv1d.bias", &[cd])?) } else { None },
                    dt_bias: s.get("mamba.dt_bias", &[shape.heads])?,
                    a_log: s.get("mamba.A_log", &[shape.heads])?,
                    d: s.get("mamba.D", &[shape.heads])?,
                    norm: Some(s.get("mamba.norm.weight", &[inner])?),
                    eps,
                    out_proj: scaled(s.linear("mamba.out_proj", d, inner, bias)?, m)?,
                    dt_limit: (0.0, f64::INFINITY),
                };
                StackLayer::new(mamba, attn_norm, mlp, ffn_norm, NormPosition::Pre)
            }
            _ => {
                let ab = cfg.attention_bias;
                let attn = Attention::new(
                    s.linear("self_attn.q_proj", h * dh, d, ab)?,
                    s.linear("self_attn.k_proj", hk * dh, d, ab)?,
                    s.linear("self_attn.v_proj", hk * dh, d, ab)?,
                    scaled(s.linear("self_attn.o_proj", d, h * dh, ab)?, m)?,
                    h,
                    hk,
                    dh,
                )
                .with_rotary(rotary.clone())
                .with_score(Score { scale: Some(cfg.attention_multiplier), softcap: None });
                StackLayer::new(attn, attn_norm, mlp, ffn_norm, NormPosition::Pre)
            }
        };
        layers.push(layer);
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let output = w.output_or_tied("lm_head.weight", &tokens, cfg.tie_word_embeddings)?;
    if cfg.logits_scaling == 0.0 || !cfg.logits_scaling.is_finite() {
        return Err(bad(format!("logits_scaling {} must be a finite non-zero number", cfg.logits_scaling)));
    }
    let embed = Embeddings {
        tokens,
        scale: cfg.embedding_multiplier,
        positions: Positions::None,
        token_type: None,
        norm: None,
    };
    let mut final_norm = rms(&mut w, "model.norm.weight".into())?;
    final_norm.weight = final_norm.weight.f_div_scalar(cfg.logits_scaling)?;
    Ok(Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        cfg.max_position_embeddings,
    ))
}
