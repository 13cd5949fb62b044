//! Attention weights tile by tile (`Hooks::tile_rows` / `Hooks::tile`,
//! docs/methods.md#score-tiles): a run that asks for tiles gets every layer's scores and weights
//! as blocks of at most the rows it asked for, in order, covering every query once; the blocks
//! put together are the whole run's `hook_attn_scores` and `hook_pattern`, a running statistic
//! over them equals the same statistic over the whole pattern, and the run's output is the
//! untiled run's, on an encoder with padding, causal stacks (one with soft-capped scores) and a
//! translation model's three kinds.

use crate::common;
use headscope::model::hooks::{At, Both, Hooks, Point, Tile};
use headscope::model::nn::Gates;
use headscope::model::transformer::Stop;
use headscope::model::{Kind, Model, ModelError};
use std::collections::BTreeMap;
use tch::{Kind as DType, Tensor};

/// Keeps every tile it is handed (a real consumer would keep running sums).
struct Tiles {
    rows: i64,
    got: BTreeMap<At, Vec<(i64, Tensor, Tensor)>>,
    /// Tiles that skipped keys the bias hides from all their rows.
    skipped: usize,
}

impl Hooks for Tiles {
    fn wants(&self, _at: At) -> bool {
        false
    }
    fn visit(&mut self, _at: At, _x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        Ok(None)
    }
    fn tile_rows(&self, at: At) -> Option<i64> {
        (at.point == Point::Pattern).then_some(self.rows)
    }
    fn tile(&mut self, at: At, tile: &Tile) -> Result<(), ModelError> {
        // Every key: the skipped ones at weight 0 (and at their bias as the score).
        let (scores, pattern) = (tile.full_scores()?.expect("scores"), tile.full_pattern()?);
        if !tile.is_whole() {
            self.skipped += 1;
        }
        self.got.entry(at).or_default().push((tile.q0, scores, pattern));
        Ok(())
    }
}

/// Two sentences of different lengths (the shorter padded) through the stack, and through a
/// translation model's decoder teacher-forced on fixed targets.
fn run(m: &Model, hooks: &mut dyn Hooks) -> Tensor {
    let _g = tch::no_grad_guard();
    let b = m.batch(&["The cat sat on the mat near the door.", "A dog."]).unwrap();
    let (ids, mask) = (&b.ids, &b.mask);
    let gates = Gates::none();
    let enc = m.net.encode(ids, mask, &gates, Some(&mut *hooks)).unwrap();
    if m.net.decoder.is_empty() {
        return enc;
    }
    let tgt = Tensor::from_slice(&[5i64, 9, 7, 3, 8, 6, 4, 2]).view([2, 4]);
    m.net.teacher(&enc, mask, &tgt, Stop::FinalNorm, &gates, Some(hooks)).unwrap()
}

