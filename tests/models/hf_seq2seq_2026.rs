//! The pre-norm encoder-decoders (M2M100 as NLLB-200 ships it, mBART) against transformers 4.57:
//! tiny random checkpoints in each family's official layout and their goldens (eager attention,
//! float32) come from `tests/fixtures/make_tiny_seq2seq_2026.py`. Source ids equal the HF
//! tokenizer's; teacher-forced logits and every head's attention (`enc`, `dec`, `cross`) within
//! the float32 bound (`common::f32_bound`); greedy translations token for token, the forced target-language token first (the
//! checkpoint's `forced_bos_token_id` from config.json for M2M100, from generation_config.json
//! for mBART; another language through `tgt_lang`), one sentence at a time and batched; gates
//! equal to `head_mask`, `decoder_head_mask` and `cross_attn_head_mask`. Also: the hook points
//! the model lists are those its forward meets, the cross-head sweep (resumed at the pre-norm
//! decoder's `hook_resid_mid`) equals masking one head at a time, and bad input fails in one
//! line. T5, Flan-T5 and mT5 (`make_tiny_seq2seq_2026.py` too): the same checks without a forced
//! language, the relative position bias included.

use crate::common;
use crate::common::max_diff;

use headscope::model::hooks::{At, Point, Record};
use headscope::model::nn::Gates;
use headscope::model::transformer::Stop;
use headscope::model::{HeadId, Kind, Model};
use std::collections::HashMap;
use tch::Tensor;

// float32 against transformers: common::f32_bound (scale x sqrt(depth), derived there).
const GOLDEN: &str = "tiny_hf/golden_seq2seq_2026.npz";
const MASK_ENC: [[f32; 4]; 2] = [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]];
const MASK_DEC: [[f32; 4]; 2] = [[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]];
const MASK_CROSS: [[f32; 4]; 2] = [[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]];

fn mask(m: &[[f32; 4]; 2]) -> Tensor {
    Tensor::from_slice(&m.concat()).view([1, 2, 4])
}

fn ids(v: &[i64]) -> (Tensor, Tensor) {
    (
        Tensor::from_slice(v).view([1, v.len() as i64]),
        Tensor::ones([1, v.len() as i64], (tch::Kind::Float, tch::Device::Cpu)),
    )
}

/// Teacher-forced logits `[T, V]` and each kind's attention `[L, H, Tq, Tk]`.
fn forward(m: &Model, src: &[i64], targets: &[i64], gates: &Gates) -> (Tensor, HashMap<Kind, Tensor>) {
    let (x, mask) = ids(src);
    let (tgt, _) = ids(targets);
    let _g = tch::no_grad_guard();
    let (seen, logits) = common::recorded(&[Point::Pattern], |r| {
        let enc = m.net.encode(&x, &mask, gates, Some(&mut *r)).unwrap();
        m.net.teacher(&enc, &mask, &tgt, Stop::Logits, gates, Some(r)).unwrap().get(0)
    });
    let mut attn: HashMap<Kind, Vec<Tensor>> = HashMap::new();
    for (at, a) in seen {
        attn.entry(at.kind).or_default().push(a.get(0));
    }
    // A pruned model's layers differ in width: their attention is not stacked.
    (logits, attn.into_iter().filter_map(|(k, v)| Tensor::f_stack(&v, 0).ok().map(|t| (k, t))).collect())
}

fn greedy(m: &Model, src: &[i64], max_len: i64) -> Vec<i64> {
    let _g = tch::no_grad_guard();
    let (x, mask) = ids(src);
    let enc = m.net.encode(&x, &mask, &Gates::none(), None).unwrap();
    m.net.greedy(&enc, &mask, &[max_len], &Gates::none()).unwrap().remove(0)
}

fn check(name: &str) {
    check_in(GOLDEN, name, name)
}

