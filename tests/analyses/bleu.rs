//! BLEU equals sacreBLEU's default within 0.01 on several file pairs (tests/fixtures/bleu_reference.py
//! runs sacreBLEU on the same data in this run).

use headscope::metrics::bleu::corpus_bleu;
use std::path::Path;

#[test]
fn bleu_equals_sacrebleu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bleu.json");
    let st = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("tests/fixtures/bleu_reference.py"))
        .arg(headscope::assets::asset_path("pud_en.txt").unwrap())
        .arg(&out)
        .status()
        .expect("run sacreBLEU (scripts/setup installs it)");
    assert!(st.success());
    let pairs: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(pairs.len() >= 8);
    for p in &pairs {
        let strings = |v: &serde_json::Value| {
            v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect::<Vec<_>>()
        };
        let hyps = strings(&p["hyps"]);
        let refs: Vec<Vec<String>> = p["refs"].as_array().unwrap().iter().map(strings).collect();
        let ours = corpus_bleu(&hyps, &refs).unwrap().score;
        let theirs = p["sacrebleu"].as_f64().unwrap();
        assert!((ours - theirs).abs() < 0.01, "{}: headscope {ours} vs sacreBLEU {theirs}", p["name"]);
    }
}
