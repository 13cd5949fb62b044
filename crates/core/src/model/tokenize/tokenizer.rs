//! Tokenization through the HF `tokenizers` crate, keeping character offsets (for aligning
//! model tokens with treebank words) and which tokens are special.

use super::spm;
use crate::model::ModelError;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// One tokenized sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub ids: Vec<i64>,
    pub tokens: Vec<String>,
    /// Character (not byte) offsets `[start, end)` into the text; special tokens get (0, 0).
    pub offsets: Vec<(usize, usize)>,
    pub special: Vec<bool>,
}

/// How a family frames a sentence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Framing {
    /// The tokenizer's own post-processor adds specials (BERT's [CLS] ... [SEP]).
    Tokenizer,
    /// Plain pieces, then this EOS id appended (Marian sources get `</s>`).
    AppendEos(i64),
    /// fairseq's multilingual framing (M2M100 without tokenizer.json): the source language's
    /// token, the pieces, EOS.
    Fairseq { prefix: i64, eos: i64 },
}

/// M2M100's language codes (transformers' `FAIRSEQ_LANGUAGE_CODES`), by `tokenizer_config.json`'s
/// `language_codes`: token `__{code}__` has id `len(vocab.json) + i`.
const M2M100_CODES: &[&str] = &[
    "af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy", "da", "de", "el", "en",
    "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha", "he", "hi", "hr", "ht", "hu", "hy", "id",
    "ig", "ilo", "is", "it", "ja", "jv", "ka", "kk", "km", "kn", "ko", "lb", "lg", "ln", "lo", "lt", "lv", "mg", "mk",
    "ml", "mn", "mr", "ms", "my", "ne", "nl", "no", "ns", "oc", "or", "pa", "pl", "ps", "pt", "ro", "ru", "sd", "si",
    "sk", "sl", "so", "sq", "sr", "ss", "su", "sv", "sw", "ta", "th", "tl", "tn", "tr", "uk", "ur", "uz", "vi", "wo",
    "xh", "yi", "yo", "zh", "zu",
];
const WMT21_CODES: &[&str] = &["en", "ha", "is", "ja", "cs", "ru", "zh", "de"];

pub struct Tok {
    inner: tokenizers::Tokenizer,
    pub framing: Framing,
    pub pad_id: i64,
    pub eos_id: Option<i64>,
    /// MarianMT's piece -> id mapping (vocab.json) over sentencepiece models, when set.
    marian: Option<Box<Marian>>,
}

/// What `MarianTokenizer` adds around its two sentencepiece models: `inner` is the source
/// model's unigram search (its ids are sentencepiece's and are not used), `normalizer` the
/// source model's normalizer; pieces become ids through `vocab.json`.
struct Marian {
    normalizer: spm::SpmNormalizer,
    vocab: HashMap<String, i64>,
    pieces: HashMap<i64, String>,
    unk_id: i64,
    /// `</s>`, `<unk>`, `<pad>`: split out of the text as whole tokens, skipped when decoding.
    specials: Vec<(String, i64)>,
    /// The target model's control pieces (decoded as nothing), its unknown piece and the text
    /// that one decodes to.
    target_control: HashSet<String>,
    target_unk: String,
    unk_surface: String,
    /// The target model, which encodes reference translations (`text_target`).
    target: spm::SpmTokenizer,
    /// MarianMT's `>>code<<` prefixes are looked up whole in the vocabulary.
    opus_codes: bool,
    /// Target-language tokens and their ids (M2M100), in id order.
    codes: Vec<(String, i64)>,
}