/// [`check`] against the goldens in `golden`, the checkpoint in `dir_name` (under
/// tests/fixtures/tiny_hf): the transformers-5 twins use it (`hf_tf5.rs`).
pub(crate) fn check_in(golden: &str, name: &str, dir_name: &str) {
    let g = common::golden(golden);
    let m = common::tiny_hf(dir_name, "f32");
    assert_eq!(
        m.kinds().iter().map(|k| k.kind).collect::<Vec<_>>(),
        vec![Kind::Enc, Kind::Dec, Kind::Cross],
        "{name}: kinds"
    );
    let n = g.keys().filter(|k| k.starts_with(&format!("{name}_ids_"))).count();
    assert!(n >= 20, "{name}: {n} sentences in {golden}");
    let texts = common::short_pud_sentences(n);
    // M2M100 and mBART force a target language (T5 does not).
    let forced = m.net.forced_bos.get();
    assert_eq!(
        forced.is_some(),
        g.contains_key(&format!("{name}_tgt2_id")),
        "{name}: the checkpoint's forced_bos_token_id"
    );
    let (mut worst_logit, mut worst_attn, mut worst_masked) = (0f64, 0f64, 0f64);
    let (mut detailed, mut compared) = (0, 0);
    let gates = Gates {
        enc: Some(mask(&MASK_ENC)),
        dec: Some(mask(&MASK_DEC)),
        cross: Some(mask(&MASK_CROSS)),
        ..Gates::none()
    };
    let mut want_all = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let want_ids = Vec::<i64>::try_from(&g[&format!("{name}_ids_{i}")]).unwrap();
        let src = m.tokenize(text).unwrap().ids;
        assert_eq!(src, want_ids, "{name}: token ids of sentence {i} ({text:?})");
        let want_gen = Vec::<i64>::try_from(&g[&format!("{name}_gen_{i}")]).unwrap();
        if let Some(f) = forced {
            assert_eq!(want_gen[0], f, "{name}: transformers forced the language token");
        }
        // Greedy translation, at most floor(2.5 * source tokens) + 2 tokens, stopping at EOS.
        let got = greedy(&m, &src, (2.5 * src.len() as f64) as i64 + 2);
        let want: Vec<i64> = want_gen.iter().copied().take_while(|&t| t != m.net.eos_id).collect();
        assert!(want.len() >= 8, "{name}: sentence {i}: a translation of {} tokens", want.len());
        assert_eq!(got, want, "{name}: greedy translation of sentence {i}");
        compared += got.len();
        want_all.push(want);
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
            assert!(max_diff(&l, want_masked) > 1e-2, "{name}: closing heads did not change the logits");
            detailed += 1;
        }
    }
    assert!(detailed >= 2, "{name}: {detailed} teacher-forced goldens");
    // Batched (length buckets, right padding): the same translations.
    let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
    let batched = m.translate(&refs, &Gates::none(), 200).unwrap();
    assert_eq!(batched, want_all, "{name}: batched translations");
    eprintln!("{name}: {n} sentences ({compared} greedy tokens{}), {detailed} teacher-forced; logits within {worst_logit:.3} of the float32 bound, attention {worst_attn:.3}, gated logits {worst_masked:.3} (of head masks)", if forced.is_some() { ", forced language first" } else { "" });
    assert!(worst_logit <= 1.0, "{name}: logits differ by {worst_logit:.3} of the float32 bound");
    assert!(worst_attn <= 1.0, "{name}: attention differs by {worst_attn:.3} of the float32 bound");
    assert!(
        worst_masked <= 1.0,
        "{name}: gated logits differ from head masks' by {worst_masked:.3} of the float32 bound"
    );
    // Another target language (`tgt_lang`): its code forced first, as transformers' generate
    // with that forced_bos_token_id.
    let Some(tgt2) = g.get(&format!("{name}_tgt2_id")).map(|t| t.int64_value(&[])) else { return };
    let code = m.tok.id_to_token(tgt2);
    let mut m2 = common::tiny_hf(dir_name, "f32");
    m2.set_target_language(&code).unwrap();
    let want2: Vec<Vec<i64>> = (0..n)
        .map(|i| {
            Vec::<i64>::try_from(&g[&format!("{name}_gen2_{i}")])
                .unwrap()
                .into_iter()
                .take_while(|&t| t != m.net.eos_id)
                .collect()
        })
        .collect();
    assert_ne!(want2, want_all, "{name}: the two target languages translate alike");
    assert_eq!(m2.translate(&refs, &Gates::none(), 200).unwrap(), want2, "{name}: translations into {code}");
    assert_eq!(
        m.translate_forced(&refs, &Gates::none(), 200, Some(tgt2)).unwrap(),
        want2,
        "{name}: translate's own tgt_lang {code}"
    );
}

#[test]
fn m2m100_equals_transformers() {
    check("m2m100");
}

#[test]
fn mbart_equals_transformers() {
    check("mbart");
}

/// T5 v1.0 (ReLU, tied output scaled by d^-0.5), Flan-T5 and mT5 (gated GELU, untied): the
/// relative position bias (bidirectional in the encoder, causal in the decoder, both reaching
/// the logarithmic buckets), unscaled scores, RMSNorms, d_kv other than d_model / heads.
#[test]
fn t5_flan_t5_mt5_equal_transformers() {
    for name in ["t5", "flan_t5", "mt5"] {
        check(name);
    }
}

