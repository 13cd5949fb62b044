//! Parity of the real models with independent references (scripts under tests/fixtures/):
//! MiniLM against HF transformers, Firefox-Translations EN->PT against a numpy Marian.
//! Each check runs on the CPU, and again on CUDA when a GPU is present.

use crate::common;
use crate::common::{fixtures, python};

use headscope::assets::asset_path;
use headscope::model::hooks::Point;
use headscope::model::nn::Gates;
use headscope::model::{Kind, LoadOptions, Model};
use std::path::Path;
use tch::{Device, Tensor};

// float32 against transformers: common::f32_bound (scale x sqrt(depth), derived there).

fn devices() -> Vec<Device> {
    if tch::Cuda::is_available() {
        vec![Device::Cpu, Device::Cuda(0)]
    } else {
        common::skip("cuda", "CUDA is not available: the CUDA half of the parity tests did not run");
        vec![Device::Cpu]
    }
}

/// Hidden states (embeddings + each layer) and attention probabilities of one sentence.
fn minilm_forward(m: &Model, text: &str) -> (Vec<i64>, Tensor, Tensor) {
    let b = m.batch(&[text]).unwrap();
    let (hidden, attn) = common::hidden_and_attention(|r| m.encode(&b, &Gates::none(), Some(r)).unwrap());
    (b.encoded[0].ids.clone(), Tensor::stack(&hidden, 0), Tensor::stack(&attn, 0))
}

fn check_minilm_npz(npz: &Path, device: Device) -> usize {
    let m = Model::load(
        &asset_path("minilm").unwrap(),
        LoadOptions { device, dtype: tch::Kind::Float, allow_unknown_config: false },
    )
    .unwrap();
    let z = common::npz(npz);
    let n = z.keys().filter(|k| k.starts_with("ids")).count();
    assert!(n > 0, "{}: no sentences", npz.display());
    for i in 0..n {
        let text = String::from_utf8(Vec::<u8>::try_from(&z[&format!("text{i}")]).unwrap()).unwrap();
        let (ids, hidden, attn) = minilm_forward(&m, &text);
        assert_eq!(ids, Vec::<i64>::try_from(&z[&format!("ids{i}")]).unwrap(), "token ids differ for {text:?}");
        let depth = common::depth(&m, ids.len());
        let want = &z[&format!("hidden{i}")];
        let dh = common::max_diff(&hidden, want) / common::f32_bound(common::scale(want), depth);
        let da = common::max_diff(&attn, &z[&format!("attn{i}")]) / common::f32_bound(1.0, depth);
        assert!(
            dh <= 1.0,
            "{device:?} sentence {i}: hidden states differ by {dh:.3} of the float32 bound from HF ({text:?})"
        );
        assert!(
            da <= 1.0,
            "{device:?} sentence {i}: attention differs by {da:.3} of the float32 bound from HF ({text:?})"
        );
    }
    n
}

#[test]
fn minilm_matches_committed_hf_golden() {
    for d in devices() {
        assert_eq!(check_minilm_npz(&fixtures().join("minilm_golden.npz"), d), 3);
    }
}

#[test]
fn minilm_matches_hf_on_20_pud_sentences() {
    let out = tempfile::tempdir().unwrap();
    let npz = out.path().join("ref.npz");
    let st = std::process::Command::new(python())
        .arg(fixtures().join("minilm_reference.py"))
        .arg(asset_path("minilm").unwrap())
        .arg(asset_path("pud_en.txt").unwrap())
        .arg(&npz)
        .args(["--first", "20"])
        .status()
        .expect("run the HF reference (scripts/setup installs it into .venv)");
    assert!(st.success(), "HF reference script failed");
    for d in devices() {
        assert_eq!(check_minilm_npz(&npz, d), 20);
    }
}

#[derive(serde::Deserialize)]
struct MarianCase {
    source: String,
    source_ids: Vec<i64>,
    output_ids: Vec<i64>,
    output: String,
}

