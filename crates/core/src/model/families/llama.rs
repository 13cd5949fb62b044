//! HF Llama, Qwen2, Qwen3 and Mistral (`model_type` "llama", "qwen2", "qwen3", "mistral"):
//! RMSNorm before each sublayer, rotary positions (HF's rotate-half, base `rope_theta`, with
//! `rope_scaling` of type `linear`, `dynamic`, `llama3` or `yarn`: Llama 3.1/3.2, long-context
//! Qwen2.5; docs/methods.md#rope-scaling), grouped-query causal self-attention (each query head
//! is a head of its own for every analysis and gate; `head_dim` may differ from
//! `hidden_size / num_attention_heads`), SwiGLU MLP, a final norm, and `lm_head` (or the
//! embeddings when `tie_word_embeddings`). Qwen2 adds Q/K/V biases (Llama with
//! `attention_bias` all four); Qwen3 an RMSNorm of each head's query and key before rotary
//! (`self_attn.q_norm`, `self_attn.k_norm`); OLMo-2 (`olmo2`) the same norms over all heads at
//! once, and each sublayer's output normed before its residual instead of its input
//! (`post_attention_layernorm`, `post_feedforward_layernorm`; `NormPosition::PostSublayer`);
//! Mistral attends within `sliding_window` positions. Its heads are kind `dec`. The
//! mixture-of-experts variants (docs/methods.md#experts) replace the MLP by
//! [`crate::model::experts::Experts`]: Mixtral (`block_sparse_moe`, Mistral's attention), OLMoE
//! (pre-norm with OLMo-2's q/k norms over all heads), Qwen2-MoE (Qwen2's attention, a shared
//! expert behind a sigmoid gate) and Qwen3-MoE (Qwen3's attention); Qwen's `mlp_only_layers`
//! and `decoder_sparse_step` keep some layers dense. SmolLM3 has layers without rotary
//! (`no_rope_layers`); OLMo-3 has OLMo-2's norms and sliding-window layers (`layer_types`),
//! rotated without the config's `rope_scaling`. gpt-oss adds learned attention sinks
//! (`self_attn.sinks`; docs/methods.md#attention-sinks), biases on every projection,
//! alternating sliding-window layers and fused clamped-SwiGLU experts behind a biased router.
//!
//! HF checkpoints keep their rotate-half rows (pairs `(i, i + dh/2)`), so `hook_q` and `hook_k`
//! are the checkpoint's own; GGUF files store Q and K rows permuted by llama.cpp's converter
//! into adjacent pairs `(2i, 2i + 1)`, which the rotary reads as they are ([`RotaryRows`]).

use crate::model::experts::{Expert, Experts, Routing};
use crate::model::mlp::Mlp;
use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition, QkNorm, RopeScaling, Rotary};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;
use tch::Tensor;

/// HF's `config.json` of the llama family; the GGUF loader (`llama_gguf.rs`) fills one from
/// the GGUF metadata.
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    #[serde(default)]
    pub head_dim: Option<i64>,
    pub rms_norm_eps: f64,
    /// transformers 4's base (10000 when absent); transformers 5 writes it in `rope_parameters`.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// transformers 5's rotary settings (docs/formats.md#transformers-5-configs).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    pub vocab_size: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    /// Phi-3's pretraining context (LongRoPE's threshold).
    #[serde(default)]
    pub original_max_position_embeddings: Option<i64>,
    /// Rotary on this fraction of each head's dimensions (Phi-4-mini).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub sliding_window: Option<i64>,
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Qwen2/3's per-layer attention types (transformers 4.5x+): every layer must be full.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// SmolLM3: 1 where a layer has rotary positions, 0 where it has none (NoPE).
    #[serde(default)]
    pub no_rope_layers: Option<Vec<i64>>,
    /// SmolLM3: without `no_rope_layers`, every this-many-th layer has no rotary (default 4).
    #[serde(default)]
    pub no_rope_layer_interval: Option<usize>,
    /// The mixture-of-experts keys (none in a dense family).
    #[serde(flatten)]
    pub moe: MoeConfig,
    /// Rotary dimensions per head when fewer than `head_dim` (GGUF `rope.dimension_count`).
    #[serde(skip)]
    pub rope_dim: Option<i64>,
}

