//! Packed rows (docs/methods.md#packing): a language model's sentences several to a row behind
//! a segment mask compute as each alone, on every family whose positions allow it (rotary with
//! any length-free scaling, sliding windows, soft-caps, sinks, latent attention, experts); the
//! others (learned positions, LongRope, dynamic NTK, Llama 4's chunks and temperature) are not
//! packed.

use crate::common;
use headscope::model::nn::Gates;
use tch::{Kind as DType, Tensor};

const TEXTS: [&str; 5] = [
    "The cat sat on the mat.",
    "Attention heads can be pruned.",
    "Specialized heads do the heavy lifting, the rest can be pruned without much loss.",
    "Hi.",
    "A short sentence, and then a slightly longer one with more words in it.",
];

/// Each tiny checkpoint and whether its sentences may share a row.
const FAMILIES: [(&str, bool); 17] = [
    ("llama", true),
    ("llama3", true),
    ("llama_linear", true),
    ("llama_yarn", true),
    ("llama_dynamic", false),
    ("mistral", true),
    ("qwen2", true),
    ("qwen3", true),
    ("gemma2", true),
    ("gemma3", true),
    ("olmo2", true),
    ("pythia", true),
    ("gpt_oss", true),
    ("deepseek_v2", true),
    ("olmoe", true),
    ("phi3", false),
    ("gpt2", false),
];

#[test]
fn packed_rows_equal_each_sentence_alone() {
    let _g = tch::no_grad_guard();
    let mut families: Vec<(&str, bool)> = FAMILIES.to_vec();
    families.push(("llama4_text", false));
    for (name, packs) in families {
        let m = common::tiny_hf(name, "f32");
        assert_eq!(m.net.packs(&Gates::none()), packs, "{name}: packs");
        if !packs {
            continue;
        }
        let encoded = m.tokenize_all(TEXTS).unwrap();
        let batches: Vec<_> = m.packed_batches(&encoded, 1024).collect();
        assert_eq!(batches.len(), 1, "{name}: one batch");
        let (order, b) = &batches[0];
        assert_eq!(b.ids.size()[0], 1, "{name}: the five sentences share one row");
        let states = m.net.encode(&b.ids, &b.mask, &Gates::none(), None).unwrap();
        let mut at = 0i64;
        for &i in order {
            let ids = Tensor::from_slice(&encoded[i].ids).view([1, -1]);
            let n = ids.size()[1];
            let mask = Tensor::ones([1, n], (DType::Float, tch::Device::Cpu));
            let alone = m.net.encode(&ids, &mask, &Gates::none(), None).unwrap();
            let packed = states.narrow(1, at, n);
            let bound = common::f32_bound(common::scale(&alone), common::depth(&m, n as usize));
            let d = common::max_diff(&packed, &alone);
            assert!(d <= bound, "{name}: sentence {i} packed at {at} differs from alone by {d:e} (bound {bound:e})");
            at += n;
        }
    }
}

#[test]
fn the_packed_loss_is_the_mean_of_each_sentences_own_losses() {
    let _g = tch::no_grad_guard();
    for (name, packs) in FAMILIES {
        let m = common::tiny_hf(name, "f32");
        let (mean, count, _) = m.dataset_loss(&TEXTS, None, 1024, &Gates::none(), &|| false).unwrap();
        // Each sentence alone, its next-token losses in float64 from its own logits.
        let (mut sum, mut n) = (0.0, 0usize);
        let mut bound = 0f64;
        for t in TEXTS {
            let p = m.predictions(t, &Gates::none()).unwrap();
            let losses = p.next_token_losses().unwrap();
            bound = bound.max(common::f32_bound(common::scale(&p.logits), common::depth(&m, losses.len() + 1)));
            sum += losses.iter().sum::<f64>();
            n += losses.len();
        }
        assert_eq!(count as usize, n, "{name}: target tokens (packed: {packs})");
        if !packs {
            // Padded rows: a length-dependent rotary (dynamic NTK) reads the padded length, as
            // transformers' padded batches do; only the count is the sentences' own.
            continue;
        }
        let want = sum / n as f64;
        assert!((mean - want).abs() <= 2.0 * bound, "{name}: loss {mean} vs {want} alone (packed: {packs})");
    }
}

/// The model's positions bound each sentence, not a packed row: rows longer than a tiny
/// model's `max_position_embeddings` run (their sentences are shorter), a sentence longer is
/// refused naming both lengths unless `past_positions` is on; dynamic NTK has no limit.
#[test]
fn positions_bound_each_sentence_not_the_packed_row() {
    let _g = tch::no_grad_guard();
    let m = common::tiny_hf("llama_yarn", "f32"); // 64 positions
    let max = m.net.max_positions.expect("a rotary model records its positions");
    let many: Vec<&str> = TEXTS.iter().cycle().take(40).copied().collect();
    let encoded = m.tokenize_all(many.iter().copied()).unwrap();
    let batches: Vec<_> = m.packed_batches(&encoded, 100_000).collect();
    assert!(batches.iter().any(|(_, b)| b.ids.size()[1] > max), "no packed row past {max} positions");
    m.dataset_loss(&many, None, 100_000, &Gates::none(), &|| false).expect("packed rows past the limit run");
    let long = "a b c d e f g h ".repeat(max as usize);
    let e = m.dataset_loss(&[long.as_str()], None, 100_000, &Gates::none(), &|| false).expect_err("refused");
    let e = e.to_string();
    assert!(
        e.contains(&format!("longer than the model's {max} positions")) && e.contains("allow_past_positions"),
        "{e}"
    );
    headscope::budget::set_past_positions(Some(true));
    let past = m.dataset_loss(&[long.as_str()], None, 100_000, &Gates::none(), &|| false);
    headscope::budget::set_past_positions(None);
    assert!(past.is_ok_and(|(l, _, _)| l.is_finite()), "allowed past the positions");
    assert_eq!(common::tiny_hf("llama_dynamic", "f32").net.max_positions, None, "dynamic NTK scales itself");
}
