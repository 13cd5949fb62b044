//! Placements (docs/methods.md#placement): a stack split into placements runs through
//! `Transformer::run` with the residual stream moved at every boundary the plan has and back
//! to the unembedding's placement, each move told to the hooks in order, and the numbers of one
//! placement bit for bit; resumes start where the layer they enter sits; a bad plan is refused
//! in one line. On this machine every placement is the CPU (a split on one device), as the
//! issue on models split across devices asks of its tests.

use crate::common;
use headscope::model::hooks::{At, Both, Hooks, Point};
use headscope::model::nn::Gates;
use headscope::model::transformer::{Placement, Start, Stop};
use headscope::model::{Model, ModelError};
use tch::{Device, Kind as DType, Tensor};

/// The moves a run made, `(from, to, before layer)` by placement index.
#[derive(Default)]
struct Moves(Vec<(usize, usize, usize)>);

impl Hooks for Moves {
    fn wants(&self, _: At) -> bool {
        false
    }
    fn visit(&mut self, _: At, _: &Tensor) -> Result<Option<Tensor>, ModelError> {
        Ok(None)
    }
    fn moved(&mut self, from: Placement, to: Placement, layer: usize) {
        self.0.push((from.index, to.index, layer));
    }
}

fn cpu(index: usize) -> Placement {
    Placement { index, device: Device::Cpu }
}

/// Placements 1 and 2 in turn, none on the embeddings' placement 0: `[1, 2, 1, ..]`.
fn plan(n: usize) -> Vec<Placement> {
    (0..n).map(|l| cpu(1 + l % 2)).collect()
}

/// The moves a whole run over [`plan`] makes: onto layer 0's placement, at every layer after,
/// and home to the unembedding.
fn expected(n: usize) -> Vec<(usize, usize, usize)> {
    let p = |l: usize| 1 + l % 2;
    let mut v = vec![(0, p(0), 0)];
    v.extend((1..n).map(|l| (p(l - 1), p(l), l)));
    v.push((p(n - 1), 0, n));
    v
}

fn run(m: &Model, start: Start, stop: Stop) -> (Tensor, Vec<(usize, usize, usize)>) {
    let mut moves = Moves::default();
    let out = m.net.run(start, stop, &Gates::none(), &mut Some(&mut moves)).unwrap();
    (out, moves.0)
}

#[test]
fn a_split_stack_moves_where_the_plan_says_and_computes_the_same_numbers() {
    let _g = tch::no_grad_guard();
    for name in ["llama", "gpt2"] {
        let mut m = common::tiny_hf(name, "f32");
        let n = m.net.stack.len();
        assert!(n >= 2, "{name}: the fixture needs two layers, has {n}");
        let ids = Tensor::from_slice(&m.tokenize("The cat sat on the mat.").unwrap().ids).view([1, -1]);
        let mask = Tensor::ones(ids.size(), (DType::Float, Device::Cpu));
        let tokens = || Start::Tokens { ids: &ids, mask: &mask };
        let (one, none) = run(&m, tokens(), Stop::Logits);
        assert!(none.is_empty(), "{name}: one placement moves nothing: {none:?}");
        let (upto, _) = run(&m, tokens(), Stop::After(n - 2));
        let (first, _) = run(&m, tokens(), Stop::After(0));

        m.net.place(&plan(n)).unwrap();
        let placed: Vec<usize> = m.net.stack.iter().map(|l| l.placement().index).collect();
        assert_eq!(placed, plan(n).iter().map(|p| p.index).collect::<Vec<_>>(), "{name}: placements");
        let (split, moves) = run(&m, tokens(), Stop::Logits);
        assert_eq!(common::max_diff(&split, &one), 0.0, "{name}: split logits");
        assert_eq!(moves, expected(n), "{name}: moves of a whole run");
        // Stopping after layer 0 leaves the stream on its placement.
        let (x0, moves) = run(&m, tokens(), Stop::After(0));
        assert_eq!(common::max_diff(&x0, &first), 0.0, "{name}: stopped after layer 0");
        assert_eq!(moves, vec![(0, 1, 0)], "{name}: moves up to layer 0");
        // A resume at the last layer starts on its placement and comes home once.
        let (rest, moves) = run(&m, Start::Layer { layer: n - 1, x: &upto, bias: None }, Stop::Logits);
        assert_eq!(common::max_diff(&rest, &one), 0.0, "{name}: resumed at layer {}", n - 1);
        assert_eq!(moves, vec![(1 + (n - 1) % 2, 0, n)], "{name}: moves of a resume");
        // Stop after layer 0 on the split model, then resume from there: the whole run again.
        let (rest, moves) = run(&m, Start::Layer { layer: 1, x: &x0, bias: None }, Stop::FinalNorm);
        let (whole, _) = run(&m, tokens(), Stop::FinalNorm);
        assert_eq!(common::max_diff(&rest, &whole), 0.0, "{name}: resumed at layer 1 after a split stop");
        // (It enters on layer 1's placement: the moves onto layers 0 and 1 are not made.)
        let want = expected(n)[2..].to_vec();
        assert_eq!(moves, want, "{name}: moves of a resume at layer 1 to the final norm");
        // A resume at layer 1's hook_z, with the contexts the whole split run recorded there.
        let mut moves = Moves::default();
        let (seen, _) = common::recorded(&[Point::Z], |r| {
            let mut both = Both(r, &mut moves);
            m.net.run(tokens(), Stop::FinalNorm, &Gates::none(), &mut Some(&mut both)).unwrap()
        });
        assert_eq!(moves.0, expected(n), "{name}: moves beside a recording hook");
        let z1 = seen.iter().find(|(a, _)| *a == At::new(m.net.stack_kind, 1, Point::Z)).unwrap().1.shallow_clone();
        let (rest, _) = run(&m, Start::Z { layer: 1, x: &x0, z: &z1, bias: None }, Stop::FinalNorm);
        assert_eq!(common::max_diff(&rest, &whole), 0.0, "{name}: resumed at layer 1's hook_z");
        // Gates on a split model: each layer's gates go where the layer is.
        let heads = m.net.stack[0].mixer().width() as i64;
        let g = Tensor::ones([n as i64, heads], (DType::Float, Device::Cpu));
        let _ = g.get(0).get(0).fill_(0.0);
        let gates = Gates { dec: Some(g.unsqueeze(0)), ..Gates::none() }; // both fixtures are decoder-only
        let split = m.net.run(tokens(), Stop::Logits, &gates, &mut None).unwrap();
        m.net.place(&vec![cpu(0); n]).unwrap();
        let unsplit = m.net.run(tokens(), Stop::Logits, &gates, &mut None).unwrap();
        assert_eq!(common::max_diff(&split, &unsplit), 0.0, "{name}: gated split run");
        assert!(common::max_diff(&unsplit, &one) > 0.0, "{name}: the gate closed a head");
    }
}

#[test]
fn a_bad_plan_is_refused_in_one_line() {
    let mut m = common::tiny_hf("llama", "f32");
    let n = m.net.stack.len();
    let err = m.net.place(&plan(n - 1)).unwrap_err().to_string();
    assert!(err.contains(&format!("a placement plan of {} layers for a stack of {n}", n - 1)), "{err}");
    let mut other = plan(n);
    other[1] = Placement { index: 1, device: Device::Cuda(0) };
    let err = m.net.place(&other).unwrap_err().to_string();
    assert!(err.contains("layer 1 placed on Cuda(0)") && !err.contains('\n'), "{err}");
    assert!(m.net.stack.iter().all(|l| l.placement() == cpu(0)), "a refused plan moves nothing");
}
