//! SentencePiece models (`*.spm`, `*.model`) without the C++ library: a small checked reader for
//! the `ModelProto` protobuf, and an equivalent tokenizer for unigram models (what MarianMT's
//! opus-mt checkpoints ship as `source.spm` / `target.spm`).
//!
//! [`SpmTokenizer`] reproduces `SentencePieceProcessor::Encode`: sentencepiece's own normalizer
//! (longest-match rules of the precompiled character map, then its whitespace rules: leading and
//! trailing spaces dropped, runs collapsed, a dummy `▁` prefix, spaces escaped as `▁`), then the
//! `tokenizers` crate's `Unigram` Viterbi search over the whole sentence, with unknown characters
//! fused into one piece whose text is the (normalized) surface, as sentencepiece's
//! `encode(out_type=str)` reports it. Ids are the sentencepiece ids.

use crate::model::ModelError;
use std::collections::HashSet;
use std::path::Path;
use tokenizers::decoders::metaspace::{Metaspace, PrependScheme};
use tokenizers::models::unigram::Unigram;

/// Sentencepiece's meta symbol for a space.
pub const SPACE: char = '▁';

/// `ModelProto.SentencePiece.Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl PieceType {
    /// sentencepiece's `ModelProto.SentencePiece.Type` number (GGUF's `token_type` uses the same).
    pub fn code(self) -> u64 {
        match self {
            PieceType::Normal => 1,
            PieceType::Unknown => 2,
            PieceType::Control => 3,
            PieceType::UserDefined => 4,
            PieceType::Unused => 5,
            PieceType::Byte => 6,
        }
    }

    pub fn from_proto(v: u64) -> Option<PieceType> {
        Some(match v {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub piece: String,
    pub score: f32,
    pub kind: PieceType,
}

/// `NormalizerSpec`, with the proto2 defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct NormalizerSpec {
    pub name: String,
    pub precompiled_charsmap: Vec<u8>,
    pub add_dummy_prefix: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> Self {
        NormalizerSpec {
            name: String::new(),
            precompiled_charsmap: vec![],
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

/// The parts of a `ModelProto` that tokenization depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct SpmModel {
    pub pieces: Vec<Piece>,
    /// `TrainerSpec.model_type`: 1 unigram, 2 BPE, 3 word, 4 char.
    pub model_type: u64,
    pub byte_fallback: bool,
    pub treat_whitespace_as_suffix: bool,
    /// What `decode` writes for the unknown piece.
    pub unk_surface: String,
    pub normalizer: NormalizerSpec,
    /// Whether the model carries a non-empty denormalizer (applied by sentencepiece's decoder;
    /// not reproduced here).
    pub has_denormalizer: bool,
}

/// One field of a protobuf message.
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// A checked protobuf wire-format reader over one message.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = *self.buf.get(self.pos).ok_or_else(|| format!("truncated varint at byte {}", self.pos))?;
            self.pos += 1;
            if i == 9 && b > 1 {
                return Err(format!("varint overflows 64 bits at byte {}", self.pos - 1));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("varint longer than 10 bytes at byte {}", self.pos))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            format!("field of {n} bytes at byte {} runs past the end ({} bytes)", self.pos, self.buf.len())
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next (field number, value), or None at the end of the message.
    fn field(&mut self) -> Result<Option<(u64, Value<'a>)>, String> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let at = self.pos;
        let key = self.varint()?;
        let field = key >> 3;
        if field == 0 {
            return Err(format!("field number 0 at byte {at}"));
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n).map_err(|_| format!("length {n} at byte {at} is too large"))?;
                Value::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            w => return Err(format!("unsupported wire type {w} (field {field}) at byte {at}")),
        };
        Ok(Some((field, value)))
    }
}

fn want_varint(v: Value, what: &str) -> Result<u64, String> {
    match v {
        Value::Varint(x) => Ok(x),
        _ => Err(format!("{what} is not a varint")),
    }
}

fn want_bytes<'a>(v: Value<'a>, what: &str) -> Result<&'a [u8], String> {
    match v {
        Value::Bytes(b) => Ok(b),
        _ => Err(format!("{what} is not length-delimited")),
    }
}

