//! HF DeepSeek-V2 and DeepSeek-V3 (`model_type` "deepseek_v2", "deepseek_v3"), as
//! transformers 4.57's `DeepseekV2ForCausalLM` and `DeepseekV3ForCausalLM` compute them:
//! pre-norm RMSNorm layers whose token mixer is multi-head latent attention
//! ([`crate::model::latent`], docs/methods.md#latent-attention) and whose MLP is a dense SwiGLU
//! in the first `first_k_dense_replace` layers, a mixture of experts after them
//! (docs/methods.md#experts): routed experts behind a grouped router
//! ([`Routing::Grouped`]: V2 softmax scores, greedy or group-limited by each group's best
//! score, not renormalised; V3 sigmoid scores with a choice bias, groups ranked by their two
//! best, renormalised where `norm_topk_prob`; both times `routed_scaling_factor`) plus shared
//! experts, one SwiGLU `n_shared_experts` times as wide, added to every token.
//!
//! The rotary part of each head's query and key is its last `qk_rope_head_dim` dimensions,
//! stored as adjacent pairs (V2's complex rotation; V3 with `rope_interleave`, its default),
//! so `hook_q` and `hook_k` are the checkpoint's own. Scores are scaled by
//! `qk_head_dim^-1/2`, and in V3 by YaRN's `mscale(factor, mscale_all_dim)^2` besides (V2 in
//! transformers applies no such factor). Its heads are kind `dec`.

use crate::model::experts::{Expert, Experts, Routing};
use crate::model::latent::Latent;
use crate::model::mlp::Mlp;
use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition, Rotary, Score};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::{Deserialize, Deserializer};
use std::path::Path;

/// A key given as `null` (`Some(None)`) told apart from a key left out (`None`).
fn given<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

/// HF's `config.json` of DeepSeek-V2 / V3; transformers' defaults (which differ by version)
/// where a key is left out.
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
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
    /// V2: biases on every MLP projection, experts' included.
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// The query latent's width; `null`: queries straight from the stream (V2-Lite).
    #[serde(default, deserialize_with = "given")]
    pub q_lora_rank: Option<Option<i64>>,
    #[serde(default)]
    pub kv_lora_rank: Option<i64>,
    #[serde(default)]
    pub qk_nope_head_dim: Option<i64>,
    #[serde(default)]
    pub qk_rope_head_dim: Option<i64>,
    #[serde(default)]
    pub v_head_dim: Option<i64>,
    /// Derived by transformers (`qk_nope_head_dim + qk_rope_head_dim`): checked.
    #[serde(default)]
    pub qk_head_dim: Option<i64>,
    /// Derived by transformers (`qk_rope_head_dim`): checked.
    #[serde(default)]
    pub head_dim: Option<i64>,
    /// V3: the queries' and keys' rotary dimensions stored as adjacent pairs (default true).
    #[serde(default)]
    pub rope_interleave: Option<bool>,
    #[serde(default)]
    pub n_routed_experts: Option<i64>,
    /// `null` (V2): no shared experts.
    #[serde(default, deserialize_with = "given")]
    pub n_shared_experts: Option<Option<i64>>,
    #[serde(default)]
    pub moe_intermediate_size: Option<i64>,
    #[serde(default)]
    pub num_experts_per_tok: Option<i64>,
    #[serde(default, deserialize_with = "given")]
    pub n_group: Option<Option<i64>>,
    #[serde(default, deserialize_with = "given")]
    pub topk_group: Option<Option<i64>>,
    /// V2: `greedy` or `group_limited_greedy`; V3's original configs: `noaux_tc`.
    #[serde(default)]
    pub topk_method: Option<String>,
    /// DeepSeek's original configs: `softmax` (V2) or `sigmoid` (V3), as transformers fixes.
    #[serde(default)]
    pub scoring_func: Option<String>,
    #[serde(default)]
    pub routed_scaling_factor: Option<f64>,
    /// V3 renormalises the chosen weights where true (its default); transformers' V2 never does.
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    #[serde(default)]
    pub first_k_dense_replace: Option<usize>,
    /// DeepSeek's original configs: every this-many-th layer has experts (transformers reads
    /// only 1).
    #[serde(default)]
    pub moe_layer_freq: Option<i64>,
}

