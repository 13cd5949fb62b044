//! HF decoder-only families (GPT-2, Llama, Qwen2, Mistral; Llama also sharded) against
//! transformers: tiny random checkpoints in each family's official layout and their golden
//! outputs (eager attention, float32) come from `tests/fixtures/make_tiny_hf.py`. Token ids,
//! logits and every head's attention within 1e-4, greedy continuations token for token, and
//! GPT-2's gates equal to transformers' `head_mask`. The 2026 families (make_tiny_hf_2026.py) are
//! also run in float64 against transformers in float64 (its float32 casts widened): logits and
//! attention within 1e-5 (1e-14 in practice), and the gates equal to zeroing the head's slice at
//! the output projection. Bad checkpoints are one-line errors.

use crate::common;
use crate::common::{max_diff, tiny_hf_dir as dir};

use headscope::model::hooks::Point;
use headscope::model::nn::Gates;
use headscope::model::{Kind, LoadOptions, Model};
use std::collections::HashMap;
use std::path::Path;
use tch::Tensor;

// float32 against transformers: common::f32_bound (scale x sqrt(depth), derived there).
/// Against transformers' float64 run, where some of transformers' arithmetic still rounds to
/// float32 (the dynamic rotary's frequencies: 6.6e-8; a GGUF twin's float32 LongRoPE factors:
/// 4.6e-6). Where transformers runs in float64 throughout, `hf_tf5.rs` holds 1e-10.
const TOL64: f64 = 1e-5;
/// gpt2 heads closed per layer in the golden `head_mask` run (1 = open).
const MASK: [[f32; 4]; 2] = [[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]];

/// Logits `[T, V]` and attention `[L, H, T, T]` of one sentence.
fn forward(m: &Model, ids: &[i64], gates: &Gates) -> (Tensor, Tensor) {
    let t = Tensor::from_slice(ids).view([1, ids.len() as i64]);
    let mask = Tensor::ones([1, ids.len() as i64], (tch::Kind::Float, tch::Device::Cpu));
    let _g = tch::no_grad_guard();
    let (seen, h) = common::recorded(&[Point::Pattern], |r| m.net.encode(&t, &mask, gates, Some(r)).unwrap());
    let attn: Vec<Tensor> = common::at_point(&seen, Point::Pattern).iter().map(|a| a.get(0)).collect();
    let logits = m.net.logits(&h).unwrap().get(0);
    (logits, Tensor::stack(&attn, 0))
}

fn check(family: &str, dir_name: &str) {
    check_against(&common::golden("tiny_hf/golden.npz"), family, dir_name)
}

pub(crate) fn check_against(g: &HashMap<String, Tensor>, family: &str, dir_name: &str) {
    let m = common::tiny_hf(dir_name, "f32");
    assert_eq!(m.kinds().iter().map(|k| k.kind).collect::<Vec<_>>(), vec![Kind::Dec]);
    let n = g.keys().filter(|k| k.starts_with(&format!("{family}_ids_"))).count();
    assert!(n >= 20, "{family}: {n} sentences in golden.npz");
    let texts = common::short_pud_sentences(n);
    let (mut worst_logit, mut worst_attn) = (0f64, 0f64);
    for (i, text) in texts.iter().enumerate() {
        let want_ids = Vec::<i64>::try_from(&g[&format!("{family}_ids_{i}")]).unwrap();
        let got = m.tokenize(text).unwrap().ids;
        assert_eq!(got, want_ids, "{dir_name}: token ids of sentence {i} ({text:?})");
        if let Some(logits) = g.get(&format!("{family}_logits_{i}")) {
            let (l, a) = forward(&m, &got, &Gates::none());
            let depth = common::depth(&m, got.len());
            worst_logit = worst_logit.max(max_diff(&l, logits) / common::f32_bound(common::scale(logits), depth));
            worst_attn =
                worst_attn.max(max_diff(&a, &g[&format!("{family}_attn_{i}")]) / common::f32_bound(1.0, depth));
            if let Some(masked) = g.get(&format!("{family}_masked_{i}")) {
                let gates = Gates { dec: Some(Tensor::from_slice(&MASK.concat()).view([1, 2, 4])), ..Gates::none() };
                let (lm, _) = forward(&m, &got, &gates);
                let d = max_diff(&lm, masked) / common::f32_bound(common::scale(masked), depth);
                assert!(d <= 1.0, "{dir_name}: gated logits differ from head_mask's by {d:.3} of the float32 bound");
            }
        }
        let want_gen: Vec<i64> = Vec::<i64>::try_from(&g[&format!("{family}_gen_{i}")])
            .unwrap()
            .into_iter()
            .take_while(|&t| t != m.net.eos_id)
            .collect();
        let gen = m.generate(text, 8, &Gates::none()).unwrap();
        assert_eq!(gen, want_gen, "{dir_name}: greedy continuation of sentence {i}");
    }
    println!("{dir_name}: {n} sentences, largest logit difference {worst_logit:.3} of the float32 bound, attention {worst_attn:.3}");
    assert!(
        worst_logit <= 1.0 && worst_attn <= 1.0,
        "{dir_name}: logits {worst_logit:.3}, attention {worst_attn:.3} of the float32 bound"
    );
    check_float64(g, family, dir_name, texts[0].as_str());
}

