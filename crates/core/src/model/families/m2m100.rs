//! HF M2M100 (`model_type: "m2m_100"`; NLLB-200's dense checkpoints are M2M100 with an NLLB
//! tokenizer) and mBART (`"mbart"`): pre-norm encoder-decoders with the same layers (names
//! below) that differ in their embeddings. Every sublayer reads its LayerNorm of the stream
//! (`x + f(norm(x))`); encoder and decoder end in a final `layer_norm`.
//! M2M100: fixed sinusoids numbered from `pad + 1` (fairseq's positions; frequencies
//! `10000^(-i / (d/2 - 1))`, `[sin | cos]`, computed in float32 as transformers does), no
//! embedding norm, output tied to the shared embeddings, no `final_logits_bias`.
//! mBART: learned positions numbered from 2, `layernorm_embedding` on both sides,
//! `final_logits_bias`. Both: embeddings times `sqrt(d)` under `scale_embedding`, the decoder
//! starts from `decoder_start_token_id` and, where the checkpoint (or `load_model`'s `tgt_lang`)
//! says so, emits the target-language token `forced_bos_token_id` first. The decoder's causal
//! self-attention heads are kind `dec`.

use crate::model::families::bart::{attention, linear, norm};
use crate::model::nn::{Activation, Ffn, Linear, NormPosition};
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
    /// Absent: the family's default (M2M100 true, mBART false).
    #[serde(default)]
    scale_embedding: Option<bool>,
    pad_token_id: i64,
    eos_token_id: i64,
    #[serde(default)]
    bos_token_id: Option<i64>,
    #[serde(default)]
    decoder_start_token_id: Option<i64>,
    #[serde(default)]
    forced_bos_token_id: Option<i64>,
}

/// What `generation_config.json` may add (transformers 4.57 moves generation keys there).
#[derive(Debug, Default, Deserialize)]
struct Generation {
    #[serde(default)]
    decoder_start_token_id: Option<i64>,
    #[serde(default)]
    forced_bos_token_id: Option<i64>,
}

