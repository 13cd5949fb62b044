//! Hybrid stacks (issue 49): attention layers beside other token mixers, against transformers.
//! LFM2's gated short convolutions (`tests/fixtures/make_tiny_hf_hybrid.py`,
//! `golden_hybrid.npz`): token ids, logits and the attention layers' patterns within the float32
//! bound, the conv layer's hook points equal to transformers' values at its projections, greedy
//! continuations token for token (transformers' over its hybrid cache, headscope's over its
//! keys/values and conv states, and headscope's without a cache), and in float64 the logits,
//! patterns and the gates closing heads of the attention layers within 1e-5.

use crate::common;
use crate::common::max_diff;

use headscope::model::hooks::Point;
use headscope::model::nn::Gates;
use headscope::model::{Kind, Model};
use std::collections::HashMap;
use tch::Tensor;

/// Heads closed per attention layer in `{name}_masked64_0` (make_tiny_hf_hybrid.py's MASK).
const MASK: [[f64; 4]; 2] = [[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]];

fn golden() -> HashMap<String, Tensor> {
    common::golden("tiny_hf/golden_hybrid.npz")
}

/// Logits `[T, V]`, the attention layers' patterns `[L_attn, H, T, T]` and every recorded
/// `(point, value)` of one sentence.
fn forward(
    m: &Model,
    ids: &[i64],
    gates: &Gates,
    points: &[Point],
) -> (Tensor, Tensor, Vec<(headscope::model::hooks::At, Tensor)>) {
    let t = Tensor::from_slice(ids).view([1, ids.len() as i64]);
    let mask = Tensor::ones([1, ids.len() as i64], (tch::Kind::Float, tch::Device::Cpu));
    let _g = tch::no_grad_guard();
    let (seen, h) = common::recorded(points, |r| m.net.encode(&t, &mask, gates, Some(r)).unwrap());
    let attn: Vec<Tensor> = common::at_point(&seen, Point::Pattern).iter().map(|a| a.get(0)).collect();
    let logits = m.net.logits(&h).unwrap().get(0);
    (logits, Tensor::stack(&attn, 0), seen)
}

/// The gates closing MASK's heads in the attention layers of `m` (conv layers' rows open).
fn mask_gates(m: &Model) -> Gates {
    let attention: Vec<usize> = (0..m.net.stack.len()).filter(|&l| m.net.stack[l].attention().is_some()).collect();
    let mut g = vec![1f64; m.net.stack.len() * 4];
    for (i, &l) in attention.iter().enumerate() {
        g[l * 4..l * 4 + 4].copy_from_slice(&MASK[i]);
    }
    Gates { dec: Some(Tensor::from_slice(&g).view([1, m.net.stack.len() as i64, 4])), ..Gates::none() }
}

fn check(name: &str) {
    check_dir(name, name);
}

