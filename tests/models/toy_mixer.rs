//! A new kind of token mixer added from outside the model module, in this file alone:
//! `ToyEma`, heads that each take a normalised, exponentially decayed mean of their values over
//! the positions up to the query (a decay learned per head: a linear-attention-like head with a
//! state that does not grow). It implements `headscope::model::mixer::Mixer`
//! (docs/methods.md#mixers), and nothing else in headscope names it. Then gates, removing heads
//! (`prune_heads`' step), key/value accounting, the derived hook points and parameters, an
//! ablation sweep and activation patching run on a model built from it, each checked against a
//! computation by hand.

use crate::common;
use headscope::analysis::ablation::{evaluate, prepare, sweep, Metric};
use headscope::analysis::patching::{patch, Direction, PairIds, PatchMetric, PatchSpec, Site};
use headscope::analysis::streaming::kv_cost;
use headscope::data::Dataset;
use headscope::model::bias::Bias;
use headscope::model::hooks::{self, At, GradRules, HookSlot, Hooks, Point};
use headscope::model::mixer::{Inside, Mixer};
use headscope::model::nn::{Activation, Ffn, Gates, LayerGate, Linear, NormPosition, Params};
use headscope::model::transformer::{Embeddings, Positions, StackLayer, Start, Stop};
use headscope::model::view::View;
use headscope::model::{Family, HeadId, Kind, Model, ModelError};
use headscope::prune::physical::remove_heads;
use tch::{Device, Kind as DType, Tensor};

const D: i64 = 16;
const H: i64 = 4;
const DH: i64 = 4;
const FF: i64 = 24;
const P: i64 = 16;
const WORDS: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];
const V: i64 = WORDS.len() as i64 + 4;

/// Deterministic weights without the global RNG (tests run in parallel).
fn det(shape: &[i64], salt: f64) -> Tensor {
    let n: i64 = shape.iter().product();
    ((Tensor::arange(n, (DType::Float, Device::Cpu)) * 0.731 + salt).sin() * 0.4).view(shape)
}

/// The toy mixer: values `V x`, per head weights `softmax(bias + decay_h (s - t))` over keys
/// `s` (the stack's causal bias keeps `s <= t`), contexts `z = weights v`, output `W_O z`.
struct ToyEma {
    v: Linear,
    o: Linear,
    decay: Tensor,
    present: Vec<usize>,
    width: usize,
}

impl ToyEma {
    fn new(salt: f64) -> ToyEma {
        ToyEma {
            v: Linear { w: det(&[H * DH, D], salt), b: None },
            o: Linear { w: det(&[D, H * DH], salt + 1.0), b: Some(det(&[D], salt + 2.0) * 0.1) },
            decay: det(&[H], salt + 3.0).abs() + 0.05,
            present: (0..H as usize).collect(),
            width: H as usize,
        }
    }

    fn index(&self) -> Tensor {
        Tensor::from_slice(&self.present.iter().map(|&h| h as i64).collect::<Vec<_>>())
    }
}