/// Where the goldens hold transformers' float64 run (`{family}_logits64_0`: make_tiny_hf_2026.py),
/// headscope's float64 run equals it within 1e-5 (logits and every head's attention), and closing
/// MASK's heads through the gates equals zeroing their slices at the output projection
/// (`{family}_masked64_0`). float32 runs differ by their summation order (transformers' own float32
/// Gemma logits are 7e-5 from its float64 ones), hence TOL above.
fn check_float64(g: &HashMap<String, Tensor>, family: &str, dir_name: &str, text: &str) {
    let Some((dl, da, dm)) = float64_diffs(g, family, dir_name, text) else { return };
    assert!(
        dl < TOL64 && da < TOL64 && dm < TOL64,
        "{dir_name} in float64: logits {dl:e}, attention {da:e}, gated {dm:e}"
    );
}

/// headscope's float64 run against transformers' (`{family}_logits64_0` etc.): the largest
/// differences of the logits, the attention and the logits with MASK's heads closed; `None`
/// where the goldens hold no float64 run.
pub(crate) fn float64_diffs(
    g: &HashMap<String, Tensor>,
    family: &str,
    dir_name: &str,
    text: &str,
) -> Option<(f64, f64, f64)> {
    let want = g.get(&format!("{family}_logits64_0"))?;
    let m = common::tiny_hf(dir_name, "f64");
    let ids = m.tokenize(text).unwrap().ids;
    let (l, a) = forward(&m, &ids, &Gates::none());
    let (dl, da) = (max_diff(&l, want), max_diff(&a, &g[&format!("{family}_attn64_0")]));
    let gates = Gates {
        dec: Some(Tensor::from_slice(&MASK.concat()).view([1, 2, 4]).to_kind(tch::Kind::Double)),
        ..Gates::none()
    };
    let dm = max_diff(&forward(&m, &ids, &gates).0, &g[&format!("{family}_masked64_0")]);
    println!(
        "{dir_name} in float64: logits {dl:.2e}, attention {da:.2e}, heads closed at the output projection {dm:.2e}"
    );
    Some((dl, da, dm))
}

#[test]
fn gpt2_equals_transformers() {
    check("gpt2", "gpt2");
}

#[test]
fn llama_equals_transformers() {
    check("llama", "llama");
}

#[test]
fn sharded_llama_equals_transformers() {
    check("llama", "llama_sharded");
}

#[test]
fn qwen2_with_qkv_biases_equals_transformers() {
    check("qwen2", "qwen2");
}

#[test]
fn mistral_with_a_sliding_window_equals_transformers() {
    check("mistral", "mistral");
}

/// The 2026 llama-family variants (`tests/fixtures/make_tiny_hf_2026.py`, `golden_2026.npz`):
/// every `rope_scaling` type, `head_dim` other than `hidden_size / num_attention_heads`, an
/// untied `lm_head`, and Qwen3's per-head query and key norms.
#[test]
fn llama3_rope_scaling_and_head_dim_equal_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "llama3", "llama3");
}

#[test]
fn linear_rope_scaling_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "llama_linear", "llama_linear");
}

/// Dynamic NTK: most sentences (and every continuation) are longer than the 12 positions of
/// `max_position_embeddings`, so the base grows with the length, as transformers computes it.
#[test]
fn dynamic_rope_scaling_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "llama_dynamic", "llama_dynamic");
}

#[test]
fn yarn_rope_scaling_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "llama_yarn", "llama_yarn");
}

#[test]
fn qwen3_with_query_and_key_norms_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "qwen3", "qwen3");
}

/// GPT-NeoX as Pythia configures it: attention and MLP in parallel on each layer's input,
/// rotary on a quarter of each head's dimensions, the fused per-head `query_key_value`.
#[test]
fn pythia_gpt_neox_with_parallel_residual_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "pythia", "pythia");
}

/// GPT-NeoX with sequential sublayers (`use_parallel_residual: false`), half-rotary heads and
/// linear rope scaling.
#[test]
fn sequential_gpt_neox_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "neox_sequential", "neox_sequential");
}

