//! Firefox-Translations Marian checkpoints (`model.*.bin` + `tokenizer.json`): the binary
//! format (docs/formats.md), int8 dequantisation, and the architecture
//! (post-norm encoder; SSRU decoder with cross-attention; tied output with bias).

use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition};
use crate::model::readers::bytes::Cursor;
use crate::model::readers::weights::Weights;
use crate::model::ssru::Ssru;
use crate::model::transformer::{DecoderLayer, Embeddings, Positions, StackLayer, Transformer};
use crate::model::{Kind, LoadOptions, ModelError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::Tensor;

const FLOAT32: u64 = 0x404;
const INT8: u64 = 0x4101;
pub const EOS: i64 = 0;
const EPS: f64 = 1e-9;

/// The `model.*.bin` of a directory, if there is exactly one.
pub fn find_bin(dir: &Path) -> Option<PathBuf> {
    let mut bins: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "bin")
                && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("model."))
        })
        .collect();
    (bins.len() == 1).then(|| bins.remove(0))
}

/// Reads every float tensor of a Marian `.bin`, dequantising int8 matrices, and the embedded
/// `special:model.yml`. Tensors come as PyTorch uses them: `[out, in]` matrices, flat vectors.
pub fn read_bin(path: &Path) -> Result<(HashMap<String, Tensor>, String), ModelError> {
    let bytes = crate::model::readers::safetensors::map(path)?;
    read_bin_bytes(&bytes, &path.display().to_string())
}

/// `read_bin` over a file's bytes; `file` names it in errors.
pub fn read_bin_bytes(bytes: &[u8], file: &str) -> Result<(HashMap<String, Tensor>, String), ModelError> {
    let file = file.to_string();
    let mut r = Cursor::new(bytes, &file);
    let _version = r.u64("the version")?;
    // Each tensor has a 32-byte header.
    let n = r.count(32, "the tensor count")?;
    let mut headers = Vec::with_capacity(n);
    for i in 0..n {
        let what = format!("header {i}");
        headers.push((r.u64(&what)?, r.u64(&what)?, r.u64(&what)?, r.u64(&what)?));
    }
    let mut names = Vec::with_capacity(n);
    for (i, (len, ..)) in headers.iter().enumerate() {
        let raw = r.take(*len, &format!("the name of tensor {i}"))?;
        names.push(String::from_utf8_lossy(raw).trim_end_matches('\0').to_string());
    }
    let mut shapes = Vec::with_capacity(n);
    for (i, (_, _, dims, _)) in headers.iter().enumerate() {
        let what = format!("the shape of {}", names[i]);
        let raw = r.take(dims.checked_mul(4).unwrap_or(u64::MAX), &what)?;
        let shape: Vec<i64> = raw.chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect();
        crate::model::readers::bytes::elements(
            shape.iter().map(|&d| d as i128),
            &format!("tensor {}", names[i]),
            &file,
        )?;
        shapes.push(shape);
    }
    let aligned = r.u64("the alignment padding")?;
    r.take(aligned, "the alignment padding")?;
    let mut out = HashMap::new();
    let mut yml = String::new();
    for i in 0..n {
        let (_, typ, _, len) = headers[i];
        let name = &names[i];
        let data = r.take(len, &format!("the data of {name}"))?;
        if name == "special:model.yml" {
            yml = String::from_utf8_lossy(data).trim_end_matches('\0').to_string();
        }
        if name.ends_with("_QuantMultA") || name.starts_with("special:") {
            continue;
        }
        let shape = &shapes[i];
        let count: i64 = shape.iter().product(); // checked above: at most 2^63 - 1
        let bad = |why: String| ModelError::Corrupt { file: file.clone(), why: format!("tensor {name}: {why}") };
        let t = match typ {
            FLOAT32 => {
                if (count as u64).checked_mul(4).is_none_or(|n| (data.len() as u64) < n) {
                    return Err(bad(format!("{} bytes for {count} floats", data.len())));
                }
                let t = Tensor::f_from_data_size(&data[..4 * count as usize], &[count], tch::Kind::Float)?;
                // Row vectors [1, n] become [n].
                if shape.len() == 2 && shape[0] == 1 {
                    t
                } else {
                    t.f_view(shape.as_slice())?
                }
            }
            INT8 => {
                if shape.len() != 2 || data.len() < count as usize + 4 {
                    return Err(bad(format!("int8 data of {} bytes for shape {shape:?}", data.len())));
                }
                let m = f32::from_le_bytes(data[count as usize..count as usize + 4].try_into().unwrap_or([0; 4]));
                if !(m.is_finite() && m != 0.0) {
                    return Err(bad(format!("quantisation multiplier {m}")));
                }
                // Dequantised inside libtorch (vectorised): float = int8 / m.
                let mut t = Tensor::f_from_data_size(&data[..count as usize], &[count], tch::Kind::Int8)?
                    .to_kind(tch::Kind::Float);
                let _ = t.f_mul_scalar_(1.0 / m as f64)?;
                // Stored transposed except Wemb: the raw [cols, rows] is PyTorch's [out, in].
                if name == "Wemb" {
                    t.f_view([shape[0], shape[1]])?
                } else {
                    t.f_view([shape[1], shape[0]])?
                }
            }
            other => return Err(bad(format!("unknown tensor type {other:#x}"))),
        };
        out.insert(name.clone(), t);
    }
    Ok((out, yml))
}

