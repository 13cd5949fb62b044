//! HF Phi-3 / Phi-4 (`model_type: "phi3"`): the llama architecture (`llama::build`) with the
//! query, key and value projections fused in `self_attn.qkv_proj` (rows: every query head,
//! then every key head, then every value head) and the gate and up projections fused in
//! `mlp.gate_up_proj` (the gate's rows first), split here into llama's names; LongRoPE
//! `rope_scaling` (the 128k variants, docs/methods.md#rope-scaling), a `sliding_window`, and a
//! `partial_rotary_factor` (Phi-4-mini). Its heads are kind `dec`.

use crate::model::families::llama::{build, Config, RotaryRows};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::Transformer;
use crate::model::{LoadOptions, ModelError};
use std::path::Path;

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (mut map, file) = hf::weights(dir, opts.dtype)?;
    split_fused(&mut map, &cfg, &cfg_file, &file)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None), RotaryRows::RotateHalf)
}

/// `self_attn.qkv_proj` and `mlp.gate_up_proj` of every layer (in `file`) split into llama's
/// projections (the GGUF's `attn_qkv` and `ffn_up` hold the same rows under HF's names).
pub(crate) fn split_fused(
    map: &mut std::collections::HashMap<String, tch::Tensor>,
    cfg: &Config,
    cfg_file: &str,
    file: &str,
) -> Result<(), ModelError> {
    let file = file.to_string();
    let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
    let hk = cfg.num_key_value_heads.unwrap_or(h);
    let dh = cfg.head_dim.unwrap_or(if h > 0 && d % h == 0 { d / h } else { 0 });
    if h <= 0 || hk <= 0 || dh <= 0 {
        return Err(ModelError::Config(
            cfg_file.to_string(),
            format!("num_attention_heads {h}, num_key_value_heads {hk} and head size {dh} must be positive"),
        ));
    }
    let ff = cfg.intermediate_size;
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut split = |fused: &str, parts: &[(&str, i64)]| -> Result<(), ModelError> {
            let name = format!("{p}.{fused}.weight");
            let t = map
                .remove(&name)
                .ok_or_else(|| ModelError::MissingTensor { file: file.clone(), name: name.clone() })?;
            let rows: i64 = parts.iter().map(|(_, r)| r).sum();
            if t.dim() != 2 || t.size()[0] != rows {
                return Err(ModelError::BadShape { file: file.clone(), name, want: vec![rows, d], got: t.size() });
            }
            let mut start = 0;
            for (part, r) in parts {
                map.insert(format!("{p}.{part}.weight"), t.f_narrow(0, start, *r)?.contiguous());
                start += r;
            }
            Ok(())
        };
        split(
            "self_attn.qkv_proj",
            &[("self_attn.q_proj", h * dh), ("self_attn.k_proj", hk * dh), ("self_attn.v_proj", hk * dh)],
        )?;
        split("mlp.gate_up_proj", &[("mlp.gate_proj", ff), ("mlp.up_proj", ff)])?;
    }
    Ok(())
}
