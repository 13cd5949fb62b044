//! Decoder-only checkpoints in GGUF of the architectures `llama` (SmolLM2-135M in the assets),
//! `qwen2` and `qwen3`, built by the HF llama code (`llama::build`), and `gemma`, `gemma2`,
//! `gemma3` (Gemma 3 270M in the assets), built by the HF Gemma code (`gemma::build`), from the
//! metadata and the tensors renamed to HF's names: RMSNorm before each sublayer, rotary
//! positions, grouped-query causal self-attention (Qwen2's Q/K/V biases, Qwen3's and Gemma 3's
//! per-head q/k norms), SwiGLU or GeGLU FFN, a final RMSNorm, and an output projection tied to
//! the embeddings unless `output.weight` exists.
//! Settings come from the GGUF metadata (`ARCH.*`), with llama.cpp's fixed values where the
//! metadata has none (Gemma 3: every sixth layer global, local rotary base 10000; Gemma 2:
//! alternating); the tokenizer is the directory's `tokenizer.json` when there is one, else the
//! GGUF's own (`gguf_tokenizer`). llama.cpp's converter permutes a llama checkpoint's Q/K rows
//! into adjacent rotary pairs, and leaves Qwen's and Gemma's in HF's rotate-half order (their
//! NEOX rope); it stores Gemma's RMSNorm weights as `1 + w`, which are read back as `w` (as
//! transformers' GGUF loader does).

use super::gguf::{Gguf, Value};
use super::llama::{build, Config, RotaryRows};
use super::transformer::Transformer;
use super::weights::Weights;
use super::{LoadOptions, ModelError};
use std::path::{Path, PathBuf};

/// The one `*.gguf` of a directory.
pub fn find_gguf(dir: &Path) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "gguf")).collect();
    (v.len() == 1).then(|| v.remove(0))
}

/// A GGUF tensor name -> the HF name of the same tensor (`arch` decides what `ffn_norm` is:
/// Gemma 2/3's norm before the MLP has a name of its own).
fn hf_name(arch: &str, name: &str) -> String {
    if let Some(rest) = name.strip_prefix("blk.") {
        if let Some((l, part)) = rest.split_once('.') {
            let (module, suffix) = part.rsplit_once('.').unwrap_or((part, "weight"));
            let hf = match module {
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "attn_norm" => "input_layernorm",
                "ffn_norm" if arch == "gemma2" || arch == "gemma3" => "pre_feedforward_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "post_attention_norm" => "post_attention_layernorm",
                "post_ffw_norm" => "post_feedforward_layernorm",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                "ffn_gate" => "mlp.gate_proj",
                _ => return name.to_string(),
            };
            return format!("model.layers.{l}.{hf}.{suffix}");
        }
    }
    match name {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        other => other.to_string(),
    }
}