#[test]
fn tiles_put_together_are_the_whole_pattern() {
    let mut models: Vec<(String, Model)> = ["llama", "gemma2", "gpt2", "marian", "t5"]
        .iter()
        .map(|n| (n.to_string(), common::tiny_hf(n, "f32")))
        .collect();
    models.push(("bert".into(), common::load(&common::fixtures().join("lrp_tiny/bert"), "f32")));
    for (name, m) in models {
        for l in 0..m.net.stack.len() {
            assert!(m.net.stack[l].mixer().hands_tiles(), "{name}: layer {l}");
        }
        let (seen, whole) = common::recorded(&[Point::Scores, Point::Pattern], |h| run(&m, h));
        let mut tiles = Tiles { rows: 3, got: BTreeMap::new(), skipped: 0 };
        let tiled = run(&m, &mut tiles);
        // Causal attention's tiles skip the later keys (a decoder-only stack, a translation
        // model's decoder); bert's encoder sees every key.
        let causal = m.net.causal || !m.net.decoder.is_empty();
        assert_eq!(tiles.skipped > 0, causal, "{name}: {} tiles skipped keys", tiles.skipped);
        // float32 rounding of separate row blocks, carried through the layers: the bound of
        // common::f32_bound over the model's accumulation depth (docs/testing.md).
        let depth = common::depth(&m, whole.size()[1] as usize);
        let bound = common::f32_bound(whole.abs().max().double_value(&[]), depth);
        let d = common::max_diff(&tiled, &whole);
        assert!(d <= bound, "{name}: the tiled run's output differs by {d:e} (bound {bound:e})");
        let patterns: Vec<&(At, Tensor)> = seen.iter().filter(|(a, _)| a.point == Point::Pattern).collect();
        assert!(!patterns.is_empty(), "{name}: no pattern recorded");
        // Every layer and kind the whole run has, and no other, handed tiles.
        let kinds_layers: Vec<At> = patterns.iter().map(|(a, _)| *a).collect();
        let tiled_at: Vec<At> = tiles.got.keys().copied().collect();
        let mut sorted = kinds_layers.clone();
        sorted.sort();
        assert_eq!(tiled_at, sorted, "{name}: the tiled points");
        if !m.net.decoder.is_empty() {
            for k in [Kind::Enc, Kind::Dec, Kind::Cross] {
                assert!(tiled_at.iter().any(|a| a.kind == k), "{name}: no {k} tiles");
            }
        }
        for (at, full) in patterns {
            let scores = &seen.iter().find(|(a, _)| *a == At::new(at.kind, at.layer, Point::Scores)).unwrap().1;
            let parts = &tiles.got[at];
            let tq = full.size()[2];
            // In order, each at most 3 rows, covering 0..tq once.
            let mut next = 0;
            for (q0, s, p) in parts {
                assert_eq!(*q0, next, "{name} {at}: tiles out of order");
                let n = p.size()[2];
                assert!((1..=3).contains(&n), "{name} {at}: a tile of {n} rows");
                assert_eq!(s.size(), p.size(), "{name} {at}: scores and weights of a tile");
                next += n;
            }
            assert_eq!(next, tq, "{name} {at}: the tiles cover {next} of {tq} query rows");
            let p = Tensor::cat(&parts.iter().map(|t| t.2.shallow_clone()).collect::<Vec<_>>(), 2);
            let s = Tensor::cat(&parts.iter().map(|t| t.1.shallow_clone()).collect::<Vec<_>>(), 2);
            let dp = common::max_diff(&p, full);
            let pb = common::f32_bound(1.0, depth);
            assert!(dp <= pb, "{name} {at}: tiled weights differ by {dp:e} (bound {pb:e})");
            // Scores: masked entries are -1e9-ish on both sides; compare where unmasked.
            let real = full.gt(0.0);
            let ds = common::max_diff(&s.masked_select(&real), &scores.masked_select(&real));
            let sb = common::f32_bound(scores.masked_select(&real).abs().max().double_value(&[]), depth);
            assert!(ds <= sb, "{name} {at}: tiled scores differ by {ds:e} (bound {sb:e})");
            // A running statistic kept tile by tile (each head's largest weight per query,
            // summed): the same as over the whole pattern.
            let running: f64 =
                parts.iter().map(|t| t.2.amax([-1i64].as_slice(), false).sum(DType::Double).double_value(&[])).sum();
            let at_once = full.amax([-1i64].as_slice(), false).sum(DType::Double).double_value(&[]);
            assert!((running - at_once).abs() <= 1e-5 * at_once.abs().max(1.0), "{name} {at}: {running} vs {at_once}");
        }
    }
}

