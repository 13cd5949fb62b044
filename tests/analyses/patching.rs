//! Activation patching (docs/methods.md#activation-patching) against HF transformers in float64
//! with hooks on the checkpoints' own modules (`fixtures/patching_reference.py`,
//! `fixtures/patching_golden.npz`): every site, all positions and per position, denoising and
//! noising, every metric, on tiny GPT-2, Llama and Qwen2 (grouped-query); float32 within 1e-4;
//! and the identities that hold by construction.

use crate::common::{self, fixtures};

use headscope::analysis::patching::{attribute, patch, Direction, PairIds, PatchMetric, PatchSpec, Patched, Site};
use headscope::model::nn::Gates;
use headscope::model::transformer::{Start, Stop};
use headscope::model::Model;
use std::collections::HashMap;
use tch::Tensor;

const MODELS: [&str; 3] = ["gpt2", "llama", "qwen2"];
const SITES: [&str; 8] = ["z", "q", "k", "v", "pattern", "resid_pre", "attn_out", "mlp_out"];
const METRICS: [&str; 4] = ["logit_diff", "prob", "kl", "loss"];

fn pairs(g: &HashMap<String, Tensor>) -> Vec<PairIds> {
    let lens = Vec::<i64>::try_from(&g["pairs/len"]).unwrap();
    let answer = Vec::<i64>::try_from(&g["pairs/answer"]).unwrap();
    let wrong = Vec::<i64>::try_from(&g["pairs/wrong"]).unwrap();
    let row = |k: &str, i: usize| Vec::<i64>::try_from(&g[k].get(i as i64)).unwrap()[..lens[i] as usize].to_vec();
    (0..lens.len())
        .map(|i| PairIds {
            clean: row("pairs/clean", i),
            corrupted: row("pairs/corrupted", i),
            answer: answer[i],
            wrong: Some(wrong[i]),
        })
        .collect()
}

fn run(m: &Model, pairs: &[PairIds], site: Site, each: bool, direction: Direction, metric: PatchMetric) -> Patched {
    patch(m, pairs, PatchSpec::new(site, each, direction, metric), &Gates::none(), &|| false, &mut |_, _| {}).unwrap()
}

fn max_diff(p: &Patched, want: &Tensor) -> f64 {
    let got: Vec<f64> = p.patched.iter().flatten().flatten().copied().collect();
    let want = Vec::<f64>::try_from(&want.flatten(0, -1)).unwrap();
    assert_eq!(got.len(), want.len(), "grid size");
    got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max)
}

#[test]
fn patching_equals_transformers_with_hooks() {
    let g = common::golden("patching_golden.npz");
    let all = pairs(&g);
    let six: Vec<PairIds> = all.iter().filter(|p| p.clean.len() == 6).cloned().collect();
    for name in MODELS {
        for (dtype, tol) in [("f64", 1e-8), ("f32", 1e-4)] {
            let m = common::tiny_hf(name, dtype);
            let mut worst = (0.0f64, String::new());
            for site in SITES {
                for (mode, each, ps) in [("all", false, &all), ("each", true, &six)] {
                    for direction in ["denoise", "noise"] {
                        for metric in METRICS {
                            // f32 runs check one metric per site and mode (the runs are the same).
                            if dtype == "f32" && (metric != "logit_diff" || direction != "denoise") {
                                continue;
                            }
                            let p = run(
                                &m,
                                ps,
                                site.parse().unwrap(),
                                each,
                                direction.parse().unwrap(),
                                metric.parse().unwrap(),
                            );
                            let key = format!("{name}/{site}/{mode}/{direction}/{metric}");
                            let d = max_diff(&p, &g[&key]);
                            if mode == "all" {
                                let c = g[&format!("{name}/clean/{metric}")].double_value(&[]);
                                let k = g[&format!("{name}/corrupted/{metric}")].double_value(&[]);
                                let rel = |a: f64, b: f64| (a - b).abs() / (1.0 + b.abs());
                                assert!(
                                    rel(p.clean, c) < tol && rel(p.corrupted, k) < tol,
                                    "{key}: clean {} vs {c}, corrupted {} vs {k}",
                                    p.clean,
                                    p.corrupted
                                );
                            }
                            if d > worst.0 {
                                worst = (d, key.clone());
                            }
                            assert!(d < tol, "{key} ({dtype}): differs from transformers by {d:e}");
                        }
                    }
                }
            }
            eprintln!("{name} {dtype}: patching within {:.1e} of transformers (worst {})", worst.0, worst.1);
        }
    }
}

