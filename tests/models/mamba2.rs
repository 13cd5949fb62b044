//! Mamba-2 layers beside attention (issue 49): Granite-4.0-H (`granitemoehybrid`) against
//! transformers (`tests/fixtures/make_tiny_hf_mamba2.py`, `golden_mamba2.npz`): token ids,
//! logits and the attention layers' patterns within the float32 bound, heads closed (Mamba-2 and
//! attention heads by one gate grid) as transformers' pre-hooks on the output projections close
//! them, parameter counts, greedy continuations token for token (transformers' over its hybrid
//! cache, headscope's over its keys/values, convolution and SSM states, and without a cache);
//! in float64 the logits, the heads closed, and each Mamba-2 head's effective attention
//! (`ssm.hook_alpha`) against the generator's numpy computation by its definition. Then a
//! hand-built Mamba-2 head whose recurrence copies the previous token, found by the positional
//! statistic at offset -1 with fraction 1.0.

use crate::common;
use crate::common::max_diff;

use headscope::analysis::analyze;
use headscope::analysis::options::{Options, Stat};
use headscope::data::Dataset;
use headscope::model::hooks::{At, Hooks, Point};
use headscope::model::mamba2::{Mamba2, Shape};
use headscope::model::nn::{Activation, Ffn, Gates, Linear, Norm, NormKind, NormPosition};
use headscope::model::transformer::{Embeddings, Positions, StackLayer};
use headscope::model::{Family, Kind, Model, ModelError};
use std::collections::HashMap;
use tch::{Device, Kind as DType, Tensor};

/// Heads closed per layer in `{name}_masked*_0` (make_tiny_hf_mamba2.py's MASK; 1 = open).
fn mask(name: &str) -> Vec<Vec<f64>> {
    let rows: &[&[f64]] = if name == "granite_h" {
        &[&[1., 0., 1., 1., 0., 1., 1., 1.], &[1., 0., 1., 1.], &[0., 1., 1., 1., 1., 1., 0., 1.], &[1., 1., 0., 1.]]
    } else {
        &[&[0., 1., 1., 1.], &[1., 1., 1., 0., 1., 1., 1., 1.], &[1., 1., 0., 1., 1., 0., 1., 1.], &[1., 1., 1., 0.]]
    };
    rows.iter().map(|r| r.to_vec()).collect()
}

fn golden() -> HashMap<String, Tensor> {
    common::golden("tiny_hf/golden_mamba2.npz")
}

/// Logits `[T, V]` of one sentence under `gates`, and every recorded `(point, value)`.
fn forward(m: &Model, ids: &[i64], gates: &Gates, points: &[Point]) -> (Tensor, Vec<(At, Tensor)>) {
    let t = Tensor::from_slice(ids).view([1, ids.len() as i64]);
    let mask = Tensor::ones([1, ids.len() as i64], (DType::Float, Device::Cpu));
    let _g = tch::no_grad_guard();
    let (seen, h) = common::recorded(points, |r| m.net.encode(&t, &mask, gates, Some(r)).unwrap());
    (m.net.logits(&h).unwrap().get(0), seen)
}

/// The gates of MASK over the grid of the widest layer (8): an attention layer's 4 heads are the
/// first columns, the rest absent (open).
fn mask_gates(name: &str) -> Gates {
    let mut g = vec![1f64; 4 * 8];
    for (l, row) in mask(name).iter().enumerate() {
        g[l * 8..l * 8 + row.len()].copy_from_slice(row);
    }
    Gates { dec: Some(Tensor::from_slice(&g).view([1, 4, 8])), ..Gates::none() }
}

/// The recorded values of `point` at `layers`, batch row 0, stacked.
fn stacked(seen: &[(At, Tensor)], point: Point, layers: &[usize]) -> Tensor {
    let v: Vec<Tensor> =
        seen.iter().filter(|(a, _)| a.point == point && layers.contains(&a.layer)).map(|(_, t)| t.get(0)).collect();
    assert_eq!(v.len(), layers.len(), "{point:?} at {layers:?}");
    Tensor::stack(&v, 0)
}

