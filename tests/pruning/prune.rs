//! Pruning: planted useless heads are closed first; the penalty closes more heads as lambda
//! grows on a real model; a killed run resumed from its checkpoint ends with the same gates
//! as an uninterrupted one; `prune_heads` computes what the masked model computes.

use crate::common;

use headscope::data::Dataset;
use headscope::model::nn::{Activation, Attention, Ffn, Gates, Linear, NormPosition};
use headscope::model::transformer::{Embeddings, Positions, StackLayer, Stop};
use headscope::model::{Family, HeadId, Kind, LoadOptions, Model};
use headscope::prune::{train, Hooks, PruneOptions};
use std::collections::BTreeSet;
use std::path::Path;
use tch::{Device, Kind as DType, Tensor};

const WORDS: [&str; 12] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];
const D: i64 = 16;
const H: i64 = 4;
const DH: i64 = 4;
/// Heads 2 and 3 of every layer have zero value projections: they contribute nothing.
const USELESS: [i64; 2] = [2, 3];

fn randn(shape: &[i64], scale: f64) -> Tensor {
    Tensor::randn(shape, (DType::Float, Device::Cpu)) * scale
}

fn lin(out: i64, inp: i64) -> Linear {
    Linear { w: randn(&[out, inp], 1.0 / (inp as f64).sqrt()), b: Some(randn(&[out], 0.1)) }
}

fn layer() -> StackLayer {
    let mut attn = Attention::new(lin(D, D), lin(D, D), lin(D, D), lin(D, D), H, H, DH);
    let _ = attn.q.w.g_mul_scalar_(3.0); // sharper attention, so heads differ
    for h in USELESS {
        let _ = attn.v.w.narrow(0, h * DH, DH).fill_(0.0);
        let _ = attn.v.b.as_ref().unwrap().narrow(0, h * DH, DH).fill_(0.0);
    }
    StackLayer::new(
        attn,
        common::layer_norm(D),
        Ffn { up: lin(32, D), down: lin(D, 32), act: Activation::Gelu, gate: None },
        common::layer_norm(D),
        NormPosition::Post,
    )
}

fn tiny_model(dir: &Path) -> Model {
    tch::manual_seed(11);
    let v = WORDS.len() as i64 + 4;
    let embed = Embeddings {
        tokens: randn(&[v, D], 1.0),
        scale: 1.0,
        positions: Positions::Learned(randn(&[32, D], 1.0)),
        token_type: None,
        norm: None,
    };
    common::hand_built(dir, &WORDS, embed, vec![layer(), layer()], Kind::Enc, Family::Bert)
}

fn corpus(dir: &Path) -> Dataset {
    let mut state = 7u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let lines: Vec<String> =
        (0..40).map(|_| (0..10).map(|_| WORDS[next() % WORDS.len()]).collect::<Vec<_>>().join(" ")).collect();
    let p = dir.join("train.txt");
    std::fs::write(&p, lines.join("\n")).unwrap();
    Dataset::corpus(&p).unwrap()
}

fn closed_after(model: &Model, data: &Dataset, lambda: f64, steps: usize) -> BTreeSet<(usize, usize)> {
    let mut o = PruneOptions::new(vec![Kind::Enc]);
    (o.lambda, o.steps, o.lr, o.batch_tokens, o.seed) = (lambda, steps, 0.1, 120, 3);
    // Every head starts open (P(open) = 0.93), as in a model before pruning.
    o.init = headscope::prune::Init::Constant(2.0);
    let run = train(model, &[], data, &o, Hooks { stop: &|| false, progress: &mut |_, _| {} }).unwrap();
    run.closed().iter().map(|h| (h.layer_idx, h.head)).collect()
}

/// A run from the default start stopped after two steps has most gates unsettled (P(open) in
/// [0.1, 0.9)); one trained to the planted answer has settled them (its result shows no note).
#[test]
fn unsettled_gates_are_counted_until_training_decides_them() {
    let _rng = common::rng();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = corpus(dir.path());
    let run = |steps: usize, init: Option<headscope::prune::Init>| {
        let mut o = PruneOptions::new(vec![Kind::Enc]);
        (o.lambda, o.steps, o.lr, o.batch_tokens, o.seed) = (0.02, steps, 0.1, 120, 3);
        if let Some(i) = init {
            o.init = i;
        }
        train(&model, &[], &data, &o, Hooks { stop: &|| false, progress: &mut |_, _| {} }).unwrap().unsettled()
    };
    let (early, trained) = run(2, None);
    assert!(early as f64 > headscope::prune::UNSETTLED_SHARE * trained as f64, "{early} of {trained} after 2 steps");
    let (late, trained) = run(100, Some(headscope::prune::Init::Constant(2.0)));
    assert!(late as f64 <= headscope::prune::UNSETTLED_SHARE * trained as f64, "{late} of {trained} after 100 steps");
}