impl Mixer for ToyEma {
    fn kind(&self) -> &'static str {
        "toy_ema"
    }
    fn width(&self) -> usize {
        self.width
    }
    fn present(&self) -> Vec<usize> {
        self.present.clone()
    }
    fn head_dim(&self) -> i64 {
        DH
    }
    /// One running state of `d_head` numbers per head, whatever the context.
    fn numbers_per_entry(&self) -> i64 {
        DH
    }
    fn entries(&self, _context: i64) -> i64 {
        1
    }
    fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
        let mut phys = Vec::new();
        for h in keep {
            phys.push(self.present.iter().position(|p| p == h).ok_or(format!("head {h} is not in this layer"))? as i64);
        }
        let rows: Vec<i64> = phys.iter().flat_map(|&p| p * DH..(p + 1) * DH).collect();
        let rows = Tensor::from_slice(&rows);
        self.v.w = self.v.w.index_select(0, &rows);
        self.o.w = self.o.w.index_select(1, &rows);
        self.decay = self.decay.index_select(0, &Tensor::from_slice(&phys));
        self.present = keep.to_vec();
        Ok(())
    }
    fn forward(
        &self,
        x: &Tensor,
        bias: &Bias,
        gate: Option<&LayerGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        inside: Inside,
    ) -> Result<Tensor, ModelError> {
        let (b, t, n) = (x.size()[0], x.size()[1], self.present.len() as i64);
        let v = hooks::at(h, At::new(kind, layer, Point::V), self.v.forward(x).view([b, t, n, DH]).transpose(1, 2))?;
        let pos = Tensor::arange(t, (DType::Float, x.device()));
        let dist = pos.view([1, t]) - pos.view([t, 1]);
        let weights =
            (self.decay.view([1, n, 1, 1]) * dist.view([1, 1, t, t]) + bias.dense()?).softmax(-1, DType::Float);
        let mut z = weights.matmul(&v);
        if let Some(g) = gate {
            z = self.gated(&z, g, inside);
        }
        let z = hooks::at(h, At::new(kind, layer, Point::Z), z)?;
        self.output_from_z(&z, kind, layer, h, inside)
    }
    fn gated(&self, z: &Tensor, lg: &LayerGate, _: Inside) -> Tensor {
        let n = self.present.len() as i64;
        let g = lg.g.index_select(1, &self.index()).view([-1, n, 1, 1]);
        match &lg.fill {
            None => z * g,
            Some(f) => {
                let f = f.index_select(0, &self.index()).view([1, n, 1, DH]);
                z * &g + (g.ones_like() - &g) * f
            }
        }
    }
    fn output_from_z(
        &self,
        z: &Tensor,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<Tensor, ModelError> {
        let (b, n, t) = (z.size()[0], z.size()[1], z.size()[2]);
        let out = self.o.forward(&z.transpose(1, 2).reshape([b, t, n * DH]));
        hooks::at(h, At::new(kind, layer, Point::AttnOut), out)
    }
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        out.extend([Point::V, Point::Z, Point::AttnOut].map(|p| At::new(kind, layer, p)));
    }
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.v.params_mut(prefix, "V", out);
        self.o.params_mut(prefix, "O", out);
        out.push((format!("{prefix}decay"), &mut self.decay));
    }
}

fn layer(salt: f64) -> StackLayer {
    StackLayer::new(
        ToyEma::new(salt),
        common::layer_norm(D),
        Ffn {
            up: common::lin(det(&[FF, D], salt + 4.0), det(&[FF], salt + 5.0) * 0.1),
            down: common::lin(det(&[D, FF], salt + 6.0), det(&[D], salt + 7.0) * 0.1),
            act: Activation::Gelu,
            gate: None,
        },
        common::layer_norm(D),
        NormPosition::Pre,
    )
}

/// A decoder-only language model of two toy layers with an output head.
fn toy_model(dir: &std::path::Path) -> Model {
    let embed = Embeddings {
        tokens: det(&[V, D], 0.3),
        scale: 1.0,
        positions: Positions::Learned(det(&[P, D], 0.9) * 0.5),
        token_type: None,
        norm: None,
    };
    let mut m = common::hand_built(dir, &WORDS, embed, vec![layer(1.0), layer(11.0)], Kind::Dec, Family::Gpt2);
    m.net.final_norm = Some(common::layer_norm(D));
    m.net.output = Some(Linear { w: det(&[V, D], 2.2), b: None });
    m.n_params = m.count_params();
    m
}

fn dec(l: usize, h: usize) -> HeadId {
    HeadId { kind: Kind::Dec, layer_idx: l, head: h }
}

fn ids(v: &[i64]) -> Tensor {
    Tensor::from_slice(v).view([1, -1])
}

