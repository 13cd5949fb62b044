//! What each HF family reads of `config.json`, as data (docs/formats.md#config-keys): the keys
//! its loader reads, and the keys it knows to be harmless, each with its reason. A key outside
//! both, a harmless-when key at another value, an unknown `rope_type` or an unknown key inside
//! the rope settings is refused by default (one line naming the file, the key and what to do);
//! under `allow_unknown_config` it is dropped with a warning instead.
//!
//! `tests/fixtures/config_keys_reference.py` lists every `config.X` transformers' modeling file
//! of each family reads (`config_keys_tf5.json`); `tests/models/config_keys.rs` checks each is
//! read here or listed harmless.

use serde_json::Value;

/// When a harmless key is harmless.
#[derive(Debug, Clone, Copy)]
pub enum When {
    /// At any value.
    Always,
    /// At this value (JSON text) or `null`: another value changes the computation.
    Is(&'static str),
}

/// One family's keys.
#[derive(Debug)]
pub struct Keys {
    /// The `model_type`s this entry covers.
    pub model_types: &'static [&'static str],
    /// Keys the loader reads (and checks).
    pub reads: &'static [&'static str],
    /// Keys that change nothing headscope computes, with why.
    pub harmless: &'static [(&'static str, When, &'static str)],
}

const GENERATION: &str = "a generation setting (headscope decodes greedily; analyses read no sampling setting)";
const TRAINING: &str = "training only (no dropout, initialisation or layer drop at inference)";
const BOOKKEEPING: &str = "bookkeeping of transformers (names, versions, task heads headscope does not load)";
const OUTPUTS: &str = "what transformers returns, not what it computes";
const SPECIAL: &str = "a special token's id: the tokenizer places it, the forward does not read it";

