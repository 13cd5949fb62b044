//! Experts as units (docs/methods.md#experts-as-units) on the tiny mixtures of experts of
//! `tests/fixtures/make_tiny_hf_2025.py`: `prune_experts` equals routing around the experts it
//! removes (and routing around equals transformers', `hf_2025.rs`); the sweep's cells equal
//! each ablation computed another way (the pruned model; the expert's down projection zeroed);
//! gradient importance equals a central difference of the loss in float64; the router's
//! statistics count real tokens only; bad expert numbers are refused in one line.

use crate::common;
use headscope::analysis::ablation::{evaluate, prepare, Metric, Prepared};
use headscope::analysis::experts::{
    check_expert, expert_importance, expert_sweep, layer_experts, prune_experts, router_stats, ExpertAblation,
    ExpertEdit, ExpertId,
};
use headscope::data::Dataset;
use headscope::model::nn::Gates;
use headscope::model::Model;
use tch::{Kind as DType, Tensor};

fn e(layer: usize, expert: usize) -> ExpertId {
    ExpertId { layer, expert }
}

fn data(dir: &std::path::Path, lines: &[&str]) -> Dataset {
    let p = dir.join("data.txt");
    std::fs::write(&p, lines.join("\n")).unwrap();
    Dataset::corpus(&p).unwrap()
}

const SENTENCES: [&str; 3] =
    ["the cat sat on the mat and looked at the door", "a dog ran", "birds sing in the early morning light"];

fn logits(m: &Model, edit: Option<&mut ExpertEdit>) -> Tensor {
    let _g = tch::no_grad_guard();
    let ids = m.tokenize(SENTENCES[0]).unwrap().ids;
    let t = Tensor::from_slice(&ids).view([1, -1]);
    let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
    let h = edit.map(|e| e as &mut dyn headscope::model::hooks::Hooks);
    m.net.logits(&m.net.encode(&t, &mask, &Gates::none(), h).unwrap()).unwrap()
}

fn param_count(m: &mut Model, part: &str) -> i64 {
    m.net.named_params_mut().iter().filter(|(n, _)| n.contains(part)).map(|(_, t)| t.numel() as i64).sum()
}

/// `prune_experts` removes each expert's weights and its router row, keeps the others'
/// numbers, and computes what routing around them computes, on every routing the families
/// use (Mixtral renormalised, OLMoE not, Qwen2-MoE with a shared expert, gpt-oss's top-k
/// softmax with a router bias).
#[test]
fn prune_experts_equals_routing_around() {
    let _g = common::heavy();
    for name in ["mixtral", "olmoe", "qwen2_moe", "gpt_oss"] {
        let mut m = common::tiny_hf(name, "f32");
        let drop: Vec<ExpertId> =
            if name == "qwen2_moe" { vec![e(0, 1), e(0, 3)] } else { vec![e(0, 1), e(1, 2), e(1, 0)] };
        let mut routed = ExpertEdit::ablate(&m, &drop, ExpertAblation::Route).unwrap();
        let want = logits(&m, Some(&mut routed));
        let plain = logits(&m, None);
        let mut p = prune_experts(&m, &drop).unwrap();
        let got = logits(&p, None);
        let d = common::max_diff(&got, &want);
        assert!(d < 1e-5, "{name}: pruned against routed around: {d:e}");
        assert!(common::max_diff(&got, &plain) > 1e-4, "{name}: pruning moved nothing");
        let kept: Vec<Vec<usize>> = (0..2).map(|l| layer_experts(&p, l).map_or(vec![], |x| x.ids().to_vec())).collect();
        let want_ids = if name == "qwen2_moe" { vec![vec![0, 2], vec![]] } else { vec![vec![0, 2, 3], vec![1, 3]] };
        assert_eq!(kept, want_ids, "{name}: experts kept, by their numbers");
        // Each removed expert's weights and its router row (and bias) are gone.
        let d_model = m.net.d_model;
        let mut gone = 0;
        for id in &drop {
            gone += param_count(&mut m, &format!("blocks.{}.mlp.experts.{}.", id.layer, id.expert));
            gone += d_model + if name == "gpt_oss" { 1 } else { 0 };
        }
        assert_eq!(m.n_params - p.n_params, gone, "{name}: parameters removed");
        assert_eq!(p.count_params(), p.n_params, "{name}: the pruned model's count");
        // A second pruning is refused (prune the original), as prune_heads refuses.
        let again = prune_experts(&p, &[e(0, 0)]).err().expect("pruning a pruned model");
        assert!(again.to_string().contains("already pruned"), "{again}");
    }
    // A model pruned at a layer's last expert is pruned too: a reload (another prune, head
    // pruning, a move) would bring the expert back, and is refused.
    let m = common::tiny_hf("mixtral", "f32");
    let tail = prune_experts(&m, &[e(1, 3)]).unwrap();
    assert_eq!(tail.experts_removed(), 1);
    let again = prune_experts(&tail, &[e(0, 0)]).err().expect("pruning a pruned model").to_string();
    assert!(again.contains("already pruned"), "{again}");
    let heads = headscope::prune::physical::prune_heads(&tail, &[], None).err().expect("prune_heads on it").to_string();
    assert!(heads.contains("already pruned"), "{heads}");
    // Routing around too many experts is refused as pruning them is.
    let many = ExpertEdit::ablate(&m, &[e(0, 0), e(0, 1), e(0, 2)], ExpertAblation::Route).err().unwrap().to_string();
    assert!(many.contains("leaves 1, fewer than the 2"), "{many}");
    // Too few left to route to, an expert out of range, a dense layer, a dense model.
    let few = prune_experts(&m, &[e(0, 0), e(0, 1), e(0, 2)]).err().unwrap().to_string();
    assert!(few.contains("layer 0 would keep 1 experts, fewer than the 2"), "{few}");
    for (id, want) in [(e(0, 4), "0.e4: layer 0 has experts 0..3"), (e(2, 0), "layer 2 out of range")] {
        let msg = check_expert(&m, id).err().unwrap().to_string();
        assert!(msg.contains(want) && msg.lines().count() == 1, "{id}: {msg}");
    }
    let q = common::tiny_hf("qwen2_moe", "f32");
    let msg = check_expert(&q, e(1, 0)).err().unwrap().to_string();
    assert!(msg.contains("layer 1 of") && msg.contains("is dense (its expert layers: 0)"), "{msg}");
    let dense = common::tiny_hf("smollm3", "f32");
    let msg = check_expert(&dense, e(0, 0)).err().unwrap().to_string();
    assert!(msg.contains("has no mixture-of-experts layers"), "{msg}");
}