#[test]
fn planted_useless_heads_are_pruned_first() {
    let _rng = common::rng();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = corpus(dir.path());
    let useless: BTreeSet<(usize, usize)> =
        (0..2).flat_map(|l| USELESS.iter().map(move |&h| (l, h as usize))).collect();
    // A moderate lambda: the useless heads close and the useful ones stay.
    let mut seen_all = false;
    for steps in [10, 20, 40, 60, 80, 100] {
        let closed = closed_after(&model, &data, 0.02, steps);
        assert!(closed.is_subset(&useless), "after {steps} steps a useful head was closed: {closed:?}");
        seen_all |= closed == useless;
    }
    assert!(seen_all, "the useless heads never all closed");
    assert_eq!(closed_after(&model, &data, 0.02, 100), useless);
    // A strong lambda closes everything eventually, but never a useful head before all the
    // useless ones.
    let mut last = BTreeSet::new();
    for steps in [10, 20, 30, 40, 60, 80, 120] {
        let closed = closed_after(&model, &data, 2.0, steps);
        if closed.iter().any(|h| !useless.contains(h)) {
            assert!(
                useless.is_subset(&closed),
                "after {steps} steps a useful head closed before every useless one: {closed:?}"
            );
        }
        last = closed;
    }
    assert!(last.len() > useless.len(), "a strong lambda should close useful heads too: {last:?}");
}

#[test]
fn stronger_penalty_leaves_fewer_heads_open_on_minilm() {
    let _rng = common::rng();
    let model = common::asset("minilm", "f32");
    let data = Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap().take(24);
    let mut expected = Vec::new();
    for lambda in [0.0, 0.005, 0.5] {
        let mut o = PruneOptions::new(vec![Kind::Enc]);
        (o.lambda, o.steps, o.lr, o.batch_tokens) = (lambda, 20, 0.05, 300);
        let run = train(&model, &[], &data, &o, Hooks { stop: &|| false, progress: &mut |_, _| {} }).unwrap();
        let p = run.state.curve.last().unwrap();
        println!("lambda {lambda}: expected open {:.2}, open {}", p.expected_open, p.open);
        expected.push((p.expected_open, p.open));
    }
    assert!(expected[0].0 > expected[1].0 && expected[1].0 > expected[2].0, "{expected:?}");
    assert!(
        expected[0].1 >= expected[1].1 && expected[1].1 >= expected[2].1 && expected[0].1 > expected[2].1,
        "{expected:?}"
    );
}

fn gates_of(json: &Path) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    v
}

#[test]
fn killed_run_resumes_to_the_same_gates() {
    let _rng = common::rng();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("p.rhai");
    std::fs::write(
        &script,
        r#"let m = load_model("minilm");
let r = m.prune(corpus(asset("pud_en.txt")).take(40), #{lambda: 0.2, steps: 60, lr: 0.05, batch_tokens: 300, eval_every: 10, checkpoint: ARGS[0], resume: true, seed: 3});
r.to_json(ARGS[1]);
"#,
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_headscope");
    let run = |ck: &Path, out: &Path| {
        std::process::Command::new(bin).arg("run").arg(&script).arg(ck).arg(out).output().unwrap()
    };
    let (ck_a, out_a) = (dir.path().join("a"), dir.path().join("a.json"));
    let r = run(&ck_a, &out_a);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));

    // Kill a second run once its checkpoint has passed step 20, then resume it.
    let (ck_b, out_b) = (dir.path().join("b"), dir.path().join("b.json"));
    let mut child = std::process::Command::new(bin).arg("run").arg(&script).arg(&ck_b).arg(&out_b).spawn().unwrap();
    let t0 = std::time::Instant::now();
    let mut killed_at = 0;
    while t0.elapsed().as_secs() < 120 {
        if let Ok(bytes) = std::fs::read(ck_b.join("checkpoint.json")) {
            let v: serde_json::Value = serde_json::from_slice(&bytes).expect("a checkpoint is never half-written");
            killed_at = v["step"].as_u64().unwrap();
            if killed_at >= 20 {
                child.kill().unwrap();
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.wait();
    assert!(killed_at >= 20 && !out_b.exists(), "the run was not killed mid-way (checkpoint step {killed_at})");
    let r = run(&ck_b, &out_b);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));

    let (a, b) = (gates_of(&out_a), gates_of(&out_b));
    let from = b["resumed_from"].as_u64().expect("the second run resumed");
    assert!(
        from >= killed_at && from < 60 && from % 10 == 0,
        "resumed from {from}, killed after checkpoint {killed_at}"
    );
    assert_eq!(a["resumed_from"], serde_json::Value::Null);
    assert_eq!(a["log_alpha"], b["log_alpha"], "resumed gates differ from the uninterrupted run's");
    assert_eq!(a["curve"], b["curve"]);
    assert_eq!(b["curve"].as_array().unwrap().len(), 60);
}

#[test]
fn physically_pruned_model_equals_the_masked_model() {
    let _rng = common::rng();
    let opts = LoadOptions::new(headscope::device::DeviceChoice::Cpu, "f32").unwrap();
    let model = Model::load(&headscope::assets::asset_path("enpt").unwrap(), opts).unwrap();
    let h = |kind, layer_idx, head| HeadId { kind, layer_idx, head };
    // A whole encoder layer, scattered heads, and cross-attention heads.
    let mut closed: Vec<HeadId> = (0..8).map(|i| h(Kind::Enc, 2, i)).collect();
    closed.extend([
        h(Kind::Enc, 0, 1),
        h(Kind::Enc, 0, 6),
        h(Kind::Enc, 5, 3),
        h(Kind::Cross, 0, 2),
        h(Kind::Cross, 1, 7),
    ]);
    let pruned = headscope::prune::physical::prune_heads(&model, &closed, None).unwrap();
    assert!(pruned.n_params < model.n_params);
    assert_eq!(pruned.net.stack[2].attention().unwrap().n_heads, 0);
    assert_eq!(pruned.net.stack[0].attention().unwrap().q.w.size(), vec![6 * 32, 256]);
    let gates = model.gates_closing(&closed).unwrap();
    let texts = ["The cat sat on the mat.", "Researchers ask which heads matter, and how many can go.", "Hello."];
    let batch = model.batch(&texts).unwrap();
    let _g = tch::no_grad_guard();
    let enc_masked = model.net.encode(&batch.ids, &batch.mask, &gates, None).unwrap();
    let enc_pruned = pruned.net.encode(&batch.ids, &batch.mask, &Gates::none(), None).unwrap();
    let rel = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]) / a.abs().max().double_value(&[]);
    assert!(rel(&enc_masked, &enc_pruned) < 1e-5, "encoder outputs differ: {}", rel(&enc_masked, &enc_pruned));
    let targets = Tensor::from_slice(&[5i64, 17, 230, 8, 2, 44, 9, 3, 120]).view([3, 3]);
    let l_masked = model.net.teacher(&enc_masked, &batch.mask, &targets, Stop::Logits, &gates, None).unwrap();
    let l_pruned = pruned.net.teacher(&enc_pruned, &batch.mask, &targets, Stop::Logits, &Gates::none(), None).unwrap();
    assert!(rel(&l_masked, &l_pruned) < 1e-5, "decoder logits differ: {}", rel(&l_masked, &l_pruned));
    let t_masked = model.translate(&texts, &gates, 64).unwrap();
    let t_pruned = pruned.translate(&texts, &Gates::none(), 64).unwrap();
    assert_eq!(t_masked, t_pruned);
}