fn eps() -> f64 {
    1e-6
}

fn silu() -> String {
    "silu".into()
}

/// transformers' `DeepseekV3RMSNorm(width)` default, the latents' norms' epsilon (the config's
/// `rms_norm_eps` is the layers').
const LATENT_EPS: f64 = 1e-6;

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None))
}

/// The routing and widths of the mixture-of-experts layers.
struct Moe {
    n: i64,
    top_k: i64,
    width: i64,
    shared: Option<i64>,
    routing: Routing,
    /// V3's `e_score_correction_bias`.
    choice_bias: bool,
}

/// The settings in use, transformers' defaults by version where the config is silent.
fn moe_of(cfg: &Config, v3: bool) -> Result<Moe, String> {
    let n = cfg.n_routed_experts.unwrap_or(if v3 { 256 } else { 64 });
    let top_k = match (cfg.num_experts_per_tok, v3) {
        (Some(k), _) => k,
        (None, true) => 8,
        (None, false) => {
            return Err("num_experts_per_tok is required (transformers' DeepSeek-V2 has no default)".into())
        }
    };
    if n <= 0 || top_k <= 0 || top_k > n {
        return Err(format!("num_experts_per_tok {top_k} must be between 1 and the {n} experts (n_routed_experts)"));
    }
    let width = cfg.moe_intermediate_size.unwrap_or(if v3 { 2048 } else { 1407 });
    let shared_n = cfg.n_shared_experts.unwrap_or(Some(if v3 { 1 } else { 2 }));
    if shared_n.is_some_and(|s| s < 0) {
        return Err(format!("n_shared_experts {} must be 0 or more", shared_n.unwrap_or(0)));
    }
    let shared = shared_n.map(|s| s * width).filter(|&s| s > 0);
    let scoring = cfg.scoring_func.as_deref().unwrap_or(if v3 { "sigmoid" } else { "softmax" });
    if scoring != if v3 { "sigmoid" } else { "softmax" } {
        return Err(format!(
            "scoring_func '{scoring}' is not what transformers computes for {} (its routers fix it)",
            cfg.model_type
        ));
    }
    let method = cfg.topk_method.as_deref().unwrap_or(if v3 { "noaux_tc" } else { "greedy" });
    let grouped = match (v3, method) {
        (true, "noaux_tc") | (false, "group_limited_greedy") => true,
        (false, "greedy") => false,
        _ => {
            return Err(format!(
                "topk_method '{method}' is not supported for {} ({})",
                cfg.model_type,
                if v3 { "noaux_tc" } else { "greedy, group_limited_greedy" }
            ))
        }
    };
    let (groups, top_groups) = if grouped {
        let groups = cfg.n_group.flatten().or(if v3 { Some(8) } else { None });
        let top = cfg.topk_group.flatten().or(if v3 { Some(4) } else { None });
        match (groups, top) {
            (Some(g), Some(t)) => (g, t),
            _ => return Err(format!("topk_method '{method}' needs n_group and topk_group")),
        }
    } else {
        (1, 1)
    };
    if groups <= 0 || n % groups != 0 {
        return Err(format!("n_group {groups} must divide the {n} experts (n_routed_experts)"));
    }
    let per = n / groups;
    if top_groups <= 0 || top_groups > groups || top_k > top_groups * per {
        return Err(format!(
            "topk_group {top_groups} of {groups} groups of {per} experts cannot hold num_experts_per_tok {top_k}"
        ));
    }
    if v3 && per < 2 {
        return Err(format!(
            "n_group {groups}: DeepSeek-V3 scores each group by its two best experts, and its groups hold {per}"
        ));
    }
    let scale = cfg.routed_scaling_factor.unwrap_or(if v3 { 2.5 } else { 1.0 });
    if !scale.is_finite() {
        return Err(format!("routed_scaling_factor {scale} must be a number"));
    }
    let routing = Routing::Grouped {
        sigmoid: v3,
        groups,
        top_groups,
        top2_sum: v3,
        renormalise: v3 && cfg.norm_topk_prob.unwrap_or(true),
        scale,
    };
    Ok(Moe { n, top_k, width, shared, routing, choice_bias: v3 })
}

