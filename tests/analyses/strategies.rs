//! Pruning strategies side by side (docs/methods.md#pruning-strategies): on the planted model
//! every data-driven strategy removes only heads that write nothing (the loss stays the
//! model's, difference 0) while the random baseline breaks it; HARP's bypassed attention is
//! `alpha (norm(x) W_V) W_O` computed by hand; targeted L0 holds the expected open heads to
//! its target; bad input is a one-line error.

use crate::common;
use headscope::data::{Dataset, Item};
use headscope::model::hooks::{At, Point, Record};
use headscope::model::nn::{Bypass, Gates};
use headscope::model::{HeadId, Kind, ModelError};
use headscope::prune::strategies::{compare, CompareOptions, Strategy, STRATEGIES};
use headscope::prune::{train, Concrete, Distill, EvalGates, Hooks, Init, PenaltyScale, PruneOptions};
use std::sync::Arc;
use tch::Tensor;

fn prune_options(kind: Kind) -> PruneOptions {
    PruneOptions {
        lambda: 0.05,
        steps: 60,
        lr: 0.1,
        batch_tokens: 200,
        kinds: vec![kind],
        joint: false,
        model_lr: 1e-5,
        seed: 1,
        eval_data: None,
        eval_every: 1000,
        checkpoint: None,
        resume: false,
        concrete: Concrete::default(),
        init: Init::Uniform,
        penalty_scale: PenaltyScale::PerHead,
        distill: Distill::Cosine,
        eval_gates: EvalGates::Binary,
        target: None,
        ablation: None,
    }
}

/// Texts of the planted vocabulary: a random segment of 4 words, 5 times (the copy head
/// predicts every token after the first segment).
fn repeats(n: usize, seed: u64) -> Dataset {
    let mut x = seed;
    let items = (0..n)
        .map(|_| {
            let seg: Vec<String> = (0..4)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    format!("w{}", (x >> 33) % 36)
                })
                .collect();
            Item { text: vec![seg.join(" "); 5].join(" "), target: None, tree: None }
        })
        .collect();
    Dataset::new(format!("repeats{seed}"), items)
}

/// The planted model (streaming.rs) with a silent third layer: of its 12 heads only dec.0.0
/// (previous token) and dec.1.0 (copy) write anything.
#[test]
fn every_strategy_but_random_removes_only_the_heads_that_write_nothing() {
    let (v, _dir) = crate::streaming::planted::model_with(1, 1.0);
    let m = &v.model;
    let o = CompareOptions {
        fractions: vec![0.3, 10.0 / 12.0],
        strategies: STRATEGIES.to_vec(),
        seeds: 5,
        prune: prune_options(Kind::Dec),
        michel_step: 0.1,
        harp_alphas: vec![0.0, 0.5, 1.0],
    };
    let c = compare(m, &repeats(8, 3), &repeats(8, 11), &o, &|| false, &mut |_, _, _| {}).unwrap();
    assert!(c.full < 2.0, "the planted model predicts the repeats: loss {}", c.full);
    let useful = [HeadId { kind: Kind::Dec, layer_idx: 0, head: 0 }, HeadId { kind: Kind::Dec, layer_idx: 1, head: 0 }];
    for r in &c.rows {
        eprintln!(
            "{:16} {:.3}: removed {:2} loss {:.6} (full {:.6}) {:?}",
            r.strategy.to_string(),
            r.fraction,
            r.heads_removed,
            r.value,
            c.full,
            r.spread
        );
        match r.strategy {
            Strategy::Random => {
                if r.heads_removed == 10 {
                    assert!(
                        (r.value - c.full).abs() > 0.5,
                        "removing 10 of 12 heads at random changes the model: {} vs {}",
                        r.value,
                        c.full
                    );
                    assert!(r.spread.is_some());
                }
            }
            Strategy::Harp | Strategy::SublayerCosine if r.fraction < 0.5 => {
                assert_eq!(r.layers_removed, Some(1));
                assert!(
                    r.removed.iter().all(|h| h.layer_idx == 2),
                    "{}: the silent layer goes first: {:?}",
                    r.strategy,
                    r.removed
                );
                assert_eq!(r.value, c.full, "{}: dropping the silent layer changes nothing", r.strategy);
            }
            Strategy::Harp | Strategy::SublayerCosine => assert_eq!(r.layers_removed, Some(3)),
            s => {
                assert_eq!(r.heads_removed, if r.fraction < 0.5 { 4 } else { 10 });
                assert!(
                    !r.removed.iter().any(|h| useful.contains(h)),
                    "{s} at {}: removed a head that writes: {:?}",
                    r.fraction,
                    r.removed
                );
                assert_eq!(r.value, c.full, "{s}: removing heads that write nothing changes nothing");
            }
        }
    }
}