/// Logits `[1, T, V]` of `ids` under `gates`, hooks `h`.
fn logits(m: &Model, ids: &Tensor, gates: &Gates, h: &mut HookSlot) -> Tensor {
    let mask = ids.ones_like();
    m.net.run(Start::Tokens { ids, mask: &mask }, Stop::Logits, gates, h).unwrap()
}

#[test]
fn the_derived_hook_points_and_parameters_are_the_mixers_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = toy_model(dir.path());
    let x = ids(&[4, 5, 6, 7, 8]);
    let (seen, _) = common::recorded(&[], |r| logits(&m, &x, &Gates::none(), &mut Some(r)));
    let visited: Vec<String> = seen.iter().map(|(at, _)| at.to_string()).collect();
    let derived: Vec<String> = m.hook_points().iter().map(|a| a.to_string()).collect();
    assert_eq!(visited, derived, "the forward visits exactly the derived list, in order");
    assert!(derived.contains(&"dec.blocks.1.attn.hook_z".to_string()), "{derived:?}");
    assert!(!derived.iter().any(|p| p.contains("hook_pattern")), "the toy mixer has no pattern: {derived:?}");
    // Parameters counted by hand: embeddings, per layer the mixer (V, O and its bias, decay),
    // two LayerNorms and the MLP; the final norm and the output head.
    let per_layer = H * DH * D + D * H * DH + D + H + 2 * 2 * D + (FF * D + FF) + (D * FF + D);
    let by_hand = V * D + P * D + 2 * per_layer + 2 * D + V * D;
    assert_eq!(m.count_params(), by_hand);
    let names: Vec<String> = m.net.named_params_mut().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"dec.blocks.1.attn.decay".to_string()), "{names:?}");
}

#[test]
fn gates_equal_removing_the_heads_and_refuse_nothing_silently() {
    let dir = tempfile::tempdir().unwrap();
    let m = toy_model(dir.path());
    let x = ids(&[4, 9, 6, 7, 8, 10]);
    let closed = [dec(0, 1), dec(1, 3), dec(1, 0)];
    let full = logits(&m, &x, &Gates::none(), &mut None);
    let masked = logits(&m, &x, &m.gates_closing(&closed).unwrap(), &mut None);
    assert!(full.dist(&masked).double_value(&[]) > 1e-3, "closing heads changes the logits");
    let mut thin = toy_model(dir.path());
    remove_heads(&mut thin, &closed, "toy").unwrap();
    assert_eq!(thin.present(Kind::Dec, 1), vec![1, 2]);
    assert_eq!(thin.layer_heads(Kind::Dec), vec![3, 2]);
    assert!(thin.n_params < m.n_params, "{} < {}", thin.n_params, m.n_params);
    let removed = logits(&thin, &x, &Gates::none(), &mut None);
    let diff = (&masked - &removed).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "removing the heads computes what masking them computes: {diff}");
    // A removed head is refused by name.
    let e = thin.gates_closing(&[dec(1, 3)]).err().unwrap().to_string();
    assert!(e.contains("removed"), "{e}");
    // Generation needs a key/value cache, which this mixer does not keep: refused in one line.
    let mut cache = headscope::model::transformer::StackCache::default();
    let e = m.net.stack_cached(&x, &mut cache, &Gates::none(), None).unwrap_err().to_string();
    assert!(e.contains("'toy_ema'") && !e.contains('\n'), "{e}");
}

#[test]
fn key_value_accounting_reads_the_mixers_state() {
    let dir = tempfile::tempdir().unwrap();
    let v = View::new(toy_model(dir.path()));
    // Every head keeps one state of d_head float32 numbers at any context.
    let c = kv_cost(&v, 1000, None);
    assert_eq!((c.groups, c.entries, c.full_entries), (2 * H, 2 * H, 2 * H));
    assert_eq!(c.bytes, 2 * H * DH * 4);
    let mut thin = toy_model(dir.path());
    remove_heads(&mut thin, &[dec(0, 2)], "toy").unwrap();
    let c = kv_cost(&View::new(thin), 1000, None);
    assert_eq!((c.groups, c.bytes), (2 * H - 1, (2 * H - 1) * DH * 4));
}

