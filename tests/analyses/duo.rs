//! DuoAttention's learned gates (docs/methods.md#duo-gates): the mix is the blend of the full
//! and the streaming attention, gate 0 is the streaming view and gate 1 the model; on the
//! planted model training closes every gate but the copy head's; a run stopped and resumed from
//! its checkpoint ends with the same gates as one never stopped.

use crate::common;
use headscope::data::{Dataset, Item};
use headscope::model::hooks::{At, Point, Record};
use headscope::model::nn::{Duo, Regime};
use headscope::model::view::View;
use headscope::model::{HeadId, Kind, ModelError};
use headscope::prune::duo::{train, DuoOptions, Method};
use headscope::prune::Concrete;
use headscope::prune::{CurvePoint, Hooks};
use std::cell::Cell;

use tch::{Kind as DType, Tensor};

const TEXT: &str =
    "the cat and the dog sat on the mat in the park all day while a dog ran in the park today and we like green tea";

/// Layer patterns and logits of one sequence under `gates`.
fn run(v: &View, gates: &headscope::model::nn::Gates, ids: &[i64]) -> (Vec<Tensor>, Tensor) {
    let m = &v.model;
    let x = Tensor::from_slice(ids).view([1, -1]);
    let mut patterns = Vec::new();
    let mut on = |_: At, a: &Tensor| -> Result<(), ModelError> {
        patterns.push(a.shallow_clone());
        Ok(())
    };
    let mut rec = Record::new(&[Point::Pattern], &mut on);
    let states = m.net.encode(&x, &x.ones_like().to_kind(DType::Float), gates, Some(&mut rec)).unwrap();
    (patterns, m.net.logits(&states).unwrap())
}

fn duo(v: &View, alpha: Tensor, sink: i64, recent: i64) -> headscope::model::nn::Gates {
    let mut g = v.gates().unwrap();
    g.duo = Some(std::rc::Rc::new(Duo { alpha, sink, recent }));
    g
}

/// Gate 1 is the model, gate 0 the streaming view (difference 0), and a gate between mixes the
/// two patterns linearly (exactly in layer 0, whose input no gate changes).
#[test]
fn the_mix_blends_full_and_streaming_attention() {
    for name in ["llama", "gpt2"] {
        let v = View::new(common::tiny_hf(name, "f64"));
        let ids: Vec<i64> = v.model.tokenize(TEXT).unwrap().ids;
        let shape = v.model.kind_shape(Kind::Dec).unwrap();
        let (l, h) = (shape.n_layers as i64, shape.n_heads as i64);
        let (sink, recent) = (2, 5);
        let (plain_p, plain) = run(&v, &v.gates().unwrap(), &ids);
        let (_, ones) = run(&v, &duo(&v, Tensor::ones([l, h], (DType::Double, tch::Device::Cpu)), sink, recent), &ids);
        assert_eq!(common::max_diff(&plain, &ones), 0.0, "{name}: gate 1 everywhere is the model");
        let every: Vec<HeadId> = (0..l as usize)
            .flat_map(|layer| (0..h as usize).map(move |head| HeadId { kind: Kind::Dec, layer_idx: layer, head }))
            .collect();
        let s = v.streaming(&every, sink, recent, Regime::Always, "test").unwrap();
        let (stream_p, streamed) = run(&s, &s.gates().unwrap(), &ids);
        let (_, zeros) =
            run(&v, &duo(&v, Tensor::zeros([l, h], (DType::Double, tch::Device::Cpu)), sink, recent), &ids);
        let d0 = common::max_diff(&streamed, &zeros);
        assert!(d0 < 1e-12, "{name}: gate 0 everywhere is the streaming view ({d0:e})");
        assert!(common::max_diff(&plain, &streamed) > 1e-3, "{name}: the window changes the model");
        // Layer 0 under gates a: a P_full + (1 - a) P_streaming per head.
        let a: Vec<f64> = (0..l * h).map(|i| (i as f64 * 0.37).fract()).collect();
        let alpha = Tensor::from_slice(&a).view([l, h]);
        let (mixed_p, _) = run(&v, &duo(&v, alpha.shallow_clone(), sink, recent), &ids);
        let a0 = alpha.get(0).view([1, h, 1, 1]);
        let want = &plain_p[0] * &a0 + &stream_p[0] * (a0.ones_like() - &a0);
        let d = common::max_diff(&mixed_p[0], &want);
        assert!(d < 1e-14, "{name}: layer 0's pattern is the blend ({d:e})");
        eprintln!("{name}: gate 1 = model (0), gate 0 = streaming view ({d0:.1e}), layer-0 blend within {d:.1e}");
    }
}