fn check(name: &str) {
    let g = golden();
    let m = common::tiny_hf(name, "f32");
    let kinds = m.kinds();
    assert_eq!((kinds.len(), kinds[0].kind, kinds[0].n_layers, kinds[0].n_heads), (1, Kind::Dec, 4, 8), "{name}");
    let mixers: Vec<&str> = m.net.stack.iter().map(|l| l.mixer().kind()).collect();
    let mamba: Vec<usize> = (0..4).filter(|&l| mixers[l] == "mamba2").collect();
    let attn: Vec<usize> = (0..4).filter(|&l| mixers[l] == "attention").collect();
    assert_eq!((mamba.len(), attn.len()), (2, 2), "{name}: {mixers:?}");
    let params = g[&format!("{name}_params")].int64_value(&[]);
    assert_eq!(m.n_params, params, "{name}: parameters as transformers counts them");
    let n = g.keys().filter(|k| k.starts_with(&format!("{name}_ids_"))).count();
    assert!(n >= 20, "{name}: {n} sentences");
    let texts = common::short_pud_sentences(n);
    let (mut worst_logit, mut worst_attn, mut worst_mask) = (0f64, 0f64, 0f64);
    for (i, text) in texts.iter().enumerate() {
        let want_ids = Vec::<i64>::try_from(&g[&format!("{name}_ids_{i}")]).unwrap();
        let ids = m.tokenize(text).unwrap().ids;
        assert_eq!(ids, want_ids, "{name}: token ids of sentence {i}");
        let depth = common::depth(&m, ids.len());
        if let Some(logits) = g.get(&format!("{name}_logits_{i}")) {
            let (l, seen) = forward(&m, &ids, &Gates::none(), &[Point::Pattern]);
            worst_logit = worst_logit.max(max_diff(&l, logits) / common::f32_bound(common::scale(logits), depth));
            let a = stacked(&seen, Point::Pattern, &attn);
            worst_attn = worst_attn.max(max_diff(&a, &g[&format!("{name}_attn_{i}")]) / common::f32_bound(1.0, depth));
        }
        if i == 0 {
            let want = &g[&format!("{name}_masked_0")];
            let (l, _) = forward(&m, &ids, &mask_gates(name), &[]);
            worst_mask = max_diff(&l, want) / common::f32_bound(common::scale(want), depth);
        }
        let want_gen: Vec<i64> = Vec::<i64>::try_from(&g[&format!("{name}_gen_{i}")])
            .unwrap()
            .into_iter()
            .take_while(|&t| t != m.net.eos_id)
            .collect();
        let gen = m.generate(text, 8, &Gates::none()).unwrap();
        assert_eq!(gen, want_gen, "{name}: greedy continuation of sentence {i} over the hybrid cache");
        if i < 4 {
            let uncached = m.generate_with(text, 8, &Gates::none(), false).unwrap();
            assert_eq!(uncached, gen, "{name}: sentence {i} without a cache");
        }
    }
    println!(
        "{name}: {n} sentences, logits {worst_logit:.3}, attention {worst_attn:.3}, heads closed {worst_mask:.3} of the float32 bound"
    );
    assert!(
        worst_logit <= 1.0 && worst_attn <= 1.0 && worst_mask <= 1.0,
        "{name}: logits {worst_logit:.3}, attention {worst_attn:.3}, heads closed {worst_mask:.3}"
    );

    // float64 against transformers in float64 (its float32 casts widened) and the effective
    // attention against numpy's by its definition.
    let m = common::tiny_hf(name, "f64");
    let ids = m.tokenize(&texts[0]).unwrap().ids;
    let (l, seen) = forward(&m, &ids, &Gates::none(), &[Point::SsmAlpha, Point::Pattern]);
    let dl = max_diff(&l, &g[&format!("{name}_logits64_0")]);
    let alpha = stacked(&seen, Point::SsmAlpha, &mamba);
    let want = &g[&format!("{name}_alpha64_0")];
    let da = max_diff(&alpha, want);
    let (lm, _) = forward(&m, &ids, &mask_gates(name), &[]);
    let dm = max_diff(&lm, &g[&format!("{name}_masked64_0")]);
    let moved = max_diff(&lm, &l);
    println!(
        "{name} in float64: logits {dl:.2e}, heads closed {dm:.2e} (closing moved the logits {moved:.2e}), effective attention {da:.2e} (largest {:.2e})",
        want.abs().max().double_value(&[])
    );
    assert!(dl < 1e-5 && dm < 1e-5, "{name} in float64: logits {dl:e}, heads closed {dm:e}");
    assert!(da < 1e-6, "{name}: effective attention differs from numpy's by {da:e}");
    assert!(moved > 1e-3, "{name}: closing heads changed nothing ({moved:e})");
    // The pattern a Mamba-2 layer shows: |alpha| by row, each row summing to 1.
    let shown = stacked(&seen, Point::Pattern, &mamba);
    let by_row = alpha.abs() / alpha.abs().sum_dim_intlist([-1i64].as_slice(), true, None::<DType>);
    assert!(max_diff(&shown, &by_row) < 1e-12, "{name}: the pattern is not |alpha| by row");
    let sums = shown.sum_dim_intlist([-1i64].as_slice(), false, None::<DType>);
    assert!(max_diff(&sums, &sums.ones_like()) < 1e-12, "{name}: rows of the shown pattern");
}

#[test]
fn granite_h_equals_transformers() {
    check("granite_h");
}

#[test]
fn granite_h_with_experts_and_groups_equals_transformers() {
    check("granite_h_moe");
}