/// A parallel layer has no `hook_resid_mid` (nothing on its path sums attention alone), and its
/// MLP norm reads the layer's input: the hook table a model lists says so, LRP's rules (derived
/// for sequential layers) refuse it with one line, AttnLRP runs.
#[test]
fn parallel_layers_list_their_own_hook_points_and_lrp_refuses_them() {
    let m = common::tiny_hf("pythia", "f32");
    let names: Vec<String> = m.hook_points().iter().map(|a| a.to_string()).collect();
    assert!(names.iter().any(|n| n == "dec.blocks.0.ln2.hook_normalized"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("hook_resid_mid")), "{names:?}");
    let seq = common::tiny_hf("neox_sequential", "f32");
    assert!(seq.hook_points().iter().any(|a| a.to_string() == "dec.blocks.0.hook_resid_mid"));
    lrp_refuses_and_attnlrp_runs("pythia", "in parallel (GPT-NeoX)");
}

/// On the tiny checkpoint `name`, `m.lrp(d)` is a one-line error containing `why` and
/// `m.lrp(d, #{rule: "attnlrp"})` runs.
pub(crate) fn lrp_refuses_and_attnlrp_runs(name: &str, why: &str) {
    let mut s = headscope::engine::Session::new(headscope::engine::SessionOptions::default());
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lrp_tiny/text.txt");
    s.eval(
        "setup",
        &format!(
            "let m = load_model({:?}); let d = corpus({:?}).take(2);",
            dir().join(name).display().to_string(),
            text.display().to_string()
        ),
    )
    .unwrap();
    let Err(e) = s.eval("lrp", "m.lrp(d)") else { panic!("{name}: lrp ran") };
    assert!(e.message.contains(why) && e.message.lines().count() == 1, "{name}: {}", e.message);
    let a = s.eval("attnlrp", "m.lrp(d, #{rule: \"attnlrp\"})");
    assert!(a.is_ok(), "{name}: {:?}", a.err().map(|e| e.message));
}

/// Phi-3: fused `qkv_proj` and `gate_up_proj` split at load; LongRoPE with the short factors up
/// to the original 16 positions and the long ones beyond (most sentences, every continuation).
#[test]
fn phi3_with_longrope_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "phi3", "phi3");
}

/// Phi-4-mini's partial rotary (half of each head) with a sliding window of 6 positions.
#[test]
fn phi3_with_partial_rotary_and_a_sliding_window_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "phi3_partial", "phi3_partial");
}

/// OLMo-2: each sublayer's output normed before its residual, q/k norms over all heads.
#[test]
fn olmo2_with_post_sublayer_norms_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "olmo2", "olmo2");
}

/// OLMo-2 with as many key/value heads as query heads (OLMo-2-7B's shape,
/// `tests/fixtures/make_tiny_olmo2_mha.py`): equal to transformers, and `prune_heads` refuses it
/// in one line (its q/k norms span all heads, so removing one cannot equal masking it; this
/// panicked inside libtorch at the next forward before).
#[test]
fn olmo2_without_gqa_equals_transformers_and_prune_heads_refuses_it() {
    check_against(&common::golden("tiny_hf/golden_olmo2_mha.npz"), "olmo2_mha", "olmo2_mha");
    let m = common::tiny_hf("olmo2_mha", "f32");
    let head = headscope::model::HeadId { kind: Kind::Dec, layer_idx: 0, head: 1 };
    let err =
        headscope::prune::physical::prune_heads(&m, &[head], None).err().expect("prune_heads refused").to_string();
    assert!(
        !err.contains('\n')
            && err.contains("layer 0")
            && err.contains("all its heads together")
            && err.contains("with_gates"),
        "{err}"
    );
    // Heads sharing keys and values (grouped-query attention) are refused too, naming why.
    let gqa = common::tiny_hf("llama", "f32");
    let err =
        headscope::prune::physical::prune_heads(&gqa, &[head], None).err().expect("prune_heads refused").to_string();
    assert!(!err.contains('\n') && err.contains("grouped-query") && err.contains("with_gates"), "{err}");
}