/// An integer setting of the embedded model.yml, e.g. `transformer-heads: 8`.
fn yml_int(yml: &str, key: &str) -> Option<i64> {
    yml.lines().find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
}

/// Marian's naming: `{p}W{s}` / `{p}b{s}`, `{p}_scale` / `{p}_bias` (not `Weights::linear`'s
/// `.weight` / `.bias`).
trait MarianNames {
    fn marian_linear(&mut self, p: &str, s: &str, out: i64, inp: i64, bias: bool) -> Result<Linear, ModelError>;
    fn marian_norm(&mut self, p: &str, d: i64) -> Result<Norm, ModelError>;
    fn attention(&mut self, p: &str, d: i64, heads: i64) -> Result<Attention, ModelError>;
    fn ffn(&mut self, p: &str, d: i64, f: i64) -> Result<Ffn, ModelError>;
    fn count_layers(&self, prefix: &str) -> usize;
}

impl MarianNames for Weights {
    /// `{p}W{s}` / `{p}b{s}` as a Linear of `[out, in]`.
    fn marian_linear(&mut self, p: &str, s: &str, out: i64, inp: i64, bias: bool) -> Result<Linear, ModelError> {
        let w = self.get(&format!("{p}W{s}"), &[out, inp])?;
        let b = if bias { Some(self.get(&format!("{p}b{s}"), &[out])?) } else { None };
        Ok(Linear { w, b })
    }
    fn marian_norm(&mut self, p: &str, d: i64) -> Result<Norm, ModelError> {
        Ok(Norm {
            kind: NormKind::Layer,
            weight: self.get(&format!("{p}_scale"), &[d])?,
            bias: Some(self.get(&format!("{p}_bias"), &[d])?),
            eps: EPS,
        })
    }
    fn attention(&mut self, p: &str, d: i64, heads: i64) -> Result<Attention, ModelError> {
        Ok(Attention::new(
            self.marian_linear(p, "q", d, d, true)?,
            self.marian_linear(p, "k", d, d, true)?,
            self.marian_linear(p, "v", d, d, true)?,
            self.marian_linear(p, "o", d, d, true)?,
            heads,
            heads,
            d / heads,
        ))
    }
    fn ffn(&mut self, p: &str, d: i64, f: i64) -> Result<Ffn, ModelError> {
        Ok(Ffn {
            up: self.marian_linear(p, "1", f, d, true)?,
            down: self.marian_linear(p, "2", d, f, true)?,
            act: Activation::Relu,
            gate: None,
        })
    }
    fn count_layers(&self, prefix: &str) -> usize {
        (1..).take_while(|l| self.map.keys().any(|k| k.starts_with(&format!("{prefix}{l}_")))).count()
    }
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let bin = find_bin(dir)
        .ok_or_else(|| ModelError::Io(dir.display().to_string(), "no single model.*.bin in the directory".into()))?;
    let (map, yml) = read_bin(&bin)?;
    let mut w = Weights::new(map, bin.display().to_string(), opts, None);
    let wemb =
        w.map.get("Wemb").ok_or_else(|| ModelError::MissingTensor { file: w.file.clone(), name: "Wemb".into() })?;
    let [vocab, d] = wemb.size()[..] else {
        return Err(ModelError::Corrupt {
            file: w.file.clone(),
            why: format!("tensor Wemb has shape {:?}: a token table is [vocab, width]", wemb.size()),
        });
    };
    let heads = yml_int(&yml, "transformer-heads").ok_or_else(|| ModelError::Corrupt {
        file: w.file.clone(),
        why: "special:model.yml has no transformer-heads".into(),
    })?;
    if heads <= 0 || d % heads != 0 {
        return Err(ModelError::Corrupt {
            file: w.file.clone(),
            why: format!("transformer-heads {heads} does not divide the model size {d}"),
        });
    }
    let f = w.map.get("encoder_l1_ffn_W1").and_then(|t| t.size().first().copied()).unwrap_or(4 * d);
    let n_enc = w.count_layers("encoder_l");
    let n_dec = w.count_layers("decoder_l");
    let mut encoder = Vec::with_capacity(n_enc);
    for l in 1..=n_enc {
        let p = format!("encoder_l{l}_");
        encoder.push(StackLayer::new(
            w.attention(&format!("{p}self_"), d, heads)?,
            w.marian_norm(&format!("{p}self_Wo_ln"), d)?,
            w.ffn(&format!("{p}ffn_"), d, f)?,
            w.marian_norm(&format!("{p}ffn_ffn_ln"), d)?,
            NormPosition::Post,
        ));
    }
    let mut decoder = Vec::with_capacity(n_dec);
    for l in 1..=n_dec {
        let p = format!("decoder_l{l}_");
        let cell = Ssru {
            w: w.marian_linear(&format!("{p}rnn_"), "", d, d, false)?,
            wf: w.marian_linear(&format!("{p}rnn_"), "f", d, d, true)?,
        };
        decoder.push(DecoderLayer::new(
            cell,
            w.marian_norm(&format!("{p}rnn_ffn_ln"), d)?,
            Some((w.attention(&format!("{p}context_"), d, heads)?, w.marian_norm(&format!("{p}context_Wo_ln"), d)?)),
            w.ffn(&format!("{p}ffn_"), d, f)?,
            w.marian_norm(&format!("{p}ffn_ffn_ln"), d)?,
            NormPosition::Post,
        ));
    }
    let tokens = w.get("Wemb", &[vocab, d])?;
    let output = Linear { w: tokens.shallow_clone(), b: Some(w.get("decoder_ff_logit_out_b", &[vocab])?) };
    let embed =
        Embeddings { tokens, scale: (d as f64).sqrt(), positions: Positions::Sinusoidal, token_type: None, norm: None };
    Ok(Transformer {
        embed,
        stack: encoder,
        stack_kind: Kind::Enc,
        causal: false,
        window: None,
        final_norm: None,
        decoder,
        output: Some(output),
        d_model: d,
        eos_id: EOS,
        dec_embed: None,
        dec_start: None,
        banned: vec![],
        logit_softcap: None,
        forced_bos: Default::default(),
        rel_bias: None,
        max_positions: None,
    })
}