impl Marian {
    /// One sentencepiece model for both sides (M2M100, T5's GGUF tokenizer): `vocab` maps its
    /// pieces to the model's ids, `specials` are split out of texts whole and skipped when
    /// decoding, `codes` are the target-language tokens.
    #[allow(clippy::too_many_arguments)]
    fn one_model(
        model: &spm::SpmModel,
        tok: &spm::SpmTokenizer,
        specials: Vec<(String, i64)>,
        vocab: HashMap<String, i64>,
        pieces: HashMap<i64, String>,
        unk_id: i64,
        codes: Vec<(String, i64)>,
    ) -> Marian {
        Marian {
            normalizer: tok.normalizer.clone(),
            specials,
            target_control: model
                .pieces
                .iter()
                .filter(|p| p.kind == spm::PieceType::Control)
                .map(|p| p.piece.clone())
                .collect(),
            target_unk: model
                .pieces
                .iter()
                .find(|p| p.kind == spm::PieceType::Unknown)
                .map(|p| p.piece.clone())
                .unwrap_or_default(),
            unk_surface: model.unk_surface.clone(),
            target: tok.clone(),
            vocab,
            pieces,
            unk_id,
            opus_codes: false,
            codes,
        }
    }
}

/// MarianMT's `vocab.json`: piece -> id, every id non-negative and given once, with the
/// three specials.
pub struct MarianVocab {
    pub vocab: HashMap<String, i64>,
    pub pieces: HashMap<i64, String>,
    pub eos: i64,
    pub unk_id: i64,
    pub pad_id: i64,
}

impl MarianVocab {
    /// Parses the bytes of a `vocab.json`; `file` names it in errors.
    pub fn parse(bytes: &[u8], file: &str) -> Result<MarianVocab, ModelError> {
        let vocab: HashMap<String, i64> = serde_json::from_slice(bytes)
            .map_err(|e| ModelError::Config(file.into(), format!("not a piece -> id map: {e}")))?;
        let id_of =
            |t: &str| vocab.get(t).copied().ok_or_else(|| ModelError::Config(file.into(), format!("has no {t}")));
        let (eos, unk_id, pad_id) = (id_of("</s>")?, id_of("<unk>")?, id_of("<pad>")?);
        let mut pieces = HashMap::with_capacity(vocab.len());
        for (piece, &id) in &vocab {
            if id < 0 || pieces.insert(id, piece.clone()).is_some() {
                return Err(ModelError::Config(file.into(), format!("id {id} is negative or given twice")));
            }
        }
        Ok(MarianVocab { vocab, pieces, eos, unk_id, pad_id })
    }
}

