//! HF LFM2 (`model_type` "lfm2", Liquid AI's LFM2-350M/700M/1.2B/2.6B): a hybrid stack whose
//! layers are either a gated short convolution ([`ShortConv`], `layer_types` "conv") or
//! grouped-query attention with an RMSNorm of each head's query and key before rotary
//! (`self_attn.q_layernorm`, `k_layernorm`; "full_attention"), each followed by a SwiGLU MLP
//! (`feed_forward.w1`, `w3`, `w2`), RMSNorm before both sublayers (`operator_norm`,
//! `ffn_norm`), a final norm (`model.embedding_norm`) and the embeddings tied to the output.
//! Only the attention layers have heads (kind `dec`); a conv layer's row in gates and grids is
//! empty (docs/methods.md#mixers). transformers' original config keys (`block_ff_dim`,
//! `theta`, `tie_embedding`, `full_attn_idxs`) are read where they take precedence there.

use crate::model::nn::{Activation, Attention, Ffn, Norm, NormKind, NormPosition, QkNorm, RopeScaling, Rotary};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::shortconv::ShortConv;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;

/// HF's `config.json` of LFM2 (transformers' `Lfm2Config`).
#[derive(Debug, Deserialize)]
pub struct Config {
    pub hidden_size: i64,
    #[serde(default = "default_ff")]
    pub intermediate_size: i64,
    /// The original key of the MLP width, read before `intermediate_size`.
    #[serde(default)]
    pub block_ff_dim: Option<i64>,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    #[serde(default = "default_eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// The original key of the rotary base, read before `rope_theta`.
    #[serde(default)]
    pub theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    pub vocab_size: i64,
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
    /// The original key of the tying, read before `tie_word_embeddings`.
    #[serde(default)]
    pub tie_embedding: Option<bool>,
    #[serde(default)]
    pub conv_bias: bool,
    #[serde(default = "default_taps", rename = "conv_L_cache")]
    pub conv_l_cache: i64,
    #[serde(default = "default_multiple")]
    pub block_multiple_of: i64,
    #[serde(default = "default_multiplier")]
    pub block_ffn_dim_multiplier: Option<f64>,
    #[serde(default = "yes")]
    pub block_auto_adjust_ff_dim: bool,
    #[serde(default)]
    pub full_attn_idxs: Option<Vec<usize>>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

// transformers' `Lfm2Config` defaults.
fn default_ff() -> i64 {
    12288
}
fn default_eps() -> f64 {
    1e-5
}
fn yes() -> bool {
    true
}
fn default_taps() -> i64 {
    3
}
fn default_multiple() -> i64 {
    256
}
fn default_multiplier() -> Option<f64> {
    Some(1.0)
}
/// The rotary base where the config gives none.
const DEFAULT_THETA: f64 = 1e6;

impl Config {
    /// The MLP's width as transformers' `Lfm2MLP` computes it: with `block_auto_adjust_ff_dim`,
    /// two thirds of the given width, times `block_ffn_dim_multiplier` and rounded up to a
    /// multiple of `block_multiple_of` (the last two only with a multiplier).
    pub fn mlp_width(&self) -> Result<i64, String> {
        let mut w = self.block_ff_dim.unwrap_or(self.intermediate_size);
        if self.block_auto_adjust_ff_dim {
            w = 2 * w / 3;
            if let Some(m) = self.block_ffn_dim_multiplier {
                let of = self.block_multiple_of;
                if of <= 0 {
                    return Err(format!("block_multiple_of {of} must be positive"));
                }
                w = (m * w as f64) as i64;
                w = of * ((w + of - 1) / of);
            }
        }
        if w <= 0 {
            return Err(format!("the MLP width {w} (block_ff_dim / intermediate_size, adjusted) must be positive"));
        }
        Ok(w)
    }

    /// Each layer's kind: `true` for attention. `layer_types` when given, else
    /// `full_attn_idxs` (every layer when neither is).
    pub fn attention_layers(&self) -> Result<Vec<bool>, String> {
        let n = self.num_hidden_layers;
        match (&self.layer_types, &self.full_attn_idxs) {
            (Some(t), _) => hf::attention_layer_types(t, n, "lfm2", "full_attention", "conv"),
            (None, Some(idx)) => {
                if let Some(i) = idx.iter().find(|&&i| i >= n) {
                    return Err(format!("full_attn_idxs holds {i}, past the {n} layers"));
                }
                Ok((0..n).map(|l| idx.contains(&l)).collect())
            }
            (None, None) => Ok(vec![true; n]),
        }
    }
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None))
}