/// The hook points a pre-norm encoder-decoder lists (`Model::hook_points`) are exactly those
/// one encode, one teacher-forced decoder pass and the unembedding meet, the decoder's final
/// norm (`dec.ln_final.hook_normalized`) included and equal to the states the logits read.
#[test]
fn prenorm_hook_points_are_those_the_forward_meets() {
    for name in ["m2m100", "mbart", "t5"] {
        let m = common::tiny_hf(name, "f32");
        let listed = m.hook_points();
        let mut points: Vec<Point> = Vec::new();
        for a in &listed {
            if !points.contains(&a.point) {
                points.push(a.point);
            }
        }
        let (x, mask) = ids(&m.tokenize("The cat sat on the mat.").unwrap().ids);
        let (tgt, _) = ids(&[5, 9, 17, 4]);
        let mut seen: Vec<At> = Vec::new();
        let mut last: Option<Tensor> = None;
        let states = {
            let _g = tch::no_grad_guard();
            let mut on = |at: At, t: &Tensor| {
                if !seen.contains(&at) {
                    seen.push(at);
                }
                if at == At::new(Kind::Dec, 0, Point::LnFinal) {
                    last = Some(t.shallow_clone());
                }
                Ok(())
            };
            let mut rec = Record { points: &points, kinds: &[Kind::Enc, Kind::Dec, Kind::Cross], on: &mut on };
            let enc = m.net.encode(&x, &mask, &Gates::none(), Some(&mut rec)).unwrap();
            let states = m.net.teacher(&enc, &mask, &tgt, Stop::FinalNorm, &Gates::none(), Some(&mut rec)).unwrap();
            let _ = m.net.logits_hooked(&states, &mut Some(&mut rec)).unwrap();
            states
        };
        // The listing is in TransformerLens's order (q, k, v); the forward computes keys and
        // values first (cross-attention's from the encoder output, once): compared as sets.
        let (mut seen, mut listed) = (seen, listed);
        seen.sort();
        listed.sort();
        assert_eq!(seen, listed, "{name}: listed hook points vs the forward's");
        let last = last.unwrap_or_else(|| panic!("{name}: no dec.ln_final"));
        assert_eq!(max_diff(&last, &states), 0.0, "{name}: the decoder's final norm is its output");
    }
}

/// On M2M100 and T5 (its relative position bias in the rows the stack resumes over) the
/// single-head sweep over `cross` heads resumes the pre-norm decoder at each layer's
/// `hook_resid_mid` (`DecoderLayer::cross_resume_point`): equal to masking one head at a time
/// (1e-5 relative), for `dec` and `enc` heads too.
#[test]
fn prenorm_sweep_equals_one_at_a_time() {
    use headscope::analysis::ablation::{evaluate, prepare, sweep, Metric};
    for name in ["m2m100", "t5"] {
        let m = common::tiny_hf(name, "f32");
        let data =
            headscope::data::Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap().take(6);
        let p = prepare(&m, &data, Metric::Loss, 128, Gates::none()).unwrap();
        let grids = sweep(&m, &p, &[Kind::Enc, Kind::Dec, Kind::Cross], &|| false, &mut |_, _| {}).unwrap();
        let base = evaluate(&m, &p, &Gates::none(), &|| false).unwrap();
        let (mut checked, mut differs, mut worst) = (0, 0, 0f64);
        for (kind, grid) in &grids {
            for (l, row) in grid.iter().enumerate() {
                for (h, &v) in row.iter().enumerate() {
                    let id = HeadId { kind: *kind, layer_idx: l, head: h };
                    let one = evaluate(&m, &p, &m.gates_closing(&[id]).unwrap(), &|| false).unwrap();
                    worst = worst.max((v - one).abs() / one.abs().max(1e-12));
                    assert!(
                        (v - one).abs() <= 1e-5 * one.abs().max(1e-12),
                        "{id}: sweep {v} vs one at a time {one} (base {base})"
                    );
                    checked += 1;
                    differs += usize::from((one - base).abs() > 1e-9);
                }
            }
        }
        eprintln!("{name}: {checked} heads swept (loss), within {worst:e} relative of one at a time");
        assert_eq!(checked, 3 * 2 * 4);
        assert!(differs * 2 > checked, "masking single heads should change the loss");
    }
}