fn options(steps: usize) -> DuoOptions {
    DuoOptions {
        steps,
        lr: 0.05,
        lambda: 0.05,
        sink: 2,
        recent: 8,
        context: 40,
        samples: 3,
        needle: 6,
        batch: 1,
        seed: 4,
        checkpoint: None,
        resume: false,
        save_every: 2,
        method: Method::Duo,
    }
}

fn pud(n: usize) -> Dataset {
    Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap().take(n)
}

fn quiet<'a>(stop: &'a dyn Fn() -> bool, progress: &'a mut dyn FnMut(&CurvePoint, usize)) -> Hooks<'a> {
    Hooks { stop, progress }
}

/// A run stopped after 3 steps and resumed from its checkpoint ends with the gates of a run
/// never stopped, bit for bit.
#[test]
fn a_resumed_run_ends_with_identical_gates() {
    let v = View::new(common::tiny_hf("llama", "f32"));
    let data = pud(40);
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(6);
    let whole = train(&v, &data, &o, quiet(&|| false, &mut |_, _| {})).unwrap();
    o.checkpoint = Some(dir.path().to_path_buf());
    let calls = Cell::new(0);
    let stop = || {
        calls.set(calls.get() + 1);
        calls.get() > 3
    };
    let e = train(&v, &data, &o, quiet(&stop, &mut |_, _| {})).err().expect("the run stops");
    assert!(e.to_string().contains("interrupt"), "{e}");
    // A second run without resume refuses the directory.
    let again =
        train(&v, &data, &o, quiet(&|| false, &mut |_, _| {})).err().expect("a directory holding a run is refused");
    assert!(again.to_string().contains("already holds a run"), "{again}");
    o.resume = true;
    let resumed = train(&v, &data, &o, quiet(&|| false, &mut |_, _| {})).unwrap();
    assert_eq!(resumed.resumed_from, Some(3));
    assert_eq!(resumed.state.log_alpha, whole.state.log_alpha, "resumed gates equal the uninterrupted run's");
    // The curve comes back through the checkpoint's JSON: its losses within a rounding.
    assert_eq!(resumed.state.curve.len(), whole.state.curve.len());
    for (a, b) in resumed.state.curve.iter().zip(&whole.state.curve) {
        assert!(
            a.step == b.step && (a.loss - b.loss).abs() <= 1e-15 * (1.0 + b.loss.abs()) && a.open == b.open,
            "{a:?} vs {b:?}"
        );
    }
    assert!(whole.state.log_alpha.iter().any(|&a| a < 1.0), "the gates moved: {:?}", whole.state.log_alpha);
    // Another option is refused on resume, naming it.
    o.lambda = 0.5;
    let other = train(&v, &data, &o, quiet(&|| false, &mut |_, _| {})).err().unwrap().to_string();
    assert!(other.contains("lambda") && !other.contains('\n'), "{other}");
}

/// On the planted model (streaming.rs: a windowed layer 0, a copy head dec.1.0 whose output is
/// the prediction, layer-1 heads writing nothing else) the gates of every group but the copy
/// head's fall to 0; the copy head's stays high.
#[test]
fn learned_gates_keep_the_planted_copy_head_alone() {
    let (v, _dir) = crate::streaming::planted::model();
    // Texts of the planted vocabulary: random words, 200 of them.
    let data = words();
    let o = DuoOptions {
        steps: 60,
        lr: 0.05,
        lambda: 0.01,
        sink: 2,
        recent: 8,
        context: 48,
        samples: 4,
        needle: 6,
        batch: 2,
        seed: 1,
        checkpoint: None,
        resume: false,
        save_every: 10,
        method: Method::Duo,
    };
    let r = train(&v, &data, &o, quiet(&|| false, &mut |_, _| {})).unwrap();
    let g = r.per_head();
    eprintln!("planted duo gates {g:?}; loss {:?}", r.state.curve.last().map(|p| p.loss));
    assert!(g[1][0] > 0.5, "the copy head keeps its gate: {}", g[1][0]);
    for (l, row) in g.iter().enumerate() {
        for (h, &a) in row.iter().enumerate() {
            if (l, h) != (1, 0) {
                assert!(a < 0.05, "dec.{l}.{h} gate {a}: streaming it changes nothing");
            }
        }
    }
}