/// The sweep's cells against each ablation computed otherwise: routing around = the pruned
/// model's metric; the output zeroed = the model with that expert's down projection zeroed
/// (the router still picks it). Every expert moves the loss.
#[test]
fn an_expert_sweep_equals_each_ablation_computed_otherwise() {
    let _g = common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), &SENTENCES);
    let m = common::tiny_hf("mixtral", "f32");
    let prep = |m: &Model| -> Prepared { prepare(m, &d, Metric::Loss, 4096, Gates::none()).unwrap() };
    let p = prep(&m);
    let base = evaluate(&m, &p, &p.base, &|| false).unwrap();
    let route = expert_sweep(&m, &p, ExpertAblation::Route, &|| false, &mut |_, _| {}).unwrap();
    let output = expert_sweep(&m, &p, ExpertAblation::Output, &|| false, &mut |_, _| {}).unwrap();
    assert_eq!((route.len(), route[0].len(), output[1].len()), (2, 4, 4));
    for l in 0..2 {
        for x in 0..4 {
            let pruned = prune_experts(&m, &[e(l, x)]).unwrap();
            let want = evaluate(&pruned, &prep(&pruned), &Gates::none(), &|| false).unwrap();
            let got = route[l][x];
            assert!((got - want).abs() < 1e-5, "{l}.e{x} routed around: sweep {got}, pruned {want}");
            let mut zeroed = common::tiny_hf("mixtral", "f32");
            for (n, t) in zeroed.net.named_params_mut() {
                if n == format!("dec.blocks.{l}.mlp.experts.{x}.W_out") {
                    let _ = t.f_zero_().unwrap();
                }
            }
            let want = evaluate(&zeroed, &prep(&zeroed), &Gates::none(), &|| false).unwrap();
            let got = output[l][x];
            assert!((got - want).abs() < 1e-5, "{l}.e{x} output zeroed: sweep {got}, weights zeroed {want}");
            assert!((got - base).abs() > 1e-6 && (route[l][x] - base).abs() > 1e-6, "{l}.e{x} moved nothing");
        }
    }
    // On a pruned model, a removed expert has no cell.
    let pruned = prune_experts(&m, &[e(0, 2)]).unwrap();
    let g = expert_sweep(&pruned, &prep(&pruned), ExpertAblation::Route, &|| false, &mut |_, _| {}).unwrap();
    assert!(g[0][2].is_nan() && !g[0][3].is_nan() && !g[1][2].is_nan(), "{g:?}");
}

