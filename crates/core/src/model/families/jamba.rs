//! HF Jamba (`model_type` "jamba", AI21's Jamba and Jamba-1.5/1.6/1.7 Mini): a hybrid stack
//! whose layers are either Mamba ([`Mamba1`]: `mamba.in_proj`, `conv1d`, `x_proj`, `dt_proj`,
//! `dt_layernorm`, `b_layernorm`, `c_layernorm`, `A_log`, `D`, `out_proj`) or grouped-query
//! attention without positions (`self_attn.q_proj` .. `o_proj`; layer `l` attends where
//! `l % attn_layer_period == attn_layer_offset`), each followed by a SwiGLU MLP
//! (`feed_forward.gate_proj`, `up_proj`, `down_proj`) or, where `l % expert_layer_period ==
//! expert_layer_offset`, experts (`feed_forward.router`, `feed_forward.experts.E.*`; softmax over
//! every expert, the top `k` kept unnormalised, as Mixtral's block without its renormalisation).
//! RMSNorm before both sublayers (`input_layernorm`, `pre_ff_layernorm`) and at the end
//! (`model.final_layernorm`).
//!
//! A Mamba layer has no heads: its channels fall into as many groups as the attention layers
//! have heads, each group a unit (`dec.L.H` in gates and grids, docs/methods.md#mixers).

use crate::model::experts::{Expert, Experts, Routing};
use crate::model::mamba1::Mamba1;
use crate::model::mlp::Mlp;
use crate::model::nn::{Activation, Attention, Ffn, Norm, NormKind, NormPosition};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;

/// HF's `config.json` of Jamba (transformers' `JambaConfig`).
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
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    pub vocab_size: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_ff")]
    pub intermediate_size: i64,
    #[serde(default)]
    pub sliding_window: Option<i64>,
    #[serde(default = "default_top_k")]
    pub num_experts_per_tok: i64,
    #[serde(default = "default_experts")]
    pub num_experts: i64,
    #[serde(default = "two")]
    pub expert_layer_period: usize,
    #[serde(default = "one")]
    pub expert_layer_offset: usize,
    #[serde(default = "default_attn_period")]
    pub attn_layer_period: usize,
    #[serde(default = "default_attn_offset")]
    pub attn_layer_offset: usize,
    #[serde(default = "default_state")]
    pub mamba_d_state: i64,
    #[serde(default = "default_conv")]
    pub mamba_d_conv: i64,
    #[serde(default = "two_i")]
    pub mamba_expand: i64,
    /// An integer, or "auto" (`ceil(hidden_size / 16)`).
    #[serde(default)]
    pub mamba_dt_rank: Option<serde_json::Value>,
    #[serde(default = "yes")]
    pub mamba_conv_bias: bool,
    #[serde(default)]
    pub mamba_proj_bias: bool,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

// transformers' `JambaConfig` defaults.
fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-6
}
fn default_ff() -> i64 {
    14336
}
fn default_top_k() -> i64 {
    2
}
fn default_experts() -> i64 {
    16
}
fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn two_i() -> i64 {
    2
}
fn default_attn_period() -> usize {
    8
}
fn default_attn_offset() -> usize {
    4
}
fn default_state() -> i64 {
    16
}
fn default_conv() -> i64 {
    4
}
fn yes() -> bool {
    true
}