/// bfloat16 on the CPU: the tiny Llama's logits and attention differ from transformers'
/// float32 ones by no more than 1.5 times what transformers' own bfloat16 run differs
/// (`llama_bf16_*` in golden_2026.npz), and the analyses (confidence, the exact sweep, gradient
/// importance) stay within a few percent of the float32 model's.
#[test]
fn bf16_runs_on_the_cpu_within_its_precision() {
    let g = common::golden("tiny_hf/golden.npz");
    let g26 = common::golden("tiny_hf/golden_2026.npz");
    let m = Model::load(&dir().join("llama"), LoadOptions::new(headscope::device::DeviceChoice::Cpu, "bf16").unwrap())
        .unwrap();
    assert_eq!(m.opts.dtype, tch::Kind::BFloat16);
    for i in 0..2 {
        let ids = Vec::<i64>::try_from(&g[&format!("llama_ids_{i}")]).unwrap();
        let (l, a) = forward(&m, &ids, &Gates::none());
        assert_eq!(l.kind(), tch::Kind::BFloat16);
        let want = &g[&format!("llama_logits_{i}")];
        let hf = max_diff(&g26[&format!("llama_bf16_logits_{i}")], want);
        let d = max_diff(&l, want);
        println!("sentence {i}: bf16 logits differ from transformers' f32 by {d:.3} (transformers' bf16: {hf:.3})");
        assert!(hf > 0.0 && d <= 1.5 * hf, "sentence {i}: bf16 logits differ by {d}, transformers' bf16 by {hf}");
        let want_a = &g[&format!("llama_attn_{i}")];
        let (da, hfa) = (max_diff(&a, want_a), max_diff(&g26[&format!("llama_bf16_attn_{i}")], want_a));
        assert!(da <= 1.5 * hfa, "sentence {i}: bf16 attention differs by {da}, transformers' bf16 by {hfa}");
    }
    let mut s = headscope::engine::Session::new(headscope::engine::SessionOptions::default());
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lrp_tiny/text.txt");
    s.eval("setup", &format!("let d = corpus({:?}).take(4); let b = load_model({:?}, #{{dtype: \"bf16\", device: \"cpu\"}}); let f = load_model({:?}, #{{device: \"cpu\"}});", text.display().to_string(), dir().join("llama").display().to_string(), dir().join("llama").display().to_string())).unwrap();
    for (what, code, tol) in [
        ("confidence", "X.analyze(d).confidence[\"dec\"]", 0.02),
        ("sweep", "X.ablation_sweep(d)[\"dec\"]", 0.05),
        ("importance", "X.head_importance(d)[\"dec\"]", 0.05),
    ] {
        let v = |x: &str, s: &mut headscope::engine::Session| -> Vec<f64> {
            let out = s
                .eval(
                    "q",
                    &format!(
                        "let g = {}; let v = []; for r in g {{ for x in r {{ v.push(x); }} }} v",
                        code.replace('X', x)
                    ),
                )
                .unwrap()
                .unwrap()
                .text;
            out.trim_matches(|c| c == '[' || c == ']').split(',').map(|x| x.trim().parse::<f64>().unwrap()).collect()
        };
        let (bv, fv) = (v("b", &mut s), v("f", &mut s));
        let scale = fv.iter().fold(0f64, |m, x| m.max(x.abs()));
        let d = bv.iter().zip(&fv).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(d <= tol * scale, "{what}: bf16 differs from f32 by {d} (scale {scale})");
    }
}

/// Phi-3 (LongRoPE; partial rotary with a sliding window) and GPT-NeoX (Pythia) as llama.cpp's
/// converter writes them (`make_tiny_gguf_2026.py`, tests/fixtures/GGUF_2026_NOTES.md): the
/// rope factors as tensors, GPT-NeoX's query_key_value regrouped; read back, they give their
/// safetensors twins' transformers goldens (logits and attention within 1e-4 in float32, 1e-5 in
/// float64, gates against zeroing at the output projection, greedy continuations), and the
/// GGUF's own tokenizer (GPT-2 BPE in the metadata) gives the same ids as tokenizer.json.
#[test]
fn phi3_and_gpt_neox_gguf_files_equal_their_safetensors_twins() {
    let g = common::golden("tiny_hf/golden_2026.npz");
    for (family, dir_name) in [("phi3", "phi3_gguf"), ("phi3_partial", "phi3_partial_gguf"), ("pythia", "pythia_gguf")]
    {
        check_against(&g, family, dir_name);
        let alone = tempfile::tempdir().unwrap();
        std::fs::copy(dir().join(dir_name).join("model.gguf"), alone.path().join("model.gguf")).unwrap();
        let m = common::load(alone.path(), "f32");
        for (i, text) in common::short_pud_sentences(20).iter().enumerate() {
            let want = Vec::<i64>::try_from(&g[&format!("{family}_ids_{i}")]).unwrap();
            assert_eq!(m.tokenize(text).unwrap().ids, want, "{dir_name}: the GGUF's own tokenizer on sentence {i}");
        }
    }
}

