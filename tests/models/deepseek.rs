//! DeepSeek-V2 and V3 against transformers (docs/methods.md#latent-attention,
//! docs/methods.md#experts): tiny random checkpoints from `tests/fixtures/make_tiny_hf_2025.py`
//! (eager attention). V3: a query latent, YaRN with `mscale_all_dim` (the score scale squared),
//! rotary dimensions as adjacent pairs, layer 0 dense and layer 1 eight experts in two groups of
//! four (one group chosen per token, its two best experts' sum ranking it) behind a sigmoid
//! router with a choice bias, renormalised and scaled by 2.5, and a shared expert. V2: queries
//! straight from the stream, eight experts behind a softmax router limited to one group of
//! four by each group's best score, not renormalised, scaled by 1.5, two shared experts' width.
//! Logits and every head's attention within the float32 bound, greedy continuations (with the
//! cache), float64 within 1e-10 with heads closed at the output projection too, parameter
//! counts equal; an expert zeroed or routed around equals transformers'; `prune_experts`
//! equals routing around; the latents' hook points; the cache counted as one latent per token
//! and layer; `prune_heads` equals masking; LRP refuses in one line and AttnLRP runs.

use crate::common;
use crate::hf_2025::AblateExpert;
use crate::hf_families::{check_against, float64_diffs};
use headscope::analysis::experts::{layer_experts, prune_experts, ExpertAblation, ExpertEdit, ExpertId};
use headscope::analysis::streaming::kv_cost;
use headscope::model::hooks::{Hooks, Point};
use headscope::model::nn::Gates;
use headscope::model::view::View;
use headscope::model::Model;
use tch::{Kind as DType, Tensor};

const NAMES: [&str; 2] = ["deepseek_v3", "deepseek_v2"];

/// The logits `[T, V]` of `text` under the hooks `h`.
pub(crate) fn logits(m: &Model, h: Option<&mut dyn Hooks>, text: &str) -> Tensor {
    let _g = tch::no_grad_guard();
    let ids = m.tokenize(text).unwrap().ids;
    let t = Tensor::from_slice(&ids).view([1, -1]);
    let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
    m.net.logits(&m.net.encode(&t, &mask, &Gates::none(), h).unwrap()).unwrap().get(0)
}

#[test]
fn deepseek_v2_and_v3_equal_transformers() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    for name in NAMES {
        check_against(&g, name, name);
        let m = common::tiny_hf(name, "f32");
        assert_eq!(m.n_params, i64::try_from(&g[&format!("{name}_params")]).unwrap(), "{name}: parameters");
        let kinds: Vec<&str> = m.net.stack.iter().map(|l| l.mlp().kind()).collect();
        let want = if name == "deepseek_v3" { vec!["dense", "experts"] } else { vec!["experts", "experts"] };
        assert_eq!(kinds, want, "{name}: MLP kinds by layer");
        // transformers' float64 run is float64 throughout (its routers' casts widened too).
        let text = &common::short_pud_sentences(1)[0];
        let (dl, da, dm) = float64_diffs(&g, name, name, text).expect("float64 goldens");
        assert!(
            dl < 1e-10 && da < 1e-10 && dm < 1e-10,
            "{name} in float64: logits {dl:e}, attention {da:e}, gated {dm:e}"
        );
    }
}

