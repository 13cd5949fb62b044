//! The tokenizer a GGUF file carries in its metadata (`crates/core/src/model/tokenize/gguf_tokenizer.rs`), on the two
//! real GGUF assets (scripts/setup) against independent references
//! (`tests/fixtures/gguf_tokenizer_reference.py`): Gemma 3's sentencepiece BPE against the
//! `sentencepiece` package on a model written from the same metadata, Qwen2.5's byte-level BPE
//! against transformers' GGUF tokenizer; SmolLM2's against its derived tokenizer.json; and
//! the metadata headscope does not read refused in one line naming the key.

use crate::common;
use headscope::model::readers::gguf::Gguf;
use headscope::model::tokenize::tokenizer::Tok;

fn asset_gguf(name: &str) -> Gguf {
    let dir = headscope::assets::asset_path(name).unwrap();
    let file = headscope::model::families::llama_gguf::find_gguf(&dir)
        .unwrap_or_else(|| panic!("{}: no .gguf (run scripts/setup)", dir.display()));
    Gguf::open(&file).unwrap()
}

#[test]
fn gemma3_and_qwen2_metadata_tokenizers_equal_their_references() {
    let golden = common::golden_json("gguf_tokenizer_golden.json");
    let texts: Vec<&str> = golden["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(texts.len() > 60);
    for (key, asset) in [("gemma3", "gemma3"), ("qwen2", "qwen25coder")] {
        let tok = Tok::from_gguf(&asset_gguf(asset)).unwrap_or_else(|e| panic!("{key}: {e}"));
        let want = golden[key].as_array().unwrap();
        let mut tokens = 0;
        for (i, (text, want)) in texts.iter().zip(want).enumerate() {
            let want: Vec<i64> = want.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
            let got = tok.encode(text).unwrap();
            assert_eq!(got.ids, want, "{key}, text {i} {text:?}: {:?}", got.tokens);
            tokens += want.len();
            // The PUD sentences decode back to themselves.
            if i < 60 {
                assert_eq!(tok.decode(&got.ids).unwrap(), *text, "{key}: decoding text {i}");
            }
        }
        eprintln!("{key}: {} texts, {tokens} tokens, all equal to the reference", texts.len());
    }
}

#[test]
fn smollm2_metadata_tokenizer_equals_its_derived_tokenizer_json() {
    let dir = headscope::assets::asset_path("smollm2").unwrap();
    let from_meta = Tok::from_gguf(&asset_gguf("smollm2")).unwrap();
    let derived =
        Tok::from_file(&dir.join("tokenizer.json"), headscope::model::tokenize::tokenizer::Framing::Tokenizer).unwrap();
    let golden = common::golden_json("gguf_tokenizer_golden.json");
    for text in golden["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()) {
        let (a, b) = (from_meta.encode(text).unwrap(), derived.encode(text).unwrap());
        // transformers' conversion prepends <|im_start|> (id 1) although the GGUF says
        // add_bos_token = false; the metadata tokenizer follows the GGUF, as llama.cpp.
        assert_eq!(b.ids.first(), Some(&1), "{text:?}");
        assert_eq!(a.ids, b.ids[1..], "{text:?}");
        assert_eq!(a.offsets, b.offsets[1..], "{text:?}");
    }
}

/// A GGUF file holding only metadata (`kvs`: key and value, strings and arrays of strings or
/// f32) in the format's version 3.
fn gguf_with(kvs: &[(&str, Meta)]) -> Gguf {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    for (k, v) in kvs {
        s(&mut b, k);
        match v {
            Meta::Str(x) => {
                b.extend(8u32.to_le_bytes());
                s(&mut b, x);
            }
            Meta::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Meta::Strs(xs) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((xs.len() as u64).to_le_bytes());
                xs.iter().for_each(|x| s(&mut b, x));
            }
            Meta::F32s(xs) => {
                b.extend(9u32.to_le_bytes());
                b.extend(6u32.to_le_bytes());
                b.extend((xs.len() as u64).to_le_bytes());
                xs.iter().for_each(|x| b.extend(x.to_le_bytes()));
            }
        }
    }
    Gguf::from_bytes(Box::new(b), "meta.gguf".into()).unwrap()
}

