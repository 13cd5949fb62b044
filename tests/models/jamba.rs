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
use crate::hybrid_golden::{check, counts_its_states, rows_sum_to_one, sentence, stacked, Case, Replace};

use headscope::model::hooks::{At, Point};
use headscope::model::nn::Gates;
use headscope::model::Kind;
use tch::Tensor;

/// One checkpoint of make_tiny_hf_jamba.py against its goldens (its MASK), and the pattern a
/// Mamba layer shows: its channels' |alpha| by row, averaged over the group, as numpy's.
fn equals_transformers(name: &str, mask: &[&[f64]]) {
    twin_equals_transformers(name, None, mask);
}

/// [`equals_transformers`] of `name`, or of its GGUF twin `twin` against `name`'s goldens (held
/// to 1e-6 in float64: the twin's `ssm_a` is -exp(A_log) in float32).
fn twin_equals_transformers(name: &str, twin: Option<&str>, mask: &[&[f64]]) {
    let golden = crate::common::golden("tiny_hf/golden_jamba.npz");
    let run = check(&Case { name, golden: &golden, mixer: "mamba", alpha: Point::SsmAlpha, width: 4, mask, twin });
    let shown = stacked(&run.seen, Point::Pattern, &run.layers);
    let ds = max_diff(&shown, &golden[&format!("{name}_shown64_0")]);
    let tol = if twin.is_some() { 1e-6 } else { 1e-12 };
    assert!(ds < tol, "{name}: the shown pattern differs from numpy's by {ds:e}");
    rows_sum_to_one(name, &shown);
}

const JAMBA_MASK: [&[f64]; 4] = [&[1., 0., 1., 1.], &[1., 0., 1., 1.], &[0., 1., 1., 0.], &[1., 1., 0., 1.]];
const JAMBA_MOE_MASK: [&[f64]; 4] = [&[0., 1., 1., 1.], &[1., 1., 1., 0.], &[1., 0., 1., 1.], &[0., 1., 1., 1.]];

#[test]
fn jamba_equals_transformers() {
    equals_transformers("jamba", &JAMBA_MASK);
}

#[test]
fn jamba_with_experts_equals_transformers() {
    equals_transformers("jamba_moe", &JAMBA_MOE_MASK);
}

/// Both tiny Jamba checkpoints as llama.cpp's converter writes them in GGUF
/// (`tests/fixtures/make_tiny_gguf_hybrid.py`: the layer kinds in the per-layer `head_count_kv`
/// and the routers' presence, `ssm_a` = -exp(A_log), the squeezed convolution, stacked experts)
/// give their HF twins' goldens, closed groups and effective attention included, and count the
/// same parameters.
#[test]
fn jamba_gguf_equals_its_hf_twin() {
    twin_equals_transformers("jamba", Some("jamba_gguf"), &JAMBA_MASK);
    twin_equals_transformers("jamba_moe", Some("jamba_moe_gguf"), &JAMBA_MOE_MASK);
    assert_eq!(common::tiny_hf("jamba_moe_gguf", "f32").family_name(), "jamba (gguf)");
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
    let (t, mask) = sentence(&m, "the cat sat on the mat and the dog sat too");
    let _g = tch::no_grad_guard();
    for p in [Point::SsmAlpha, Point::Pattern] {
        let mut w = Replace::new(At::new(Kind::Dec, 2, p), |a: &Tensor| a.zeros_like(), vec![]);
        let err = m.net.encode(&t, &mask, &Gates::none(), Some(&mut w)).unwrap_err().to_string();
        assert!(err.contains("read only") && err.contains("layer 2") && err.contains("Mamba"), "{err}");
    }
    let base = m.net.encode(&t, &mask, &Gates::none(), None).unwrap();
    let mut w = Replace::new(At::new(Kind::Dec, 0, Point::SsmDt), |a: &Tensor| a * 2.0, vec![]);
    let changed = m.net.encode(&t, &mask, &Gates::none(), Some(&mut w)).unwrap();
    assert!(max_diff(&base, &changed) > 1e-6, "a write to ssm.hook_dt changes the output");
}

/// The key/value accounting of Jamba: attention layers grow (2 layers x 2 key/value groups x a
/// key and a value of 8 numbers per position), each Mamba channel group holds its channels'
/// states `16 x 4` and each Mamba layer its convolution's last 3 inputs of 64 channels; a
/// generation's cache holds exactly that.
#[test]
fn a_mamba_hybrid_counts_its_states_and_its_generation_holds_them() {
    let attention = |context: i64| 2 * 2 * context * (2 * 8) * 4;
    let mamba = 2 * (4 * 16 * 4 + 64 * 3) * 4;
    counts_its_states("jamba", |c| attention(c) + mamba, 2 * 2 + 2 * 4, |c| 2 * 2 * c + 2 * 4);
}
