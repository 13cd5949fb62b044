//! HF T5, Flan-T5 (`model_type: "t5"`) and mT5 (`"mt5"`): pre-norm encoder-decoders with
//! RMSNorms without bias (`layer_norm_epsilon`), no position embeddings but a relative position
//! bias per head (`relative_attention_bias` of each stack's first layer, shared by every layer:
//! `transformer::RelativeBias`; bidirectional buckets in the encoder, causal ones in the
//! decoder, none on cross-attention), no `1/sqrt(d)` score scaling, projections without bias
//! (inner width `num_heads * d_kv`), ReLU (`DenseReluDense.wi`, `wo`) or gated GELU / ReLU
//! (`wi_0` the gate, `wi_1` the linear branch), final norms on both stacks, the decoder start
//! token (`<pad>`), and the output tied to the shared embeddings (T5 v1.0: the decoder's output
//! scaled by `d_model^-0.5` first, folded into its final norm's weight, so
//! `dec.ln_final.hook_normalized` is what the output layer reads) or an untied `lm_head`
//! (T5 v1.1, Flan-T5, mT5). The decoder's causal self-attention heads are kind `dec`.

use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition, Score};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{DecoderLayer, Embeddings, Positions, RelativeBias, StackLayer, Transformer};
use crate::model::{Kind, LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Deserialize)]
pub(crate) struct Config {
    pub model_type: String,
    pub vocab_size: i64,
    pub d_model: i64,
    pub d_kv: i64,
    pub d_ff: i64,
    pub num_layers: usize,
    /// Absent: as many as the encoder's.
    #[serde(default)]
    pub num_decoder_layers: Option<usize>,
    pub num_heads: i64,
    /// Required: the relative position bias has no default a checkpoint can rely on.
    #[serde(default)]
    pub relative_attention_num_buckets: Option<i64>,
    #[serde(default)]
    pub relative_attention_max_distance: Option<i64>,
    #[serde(default)]
    pub layer_norm_epsilon: Option<f64>,
    #[serde(default)]
    pub feed_forward_proj: Option<String>,
    /// Absent: transformers' default (T5 true, mT5 false). transformers 5 always writes true and
    /// lets the weights decide (an `lm_head.weight` present is used).
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    /// transformers 5's T5: whether the decoder's output is scaled by d_model^-0.5 before the
    /// output layer (4.x: whenever the output is tied). transformers 5's mT5 never scales.
    #[serde(default)]
    pub scale_decoder_outputs: Option<bool>,
    /// Which transformers wrote the config: 5.x's T5 and mT5 read tying and scaling otherwise.
    #[serde(default)]
    pub transformers_version: Option<String>,
    pub pad_token_id: i64,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub decoder_start_token_id: Option<i64>,
}

fn linear(w: &mut Weights, name: &str, out: i64, inp: i64) -> Result<Linear, ModelError> {
    Ok(Linear { w: w.get(name, &[out, inp])?, b: None })
}

fn rms(w: &mut Weights, name: &str, d: i64, eps: f64) -> Result<Norm, ModelError> {
    Ok(Norm { kind: NormKind::Rms, weight: w.get(name, &[d])?, bias: None, eps })
}

/// `{prefix}.q`, `.k`, `.v`, `.o` without bias; scores unscaled.
fn attention(w: &mut Weights, prefix: &str, d: i64, h: i64, dkv: i64) -> Result<Attention, ModelError> {
    let inner = h * dkv;
    Ok(Attention::new(
        linear(w, &format!("{prefix}.q.weight"), inner, d)?,
        linear(w, &format!("{prefix}.k.weight"), inner, d)?,
        linear(w, &format!("{prefix}.v.weight"), inner, d)?,
        linear(w, &format!("{prefix}.o.weight"), d, inner)?,
        h,
        h,
        dkv,
    )
    .with_score(Score { scale: Some(1.0), softcap: None }))
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
    build(&cfg, &cfg_file, Weights::new(map, file, opts, None))
}