/// Gradient importance is |dL/dg| of a gate on the expert's weights: a central difference of
/// the loss (one sentence, float64) with the gate at 1 +- 1e-4 agrees; an expert no token
/// chose has importance 0.
#[test]
fn expert_importance_is_the_loss_gradient_in_a_gate() {
    let _g = common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), &SENTENCES[..1]);
    let m = common::tiny_hf("olmoe", "f64");
    let imp = expert_importance(&m, &d, &Gates::none(), 4096, &|| false, &mut |_, _| {}).unwrap();
    let p = prepare(&m, &d, Metric::Loss, 4096, Gates::none()).unwrap();
    let h = 1e-4;
    let mut nonzero = 0;
    for (l, row) in imp.iter().enumerate() {
        for (x, &got) in row.iter().enumerate() {
            let at = |g: f64| {
                let mut gate = vec![1.0f64; 4];
                gate[x] = g;
                let t = Tensor::from_slice(&gate).view([1, 1, 4]).to_kind(DType::Double);
                let mut edit = ExpertEdit::gated(&m, vec![(l, t)]);
                headscope::analysis::ablation::evaluate_hooked(&m, &p, &p.base, Some(&mut edit), &|| false)
                    .unwrap()
                    .value()
            };
            let fd = ((at(1.0 + h) - at(1.0 - h)) / (2.0 * h)).abs();
            assert!((got - fd).abs() <= 1e-4 * fd.max(1e-3), "{l}.e{x}: importance {got}, central difference {fd}");
            nonzero += (got > 1e-9) as usize;
        }
    }
    assert!(imp.len() == 2 && nonzero >= 4, "importances: {imp:?}");
}

/// The router's statistics: loads sum to the experts per token, co-selection's diagonal is the
/// load, entropy lies in [0, ln n]; padding takes no part (two sentences batched together give
/// the token-weighted mean of each alone).
#[test]
fn router_stats_count_real_tokens() {
    let _g = common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = common::tiny_hf("mixtral", "f32");
    let stats = |lines: &[&str]| router_stats(&m, &data(dir.path(), lines), &Gates::none(), 4096, &|| false).unwrap();
    let both = stats(&SENTENCES[..2]);
    let (a, b) = (stats(&SENTENCES[..1]), stats(&SENTENCES[1..2]));
    assert_eq!(both.len(), 2);
    for ((s, x), y) in both.iter().zip(&a).zip(&b) {
        assert_eq!(s.tokens, x.tokens + y.tokens, "layer {}: tokens", s.layer);
        assert!(x.tokens > y.tokens, "the two sentences differ in length");
        let (wa, wb) = (x.tokens as f64 / s.tokens as f64, y.tokens as f64 / s.tokens as f64);
        for i in 0..4 {
            let mix = wa * x.load[i] + wb * y.load[i];
            assert!((s.load[i] - mix).abs() < 1e-9, "layer {} expert {i}: load {} against {mix}", s.layer, s.load[i]);
            let mix = wa * x.weight[i] + wb * y.weight[i];
            assert!((s.weight[i] - mix).abs() < 1e-6, "layer {} expert {i}: weight", s.layer);
            assert!((s.co_selection[i][i] - s.load[i]).abs() < 1e-12, "co-selection's diagonal");
        }
        assert!((s.entropy - (wa * x.entropy + wb * y.entropy)).abs() < 1e-6, "layer {}: entropy", s.layer);
        assert!((s.load.iter().sum::<f64>() - 2.0).abs() < 1e-9, "layer {}: loads sum to top_k", s.layer);
        assert!((s.weight.iter().sum::<f64>() - 1.0).abs() < 1e-5, "layer {}: Mixtral's weights renormalised", s.layer);
        assert!(s.entropy > 0.0 && s.entropy <= 4f64.ln() + 1e-9, "layer {}: entropy {}", s.layer, s.entropy);
    }
}

