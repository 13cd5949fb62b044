//! MarianMT (opus-mt) tokenizers from source.spm / target.spm / vocab.json, against transformers'
//! MarianTokenizer (tests/fixtures/tiny_spm, made by tests/fixtures/make_tiny_spm.py).

use crate::common;

use headscope::model::tokenize::spm;
use headscope::model::tokenize::tokenizer::Tok;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_spm")
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

#[test]
fn encodes_like_marian_tokenizer() {
    let tok = Tok::marian(&fixture()).unwrap();
    let g = common::golden_json("tiny_spm/golden.json");
    let cases = g["encode"].as_array().unwrap();
    assert!(cases.len() >= 150);
    let mut bad = vec![];
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let enc = tok.encode(text).unwrap();
        if enc.ids != want {
            bad.push(format!("{text:?}\n  want {want:?}\n  got  {:?} {:?}", enc.ids, enc.tokens));
        }
        // Character offsets inside the text, in order; only the </s> is special.
        let n = text.chars().count();
        assert_eq!(enc.offsets.len(), enc.ids.len());
        assert_eq!(enc.special.last(), Some(&true), "{text:?}");
        let mut last = 0;
        for (&(a, b), &special) in enc.offsets.iter().zip(&enc.special) {
            if special {
                continue;
            }
            assert!(a <= b && b <= n && a >= last, "{text:?}: offsets {:?}", enc.offsets);
            last = a;
        }
    }
    assert!(bad.is_empty(), "{} of {} differ from MarianTokenizer:\n{}", bad.len(), cases.len(), bad.join("\n"));
}

#[test]
fn decodes_like_marian_tokenizer() {
    let tok = Tok::marian(&fixture()).unwrap();
    let g = common::golden_json("tiny_spm/golden.json");
    for case in g["decode"].as_array().unwrap() {
        let want = case["text"].as_str().unwrap();
        assert_eq!(tok.decode(&ids(&case["ids"])).unwrap(), want, "ids {}", case["ids"]);
    }
}

#[test]
fn vocabulary_and_framing_come_from_vocab_json() {
    let tok = Tok::marian(&fixture()).unwrap();
    let vocab: serde_json::Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("vocab.json")).unwrap()).unwrap();
    assert_eq!(tok.vocab_size(), vocab.len());
    assert_eq!(tok.token_to_id("</s>"), Some(0));
    assert_eq!(tok.token_to_id("<unk>"), Some(1));
    assert_eq!(tok.pad_id, vocab.len() as i64 - 1);
    assert_eq!(tok.eos_id, Some(0));
    assert_eq!(tok.id_to_token(tok.token_to_id("▁the").unwrap()), "▁the");

    // Character offsets into the text (a piece's leading ▁ covers the space it stands for),
    // and the appended </s>.
    let enc = tok.encode("Où est the world").unwrap();
    assert_eq!(enc.ids.last(), Some(&0));
    assert_eq!(enc.tokens.last().map(String::as_str), Some("</s>"));
    let world = enc.tokens.iter().position(|t| t == "▁world").unwrap();
    assert_eq!(enc.offsets[world], (10, 16));
    // A literal special token in the text is that token, and special.
    let enc = tok.encode("a </s> b").unwrap();
    assert_eq!(enc.special.iter().filter(|&&s| s).count(), 2);
    assert_eq!(enc.offsets[enc.ids.iter().position(|&i| i == 0).unwrap()], (2, 6));
}