#[test]
fn patching_identities() {
    let g = common::golden("patching_golden.npz");
    let all = pairs(&g);
    let m = common::tiny_hf("llama", "f64");
    // The whole residual stream of layer 0 from the clean run is the clean run.
    let p = run(&m, &all, Site::ResidPre, false, Direction::Denoise, PatchMetric::LogitDiff);
    assert!((p.patched[0][0][0] - p.clean).abs() < 1e-10, "{} vs {}", p.patched[0][0][0], p.clean);
    let n = run(&m, &all, Site::ResidPre, false, Direction::Noise, PatchMetric::LogitDiff);
    assert!((n.patched[0][0][0] - n.corrupted).abs() < 1e-10);
    assert!((p.normalized(p.patched[0][0][0]) - 1.0).abs() < 1e-9);
    // `result` is `z` through W^O: the same patch.
    let z = run(&m, &all, Site::Z, false, Direction::Denoise, PatchMetric::Kl);
    let r = run(&m, &all, Site::Result, false, Direction::Denoise, PatchMetric::Kl);
    assert_eq!(z.patched, r.patched);
    // Grouped-query: k and v have one unit per key/value head.
    let k = run(&m, &all, Site::K, false, Direction::Denoise, PatchMetric::Prob);
    assert_eq!((k.patched.len(), k.patched[0].len(), k.patched[0][0].len()), (2, 1, 2));
    // Per position, the patches at positions where clean and corrupted agree before the first
    // difference change nothing in a causal model (positions 0 and 1 of both length-6 pairs).
    let six: Vec<PairIds> = all.iter().filter(|p| p.clean.len() == 6).cloned().collect();
    let e = run(&m, &six, Site::ResidPre, true, Direction::Denoise, PatchMetric::LogitDiff);
    for pos in 0..2 {
        for l in 0..2 {
            assert!((e.patched[l][pos][0] - e.corrupted).abs() < 1e-10, "layer {l} position {pos}");
        }
    }
    // Batches of one pair (batch_tokens below a pair's length) give the batched result.
    for (site, each, ps) in [(Site::Z, false, &all), (Site::Pattern, true, &six), (Site::V, false, &all)] {
        let one = PatchSpec { batch_tokens: 1, ..PatchSpec::new(site, each, Direction::Denoise, PatchMetric::Kl) };
        let a = patch(&m, ps, one, &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
        let b = run(&m, ps, site, each, Direction::Denoise, PatchMetric::Kl);
        let d = a
            .patched
            .iter()
            .flatten()
            .flatten()
            .zip(b.patched.iter().flatten().flatten())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(
            d < 1e-12 && (a.clean - b.clean).abs() < 1e-12,
            "{site}: one pair per batch differs from one batch by {d:e}"
        );
    }
}

#[test]
fn bad_pairs_are_refused_with_the_reason() {
    let m = common::tiny_hf("gpt2", "f32");
    let spec = PatchSpec::new(Site::Z, false, Direction::Denoise, PatchMetric::LogitDiff);
    let go = |ps: &[PairIds], spec: PatchSpec| {
        patch(&m, ps, spec, &Gates::none(), &|| false, &mut |_, _| {}).unwrap_err().to_string()
    };
    let e = go(&[PairIds { clean: vec![1, 2, 3], corrupted: vec![1, 2], answer: 4, wrong: Some(5) }], spec);
    assert!(e.contains("pair 0") && e.contains("3 tokens") && e.contains("corrupted 2"), "{e}");
    let e = go(&[PairIds { clean: vec![1, 2], corrupted: vec![1, 3], answer: 4, wrong: None }], spec);
    assert!(e.contains("logit_diff") && e.contains("wrong answer"), "{e}");
    let two = [
        PairIds { clean: vec![1, 2], corrupted: vec![1, 3], answer: 4, wrong: Some(5) },
        PairIds { clean: vec![1, 2, 3], corrupted: vec![1, 3, 3], answer: 4, wrong: Some(5) },
    ];
    let e = go(&two, PatchSpec { each_position: true, ..spec });
    assert!(e.contains("one token length") && e.contains("2, 3"), "{e}");
    assert!(go(&[], spec).contains("no pairs"));
    // An interrupt stops the run.
    let e = patch(&m, &two, spec, &Gates::none(), &|| true, &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.to_lowercase().contains("interrupt"), "{e}");
}

#[test]
fn attribution_patching_equals_its_definition_by_autograd() {
    let g = common::golden("patching_golden.npz");
    let all = pairs(&g);
    let six: Vec<PairIds> = all.iter().filter(|p| p.clean.len() == 6).cloned().collect();
    for name in MODELS {
        let m = common::tiny_hf(name, "f64");
        let mut worst = (0.0f64, String::new());
        for site in SITES {
            for (mode, each, ps) in [("all", false, &all), ("each", true, &six)] {
                for direction in ["denoise", "noise"] {
                    let spec =
                        PatchSpec::new(site.parse().unwrap(), each, direction.parse().unwrap(), PatchMetric::LogitDiff);
                    let a = attribute(&m, ps, spec, &Gates::none(), &|| false).unwrap();
                    let key = format!("{name}/attr/{site}/{mode}/{direction}/logit_diff");
                    let d = max_diff(&a, &g[&key]);
                    if d > worst.0 {
                        worst = (d, key.clone());
                    }
                    assert!(d < 1e-6, "{key}: differs from autograd by {d:e}");
                }
            }
        }
        eprintln!("{name} f64: attribution patching within {:.1e} of autograd (worst {})", worst.0, worst.1);
    }
}

/// TransformerLens 2.18's own patching functions (`fixtures/patching_tl_reference.py`,
/// float32): `get_act_patch_attn_head_out_all_pos` (over the three pairs), `..._by_pos` and
/// `get_act_patch_resid_pre` (over the two pairs of length 6), denoising, mean logit difference.
#[test]
fn patching_equals_transformer_lens() {
    let g = common::golden("patching_golden.npz");
    let tl: HashMap<String, Tensor> = common::golden("patching_tl_golden.npz");
    let all = pairs(&g);
    let six: Vec<PairIds> = all.iter().filter(|p| p.clean.len() == 6).cloned().collect();
    for name in ["gpt2", "llama"] {
        let m = common::tiny_hf(name, "f32");
        let cases = [
            ("three_pairs/head_out_all_pos", Site::Z, false, &all),
            ("head_out_by_pos", Site::Z, true, &six),
            ("resid_pre", Site::ResidPre, true, &six),
        ];
        for (key, site, each, ps) in cases {
            let p = run(&m, ps, site, each, Direction::Denoise, PatchMetric::LogitDiff);
            // TransformerLens's shapes: [layer, head], [layer, pos, head], [layer, pos].
            let want = tl[&format!("{name}/{key}")].to_kind(tch::Kind::Double);
            let want = if each && site == Site::ResidPre {
                want.unsqueeze(-1)
            } else if !each {
                want.unsqueeze(1)
            } else {
                want
            };
            let d = max_diff(&p, &want);
            eprintln!("{name} {key}: TransformerLens within {d:.1e}");
            assert!(d < 1e-4, "{name} {key}: differs from TransformerLens by {d:e}");
        }
        let c = tl[&format!("{name}/three_pairs/clean")].double_value(&[]);
        let p = run(&m, &all, Site::Z, false, Direction::Denoise, PatchMetric::LogitDiff);
        assert!((p.clean - c).abs() < 1e-4, "{name}: clean {} vs TransformerLens {c}", p.clean);
    }
}

/// Mean ablation (docs/methods.md#mean-ablation) against transformers in float64
/// (`fixtures/mean_ablation_reference.py`): each head's mean context over the reference
/// sentences, and the next-token loss with two heads set to their means (and to zero, which is
/// the old masking); the sweep's mean-ablated entries equal ablating each head alone.
#[test]
fn mean_ablation_equals_transformers() {
    use headscope::analysis::ablation::{evaluate, mean_fill, prepare, sweep, Metric};
    use headscope::data::{Dataset, Item};
    use headscope::model::{HeadId, Kind};
    let g: HashMap<String, Tensor> =
        Tensor::read_npz(fixtures().join("mean_ablation_golden.npz")).unwrap().into_iter().collect();
    let texts = |v: &[&str]| {
        Dataset::new("t", v.iter().map(|t| Item { text: t.to_string(), target: None, tree: None }).collect())
    };
    let reference =
        texts(&["the cat sat on the mat", "a dog ran in the park today", "we like green tea", "it is raining"]);
    let eval = texts(&["the dog sat in the park", "a cat likes tea", "it is green"]);
    let heads = [HeadId { kind: Kind::Dec, layer_idx: 0, head: 1 }, HeadId { kind: Kind::Dec, layer_idx: 1, head: 2 }];
    for name in ["gpt2", "llama"] {
        let m = common::tiny_hf(name, "f64");
        for (d, key) in [(&reference, "ref_ids"), (&eval, "eval_ids")] {
            for (i, item) in d.items.iter().enumerate() {
                let want = Vec::<i64>::try_from(&g[&format!("{name}/{key}/{i}")]).unwrap();
                assert_eq!(m.tokenize(&item.text).unwrap().ids, want, "{name}: tokenization of {:?}", item.text);
            }
        }
        let fills = mean_fill(&m, &reference, &[Kind::Dec], 1024, &Gates::none(), &|| false).unwrap();
        let d = (fills.dec.as_ref().unwrap() - &g[&format!("{name}/mean")]).abs().max().double_value(&[]);
        assert!(d < 1e-12, "{name}: means differ from transformers by {d:e}");
        let p = prepare(&m, &eval, Metric::Loss, 1024, Gates::none()).unwrap();
        let stop = || false;
        let full = evaluate(&m, &p, &Gates::none(), &stop).unwrap();
        let zero = evaluate(&m, &p, &m.gates_closing(&heads).unwrap(), &stop).unwrap();
        let mut mean_gates = m.gates_closing(&heads).unwrap();
        mean_gates.fill = fills.share();
        let mean = evaluate(&m, &p, &mean_gates, &stop).unwrap();
        for (what, got) in [("full", full), ("zero", zero), ("mean", mean)] {
            let want = g[&format!("{name}/loss_{what}")].double_value(&[]);
            assert!((got - want).abs() < 1e-7 * want.abs(), "{name} {what}: loss {got} vs transformers {want}");
        }
        eprintln!(
            "{name}: mean-ablated loss {mean:.9} (transformers {:.9}), zero {zero:.9}",
            g[&format!("{name}/loss_mean")].double_value(&[])
        );
        // The sweep under mean ablation: every entry equals that head alone mean-ablated.
        let mut base = Gates::none();
        base.fill = fills.share();
        let pm = prepare(&m, &eval, Metric::Loss, 1024, base).unwrap();
        let grid = sweep(&m, &pm, &[Kind::Dec], &stop, &mut |_, _| {}).unwrap();
        for (l, row) in grid[0].1.iter().enumerate() {
            for (h, &v) in row.iter().enumerate() {
                let mut one = m.gates_closing(&[HeadId { kind: Kind::Dec, layer_idx: l, head: h }]).unwrap();
                one.fill = fills.share();
                let alone = evaluate(&m, &pm, &one, &stop).unwrap();
                assert!((v - alone).abs() < 1e-9 * alone.abs(), "{name} dec.{l}.{h}: sweep {v} vs alone {alone}");
            }
        }
    }
}

/// The translation pairs of `patching_seq2seq_golden.npz`: all three, and the two of length 5
/// (per position).
fn seq2seq_pairs(
    g: &HashMap<String, Tensor>,
) -> (Vec<headscope::analysis::patching::SourcePair>, Vec<headscope::analysis::patching::SourcePair>) {
    use headscope::analysis::patching::SourcePair;
    let lens = |k: &str| Vec::<i64>::try_from(&g[k]).unwrap();
    let (sl, tl) = (lens("pairs/src_len"), lens("pairs/tgt_len"));
    let row = |k: &str, i: usize, n: i64| Vec::<i64>::try_from(&g[k].get(i as i64)).unwrap()[..n as usize].to_vec();
    let all: Vec<SourcePair> = (0..sl.len())
        .map(|i| SourcePair {
            clean: row("pairs/clean", i, sl[i]),
            corrupted: row("pairs/corrupted", i, sl[i]),
            target: row("pairs/target", i, tl[i]),
        })
        .collect();
    let five: Vec<SourcePair> = all.iter().filter(|p| p.clean.len() == 5).cloned().collect();
    (all, five)
}

/// Every translation case of the seq2seq goldens: kind x site (the cross-attention has no
/// residual stream of its own) x position mode x direction x metric. `check(spec, kind, pairs,
/// key)` returns the case's difference; the cases at or above `tol` are listed in the panic, and
/// the worst case and the number of cases are returned.
fn seq2seq_cases(
    name: &str,
    all: &[headscope::analysis::patching::SourcePair],
    five: &[headscope::analysis::patching::SourcePair],
    tol: f64,
    what: &str,
    mut check: impl FnMut(PatchSpec, headscope::model::Kind, &[headscope::analysis::patching::SourcePair], &str) -> f64,
) -> ((f64, String), usize) {
    use headscope::model::Kind;
    let mut worst = (0.0f64, String::new());
    let mut bad = Vec::new();
    let mut n = 0;
    for kind in [Kind::Enc, Kind::Dec, Kind::Cross] {
        let sites: &[&str] = if kind == Kind::Cross { &SITES[..5] } else { &SITES };
        for site in sites {
            for (mode, each, ps) in [("all", false, all), ("each", true, five)] {
                for direction in ["denoise", "noise"] {
                    for metric in ["loss", "kl"] {
                        let spec = PatchSpec::new(
                            site.parse().unwrap(),
                            each,
                            direction.parse().unwrap(),
                            metric.parse().unwrap(),
                        );
                        let key = format!("{name}/{kind}/{site}/{mode}/{direction}/{metric}");
                        let d = check(spec, kind, ps, &key);
                        n += 1;
                        if d > worst.0 {
                            worst = (d, key.clone());
                        }
                        if d >= tol {
                            bad.push(format!("{key}: {d:.1e}"));
                        }
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{what} by {tol:e} or more:\n{}", bad.join("\n"));
    (worst, n)
}

/// Translation models (`fixtures/patching_seq2seq_reference.py`): MarianMT and BART, heads of
/// `enc`, `dec` and `cross` and the encoder's and decoder's residual stream, teacher-forced on
/// each pair's target, loss and KL, against transformers in float64 with hooks.
#[test]
fn translation_patching_equals_transformers_with_hooks() {
    use headscope::analysis::patching::patch_translation;
    use headscope::model::Kind;
    let g: HashMap<String, Tensor> =
        Tensor::read_npz(fixtures().join("patching_seq2seq_golden.npz")).unwrap().into_iter().collect();
    let (all, five) = seq2seq_pairs(&g);
    for name in ["marian", "bart"] {
        let m = common::tiny_hf(name, "f64");
        let (worst, _) = seq2seq_cases(name, &all, &five, 1e-8, "differ from transformers", |spec, kind, ps, key| {
            let p = patch_translation(&m, ps, spec, kind, &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
            if !spec.each_position {
                let c = g[&format!("{name}/clean/{}", spec.metric)].double_value(&[]);
                assert!((p.clean - c).abs() < 1e-8, "{key}: clean {} vs {c}", p.clean);
            }
            max_diff(&p, &g[key])
        });
        eprintln!("{name} f64: translation patching within {:.1e} of transformers (worst {})", worst.0, worst.1);
    }
    // Bad input: a metric that reads an answer token, the residual stream of "cross".
    let m = common::tiny_hf("marian", "f32");
    let spec = PatchSpec::new(Site::Z, false, Direction::Denoise, PatchMetric::LogitDiff);
    let e = patch_translation(&m, &all, spec, Kind::Enc, &Gates::none(), &|| false, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"loss\" or \"kl\""), "{e}");
    let e = patch_translation(
        &m,
        &all,
        PatchSpec { site: Site::ResidPre, metric: PatchMetric::Loss, ..spec },
        Kind::Cross,
        &Gates::none(),
        &|| false,
        &mut |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not to \"cross\""), "{e}");
}

/// Attribution patching of translation models (`fixtures/attribution_seq2seq_reference.py`):
/// MarianMT and BART, every site of `enc`, `dec` and `cross`, all positions and per position,
/// both directions, loss and KL, equal to `(a_source - a_base) . grad` by transformers'
/// autograd in float64 within 1e-6 relative; and the agreement with exact patching is reported.
#[test]
fn translation_attribution_equals_its_definition_by_autograd() {
    use headscope::analysis::patching::{attribute_translation, patch_translation};
    use headscope::model::Kind;
    let g: HashMap<String, Tensor> =
        Tensor::read_npz(fixtures().join("patching_seq2seq_golden.npz")).unwrap().into_iter().collect();
    let a: HashMap<String, Tensor> =
        Tensor::read_npz(fixtures().join("attribution_seq2seq_golden.npz")).unwrap().into_iter().collect();
    let (all, five) = seq2seq_pairs(&g);
    for name in ["marian", "bart"] {
        let m = common::tiny_hf(name, "f64");
        let (worst, n) =
            seq2seq_cases(name, &all, &five, 1e-6, "attribution differs from autograd", |spec, kind, ps, key| {
                let p = attribute_translation(&m, ps, spec, kind, &Gates::none(), &|| false).unwrap();
                let want = &a[key];
                max_diff(&p, want) / (1.0 + want.abs().max().double_value(&[]))
            });
        assert!(n >= 100, "{n} cases");
        eprintln!("{name} f64: translation attribution patching within {:.1e} (relative) of autograd over {n} cases (worst {})", worst.0, worst.1);
        // How the estimate agrees with exact patching (reported, not asserted: a first-order
        // estimate of a tiny random model).
        let spec = PatchSpec::new(Site::Z, false, Direction::Denoise, PatchMetric::Loss);
        let (est, exact) = (
            attribute_translation(&m, &all, spec, Kind::Cross, &Gates::none(), &|| false).unwrap(),
            patch_translation(&m, &all, spec, Kind::Cross, &Gates::none(), &|| false, &mut |_, _| {}).unwrap(),
        );
        let flat = |p: &Patched| p.patched.iter().flatten().flatten().map(|v| v - p.corrupted).collect::<Vec<f64>>();
        eprintln!(
            "{name}: cross z denoising loss, Spearman(attribution, exact) = {:.3}",
            headscope::analysis::importance::spearman(&flat(&est), &flat(&exact))
        );
    }
}

/// A session interrupted in the middle of a patching run answers with an interrupt, keeps its
/// variables, and patches again afterwards.
#[test]
fn an_interrupt_mid_patching_leaves_the_session_intact() {
    use headscope::engine::{Session, SessionOptions};
    let mut s = Session::new(SessionOptions::default());
    let dir = fixtures().join("tiny_hf/gpt2");
    s.eval(
        "t",
        &format!(
            "let m = load_model({:?}); let p = pairs([[\"a b c d\", \"a b e d\", \" c\", \" e\"]]); let kept = 42;",
            dir.display().to_string()
        ),
    )
    .unwrap();
    let stop = s.interrupt_handle();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        stop.trigger();
    });
    // Patching in a loop long enough to be under way when the interrupt comes.
    let e = s.eval("t", "loop { m.patch(p, #{positions: \"each\"}); }").unwrap_err();
    t.join().unwrap();
    assert_eq!(e.kind, headscope::engine::error::ErrorKind::Interrupted, "{e}");
    s.interrupt_handle().reset();
    let out = s.eval("t", "kept + m.patch(p).pairs").unwrap().unwrap();
    assert_eq!(out.text.trim(), "43");
}

/// Path patching (`fixtures/path_patching_reference.py`, `path_patching_golden.npz`): every
/// sender head's metric with the receiver a head's query, key or value input (the last layer's
/// heads 1, 2, 3) or the logits, denoising and noising, equal to transformers in float64 with
/// hooks within 1e-8 (float32: 1e-4); the layers at and above the receiver send nothing (NaN).
#[test]
fn path_patching_equals_transformers_with_hooks() {
    use headscope::analysis::patching::{path_patch, PathInput, Receiver};
    let g = common::golden("patching_golden.npz");
    let want = common::golden("path_patching_golden.npz");
    let all = pairs(&g);
    let receivers = [
        ("1.1.q", Receiver::Head { layer: 1, head: 1, input: PathInput::Q }),
        ("1.2.k", Receiver::Head { layer: 1, head: 2, input: PathInput::K }),
        ("1.3.v", Receiver::Head { layer: 1, head: 3, input: PathInput::V }),
        ("logits", Receiver::Logits),
    ];
    for name in MODELS {
        for (dtype, tol) in [("f64", 1e-8), ("f32", 1e-4)] {
            let m = common::tiny_hf(name, dtype);
            let mut worst = 0.0f64;
            for (key, receiver) in receivers {
                for direction in ["denoise", "noise"] {
                    let spec = PatchSpec::new(Site::Z, false, direction.parse().unwrap(), PatchMetric::LogitDiff);
                    let p = path_patch(&m, &all, spec, receiver, &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
                    let got: Vec<f64> = p.patched.iter().flatten().flatten().copied().collect();
                    let w = Vec::<f64>::try_from(
                        &want[&format!("{name}/path/{key}/{direction}/logit_diff")].flatten(0, -1),
                    )
                    .unwrap();
                    assert_eq!(got.len(), w.len(), "{name} {key}: grid size");
                    for (i, (a, b)) in got.iter().zip(&w).enumerate() {
                        assert_eq!(
                            a.is_nan(),
                            b.is_nan(),
                            "{name} {key} {direction} entry {i}: {a} vs {b} (NaN marks layers that send nothing)"
                        );
                        if !b.is_nan() {
                            worst = worst.max((a - b).abs());
                            assert!(
                                (a - b).abs() < tol,
                                "{name} {key} {direction} ({dtype}) entry {i}: {a} vs transformers {b}"
                            );
                        }
                    }
                }
            }
            eprintln!("{name} {dtype}: path patching within {worst:.1e} of transformers");
        }
    }
    // A receiver in the first layer has no senders; path patching sends whole outputs only.
    let m = common::tiny_hf("gpt2", "f32");
    let spec = PatchSpec::new(Site::Z, false, Direction::Denoise, PatchMetric::LogitDiff);
    let e = path_patch(
        &m,
        &all,
        spec,
        Receiver::Head { layer: 0, head: 1, input: PathInput::Q },
        &Gates::none(),
        &|| false,
        &mut |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("first layer"), "{e}");
    let e = path_patch(
        &m,
        &all,
        PatchSpec { site: Site::Q, ..spec },
        Receiver::Logits,
        &Gates::none(),
        &|| false,
        &mut |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("site \"z\""), "{e}");
}

/// Exact patching resumes a causal stack at the first position a patch changes, over the base
/// run's keys and values of the positions before (`Transformer::resume_pass`). In every
/// decoder-only family (rotary variants, sliding windows of 5 over 8 tokens, Gemma's alternating
/// windows and soft-capping, parallel residuals, post-norms, q/k norms), float64: patching a
/// layer's whole residual stream from the clean run is the clean run, and each head's `z`
/// patch, at all positions and at each position alone (per position: the passes that pack
/// several start positions, their attention apart and the rest flattened), equals the whole
/// stack run from that layer over every position (`Transformer::run` from `Start::Z`).
#[test]
fn resumed_patches_equal_whole_runs_in_every_family() {
    use headscope::model::hooks::Point;
    let pair = PairIds {
        clean: vec![5, 17, 42, 99, 7, 250, 3, 9],
        corrupted: vec![5, 17, 42, 140, 7, 250, 3, 19],
        answer: 33,
        wrong: Some(44),
    };
    for name in [
        "llama",
        "llama3",
        "llama_yarn",
        "gpt2",
        "qwen2",
        "qwen3",
        "mistral",
        "gemma",
        "gemma2",
        "gemma3",
        "pythia",
        "neox_sequential",
        "phi3",
        "phi3_partial",
        "olmo2",
    ] {
        let m = common::tiny_hf(name, "f64");
        let ps = [pair.clone()];
        let r = run(&m, &ps, Site::ResidPre, false, Direction::Denoise, PatchMetric::LogitDiff);
        for (l, layer) in r.patched.iter().enumerate() {
            assert!(
                (layer[0][0] - r.clean).abs() < 1e-9 * (1.0 + r.clean.abs()),
                "{name}: resid_pre of layer {l} from the clean run gives {} but the clean run {}",
                layer[0][0],
                r.clean
            );
        }
        // Each head's z patch against the whole stack from its layer (every position).
        let z = run(&m, &ps, Site::Z, false, Direction::Denoise, PatchMetric::LogitDiff);
        let z_each = run(&m, &ps, Site::Z, true, Direction::Denoise, PatchMetric::LogitDiff);
        let ids = |v: &[i64]| Tensor::from_slice(v).view([1, v.len() as i64]);
        let mask = Tensor::ones([1, 8], (tch::Kind::Double, tch::Device::Cpu));
        let _g = tch::no_grad_guard();
        let run_rec = |v: &[i64]| {
            common::recorded(&[Point::ResidPre, Point::Z], |r| {
                m.net.encode(&ids(v), &mask, &Gates::none(), Some(r)).unwrap()
            })
        };
        let (clean, _) = run_rec(&pair.clean);
        let (corrupt, _) = run_rec(&pair.corrupted);
        let (zc, zk, xk) = (
            common::at_point(&clean, Point::Z),
            common::at_point(&corrupt, Point::Z),
            common::at_point(&corrupt, Point::ResidPre),
        );
        let bias = m.net.self_bias(&mask, tch::Kind::Double);
        let mut worst = 0.0f64;
        let whole = |l: usize, patched: &Tensor| {
            let states = m
                .net
                .run(
                    Start::Z { layer: l, x: &xk[l], z: patched, bias: Some(&bias) },
                    Stop::FinalNorm,
                    &Gates::none(),
                    &mut None,
                )
                .unwrap();
            let logits = m.net.logits(&states.select(1, 7)).unwrap().to_kind(tch::Kind::Double);
            logits.double_value(&[0, 33]) - logits.double_value(&[0, 44])
        };
        for l in 0..zk.len() {
            let heads = zk[l].size()[1];
            for h in 0..heads {
                let patched = zk[l].copy();
                patched.narrow(1, h, 1).copy_(&zc[l].narrow(1, h, 1));
                let want = whole(l, &patched);
                let got = z.patched[l][0][h as usize];
                worst = worst.max((got - want).abs());
                assert!(
                    (got - want).abs() < 1e-9 * (1.0 + want.abs()),
                    "{name}: z of {l}.{h}: resumed {got} vs the whole stack {want}"
                );
                for p in 0..8 {
                    let patched = zk[l].copy();
                    patched.narrow(1, h, 1).narrow(2, p, 1).copy_(&zc[l].narrow(1, h, 1).narrow(2, p, 1));
                    let want = whole(l, &patched);
                    let got = z_each.patched[l][p as usize][h as usize];
                    worst = worst.max((got - want).abs());
                    assert!(
                        (got - want).abs() < 1e-9 * (1.0 + want.abs()),
                        "{name}: z of {l}.{h} at position {p}: resumed {got} vs the whole stack {want}"
                    );
                }
            }
        }
        eprintln!("{name}: resumed z patches within {worst:.1e} of whole-stack runs");
    }
}

/// Resample ablation against transformers in float64 with a pre-hook on W^O
/// (`fixtures/resample_ablation_reference.py`): each sentence's draw (splitmix64 of the seed
/// and a hash of its ids, among the reference sentences at least as long; a longer sentence
/// than any falls back to all others, its positions past the drawn one's end taking the head's
/// mean), the loss with two heads closed, and every head of the sweep, for two seeds; and
/// per-position mean ablation (each position's mean over the reference sentences that have it),
/// its loss and sweep.
#[test]
fn resample_ablation_equals_transformers() {
    use headscope::analysis::ablation::{evaluate, position_means, prepare, set_resample, sweep, Metric};
    use headscope::data::{Dataset, Item};
    use headscope::model::{HeadId, Kind};
    let g: HashMap<String, Tensor> =
        Tensor::read_npz(fixtures().join("resample_ablation_golden.npz")).unwrap().into_iter().collect();
    let texts = |v: &[&str]| {
        Dataset::new("t", v.iter().map(|t| Item { text: t.to_string(), target: None, tree: None }).collect())
    };
    let reference =
        texts(&["the cat sat on the mat", "a dog ran in the park today", "we like green tea", "it is raining"]);
    let eval = texts(&[
        "the dog sat in the park",
        "a cat likes tea",
        "it is green",
        "the cat and the dog sat on the mat in the park all day",
    ]);
    let heads = [HeadId { kind: Kind::Dec, layer_idx: 0, head: 1 }, HeadId { kind: Kind::Dec, layer_idx: 1, head: 2 }];
    let stop = || false;
    let check = |name: &str, what: &str, m: &headscope::model::Model, p: &headscope::analysis::ablation::Prepared| {
        let got = evaluate(m, p, &m.gates_closing(&heads).unwrap(), &stop).unwrap();
        let want = g[&format!("{name}/{what}/loss")].double_value(&[]);
        assert!((got - want).abs() < 1e-9 * want, "{name} {what}: ablated loss {got} vs transformers {want}");
        let grid = sweep(m, p, &[Kind::Dec], &stop, &mut |_, _| {}).unwrap();
        let w = &g[&format!("{name}/{what}/sweep")];
        let mut worst = 0.0f64;
        for (l, row) in grid[0].1.iter().enumerate() {
            for (h, &v) in row.iter().enumerate() {
                let want = w.double_value(&[l as i64, h as i64]);
                worst = worst.max((v - want).abs());
                assert!((v - want).abs() < 1e-9 * want, "{name} {what} dec.{l}.{h}: sweep {v} vs transformers {want}");
            }
        }
        eprintln!("{name} {what}: ablated loss {got:.12} (transformers {want:.12}); sweep within {worst:.1e}");
    };
    for name in ["gpt2", "llama"] {
        let m = common::tiny_hf(name, "f64");
        for seed in [0u64, 5] {
            let mut p = prepare(&m, &eval, Metric::Loss, 1024, Gates::none()).unwrap();
            let draws: Vec<i64> =
                set_resample(&m, &mut p, &eval, &reference, seed).unwrap().into_iter().map(|d| d as i64).collect();
            assert_eq!(
                draws,
                Vec::<i64>::try_from(&g[&format!("{name}/draws/{seed}")]).unwrap(),
                "{name} seed {seed}: draws"
            );
            let got = evaluate(&m, &p, &m.gates_closing(&heads).unwrap(), &stop).unwrap();
            let want = g[&format!("{name}/loss/{seed}")].double_value(&[]);
            assert!(
                (got - want).abs() < 1e-9 * want,
                "{name} seed {seed}: resample-ablated loss {got} vs transformers {want}"
            );
            let grid = sweep(&m, &p, &[Kind::Dec], &stop, &mut |_, _| {}).unwrap();
            let w = &g[&format!("{name}/sweep/{seed}")];
            for (l, row) in grid[0].1.iter().enumerate() {
                for (h, &v) in row.iter().enumerate() {
                    let want = w.double_value(&[l as i64, h as i64]);
                    assert!(
                        (v - want).abs() < 1e-9 * want,
                        "{name} seed {seed} dec.{l}.{h}: sweep {v} vs transformers {want}"
                    );
                }
            }
            eprintln!("{name} seed {seed}: resample-ablated loss {got:.12} (transformers {want:.12})");
        }
        let mut p = prepare(&m, &eval, Metric::Loss, 1024, Gates::none()).unwrap();
        p.source = Some(std::rc::Rc::new(position_means(&m, &reference, 1024, &stop).unwrap()));
        check(name, "perpos", &m, &p);
    }
}

/// Resample and per-position mean ablation wherever ablation is: a `with_mask` view measured by
/// `ablate` equals `ablate` closing the same heads with the same options (a sentence draws by its
/// own ids, so the view and the call draw alike), `ablation_sweep` runs them, zero ablation
/// through the mode equals the plain mask (difference 0), pruning trains and evaluates under a
/// view's mode, and what cannot run on such a view (generation, patching's resumed rows) says
/// so in one line.
#[test]
fn resample_and_per_position_means_hold_in_views_sweeps_and_pruning() {
    use headscope::engine::{Session, SessionOptions};
    let mut s = Session::new(SessionOptions::default());
    let dir = common::root().join("tests/fixtures/tiny_hf/llama");
    s.eval("setup", &format!("let m = load_model({:?}); let r = corpus(asset(\"pud_en.txt\")).take(8); let e = corpus(asset(\"pud_en.txt\")).skip(8).take(5); let h = [\"dec.0.1\", \"dec.1.2\"];", dir.display().to_string())).unwrap();
    let num = |s: &mut Session, code: &str| -> f64 {
        s.eval("t", code)
            .unwrap_or_else(|e| panic!("{code}: {e}"))
            .unwrap()
            .text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{code}: {e}"))
    };
    for opts in [
        "#{ablation: \"resample\", reference: r, seed: 5}",
        "#{ablation: \"resample\", reference: r, seed: 0}",
        "#{ablation: \"mean\", reference: r, per_position: true}",
        "#{ablation: \"mean\", reference: r}",
    ] {
        let view = num(&mut s, &format!("m.with_mask(h, {opts}).ablate(e, []).value"));
        let call = num(&mut s, &format!("m.ablate(e, h, {opts}).value"));
        let zero = num(&mut s, "m.ablate(e, h).value");
        eprintln!("{opts}: view {view:.12}, ablate {call:.12}, zero {zero:.12}");
        assert_eq!(view, call, "{opts}: the view and the call");
        assert!((view - zero).abs() > 1e-6, "{opts}: differs from zero ablation");
        // The sweep's entry for dec.1.2 is that head closed alone with the same options.
        let sweep_opts = opts.replacen("#{", "#{kinds: [\"dec\"], ", 1);
        let entry = num(&mut s, &format!("m.ablation_sweep(e, {sweep_opts})[\"dec\"][1][2]"));
        let alone = num(&mut s, &format!("m.ablate(e, [\"dec.1.2\"], {opts}).value"));
        assert!((entry - alone).abs() < 1e-5 * alone.abs(), "{opts}: sweep entry {entry} vs ablate {alone}");
    }
    let per_pos = num(&mut s, "m.ablate(e, h, #{ablation: \"mean\", reference: r, per_position: true}).value");
    let mean = num(&mut s, "m.ablate(e, h, #{ablation: \"mean\", reference: r}).value");
    assert!((per_pos - mean).abs() > 1e-6, "per-position means differ from the means");
    // Zero ablation through the mode is the mask, exactly.
    assert_eq!(
        num(&mut s, "m.with_mask(h, #{ablation: \"zero\"}).ablate(e, []).value"),
        num(&mut s, "m.with_mask(h).ablate(e, []).value")
    );
    assert_eq!(num(&mut s, "m.ablate(e, h, #{ablation: \"zero\"}).value"), num(&mut s, "m.ablate(e, h).value"));
    // Pruning on a view: its closed heads (and the gates it closes) take the view's fill, in
    // training and in the evaluation; a zero view prunes as the plain mask does.
    let prune = |s: &mut Session, v: &str| {
        num(s, &format!("{v}.prune(r, #{{steps: 2, eval_data: e, eval_every: 1, seed: 3}}).final_eval"))
    };
    let plain = prune(&mut s, "m.with_mask(h)");
    assert_eq!(prune(&mut s, "m.with_mask(h, #{ablation: \"zero\"})"), plain);
    let resampled = prune(&mut s, "m.with_mask(h, #{ablation: \"resample\", reference: r, seed: 5})");
    let positioned = prune(&mut s, "m.with_mask(h, #{ablation: \"mean\", reference: r, per_position: true})");
    eprintln!("prune eval: zero {plain:.9}, resample {resampled:.9}, per-position mean {positioned:.9}");
    assert!(
        (resampled - plain).abs() > 1e-6 && (positioned - plain).abs() > 1e-6,
        "pruning's evaluation sees the view's ablation"
    );
    // A checkpoint resumes only under the ablation it was made with.
    let ck = tempfile::tempdir().unwrap();
    let ck = ck.path().join("run").display().to_string();
    s.eval("ck", &format!("let ck = {ck:?}; m.with_mask(h, #{{ablation: \"resample\", reference: r, seed: 5}}).prune(r, #{{steps: 2, checkpoint: ck}});")).unwrap();
    let e = s
        .eval("resume", "m.with_mask(h).prune(r, #{steps: 3, checkpoint: ck, resume: true})")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("was made with ablation = \"resample (seed 5) of "), "{e}");
    let again = num(&mut s, "m.with_mask(h, #{ablation: \"resample\", reference: r, seed: 5}).prune(r, #{steps: 3, checkpoint: ck, resume: true}).curve.len()");
    assert!(again >= 3.0, "resumed under the same ablation");
    let bad: &[(&str, &str)] = &[
        ("m.with_mask(h, #{ablation: \"resample\"})", "with_mask: ablation \"resample\" needs a reference dataset"),
        (
            "m.with_mask(h, #{ablation: \"zero\", per_position: true})",
            "with_mask: per_position takes means per position; it needs ablation: \"mean\"",
        ),
        (
            "m.ablate(e, h, #{ablation: \"resample\", per_position: true})",
            "ablate: per_position takes means per position",
        ),
        (
            "m.with_mask(h, #{ablation: \"resample\", reference: r}).generate(\"the cat\", 3)",
            "generation is not offered under resample or per-position mean ablation",
        ),
        (
            "m.with_mask(h, #{ablation: \"mean\", reference: r, per_position: true}).generate(\"the cat\", 3)",
            "generation is not offered under resample or per-position mean ablation",
        ),
        (
            "load_model(\"enpt\").with_mask([\"enc.0.1\"], #{ablation: \"resample\", reference: r})",
            "resample ablation of translation models is not offered yet",
        ),
    ];
    for (code, want) in bad {
        let e = s.eval("case", code).err().map(|e| e.to_string()).unwrap_or_else(|| panic!("{code}: no error"));
        let first = e.lines().next().unwrap_or("");
        assert!(first.contains(want), "{code}: the first line {first:?} should say {want:?}\n{e}");
    }
    assert_eq!(num(&mut s, "h.len()"), 2.0, "the session keeps its variables");
}