/// Bad input: one-line errors, nothing panics.
#[test]
fn bad_duo_input_is_a_one_line_error() {
    let v = View::new(common::tiny_hf("llama", "f32"));
    let data = pud(40);
    let mut cases: Vec<(DuoOptions, &str)> = vec![];
    let mut o = options(2);
    o.sink = 30;
    o.recent = 20;
    cases.push((o, "sink + recent"));
    let mut o = options(2);
    o.needle = 30;
    cases.push((o, "does not fit"));
    let mut o = options(2);
    o.resume = true;
    cases.push((o, "needs a checkpoint"));
    let mut o = options(2);
    o.lr = 0.0;
    cases.push((o, "lr must be"));
    let mut o = options(2);
    o.context = 100_000;
    cases.push((o, "fewer than one context"));
    for (o, want) in cases {
        let e = train(&v, &data, &o, quiet(&|| false, &mut |_, _| {})).err().expect("refused").to_string();
        assert!(e.contains(want) && e.starts_with("learn_duo") && !e.contains('\n'), "{want}: {e}");
    }
    let enc = View::new(common::tiny_hf("roberta", "f32"));
    let e = train(&enc, &data, &options(2), quiet(&|| false, &mut |_, _| {})).err().unwrap().to_string();
    assert!(e.contains("not a decoder-only model"), "{e}");
    let s = v.streaming(&[HeadId { kind: Kind::Dec, layer_idx: 0, head: 0 }], 2, 4, Regime::Always, "test").unwrap();
    let e = train(&s, &data, &options(2), quiet(&|| false, &mut |_, _| {})).err().unwrap().to_string();
    assert!(e.contains("streaming heads already"), "{e}");
}

fn words() -> Dataset {
    let mut x = 7u64;
    let words: Vec<String> = (0..200)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            format!("w{}", (x >> 33) % 36)
        })
        .collect();
    Dataset::new("words", words.chunks(50).map(|c| Item { text: c.join(" "), target: None, tree: None }).collect())
}

/// PruLong's Hard Concrete masks on the planted model, held to one group in eight kept full:
/// the copy head's mask is the one left open (log_alpha > 0), every other below it and closed.
#[test]
fn prulong_masks_keep_the_planted_copy_head() {
    let (v, _dir) = crate::streaming::planted::model_with(0, 1.0);
    let method = Method::PruLong { target: Some(1.0 / 8.0), concrete: Concrete::default() };
    let o = DuoOptions {
        steps: 150,
        lr: 0.1,
        lambda: 0.0,
        sink: 2,
        recent: 8,
        context: 48,
        samples: 4,
        needle: 6,
        batch: 2,
        seed: 1,
        checkpoint: None,
        resume: false,
        save_every: 10,
        method,
    };
    let r = train(&v, &words(), &o, quiet(&|| false, &mut |_, _| {})).unwrap();
    let g = r.per_head();
    eprintln!("planted prulong log_alpha {g:?}; last {:?}", r.state.curve.last());
    assert!(g[1][0] > 0.0, "the copy head's mask stays open: {}", g[1][0]);
    for (l, row) in g.iter().enumerate() {
        for (h, &a) in row.iter().enumerate() {
            if (l, h) != (1, 0) {
                assert!(a < 0.0 && a < g[1][0], "dec.{l}.{h} log_alpha {a}: closed, below the copy head");
            }
        }
    }
    // Resumable: stopped after 40 steps and resumed, the same masks.
    let dir = tempfile::tempdir().unwrap();
    let mut o = DuoOptions { checkpoint: Some(dir.path().to_path_buf()), ..o };
    let calls = Cell::new(0);
    let stop = || {
        calls.set(calls.get() + 1);
        calls.get() > 40
    };
    assert!(train(&v, &words(), &o, quiet(&stop, &mut |_, _| {})).is_err());
    o.resume = true;
    let resumed = train(&v, &words(), &o, quiet(&|| false, &mut |_, _| {})).unwrap();
    assert_eq!(resumed.resumed_from, Some(40));
    assert_eq!(resumed.state.log_alpha, r.state.log_alpha, "resumed masks equal the uninterrupted run's");
    assert_eq!(resumed.state.lagrange, r.state.lagrange);
}