/// The tiny Mixtral with layer 0 planted, routed to one expert per token (weight 1): router
/// rows `a, -a, -0.999 a, 0`, so each token goes to expert 0 (where `a x > 0`) or expert 1;
/// expert 2 is a copy of expert 1 (the router ranks it just below: routed around expert 1, a
/// token goes to its twin, and nothing changes), both with their output a fifth of expert 1's
/// as loaded; expert 3 is dead (its output is zero, and the router, whose row for it is zero,
/// never ranks it first); expert 0 is vital (its output four times larger; routed around it,
/// its tokens go to the dead expert).
fn planted(lines: &[String]) -> Model {
    let _g = tch::no_grad_guard();
    let mut m = common::tiny_hf("mixtral", "f32");
    // `a`: the mean direction of layer 0's MLP inputs over `lines`, so that most tokens go to
    // the vital expert.
    let mut sum = Tensor::zeros([m.net.d_model], (DType::Float, tch::Device::Cpu));
    for line in lines {
        let ids = m.tokenize(line).unwrap().ids;
        let t = Tensor::from_slice(&ids).view([1, -1]);
        let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
        let (seen, _) = common::recorded(&[headscope::model::hooks::Point::Ln2], |r| {
            m.net.encode(&t, &mask, &Gates::none(), Some(r)).unwrap()
        });
        sum += seen[0].1.reshape([-1, m.net.d_model]).sum_dim_intlist([0i64].as_slice(), false, DType::Float);
    }
    {
        let any = m.net.stack[0].mlp_mut().as_any_mut().unwrap();
        let ex = any.downcast_mut::<headscope::model::experts::Experts>().unwrap();
        ex.top_k = 1;
        let a = &sum / sum.norm() * ex.router.w.get(0).norm();
        ex.router.w = Tensor::stack(&[a.copy(), -&a, &a * -0.999, a.zeros_like()], 0);
    }
    let name = |e: usize, w: &str| format!("dec.blocks.0.mlp.experts.{e}.{w}");
    let mut params = m.net.named_params_mut();
    for (n, t) in params.iter_mut() {
        if *n == name(1, "W_out") {
            let _ = t.f_mul_scalar_(0.2).unwrap();
        }
    }
    let ones: Vec<(String, Tensor)> =
        params.iter().filter(|(n, _)| n.starts_with(&name(1, ""))).map(|(n, t)| (n.clone(), t.copy())).collect();
    assert_eq!(ones.len(), 3, "expert 1's three projections");
    for (n, t) in params.iter_mut() {
        if let Some((_, src)) = ones.iter().find(|(o, _)| o.replace(".experts.1.", ".experts.2.") == *n) {
            t.copy_(src);
        } else if *n == name(3, "W_out") {
            let _ = t.zero_();
        } else if *n == name(0, "W_out") {
            let _ = t.f_mul_scalar_(4.0).unwrap();
        }
    }
    m
}

/// The planted experts of layer 0: brute-force removal (each routed around alone, KL to the
/// planted model) finds the twins and the dead expert free to remove and the vital one not;
/// the sweep, gradient importance and L0 gates agree: the vital expert ranks first, the dead
/// expert and the twin the router never picks have importance 0, and L0 closes them and
/// keeps the vital one.
#[test]
fn a_planted_moe_is_ranked_as_brute_force_removal_ranks_it() {
    let _g = common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = common::short_pud_sentences(8);
    let d = data(dir.path(), &lines.iter().map(String::as_str).collect::<Vec<_>>());
    let m = planted(&lines);
    let p = prepare(&m, &d, Metric::Kl, 4096, Gates::none()).unwrap();
    let truth: Vec<f64> = (0..4)
        .map(|x| {
            headscope::analysis::experts::evaluate_ablated(&m, &p, &[e(0, x)], ExpertAblation::Route, &|| false)
                .unwrap()
                .value()
        })
        .collect();
    assert!(truth[0] > 1e-2, "routing around the vital expert costs: {truth:?}");
    for x in 1..4 {
        assert!(truth[x].abs() < 1e-9, "expert {x} is free to remove alone: {truth:?}");
    }
    let sweep = expert_sweep(&m, &p, ExpertAblation::Route, &|| false, &mut |_, _| {}).unwrap();
    assert_eq!(sweep[0], truth, "the sweep is brute-force removal");
    let imp = expert_importance(&m, &d, &Gates::none(), 4096, &|| false, &mut |_, _| {}).unwrap();
    let top = (0..4).max_by(|&a, &b| imp[0][a].total_cmp(&imp[0][b])).unwrap();
    assert_eq!(top, 0, "the vital expert is the most important: {:?}", imp[0]);
    assert!(imp[0][2] == 0.0 && imp[0][3] == 0.0, "never chosen, no gradient: {:?}", imp[0]);
    assert!(imp[0][1] > 0.0, "the twin the router picks has a gradient: {:?}", imp[0]);
    let opts = headscope::prune::experts::ExpertL0Options {
        lambda: 0.01,
        steps: 60,
        lr: 0.1,
        batch_tokens: 4096,
        seed: 1,
        init: 2.0,
        objective: headscope::prune::experts::ExpertObjective::Kl,
    };
    let r = headscope::prune::experts::expert_l0(&m, &d, &opts, &|| false, &mut |_, _| {}).unwrap();
    let closed: Vec<usize> = r.closed.iter().filter(|c| c.layer == 0).map(|c| c.expert).collect();
    assert!(
        closed.contains(&2) && closed.contains(&3),
        "L0 closes the dead expert and a twin: {closed:?} {:?}",
        r.p_open
    );
    assert!(!closed.contains(&0), "L0 keeps the vital expert: {closed:?} {:?}", r.p_open);
    assert!(r.p_open[0][0] > r.p_open[0][2].max(r.p_open[0][3]), "{:?}", r.p_open);
    eprintln!("planted layer 0: removal KL {truth:?}, importance {:?}, L0 P(open) {:?}", imp[0], r.p_open[0]);
    let (first, last) = (r.curve[0], r.curve[r.curve.len() - 1]);
    assert!(last.2 < first.2, "the expected open experts fall: {first:?} -> {last:?}");
}