fn want_string(v: Value, what: &str) -> Result<String, String> {
    let b = want_bytes(v, what)?;
    String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not valid UTF-8"))
}

fn parse_piece(buf: &[u8], index: usize) -> Result<Piece, String> {
    let mut r = Reader::new(buf);
    let mut p = Piece { piece: String::new(), score: 0.0, kind: PieceType::Normal };
    while let Some((field, v)) = r.field()? {
        match field {
            1 => p.piece = want_string(v, &format!("piece {index}"))?,
            2 => match v {
                Value::Fixed32(bits) => p.score = f32::from_bits(bits),
                _ => return Err(format!("the score of piece {index} is not a float")),
            },
            3 => {
                let t = want_varint(v, &format!("the type of piece {index}"))?;
                p.kind = PieceType::from_proto(t).ok_or_else(|| format!("piece {index} has unknown type {t}"))?;
            }
            _ => {}
        }
    }
    if p.piece.is_empty() {
        return Err(format!("piece {index} is empty"));
    }
    if !p.score.is_finite() {
        return Err(format!("piece {index} ({:?}) has score {}", p.piece, p.score));
    }
    Ok(p)
}

/// Parses a serialized `ModelProto`; the error says what is wrong (without the file name).
pub fn parse(bytes: &[u8]) -> Result<SpmModel, String> {
    let mut m = SpmModel {
        pieces: vec![],
        model_type: 1,
        byte_fallback: false,
        treat_whitespace_as_suffix: false,
        unk_surface: " \u{2047} ".into(),
        normalizer: NormalizerSpec::default(),
        has_denormalizer: false,
    };
    let mut r = Reader::new(bytes);
    while let Some((field, v)) = r.field()? {
        match field {
            1 => {
                let index = m.pieces.len();
                m.pieces.push(parse_piece(want_bytes(v, "a piece")?, index)?);
            }
            2 => {
                let mut t = Reader::new(want_bytes(v, "trainer_spec")?);
                while let Some((field, v)) = t.field()? {
                    match field {
                        3 => m.model_type = want_varint(v, "trainer_spec.model_type")?,
                        24 => {
                            m.treat_whitespace_as_suffix =
                                want_varint(v, "trainer_spec.treat_whitespace_as_suffix")? != 0
                        }
                        35 => m.byte_fallback = want_varint(v, "trainer_spec.byte_fallback")? != 0,
                        44 => m.unk_surface = want_string(v, "trainer_spec.unk_surface")?,
                        _ => {}
                    }
                }
            }
            3 => {
                let mut n = Reader::new(want_bytes(v, "normalizer_spec")?);
                while let Some((field, v)) = n.field()? {
                    match field {
                        1 => m.normalizer.name = want_string(v, "normalizer_spec.name")?,
                        2 => {
                            m.normalizer.precompiled_charsmap =
                                want_bytes(v, "normalizer_spec.precompiled_charsmap")?.to_vec()
                        }
                        3 => m.normalizer.add_dummy_prefix = want_varint(v, "normalizer_spec.add_dummy_prefix")? != 0,
                        4 => {
                            m.normalizer.remove_extra_whitespaces =
                                want_varint(v, "normalizer_spec.remove_extra_whitespaces")? != 0
                        }
                        5 => {
                            m.normalizer.escape_whitespaces = want_varint(v, "normalizer_spec.escape_whitespaces")? != 0
                        }
                        _ => {}
                    }
                }
            }
            5 => {
                let mut n = Reader::new(want_bytes(v, "denormalizer_spec")?);
                while let Some((field, v)) = n.field()? {
                    if field == 2 && !want_bytes(v, "denormalizer_spec.precompiled_charsmap")?.is_empty() {
                        m.has_denormalizer = true;
                    }
                }
            }
            _ => {}
        }
    }
    if m.pieces.is_empty() {
        return Err("no pieces (not a sentencepiece model?)".into());
    }
    let mut seen = HashSet::new();
    for p in &m.pieces {
        if !seen.insert(p.piece.as_str()) {
            return Err(format!("piece {:?} is defined twice", p.piece));
        }
    }
    if !m.pieces.iter().any(|p| p.kind == PieceType::Unknown) {
        return Err("no <unk> piece".into());
    }
    if !m.normalizer.precompiled_charsmap.is_empty() {
        check_charsmap(&m.normalizer.precompiled_charsmap)?;
    }
    Ok(m)
}

