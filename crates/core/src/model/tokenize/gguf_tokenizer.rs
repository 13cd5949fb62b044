//! The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`), built as a
//! `tokenizer.json` for the HF `tokenizers` crate, the way transformers' GGUF conversion
//! (`integrations/ggml.py`) builds it, so that a downloaded `.gguf` opens on its own:
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE over `tokens` and `merges`; the
//!   pre-tokenizer named by `tokenizer.ggml.pre` (`qwen2`: NFC and Qwen2's split regex;
//!   `smollm`, `gpt-2`, `default`: GPT-2's).
//! - `tokenizer.ggml.model = "llama"` (sentencepiece BPE: Gemma, Llama 2): BPE whose merges
//!   are ranked by the `scores` of the merged pieces, as sentencepiece merges (checked against
//!   the `sentencepiece` package on a model written from the same metadata), with byte
//!   fallback, spaces written `▁`, and a `▁` prefix unless `add_space_prefix` is false.
//!   (transformers' `GGUFGemmaConverter` builds a unigram model from the scores instead,
//!   which splits "quick" as "qu" + "ick" where Gemma's own tokenizer keeps "▁quick".)
//!
//! Control and unknown tokens (`token_type` 3, 2) are special added tokens, split out of the
//! text whole; user-defined tokens (4) are added tokens too, as sentencepiece and llama.cpp
//! match them. `add_bos_token` / `add_eos_token` frame each sentence as llama.cpp does.
//! Anything else (another tokenizer model, an unknown pre-tokenizer) is a one-line error
//! naming the key: a `tokenizer.json` beside the `.gguf` is then used instead (it always takes
//! precedence).

use crate::model::readers::gguf::{Gguf, Value};
use crate::model::ModelError;
use serde_json::{json, Value as Json};