impl Tok {
    pub fn from_file(path: &Path, framing: Framing) -> Result<Self, ModelError> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        Self::from_bytes(&bytes, &path.display().to_string(), framing)
    }

    /// A tokenizer from the bytes of a `tokenizer.json`; `file` names it in errors.
    pub fn from_bytes(bytes: &[u8], file: &str, framing: Framing) -> Result<Self, ModelError> {
        let mut inner = guarded(&format!("{file}: "), || {
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| ModelError::Tokenizer(format!("{file}: {e}")))
        })?;
        // all-MiniLM's tokenizer.json pads to 128 and truncates: headscope batches itself.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| ModelError::Tokenizer(format!("{file}: {e}")))?;
        let pad_id = ["[PAD]", "<pad>"].iter().find_map(|t| inner.token_to_id(t)).unwrap_or(0) as i64;
        let eos_id = match framing {
            Framing::AppendEos(id) | Framing::Fairseq { eos: id, .. } => Some(id),
            Framing::Tokenizer => ["[SEP]", "</s>"].iter().find_map(|t| inner.token_to_id(t)).map(|i| i as i64),
        };
        Ok(Tok { inner, framing, pad_id, eos_id, marian: None })
    }

    /// The tokenizer a GGUF file carries in its metadata ([`crate::model::tokenize::gguf_tokenizer`]); its
    /// padding id is the metadata's `tokenizer.ggml.padding_token_id` when given.
    pub fn from_gguf(g: &crate::model::readers::gguf::Gguf) -> Result<Tok, ModelError> {
        if let Some(model) = crate::model::tokenize::gguf_tokenizer::spm_unigram(g)? {
            return Self::spm_ids(model, &format!("{} (its tokenizer metadata)", g.file), g);
        }
        let bytes = crate::model::tokenize::gguf_tokenizer::tokenizer_json(g)?;
        let mut tok = Self::from_bytes(&bytes, &format!("{} (its tokenizer metadata)", g.file), Framing::Tokenizer)?;
        if let Some(pad) =
            g.metadata.get("tokenizer.ggml.padding_token_id").and_then(crate::model::readers::gguf::Value::as_u64)
        {
            tok.pad_id = pad as i64;
        }
        Ok(tok)
    }

    /// A MarianMT (opus-mt) checkpoint's tokenizer from the files it ships: `source.spm`
    /// encodes, `target.spm` decodes, `vocab.json` (shared by both) maps pieces to ids, as
    /// transformers' `MarianTokenizer` does. Sources get `</s>` appended.
    pub fn marian(dir: &Path) -> Result<Tok, ModelError> {
        let vocab_path = dir.join("vocab.json");
        let vocab_file = vocab_path.display().to_string();
        let bytes = std::fs::read(&vocab_path).map_err(|e| ModelError::Io(vocab_file.clone(), e.to_string()))?;
        let MarianVocab { vocab, pieces, eos, unk_id, pad_id } = MarianVocab::parse(&bytes, &vocab_file)?;
        let source_path = dir.join("source.spm");
        let source = spm::load(&source_path)?.tokenizer(&source_path.display().to_string())?;
        let target_path = dir.join("target.spm");
        let target = spm::load(&target_path)?;
        let target_tok = target.tokenizer(&target_path.display().to_string())?;
        let target_unk = target
            .pieces
            .iter()
            .find(|p| p.kind == spm::PieceType::Unknown)
            .map(|p| p.piece.clone())
            .unwrap_or_default();
        let marian = Marian {
            normalizer: source.normalizer,
            specials: vec![("</s>".into(), eos), ("<unk>".into(), unk_id), ("<pad>".into(), pad_id)],
            target_control: target
                .pieces
                .iter()
                .filter(|p| p.kind == spm::PieceType::Control)
                .map(|p| p.piece.clone())
                .collect(),
            target_unk,
            unk_surface: target.unk_surface,
            target: target_tok,
            vocab,
            pieces,
            unk_id,
            opus_codes: true,
            codes: vec![],
        };
        Ok(Tok {
            inner: source.model,
            framing: Framing::AppendEos(eos),
            pad_id,
            eos_id: Some(eos),
            marian: Some(Box::new(marian)),
        })
    }

    /// A sentencepiece unigram model whose ids are the model's (T5's GGUF tokenizer,
    /// `gguf_tokenizer::spm_unigram`): sentencepiece's normalizer and Viterbi search, control and
    /// unknown pieces split out of the text whole and skipped when decoding, EOS appended where
    /// the metadata's `add_eos_token` says (T5: `</s>`).
    fn spm_ids(model: spm::SpmModel, file: &str, g: &crate::model::readers::gguf::Gguf) -> Result<Tok, ModelError> {
        let tok = model.tokenizer(file)?;
        let id = |key: &str| {
            g.metadata
                .get(key)
                .and_then(crate::model::readers::gguf::Value::as_u64)
                .map(|v| v as i64)
                .filter(|&v| (v as usize) < model.pieces.len())
        };
        let vocab: HashMap<String, i64> =
            model.pieces.iter().enumerate().rev().map(|(i, p)| (p.piece.clone(), i as i64)).collect();
        let pieces: HashMap<i64, String> =
            model.pieces.iter().enumerate().map(|(i, p)| (i as i64, p.piece.clone())).collect();
        let kind_ids = |k: spm::PieceType| {
            model.pieces.iter().enumerate().filter(move |(_, p)| p.kind == k).map(|(i, p)| (p.piece.clone(), i as i64))
        };
        let specials: Vec<(String, i64)> =
            kind_ids(spm::PieceType::Control).chain(kind_ids(spm::PieceType::Unknown)).collect();
        let unk_id = id("tokenizer.ggml.unknown_token_id")
            .or_else(|| kind_ids(spm::PieceType::Unknown).next().map(|p| p.1))
            .unwrap_or(0);
        let eos = id("tokenizer.ggml.eos_token_id");
        let add_eos = g
            .metadata
            .get("tokenizer.ggml.add_eos_token")
            .and_then(crate::model::readers::gguf::Value::as_bool)
            .unwrap_or(false);
        let framing = match (add_eos, eos) {
            (true, Some(e)) => Framing::AppendEos(e),
            (true, None) => {
                return Err(ModelError::Tokenizer(format!(
                    "{file}: metadata tokenizer.ggml.eos_token_id is missing, but the metadata asks for the token"
                )))
            }
            (false, _) => Framing::Tokenizer,
        };
        let pad_id = id("tokenizer.ggml.padding_token_id").unwrap_or(0);
        let m = Marian::one_model(&model, &tok, specials, vocab, pieces, unk_id, vec![]);
        Ok(Tok { inner: tok.model, framing, pad_id, eos_id: eos, marian: Some(Box::new(m)) })
    }

    /// An M2M100 checkpoint's tokenizer from the files `facebook/m2m100_*` ship (no
    /// tokenizer.json): `sentencepiece.bpe.model` (BPE) encodes, `vocab.json` (fairseq's
    /// dictionary) maps pieces to ids, `<unk>` for pieces it lacks; the language tokens
    /// `__xx__` follow the dictionary (`len(vocab.json) + i`, `tokenizer_config.json`'s
    /// `language_codes`); sources are `[__src__] pieces </s>` with `src_lang` from
    /// tokenizer_config.json (default `en`), as transformers' `M2M100Tokenizer` frames them.
    /// Each stretch between special tokens is encoded on its own.
    pub fn m2m100(dir: &Path) -> Result<Tok, ModelError> {
        let vocab_path = dir.join("vocab.json");
        let vocab_file = vocab_path.display().to_string();
        let bytes = std::fs::read(&vocab_path).map_err(|e| ModelError::Io(vocab_file.clone(), e.to_string()))?;
        let MarianVocab { mut vocab, mut pieces, eos, unk_id, pad_id } = MarianVocab::parse(&bytes, &vocab_file)?;
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read(&config_path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| ModelError::Config(config_path.display().to_string(), e.to_string()))?,
            Err(_) => serde_json::Value::Null,
        };
        let codes = match config.get("language_codes").and_then(|v| v.as_str()).unwrap_or("m2m100") {
            "m2m100" => M2M100_CODES,
            "wmt21" => WMT21_CODES,
            other => {
                return Err(ModelError::Config(
                    config_path.display().to_string(),
                    format!("language_codes '{other}' is not known (m2m100, wmt21)"),
                ))
            }
        };
        let first = pieces.keys().max().map_or(0, |m| m + 1).max(vocab.len() as i64);
        let mut lang = Vec::new();
        for (i, code) in codes.iter().enumerate() {
            let (token, id) = (format!("__{code}__"), first + i as i64);
            vocab.insert(token.clone(), id);
            pieces.insert(id, token.clone());
            lang.push((token, id));
        }
        let src = config.get("src_lang").and_then(|v| v.as_str()).unwrap_or("en");
        let prefix = vocab.get(&format!("__{src}__")).copied().ok_or_else(|| {
            ModelError::Config(
                config_path.display().to_string(),
                format!("src_lang '{src}' is not one of the language codes"),
            )
        })?;
        let spm_path = dir.join("sentencepiece.bpe.model");
        let model = spm::load(&spm_path)?;
        let tok = model.bpe_tokenizer(&spm_path.display().to_string())?;
        let mut specials: Vec<(String, i64)> = ["<s>", "<pad>", "</s>", "<unk>"]
            .iter()
            .filter_map(|t| vocab.get(*t).map(|&id| (t.to_string(), id)))
            .collect();
        specials.extend(lang.iter().cloned());
        let m = Marian::one_model(&model, &tok, specials, vocab, pieces, unk_id, lang);
        Ok(Tok {
            inner: tok.model,
            framing: Framing::Fairseq { prefix, eos },
            pad_id,
            eos_id: Some(eos),
            marian: Some(Box::new(m)),
        })
    }

    pub fn vocab_size(&self) -> usize {
        match &self.marian {
            Some(m) => m.vocab.len(),
            None => self.inner.get_vocab_size(true),
        }
    }

    pub fn encode(&self, text: &str) -> Result<Encoded, ModelError> {
        let char_of_byte = char_of_byte(text);
        if let Some(m) = &self.marian {
            return self.encode_marian(m, &m.normalizer, &self.inner, text, &char_of_byte);
        }
        let add_special = self.framing == Framing::Tokenizer;
        let what = format!("cannot tokenize {text:?}: ");
        let enc = guarded(&what, || {
            self.inner.encode(text, add_special).map_err(|e| ModelError::Tokenizer(format!("{what}{e}")))
        })?;
        let mut out = Encoded {
            ids: enc.get_ids().iter().map(|&i| i as i64).collect(),
            tokens: enc.get_tokens().to_vec(),
            offsets: enc
                .get_offsets()
                .iter()
                .map(|&(a, b)| (char_of_byte[a.min(text.len())], char_of_byte[b.min(text.len())]))
                .collect(),
            special: enc.get_special_tokens_mask().iter().map(|&m| m == 1).collect(),
        };
        // Bytes written as characters (`âĢľ`) or byte pieces (`<0xE2>`): the text typed.
        out.tokens = super::readable::readable(&out.tokens, &out.special, self.byte_level());
        if let Framing::AppendEos(eos) = self.framing {
            out.ids.push(eos);
            out.tokens.push(self.inner.id_to_token(eos as u32).unwrap_or_else(|| "</s>".into()));
            out.offsets.push((0, 0));
            out.special.push(true);
        }
        Ok(out)
    }

    /// Counts the ids of every token of `lines` that is not a special token into `counts`: what
    /// a frequency table reads (`analysis::freq_table`). The ids [`Tok::encode`] gives line by
    /// line, computed without offsets and spread over the cores (the Brown corpus, 57,000
    /// lines, in about a third of the time on two cores).
    pub fn count_ids(&self, lines: &[&str], counts: &mut HashMap<i64, u64>) -> Result<(), ModelError> {
        // Framing::AppendEos adds a special EOS, which is not counted.
        let add_special = self.framing == Framing::Tokenizer;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
        let chunk = lines.len().div_ceil(threads).max(1);
        let inner = &self.inner;
        let this = self;
        let parts: Vec<Result<HashMap<i64, u64>, ModelError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = lines
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        let mut local: HashMap<i64, u64> = HashMap::new();
                        for line in part {
                            if this.marian.is_some() {
                                let e = this.encode(line)?;
                                for (id, sp) in e.ids.iter().zip(&e.special) {
                                    if !sp {
                                        *local.entry(*id).or_default() += 1;
                                    }
                                }
                                continue;
                            }
                            let what = format!("cannot tokenize {line:?}: ");
                            let enc = guarded(&what, || {
                                inner
                                    .encode_fast(*line, add_special)
                                    .map_err(|e| ModelError::Tokenizer(format!("{what}{e}")))
                            })?;
                            for (id, m) in enc.get_ids().iter().zip(enc.get_special_tokens_mask()) {
                                if *m == 0 {
                                    *local.entry(*id as i64).or_default() += 1;
                                }
                            }
                        }
                        Ok(local)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(ModelError::Tokenizer("a tokenizer thread failed".into()))))
                .collect()
        });
        for part in parts {
            for (id, n) in part? {
                *counts.entry(id).or_default() += n;
            }
        }
        Ok(())
    }

    /// `MarianTokenizer`'s encoding: the text split around literal special tokens, a leading
    /// `>>xx<<` language code kept whole, the rest through the source model, pieces to ids
    /// through vocab.json (the unknown id for pieces it lacks), then `</s>`.
    fn encode_marian(
        &self,
        m: &Marian,
        normalizer: &spm::SpmNormalizer,
        model: &tokenizers::Tokenizer,
        text: &str,
        char_of_byte: &[usize],
    ) -> Result<Encoded, ModelError> {
        let mut out = Encoded { ids: vec![], tokens: vec![], offsets: vec![], special: vec![] };
        let push = |out: &mut Encoded, id: i64, span: (usize, usize), special: bool| {
            out.ids.push(id);
            out.tokens.push(m.pieces.get(&id).cloned().unwrap_or_else(|| format!("<{id}>")));
            out.offsets.push((char_of_byte[span.0], char_of_byte[span.1]));
            out.special.push(special);
        };
        if let Framing::Fairseq { prefix, .. } = self.framing {
            push(&mut out, prefix, (0, 0), true);
        }
        let mut at = 0;
        while at < text.len() {
            // The leftmost literal special token, the longest there.
            let next = m
                .specials
                .iter()
                .filter_map(|(t, id)| text[at..].find(t.as_str()).map(|i| (at + i, std::cmp::Reverse(t.len()), *id)))
                .min()
                .map(|(i, l, id)| (i, l.0, id));
            let end = next.map_or(text.len(), |(i, _, _)| i);
            let mut start = at;
            let chunk = &text[at..end];
            if m.opus_codes && chunk.starts_with(">>") {
                if let Some(i) = chunk.find("<<") {
                    let code = &chunk[..i + 2];
                    push(&mut out, m.vocab.get(code).copied().unwrap_or(m.unk_id), (start, start + code.len()), false);
                    start += code.len();
                }
            }
            if start < end {
                let piece_text = &text[start..end];
                for t in spm::encode_with(normalizer, model, piece_text)? {
                    let id = m.vocab.get(&t.piece).copied().unwrap_or(m.unk_id);
                    push(&mut out, id, (start + t.span.0, start + t.span.1), false);
                }
            }
            match next {
                Some((i, len, id)) => {
                    push(&mut out, id, (i, i + len), true);
                    at = i + len;
                }
                None => at = text.len(),
            }
        }
        if let Framing::AppendEos(eos) | Framing::Fairseq { eos, .. } = self.framing {
            push(&mut out, eos, (0, 0), true);
        }
        Ok(out)
    }

    /// A reference translation as the decoder's targets: MarianMT's target model (as
    /// `MarianTokenizer(text_target=...)`), else the same as [`Tok::encode`].
    pub fn encode_target(&self, text: &str) -> Result<Encoded, ModelError> {
        match &self.marian {
            Some(m) => self.encode_marian(m, &m.target.normalizer, &m.target.model, text, &char_of_byte(text)),
            None => self.encode(text),
        }
    }

    pub fn decode(&self, ids: &[i64]) -> Result<String, ModelError> {
        if let Some(m) = &self.marian {
            return Ok(decode_marian(m, ids));
        }
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        guarded("cannot decode: ", || {
            self.inner.decode(&ids, true).map_err(|e| ModelError::Tokenizer(format!("cannot decode: {e}")))
        })
    }

    /// The token `id` as a person reads it ([`super::readable`]: a byte-level token's bytes as
    /// text, `⋯` where it holds part of a character).
    pub fn id_to_token(&self, id: i64) -> String {
        if let Some(m) = &self.marian {
            return m.pieces.get(&id).cloned().unwrap_or_else(|| format!("<{id}>"));
        }
        match self.inner.id_to_token(id as u32) {
            Some(t) => {
                let special = self.inner.get_added_vocabulary().is_special_token(&t);
                super::readable::readable(&[t], &[special], self.byte_level()).remove(0)
            }
            None => format!("<{id}>"),
        }
    }

    /// The token `id` exactly as the vocabulary holds it (byte-level characters and all: what
    /// `token_to_id` reads back).
    pub fn raw_token(&self, id: i64) -> Option<String> {
        match &self.marian {
            Some(m) => m.pieces.get(&id).cloned(),
            None => self.inner.id_to_token(id as u32),
        }
    }

    /// The tokens of `ids` in order as a person reads them: a character split over tokens shows
    /// on the token that completes it ([`super::readable`]).
    pub fn ids_to_tokens(&self, ids: &[i64]) -> Vec<String> {
        if let Some(m) = &self.marian {
            return ids.iter().map(|id| m.pieces.get(id).cloned().unwrap_or_else(|| format!("<{id}>"))).collect();
        }
        let raw: Vec<String> =
            ids.iter().map(|&id| self.inner.id_to_token(id as u32).unwrap_or_else(|| format!("<{id}>"))).collect();
        let added = self.inner.get_added_vocabulary();
        let special: Vec<bool> = raw.iter().map(|t| added.is_special_token(t)).collect();
        super::readable::readable(&raw, &special, self.byte_level())
    }

    /// Whether the tokenizer is a byte-level BPE (its decoder says so).
    fn byte_level(&self) -> bool {
        self.inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|j| super::readable::is_byte_level(&j))
    }

    /// The special tokens a tokenizer adds that are not framing tokens (`<s>`, `</s>`, `<pad>`,
    /// `<unk>`, `<mask>`: anything written `<...>`): the language codes of multilingual
    /// tokenizers (NLLB's `fra_Latn`, mBART's `fr_XX`, M2M100's `__fr__`), sorted by id.
    pub fn language_codes(&self) -> Vec<(String, i64)> {
        if let Some(m) = &self.marian {
            return m.codes.clone();
        }
        let mut codes: Vec<(String, i64)> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special && !(t.content.starts_with('<') && t.content.ends_with('>')))
            .map(|(id, t)| (t.content, id as i64))
            .collect();
        codes.sort_by_key(|c| c.1);
        codes
    }

    /// Token id of a string, if it is one token of the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<i64> {
        if let Some(m) = &self.marian {
            return m.vocab.get(token).copied();
        }
        self.inner.token_to_id(token).map(|i| i as i64)
    }
}

