//! Gradient head importance (docs/methods.md#gradient-head-importance) against transformers:
//! `tests/fixtures/importance_reference.py` runs the bertology recipe (|d loss / d head_mask|,
//! one sentence per batch) on the tiny GPT-2 (200 PUD sentences, next-token loss) and MarianMT
//! (50 pairs, teacher-forced loss, enc/dec/cross masks) checkpoints; its output is
//! `tests/fixtures/importance_golden.json`. Also: batching does not change the result (loss and
//! Fisher), layer normalisation, closed heads, and CPU = CUDA where CUDA is present.

use crate::common::{self, root};

use headscope::analysis::importance::{head_importance, ImportanceMetric, ImportanceOptions, Normalize};
use headscope::data::{Dataset, Item};
use headscope::device::DeviceChoice;
use headscope::model::nn::Gates;
use headscope::model::{HeadId, Kind, KindGrids, Model};

const REL: f64 = 1e-4;

fn lines() -> Vec<String> {
    std::fs::read_to_string(root().join("assets/pud_en.txt"))
        .expect("assets/pud_en.txt (scripts/setup)")
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn corpus(n: usize) -> Dataset {
    Dataset::new("pud", lines().into_iter().take(n).map(|text| Item { text, target: None, tree: None }).collect())
}

/// Source i = PUD line i, reference = line i + 1, as the reference script pairs them.
fn pairs(n: usize) -> Dataset {
    let l = lines();
    Dataset::new(
        "pud pairs",
        (0..n).map(|i| Item { text: l[i].clone(), target: Some(l[i + 1].clone()), tree: None }).collect(),
    )
}

fn opts(kinds: &[Kind], metric: ImportanceMetric, batch_tokens: usize) -> ImportanceOptions {
    ImportanceOptions {
        metric,
        normalize: Normalize::None,
        kinds: kinds.to_vec(),
        batch_tokens,
        seed: 3,
        row_offset: 0,
    }
}

fn run(m: &Model, d: &Dataset, o: &ImportanceOptions, base: &Gates) -> KindGrids {
    head_importance(m, d, base, o, &|| false, &mut |_, _| {}).unwrap_or_else(|e| panic!("head_importance: {e}")).grids
}

/// Largest relative difference over every head; panics naming the head when over `rel`.
fn assert_close(what: &str, got: &KindGrids, want: impl Fn(Kind, usize, usize) -> f64, rel: f64) -> f64 {
    let mut worst: f64 = 0.0;
    for (kind, grid) in got {
        for (l, row) in grid.iter().enumerate() {
            for (h, &v) in row.iter().enumerate() {
                let w = want(*kind, l, h);
                let d = (v - w).abs() / w.abs().max(1e-12);
                assert!(d <= rel, "{what}: {kind}.{l}.{h}: headscope {v:.8e}, reference {w:.8e} (relative {d:.2e})");
                worst = worst.max(d);
            }
        }
    }
    worst
}

fn from_json(g: &serde_json::Value) -> impl Fn(Kind, usize, usize) -> f64 + '_ {
    move |k, l, h| g[k.to_string()][l][h].as_f64().unwrap()
}

#[test]
fn gpt2_equals_transformers_head_mask_gradients() {
    let m = common::tiny_hf("gpt2", "f32");
    let got = run(&m, &corpus(200), &opts(&[Kind::Dec], ImportanceMetric::Loss, 512), &Gates::none());
    let g = common::golden_json("importance_golden.json")["gpt2"].clone();
    let worst = assert_close("gpt2", &got, from_json(&g), REL);
    println!("gpt2, 200 sentences: largest relative difference {worst:.2e}");
}

#[test]
fn marian_equals_transformers_enc_dec_cross() {
    let m = common::tiny_hf("marian", "f32");
    let kinds = [Kind::Enc, Kind::Dec, Kind::Cross];
    let got = run(&m, &pairs(50), &opts(&kinds, ImportanceMetric::Loss, 512), &Gates::none());
    assert_eq!(got.iter().map(|(k, _)| *k).collect::<Vec<_>>(), kinds);
    let g = common::golden_json("importance_golden.json")["marian"].clone();
    let worst = assert_close("marian", &got, from_json(&g), REL);
    println!("marian, 50 pairs: largest relative difference {worst:.2e}");
}

