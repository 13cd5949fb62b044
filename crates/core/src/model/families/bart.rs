//! HF BART (`model_type: "bart"`) and MarianMT (`"marian"`, the opus-mt models): post-norm
//! encoder-decoders with the same layers (names below) that differ in their embeddings.
//! BART: learned positions numbered from 2, `layernorm_embedding` on both sides, decoder start
//! = EOS. MarianMT: fixed sinusoidal positions (`[sin | cos]`, frequencies `10000^(-2i/d)`),
//! embeddings scaled by `sqrt(d)`, decoder start = `<pad>`, `<pad>` never generated. Both:
//! shared (or separate) token embeddings, output tied to the decoder's embeddings, plus
//! `final_logits_bias`. The decoder's causal self-attention heads are kind `dec`.

use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{place, DecoderLayer, Embeddings, Positions, StackLayer, Transformer};
use crate::model::{Kind, LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;
use tch::{Device, Kind as DType, Tensor};

#[derive(Debug, Deserialize)]
struct Config {
    model_type: String,
    vocab_size: i64,
    d_model: i64,
    encoder_layers: usize,
    decoder_layers: usize,
    encoder_attention_heads: i64,
    decoder_attention_heads: i64,
    encoder_ffn_dim: i64,
    decoder_ffn_dim: i64,
    activation_function: String,
    max_position_embeddings: i64,
    #[serde(default)]
    scale_embedding: bool,
    pad_token_id: i64,
    eos_token_id: i64,
    #[serde(default)]
    decoder_start_token_id: Option<i64>,
    /// MarianMT: a target vocabulary of its own (absent: the shared one).
    #[serde(default)]
    decoder_vocab_size: Option<i64>,
    #[serde(default)]
    bad_words_ids: Option<Vec<Vec<i64>>>,
}

/// BART's naming (shared by M2M100 / NLLB and mBART, `m2m100.rs`): `{prefix}.weight` /
/// `{prefix}.bias`; LayerNorm epsilon 1e-5 (nn.LayerNorm's default; HF does not store it).
pub(super) fn linear(w: &mut Weights, prefix: &str, out: i64, inp: i64) -> Result<Linear, ModelError> {
    w.linear(prefix, out, inp, true)
}

pub(super) fn norm(w: &mut Weights, prefix: &str, d: i64) -> Result<Norm, ModelError> {
    w.norm(NormKind::Layer, prefix, d, true, 1e-5)
}

pub(super) fn attention(w: &mut Weights, prefix: &str, d: i64, h: i64) -> Result<Attention, ModelError> {
    Ok(Attention::new(
        linear(w, &format!("{prefix}.q_proj"), d, d)?,
        linear(w, &format!("{prefix}.k_proj"), d, d)?,
        linear(w, &format!("{prefix}.v_proj"), d, d)?,
        linear(w, &format!("{prefix}.out_proj"), d, d)?,
        h,
        h,
        d / h,
    ))
}

/// MarianMT's sinusoids `[n, d]` as HF computes them (float64, then the model's dtype):
/// position `p`, unit `i < d/2`: `sin(p 10000^(-2i/d))`, unit `d/2 + i`: the cosine.
fn hf_sinusoids(n: i64, d: i64, device: Device, dtype: DType) -> Tensor {
    let half = d / 2;
    let i = Tensor::arange(half, (DType::Double, Device::Cpu));
    let inv = (i * (-2.0 * 10000f64.ln() / d as f64)).exp();
    let ang = Tensor::arange(n, (DType::Double, Device::Cpu)).unsqueeze(1) * inv.unsqueeze(0);
    place(Tensor::cat(&[ang.sin(), ang.cos()], 1), device, dtype)
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let bad = |why: String| ModelError::Config(cfg_file.clone(), why);
    let marian = cfg.model_type == "marian";
    let d = cfg.d_model;
    for (what, h) in [
        ("encoder_attention_heads", cfg.encoder_attention_heads),
        ("decoder_attention_heads", cfg.decoder_attention_heads),
    ] {
        if h <= 0 || d % h != 0 {
            return Err(bad(format!("d_model {d} is not a multiple of {what} {h}")));
        }
    }
    if marian && d % 2 != 0 {
        return Err(bad(format!("d_model {d} is odd; sinusoidal positions need an even width")));
    }
    let act = match cfg.activation_function.as_str() {
        "swish" | "silu" => Activation::Silu,
        "gelu" => Activation::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
        "relu" => Activation::Relu,
        other => {
            return Err(bad(format!(
                "activation_function '{other}' is not supported (swish, silu, gelu, gelu_new, relu)"
            )))
        }
    };
    let (map, file) = hf::weights(dir, opts.dtype)?;
    let mut w = Weights::new(map, file, opts, None);
    let v_src = cfg.vocab_size;
    let v_tgt = cfg.decoder_vocab_size.unwrap_or(v_src);
    // Token embeddings: `model.shared` (written once by safetensors exports), else each side's
    // own table (pytorch_model.bin holds all names; separate vocabularies have no `shared`).
    let shared =
        if w.shape("model.shared.weight").is_some() { Some(w.get("model.shared.weight", &[v_src, d])?) } else { None };
    let enc_tokens = match &shared {
        Some(t) => t.shallow_clone(),
        None => w.get("model.encoder.embed_tokens.weight", &[v_src, d])?,
    };
    let dec_tokens = match (&shared, v_tgt == v_src) {
        (Some(t), true) => t.shallow_clone(),
        _ => w.get("model.decoder.embed_tokens.weight", &[v_tgt, d])?,
    };
    let scale = if cfg.scale_embedding { (d as f64).sqrt() } else { 1.0 };
    let max = cfg.max_position_embeddings;
    let side = |w: &mut Weights, tokens: Tensor, side: &str| -> Result<Embeddings, ModelError> {
        let positions = if marian {
            // Fixed sinusoids; some exports store them, which changes nothing.
            Positions::Learned(hf_sinusoids(max, d, opts.device, opts.dtype))
        } else {
            // BART numbers positions from 2 (the first two rows are never read).
            let table = w.get(&format!("model.{side}.embed_positions.weight"), &[max + 2, d])?;
            Positions::Learned(table.narrow(0, 2, max))
        };
        let norm = if marian { None } else { Some(norm(w, &format!("model.{side}.layernorm_embedding"), d)?) };
        Ok(Embeddings { tokens, scale, positions, token_type: None, norm })
    };
    let embed = side(&mut w, enc_tokens, "encoder")?;
    let dec_embed = side(&mut w, dec_tokens.shallow_clone(), "decoder")?;
    let (he, hd) = (cfg.encoder_attention_heads, cfg.decoder_attention_heads);
    let mut encoder = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for l in 0..cfg.encoder_layers {
        let p = format!("model.encoder.layers.{l}");
        encoder.push(StackLayer::new(
            attention(&mut w, &format!("{p}.self_attn"), d, he)?,
            norm(&mut w, &format!("{p}.self_attn_layer_norm"), d)?,
            Ffn {
                up: linear(&mut w, &format!("{p}.fc1"), cfg.encoder_ffn_dim, d)?,
                down: linear(&mut w, &format!("{p}.fc2"), d, cfg.encoder_ffn_dim)?,
                act,
                gate: None,
            },
            norm(&mut w, &format!("{p}.final_layer_norm"), d)?,
            NormPosition::Post,
        ));
    }
    let mut decoder = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for l in 0..cfg.decoder_layers {
        let p = format!("model.decoder.layers.{l}");
        decoder.push(DecoderLayer::new(
            attention(&mut w, &format!("{p}.self_attn"), d, hd)?,
            norm(&mut w, &format!("{p}.self_attn_layer_norm"), d)?,
            Some((
                attention(&mut w, &format!("{p}.encoder_attn"), d, hd)?,
                norm(&mut w, &format!("{p}.encoder_attn_layer_norm"), d)?,
            )),
            Ffn {
                up: linear(&mut w, &format!("{p}.fc1"), cfg.decoder_ffn_dim, d)?,
                down: linear(&mut w, &format!("{p}.fc2"), d, cfg.decoder_ffn_dim)?,
                act,
                gate: None,
            },
            norm(&mut w, &format!("{p}.final_layer_norm"), d)?,
            NormPosition::Post,
        ));
    }
    // The output: `lm_head` where stored (untied exports), else the decoder's embeddings; plus
    // `final_logits_bias [1, V]`.
    let head = w.output_or_tied("lm_head.weight", &dec_tokens, true)?;
    let bias = if w.shape("final_logits_bias").is_some() {
        Some(w.get("final_logits_bias", &[1, v_tgt])?.view([v_tgt]))
    } else {
        None
    };
    let start = cfg.decoder_start_token_id.unwrap_or(if marian { cfg.pad_token_id } else { cfg.eos_token_id });
    // Single-token bad words (MarianMT's `[[pad]]`), from config.json or generation_config.json.
    let generation: Option<serde_json::Value> =
        std::fs::read_to_string(dir.join("generation_config.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
    let from_generation = generation
        .as_ref()
        .and_then(|g| g.get("bad_words_ids"))
        .and_then(|v| serde_json::from_value::<Vec<Vec<i64>>>(v.clone()).ok());
    let banned: Vec<i64> = cfg
        .bad_words_ids
        .or(from_generation)
        .unwrap_or_default()
        .into_iter()
        .filter(|b| b.len() == 1)
        .map(|b| b[0])
        .collect();
    for &id in banned.iter().chain([start, cfg.eos_token_id].iter()) {
        if id < 0 || id >= v_tgt {
            return Err(bad(format!(
                "token id {id} (decoder start, EOS or a bad word) is outside the target vocabulary of {v_tgt}"
            )));
        }
    }
    Ok(Transformer {
        embed,
        stack: encoder,
        stack_kind: Kind::Enc,
        causal: false,
        window: None,
        final_norm: None,
        decoder,
        output: Some(Linear { w: head, b: bias }),
        d_model: d,
        eos_id: cfg.eos_token_id,
        // MarianMT with one vocabulary reads both sides through the same embeddings.
        dec_embed: if marian && v_tgt == v_src && cfg.decoder_vocab_size.is_none() { None } else { Some(dec_embed) },
        dec_start: Some(start),
        banned,
        logit_softcap: None,
        forced_bos: Default::default(),
        rel_bias: None,
        max_positions: None,
    })
}
