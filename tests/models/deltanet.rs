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
use crate::hybrid_golden::{check, counts_its_states, sentence, shown_is_alpha_by_row, Case, Replace};

use headscope::analysis::analyze;
use headscope::analysis::options::{Options, Stat};
use headscope::data::Dataset;
use headscope::model::deltanet::{DeltaNet, Shape};
use headscope::model::hooks::{At, Point};
use headscope::model::nn::{Activation, Ffn, Gates, Linear, Norm, NormKind, NormPosition};
use headscope::model::transformer::{Embeddings, Positions, StackLayer};
use headscope::model::{Family, Kind};
use tch::{Device, Kind as DType, Tensor};

/// One checkpoint of make_tiny_hf_deltanet.py against its goldens (its MASK).
fn equals_transformers(name: &str, mask: &[&[f64]]) {
    let golden = common::golden("tiny_hf/golden_deltanet.npz");
    let run =
        check(&Case { name, golden: &golden, mixer: "deltanet", alpha: Point::DeltaAlpha, width: 4, mask, twin: None });
    shown_is_alpha_by_row(name, &run);
}

#[test]
fn qwen3_next_equals_transformers() {
    equals_transformers("qwen3_next", &[&[1., 0., 1., 1.], &[1., 0., 1., 1.], &[0., 1., 1., 0.], &[1., 1., 0., 1.]]);
}

#[test]
fn qwen3_next_with_experts_equals_transformers() {
    equals_transformers(
        "qwen3_next_moe",
        &[&[0., 1., 1., 1.], &[1., 1., 1., 0.], &[1., 0., 1., 1.], &[1., 1., 1., 0.]],
    );
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
    let (t, mask) = sentence(&m, "the cat sat on the mat and the dog sat too");
    let _g = tch::no_grad_guard();
    let mut r =
        Replace::new(At::new(Kind::Dec, 0, Point::DeltaAlpha), |a: &Tensor| a.zeros_like(), vec![Point::DeltaY]);
    let _ = m.net.encode(&t, &mask, &Gates::none(), Some(&mut r)).unwrap();
    let y = r.one(Point::DeltaY, 0);
    assert_eq!(y.abs().max().double_value(&[]), 0.0, "alpha zeroed leaves y = 0");
    let mut w = Replace::new(At::new(Kind::Dec, 2, Point::Pattern), |a: &Tensor| a.zeros_like(), vec![]);
    let err = m.net.encode(&t, &mask, &Gates::none(), Some(&mut w)).unwrap_err().to_string();
    assert!(err.contains("read only") && err.contains("delta.hook_alpha") && err.contains("layer 2"), "{err}");
    // Head 1 of attention layer 1 silenced by its output gate: its slice of hook_z is zero, the
    // others' are not.
    let silence = |g: &Tensor| {
        let g = g.copy();
        let _ = g.narrow(1, 1, 1).fill_(0.0);
        g
    };
    let mut s = Replace::new(At::new(Kind::Dec, 1, Point::OutGate), silence, vec![Point::Z]);
    let _ = m.net.encode(&t, &mask, &Gates::none(), Some(&mut s)).unwrap();
    let z = s.one(Point::Z, 1);
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
    let attention = |context: i64| 2 * 2 * context * (2 * 8) * 4;
    let delta = 2 * (4 * 8 * 8 + 64 * 3) * 4;
    counts_its_states("qwen3_next", |c| attention(c) + delta, 2 * 2 + 2 * 4, |c| 2 * 2 * c + 2 * 4);
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