/// A copy of the tiny checkpoint `name` with its config.json edited, loaded (float32, unknown
/// keys refused).
pub(crate) fn edited(name: &str, edit: &dyn Fn(&mut serde_json::Value)) -> (tempfile::TempDir, Result<Model, String>) {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(common::tiny_hf_dir().join(name)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let p = dir.path().join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&p, serde_json::to_string(&c).unwrap()).unwrap();
    let opts =
        headscope::model::LoadOptions { device: tch::Device::Cpu, dtype: DType::Float, allow_unknown_config: false };
    let m = Model::load(dir.path(), opts).map_err(|e| e.to_string());
    (dir, m)
}

/// Bad MoE configs are refused in one line naming the file and the key: a field no family
/// reads, more experts per token than experts.
#[test]
fn bad_moe_configs_are_one_line_errors_naming_the_key() {
    let (d, m) = edited("mixtral", &|c| c["router_temperature"] = serde_json::json!(2.0));
    let e = m.err().expect("an unknown MoE field");
    let file = d.path().join("config.json").display().to_string();
    assert!(e.contains("router_temperature") && e.contains(&file) && e.lines().count() == 1, "{e}");
    let (_d, m) = edited("olmoe", &|c| c["num_experts_per_tok"] = serde_json::json!(9));
    let e = m.err().expect("9 of 4 experts");
    assert!(e.contains("num_experts_per_tok 9 must be between 1 and the 4 experts") && e.lines().count() == 1, "{e}");
}

/// gpt-oss's clamped SwiGLU reads `swiglu_limit` and `swiglu_alpha` (transformers 5 does): a
/// tighter limit moves the logits; a limit that is not a positive number is refused in one line
/// naming the key.
#[test]
fn gpt_oss_reads_its_swiglu_limit() {
    let _g = common::heavy();
    let with = |edit: &dyn Fn(&mut serde_json::Value)| edited("gpt_oss", edit);
    let plain = logits(&common::tiny_hf("gpt_oss", "f32"), None);
    let (_d, m) = with(&|c| c["swiglu_limit"] = serde_json::json!(7.0));
    assert!(common::max_diff(&logits(&m.unwrap(), None), &plain) == 0.0, "the default limit, written out");
    let (_d, m) = with(&|c| c["swiglu_limit"] = serde_json::json!(1.0));
    assert!(common::max_diff(&logits(&m.unwrap(), None), &plain) > 1e-4, "a limit of 1 clamps more");
    let (_d, m) = with(&|c| c["swiglu_limit"] = serde_json::json!(-1.0));
    let e = m.err().expect("a negative limit");
    assert!(e.contains("swiglu_limit -1 must be a positive number") && e.lines().count() == 1, "{e}");
}

