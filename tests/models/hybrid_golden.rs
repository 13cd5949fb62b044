//! The comparison every hybrid family's tiny checkpoints share (issue 49; `mamba2.rs`,
//! `deltanet.rs`, `jamba.rs`): a generator's golden file (`make_tiny_hf_{mamba2,deltanet,
//! jamba}.py`) holds per model token ids, greedy continuations, float32 logits and attention
//! patterns, logits with MASK's heads closed, the parameter count, and a float64 run's logits,
//! closed logits and each non-attention layer's effective attention. [`check`] compares them
//! all and hands the float64 run's recorded values back for the family's own pattern check.

use crate::common;
use crate::common::max_diff;

use headscope::model::hooks::{At, Hooks, Point};
use headscope::model::nn::Gates;
use headscope::model::{Kind, Model, ModelError};
use std::collections::HashMap;
use tch::{Device, Kind as DType, Tensor};

/// One tiny hybrid checkpoint and what its generator wrote.
pub struct Case<'a> {
    /// The checkpoint under `tests/fixtures/tiny_hf`, its keys' prefix in the golden file.
    pub name: &'a str,
    pub golden: &'a HashMap<String, Tensor>,
    /// The layers' mixer kind besides attention (`mamba2`, `deltanet`, `mamba`).
    pub mixer: &'a str,
    /// Where that kind's effective attention is recorded.
    pub alpha: Point,
    /// The widest layer's heads (the grid's width).
    pub width: usize,
    /// Heads closed per layer in `{name}_masked*_0` (the generator's MASK; 1 = open; a row
    /// narrower than `width` leaves the rest open).
    pub mask: &'a [&'a [f64]],
    /// A GGUF twin under `tests/fixtures/tiny_hf` read in place of `name` against `name`'s
    /// goldens. Its float64 run is held to 1e-5 (logits) and 1e-6 (effective attention), not
    /// to rounding: GGUF stores `-exp(A_log)` in float32, not `A_log`.
    pub twin: Option<&'a str>,
}

/// What the float64 run recorded, for the family's own checks.
pub struct Float64Run {
    pub seen: Vec<(At, Tensor)>,
    /// The layers of the non-attention kind.
    pub layers: Vec<usize>,
    /// Their effective attention, stacked `[L, H, T, T]`.
    pub alpha: Tensor,
}

/// Logits `[T, V]` of one sentence under `gates`, and every recorded `(point, value)`.
pub fn forward(m: &Model, ids: &[i64], gates: &Gates, points: &[Point]) -> (Tensor, Vec<(At, Tensor)>) {
    let t = Tensor::from_slice(ids).view([1, ids.len() as i64]);
    let mask = Tensor::ones([1, ids.len() as i64], (DType::Float, Device::Cpu));
    let _g = tch::no_grad_guard();
    let (seen, h) = common::recorded(points, |r| m.net.encode(&t, &mask, gates, Some(r)).unwrap());
    (m.net.logits(&h).unwrap().get(0), seen)
}

/// The recorded values of `point` at `layers`, batch row 0, stacked.
pub fn stacked(seen: &[(At, Tensor)], point: Point, layers: &[usize]) -> Tensor {
    let v: Vec<Tensor> =
        seen.iter().filter(|(a, _)| a.point == point && layers.contains(&a.layer)).map(|(_, t)| t.get(0)).collect();
    assert_eq!(v.len(), layers.len(), "{point:?} at {layers:?}");
    Tensor::stack(&v, 0)
}

impl Case<'_> {
    /// The gates of the mask over the grid (a narrower layer's heads are its first columns).
    fn gates(&self) -> Gates {
        let n = self.mask.len();
        let mut g = vec![1f64; n * self.width];
        for (l, row) in self.mask.iter().enumerate() {
            g[l * self.width..l * self.width + row.len()].copy_from_slice(row);
        }
        Gates { dec: Some(Tensor::from_slice(&g).view([1, n as i64, self.width as i64])), ..Gates::none() }
    }
}