/// [`check`] of the checkpoint in `tiny_hf/{dir}` against `name`'s goldens (a GGUF twin).
fn check_dir(name: &str, dir: &str) {
    let g = golden();
    let m = common::tiny_hf(dir, "f32");
    let kinds = m.kinds();
    assert_eq!((kinds.len(), kinds[0].kind, kinds[0].n_layers, kinds[0].n_heads), (1, Kind::Dec, 4, 4), "{name}");
    let conv_layers: Vec<usize> = (0..4).filter(|&l| m.net.stack[l].mixer().kind() == "shortconv").collect();
    assert_eq!(conv_layers.len(), 2, "{name}: two conv layers");
    let n = g.keys().filter(|k| k.starts_with(&format!("{name}_ids_"))).count();
    assert!(n >= 20, "{name}: {n} sentences");
    let texts = common::short_pud_sentences(n);
    let (mut worst_logit, mut worst_attn) = (0f64, 0f64);
    for (i, text) in texts.iter().enumerate() {
        let want_ids = Vec::<i64>::try_from(&g[&format!("{name}_ids_{i}")]).unwrap();
        let ids = m.tokenize(text).unwrap().ids;
        assert_eq!(ids, want_ids, "{name}: token ids of sentence {i}");
        if let Some(logits) = g.get(&format!("{name}_logits_{i}")) {
            let points = [Point::Pattern, Point::ConvB, Point::ConvC, Point::ConvX, Point::ConvY];
            let (l, a, seen) = forward(&m, &ids, &Gates::none(), &points);
            let depth = common::depth(&m, ids.len());
            worst_logit = worst_logit.max(max_diff(&l, logits) / common::f32_bound(common::scale(logits), depth));
            worst_attn = worst_attn.max(max_diff(&a, &g[&format!("{name}_attn_{i}")]) / common::f32_bound(1.0, depth));
            // The patterns come from the attention layers alone.
            let at: Vec<usize> = seen.iter().filter(|(a, _)| a.point == Point::Pattern).map(|(a, _)| a.layer).collect();
            assert!(at.iter().all(|l| !conv_layers.contains(l)) && at.len() == 2, "{name}: patterns at {at:?}");
            if i == 0 {
                let first = conv_layers[0];
                let one = |p: Point| {
                    seen.iter().find(|(a, _)| a.point == p && a.layer == first).map(|(_, t)| t.get(0)).unwrap()
                };
                let bcx = Tensor::cat(&[one(Point::ConvB), one(Point::ConvC), one(Point::ConvX)], -1);
                let want = &g[&format!("{name}_conv_bcx_0")];
                let d = max_diff(&bcx, want) / common::f32_bound(common::scale(want), depth);
                assert!(d <= 1.0, "{name}: conv.hook_b|c|x differ from in_proj's output by {d:.3} of the bound");
                let want = &g[&format!("{name}_conv_y_0")];
                let d = max_diff(&one(Point::ConvY), want) / common::f32_bound(common::scale(want), depth);
                assert!(d <= 1.0, "{name}: conv.hook_y differs from out_proj's input by {d:.3} of the bound");
            }
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
    println!("{name}: {n} sentences, logits {worst_logit:.3}, attention {worst_attn:.3} of the float32 bound");
    assert!(worst_logit <= 1.0 && worst_attn <= 1.0, "{name}: logits {worst_logit:.3}, attention {worst_attn:.3}");

    // float64 against transformers in float64: logits, patterns, and heads closed by the gates.
    let m = common::tiny_hf(dir, "f64");
    let ids = m.tokenize(&texts[0]).unwrap().ids;
    let (l, a, _) = forward(&m, &ids, &Gates::none(), &[Point::Pattern]);
    let (dl, da) = (max_diff(&l, &g[&format!("{name}_logits64_0")]), max_diff(&a, &g[&format!("{name}_attn64_0")]));
    let (lm, _, _) = forward(&m, &ids, &mask_gates(&m), &[Point::Pattern]);
    let dm = max_diff(&lm, &g[&format!("{name}_masked64_0")]);
    let moved = max_diff(&lm, &l);
    println!("{name} in float64: logits {dl:.2e}, attention {da:.2e}, heads closed {dm:.2e} (closing moved the logits {moved:.2e})");
    assert!(dl < 1e-5 && da < 1e-5 && dm < 1e-5, "{name} in float64: logits {dl:e}, attention {da:e}, gated {dm:e}");
    assert!(moved > 1e-3, "{name}: closing heads changed nothing ({moved:e})");
}

#[test]
fn lfm2_equals_transformers() {
    check("lfm2");
}

/// LFM2 as llama.cpp writes it in GGUF (`tests/fixtures/make_tiny_gguf_hybrid.py`: the layer
/// kinds in the per-layer `head_count_kv`, the squeezed convolution, the final norm as
/// `token_embd_norm`) gives its HF twin's goldens, float64 included, and counts its parameters.
#[test]
fn lfm2_gguf_equals_its_hf_twin() {
    check_dir("lfm2", "lfm2_gguf");
    let (hf, gguf) = (common::tiny_hf("lfm2", "f32"), common::tiny_hf("lfm2_gguf", "f32"));
    assert_eq!(gguf.n_params, hf.n_params);
    assert_eq!(gguf.family_name(), "lfm2 (gguf)");
    let kinds: Vec<&str> = (0..4).map(|l| gguf.net.stack[l].mixer().kind()).collect();
    assert_eq!(kinds, ["shortconv", "attention", "shortconv", "attention"]);
}

#[test]
fn lfm2_with_conv_biases_equals_transformers() {
    check("lfm2_bias");
}

/// A conv layer lists its own hook points and none of attention's; a gate on its (empty) row
/// changes nothing; the key/value accounting counts a constant state for it.
#[test]
fn a_conv_layer_has_its_own_hook_points_and_no_heads() {
    let m = common::tiny_hf("lfm2", "f32");
    let names: Vec<String> = m.hook_points().iter().map(|a| a.to_string()).collect();
    for want in [
        "dec.blocks.0.conv.hook_bx",
        "dec.blocks.0.conv.hook_y",
        "dec.blocks.0.hook_attn_out",
        "dec.blocks.1.attn.hook_pattern",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    assert!(!names.iter().any(|n| n.starts_with("dec.blocks.0.attn.")), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("dec.blocks.1.conv.")), "{names:?}");
    assert_eq!(m.net.stack[0].mixer().width(), 0);
    assert_eq!(m.net.stack[1].mixer().width(), 4);
    // Closing every "head" of conv layer 0's row changes nothing.
    let ids = m.tokenize("The quick brown fox").unwrap().ids;
    let (l, _, _) = forward(&m, &ids, &Gates::none(), &[]);
    let mut g = vec![1f32; 16];
    g[..4].fill(0.0);
    let gates = Gates { dec: Some(Tensor::from_slice(&g).view([1, 4, 4])), ..Gates::none() };
    let (lg, _, _) = forward(&m, &ids, &gates, &[]);
    assert_eq!(max_diff(&l, &lg), 0.0);
}

/// The key/value accounting of a hybrid: the attention layers' caches grow with the context
/// (2 layers x 2 key/value groups x a key and a value of 8 numbers per position), the conv
/// layers' states do not (2 layers x `d_model` 32 x `K - 1` = 2 inputs), counted by hand.
#[test]
fn a_hybrid_counts_growing_caches_and_constant_conv_states() {
    let v = headscope::model::view::View::new(common::tiny_hf("lfm2", "f32"));
    for context in [1i64, 100, 1000] {
        let c = headscope::analysis::streaming::kv_cost(&v, context, None);
        let attention = 2 * 2 * context * (2 * 8) * 4;
        let conv = 2 * 32 * 2 * 4;
        assert_eq!(c.bytes, attention + conv, "context {context}");
        assert_eq!(c.full_bytes, c.bytes);
        assert_eq!((c.groups, c.entries), (2 * 2 + 2, 2 * 2 * context + 2), "context {context}");
    }
}

/// The cache a generation leaves holds what the accounting counts: the attention layers' keys
/// and values of every cached position and the conv layers' last inputs.
#[test]
fn a_hybrid_generation_holds_what_is_counted() {
    let m = common::tiny_hf("lfm2", "f32");
    let (gen, cache) = m.generate_run("the cat and the dog sat on the mat", 8, &Gates::none(), true).unwrap();
    assert!(!gen.is_empty());
    let conv: Vec<i64> = cache
        .carries
        .iter()
        .filter_map(|c| match c {
            headscope::model::mixer::Carry::State(s) => Some(s.size().iter().product::<i64>()),
            _ => None,
        })
        .collect();
    assert_eq!(conv, vec![32 * 2, 32 * 2], "two conv layers carry [1, d_model, K - 1]");
    let v = headscope::model::view::View::new(m);
    assert_eq!(cache.bytes(), headscope::analysis::streaming::kv_cost(&v, cache.len, None).bytes);
}
