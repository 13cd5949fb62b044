//! HF encoder-decoder families (MarianMT from safetensors and from `pytorch_model.bin`, BART)
//! against transformers: tiny random checkpoints in each family's official layout and their
//! golden outputs (eager attention, float32) come from `tests/fixtures/make_tiny_seq2seq.py`.
//! Source ids equal the HF tokenizer's (MarianMT: its sentencepiece models and vocab.json);
//! teacher-forced logits and every head's attention (`enc`, `dec`, `cross`) within 1e-4; greedy
//! translations token for token; gates equal to `head_mask`, `decoder_head_mask` and
//! `cross_attn_head_mask`.

use crate::common;
use crate::common::max_diff;

use headscope::model::hooks::Point;
use headscope::model::nn::Gates;
use headscope::model::transformer::Stop;
use headscope::model::{Kind, Model};
use std::collections::HashMap;
use tch::Tensor;

// float32 against transformers: common::f32_bound (scale x sqrt(depth), derived there).
const MASK_ENC: [[f32; 4]; 2] = [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]];
const MASK_DEC: [[f32; 4]; 2] = [[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]];
const MASK_CROSS: [[f32; 4]; 2] = [[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]];

fn mask(m: &[[f32; 4]; 2]) -> Tensor {
    Tensor::from_slice(&m.concat()).view([1, 2, 4])
}

/// Teacher-forced logits `[T, V]` and each kind's attention `[L, H, Tq, Tk]`.
fn forward(m: &Model, src: &[i64], targets: &[i64], gates: &Gates) -> (Tensor, HashMap<Kind, Tensor>) {
    let ids = Tensor::from_slice(src).view([1, src.len() as i64]);
    let mask = Tensor::ones([1, src.len() as i64], (tch::Kind::Float, tch::Device::Cpu));
    let tgt = Tensor::from_slice(targets).view([1, targets.len() as i64]);
    let _g = tch::no_grad_guard();
    let (seen, logits) = common::recorded(&[Point::Pattern], |r| {
        let enc = m.net.encode(&ids, &mask, gates, Some(&mut *r)).unwrap();
        m.net.teacher(&enc, &mask, &tgt, Stop::Logits, gates, Some(r)).unwrap().get(0)
    });
    let mut attn: HashMap<Kind, Vec<Tensor>> = HashMap::new();
    for (at, a) in seen {
        attn.entry(at.kind).or_default().push(a.get(0));
    }
    // A pruned model's layers differ in width: their attention is not stacked.
    (logits, attn.into_iter().filter_map(|(k, v)| Tensor::f_stack(&v, 0).ok().map(|t| (k, t))).collect())
}

fn check(name: &str, dir_name: &str) {
    check_in("tiny_hf/golden_seq2seq.npz", name, dir_name)
}

