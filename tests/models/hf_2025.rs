//! The 2025 decoders against transformers: tiny random mixtures of experts
//! (docs/methods.md#experts: Mixtral, OLMoE, Qwen2-MoE with a shared expert and a dense layer,
//! Qwen3-MoE; 4 experts, 2 per token), SmolLM3 (a layer without rotary) and OLMo-3 (a
//! sliding-window layer beside a global one) and their goldens from
//! `tests/fixtures/make_tiny_hf_2025.py` (eager attention). Token ids, logits and every head's attention within the float32 bound, greedy
//! continuations token for token, float64 within 1e-5 with heads closed at the output
//! projection too, parameter counts equal; the router's hook points; routing replaced through
//! `mlp.hook_router_weights` equals running the chosen experts by hand; an expert's output
//! zeroed and an expert routed around equal transformers'.

use crate::common;
use crate::hf_families::check_against;
use headscope::model::hooks::{At, Hooks, Point};
use headscope::model::nn::Gates;
use headscope::model::ModelError;
use tch::{Kind as DType, Tensor};

const FAMILIES: [&str; 4] = ["mixtral", "olmoe", "qwen2_moe", "qwen3_moe"];

#[test]
fn moe_decoders_equal_transformers() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    for name in FAMILIES {
        check_against(&g, name, name);
        let m = common::tiny_hf(name, "f32");
        let want = i64::try_from(&g[&format!("{name}_params")]).unwrap();
        assert_eq!(m.n_params, want, "{name}: parameters, headscope against transformers");
        let kinds: Vec<&str> = m.net.stack.iter().map(|l| l.mlp().kind()).collect();
        let want = if name == "qwen2_moe" { vec!["experts", "dense"] } else { vec!["experts", "experts"] };
        assert_eq!(kinds, want, "{name}: MLP kinds by layer");
    }
}

/// SmolLM3's layer without rotary (NoPE) and OLMo-3's sliding-window layer beside a global one
/// with its own rope_scaling: the same checks as every HF family.
#[test]
fn smollm3_and_olmo3_equal_transformers() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    for name in ["smollm3", "olmo3"] {
        check_against(&g, name, name);
        let m = common::tiny_hf(name, "f32");
        assert_eq!(m.n_params, i64::try_from(&g[&format!("{name}_params")]).unwrap(), "{name}: parameters");
    }
    let s = common::tiny_hf("smollm3", "f32");
    let rotary: Vec<bool> = s.net.stack.iter().map(|l| l.attention().unwrap().rotary.is_some()).collect();
    assert_eq!(rotary, vec![true, false], "smollm3: rotary by layer");
    let o = common::tiny_hf("olmo3", "f32");
    let windows: Vec<Option<i64>> = o.net.stack.iter().map(|l| l.window()).collect();
    assert_eq!(windows, vec![Some(5), None], "olmo3: windows by layer");
}

/// Two loader defaults against transformers (`make_tiny_hf_2025.py`'s variants): Qwen3-MoE with
/// `decoder_sparse_step` 2 (layer 1 of three has experts, the others a dense MLP) and
/// `norm_topk_prob: false`; OLMo-3 with `layer_types` deleted from its config.json (both sides take
/// the default: three sliding-window layers in four).
#[test]
fn loader_defaults_equal_transformers() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    for name in ["qwen3_moe_sparse", "olmo3_default_layers"] {
        check_against(&g, name, name);
        let m = common::tiny_hf(name, "f32");
        assert_eq!(m.n_params, i64::try_from(&g[&format!("{name}_params")]).unwrap(), "{name}: parameters");
    }
    let q = common::tiny_hf("qwen3_moe_sparse", "f32");
    let kinds: Vec<&str> = q.net.stack.iter().map(|l| l.mlp().kind()).collect();
    assert_eq!(kinds, vec!["dense", "experts", "dense"], "qwen3_moe_sparse: MLP kinds by layer");
    let o = common::tiny_hf("olmo3_default_layers", "f32");
    let windows: Vec<Option<i64>> = o.net.stack.iter().map(|l| l.window()).collect();
    assert_eq!(windows, vec![Some(5), Some(5), Some(5), None], "olmo3_default_layers: windows by layer");
}

/// Replaces layer 0's routing by `weights` (same shape) and records the experts' output.
struct Reroute {
    weights: Option<Tensor>,
    seen: Vec<(At, Tensor)>,
}