/// Keys every family may carry (transformers' `PretrainedConfig`).
pub const COMMON: &[(&str, When, &str)] = &[
    ("_name_or_path", When::Always, BOOKKEEPING),
    ("_model_name_or_path", When::Always, BOOKKEEPING),
    ("_commit_hash", When::Always, BOOKKEEPING),
    ("_attn_implementation", When::Always, "transformers' kernel choice (eager, sdpa, flash): the same function"),
    ("architectures", When::Always, BOOKKEEPING),
    ("transformers_version", When::Always, BOOKKEEPING),
    ("model_type", When::Always, "read to pick the family"),
    (
        "dtype",
        When::Always,
        "the dtype the weights were saved in: headscope loads in the dtype asked (load_model's dtype)",
    ),
    ("torch_dtype", When::Always, "transformers 4's name of dtype"),
    ("id2label", When::Always, BOOKKEEPING),
    ("label2id", When::Always, BOOKKEEPING),
    ("num_labels", When::Always, BOOKKEEPING),
    ("problem_type", When::Always, BOOKKEEPING),
    ("finetuning_task", When::Always, BOOKKEEPING),
    ("task_specific_params", When::Always, BOOKKEEPING),
    ("prefix", When::Always, BOOKKEEPING),
    ("tokenizer_class", When::Always, BOOKKEEPING),
    ("auto_map", When::Always, BOOKKEEPING),
    ("output_attentions", When::Always, OUTPUTS),
    ("output_hidden_states", When::Always, OUTPUTS),
    ("return_dict", When::Always, OUTPUTS),
    ("torchscript", When::Always, OUTPUTS),
    ("use_bfloat16", When::Always, "a TPU training switch"),
    ("tf_legacy_loss", When::Always, TRAINING),
    ("chunk_size_feed_forward", When::Always, "splits the MLP into chunks: the same numbers, less memory"),
    ("use_cache", When::Always, "whether transformers keeps a key/value cache: the same numbers"),
    ("gradient_checkpointing", When::Always, TRAINING),
    ("initializer_range", When::Always, TRAINING),
    ("initializer_factor", When::Always, TRAINING),
    ("init_std", When::Always, TRAINING),
    ("bad_words_ids", When::Always, GENERATION),
    ("begin_suppress_tokens", When::Always, GENERATION),
    ("suppress_tokens", When::Always, GENERATION),
    ("diversity_penalty", When::Always, GENERATION),
    ("do_sample", When::Always, GENERATION),
    ("early_stopping", When::Always, GENERATION),
    ("encoder_no_repeat_ngram_size", When::Always, GENERATION),
    ("no_repeat_ngram_size", When::Always, GENERATION),
    ("exponential_decay_length_penalty", When::Always, GENERATION),
    ("forced_eos_token_id", When::Always, GENERATION),
    ("length_penalty", When::Always, GENERATION),
    ("max_length", When::Always, GENERATION),
    ("min_length", When::Always, GENERATION),
    ("num_beam_groups", When::Always, GENERATION),
    ("num_beams", When::Always, GENERATION),
    ("num_return_sequences", When::Always, GENERATION),
    ("output_scores", When::Always, GENERATION),
    ("remove_invalid_values", When::Always, GENERATION),
    ("repetition_penalty", When::Always, GENERATION),
    ("return_dict_in_generate", When::Always, GENERATION),
    ("temperature", When::Always, GENERATION),
    ("top_k", When::Always, GENERATION),
    ("top_p", When::Always, GENERATION),
    ("typical_p", When::Always, GENERATION),
    ("bos_token_id", When::Always, SPECIAL),
    ("pad_token_id", When::Always, SPECIAL),
    ("sep_token_id", When::Always, SPECIAL),
    ("unk_token_id", When::Always, SPECIAL),
    ("is_decoder", When::Is("false"), "true makes a BERT-style model causal"),
    ("add_cross_attention", When::Is("false"), "true adds cross-attention layers"),
    ("tie_encoder_decoder", When::Is("false"), "true shares the encoder's weights with the decoder"),
    ("cross_attention_hidden_size", When::Is("null"), "a cross-attention input of another width"),
    ("pruned_heads", When::Is("{}"), "heads pruned by transformers' prune_heads: the layers' widths differ"),
    ("is_encoder_decoder", When::Is("false"), "true for encoder-decoders (read by those families)"),
    ("decoder_start_token_id", When::Always, SPECIAL),
    ("attention_dropout", When::Always, TRAINING),
    ("classifier_dropout", When::Always, TRAINING),
    ("hidden_dropout", When::Always, TRAINING),
    ("dropout", When::Always, TRAINING),
    ("activation_dropout", When::Always, TRAINING),
    (
        "pretraining_tp",
        When::Always,
        "transformers no longer reads it (it split matmuls into slices, the same product)",
    ),
];

/// The rotary keys of the families with rotary positions (transformers 4 and 5 shapes).
const ROPE: [&str; 3] = ["rope_theta", "rope_scaling", "rope_parameters"];

macro_rules! keys {
    ([$($t:expr),*], reads [$($r:expr),* $(,)?], harmless [$(($h:expr, $w:expr, $why:expr)),* $(,)?]) => {
        Keys { model_types: &[$($t),*], reads: &[$($r),*], harmless: &[$(($h, $w, $why)),*] }
    };
}

