//! Mamba layers beside attention (issue 49): Jamba (`jamba`) against transformers
//! (`tests/fixtures/make_tiny_hf_jamba.py`, `golden_jamba.npz`): token ids, logits and the
//! attention layers' patterns within the float32 bound, channel groups and heads closed by one
//! gate grid as transformers' pre-hooks on the output projections close them, parameter counts,
//! greedy continuations token for token (with and without headscope's cache of keys/values,
//! convolution and SSM states); in float64 the logits, the groups closed, and each channel
//! group's effective attention (`ssm.hook_alpha`, its channels' mean) and shown pattern (its
//! channels' `|alpha|` by row, averaged) against the generator's numpy computation by the
//! definition.

use crate::common;
use crate::common::max_diff;

use headscope::model::hooks::{At, Hooks, Point};
use headscope::model::nn::Gates;
use headscope::model::{Kind, Model, ModelError};
use std::collections::HashMap;
use tch::{Device, Kind as DType, Tensor};

/// Heads closed per layer in `{name}_masked*_0` (make_tiny_hf_jamba.py's MASK; 1 = open).
fn mask(name: &str) -> Vec<Vec<f64>> {
    let rows: &[&[f64]] = if name == "jamba" {
        &[&[1., 0., 1., 1.], &[1., 0., 1., 1.], &[0., 1., 1., 0.], &[1., 1., 0., 1.]]
    } else {
        &[&[0., 1., 1., 1.], &[1., 1., 1., 0.], &[1., 0., 1., 1.], &[0., 1., 1., 1.]]
    };
    rows.iter().map(|r| r.to_vec()).collect()
}

fn golden() -> HashMap<String, Tensor> {
    common::golden("tiny_hf/golden_jamba.npz")
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
    let linear: Vec<usize> = (0..4).filter(|&l| mixers[l] == "mamba").collect();
    let attn: Vec<usize> = (0..4).filter(|&l| mixers[l] == "attention").collect();
    assert_eq!(linear.len() + attn.len(), 4, "{name}: {mixers:?}");
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
    let (l, seen) = forward(&m, &ids, &Gates::none(), &[Point::SsmAlpha, Point::Pattern]);
    let dl = max_diff(&l, &g[&format!("{name}_logits64_0")]);
    let alpha = stacked(&seen, Point::SsmAlpha, &linear);
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
    // The pattern a Mamba layer shows: its channels' |alpha| by row, averaged over the group.
    let shown = stacked(&seen, Point::Pattern, &linear);
    let ds = max_diff(&shown, &g[&format!("{name}_shown64_0")]);
    assert!(ds < 1e-12, "{name}: the shown pattern differs from numpy's by {ds:e}");
    let sums = shown.sum_dim_intlist([-1i64].as_slice(), false, None::<DType>);
    assert!(max_diff(&sums, &sums.ones_like()) < 1e-12, "{name}: rows of the shown pattern");
}

#[test]
fn jamba_equals_transformers() {
    check("jamba");
}

#[test]
fn jamba_with_experts_equals_transformers() {
    check("jamba_moe");
}

/// Records values and replaces one.
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

/// A Mamba layer's hook points are the state-space ones; its effective attention and shown
/// pattern are read only (a write is refused naming what to write instead); a write to its
/// step sizes changes the output.
#[test]
fn a_mamba_layer_has_read_only_effective_attention_and_writable_inputs() {
    let m = common::tiny_hf("jamba", "f64");
    let names: Vec<String> = m.hook_points().iter().map(|a| a.to_string()).collect();
    for want in [
        "dec.blocks.0.ssm.hook_alpha",
        "dec.blocks.0.ssm.hook_dt",
        "dec.blocks.0.attn.hook_z",
        "dec.blocks.1.attn.hook_q",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    assert!(!names.iter().any(|n| n == "dec.blocks.0.attn.hook_q"), "{names:?}");
    let ids = m.tokenize("the cat sat on the mat and the dog sat too").unwrap().ids;
    let t = Tensor::from_slice(&ids).view([1, ids.len() as i64]);
    let mask = t.ones_like().to_kind(DType::Float);
    let _g = tch::no_grad_guard();
    for p in [Point::SsmAlpha, Point::Pattern] {
        let mut w =
            Replace { at: At::new(Kind::Dec, 2, p), with: |a: &Tensor| a.zeros_like(), seen: vec![], record: vec![] };
        let err = m.net.encode(&t, &mask, &Gates::none(), Some(&mut w)).unwrap_err().to_string();
        assert!(err.contains("read only") && err.contains("layer 2") && err.contains("Mamba"), "{err}");
    }
    let base = m.net.encode(&t, &mask, &Gates::none(), None).unwrap();
    let mut w =
        Replace { at: At::new(Kind::Dec, 0, Point::SsmDt), with: |a: &Tensor| a * 2.0, seen: vec![], record: vec![] };
    let changed = m.net.encode(&t, &mask, &Gates::none(), Some(&mut w)).unwrap();
    assert!(max_diff(&base, &changed) > 1e-6, "a write to ssm.hook_dt changes the output");
}

/// The key/value accounting of Jamba: attention layers grow (2 layers x 2 key/value groups x a
/// key and a value of 8 numbers per position), each Mamba channel group holds its channels'
/// states `16 x 4` and each Mamba layer its convolution's last 3 inputs of 64 channels; a
/// generation's cache holds exactly that.
#[test]
fn a_mamba_hybrid_counts_its_states_and_its_generation_holds_them() {
    let m = common::tiny_hf("jamba", "f32");
    let (gen, cache) = m.generate_run("the cat and the dog sat on the mat", 8, &Gates::none(), true).unwrap();
    assert!(!gen.is_empty());
    let v = headscope::model::view::View::new(m);
    for context in [1i64, 100, 1000] {
        let c = headscope::analysis::streaming::kv_cost(&v, context, None);
        let attention = 2 * 2 * context * (2 * 8) * 4;
        let mamba = 2 * (4 * 16 * 4 + 64 * 3) * 4;
        assert_eq!(c.bytes, attention + mamba, "context {context}");
        assert_eq!((c.groups, c.entries), (2 * 2 + 2 * 4, 2 * 2 * context + 2 * 4), "context {context}");
    }
    assert_eq!(cache.bytes(), headscope::analysis::streaming::kv_cost(&v, cache.len, None).bytes);
}
