//! `analyze` reads attention tile by tile (docs/methods.md#score-tiles): its statistics with
//! tiles of 1, 3 and 7 query rows (heights that do not divide the sentences' lengths) equal
//! those of one tile holding every row (the whole pattern's arithmetic), and each head's
//! confidence equals the one computed by hand from the whole `hook_pattern` recorded sentence
//! by sentence; on an encoder with padding, causal stacks (grouped-query; soft-capped scores
//! and sliding windows that cross tiles; learned sinks) and T5's relative bias; in float32
//! within 1e-6 and in float64 within 1e-12.

use crate::common;
use headscope::analysis::options::{ExcludeKeys, FreqSource, Options, Stat};
use headscope::analysis::result::Analysis;
use headscope::analysis::{analyze, freq_table};
use headscope::data::Dataset;
use headscope::model::hooks::Point;
use headscope::model::nn::Gates;
use headscope::model::Model;
use tch::Kind as DType;

const SENTENCES: &[&str] = &[
    "The cat sat on the mat near the door of the old house by the river.",
    "A dog barked.",
    "Seven quiet engineers measured every attention head twice before lunch.",
    "Rare words like zymurgy appear seldom.",
];

fn run(m: &Model, dir: &std::path::Path, rows: usize) -> Analysis {
    let corpus = dir.join("c.txt");
    std::fs::write(&corpus, SENTENCES.join("\n")).unwrap();
    let data = Dataset::corpus(&corpus).unwrap();
    let kind = m.net.stack_kind;
    let mut opts = Options::new(vec![Stat::Confidence, Stat::Positional, Stat::Rare], vec![kind], corpus.clone());
    opts.exclude_keys = ExcludeKeys::Nothing;
    opts.freq = FreqSource::Text(corpus.clone());
    opts.rare_top_n = 2;
    // Two sentences a batch: the shorter padded.
    opts.batch_tokens = 48;
    opts.tile_rows = rows;
    let freq = freq_table(m, &opts.freq, opts.rare_top_n).unwrap();
    analyze(m, &data, &opts, Some(&freq), &Gates::none(), &|| false, &mut |_, _| {}).unwrap()
}

/// Each head's confidence from the whole pattern, by hand: the mean over real (not special)
/// queries of the row's largest weight, each sentence run alone (no padding).
fn confidence_by_hand(m: &Model) -> Vec<Vec<f64>> {
    let _g = tch::no_grad_guard();
    let n_layers = m.net.stack.len();
    let mut sums: Vec<Vec<f64>> = Vec::new();
    let mut queries = 0usize;
    for s in SENTENCES {
        let enc = &m.tokenize_all([*s]).unwrap()[0];
        let b = m.batch(&[*s]).unwrap();
        let (seen, _) =
            common::recorded(&[Point::Pattern], |h| m.net.encode(&b.ids, &b.mask, &Gates::none(), Some(h)).unwrap());
        let patterns: Vec<_> = seen.iter().filter(|(a, _)| a.kind == m.net.stack_kind).collect();
        assert_eq!(patterns.len(), n_layers);
        let real: Vec<i64> = enc.special.iter().enumerate().filter(|(_, &sp)| !sp).map(|(i, _)| i as i64).collect();
        queries += real.len();
        let idx = tch::Tensor::from_slice(&real);
        for (l, (_, p)) in patterns.iter().enumerate() {
            let mx = p
                .get(0)
                .to_kind(DType::Double)
                .index_select(1, &idx)
                .amax([-1i64].as_slice(), false)
                .sum_dim_intlist([1i64].as_slice(), false, DType::Double);
            let v: Vec<f64> = Vec::try_from(mx).unwrap();
            if sums.len() <= l {
                sums.push(vec![0.0; v.len()]);
            }
            sums[l].iter_mut().zip(v).for_each(|(s, x)| *s += x);
        }
    }
    sums.into_iter().map(|r| r.into_iter().map(|x| x / queries as f64).collect()).collect()
}