/// Every HF family's keys.
pub const TABLE: &[Keys] = &[
    keys!(["llama", "mistral", "qwen2", "qwen3", "olmo2", "olmo3", "phi3", "smollm3"],
        reads ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
               ROPE[0], ROPE[1], ROPE[2], "vocab_size", "tie_word_embeddings", "hidden_act", "max_position_embeddings", "original_max_position_embeddings",
               "partial_rotary_factor", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "layer_types", "eos_token_id",
               "no_rope_layers", "no_rope_layer_interval"],
        harmless [("max_window_layers", When::Always, "Qwen's layers with a window, only under use_sliding_window (refused)"),
                  ("embd_pdrop", When::Always, TRAINING), ("resid_pdrop", When::Always, TRAINING),
                  ("qkv_bias", When::Always, "Qwen2 always has Q/K/V biases (read from the family)")]),
    keys!(["mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "gpt_oss"],
        reads ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
               ROPE[0], ROPE[1], ROPE[2], "vocab_size", "tie_word_embeddings", "hidden_act", "max_position_embeddings", "attention_bias",
               "sliding_window", "use_sliding_window", "layer_types", "eos_token_id", "num_local_experts", "num_experts", "num_experts_per_tok",
               "norm_topk_prob", "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "clip_qkv",
               "qkv_bias", "swiglu_alpha", "swiglu_limit"],
        harmless [("max_window_layers", When::Always, "Qwen's layers with a window, only under use_sliding_window (refused)"),
                  ("router_aux_loss_coef", When::Always, TRAINING), ("output_router_logits", When::Always, "whether transformers returns the router's logits (headscope hooks them: mlp.hook_router_logits)"),
                  ("router_jitter_noise", When::Always, TRAINING)]),
    keys!(["deepseek_v2", "deepseek_v3"],
        reads ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", ROPE[0], ROPE[1],
               ROPE[2], "vocab_size", "tie_word_embeddings", "hidden_act", "max_position_embeddings", "attention_bias", "mlp_bias", "eos_token_id",
               "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim", "head_dim", "rope_interleave",
               "n_routed_experts", "n_shared_experts", "moe_intermediate_size", "num_experts_per_tok", "n_group", "topk_group", "topk_method",
               "scoring_func", "routed_scaling_factor", "norm_topk_prob", "first_k_dense_replace", "moe_layer_freq"],
        harmless [("aux_loss_alpha", When::Always, TRAINING), ("seq_aux", When::Always, TRAINING),
                  ("ep_size", When::Always, "expert parallelism across devices: the same numbers"),
                  ("num_nextn_predict_layers", When::Always, "DeepSeek-V3's multi-token-prediction layers, which transformers does not load either"),
                  ("output_router_logits", When::Always, "whether transformers returns the router's logits (headscope hooks them: mlp.hook_router_logits)")]),
    keys!(["llama4_text"],
        reads ["hidden_size", "intermediate_size", "intermediate_size_mlp", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "rms_norm_eps", ROPE[0], ROPE[1], ROPE[2], "vocab_size", "tie_word_embeddings", "hidden_act", "max_position_embeddings", "attention_bias",
               "eos_token_id", "num_experts_per_tok", "num_local_experts", "moe_layers", "interleave_moe_layer_step", "use_qk_norm", "no_rope_layers",
               "no_rope_layer_interval", "attention_chunk_size", "layer_types", "attn_temperature_tuning", "floor_scale", "attn_scale"],
        harmless [("router_aux_loss_coef", When::Always, TRAINING), ("router_jitter_noise", When::Always, TRAINING),
                  ("output_router_logits", When::Always, "whether transformers returns the router's logits (headscope hooks them: mlp.hook_router_logits)")]),
    keys!(["gemma", "gemma2", "gemma3_text"],
        reads ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "hidden_activation", "hidden_act", "max_position_embeddings", "rms_norm_eps", ROPE[0], ROPE[1], ROPE[2], "rope_local_base_freq",
               "attention_bias", "query_pre_attn_scalar", "sliding_window", "layer_types", "sliding_window_pattern", "final_logit_softcapping",
               "attn_logit_softcapping", "tie_word_embeddings", "eos_token_id"],
        harmless [("_sliding_window_pattern", When::Always, "transformers' own copy of sliding_window_pattern, superseded by layer_types"),
                  ("use_bidirectional_attention", When::Is("false"), "true makes Gemma 3 attend both ways (EmbeddingGemma)"),
                  ("cache_implementation", When::Always, "the cache transformers allocates: the same numbers")]),
    keys!(["gpt_neox"],
        reads ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size", "hidden_act", "rotary_pct",
               "partial_rotary_factor", "rotary_emb_base", ROPE[0], ROPE[1], ROPE[2], "max_position_embeddings", "layer_norm_eps",
               "use_parallel_residual", "attention_bias", "tie_word_embeddings", "eos_token_id", "head_dim"],
        harmless []),
    keys!(["gpt2"],
        reads ["n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "n_inner", "layer_norm_epsilon", "activation_function", "eos_token_id"],
        harmless [("n_ctx", When::Always, "an old name of n_positions; the position table's shape is read from the weights"),
                  ("attn_pdrop", When::Always, TRAINING), ("embd_pdrop", When::Always, TRAINING), ("resid_pdrop", When::Always, TRAINING),
                  ("summary_activation", When::Always, BOOKKEEPING), ("summary_first_dropout", When::Always, BOOKKEEPING),
                  ("summary_proj_to_labels", When::Always, BOOKKEEPING), ("summary_last_dropout", When::Always, BOOKKEEPING), ("summary_type", When::Always, BOOKKEEPING), ("summary_use_proj", When::Always, BOOKKEEPING),
                  ("scale_attn_weights", When::Is("true"), "false leaves the scores unscaled"),
                  ("scale_attn_by_inverse_layer_idx", When::Is("false"), "true divides layer l's scores by l + 1"),
                  ("reorder_and_upcast_attn", When::Always, "computes the scores in float32 under half precision: the same function"),
                  ("tie_word_embeddings", When::Is("true"), "GPT-2's output is its token embeddings")]),
    keys!(["bert", "roberta"],
        reads ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act", "layer_norm_eps", "max_position_embeddings",
               "vocab_size", "pad_token_id", "eos_token_id", "type_vocab_size"],
        harmless [("position_embedding_type", When::Is("\"absolute\""), "relative_key positions are another attention"),
                  ("tie_word_embeddings", When::Always, "headscope loads no masked-LM head for BERT and RoBERTa"),
                  ("embedding_size", When::Always, "an embedding width other than hidden_size fails the weights' shape check"),
                  ("hidden_dropout_prob", When::Always, TRAINING), ("attention_probs_dropout_prob", When::Always, TRAINING),
                  ("gradient_checkpointing", When::Always, TRAINING)]),
    keys!(["bart", "marian"],
        reads ["vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
               "decoder_ffn_dim", "activation_function", "max_position_embeddings", "scale_embedding", "pad_token_id", "eos_token_id",
               "decoder_start_token_id", "decoder_vocab_size", "bad_words_ids", "is_encoder_decoder"],
        harmless [("num_hidden_layers", When::Always, "transformers' alias of encoder_layers"),
                  ("encoder_layerdrop", When::Always, TRAINING), ("decoder_layerdrop", When::Always, TRAINING),
                  ("share_encoder_decoder_embeddings", When::Always, "whether the two sides share a table: read from the weights present"),
                  ("tie_word_embeddings", When::Always, "the weights decide: an lm_head.weight present is used, else the decoder's embeddings"),
                  ("normalize_before", When::Is("false"), "BART and MarianMT are post-norm"),
                  ("add_final_layer_norm", When::Is("false"), "a final norm BART does not have"),
                  ("normalize_embedding", When::Is("true"), "BART norms its embeddings"),
                  ("static_position_embeddings", When::Is("false"), "an mBART-50 switch"),
                  ("add_bias_logits", When::Is("false"), "a bias BART does not have"),
                  ("extra_pos_embeddings", When::Is("2"), "BART's position offset"),
                  ("classif_dropout", When::Always, TRAINING), ("num_labels", When::Always, BOOKKEEPING),
                  ("gradient_checkpointing", When::Always, TRAINING), ("force_bos_token_to_be_generated", When::Always, GENERATION),
                  ("forced_bos_token_id", When::Always, GENERATION)]),
    keys!(["m2m_100", "mbart"],
        reads ["vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
               "decoder_ffn_dim", "activation_function", "max_position_embeddings", "scale_embedding", "pad_token_id", "eos_token_id", "bos_token_id",
               "decoder_start_token_id", "forced_bos_token_id", "is_encoder_decoder"],
        harmless [("num_hidden_layers", When::Always, "transformers' alias of encoder_layers"),
                  ("encoder_layerdrop", When::Always, TRAINING), ("decoder_layerdrop", When::Always, TRAINING),
                  ("tie_word_embeddings", When::Always, "the weights decide: an lm_head.weight present is used, else the decoder's embeddings"),
                  ("gradient_checkpointing", When::Always, TRAINING)]),
    keys!(["t5", "mt5"],
        reads ["vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads", "relative_attention_num_buckets",
               "relative_attention_max_distance", "layer_norm_epsilon", "feed_forward_proj", "tie_word_embeddings", "pad_token_id", "eos_token_id",
               "decoder_start_token_id", "is_encoder_decoder", "scale_decoder_outputs"],
        harmless [("dense_act_fn", When::Always, "derived by transformers from feed_forward_proj (read)"),
                  ("is_gated_act", When::Always, "derived by transformers from feed_forward_proj (read)"),
                  ("dropout_rate", When::Always, TRAINING), ("n_positions", When::Always, "unused by T5 (relative positions)"),
                  ("output_past", When::Always, OUTPUTS), ("gradient_checkpointing", When::Always, TRAINING)]),
];