/// A hook that asks for no tiles (0 rows) gets none, and the run is the plain forward's bit for
/// bit (the fused kernel, as without hooks).
#[test]
fn an_untiled_run_hands_no_tiles() {
    let m = common::tiny_hf("llama", "f32");
    let mut tiles = Tiles { rows: 0, got: BTreeMap::new(), skipped: 0 };
    let out = run(&m, &mut tiles);
    assert!(tiles.got.is_empty(), "tiles handed to a hook that asked for 0 rows");
    let _g = tch::no_grad_guard();
    let b = m.batch(&["The cat sat on the mat near the door.", "A dog."]).unwrap();
    let plain = m.net.encode(&b.ids, &b.mask, &Gates::none(), None).unwrap();
    assert_eq!(common::max_diff(&out, &plain), 0.0);
}

/// Replaces layer 0's weights by uniform ones (over every key, a hook's free choice).
struct Uniform;

impl Hooks for Uniform {
    fn wants(&self, at: At) -> bool {
        at.point == Point::Pattern && at.layer == 0
    }
    fn visit(&mut self, _at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        Ok(Some(x.ones_like() / x.size()[3] as f64))
    }
}

/// Tiles beside a hook that looks at the whole pattern: the whole pattern is visited (recorded,
/// or replaced, and the replacement takes effect downstream), and the tiles are its rows,
/// bit for bit.
#[test]
fn tiles_beside_a_hook_on_the_whole_pattern_are_its_rows() {
    let m = common::tiny_hf("llama", "f32");
    // Recorded: the record sees every layer's whole pattern, the tiles are its rows, and the
    // output is the recording run's.
    let mut tiles = Tiles { rows: 2, got: BTreeMap::new(), skipped: 0 };
    let (seen, out) = common::recorded(&[Point::Pattern], |rec| run(&m, &mut Both(rec, &mut tiles)));
    let (_, plain) = common::recorded(&[Point::Pattern], |rec| run(&m, rec));
    assert_eq!(common::max_diff(&out, &plain), 0.0, "the output beside a record");
    assert_eq!(seen.len(), m.net.stack.len(), "every layer's whole pattern recorded");
    for (at, full) in &seen {
        let parts: Vec<Tensor> = tiles.got[at].iter().map(|t| t.2.shallow_clone()).collect();
        assert!(tiles.got[at].iter().all(|t| t.2.size()[2] <= 2), "{at}: a tile over 2 rows");
        assert_eq!(common::max_diff(&Tensor::cat(&parts, 2), full), 0.0, "{at}: tiles beside a record");
    }
    // Replaced: layer 0's tiles are the uniform weights the hook put there, and the output
    // is the replaced run's, not the plain one's.
    let mut tiles = Tiles { rows: 2, got: BTreeMap::new(), skipped: 0 };
    let replaced_tiled = run(&m, &mut Both(&mut Uniform, &mut tiles));
    let replaced = run(&m, &mut Uniform);
    // (Layers above 0 are tiled in one run and fused in the other: float32 rounding apart.)
    let bound =
        common::f32_bound(replaced.abs().max().double_value(&[]), common::depth(&m, replaced.size()[1] as usize));
    let d = common::max_diff(&replaced_tiled, &replaced);
    assert!(d <= bound, "the replacement took effect: {d:e} from the replaced run (bound {bound:e})");
    assert!(common::max_diff(&replaced, &plain) > 1e-4, "the replacement changed nothing");
    let at0 = At::new(m.net.stack_kind, 0, Point::Pattern);
    for (_, _, p) in &tiles.got[&at0] {
        let tk = p.size()[3] as f64;
        assert!(common::max_diff(p, &(p.ones_like() / tk)) < 1e-7, "layer 0's tiles are not the replacement");
    }
}

