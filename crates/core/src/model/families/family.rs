//! The checkpoint families headscope reads, one row each: how a directory is recognised (an HF
//! `model_type`, a GGUF file, a Firefox-Translations Marian model), which loader builds the one
//! [`Transformer`], where its tokenizer comes from, whether the model's EOS ends its texts, and
//! which tensors transformers holds as buffers rather than parameters. A new family is a row
//! and a loader file; detection, loading, the parameter count and the message for an unknown
//! directory read the table.

use super::{
    bart, bert, deepseek, gemma, gpt2, gpt_neox, granitehybrid, jamba, lfm2, llama, llama4, llama_gguf, m2m100,
    marian_bin, phi3, qwen3next, t5,
};
use crate::model::readers::hf;
use crate::model::transformer::Transformer;
use crate::model::{LoadOptions, ModelError};
use std::fmt;
use std::path::Path;

/// Checkpoint families, detected from the files ([`ROWS`] says what each is).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Family {
    Bert,
    DeepseekV2,
    DeepseekV3,
    MarianBin,
    /// One GGUF file, of any of the architectures `llama_gguf` reads (a model says which:
    /// `Model::family_name`).
    Gguf,
    Roberta,
    Gpt2,
    GptNeox,
    Llama,
    Llama4Text,
    Qwen2,
    Qwen3,
    Mistral,
    Phi3,
    Olmo2,
    GptOss,
    Olmo3,
    SmolLm3,
    Mixtral,
    Olmoe,
    Qwen2Moe,
    Qwen3Moe,
    Gemma,
    Gemma2,
    Gemma3Text,
    /// LFM2: short-convolution layers beside attention layers.
    Lfm2,
    /// Granite-4.0-H: Mamba-2 layers beside attention layers (and experts).
    GraniteMoeHybrid,
    /// Qwen3-Next: gated DeltaNet layers beside gated attention layers (and experts).
    Qwen3Next,
    /// Jamba: Mamba layers beside attention layers (and experts).
    Jamba,
    Marian,
    Bart,
    M2m100,
    Mbart,
    T5,
    Mt5,
}

/// How a family's checkpoints are recognised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Source {
    /// An HF directory (`config.json`) whose `model_type` is the row's name.
    Hf,
    /// One `*.gguf` file (or a directory holding one).
    Gguf,
    /// A Firefox-Translations Marian model: `model.*.bin` with a `tokenizer.json`.
    MarianBin,
}

/// Where a family's tokenizer comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TokenizerSource {
    /// `tokenizer.json`.
    Json,
    /// `tokenizer.json`, the EOS appended by headscope (the Firefox-Translations models leave it
    /// to the model).
    JsonAppendEos,
    /// `tokenizer.json`, else MarianMT's sentencepiece models and `vocab.json`.
    JsonOrMarianSpm,
    /// `tokenizer.json`, else M2M100's `sentencepiece.bpe.model` and `vocab.json`.
    JsonOrM2m100Spm,
    /// `tokenizer.json` beside the file, else the GGUF's own metadata.
    JsonOrGguf,
}

/// One family's row.
pub struct Row {
    pub family: Family,
    /// Its name: the HF `model_type` for an HF family.
    pub name: &'static str,
    pub source: Source,
    pub load: fn(&Path, LoadOptions) -> Result<Transformer, ModelError>,
    pub tokenizer: TokenizerSource,
    /// The model's EOS ends each text (`tok.eos_id`); encoders have none.
    pub eos_from_model: bool,
    /// Parameter names (`Transformer::named_params_mut`, ending so) that transformers holds as
    /// buffers, not parameters: left out of the parameter count.
    pub buffers: &'static [&'static str],
}

fn bert_load(p: &Path, o: LoadOptions) -> Result<Transformer, ModelError> {
    bert::load(p, o).map(|(n, _cfg)| n)
}

const fn hf(
    family: Family,
    name: &'static str,
    load: fn(&Path, LoadOptions) -> Result<Transformer, ModelError>,
    tokenizer: TokenizerSource,
    eos_from_model: bool,
    buffers: &'static [&'static str],
) -> Row {
    Row { family, name, source: Source::Hf, load, tokenizer, eos_from_model, buffers }
}

