//! HF Gemma, Gemma 2 and Gemma 3 text models (`model_type` "gemma", "gemma2", "gemma3_text"):
//! token embeddings times `sqrt(hidden_size)`, RMSNorms that scale by `1 + weight` (loaded as
//! `1 + weight`), grouped-query causal attention (Gemma 2/3: scaled by
//! `query_pre_attn_scalar^-1/2`),
//! a GeGLU MLP (`gelu_pytorch_tanh`), a final norm and the output tied to the embeddings.
//! Gemma 2 and 3 add four norms per layer (`input_layernorm`, `post_attention_layernorm`
//! after the attention, `pre_feedforward_layernorm`, `post_feedforward_layernorm` after the
//! MLP: `ln1`, `ln1_post`, `ln2`, `ln2_post`) and alternate sliding-window and global layers
//! (`layer_types`); Gemma 2 soft-caps attention scores and final logits; Gemma 3 norms each
//! head's query and key before rotary and gives its sliding layers their own rotary base
//! (`rope_local_base_freq`, unscaled; `rope_scaling` applies to the global layers). Its heads
//! are kind `dec`.

use super::hf;
use super::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition, QkNorm, RopeScaling, Rotary, Score};
use super::transformer::{EncoderLayer, Embeddings, Positions, Transformer};
use super::weights::Weights;
use super::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;
use tch::Tensor;

#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    pub head_dim: i64,
    #[serde(default)]
    pub hidden_activation: Option<String>,
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub rope_local_base_freq: Option<f64>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    pub sliding_window: Option<i64>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub sliding_window_pattern: Option<usize>,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

fn default_theta() -> f64 {
    10000.0
}

fn default_true() -> bool {
    true
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None), opts)
}