fn assert_close(name: &str, what: &str, a: &[Vec<f64>], b: &[Vec<f64>], tol: f64) {
    assert_eq!(a.len(), b.len(), "{name}: {what}: layers");
    for (l, (ra, rb)) in a.iter().zip(b).enumerate() {
        for (h, (x, y)) in ra.iter().zip(rb).enumerate() {
            assert!((x - y).abs() <= tol, "{name}: {what} of head {l}.{h}: {x} against {y} (tolerance {tol:e})");
        }
    }
}

/// `tol`: tiles against one tile; `hand`: against the by-hand confidence (each sentence run
/// alone, unpadded: in float32 the batch's padding changes the pass's rounding).
fn check(name: &str, m: &Model, tol: f64, hand: f64) {
    let dir = tempfile::tempdir().unwrap();
    let kind = m.net.stack_kind;
    for l in 0..m.net.stack.len() {
        assert!(m.net.stack[l].mixer().hands_tiles(), "{name}: layer {l} hands no tiles");
    }
    // One tile of every row: the whole pattern's arithmetic (tests/models/tiles.rs).
    let whole = run(m, dir.path(), 100_000);
    let wk = whole.kind(kind).unwrap();
    let by_hand = confidence_by_hand(m);
    assert_close(name, "confidence (whole against by hand)", wk.confidence.as_ref().unwrap(), &by_hand, hand);
    for rows in [1, 3, 7] {
        let a = run(m, dir.path(), rows);
        let k = a.kind(kind).unwrap();
        assert_eq!(k.queries, wk.queries, "{name}: queries");
        let conf = k.confidence.as_ref().unwrap();
        assert_close(name, &format!("confidence ({rows} rows a tile)"), conf, wk.confidence.as_ref().unwrap(), tol);
        assert_close(name, &format!("confidence ({rows} rows a tile, by hand)"), conf, &by_hand, hand);
        let frac = |k: &headscope::analysis::result::KindResult| -> Vec<Vec<f64>> {
            k.positional.as_ref().unwrap().iter().map(|r| r.iter().map(|p| p.fraction).collect()).collect()
        };
        let offs = |k: &headscope::analysis::result::KindResult| -> Vec<Vec<i64>> {
            k.positional.as_ref().unwrap().iter().map(|r| r.iter().map(|p| p.offset).collect()).collect()
        };
        assert_eq!(offs(k), offs(wk), "{name}: positional offsets, {rows} rows a tile");
        assert_close(name, &format!("positional ({rows} rows a tile)"), &frac(k), &frac(wk), 0.0);
        assert_close(
            name,
            &format!("rare ({rows} rows a tile)"),
            &k.rare.as_ref().unwrap().score,
            &wk.rare.as_ref().unwrap().score,
            0.0,
        );
        assert!(
            a.options.iter().any(|(k, v)| k == "tile_rows" && v == &serde_json::json!(rows)),
            "{name}: tile_rows echoed"
        );
    }
}

#[test]
fn tiled_statistics_equal_the_whole_pattern() {
    let _h = common::heavy();
    check("bert", &common::load(&common::fixtures().join("lrp_tiny/bert"), "f32"), 1e-6, 1e-6);
    for name in ["llama", "gemma2", "gpt_oss", "mistral", "t5"] {
        check(name, &common::tiny_hf(name, "f32"), 1e-6, 1e-6);
    }
    check("llama (float64)", &common::tiny_hf("llama", "f64"), 1e-12, 1e-12);
}