/// The keys of the mixture-of-experts variants (docs/methods.md#experts).
#[derive(Debug, Default, Deserialize)]
pub struct MoeConfig {
    /// Mixtral's experts per layer.
    #[serde(default)]
    pub num_local_experts: Option<i64>,
    /// OLMoE's and Qwen-MoE's experts per layer.
    #[serde(default)]
    pub num_experts: Option<i64>,
    #[serde(default)]
    pub num_experts_per_tok: Option<i64>,
    /// Whether the chosen experts' probabilities are renormalised (Mixtral always is).
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    /// Qwen-MoE: each routed expert's width (`intermediate_size` is the dense layers').
    #[serde(default)]
    pub moe_intermediate_size: Option<i64>,
    /// Qwen2-MoE: the shared expert's width.
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<i64>,
    /// Qwen-MoE: every this-many-th layer has experts, the others a dense MLP.
    #[serde(default)]
    pub decoder_sparse_step: Option<usize>,
    /// Qwen-MoE: layers with a dense MLP.
    #[serde(default)]
    pub mlp_only_layers: Option<Vec<usize>>,
    /// Qwen2-MoE: biases on the query, key and value projections (transformers' default: true).
    #[serde(default)]
    pub qkv_bias: Option<bool>,
    /// OLMoE: queries, keys and values clamped to this (refused: not supported).
    #[serde(default)]
    pub clip_qkv: Option<f64>,
    /// gpt-oss: the clamped SwiGLU's `alpha` in `sigmoid(alpha g)` (transformers' default 1.702).
    #[serde(default)]
    pub swiglu_alpha: Option<f64>,
    /// gpt-oss: the clamp of the SwiGLU's gate and up projections (transformers' default 7).
    #[serde(default)]
    pub swiglu_limit: Option<f64>,
}

/// How Q and K rows are stored: HF's rotate-half layout, or adjacent pairs (GGUF, permuted by
/// llama.cpp's converter).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RotaryRows {
    RotateHalf,
    Adjacent,
}

/// The base when a config gives none (transformers' `LlamaConfig` default).
pub const DEFAULT_THETA: f64 = 10000.0;

impl Config {
    /// The rotary settings in use, from either config shape.
    pub fn rope(&self) -> Result<hf::Rope, String> {
        hf::rope_settings(
            self.rope_parameters.as_ref(),
            hf::Rope4 {
                theta: self.rope_theta,
                scaling: self.rope_scaling.as_ref(),
                partial_rotary_factor: self.partial_rotary_factor,
            },
            "full_attention",
        )
    }
}

fn default_act() -> String {
    "silu".into()
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None), RotaryRows::RotateHalf)
}

