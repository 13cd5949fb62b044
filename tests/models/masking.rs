//! Head masking on a tiny random encoder-decoder built from the engine's own blocks: all-one
//! gates change nothing, a masked head changes only what lies downstream of it, a per-row
//! gate batch equals separate runs, and weights are untouched. Also: teacher forcing (every
//! decoder step at once) equals decoding step by step.

use crate::common;

use headscope::model::bias::Bias;
use headscope::model::hooks::{At, HookSlot, Point};
use headscope::model::mixer::{Inside, Mixer};
use headscope::model::nn::{Activation, Attention, Ffn, Gates, Linear, NormPosition};
use headscope::model::nn::{LayerGate, Params};
use headscope::model::ssru::Ssru;
use headscope::model::transformer::{DecStart, DecoderLayer, Embeddings, Positions, StackLayer, Stop, Transformer};
use headscope::model::Kind;
use headscope::model::ModelError;
use tch::{Device, Kind as DType, Tensor};

const D: i64 = 8;
const H: i64 = 2;

fn lin(out: i64, inp: i64) -> Linear {
    Linear {
        w: Tensor::randn([out, inp], (DType::Float, Device::Cpu)) * 0.3,
        b: Some(Tensor::randn([out], (DType::Float, Device::Cpu)) * 0.1),
    }
}
fn attn() -> Attention {
    Attention::new(lin(D, D), lin(D, D), lin(D, D), lin(D, D), H, H, D / H)
}

fn tiny() -> Transformer {
    tiny_with(|| Ssru { w: Linear { w: lin(D, D).w, b: None }, wf: lin(D, D) })
}

/// [`tiny`] with each decoder layer's self-block made by `self_block`.
fn tiny_with<M: Mixer + 'static>(self_block: impl Fn() -> M) -> Transformer {
    tch::manual_seed(7);
    let vocab = 11;
    let tokens = Tensor::randn([vocab, D], (DType::Float, Device::Cpu));
    Transformer {
        embed: Embeddings {
            tokens: tokens.shallow_clone(),
            scale: 1.0,
            positions: Positions::Sinusoidal,
            token_type: None,
            norm: None,
        },
        stack: (0..2)
            .map(|_| {
                StackLayer::new(
                    attn(),
                    common::layer_norm(D),
                    Ffn { up: lin(16, D), down: lin(D, 16), act: Activation::Relu, gate: None },
                    common::layer_norm(D),
                    NormPosition::Post,
                )
            })
            .collect(),
        stack_kind: Kind::Enc,
        causal: false,
        window: None,
        final_norm: None,
        decoder: (0..2)
            .map(|_| {
                DecoderLayer::new(
                    self_block(),
                    common::layer_norm(D),
                    Some((attn(), common::layer_norm(D))),
                    Ffn { up: lin(16, D), down: lin(D, 16), act: Activation::Relu, gate: None },
                    common::layer_norm(D),
                    NormPosition::Post,
                )
            })
            .collect(),
        output: Some(Linear { w: tokens, b: Some(Tensor::zeros([vocab], (DType::Float, Device::Cpu))) }),
        d_model: D,
        eos_id: 0,
        dec_embed: None,
        dec_start: None,
        banned: vec![],
        logit_softcap: None,
        forced_bos: Default::default(),
        rel_bias: None,
        max_positions: None,
    }
}

fn inputs() -> (Tensor, Tensor) {
    let ids = Tensor::from_slice(&[3i64, 4, 5, 6, 7, 8, 2, 9, 0, 0]).view([2, 5]);
    let mask = Tensor::from_slice(&[1f32, 1., 1., 1., 1., 1., 1., 1., 0., 0.]).view([2, 5]);
    (ids, mask)
}