/// The entry of a `model_type`.
pub fn keys_of(model_type: &str) -> Option<&'static Keys> {
    TABLE.iter().find(|k| k.model_types.contains(&model_type))
}

/// What a key is to a family: read, harmless (at its value), or neither (the reason).
fn verdict(keys: &Keys, key: &str, value: &Value) -> Result<(), String> {
    if keys.reads.contains(&key) {
        return Ok(());
    }
    let found = keys.harmless.iter().chain(COMMON).find(|(k, _, _)| *k == key);
    match found {
        Some((_, When::Always, _)) => Ok(()),
        Some((_, When::Is(at), why)) => {
            let want: Value = serde_json::from_str(at).unwrap_or(Value::Null);
            if value.is_null() || *value == want {
                Ok(())
            } else {
                Err(format!("key '{key}' is {value}, and headscope only computes it as {at} ({why})"))
            }
        }
        None => Err(format!("key '{key}' is not read by headscope, so it may compute other numbers than transformers")),
    }
}

/// The unknown rope settings of one rope object, dropped (under `allow`) or refused.
fn vet_rope(
    obj: &mut serde_json::Map<String, Value>,
    label: &str,
    allow: bool,
    out: &mut Vec<String>,
) -> Result<(), String> {
    let kind =
        obj.get("rope_type").or_else(|| obj.get("type")).and_then(|t| t.as_str()).unwrap_or("default").to_string();
    let kind = if kind == "su" { "longrope".to_string() } else { kind };
    let Some((_, known)) = crate::model::readers::hf::ROPE_KEYS.iter().find(|(k, _)| *k == kind) else {
        let supported: Vec<&str> = crate::model::readers::hf::ROPE_KEYS.iter().map(|(k, _)| *k).collect();
        let msg = format!("{label}: rope_type '{kind}' is not supported ({})", supported.join(", "));
        if !allow {
            return Err(msg);
        }
        out.push(format!("{msg}: loaded as 'default' (no scaling), as allow_unknown_config asked; its numbers will differ from transformers'"));
        obj.retain(|k, _| ["rope_theta", "partial_rotary_factor"].contains(&k.as_str()));
        return Ok(());
    };
    let unknown: Vec<String> = obj
        .keys()
        .filter(|k| {
            !["rope_type", "type", "rope_theta", "partial_rotary_factor"].contains(&k.as_str())
                && !known.contains(&k.as_str())
        })
        .cloned()
        .collect();
    for k in unknown {
        let msg = format!(
            "{label}.{k} is not a setting of rope_type '{kind}' (it reads: {})",
            if known.is_empty() { "rope_theta, partial_rotary_factor".to_string() } else { known.join(", ") }
        );
        if !allow {
            return Err(msg);
        }
        out.push(format!("{msg}: ignored, as allow_unknown_config asked"));
        obj.remove(&k);
    }
    Ok(())
}

