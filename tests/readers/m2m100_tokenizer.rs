//! An M2M100 checkpoint without tokenizer.json, as `facebook/m2m100_*` ship it
//! (`sentencepiece.bpe.model` + `vocab.json`), against transformers' `M2M100Tokenizer`
//! (`tests/fixtures/make_tiny_m2m100_spm.py`, rules in `M2M100_SPM_NOTES.md`): the ids of 54
//! texts (PUD sentences, spaces, tabs, NFKC cases, unknown scripts, special and language tokens
//! inside the text), the language tokens' ids, decoding with special tokens skipped, and greedy
//! translations with the target language forced.

use crate::common;

use headscope::model::nn::Gates;
use serde_json::Value;

fn golden() -> Value {
    let path = common::tiny_hf_dir().join("m2m100_spm/golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

#[test]
fn m2m100_without_tokenizer_json_equals_transformers() {
    let g = golden();
    let mut m = common::tiny_hf("m2m100_spm", "f32");
    assert!(!common::tiny_hf_dir().join("m2m100_spm/tokenizer.json").exists());
    let mut wrong = Vec::new();
    let cases = g["encode"].as_array().unwrap();
    assert!(cases.len() >= 50);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let got = m.tokenize(text).unwrap().ids;
        if got != ids(&case["ids"]) {
            wrong.push(format!("{text:?}\n  want {:?}\n  got  {got:?}", ids(&case["ids"])));
        }
    }
    // The language tokens: __xx__ at len(vocab.json) + i, as codes of tgt_lang.
    let langs = g["lang_token_ids"].as_object().unwrap();
    assert_eq!(langs.len(), 100);
    for (token, id) in langs {
        assert_eq!(m.tok.token_to_id(token), id.as_i64(), "{token}");
    }
    assert_eq!(m.target_language("pt").unwrap(), g["lang_id"]["pt"].as_i64().unwrap());
    assert_eq!(m.tok.language_codes().len(), 100);
    // Decoding with special tokens skipped (language tokens, </s>, <unk>, the madeup ids).
    let mut decoded = 0;
    for case in g["decode"].as_array().unwrap() {
        let want = case["text"].as_str().unwrap();
        let got = m.detokenize(&ids(&case["ids"])).unwrap();
        if got != want {
            wrong.push(format!("decode {:?}\n  want {want:?}\n  got  {got:?}", ids(&case["ids"])));
        }
        decoded += 1;
    }
    assert!(wrong.is_empty(), "{} differences:\n{}", wrong.len(), wrong.join("\n"));
    // Greedy translations into Portuguese (`tgt_lang`: nothing in the checkpoint forces one).
    m.set_target_language("pt").unwrap();
    for case in g["translate"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(m.tokenize(text).unwrap().ids, ids(&case["src_ids"]));
        let want: Vec<i64> = ids(&case["gen"]).into_iter().skip(1).take_while(|&t| t != 2).collect();
        let got = m.translate(&[text], &Gates::none(), 4096).unwrap().remove(0);
        assert_eq!(got, want, "translation of {text:?}");
    }
    println!(
        "m2m100_spm: {} texts encoded, {decoded} decoded, {} translations as transformers",
        cases.len(),
        g["translate"].as_array().unwrap().len()
    );
}
