//! BERT and RoBERTa checkpoints (HF layout): `config.json`, safetensors, `tokenizer.json`.
//! RoBERTa is the same code with `roberta.` names and positions after the padding index.
//! The real all-MiniLM-L6-v2 of the assets is one.

use crate::model::nn::{Activation, Attention, Ffn, NormKind, NormPosition};
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{Kind, LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;

/// The fields of HF's `config.json` that matter here.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub hidden_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub intermediate_size: i64,
    pub hidden_act: String,
    pub layer_norm_eps: f64,
    pub max_position_embeddings: i64,
    pub vocab_size: i64,
    #[serde(default)]
    pub model_type: String,
    /// RoBERTa: positions start after the padding index (`pad_token_id + 1`).
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<(Transformer, Config), ModelError> {
    let cfg_path = dir.join("config.json");
    let cfg: Config = crate::model::readers::hf::typed_config(dir)?;
    let act = match cfg.hidden_act.as_str() {
        "gelu" => Activation::Gelu,
        "relu" => Activation::Relu,
        other => {
            return Err(ModelError::Config(
                cfg_path.display().to_string(),
                format!("hidden_act '{other}' is not supported (gelu, relu)"),
            ))
        }
    };
    if cfg.num_attention_heads <= 0 || cfg.hidden_size % cfg.num_attention_heads != 0 {
        return Err(ModelError::Config(
            cfg_path.display().to_string(),
            format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                cfg.hidden_size, cfg.num_attention_heads
            ),
        ));
    }
    let (map, file) = crate::model::readers::hf::weights(dir, opts.dtype)?;
    let roberta = cfg.model_type == "roberta";
    let mut w = Weights::new(map, file, opts, Some(if roberta { "roberta." } else { "bert." }));
    let (d, h, f, eps) = (cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size, cfg.layer_norm_eps);

    let embed = Embeddings {
        tokens: w.get("embeddings.word_embeddings.weight", &[cfg.vocab_size, d])?,
        scale: 1.0,
        positions: Positions::Learned({
            let table = w.get("embeddings.position_embeddings.weight", &[cfg.max_position_embeddings, d])?;
            // RoBERTa numbers positions from pad_token_id + 1: the rows before are never read.
            let offset = if roberta { cfg.pad_token_id.unwrap_or(1) + 1 } else { 0 };
            if offset >= cfg.max_position_embeddings {
                return Err(ModelError::Config(
                    cfg_path.display().to_string(),
                    format!("pad_token_id {} leaves no position embeddings", offset - 1),
                ));
            }
            table.narrow(0, offset, cfg.max_position_embeddings - offset)
        }),
        token_type: Some({
            let n = w.shape("embeddings.token_type_embeddings.weight").map_or(2, |s| s[0]);
            w.get("embeddings.token_type_embeddings.weight", &[n, d])?
        }),
        norm: Some(w.norm(NormKind::Layer, "embeddings.LayerNorm", d, true, eps)?),
    };
    let mut encoder = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for l in 0..cfg.num_hidden_layers {
        let p = format!("encoder.layer.{l}");
        encoder.push(StackLayer::new(
            Attention::new(
                w.linear(&format!("{p}.attention.self.query"), d, d, true)?,
                w.linear(&format!("{p}.attention.self.key"), d, d, true)?,
                w.linear(&format!("{p}.attention.self.value"), d, d, true)?,
                w.linear(&format!("{p}.attention.output.dense"), d, d, true)?,
                h,
                h,
                d / h,
            ),
            w.norm(NormKind::Layer, &format!("{p}.attention.output.LayerNorm"), d, true, eps)?,
            Ffn {
                up: w.linear(&format!("{p}.intermediate.dense"), f, d, true)?,
                down: w.linear(&format!("{p}.output.dense"), d, f, true)?,
                act,
                gate: None,
            },
            w.norm(NormKind::Layer, &format!("{p}.output.LayerNorm"), d, true, eps)?,
            NormPosition::Post,
        ));
    }
    // No decoder; [SEP] (102 in BERT vocabularies) or RoBERTa's </s> closes each sentence.
    let eos_id = crate::model::readers::hf::first_id(&cfg.eos_token_id).unwrap_or(102);
    Ok((
        Transformer {
            embed,
            stack: encoder,
            stack_kind: Kind::Enc,
            causal: false,
            window: None,
            final_norm: None,
            decoder: vec![],
            output: None,
            d_model: d,
            eos_id,
            dec_embed: None,
            dec_start: None,
            banned: vec![],
            logit_softcap: None,
            forced_bos: Default::default(),
            rel_bias: None,
            max_positions: None,
        },
        cfg,
    ))
}