/// [`check`] against the goldens in `golden` (under tests/fixtures), the checkpoint in `dir_name`
/// (under tests/fixtures/tiny_hf): the transformers-5 twins use it (`hf_tf5.rs`).
pub(crate) fn check_in(golden: &str, name: &str, dir_name: &str) {
    let g = common::golden(golden);
    let m = common::tiny_hf(dir_name, "f32");
    assert_eq!(
        m.kinds().iter().map(|k| k.kind).collect::<Vec<_>>(),
        vec![Kind::Enc, Kind::Dec, Kind::Cross],
        "{dir_name}: kinds"
    );
    let n = g.keys().filter(|k| k.starts_with(&format!("{name}_ids_"))).count();
    assert!(n >= 20, "{name}: {n} sentences in {golden}");
    let texts = common::short_pud_sentences(n);
    let (mut worst_logit, mut worst_attn, mut worst_masked) = (0f64, 0f64, 0f64);
    let mut detailed = 0;
    let gates = Gates {
        enc: Some(mask(&MASK_ENC)),
        dec: Some(mask(&MASK_DEC)),
        cross: Some(mask(&MASK_CROSS)),
        ..Gates::none()
    };
    for (i, text) in texts.iter().enumerate() {
        let want_ids = Vec::<i64>::try_from(&g[&format!("{name}_ids_{i}")]).unwrap();
        let src = m.tokenize(text).unwrap().ids;
        assert_eq!(src, want_ids, "{dir_name}: token ids of sentence {i} ({text:?})");
        let want_gen = Vec::<i64>::try_from(&g[&format!("{name}_gen_{i}")]).unwrap();
        // Greedy translation, at most floor(2.5 * source tokens) + 2 tokens, stopping at EOS.
        let got_gen = {
            let _g = tch::no_grad_guard();
            let ids = Tensor::from_slice(&src).view([1, src.len() as i64]);
            let mask = Tensor::ones([1, src.len() as i64], (tch::Kind::Float, tch::Device::Cpu));
            let enc = m.net.encode(&ids, &mask, &Gates::none(), None).unwrap();
            m.net.greedy(&enc, &mask, &[(2.5 * src.len() as f64) as i64 + 2], &Gates::none()).unwrap().remove(0)
        };
        let want_tokens: Vec<i64> = want_gen.iter().copied().take_while(|&t| t != m.net.eos_id).collect();
        assert_eq!(got_gen, want_tokens, "{dir_name}: greedy translation of sentence {i}");
        assert!(
            !got_gen.contains(&m.tok.pad_id) || m.net.banned.is_empty(),
            "{dir_name}: a banned token was generated"
        );
        if let Some(logits) = g.get(&format!("{name}_logits_{i}")) {
            let t = logits.size()[0] as usize;
            let targets: Vec<i64> = want_gen[..t].to_vec();
            let (l, a) = forward(&m, &src, &targets, &Gates::none());
            let depth = common::depth(&m, src.len().max(t));
            worst_logit = worst_logit.max(max_diff(&l, logits) / common::f32_bound(common::scale(logits), depth));
            for kind in [Kind::Enc, Kind::Dec, Kind::Cross] {
                worst_attn = worst_attn
                    .max(max_diff(&a[&kind], &g[&format!("{name}_{kind}_{i}")]) / common::f32_bound(1.0, depth));
            }
            let (lm, _) = forward(&m, &src, &targets, &gates);
            let want_masked = &g[&format!("{name}_masked_{i}")];
            worst_masked =
                worst_masked.max(max_diff(&lm, want_masked) / common::f32_bound(common::scale(want_masked), depth));
            // The masks matter: the comparison would catch gates that did nothing.
            assert!(max_diff(&l, want_masked) > 1e-2, "{dir_name}: closing heads did not change the logits");
            detailed += 1;
        }
    }
    assert!(detailed >= 2, "{dir_name}: {detailed} teacher-forced goldens");
    eprintln!("{dir_name}: {n} sentences, {detailed} teacher-forced; logits within {worst_logit:.3} of the float32 bound, attention {worst_attn:.3}, gated logits {worst_masked:.3} (of head masks)");
    assert!(worst_logit <= 1.0, "{dir_name}: logits differ by {worst_logit:.3} of the float32 bound");
    assert!(worst_attn <= 1.0, "{dir_name}: attention differs by {worst_attn:.3} of the float32 bound");
    assert!(
        worst_masked <= 1.0,
        "{dir_name}: gated logits differ from head masks' by {worst_masked:.3} of the float32 bound"
    );
}

#[test]
fn marian_equals_transformers() {
    check("marian", "marian");
}

#[test]
fn marian_from_pytorch_model_bin_equals_transformers() {
    check("marian", "marian_torchbin");
}

#[test]
fn bart_equals_transformers() {
    check("bart", "bart");
}

/// `prune_heads` on decoder self-attention heads (one layer emptied) equals masking them:
/// teacher-forced logits of the pruned MarianMT equal the gated original's, and its `dec`
/// layers hold fewer heads.
#[test]
fn pruned_decoder_self_attention_equals_masking() {
    use headscope::model::HeadId;
    let m = common::tiny_hf("marian", "f32");
    let mut closed: Vec<HeadId> = (0..4).map(|head| HeadId { kind: Kind::Dec, layer_idx: 1, head }).collect();
    closed.extend([
        HeadId { kind: Kind::Dec, layer_idx: 0, head: 2 },
        HeadId { kind: Kind::Cross, layer_idx: 0, head: 1 },
    ]);
    let pruned = headscope::prune::physical::prune_heads(&m, &closed, None).unwrap();
    assert_eq!(pruned.present(Kind::Dec, 1), Vec::<usize>::new(), "dec layer 1 emptied");
    assert_eq!(pruned.present(Kind::Dec, 0), vec![0, 1, 3]);
    let gates = m.gates_closing(&closed).unwrap();
    let src = m.tokenize("The cat sat on the mat.").unwrap().ids;
    let targets: Vec<i64> = vec![5, 9, 17, 4, 0];
    let (want, _) = forward(&m, &src, &targets, &gates);
    let (got, _) = forward(&pruned, &src, &targets, &Gates::none());
    let (open, _) = forward(&m, &src, &targets, &Gates::none());
    let d = max_diff(&got, &want);
    assert!(d < 1e-5, "pruned vs masked logits differ by {d:e}");
    assert!(max_diff(&open, &want) > 1e-3, "closing the heads must change the logits");
}