/// The llama-family Transformer from a config and tensors under HF's names (`cfg_file` is
/// named in config errors).
pub fn build(cfg: &Config, cfg_file: &str, mut w: Weights, rows: RotaryRows) -> Result<Transformer, ModelError> {
    let cfg_file = cfg_file.to_string();
    let bad = |why: String| ModelError::Config(cfg_file.clone(), why);
    let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
    let (hk, dh) = silu_heads(&cfg.hidden_act, d, h, cfg.num_key_value_heads, cfg.head_dim).map_err(bad)?;
    let rope = cfg.rope().map_err(bad)?;
    let rope_dim = match (cfg.rope_dim, rope.partial_rotary_factor) {
        (Some(r), _) => r,
        (None, Some(f)) if (0.0..=1.0).contains(&f) => (dh as f64 * f) as i64,
        (None, Some(f)) => return Err(bad(format!("partial_rotary_factor {f} must be in [0, 1]"))),
        (None, None) => dh,
    };
    if rope_dim % 2 != 0 {
        return Err(bad(format!(
            "{rope_dim} rotary dimensions per head (partial_rotary_factor of head size {dh}) is not an even number"
        )));
    }
    let scaling =
        rope.scaling_for(cfg.max_position_embeddings, cfg.original_max_position_embeddings, rope_dim).map_err(bad)?;
    // Dynamic NTK scales itself for inputs past max_position_embeddings: no limit there.
    let max_positions = cfg.max_position_embeddings.filter(|_| !matches!(scaling, RopeScaling::Dynamic { .. }));
    // transformers' default base where the config gives none, by family.
    let theta = rope.theta.unwrap_or(match cfg.model_type.as_str() {
        "mixtral" => 1e6,
        "gpt_oss" => 150000.0,
        "smollm3" => 2e6,
        _ => DEFAULT_THETA,
    });
    // Qwen2/3 configs carry a sliding_window that only applies with use_sliding_window.
    let window = match cfg.model_type.as_str() {
        "mistral" | "phi3" | "mixtral" => cfg.sliding_window,
        "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" if cfg.use_sliding_window == Some(true) => {
            return Err(bad("use_sliding_window (per-layer windows) is not supported".into()))
        }
        _ => None,
    };
    let mt = cfg.model_type.as_str();
    let n_layers = cfg.num_hidden_layers;
    // Per layer, computed as the layers are read (a config's layer count reserves nothing: a
    // corrupt one fails at the first missing tensor). OLMo-3's and gpt-oss's sliding-window
    // layers (transformers' defaults: three in four, one in two); elsewhere every layer attends
    // to the whole prefix.
    let windowed = matches!(mt, "olmo3" | "gpt_oss");
    let sliding = |l: usize| -> bool {
        match (mt, &cfg.layer_types) {
            ("olmo3", None) => !(l + 1).is_multiple_of(4),
            ("gpt_oss", None) => !(l + 1).is_multiple_of(2),
            (_, Some(t)) if windowed => t.get(l).is_some_and(|t| t == "sliding_attention"),
            _ => false,
        }
    };
    let allowed: &[&str] = if windowed { &["full_attention", "sliding_attention"] } else { &["full_attention"] };
    if let Some(t) = cfg.layer_types.as_ref().and_then(|t| t.iter().find(|t| !allowed.contains(&t.as_str()))) {
        return Err(bad(format!("layer_types holds '{t}': model_type '{mt}' supports {}", allowed.join(", "))));
    }
    if cfg.layer_types.as_ref().is_some_and(|t| t.len() != n_layers) {
        return Err(bad(format!("layer_types must list the {n_layers} layers")));
    }
    // SmolLM3's layers without rotary positions (NoPE).
    if let (Some(v), true) = (&cfg.no_rope_layers, mt == "smollm3") {
        if v.len() != n_layers {
            return Err(bad(format!("no_rope_layers lists {} layers of {n_layers}", v.len())));
        }
    }
    let every = cfg.no_rope_layer_interval.unwrap_or(4).max(1);
    let rotary_at = |l: usize| -> bool {
        match (mt, &cfg.no_rope_layers) {
            ("smollm3", Some(v)) => v.get(l).is_none_or(|&r| r != 0),
            ("smollm3", None) => !(l + 1).is_multiple_of(every),
            _ => true,
        }
    };
    if mt == "smollm3" && cfg.use_sliding_window == Some(true) {
        return Err(bad("use_sliding_window (SmolLM3's windowed layers) is not supported".into()));
    }
    // gpt-oss: every projection has a bias (transformers sets attention_bias itself).
    let gpt_oss = mt == "gpt_oss";
    let attention_bias = cfg.attention_bias || gpt_oss;
    // Qwen2-MoE reads qkv_bias (default true); Qwen2 always has the biases.
    let qkv_bias = mt == "qwen2" || (mt == "qwen2_moe" && cfg.moe.qkv_bias.unwrap_or(true)) || attention_bias;
    // OLMo-3 has OLMo-2's norms.
    let olmo2 = matches!(mt, "olmo2" | "olmo3");
    // OLMo-2/3 and OLMoE norm queries and keys over all heads at once, Qwen3 per head.
    let all_heads_qk = olmo2 || mt == "olmoe";
    let qk_norm = matches!(mt, "qwen3" | "qwen3_moe") || all_heads_qk;
    if let Some(c) = cfg.moe.clip_qkv {
        return Err(bad(format!("clip_qkv {c} (queries, keys and values clamped) is not supported")));
    }
    let moe = moe_of(cfg).map_err(bad)?;
    let eps = cfg.rms_norm_eps;
    let rms = |w: &mut Weights, name: String| -> Result<Norm, ModelError> {
        Ok(Norm { kind: NormKind::Rms, weight: w.get(&name, &[d])?, bias: None, eps })
    };
    let mut layers = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for l in 0..cfg.num_hidden_layers {
        if sliding(l) && cfg.sliding_window.is_none_or(|w| w <= 0) {
            return Err(bad(format!("layer {l} is a sliding_attention layer and sliding_window is not positive")));
        }
        let p = format!("model.layers.{l}");
        let proj =
            |w: &mut Weights, name: &str, out: i64, inp: i64, bias: bool| w.scoped(&p).linear(name, out, inp, bias);
        // OLMo-2 norms each sublayer's output (post_attention_layernorm after the attention,
        // post_feedforward_layernorm after the MLP) and not their inputs.
        layers.push(
            StackLayer::new(
                Attention::new(
                    proj(&mut w, "self_attn.q_proj", h * dh, d, qkv_bias)?,
                    proj(&mut w, "self_attn.k_proj", hk * dh, d, qkv_bias)?,
                    proj(&mut w, "self_attn.v_proj", hk * dh, d, qkv_bias)?,
                    proj(&mut w, "self_attn.o_proj", d, h * dh, attention_bias)?,
                    h,
                    hk,
                    dh,
                )
                .with_rotary(rotary_at(l).then(|| Rotary {
                    base: theta,
                    dim: rope_dim,
                    offset: 0,
                    half: rows == RotaryRows::RotateHalf,
                    // OLMo-3's sliding layers rotate without the config's rope_scaling.
                    scaling: if sliding(l) && mt == "olmo3" { RopeScaling::None } else { scaling.clone() },
                }))
                .with_sinks(if gpt_oss { Some(w.get(&format!("{p}.self_attn.sinks"), &[h])?) } else { None })
                .with_qk_norm(if qk_norm {
                    // Qwen3: over each head's head_dim; OLMo-2, OLMoE: over the whole projection.
                    let per_head = !all_heads_qk;
                    let width = |n: i64| if per_head { dh } else { n * dh };
                    let norm = |w: &mut Weights, name: &str, n: i64| -> Result<Norm, ModelError> {
                        Ok(Norm {
                            kind: NormKind::Rms,
                            weight: w.get(&format!("{p}.self_attn.{name}.weight"), &[width(n)])?,
                            bias: None,
                            eps,
                        })
                    };
                    Some(QkNorm { q: norm(&mut w, "q_norm", h)?, k: norm(&mut w, "k_norm", hk)?, per_head })
                } else {
                    None
                }),
                rms(
                    &mut w,
                    format!("{p}.{}.weight", if olmo2 { "post_attention_layernorm" } else { "input_layernorm" }),
                )?,
                mlp(&mut w, &p, cfg, moe.as_ref().filter(|m| m.sparse(l)), d)?,
                rms(
                    &mut w,
                    format!(
                        "{p}.{}.weight",
                        if olmo2 { "post_feedforward_layernorm" } else { "post_attention_layernorm" }
                    ),
                )?,
                if olmo2 { NormPosition::PostSublayer } else { NormPosition::Pre },
            )
            .with_window(if sliding(l) { cfg.sliding_window } else { None }),
        );
    }
    let tokens = w.get("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let output = w.output_or_tied("lm_head.weight", &tokens, cfg.tie_word_embeddings)?;
    let embed = Embeddings { tokens, scale: 1.0, positions: Positions::None, token_type: None, norm: None };
    let final_norm = rms(&mut w, "model.norm.weight".into())?;
    let mut net = Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        max_positions,
    );
    net.window = window;
    Ok(net)
}

