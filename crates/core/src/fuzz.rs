//! Fuzz entry points: one per reader of user files, each taking the file's bytes. The AFL
//! targets in `fuzz/` (docs/fuzzing.md) and the plain replay of the committed corpus and
//! regression files (`tests/readers/fuzz_corpus.rs`) both call [`run`], so they exercise the same
//! code. A reader answers any input with a value or an error; a panic is a bug.

use crate::data::conllu;
use crate::model::families::marian_bin;
use crate::model::readers::{gguf, safetensors, torch_pickle};
use crate::model::tokenize::spm;
use crate::model::tokenize::tokenizer::{Framing, MarianVocab, Tok};
use crate::prune::checkpoint;

/// Every target, by the name of its AFL binary and of its corpus folder.
pub const TARGETS: &[&str] = &[
    "conllu",
    "safetensors",
    "gguf",
    "gguf_model",
    "marian_bin",
    "torch_pickle",
    "tokenizer_json",
    "spm",
    "marian_vocab",
    "checkpoint",
];

/// A sentence every tokenizer target encodes once it has loaded (accents, digits, CJK,
/// emoji, a control character), then decodes back.
const TEXT: &str = "Héllo, wörld 42! 日本 \u{1F600}\ttab\u{7}";

/// Feeds `data` to the reader `target` names: `Ok` when the reader accepted it, the
/// reader's one-line error otherwise.
pub fn run(target: &str, data: &[u8]) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    match target {
        "conllu" => {
            // Treebanks are read as UTF-8 text (`Dataset::treebank`).
            let text = std::str::from_utf8(data).map_err(|x| e(&x))?;
            let sents = conllu::parse(text, "fuzz.conllu").map_err(|x| e(&x))?;
            for s in &sents {
                let _ = (s.text(), s.word_spans(), s.sent_id());
            }
            let _ = conllu::write(&sents);
            Ok(())
        }
        "safetensors" => safetensors::read_bytes(data, "fuzz.safetensors").map(drop).map_err(|x| e(&x)),
        "gguf" => {
            let g = gguf::Gguf::from_bytes(Box::new(data.to_vec()), "fuzz.gguf".into()).map_err(|x| e(&x))?;
            // The tokenizer in the metadata, where there is one (refusals are fine, panics not).
            if g.metadata.contains_key("tokenizer.ggml.model") {
                Tok::from_gguf(&g).map_err(|x| e(&x))?;
            }
            let names: Vec<String> = g.tensors.iter().take(16).map(|t| t.name.clone()).collect();
            for name in names {
                let _dequantised = g.tensor(&name).map_err(|x| e(&x))?;
            }
            Ok(())
        }
        "gguf_model" => {
            // The model a GGUF's architecture names, built from its metadata and tensors
            // (`llama_gguf::build_from`: every architecture read, T5's encoder-decoder included).
            let g = gguf::Gguf::from_bytes(Box::new(data.to_vec()), "fuzz.gguf".into()).map_err(|x| e(&x))?;
            let opts = crate::model::LoadOptions::new(crate::device::DeviceChoice::Cpu, "f32").map_err(|x| e(&x))?;
            crate::model::families::llama_gguf::build_from(&g, "fuzz.gguf", opts).map(drop).map_err(|x| e(&x))
        }
        "marian_bin" => marian_bin::read_bin_bytes(data, "fuzz.bin").map(drop).map_err(|x| e(&x)),
        "torch_pickle" => torch_pickle::read_bytes(data, "pytorch_model.bin").map(drop).map_err(|x| e(&x)),
        "tokenizer_json" => {
            let tok = Tok::from_bytes(data, "tokenizer.json", Framing::Tokenizer).map_err(|x| e(&x))?;
            let enc = tok.encode(TEXT).map_err(|x| e(&x))?;
            tok.decode(&enc.ids).map_err(|x| e(&x))?;
            Ok(())
        }
        "spm" => {
            let m = spm::parse(data).map_err(|x| format!("fuzz.spm: {x}"))?;
            // Unigram models (Marian, T5), BPE ones (M2M100's sentencepiece.bpe.model).
            let tok = if m.model_type == 2 { m.bpe_tokenizer("fuzz.spm") } else { m.tokenizer("fuzz.spm") }
                .map_err(|x| e(&x))?;
            tok.encode(TEXT).map_err(|x| e(&x))?;
            Ok(())
        }
        "marian_vocab" => MarianVocab::parse(data, "vocab.json").map(drop).map_err(|x| e(&x)),
        "checkpoint" => {
            let identity = serde_json::json!({
                "model": "tiny", "family": "bert", "gated": ["enc 2x2"], "dataset": "two.txt", "sentences": 2,
                "options": {"lambda": "0.01", "seed": "0"},
            });
            checkpoint::parse_state(data, "checkpoint.json", &identity, 4).map(drop)
        }
        other => Err(format!("unknown fuzz target '{other}' (expected one of {})", TARGETS.join(", "))),
    }
}