/// Under DuoAttention's gates (each head a mix of full and streaming weights, its own window
/// bias per tile) the tiles put together are the gated run's whole pattern, and the output the
/// untiled gated run's.
#[test]
fn tiles_under_duo_gates_are_the_mixed_pattern() {
    let _g = tch::no_grad_guard();
    let m = common::tiny_hf("llama", "f32");
    let (layers, heads) = (m.net.stack.len() as i64, m.net.stack[0].mixer().width() as i64);
    let alpha = Tensor::linspace(0.1, 0.9, layers * heads, (DType::Float, tch::Device::Cpu)).view([layers, heads]);
    let gates =
        Gates { duo: Some(std::rc::Rc::new(headscope::model::nn::Duo { alpha, sink: 1, recent: 2 })), ..Gates::none() };
    let b = m.batch(&["The cat sat on the mat near the door.", "A dog."]).unwrap();
    let (seen, whole) =
        common::recorded(&[Point::Pattern], |h| m.net.encode(&b.ids, &b.mask, &gates, Some(h)).unwrap());
    let plain = m.net.encode(&b.ids, &b.mask, &Gates::none(), None).unwrap();
    assert!(common::max_diff(&whole, &plain) > 1e-4, "the duo gates changed nothing");
    let mut tiles = Tiles { rows: 3, got: BTreeMap::new(), skipped: 0 };
    let tiled = m.net.encode(&b.ids, &b.mask, &gates, Some(&mut tiles)).unwrap();
    let depth = common::depth(&m, whole.size()[1] as usize);
    let bound = common::f32_bound(whole.abs().max().double_value(&[]), depth);
    let d = common::max_diff(&tiled, &whole);
    assert!(d <= bound, "the tiled gated run differs by {d:e} (bound {bound:e})");
    assert_eq!(seen.len(), layers as usize);
    for (at, full) in &seen {
        let parts: Vec<Tensor> = tiles.got[at].iter().map(|t| t.2.shallow_clone()).collect();
        let dp = common::max_diff(&Tensor::cat(&parts, 2), full);
        assert!(dp <= common::f32_bound(1.0, depth), "{at}: tiled duo weights differ by {dp:e}");
    }
}

/// An interrupt (Ctrl-C, a kernel's interrupt_request) raised while a layer hands its tiles
/// stops the forward before the next tile (`model::check_interrupt` in the tile loop), not at
/// the next layer: a long layer's wait is one tile's work.
#[test]
fn an_interrupt_stops_the_forward_within_a_layer_at_the_next_tile() {
    use headscope::run::{enter, Context, Interrupt};
    struct Stopper {
        seen: usize,
        trigger: Interrupt,
    }
    impl Hooks for Stopper {
        fn wants(&self, _at: At) -> bool {
            false
        }
        fn visit(&mut self, _at: At, _x: &Tensor) -> Result<Option<Tensor>, ModelError> {
            Ok(None)
        }
        fn tile_rows(&self, at: At) -> Option<i64> {
            (at.point == Point::Pattern).then_some(1)
        }
        fn tile(&mut self, _at: At, _tile: &Tile) -> Result<(), ModelError> {
            self.seen += 1;
            if self.seen == 3 {
                self.trigger.trigger();
            }
            Ok(())
        }
    }
    let m = common::tiny_hf("llama", "f32");
    let interrupt = Interrupt::default();
    let _ctx = enter(Context {
        interrupt: interrupt.clone(),
        progress: std::rc::Rc::new(|_, _, _| {}),
        warn: std::rc::Rc::new(|_| {}),
    });
    let _g = tch::no_grad_guard();
    let b = m.batch(&["The cat sat on the mat near the door."]).unwrap();
    assert!(b.ids.size()[1] > 3, "more query rows than the tiles seen");
    let mut hooks = Stopper { seen: 0, trigger: interrupt.clone() };
    let err = m.net.encode(&b.ids, &b.mask, &Gates::none(), Some(&mut hooks)).err();
    assert!(matches!(err, Some(ModelError::Interrupted)), "{err:?}");
    assert_eq!(hooks.seen, 3, "no tile after the interrupt");
    interrupt.reset();
    let mut hooks = Stopper { seen: 0, trigger: Interrupt::default() };
    assert!(m.net.encode(&b.ids, &b.mask, &Gates::none(), Some(&mut hooks)).is_ok());
    assert_eq!(hooks.seen as i64, b.ids.size()[1] * m.net.stack.len() as i64, "one tile a row a layer");
}