use TokenizerSource::{Json, JsonOrM2m100Spm, JsonOrMarianSpm};

/// HF BART, mBART and MarianMT hold `final_logits_bias` as a buffer.
const LOGITS_BIAS: &[&str] = &["unembed.b_U"];
/// Llama 4's q/k norms have no weight in transformers (held here with unit weights).
const UNIT_QK_NORMS: &[&str] = &["q_norm.w", "k_norm.w"];
/// DeepSeek-V3's router holds its choice bias (`e_score_correction_bias`, GGUF `exp_probs_b`) as
/// a buffer.
const CHOICE_BIAS: &[&str] = &["b_gate_choice"];
/// M2M100's sinusoid tables are buffers (MarianMT's are frozen parameters).
const SINUSOIDS: &[&str] = &["pos_embed.W_pos"];

/// Every family, HF families in the order errors list them.
pub const ROWS: &[Row] = &[
    hf(Family::Bart, "bart", bart::load, Json, true, LOGITS_BIAS),
    hf(Family::Bert, "bert", bert_load, Json, false, &[]),
    hf(Family::DeepseekV2, "deepseek_v2", deepseek::load, Json, true, &[]),
    hf(Family::DeepseekV3, "deepseek_v3", deepseek::load, Json, true, CHOICE_BIAS),
    hf(Family::Gemma, "gemma", gemma::load, Json, true, &[]),
    hf(Family::Gemma2, "gemma2", gemma::load, Json, true, &[]),
    hf(Family::Gemma3Text, "gemma3_text", gemma::load, Json, true, &[]),
    hf(Family::Gpt2, "gpt2", gpt2::load, Json, true, &[]),
    hf(Family::GptNeox, "gpt_neox", gpt_neox::load, Json, true, &[]),
    hf(Family::GptOss, "gpt_oss", llama::load, Json, true, &[]),
    hf(Family::GraniteMoeHybrid, "granitemoehybrid", granitehybrid::load, Json, true, &[]),
    hf(Family::Jamba, "jamba", jamba::load, Json, true, &[]),
    hf(Family::Lfm2, "lfm2", lfm2::load, Json, true, &[]),
    hf(Family::Llama, "llama", llama::load, Json, true, &[]),
    hf(Family::Llama4Text, "llama4_text", llama4::load, Json, true, UNIT_QK_NORMS),
    hf(Family::M2m100, "m2m_100", m2m100::load, JsonOrM2m100Spm, true, SINUSOIDS),
    hf(Family::Marian, "marian", bart::load, JsonOrMarianSpm, true, LOGITS_BIAS),
    hf(Family::Mbart, "mbart", m2m100::load, Json, true, LOGITS_BIAS),
    hf(Family::Mistral, "mistral", llama::load, Json, true, &[]),
    hf(Family::Mixtral, "mixtral", llama::load, Json, true, &[]),
    hf(Family::Olmo2, "olmo2", llama::load, Json, true, &[]),
    hf(Family::Olmo3, "olmo3", llama::load, Json, true, &[]),
    hf(Family::Olmoe, "olmoe", llama::load, Json, true, &[]),
    hf(Family::Phi3, "phi3", phi3::load, Json, true, &[]),
    hf(Family::Qwen2, "qwen2", llama::load, Json, true, &[]),
    hf(Family::Qwen2Moe, "qwen2_moe", llama::load, Json, true, &[]),
    hf(Family::Qwen3, "qwen3", llama::load, Json, true, &[]),
    hf(Family::Qwen3Moe, "qwen3_moe", llama::load, Json, true, &[]),
    hf(Family::Qwen3Next, "qwen3_next", qwen3next::load, Json, true, &[]),
    hf(Family::Roberta, "roberta", bert_load, Json, false, &[]),
    hf(Family::SmolLm3, "smollm3", llama::load, Json, true, &[]),
    hf(Family::Mt5, "mt5", t5::load, Json, true, &[]),
    hf(Family::T5, "t5", t5::load, Json, true, &[]),
    Row {
        family: Family::MarianBin,
        name: "marian_bin",
        source: Source::MarianBin,
        load: marian_bin::load,
        tokenizer: TokenizerSource::JsonAppendEos,
        eos_from_model: false,
        buffers: &[],
    },
    Row {
        family: Family::Gguf,
        name: "gguf",
        source: Source::Gguf,
        load: llama_gguf::load,
        tokenizer: TokenizerSource::JsonOrGguf,
        eos_from_model: true,
        // deepseek2's `exp_probs_b` is V3's choice bias.
        buffers: CHOICE_BIAS,
    },
];

