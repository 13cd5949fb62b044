//! Gated DeltaNet layers beside gated attention (issue 49): Qwen3-Next (`qwen3_next`) against
//! transformers (`tests/fixtures/make_tiny_hf_deltanet.py`, `golden_deltanet.npz`): token ids,
//! logits and the attention layers' patterns within the float32 bound, heads closed (DeltaNet and
//! attention heads by one gate grid) as transformers' pre-hooks on the output projections close
//! them, parameter counts, greedy continuations token for token (transformers' over its hybrid
//! cache, headscope's over its keys/values, convolution and recurrent states, and without a
//! cache); in float64 the logits, the heads closed, and each DeltaNet head's effective attention
//! (`delta.hook_alpha`) against the generator's numpy computation by its definition (products of
//! the delta rule's transition matrices). Then a hand-built DeltaNet head whose recurrence reads
//! the previous token, found by the positional statistic at offset -1 with fraction 1.0.

use crate::common;
use crate::common::max_diff;

use headscope::analysis::analyze;
use headscope::analysis::options::{Options, Stat};
use headscope::data::Dataset;
use headscope::model::deltanet::{DeltaNet, Shape};
use headscope::model::hooks::{At, Hooks, Point};
use headscope::model::nn::{Activation, Ffn, Gates, Linear, Norm, NormKind, NormPosition};
use headscope::model::transformer::{Embeddings, Positions, StackLayer};
use headscope::model::{Family, Kind, Model, ModelError};
use std::collections::HashMap;
use tch::{Device, Kind as DType, Tensor};

/// Heads closed per layer in `{name}_masked*_0` (make_tiny_hf_deltanet.py's MASK; 1 = open).
fn mask(name: &str) -> Vec<Vec<f64>> {
    let rows: &[&[f64]] = if name == "qwen3_next" {
        &[&[1., 0., 1., 1.], &[1., 0., 1., 1.], &[0., 1., 1., 0.], &[1., 1., 0., 1.]]
    } else {
        &[&[0., 1., 1., 1.], &[1., 1., 1., 0.], &[1., 0., 1., 1.], &[1., 1., 1., 0.]]
    };
    rows.iter().map(|r| r.to_vec()).collect()
}

fn golden() -> HashMap<String, Tensor> {
    common::golden("tiny_hf/golden_deltanet.npz")
}

/// Logits `[T, V]` of one sentence under `gates`, and every recorded `(point, value)`.
fn forward(m: &Model, ids: &[i64], gates: &Gates, points: &[Point]) -> (Tensor, Vec<(At, Tensor)>) {
    let t = Tensor::from_slice(ids).view([1, ids.len() as i64]);
    let mask = Tensor::ones([1, ids.len() as i64], (DType::Float, Device::Cpu));
    let _g = tch::no_grad_guard();
    let (seen, h) = common::recorded(points, |r| m.net.encode(&t, &mask, gates, Some(r)).unwrap());
    (m.net.logits(&h).unwrap().get(0), seen)
}

/// The gates of MASK (every layer 4 heads wide).
fn mask_gates(name: &str) -> Gates {
    let g: Vec<f64> = mask(name).concat();
    Gates { dec: Some(Tensor::from_slice(&g).view([1, 4, 4])), ..Gates::none() }
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
    assert_eq!((kinds.len(), kinds[0].kind, kinds[0].n_layers, kinds[0].n_heads), (1, Kind::Dec, 4, 4), "{name}");
    let mixers: Vec<&str> = m.net.stack.iter().map(|l| l.mixer().kind()).collect();
    let linear: Vec<usize> = (0..4).filter(|&l| mixers[l] == "deltanet").collect();
    let attn: Vec<usize> = (0..4).filter(|&l| mixers[l] == "attention").collect();
    assert_eq!((linear.len(), attn.len()), (2, 2), "{name}: {mixers:?}");
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
        assert_eq!(
            gen, want_gen,
            "{name}: greedy continuation of sentence {i} over the hybrid cache (states and keys/values)"
        );
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
    let (l, seen) = forward(&m, &ids, &Gates::none(), &[Point::DeltaAlpha, Point::Pattern]);
    let dl = max_diff(&l, &g[&format!("{name}_logits64_0")]);
    let alpha = stacked(&seen, Point::DeltaAlpha, &linear);
    let want = &g[&format!("{name}_alpha64_0")];
    let da = max_diff(&alpha, want);
    let (lm, _) = forward(&m, &ids, &mask_gates(name), &[]);
    let dm = max_diff(&lm, &g[&format!("{name}_masked64_0")]);
    let moved = max_diff(&lm, &l);
    println!(
        "{name} in float64: logits {dl:.2e}, heads closed {dm:.2e} (closing moved the logits {moved:.2e}), effective attention {da:.2e} (largest {:.2e})",
        want.abs().max().double_value(&[])
    );
    // transformers widened to float64 throughout: the same function to rounding.
    assert!(dl < 1e-10 && dm < 1e-10, "{name} in float64: logits {dl:e}, heads closed {dm:e}");
    assert!(da < 1e-12, "{name}: effective attention differs from numpy's by {da:e}");
    assert!(moved > 1e-3, "{name}: closing heads changed nothing ({moved:e})");
    // The pattern a DeltaNet layer shows: |alpha| by row, each row summing to 1.
    let shown = stacked(&seen, Point::Pattern, &linear);
    let by_row = alpha.abs() / alpha.abs().sum_dim_intlist([-1i64].as_slice(), true, None::<DType>);
    assert!(max_diff(&shown, &by_row) < 1e-12, "{name}: the pattern is not |alpha| by row");
    let sums = shown.sum_dim_intlist([-1i64].as_slice(), false, None::<DType>);
    assert!(max_diff(&sums, &sums.ones_like()) < 1e-12, "{name}: rows of the shown pattern");
}