/// The model of a config and its weights under HF's names (from `config.json` and safetensors,
/// or from a GGUF's metadata and tensors, `llama_gguf`); `cfg_file` names the config in errors.
pub fn build(cfg: &Config, cfg_file: &str, mut w: Weights, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let version = match cfg.model_type.as_str() {
        "gemma" => 1,
        "gemma2" => 2,
        _ => 3,
    };
    let (d, h, dh) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim);
    let hk = cfg.num_key_value_heads.unwrap_or(h);
    if h <= 0 || hk <= 0 || h % hk != 0 {
        return Err(bad(format!("num_attention_heads {h} is not a positive multiple of num_key_value_heads {hk}")));
    }
    if dh <= 0 || dh % 2 != 0 {
        return Err(bad(format!("head_dim {dh} must be a positive even number")));
    }
    let act_name = cfg.hidden_activation.clone().or(cfg.hidden_act.clone()).unwrap_or_else(|| "gelu_pytorch_tanh".into());
    let act = match act_name.as_str() {
        "gelu_pytorch_tanh" | "gelu_new" => Activation::GeluTanh,
        "gelu" => Activation::Gelu,
        other => return Err(bad(format!("hidden_activation '{other}' is not supported (gelu_pytorch_tanh, gelu)"))),
    };
    let n = cfg.num_hidden_layers;
    // Which layers attend within the sliding window.
    let sliding: Vec<bool> = match (&cfg.layer_types, version) {
        (Some(t), _) => {
            if t.len() != n {
                return Err(bad(format!("layer_types has {} entries for {n} layers", t.len())));
            }
            t.iter()
                .map(|x| match x.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(bad(format!("layer_types: '{other}' is not a layer type (sliding_attention, full_attention)"))),
                })
                .collect::<Result<_, _>>()?
        }
        (None, 1) => vec![false; n],
        (None, 2) => (0..n).map(|i| (i + 1) % 2 != 0).collect(),
        (None, _) => {
            let p = cfg.sliding_window_pattern.unwrap_or(6).max(1);
            (0..n).map(|i| (i + 1) % p != 0).collect()
        }
    };
    if sliding.iter().any(|&s| s) && cfg.sliding_window.is_none_or(|w| w <= 0) {
        return Err(bad("sliding layers need a positive sliding_window".into()));
    }
    let global_scaling = hf::rope_scaling_for(cfg.rope_scaling.as_ref(), cfg.max_position_embeddings, None, dh).map_err(bad)?;
    let score = Score {
        // Gemma 1 scales by head_dim^-1/2 (it has no query_pre_attn_scalar).
        scale: if version == 1 { None } else { Some(cfg.query_pre_attn_scalar.unwrap_or(dh as f64).powf(-0.5)) },
        softcap: if version == 2 { cfg.attn_logit_softcapping } else { None },
    };
    let eps = cfg.rms_norm_eps;
    // Gemma's RMSNorm scales by (1 + weight).
    let norm = |w: &mut Weights, name: String, width: i64| -> Result<Norm, ModelError> {
        let weight = w.get(&name, &[width])?;
        Ok(Norm { kind: NormKind::Rms, weight: weight.ones_like() + weight, bias: None, eps })
    };
    let ff = cfg.intermediate_size;
    let mut layers = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for (l, &is_sliding) in sliding.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let proj = |w: &mut Weights, name: &str, out: i64, inp: i64, bias: bool| -> Result<Linear, ModelError> {
            let weight = w.get(&format!("{p}.{name}.weight"), &[out, inp])?;
            let b = if bias { Some(w.get(&format!("{p}.{name}.bias"), &[out])?) } else { None };
            Ok(Linear { w: weight, b })
        };
        let (base, scaling) = match (version, is_sliding) {
            (3, true) => (cfg.rope_local_base_freq.unwrap_or(10000.0), RopeScaling::None),
            _ => (cfg.rope_theta, global_scaling.clone()),
        };
        let qk_norm = if version == 3 { Some(QkNorm { q: norm(&mut w, format!("{p}.self_attn.q_norm.weight"), dh)?, k: norm(&mut w, format!("{p}.self_attn.k_norm.weight"), dh)?, per_head: true }) } else { None };
        let post_norms = if version >= 2 { Some((norm(&mut w, format!("{p}.post_attention_layernorm.weight"), d)?, norm(&mut w, format!("{p}.post_feedforward_layernorm.weight"), d)?)) } else { None };
        let ffn_norm_name = if version >= 2 { "pre_feedforward_layernorm" } else { "post_attention_layernorm" };
        layers.push(EncoderLayer {
            attn: Attention {
                q: proj(&mut w, "self_attn.q_proj", h * dh, d, cfg.attention_bias)?,
                k: proj(&mut w, "self_attn.k_proj", hk * dh, d, cfg.attention_bias)?,
                v: proj(&mut w, "self_attn.v_proj", hk * dh, d, cfg.attention_bias)?,
                o: proj(&mut w, "self_attn.o_proj", d, h * dh, cfg.attention_bias)?,
                n_heads: h,
                n_kv_heads: hk,
                head_dim: dh,
                rotary: Some(Rotary { base, dim: dh, half: true, scaling }),
                slots: None,
                qk_norm,
                score,
            },
            attn_norm: norm(&mut w, format!("{p}.input_layernorm.weight"), d)?,
            ffn: Ffn {
                up: proj(&mut w, "mlp.up_proj", ff, d, false)?,
                down: proj(&mut w, "mlp.down_proj", d, ff, false)?,
                act,
                gate: Some(proj(&mut w, "mlp.gate_proj", ff, d, false)?),
            },
            ffn_norm: norm(&mut w, format!("{p}.{ffn_norm_name}.weight"), d)?,
            norm_position: NormPosition::Pre,
            post_norms,
            window: if is_sliding { cfg.sliding_window } else { None },
        });
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let output = if cfg.tie_word_embeddings && w.shape("lm_head.weight").is_none() { tokens.shallow_clone() } else { w.get("lm_head.weight", &[cfg.vocab_size, d])? };
    // As transformers: the multiplier sqrt(hidden_size) is taken in the model's precision.
    let scale = Tensor::from((d as f64).sqrt()).to_kind(opts.dtype).double_value(&[]);
    let embed = Embeddings { tokens, scale, positions: Positions::None, token_type: None, norm: None };
    let final_norm = norm(&mut w, "model.norm.weight".into(), d)?;
    let mut net = Transformer::decoder_only(embed, layers, Some(final_norm), output, hf::first_id(&cfg.eos_token_id).unwrap_or(1));
    net.logit_softcap = if version == 2 { cfg.final_logit_softcapping } else { None };
    Ok(net)
}