/// Gemma 3 as a GGUF file (`make_tiny_gguf_gemma3.py`: a tiny random Gemma 3 written as
/// llama.cpp's converter writes it, norms as 1 + w, five sliding-window layers and a global one):
/// its transformers twin's logits, attention and greedy continuations (transformers' own GGUF
/// loader reads the same file to the same logits, checked by the script).
/// Gemma 2 as a GGUF file (`make_tiny_gguf_gemma3.py`: alternating sliding and global layers
/// and the query scale as llama.cpp fixes them, both soft-caps from the metadata, norms as
/// 1 + w): its transformers twin's logits, attention and greedy continuations.
#[test]
fn gemma2_gguf_file_equals_its_safetensors_twin() {
    check_against(&common::golden("tiny_hf/golden_gguf.npz"), "gemma2_gguf", "gemma2_gguf");
}

#[test]
fn gemma3_gguf_file_equals_its_safetensors_twin() {
    check_against(&common::golden("tiny_hf/golden_gguf.npz"), "gemma3_gguf", "gemma3_gguf");
    let m = common::tiny_hf("gemma3_gguf", "f32");
    assert_eq!((m.family.to_string(), m.family_name()), ("gguf".to_string(), "gemma3 (gguf)".to_string()));
    let windows: Vec<Option<i64>> = m.net.stack.iter().map(|l| l.window()).collect();
    assert_eq!(windows, [vec![Some(5); 5], vec![None]].concat());
}

/// Qwen2 and Qwen3 as GGUF files (the tiny HF checkpoints written with llama.cpp's names and
/// metadata by `make_tiny_hf_2026.py`): the HF goldens, token for token.
#[test]
fn qwen2_and_qwen3_gguf_files_equal_transformers() {
    check_against(&common::golden("tiny_hf/golden.npz"), "qwen2", "qwen2_gguf");
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "qwen3", "qwen3_gguf");
    assert_eq!(common::tiny_hf("qwen3_gguf", "f32").family_name(), "qwen3 (gguf)");
}

/// Gemma: embeddings times sqrt(d), (1 + w) RMSNorms, GeGLU, head_dim 16 with hidden 32 / 4 heads.
#[test]
fn gemma_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "gemma", "gemma");
}

/// Gemma 2: four norms per layer, `query_pre_attn_scalar`, alternating sliding-window and
/// global layers, attention and final-logit soft-capping.
#[test]
fn gemma2_with_soft_capping_and_alternating_windows_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "gemma2", "gemma2");
}

/// Gemma 3 (text): per-head q/k norms, a local rotary base on sliding layers, linear rope
/// scaling on the global ones.
#[test]
fn gemma3_with_local_rotary_and_qk_norms_equals_transformers() {
    check_against(&common::golden("tiny_hf/golden_2026.npz"), "gemma3", "gemma3");
}

/// Gemma 2's four norms are hook points of their own (`ln1_post`, `ln2_post`, as
/// TransformerLens names them), and the final-logit cap applies to the task loss.
#[test]
fn gemma2_lists_its_post_norms_and_caps_the_loss() {
    let m = common::tiny_hf("gemma2", "f32");
    let names: Vec<String> = m.hook_points().iter().map(|a| a.to_string()).collect();
    for want in [
        "dec.blocks.1.ln1_post.hook_normalized",
        "dec.blocks.1.ln2_post.hook_normalized",
        "dec.blocks.1.ln2.hook_normalized",
    ] {
        assert!(names.contains(&want.to_string()), "{want} missing: {names:?}");
    }
    assert_eq!(m.net.logit_softcap, Some(3.0));
    let g = common::golden("tiny_hf/golden_2026.npz");
    let ids = Vec::<i64>::try_from(&g["gemma2_ids_0"]).unwrap();
    let t = Tensor::from_slice(&ids).view([1, -1]);
    let mask = Tensor::ones([1, ids.len() as i64], (tch::Kind::Float, tch::Device::Cpu));
    let logp = tch::no_grad(|| {
        m.log_probs(&m.net.encode(&t, &mask, &Gates::none(), None).unwrap(), tch::Kind::Double).unwrap()
    });
    let want = g["gemma2_logits_0"].to_kind(tch::Kind::Double).unsqueeze(0).log_softmax(-1, tch::Kind::Double);
    let d = max_diff(&logp, &want);
    assert!(d < 1e-4, "log-probabilities under the cap differ from transformers' by {d}");
    assert!(g["gemma2_logits_0"].abs().max().double_value(&[]) <= 3.0, "the golden logits are capped");
    lrp_refuses_and_attnlrp_runs("gemma2", "(Gemma 2/3)");
    lrp_refuses_and_attnlrp_runs("olmo2", "(OLMo-2)");
}