/// The DeepSeek Transformer from a config and tensors under HF's names.
pub fn build(cfg: &Config, cfg_file: &str, mut w: Weights) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let v3 = cfg.model_type == "deepseek_v3";
    if cfg.hidden_act != "silu" {
        return Err(bad(format!("hidden_act '{}' is not supported (silu)", cfg.hidden_act)));
    }
    let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
    if let Some(hk) = cfg.num_key_value_heads.filter(|&hk| hk != h) {
        return Err(bad(format!(
            "num_key_value_heads {hk} differs from num_attention_heads {h}: latent attention gives every head its own keys and values"
        )));
    }
    let q_rank = cfg.q_lora_rank.unwrap_or(Some(1536));
    let kv_rank = cfg.kv_lora_rank.unwrap_or(512);
    let nope = cfg.qk_nope_head_dim.unwrap_or(128);
    let rope_dim = cfg.qk_rope_head_dim.unwrap_or(64);
    let v_dim = cfg.v_head_dim.unwrap_or(128);
    for (key, v) in [("kv_lora_rank", kv_rank), ("qk_nope_head_dim", nope), ("v_head_dim", v_dim)] {
        if v <= 0 {
            return Err(bad(format!("{key} {v} must be positive")));
        }
    }
    if let Some(q) = q_rank.filter(|&q| q <= 0) {
        return Err(bad(format!("q_lora_rank {q} must be positive (or null)")));
    }
    if rope_dim <= 0 || rope_dim % 2 != 0 {
        return Err(bad(format!("qk_rope_head_dim {rope_dim} must be a positive even number")));
    }
    if h <= 0 {
        return Err(bad(format!("num_attention_heads {h} must be positive")));
    }
    let qk = nope + rope_dim;
    if let Some(x) = cfg.qk_head_dim.filter(|&x| x != qk) {
        return Err(bad(format!("qk_head_dim {x} is not qk_nope_head_dim {nope} + qk_rope_head_dim {rope_dim}")));
    }
    if let Some(x) = cfg.head_dim.filter(|&x| x != rope_dim) {
        return Err(bad(format!("head_dim {x} is not qk_rope_head_dim {rope_dim} (transformers derives it so)")));
    }
    if let Some(f) = cfg.moe_layer_freq.filter(|&f| f != 1) {
        return Err(bad(format!(
            "moe_layer_freq {f}: transformers gives every layer after first_k_dense_replace experts (1)"
        )));
    }
    let interleave = if v3 { cfg.rope_interleave.unwrap_or(true) } else { true };
    if !v3 && cfg.rope_interleave.is_some() {
        return Err(bad("rope_interleave is DeepSeek-V3's; DeepSeek-V2 always rotates adjacent pairs".into()));
    }
    let rope = hf::rope_settings(
        cfg.rope_parameters.as_ref(),
        hf::Rope4 { theta: cfg.rope_theta, scaling: cfg.rope_scaling.as_ref(), partial_rotary_factor: None },
        "full_attention",
    )
    .map_err(bad)?;
    let scaling = rope.scaling_for(cfg.max_position_embeddings, None, rope_dim).map_err(bad)?;
    // V3: YaRN's mscale of all dimensions, squared, on the score scale.
    let mut scale = 1.0 / (qk as f64).sqrt();
    if v3 {
        if let Some(s) = &rope.scaling {
            let num = |k: &str| s.get(k).and_then(|v| v.as_f64());
            let factor = num("factor").unwrap_or(1.0);
            let all = num("mscale_all_dim").unwrap_or(0.0);
            if all != 0.0 && factor > 1.0 {
                let m = 0.1 * all * factor.ln() + 1.0;
                scale *= m * m;
            }
        }
    }
    let moe = moe_of(cfg, v3).map_err(bad)?;
    let dense_layers = cfg.first_k_dense_replace.unwrap_or(if v3 { 3 } else { 0 });
    let eps = cfg.rms_norm_eps;
    let rms = |w: &mut Weights, name: String, width: i64, eps: f64| -> Result<Norm, ModelError> {
        Ok(Norm { kind: NormKind::Rms, weight: w.get(&name, &[width])?, bias: None, eps })
    };
    let mut layers = Vec::new();
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let a = format!("{p}.self_attn");
        let (q, q_a) = match q_rank {
            None => (w.scoped(&a).linear("q_proj", h * qk, d, false)?, None),
            Some(r) => {
                let q_a = w.scoped(&a).linear("q_a_proj", r, d, cfg.attention_bias)?;
                let norm = rms(&mut w, format!("{a}.q_a_layernorm.weight"), r, LATENT_EPS)?;
                (w.scoped(&a).linear("q_b_proj", h * qk, r, false)?, Some((q_a, norm)))
            }
        };
        let kv_a = w.scoped(&a).linear("kv_a_proj_with_mqa", kv_rank + rope_dim, d, cfg.attention_bias)?;
        let kv_norm = rms(&mut w, format!("{a}.kv_a_layernorm.weight"), kv_rank, LATENT_EPS)?;
        // kv_b_proj's rows, head by head: the key's dimensions without positions, then the value.
        let kv_b =
            w.scoped(&a).get("kv_b_proj.weight", &[h * (nope + v_dim), kv_rank])?.f_view([h, nope + v_dim, kv_rank])?;
        let k = Linear { w: kv_b.f_narrow(1, 0, nope)?.f_reshape([h * nope, kv_rank])?.f_contiguous()?, b: None };
        let v = Linear { w: kv_b.f_narrow(1, nope, v_dim)?.f_reshape([h * v_dim, kv_rank])?.f_contiguous()?, b: None };
        let o = w.scoped(&a).linear("o_proj", d, h * v_dim, cfg.attention_bias)?;
        let attention = Attention::new(q, k, v, o, h, h, qk)
            .with_rotary(Some(Rotary {
                base: rope.theta.unwrap_or(10000.0),
                dim: rope_dim,
                offset: nope,
                half: !interleave,
                scaling: scaling.clone(),
            }))
            .with_score(Score { scale: Some(scale), softcap: None })
            .with_latent(Some(Latent { q_a, kv_a, kv_norm, kv_rank, nope, rope: rope_dim, v_dim }));
        let mlp = mlp(&mut w, &p, cfg, (l >= dense_layers).then_some(&moe), d)?;
        layers.push(StackLayer::new(
            attention,
            rms(&mut w, format!("{p}.input_layernorm.weight"), d, eps)?,
            mlp,
            rms(&mut w, format!("{p}.post_attention_layernorm.weight"), d, eps)?,
            NormPosition::Pre,
        ));
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let output = w.output_or_tied("lm_head.weight", &tokens, cfg.tie_word_embeddings)?;
    let embed = Embeddings { tokens, scale: 1.0, positions: Positions::None, token_type: None, norm: None };
    let final_norm = rms(&mut w, "model.norm.weight".into(), d, eps)?;
    Ok(Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        cfg.max_position_embeddings,
    ))
}

