//! Tokenization through the HF `tokenizers` crate, keeping character offsets (for aligning
//! model tokens with treebank words) and which tokens are special.

use super::ModelError;
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
}

pub struct Tok {
    inner: tokenizers::Tokenizer,
    pub framing: Framing,
    pub pad_id: i64,
    pub eos_id: Option<i64>,
}

impl Tok {
    pub fn from_file(path: &Path, framing: Framing) -> Result<Self, ModelError> {
        let mut inner = tokenizers::Tokenizer::from_file(path).map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        // all-MiniLM's tokenizer.json pads to 128 and truncates: headscope batches itself.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let pad_id = ["[PAD]", "<pad>"].iter().find_map(|t| inner.token_to_id(t)).unwrap_or(0) as i64;
        let eos_id = match framing {
            Framing::AppendEos(id) => Some(id),
            Framing::Tokenizer => ["[SEP]", "</s>"].iter().find_map(|t| inner.token_to_id(t)).map(|i| i as i64),
        };
        Ok(Tok { inner, framing, pad_id, eos_id })
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn encode(&self, text: &str) -> Result<Encoded, ModelError> {
        let add_special = self.framing == Framing::Tokenizer;
        let enc = self.inner.encode(text, add_special).map_err(|e| ModelError::Tokenizer(format!("cannot tokenize {text:?}: {e}")))?;
        // Byte offsets -> character offsets.
        let char_of_byte = {
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
        };
        let mut out = Encoded {
            ids: enc.get_ids().iter().map(|&i| i as i64).collect(),
            tokens: enc.get_tokens().to_vec(),
            offsets: enc.get_offsets().iter().map(|&(a, b)| (char_of_byte[a.min(text.len())], char_of_byte[b.min(text.len())])).collect(),
            special: enc.get_special_tokens_mask().iter().map(|&m| m == 1).collect(),
        };
        if let Framing::AppendEos(eos) = self.framing {
            out.ids.push(eos);
            out.tokens.push(self.inner.id_to_token(eos as u32).unwrap_or_else(|| "</s>".into()));
            out.offsets.push((0, 0));
            out.special.push(true);
        }
        Ok(out)
    }

    pub fn decode(&self, ids: &[i64]) -> Result<String, ModelError> {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        self.inner.decode(&ids, true).map_err(|e| ModelError::Tokenizer(format!("cannot decode: {e}")))
    }

    pub fn id_to_token(&self, id: i64) -> String {
        self.inner.id_to_token(id as u32).unwrap_or_else(|| format!("<{id}>"))
    }

    /// Token id of a string, if it is one token of the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(|i| i as i64)
    }
}