/// A llama-shaped config's checks (Llama 4's too): a SiLU MLP, query heads a positive multiple
/// of the key/value heads, an even positive head size (`head_dim`, else `d / h`); the key/value
/// heads and the head size.
pub(crate) fn silu_heads(
    act: &str,
    d: i64,
    h: i64,
    kv: Option<i64>,
    head_dim: Option<i64>,
) -> Result<(i64, i64), String> {
    if act != "silu" {
        return Err(format!("hidden_act '{act}' is not supported (silu)"));
    }
    let hk = kv.unwrap_or(h);
    if h <= 0 || hk <= 0 || h % hk != 0 {
        return Err(format!("num_attention_heads {h} is not a positive multiple of num_key_value_heads {hk}"));
    }
    let dh = head_dim.unwrap_or(if d % h == 0 { d / h } else { 0 });
    if dh <= 0 || dh % 2 != 0 {
        return Err(format!(
            "head size {dh} (head_dim, else hidden_size {d} / num_attention_heads {h}) must be a positive even number"
        ));
    }
    Ok((hk, dh))
}

/// A mixture-of-experts family's settings (docs/methods.md#experts).
struct Moe {
    n: i64,
    top_k: i64,
    renormalise: bool,
    width: i64,
    /// Qwen2-MoE's shared expert's width.
    shared: Option<i64>,
    /// Checkpoint names: the block (`block_sparse_moe`, `mlp`) and each expert's gate, up and
    /// down projections.
    block: &'static str,
    names: [&'static str; 3],
    step: usize,
    dense: Vec<usize>,
    /// gpt-oss's clamped SwiGLU: `(alpha, limit)`.
    clamp: (f64, f64),
}

impl Moe {
    /// Whether layer `l` has experts (Qwen's `mlp_only_layers` and `decoder_sparse_step`).
    fn sparse(&self, l: usize) -> bool {
        !self.dense.contains(&l) && (l + 1).is_multiple_of(self.step.max(1))
    }
}

/// The experts of a MoE `model_type` (transformers' defaults where the config is silent), `None`
/// for a dense one.
fn moe_of(cfg: &Config) -> Result<Option<Moe>, String> {
    let mt = cfg.model_type.as_str();
    // transformers' defaults: experts per layer, chosen per token.
    let (n_default, k_default) = match mt {
        "mixtral" => (8, 2),
        "olmoe" => (64, 8),
        "qwen2_moe" => (60, 4),
        "qwen3_moe" => (128, 8),
        "gpt_oss" => (128, 4),
        _ => return Ok(None),
    };
    // Mixtral and gpt-oss count their experts in num_local_experts, the others in num_experts.
    let local = matches!(mt, "mixtral" | "gpt_oss");
    let n = if local { cfg.moe.num_local_experts } else { cfg.moe.num_experts }.unwrap_or(n_default);
    let top_k = cfg.moe.num_experts_per_tok.unwrap_or(k_default);
    // Mixtral always renormalises; gpt-oss's routing has no such switch (Routing::TopKSoftmax).
    let renormalise = mt == "mixtral" || (mt != "gpt_oss" && cfg.moe.norm_topk_prob.unwrap_or(false));
    let (block, names) = if mt == "mixtral" {
        ("block_sparse_moe", ["w1", "w3", "w2"])
    } else {
        ("mlp", ["gate_proj", "up_proj", "down_proj"])
    };
    if n <= 0 || top_k <= 0 || top_k > n {
        return Err(format!("num_experts_per_tok {top_k} must be between 1 and the {n} experts"));
    }
    let qwen = mt.starts_with("qwen");
    let width =
        if qwen { cfg.moe.moe_intermediate_size.unwrap_or(cfg.intermediate_size) } else { cfg.intermediate_size };
    let shared = if mt == "qwen2_moe" {
        // transformers' default width (5632) where the config gives none; 0: no shared expert.
        Some(cfg.moe.shared_expert_intermediate_size.unwrap_or(5632)).filter(|&s| s > 0)
    } else {
        None
    };
    let step = if qwen { cfg.moe.decoder_sparse_step.unwrap_or(1) } else { 1 };
    if step == 0 {
        return Err("decoder_sparse_step 0: no layer could have experts".into());
    }
    let dense = if qwen { cfg.moe.mlp_only_layers.clone().unwrap_or_default() } else { vec![] };
    if mt != "gpt_oss" {
        if let Some(key) = [("swiglu_alpha", cfg.moe.swiglu_alpha), ("swiglu_limit", cfg.moe.swiglu_limit)]
            .iter()
            .find_map(|(k, v)| v.map(|_| *k))
        {
            return Err(format!("{key} is gpt-oss's clamped SwiGLU; model_type '{mt}' has no such experts"));
        }
    }
    let clamp = (cfg.moe.swiglu_alpha.unwrap_or(1.702), cfg.moe.swiglu_limit.unwrap_or(7.0));
    for (key, v) in [("swiglu_alpha", clamp.0), ("swiglu_limit", clamp.1)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{key} {v} must be a positive number"));
        }
    }
    Ok(Some(Moe { n, top_k, renormalise, width, shared, block, names, step, dense, clamp }))
}

