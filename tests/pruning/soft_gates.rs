//! A view with continuous gates (`m.with_gates(r)` of a prune result under
//! `eval_gates: "continuous"`) is the model every analysis reads: `analyze`, `diversity` and
//! `ablation_sweep` (its grid and its `base`) on the view equal the same analyses on a copy of
//! the checkpoint whose W^O columns of each head were multiplied by that head's gate by hand
//! (a gate scales the head's context `z` before W^O, docs/methods.md#hook-points, so the two
//! are one model computed two ways), and differ from the ungated model's.

use crate::common::{self, root};

use headscope::engine::{Session, SessionOptions};
use std::path::Path;
use tch::Tensor;

fn eval(s: &mut Session, code: &str) -> String {
    match s.eval("case", code) {
        Ok(v) => v.map(|o| o.text).unwrap_or_default(),
        Err(e) => panic!("{code}: {}", e.message),
    }
}

/// `src` copied to `dst` with the per-head input columns of W^O scaled: `key(l)` names layer
/// `l`'s output matrix, `by_rows` says whether its input axis is the first (GPT-2's Conv1D) or
/// the second (a Linear's `[out, in]`).
fn scaled_copy(src: &Path, dst: &Path, gates: &[Vec<f64>], key: impl Fn(usize) -> String, by_rows: bool) {
    std::fs::create_dir_all(dst).unwrap();
    for f in std::fs::read_dir(src).unwrap() {
        let p = f.unwrap().path();
        if p.file_name().unwrap() != "model.safetensors" {
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
    let mut tensors = Tensor::read_safetensors(src.join("model.safetensors")).unwrap();
    for (l, row) in gates.iter().enumerate() {
        let (_, w) = tensors.iter_mut().find(|(n, _)| *n == key(l)).unwrap_or_else(|| panic!("no {}", key(l)));
        let d = w.size()[0];
        let dh = d / row.len() as i64;
        // The view's gates are float32 numbers (ScriptModel::gates); the product is kept in
        // float64, as the float64 model computes it.
        let scale: Vec<f64> = row.iter().flat_map(|&g| std::iter::repeat_n(g as f32 as f64, dh as usize)).collect();
        let s = Tensor::from_slice(&scale);
        let w64 = w.to_kind(tch::Kind::Double);
        let w = &mut *w;
        *w = if by_rows { &w64 * s.view([-1, 1]) } else { &w64 * s.view([1, -1]) };
    }
    Tensor::write_safetensors(&tensors, dst.join("model.safetensors")).unwrap();
}

/// A script function writing nested arrays of numbers as JSON (shortest round-trip floats).
const JS: &str = r#"fn js(x) { if type_of(x) != "array" { return x.to_string(); } let s = "["; let first = true; for e in x { if !first { s += ","; } s += js(e); first = false; } s + "]" }"#;

fn parse_grid(text: &str) -> Vec<Vec<f64>> {
    let text = text.trim().trim_matches('"');
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn max_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| if x.is_nan() && y.is_nan() { 0.0 } else { (x - y).abs() })
        .fold(0.0, f64::max)
}

fn check(model: &str, key: impl Fn(usize) -> String, by_rows: bool) {
    let dir = if model == "bert" {
        root().join("tests/fixtures/lrp_tiny/bert")
    } else {
        root().join("tests/fixtures/tiny_hf").join(model)
    };
    let text = root().join("tests/fixtures/lrp_tiny/text.txt");
    let mut s = Session::new(SessionOptions::default());
    eval(&mut s, JS);
    eval(
        &mut s,
        &format!(
            r#"let m = load_model({:?}, #{{device: "cpu", dtype: "f64"}}); let d = corpus({:?}).take(4);"#,
            dir.display().to_string(),
            text.display().to_string()
        ),
    );
    // Gates that differ from head to head, none 0 or 1.
    eval(
        &mut s,
        r#"let r = m.prune(d, #{steps: 6, lr: 0.15, init: 0.3, lambda: 0.1, eval_gates: "continuous", batch_tokens: 400}); let v = m.with_gates(r);"#,
    );
    let gates = parse_grid(&eval(
        &mut s,
        r#"js(r.gates["KIND"])"#.replace("KIND", if model == "bert" { "enc" } else { "dec" }).as_str(),
    ));
    let flat: Vec<f64> = gates.iter().flatten().copied().collect();
    assert!(flat.iter().all(|&g| g > 0.05 && g < 0.999), "{model}: gates {flat:?}");
    assert!(flat.iter().any(|&g| (g - flat[0]).abs() > 1e-3), "{model}: all gates equal {flat:?}");

    let tmp = tempfile::tempdir().unwrap();
    let by_hand = tmp.path().join(model);
    scaled_copy(&dir, &by_hand, &gates, key, by_rows);
    eval(
        &mut s,
        &format!(r#"let h = load_model({:?}, #{{device: "cpu", dtype: "f64"}});"#, by_hand.display().to_string()),
    );

    let kind = if model == "bert" { "enc" } else { "dec" };
    let grid = |s: &mut Session, code: &str| parse_grid(&eval(s, &format!("js({code})")));
    let mut compared = Vec::new();
    for (what, code) in [
        ("analyze confidence", "X.analyze(d, #{stats: [\"confidence\"]}).confidence[\"K\"]"),
        ("diversity output", "X.diversity(d).matrix(\"output\", \"K\", 1)"),
        ("diversity query", "X.diversity(d).matrix(\"query\", \"K\", 1)"),
        ("ablation_sweep grid", "X.ablation_sweep(d)[\"K\"]"),
        ("ablation_sweep base", "[[X.ablation_sweep(d).options.base]]"),
    ] {
        let code = code.replace('K', kind);
        let (view, hand, plain) = (
            grid(&mut s, &code.replace('X', "v")),
            grid(&mut s, &code.replace('X', "h")),
            grid(&mut s, &code.replace('X', "m")),
        );
        let diff = max_diff(&view, &hand);
        assert!(
            diff < 1e-9,
            "{model} {what}: the view and the gates applied by hand differ by {diff:e}\nview {view:?}\nhand {hand:?}"
        );
        compared.push((what, max_diff(&view, &plain)));
    }
    // The gates change every number compared (layer 1's queries through layer 0's gates), so
    // the equalities above say something.
    for (what, d) in &compared {
        if model == "bert" && *what == "ablation_sweep base" {
            // An encoder's metric is the cosine to the model's own output: 1 for any model the
            // sweep starts from, gated or not.
            assert_eq!(*d, 0.0);
            continue;
        }
        assert!(*d > 1e-6, "{model} {what}: the gated view equals the ungated model (difference {d:e})");
    }
}

#[test]
fn a_soft_gated_view_equals_its_gates_applied_by_hand_bert() {
    let _rng = common::rng();
    check("bert", |l| format!("encoder.layer.{l}.attention.output.dense.weight"), false);
}

#[test]
fn a_soft_gated_view_equals_its_gates_applied_by_hand_gpt2() {
    let _rng = common::rng();
    check("gpt2", |l| format!("transformer.h.{l}.attn.c_proj.weight"), true);
}