enum Meta {
    Str(&'static str),
    U32(u32),
    Strs(Vec<&'static str>),
    F32s(Vec<f32>),
}

#[test]
fn metadata_tokenizers_read_small_vocabularies_and_refuse_the_rest_in_one_line() {
    use Meta::*;
    let bpe = |pre: &'static str| {
        vec![
            ("general.architecture", Str("qwen2")),
            ("tokenizer.ggml.model", Str("gpt2")),
            ("tokenizer.ggml.pre", Str(pre)),
            ("tokenizer.ggml.tokens", Strs(vec!["a", "b", "ab", "Ġ", "Ġab"])),
            ("tokenizer.ggml.merges", Strs(vec!["a b", "Ġ ab"])),
        ]
    };
    let tok = Tok::from_gguf(&gguf_with(&bpe("qwen2"))).unwrap();
    assert_eq!(tok.encode("ab ab").unwrap().ids, vec![2, 4]);
    // sentencepiece BPE: "▁ab" wins over "▁a" + "b" by its score; byte fallback for "c".
    let spm = |scores: Vec<f32>| {
        vec![
            ("general.architecture", Str("llama")),
            ("tokenizer.ggml.model", Str("llama")),
            ("tokenizer.ggml.tokens", Strs(vec!["<unk>", "<0x63>", "▁", "a", "b", "▁a", "▁ab"])),
            ("tokenizer.ggml.scores", F32s(scores)),
            ("tokenizer.ggml.unknown_token_id", U32(0)),
        ]
    };
    let tok = Tok::from_gguf(&gguf_with(&spm(vec![0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0]))).unwrap();
    assert_eq!(tok.encode("ab c").unwrap().ids, vec![6, 2, 1], "{:?}", tok.encode("ab c").unwrap().tokens);
    let cases: Vec<(Vec<(&str, Meta)>, &str)> = vec![
        (
            vec![("tokenizer.ggml.model", Str("rwkv"))],
            "tokenizer.ggml.model: tokenizer model 'rwkv' is not read (gpt2, llama, t5 are)",
        ),
        (vec![("tokenizer.ggml.model", Str("t5"))], "tokenizer.ggml.tokens: missing or not an array"),
        (bpe("falcon"), "tokenizer.ggml.pre: pre-tokenizer 'falcon' is not read"),
        (vec![("tokenizer.ggml.tokens", Strs(vec!["a"]))], "tokenizer.ggml.model: missing"),
        (spm(vec![0.0]), "tokenizer.ggml.scores: has 1 scores for 7 tokens"),
        (
            {
                let mut v = bpe("qwen2");
                v.push(("tokenizer.ggml.bos_token_id", U32(9)));
                v
            },
            "tokenizer.ggml.bos_token_id: id 9 is outside the 5 tokens",
        ),
    ];
    for (kvs, want) in cases {
        let e = Tok::from_gguf(&gguf_with(&kvs)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("meta.gguf") && e.contains(want) && e.lines().count() == 1, "{e}");
    }
}

/// T5's GGUF tokenizer (`tokenizer.ggml.model = "t5"`: a sentencepiece unigram model's pieces,
/// scores, types and charsmap, as llama.cpp's converter writes them;
/// `tests/fixtures/make_t5_gguf_tokenizer.py` from the nmt_nfkc unigram model of tiny_spm):
/// ids equal sentencepiece's own plus `</s>` on 40 PUD sentences and hand-made texts (spaces,
/// tabs, NFKC cases, unknown scripts, emoji), decodes equal sentencepiece's where no unknown
/// piece is decoded.
#[test]
fn t5_gguf_tokenizer_equals_sentencepiece() {
    let dir = crate::common::tiny_hf_dir().join("t5_tokenizer_gguf");
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let gguf = headscope::model::readers::gguf::Gguf::open(&dir.join("tokenizer.gguf")).unwrap();
    let tok = headscope::model::tokenize::tokenizer::Tok::from_gguf(&gguf).unwrap();
    let (unk, eos) = (g["unk"].as_i64().unwrap(), g["eos"].as_i64().unwrap());
    let mut wrong = Vec::new();
    let mut decoded = 0;
    let cases = g["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<i64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let got = tok.encode(text).unwrap().ids;
        if got != want {
            wrong.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
        if !want.contains(&unk) {
            let text_back = tok.decode(&want).unwrap();
            if text_back != case["decoded"].as_str().unwrap() {
                wrong.push(format!("decode {want:?}: want {:?}, got {text_back:?}", case["decoded"]));
            }
            decoded += 1;
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(tok.eos_id, Some(eos));
    assert!(cases.len() >= 50 && decoded >= 40, "{} cases, {decoded} decoded", cases.len());
}