/// A call into the `tokenizers` library, whose panics become errors starting with `what`: it
/// panics on some hostile `tokenizer.json` files instead of refusing them (a malformed decoder
/// while reading; a template naming a special token it does not define while encoding),
/// found by the tokenizer_json fuzz target (fuzz/regressions/tokenizer_json/).
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, ModelError>) -> Result<T, ModelError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(ModelError::Tokenizer(format!(
            "{what}the tokenizers library failed: {}",
            msg.lines().next().unwrap_or_default()
        )))
    })
}

/// Byte offset -> character offset, for every byte offset of `text` and its end.
fn char_of_byte(text: &str) -> Vec<usize> {
    let mut v = vec![0usize; text.len() + 1];
    let mut c = 0;
    for (i, ch) in text.char_indices() {
        for k in 0..ch.len_utf8() {
            v[i + k] = c;
        }
        c += 1;
    }
    v[text.len()] = c;
    v
}

/// `MarianTokenizer.decode(ids, skip_special_tokens=True)`: special and unknown ids dropped,
/// pieces through the target model's `decode_pieces` (control pieces vanish, its unknown piece
/// reads as the unknown surface), `▁` -> space, then Python's `str.strip()`.
fn decode_marian(m: &Marian, ids: &[i64]) -> String {
    let mut text = String::new();
    for id in ids {
        if m.specials.iter().any(|(_, s)| s == id) {
            continue;
        }
        let Some(piece) = m.pieces.get(id) else { continue };
        if m.target_control.contains(piece) {
            continue;
        }
        text.push_str(if *piece == m.target_unk { &m.unk_surface } else { piece });
    }
    let text = text.replace(spm::SPACE, " ");
    // Python's str.isspace() also counts the information separators U+001C..U+001F.
    text.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)).to_string()
}
