//! `Tok::count_ids` (what a frequency table of rare-word heads reads, docs/methods.md#rare-word-heads)
//! counts exactly the non-special ids that `Tok::encode` gives line by line, on every kind of
//! tokenizer: byte-level BPE (GPT-2), WordPiece (MiniLM), sentencepiece through tokenizer.json
//! (Llama), MarianMT's sentencepiece models with vocab.json, and a GGUF's own vocabulary.

use crate::common;
use std::collections::HashMap;

#[test]
fn counted_ids_equal_line_by_line_encoding() {
    let text = std::fs::read_to_string(common::root().join("assets/brown.txt")).unwrap();
    // A slice of the Brown corpus with lines of every length, blank ones included.
    let lines: Vec<&str> = text.lines().take(1500).collect();
    let models = [
        common::tiny_hf("gpt2", "f32"),
        common::tiny_hf("llama", "f32"),
        common::tiny_hf("qwen3_gguf", "f32"),
        common::asset("minilm", "f32"),
        common::asset("enpt", "f32"),
    ];
    for m in &models {
        let mut want: HashMap<i64, u64> = HashMap::new();
        for line in &lines {
            let e = m.tokenize(line).unwrap();
            for (id, sp) in e.ids.iter().zip(&e.special) {
                if !sp {
                    *want.entry(*id).or_default() += 1;
                }
            }
        }
        let mut got = HashMap::new();
        m.tok.count_ids(&lines, &mut got).unwrap();
        assert!(want.values().sum::<u64>() > 10_000, "{}: the slice has tokens", m.name());
        assert_eq!(got, want, "{}: count_ids differs from encoding line by line", m.name());
    }
}
