//! Granite-4.0-H in GGUF (`general.architecture` `granitehybrid`), as llama.cpp's converter
//! (`GraniteHybridModel`) writes it, built by the HF code (`granitehybrid::build`) from the
//! metadata and the tensors renamed to HF's names:
//! - the layer kinds: `attention.head_count_kv` per layer, 0 for a Mamba-2 layer (a single
//!   number: every layer attention);
//! - the Mamba-2 shape: `ssm.time_step_rank` the heads, `ssm.inner_size` (heads x head width),
//!   `ssm.group_count`, `ssm.state_size`, `ssm.conv_kernel`; the tensors `ssm_in`,
//!   `ssm_conv1d` (squeezed to `[C, K]`), `ssm_dt.bias` (`dt_bias`), `ssm_a` = -exp(A_log)
//!   `[heads, 1]` (read back as `A_log = ln(-a)`, so a non-negative entry is an error),
//!   `ssm_d` `[heads, 1]`, `ssm_norm` `[groups, inner / groups]` and `ssm_out`. The gated norm
//!   is computed as transformers computes it, over all `inner` channels at once (llama.cpp
//!   normalises each group alone; the two agree at one group, as every Granite-4.0-H has);
//! - Granite's multipliers: `attention.scale` (none: llama.cpp's head_dim^-1/2),
//!   `embedding_scale`, `residual_scale`, `logit_scale` (none: 1);
//! - the MLPs: `ffn_gate` and `ffn_up` (`ffn_*_shexp` beside experts) joined back into the
//!   shared MLP's `input_linear`, `expert_shared_feed_forward_length` wide (none:
//!   `feed_forward_length`); the experts' `ffn_gate_exps` / `ffn_up_exps` joined into their
//!   `input_linear`, `ffn_down_exps`, the router `ffn_gate_inp`; `expert_count` 0: no experts;
//! - rotary where `rope.scaling.finetuned` is true or absent (llama.cpp's reading; the
//!   converter writes false for Granite-4.0-H, which has none), over whole heads; Q and K rows
//!   permuted by the converter into adjacent pairs, put back in transformers' rotate-half order.

use crate::model::families::gguf_hybrid;
use crate::model::families::granitehybrid::{build, Config};
use crate::model::families::llama_gguf::{vocab_rows, Meta};
use crate::model::readers::gguf::{Gguf, Value};
use crate::model::readers::weights::Weights;
use crate::model::transformer::Transformer;
use crate::model::{LoadOptions, ModelError};
use std::collections::HashMap;
use tch::Tensor;

/// `granitehybrid`'s own GGUF names (the MLP halves keep their GGUF names, joined later).
const NAMES: gguf_hybrid::Names = gguf_hybrid::Names {
    final_norm: "model.norm.weight",
    whole: &[
        ("ssm_dt.bias", "mamba.dt_bias"),
        ("ffn_down.weight", "shared_mlp.output_linear.weight"),
        ("ffn_down_shexp.weight", "shared_mlp.output_linear.weight"),
        ("ffn_down_exps.weight", "block_sparse_moe.output_linear.weight"),
        ("ffn_gate_inp.weight", "block_sparse_moe.router.layer.weight"),
    ],
    modules: &[("ffn_norm", "post_attention_layernorm"), ("ssm_norm", "mamba.norm")],
};

/// Rows of a Q or K projection in llama.cpp's adjacent rotary pairs (`heads` heads) back in
/// transformers' rotate-half order: the inverse of the converter's `LlamaModel.permute`.
fn unpermute(w: &Tensor, heads: i64) -> Result<Tensor, tch::TchError> {
    let s = w.size();
    let (rows, rest) = (s[0], &s[1..]);
    let mut grouped = vec![heads, rows / heads / 2, 2];
    grouped.extend_from_slice(rest);
    w.f_reshape(grouped.as_slice())?.f_transpose(1, 2)?.f_contiguous()?.f_reshape(s.as_slice())
}

