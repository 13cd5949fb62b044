//! Attention sinks (docs/methods.md#attention-sinks): a decoder-only model keeps its
//! beginning-of-sequence sink apart by default in confidence (the analysis pass), the attention
//! listing and the head labels; the default equals the explicit new option and differs from the
//! explicit old one, and encoders and translation models keep the paper's defaults.

use crate::common::root;
use headscope::engine::{Session, SessionOptions};

fn session(model: &str) -> Session {
    let mut s = Session::new(SessionOptions::default());
    let m = root().join("tests/fixtures/tiny_hf").join(model);
    let d = root().join("tests/fixtures/lrp_tiny/text.txt");
    s.eval(
        "setup",
        &format!(
            "let m = load_model({:?}, #{{device: \"cpu\"}}); let d = corpus({:?}).take(3);",
            m.display().to_string(),
            d.display().to_string()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    s
}

fn eval(s: &mut Session, code: &str) -> String {
    s.eval("case", code).unwrap_or_else(|e| panic!("{code}: {e}")).map(|o| o.text).unwrap_or_default()
}

/// Script code giving every kind's grid of a Grid expression as JSON.
fn grid(expr: &str) -> String {
    format!("{{ let g = {expr}; let v = []; for k in g.kinds {{ v.push(g[k]); }} #{{v: v}}.to_json() }}")
}

fn json(s: &mut Session, code: &str) -> serde_json::Value {
    let out = eval(s, code);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{code}: {e}: {out}"))
}

fn json_v(s: &mut Session, code: &str) -> serde_json::Value {
    json(s, code)["v"].clone()
}

/// Tiny decoder-only checkpoints with a BOS token (`<s>`, special): confidence's default is
/// `exclude_keys: "special"`, equal to asking for it, different from the old `"eos"`.
#[test]
fn decoder_only_confidence_leaves_the_bos_sink_out_by_default() {
    for model in ["llama", "qwen2", "gemma"] {
        let mut s = session(model);
        assert_eq!(eval(&mut s, "m.confidence(d).options.exclude_keys"), "special", "{model}");
        let default = json(&mut s, &grid("m.confidence(d)"));
        let special = json(&mut s, &grid("m.confidence(d, #{exclude_keys: \"special\"})"));
        let eos = json(&mut s, &grid("m.confidence(d, #{exclude_keys: \"eos\"})"));
        assert_eq!(default, special, "{model}: the default is exclude_keys \"special\"");
        assert_ne!(default, eos, "{model}: excluding the BOS key changes confidence");
        // The analysis pass echoes the same default.
        assert_eq!(eval(&mut s, "m.analyze(d, #{stats: [\"confidence\"]}).meta.exclude_keys"), "special", "{model}");
    }
}

/// Encoders and translation models keep the paper's default, `"eos"`.
#[test]
fn encoder_and_translation_defaults_are_unchanged() {
    for model in ["roberta", "marian"] {
        let mut s = session(model);
        assert_eq!(eval(&mut s, "m.confidence(d).options.exclude_keys"), "eos", "{model}");
        let default = json(&mut s, &grid("m.confidence(d)"));
        let eos = json(&mut s, &grid("m.confidence(d, #{exclude_keys: \"eos\"})"));
        assert_eq!(default, eos, "{model}");
        let none = json(&mut s, &grid("m.confidence(d, #{exclude_keys: \"none\"})"));
        assert_ne!(default, none, "{model}: EOS keys are left out by default");
        assert_eq!(eval(&mut s, "m.head_types(#{n: 2, len: 6, haystack: 8}).options.exclude_sink"), "false", "{model}");
        assert_eq!(eval(&mut s, "m.heads(\"enc\")[0].attention(\"the cat\").options.exclude_keys"), "none", "{model}");
    }
}

/// Head labels: a decoder-only model's default leaves the first position out of the other
/// types' scores and keeps sink heads apart (`.sinks`), equal to `exclude_sink: true`; the old
/// labels (sinks among them) are `exclude_sink: false`.
#[test]
fn decoder_only_head_types_keep_the_sink_apart_by_default() {
    let mut s = session("llama");
    let o = "n: 3, len: 8, haystack: 10, thresholds: #{sink: 0.0}";
    assert_eq!(eval(&mut s, &format!("m.head_types(#{{{o}}}).options.exclude_sink")), "true");
    let labels = |s: &mut Session, extra: &str| eval(s, &format!("m.head_types(#{{{o}{extra}}}).labels.to_string()"));
    let scores = |s: &mut Session, extra: &str| {
        json(s, &format!("#{{v: m.head_types(#{{{o}{extra}}})[\"induction\"][\"dec\"]}}.to_json()"))
    };
    assert_eq!(labels(&mut s, ""), labels(&mut s, ", exclude_sink: true"));
    assert_eq!(scores(&mut s, ""), scores(&mut s, ", exclude_sink: true"));
    assert_ne!(
        scores(&mut s, ""),
        scores(&mut s, ", exclude_sink: false"),
        "excluding the first key changes the induction scores"
    );
    // A sink threshold of 0 makes every head a sink: apart by default, labels with the old option.
    let heads = eval(&mut s, "m.heads(\"dec\").len()");
    assert_eq!(eval(&mut s, &format!("m.head_types(#{{{o}}}).sinks.len()")), heads);
    let types = json(&mut s, &format!("#{{v: m.head_types(#{{{o}}}).labels.column(\"types\")}}.to_json()"));
    assert!(types["v"].as_array().unwrap().iter().all(|t| !t.as_str().unwrap().contains("sink")), "{types}");
    assert_eq!(eval(&mut s, &format!("m.head_types(#{{{o}, exclude_sink: false}}).labels.len()")), heads);
    assert_eq!(eval(&mut s, &format!("type_of(m.head_types(#{{{o}, exclude_sink: false}}).sinks)")), "()");
    let bad = s.eval("case", "m.head_types(#{exclude_sink: \"yes\"})").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(bad.contains("head_types: option 'exclude_sink' must be true or false"), "{bad}");
}

/// The attention listing of a decoder-only model names, per query, the top key among the
/// non-special keys (checked against the weights), the BOS weight shown apart; the old listing
/// is `with_exclude_keys("none")`.
#[test]
fn decoder_only_attention_listing_keeps_the_bos_apart() {
    let mut s = session("llama");
    eval(&mut s, "let a = m.head(\"dec\", 1, 0).attention(\"the cat sat on the mat\");");
    assert_eq!(eval(&mut s, "a.options.exclude_keys"), "special");
    let keys: Vec<String> = serde_json::from_value(json_v(&mut s, "#{v: a.keys}.to_json()")).unwrap();
    let values: Vec<Vec<f64>> = serde_json::from_value(json_v(&mut s, "#{v: a.values}.to_json()")).unwrap();
    assert_eq!(keys[0], "<s>");
    // The listing writes tokens as a reader does (no tokenizer markers), as heatmaps label them.
    let keys = headscope::plot::reader_labels(&keys);
    let text = eval(&mut s, "a.to_string()");
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert!(text.lines().next().unwrap().contains("exclude_keys \"special\""), "{text}");
    assert_eq!(rows.len(), values.len(), "{text}");
    for (i, (row, w)) in rows.iter().zip(&values).enumerate() {
        if i == 0 {
            // The BOS query sees only itself: its own top key, nothing kept to list.
            assert!(row.contains(&format!("-> {:<12} {:.3}", keys[0], w[0])) && !row.contains('('), "{row:?}");
            continue;
        }
        let k = (1..w.len()).max_by(|&a, &b| w[a].total_cmp(&w[b])).unwrap();
        let want = format!("-> {:<12} {:.3}   ({} {:.3})", keys[k], w[k], keys[0], w[0]);
        assert!(row.contains(&want), "row {i}: {row:?} lacks {want:?}\n{text}");
    }
    let all = eval(&mut s, "a.with_exclude_keys(\"none\").to_string()");
    for (i, (row, w)) in all.lines().skip(1).zip(&values).enumerate() {
        let k = (0..w.len()).max_by(|&a, &b| w[a].total_cmp(&w[b])).unwrap();
        assert!(row.contains(&format!("-> {:<12} {:.3}", keys[k], w[k])) && !row.contains('('), "row {i}: {row:?}");
    }
    let bad = s.eval("case", "a.with_exclude_keys(\"bos\")").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(bad.contains("with_exclude_keys: unknown exclude_keys 'bos'"), "{bad}");
}

/// A long text's listing is a summary: 40 queries, then how many more and where the weights are.
#[test]
fn a_long_texts_attention_listing_stops_after_40_queries() {
    let mut s = session("llama");
    eval(&mut s, "let t = \"\"; for i in 0..30 { t += \"the cat sat \"; } let a = m.head(\"dec\", 0, 1).attention(t);");
    let n: usize = eval(&mut s, "a.queries.len()").parse().unwrap();
    assert!(n > 41, "{n} queries");
    let text = eval(&mut s, "a.to_string()");
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 41, "{text}");
    assert_eq!(
        rows[40].trim(),
        format!("... {} more queries (every weight: a.values[query][key], a.heatmap())", n - 40)
    );
}