/// Hidden states after each layer and attention of each layer.
fn run(t: &Transformer, gates: &Gates) -> (Vec<Tensor>, Vec<Tensor>, Tensor) {
    let (ids, mask) = inputs();
    let (seen, out) =
        common::recorded(&[Point::ResidPre, Point::Pattern], |r| t.encode(&ids, &mask, gates, Some(r)).unwrap());
    let mut hidden = common::at_point(&seen, Point::ResidPre);
    hidden.push(out.shallow_clone());
    (hidden, common::at_point(&seen, Point::Pattern), out)
}

fn enc_gates(g: &[f32], rows: i64) -> Gates {
    Gates { enc: Some(Tensor::from_slice(g).view([rows, 2, H])), ..Gates::none() }
}

#[test]
fn all_one_gates_give_exactly_the_unmasked_outputs() {
    let _rng = common::rng();
    let t = tiny();
    let (_, _, plain) = run(&t, &Gates::none());
    let (_, _, ones) = run(&t, &enc_gates(&[1.0; 4], 1));
    assert!(plain.equal(&ones));
    let (ids, mask) = inputs();
    let enc = t.encode(&ids, &mask, &Gates::none(), None).unwrap();
    let targets = Tensor::from_slice(&[5i64, 6, 0, 7, 0, 0]).view([2, 3]);
    let a = t.teacher(&enc, &mask, &targets, Stop::Logits, &Gates::none(), None).unwrap();
    let cross_ones = Gates { cross: Some(Tensor::ones([1, 2, H], (DType::Float, Device::Cpu))), ..Gates::none() };
    let b = t.teacher(&enc, &mask, &targets, Stop::Logits, &cross_ones, None).unwrap();
    assert!(a.equal(&b));
}

#[test]
fn masking_a_head_changes_only_what_is_downstream() {
    let _rng = common::rng();
    let t = tiny();
    let (h0, p0, out0) = run(&t, &Gates::none());
    // Close head 0 of layer 1.
    let (h1, p1, out1) = run(&t, &enc_gates(&[1.0, 1.0, 0.0, 1.0], 1));
    // Embeddings and layer 0 are upstream: identical.
    assert!(h1[0].equal(&h0[0]) && h1[1].equal(&h0[1]));
    // Layer 1's attention probabilities are computed before the gate: identical.
    assert!(p1[0].equal(&p0[0]) && p1[1].equal(&p0[1]));
    // The layer's output changes.
    assert!(!out1.equal(&out0));
    // At the attention block of layer 1 the gate removes exactly head 0's contribution:
    // plain - masked = context_0 W^O[:, head 0 slice]^T, for every token (layer 1's
    // `hook_attn_out` in the plain and the masked run).
    let (ids, mask) = inputs();
    let points = [Point::Z, Point::AttnOut];
    let (seen, _) = common::recorded(&points, |r| t.encode(&ids, &mask, &Gates::none(), Some(r)).unwrap());
    let gates = enc_gates(&[1.0, 1.0, 0.0, 1.0], 1);
    let (seen_masked, _) = common::recorded(&points, |r| t.encode(&ids, &mask, &gates, Some(r)).unwrap());
    let plain = &common::at_point(&seen, Point::AttnOut)[1];
    let masked = &common::at_point(&seen_masked, Point::AttnOut)[1];
    let ctx = &common::at_point(&seen, Point::Z)[1..];
    let a = t.stack[1].attention().unwrap();
    let head0 = ctx[0].select(1, 0); // [B, T, dh]
    let contribution = head0.matmul(&a.o.w.narrow(1, 0, D / H).tr());
    assert!(contribution.abs().max().double_value(&[]) > 1e-3, "head 0 contributes something");
    assert!((plain - masked).allclose(&contribution, 1e-5, 1e-6, false));
}

