//! Llama 4's text model against transformers (`llama4_text`; docs/methods.md#experts,
//! docs/methods.md#llama-4): a tiny random checkpoint from `tests/fixtures/make_tiny_hf_2025.py`
//! (eager attention) with layer 0 rotary, its queries and keys normed by their RMS, attending
//! within chunks of 6 positions, and a dense MLP; layer 1 without rotary, with the attention
//! temperature (floor_scale 4, attn_scale 0.5), four fused experts of which the sigmoids of the
//! top two logits weigh the inputs, and a shared expert. Logits and attention within the
//! float32 bound, greedy continuations (with the cache, across chunks), float64 within 1e-10
//! with heads closed at the output projection too, parameter counts equal; an expert zeroed or
//! routed around equals transformers'; `prune_experts` equals routing around.

use crate::common;
use crate::deepseek::logits;
use crate::hf_2025::AblateExpert;
use crate::hf_families::{check_against, float64_diffs};
use headscope::analysis::experts::{prune_experts, ExpertAblation, ExpertEdit, ExpertId};

#[test]
fn llama4_text_equals_transformers() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    check_against(&g, "llama4_text", "llama4_text");
    let m = common::tiny_hf("llama4_text", "f32");
    assert_eq!(m.n_params, i64::try_from(&g["llama4_text_params"]).unwrap(), "parameters");
    let kinds: Vec<&str> = m.net.stack.iter().map(|l| l.mlp().kind()).collect();
    assert_eq!(kinds, vec!["dense", "experts"], "MLP kinds by layer");
    let chunks: Vec<Option<i64>> = m.net.stack.iter().map(|l| l.chunk()).collect();
    assert_eq!(chunks, vec![Some(6), None], "chunks by layer");
    let text = &common::short_pud_sentences(1)[0];
    assert!(m.tokenize(text).unwrap().ids.len() > 6, "the first sentence crosses a chunk");
    let (dl, da, dm) = float64_diffs(&g, "llama4_text", "llama4_text", text).expect("float64 goldens");
    assert!(dl < 1e-10 && da < 1e-10 && dm < 1e-10, "float64: logits {dl:e}, attention {da:e}, gated {dm:e}");
}

#[test]
fn a_llama4_expert_zeroed_or_routed_around_equals_transformers_and_pruning() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    let m = common::tiny_hf("llama4_text", "f32");
    let text = &common::short_pud_sentences(1)[0];
    let plain = logits(&m, None, text);
    let depth = common::depth(&m, m.tokenize(text).unwrap().ids.len());
    for (route, key) in [(false, "zeroed"), (true, "routed")] {
        let want = &g[&format!("llama4_text_expert_{key}_0")];
        let got = logits(&m, Some(&mut AblateExpert { layer: 1, expert: 1, route }), text);
        let d = common::max_diff(&got, want) / common::f32_bound(common::scale(want), depth);
        assert!(d <= 1.0, "expert 1 {key}: {d:.3} of the float32 bound from transformers");
        assert!(common::max_diff(&got, &plain) > 1e-4, "expert 1 {key} moved nothing");
    }
    let ids = [ExpertId { layer: 1, expert: 1 }, ExpertId { layer: 1, expert: 2 }];
    let mut routed = ExpertEdit::ablate(&m, &ids, ExpertAblation::Route).unwrap();
    let want = logits(&m, Some(&mut routed), text);
    let p = prune_experts(&m, &ids).unwrap();
    let d = common::max_diff(&logits(&p, None, text), &want);
    assert!(d < 1e-5, "pruned against routed around: {d:e}");
}

/// LRP's rules refuse the experts in one line; AttnLRP runs through experts that read their
/// input times the router's weight (held fixed).
#[test]
fn lrp_refuses_and_attnlrp_runs_through_input_scaled_experts() {
    crate::hf_families::lrp_refuses_and_attnlrp_runs("llama4_text", "experts");
}