/// `mlp.hook_expert_out` holds each expert's weighted output, seen per expert as heads are
/// (`[B, expert, T, D]`): zero where the router did not choose the expert, summing to the
/// routed output (`hook_mlp_out` less Qwen2-MoE's `mlp.hook_shared_out`); reading it changes
/// nothing, and an intervention zeroing one expert there (patching its output, as a head's
/// `hook_z` is patched) equals the expert's output ablation.
#[test]
fn each_experts_output_is_a_hook_point() {
    use headscope::model::hooks::{At, Intervention, Interventions, Op, Point};
    let _g = common::heavy();
    let _ng = tch::no_grad_guard();
    for name in ["mixtral", "qwen2_moe", "gpt_oss"] {
        let m = common::tiny_hf(name, "f32");
        let ids = m.tokenize(SENTENCES[0]).unwrap().ids;
        let t = Tensor::from_slice(&ids).view([1, -1]);
        let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
        let plain = m.net.logits(&m.net.encode(&t, &mask, &Gates::none(), None).unwrap()).unwrap();
        let points = [Point::RouterWeights, Point::ExpertOut, Point::SharedOut, Point::MlpOut];
        let (seen, enc) = common::recorded(&points, |r| m.net.encode(&t, &mask, &Gates::none(), Some(r)).unwrap());
        assert_eq!(common::max_diff(&m.net.logits(&enc).unwrap(), &plain), 0.0, "{name}: reading changes nothing");
        let layer0 = |p: Point| seen.iter().find(|(a, _)| a.layer == 0 && a.point == p).map(|(_, v)| v.shallow_clone());
        let (w, each, out) =
            (layer0(Point::RouterWeights).unwrap(), layer0(Point::ExpertOut).unwrap(), layer0(Point::MlpOut).unwrap());
        assert_eq!(each.size(), [1, 4, ids.len() as i64, m.net.d_model], "{name}: [B, expert, T, D]");
        // Zero exactly where the router gave no weight.
        let silent = w.eq(0.0).transpose(1, 2).unsqueeze(-1);
        assert_eq!(f64::try_from(each.abs().masked_select(&silent).sum(DType::Double)).unwrap(), 0.0, "{name}");
        let routed = each.sum_dim_intlist([1i64].as_slice(), false, DType::Float);
        let shared = layer0(Point::SharedOut);
        assert_eq!(shared.is_some(), name == "qwen2_moe", "{name}: a shared expert's point");
        let want = match &shared {
            Some(s) => &out - s,
            None => out.shallow_clone(),
        };
        assert!(common::max_diff(&routed, &want) < 1e-5, "{name}: experts sum to the routed output");
        // Patching expert 1's output to zero = its output ablation.
        let at = At::new(headscope::model::Kind::Dec, 0, Point::ExpertOut);
        let mut patch = Interventions {
            list: vec![Intervention {
                at,
                op: Op::Replace(Tensor::zeros([1], (DType::Float, tch::Device::Cpu))),
                heads: Some(vec![1]),
                positions: None,
                rows: None,
            }],
        };
        let patched = m.net.logits(&m.net.encode(&t, &mask, &Gates::none(), Some(&mut patch)).unwrap()).unwrap();
        let mut zeroed = ExpertEdit::ablate(&m, &[e(0, 1)], ExpertAblation::Output).unwrap();
        let want = logits(&m, Some(&mut zeroed));
        assert!(common::max_diff(&patched, &want) < 1e-5, "{name}: patched to zero = output ablation");
        assert!(common::max_diff(&patched, &plain) > 1e-4, "{name}: the patch moved nothing");
    }
}