/// The GGUF's metadata as the HF llama config and its tensors under HF's names, built by the
/// same code as HF llama checkpoints (`llama::build`); the Q/K rows are already in adjacent
/// pairs.
pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let path = find_gguf(dir).ok_or_else(|| ModelError::Io(dir.display().to_string(), "no single *.gguf in the directory".into()))?;
    let g = Gguf::open(&path)?;
    let file = path.display().to_string();
    let bad = |why: String| ModelError::Config(file.clone(), why);
    let arch = g.metadata.get("general.architecture").and_then(Value::as_str).unwrap_or_default().to_string();
    let rows = match arch.as_str() {
        "llama" => RotaryRows::Adjacent,
        "qwen2" | "qwen3" | "gemma" | "gemma2" | "gemma3" => RotaryRows::RotateHalf,
        _ => return Err(bad(format!("architecture '{arch}' is not supported (llama, qwen2, qwen3, gemma, gemma2, gemma3 are)"))),
    };
    let key = |k: &str| format!("{arch}.{k}");
    let scaling = g.metadata.get(&key("rope.scaling.type")).and_then(Value::as_str).filter(|t| *t != "none");
    if let Some(t) = scaling.filter(|t| !(*t == "linear" && arch.starts_with("gemma"))) {
        return Err(bad(format!("metadata {}: rope scaling '{t}' is not supported in GGUF files of '{arch}' yet", key("rope.scaling.type"))));
    }
    let int = |k: &str| g.metadata.get(&key(k)).and_then(Value::as_u64).map(|v| v as i64).ok_or_else(|| bad(format!("metadata {} is missing", key(k))));
    let (n_layers, d, ff, h) = (int("block_count")? as usize, int("embedding_length")?, int("feed_forward_length")?, int("attention.head_count")?);
    let hk = int("attention.head_count_kv").unwrap_or(h);
    // Qwen3's and Gemma's heads are wider than d / h: the key length says.
    let key_length = int("attention.key_length").ok();
    if h <= 0 || hk <= 0 || h % hk != 0 || (key_length.is_none() && d % h != 0) {
        return Err(bad(format!("{h} heads and {hk} key/value heads do not fit a model of size {d}")));
    }
    let float = |k: &str| g.metadata.get(&key(k)).and_then(Value::as_f64);
    let eps = float("attention.layer_norm_rms_epsilon").ok_or_else(|| bad(format!("metadata {} is missing", key("attention.layer_norm_rms_epsilon"))))?;
    let eos = g.metadata.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).unwrap_or(0) as i64;
    let gemma = arch.starts_with("gemma");
    let map: std::collections::HashMap<String, tch::Tensor> = g
        .tensors
        .iter()
        .map(|t| {
            let x = g.tensor(&t.name)?;
            // llama.cpp wrote Gemma's norms as 1 + w.
            let x = if gemma && t.name.ends_with("norm.weight") { x - 1.0 } else { x };
            Ok((hf_name(&arch, &t.name), x))
        })
        .collect::<Result<_, ModelError>>()?;
    let vocab = map.get("model.embed_tokens.weight").map(|t| t.size()[0]).ok_or_else(|| ModelError::MissingTensor { file: file.clone(), name: "token_embd.weight".into() })?;
    let head_dim = key_length.unwrap_or(d / h);
    if gemma {
        // llama.cpp's fixed Gemma settings: the 27B models (62 layers for Gemma 3, 46 for
        // Gemma 2) scale scores by (hidden / heads)^-1/2, the others by head_dim^-1/2.
        let big = (arch == "gemma3" && n_layers == 62) || (arch == "gemma2" && n_layers == 46);
        let rope_scaling = match scaling {
            Some(_) => Some(serde_json::json!({"rope_type": "linear", "factor": float("rope.scaling.factor").ok_or_else(|| bad(format!("metadata {} is missing", key("rope.scaling.factor"))))?})),
            None => None,
        };
        let cfg = super::gemma::Config {
            model_type: if arch == "gemma3" { "gemma3_text".into() } else { arch.clone() },
            vocab_size: vocab,
            hidden_size: d,
            intermediate_size: ff,
            num_hidden_layers: n_layers,
            num_attention_heads: h,
            num_key_value_heads: Some(hk),
            head_dim,
            hidden_activation: Some("gelu_pytorch_tanh".into()),
            hidden_act: None,
            max_position_embeddings: int("context_length").ok(),
            rms_norm_eps: eps,
            rope_theta: float("rope.freq_base").unwrap_or(10000.0),
            rope_scaling,
            rope_local_base_freq: Some(10000.0),
            attention_bias: false,
            query_pre_attn_scalar: Some(if big { (d / h) as f64 } else { head_dim as f64 }),
            sliding_window: int("attention.sliding_window").ok(),
            layer_types: None,
            sliding_window_pattern: Some(6),
            final_logit_softcapping: float("final_logit_softcapping"),
            attn_logit_softcapping: float("attn_logit_softcapping"),
            tie_word_embeddings: !map.contains_key("lm_head.weight"),
            eos_token_id: Some(eos.into()),
        };
        return super::gemma::build(&cfg, &file, Weights::new(map, file.clone(), opts, None), opts);
    }
    let cfg = Config {
        model_type: arch.clone(),
        hidden_size: d,
        intermediate_size: ff,
        num_hidden_layers: n_layers,
        num_attention_heads: h,
        num_key_value_heads: Some(hk),
        head_dim: Some(head_dim),
        rms_norm_eps: eps,
        rope_theta: float("rope.freq_base").unwrap_or(10000.0),
        vocab_size: vocab,
        tie_word_embeddings: !map.contains_key("lm_head.weight"),
        hidden_act: "silu".into(),
        rope_scaling: None,
        max_position_embeddings: int("context_length").ok(),
        original_max_position_embeddings: None,
        partial_rotary_factor: None,
        attention_bias: false,
        mlp_bias: false,
        sliding_window: None,
        use_sliding_window: None,
        eos_token_id: Some(eos.into()),
        rope_dim: int("rope.dimension_count").ok(),
    };
    build(&cfg, &file, Weights::new(map, file.clone(), opts, None), rows)
}