/// A copy of a tiny checkpoint with `edit` applied to its files.
fn broken(name: &str, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir().join(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, t.path().join(p.file_name().unwrap())).unwrap();
    }
    edit(t.path());
    t
}

fn load_err(d: &Path) -> String {
    match Model::load(d, LoadOptions::new(headscope::device::DeviceChoice::Cpu, "f32").unwrap()) {
        Ok(_) => panic!("{} loaded", d.display()),
        Err(e) => e.to_string(),
    }
}

fn edit_config(d: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = d.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn bad_checkpoints_are_one_line_errors() {
    let cases: Vec<(tempfile::TempDir, &str)> = vec![
        (broken("llama", |d| edit_config(d, |v| v["model_type"] = "mamba".into())), "model_type 'mamba' is not supported (supported: bart, bert, deepseek_v2, deepseek_v3, gemma, gemma2, gemma3_text, gpt2, gpt_neox, gpt_oss, granitemoehybrid, jamba, lfm2, llama, llama4_text, m2m_100, marian, mbart, mistral, mixtral, mt5, olmo2, olmo3, olmoe, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_next, roberta, smollm3, t5)"),
        (broken("llama3", |d| edit_config(d, |v| v["rope_scaling"]["rope_type"] = "ntk-by-parts".into())), "rope_scaling: rope_type 'ntk-by-parts' is not supported (default, linear, dynamic, llama3, yarn, longrope)"),
        (broken("phi3", |d| edit_config(d, |v| v["rope_scaling"]["short_factor"] = serde_json::json!([1.0, 2.0]))), "rope_scaling.short_factor has 2 factors, expected 4 (one per rotary pair)"),
        (broken("phi3", |d| edit_config(d, |v| v["rope_scaling"]["long_factor"] = serde_json::json!([1.0, 2.0, 0.0, 1.0]))), "rope_scaling.long_factor holds 0: factors must be positive"),
        (broken("phi3", |d| {
            let p = d.join("model.safetensors");
            let t: Vec<(String, Tensor)> = Tensor::read_safetensors(&p).unwrap().into_iter().map(|(n, t)| if n == "model.layers.0.self_attn.qkv_proj.weight" { (n, t.narrow(0, 0, 40)) } else { (n, t) }).collect();
            Tensor::write_safetensors(&t, &p).unwrap();
        }), "tensor 'model.layers.0.self_attn.qkv_proj.weight' has shape [40, 32], expected [64, 32]"),
        (broken("phi3_partial", |d| edit_config(d, |v| v["partial_rotary_factor"] = 0.375.into())), "3 rotary dimensions per head (partial_rotary_factor of head size 8) is not an even number"),
        (broken("llama3", |d| edit_config(d, |v| { v["rope_scaling"].as_object_mut().unwrap().remove("low_freq_factor"); })), "rope_scaling of type 'llama3' needs low_freq_factor"),
        (broken("llama3", |d| edit_config(d, |v| v["rope_scaling"]["factor"] = "8".into())), "rope_scaling.factor must be a number, got \"8\""),
        (broken("llama3", |d| edit_config(d, |v| v["rope_scaling"]["factor"] = 0.5.into())), "rope_scaling.factor must be at least 1, got 0.5"),
        (broken("llama3", |d| edit_config(d, |v| v["rope_scaling"]["high_freq_factor"] = 1.0.into())), "rope_scaling.high_freq_factor 1 must exceed low_freq_factor 1"),
        (broken("pythia", |d| edit_config(d, |v| { v["rotary_pct"] = 0.375.into(); v["partial_rotary_factor"] = 0.375.into(); })), "rotary_pct 0.375 gives 3 rotary dimensions per head, not an even number"),
        (broken("pythia", |d| edit_config(d, |v| v["hidden_act"] = "swish".into())), "hidden_act 'swish' is not supported"),
        (broken("gemma2", |d| edit_config(d, |v| v["layer_types"] = serde_json::json!(["sliding_attention"]))), "layer_types has 1 entries for 2 layers"),
        (broken("gemma3", |d| edit_config(d, |v| v["layer_types"] = serde_json::json!(["local", "full_attention"]))), "layer_types: 'local' is not a layer type (sliding_attention, full_attention)"),
        (broken("gemma2", |d| edit_config(d, |v| v["sliding_window"] = serde_json::Value::Null)), "sliding layers need a positive sliding_window"),
        (broken("llama_dynamic", |d| edit_config(d, |v| { v.as_object_mut().unwrap().remove("max_position_embeddings"); })), "rope_scaling of type 'dynamic' needs max_position_embeddings"),
        (broken("qwen3", |d| {
            let p = d.join("model.safetensors");
            let t: Vec<(String, Tensor)> = Tensor::read_safetensors(&p).unwrap().into_iter().filter(|(n, _)| n != "model.layers.1.self_attn.k_norm.weight").collect();
            Tensor::write_safetensors(&t, &p).unwrap();
        }), "model.layers.1.self_attn.k_norm.weight"),
        (broken("llama", |d| edit_config(d, |v| { v.as_object_mut().unwrap().remove("rms_norm_eps"); })), "missing field `rms_norm_eps`"),
        (broken("gpt2", |d| edit_config(d, |v| v["n_embd"] = 48.into())), "tensor 'h.0.attn.c_attn.weight' has shape [32, 96], expected [48, 144]"),
        (broken("llama", |d| edit_config(d, |v| v["vocab_size"] = 100.into())), "tensor 'model.embed_tokens.weight' has shape [320, 32], expected [100, 32]"),
        (broken("llama_sharded", |d| std::fs::remove_file(d.join("model-00002-of-00003.safetensors")).unwrap()), "shard 'model-00002-of-00003.safetensors' is listed but missing"),
        (broken("qwen2", |d| {
            let p = d.join("tokenizer.json");
            let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            v["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({"id": 400, "content": "<extra>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}));
            std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
        }), "the tokenizer has 321 tokens but the embeddings have 320 rows"),
    ];
    for (d, want) in &cases {
        let e = load_err(d.path());
        assert!(e.contains(want), "want {want:?}, got {e:?}");
        assert_eq!(e.lines().count(), 1, "not one line: {e}");
    }
}