/// DeepSeek-V3 and V2 as llama.cpp writes them in GGUF (`deepseek2`,
/// `tests/fixtures/make_tiny_gguf_moe.py`: V3 with the per-head up-projection split into
/// `attn_k_b` / `attn_v_b` and YaRN as `yarn_log_multiplier`, V2 with the older `attn_kv_b`, no
/// query latent and no gating function) give their HF twins' transformers goldens: ids, logits,
/// attention, greedy continuations, float32 with heads closed; parameters and MLP kinds equal.
/// A file without one layer's `attn_v_b` is a one-line error naming the file and the tensor.
#[test]
fn deepseek2_gguf_equals_its_hf_twin() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    for name in NAMES {
        let dir = format!("{name}_gguf");
        check_against(&g, name, &dir);
        let m = common::tiny_hf(&dir, "f32");
        assert_eq!(m.n_params, i64::try_from(&g[&format!("{name}_params")]).unwrap(), "{dir}: parameters");
        assert_eq!(m.family_name(), "deepseek2 (gguf)");
        let hf = common::tiny_hf(name, "f32");
        let kinds = |m: &Model| m.net.stack.iter().map(|l| l.mlp().kind()).collect::<Vec<_>>();
        assert_eq!(kinds(&m), kinds(&hf), "{dir}: MLP kinds by layer");
    }
    let dir = common::fixtures().join("bad_gguf/deepseek_v3_no_v_b");
    let opts =
        headscope::model::LoadOptions { device: tch::Device::Cpu, dtype: DType::Float, allow_unknown_config: false };
    let e = Model::load(&dir, opts).err().expect("a GGUF without attn_v_b loaded").to_string();
    let file = dir.join("model.gguf").display().to_string();
    assert!(e.contains(&file) && e.contains("blk.1.attn_v_b.weight") && e.lines().count() == 1, "{e}");
}

/// An expert's output zeroed where it is chosen equals transformers with its down projection
/// zeroed; routing around it equals transformers with its router logit at minus infinity (V3:
/// and its choice bias, docs/methods.md#experts-as-units); both move the logits.
#[test]
fn a_deepseek_expert_zeroed_or_routed_around_equals_transformers() {
    let g = common::golden("tiny_hf/golden_2025.npz");
    for (name, layer) in [("deepseek_v3", 1), ("deepseek_v2", 0)] {
        let m = common::tiny_hf(name, "f32");
        let text = &common::short_pud_sentences(1)[0];
        let plain = logits(&m, None, text);
        let depth = common::depth(&m, m.tokenize(text).unwrap().ids.len());
        for (route, key) in [(false, "zeroed"), (true, "routed")] {
            let want = &g[&format!("{name}_expert_{key}_0")];
            let got = logits(&m, Some(&mut AblateExpert { layer, expert: 1, route }), text);
            let d = common::max_diff(&got, want) / common::f32_bound(common::scale(want), depth);
            assert!(d <= 1.0, "{name}: expert 1 {key}: {d:.3} of the float32 bound from transformers");
            assert!(common::max_diff(&got, &plain) > 1e-4, "{name}: expert 1 {key} moved nothing");
        }
    }
}

/// Removing experts from a grouped router keeps the groups of the experts as loaded: pruning
/// equals routing around (V3 with its choice bias; V2 by its groups' best scores), whole
/// groups' worth included.
#[test]
fn prune_experts_equals_routing_around_on_grouped_routers() {
    let text = &common::short_pud_sentences(1)[0];
    for (name, layer) in [("deepseek_v3", 1), ("deepseek_v2", 0)] {
        let m = common::tiny_hf(name, "f32");
        for drop in [vec![1usize], vec![0, 5, 6], vec![4, 5, 6]] {
            let ids: Vec<ExpertId> = drop.iter().map(|&expert| ExpertId { layer, expert }).collect();
            let mut routed = ExpertEdit::ablate(&m, &ids, ExpertAblation::Route).unwrap();
            let want = logits(&m, Some(&mut routed), text);
            let p = prune_experts(&m, &ids).unwrap();
            let got = logits(&p, None, text);
            let d = common::max_diff(&got, &want);
            assert!(d < 1e-5, "{name}: {drop:?} pruned against routed around: {d:e}");
            assert!(common::max_diff(&got, &logits(&m, None, text)) > 1e-4, "{name}: {drop:?} moved nothing");
            let kept = layer_experts(&p, layer).map(|x| x.ids().to_vec()).unwrap_or_default();
            assert_eq!(kept, (0..8).filter(|e| !drop.contains(e)).collect::<Vec<_>>(), "{name}: experts kept");
        }
    }
}