/// Head types (previous, duplicate, induction, sink, retrieval) and the streaming scorers read
/// the attention tile by tile too: with one-row tiles and tiles of a few hundred bytes (heights
/// that do not divide the probes' lengths) they equal one tile of every row.
#[test]
fn tiled_head_types_and_kv_scores_equal_the_whole_pattern() {
    use headscope::analysis::set_tile_bytes;
    use headscope::analysis::streaming::{scores, ScoreOptions, Scorer};
    use headscope::analysis::taxonomy::{head_type_scores, token_pool, ProbeOptions, Probes};
    use headscope::model::view::View;
    let _h = common::heavy();
    for name in ["llama", "gemma2", "gpt_oss"] {
        let m = common::tiny_hf(name, "f32");
        let po = ProbeOptions { seed: 3, n: 3, len: 11, needle: 3, haystack: 13 };
        let probes = Probes::generate(&token_pool(&m), &po).unwrap();
        let v = View::new(m);
        let so = ScoreOptions { probes: po.clone(), q_len: 16 };
        let run = |bytes: i64| {
            set_tile_bytes(bytes);
            let types = head_type_scores(&v.model, &probes, &Gates::none(), &|| false, true).unwrap();
            let kv: Vec<_> = [Scorer::Echo, Scorer::Induction, Scorer::Retrieval, Scorer::HeadKv]
                .into_iter()
                .map(|s| (s, scores(&v, s, None, &so, &|| false).unwrap()))
                .collect();
            set_tile_bytes(0);
            (types, kv)
        };
        let (types, kv) = run(1 << 30);
        for bytes in [1, 700] {
            let (t2, kv2) = run(bytes);
            for ((ty, a), (_, b)) in types.iter().zip(&t2) {
                assert_close(name, &format!("{ty:?} ({bytes} bytes a tile)"), b, a, 1e-6);
            }
            for ((s, a), (_, b)) in kv.iter().zip(&kv2) {
                assert_close(name, &format!("kv_scores {s} ({bytes} bytes a tile)"), b, a, 1e-6);
            }
        }
    }
}

/// The memory budget of a tiled pass counts the attention bias as the stack builds it: none
/// held where the bias is described (every tile builds its rows), per head under T5's
/// relative positions, three where packed rows meet a layer's own sliding window (gemma2;
/// mistral's window is in the stack's one bias), and 8 bytes a value in float64
/// (docs/methods.md#memory-budget); a tile's scores in place of the pattern.
#[test]
fn the_tiled_forward_counts_the_bias_it_builds() {
    let t = 4096i64;
    let none = Gates::none();
    for (name, dtype, packed, per_head, copies, value) in [
        ("llama", "f32", false, false, 0.0, 4.0),
        ("llama", "f32", true, false, 1.0, 4.0),
        ("t5", "f32", false, true, 1.0, 4.0),
        ("mistral", "f32", true, false, 1.0, 4.0),
        ("gemma2", "f32", false, false, 0.0, 4.0),
        ("gemma2", "f32", true, false, 3.0, 4.0),
        ("llama", "f64", true, false, 1.0, 8.0),
    ] {
        let m = common::tiny_hf(name, dtype);
        let heads = m.net.stack.iter().map(|l| l.mixer().width()).max().unwrap() as f64;
        let bias = value * copies * if per_head { heads } else { 1.0 } * (t * t) as f64;
        let tiled = m.net.forward_bytes(1, t, Some(128), packed, &none);
        let whole = m.net.forward_bytes(1, t, None, packed, &none);
        let tile = 4.0 * value * heads * (128 * t) as f64 + value * t as f64;
        assert!(tiled >= bias + tile, "{name} {dtype}: {tiled} counts less than its bias {bias} and a tile {tile}");
        assert!(
            tiled - (bias + tile) <= whole - 4.0 * heads * (t * t) as f64,
            "{name} {dtype}: activations counted alike"
        );
    }
}