/// Replaces the value at one point by `with(value)`.
struct Replace<F: FnMut(&Tensor) -> Tensor> {
    at: At,
    with: F,
    seen: Vec<(At, Tensor)>,
    record: Vec<Point>,
}

impl<F: FnMut(&Tensor) -> Tensor + Send> Hooks for Replace<F> {
    fn wants(&self, at: At) -> bool {
        at == self.at || self.record.contains(&at.point)
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        self.seen.push((at, x.shallow_clone()));
        Ok((at == self.at).then(|| (self.with)(x)))
    }
}

/// A Mamba-2 layer's hook points are its own (no queries or keys); its effective attention is
/// read and written at `ssm.hook_alpha` (zero it and the heads' outputs are the skip `D x`
/// alone); its shown pattern refuses a write, naming the point to write instead.
#[test]
fn a_mamba2_layer_has_its_own_hook_points_and_writable_effective_attention() {
    let m = common::tiny_hf("granite_h", "f64");
    let names: Vec<String> = m.hook_points().iter().map(|a| a.to_string()).collect();
    for want in [
        "dec.blocks.0.ssm.hook_alpha",
        "dec.blocks.0.ssm.hook_dt",
        "dec.blocks.0.attn.hook_pattern",
        "dec.blocks.0.attn.hook_z",
        "dec.blocks.1.attn.hook_q",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    assert!(!names.iter().any(|n| n == "dec.blocks.0.attn.hook_q"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("dec.blocks.1.ssm.")), "{names:?}");
    let ids = m.tokenize("the cat sat on the mat and the dog sat too").unwrap().ids;
    let t = Tensor::from_slice(&ids).view([1, ids.len() as i64]);
    let mask = t.ones_like().to_kind(DType::Float);
    let _g = tch::no_grad_guard();
    let mut r = Replace {
        at: At::new(Kind::Dec, 0, Point::SsmAlpha),
        with: |a: &Tensor| a.zeros_like(),
        seen: vec![],
        record: vec![Point::SsmX, Point::SsmY],
    };
    let _ = m.net.encode(&t, &mask, &Gates::none(), Some(&mut r)).unwrap();
    let one = |p: Point| r.seen.iter().find(|(a, _)| a.point == p && a.layer == 0).unwrap().1.shallow_clone();
    let mamba = m.net.stack[0].mixer().as_any().unwrap().downcast_ref::<Mamba2>().unwrap();
    let skip = one(Point::SsmX) * mamba.d.view([1, 8, 1, 1]);
    assert!(max_diff(&one(Point::SsmY), &skip) < 1e-12, "alpha zeroed leaves y = D x");
    let mut w = Replace {
        at: At::new(Kind::Dec, 2, Point::Pattern),
        with: |a: &Tensor| a.zeros_like(),
        seen: vec![],
        record: vec![],
    };
    let err = m.net.encode(&t, &mask, &Gates::none(), Some(&mut w)).unwrap_err().to_string();
    assert!(err.contains("read only") && err.contains("ssm.hook_alpha") && err.contains("layer 2"), "{err}");
}

/// The key/value accounting of Granite-4.0-H: attention layers grow (2 layers x 2 key/value
/// groups x a key and a value of 8 numbers per position), each Mamba-2 head holds its state
/// `[P, N]` = 8 x 4 and each Mamba-2 layer its convolution's last 3 inputs of `I + 2 G N` = 72
/// channels, whatever the context; a generation's cache holds exactly that.
#[test]
fn a_mamba2_hybrid_counts_its_states_and_its_generation_holds_them() {
    let m = common::tiny_hf("granite_h", "f32");
    let (gen, cache) = m.generate_run("the cat and the dog sat on the mat", 8, &Gates::none(), true).unwrap();
    assert!(!gen.is_empty());
    let v = headscope::model::view::View::new(m);
    for context in [1i64, 100, 1000] {
        let c = headscope::analysis::streaming::kv_cost(&v, context, None);
        let attention = 2 * 2 * context * (2 * 8) * 4;
        let mamba = 2 * (8 * 8 * 4 + 72 * 3) * 4;
        assert_eq!(c.bytes, attention + mamba, "context {context}");
        assert_eq!((c.groups, c.entries), (2 * 2 + 2 * 8, 2 * 2 * context + 2 * 8), "context {context}");
    }
    assert_eq!(cache.bytes(), headscope::analysis::streaming::kv_cost(&v, cache.len, None).bytes);
}

/// A hand-built Mamba-2 layer over one-hot tokens, two heads in two groups of B and C (a 1-tap
/// convolution, so B and C at a position are its token's): head 0's `C` of each word matches
/// the `B` of the token before it in "a b a b ..." ([CLS] reads as "b"), head 1's `C` its own
/// `B`; the decay `exp(dt A) = e^-3` per step makes the nearest match the largest. The
/// positional statistic finds head 0 at offset -1 with fraction 1.0 (every word's largest
/// effective weight on the token before it).
#[test]
fn a_mamba2_head_that_copies_the_previous_token_is_positional_at_minus_one() {
    const WORDS: [&str; 2] = ["a", "b"];
    let (v, d) = (6i64, 8i64); // [PAD] [CLS] [SEP] [UNK] a b
    let (cls, a, b) = (1i64, 4i64, 5i64);
    let shape = Shape { heads: 2, head_dim: 2, groups: 2, state: 2, norm_groups: 1 };
    let (inner, cd) = (shape.inner(), shape.conv_channels()); // 4, 12
    let w = Tensor::zeros([inner + cd + 2, d], (DType::Float, Device::Cpu));
    let set = |row: i64, col: i64, x: f64| {
        let _ = w.get(row).get(col).fill_(x);
    };
    // x: every channel reads every token (the values do not matter to alpha).
    for c in 0..inner {
        for tok in [cls, a, b] {
            set(inner + c, tok, 1.0);
        }
    }
    // Conv channels: x [0, 4), B of group 0 [4, 6), B of group 1 [6, 8), C of group 0 [8, 10),
    // C of group 1 [10, 12); in_proj rows start at `inner` (after z).
    let bg = |g: i64, n: i64| inner + inner + 2 * g + n;
    let cg = |g: i64, n: i64| inner + inner + 4 + 2 * g + n;
    for g in 0..2 {
        set(bg(g, 0), a, 5.0);
        set(bg(g, 1), b, 5.0);
        set(bg(g, 1), cls, 5.0);
    }
    set(cg(0, 1), a, 5.0); // head 0: a's C meets the B of b (and [CLS]) before it
    set(cg(0, 0), b, 5.0); // b's C meets a's B
    set(cg(1, 0), a, 5.0); // head 1: each word's C meets its own B
    set(cg(1, 1), b, 5.0);
    let dt = 1.0f64;
    let mamba = Mamba2 {
        shape,
        in_proj: Linear { w, b: None },
        conv: Tensor::ones([cd, 1, 1], (DType::Float, Device::Cpu)),
        conv_bias: None,
        dt_bias: Tensor::from_slice(&[(dt.exp() - 1.0).ln() as f32; 2]),
        a_log: Tensor::from_slice(&[3f32.ln(); 2]),
        d: Tensor::zeros([2], (DType::Float, Device::Cpu)),
        norm: None,
        eps: 1e-6,
        out_proj: Linear { w: Tensor::zeros([d, inner], (DType::Float, Device::Cpu)), b: None },
        dt_limit: (0.0, f64::INFINITY),
    };
    let ffn = Ffn {
        gate: None,
        up: Linear { w: Tensor::zeros([4, d], (DType::Float, Device::Cpu)), b: None },
        down: Linear { w: Tensor::zeros([d, 4], (DType::Float, Device::Cpu)), b: None },
        act: Activation::Gelu,
    };
    // RMS norms of unit weight keep a one-hot token one-hot (scaled).
    let rms =
        || Norm { kind: NormKind::Rms, weight: Tensor::ones([d], (DType::Float, Device::Cpu)), bias: None, eps: 1e-6 };
    let layer = StackLayer::new(mamba, rms(), ffn, rms(), NormPosition::Pre);
    let dir = tempfile::tempdir().unwrap();
    let embed = Embeddings {
        tokens: Tensor::eye_m(v, d, (DType::Float, Device::Cpu)),
        scale: 1.0,
        positions: Positions::None,
        token_type: None,
        norm: None,
    };
    let model = common::hand_built(dir.path(), &WORDS, embed, vec![layer], Kind::Dec, Family::Gpt2);
    let corpus = dir.path().join("c.txt");
    std::fs::write(&corpus, "a b a b a b a b a b\na b a b a b\n").unwrap();
    let data = Dataset::corpus(&corpus).unwrap();
    let opts = Options::new(vec![Stat::Confidence, Stat::Positional], vec![Kind::Dec], corpus.clone());
    let r = analyze(&model, &data, &opts, None, &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
    let k = r.kind(Kind::Dec).unwrap();
    let pos = k.positional.as_ref().unwrap();
    println!(
        "positional: head 0 {:?}, head 1 {:?}",
        (pos[0][0].offset, pos[0][0].fraction),
        (pos[0][1].offset, pos[0][1].fraction)
    );
    assert_eq!((pos[0][0].offset, pos[0][0].fraction), (-1, 1.0), "head 0 copies the previous token");
    assert_ne!((pos[0][1].offset, pos[0][1].fraction), (-1, 1.0), "head 1 reads its own token, not the one before");
    assert_eq!(k.queries, 16, "every word is a query");
}