/// Checks a parsed `config.json` of `model_type` (from `file`) against the family's keys:
/// `Ok(warnings)` with the offending keys removed under `allow`, else the first offence as
/// `Err` (one line: the file, the key, what to do).
pub fn vet(cfg: &mut Value, file: &str, model_type: &str, allow: bool) -> Result<Vec<String>, String> {
    let what_to_do =
        "fix the config, or load with #{allow_unknown_config: true} to proceed anyway (a warning is printed)";
    let fail = |msg: String| format!("{file}: {msg}; {what_to_do}");
    let mut warnings = Vec::new();
    let Some(obj) = cfg.as_object_mut() else { return Ok(warnings) };
    let Some(keys) = keys_of(model_type) else { return Ok(warnings) };
    let mut names: Vec<String> = obj.keys().cloned().collect();
    names.sort();
    for key in names {
        if let Err(msg) = verdict(keys, &key, &obj[&key]) {
            if !allow {
                return Err(fail(format!("{msg} (model_type '{model_type}')")));
            }
            warnings.push(format!("{file}: {msg}: ignored, as allow_unknown_config asked"));
            obj.remove(&key);
        }
    }
    let mut rope_warnings = Vec::new();
    if let Some(Value::Object(s)) = obj.get_mut("rope_scaling") {
        vet_rope(s, "rope_scaling", allow, &mut rope_warnings).map_err(&fail)?;
    }
    if let Some(Value::Object(p)) = obj.get_mut("rope_parameters") {
        let per_type = !p.is_empty()
            && p.iter().all(|(k, v)| crate::model::readers::hf::LAYER_TYPES.contains(&k.as_str()) && v.is_object());
        if per_type {
            for (t, entry) in p.iter_mut() {
                if let Value::Object(e) = entry {
                    vet_rope(e, &format!("rope_parameters.{t}"), allow, &mut rope_warnings).map_err(&fail)?;
                }
            }
        } else {
            vet_rope(p, "rope_parameters", allow, &mut rope_warnings).map_err(&fail)?;
        }
    }
    warnings.extend(rope_warnings.into_iter().map(|w| format!("{file}: {w}")));
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_keys_are_refused_or_dropped_with_a_warning() {
        let mut c = json!({"model_type": "llama", "hidden_size": 8, "frobnicate": 3});
        let e = vet(&mut c.clone(), "c.json", "llama", false).unwrap_err();
        assert!(
            e.starts_with("c.json: key 'frobnicate' is not read by headscope") && e.contains("allow_unknown_config"),
            "{e}"
        );
        let w = vet(&mut c, "c.json", "llama", true).unwrap();
        assert_eq!(w.len(), 1);
        assert!(c.get("frobnicate").is_none());
    }

    #[test]
    fn harmless_when_keys_are_checked_at_their_value() {
        assert!(vet(&mut json!({"scale_attn_weights": true}), "c", "gpt2", false).is_ok());
        let e = vet(&mut json!({"scale_attn_weights": false}), "c", "gpt2", false).unwrap_err();
        assert!(e.contains("scale_attn_weights' is false"), "{e}");
        assert!(vet(&mut json!({"pruned_heads": {}}), "c", "bert", false).is_ok());
        assert!(vet(&mut json!({"pruned_heads": {"0": [1]}}), "c", "bert", false).is_err());
    }

    #[test]
    fn rope_settings_are_vetted_in_both_shapes() {
        let e = vet(
            &mut json!({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "warp": 1}}),
            "c",
            "llama",
            false,
        )
        .unwrap_err();
        assert!(e.contains("rope_parameters.warp is not a setting of rope_type 'linear'"), "{e}");
        let e =
            vet(&mut json!({"rope_scaling": {"rope_type": "zigzag", "factor": 2.0}}), "c", "llama", false).unwrap_err();
        assert!(e.contains("rope_type 'zigzag' is not supported"), "{e}");
        let mut c = json!({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "odd": 1}}});
        assert!(vet(&mut c.clone(), "c", "gemma3_text", false)
            .unwrap_err()
            .contains("rope_parameters.sliding_attention.odd"));
        assert_eq!(vet(&mut c, "c", "gemma3_text", true).unwrap().len(), 1);
        assert!(c["rope_parameters"]["sliding_attention"].get("odd").is_none());
    }
}