/// Bad input fails in one line naming what is wrong: an unknown target language (naming the
/// code and the known ones), a config whose width disagrees with the weights (naming the file
/// and the tensor), a forced token outside the vocabulary (naming the key), a T5 config without
/// `relative_attention_num_buckets` (naming the file and the key).
#[test]
fn prenorm_bad_input_is_one_line() {
    // A T5 config without relative_attention_num_buckets.
    let src = common::tiny_hf_dir().join("t5");
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("relative_attention_num_buckets");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let opts = headscope::model::LoadOptions {
        device: tch::Device::Cpu,
        dtype: tch::Kind::Float,
        allow_unknown_config: false,
    };
    let e = Model::load(dir.path(), opts).err().expect("a T5 without buckets loaded").to_string();
    assert!(e.contains("config.json") && e.contains("relative_attention_num_buckets") && !e.contains('\n'), "{e}");

    let m = common::tiny_hf("m2m100", "f32");
    let e = m.target_language("xx_Yyyy").unwrap_err().to_string();
    assert!(e.contains("'xx_Yyyy'") && e.contains("fra_Latn") && !e.contains('\n'), "{e}");
    let e = common::tiny_hf("roberta", "f32").target_language("fra_Latn").unwrap_err().to_string();
    assert!(e.contains("does not translate") && !e.contains('\n'), "{e}");
    let src = common::tiny_hf_dir().join("mbart");
    for (key, value, want) in [
        ("d_model", serde_json::json!(48), "model.shared.weight"),
        ("forced_bos_token_id", serde_json::json!(100000), "forced_bos_token_id"),
        ("encoder_attention_heads", serde_json::json!(5), "encoder_attention_heads"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
        }
        let cfg_path = dir.path().join("config.json");
        let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg[key] = value;
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let opts = headscope::model::LoadOptions {
            device: tch::Device::Cpu,
            dtype: tch::Kind::Float,
            allow_unknown_config: false,
        };
        let e = Model::load(dir.path(), opts).err().unwrap_or_else(|| panic!("{key}: loaded")).to_string();
        assert!(e.contains(want) && !e.contains('\n'), "{key}: {e}");
        assert!(e.contains("config.json") || e.contains("model.safetensors"), "{key}: names no file: {e}");
    }
}

/// Reference translations as targets of a model that forces a target language: the language's
/// token, the reference's pieces (the tokenizer's source-language framing left out), EOS, as
/// transformers frames labels with `tgt_lang` (and as greedy targets come out); the forced token
/// and EOS count as special. A model without a forced language keeps its tokenizer's framing.
#[test]
fn prenorm_reference_targets_start_with_the_target_language() {
    for name in ["m2m100", "mbart"] {
        let mut m = common::tiny_hf(name, "f32");
        let text = "The cat sat on the mat.";
        let plain = m.tokenize(text).unwrap();
        let pieces: Vec<i64> = plain.ids.iter().zip(&plain.special).filter(|(_, s)| !**s).map(|(i, _)| *i).collect();
        assert!(pieces.len() + 2 == plain.ids.len(), "{name}: the source framing adds a language code and EOS");
        for code in [None, Some("deu_Latn"), Some("de_DE")] {
            if let Some(c) = code {
                if m.set_target_language(c).is_err() {
                    continue; // the other family's code
                }
            }
            let forced = m.net.forced_bos.get().unwrap();
            let t = &m.reference_targets(&[text]).unwrap()[0];
            let want: Vec<i64> = std::iter::once(forced).chain(pieces.iter().copied()).chain([m.net.eos_id]).collect();
            assert_eq!(t.ids, want, "{name} ({code:?}): reference targets");
            assert_eq!(t.special.iter().filter(|s| **s).count(), 2, "{name}: special targets");
        }
    }
    let t5 = common::tiny_hf("t5", "f32");
    assert_eq!(
        t5.reference_targets(&["The cat."]).unwrap()[0].ids,
        t5.tokenize("The cat.").unwrap().ids,
        "t5: the tokenizer's own framing"
    );
}