/// The latents are hook points (`hook_q_latent`, `hook_kv_latent`), each head's key ends with
/// the rotary part every head shares (the latent's last `qk_rope_head_dim` numbers, before
/// rotary), contexts are `v_head_dim` wide, and the cache is one latent per token and layer.
#[test]
fn the_latents_are_hook_points_and_the_cache_counts_one_latent_per_layer() {
    let m = common::tiny_hf("deepseek_v3", "f32");
    let ids = m.tokenize("The cat sat on the mat.").unwrap().ids;
    let t = Tensor::from_slice(&ids).view([1, -1]);
    let n = ids.len() as i64;
    let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
    let points = [Point::QLatent, Point::KvLatent, Point::K, Point::Z];
    let (seen, _) = common::recorded(&points, |r| m.net.encode(&t, &mask, &Gates::none(), Some(r)).unwrap());
    let at = |p| common::at_point(&seen, p);
    assert_eq!(at(Point::QLatent)[0].size(), [1, n, 16], "q latent");
    assert_eq!(at(Point::KvLatent)[0].size(), [1, n, 16], "kv latent: 12 + 4 rotary");
    assert_eq!(at(Point::K)[0].size(), [1, 4, n, 12], "keys: 8 + 4 per head");
    assert_eq!(at(Point::Z)[0].size(), [1, 4, n, 6], "contexts: v_head_dim");
    let shared = at(Point::KvLatent)[0].narrow(-1, 12, 4);
    for h in 0..4 {
        let d = common::max_diff(&at(Point::K)[0].get(0).get(h).narrow(-1, 8, 4), &shared.get(0));
        assert!(d == 0.0, "head {h}: rotary part of its key differs from the shared one by {d:e}");
    }
    let listed = m.hook_points();
    for p in [Point::QLatent, Point::KvLatent] {
        assert!(listed.iter().any(|a| a.layer == 1 && a.point == p), "{p:?} not among the hook points");
    }
    let c = kv_cost(&View::new(m), 1000, None);
    assert_eq!((c.groups, c.bytes), (2, 2 * 1000 * 16 * 4), "one latent of 16 floats per token and layer");
}

/// LRP's rules refuse latent attention in one line; AttnLRP runs through it and the experts.
#[test]
fn lrp_refuses_latent_attention_and_attnlrp_runs() {
    crate::hf_families::lrp_refuses_and_attnlrp_runs("deepseek_v2", "latent attention");
}

/// Bad DeepSeek configs: one line naming the file and the key.
#[test]
fn bad_deepseek_configs_are_one_line_errors_naming_the_key() {
    use serde_json::json;
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 6] = [
        ("deepseek_v3", |c| c["n_routed_expert"] = json!(8), "key 'n_routed_expert' is not read"),
        (
            "deepseek_v3",
            |c| c["num_key_value_heads"] = json!(2),
            "num_key_value_heads 2 differs from num_attention_heads 4",
        ),
        (
            "deepseek_v3",
            |c| c["topk_group"] = json!(3),
            "topk_group 3 of 2 groups of 4 experts cannot hold num_experts_per_tok 2",
        ),
        ("deepseek_v3", |c| c["n_group"] = json!(3), "n_group 3 must divide the 8 experts (n_routed_experts)"),
        (
            "deepseek_v2",
            |c| c["topk_method"] = json!("noaux_tc"),
            "topk_method 'noaux_tc' is not supported for deepseek_v2",
        ),
        (
            "deepseek_v3",
            |c| c["qk_head_dim"] = json!(16),
            "qk_head_dim 16 is not qk_nope_head_dim 8 + qk_rope_head_dim 4",
        ),
    ];
    for (name, edit, want) in cases {
        let (d, m) = crate::experts::edited(name, &edit);
        let e = m.err().unwrap_or_else(|| panic!("{name}: {want}: loaded"));
        let file = d.path().join("config.json").display().to_string();
        assert!(e.contains(want) && e.contains(&file) && e.lines().count() == 1, "{name}: want {want:?}, got {e}");
    }
}

