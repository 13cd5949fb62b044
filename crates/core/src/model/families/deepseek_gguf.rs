//! DeepSeek-V2 / V3 in GGUF (`general.architecture` `deepseek2`), as llama.cpp's converter
//! writes them, built by the HF DeepSeek code (`deepseek::build`) from the metadata and the
//! tensors renamed to HF's names:
//! - the latents: `attn_q_a`, `attn_q_a_norm`, `attn_q_b` (or `attn_q` where there is no query
//!   latent), `attn_kv_a_mqa`, `attn_kv_a_norm`, and the per-head up-projection either as
//!   `attn_kv_b` (older files) or split in two, `attn_k_b` `[H, kv_lora_rank, nope]` (transposed)
//!   and `attn_v_b` `[H, v, kv_lora_rank]` (newer files, for llama.cpp's absorbed MLA), joined
//!   back here into HF's `kv_b_proj`;
//! - the widths: `key_length_mla` / `value_length_mla` where present (the per-head widths;
//!   `key_length` / `value_length` then describe llama.cpp's MQA cache), else `key_length` /
//!   `value_length`; `rope.dimension_count` the rotary part; `head_count_kv` (1 in the MQA form) is
//!   not read, every head has its own keys and values;
//! - the experts: `leading_dense_block_count` dense layers, then each layer's experts stacked
//!   per projection (split at load), `ffn_gate_inp` the router, `exp_probs_b.bias` V3's choice
//!   bias, `ffn_*_shexp` the shared experts (`expert_shared_count` of them, one SwiGLU);
//! - the router: `expert_gating_func` 2 (sigmoid) is DeepSeek-V3's (groups ranked by their two
//!   best experts, renormalised where `expert_weights_norm`), 1 or none (llama.cpp's default:
//!   softmax) DeepSeek-V2's (greedy, or group-limited where `expert_group_count` > 1, never
//!   renormalised, as transformers computes it); `expert_weights_scale` (none: 1) scales the
//!   routed experts' sum;
//! - YaRN: `rope.scaling.factor`, `original_context_length`, `yarn_beta_fast` / `_slow` (none:
//!   32 / 1) and `yarn_log_multiplier` = 0.1 `mscale_all_dim` (llama.cpp's convention, with
//!   `mscale` = `mscale_all_dim`, as every DeepSeek-V3 config has it).
//!
//! The rotary dimensions stay in adjacent pairs (llama.cpp's converter does not permute them:
//! its rope for `deepseek2` is the interleaved one).

use crate::model::families::deepseek::{build, Config};
use crate::model::families::llama_gguf::{split_experts, vocab_rows, Meta};
use crate::model::readers::gguf::{Gguf, Value};
use crate::model::readers::weights::Weights;
use crate::model::transformer::Transformer;
use crate::model::{LoadOptions, ModelError};
use std::collections::HashMap;
use tch::Tensor;

/// A `deepseek2` GGUF tensor name -> the HF name (`None`: a name this family does not know).
fn hf_name(name: &str) -> Option<String> {
    let fixed = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.into());
    }
    let (l, part) = name.strip_prefix("blk.")?.split_once('.')?;
    if part == "exp_probs_b.bias" {
        return Some(format!("model.layers.{l}.mlp.gate.e_score_correction_bias"));
    }
    let (module, suffix) = part.rsplit_once('.')?;
    let hf = match module {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_q_a" => "self_attn.q_a_proj",
        "attn_q_a_norm" => "self_attn.q_a_layernorm",
        "attn_q_b" => "self_attn.q_b_proj",
        "attn_kv_a_mqa" => "self_attn.kv_a_proj_with_mqa",
        "attn_kv_a_norm" => "self_attn.kv_a_layernorm",
        "attn_kv_b" => "self_attn.kv_b_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "ffn_gate_inp" => "mlp.gate",
        "ffn_gate_shexp" => "mlp.shared_experts.gate_proj",
        "ffn_up_shexp" => "mlp.shared_experts.up_proj",
        "ffn_down_shexp" => "mlp.shared_experts.down_proj",
        // Stacked experts (split later) and the split k_b / v_b keep their GGUF names.
        _ => return Some(name.to_string()),
    };
    Some(format!("model.layers.{l}.{hf}.{suffix}"))
}

