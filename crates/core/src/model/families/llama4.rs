//! HF Llama 4's text model (`model_type` "llama4_text"), as transformers 4.57's
//! `Llama4ForCausalLM` computes it: pre-norm RMSNorm layers; grouped-query attention whose
//! rotary layers (`no_rope_layers` 1; by default three in four) rotate adjacent pairs, norm each
//! head's query and key by its RMS without a weight (`use_qk_norm`; held here as per-head norms
//! of unit weight, buffers, applied before the rotation, which keeps a vector's RMS) and attend
//! within chunks of `attention_chunk_size` positions (`layer_types` "chunked_attention"), and
//! whose other layers (NoPE) see every earlier position with the attention temperature
//! (`attn_temperature_tuning`: queries times `ln(1 + floor((p + 1) / floor_scale)) attn_scale +
//! 1`); MLPs dense (`intermediate_size_mlp`) or, in `moe_layers`, a mixture of experts
//! (docs/methods.md#experts): a router whose `top_k` largest logits' sigmoids weigh the chosen
//! experts' inputs (`expert(w x)`, [`Experts::input_scaled`]), experts fused as `gate_up_proj
//! [E, D, 2I]` (the gate's columns first) and `down_proj [E, I, D]`, and a shared expert added to
//! every token. Its heads are kind `dec`.

use crate::model::experts::{Expert, Experts, Routing};
use crate::model::mlp::Mlp;
use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition, QkNorm, Rotary, Temperature};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;
use tch::Tensor;

/// HF's `config.json` of Llama 4's text model; transformers' defaults where a key is left out.
#[derive(Debug, Deserialize)]
pub struct Config {
    pub hidden_size: i64,
    /// Each routed expert's and the shared expert's width.
    pub intermediate_size: i64,
    /// The dense layers' width.
    #[serde(default)]
    pub intermediate_size_mlp: Option<i64>,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    #[serde(default)]
    pub head_dim: Option<i64>,
    #[serde(default = "eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    pub vocab_size: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "silu")]
    pub hidden_act: String,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub num_experts_per_tok: Option<i64>,
    #[serde(default)]
    pub num_local_experts: Option<i64>,
    #[serde(default)]
    pub moe_layers: Option<Vec<usize>>,
    #[serde(default)]
    pub interleave_moe_layer_step: Option<usize>,
    #[serde(default)]
    pub use_qk_norm: Option<bool>,
    /// 1 where a layer has rotary positions, 0 where it has none.
    #[serde(default)]
    pub no_rope_layers: Option<Vec<i64>>,
    #[serde(default)]
    pub no_rope_layer_interval: Option<usize>,
    #[serde(default)]
    pub attention_chunk_size: Option<i64>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub attn_temperature_tuning: Option<bool>,
    #[serde(default)]
    pub floor_scale: Option<f64>,
    #[serde(default)]
    pub attn_scale: Option<f64>,
}

fn eps() -> f64 {
    1e-5
}

fn silu() -> String {
    "silu".into()
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None))
}

