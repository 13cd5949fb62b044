//! The head taxonomy (docs/methods.md#head-taxonomy). (1) Planted heads: a tiny decoder-only
//! model built by hand whose heads are, by construction, a sink (dec.0.0), a previous-token head
//! (dec.0.1), a duplicate-token head (dec.0.2), an induction head that also copies the needle
//! (dec.1.0) and a copy head that is no induction head (dec.1.1), the others uniform: `head_types` labels exactly those heads with exactly those
//! types. (2) The previous-token, duplicate-token and induction scores on the repeated-token
//! probe equal TransformerLens's `detect_head` (tests/fixtures/taxonomy_reference.py,
//! transformer-lens 2.18 on the tiny GPT-2, loaded offline) within 1e-4.

use crate::common;
use crate::common::{root, zeros};

use headscope::analysis::taxonomy::{head_type_scores, labels, token_pool, HeadType, ProbeOptions, Probes};
use headscope::model::nn::{Activation, Attention, Ffn, Gates, Linear, NormPosition};
use headscope::model::transformer::{Embeddings, Positions, StackLayer};
use headscope::model::{Family, Kind, Model};
use tch::{Device, Kind as DType, Tensor};

const V: i64 = 40; // [PAD] [CLS] [SEP] [UNK] + 36 words
const P: i64 = 32;
const D: i64 = 2 * V + P; // token one-hot | position one-hot | previous token (written by dec.0.1)
const H: i64 = 4;
const DH: i64 = D;
const S: f64 = 30.0;
const COPY: f64 = 0.06;

/// q, k, v, o of one layer from (head, head dim, input dim, value) entries.
fn attention(
    q: &[(i64, i64, i64, f64)],
    k: &[(i64, i64, i64, f64)],
    v: &[(i64, i64, i64, f64)],
    o: &[(i64, i64, i64, f64)],
    q_bias: &[(i64, i64, f64)],
) -> Attention {
    let fill = |entries: &[(i64, i64, i64, f64)], out_major: bool| {
        let w = zeros(&[H * DH, D]);
        for &(h, d, i, x) in entries {
            if out_major {
                let _ = w.get(h * DH + d).get(i).fill_(x);
            }
        }
        w
    };
    // W^O maps head dims back to the residual: [D, H * DH]; entries (head, head dim, output dim).
    let wo = zeros(&[D, H * DH]);
    for &(h, d, out, x) in o {
        let _ = wo.get(out).get(h * DH + d).fill_(x);
    }
    let bq = zeros(&[H * DH]);
    for &(h, d, x) in q_bias {
        let _ = bq.get(h * DH + d).fill_(x);
    }
    let lin = |w: Tensor, b: Tensor| Linear { w, b: Some(b) };
    Attention::new(
        lin(fill(q, true), bq),
        lin(fill(k, true), zeros(&[H * DH])),
        lin(fill(v, true), zeros(&[H * DH])),
        lin(wo, zeros(&[D])),
        H,
        H,
        DH,
    )
}

fn layer(attn: Attention) -> StackLayer {
    StackLayer::new(
        attn,
        common::rms_norm(D),
        Ffn {
            up: Linear { w: zeros(&[8, D]), b: None },
            down: Linear { w: zeros(&[D, 8]), b: None },
            act: Activation::Gelu,
            gate: None,
        },
        common::rms_norm(D),
        NormPosition::Pre,
    )
}