/// The model a `granitehybrid` GGUF holds.
pub fn load(g: &Gguf, file: &str, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let meta = Meta { g, arch: "granitehybrid", file };
    let bad = |why: String| ModelError::Config(file.to_string(), why);
    let key = |k: &str| meta.key(k);
    meta.rope_scaling(&|_| false)?;
    let n = meta.blocks()?;
    let (d, h) = (meta.int("embedding_length")?, meta.int("attention.head_count")?);
    if h <= 0 || d % h != 0 {
        return Err(bad(format!("{h} heads do not divide a model of size {d}")));
    }
    let kv = meta.per_layer("attention.head_count_kv", n, h)?;
    let hk = gguf_hybrid::attention_kv(&meta, &kv, h)?;
    let rope = g.metadata.get(&key("rope.scaling.finetuned")).and_then(Value::as_bool).unwrap_or(true);
    if let Ok(r) = meta.int("rope.dimension_count") {
        if rope && r != d / h {
            return Err(bad(format!(
                "metadata {} is {r}: rotary over part of a head (of {}) is not read",
                key("rope.dimension_count"),
                d / h
            )));
        }
    }
    let eps = meta
        .float("attention.layer_norm_rms_epsilon")
        .ok_or_else(|| bad(format!("metadata {} is missing", key("attention.layer_norm_rms_epsilon"))))?;
    let ff = meta.int("feed_forward_length")?;
    let shared = meta.int("expert_shared_feed_forward_length").unwrap_or(ff);
    let experts = meta.int("expert_count").unwrap_or(0);
    let mamba = kv.contains(&0);
    let ssm = |k: &str| meta.int_if(mamba, k);
    let (heads, inner) = (ssm("ssm.time_step_rank")?.unwrap_or(1), ssm("ssm.inner_size")?.unwrap_or(2 * d));
    if heads <= 0 || inner % heads != 0 {
        return Err(bad(format!(
            "metadata {} {inner} is not a multiple of {} {heads}",
            key("ssm.inner_size"),
            key("ssm.time_step_rank")
        )));
    }
    let groups = ssm("ssm.group_count")?.unwrap_or(1);
    let mut map: HashMap<String, Tensor> = HashMap::new();
    for t in &g.tensors {
        let x = g.tensor_as(&t.name, opts.dtype)?;
        let name = gguf_hybrid::hf_name(&t.name, &NAMES);
        let shape = |want: Vec<i64>, x: &Tensor| ModelError::BadShape {
            file: file.into(),
            name: t.name.clone(),
            want,
            got: x.size(),
        };
        let x = if name.ends_with("mamba.A_log") {
            gguf_hybrid::a_log(&x, &t.name, &[heads], file)?
        } else if name.ends_with("mamba.D") || name.ends_with("mamba.norm.weight") {
            x.f_reshape([-1])?
        } else if name.ends_with("mamba.conv1d.weight") {
            gguf_hybrid::unsqueezed_conv(x, &t.name, file)?
        } else if name.ends_with("self_attn.q_proj.weight") || name.ends_with("self_attn.k_proj.weight") {
            let hs = if name.ends_with("q_proj.weight") { h } else { hk };
            if x.dim() != 2 || x.size()[0] % (2 * hs) != 0 {
                return Err(shape(vec![hs * (d / h), d], &x));
            }
            unpermute(&x, hs)?
        } else {
            x
        };
        map.insert(name, x);
    }
    // The MLPs' halves joined back: the shared MLP's `input_linear [2F, D]` (gate rows first),
    // the experts' `[E, 2F, D]`.
    let mut take =
        |name: String| map.remove(&name).ok_or_else(|| ModelError::MissingTensor { file: file.into(), name });
    let mut joined = Vec::new();
    for l in 0..n {
        let s = if experts > 0 { "_shexp" } else { "" };
        let (gate, up) = (take(format!("blk.{l}.ffn_gate{s}.weight"))?, take(format!("blk.{l}.ffn_up{s}.weight"))?);
        joined.push((format!("model.layers.{l}.shared_mlp.input_linear.weight"), Tensor::f_cat(&[gate, up], 0)?));
        if experts > 0 {
            let (gate, up) =
                (take(format!("blk.{l}.ffn_gate_exps.weight"))?, take(format!("blk.{l}.ffn_up_exps.weight"))?);
            joined.push((
                format!("model.layers.{l}.block_sparse_moe.input_linear.weight"),
                Tensor::f_cat(&[gate, up], 1)?,
            ));
        }
    }
    map.extend(joined);
    let vocab = vocab_rows(&map, "model.embed_tokens.weight", "token_embd.weight", file)?;
    let has = |suffix: &str| g.tensors.iter().any(|t| t.name.ends_with(suffix));
    let layer_types: Vec<&str> = kv.iter().map(|&k| if k > 0 { "attention" } else { "mamba" }).collect();
    let eos = g.metadata.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).unwrap_or(0);
    let cfg: Config = serde_json::from_value(serde_json::json!({
        "hidden_size": d,
        "num_hidden_layers": n,
        "num_attention_heads": h,
        "num_key_value_heads": hk,
        "rms_norm_eps": eps,
        "rope_theta": meta.float("rope.freq_base").unwrap_or(10000.0),
        "max_position_embeddings": meta.int("context_length").ok(),
        "vocab_size": vocab,
        "tie_word_embeddings": !map.contains_key("lm_head.weight"),
        "embedding_multiplier": meta.float("embedding_scale").filter(|&s| s != 0.0).unwrap_or(1.0),
        "residual_multiplier": meta.float("residual_scale").filter(|&s| s != 0.0).unwrap_or(1.0),
        "logits_scaling": meta.float("logit_scale").filter(|&s| s != 0.0).unwrap_or(1.0),
        "attention_multiplier": meta.float("attention.scale").filter(|&s| s != 0.0).unwrap_or(1.0 / ((d / h) as f64).sqrt()),
        "num_local_experts": experts,
        "num_experts_per_tok": meta.int("expert_used_count").unwrap_or(0),
        "intermediate_size": ff,
        "shared_intermediate_size": shared,
        "position_embedding_type": if rope { "rope" } else { "nope" },
        "layer_types": layer_types,
        "mamba_n_heads": heads,
        "mamba_n_groups": groups,
        "mamba_d_state": ssm("ssm.state_size")?.unwrap_or(1),
        "mamba_d_head": inner / heads,
        "mamba_d_conv": ssm("ssm.conv_kernel")?.unwrap_or(4),
        "mamba_expand": inner as f64 / d as f64,
        "mamba_conv_bias": has("ssm_conv1d.bias"),
        "mamba_proj_bias": has("ssm_in.bias"),
        "eos_token_id": eos,
    }))
    .map_err(|e| bad(format!("the metadata as Granite-4.0-H's config: {e}")))?;
    build(&cfg, file, Weights::new(map, file.into(), opts, None))
}