/// Qwen2's split regex (transformers' `Qwen2Converter`, llama.cpp's `qwen2` pre-tokenizer).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The bytes of a `tokenizer.json` equivalent to the GGUF's metadata tokenizer.
pub fn tokenizer_json(g: &Gguf) -> Result<Vec<u8>, ModelError> {
    let bad = |key: &str, why: String| ModelError::Tokenizer(format!("{}: metadata {key}: {why}", g.file));
    let meta = |key: &str| g.metadata.get(key);
    let str_of = |key: &str| -> Result<&str, ModelError> {
        meta(key).and_then(Value::as_str).ok_or_else(|| bad(key, "missing or not a string".into()))
    };
    let array = |key: &str| -> Result<&Vec<Value>, ModelError> {
        match meta(key) {
            Some(Value::Array(a)) => Ok(a),
            _ => Err(bad(key, "missing or not an array".into())),
        }
    };
    let id = |key: &str| meta(key).and_then(Value::as_u64).map(|v| v as usize);
    let flag = |key: &str| matches!(meta(key), Some(Value::Bool(true)));
    let model = str_of("tokenizer.ggml.model")?;
    if model != "gpt2" && model != "llama" {
        return Err(bad("tokenizer.ggml.model", format!("tokenizer model '{model}' is not read (gpt2, llama, t5 are); put the model's tokenizer.json beside the .gguf")));
    }
    let tokens: Vec<&str> = array("tokenizer.ggml.tokens")?
        .iter()
        .enumerate()
        .map(|(i, v)| v.as_str().ok_or_else(|| bad("tokenizer.ggml.tokens", format!("entry {i} is not a string"))))
        .collect::<Result<_, _>>()?;
    let n = tokens.len();
    let types: Vec<u64> = match meta("tokenizer.ggml.token_type") {
        Some(Value::Array(a)) if a.len() == n => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        Some(_) => return Err(bad("tokenizer.ggml.token_type", format!("must be {n} integers, one per token"))),
        None => vec![1; n],
    };
    let named = |key: &str| -> Result<Option<usize>, ModelError> {
        match id(key) {
            Some(i) if i >= n => Err(bad(key, format!("id {i} is outside the {n} tokens"))),
            other => Ok(other),
        }
    };
    let (bos, eos, unk) = (
        named("tokenizer.ggml.bos_token_id")?,
        named("tokenizer.ggml.eos_token_id")?,
        named("tokenizer.ggml.unknown_token_id")?,
    );
    // Pieces holding a plain space never match in sentencepiece (its normalizer writes spaces
    // as ▁ before user-defined pieces are looked for), so they are not added.
    let added = |kinds: &[u64]| -> Vec<Json> {
        (0..n)
            .filter(|&i| kinds.contains(&types[i]) && !(model == "llama" && tokens[i].contains(' ')))
            .map(|i| json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": types[i] != 4}))
            .collect()
    };
    // The framing llama.cpp applies: BOS before, EOS after, where the metadata says.
    let frame = |must: &[(bool, Option<usize>, &str)]| -> Result<Json, ModelError> {
        let mut single = vec![];
        let mut specials = serde_json::Map::new();
        for &(on, tok, key) in must {
            if !on {
                continue;
            }
            let i = tok.ok_or_else(|| bad(key, "is missing, but the metadata asks for the token".into()))?;
            if key.contains("eos") {
                single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
            }
            single.push(json!({"SpecialToken": {"id": tokens[i], "type_id": 0}}));
            specials.insert(tokens[i].to_string(), json!({"id": tokens[i], "ids": [i], "tokens": [tokens[i]]}));
        }
        if single.is_empty() {
            return Ok(Json::Null);
        }
        if !single.iter().any(|s| s.get("Sequence").is_some()) {
            single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        }
        let mut pair = single.clone();
        pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
        Ok(json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}))
    };
    let post = frame(&[
        (flag("tokenizer.ggml.add_bos_token"), bos, "tokenizer.ggml.bos_token_id"),
        (flag("tokenizer.ggml.add_eos_token"), eos, "tokenizer.ggml.eos_token_id"),
    ])?;
    let doc = match model {
        "gpt2" => {
            let pre = meta("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
            let byte_level = |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": regex});
            let (normalizer, pre_tokenizer) = match pre {
                "qwen2" => (json!({"type": "NFC"}), json!({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false}, byte_level(false)]})),
                "smollm" | "gpt-2" | "gpt2" | "default" => (Json::Null, byte_level(true)),
                other => return Err(bad("tokenizer.ggml.pre", format!("pre-tokenizer '{other}' is not read (qwen2, smollm, gpt-2, default are); put the model's tokenizer.json beside the .gguf"))),
            };
            let merges: Vec<&str> = array("tokenizer.ggml.merges")?
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str().filter(|m| m.contains(' ')).ok_or_else(|| {
                        bad("tokenizer.ggml.merges", format!("entry {i} is not two tokens separated by a space"))
                    })
                })
                .collect::<Result<_, _>>()?;
            let vocab: serde_json::Map<String, Json> =
                tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
            if vocab.len() != n {
                return Err(bad("tokenizer.ggml.tokens", "holds a token twice".into()));
            }
            json!({
                "version": "1.0", "truncation": null, "padding": null,
                "added_tokens": added(&[3, 4]),
                "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post,
                "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
                "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                          "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges}
            })
        }
        "llama" => {
            let scores = array("tokenizer.ggml.scores")?;
            if scores.len() != n {
                return Err(bad("tokenizer.ggml.scores", format!("has {} scores for {n} tokens", scores.len())));
            }
            let scores: Vec<f64> = scores
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    s.as_f64().ok_or_else(|| bad("tokenizer.ggml.scores", format!("entry {i} is not a number")))
                })
                .collect::<Result<_, _>>()?;
            // llama.cpp's default for sentencepiece vocabularies is a dummy prefix (Llama 2);
            // Gemma's GGUFs say false.
            let prefix = !matches!(meta("tokenizer.ggml.add_space_prefix"), Some(Value::Bool(false)));
            let (vocab, merges) = spm_bpe(&tokens, &types, &scores);
            let unk = unk.map(|i| tokens[i]);
            let mut normalizer = vec![json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})];
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if prefix {
                normalizer.insert(0, json!({"type": "Prepend", "prepend": "▁"}));
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            json!({
                "version": "1.0", "truncation": null, "padding": null,
                "added_tokens": added(&[2, 3, 4]),
                "normalizer": {"type": "Sequence", "normalizers": normalizer},
                "pre_tokenizer": null,
                "post_processor": post,
                "decoder": {"type": "Sequence", "decoders": decoders},
                "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                          "fuse_unk": true, "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges}
            })
        }
        _ => unreachable!("checked above"),
    };
    serde_json::to_vec(&doc).map_err(|e| bad("tokenizer.ggml.*", e.to_string()))
}

