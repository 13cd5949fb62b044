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

const SENTENCES: [&str; 3] = [
    "the cat and the dog sat on the mat in the park all day",
    "a dog ran in the park today and we like green tea",
    "it is raining",
];

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
            let ids: Vec<i64> = m.model.tokenize(text).unwrap().ids.clone();
            assert_eq!(
                ids,
                Vec::<i64>::try_from(&g[&format!("{name}/{s}/ids")]).unwrap(),
                "{name}: sentence {s} tokenized as transformers does"
            );
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
        let heads =
            [HeadId { kind: Kind::Dec, layer_idx: 0, head: 1 }, HeadId { kind: Kind::Dec, layer_idx: 1, head: 3 }];
        let prompt = "the cat and the dog sat on the mat";
        let n_prompt = m.model.tokenize(prompt).unwrap().ids.len() as i64;
        for regime in [Regime::Always, Regime::Decode { prompt: None }] {
            let v = m.streaming(&heads, 2, 3, regime, "test").unwrap();
            let new = v.model.generate(prompt, 8, &v.gates().unwrap()).unwrap();
            let out: Vec<i64> =
                m.model.tokenize(prompt).unwrap().ids.iter().copied().chain(new.iter().copied()).collect();
            // The same ids run whole: each generated token is the argmax at its position.
            let fixed = match regime {
                Regime::Decode { .. } => {
                    m.streaming(&heads, 2, 3, Regime::Decode { prompt: Some(n_prompt) }, "test").unwrap()
                }
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

pub(crate) mod planted {
    //! A hand-built decoder-only model: layer 0 attends within a window of the last 4 tokens
    //! (dec.0.0 a previous-token head writing the previous token into a slot of its own, the
    //! others uniform over the window); in layer 1, dec.1.0 is a copy (induction) head whose
    //! output is the model's prediction (the token after the current token's previous
    //! occurrence), dec.1.1 an echo head (attention on the current token's previous occurrence),
    //! dec.1.2 and dec.1.3 uniform over every token.
    use crate::common::{self, zeros};
    use headscope::analysis::streaming::{
        group_scores, kv_cost, passkey_accuracy, passkeys, scores, split, ScoreOptions, Scorer, SCORERS,
    };
    use headscope::analysis::taxonomy::ProbeOptions;
    use headscope::data::{Dataset, Item};
    use headscope::model::nn::{Activation, Attention, Ffn, Linear, NormPosition, Regime};
    use headscope::model::transformer::{Embeddings, Positions, StackLayer};
    use headscope::model::view::View;
    use headscope::model::{Family, HeadId, Kind};
    use tch::{Device, Kind as DType, Tensor};

    const V: i64 = 40;
    const P: i64 = 64;
    const D: i64 = 3 * V + P; // token | position | previous token | answer
    const H: i64 = 4;
    const S: f64 = 30.0;
    const CONTEXT: i64 = 48;
    const NEEDLE: usize = 6;

    fn attention(
        q: &[(i64, i64, i64, f64)],
        k: &[(i64, i64, i64, f64)],
        v: &[(i64, i64, i64, f64)],
        o: &[(i64, i64, i64, f64)],
    ) -> Attention {
        let fill = |entries: &[(i64, i64, i64, f64)]| {
            let w = zeros(&[H * D, D]);
            for &(h, d, i, x) in entries {
                let _ = w.get(h * D + d).get(i).fill_(x);
            }
            w
        };
        let wo = zeros(&[D, H * D]);
        for &(h, d, out, x) in o {
            let _ = wo.get(out).get(h * D + d).fill_(x);
        }
        Attention::new(
            Linear { w: fill(q), b: None },
            Linear { w: fill(k), b: None },
            Linear { w: fill(v), b: None },
            Linear { w: wo, b: None },
            H,
            H,
            D,
        )
    }

    fn layer(attn: Attention, window: Option<i64>) -> StackLayer {
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
        .with_window(window)
    }

    pub fn model() -> (View, tempfile::TempDir) {
        model_with(0, 10.0)
    }

    /// The planted model with `silent` layers on top whose heads write nothing (all weights 0)
    /// and the output head's weight `out` (10: a copied token's logit about 78).
    pub fn model_with(silent: usize, out_weight: f64) -> (View, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let words: Vec<String> = (0..V - 4).map(|i| format!("w{i}")).collect();
        let refs: Vec<&str> = words.iter().map(|s| s.as_str()).collect();
        let (tokv, posv, prevv, ansv) = (0, V, V + P, 2 * V + P);
        // The rms norm scales the one-hot input (two ones in D) by sqrt(D / 2), and scores are
        // divided by sqrt(d_head): S sqrt(D) / (D / 2) per entry gives scores of S in layer 0
        // (2 S / 3 in layer 1, whose input has a third one).
        let n = S * (D as f64).sqrt() / (D as f64 / 2.0);
        let (mut q0, mut k0, mut v0, mut o0) = (vec![], vec![], vec![], vec![]);
        for i in 1..P {
            q0.push((0, i - 1, posv + i, n));
        }
        for j in 0..P {
            k0.push((0, j, posv + j, 1.0));
        }
        for t in 0..V {
            v0.push((0, t, tokv + t, 1.0));
            o0.push((0, t, prevv + t, 1.0 / (D as f64 / 2.0).sqrt()));
        }
        let (mut q1, mut k1, mut v1, mut o1) = (vec![], vec![], vec![], vec![]);
        for t in 0..V {
            // dec.1.0: the current token meets the previous-token slot; its value, the key's
            // token, goes to the answer slot.
            q1.push((0, t, tokv + t, n));
            k1.push((0, t, prevv + t, 1.0));
            v1.push((0, t, tokv + t, 1.0));
            o1.push((0, t, ansv + t, 1.0));
            // dec.1.1: the current token meets the same token, not at its own position.
            q1.push((1, t, tokv + t, n));
            k1.push((1, t, tokv + t, 1.0));
        }
        for p in 0..P {
            q1.push((1, V + p, posv + p, -n));
            k1.push((1, V + p, posv + p, 1.0));
        }
        let l0 = attention(&q0, &k0, &v0, &o0);
        let l1 = attention(&q1, &k1, &v1, &o1);
        let tokens = Tensor::eye_m(V, D, (DType::Float, Device::Cpu));
        let positions = zeros(&[P, D]);
        for p in 0..P {
            let _ = positions.get(p).get(posv + p).fill_(1.0);
        }
        let embed =
            Embeddings { tokens, scale: 1.0, positions: Positions::Learned(positions), token_type: None, norm: None };
        let mut m = common::hand_built(
            dir.path(),
            &refs,
            embed,
            vec![layer(l0, Some(4)), layer(l1, None)]
                .into_iter()
                .chain((0..silent).map(|_| layer(attention(&[], &[], &[], &[]), None)))
                .collect(),
            Kind::Dec,
            Family::Gpt2,
        );
        let out = zeros(&[V, D]);
        for t in 0..V {
            let _ = out.get(t).get(ansv + t).fill_(out_weight);
        }
        m.net.output = Some(Linear { w: out, b: None });
        (View::new(m), dir)
    }

    fn head(l: usize, h: usize) -> HeadId {
        HeadId { kind: Kind::Dec, layer_idx: l, head: h }
    }

    fn probes() -> ScoreOptions {
        ScoreOptions { probes: ProbeOptions { seed: 1, n: 6, len: 12, needle: NEEDLE, haystack: 30 }, q_len: 64 }
    }

    fn words(v: &View) -> Dataset {
        let _ = v;
        let texts = ["w5 w6 w7 w8 w9 w10 w11 w12 w5 w6 w7 w8", "w20 w21 w22 w20 w21 w22 w30 w31"];
        Dataset::new("words", texts.iter().map(|t| Item { text: t.to_string(), target: None, tree: None }).collect())
    }

    /// Every scorer puts the windowed layer's heads at the bottom; the retrieval-like scorers
    /// put the copy head at the top, echo the echo head.
    #[test]
    fn every_scorer_scores_the_windowed_heads_streaming_and_keeps_the_copy_heads() {
        let (v, _dir) = model();
        for scorer in SCORERS {
            let g = scores(&v, scorer, Some(&words(&v)), &probes(), &|| false).unwrap();
            eprintln!(
                "{scorer:10} {:?}",
                g.iter().map(|r| r.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>()).collect::<Vec<_>>()
            );
            let low = g[0][0];
            assert!(
                g.iter().flatten().all(|&x| low <= x),
                "{scorer}: dec.0.0 (attending to the last 4 tokens only) scores lowest"
            );
            // Keeping one group in eight full streams the windowed head.
            let one = split(&v, &group_scores(&v, &g), 1.0 / 8.0, 0, 4, Regime::Always, "test").unwrap();
            assert!(one.streaming.as_ref().unwrap().heads[0][0], "{scorer}: dec.0.0 streams");
            let top = match scorer {
                Scorer::Retrieval | Scorer::HeadKv | Scorer::Induction => vec![head(1, 0)],
                Scorer::Echo => vec![head(1, 1)],
                Scorer::Razor => vec![head(1, 0), head(1, 1)],
                Scorer::Duo => vec![],
            };
            if let Some(t) = top.iter().max_by(|a, b| g[a.layer_idx][a.head].total_cmp(&g[b.layer_idx][b.head])) {
                let best = g[t.layer_idx][t.head];
                assert!(g.iter().flatten().all(|&x| x <= best), "{scorer}: {t} scores highest");
                assert!(best > low, "{scorer}: {t} above the windowed heads");
                let kept = !one.streaming.as_ref().unwrap().heads[t.layer_idx][t.head];
                assert!(kept, "{scorer}: keeping one group full keeps {t}");
            }
        }
    }

    /// Streaming the windowed layer changes nothing (difference 0); streaming the copy head
    /// breaks the passkey.
    #[test]
    fn streaming_a_windowed_head_changes_nothing_and_a_copy_head_breaks_the_passkey() {
        let (v, _dir) = model();
        let keys = passkeys(&v.model, ("kv_curve", "passkey"), 4, NEEDLE, CONTEXT, 3).unwrap();
        let run = |w: &View, ids: &[i64]| {
            let x = Tensor::from_slice(ids).view([1, -1]);
            let states =
                w.model.net.encode(&x, &x.ones_like().to_kind(DType::Float), &w.gates().unwrap(), None).unwrap();
            w.model.net.logits(&states).unwrap()
        };
        let layer0: Vec<HeadId> = (0..4).map(|h| head(0, h)).collect();
        for (sink, recent) in [(0, 4), (4, 4), (2, 16)] {
            let s = v.streaming(&layer0, sink, recent, Regime::Always, "test").unwrap();
            for (seq, _) in &keys {
                let d = common::max_diff(&run(&v, seq), &run(&s, seq));
                assert_eq!(
                    d, 0.0,
                    "sink {sink}, recent {recent}: streaming the windowed layer changed the logits by {d:e}"
                );
            }
        }
        let full: f64 =
            keys.iter().map(|(s, _)| passkey_accuracy(&v, &v.gates().unwrap(), s, NEEDLE).unwrap()).sum::<f64>()
                / keys.len() as f64;
        let copy = v.streaming(&[head(1, 0)], 2, 8, Regime::Always, "test").unwrap();
        let broken: f64 =
            keys.iter().map(|(s, _)| passkey_accuracy(&copy, &copy.gates().unwrap(), s, NEEDLE).unwrap()).sum::<f64>()
                / keys.len() as f64;
        let echo = v.streaming(&[head(1, 1), head(1, 2), head(1, 3)], 2, 8, Regime::Always, "test").unwrap();
        let others: f64 =
            keys.iter().map(|(s, _)| passkey_accuracy(&echo, &echo.gates().unwrap(), s, NEEDLE).unwrap()).sum::<f64>()
                / keys.len() as f64;
        eprintln!(
            "passkey accuracy: full {full}, copy head streaming {broken}, the other layer-1 heads streaming {others}"
        );
        assert_eq!(full, 1.0, "the planted model retrieves every passkey");
        assert_eq!(others, 1.0, "streaming the heads that do not copy keeps the passkey");
        assert!(broken < 0.2, "streaming the copy head breaks the passkey: {broken}");
        // The cache: 4 of 8 groups stream at sink 0, recent 4.
        let c = kv_cost(&v.streaming(&layer0, 0, 4, Regime::Always, "test").unwrap(), CONTEXT, None);
        assert_eq!((c.groups, c.streaming, c.entries, c.full_entries), (8, 4, 4 * CONTEXT + 4 * 4, 8 * CONTEXT));
        assert_eq!(c.bytes, c.entries * 2 * D * 4);
    }

    /// The needle test: each sequence is the haystack with the needle at its depth and again at
    /// the end; the planted model copies the needles at every depth, and closing its copy head
    /// (`with_mask`'s view) breaks it while closing a uniform head keeps it.
    #[test]
    fn the_needle_test_sees_the_copy_head() {
        use headscope::analysis::needle::{needle_sequences, needle_test, NeedleOptions};
        let (v, _dir) = model();
        let o =
            NeedleOptions { contexts: vec![CONTEXT, 40], depths: vec![0.0, 0.5, 1.0], n: 3, needle: NEEDLE, seed: 5 };
        let hay = CONTEXT as usize - 2 * NEEDLE;
        let long = {
            let w = words(&v);
            Dataset::new("words x4", (0..4).flat_map(|_| w.items.iter().cloned().collect::<Vec<_>>()).collect())
        };
        let stream: Vec<i64> = long.texts().into_iter().flat_map(|t| v.model.tokenize(t).unwrap().ids).collect();
        assert!(stream.len() >= hay, "the test's data holds a haystack");
        for (depth, want_at) in [(0.0, 0), (0.5, hay / 2), (1.0, hay)] {
            for data in [None, Some(&long)] {
                let seqs = needle_sequences(&v.model, data, CONTEXT, depth, &o).unwrap();
                assert_eq!(seqs.len(), 3);
                for (k, (s, at)) in seqs.iter().enumerate() {
                    assert_eq!((s.len(), *at), (CONTEXT as usize, want_at), "depth {depth}");
                    let key = &s[s.len() - NEEDLE..];
                    assert_eq!(&s[*at..*at + NEEDLE], key, "depth {depth}: the needle at its depth");
                    let haystack: Vec<i64> =
                        s[..*at].iter().chain(&s[*at + NEEDLE..s.len() - NEEDLE]).copied().collect();
                    if data.is_some() {
                        let start = (k * hay) % (stream.len() - hay + 1);
                        assert_eq!(
                            haystack,
                            stream[start..start + hay],
                            "depth {depth}: the haystack is the data's text"
                        );
                    } else {
                        assert!(!haystack.windows(NEEDLE).any(|w| w == key), "the random haystack holds no needle");
                    }
                }
                assert_ne!(
                    seqs[0].0[CONTEXT as usize - NEEDLE..],
                    seqs[1].0[CONTEXT as usize - NEEDLE..],
                    "needles differ"
                );
            }
        }
        let acc = |w: &View| {
            needle_test(w, None, &o, &|| false, &mut |_, _| {}).unwrap().iter().map(|r| r.accuracy).collect::<Vec<_>>()
        };
        let full = acc(&v);
        let closed = acc(&v.closing(&[head(1, 0)]));
        let uniform = acc(&v.closing(&[head(1, 2)]));
        eprintln!("needle accuracy: full {full:?}, copy head closed {closed:?}, a uniform head closed {uniform:?}");
        assert_eq!(full.len(), 6);
        // (At depth 0, the needle first at position 0, it misses 2 of 15 tokens at either length.)
        assert!(
            full.iter().all(|&a| a >= 0.85) && full.iter().filter(|&&a| a == 1.0).count() >= 4,
            "the planted model copies the needles: {full:?}"
        );
        assert_eq!(uniform, full, "closing a uniform head changes no copy");
        assert!(closed.iter().all(|&a| a < 0.2), "closing the copy head breaks them: {closed:?}");
    }
}

/// A streaming view's generation holds its cache packed: the bytes of its tensors equal the
/// cache counted from shapes (`kv_cost`) exactly, below the full cache once the context passes
/// `sink + recent`; a view streaming no group holds the full cache.
#[test]
fn the_packed_cache_holds_the_bytes_counted_from_shapes() {
    use headscope::analysis::streaming::kv_cost;
    for name in ["llama", "gpt2"] {
        let m = View::new(common::tiny_hf(name, "f32"));
        let heads =
            [HeadId { kind: Kind::Dec, layer_idx: 0, head: 1 }, HeadId { kind: Kind::Dec, layer_idx: 1, head: 3 }];
        let prompt = "the cat and the dog sat on the mat in the park";
        for regime in [Regime::Always, Regime::Decode { prompt: None }] {
            for (v, what) in [
                (m.streaming(&heads, 2, 3, regime, "test").unwrap(), "streaming"),
                (m.streaming(&[], 2, 3, regime, "test").unwrap(), "none streaming"),
                (m.clone(), "plain"),
            ] {
                let (new, cache) = v.model.generate_run(prompt, 12, &v.gates().unwrap(), true).unwrap();
                let counted = kv_cost(&v, cache.len, cache.prompt);
                eprintln!(
                    "{name} {regime:?} {what}: {} tokens generated, context {}: cache {} bytes, counted {} of {} full",
                    new.len(),
                    cache.len,
                    cache.bytes(),
                    counted.bytes,
                    counted.full_bytes
                );
                assert_eq!(
                    cache.bytes(),
                    counted.bytes,
                    "{name} {regime:?} {what}: the cache's tensors hold what kv_cost counts"
                );
                if what == "streaming" {
                    assert!(counted.bytes < counted.full_bytes, "{name} {regime:?}: streaming keeps less");
                } else {
                    assert_eq!(
                        counted.bytes, counted.full_bytes,
                        "{name}: {what} keeps the full cache, one key and value per group"
                    );
                }
            }
        }
    }
}

/// PruLong's KV footprint (docs/methods.md#kv-footprint) equals an independent reference
/// (`fixtures/kv_footprint_reference.py`): a brute-force simulation of the cache from the
/// streaming masks, entry by entry, which itself equals PruLong's published accounting in the
/// `always` regime (asserted there). Exactly, as integers; and through a view of tiny Llama
/// (4 groups) and SmolLM2 (90) where the golden has their group counts.
#[test]
fn the_kv_footprint_equals_a_simulation_of_the_cache() {
    use headscope::analysis::streaming::{footprint, kv_footprint};
    let g = common::golden_json("kv_footprint_golden.json");
    let llama = View::new(common::tiny_hf("llama", "f32"));
    let smol = std::cell::OnceCell::new();
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 9);
    for c in cases {
        let n = |k: &str| c[k].as_i64().unwrap();
        let (groups, stream, sink, recent, prompt, decode, chunk) =
            (n("groups"), n("streaming"), n("sink"), n("recent"), n("prompt"), n("decode"), n("chunk"));
        let rp = c["regime_prompt"].as_i64();
        let regime = if c["regime"] == "always" { Regime::Always } else { Regime::Decode { prompt: rp } };
        let p_regime = rp.unwrap_or(prompt);
        let f = footprint(groups - stream, stream, Some((sink, recent, regime, p_regime)), prompt, decode, chunk);
        let want = (n("entry_steps"), n("full_entry_steps"), n("peak"), n("full_peak"));
        eprintln!("{c}: footprint {:.6} peak {:.6}", f.fraction(), f.peak_fraction());
        assert_eq!((f.entry_steps, f.full_entry_steps, f.peak, f.full_peak), want, "{c}");
        if let Some(fp) = c["prulong_footprint"].as_f64() {
            assert!((f.fraction() - fp).abs() < 1e-12, "PruLong's accounting: {c}");
        }
        // Through a view: the first `stream` groups (whole groups, every layer) stream.
        let view = match groups {
            4 => Some(&llama),
            90 => Some(smol.get_or_init(|| View::new(common::asset("smollm2", "f32")))),
            _ => None,
        };
        if let Some(v) = view {
            let per = v.group_size(Kind::Dec, 0);
            let per_layer = (v.model.attention(Kind::Dec, 0).unwrap().width() / per) as i64;
            let heads: Vec<HeadId> = (0..stream)
                .map(|i| HeadId {
                    kind: Kind::Dec,
                    layer_idx: (i / per_layer) as usize,
                    head: (i % per_layer) as usize * per,
                })
                .collect();
            let w = v.streaming(&heads, sink, recent, regime, "test").unwrap();
            let got = kv_footprint(&w, prompt, decode, chunk);
            assert_eq!((got.entry_steps, got.full_entry_steps, got.peak, got.full_peak), want, "through a view: {c}");
        }
    }
    // A view without streaming groups holds the full cache.
    let plain = kv_footprint(&llama, 100, 20, 30);
    assert_eq!((plain.entry_steps, plain.peak), (plain.full_entry_steps, plain.full_peak));
}

/// The decode regime equals kvpress 0.5.5's DuoAttentionPress with the same streaming mask set
/// by hand (`fixtures/kvpress_reference.py`: SmolLM2 through transformers' GGUF loader, a 256
/// token prompt prefilled under the press, the rest fed over its cache): the next-token loss
/// of the 44 tokens after the prompt within 1e-4.
#[test]
fn decode_regime_equals_kvpress_duo_attention_on_smollm2() {
    let _heavy = common::heavy();
    let g = common::golden_json("kvpress_golden.json");
    let m = View::new(common::asset("smollm2", "f32"));
    let text = std::fs::read_to_string(headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap();
    let joined: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    // No special tokens, as the reference (headscope's GGUF tokenizer puts SmolLM2's BOS first).
    let e = m.model.tokenize(&joined.join(" ")).unwrap();
    let ids: Vec<i64> = e.ids.iter().zip(&e.special).filter(|(_, s)| !**s).map(|(&i, _)| i).take(300).collect();
    let (first, last) = (&g["ids_first_last"][0], &g["ids_first_last"][1]);
    assert_eq!(serde_json::json!(ids[..4]), *first, "tokenized as the reference");
    assert_eq!(serde_json::json!(ids[296..]), *last, "tokenized as the reference");
    let (p, sink, recent) = (g["prompt"].as_i64().unwrap(), g["sink"].as_i64().unwrap(), g["recent"].as_i64().unwrap());
    let mut heads = Vec::new();
    for (l, row) in g["streaming_mask"].as_array().unwrap().iter().enumerate() {
        for (k, on) in row.as_array().unwrap().iter().enumerate() {
            if on.as_i64() == Some(1) || on.as_bool() == Some(true) {
                heads.push(HeadId { kind: Kind::Dec, layer_idx: l, head: k * 3 });
            }
        }
    }
    assert_eq!(heads.len(), 45);
    let loss = |v: &View| {
        let x = Tensor::from_slice(&ids[..299]).view([1, 299]);
        let states = v.model.net.encode(&x, &x.ones_like().to_kind(DType::Float), &v.gates().unwrap(), None).unwrap();
        let logp = v.model.log_probs(&states.narrow(1, p - 1, 300 - p), DType::Float).unwrap();
        let targets = Tensor::from_slice(&ids[p as usize..]).view([1, -1]);
        headscope::model::loss::nll(&logp, &targets).mean(DType::Double).double_value(&[])
    };
    let plain = loss(&m);
    let streamed = loss(&m.streaming(&heads, sink, recent, Regime::Decode { prompt: Some(p) }, "test").unwrap());
    let (want_plain, want) =
        (g["plain"]["loss"].as_f64().unwrap(), g["cases"]["streaming"]["one_call"]["loss"].as_f64().unwrap());
    eprintln!("SmolLM2 decode regime, 45 of 90 groups streaming: loss {streamed:.9} (kvpress {want:.9}); plain {plain:.9} (transformers {want_plain:.9})");
    assert!((plain - want_plain).abs() < 1e-4, "plain loss {plain} vs {want_plain}");
    assert!((streamed - want).abs() < 1e-4, "streaming loss {streamed} vs kvpress {want}");
    assert!((streamed - plain).abs() > 1e-2, "the case must change the loss");
}

/// The duo scorer (kvpress's `duo_attention_on_the_fly`, docs/methods.md#streaming-heads) on
/// SmolLM2 over three texts, `q_len` 50, against `fixtures/duo_scores_reference.py`: the mean
/// queries and keys captured from transformers, rotated and scored in float64 there (kvpress's
/// own float32 code agrees with it to 4.3e-8, asserted by the script). Each text alone and
/// the mean of the three, every layer and head.
#[test]
fn duo_scores_equal_kvpress_on_the_fly_on_smollm2() {
    use headscope::analysis::streaming::{scores, ScoreOptions, Scorer};
    use headscope::analysis::taxonomy::ProbeOptions;
    let _heavy = common::heavy();
    let g = common::golden_json("duo_scores_golden.json");
    let v = View::new(common::asset("smollm2", "f32"));
    let texts: Vec<String> = g["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    let corpus = headscope::data::Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap();
    let data = corpus.take(texts.len());
    for (i, (item, want)) in data.items.iter().zip(&texts).enumerate() {
        assert_eq!(&item.text, want, "text {i} is the reference's");
        let ids = v.model.tokenize(&item.text).unwrap().ids;
        assert_eq!(serde_json::json!(ids), g["ids"][i], "text {i} tokenized as the reference");
    }
    let o = ScoreOptions {
        probes: ProbeOptions { seed: 1, n: 1, len: 8, needle: 2, haystack: 8 },
        q_len: g["q_len"].as_i64().unwrap(),
    };
    let check = |got: &[Vec<f64>], want: &serde_json::Value, what: &str| {
        let mut worst = 0f64;
        for (l, row) in got.iter().enumerate() {
            for (h, x) in row.iter().enumerate() {
                let w = want[l][h].as_f64().unwrap();
                worst = worst.max((x - w).abs());
                assert!((x - w).abs() < 1e-6, "{what} dec.{l}.{h}: headscope {x} vs reference {w}");
            }
        }
        eprintln!("duo scores, {what}: within {worst:.1e} of the reference");
    };
    let all = scores(&v, Scorer::Duo, Some(&data), &o, &|| false).unwrap();
    assert_eq!((all.len(), all[0].len()), (30, 9));
    check(&all, &g["scores"], "three texts");
    for i in 0..texts.len() {
        let one = data.slice(i..i + 1);
        check(&scores(&v, Scorer::Duo, Some(&one), &o, &|| false).unwrap(), &g["per_text"][i], &format!("text {i}"));
    }
    // The scores tell heads apart (a constant would pass a loose check).
    let flat: Vec<f64> = all.iter().flatten().copied().collect();
    let (lo, hi) = flat.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    assert!(hi - lo > 0.1, "scores span {lo}..{hi}");
}

/// Bad input to the streaming functions: one-line errors naming the argument; the session
/// keeps its variables.
#[test]
fn bad_streaming_input_is_a_one_line_error() {
    use headscope::engine::{Session, SessionOptions};
    let mut s = Session::new(SessionOptions::default());
    let tiny = |n: &str| common::root().join("tests/fixtures/tiny_hf").join(n).display().to_string();
    s.eval(
        "setup",
        &format!(
            "let m = load_model({:?}); let b = load_model({:?}); let d = corpus(asset(\"pud_en.txt\")).take(20);",
            tiny("llama"),
            tiny("bart")
        ),
    )
    .unwrap();
    let cases: &[(&str, &str)] = &[
        ("load_model(\"minilm\").with_streaming([\"enc.0.1\"])", "with_streaming: minilm is an encoder: it reads every token at once and keeps no key/value cache"),
        ("b.with_streaming([\"dec.0.1\"])", "streaming heads are offered for decoder-only models"),
        ("m.with_streaming([\"dec.0.1\"], #{sink: -2})", "with_streaming: sink must be 0 or more, got -2"),
        ("m.with_streaming([\"dec.0.1\"], #{recent: 0})", "with_streaming: recent must be 1 or more, got 0"),
        ("m.with_streaming([\"dec.0.1\"], #{regime: \"prefill\"})", "unknown streaming regime 'prefill'"),
        ("m.with_streaming([\"dec.0.1\"], #{prompt: 4})", "'prompt' is the part the decode regime reads in full; it needs regime: \"decode\""),
        ("m.with_streaming([\"dec.9.1\"])", "with_streaming: heads[0]: layer 9 out of range"),
        ("m.with_streaming([\"dec.0.1\"], #{sink: 2}).with_streaming([\"dec.1.1\"], #{sink: 3})", "one setting per view"),
        ("m.kv_curve(m.kv_scores(\"echo\", #{n: 2, len: 10}), d, #{context: 64, sink: 32, recent: 40})", "kv_curve: sink + recent = 72 covers the whole context of 64: nothing would stream"),
        ("m.kv_curve(m.kv_scores(\"echo\", #{n: 2, len: 10}), d, #{context: 64, sink: 2, recent: 30, regime: \"decode\"})", "kv_curve: sink + recent = 32 covers the prompt of 32 the decode regime reads in full: nothing would stream"),
        ("m.kv_curve(m.kv_scores(\"echo\", #{n: 2, len: 10}), d, #{context: 64, fractions: [0.5, 0]})", "kv_curve: fractions must lie in (0, 1], got 0"),
        ("m.kv_curve(m.kv_scores(\"echo\", #{n: 2, len: 10}), d, #{context: 64, fractions: [1.5]})", "kv_curve: fractions must lie in (0, 1], got 1.5"),
        ("m.kv_curve(m.kv_scores(\"echo\", #{n: 2, len: 10}), d, #{context: 64, sink: 2, recent: 8, needle: 40})", "kv_curve: a passkey of 40 tokens must have 2 or more and fit twice in the context of 64"),
        ("m.kv_curve(m.kv_scores(\"echo\", #{n: 2, len: 10}), d, #{context: 100000, sink: 2, recent: 8})", "fewer than one context of 100000"),
        ("m.kv_curve(m.kv_scores(\"echo\", #{n: 2, len: 10}), d, #{context: 64, prompt: 64, sink: 2, recent: 8})", "kv_curve: prompt must lie in 1..63"),
        ("m.kv_curve(#{a: 3}, d, #{context: 64})", "kv_curve: scores.a must be a Grid of per-head scores, got 3"),
        ("m.with_streaming([\"dec.0.1\"]).kv_curve(m.kv_scores(\"echo\"), d, #{})", "kv_curve: not on a view with streaming heads"),
        ("m.needle_test(#{contexts: [64], depths: [1.5]})", "needle_test: depths must lie in [0, 1], got 1.5"),
        ("m.needle_test(#{contexts: [10], needle: 8})", "needle_test: option 'needle' 8 (a passkey of 8 tokens, twice) does not fit option 'context' 10"),
        ("m.needle_test(#{contexts: [64], needle: 1})", "needle_test: needle must be 2 or more tokens, got 1"),
        ("m.needle_test(#{contexts: [64.5]})", "needle_test: contexts must be whole numbers of tokens, got 64.5"),
        ("m.needle_test(#{contexts: [100000], data: d.take(2)})", "fewer than the haystack of 99984 a context of 100000 needs"),
        ("m.needle_test(#{n: 0})", "needle_test: n must be 1 or more sequences, got 0"),
        ("b.needle_test(#{})", "is not a decoder-only model"),
        ("m.kv_scores(\"sinky\")", "kv_scores: unknown streaming scorer 'sinky'"),
        ("m.kv_scores(\"duo\")", "kv_scores: the duo scorer needs data"),
        ("m.kv_scores(\"echo\", #{data: d})", "kv_scores: 'data' feeds the duo scorer"),
        ("b.kv_scores(\"echo\")", "is not a decoder-only model"),
        ("m.kv_cost(0)", "kv_cost: context must be 1 or more tokens, got 0"),
        ("m.kv_footprint(0)", "kv_footprint: prompt must be 1 or more tokens, got 0"),
        ("m.kv_footprint(64, #{chunk: 0})", "kv_footprint: chunk must be 1 or more tokens, got 0"),
        ("m.kv_footprint(64, #{decode: -3})", "kv_footprint: option 'decode': expected a non-negative integer, got -3"),
        ("b.kv_footprint(64)", "is not a decoder-only model"),
        ("m.kv_curve(m.kv_scores(\"echo\", #{n: 2, len: 10}), d, #{context: 64, sink: 2, recent: 8, chunk: 0})", "kv_curve: chunk must be 1 or more tokens, got 0"),
        ("kv_plot(table([\"x\"], []), \"kl\")", "kv_plot: the table has no 'scorer' column: pass a kv_curve table"),
        ("kv_plot(table([\"x\"], []), \"kl\", \"area\")", "kv_plot: x must be \"kv_kept\", \"footprint\" or \"peak\", got \"area\""),
        ("m.with_streaming([\"dec.0.1\"]).lrp(d)", "lrp: not on a view with streaming heads"),
        ("m.with_streaming([\"dec.0.1\"]).prune(d, #{steps: 1})", "prune: not on a view with streaming heads"),
    ];
    for (code, want) in cases {
        let e = s.eval("case", code).err().map(|e| e.to_string()).unwrap_or_else(|| panic!("{code}: no error"));
        let first = e.lines().next().unwrap_or("");
        assert!(first.contains(want), "{code}: the first line {first:?} should say {want:?}\n{e}");
        assert!(!e.contains("panicked"), "{code}: {e}");
    }
    let still = s.eval("after", "m.kv_cost(10).groups").unwrap().unwrap().text;
    assert_eq!(still.trim(), "4", "the session keeps its variables");
}