impl Hooks for Reroute {
    fn wants(&self, at: At) -> bool {
        at.layer == 0 && matches!(at.point, Point::RouterLogits | Point::RouterWeights | Point::MlpOut | Point::Ln2)
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        self.seen.push((at, x.shallow_clone()));
        Ok(match (at.point, &self.weights) {
            (Point::RouterWeights, Some(w)) => Some(w.shallow_clone()),
            _ => None,
        })
    }
}

/// The router's points hold what the family computes: the weights are the top two of the
/// softmax of the logits (renormalised by Mixtral, not by OLMoE), zero elsewhere; and the
/// routing replaced at `mlp.hook_router_weights` (one expert forced per token) gives
/// `hook_mlp_out` = that expert's SwiGLU times its weight, computed here by hand from the
/// checkpoint's weights.
#[test]
fn the_router_hooks_hold_the_routing_and_a_replacement_reroutes() {
    let _g = tch::no_grad_guard();
    for (name, renormalised) in [("mixtral", true), ("olmoe", false)] {
        let m = common::tiny_hf(name, "f32");
        let ids = Tensor::from_slice(&m.tokenize("The cat sat on the mat.").unwrap().ids).view([1, -1]);
        let mask = Tensor::ones(ids.size(), (DType::Float, tch::Device::Cpu));
        let mut r = Reroute { weights: None, seen: vec![] };
        let _ = m.net.encode(&ids, &mask, &Gates::none(), Some(&mut r)).unwrap();
        let get = |seen: &[(At, Tensor)], p: Point| seen.iter().find(|(a, _)| a.point == p).unwrap().1.shallow_clone();
        let (logits, weights) = (get(&r.seen, Point::RouterLogits), get(&r.seen, Point::RouterWeights));
        let p = logits.softmax(-1, DType::Float);
        let (top, idx) = p.topk(2, -1, true, true);
        let top = if renormalised { &top / top.sum_dim_intlist([-1i64].as_slice(), true, DType::Float) } else { top };
        let want = p.zeros_like().scatter(-1, &idx, &top);
        assert!(common::max_diff(&weights, &want) < 1e-6, "{name}: routing weights");
        assert_eq!(
            weights.ne(0.0).sum(DType::Int64).int64_value(&[]),
            2 * ids.size()[1],
            "{name}: two experts per token"
        );

        // Force expert 3 alone, weight 0.5, on every token.
        let forced = weights.zeros_like();
        let _ = forced.narrow(-1, 3, 1).fill_(0.5);
        let mut r2 = Reroute { weights: Some(forced), seen: vec![] };
        let _ = m.net.encode(&ids, &mask, &Gates::none(), Some(&mut r2)).unwrap();
        let x = get(&r2.seen, Point::Ln2);
        let out = get(&r2.seen, Point::MlpOut);
        let dense = m.net.stack[0].mlp();
        assert_eq!(dense.kind(), "experts");
        let mut params = Vec::new();
        let mut net = common::tiny_hf(name, "f32");
        net.net.stack[0].params_mut("", &mut params);
        let w =
            |n: &str| params.iter().find(|(k, _)| k == n).unwrap_or_else(|| panic!("{name}: no {n}")).1.shallow_clone();
        let (wg, wu, wd) = (w("mlp.experts.3.W_gate"), w("mlp.experts.3.W_in"), w("mlp.experts.3.W_out"));
        let by_hand = (x.matmul(&wg.tr()).silu() * x.matmul(&wu.tr())).matmul(&wd.tr()) * 0.5;
        let d = common::max_diff(&out, &by_hand);
        assert!(d < 1e-5, "{name}: the rerouted MLP differs from expert 3 by hand by {d:e}");
    }
}

/// An expert of one layer ablated through the router's hook points (docs/methods.md#experts).
pub(crate) struct AblateExpert {
    pub layer: usize,
    pub expert: i64,
    /// Routed around (its logit set to minus infinity), else its output zeroed (its weight).
    pub route: bool,
}

impl Hooks for AblateExpert {
    fn wants(&self, at: At) -> bool {
        at.layer == self.layer && at.point == if self.route { Point::RouterLogits } else { Point::RouterWeights }
    }
    fn visit(&mut self, _: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        let fill = if self.route { f64::NEG_INFINITY } else { 0.0 };
        Ok(Some(x.index_fill(-1, &Tensor::from_slice(&[self.expert]), fill)))
    }
}

