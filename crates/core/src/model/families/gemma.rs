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

use crate::model::nn::{Activation, Attention, Ffn, Norm, NormKind, NormPosition, QkNorm, Rotary, Score};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
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
    /// transformers 4's base (10000 when absent); transformers 5 writes `rope_parameters`.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// transformers 5's rotary settings: flat, or per layer type (Gemma 3).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
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

/// The base when a config gives none (transformers' Gemma and Gemma 2 configs' default, and
/// Gemma 3's on its sliding layers).
pub const DEFAULT_THETA: f64 = 10000.0;
/// Gemma 3's global base when its config gives none.
pub const GEMMA3_THETA: f64 = 1_000_000.0;

impl Config {
    /// The rotary settings of the global layers, and of the sliding ones: transformers 5's entry
    /// of each layer type where `rope_parameters` is keyed by them; else Gemma 3's sliding
    /// layers use `rope_local_base_freq` (10000 when absent) unscaled, Gemma 1/2's the global
    /// settings.
    pub fn ropes(&self) -> Result<(hf::Rope, hf::Rope), String> {
        let version = if self.model_type.starts_with("gemma3") { 3 } else { 0 };
        let old =
            hf::Rope4 { theta: self.rope_theta, scaling: self.rope_scaling.as_ref(), partial_rotary_factor: None };
        let global = hf::rope_settings(self.rope_parameters.as_ref(), old, "full_attention")?;
        let per_type = self
            .rope_parameters
            .as_ref()
            .and_then(|p| p.as_object())
            .is_some_and(|o| o.keys().any(|k| hf::LAYER_TYPES.contains(&k.as_str())));
        let sliding = if per_type {
            hf::rope_settings(self.rope_parameters.as_ref(), old, "sliding_attention")?
        } else if version == 3 {
            hf::Rope {
                theta: Some(self.rope_local_base_freq.unwrap_or(DEFAULT_THETA)),
                scaling: None,
                partial_rotary_factor: None,
                source: "rope_local_base_freq",
            }
        } else {
            global.clone()
        };
        if self.rope_local_base_freq.is_some() && per_type && sliding.theta != self.rope_local_base_freq {
            return Err(format!(
                "rope_local_base_freq is {} but rope_parameters.sliding_attention.rope_theta is {:?}: remove one",
                self.rope_local_base_freq.unwrap_or_default(),
                sliding.theta
            ));
        }
        // transformers' Gemma3TextConfig defaults the global base to 1e6 (4.57 and 5.x alike).
        let mut global = global;
        if version == 3 && global.theta.is_none() {
            global.theta = Some(GEMMA3_THETA);
        }
        Ok((global, sliding))
    }
}

fn default_true() -> bool {
    true
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
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
    let act_name =
        cfg.hidden_activation.clone().or(cfg.hidden_act.clone()).unwrap_or_else(|| "gelu_pytorch_tanh".into());
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
                    other => Err(bad(format!(
                        "layer_types: '{other}' is not a layer type (sliding_attention, full_attention)"
                    ))),
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
    let (global, local) = cfg.ropes().map_err(bad)?;
    let global_scaling = global.scaling_for(cfg.max_position_embeddings, None, dh).map_err(bad)?;
    let local_scaling = local.scaling_for(cfg.max_position_embeddings, None, dh).map_err(bad)?;
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
        let proj =
            |w: &mut Weights, name: &str, out: i64, inp: i64, bias: bool| w.scoped(&p).linear(name, out, inp, bias);
        let (base, scaling) = if is_sliding {
            (local.theta.unwrap_or(DEFAULT_THETA), local_scaling.clone())
        } else {
            (global.theta.unwrap_or(DEFAULT_THETA), global_scaling.clone())
        };
        let qk_norm = if version == 3 {
            Some(QkNorm {
                q: norm(&mut w, format!("{p}.self_attn.q_norm.weight"), dh)?,
                k: norm(&mut w, format!("{p}.self_attn.k_norm.weight"), dh)?,
                per_head: true,
            })
        } else {
            None
        };
        let post_norms = if version >= 2 {
            Some((
                norm(&mut w, format!("{p}.post_attention_layernorm.weight"), d)?,
                norm(&mut w, format!("{p}.post_feedforward_layernorm.weight"), d)?,
            ))
        } else {
            None
        };
        let ffn_norm_name = if version >= 2 { "pre_feedforward_layernorm" } else { "post_attention_layernorm" };
        layers.push(
            StackLayer::new(
                Attention::new(
                    proj(&mut w, "self_attn.q_proj", h * dh, d, cfg.attention_bias)?,
                    proj(&mut w, "self_attn.k_proj", hk * dh, d, cfg.attention_bias)?,
                    proj(&mut w, "self_attn.v_proj", hk * dh, d, cfg.attention_bias)?,
                    proj(&mut w, "self_attn.o_proj", d, h * dh, cfg.attention_bias)?,
                    h,
                    hk,
                    dh,
                )
                .with_rotary(Some(Rotary { base, dim: dh, offset: 0, half: true, scaling }))
                .with_qk_norm(qk_norm)
                .with_score(score),
                norm(&mut w, format!("{p}.input_layernorm.weight"), d)?,
                Ffn {
                    up: proj(&mut w, "mlp.up_proj", ff, d, false)?,
                    down: proj(&mut w, "mlp.down_proj", d, ff, false)?,
                    act,
                    gate: Some(proj(&mut w, "mlp.gate_proj", ff, d, false)?),
                },
                norm(&mut w, format!("{p}.{ffn_norm_name}.weight"), d)?,
                NormPosition::Pre,
            )
            .with_post_norms(post_norms)
            .with_window(if is_sliding { cfg.sliding_window } else { None }),
        );
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let output = w.output_or_tied("lm_head.weight", &tokens, cfg.tie_word_embeddings)?;
    // As transformers: the multiplier sqrt(hidden_size) is taken in the model's precision.
    let scale = Tensor::from((d as f64).sqrt()).to_kind(opts.dtype).double_value(&[]);
    let embed = Embeddings { tokens, scale, positions: Positions::None, token_type: None, norm: None };
    let final_norm = norm(&mut w, "model.norm.weight".into(), d)?;
    let mut net = Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(1),
        cfg.max_position_embeddings,
    );
    net.logit_softcap = if version == 2 { cfg.final_logit_softcapping } else { None };
    Ok(net)
}