#[test]
fn marian_enpt_matches_numpy_reference() {
    let cases: Vec<MarianCase> =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("marian_enpt_golden.json")).unwrap()).unwrap();
    assert_eq!(cases.len(), 21);
    assert_eq!(cases[0].output, "O gato está dormindo no sofá.");
    let attn = common::npz(&fixtures().join("marian_enpt_attn.npz"));
    for device in devices() {
        let m = Model::load(
            &asset_path("enpt").unwrap(),
            LoadOptions { device, dtype: tch::Kind::Float, allow_unknown_config: false },
        )
        .unwrap();
        let sources: Vec<&str> = cases.iter().map(|c| c.source.as_str()).collect();
        // Batched by length, as scripts translate.
        let outs = m.translate(&sources, &Gates::none(), 4096).unwrap();
        for (c, ids) in cases.iter().zip(&outs) {
            assert_eq!(m.tokenize(&c.source).unwrap().ids, c.source_ids, "source ids differ for {:?}", c.source);
            assert_eq!(ids, &c.output_ids, "{device:?}: greedy output differs for {:?}", c.source);
            assert_eq!(m.detokenize(ids).unwrap(), c.output);
        }
        for (key, want) in &attn {
            let i: usize = key.trim_start_matches('s').parse().unwrap();
            let b = m.batch(&[cases[i].source.as_str()]).unwrap();
            let (seen, _) = common::recorded(&[Point::Pattern], |r| m.encode(&b, &Gates::none(), Some(r)).unwrap());
            let got: Vec<Tensor> = seen.iter().filter(|(at, _)| at.kind == Kind::Enc).map(|(_, a)| a.get(0)).collect();
            let depth = common::depth(&m, b.encoded[0].ids.len());
            let d = common::max_diff(&Tensor::stack(&got, 0), want) / common::f32_bound(1.0, depth);
            assert!(d <= 1.0, "{device:?}: encoder attention of sentence {i} differs by {d:.3} of the float32 bound");
        }
    }
}

/// SmolLM2-135M (decoder-only, GGUF Q4_1) against HF transformers loading the same GGUF: every
/// hidden state within 1e-4 relative to its layer's scale, and the same greedy continuation.
#[test]
fn smollm2_matches_hf_transformers() {
    let _heavy = common::heavy();
    let out = tempfile::tempdir().unwrap();
    let npz = out.path().join("smol.npz");
    let st = std::process::Command::new(python())
        .arg(fixtures().join("smollm2_reference.py"))
        .arg(asset_path("smollm2").unwrap())
        .arg(asset_path("pud_en.txt").unwrap())
        .arg(&npz)
        .status()
        .expect("run the HF reference");
    assert!(st.success(), "HF reference script failed");
    let z = common::npz(&npz);
    for device in devices() {
        let m = Model::load(
            &asset_path("smollm2").unwrap(),
            LoadOptions { device, dtype: tch::Kind::Float, allow_unknown_config: false },
        )
        .unwrap();
        for i in 0..3 {
            let text = String::from_utf8(Vec::<u8>::try_from(&z[&format!("text{i}")]).unwrap()).unwrap();
            let b = m.batch(&[text.as_str()]).unwrap();
            assert_eq!(
                b.encoded[0].ids,
                Vec::<i64>::try_from(&z[&format!("ids{i}")]).unwrap(),
                "token ids of {text:?}"
            );
            let (hidden, _) = common::hidden_and_attention(|r| m.encode(&b, &Gates::none(), Some(r)).unwrap());
            let ours = Tensor::stack(&hidden, 0);
            let want = &z[&format!("hidden{i}")];
            assert_eq!(ours.size(), want.size());
            let depth = common::depth(&m, b.encoded[0].ids.len());
            for l in 0..ours.size()[0] {
                let d = common::max_diff(&ours.get(l), &want.get(l))
                    / common::f32_bound(common::scale(&want.get(l)), depth);
                assert!(
                    d <= 1.0,
                    "{device:?} sentence {i} layer {l}: hidden states differ by {d:.3} of the float32 bound"
                );
            }
        }
        let prompt = String::from_utf8(Vec::<u8>::try_from(&z["gen_prompt"]).unwrap()).unwrap();
        let gen = m.generate(&prompt, 8, &Gates::none()).unwrap();
        assert_eq!(gen, Vec::<i64>::try_from(&z["gen_ids"]).unwrap(), "{device:?}: greedy continuation of {prompt:?}");
    }
}