/// The model a `deepseek2` GGUF holds.
pub fn load(g: &Gguf, file: &str, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let meta = Meta { g, arch: "deepseek2", file };
    let bad = |why: String| ModelError::Config(file.to_string(), why);
    let int = |k: &str| meta.int(k);
    let opt_int = |k: &str| meta.int(k).ok();
    let float = |k: &str| meta.float(k);
    let n_layers = meta.blocks()?;
    let h = int("attention.head_count")?;
    let rope_dim = int("rope.dimension_count")?;
    let kv_rank = int("attention.kv_lora_rank")?;
    // Newer files: `*_mla` the per-head widths; older: `key_length` / `value_length`.
    let (qk, v_dim) = match (opt_int("attention.key_length_mla"), opt_int("attention.value_length_mla")) {
        (Some(k), Some(v)) => (k, v),
        _ => (int("attention.key_length")?, int("attention.value_length")?),
    };
    let nope = qk - rope_dim;
    if nope <= 0 || v_dim <= 0 || h <= 0 {
        return Err(bad(format!(
            "metadata: key length {qk} (rotary {rope_dim}), value length {v_dim} and {h} heads do not describe latent attention"
        )));
    }
    let eps = float("attention.layer_norm_rms_epsilon")
        .ok_or_else(|| bad(format!("metadata {} is missing", meta.key("attention.layer_norm_rms_epsilon"))))?;
    let gating = opt_int("expert_gating_func").unwrap_or(1);
    let v3 = match gating {
        1 => false,
        2 => true,
        other => {
            return Err(bad(format!(
                "metadata {}: gating function {other} is not DeepSeek's (1 softmax, 2 sigmoid)",
                meta.key("expert_gating_func")
            )))
        }
    };
    let norm = g.metadata.get(&meta.key("expert_weights_norm")).and_then(Value::as_bool).unwrap_or(false);
    if norm && !v3 {
        return Err(bad(format!(
            "metadata {}: renormalised softmax routing is not DeepSeek-V2 as transformers computes it",
            meta.key("expert_weights_norm")
        )));
    }
    let groups = opt_int("expert_group_count").unwrap_or(1);
    let top_groups = opt_int("expert_group_used_count").unwrap_or(groups);
    let n_experts = int("expert_count")?;
    let width = int("expert_feed_forward_length")?;
    let dense = opt_int("leading_dense_block_count").unwrap_or(0) as usize;
    let d = int("embedding_length")?;

    let mut map: HashMap<String, Tensor> = HashMap::new();
    for t in &g.tensors {
        let name = hf_name(&t.name).ok_or_else(|| bad(format!("tensor '{}' is not a deepseek2 tensor", t.name)))?;
        map.insert(name, g.tensor_as(&t.name, opts.dtype)?);
    }
    join_kv_b(&mut map, n_layers, h, file)?;
    split_experts(&mut map, dense..n_layers, n_experts, width, d, file)?;
    let vocab = vocab_rows(&map, "model.embed_tokens.weight", "token_embd.weight", file)?;
    let scaling = g.metadata.get(&meta.key("rope.scaling.type")).and_then(Value::as_str).filter(|t| *t != "none");
    let rope_scaling = match scaling {
        None => None,
        Some("yarn") => {
            let all = float("rope.scaling.yarn_log_multiplier").unwrap_or(0.0) / 0.1;
            let mut s = meta.yarn()?;
            s["mscale"] = all.into();
            s["mscale_all_dim"] = all.into();
            Some(s)
        }
        Some(t) => {
            return Err(bad(format!(
                "metadata {}: rope scaling '{t}' is not supported in deepseek2 GGUF files (yarn is)",
                meta.key("rope.scaling.type")
            )))
        }
    };
    let shared = opt_int("expert_shared_count").unwrap_or(0);
    let cfg = Config {
        model_type: if v3 { "deepseek_v3" } else { "deepseek_v2" }.into(),
        hidden_size: d,
        intermediate_size: int("feed_forward_length")?,
        num_hidden_layers: n_layers,
        num_attention_heads: h,
        num_key_value_heads: None,
        rms_norm_eps: eps,
        rope_theta: Some(float("rope.freq_base").unwrap_or(10000.0)),
        rope_scaling,
        rope_parameters: None,
        vocab_size: vocab,
        tie_word_embeddings: !map.contains_key("lm_head.weight"),
        hidden_act: "silu".into(),
        max_position_embeddings: opt_int("context_length"),
        attention_bias: false,
        mlp_bias: false,
        eos_token_id: g.metadata.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).map(|e| e.into()),
        q_lora_rank: Some(opt_int("attention.q_lora_rank")),
        kv_lora_rank: Some(kv_rank),
        qk_nope_head_dim: Some(nope),
        qk_rope_head_dim: Some(rope_dim),
        v_head_dim: Some(v_dim),
        qk_head_dim: None,
        head_dim: None,
        rope_interleave: v3.then_some(true),
        n_routed_experts: Some(n_experts),
        n_shared_experts: Some((shared > 0).then_some(shared)),
        moe_intermediate_size: Some(width),
        num_experts_per_tok: Some(int("expert_used_count")?),
        n_group: Some(Some(groups)),
        topk_group: Some(Some(top_groups)),
        topk_method: Some(
            match (v3, groups > 1) {
                (true, _) => "noaux_tc",
                (false, true) => "group_limited_greedy",
                (false, false) => "greedy",
            }
            .into(),
        ),
        scoring_func: None,
        routed_scaling_factor: Some(float("expert_weights_scale").unwrap_or(1.0)),
        norm_topk_prob: Some(norm),
        first_k_dense_replace: Some(dense),
        moe_layer_freq: None,
    };
    build(&cfg, file, Weights::new(map, file.to_string(), opts, None))
}