/// A bypassed layer's attention output is `alpha (ln1 W_V) W_O` (grouped values repeated per
/// query head), computed here by hand from the layer's weights.
#[test]
fn harp_bypass_is_the_value_path_scaled() {
    for name in ["gpt2", "llama"] {
        let m = common::tiny_hf(name, "f64");
        let b = m.batch(&["the cat sat on the mat", "a dog ran"]).unwrap();
        let (l, alpha) = (1usize, 0.7);
        let a = m.attention(Kind::Dec, l).unwrap();
        let mut g = Gates::none();
        g.bypass = Some(Arc::new(vec![Bypass { kind: Kind::Dec, layer_idx: l, alpha, width: a.width() }]));
        let (mut ln1, mut out) = (None, None);
        let mut on = |at: At, t: &Tensor| -> Result<(), ModelError> {
            if at.layer == l {
                match at.point {
                    Point::Ln1 => ln1 = Some(t.shallow_clone()),
                    Point::AttnOut => out = Some(t.shallow_clone()),
                    _ => {}
                }
            }
            Ok(())
        };
        let mut rec = Record::new(&[Point::Ln1, Point::AttnOut], &mut on);
        let _ = m.encode(&b, &g, Some(&mut rec)).unwrap();
        let (x, got) = (ln1.unwrap(), out.unwrap());
        let (bsz, t) = (x.size()[0], x.size()[1]);
        let (h, hk, dh) = (a.n_heads, a.n_kv_heads, a.head_dim);
        let v = a.v.forward(&x).view([bsz, t, hk, dh]).repeat_interleave_self_int(h / hk, Some(2), None).reshape([
            bsz,
            t,
            h * dh,
        ]);
        let want = a.o.forward(&(v * alpha));
        let d = common::max_diff(&got, &want);
        assert!(d < 1e-12, "{name}: bypassed layer {l} within {d:e} of alpha (ln1 W_V) W_O");
        // And the model changes: the layer no longer attends.
        let plain = m.encode(&b, &Gates::none(), None).unwrap();
        let bypassed = m.encode(&b, &g, None).unwrap();
        assert!(common::max_diff(&plain, &bypassed) > 1e-6, "{name}: the bypass changes the states");
    }
}

/// Targeted L0 holds the expected number of open heads near its target (lambda 0: no other
/// pressure to close heads).
#[test]
fn targeted_l0_holds_the_expected_open_heads_to_the_target() {
    let m = common::tiny_hf("gpt2", "f32");
    let data = Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap().take(12);
    for target in [2.0, 6.0] {
        let o = PruneOptions { steps: 600, lambda: 0.0, target: Some(target), ..prune_options(Kind::Dec) };
        let r = train(&m, &[], &data, &o, Hooks { stop: &|| false, progress: &mut |_, _| {} }).unwrap();
        // The Lagrangian oscillates about its target (a period of about 300 steps here): the
        // mean over the second half.
        let tail = &r.state.curve[r.state.curve.len() / 2..];
        let open = tail.iter().map(|p| p.expected_open).sum::<f64>() / tail.len() as f64;
        eprintln!(
            "target {target}: expected open heads {open:.3} (last step {:.3}), multipliers {:?}",
            r.state.curve.last().unwrap().expected_open,
            r.state.lagrange
        );
        assert!((open - target).abs() < 0.6, "target {target}: expected open {open}");
    }
}