/// A view closing experts (docs/methods.md#experts-as-units) computes what the router's hooks
/// compute, both ways (routed around: Mixtral's softmax and DeepSeek-V3's grouped router;
/// output zeroed), in one forward and through a prepared metric; and it reaches the passes that
/// resume a layer (a head sweep resumes at `hook_z`): each head's swept value equals the view
/// with that head closed as well.
#[test]
fn a_view_closing_experts_equals_the_hooks_and_reaches_resumed_passes() {
    use headscope::analysis::ablation::sweep;
    use headscope::model::view::View;
    use headscope::model::{HeadId, Kind};
    let _g = common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), &SENTENCES);
    let stop = || false;
    for (name, layer) in [("mixtral", 0), ("deepseek_v3", 1)] {
        let m = common::tiny_hf(name, "f32");
        let ids = [e(layer, 1), e(layer, 2)];
        for (how, route) in [(ExpertAblation::Route, true), (ExpertAblation::Output, false)] {
            let v = View::new(common::tiny_hf(name, "f32")).closing_experts(&ids, route, "test").unwrap();
            let mut edit = ExpertEdit::ablate(&m, &ids, how).unwrap();
            let want = logits(&m, Some(&mut edit));
            let got = {
                let _g = tch::no_grad_guard();
                let t = Tensor::from_slice(&m.tokenize(SENTENCES[0]).unwrap().ids).view([1, -1]);
                let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
                v.model.net.logits(&v.model.net.encode(&t, &mask, &v.gates().unwrap(), None).unwrap()).unwrap()
            };
            let dl = common::max_diff(&got, &want);
            assert!(dl < 1e-6, "{name} {how}: the view's logits differ from the hooks' by {dl:e}");
            assert!(common::max_diff(&got, &logits(&m, None)) > 1e-4, "{name} {how}: the view moved nothing");
            let p = prepare(&m, &d, Metric::Loss, 2048, Gates::none()).unwrap();
            let hooked = headscope::analysis::experts::evaluate_ablated(&m, &p, &ids, how, &stop).unwrap().value();
            let pv = prepare(&v.model, &d, Metric::Loss, 2048, v.gates().unwrap()).unwrap();
            let viewed = evaluate(&v.model, &pv, &pv.base, &stop).unwrap();
            assert!((viewed - hooked).abs() < 1e-6, "{name} {how}: loss {viewed} on the view, {hooked} by the hooks");
            let grid = sweep(&v.model, &pv, &[Kind::Dec], &stop, &mut |_, _| {}).unwrap();
            let head = HeadId { kind: Kind::Dec, layer_idx: 1, head: 2 };
            let both = v.closing(&[head]);
            let pb = prepare(&both.model, &d, Metric::Loss, 2048, both.gates().unwrap()).unwrap();
            let want = evaluate(&both.model, &pb, &pb.base, &stop).unwrap();
            let swept = grid[0].1[1][2];
            assert!(
                (swept - want).abs() < 1e-5,
                "{name} {how}: head dec.1.2 swept {swept}, closed beside the experts {want}"
            );
            assert!((swept - viewed).abs() > 1e-6, "{name} {how}: closing dec.1.2 changed nothing");
        }
        // One way per view; a layer cannot lose more experts than leave its top k; an expert the
        // layer does not have is named.
        let v = View::new(common::tiny_hf(name, "f32")).closing_experts(&ids, true, "f").unwrap();
        let e1 = v.closing_experts(&[e(layer, 3)], false, "f").err().unwrap().to_string();
        assert!(e1.contains("one way per view"), "{e1}");
        let n = layer_experts(&m, layer).unwrap().ids().len();
        let all: Vec<ExpertId> = (0..n).map(|x| e(layer, x)).collect();
        let e2 = View::new(common::tiny_hf(name, "f32")).closing_experts(&all, true, "f").err().unwrap().to_string();
        assert!(e2.contains("fewer than the 2 it routes each token to"), "{e2}");
        let e3 = View::new(common::tiny_hf(name, "f32"))
            .closing_experts(&[e(layer, 99)], false, "f")
            .err()
            .unwrap()
            .to_string();
        assert!(e3.contains("expert 99 of layer") && e3.lines().count() == 1, "{e3}");
    }
}

/// Qwen3-MoE and OLMoE as llama.cpp writes them in GGUF (`tests/fixtures/make_tiny_gguf_moe.py`: each
/// layer's experts stacked per projection) gives its HF twin's transformers goldens: ids,
/// logits, attention, greedy continuations, float64 with heads closed; parameters equal. A file
/// that ends inside an expert tensor is a one-line error naming the file and the tensor.
#[test]
fn qwen3_moe_gguf_equals_its_hf_twin_and_a_truncated_expert_tensor_is_named() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    crate::hf_families::check_against(&g, "qwen3_moe", "qwen3_moe_gguf");
    // OLMoE (its q/k norms over all heads; not renormalised) likewise.
    crate::hf_families::check_against(&g, "olmoe", "olmoe_gguf");
    assert_eq!(common::tiny_hf("olmoe_gguf", "f32").n_params, i64::try_from(&g["olmoe_params"]).unwrap());
    let m = common::tiny_hf("qwen3_moe_gguf", "f32");
    assert_eq!(m.n_params, i64::try_from(&g["qwen3_moe_params"]).unwrap(), "parameters");
    assert_eq!(m.family_name(), "qwen3moe (gguf)");
    let dir = common::fixtures().join("bad_gguf/qwen3_moe_truncated");
    let opts =
        headscope::model::LoadOptions { device: tch::Device::Cpu, dtype: DType::Float, allow_unknown_config: false };
    let e = Model::load(&dir, opts).err().expect("a truncated GGUF loaded").to_string();
    let file = dir.join("model.gguf").display().to_string();
    assert!(e.contains(&file) && e.contains("tensor 'blk.0.ffn_down_exps.weight'") && e.lines().count() == 1, "{e}");
}