/// Head counts that are zero, negative or do not divide the width, in every family's config:
/// a one-line error naming config.json and the key, never a panic (`Model::load` is the library
/// API, with no REPL around it to catch one).
#[test]
fn zero_or_non_dividing_heads_are_one_line_errors() {
    let set = |key: &'static str, v: i64| move |d: &Path| edit_config(d, |c| c[key] = v.into());
    let cases: Vec<(tempfile::TempDir, &str)> = vec![
        (broken("roberta", set("num_attention_heads", 0)), "bad config: hidden_size 32 is not a multiple of num_attention_heads 0"),
        (broken("roberta", set("num_attention_heads", -4)), "bad config: hidden_size 32 is not a multiple of num_attention_heads -4"),
        (broken("roberta", set("num_attention_heads", 5)), "bad config: hidden_size 32 is not a multiple of num_attention_heads 5"),
        (broken("gpt2", set("n_head", 0)), "bad config: n_embd 32 is not a multiple of n_head 0"),
        (broken("gpt2", set("n_head", 3)), "bad config: n_embd 32 is not a multiple of n_head 3"),
        (broken("llama", set("num_attention_heads", 0)), "bad config: num_attention_heads 0 is not a positive multiple of num_key_value_heads 2"),
        (broken("llama", set("num_key_value_heads", 0)), "bad config: num_attention_heads 4 is not a positive multiple of num_key_value_heads 0"),
        (broken("llama", set("num_key_value_heads", 3)), "bad config: num_attention_heads 4 is not a positive multiple of num_key_value_heads 3"),
        (broken("qwen2", set("num_attention_heads", 0)), "bad config: num_attention_heads 0 is not a positive multiple of num_key_value_heads 2"),
        (broken("qwen2", set("num_attention_heads", 6)), "bad config: head size 0 (head_dim, else hidden_size 32 / num_attention_heads 6) must be a positive even number"),
        (broken("mistral", set("num_attention_heads", 0)), "bad config: num_attention_heads 0 is not a positive multiple of num_key_value_heads 2"),
        (broken("bart", set("encoder_attention_heads", 0)), "bad config: d_model 32 is not a multiple of encoder_attention_heads 0"),
        (broken("bart", set("decoder_attention_heads", 5)), "bad config: d_model 32 is not a multiple of decoder_attention_heads 5"),
        (broken("marian", set("encoder_attention_heads", 0)), "bad config: d_model 32 is not a multiple of encoder_attention_heads 0"),
    ];
    let mut wrong = Vec::new();
    for (d, want) in &cases {
        let cfg = d.path().join("config.json").display().to_string();
        match std::panic::catch_unwind(|| load_err(d.path())) {
            Err(_) => wrong.push(format!("{cfg}: panicked (want {want:?})")),
            Ok(e) if !e.starts_with(&format!("{cfg}: {want}")) || e.lines().count() != 1 => {
                wrong.push(format!("{cfg}: want {want:?}, got {e:?}"))
            }
            Ok(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// SmolLM2 from its GGUF and from an HF safetensors export of the same weights (made by
/// `tests/fixtures/export_smollm2_hf.py` with transformers' GGUF loader) give the same logits.
#[test]
fn smollm2_from_gguf_equals_its_hf_export() {
    let _heavy = common::heavy();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let r = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("tests/fixtures/export_smollm2_hf.py"))
        .arg(headscope::assets::asset_path("smollm2").unwrap())
        .arg(out.path())
        .output()
        .unwrap();
    assert!(r.status.success(), "export failed: {}", String::from_utf8_lossy(&r.stderr));
    let gguf = Model::load(
        &headscope::assets::asset_path("smollm2").unwrap(),
        LoadOptions::new(headscope::device::DeviceChoice::Cpu, "f32").unwrap(),
    )
    .unwrap();
    let hf = Model::load(out.path(), LoadOptions::new(headscope::device::DeviceChoice::Cpu, "f32").unwrap()).unwrap();
    assert_eq!(hf.family.to_string(), "llama");
    let mut worst = 0f64;
    for text in
        ["The cat is sleeping on the sofa.", "Researchers ask which heads matter, and how many can go.", "Hello."]
    {
        let ids = gguf.tokenize(text).unwrap().ids;
        assert_eq!(ids, hf.tokenize(text).unwrap().ids);
        let (la, aa) = forward(&gguf, &ids, &Gates::none());
        let (lb, ab) = forward(&hf, &ids, &Gates::none());
        let depth = common::depth(&hf, ids.len());
        worst = worst.max(max_diff(&la, &lb) / common::f32_bound(common::scale(&lb), depth));
        let da = max_diff(&aa, &ab) / common::f32_bound(1.0, depth);
        assert!(da <= 1.0, "attention differs by {da:.3} of the float32 bound");
    }
    println!("SmolLM2 GGUF vs HF export: largest logit difference {worst:.3} of the float32 bound");
    assert!(worst <= 1.0, "logits differ by {worst:.3} of the float32 bound");
}

/// RoBERTa (the BERT code with positions numbered after the padding index): last hidden
/// states and every head's attention against transformers' `RobertaModel`, on a padded batch
/// too.
#[test]
fn roberta_equals_transformers() {
    roberta_against("tiny_hf/golden.npz", "roberta");
}

/// RoBERTa's checks against the goldens in `golden`, the checkpoint in `dir_name` (under
/// tests/fixtures/tiny_hf): the transformers-5 twin uses it (`hf_tf5.rs`).
pub(crate) fn roberta_against(golden: &str, dir_name: &str) {
    let g = common::golden(golden);
    let m = common::tiny_hf(dir_name, "f32");
    assert_eq!((m.family.to_string(), m.kinds()[0].kind), ("roberta".to_string(), Kind::Enc));
    let n = g.keys().filter(|k| k.starts_with("roberta_ids_")).count();
    assert_eq!(n, 5);
    let ids: Vec<Vec<i64>> = (0..n).map(|i| Vec::<i64>::try_from(&g[&format!("roberta_ids_{i}")]).unwrap()).collect();
    // One padded batch of all five sentences.
    let enc: Vec<headscope::model::tokenize::tokenizer::Encoded> = ids
        .iter()
        .map(|v| {
            let text = m.detokenize(v).unwrap();
            m.tokenize(&text).unwrap()
        })
        .collect();
    for (e, want) in enc.iter().zip(&ids) {
        assert_eq!(&e.ids, want, "token ids");
    }
    let b = m.batch_encoded(enc);
    let _g = tch::no_grad_guard();
    let (seen, h) = common::recorded(&[Point::Pattern], |r| m.encode(&b, &Gates::none(), Some(r)).unwrap());
    let attn = common::at_point(&seen, Point::Pattern);
    let (mut wh, mut wa) = (0f64, 0f64);
    for (i, v) in ids.iter().enumerate() {
        let t = v.len() as i64;
        let depth = common::depth(&m, v.len());
        let want = &g[&format!("roberta_hidden_{i}")];
        wh = wh.max(max_diff(&h.get(i as i64).narrow(0, 0, t), want) / common::f32_bound(common::scale(want), depth));
        let a =
            Tensor::stack(&attn.iter().map(|x| x.get(i as i64).narrow(1, 0, t).narrow(2, 0, t)).collect::<Vec<_>>(), 0);
        wa = wa.max(max_diff(&a, &g[&format!("roberta_attn_{i}")]) / common::f32_bound(1.0, depth));
    }
    println!("roberta: largest hidden-state difference {wh:.3} of the float32 bound, attention {wa:.3}");
    assert!(wh <= 1.0 && wa <= 1.0, "hidden {wh:.3}, attention {wa:.3} of the float32 bound");
}