/// The LFM2 Transformer from a config and tensors under HF's names.
pub fn build(cfg: &Config, cfg_file: &str, mut w: Weights) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
    let (hk, dh) = super::llama::silu_heads("silu", d, h, cfg.num_key_value_heads, None).map_err(bad)?;
    let ff = cfg.mlp_width().map_err(bad)?;
    let attention = cfg.attention_layers().map_err(bad)?;
    let k = cfg.conv_l_cache;
    if k < 1 {
        return Err(bad(format!("conv_L_cache {k} must be at least 1")));
    }
    let rope = hf::rope_settings(
        None,
        hf::Rope4 {
            theta: cfg.theta.or(cfg.rope_theta),
            scaling: cfg.rope_scaling.as_ref(),
            partial_rotary_factor: None,
        },
        "full_attention",
    )
    .map_err(bad)?;
    let scaling = rope.scaling_for(cfg.max_position_embeddings, None, dh).map_err(bad)?;
    let max_positions = cfg.max_position_embeddings.filter(|_| !matches!(scaling, RopeScaling::Dynamic { .. }));
    let theta = rope.theta.unwrap_or(DEFAULT_THETA);
    let eps = cfg.norm_eps;
    let rms = |w: &mut Weights, name: String, n: i64| -> Result<Norm, ModelError> {
        Ok(Norm { kind: NormKind::Rms, weight: w.get(&name, &[n])?, bias: None, eps })
    };
    let mut layers = Vec::new();
    for (l, &attends) in attention.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let attn_norm = rms(&mut w, format!("{p}.operator_norm.weight"), d)?;
        let ffn_norm = rms(&mut w, format!("{p}.ffn_norm.weight"), d)?;
        let mut s = w.scoped(&p);
        let mlp = Ffn {
            gate: Some(s.linear("feed_forward.w1", ff, d, false)?),
            up: s.linear("feed_forward.w3", ff, d, false)?,
            down: s.linear("feed_forward.w2", d, ff, false)?,
            act: Activation::Silu,
        };
        let layer = if attends {
            let attn = Attention::new(
                s.linear("self_attn.q_proj", h * dh, d, false)?,
                s.linear("self_attn.k_proj", hk * dh, d, false)?,
                s.linear("self_attn.v_proj", hk * dh, d, false)?,
                s.linear("self_attn.out_proj", d, h * dh, false)?,
                h,
                hk,
                dh,
            )
            .with_rotary(Some(Rotary { base: theta, dim: dh, offset: 0, half: true, scaling: scaling.clone() }))
            .with_qk_norm(Some(QkNorm {
                q: Norm { kind: NormKind::Rms, weight: s.get("self_attn.q_layernorm.weight", &[dh])?, bias: None, eps },
                k: Norm { kind: NormKind::Rms, weight: s.get("self_attn.k_layernorm.weight", &[dh])?, bias: None, eps },
                per_head: true,
            }));
            StackLayer::new(attn, attn_norm, mlp, ffn_norm, NormPosition::Pre)
        } else {
            let conv = ShortConv {
                in_proj: s.linear("conv.in_proj", 3 * d, d, cfg.conv_bias)?,
                conv: s.get("conv.conv.weight", &[d, 1, k])?,
                conv_bias: if cfg.conv_bias { Some(s.get("conv.conv.bias", &[d])?) } else { None },
                out_proj: s.linear("conv.out_proj", d, d, cfg.conv_bias)?,
            };
            StackLayer::new(conv, attn_norm, mlp, ffn_norm, NormPosition::Pre)
        };
        layers.push(layer);
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let tie = cfg.tie_embedding.unwrap_or(cfg.tie_word_embeddings);
    let output = w.output_or_tied("lm_head.weight", &tokens, tie)?;
    let embed = Embeddings { tokens, scale: 1.0, positions: Positions::None, token_type: None, norm: None };
    let final_norm = rms(&mut w, "model.embedding_norm.weight".into(), d)?;
    Ok(Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        max_positions,
    ))
}