/// `prune_heads` on T5 (heads of every kind, one encoder layer and one decoder self-attention
/// layer emptied) equals masking them: each thinned layer reads its own heads' columns of the
/// stack's relative position bias. Teacher-forced logits of the pruned model equal the gated
/// original's; greedy translations too.
#[test]
fn t5_pruned_equals_masking() {
    let m = common::tiny_hf("t5", "f32");
    let mut closed: Vec<HeadId> = (0..4).map(|head| HeadId { kind: Kind::Enc, layer_idx: 1, head }).collect();
    closed.extend((0..4).map(|head| HeadId { kind: Kind::Dec, layer_idx: 0, head }));
    closed.extend([
        HeadId { kind: Kind::Enc, layer_idx: 0, head: 2 },
        HeadId { kind: Kind::Dec, layer_idx: 1, head: 0 },
        HeadId { kind: Kind::Dec, layer_idx: 1, head: 3 },
        HeadId { kind: Kind::Cross, layer_idx: 1, head: 1 },
    ]);
    let pruned = headscope::prune::physical::prune_heads(&m, &closed, None).unwrap();
    assert_eq!(pruned.present(Kind::Enc, 0), vec![0, 1, 3]);
    assert_eq!(pruned.present(Kind::Dec, 1), vec![1, 2]);
    assert_eq!(pruned.present(Kind::Dec, 0), Vec::<usize>::new(), "dec layer 0 emptied");
    let gates = m.gates_closing(&closed).unwrap();
    let src = m.tokenize("The cat sat on the mat, and the dog sat on the rug beside it.").unwrap().ids;
    let targets: Vec<i64> = vec![5, 9, 17, 4, 33, 8, 61, 12, 7, 1];
    let (want, _) = forward(&m, &src, &targets, &gates);
    let (got, _) = forward(&pruned, &src, &targets, &Gates::none());
    let (open, _) = forward(&m, &src, &targets, &Gates::none());
    let d = max_diff(&got, &want);
    eprintln!("t5: pruned vs masked logits within {d:e}");
    assert!(d < 1e-5, "pruned vs masked logits differ by {d:e}");
    assert!(max_diff(&open, &want) > 1e-3, "closing the heads must change the logits");
    let refs = ["The cat sat on the mat.", "A dog barked twice at the postman."];
    assert_eq!(
        pruned.translate(&refs, &Gates::none(), 200).unwrap(),
        m.translate(&refs, &gates, 200).unwrap(),
        "t5: pruned vs masked translations"
    );
}

/// T5 as llama.cpp's converter writes it (`make_tiny_gguf_2026.py`: `enc.blk.N.*`,
/// `dec.blk.N.*`, the relative position bias in block 0 of each stack, no `output.weight` for
/// the tied output) equals its safetensors twin read with what GGUF cannot carry set as a GGUF
/// reader must assume it (`relative_attention_max_distance` 128, llama.cpp's fixed value):
/// teacher-forced logits, every head's attention of every kind (float64, difference within
/// 1e-10; 1.5e-12 seen) and greedy translations of 20 sentences token for token (float32 and 64).
#[test]
fn t5_gguf_file_equals_its_safetensors_twin() {
    let twin = tempfile::tempdir().unwrap();
    let src = common::tiny_hf_dir().join("t5");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, twin.path().join(f.file_name().unwrap())).unwrap();
    }
    let cfg = twin.path().join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    assert_eq!(v["relative_attention_max_distance"], 16, "the tiny T5 reaches the logarithmic buckets early");
    v["relative_attention_max_distance"] = 128.into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    let gguf_dir = common::tiny_hf_dir().join("t5_gguf");
    let texts = common::short_pud_sentences(20);
    for dtype in ["f64", "f32"] {
        let (a, b) = (common::load(twin.path(), dtype), common::load(&gguf_dir, dtype));
        assert_eq!(b.kinds().iter().map(|k| k.kind).collect::<Vec<_>>(), vec![Kind::Enc, Kind::Dec, Kind::Cross]);
        let (mut worst, mut compared) = (0f64, 0);
        for text in &texts {
            let src = a.tokenize(text).unwrap().ids;
            assert_eq!(b.tokenize(text).unwrap().ids, src);
            let max_len = (2.5 * src.len() as f64) as i64 + 2;
            let got = greedy(&b, &src, max_len);
            assert_eq!(got, greedy(&a, &src, max_len), "greedy translation of {text:?} ({dtype})");
            compared += got.len();
            if dtype == "f64" {
                let (la, aa) = forward(&a, &src, &got, &Gates::none());
                let (lb, ab) = forward(&b, &src, &got, &Gates::none());
                worst = worst.max(max_diff(&la, &lb));
                for kind in [Kind::Enc, Kind::Dec, Kind::Cross] {
                    worst = worst.max(max_diff(&aa[&kind], &ab[&kind]));
                }
            }
        }
        println!(
            "t5_gguf ({dtype}): {compared} greedy tokens identical, largest logit or attention difference {worst:.2e}"
        );
        assert!(worst < 1e-10, "t5_gguf: {worst:e}");
        assert!(compared >= 160);
    }
}