/// Layer `p`'s MLP: a dense SwiGLU (`intermediate_size`), or its experts where `moe` is given.
fn mlp(w: &mut Weights, p: &str, cfg: &Config, moe: Option<&Moe>, d: i64) -> Result<Box<dyn Mlp>, ModelError> {
    let bias = cfg.mlp_bias;
    let swiglu = |w: &mut Weights, at: &str, width: i64| -> Result<Ffn, ModelError> {
        let mut w = w.scoped(at);
        Ok(Ffn {
            gate: Some(w.linear("gate_proj", width, d, bias)?),
            up: w.linear("up_proj", width, d, bias)?,
            down: w.linear("down_proj", d, width, bias)?,
            act: Activation::Silu,
        })
    };
    let block = format!("{p}.mlp");
    let Some(m) = moe else {
        return Ok(Box::new(swiglu(w, &block, cfg.intermediate_size)?));
    };
    let router = w.scoped(&block).linear("gate", m.n, d, false)?;
    let choice_bias =
        if m.choice_bias { Some(w.scoped(&block).get("gate.e_score_correction_bias", &[m.n])?) } else { None };
    let experts = (0..m.n)
        .map(|e| Ok(Expert::SwiGlu(swiglu(w, &format!("{block}.experts.{e}"), m.width)?)))
        .collect::<Result<Vec<_>, ModelError>>()?;
    let shared = match m.shared {
        Some(s) => Some((swiglu(w, &format!("{block}.shared_experts"), s)?, None)),
        None => None,
    };
    Ok(Box::new(Experts::new(router, experts, m.top_k, m.routing, shared).with_choice_bias(choice_bias)))
}
