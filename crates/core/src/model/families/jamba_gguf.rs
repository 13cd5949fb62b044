//! Jamba in GGUF (`general.architecture` `jamba`), as llama.cpp's converter (`JambaModel`)
//! writes it, built by the HF Jamba code (`jamba::build`) from the metadata and the tensors
//! renamed to HF's names:
//! - the layer kinds: `attention.head_count_kv` per layer, 0 for a Mamba layer; the MoE layers
//!   are those holding a router (`ffn_gate_inp`: no key says which). transformers places both
//!   by a period and an offset, read back from the layers (kinds that are not periodic are an
//!   error naming them);
//! - the Mamba shape: `ssm.inner_size` (a multiple of the model's width), `ssm.state_size`,
//!   `ssm.conv_kernel`, `ssm.time_step_rank`; the tensors `ssm_in`, `ssm_conv1d` (squeezed to
//!   `[C, K]`), `ssm_x`, `ssm_dt` (weight and bias), `ssm_dt_norm` / `ssm_b_norm` /
//!   `ssm_c_norm`, `ssm_a` = -exp(A_log) `[inner, state]` (read back as `A_log`), `ssm_d`,
//!   `ssm_out`, with their biases where the file holds them (llama.cpp has no place for
//!   `ssm_in` / `ssm_out` biases; transformers' `mamba_proj_bias` does);
//! - the experts stacked per projection (`ffn_{gate,up,down}_exps`), split into
//!   transformers' `feed_forward.experts.E.*`, `expert_count` / `expert_used_count`; the dense
//!   MLPs `ffn_gate` / `ffn_up` / `ffn_down`. No rotary (Jamba has none).

use crate::model::families::gguf_hybrid;
use crate::model::families::jamba::{build, Config};
use crate::model::families::llama_gguf::{vocab_rows, Meta};
use crate::model::readers::gguf::{Gguf, Value};
use crate::model::readers::weights::Weights;
use crate::model::transformer::Transformer;
use crate::model::{LoadOptions, ModelError};
use std::collections::HashMap;
use tch::Tensor;

/// `jamba`'s own GGUF names (stacked experts keep their GGUF names).
const NAMES: gguf_hybrid::Names = gguf_hybrid::Names {
    final_norm: "model.final_layernorm.weight",
    whole: &[("ffn_gate_inp.weight", "feed_forward.router.weight")],
    modules: &[
        ("ffn_norm", "pre_ff_layernorm"),
        ("ssm_x", "mamba.x_proj"),
        ("ssm_dt", "mamba.dt_proj"),
        ("ssm_dt_norm", "mamba.dt_layernorm"),
        ("ssm_b_norm", "mamba.b_layernorm"),
        ("ssm_c_norm", "mamba.c_layernorm"),
        ("ffn_gate", "feed_forward.gate_proj"),
        ("ffn_up", "feed_forward.up_proj"),
        ("ffn_down", "feed_forward.down_proj"),
    ],
};

/// transformers' `(period, offset)` choosing exactly `layers` of `n` (`l % period == offset`),
/// if there is one: none chosen is an offset past every layer.
fn periodic(layers: &[usize], n: usize) -> Option<(usize, usize)> {
    let (period, offset) = match layers {
        [] => return Some((n + 1, n)),
        [only] => (n.max(only + 1), *only),
        [a, b, ..] => (b - a, a % (b - a)),
    };
    let chosen: Vec<usize> = (0..n).filter(|l| l % period == offset).collect();
    (chosen == layers).then_some((period, offset))
}