/// The two ablations of an expert, against transformers: its output zeroed where it is chosen
/// equals transformers with the expert's down projection zeroed, and routing around it equals
/// transformers with its router logit at minus infinity (Mixtral renormalised, OLMoE not,
/// Qwen2-MoE with its shared expert); both move the logits.
#[test]
fn an_expert_zeroed_or_routed_around_equals_transformers() {
    let _g = tch::no_grad_guard();
    let g = common::golden("tiny_hf/golden_2025.npz");
    for name in ["mixtral", "olmoe", "qwen2_moe"] {
        let m = common::tiny_hf(name, "f32");
        let text = &common::short_pud_sentences(1)[0];
        let ids = m.tokenize(text).unwrap().ids;
        let t = Tensor::from_slice(&ids).view([1, -1]);
        let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
        let logits = |h: &mut dyn Hooks| {
            m.net.logits(&m.net.encode(&t, &mask, &Gates::none(), Some(h)).unwrap()).unwrap().get(0)
        };
        let plain = m.net.logits(&m.net.encode(&t, &mask, &Gates::none(), None).unwrap()).unwrap().get(0);
        let depth = common::depth(&m, ids.len());
        for (route, key) in [(false, "zeroed"), (true, "routed")] {
            let want = &g[&format!("{name}_expert_{key}_0")];
            let got = logits(&mut AblateExpert { layer: 0, expert: 1, route });
            let d = common::max_diff(&got, want) / common::f32_bound(common::scale(want), depth);
            assert!(d <= 1.0, "{name}: expert 1 {key}: {d:.3} of the float32 bound from transformers");
            assert!(common::max_diff(&got, &plain) > 1e-4, "{name}: expert 1 {key} moved nothing");
        }
    }
}

/// gpt-oss (docs/methods.md#attention-sinks): learned sinks, alternating sliding and global
/// layers, YaRN, biased projections, a biased router softmaxing its top two logits and clamped
/// SwiGLU experts: the same checks as every HF family. Each head's sink mass (one minus the row
/// sums of `hook_pattern`) is what transformers' attention leaves (within the float32 bound),
/// and somewhere more than 1% of a row.
#[test]
fn gpt_oss_with_attention_sinks_equals_transformers() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    check_against(&g, "gpt_oss", "gpt_oss");
    let m = common::tiny_hf("gpt_oss", "f32");
    assert_eq!(m.n_params, i64::try_from(&g["gpt_oss_params"]).unwrap(), "gpt_oss: parameters");
    let windows: Vec<Option<i64>> = m.net.stack.iter().map(|l| l.window()).collect();
    assert_eq!(windows, vec![Some(5), None], "gpt_oss: windows by layer");
    let _g = tch::no_grad_guard();
    let ids = Vec::<i64>::try_from(&g["gpt_oss_ids_0"]).unwrap();
    let t = Tensor::from_slice(&ids).view([1, -1]);
    let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
    let (seen, _) = common::recorded(&[Point::Pattern], |r| m.net.encode(&t, &mask, &Gates::none(), Some(r)).unwrap());
    let ours: Vec<Tensor> = common::at_point(&seen, Point::Pattern).iter().map(|a| a.get(0)).collect();
    let ours = Tensor::stack(&ours, 0); // [L, H, T, T]
    let sink = |a: &Tensor| a.sum_dim_intlist([-1i64].as_slice(), false, DType::Double).neg() + 1.0;
    let d = common::max_diff(&sink(&ours), &sink(&g["gpt_oss_attn_0"]));
    assert!(d < 1e-5, "gpt_oss: sink mass differs from transformers' by {d:e}");
    let most = sink(&ours).max().double_value(&[]);
    assert!(most > 0.01, "gpt_oss: no head's sink took more than {most:e} of a row: the sinks are not exercised");
}

/// LRP's rules know the dense MLP and refuse the experts in one line naming the kind; AttnLRP
/// runs through them (the router's weights as fixed gates, each expert a SwiGLU under its
/// rules), gpt-oss's clamped experts included.
#[test]
fn lrp_refuses_experts_and_attnlrp_runs_through_them() {
    crate::hf_families::lrp_refuses_and_attnlrp_runs("mixtral", "experts");
    crate::hf_families::lrp_refuses_and_attnlrp_runs("gpt_oss", "experts");
}
