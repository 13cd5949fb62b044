//! What the hybrid families' GGUF loaders (`lfm2_gguf`, `granitehybrid_gguf`, `jamba_gguf`)
//! read alike: the layer kinds llama.cpp's converter writes into the per-layer
//! `head_count_kv` (0: a layer without attention), and the state-space tensors it transforms
//! (`ssm_a` = -exp(A_log), the convolution squeezed to `[C, K]`).

use crate::model::families::llama_gguf::Meta;
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