/// The model's outputs as values (docs/methods.md#model-outputs) against HF transformers
/// (`fixtures/outputs_reference.py`, float32): `predictions`' logits (every position for the
/// tiny GPT-2, Llama and Qwen2; the last for SmolLM2 through transformers' GGUF loader) within
/// 1e-4 relative to their scale, the same five most likely next tokens, next-token losses within
/// 1e-4 and the mean task loss over the texts (`dataset_loss`) within 1e-4.
#[test]
fn logits_top_tokens_and_loss_match_hf_transformers() {
    let _heavy = common::heavy();
    let out = tempfile::tempdir().unwrap();
    let npz = out.path().join("outputs.npz");
    let st = std::process::Command::new(python())
        .arg(fixtures().join("outputs_reference.py"))
        .arg(asset_path("smollm2").unwrap())
        .arg(&npz)
        .status()
        .expect("run the HF reference");
    assert!(st.success(), "HF reference script failed");
    let z = common::npz(&npz);
    let tiny = ["a b c d e", "the cat sat"];
    let smol = ["The capital of France is", "The cat sat on the mat. It was"];
    for (name, texts) in [("gpt2", tiny), ("llama", tiny), ("qwen2", tiny), ("smollm2", smol)] {
        let dir =
            if name == "smollm2" { asset_path("smollm2").unwrap() } else { fixtures().join("tiny_hf").join(name) };
        let m = Model::load(
            &dir,
            LoadOptions { device: Device::Cpu, dtype: tch::Kind::Float, allow_unknown_config: false },
        )
        .unwrap();
        let mut loss_bound = 0f64;
        for (i, text) in texts.iter().enumerate() {
            let p = m.predictions(text, &Gates::none()).unwrap();
            assert_eq!(
                p.encoded.ids,
                Vec::<i64>::try_from(&z[&format!("{name}/ids/{i}")]).unwrap(),
                "{name}: token ids of {text:?}"
            );
            let t = p.logits.size()[0];
            let (ours, want) = match z.get(&format!("{name}/logits/{i}")) {
                Some(all) => (p.logits.shallow_clone(), all.shallow_clone()),
                None => (p.logits.get(t - 1), z[&format!("{name}/last/{i}")].shallow_clone()),
            };
            let depth = common::depth(&m, t as usize);
            let d = common::max_diff(&ours, &want) / common::f32_bound(common::scale(&want), depth);
            assert!(d <= 1.0, "{name} {text:?}: logits differ by {d:.3} of the float32 bound");
            let top: Vec<i64> = Vec::<i64>::try_from(&p.logits.get(t - 1).topk(5, -1, true, true).1).unwrap();
            assert_eq!(
                top,
                Vec::<i64>::try_from(&z[&format!("{name}/top5/{i}")]).unwrap(),
                "{name} {text:?}: the five most likely next tokens"
            );
            let losses = p.next_token_losses().unwrap();
            let want = Vec::<f64>::try_from(&z[&format!("{name}/losses/{i}")].to_kind(tch::Kind::Double)).unwrap();
            // A loss is a log-softmax of the logits: its error is the logits' (their scale's bound).
            let bound = common::f32_bound(common::scale(&p.logits), common::depth(&m, t as usize));
            let d = losses.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(
                losses.len() == want.len() && d <= 2.0 * bound,
                "{name} {text:?}: next-token losses differ by {d:e} (bound {:e})",
                2.0 * bound
            );
            loss_bound = loss_bound.max(2.0 * bound);
        }
        let (mean, count, from) = m.dataset_loss(&texts, None, 1024, &Gates::none(), &|| false).unwrap();
        let want = z[&format!("{name}/mean")].double_value(&[]);
        assert_eq!(from, "next tokens");
        // A mean of per-token losses errs at most as much as the worst of them.
        assert!(
            (mean - want).abs() <= loss_bound,
            "{name}: mean loss {mean} vs transformers {want} over {count} tokens (bound {loss_bound:e})"
        );
        eprintln!("{name}: logits, top 5, losses and mean loss ({mean:.6} vs {want:.6}) agree with transformers");
    }
}