fn planted() -> (Model, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let words: Vec<String> = (0..V - 4).map(|i| format!("w{i}")).collect();
    let refs: Vec<&str> = words.iter().map(|s| s.as_str()).collect();
    let (tokv, posv, prevv) = (0, V, V + P);
    // Layer 0. h0 sink: a constant query meets a key only position 0 has. h1 previous token:
    // the query of position i is the key of position i - 1; it copies the token into the
    // previous-token slot. h2 duplicate: same token +S, same position -S. h3 uniform.
    let (mut q0, mut k0, mut v0, mut o0) = (vec![], vec![], vec![], vec![]);
    k0.push((0, 0, posv, S));
    for i in 1..P {
        q0.push((1, i - 1, posv + i, S));
    }
    for j in 0..P {
        k0.push((1, j, posv + j, 1.0));
        q0.push((2, V + j, posv + j, -S));
        k0.push((2, V + j, posv + j, 1.0));
    }
    for t in 0..V {
        v0.push((1, t, tokv + t, 1.0));
        o0.push((1, t, prevv + t, 1.0));
        q0.push((2, t, tokv + t, S));
        k0.push((2, t, tokv + t, 1.0));
    }
    // Layer 1. h0 induction: the current token meets the previous-token slot. h1 copy: the
    // same match, weak (COPY instead of S): its top key is the token to copy, but most of its
    // weight stays spread, so it is no induction head by the detector's score.
    let (mut q1, mut k1) = (vec![], vec![]);
    for t in 0..V {
        q1.push((0, t, tokv + t, S));
        k1.push((0, t, prevv + t, 1.0));
        q1.push((1, t, tokv + t, COPY));
        k1.push((1, t, prevv + t, 1.0));
    }
    let l0 = attention(&q0, &k0, &v0, &o0, &[(0, 0, S)]);
    let l1 = attention(&q1, &k1, &[], &[], &[]);
    let tokens = Tensor::eye_m(V, D, (DType::Float, Device::Cpu));
    let positions = zeros(&[P, D]);
    for p in 0..P {
        let _ = positions.get(p).get(posv + p).fill_(1.0);
    }
    let embed =
        Embeddings { tokens, scale: 1.0, positions: Positions::Learned(positions), token_type: None, norm: None };
    let m = common::hand_built(dir.path(), &refs, embed, vec![layer(l0), layer(l1)], Kind::Dec, Family::Gpt2);
    (m, dir)
}

#[test]
fn planted_heads_are_found_exactly_and_no_others() {
    let (m, _dir) = planted();
    let probes =
        Probes::generate(&token_pool(&m), &ProbeOptions { seed: 0, n: 8, len: 10, needle: 6, haystack: 14 }).unwrap();
    let grids = head_type_scores(&m, &probes, &Gates::none(), &|| false, false).unwrap();
    for (ty, g) in &grids {
        println!(
            "{ty:16} {:?}",
            g.iter().map(|r| r.iter().map(|v| format!("{v:.3}")).collect::<Vec<_>>()).collect::<Vec<_>>()
        );
    }
    let found: Vec<((usize, usize), Vec<HeadType>)> = labels(&grids, &[]);
    let want = vec![
        ((0, 0), vec![HeadType::Sink]),
        ((0, 1), vec![HeadType::PreviousToken]),
        ((0, 2), vec![HeadType::DuplicateToken]),
        ((1, 0), vec![HeadType::Induction, HeadType::Retrieval]),
        ((1, 1), vec![HeadType::Retrieval]),
    ];
    assert_eq!(found, want);
}

#[test]
fn detector_scores_equal_transformer_lens() {
    detector_scores_against_transformer_lens(false);
}

/// With the sink excluded (a decoder-only model's default, docs/methods.md#attention-sinks):
/// TransformerLens's `detect_head(..., exclude_bos=True)`; and the scores differ from the
/// default ones, so the option is not a no-op.
#[test]
fn detector_scores_without_the_sink_equal_transformer_lens_exclude_bos() {
    detector_scores_against_transformer_lens(true);
}

