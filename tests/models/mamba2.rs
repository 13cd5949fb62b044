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
use crate::hybrid_golden::{check, counts_its_states, sentence, shown_is_alpha_by_row, Case, Replace};

use headscope::analysis::analyze;
use headscope::analysis::options::{Options, Stat};
use headscope::data::Dataset;
use headscope::model::hooks::{At, Point};
use headscope::model::mamba2::{Mamba2, Shape};
use headscope::model::nn::{Activation, Ffn, Gates, Linear, Norm, NormKind, NormPosition};
use headscope::model::transformer::{Embeddings, Positions, StackLayer};
use headscope::model::{Family, Kind};
use tch::{Device, Kind as DType, Tensor};

/// One checkpoint of make_tiny_hf_mamba2.py against its goldens (its MASK: 8 Mamba-2 heads or
/// 4 attention heads per layer).
fn equals_transformers(name: &str, mask: &[&[f64]]) {
    twin_equals_transformers(name, None, mask);
}

/// [`equals_transformers`] of `name`, or of its GGUF twin `twin` against `name`'s goldens.
fn twin_equals_transformers(name: &str, twin: Option<&str>, mask: &[&[f64]]) {
    let golden = common::golden("tiny_hf/golden_mamba2.npz");
    let run = check(&Case { name, golden: &golden, mixer: "mamba2", alpha: Point::SsmAlpha, width: 8, mask, twin });
    shown_is_alpha_by_row(name, &run);
}

const GRANITE_H_MASK: [&[f64]; 4] =
    [&[1., 0., 1., 1., 0., 1., 1., 1.], &[1., 0., 1., 1.], &[0., 1., 1., 1., 1., 1., 0., 1.], &[1., 1., 0., 1.]];
const GRANITE_H_MOE_MASK: [&[f64]; 4] =
    [&[0., 1., 1., 1.], &[1., 1., 1., 0., 1., 1., 1., 1.], &[1., 1., 0., 1., 1., 0., 1., 1.], &[1., 1., 1., 0.]];

#[test]
fn granite_h_equals_transformers() {
    equals_transformers("granite_h", &GRANITE_H_MASK);
}

#[test]
fn granite_h_with_experts_and_groups_equals_transformers() {
    equals_transformers("granite_h_moe", &GRANITE_H_MOE_MASK);
}

/// Both tiny Granite-4.0-H checkpoints as llama.cpp's converter writes them in GGUF
/// (`tests/fixtures/make_tiny_gguf_hybrid.py`: `ssm_a` = -exp(A_log), the squeezed convolution,
/// the grouped `ssm_norm`, the MLPs' halves split, Q/K permuted into adjacent pairs, the rotary
/// switch in `rope.scaling.finetuned`) give their HF twins' goldens, closed heads and effective
/// attention included, and count the same parameters.
#[test]
fn granite_h_gguf_equals_its_hf_twin() {
    twin_equals_transformers("granite_h", Some("granite_h_gguf"), &GRANITE_H_MASK);
    twin_equals_transformers("granite_h_moe", Some("granite_h_moe_gguf"), &GRANITE_H_MOE_MASK);
    assert_eq!(common::tiny_hf("granite_h_moe_gguf", "f32").family_name(), "granitehybrid (gguf)");
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
    let (t, mask) = sentence(&m, "the cat sat on the mat and the dog sat too");
    let _g = tch::no_grad_guard();
    let zero = |a: &Tensor| a.zeros_like();
    let mut r = Replace::new(At::new(Kind::Dec, 0, Point::SsmAlpha), zero, vec![Point::SsmX, Point::SsmY]);
    let _ = m.net.encode(&t, &mask, &Gates::none(), Some(&mut r)).unwrap();
    let one = |p: Point| r.one(p, 0);
    let mamba = m.net.stack[0].mixer().as_any().unwrap().downcast_ref::<Mamba2>().unwrap();
    let skip = one(Point::SsmX) * mamba.d.view([1, 8, 1, 1]);
    assert!(max_diff(&one(Point::SsmY), &skip) < 1e-12, "alpha zeroed leaves y = D x");
    let mut w = Replace::new(At::new(Kind::Dec, 2, Point::Pattern), zero, vec![]);
    let err = m.net.encode(&t, &mask, &Gates::none(), Some(&mut w)).unwrap_err().to_string();
    assert!(err.contains("read only") && err.contains("ssm.hook_alpha") && err.contains("layer 2"), "{err}");
}

/// The key/value accounting of Granite-4.0-H: attention layers grow (2 layers x 2 key/value
/// groups x a key and a value of 8 numbers per position), each Mamba-2 head holds its state
/// `[P, N]` = 8 x 4 and each Mamba-2 layer its convolution's last 3 inputs of `I + 2 G N` = 72
/// channels, whatever the context; a generation's cache holds exactly that.
#[test]
fn a_mamba2_hybrid_counts_its_states_and_its_generation_holds_them() {
    let attention = |context: i64| 2 * 2 * context * (2 * 8) * 4;
    let mamba = 2 * (8 * 8 * 4 + 72 * 3) * 4;
    counts_its_states("granite_h", |c| attention(c) + mamba, 2 * 2 + 2 * 8, |c| 2 * 2 * c + 2 * 8);
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