#[test]
fn corrupt_models_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["target.spm", "vocab.json"] {
        std::fs::copy(fixture().join(f), dir.path().join(f)).unwrap();
    }
    let good = std::fs::read(fixture().join("source.spm")).unwrap();
    // Truncations, bit flips and garbage: an Err naming source.spm, or (rarely, a cut that
    // lands between fields) a tokenizer that still works; never a panic.
    let mut variants: Vec<Vec<u8>> = vec![vec![], vec![0xff; 64], b"not a sentencepiece model".to_vec()];
    for cut in [1, 2, 3, 10, 100, 1000, good.len() / 2, good.len() - 1000, good.len() - 7, good.len() - 1] {
        variants.push(good[..cut].to_vec());
    }
    let mut state = 12345u64;
    for _ in 0..40 {
        let mut v = good.clone();
        for _ in 0..8 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let at = (state >> 33) as usize % v.len();
            v[at] ^= 1 << ((state >> 20) % 8);
        }
        variants.push(v);
    }
    let mut errors = 0;
    for (i, bytes) in variants.iter().enumerate() {
        std::fs::write(dir.path().join("source.spm"), bytes).unwrap();
        match Tok::marian(dir.path()) {
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("source.spm") && !msg.contains('\n'), "variant {i}: {msg}");
                errors += 1;
            }
            Ok(tok) => {
                for text in ["Hello world, this is a test.", "ﬁ Ｆｕｌｌ e\u{301} 😀", ""] {
                    let _ = tok.encode(text);
                }
            }
        }
    }
    assert!(errors >= 13, "only {errors} of {} corrupt models were refused", variants.len());

    // Truncated by a byte: the last field (the normalizer spec) runs past the end.
    std::fs::write(dir.path().join("source.spm"), &good[..good.len() - 1]).unwrap();
    let e = Tok::marian(dir.path()).err().expect("a truncated source.spm must be refused").to_string();
    assert!(e.contains("source.spm") && e.contains("runs past the end"), "{e}");
    // Missing files and a vocab.json without <pad> are one-line errors too.
    std::fs::write(dir.path().join("source.spm"), &good).unwrap();
    assert!(Tok::marian(dir.path()).is_ok());
    std::fs::write(dir.path().join("vocab.json"), r#"{"</s>": 0, "<unk>": 1}"#).unwrap();
    let e = Tok::marian(dir.path()).err().unwrap().to_string();
    assert!(e.contains("vocab.json") && e.contains("<pad>"), "{e}");
    std::fs::remove_file(dir.path().join("target.spm")).unwrap();
    std::fs::copy(fixture().join("vocab.json"), dir.path().join("vocab.json")).unwrap();
    let e = Tok::marian(dir.path()).err().unwrap().to_string();
    assert!(e.contains("target.spm"), "{e}");
}

#[test]
fn non_unigram_models_are_refused() {
    let mut m = spm::parse(&std::fs::read(fixture().join("source.spm")).unwrap()).unwrap();
    assert_eq!(m.model_type, 1);
    assert!(!m.normalizer.precompiled_charsmap.is_empty());
    m.model_type = 2;
    let e = m.tokenizer("x.spm").err().unwrap().to_string();
    assert!(e.contains("x.spm") && e.contains("BPE") && e.contains("only unigram"), "{e}");
}

/// sentencepiece's own ids on a real Firefox Translations model (full nmt_nfkc charsmap), when
/// scripts/setup has fetched it.
#[test]
fn matches_sentencepiece_on_the_real_enpt_model() {
    let g = common::golden_json("tiny_spm/golden.json");
    let Some(real) = g.get("assets_spm") else { return };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(real["file"].as_str().unwrap());
    if !path.is_file() {
        common::skip("assets", &format!("{} is missing (scripts/setup fetches it)", path.display()));
        return;
    }
    let tok = spm::load(&path).unwrap().tokenizer(&path.display().to_string()).unwrap();
    let mut bad = vec![];
    let cases = real["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = ids(&case["ids"]).into_iter().map(|i| i as u32).collect();
        let got = tok.encode(text).unwrap();
        let got_ids: Vec<u32> = got.iter().map(|t| t.id).collect();
        if got_ids != want {
            bad.push(format!("{text:?}\n  want {want:?}\n  got  {got_ids:?} {got:?}"));
        }
    }
    assert!(bad.is_empty(), "{} of {} differ from sentencepiece:\n{}", bad.len(), cases.len(), bad.join("\n"));
}