/// A sentencepiece BPE vocabulary as the `tokenizers` crate's BPE: every normal piece that
/// splits into two pieces of the vocabulary is a merge, ranked by the merged piece's score
/// (higher first; ties by the shorter left, then right, part), which is the order
/// sentencepiece merges in (transformers' `generate_merges`). Pieces that are not normal
/// (control, user-defined, unused, byte) are never the result of a merge; pieces holding a
/// plain space can never match (the normalizer writes spaces as `▁`) and are left out.
pub(crate) fn spm_bpe(tokens: &[&str], types: &[u64], scores: &[f64]) -> (serde_json::Map<String, Json>, Vec<Json>) {
    let mut vocab = serde_json::Map::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if t.contains(' ') || index.contains_key(t) {
            continue;
        }
        index.insert(t, i);
        vocab.insert(t.to_string(), json!(i));
    }
    /// A merge and its sort key: the merged piece's score, the parts' lengths in characters,
    /// the merged piece's id, the parts' ids.
    struct Merge<'a> {
        score: f64,
        lens: (usize, usize),
        ids: (usize, usize, usize),
        parts: (&'a str, &'a str),
    }
    let mut merges: Vec<Merge> = vec![];
    for (i, t) in tokens.iter().enumerate() {
        if types[i] != 1 || index.get(t) != Some(&i) {
            continue;
        }
        for (at, _) in t.char_indices().skip(1) {
            let (l, r) = (&t[..at], &t[at..]);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                merges.push(Merge {
                    score: scores[i],
                    lens: (l.chars().count(), r.chars().count()),
                    ids: (i, li, ri),
                    parts: (l, r),
                });
            }
        }
    }
    // Higher score first, then the longer left and right parts; equal keys keep the pieces'
    // order and, within a piece, its splits by their parts' ids (generate_merges' stable sort).
    merges.sort_by(|a, b| b.score.total_cmp(&a.score).then(b.lens.cmp(&a.lens)).then(a.ids.cmp(&b.ids)));
    (vocab, merges.into_iter().map(|m| json!([m.parts.0, m.parts.1])).collect())
}

/// `tokenizer.ggml.model = "t5"` (llama.cpp's T5 converter: a sentencepiece unigram model's
/// pieces, scores, types and normalizer charsmap) as the sentencepiece model it came from, run
/// by headscope's own sentencepiece reading (`spm`: sentencepiece's normalizer exactly, then the
/// unigram Viterbi search); `None` for other tokenizer models.
pub fn spm_unigram(g: &Gguf) -> Result<Option<crate::model::tokenize::spm::SpmModel>, ModelError> {
    use crate::model::tokenize::spm::{NormalizerSpec, Piece, PieceType, SpmModel};
    let bad = |key: &str, why: String| ModelError::Tokenizer(format!("{}: metadata {key}: {why}", g.file));
    if g.metadata.get("tokenizer.ggml.model").and_then(Value::as_str) != Some("t5") {
        return Ok(None);
    }
    let array = |key: &str| -> Result<&Vec<Value>, ModelError> {
        match g.metadata.get(key) {
            Some(Value::Array(a)) => Ok(a),
            _ => Err(bad(key, "missing or not an array".into())),
        }
    };
    let tokens = array("tokenizer.ggml.tokens")?;
    let scores = array("tokenizer.ggml.scores")?;
    let n = tokens.len();
    if scores.len() != n {
        return Err(bad("tokenizer.ggml.scores", format!("has {} scores for {n} tokens", scores.len())));
    }
    let types: Vec<u64> = match g.metadata.get("tokenizer.ggml.token_type") {
        Some(Value::Array(a)) if a.len() == n => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        Some(_) => return Err(bad("tokenizer.ggml.token_type", format!("must be {n} integers, one per token"))),
        None => vec![1; n],
    };
    let mut pieces = Vec::with_capacity(n);
    for i in 0..n {
        let piece = tokens[i]
            .as_str()
            .ok_or_else(|| bad("tokenizer.ggml.tokens", format!("entry {i} is not a string")))?
            .to_string();
        let score =
            scores[i].as_f64().ok_or_else(|| bad("tokenizer.ggml.scores", format!("entry {i} is not a number")))?
                as f32;
        let kind = PieceType::from_proto(types[i]).ok_or_else(|| {
            bad("tokenizer.ggml.token_type", format!("entry {i} is {}, not a token type (1..6)", types[i]))
        })?;
        pieces.push(Piece { piece, score, kind });
    }
    let charsmap: Vec<u8> = match g.metadata.get("tokenizer.ggml.precompiled_charsmap") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::U64(x) => Ok(*x as u8),
                Value::I64(x) => Ok(*x as u8),
                _ => Err(bad("tokenizer.ggml.precompiled_charsmap", "must be bytes".into())),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("tokenizer.ggml.precompiled_charsmap", "must be an array of bytes".into())),
        None => vec![],
    };
    let flag = |key: &str, default: bool| g.metadata.get(key).and_then(Value::as_bool).unwrap_or(default);
    let normalizer = NormalizerSpec {
        name: "gguf".into(),
        precompiled_charsmap: charsmap,
        add_dummy_prefix: flag("tokenizer.ggml.add_space_prefix", true),
        remove_extra_whitespaces: flag("tokenizer.ggml.remove_extra_whitespaces", true),
        escape_whitespaces: true,
    };
    Ok(Some(SpmModel {
        pieces,
        model_type: 1,
        byte_fallback: false,
        treat_whitespace_as_suffix: false,
        unk_surface: " \u{2047} ".into(),
        normalizer,
        has_denormalizer: false,
    }))
}