/// The model of `cfg` (read from `cfg_file`) over HF's tensor names in `w`.
pub(crate) fn build(cfg: &Config, cfg_file: &str, mut w: Weights) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let (d, h, dkv, v) = (cfg.d_model, cfg.num_heads, cfg.d_kv, cfg.vocab_size);
    for (what, x) in [("d_model", d), ("num_heads", h), ("d_kv", dkv), ("d_ff", cfg.d_ff), ("vocab_size", v)] {
        if x <= 0 {
            return Err(bad(format!("{what} {x} must be positive")));
        }
    }
    let buckets = cfg
        .relative_attention_num_buckets
        .ok_or_else(|| bad("relative_attention_num_buckets is missing: T5's relative position bias needs it".into()))?;
    let max_distance = cfg.relative_attention_max_distance.unwrap_or(128);
    // The encoder's buckets split between the two directions, half of each exact: the
    // logarithmic half needs a distance beyond the exact ones.
    if !(4..=1 << 16).contains(&buckets) || max_distance <= buckets / 2 || max_distance > 1 << 30 {
        return Err(bad(format!("relative_attention_num_buckets {buckets} and relative_attention_max_distance {max_distance}: expected 4..65536 buckets and a distance above half of them")));
    }
    let eps = cfg.layer_norm_epsilon.unwrap_or(1e-6);
    let proj = cfg.feed_forward_proj.clone().unwrap_or_else(|| "relu".into());
    let (gated, act_name) = match proj.split_once('-') {
        Some(("gated", a)) => (true, a),
        None => (false, proj.as_str()),
        Some(_) => {
            return Err(bad(format!(
                "feed_forward_proj '{proj}' is not supported (an activation, or gated-ACTIVATION)"
            )))
        }
    };
    // transformers: "gated-gelu" runs gelu_new (tanh, written out); a plain "gelu" the exact one.
    let act = match (act_name, gated) {
        ("relu", _) => Activation::Relu,
        ("gelu", true) | ("gelu_new", _) => Activation::GeluNew,
        ("gelu_pytorch_tanh", _) => Activation::GeluTanh,
        ("gelu", false) => Activation::Gelu,
        ("silu", _) | ("swish", _) => Activation::Silu,
        (other, _) => {
            return Err(bad(format!(
                "feed_forward_proj '{proj}': activation '{other}' is not supported (relu, gelu, gelu_new, silu)"
            )))
        }
    };
    // transformers 4: tie_word_embeddings ties the output to the shared embeddings and scales the
    // decoder's output; transformers 5 (docs/formats.md#transformers-5-configs): the output is
    // tied when the checkpoint holds no lm_head.weight, and scale_decoder_outputs scales (T5;
    // mT5 never scales).
    let tf5 =
        cfg.scale_decoder_outputs.is_some() || cfg.transformers_version.as_deref().is_some_and(|v| v.starts_with('5'));
    let (tied, scaled) = if tf5 {
        (w.shape("lm_head.weight").is_none(), cfg.model_type == "t5" && cfg.scale_decoder_outputs.unwrap_or(true))
    } else {
        let t = cfg.tie_word_embeddings.unwrap_or(cfg.model_type == "t5");
        (t, t)
    };
    let eos = hf::first_id(&cfg.eos_token_id).unwrap_or(1);
    let tokens = if w.shape("shared.weight").is_some() {
        w.get("shared.weight", &[v, d])?
    } else {
        w.get("encoder.embed_tokens.weight", &[v, d])?
    };
    let ffn = |w: &mut Weights, p: &str| -> Result<Ffn, ModelError> {
        Ok(if gated {
            Ffn {
                gate: Some(linear(w, &format!("{p}.wi_0.weight"), cfg.d_ff, d)?),
                up: linear(w, &format!("{p}.wi_1.weight"), cfg.d_ff, d)?,
                down: linear(w, &format!("{p}.wo.weight"), d, cfg.d_ff)?,
                act,
            }
        } else {
            Ffn {
                gate: None,
                up: linear(w, &format!("{p}.wi.weight"), cfg.d_ff, d)?,
                down: linear(w, &format!("{p}.wo.weight"), d, cfg.d_ff)?,
                act,
            }
        })
    };
    let rel = |w: &mut Weights, side: &str, bidirectional: bool| -> Result<RelativeBias, ModelError> {
        let table =
            w.get(&format!("{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"), &[buckets, h])?;
        Ok(RelativeBias { table, bidirectional, num_buckets: buckets, max_distance })
    };
    let enc_rel = rel(&mut w, "encoder", true)?;
    let mut encoder = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for l in 0..cfg.num_layers {
        let p = format!("encoder.block.{l}.layer");
        encoder.push(StackLayer::new(
            attention(&mut w, &format!("{p}.0.SelfAttention"), d, h, dkv)?,
            rms(&mut w, &format!("{p}.0.layer_norm.weight"), d, eps)?,
            ffn(&mut w, &format!("{p}.1.DenseReluDense"))?,
            rms(&mut w, &format!("{p}.1.layer_norm.weight"), d, eps)?,
            NormPosition::Pre,
        ));
    }
    let enc_final = rms(&mut w, "encoder.final_layer_norm.weight", d, eps)?;
    let dec_rel = rel(&mut w, "decoder", false)?;
    let mut decoder = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for l in 0..cfg.num_decoder_layers.unwrap_or(cfg.num_layers) {
        let p = format!("decoder.block.{l}.layer");
        decoder.push(
            DecoderLayer::new(
                attention(&mut w, &format!("{p}.0.SelfAttention"), d, h, dkv)?,
                rms(&mut w, &format!("{p}.0.layer_norm.weight"), d, eps)?,
                Some((
                    attention(&mut w, &format!("{p}.1.EncDecAttention"), d, h, dkv)?,
                    rms(&mut w, &format!("{p}.1.layer_norm.weight"), d, eps)?,
                )),
                ffn(&mut w, &format!("{p}.2.DenseReluDense"))?,
                rms(&mut w, &format!("{p}.2.layer_norm.weight"), d, eps)?,
                NormPosition::Pre,
            )
            .with_rel_bias(Some(RelativeBias { table: dec_rel.table.shallow_clone(), ..dec_rel })),
        );
    }
    let mut dec_final = rms(&mut w, "decoder.final_layer_norm.weight", d, eps)?;
    if scaled {
        // transformers scales the decoder's output by d_model^-0.5 before the output layer.
        dec_final.weight = dec_final.weight * (d as f64).powf(-0.5);
    }
    match decoder.last_mut() {
        Some(last) => last.final_norm = Some(dec_final),
        None => return Err(bad("num_decoder_layers is 0: a translation model needs a decoder".into())),
    }
    let head = if tied { tokens.shallow_clone() } else { w.get("lm_head.weight", &[v, d])? };
    let start = cfg.decoder_start_token_id.unwrap_or(cfg.pad_token_id);
    for (what, id) in [("decoder_start_token_id", start), ("eos_token_id", eos)] {
        if id < 0 || id >= v {
            return Err(bad(format!("{what} {id} is outside the vocabulary of {v}")));
        }
    }
    let embed = Embeddings {
        tokens: tokens.shallow_clone(),
        scale: 1.0,
        positions: Positions::None,
        token_type: None,
        norm: None,
    };
    Ok(Transformer {
        embed,
        stack: encoder,
        stack_kind: Kind::Enc,
        causal: false,
        window: None,
        final_norm: Some(enc_final),
        decoder,
        output: Some(Linear { w: head, b: None }),
        d_model: d,
        eos_id: eos,
        dec_embed: None,
        dec_start: Some(start),
        banned: vec![],
        logit_softcap: None,
        forced_bos: Default::default(),
        rel_bias: Some(enc_rel),
        max_positions: None,
    })
}
