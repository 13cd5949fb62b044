//! Decoder-only llama-architecture checkpoints in GGUF (SmolLM2-135M in the assets): RMSNorm
//! before each sublayer, rotary positions, grouped-query causal self-attention, SwiGLU FFN,
//! a final RMSNorm, and an output projection tied to the embeddings unless `output.weight`
//! exists. Settings come from the GGUF metadata (`llama.*`); the tokenizer is the
//! `tokenizer.json` that `scripts/setup` derives from the GGUF with transformers.

use super::gguf::{Gguf, Value};
use super::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition, Rotary};
use super::transformer::{EncoderLayer, Embeddings, Positions, Transformer};
use super::weights::Weights;
use super::{Kind, LoadOptions, ModelError};
use std::path::{Path, PathBuf};

/// The one `*.gguf` of a directory.
pub fn find_gguf(dir: &Path) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "gguf")).collect();
    (v.len() == 1).then(|| v.remove(0))
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let path = find_gguf(dir).ok_or_else(|| ModelError::Io(dir.display().to_string(), "no single *.gguf in the directory".into()))?;
    let g = Gguf::open(&path)?;
    let file = path.display().to_string();
    let bad = |why: String| ModelError::Config(file.clone(), why);
    let arch = g.metadata.get("general.architecture").and_then(Value::as_str).unwrap_or_default().to_string();
    if arch != "llama" {
        return Err(bad(format!("architecture '{arch}' is not supported (llama is)")));
    }
    let int = |k: &str| g.metadata.get(&format!("llama.{k}")).and_then(Value::as_u64).map(|v| v as i64).ok_or_else(|| bad(format!("metadata llama.{k} is missing")));
    let (n_layers, d, ff, h) = (int("block_count")? as usize, int("embedding_length")?, int("feed_forward_length")?, int("attention.head_count")?);
    let hk = int("attention.head_count_kv").unwrap_or(h);
    if h <= 0 || d % h != 0 || hk <= 0 || h % hk != 0 {
        return Err(bad(format!("{h} heads and {hk} key/value heads do not fit a model of size {d}")));
    }
    let dh = d / h;
    let base = g.metadata.get("llama.rope.freq_base").and_then(Value::as_f64).unwrap_or(10000.0);
    let rope_dim = int("rope.dimension_count").unwrap_or(dh);
    let eps = g.metadata.get("llama.attention.layer_norm_rms_epsilon").and_then(Value::as_f64).ok_or_else(|| bad("metadata llama.attention.layer_norm_rms_epsilon is missing".into()))?;
    let eos = g.metadata.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).unwrap_or(0) as i64;

    let map = g.tensors.iter().map(|t| Ok((t.name.clone(), g.tensor(&t.name)?))).collect::<Result<_, ModelError>>()?;
    let mut w = Weights::new(map, file.clone(), opts, None);
    let vocab = w.shape("token_embd.weight").map(|s| s[0]).ok_or_else(|| ModelError::MissingTensor { file: file.clone(), name: "token_embd.weight".into() })?;
    let lin = |w: &mut Weights, name: String, out: i64, inp: i64| -> Result<Linear, ModelError> { Ok(Linear { w: w.get(&name, &[out, inp])?, b: None }) };
    let rms = |w: &mut Weights, name: String| -> Result<Norm, ModelError> { Ok(Norm { kind: NormKind::Rms, weight: w.get(&name, &[d])?, bias: None, eps }) };
    let mut layers = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        let p = format!("blk.{l}.");
        layers.push(EncoderLayer {
            attn: Attention {
                q: lin(&mut w, format!("{p}attn_q.weight"), d, d)?,
                k: lin(&mut w, format!("{p}attn_k.weight"), hk * dh, d)?,
                v: lin(&mut w, format!("{p}attn_v.weight"), hk * dh, d)?,
                o: lin(&mut w, format!("{p}attn_output.weight"), d, d)?,
                n_heads: h,
                n_kv_heads: hk,
                head_dim: dh,
                rotary: Some(Rotary { base, dim: rope_dim }), slots: None,
            },
            attn_norm: rms(&mut w, format!("{p}attn_norm.weight"))?,
            ffn: Ffn {
                up: lin(&mut w, format!("{p}ffn_up.weight"), ff, d)?,
                down: lin(&mut w, format!("{p}ffn_down.weight"), d, ff)?,
                act: Activation::Silu,
                gate: Some(lin(&mut w, format!("{p}ffn_gate.weight"), ff, d)?),
            },
            ffn_norm: rms(&mut w, format!("{p}ffn_norm.weight"))?,
            norm_position: NormPosition::Pre,
        });
    }
    let tokens = w.get("token_embd.weight", &[vocab, d])?;
    let output = match w.shape("output.weight") {
        Some(_) => w.get("output.weight", &[vocab, d])?,
        None => tokens.shallow_clone(),
    };
    Ok(Transformer {
        embed: Embeddings { tokens, scale: 1.0, positions: Positions::None, token_type: None, norm: None },
        encoder: layers,
        stack_kind: Kind::Dec,
        causal: true, window: None,
        final_norm: Some(rms(&mut w, "output_norm.weight".into())?),
        decoder: vec![],
        output: Some(Linear { w: output, b: None }),
        d_model: d,
        eos_id: eos,
        dec_embed: None,
        dec_start: None,
        banned: vec![],
    })
}
