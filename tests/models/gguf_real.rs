//! The two real GGUF assets (scripts/setup: Gemma 3 270M and Qwen2.5-Coder-0.5B-Instruct, both
//! Q4_K_M, mixing Q4_K, Q5_0, Q6_K and Q8_0 tensors) against transformers' GGUF loader
//! (`tests/fixtures/gguf_real_reference.py`): the dequantised weights as the model holds them,
//! the last position's logits on three PUD sentences (within 1e-3 of the row's largest value,
//! the row's norm within 1e-3 relative, the argmax equal) and the greedy continuation of 8
//! tokens.

use crate::common;
use headscope::model::nn::Gates;
use tch::{Kind, Tensor};

fn sum_and_squares(t: &Tensor) -> (f64, f64) {
    let t = t.to_kind(Kind::Double);
    (t.sum(Kind::Double).double_value(&[]), (&t * &t).sum(Kind::Double).double_value(&[]))
}

#[test]
fn real_gguf_checkpoints_equal_transformers_gguf_loader() {
    let g = common::golden("gguf_real_golden.npz");
    let toks = common::golden_json("gguf_tokenizer_golden.json");
    for (key, asset) in [("gemma3", "gemma3"), ("qwen2", "qwen25coder")] {
        let m = common::asset(asset, "f32");
        let (l0, l3) = (&m.net.stack[0], &m.net.stack[3]);
        // The model holds Gemma's norms as 1 + w; transformers holds w.
        let minus_one = |t: &Tensor| t - 1.0;
        let weights: Vec<(&str, Tensor)> = match key {
            "gemma3" => vec![
                ("model.embed_tokens.weight", m.net.embed.tokens.shallow_clone()),
                ("model.layers.0.self_attn.q_proj.weight", l0.attention().unwrap().q.w.shallow_clone()),
                ("model.layers.0.self_attn.o_proj.weight", l0.attention().unwrap().o.w.shallow_clone()),
                ("model.layers.0.mlp.down_proj.weight", l0.dense().unwrap().down.w.shallow_clone()),
                ("model.layers.0.self_attn.v_proj.weight", l0.attention().unwrap().v.w.shallow_clone()),
                (
                    "model.layers.0.self_attn.q_norm.weight",
                    minus_one(&l0.attention().unwrap().qk_norm.as_ref().unwrap().q.weight),
                ),
                ("model.layers.0.post_feedforward_layernorm.weight", minus_one(&l0.post_norms().unwrap().1.weight)),
            ],
            _ => vec![
                ("model.embed_tokens.weight", m.net.embed.tokens.shallow_clone()),
                ("lm_head.weight", m.net.output.as_ref().unwrap().w.shallow_clone()),
                ("model.layers.0.self_attn.q_proj.weight", l0.attention().unwrap().q.w.shallow_clone()),
                ("model.layers.0.mlp.down_proj.weight", l0.dense().unwrap().down.w.shallow_clone()),
                ("model.layers.0.self_attn.v_proj.weight", l0.attention().unwrap().v.w.shallow_clone()),
                ("model.layers.0.self_attn.k_proj.bias", l0.attention().unwrap().k.b.as_ref().unwrap().shallow_clone()),
                ("model.layers.3.mlp.up_proj.weight", l3.dense().unwrap().up.w.shallow_clone()),
            ],
        };
        for (name, t) in &weights {
            let (s, q) = sum_and_squares(t);
            let (ws, wq) =
                (g[&format!("{key}_wsum_{name}")].double_value(&[]), g[&format!("{key}_wsq_{name}")].double_value(&[]));
            assert!((q - wq).abs() <= 1e-6 * wq, "{key} {name}: sum of squares {q} vs transformers' {wq}");
            assert!(
                (s - ws).abs() <= 1e-6 * wq.sqrt() * (t.numel() as f64).sqrt(),
                "{key} {name}: sum {s} vs transformers' {ws}"
            );
        }
        let cols = g[&format!("{key}_cols")].shallow_clone();
        let mut worst: f64 = 0.0;
        for i in 0..3 {
            let ids: Vec<i64> = toks[key][i].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
            let t = Tensor::from_slice(&ids).view([1, ids.len() as i64]);
            let mask = Tensor::ones([1, ids.len() as i64], (Kind::Float, tch::Device::Cpu));
            let last = {
                let _g = tch::no_grad_guard();
                let h = m.net.encode(&t, &mask, &Gates::none(), None).unwrap();
                m.net.logits(&h).unwrap().get(0).get(ids.len() as i64 - 1).to_kind(Kind::Double)
            };
            let want = &g[&format!("{key}_logits_{i}")];
            let scale = want.abs().max().double_value(&[]);
            let d = (last.index_select(0, &cols) - want).abs().max().double_value(&[]) / scale;
            worst = worst.max(d);
            assert!(d < 1e-3, "{key}, sentence {i}: last-position logits differ by {d:e} of the largest");
            let (norm, want_norm) = (last.norm().double_value(&[]), g[&format!("{key}_norm_{i}")].double_value(&[]));
            assert!(
                (norm - want_norm).abs() < 1e-3 * want_norm,
                "{key}, sentence {i}: logit norm {norm} vs {want_norm}"
            );
            assert_eq!(
                last.argmax(0, false).int64_value(&[]),
                g[&format!("{key}_argmax_{i}")].int64_value(&[]),
                "{key}, sentence {i}: argmax"
            );
        }
        let text = toks["texts"][0].as_str().unwrap();
        let want_gen: Vec<i64> = Vec::<i64>::try_from(&g[&format!("{key}_gen")])
            .unwrap()
            .into_iter()
            .take_while(|&t| t != m.net.eos_id)
            .collect();
        assert_eq!(m.generate(text, 8, &Gates::none()).unwrap(), want_gen, "{key}: greedy continuation");
        println!(
            "{key}: weights equal, last-position logits within {worst:.1e} of the largest, greedy continuation equal"
        );
    }
}
