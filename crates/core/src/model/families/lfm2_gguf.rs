//! LFM2 in GGUF (`general.architecture` `lfm2`), as llama.cpp's converter (`LFM2Model`) writes
//! it, built by the HF LFM2 code (`lfm2::build`) from the metadata and the tensors renamed to
//! HF's names:
//! - the layer kinds: `attention.head_count_kv` is an array with one entry per layer, 0 for a
//!   short-convolution layer (as llama.cpp reads it); a single number makes every layer
//!   attention. Every attention layer must have the same key/value heads (transformers' one
//!   `num_key_value_heads`);
//! - `feed_forward_length` is the MLP's width as the converter computed it (no adjusting here),
//!   `shortconv.l_cache` the convolution's taps, `context_length` the positions;
//! - the tensors: `blk.N.shortconv.{in_proj,conv,out_proj}` (the convolution squeezed to
//!   `[C, K]`, read back as `[C, 1, K]`), `attn_q/k/v/output`, `attn_q_norm` / `attn_k_norm`
//!   (`q_layernorm` / `k_layernorm`), `attn_norm` (`operator_norm`), `ffn_norm`,
//!   `ffn_gate/up/down` (`feed_forward.w1/w3/w2`), the final norm as `token_embd_norm`
//!   (`model.embedding_norm`), `output` only where the output is not tied. Q/K stay in
//!   rotate-half order (llama.cpp's rope for LFM2 is NEOX; the converter does not permute).

use crate::model::families::gguf_hybrid;
use crate::model::families::lfm2::{build, Config};
use crate::model::families::llama_gguf::{vocab_rows, Meta};
use crate::model::readers::gguf::{Gguf, Value};
use crate::model::readers::weights::Weights;
use crate::model::transformer::Transformer;
use crate::model::{LoadOptions, ModelError};
use std::collections::HashMap;

/// An `lfm2` GGUF tensor name -> the HF name.
fn hf_name(name: &str) -> String {
    match name {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "token_embd_norm.weight" => return "model.embedding_norm.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let Some((l, part)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else { return name.into() };
    let (module, suffix) = part.rsplit_once('.').unwrap_or((part, "weight"));
    let hf = match module {
        "shortconv.in_proj" => "conv.in_proj",
        "shortconv.conv" => "conv.conv",
        "shortconv.out_proj" => "conv.out_proj",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.out_proj",
        "attn_q_norm" => "self_attn.q_layernorm",
        "attn_k_norm" => "self_attn.k_layernorm",
        "attn_norm" => "operator_norm",
        "ffn_norm" => "ffn_norm",
        "ffn_gate" => "feed_forward.w1",
        "ffn_up" => "feed_forward.w3",
        "ffn_down" => "feed_forward.w2",
        _ => return name.into(),
    };
    format!("model.layers.{l}.{hf}.{suffix}")
}

/// The model an `lfm2` GGUF holds.
pub fn load(g: &Gguf, file: &str, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let meta = Meta { g, arch: "lfm2", file };
    let bad = |why: String| ModelError::Config(file.to_string(), why);
    let key = |k: &str| meta.key(k);
    meta.rope_scaling(&|_| false)?;
    let n = meta.blocks()?;
    let (d, h) = (meta.int("embedding_length")?, meta.int("attention.head_count")?);
    // The layer kinds: 0 key/value heads marks a convolution layer.
    let kv = meta.per_layer("attention.head_count_kv", n, h)?;
    let hk = gguf_hybrid::attention_kv(&meta, &kv, h)?;
    if let Ok(k) = meta.int("attention.key_length") {
        if h <= 0 || k * h != d {
            return Err(bad(format!(
                "metadata {} is {k}: LFM2's heads are {d} / {h} wide",
                key("attention.key_length")
            )));
        }
    }
    let eps = meta
        .float("attention.layer_norm_rms_epsilon")
        .ok_or_else(|| bad(format!("metadata {} is missing", key("attention.layer_norm_rms_epsilon"))))?;
    let taps = meta.int("shortconv.l_cache")?;
    let mut map: HashMap<String, tch::Tensor> = g
        .tensors
        .iter()
        .map(|t| Ok((hf_name(&t.name), g.tensor_as(&t.name, opts.dtype)?)))
        .collect::<Result<_, ModelError>>()?;
    let vocab = vocab_rows(&map, "model.embed_tokens.weight", "token_embd.weight", file)?;
    // The convolution, squeezed by the converter, back to transformers' [C, 1, K].
    for l in 0..n {
        let name = format!("model.layers.{l}.conv.conv.weight");
        if let Some(t) = map.remove(&name) {
            map.insert(name, gguf_hybrid::unsqueezed_conv(t, &format!("blk.{l}.shortconv.conv.weight"), file)?);
        }
    }
    let eos = g.metadata.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).unwrap_or(0);
    let layer_types: Vec<&str> = kv.iter().map(|&k| if k > 0 { "full_attention" } else { "conv" }).collect();
    let cfg: Config = serde_json::from_value(serde_json::json!({
        "hidden_size": d,
        "intermediate_size": meta.int("feed_forward_length")?,
        "block_auto_adjust_ff_dim": false,
        "num_hidden_layers": n,
        "num_attention_heads": h,
        "num_key_value_heads": hk,
        "norm_eps": eps,
        "rope_theta": meta.float("rope.freq_base").unwrap_or(1e6),
        "max_position_embeddings": meta.int("context_length").ok(),
        "vocab_size": vocab,
        "tie_word_embeddings": !map.contains_key("lm_head.weight"),
        "conv_L_cache": taps,
        "layer_types": layer_types,
        "eos_token_id": eos,
    }))
    .map_err(|e| bad(format!("the metadata as LFM2's config: {e}")))?;
    build(&cfg, file, Weights::new(map, file.into(), opts, None))
}