/// M2M100's sinusoids for positions `first..first + n` `[n, d]`, as
/// `M2M100SinusoidalPositionalEmbedding.get_embedding` computes them: in float32, frequency
/// `i < d/2` is `exp(i * -(ln 10000 / (d/2 - 1)))`, unit `i` the sine and `d/2 + i` the cosine
/// of position times frequency; an odd width gets a zero last unit.
fn m2m100_sinusoids(first: i64, n: i64, d: i64, device: Device, dtype: DType) -> Tensor {
    let half = d / 2;
    let step = 10000f64.ln() / (half - 1) as f64;
    let freq = (Tensor::arange(half, (DType::Int64, Device::Cpu)).to_kind(DType::Float) * -step).exp();
    let ang = Tensor::arange_start(first, first + n, (DType::Int64, Device::Cpu)).to_kind(DType::Float).unsqueeze(1)
        * freq.unsqueeze(0);
    let mut table = Tensor::cat(&[ang.sin(), ang.cos()], 1);
    if d % 2 == 1 {
        table = Tensor::cat(&[table, Tensor::zeros([n, 1], (DType::Float, Device::Cpu))], 1);
    }
    place(table, device, dtype)
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let bad = |why: String| ModelError::Config(cfg_file.clone(), why);
    let m2m = cfg.model_type == "m2m_100";
    let d = cfg.d_model;
    for (what, h) in [
        ("encoder_attention_heads", cfg.encoder_attention_heads),
        ("decoder_attention_heads", cfg.decoder_attention_heads),
    ] {
        if h <= 0 || d % h != 0 {
            return Err(bad(format!("d_model {d} is not a multiple of {what} {h}")));
        }
    }
    if m2m && d < 4 {
        return Err(bad(format!("d_model {d} is too small for M2M100's sinusoidal positions (at least 4)")));
    }
    if cfg.max_position_embeddings <= 0 || cfg.max_position_embeddings > 1 << 20 {
        return Err(bad(format!("max_position_embeddings {} is outside 1..2^20", cfg.max_position_embeddings)));
    }
    if cfg.pad_token_id < 0 || cfg.pad_token_id > 1 << 30 {
        return Err(bad(format!("pad_token_id {} is outside 0..2^30", cfg.pad_token_id)));
    }
    let act = match cfg.activation_function.as_str() {
        "relu" => Activation::Relu,
        "gelu" => Activation::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
        "swish" | "silu" => Activation::Silu,
        other => {
            return Err(bad(format!(
                "activation_function '{other}' is not supported (relu, gelu, gelu_new, swish, silu)"
            )))
        }
    };
    let (map, file) = hf::weights(dir, opts.dtype)?;
    let mut w = Weights::new(map, file, opts, None);
    let v = cfg.vocab_size;
    // Token embeddings: `model.shared` (safetensors exports write the tied table once), else
    // each side's own name.
    let shared =
        if w.shape("model.shared.weight").is_some() { Some(w.get("model.shared.weight", &[v, d])?) } else { None };
    let tokens = |w: &mut Weights, side: &str| -> Result<Tensor, ModelError> {
        match &shared {
            Some(t) => Ok(t.shallow_clone()),
            None => w.get(&format!("model.{side}.embed_tokens.weight"), &[v, d]),
        }
    };
    let enc_tokens = tokens(&mut w, "encoder")?;
    let dec_tokens = tokens(&mut w, "decoder")?;
    let scale = if cfg.scale_embedding.unwrap_or(m2m) { (d as f64).sqrt() } else { 1.0 };
    let max = cfg.max_position_embeddings;
    let side = |w: &mut Weights, tokens: Tensor, side: &str| -> Result<Embeddings, ModelError> {
        if m2m {
            // fairseq numbers real tokens from pad + 1 (a right-padded batch keeps them so).
            let positions = Positions::Learned(m2m100_sinusoids(cfg.pad_token_id + 1, max, d, opts.device, opts.dtype));
            Ok(Embeddings { tokens, scale, positions, token_type: None, norm: None })
        } else {
            // mBART numbers positions from 2 (the first two rows are never read).
            let table = w.get(&format!("model.{side}.embed_positions.weight"), &[max + 2, d])?;
            let norm = Some(norm(w, &format!("model.{side}.layernorm_embedding"), d)?);
            Ok(Embeddings {
                tokens,
                scale,
                positions: Positions::Learned(table.narrow(0, 2, max)),
                token_type: None,
                norm,
            })
        }
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
            NormPosition::Pre,
        ));
    }
    let enc_final = norm(&mut w, "model.encoder.layer_norm", d)?;
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
            NormPosition::Pre,
        ));
    }
    // The decoder's final norm runs after its last layer.
    let dec_final = norm(&mut w, "model.decoder.layer_norm", d)?;
    match decoder.last_mut() {
        Some(last) => last.final_norm = Some(dec_final),
        None => return Err(bad("decoder_layers is 0: a translation model needs a decoder".into())),
    }
    // The output: `lm_head` where stored (untied exports), else the shared embeddings; mBART's
    // `final_logits_bias [1, V]`.
    let head = w.output_or_tied("lm_head.weight", &dec_tokens, true)?;
    let bias = if w.shape("final_logits_bias").is_some() {
        Some(w.get("final_logits_bias", &[1, v])?.view([v]))
    } else {
        None
    };
    let generation: Generation = match std::fs::read_to_string(dir.join("generation_config.json")) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| ModelError::Config(dir.join("generation_config.json").display().to_string(), e.to_string()))?,
        Err(_) => Generation::default(),
    };
    // transformers' fallback for a missing decoder start is the BOS.
    let start = cfg
        .decoder_start_token_id
        .or(generation.decoder_start_token_id)
        .or(cfg.bos_token_id)
        .unwrap_or(cfg.eos_token_id);
    let forced = cfg.forced_bos_token_id.or(generation.forced_bos_token_id);
    for (what, id) in [
        ("decoder_start_token_id", Some(start)),
        ("eos_token_id", Some(cfg.eos_token_id)),
        ("forced_bos_token_id", forced),
    ] {
        if let Some(id) = id.filter(|&i| i < 0 || i >= v) {
            return Err(bad(format!("{what} {id} is outside the vocabulary of {v}")));
        }
    }
    Ok(Transformer {
        embed,
        stack: encoder,
        stack_kind: Kind::Enc,
        causal: false,
        window: None,
        final_norm: Some(enc_final),
        decoder,
        output: Some(Linear { w: head, b: bias }),
        d_model: d,
        eos_id: cfg.eos_token_id,
        dec_embed: Some(dec_embed),
        dec_start: Some(start),
        banned: vec![],
        logit_softcap: None,
        forced_bos: crate::model::transformer::ForcedBos::new(forced),
        rel_bias: None,
        max_positions: None,
    })
}