/// Token ids, logits and the attention layers' patterns within the float32 bound, heads closed
/// as transformers' pre-hooks on the output projections close them, parameter counts, greedy
/// continuations token for token (over headscope's cache and without one); in float64 the
/// logits and closed logits to rounding and the effective attention within 1e-12 of the
/// generator's numpy computation by its definition.
pub fn check(c: &Case) -> Float64Run {
    let (name, g) = (c.name, c.golden);
    let dir = c.twin.unwrap_or(name);
    let m = common::tiny_hf(dir, "f32");
    let kinds = m.kinds();
    let n_layers = c.mask.len();
    assert_eq!(
        (kinds.len(), kinds[0].kind, kinds[0].n_layers, kinds[0].n_heads),
        (1, Kind::Dec, n_layers, c.width),
        "{name}"
    );
    let mixers: Vec<&str> = m.net.stack.iter().map(|l| l.mixer().kind()).collect();
    let layers: Vec<usize> = (0..n_layers).filter(|&l| mixers[l] == c.mixer).collect();
    let attn: Vec<usize> = (0..n_layers).filter(|&l| mixers[l] == "attention").collect();
    assert!(!layers.is_empty() && !attn.is_empty() && layers.len() + attn.len() == n_layers, "{name}: {mixers:?}");
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
            let (l, _) = forward(&m, &ids, &c.gates(), &[]);
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
        "{dir}: {n} sentences, logits {worst_logit:.3}, attention {worst_attn:.3}, heads closed {worst_mask:.3} of the float32 bound"
    );
    assert!(
        worst_logit <= 1.0 && worst_attn <= 1.0 && worst_mask <= 1.0,
        "{name}: logits {worst_logit:.3}, attention {worst_attn:.3}, heads closed {worst_mask:.3}"
    );

    // float64 against transformers in float64 (its float32 casts widened) and the effective
    // attention against numpy's by its definition.
    let m = common::tiny_hf(dir, "f64");
    let ids = m.tokenize(&texts[0]).unwrap().ids;
    let (l, seen) = forward(&m, &ids, &Gates::none(), &[c.alpha, Point::Pattern]);
    let dl = max_diff(&l, &g[&format!("{name}_logits64_0")]);
    let alpha = stacked(&seen, c.alpha, &layers);
    let want = &g[&format!("{name}_alpha64_0")];
    let da = max_diff(&alpha, want);
    let (lm, _) = forward(&m, &ids, &c.gates(), &[]);
    let dm = max_diff(&lm, &g[&format!("{name}_masked64_0")]);
    let moved = max_diff(&lm, &l);
    println!(
        "{dir} in float64: logits {dl:.2e}, heads closed {dm:.2e} (closing moved the logits {moved:.2e}), effective attention {da:.2e} (largest {:.2e})",
        want.abs().max().double_value(&[])
    );
    // transformers widened to float64 throughout: the same function to rounding.
    let (tl, ta) = if c.twin.is_some() { (1e-5, 1e-6) } else { (1e-10, 1e-12) };
    assert!(dl < tl && dm < tl, "{dir} in float64: logits {dl:e}, heads closed {dm:e}");
    assert!(da < ta, "{dir}: effective attention differs from numpy's by {da:e}");
    assert!(moved > 1e-3, "{name}: closing heads changed nothing ({moved:e})");
    Float64Run { seen, layers, alpha }
}

/// The pattern a Mamba-2 or DeltaNet layer shows: `|alpha|` by row, each row summing to 1.
pub fn shown_is_alpha_by_row(name: &str, run: &Float64Run) {
    let shown = stacked(&run.seen, Point::Pattern, &run.layers);
    let a = run.alpha.abs();
    let by_row = &a / a.sum_dim_intlist([-1i64].as_slice(), true, None::<DType>);
    assert!(max_diff(&shown, &by_row) < 1e-12, "{name}: the pattern is not |alpha| by row");
    rows_sum_to_one(name, &shown);
}

/// Each row of a shown pattern sums to 1.
pub fn rows_sum_to_one(name: &str, shown: &Tensor) {
    let sums = shown.sum_dim_intlist([-1i64].as_slice(), false, None::<DType>);
    assert!(max_diff(&sums, &sums.ones_like()) < 1e-12, "{name}: rows of the shown pattern");
}

/// Records values at `record` and replaces the one at `at` by `with(value)`.
pub struct Replace<F: FnMut(&Tensor) -> Tensor> {
    pub at: At,
    pub with: F,
    pub seen: Vec<(At, Tensor)>,
    pub record: Vec<Point>,
}

impl<F: FnMut(&Tensor) -> Tensor> Replace<F> {
    pub fn new(at: At, with: F, record: Vec<Point>) -> Replace<F> {
        Replace { at, with, seen: vec![], record }
    }

    /// The first value recorded at `point` of `layer`.
    pub fn one(&self, point: Point, layer: usize) -> Tensor {
        self.seen.iter().find(|(a, _)| a.point == point && a.layer == layer).unwrap().1.shallow_clone()
    }
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

/// One sentence as ids `[1, T]` and its mask, for a run with hooks.
pub fn sentence(m: &Model, text: &str) -> (Tensor, Tensor) {
    let ids = m.tokenize(text).unwrap().ids;
    let t = Tensor::from_slice(&ids).view([1, ids.len() as i64]);
    let mask = t.ones_like().to_kind(DType::Float);
    (t, mask)
}

/// The key/value accounting of a hybrid at contexts 1, 100 and 1000 against `bytes(context)`
/// and `(groups, entries(context))`, and a generation's cache holding exactly what `kv_cost`
/// counts.
pub fn counts_its_states(name: &str, bytes: impl Fn(i64) -> i64, groups: i64, entries: impl Fn(i64) -> i64) {
    let m = common::tiny_hf(name, "f32");
    let (gen, cache) = m.generate_run("the cat and the dog sat on the mat", 8, &Gates::none(), true).unwrap();
    assert!(!gen.is_empty());
    let v = headscope::model::view::View::new(m);
    for context in [1i64, 100, 1000] {
        let c = headscope::analysis::streaming::kv_cost(&v, context, None);
        assert_eq!(c.bytes, bytes(context), "{name}: context {context}");
        assert_eq!((c.groups, c.entries), (groups, entries(context)), "{name}: context {context}");
    }
    assert_eq!(cache.bytes(), headscope::analysis::streaming::kv_cost(&v, cache.len, None).bytes);
}