#[test]
fn a_sweep_equals_masking_each_head_alone() {
    let dir = tempfile::tempdir().unwrap();
    let m = toy_model(dir.path());
    let corpus = dir.path().join("c.txt");
    std::fs::write(&corpus, "a b c d e f\nh g f e\nc a b d e h g f\n").unwrap();
    let data = Dataset::corpus(&corpus).unwrap();
    let p = prepare(&m, &data, Metric::Kl, 4096, Gates::none()).unwrap();
    let grids = sweep(&m, &p, &[Kind::Dec], &|| false, &mut |_, _| {}).unwrap();
    let grid = &grids[0].1;
    assert_eq!((grid.len(), grid[0].len()), (2, H as usize));
    for (l, row) in grid.iter().enumerate() {
        for (h, &swept) in row.iter().enumerate() {
            let masked = evaluate(&m, &p, &m.gates_closing(&[dec(l, h)]).unwrap(), &|| false).unwrap();
            assert!(masked > 1e-6, "closing dec.{l}.{h} moves the output: {masked}");
            assert!(
                (swept - masked).abs() <= 1e-6 * masked.abs().max(1e-3),
                "dec.{l}.{h}: the sweep's {swept} against masking alone {masked}"
            );
        }
    }
}

/// Replaces head `head` of the value at `at` with `value`'s.
struct ReplaceHead<'a> {
    at: At,
    head: i64,
    value: &'a Tensor,
}

impl Hooks for ReplaceHead<'_> {
    fn wants(&self, at: At) -> bool {
        at == self.at
    }
    fn visit(&mut self, _: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        let y = x.copy();
        y.narrow(1, self.head, 1).copy_(&self.value.narrow(1, self.head, 1));
        Ok(Some(y))
    }
    fn rules(&self) -> GradRules {
        GradRules::Autograd
    }
}

#[test]
fn patching_equals_patching_each_head_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let m = toy_model(dir.path());
    let (clean, corrupted) = (vec![4, 5, 6, 7, 8], vec![4, 9, 6, 10, 8]);
    let (answer, wrong) = (11, 6);
    let pairs = [PairIds { clean: clean.clone(), corrupted: corrupted.clone(), answer, wrong: Some(wrong) }];
    let spec = PatchSpec::new(Site::Z, false, Direction::Denoise, PatchMetric::LogitDiff);
    let got = patch(&m, &pairs, spec, &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
    let diff = |l: &Tensor| {
        let last = l.get(0).get(l.size()[1] - 1).to_kind(DType::Double);
        last.double_value(&[answer]) - last.double_value(&[wrong])
    };
    assert!((got.clean - diff(&logits(&m, &ids(&clean), &Gates::none(), &mut None))).abs() < 1e-5);
    assert!((got.corrupted - diff(&logits(&m, &ids(&corrupted), &Gates::none(), &mut None))).abs() < 1e-5);
    let mut moved = 0;
    for l in 0..2 {
        let at = At::new(Kind::Dec, l, Point::Z);
        let (seen, _) = common::recorded(&[Point::Z], |r| logits(&m, &ids(&clean), &Gates::none(), &mut Some(r)));
        let z_clean = seen.iter().find(|(a, _)| *a == at).unwrap().1.shallow_clone();
        for h in 0..H {
            let mut put = ReplaceHead { at, head: h, value: &z_clean };
            let want = diff(&logits(&m, &ids(&corrupted), &Gates::none(), &mut Some(&mut put as &mut dyn Hooks)));
            let have = got.patched[l][0][h as usize];
            assert!((have - want).abs() < 1e-5, "dec.{l}.{h}: patch gives {have}, by hand {want}");
            moved += ((want - got.corrupted).abs() > 1e-6) as usize;
        }
    }
    assert!(moved > 0, "some patch moves the metric");
}