fn detector_scores_against_transformer_lens(exclude_sink: bool) {
    let dir = root().join("tests/fixtures/tiny_hf/gpt2");
    let m = common::load(&dir, "f32");
    let probes =
        Probes::generate(&token_pool(&m), &ProbeOptions { seed: 5, n: 6, len: 12, needle: 4, haystack: 10 }).unwrap();
    let ours = head_type_scores(&m, &probes, &Gates::none(), &|| false, exclude_sink).unwrap();
    if exclude_sink {
        let with = head_type_scores(&m, &probes, &Gates::none(), &|| false, false).unwrap();
        let moved = ours
            .iter()
            .zip(&with)
            .filter(|((t, _), _)| *t == HeadType::Induction)
            .flat_map(|((_, a), (_, b))| {
                a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).collect::<Vec<_>>()
            })
            .fold(0.0, f64::max);
        assert!(moved > 1e-3, "excluding the first key changed no induction score ({moved})");
        let sink = |g: &headscope::analysis::taxonomy::TypeGrids| {
            g.iter().find(|(t, _)| *t == HeadType::Sink).unwrap().1.clone()
        };
        assert_eq!(sink(&ours), sink(&with), "the sink score itself is the same either way");
    }
    let tmp = tempfile::tempdir().unwrap();
    let (tokens, out) = (tmp.path().join("tokens.json"), tmp.path().join("tl.json"));
    let needles: Vec<serde_json::Value> = probes
        .needles
        .iter()
        .map(|(seq, at)| serde_json::json!({ "seq": seq, "at": at, "needle": probes.needle }))
        .collect();
    // The needle starts before the haystack's end in some probes (a needle's length read from
    // the probe's shape alone would be wrong there).
    assert!(probes.needles.iter().any(|(s, at)| s.len() - at > 2 * probes.needle), "a needle inside the haystack");
    std::fs::write(&tokens, serde_json::json!({ "sequences": probes.repeated, "needles": needles }).to_string())
        .unwrap();
    let mut cmd = std::process::Command::new(common::python());
    cmd.arg(root().join("tests/fixtures/taxonomy_reference.py")).arg(&dir).arg(&tokens).arg(&out);
    if exclude_sink {
        cmd.arg("--exclude-bos");
    }
    let run = cmd.output().expect(".venv/bin/python (scripts/setup)");
    assert!(
        run.status.success(),
        "taxonomy_reference.py failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let tl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    println!("TransformerLens {}", tl["tl_version"]);
    let mut worst: f64 = 0.0;
    for (ty, key) in [
        (HeadType::PreviousToken, "previous_token"),
        (HeadType::DuplicateToken, "duplicate_token"),
        (HeadType::Induction, "induction"),
    ] {
        let g = &ours.iter().find(|(t, _)| *t == ty).unwrap().1;
        for (l, row) in g.iter().enumerate() {
            for (h, v) in row.iter().enumerate() {
                let want = tl[key][l][h].as_f64().unwrap();
                let d = (v - want).abs();
                assert!(d <= 1e-4, "{key} dec.{l}.{h}: headscope {v}, TransformerLens {want}");
                worst = worst.max(d);
            }
        }
    }
    println!("largest difference from TransformerLens: {worst:.2e}");
    assert!(worst < 1e-4);
    // Retrieval against the reference's recount from HF's attention (an argmax per query, so
    // equal up to float32 near-ties: none in these probes).
    let g = &ours.iter().find(|(t, _)| *t == HeadType::Retrieval).unwrap().1;
    let mut any = false;
    for (l, row) in g.iter().enumerate() {
        for (h, v) in row.iter().enumerate() {
            let want = tl["retrieval"][l][h].as_f64().unwrap();
            assert!((v - want).abs() <= 1e-9, "retrieval dec.{l}.{h}: headscope {v}, reference {want}");
            any |= want > 0.0;
        }
    }
    assert!(any, "some head copies a needle token, so the comparison can fail");
    // kv_scores' retrieval and headkv (the same probes; nothing excluded there).
    if !exclude_sink {
        use headscope::analysis::streaming::{scores, ScoreOptions, Scorer};
        let v = headscope::model::view::View::new(common::load(&dir, "f32"));
        let o = ScoreOptions { probes: ProbeOptions { seed: 5, n: 6, len: 12, needle: 4, haystack: 10 }, q_len: 64 };
        for (scorer, key, tol) in [(Scorer::Retrieval, "retrieval", 1e-9), (Scorer::HeadKv, "headkv", 1e-6)] {
            let g = scores(&v, scorer, None, &o, &|| false).unwrap();
            for (l, row) in g.iter().enumerate() {
                for (h, x) in row.iter().enumerate() {
                    let want = tl[key][l][h].as_f64().unwrap();
                    assert!((x - want).abs() <= tol, "kv_scores {key} dec.{l}.{h}: headscope {x}, reference {want}");
                }
            }
        }
    }
}