/// A verb that keeps whole patterns (the head view's every head, `run_with_cache` of
/// `hook_pattern`, a head's `attention`) estimates what it keeps and is refused over the memory
/// budget, naming the verb, the bytes and the statistics that read tiles instead
/// (docs/methods.md#memory-budget), where the forward alone would fit; a head's `attention`
/// keeps its own weights alone, the same numbers as the view's.
#[test]
fn whole_pattern_verbs_are_refused_past_the_budget() {
    use headscope::budget;
    use headscope::model::hooks::At;
    use headscope::model::HeadId;
    let text = "The cat sat on the mat near the door of the old house by the river. ".repeat(6);
    for name in ["llama", "t5"] {
        let m = common::tiny_hf(name, "f32");
        let none = Gates::none();
        let maps = m.attention_maps(&text, &none).unwrap();
        let last = maps.last().unwrap();
        let (kind, layer) = (last.kind, last.layers.len() - 1);
        let head = HeadId { kind, layer_idx: layer, head: 1 };
        let all = last.layers[layer].as_ref().unwrap();
        let (tq, tk) = (all.size()[1], all.size()[2]);
        let one = m.attention_map(&text, head, &none).unwrap();
        let want: Vec<Vec<f64>> = (0..tq).map(|i| Vec::<f64>::try_from(all.get(1).get(i)).unwrap()).collect();
        assert_eq!(one.weights, want, "{name}: one head's weights are the view's");
        // The stack's kind: what its forward takes, one head's map, every head's maps.
        let stack = m.net.stack_kind;
        let first = &maps[0];
        let t = first.layers[0].as_ref().unwrap().size()[1];
        let (layers, heads) = (first.layers.len() as f64, first.layers[0].as_ref().unwrap().size()[0] as f64);
        let forward = m.net.forward_bytes(1, t, None, false, &none);
        let head_bytes = 16.0 * (tq * tk) as f64;
        let limit = forward.max(head_bytes) + 1.0;
        assert!(16.0 * layers * heads * (t * t) as f64 > limit, "{name}: the test's text is long enough");
        budget::set_limit(limit as u64);
        assert!(m.attention_map(&text, head, &none).is_ok(), "{name}: one head fits in {limit} bytes");
        let e = m.attention_maps(&text, &none).err().expect("refused").to_string();
        assert!(
            e.contains(&format!(
                "the whole attention pattern of {layers} layer(s) x {heads} head(s) over {t} x {t} tokens would take"
            )) && e.contains("analyze, head_types, kv_scores (docs/methods.md#score-tiles)"),
            "{name}: {e}"
        );
        // run_with_cache keeps 4 bytes a weight of each pattern it records.
        assert!(
            4.0 * layers * heads * (t * t) as f64 > forward + 1.0,
            "{name}: every layer's patterns outweigh the forward"
        );
        budget::set_limit(forward as u64 + 1);
        let patterns = |at: At| at.point == Point::Pattern && at.kind == stack;
        let e = m.run_with_cache(&text, &none, &patterns, None).expect_err("refused").to_string();
        assert!(e.contains("the whole attention pattern of 2 layer(s)"), "{name}: {e}");
        let one_layer = |at: At| at.point == Point::Pattern && at.kind == stack && at.layer == 0;
        assert!(m.run_with_cache(&text, &none, &one_layer, None).is_ok(), "{name}: one layer's patterns fit");
        budget::set_limit(0);
    }
    // A float64 model's patterns are kept at 8 bytes a weight: what 4 bytes would let through
    // is refused.
    let m = common::tiny_hf("llama", "f64");
    let none = Gates::none();
    let stack = m.net.stack_kind;
    let t = m.batch(&[text.as_str()]).unwrap().ids.size()[1];
    let heads = m.net.stack.iter().map(|l| l.mixer().width()).max().unwrap() as f64;
    let all = m.net.stack.len() as f64 * heads * (t * t) as f64;
    let limit = m.net.forward_bytes(1, t, None, false, &none).max(4.0 * all) + 1.0;
    assert!(8.0 * all > limit);
    budget::set_limit(limit as u64);
    let patterns = |at: At| at.point == Point::Pattern && at.kind == stack;
    let e = m.run_with_cache(&text, &none, &patterns, None).expect_err("refused at 8 bytes a weight").to_string();
    assert!(e.contains("the whole attention pattern of"), "{e}");
    budget::set_limit(0);
}

/// `analyze` reports progress layer by layer of the stack (a long text is one batch of one
/// sentence): after each layer's last tile, then at the batch's end, in units of a sentence's
/// layer.
#[test]
fn analyze_reports_progress_per_layer() {
    let m = common::tiny_hf("llama", "f32");
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.txt");
    std::fs::write(&corpus, "The cat sat on the mat near the door of the old house by the river.").unwrap();
    let data = Dataset::corpus(&corpus).unwrap();
    let mut opts = Options::new(vec![Stat::Confidence], vec![m.net.stack_kind], corpus.clone());
    opts.tile_rows = 4;
    let mut seen = Vec::new();
    let a = analyze(&m, &data, &opts, None, &Gates::none(), &|| false, &mut |d, t| seen.push((d, t))).unwrap();
    let l = m.net.stack.len();
    let want: Vec<(usize, usize)> = (1..=l).chain([l]).map(|d| (d, l)).collect();
    assert_eq!(seen, want);
    assert_eq!(a.sentences, 1, "the result counts sentences, not the progress's units");
}