/// Newer files' `attn_k_b` `[H, kv_rank, nope]` and `attn_v_b` `[H, v, kv_rank]` joined into HF's
/// `kv_b_proj` `[H (nope + v), kv_rank]` (each head's key rows, then its value rows); a file with
/// one of the two and not the other, or of other shapes, is an error naming the tensor.
fn join_kv_b(map: &mut HashMap<String, Tensor>, n_layers: usize, h: i64, file: &str) -> Result<(), ModelError> {
    for l in 0..n_layers {
        let (kn, vn) = (format!("blk.{l}.attn_k_b.weight"), format!("blk.{l}.attn_v_b.weight"));
        let (k, v) = match (map.remove(&kn), map.remove(&vn)) {
            (None, None) => continue,
            (Some(k), Some(v)) => (k, v),
            (k, _) => {
                let name = if k.is_none() { kn } else { vn };
                return Err(ModelError::MissingTensor { file: file.to_string(), name });
            }
        };
        let (ks, vs) = (k.size(), v.size());
        if ks.len() != 3 || vs.len() != 3 || ks[0] != h || vs[0] != h || ks[1] != vs[2] {
            let want = vec![h, vs.get(2).copied().unwrap_or(-1), ks.get(2).copied().unwrap_or(-1)];
            return Err(ModelError::BadShape { file: file.to_string(), name: kn, want, got: ks });
        }
        let kv = Tensor::f_cat(&[k.f_transpose(1, 2)?, v], 1)?;
        let rows = kv.size()[1];
        map.insert(format!("model.layers.{l}.self_attn.kv_b_proj.weight"), kv.f_reshape([h * rows, ks[1]])?);
    }
    Ok(())
}