/// Bad input: one-line errors naming the argument.
#[test]
fn bad_compare_input_is_a_one_line_error() {
    let m = common::tiny_hf("gpt2", "f32");
    let d = Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap().take(4);
    let base = CompareOptions {
        fractions: vec![0.5],
        strategies: vec![Strategy::Random],
        seeds: 2,
        prune: prune_options(Kind::Dec),
        michel_step: 0.1,
        harp_alphas: vec![1.0],
    };
    let cases: Vec<(CompareOptions, &str)> = vec![
        (CompareOptions { fractions: vec![0.0], ..base.clone() }, "fractions must be numbers in (0, 1)"),
        (CompareOptions { fractions: vec![1.0], ..base.clone() }, "fractions must be numbers in (0, 1)"),
        (CompareOptions { seeds: 0, ..base.clone() }, "seeds must be at least 1"),
        (CompareOptions { michel_step: 0.0, ..base.clone() }, "michel_step"),
        (CompareOptions { harp_alphas: vec![], ..base.clone() }, "harp_alphas"),
        (CompareOptions { strategies: vec![], ..base.clone() }, "strategies is empty"),
    ];
    for (o, want) in cases {
        let e = compare(&m, &d, &d, &o, &|| false, &mut |_, _, _| {}).err().expect("refused").to_string();
        assert!(e.contains(want) && e.starts_with("prune_compare") && !e.contains('\n'), "{want}: {e}");
    }
    let mt = common::tiny_hf("marian", "f32");
    let e = compare(&mt, &d, &d, &base, &|| false, &mut |_, _, _| {}).err().unwrap().to_string();
    assert!(e.contains("encoder-decoder"), "{e}");
    assert!(
        "bogus".parse::<Strategy>().unwrap_err().contains("hard_concrete"),
        "an unknown strategy lists the known ones"
    );
}

/// A parallel-residual model (tiny Pythia: GPT-NeoX, no `resid_mid` on its path) runs every
/// strategy, and `sublayer_cosine` drops the layer whose `cos(resid_pre, resid_pre + attn_out)`,
/// computed here from the hook points, is highest.
#[test]
fn every_strategy_runs_on_a_parallel_residual_model() {
    let m = common::tiny_hf("pythia", "f64");
    let data = Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap().take(6);
    let texts: Vec<&str> = data.items.iter().map(|i| i.text.as_str()).collect();
    let b = m.batch(&texts).unwrap();
    let (mut pre, mut attn) = (vec![None, None], vec![None, None]);
    let mut on = |at: At, t: &Tensor| -> Result<(), ModelError> {
        match at.point {
            Point::ResidPre => pre[at.layer] = Some(t.shallow_clone()),
            Point::AttnOut => attn[at.layer] = Some(t.shallow_clone()),
            _ => {}
        }
        Ok(())
    };
    let mut rec = Record::new(&[Point::ResidPre, Point::AttnOut, Point::ResidMid], &mut on);
    let _ = m.encode(&b, &Gates::none(), Some(&mut rec)).unwrap();
    let mask = b.mask.to_kind(tch::Kind::Double);
    let sim: Vec<f64> = (0..2)
        .map(|l| {
            let (p, a) = (pre[l].as_ref().unwrap(), attn[l].as_ref().unwrap());
            let c = Tensor::cosine_similarity(p, &(p + a), -1, 1e-8);
            (c * &mask).sum(tch::Kind::Double).double_value(&[]) / mask.sum(tch::Kind::Double).double_value(&[])
        })
        .collect();
    eprintln!("pythia: cos(resid_pre, resid_pre + attn_out) per layer {sim:?}");
    assert!((sim[0] - sim[1]).abs() > 1e-6, "the layers differ: {sim:?}");
    let most = if sim[0] > sim[1] { 0 } else { 1 };
    let o = CompareOptions {
        fractions: vec![0.5],
        strategies: STRATEGIES.to_vec(),
        seeds: 2,
        prune: PruneOptions { steps: 3, ..prune_options(Kind::Dec) },
        michel_step: 0.25,
        harp_alphas: vec![0.0, 1.0],
    };
    let c = compare(&m, &data, &data, &o, &|| false, &mut |_, _, _| {}).unwrap();
    for s in STRATEGIES {
        assert!(c.rows.iter().any(|r| r.strategy == s && r.value.is_finite()), "{s} ran on pythia");
    }
    let r = c.rows.iter().find(|r| r.strategy == Strategy::SublayerCosine).unwrap();
    assert_eq!(r.layers_removed, Some(1));
    assert!(r.removed.iter().all(|h| h.layer_idx == most), "sublayer_cosine drops layer {most}: {:?}", r.removed);
}
