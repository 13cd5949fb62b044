//! Checkpoints saved by transformers 5 (issue 46): `tests/fixtures/make_tiny_hf_tf5.py`, run under
//! transformers 5.x (`scripts/setup-tf5`), re-saves each tiny checkpoint of `tiny_hf/` with
//! transformers 5 into `tiny_hf_tf5/` (its config.json in the 5.x shape: `rope_parameters`, flat or
//! per layer type) with a byte copy of the 4.57 weights, and writes transformers 5's goldens
//! (`golden_tf5.npz`, the key scheme of the 4.57 goldens). Here: each config says 5.x, its
//! weight file is byte-identical to its 4.57 twin's, both twins load to the same rotary settings
//! and the same logits, and headscope equals transformers 5's logits and attention (the float32
//! bound; float64 within 1e-5 where the goldens hold transformers' float64 run).

use crate::common;
use crate::hf_families::check_against;
use headscope::model::nn::Gates;
use std::path::PathBuf;

fn tf5_dir() -> PathBuf {
    common::fixtures().join("tiny_hf_tf5")
}

/// The checkpoint directories of `tiny_hf_tf5/`, sorted.
fn checkpoints() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(tf5_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn every_tf5_checkpoint_was_written_by_transformers_5_and_matches_its_twin() {
    let names = checkpoints();
    assert!(names.len() >= 18, "only {} transformers-5 checkpoints: {names:?}", names.len());
    let text = &common::short_pud_sentences(1)[0];
    for name in &names {
        let dir = tf5_dir().join(name);
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        let version = cfg["transformers_version"].as_str().unwrap_or_default();
        assert!(version.starts_with('5'), "{name}: transformers_version {version}");
        let m5 = common::load(&dir, "f32");
        let twin = common::tiny_hf_dir().join(name);
        if !twin.is_dir() {
            continue; // a shape transformers 4.57 cannot write
        }
        assert_eq!(
            std::fs::read(dir.join("model.safetensors")).unwrap(),
            std::fs::read(twin.join("model.safetensors")).unwrap(),
            "{name}: the weight files differ"
        );
        let m4 = common::load(&twin, "f32");
        assert_eq!(m5.rope(), m4.rope(), "{name}: the two config shapes give other rotary settings");
        if m5.decoder_only() {
            let (a, b) = (m5.predictions(text, &Gates::none()).unwrap(), m4.predictions(text, &Gates::none()).unwrap());
            assert_eq!(common::max_diff(&a.logits, &b.logits), 0.0, "{name}: the twins' logits differ");
        }
        println!(
            "{name}: transformers {version}, weights byte-identical to the 4.57 twin, rotary {}",
            m5.rope().replace('\n', "; ")
        );
    }
}

/// Decoder-only families against transformers 5's goldens, through the checks of their 4.57
/// twins (`hf_families::check_against`: token ids, greedy continuations, logits and attention,
/// float64 where the goldens hold it).
#[test]
fn decoder_only_tf5_checkpoints_equal_transformers_5() {
    let g = common::golden("tiny_hf_tf5/golden_tf5.npz");
    let mut checked = Vec::new();
    for name in checkpoints() {
        let m = common::load(&tf5_dir().join(&name), "f32");
        if !m.decoder_only() || !g.contains_key(&format!("{name}_ids_0")) {
            continue;
        }
        check_against(&g, &name, &format!("../tiny_hf_tf5/{name}"));
        checked.push(name);
    }
    println!("checked against transformers 5: {}", checked.join(", "));
    // Where transformers 5 runs in float64 throughout, headscope's float64 run equals it within
    // 1e-10 (1e-14 in practice). Its dynamic rotary still rounds the frequencies to float32.
    let text = &common::short_pud_sentences(1)[0];
    let mut exact = 0;
    for name in checked.iter().filter(|n| *n != "llama_dynamic") {
        if let Some((dl, da, dm)) = crate::hf_families::float64_diffs(&g, name, &format!("../tiny_hf_tf5/{name}"), text)
        {
            assert!(
                dl < 1e-10 && da < 1e-10 && dm < 1e-10,
                "{name} in float64: logits {dl:e}, attention {da:e}, gated {dm:e}"
            );
            exact += 1;
        }
    }
    assert!(exact >= 12, "only {exact} float64 goldens");
    for want in [
        "llama",
        "llama3",
        "llama_linear",
        "llama_dynamic",
        "llama_yarn",
        "qwen3",
        "pythia",
        "phi3",
        "phi3_partial",
        "gemma3",
    ] {
        assert!(checked.iter().any(|c| c == want), "{want} was not checked against transformers 5");
    }
}

/// The encoder-decoders (MarianMT, BART; M2M100, mBART, T5, Flan-T5, mT5) and RoBERTa against
/// transformers 5's goldens, through the checks of their 4.57 twins (token ids, greedy
/// translations, the forced target language, teacher-forced logits and every head's attention,
/// heads closed at the output projection).
#[test]
fn seq2seq_and_encoder_tf5_checkpoints_equal_transformers_5() {
    let golden = "tiny_hf_tf5/golden_tf5.npz";
    for name in ["marian", "bart"] {
        crate::hf_seq2seq::check_in(golden, name, &format!("../tiny_hf_tf5/{name}"));
    }
    for name in ["m2m100", "mbart", "t5", "flan_t5", "mt5"] {
        crate::hf_seq2seq_2026::check_in(golden, name, &format!("../tiny_hf_tf5/{name}"));
    }
    crate::hf_families::roberta_against(golden, "../tiny_hf_tf5/roberta");
}