/// Reads and parses a `.spm` file.
pub fn load(path: &Path) -> Result<SpmModel, ModelError> {
    let bytes = std::fs::read(path).map_err(|e| ModelError::Io(path.display().to_string(), e.to_string()))?;
    parse(&bytes)
        .map_err(|why| ModelError::Config(path.display().to_string(), format!("corrupt sentencepiece model: {why}")))
}

/// Checks a precompiled charsmap (`u32` trie size, a darts-clone double array, the NUL-separated
/// replacement strings): every state reachable from the root must lie inside the array, and
/// every leaf must point at a character boundary of the strings (so a corrupt map is refused
/// when loading rather than silently misread).
fn check_charsmap(map: &[u8]) -> Result<(), String> {
    let bad = |why: &str| Err(format!("precompiled_charsmap: {why}"));
    if map.len() < 4 {
        return bad("shorter than its header");
    }
    let trie_bytes = u32::from_le_bytes([map[0], map[1], map[2], map[3]]) as usize;
    if trie_bytes == 0 || !trie_bytes.is_multiple_of(4) || trie_bytes > map.len() - 4 {
        return bad(&format!("trie size {trie_bytes} does not fit in {} bytes", map.len()));
    }
    let array: Vec<usize> =
        map[4..4 + trie_bytes].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let Ok(normalized) = std::str::from_utf8(&map[4 + trie_bytes..]) else {
        return bad("replacement strings are not valid UTF-8");
    };
    let (offset, label, has_leaf, value) = (unit_offset, unit_label, unit_has_leaf, unit_value);
    let mut visited = vec![false; array.len()];
    let mut stack = vec![offset(array[0])];
    while let Some(base) = stack.pop() {
        if base >= array.len() {
            return bad("trie state points outside the array");
        }
        if std::mem::replace(&mut visited[base], true) {
            continue;
        }
        for c in 1..=255usize {
            // (Lookups are checked: a slot past the end is simply no match.)
            let Some(&unit) = array.get(base ^ c) else { continue };
            if label(unit) != c {
                continue;
            }
            let child = (base ^ c) ^ offset(unit);
            if child >= array.len() {
                return bad("trie state points outside the array");
            }
            if has_leaf(unit) {
                let v = value(array[child]);
                if v >= normalized.len() || !normalized.is_char_boundary(v) {
                    return bad("a rule points outside the replacement strings");
                }
            }
            stack.push(child);
        }
    }
    Ok(())
}

/// A string no normalized input can contain (escaped input has no plain spaces), standing in
/// for pieces sentencepiece never matches in text (<unk>, control, unused and byte pieces).
fn unmatchable(id: usize, piece: &str) -> String {
    format!(" {id} {piece} ")
}

// The unit layout of darts-clone's double array (sentencepiece's charsmap trie).
fn unit_offset(u: usize) -> usize {
    (u >> 10) << ((u & (1 << 9)) >> 6)
}
fn unit_label(u: usize) -> usize {
    u & ((1 << 31) | 0xFF)
}
fn unit_has_leaf(u: usize) -> bool {
    (u >> 8) & 1 == 1
}
fn unit_value(u: usize) -> usize {
    u & ((1 << 31) - 1)
}