impl Family {
    /// This family's row of [`ROWS`] (every family has one: `every_family_has_one_row`).
    pub fn row(self) -> &'static Row {
        ROWS.iter().find(|r| r.family == self).unwrap_or(&ROWS[0])
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.row().name)
    }
}

/// The family of a checkpoint directory; an HF directory whose `model_type` is not supported
/// is an error listing the supported ones.
pub fn detect(dir: &Path) -> Result<Option<Family>, ModelError> {
    let of = |s: Source| ROWS.iter().find(|r| r.source == s).map(|r| r.family);
    if hf::is_hf_dir(dir) {
        let t = hf::model_type(dir)?;
        return match ROWS.iter().find(|r| r.source == Source::Hf && r.name == t) {
            Some(r) => Ok(Some(r.family)),
            None => Err(ModelError::Config(
                dir.join("config.json").display().to_string(),
                format!("model_type '{t}' is not supported (supported: {})", hf_names().join(", ")),
            )),
        };
    }
    if dir.is_file() {
        return Ok(llama_gguf::gguf_of(dir).and_then(|_| of(Source::Gguf)));
    }
    Ok(if marian_bin::find_bin(dir).is_some() && dir.join("tokenizer.json").is_file() {
        of(Source::MarianBin)
    } else if llama_gguf::find_gguf(dir).is_some() {
        of(Source::Gguf)
    } else {
        None
    })
}

/// The HF `model_type`s read, sorted.
pub fn hf_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = ROWS.iter().filter(|r| r.source == Source::Hf).map(|r| r.name).collect();
    names.sort();
    names
}

/// What a directory headscope does not know is told: every family the table holds.
pub fn unknown(path: &str) -> String {
    format!(
        "'{path}' is not a model directory headscope knows: expected an HF checkpoint (config.json + model.safetensors, sharded safetensors or pytorch_model.bin; model_type {}), a Firefox-Translations Marian model (model.*.bin + tokenizer.json), or one *.gguf (architectures {}; a tokenizer.json beside it is used before the GGUF's own); a Hugging Face model id is looked up in the local cache",
        hf_names().join(", "),
        llama_gguf::SUPPORTED
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_one_row() {
        let all = [
            Family::Bert,
            Family::MarianBin,
            Family::Gguf,
            Family::Roberta,
            Family::Gpt2,
            Family::GptNeox,
            Family::Llama,
            Family::Qwen2,
            Family::Qwen3,
            Family::Mistral,
            Family::Phi3,
            Family::Olmo2,
            Family::Olmo3,
            Family::SmolLm3,
            Family::GptOss,
            Family::Mixtral,
            Family::Olmoe,
            Family::Qwen2Moe,
            Family::Qwen3Moe,
            Family::DeepseekV2,
            Family::DeepseekV3,
            Family::Llama4Text,
            Family::Gemma,
            Family::Gemma2,
            Family::Gemma3Text,
            Family::Lfm2,
            Family::GraniteMoeHybrid,
            Family::Qwen3Next,
            Family::Jamba,
            Family::Marian,
            Family::Bart,
            Family::M2m100,
            Family::Mbart,
            Family::T5,
            Family::Mt5,
        ];
        for f in all {
            assert_eq!(ROWS.iter().filter(|r| r.family == f).count(), 1, "{f:?}");
            assert_eq!(f.row().family, f);
        }
        assert_eq!(ROWS.len(), all.len());
    }

    #[test]
    fn the_unknown_directory_message_lists_every_family() {
        let msg = ModelError::UnknownFamily("x".into()).to_string();
        for r in ROWS.iter().filter(|r| r.source == Source::Hf) {
            assert!(msg.contains(r.name), "{} missing from: {msg}", r.name);
        }
        assert!(msg.contains("gemma3") && msg.contains("gptneox") && msg.contains("model.*.bin"), "{msg}");
    }
}