/// Layer `p`'s MLP: a dense SwiGLU, or the layer's experts where `moe` says it has them.
fn mlp(w: &mut Weights, p: &str, cfg: &Config, moe: Option<&Moe>, d: i64) -> Result<Box<dyn Mlp>, ModelError> {
    let swiglu = |w: &mut Weights, at: &str, names: [&str; 3], width: i64, bias: bool| -> Result<Ffn, ModelError> {
        let mut w = w.scoped(at);
        Ok(Ffn {
            gate: Some(w.linear(names[0], width, d, bias)?),
            up: w.linear(names[1], width, d, bias)?,
            down: w.linear(names[2], d, width, bias)?,
            act: Activation::Silu,
        })
    };
    let Some(m) = moe else {
        return Ok(Box::new(swiglu(
            w,
            p,
            ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"],
            cfg.intermediate_size,
            cfg.mlp_bias,
        )?));
    };
    let block = format!("{p}.{}", m.block);
    if cfg.model_type == "gpt_oss" {
        return gpt_oss_experts(w, &block, m, d);
    }
    let router = w.scoped(&block).linear("gate", m.n, d, false)?;
    let experts = (0..m.n)
        .map(|e| Ok(Expert::SwiGlu(swiglu(w, &format!("{block}.experts.{e}"), m.names, m.width, false)?)))
        .collect::<Result<Vec<_>, ModelError>>()?;
    let shared = match m.shared {
        Some(s) => Some((
            swiglu(w, &format!("{block}.shared_expert"), m.names, s, false)?,
            Some(w.scoped(&block).linear("shared_expert_gate", 1, d, false)?),
        )),
        None => None,
    };
    let routing = Routing::Softmax { renormalise: m.renormalise };
    Ok(Box::new(Experts::new(router, experts, m.top_k, routing, shared)))
}