/// sentencepiece's `normalizer::Normalizer`, exactly: at each position the longest
/// user-defined piece (copied as is) or else the longest charsmap rule, or else the character
/// as is; then its whitespace rules. (The `tokenizers` crate's `Precompiled` normalizer
/// differs: it looks rules up per grapheme and takes the shortest match, so e.g. `ⓨ` + U+0304
/// loses its macron there.)
#[derive(Debug, Clone)]
pub struct SpmNormalizer {
    trie: Vec<usize>,
    replacements: String,
    user_defined: HashSet<String>,
    user_defined_max: usize,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
}

impl SpmNormalizer {
    fn new(spec: &NormalizerSpec, pieces: &[Piece]) -> SpmNormalizer {
        // `parse` has checked the charsmap; lookups stay checked anyway.
        let map = &spec.precompiled_charsmap;
        let (trie, replacements) = if map.len() >= 4 {
            let n = (u32::from_le_bytes([map[0], map[1], map[2], map[3]]) as usize).min(map.len() - 4) / 4 * 4;
            let trie =
                map[4..4 + n].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
            (trie, String::from_utf8_lossy(&map[4 + n..]).into_owned())
        } else {
            (vec![], String::new())
        };
        let user_defined: HashSet<String> =
            pieces.iter().filter(|p| p.kind == PieceType::UserDefined).map(|p| p.piece.clone()).collect();
        let user_defined_max = user_defined.iter().map(String::len).max().unwrap_or(0);
        SpmNormalizer {
            trie,
            replacements,
            user_defined,
            user_defined_max,
            add_dummy_prefix: spec.add_dummy_prefix,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            escape_whitespaces: spec.escape_whitespaces,
        }
    }

    /// The longest charsmap rule matching a prefix of `input`: (bytes matched, replacement).
    fn rule<'a>(&'a self, input: &str) -> Option<(usize, &'a str)> {
        let a = &self.trie;
        let mut pos = unit_offset(*a.first()?);
        let mut best = None;
        for (i, &c) in input.as_bytes().iter().enumerate() {
            pos ^= c as usize;
            let Some(&unit) = a.get(pos) else { break };
            if unit_label(unit) != c as usize {
                break;
            }
            pos ^= unit_offset(unit);
            if unit_has_leaf(unit) {
                let Some(&leaf) = a.get(pos) else { break };
                best = Some((i + 1, unit_value(leaf)));
            }
        }
        let (len, at) = best?;
        if !input.is_char_boundary(len) {
            return None;
        }
        let rest = self.replacements.get(at..)?;
        Some((len, rest.split('\0').next().unwrap_or("")))
    }

    /// `NormalizePrefix`: what the start of `input` becomes, and how many bytes it consumes.
    fn prefix<'a>(&'a self, input: &'a str) -> (&'a str, usize) {
        if self.user_defined_max > 0 {
            let longest = (1..=self.user_defined_max.min(input.len()))
                .rev()
                .find(|&n| input.is_char_boundary(n) && self.user_defined.contains(&input[..n]));
            if let Some(n) = longest {
                return (&input[..n], n);
            }
        }
        if let Some((n, to)) = self.rule(input) {
            return (to, n);
        }
        let n = input.chars().next().map_or(0, char::len_utf8);
        (&input[..n], n)
    }

    /// The normalized text and, for each of its bytes, the byte range of `text` it comes from
    /// (empty for the dummy prefix).
    pub fn normalize(&self, text: &str) -> (String, Vec<(usize, usize)>) {
        let mut out = String::with_capacity(text.len() * 3 / 2 + 3);
        let mut align = Vec::with_capacity(out.capacity());
        let mut pos = 0;
        if self.remove_extra_whitespaces {
            while pos < text.len() {
                let (sp, n) = self.prefix(&text[pos..]);
                if sp != " " {
                    break;
                }
                pos += n;
            }
        }
        if pos >= text.len() {
            return (out, align);
        }
        let space = if self.escape_whitespaces { SPACE } else { ' ' };
        let mut push = |out: &mut String, c: char, span: (usize, usize)| {
            out.push(c);
            align.extend(std::iter::repeat_n(span, c.len_utf8()));
        };
        if self.add_dummy_prefix {
            push(&mut out, space, (pos, pos));
        }
        let mut is_prev_space = self.remove_extra_whitespaces;
        while pos < text.len() {
            let (mut sp, n) = self.prefix(&text[pos..]);
            if is_prev_space {
                sp = sp.trim_start_matches(' ');
            }
            if !sp.is_empty() {
                for c in sp.chars() {
                    push(&mut out, if c == ' ' { space } else { c }, (pos, pos + n));
                }
                is_prev_space = sp.ends_with(' ');
            }
            pos += n;
            if !self.remove_extra_whitespaces {
                is_prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space) {
                out.pop();
                align.truncate(out.len());
            }
        }
        (out, align)
    }
}