#[test]
fn batching_changes_nothing_loss_and_fisher() {
    let m = common::tiny_hf("gpt2", "f32");
    let d = corpus(40);
    for metric in [ImportanceMetric::Loss, ImportanceMetric::Fisher] {
        let one = run(&m, &d, &opts(&[Kind::Dec], metric, 1), &Gates::none());
        let big = run(&m, &d, &opts(&[Kind::Dec], metric, 4096), &Gates::none());
        let worst = assert_close(&format!("{metric} batch 1 vs 4096 tokens"), &big, |_, l, h| one[0].1[l][h], 1e-5);
        println!("{metric}: one sentence per batch vs 4096-token batches: {worst:.2e}");
        assert!(one[0].1.iter().flatten().all(|&v| v > 0.0));
    }
    // The Fisher targets are sampled: another seed gives other numbers.
    let a = run(&m, &d, &opts(&[Kind::Dec], ImportanceMetric::Fisher, 512), &Gates::none());
    let mut o = opts(&[Kind::Dec], ImportanceMetric::Fisher, 512);
    o.seed = 4;
    let b = run(&m, &d, &o, &Gates::none());
    assert_ne!(a[0].1, b[0].1);
}

#[test]
fn layer_normalisation_gives_unit_rows_and_closed_heads_are_nan() {
    let m = common::tiny_hf("gpt2", "f32");
    let d = corpus(10);
    let mut o = opts(&[Kind::Dec], ImportanceMetric::Loss, 512);
    o.normalize = Normalize::Layer;
    let raw = run(&m, &d, &opts(&[Kind::Dec], ImportanceMetric::Loss, 512), &Gates::none());
    let got = run(&m, &d, &o, &Gates::none());
    for (l, row) in got[0].1.iter().enumerate() {
        let norm: f64 = row.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-9, "layer {l}: norm {norm}");
        let raw_norm: f64 = raw[0].1[l].iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((row[0] - raw[0].1[l][0] / raw_norm).abs() < 1e-12);
    }
    let closed = HeadId { kind: Kind::Dec, layer_idx: 1, head: 2 };
    let masked = run(&m, &d, &opts(&[Kind::Dec], ImportanceMetric::Loss, 512), &m.gates_closing(&[closed]).unwrap());
    for (l, row) in masked[0].1.iter().enumerate() {
        for (h, v) in row.iter().enumerate() {
            assert_eq!(v.is_nan(), (l, h) == (1, 2), "dec.{l}.{h} = {v}");
        }
    }
}

#[test]
fn an_encoder_without_an_output_head_is_refused() {
    let m = common::load(&root().join("assets/minilm"), "f32");
    let err = head_importance(
        &m,
        &corpus(2),
        &Gates::none(),
        &opts(&[Kind::Enc], ImportanceMetric::Loss, 512),
        &|| false,
        &mut |_, _| {},
    )
    .err()
    .expect("refused");
    assert!(err.to_string().contains("task loss"), "{err}");
}

#[test]
fn cuda_equals_cpu() {
    if !tch::Cuda::is_available() {
        common::skip("cuda", "CUDA is not available");
        return;
    }
    let d = pairs(20);
    let kinds = [Kind::Enc, Kind::Dec, Kind::Cross];
    let cpu = run(&common::tiny_hf("marian", "f32"), &d, &opts(&kinds, ImportanceMetric::Loss, 512), &Gates::none());
    let gpu = run(
        &common::load_on(&common::tiny_hf_dir().join("marian"), DeviceChoice::Cuda(0), "f32"),
        &d,
        &opts(&kinds, ImportanceMetric::Loss, 512),
        &Gates::none(),
    );
    let worst = assert_close("cuda vs cpu", &gpu, |k, l, h| cpu.iter().find(|(k2, _)| *k2 == k).unwrap().1[l][h], 1e-3);
    println!("marian on CUDA vs CPU: {worst:.2e}");
}

/// The language-model task loss that `ablate` and the sweep measure equals transformers' loss,
/// and the sweep equals masking one head at a time under it.
#[test]
fn language_model_loss_equals_transformers_and_the_sweep_equals_ablate() {
    use headscope::analysis::ablation::{evaluate, prepare, sweep, Metric};
    let m = common::tiny_hf("gpt2", "f32");
    let p = prepare(&m, &corpus(200), Metric::Loss, 512, Gates::none()).unwrap();
    let base = evaluate(&m, &p, &Gates::none(), &|| false).unwrap();
    let want = common::golden_json("importance_golden.json")["gpt2"]["token_loss"].as_f64().unwrap();
    assert!((base - want).abs() / want < 1e-5, "headscope {base}, transformers {want}");
    let small = prepare(&m, &corpus(12), Metric::Loss, 256, Gates::none()).unwrap();
    let grid = sweep(&m, &small, &[Kind::Dec], &|| false, &mut |_, _| {}).unwrap();
    for (l, h) in [(0, 1), (1, 3)] {
        let one = evaluate(
            &m,
            &small,
            &m.gates_closing(&[HeadId { kind: Kind::Dec, layer_idx: l, head: h }]).unwrap(),
            &|| false,
        )
        .unwrap();
        let s = grid[0].1[l][h];
        assert!((s - one).abs() / one < 1e-5, "dec.{l}.{h}: sweep {s}, ablate {one}");
    }
}