#[test]
fn joint_training_trains_a_copy_and_resumes_exactly() {
    let _rng = common::rng();
    let opts = LoadOptions::new(headscope::device::DeviceChoice::Cpu, "f32").unwrap();
    let model = Model::load(&headscope::assets::asset_path("minilm").unwrap(), opts).unwrap();
    let data = Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap().take(12);
    let dir = tempfile::tempdir().unwrap();
    let mut o = PruneOptions::new(vec![Kind::Enc]);
    (o.steps, o.batch_tokens, o.joint, o.model_lr, o.eval_every, o.seed) = (6, 300, true, 1e-3, 2, 5);
    let before = model.net.stack[0].attention().unwrap().q.w.copy();
    let quiet = |stop_at: usize| {
        let n = std::cell::Cell::new(0usize);
        move || {
            n.set(n.get() + 1);
            n.get() > stop_at
        }
    };
    let full = train(&model, &[], &data, &o, Hooks { stop: &quiet(usize::MAX), progress: &mut |_, _| {} }).unwrap();
    let trained = full.trained.as_ref().expect("joint training returns the trained model");
    assert!(
        trained.net.stack[0].attention().unwrap().q.w.dist(&before).double_value(&[]) > 1e-4,
        "the weights did not move"
    );
    assert_eq!(
        model.net.stack[0].attention().unwrap().q.w.dist(&before).double_value(&[]),
        0.0,
        "the original model was edited"
    );

    // Interrupted after step 3 (its checkpoint is at step 2 or the stop), then resumed.
    o.checkpoint = Some(dir.path().join("ck"));
    o.resume = true;
    let stopped = train(&model, &[], &data, &o, Hooks { stop: &quiet(3), progress: &mut |_, _| {} });
    assert!(stopped.is_err(), "the run should have been interrupted");
    let resumed = train(&model, &[], &data, &o, Hooks { stop: &quiet(usize::MAX), progress: &mut |_, _| {} }).unwrap();
    assert!(resumed.resumed_from.is_some_and(|s| s > 0 && s < 6), "{:?}", resumed.resumed_from);
    assert_eq!(full.state.log_alpha, resumed.state.log_alpha);
    let (a, b) = (trained, resumed.trained.as_ref().unwrap());
    assert_eq!(
        a.net.stack[3].dense().unwrap().up.w.dist(&b.net.stack[3].dense().unwrap().up.w).double_value(&[]),
        0.0,
        "resumed weights differ"
    );
    let files: Vec<String> = std::fs::read_dir(dir.path().join("ck"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.iter().filter(|f| f.starts_with("weights-")).count(), 1, "stale weight files: {files:?}");
}
