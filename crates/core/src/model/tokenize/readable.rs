//! Tokens as a person reads them: a byte-level BPE token (GPT-2, Llama 3, Qwen, SmolLM2) holds
//! bytes written as characters (`âĢľ` is the three bytes of `“`), and a sentencepiece model with
//! byte fallback writes a character it has no piece for as byte tokens (`<0xE2>`). Those bytes
//! are decoded here to the characters the person typed, across tokens where a character spans
//! several: the token that completes a character shows it, a token that only begins one shows
//! `⋯` in its place (as does a token whose character is never finished; not `…`, which is a
//! token of its own in most vocabularies), and bytes that form no
//! character show `�`. Everything else is kept as the
//! tokenizer wrote it: the word markers (`Ġ`, `▁`, `##`) and byte-level control characters
//! (`Ċ` for a newline), which the plots and listings render their own way
//! (`plot::reader_labels`), and special tokens.

/// GPT-2's `bytes_to_unicode` inverted: the byte a byte-level character stands for.
fn byte_of(c: char) -> Option<u8> {
    let u = c as u32;
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if printable(u) {
        return Some(u as u8);
    }
    // The other bytes, in order, as 256, 257, ...
    let k = u.checked_sub(256)?;
    (0..=255u32).filter(|b| !printable(*b)).nth(k as usize).map(|b| b as u8)
}

/// A sentencepiece byte-fallback piece `<0xNN>`.
fn fallback_byte(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// `tokens` (with `special` marking the tokenizer's special tokens) as a person reads them;
/// `byte_level`: the tokenizer is a byte-level BPE.
pub fn readable(tokens: &[String], special: &[bool], byte_level: bool) -> Vec<String> {
    let mut out = Vec::with_capacity(tokens.len());
    // Bytes of a character begun in an earlier token.
    let mut pending: Vec<u8> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if special.get(i).copied().unwrap_or(false) {
            pending.clear();
            out.push(t.clone());
            continue;
        }
        let mut s = String::new();
        if let Some(b) = fallback_byte(t) {
            push_byte(b, &mut pending, &mut s);
        } else {
            for c in t.chars() {
                match byte_of(c).filter(|b| byte_level && *b >= 0x80) {
                    Some(b) => push_byte(b, &mut pending, &mut s),
                    None => {
                        if !pending.is_empty() {
                            s.push('\u{FFFD}');
                            pending.clear();
                        }
                        s.push(c);
                    }
                }
            }
        }
        if !pending.is_empty() {
            s.push('⋯');
        }
        out.push(s);
    }
    out
}

/// Adds one byte of a UTF-8 character: the character once it is whole, `�` for bytes that
/// cannot make one.
fn push_byte(b: u8, pending: &mut Vec<u8>, s: &mut String) {
    // A byte that cannot continue what is pending starts afresh.
    if !pending.is_empty() && (b & 0xC0) != 0x80 {
        s.push('\u{FFFD}');
        pending.clear();
    }
    pending.push(b);
    let need = match pending[0] {
        0x00..=0x7F => 1,
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => {
            s.push('\u{FFFD}');
            pending.clear();
            return;
        }
    };
    if pending.len() == need {
        match std::str::from_utf8(pending) {
            Ok(c) => s.push_str(c),
            Err(_) => s.push('\u{FFFD}'),
        }
        pending.clear();
    }
}

/// Whether a `tokenizers` decoder (its JSON) decodes byte-level BPE.
pub fn is_byte_level(decoder_json: &str) -> bool {
    decoder_json.contains("\"type\":\"ByteLevel\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's `bytes_to_unicode`, written out as transformers defines it.
    fn bytes_to_unicode() -> Vec<(u8, char)> {
        let mut bs: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
        let mut cs = bs.clone();
        let mut n = 0;
        for b in 0..=255u32 {
            if !bs.contains(&b) {
                bs.push(b);
                cs.push(256 + n);
                n += 1;
            }
        }
        bs.into_iter().zip(cs).map(|(b, c)| (b as u8, char::from_u32(c).unwrap())).collect()
    }

    /// How a byte-level BPE writes the bytes of `text` as characters.
    fn encode(text: &str) -> String {
        let table = bytes_to_unicode();
        text.bytes().map(|b| table.iter().find(|(x, _)| *x == b).unwrap().1).collect()
    }

    #[test]
    fn byte_of_inverts_bytes_to_unicode() {
        for (b, c) in bytes_to_unicode() {
            assert_eq!(byte_of(c), Some(b), "{c:?}");
        }
        assert_eq!(encode("“"), "âĢľ");
    }

    #[test]
    fn byte_level_tokens_read_as_text_with_their_markers() {
        let toks = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Whole characters in one token each: curly quotes, an accent, CJK, an emoji.
        let t = toks(&[&encode("“"), "Hello", &encode("”"), &encode(" café"), &encode(" 日本"), &encode("🙂")]);
        let r = readable(&t, &[false; 6], true);
        assert_eq!(r, ["“", "Hello", "”", "Ġcafé", "Ġ日本", "🙂"]);
        // An emoji split over two tokens: the completing token shows it, the first `⋯`.
        let e = encode("🙂");
        let (a, b) = e.split_at(e.char_indices().nth(2).unwrap().0);
        let r = readable(&toks(&["Hi", a, b]), &[false; 3], true);
        assert_eq!(r, ["Hi", "⋯", "🙂"]);
        // A character never finished (its token alone: `⋯`); a continuation byte with nothing
        // before it.
        assert_eq!(readable(&toks(&[a]), &[false], true), ["⋯"]);
        assert_eq!(readable(&toks(&[&encode("é")[2..]]), &[false], true), ["\u{FFFD}"]);
        // Special tokens and plain text stay; not byte-level: nothing is decoded.
        assert_eq!(readable(&toks(&["<|endoftext|>", "Ċ"]), &[true, false], true), ["<|endoftext|>", "Ċ"]);
        assert_eq!(readable(&toks(&["▁café", "Ã©"]), &[false; 2], false), ["▁café", "Ã©"]);
    }

    #[test]
    fn byte_fallback_pieces_read_as_their_character() {
        let t: Vec<String> =
            ["▁", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>", "▁ok"].iter().map(|s| s.to_string()).collect();
        assert_eq!(readable(&t, &[false; 6], false), ["▁", "⋯", "⋯", "⋯", "🙂", "▁ok"]);
    }
}