/// gpt-oss's experts (transformers' `GptOssMLP`): a router with a bias whose top `k` logits are
/// softmaxed, and every expert's gate and up projections fused, `gate_up_proj [E, D, 2I]` (input
/// rows, gate and up interleaved column by column) with `gate_up_proj_bias [E, 2I]`, and
/// `down_proj [E, I, D]` with `down_proj_bias [E, D]`: split here into each expert's three
/// projections, clamped SwiGLUs (`swiglu_alpha`, default 1.702, and `swiglu_limit`, default 7,
/// as transformers 5 reads them; 4.57 fixes the defaults).
fn gpt_oss_experts(w: &mut Weights, block: &str, m: &Moe, d: i64) -> Result<Box<dyn Mlp>, ModelError> {
    let (n, i) = (m.n, m.width);
    let router = w.scoped(block).linear("router", n, d, true)?;
    let gate_up = w.get(&format!("{block}.experts.gate_up_proj"), &[n, d, 2 * i])?;
    let gate_up_b = w.get(&format!("{block}.experts.gate_up_proj_bias"), &[n, 2 * i])?;
    let down = w.get(&format!("{block}.experts.down_proj"), &[n, i, d])?;
    let down_b = w.get(&format!("{block}.experts.down_proj_bias"), &[n, d])?;
    let mut experts = Vec::new();
    for e in 0..n {
        // Columns 0, 2, 4, .. of the fused projection are the gate's, 1, 3, 5, .. the up's.
        let half = |t: &Tensor, first: i64| -> Result<Tensor, ModelError> {
            Ok(t.f_get(e)?.f_slice(-1, first, 2 * i, 2)?.f_contiguous()?)
        };
        let linear = |wt: Tensor, b: Tensor| -> Result<Linear, ModelError> {
            Ok(Linear { w: wt.f_transpose(0, 1)?.f_contiguous()?, b: Some(b) })
        };
        experts.push(Expert::Clamped {
            gate: linear(half(&gate_up, 0)?, half(&gate_up_b, 0)?)?,
            up: linear(half(&gate_up, 1)?, half(&gate_up_b, 1)?)?,
            down: linear(down.f_get(e)?, down_b.f_get(e)?)?,
            alpha: m.clamp.0,
            limit: m.clamp.1,
        });
    }
    Ok(Box::new(Experts::new(router, experts, m.top_k, Routing::TopKSoftmax, None)))
}
