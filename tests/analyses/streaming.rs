//! Streaming heads (docs/methods.md#streaming-heads) against transformers in float64 with the
//! same sink + recent mask on the streaming heads alone (`fixtures/streaming_reference.py`, an
//! attention function of its own registered with transformers' `AttentionInterface`).

use crate::common;
use headscope::model::hooks::{At, Point, Record};
use headscope::model::nn::Regime;
use headscope::model::view::View;
use headscope::model::{HeadId, Kind, ModelError};
use std::collections::HashMap;
use tch::{Kind as DType, Tensor};

const SENTENCES: [&str; 3] = ["the cat and the dog sat on the mat in the park all day", "a dog ran in the park today and we like green tea", "it is raining"];

fn golden() -> HashMap<String, Tensor> {
    Tensor::read_npz(common::fixtures().join("streaming_golden.npz")).unwrap().into_iter().collect()
}

/// Each layer's pattern `[B, H, T, T]` and the last real position's logits `[B, V]` of the
/// sentences run as one padded batch.
fn run(v: &View) -> (Vec<Tensor>, Tensor, Vec<i64>) {
    let m = &v.model;
    let b = m.batch(&SENTENCES).unwrap();
    let mut patterns = Vec::new();
    let mut on = |_: At, a: &Tensor| -> Result<(), ModelError> {
        patterns.push(a.shallow_clone());
        Ok(())
    };
    let mut rec = Record::new(&[Point::Pattern], &mut on);
    let states = m.encode(&b, &v.gates().unwrap(), Some(&mut rec)).unwrap();
    let lens: Vec<i64> = b.encoded.iter().map(|e| e.ids.len() as i64).collect();
    let last: Vec<Tensor> = lens.iter().enumerate().map(|(i, &n)| states.get(i as i64).get(n - 1)).collect();
    let logits = m.net.logits(&Tensor::stack(&last, 0)).unwrap();
    (patterns, logits, lens)
}

#[test]
fn streaming_heads_equal_transformers_with_the_same_mask() {
    let g = golden();
    for (name, heads) in [("llama", vec![(0, 2), (1, 0)]), ("gpt2", vec![(0, 1), (1, 3)])] {
        let m = View::new(common::tiny_hf(name, "f64"));
        for (s, text) in SENTENCES.iter().enumerate() {
            let ids: Vec<i64> = m.model.tokenize(text).unwrap().ids.iter().map(|&i| i as i64).collect();
            assert_eq!(ids, Vec::<i64>::try_from(&g[&format!("{name}/{s}/ids")]).unwrap(), "{name}: sentence {s} tokenized as transformers does");
        }
        let ids: Vec<HeadId> = heads.iter().map(|&(l, h)| HeadId { kind: Kind::Dec, layer_idx: l, head: h }).collect();
        let (_, full, _) = run(&m);
        for (s, _) in SENTENCES.iter().enumerate() {
            let d = common::max_diff(&full.get(s as i64), &g[&format!("{name}/full/{s}/last_logits")]);
            assert!(d < 1e-10, "{name} sentence {s}: unstreamed logits differ by {d:e}");
        }
        for (regime, key) in [(Regime::Always, "always"), (Regime::Decode { prompt: Some(6) }, "decode")] {
            let v = m.streaming(&ids, 2, 3, regime, "test").unwrap();
            let (patterns, logits, lens) = run(&v);
            let (mut worst_p, mut worst_l, mut moved) = (0f64, 0f64, 0f64);
            for (s, &n) in lens.iter().enumerate() {
                let want = &g[&format!("{name}/{key}/{s}/last_logits")];
                worst_l = worst_l.max(common::max_diff(&logits.get(s as i64), want));
                moved = moved.max(common::max_diff(want, &g[&format!("{name}/full/{s}/last_logits")]));
                for (l, p) in patterns.iter().enumerate() {
                    let got = p.get(s as i64).narrow(1, 0, n).narrow(2, 0, n).to_kind(DType::Double);
                    worst_p = worst_p.max(common::max_diff(&got, &g[&format!("{name}/{key}/{s}/pattern/{l}")]));
                }
            }
            eprintln!("{name} {key}: patterns within {worst_p:.1e}, last logits within {worst_l:.1e} (streaming moved them by up to {moved:.2})");
            assert!(worst_p < 1e-6 && worst_l < 1e-6, "{name} {key}: patterns {worst_p:e}, logits {worst_l:e}");
            assert!(moved > 1e-3, "{name} {key}: the case must change something");
        }
    }
}

/// Generation over the key/value cache sees the same streaming heads as a whole-text run: the
/// decode regime's prompt is the generation's prompt, and the always regime hides the same keys
/// step by step.
#[test]
fn streaming_generation_equals_the_whole_text_run() {
    for name in ["llama", "gpt2"] {
        let m = View::new(common::tiny_hf(name, "f64"));
        let heads = [HeadId { kind: Kind::Dec, layer_idx: 0, head: 1 }, HeadId { kind: Kind::Dec, layer_idx: 1, head: 3 }];
        let prompt = "the cat and the dog sat on the mat";
        let n_prompt = m.model.tokenize(prompt).unwrap().ids.len() as i64;
        for regime in [Regime::Always, Regime::Decode { prompt: None }] {
            let v = m.streaming(&heads, 2, 3, regime, "test").unwrap();
            let new = v.model.generate(prompt, 8, &v.gates().unwrap()).unwrap();
            let out: Vec<i64> = m.model.tokenize(prompt).unwrap().ids.iter().map(|&i| i as i64).chain(new.iter().copied()).collect();
            // The same ids run whole: each generated token is the argmax at its position.
            let fixed = match regime {
                Regime::Decode { .. } => m.streaming(&heads, 2, 3, Regime::Decode { prompt: Some(n_prompt) }, "test").unwrap(),
                Regime::Always => v.clone(),
            };
            let ids = Tensor::from_slice(&out).view([1, -1]);
            let mask = ids.ones_like().to_kind(DType::Float);
            let states = fixed.model.net.encode(&ids, &mask, &fixed.gates().unwrap(), None).unwrap();
            let top = fixed.model.net.logits(&states).unwrap().argmax(-1, false).get(0);
            for t in n_prompt as usize..out.len() {
                assert_eq!(top.int64_value(&[t as i64 - 1]), out[t], "{name} {regime:?}: token {t} of {out:?}");
            }
            let plain = m.model.generate(prompt, 8, &m.gates().unwrap()).unwrap();
            eprintln!("{name} {regime:?}: streaming generation {new:?} (unstreamed {plain:?})");
        }
    }
}