/// One piece of an encoded text.
#[derive(Debug, Clone, PartialEq)]
pub struct SpmToken {
    /// The sentencepiece id (the unknown id for an unknown stretch).
    pub id: u32,
    /// The piece, or for an unknown stretch its normalized text (sentencepiece's
    /// `encode(out_type=str)`).
    pub piece: String,
    /// Byte range of the input text the piece comes from.
    pub span: (usize, usize),
}

/// A unigram sentencepiece model as sentencepiece's `encode` runs it: `normalizer`, then the
/// Viterbi search of `model`, a `tokenizers::Tokenizer` holding only the `Unigram` model (ids
/// are the sentencepiece ids; unknown characters are fused, as in sentencepiece) and a
/// `Metaspace` decoder. Its `encode` alone does not normalize: use [`SpmTokenizer::encode`].
#[derive(Clone)]
pub struct SpmTokenizer {
    pub normalizer: SpmNormalizer,
    pub model: tokenizers::Tokenizer,
}

impl SpmTokenizer {
    pub fn encode(&self, text: &str) -> Result<Vec<SpmToken>, ModelError> {
        encode_with(&self.normalizer, &self.model, text)
    }
}

/// [`SpmTokenizer::encode`] on its parts.
pub fn encode_with(
    normalizer: &SpmNormalizer,
    model: &tokenizers::Tokenizer,
    text: &str,
) -> Result<Vec<SpmToken>, ModelError> {
    use tokenizers::Model;
    let (normalized, align) = normalizer.normalize(text);
    if normalized.is_empty() {
        return Ok(vec![]);
    }
    let tokens = model
        .get_model()
        .tokenize(&normalized)
        .map_err(|e| ModelError::Tokenizer(format!("cannot tokenize {text:?}: {e}")))?;
    Ok(tokens
        .into_iter()
        .map(|t| {
            let bytes = align.get(t.offsets.0..t.offsets.1).unwrap_or(&[]);
            let start = bytes.iter().map(|s| s.0).min().unwrap_or(0);
            let end = bytes.iter().map(|s| s.1).max().unwrap_or(start);
            SpmToken { id: t.id, piece: t.value, span: (start, end) }
        })
        .collect())
}