#[test]
fn per_row_gates_equal_separate_runs() {
    let _rng = common::rng();
    let t = tiny();
    let masked = [1.0f32, 0.0, 1.0, 1.0];
    let (_, _, alone_masked) = run(&t, &enc_gates(&masked, 1));
    let (_, _, alone_plain) = run(&t, &Gates::none());
    // Row 0 masked, row 1 not, in one batch.
    let both: Vec<f32> = masked.iter().copied().chain([1.0; 4]).collect();
    let (_, _, mixed) = run(&t, &enc_gates(&both, 2));
    assert!(mixed.get(0).allclose(&alone_masked.get(0), 1e-6, 1e-6, false));
    assert!(mixed.get(1).allclose(&alone_plain.get(1), 1e-6, 1e-6, false));
}

#[test]
fn weights_are_unchanged_after_a_masked_forward() {
    let _rng = common::rng();
    let t = tiny();
    let before: Vec<Tensor> = t
        .stack
        .iter()
        .flat_map(|l| {
            [l.attention().unwrap().q.w.copy(), l.attention().unwrap().v.w.copy(), l.attention().unwrap().o.w.copy()]
        })
        .collect();
    let _ = run(&t, &enc_gates(&[0.0; 4], 1));
    let after: Vec<&Tensor> = t
        .stack
        .iter()
        .flat_map(|l| [&l.attention().unwrap().q.w, &l.attention().unwrap().v.w, &l.attention().unwrap().o.w])
        .collect();
    for (a, b) in before.iter().zip(after) {
        assert!(a.equal(b));
    }
    // And the unmasked model still gives its unmasked output.
    let (_, _, x) = run(&t, &Gates::none());
    let (_, _, y) = run(&t, &Gates::none());
    assert!(x.equal(&y));
}

/// Teacher forcing runs each decoder layer over all steps at once (the SSRU recurrence inside
/// the SSRU's scan); decoding step by step feeds one step at a time through the same layers with
/// the state carried over. Both read the same inputs, so they must give the same logits, with
/// a gated cross head too.
#[test]
fn teacher_forcing_equals_decoding_step_by_step() {
    let _rng = common::rng();
    let t = tiny();
    let (ids, mask) = inputs();
    let enc = t.encode(&ids, &mask, &Gates::none(), None).unwrap();
    let targets = Tensor::from_slice(&[5i64, 6, 3, 7, 1, 4, 2, 9]).view([2, 4]);
    let src = t.source(&enc, &mask, &mut None).unwrap();
    for gates in [
        Gates::none(),
        Gates { cross: Some(Tensor::from_slice(&[1f32, 0.0, 0.5, 1.0]).view([1, 2, H])), ..Gates::none() },
    ] {
        let teacher = t.teacher(&enc, &mask, &targets, Stop::Logits, &gates, None).unwrap(); // [B, T, V]
        let mut state = t.start_state();
        let mut none = None;
        for step in 0..4 {
            let prev = (step > 0).then(|| targets.select(1, step - 1));
            let step_run = DecStart::Step { prev: prev.as_ref(), state: &mut state };
            let logits = t.decode(step_run, Stop::Logits, &src, &gates, &mut none).unwrap().squeeze_dim(1); // [B, V]
            let d = (logits - teacher.select(1, step)).abs().max().double_value(&[]);
            assert!(d < 1e-5, "step {step}: step-by-step logits differ from teacher forcing by {d:e}");
        }
    }
}