#[test]
fn qwen3_next_equals_transformers() {
    check("qwen3_next");
}

#[test]
fn qwen3_next_with_experts_equals_transformers() {
    check("qwen3_next_moe");
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

/// A DeltaNet layer's hook points are its own; its effective attention is read and written at
/// `delta.hook_alpha` (zero it and the heads' outputs are zero); its shown pattern refuses a
/// write, naming the point to write instead. A gated attention layer's output gate is a hook
/// point, and a head its gate silences shows it at `hook_z`.
#[test]
fn a_deltanet_layer_has_its_own_hook_points_and_gated_attention_its_gate() {
    let m = common::tiny_hf("qwen3_next", "f64");
    let names: Vec<String> = m.hook_points().iter().map(|a| a.to_string()).collect();
    for want in [
        "dec.blocks.0.delta.hook_alpha",
        "dec.blocks.0.delta.hook_beta",
        "dec.blocks.0.delta.hook_g",
        "dec.blocks.0.attn.hook_pattern",
        "dec.blocks.0.attn.hook_z",
        "dec.blocks.1.attn.hook_q",
        "dec.blocks.1.attn.hook_out_gate",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    assert!(
        !names.iter().any(|n| n == "dec.blocks.0.attn.hook_q" || n == "dec.blocks.0.attn.hook_out_gate"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.starts_with("dec.blocks.1.delta.")), "{names:?}");
    let ids = m.tokenize("the cat sat on the mat and the dog sat too").unwrap().ids;
    let t = Tensor::from_slice(&ids).view([1, ids.len() as i64]);
    let mask = t.ones_like().to_kind(DType::Float);
    let _g = tch::no_grad_guard();
    let mut r = Replace {
        at: At::new(Kind::Dec, 0, Point::DeltaAlpha),
        with: |a: &Tensor| a.zeros_like(),
        seen: vec![],
        record: vec![Point::DeltaY],
    };
    let _ = m.net.encode(&t, &mask, &Gates::none(), Some(&mut r)).unwrap();
    let y = r.seen.iter().find(|(a, _)| a.point == Point::DeltaY && a.layer == 0).unwrap().1.shallow_clone();
    assert_eq!(y.abs().max().double_value(&[]), 0.0, "alpha zeroed leaves y = 0");
    let mut w = Replace {
        at: At::new(Kind::Dec, 2, Point::Pattern),
        with: |a: &Tensor| a.zeros_like(),
        seen: vec![],
        record: vec![],
    };
    let err = m.net.encode(&t, &mask, &Gates::none(), Some(&mut w)).unwrap_err().to_string();
    assert!(err.contains("read only") && err.contains("delta.hook_alpha") && err.contains("layer 2"), "{err}");
    // Head 1 of attention layer 1 silenced by its output gate: its slice of hook_z is zero, the
    // others' are not.
    let mut s = Replace {
        at: At::new(Kind::Dec, 1, Point::OutGate),
        with: |g: &Tensor| {
            let g = g.copy();
            let _ = g.narrow(1, 1, 1).fill_(0.0);
            g
        },
        seen: vec![],
        record: vec![Point::Z],
    };
    let _ = m.net.encode(&t, &mask, &Gates::none(), Some(&mut s)).unwrap();
    let z = s.seen.iter().find(|(a, _)| a.point == Point::Z && a.layer == 1).unwrap().1.shallow_clone();
    let per_head = z.abs().sum_dim_intlist([0i64, 2, 3].as_slice(), false, None::<DType>);
    let v = Vec::<f64>::try_from(&per_head).unwrap();
    assert!(v[1] == 0.0 && v.iter().enumerate().all(|(h, &x)| h == 1 || x > 0.0), "{v:?}");
}

/// The key/value accounting of Qwen3-Next: attention layers grow (2 layers x 2 key/value groups
/// x a key and a value of 8 numbers per position), each DeltaNet head holds its state
/// `[dk, dv]` = 8 x 8 and each DeltaNet layer its convolution's last 3 inputs of
/// `2 Hk dk + H dv` = 64 channels, whatever the context; a generation's cache holds exactly that.
#[test]
fn a_deltanet_hybrid_counts_its_states_and_its_generation_holds_them() {
    let m = common::tiny_hf("qwen3_next", "f32");
    let (gen, cache) = m.generate_run("the cat and the dog sat on the mat", 8, &Gates::none(), true).unwrap();
    assert!(!gen.is_empty());
    let v = headscope::model::view::View::new(m);
    for context in [1i64, 100, 1000] {
        let c = headscope::analysis::streaming::kv_cost(&v, context, None);
        let attention = 2 * 2 * context * (2 * 8) * 4;
        let delta = 2 * (4 * 8 * 8 + 64 * 3) * 4;
        assert_eq!(c.bytes, attention + delta, "context {context}");
        assert_eq!((c.groups, c.entries), (2 * 2 + 2 * 4, 2 * 2 * context + 2 * 4), "context {context}");
    }
    assert_eq!(cache.bytes(), headscope::analysis::streaming::kv_cost(&v, cache.len, None).bytes);
}

/// A hand-built gated DeltaNet layer over one-hot tokens, two heads on two key heads (a 1-tap
/// convolution, so queries and keys at a position are its token's; beta near 1): every token's
/// key is its own direction (`a` e0; `b` and [CLS] e1); head 0's query of each word is the key
/// of the word before it in "a b a b ...", head 1's its own key. The delta rule erases a key's
/// direction when the same key is written again, and the decay `exp(g) = e^-3` per step fades
/// the rest, so head 0's effective attention of each word is largest on the token before it.
/// The positional statistic finds head 0 at offset -1 with fraction 1.0.
#[test]
fn a_deltanet_head_that_reads_the_previous_token_is_positional_at_minus_one() {
    const WORDS: [&str; 2] = ["a", "b"];
    let (v, d) = (6i64, 8i64); // [PAD] [CLS] [SEP] [UNK] a b
    let (cls, a, b) = (1i64, 4i64, 5i64);
    let shape = Shape { heads: 2, key_heads: 2, key_dim: 2, head_dim: 2 };
    let cpu = (DType::Float, Device::Cpu);
    // Per key head 8 rows: q (2), k (2), v (2), z (2).
    let w = Tensor::zeros([16, d], cpu);
    let set = |w: &Tensor, row: i64, col: i64, x: f64| {
        let _ = w.get(row).get(col).fill_(x);
    };
    for kh in 0..2 {
        let base = kh * 8;
        set(&w, base + 2, a, 5.0); // a's key: e0
        set(&w, base + 3, b, 5.0); // b's and [CLS]'s key: e1
        set(&w, base + 3, cls, 5.0);
        for tok in [cls, a, b] {
            set(&w, base + 4, tok, 1.0); // values (they do not matter to alpha)
        }
    }
    set(&w, 1, a, 5.0); // head 0: a's query is e1 (b's key, the word before it)
    set(&w, 0, b, 5.0); // b's query is e0 (a's key)
    set(&w, 8, a, 5.0); // head 1: each word's query is its own key
    set(&w, 9, b, 5.0);
    // Per key head [b, a]: b large (beta near 1), a zero.
    let ba = Tensor::zeros([4, d], cpu);
    for kh in 0..2 {
        for tok in [cls, a, b] {
            set(&ba, kh * 2, tok, 20.0);
        }
    }
    let delta = DeltaNet {
        shape,
        in_qkvz: Linear { w, b: None },
        in_ba: Linear { w: ba, b: None },
        conv: Tensor::ones([shape.conv_channels(), 1, 1], cpu),
        dt_bias: Tensor::from_slice(&[(1f64.exp() - 1.0).ln() as f32; 2]),
        a_log: Tensor::from_slice(&[3f32.ln(); 2]),
        norm: Tensor::ones([2], cpu),
        eps: 1e-6,
        out_proj: Linear { w: Tensor::zeros([d, 4], cpu), b: None },
    };
    let ffn = Ffn {
        gate: None,
        up: Linear { w: Tensor::zeros([4, d], cpu), b: None },
        down: Linear { w: Tensor::zeros([d, 4], cpu), b: None },
        act: Activation::Gelu,
    };
    // RMS norms of unit weight keep a one-hot token one-hot (scaled).
    let rms = || Norm { kind: NormKind::Rms, weight: Tensor::ones([d], cpu), bias: None, eps: 1e-6 };
    let layer = StackLayer::new(delta, rms(), ffn, rms(), NormPosition::Pre);
    let dir = tempfile::tempdir().unwrap();
    let embed = Embeddings {
        tokens: Tensor::eye_m(v, d, cpu),
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
    assert_eq!((pos[0][0].offset, pos[0][0].fraction), (-1, 1.0), "head 0 reads the previous token");
    assert_eq!((pos[0][1].offset, pos[0][1].fraction), (0, 1.0), "head 1 reads its own token");
    assert_eq!(k.queries, 16, "every word is a query");
}