impl SpmModel {
    /// The tokenizer of a BPE model (M2M100's `sentencepiece.bpe.model`): sentencepiece's
    /// merges (the adjacent pair whose concatenation is the highest-scoring piece first) as the
    /// `tokenizers` crate's BPE with merges ranked by score (`gguf_tokenizer::spm_bpe`, the
    /// GGUF reader's sentencepiece BPE), unknown characters fused into one unknown piece, after
    /// sentencepiece's own normalizer. `file` names the model in errors.
    pub fn bpe_tokenizer(&self, file: &str) -> Result<SpmTokenizer, ModelError> {
        let unsupported = |why: String| ModelError::Config(file.to_string(), why);
        if self.model_type != 2 {
            return Err(unsupported(format!(
                "a BPE sentencepiece model was expected, this one is of type {}",
                self.model_type
            )));
        }
        if self.byte_fallback || self.treat_whitespace_as_suffix || !self.normalizer.escape_whitespaces {
            return Err(unsupported("sentencepiece byte_fallback, treat_whitespace_as_suffix and models without escape_whitespaces are not supported".into()));
        }
        let tokens: Vec<&str> = self.pieces.iter().map(|p| p.piece.as_str()).collect();
        // GGUF's token types, which spm_bpe reads: only normal pieces are merge results.
        let types: Vec<u64> = self.pieces.iter().map(|p| p.kind.code()).collect();
        let scores: Vec<f64> = self.pieces.iter().map(|p| f64::from(p.score)).collect();
        let (vocab, merges) = crate::model::tokenize::gguf_tokenizer::spm_bpe(&tokens, &types, &scores);
        let unk = self.pieces.iter().find(|p| p.kind == PieceType::Unknown).map(|p| p.piece.clone());
        let doc = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
            "post_processor": null, "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": true, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges}
        });
        let model =
            tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&doc).map_err(|e| unsupported(e.to_string()))?)
                .map_err(|e| unsupported(format!("cannot build the BPE model: {e}")))?;
        Ok(SpmTokenizer { normalizer: SpmNormalizer::new(&self.normalizer, &self.pieces), model })
    }

    /// The tokenizer of a unigram model; `file` names the model in errors.
    pub fn tokenizer(&self, file: &str) -> Result<SpmTokenizer, ModelError> {
        let unsupported = |why: String| ModelError::Config(file.to_string(), why);
        if self.model_type != 1 {
            let name = match self.model_type {
                2 => "BPE".to_string(),
                3 => "word".to_string(),
                4 => "char".to_string(),
                t => format!("type {t}"),
            };
            return Err(unsupported(format!("{name} sentencepiece models are not supported (only unigram)")));
        }
        if self.byte_fallback {
            return Err(unsupported("sentencepiece byte_fallback is not supported".into()));
        }
        if self.treat_whitespace_as_suffix {
            return Err(unsupported("sentencepiece treat_whitespace_as_suffix is not supported".into()));
        }
        if !self.normalizer.escape_whitespaces {
            return Err(unsupported("sentencepiece models without escape_whitespaces are not supported".into()));
        }
        let normal = self.pieces.iter().filter(|p| p.kind == PieceType::Normal).map(|p| f64::from(p.score));
        let (min, max) = normal.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), s| (lo.min(s), hi.max(s)));
        if !min.is_finite() {
            return Err(unsupported("the sentencepiece model has no normal pieces".into()));
        }
        // Pieces sentencepiece never matches keep their ids under a name nothing matches, and the
        // lowest normal score, so that the unknown penalty (min score - 10) stays sentencepiece's.
        // User-defined pieces get sentencepiece's score (bytes * max score - 0.1), kept above
        // the minimum for the same reason.
        let mut unk_id = None;
        let vocab: Vec<(String, f64)> = self
            .pieces
            .iter()
            .enumerate()
            .map(|(id, p)| match p.kind {
                PieceType::Normal => (p.piece.clone(), f64::from(p.score)),
                PieceType::UserDefined => (p.piece.clone(), (p.piece.len() as f64 * max - 0.1).max(min)),
                PieceType::Unknown => {
                    unk_id.get_or_insert(id);
                    (unmatchable(id, &p.piece), min)
                }
                PieceType::Control | PieceType::Unused | PieceType::Byte => (unmatchable(id, &p.piece), min),
            })
            .collect();
        let model = Unigram::from(vocab, unk_id, false)
            .map_err(|e| unsupported(format!("cannot build the unigram model: {e}")))?;
        let mut tok = tokenizers::Tokenizer::new(model);
        tok.with_decoder(Some(Metaspace::new(SPACE, PrependScheme::Always, true)));
        Ok(SpmTokenizer { normalizer: SpmNormalizer::new(&self.normalizer, &self.pieces), model: tok })
    }
}
