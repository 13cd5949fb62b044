//! Parity of the real models with independent references (scripts under tests/fixtures/):
//! MiniLM against HF transformers, Firefox-Translations EN->PT against a numpy Marian.
//! Each check runs on the CPU, and again on CUDA when a GPU is present.

mod common;

use headscope::assets::asset_path;
use headscope::model::hooks::Point;
use headscope::model::nn::Gates;
use headscope::model::{Kind, LoadOptions, Model};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Device, Tensor};

const TOL: f64 = 1e-4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python")
}

fn read_npz(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_npz(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).into_iter().collect()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape mismatch");
    (a.to_device(Device::Cpu).to_kind(tch::Kind::Double) - b.to_device(Device::Cpu).to_kind(tch::Kind::Double)).abs().max().double_value(&[])
}

fn devices() -> Vec<Device> {
    if tch::Cuda::is_available() {
        vec![Device::Cpu, Device::Cuda(0)]
    } else {
        eprintln!("CUDA not available: the CUDA half of the parity tests was skipped");
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
    let m = Model::load(&asset_path("minilm").unwrap(), LoadOptions { device, dtype: tch::Kind::Float }).unwrap();
    let z = read_npz(npz);
    let n = z.keys().filter(|k| k.starts_with("ids")).count();
    assert!(n > 0, "{}: no sentences", npz.display());
    for i in 0..n {
        let text = String::from_utf8(Vec::<u8>::try_from(&z[&format!("text{i}")]).unwrap()).unwrap();
        let (ids, hidden, attn) = minilm_forward(&m, &text);
        assert_eq!(ids, Vec::<i64>::try_from(&z[&format!("ids{i}")]).unwrap(), "token ids differ for {text:?}");
        let dh = max_abs_diff(&hidden, &z[&format!("hidden{i}")]);
        let da = max_abs_diff(&attn, &z[&format!("attn{i}")]);
        assert!(dh < TOL, "{device:?} sentence {i}: hidden states differ by {dh:e} from HF ({text:?})");
        assert!(da < TOL, "{device:?} sentence {i}: attention differs by {da:e} from HF ({text:?})");
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
    let cases: Vec<MarianCase> = serde_json::from_str(&std::fs::read_to_string(fixtures().join("marian_enpt_golden.json")).unwrap()).unwrap();
    assert_eq!(cases.len(), 21);
    assert_eq!(cases[0].output, "O gato está dormindo no sofá.");
    let attn = read_npz(&fixtures().join("marian_enpt_attn.npz"));
    for device in devices() {
        let m = Model::load(&asset_path("enpt").unwrap(), LoadOptions { device, dtype: tch::Kind::Float }).unwrap();
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
            let d = max_abs_diff(&Tensor::stack(&got, 0), want);
            assert!(d < TOL, "{device:?}: encoder attention of sentence {i} differs by {d:e}");
        }
    }
}

/// SmolLM2-135M (decoder-only, GGUF Q4_1) against HF transformers loading the same GGUF: every
/// hidden state within 1e-4 relative to its layer's scale, and the same greedy continuation.
#[test]
fn smollm2_matches_hf_transformers() {
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
    let z = read_npz(&npz);
    for device in devices() {
        let m = Model::load(&asset_path("smollm2").unwrap(), LoadOptions { device, dtype: tch::Kind::Float }).unwrap();
        for i in 0..3 {
            let text = String::from_utf8(Vec::<u8>::try_from(&z[&format!("text{i}")]).unwrap()).unwrap();
            let b = m.batch(&[text.as_str()]).unwrap();
            assert_eq!(b.encoded[0].ids, Vec::<i64>::try_from(&z[&format!("ids{i}")]).unwrap(), "token ids of {text:?}");
            let (hidden, _) = common::hidden_and_attention(|r| m.encode(&b, &Gates::none(), Some(r)).unwrap());
            let ours = Tensor::stack(&hidden, 0);
            let want = &z[&format!("hidden{i}")];
            assert_eq!(ours.size(), want.size());
            for l in 0..ours.size()[0] {
                let scale = want.get(l).abs().max().double_value(&[]).max(1e-6);
                let d = max_abs_diff(&ours.get(l), &want.get(l)) / scale;
                assert!(d < TOL, "{device:?} sentence {i} layer {l}: hidden states differ by {d:e} (relative)");
            }
        }
        let prompt = String::from_utf8(Vec::<u8>::try_from(&z["gen_prompt"]).unwrap()).unwrap();
        let gen = m.generate(&prompt, 8, &Gates::none()).unwrap();
        assert_eq!(gen, Vec::<i64>::try_from(&z["gen_ids"]).unwrap(), "{device:?}: greedy continuation of {prompt:?}");
    }
}