/// The Llama 4 text Transformer from a config and tensors under HF's names.
pub fn build(cfg: &Config, cfg_file: &str, mut w: Weights) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
    let (hk, dh) =
        crate::model::families::llama::silu_heads(&cfg.hidden_act, d, h, cfg.num_key_value_heads, cfg.head_dim)
            .map_err(bad)?;
    let n_layers = cfg.num_hidden_layers;
    let every = cfg.no_rope_layer_interval.unwrap_or(4).max(1);
    let rope_layers: Vec<bool> = match &cfg.no_rope_layers {
        Some(v) if !v.is_empty() => {
            if v.len() != n_layers {
                return Err(bad(format!("no_rope_layers lists {} layers of {n_layers}", v.len())));
            }
            v.iter().map(|&r| r != 0).collect()
        }
        _ => (0..n_layers).map(|l| !(l + 1).is_multiple_of(every)).collect(),
    };
    let types: Vec<String> = match &cfg.layer_types {
        Some(t) => t.clone(),
        None => {
            rope_layers.iter().map(|&r| if r { "chunked_attention" } else { "full_attention" }.to_string()).collect()
        }
    };
    if types.len() != n_layers {
        return Err(bad(format!("layer_types must list the {n_layers} layers")));
    }
    if let Some(t) = types.iter().find(|t| !["full_attention", "chunked_attention"].contains(&t.as_str())) {
        return Err(bad(format!("layer_types holds '{t}': llama4_text supports full_attention, chunked_attention")));
    }
    let chunk = cfg.attention_chunk_size.unwrap_or(8192);
    if chunk <= 0 && types.iter().any(|t| t == "chunked_attention") {
        return Err(bad(format!("attention_chunk_size {chunk} must be positive")));
    }
    let step = cfg.interleave_moe_layer_step.unwrap_or(1);
    if step == 0 {
        return Err(bad("interleave_moe_layer_step 0: no layer could have experts".into()));
    }
    let moe_layers: Vec<usize> = cfg.moe_layers.clone().unwrap_or_else(|| (step - 1..n_layers).step_by(step).collect());
    let n_experts = cfg.num_local_experts.unwrap_or(16);
    let top_k = cfg.num_experts_per_tok.unwrap_or(1);
    if !moe_layers.is_empty() && (n_experts <= 0 || top_k <= 0 || top_k > n_experts) {
        return Err(bad(format!("num_experts_per_tok {top_k} must be between 1 and the {n_experts} experts")));
    }
    let temperature = if cfg.attn_temperature_tuning.unwrap_or(true) {
        let t =
            Temperature { floor_scale: cfg.floor_scale.unwrap_or(8192.0), attn_scale: cfg.attn_scale.unwrap_or(0.1) };
        if !(t.floor_scale > 0.0 && t.attn_scale.is_finite()) {
            return Err(bad(format!("floor_scale {} must be positive", t.floor_scale)));
        }
        Some(t)
    } else {
        None
    };
    // transformers 4.57's Llama 4 reads `rope_scaling` as llama3 scaling whatever its type says.
    if let Some(t) =
        cfg.rope_scaling.as_ref().and_then(|s| s.get("rope_type").or(s.get("type"))).and_then(|t| t.as_str())
    {
        if t != "llama3" {
            return Err(bad(format!("rope_scaling of type '{t}': Llama 4's rotary reads llama3 scaling only")));
        }
    }
    let rope = hf::rope_settings(
        cfg.rope_parameters.as_ref(),
        hf::Rope4 { theta: cfg.rope_theta, scaling: cfg.rope_scaling.as_ref(), partial_rotary_factor: None },
        "full_attention",
    )
    .map_err(bad)?;
    let scaling = rope.scaling_for(cfg.max_position_embeddings, None, dh).map_err(bad)?;
    let theta = rope.theta.unwrap_or(500000.0);
    let eps = cfg.rms_norm_eps;
    let qk_norm = cfg.use_qk_norm.unwrap_or(true);
    let rms = |w: &mut Weights, name: String| -> Result<Norm, ModelError> {
        Ok(Norm { kind: NormKind::Rms, weight: w.get(&name, &[d])?, bias: None, eps })
    };
    let mut layers = Vec::new();
    for l in 0..n_layers {
        let p = format!("model.layers.{l}");
        let a = format!("{p}.self_attn");
        let rotary = rope_layers[l];
        let proj =
            |w: &mut Weights, name: &str, out: i64, inp: i64| w.scoped(&a).linear(name, out, inp, cfg.attention_bias);
        let q = proj(&mut w, "q_proj", h * dh, d)?;
        let k = proj(&mut w, "k_proj", hk * dh, d)?;
        let v = proj(&mut w, "v_proj", hk * dh, d)?;
        let o = proj(&mut w, "o_proj", d, h * dh)?;
        let (kind, device) = (q.w.kind(), q.w.device());
        let unit = || Norm { kind: NormKind::Rms, weight: Tensor::ones([dh], (kind, device)), bias: None, eps };
        let attention = Attention::new(q, k, v, o, h, hk, dh)
            .with_rotary(rotary.then(|| Rotary {
                base: theta,
                dim: dh,
                offset: 0,
                half: false,
                scaling: scaling.clone(),
            }))
            .with_qk_norm((rotary && qk_norm).then(|| QkNorm { q: unit(), k: unit(), per_head: true }))
            .with_temperature(if rotary { None } else { temperature });
        let mlp: Box<dyn Mlp> = if moe_layers.contains(&l) {
            experts(&mut w, &format!("{p}.feed_forward"), n_experts, top_k, cfg.intermediate_size, d)?
        } else {
            Box::new(swiglu(&mut w, &format!("{p}.feed_forward"), cfg.intermediate_size_mlp.unwrap_or(16384), d)?)
        };
        layers.push(
            StackLayer::new(
                attention,
                rms(&mut w, format!("{p}.input_layernorm.weight"))?,
                mlp,
                rms(&mut w, format!("{p}.post_attention_layernorm.weight"))?,
                NormPosition::Pre,
            )
            .with_chunk((types[l] == "chunked_attention").then_some(chunk)),
        );
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let output = w.output_or_tied("lm_head.weight", &tokens, cfg.tie_word_embeddings)?;
    let embed = Embeddings { tokens, scale: 1.0, positions: Positions::None, token_type: None, norm: None };
    let final_norm = rms(&mut w, "model.norm.weight".into())?;
    Ok(Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        cfg.max_position_embeddings,
    ))
}

/// A SwiGLU under `at` (`gate_proj`, `up_proj`, `down_proj`) of `width`.
fn swiglu(w: &mut Weights, at: &str, width: i64, d: i64) -> Result<Ffn, ModelError> {
    let mut w = w.scoped(at);
    Ok(Ffn {
        gate: Some(w.linear("gate_proj", width, d, false)?),
        up: w.linear("up_proj", width, d, false)?,
        down: w.linear("down_proj", d, width, false)?,
        act: Activation::Silu,
    })
}

/// The mixture of experts under `block`: the router, the fused experts split into SwiGLUs (the
/// gate's `width` columns of `gate_up_proj` first, then the up projection's), the shared expert.
fn experts(w: &mut Weights, block: &str, n: i64, top_k: i64, width: i64, d: i64) -> Result<Box<dyn Mlp>, ModelError> {
    let router = w.scoped(block).linear("router", n, d, false)?;
    let gate_up = w.get(&format!("{block}.experts.gate_up_proj"), &[n, d, 2 * width])?;
    let down = w.get(&format!("{block}.experts.down_proj"), &[n, width, d])?;
    let linear =
        |t: Tensor| -> Result<Linear, ModelError> { Ok(Linear { w: t.f_transpose(0, 1)?.f_contiguous()?, b: None }) };
    let mut list = Vec::new();
    for e in 0..n {
        let gu = gate_up.f_get(e)?;
        list.push(Expert::SwiGlu(Ffn {
            gate: Some(linear(gu.f_narrow(1, 0, width)?)?),
            up: linear(gu.f_narrow(1, width, width)?)?,
            down: linear(down.f_get(e)?)?,
            act: Activation::Silu,
        }));
    }
    let shared = swiglu(w, &format!("{block}.shared_expert"), width, d)?;
    Ok(Box::new(Experts::new(router, list, top_k, Routing::TopKSigmoid, Some((shared, None))).with_input_scaled(true)))
}
