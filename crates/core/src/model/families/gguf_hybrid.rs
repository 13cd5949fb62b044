//! What the hybrid families' GGUF loaders (`lfm2_gguf`, `granitehybrid_gguf`, `jamba_gguf`)
//! read alike: the layer kinds llama.cpp's converter writes into the per-layer
//! `head_count_kv` (0: a layer without attention), and the state-space tensors it transforms
//! (`ssm_a` = -exp(A_log), the convolution squeezed to `[C, K]`).

use crate::model::families::llama_gguf::Meta;

/// A hybrid architecture's GGUF names beyond the ones they share ([`hf_name`]): the final
/// norm's HF name, whole tensor names (`ssm_dt.bias`) and modules (`ffn_norm`, the biases and
/// weights after the module's name kept as they are).
pub(crate) struct Names {
    pub final_norm: &'static str,
    pub whole: &'static [(&'static str, &'static str)],
    pub modules: &'static [(&'static str, &'static str)],
}

/// Whole tensor names every hybrid's GGUF writes alike.
const WHOLE: &[(&str, &str)] = &[("ssm_a", "mamba.A_log"), ("ssm_d", "mamba.D")];

/// Modules every hybrid's GGUF writes alike (attention and the state-space in/out projections).
const MODULES: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ssm_in", "mamba.in_proj"),
    ("ssm_conv1d", "mamba.conv1d"),
    ("ssm_out", "mamba.out_proj"),
];

/// A hybrid's GGUF tensor name -> the HF name, by the shared tables and the architecture's
/// own (`names`); a name neither knows is kept (the loader reads it by its GGUF name, or it
/// is left over and reported).
pub(crate) fn hf_name(name: &str, names: &Names) -> String {
    match name {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output_norm.weight" => return names.final_norm.into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let Some((l, part)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else { return name.into() };
    if let Some((_, hf)) = WHOLE.iter().chain(names.whole).find(|(g, _)| *g == part) {
        return format!("model.layers.{l}.{hf}");
    }
    let (module, suffix) = part.rsplit_once('.').unwrap_or((part, "weight"));
    match MODULES.iter().chain(names.modules).find(|(g, _)| *g == module) {
        Some((_, hf)) => format!("model.layers.{l}.{hf}.{suffix}"),
        None => name.into(),
    }
}
use crate::model::ModelError;
use tch::Tensor;

/// The attention layers' one key/value head count from the per-layer counts `kv` (0: no
/// attention; `h` where no layer attends); layers with different counts are an error naming
/// the key (transformers' hybrids have one count).
pub(crate) fn attention_kv(meta: &Meta, kv: &[i64], h: i64) -> Result<i64, ModelError> {
    let mut attending = kv.iter().copied().filter(|&k| k > 0);
    let hk = attending.next().unwrap_or(h);
    if let Some(other) = attending.find(|&k| k != hk) {
        return Err(ModelError::Config(
            meta.file.to_string(),
            format!(
                "metadata {}: attention layers with {hk} and {other} key/value heads (transformers' {} has one count)",
                meta.key("attention.head_count_kv"),
                meta.arch
            ),
        ));
    }
    Ok(hk)
}

/// `A_log = ln(-a)` from the converter's `ssm_a` = -exp(A_log) (`tensor`, named in errors),
/// reshaped to `shape`; an entry that is not negative is an error (its log is not a number).
pub(crate) fn a_log(x: &Tensor, tensor: &str, shape: &[i64], file: &str) -> Result<Tensor, ModelError> {
    if x.numel() as i64 != shape.iter().product::<i64>() {
        return Err(ModelError::BadShape {
            file: file.into(),
            name: tensor.into(),
            want: shape.to_vec(),
            got: x.size(),
        });
    }
    if x.f_ge(0.0)?.f_any()?.int64_value(&[]) != 0 {
        return Err(ModelError::Corrupt {
            file: file.into(),
            why: format!("tensor '{tensor}': -exp(A_log) must be negative throughout"),
        });
    }
    Ok(x.f_neg()?.f_log()?.f_reshape(shape)?)
}

/// A depthwise convolution the converter squeezed to `[C, K]` (`tensor`), back to `[C, 1, K]`.
pub(crate) fn unsqueezed_conv(x: Tensor, tensor: &str, file: &str) -> Result<Tensor, ModelError> {
    match x.size()[..] {
        [c, k] => Ok(x.f_view([c, 1, k])?),
        _ => Err(ModelError::Corrupt {
            file: file.into(),
            why: format!("tensor '{tensor}' has shape {:?}: a convolution of [channels, taps]", x.size()),
        }),
    }
}