impl Config {
    /// The step's rank `R`.
    fn dt_rank(&self) -> Result<i64, String> {
        match &self.mamba_dt_rank {
            None => Ok((self.hidden_size + 15) / 16),
            Some(serde_json::Value::String(s)) if s == "auto" => Ok((self.hidden_size + 15) / 16),
            Some(v) => match v.as_i64() {
                Some(r) if r >= 1 => Ok(r),
                _ => Err(format!("mamba_dt_rank is {v}: a positive integer or \"auto\"")),
            },
        }
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

/// The Jamba Transformer from a config and tensors under HF's names.
pub fn build(cfg: &Config, cfg_file: &str, mut w: Weights) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
    let (hk, dh) = super::llama::silu_heads(&cfg.hidden_act, d, h, cfg.num_key_value_heads, None).map_err(bad)?;
    for (what, period, offset) in [
        ("attention", cfg.attn_layer_period, cfg.attn_layer_offset),
        ("expert", cfg.expert_layer_period, cfg.expert_layer_offset),
    ] {
        if offset >= period {
            return Err(bad(format!("{what} layer offset {offset} must be smaller than its period {period}")));
        }
    }
    if let Some(wnd) = cfg.sliding_window {
        return Err(bad(format!(
            "sliding_window {wnd}: Jamba's windowed attention (transformers applies it only in flash attention) is not supported"
        )));
    }
    let (k, n, r) = (cfg.mamba_d_conv, cfg.mamba_d_state, cfg.dt_rank().map_err(bad)?);
    let inner = cfg.mamba_expand * d;
    if k < 1 || n < 1 || inner < 1 || inner % h != 0 {
        return Err(bad(format!(
            "mamba_d_conv {k}, mamba_d_state {n} must be positive and mamba_expand * hidden_size = {inner} channels must fall into {h} groups (one per attention head)"
        )));
    }
    let (n_exp, top_k) = (cfg.num_experts, cfg.num_experts_per_tok);
    let eps = cfg.rms_norm_eps;
    let rms = |w: &mut Weights, name: String, width: i64| -> Result<Norm, ModelError> {
        Ok(Norm { kind: NormKind::Rms, weight: w.get(&name, &[width])?, bias: None, eps })
    };
    let mut layers = Vec::new();
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let attn_norm = rms(&mut w, format!("{p}.input_layernorm.weight"), d)?;
        let ffn_norm = rms(&mut w, format!("{p}.pre_ff_layernorm.weight"), d)?;
        let mlp: Box<dyn Mlp> = if n_exp > 1 && l % cfg.expert_layer_period == cfg.expert_layer_offset {
            if !(1..=n_exp).contains(&top_k) {
                return Err(bad(format!("num_experts_per_tok {top_k} must be between 1 and num_experts {n_exp}")));
            }
            let block = format!("{p}.feed_forward");
            let router = w.scoped(&block).linear("router", n_exp, d, false)?;
            let experts = (0..n_exp)
                .map(|e| Ok(Expert::SwiGlu(swiglu(&mut w, &format!("{block}.experts.{e}"), cfg.intermediate_size, d)?)))
                .collect::<Result<Vec<_>, ModelError>>()?;
            Box::new(Experts::new(router, experts, top_k, Routing::Softmax { renormalise: false }, None))
        } else {
            Box::new(swiglu(&mut w, &format!("{p}.feed_forward"), cfg.intermediate_size, d)?)
        };
        let layer = if l % cfg.attn_layer_period == cfg.attn_layer_offset {
            let mut s = w.scoped(&format!("{p}.self_attn"));
            let attn = Attention::new(
                s.linear("q_proj", h * dh, d, false)?,
                s.linear("k_proj", hk * dh, d, false)?,
                s.linear("v_proj", hk * dh, d, false)?,
                s.linear("o_proj", d, h * dh, false)?,
                h,
                hk,
                dh,
            );
            StackLayer::new(attn, attn_norm, mlp, ffn_norm, NormPosition::Pre)
        } else {
            let pm = format!("{p}.mamba");
            let dt_norm = Some(rms(&mut w, format!("{pm}.dt_layernorm.weight"), r)?);
            let b_norm = Some(rms(&mut w, format!("{pm}.b_layernorm.weight"), n)?);
            let c_norm = Some(rms(&mut w, format!("{pm}.c_layernorm.weight"), n)?);
            let mut s = w.scoped(&pm);
            let bias = cfg.mamba_proj_bias;
            let mamba = Mamba1 {
                groups: h,
                in_proj: s.linear("in_proj", 2 * inner, d, bias)?,
                conv: s.get("conv1d.weight", &[inner, 1, k])?,
                conv_bias: if cfg.mamba_conv_bias { Some(s.get("conv1d.bias", &[inner])?) } else { None },
                x_proj: s.linear("x_proj", r + 2 * n, inner, false)?,
                dt_proj: s.linear("dt_proj", inner, r, true)?,
                dt_norm,
                b_norm,
                c_norm,
                a_log: s.get("A_log", &[inner, n])?,
                d: s.get("D", &[inner])?,
                out_proj: s.linear("out_proj", d, inner, bias)?,
            };
            StackLayer::new(mamba, attn_norm, mlp, ffn_norm, NormPosition::Pre)
        };
        layers.push(layer);
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let output = w.output_or_tied("lm_head.weight", &tokens, cfg.tie_word_embeddings)?;
    let embed = Embeddings { tokens, scale: 1.0, positions: Positions::None, token_type: None, norm: None };
    let final_norm = rms(&mut w, "model.final_layernorm.weight".into(), d)?;
    Ok(Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        cfg.max_position_embeddings,
    ))
}