/// A decoder self-block of a kind that cannot continue from earlier steps (a mixer without
/// `Mixer::step`) is refused in one line naming its kind, by teacher forcing and by decoding
/// step by step alike: never run as if it were causal.
#[test]
fn a_self_block_that_cannot_continue_is_refused() {
    struct NoStep(Attention);
    impl Mixer for NoStep {
        fn kind(&self) -> &'static str {
            "nostep"
        }
        fn width(&self) -> usize {
            Mixer::width(&self.0)
        }
        fn present(&self) -> Vec<usize> {
            Mixer::present(&self.0)
        }
        fn head_dim(&self) -> i64 {
            self.0.head_dim
        }
        fn keep_heads(&mut self, keep: &[usize]) -> Result<(), String> {
            Mixer::keep_heads(&mut self.0, keep)
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
            Mixer::forward(&self.0, x, bias, gate, kind, layer, h, inside)
        }
        fn gated(&self, z: &Tensor, gate: &LayerGate, inside: Inside) -> Tensor {
            Mixer::gated(&self.0, z, gate, inside)
        }
        fn output_from_z(
            &self,
            z: &Tensor,
            kind: Kind,
            layer: usize,
            h: &mut HookSlot,
            inside: Inside,
        ) -> Result<Tensor, ModelError> {
            Mixer::output_from_z(&self.0, z, kind, layer, h, inside)
        }
        fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
            Mixer::points(&self.0, kind, layer, out)
        }
        fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
            Mixer::params_mut(&mut self.0, prefix, out)
        }
    }
    let _rng = common::rng();
    let t = tiny_with(|| NoStep(attn()));
    let (ids, mask) = inputs();
    let enc = t.encode(&ids, &mask, &Gates::none(), None).unwrap();
    let targets = Tensor::from_slice(&[5i64, 6, 3, 7, 1, 4, 2, 9]).view([2, 4]);
    let want = "dec layer 0's token mixer 'nostep' cannot continue from earlier steps";
    let err = t.teacher(&enc, &mask, &targets, Stop::Logits, &Gates::none(), None).expect_err("refused").to_string();
    assert!(err.contains(want) && !err.contains('\n'), "teacher forcing: {err}");
    let src = t.source(&enc, &mask, &mut None).unwrap();
    let mut state = t.start_state();
    let step = DecStart::Step { prev: None, state: &mut state };
    let err = t.decode(step, Stop::Logits, &src, &Gates::none(), &mut None).expect_err("refused").to_string();
    assert!(err.contains(want), "a decoder step: {err}");
    // The same layers with a self-attention, which continues, decode.
    assert!(tiny_with(attn).teacher(&enc, &mask, &targets, Stop::Logits, &Gates::none(), None).is_ok());
}

/// The hook points: `hook_result` (per-head outputs at W^O) summed over heads plus W^O's bias
/// is the attention's output, under gates too; every hook point a pass hands out has its
/// TransformerLens name.
#[test]
fn per_head_outputs_sum_to_the_attention_output() {
    let _rng = common::rng();
    let t = tiny();
    let (ids, mask) = inputs();
    let layer = &t.stack[0];
    for gates in [Gates::none(), enc_gates(&[0.0, 1.0, 1.0, 1.0], 1)] {
        let (seen, _) = common::recorded(&[], |r| t.encode(&ids, &mask, &gates, Some(r)).unwrap());
        let seen: Vec<_> = seen.into_iter().filter(|(at, _)| at.layer == 0).collect();
        let out = common::at_point(&seen, Point::AttnOut).pop().expect("hook_attn_out");
        let names: Vec<String> = seen.iter().map(|(at, _)| at.to_string()).collect();
        let parts = common::at_point(&seen, Point::Result).pop();
        let parts = parts.expect("hook_result was handed out"); // [B, H, T, D]
        let sum = parts.sum_dim_intlist([1i64].as_slice(), false, DType::Float)
            + layer.attention().unwrap().o.b.as_ref().unwrap();
        let d = (sum - &out).abs().max().double_value(&[]);
        assert!(d < 1e-5, "sum of hook_result + b^O differs from the attention output by {d:e}");
        for want in [
            "enc.blocks.0.attn.hook_q",
            "enc.blocks.0.attn.hook_pattern",
            "enc.blocks.0.attn.hook_v",
            "enc.blocks.0.attn.hook_z",
            "enc.blocks.0.attn.hook_result",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
    }
    assert_eq!(At::new(Kind::Dec, 1, Point::ResidPost).to_string(), "dec.blocks.1.hook_resid_post");
    assert_eq!(At::new(Kind::Enc, 1, Point::ResidPre).to_string(), "enc.blocks.1.hook_resid_pre");
}