/// gpt-oss as llama.cpp writes it in GGUF, its experts in MXFP4
/// (`tests/fixtures/make_tiny_gguf_mxfp4.py`: gate and up split out of transformers' interleaved
/// `gate_up_proj`, each expert's weights quantised by the `gguf` package, the router, sinks, YaRN
/// and sliding window from the metadata), and its HF twin holding the dequantised weights, both
/// give transformers' goldens of that twin: ids, logits, attention, greedy continuations;
/// parameters equal transformers' count.
#[test]
fn gpt_oss_gguf_with_mxfp4_experts_equals_transformers() {
    let g = common::golden("tiny_hf/golden_mxfp4.npz");
    let file = common::fixtures().join("tiny_hf/gpt_oss_mxfp4_gguf/model.gguf");
    let gguf = headscope::model::readers::gguf::Gguf::open(&file).unwrap();
    let mxfp4 = gguf.tensors.iter().filter(|t| t.ggml_type == 39).map(|t| t.name.clone()).collect::<Vec<_>>();
    assert_eq!(mxfp4.len(), 6, "two layers' gate, up and down experts in MXFP4: {mxfp4:?}");
    for dir in ["gpt_oss_mxfp4", "gpt_oss_mxfp4_gguf"] {
        crate::hf_families::check_against(&g, "gpt_oss_mxfp4", dir);
        let m = common::tiny_hf(dir, "f32");
        assert_eq!(m.n_params, i64::try_from(&g["gpt_oss_mxfp4_params"]).unwrap(), "{dir}: parameters");
    }
    assert_eq!(common::tiny_hf("gpt_oss_mxfp4_gguf", "f32").family_name(), "gpt-oss (gguf)");
}

/// Activation patching of each expert's output (`site: "expert_out"`): every expert's patched
/// logit difference equals the corrupted run with that expert's `mlp.hook_expert_out` slice
/// (every position) replaced by the clean run's, computed here with hooks (Mixtral, DeepSeek-V3
/// whose layer 0 is dense).
#[test]
fn patching_an_experts_output_equals_replacing_its_slice_by_hand() {
    use headscope::analysis::patching::{patch, Direction, PairIds, PatchMetric, PatchSpec, Site};
    use headscope::model::hooks::{At, Hooks, Point};
    use headscope::model::ModelError;
    struct Swap<'a> {
        clean: &'a [Option<Tensor>],
        layer: usize,
        expert: i64,
        seen: Vec<Option<Tensor>>,
    }
    impl Hooks for Swap<'_> {
        fn wants(&self, at: At) -> bool {
            at.point == Point::ExpertOut
        }
        fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
            while self.seen.len() <= at.layer {
                self.seen.push(None);
            }
            self.seen[at.layer] = Some(x.copy());
            if at.layer != self.layer || self.expert < 0 {
                return Ok(None);
            }
            let c = self.clean[at.layer].as_ref().unwrap();
            let out = x.copy();
            out.narrow(1, self.expert, 1).copy_(&c.narrow(1, self.expert, 1));
            Ok(Some(out))
        }
    }
    let pair =
        PairIds { clean: vec![5, 17, 42, 8, 9, 17], corrupted: vec![5, 18, 42, 8, 9, 18], answer: 42, wrong: Some(43) };
    for (name, layer) in [("mixtral", 1usize), ("deepseek_v3", 1)] {
        let m = common::tiny_hf(name, "f32");
        let spec = PatchSpec::new(Site::ExpertOut, false, Direction::Denoise, PatchMetric::LogitDiff);
        let r = patch(&m, std::slice::from_ref(&pair), spec, &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
        let run = |ids: &[i64], h: &mut Swap| -> f64 {
            let _g = tch::no_grad_guard();
            let t = Tensor::from_slice(ids).view([1, -1]);
            let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
            let l = m.net.logits(&m.net.encode(&t, &mask, &Gates::none(), Some(h)).unwrap()).unwrap().get(0).get(-1);
            l.double_value(&[42]) - l.double_value(&[43])
        };
        let mut rec = Swap { clean: &[], layer, expert: -1, seen: vec![] };
        let clean_ld = run(&pair.clean, &mut rec);
        let clean_values = rec.seen;
        assert!((clean_ld - r.clean).abs() < 1e-5, "{name}: clean {clean_ld} against {}", r.clean);
        let n = layer_experts(&m, layer).unwrap().ids().len();
        assert_eq!(r.patched[layer][0].len(), n, "{name}: one unit per expert");
        let mut moved = 0;
        for ex in 0..n {
            let mut swap = Swap { clean: &clean_values, layer, expert: ex as i64, seen: vec![] };
            let by_hand = run(&pair.corrupted, &mut swap);
            let got = r.patched[layer][0][ex];
            assert!((got - by_hand).abs() < 1e-5, "{name}: expert {layer}.e{ex}: patched {got}, by hand {by_hand}");
            moved += ((by_hand - r.corrupted).abs() > 1e-3) as usize;
        }
        assert!(moved > 0, "{name}: no expert's patch moved the logit difference");
        if name == "deepseek_v3" {
            assert!(r.patched[0].iter().all(|p| p.is_empty()), "{name}: the dense layer has no units");
        }
    }
}