/// The model a `jamba` GGUF holds.
pub fn load(g: &Gguf, file: &str, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let meta = Meta { g, arch: "jamba", file };
    let bad = |why: String| ModelError::Config(file.to_string(), why);
    let n = meta.blocks()?;
    let (d, h) = (meta.int("embedding_length")?, meta.int("attention.head_count")?);
    let kv = meta.per_layer("attention.head_count_kv", n, h)?;
    let hk = gguf_hybrid::attention_kv(&meta, &kv, h)?;
    let attention: Vec<usize> = (0..n).filter(|&l| kv[l] > 0).collect();
    let (attn_period, attn_offset) = periodic(&attention, n).ok_or_else(|| {
        bad(format!(
            "metadata {}: attention at layers {attention:?}, not every p-th layer from an offset (transformers' attn_layer_period / offset)",
            meta.key("attention.head_count_kv")
        ))
    })?;
    let moe: Vec<usize> = (0..n).filter(|l| g.info(&format!("blk.{l}.ffn_gate_inp.weight")).is_some()).collect();
    let (expert_period, expert_offset) = periodic(&moe, n).ok_or_else(|| {
        bad(format!(
            "experts (ffn_gate_inp) at layers {moe:?}, not every p-th layer from an offset (transformers' expert_layer_period / offset)"
        ))
    })?;
    let mamba = attention.len() < n;
    let ssm = |k: &str| meta.int_if(mamba, k).map(|v| v.unwrap_or(1));
    let (inner, state, taps, rank) =
        (ssm("ssm.inner_size")?, ssm("ssm.state_size")?, ssm("ssm.conv_kernel")?, ssm("ssm.time_step_rank")?);
    let inner = if mamba { inner } else { 2 * d };
    if d <= 0 || inner % d != 0 {
        return Err(bad(format!("metadata {} {inner} is not a multiple of the width {d}", meta.key("ssm.inner_size"))));
    }
    let experts = if moe.is_empty() { 1 } else { meta.int("expert_count")? };
    let ff = meta.int("feed_forward_length")?;
    let mut map: HashMap<String, Tensor> = HashMap::new();
    for t in &g.tensors {
        let x = g.tensor_as(&t.name, opts.dtype)?;
        let name = gguf_hybrid::hf_name(&t.name, &NAMES);
        let x = if name.ends_with("mamba.A_log") {
            gguf_hybrid::a_log(&x, &t.name, &[inner, state], file)?
        } else if name.ends_with("mamba.conv1d.weight") {
            gguf_hybrid::unsqueezed_conv(x, &t.name, file)?
        } else {
            x
        };
        map.insert(name, x);
    }
    // Each MoE layer's experts, stacked per projection, split into transformers' names.
    for &l in &moe {
        for (gguf, hf, shape) in [
            ("gate", "gate_proj", [experts, ff, d]),
            ("up", "up_proj", [experts, ff, d]),
            ("down", "down_proj", [experts, d, ff]),
        ] {
            let name = format!("blk.{l}.ffn_{gguf}_exps.weight");
            let t =
                map.remove(&name).ok_or_else(|| ModelError::MissingTensor { file: file.into(), name: name.clone() })?;
            if t.size() != shape {
                return Err(ModelError::BadShape { file: file.into(), name, want: shape.to_vec(), got: t.size() });
            }
            for e in 0..experts {
                map.insert(format!("model.layers.{l}.feed_forward.experts.{e}.{hf}.weight"), t.f_get(e)?);
            }
        }
    }
    let vocab = vocab_rows(&map, "model.embed_tokens.weight", "token_embd.weight", file)?;
    let has = |suffix: &str| g.tensors.iter().any(|t| t.name.ends_with(suffix));
    let eos = g.metadata.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).unwrap_or(0);
    let cfg: Config = serde_json::from_value(serde_json::json!({
        "hidden_size": d,
        "num_hidden_layers": n,
        "num_attention_heads": h,
        "num_key_value_heads": hk,
        "rms_norm_eps": meta.float("attention.layer_norm_rms_epsilon").ok_or_else(|| bad(format!("metadata {} is missing", meta.key("attention.layer_norm_rms_epsilon"))))?,
        "max_position_embeddings": meta.int("context_length").ok(),
        "vocab_size": vocab,
        "tie_word_embeddings": !map.contains_key("lm_head.weight"),
        "intermediate_size": ff,
        "num_experts": experts,
        "num_experts_per_tok": if moe.is_empty() { 1 } else { meta.int("expert_used_count")? },
        "expert_layer_period": expert_period,
        "expert_layer_offset": expert_offset,
        "attn_layer_period": attn_period,
        "attn_layer_offset": attn_offset,
        "mamba_d_state": state,
        "mamba_d_conv": taps,
        "mamba_expand": inner / d,
        "mamba_dt_rank": rank,
        "mamba_conv_bias": has("ssm_conv1d.bias"),
        "mamba_proj_bias": has("ssm_in.bias"),
        "eos_token_id": eos,
    }))
    .map_err(|e| bad(format!("the metadata as Jamba's config: {e}")))?;
    build(&cfg, file, Weights::new(map, file.into(), opts, None))
}

#[cfg(test)]
mod tests {
    use super::periodic;

    #[test]
    fn layer_kinds_are_read_back_as_a_period_and_an_offset() {
        assert_eq!(periodic(&[1, 3], 4), Some((2, 1)));
        assert_eq!(periodic(&[0], 4), Some((4, 0)));
        assert_eq!(periodic(&[3], 4), Some((4, 3)));
        assert_eq!(periodic(&[], 4), Some((5, 4)));
        assert_eq!(periodic(&[0, 1, 2, 3], 4), Some((1, 0)));
        assert_eq!(periodic(&[2, 5, 8], 9), Some((3, 2)));
        assert_eq!(periodic(&[1, 2], 4), None, "layers 1 and 2 of 4: period 1 would choose every layer");
        assert_eq!(periodic(&[0, 2, 3], 4), None);
    }
}