/// `prune_heads` on latent attention removes the heads' query rows, their key and value rows of
/// `kv_b_proj` and their output columns, and computes what masking them computes; the latents
/// stay whole (they are shared by every head), so the cache does not shrink.
#[test]
fn prune_heads_on_latent_attention_equals_masking() {
    use headscope::model::HeadId;
    let m = common::tiny_hf("deepseek_v3", "f32");
    let text = &common::short_pud_sentences(1)[0];
    let closed = [(0usize, 1usize), (1, 0), (1, 3)];
    let heads: Vec<HeadId> =
        closed.iter().map(|&(l, h)| HeadId { kind: headscope::model::Kind::Dec, layer_idx: l, head: h }).collect();
    let mut g = vec![1f32; 8];
    for &(l, h) in &closed {
        g[l * 4 + h] = 0.0;
    }
    let gates = Gates { dec: Some(Tensor::from_slice(&g).view([1, 2, 4])), ..Gates::none() };
    let ids = m.tokenize(text).unwrap().ids;
    let t = Tensor::from_slice(&ids).view([1, -1]);
    let mask = Tensor::ones(t.size(), (DType::Float, tch::Device::Cpu));
    let masked = {
        let _g = tch::no_grad_guard();
        m.net.logits(&m.net.encode(&t, &mask, &gates, None).unwrap()).unwrap().get(0)
    };
    let p = headscope::prune::physical::prune_heads(&m, &heads, None).unwrap();
    let got = logits(&p, None, text);
    let d = common::max_diff(&got, &masked);
    assert!(d < 1e-5, "pruned against masked: {d:e}");
    assert!(p.n_params < m.n_params, "nothing removed");
    let before = kv_cost(&View::new(m), 100, None).bytes;
    assert_eq!(kv_cost(&View::new(p), 100, None).bytes, before, "the latent cache is the same size");
}

/// The streaming verbs say once, in one line, that a latent-attention model caches one latent
/// per layer (streaming a head streams its layer); the cache's bytes are the latent's, and the
/// description names it.
#[test]
fn streaming_verbs_say_what_latent_attention_caches() {
    let dir = common::tiny_hf_dir().join("deepseek_v3");
    let code = format!(
        r#"let m = load_model("{}"); print(m); let v = m.with_streaming(["dec.0.1"], #{{sink: 1, recent: 4}}); print(v.kv_cost(100).bytes); print(v.kv_cost(100).full_bytes);"#,
        dir.display()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_headscope")).args(["-e", &code]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("latent attention (cache: 16 numbers per token and layer)"), "{text}");
    let warned: Vec<&str> = text.lines().filter(|l| l.starts_with("warning: with_streaming:")).collect();
    assert_eq!(warned.len(), 1, "{text}");
    assert!(warned[0].contains("streaming a head streams its whole layer"), "{text}");
    // Layer 0 streams (5 of 100 positions kept), layer 1 keeps all: 16 float32 numbers each.
    assert!(text.contains(&format!("\n{}\n{}", (5 + 100) * 16 * 4, 2 * 100 * 16 * 4)), "{text}");
}

/// Every head analysis reads latent attention's heads (queries and keys wider than the
/// contexts): the analysis pass, diversity (its query and context Gram matrices of their own
/// widths), the sweep, patching (exact and path) and the head types run on DeepSeek-V3.
#[test]
fn head_analyses_run_on_latent_attention() {
    let mut s = headscope::engine::Session::new(headscope::engine::SessionOptions::default());
    let code = format!(
        r#"let m = load_model({:?});
        let tb = treebank(asset("pud_en.conllu")).take(8);
        let a = m.analyze(tb);
        assert(a.confidence["dec"].len() == 2);
        let dv = m.diversity(tb);
        assert(dv.to_string().len() > 0);
        let g = m.ablation_sweep(tb);
        assert(g["dec"][1].len() == 4);
        let p = pairs([#{{clean: [5, 17, 42, 8, 9, 17], corrupted: [5, 18, 42, 8, 9, 18], answer: 42, wrong: 43}}]);
        let e = m.patch(p).effect;
        let path = m.patch(p, #{{receiver: "dec.1.1", receiver_input: "k"}}).effect;
        m.head_types(#{{n: 2, len: 10, haystack: 20}});"#,
        common::tiny_hf_dir().join("deepseek_v3").display().to_string()
    );
    if let Err(e) = s.eval("analyses", &code) {
        panic!("{}", e.message);
    }
}
