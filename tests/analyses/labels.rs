//! Tokens with non-ASCII characters read as typed (`crates/core/src/model/tokenize/readable.rs`):
//! curly quotes, accents, CJK and an emoji in the attention listing, a table (the per-token
//! loss), a heatmap's labels (its SVG) and the head view (its HTML), on a byte-level BPE model
//! (SmolLM2, whose `“` is the token `âĢľ`) and a sentencepiece model (Gemma 3); no raw byte
//! characters left, and a character split over tokens shows on the token that completes it.

use headscope::engine::{Session, SessionOptions};

const TEXT: &str = "“Café” naïve 日本 🙂";
const SHOWN: [&str; 6] = ["“", "”", "é", "ï", "日", "🙂"];
/// How byte-level BPE writes `“`, `é` and `🙂`'s first bytes, and a byte-fallback piece.
const RAW: [&str; 4] = ["âĢ", "Ã©", "ðŁ", "<0x"];

fn eval(s: &mut Session, code: &str) -> String {
    s.eval("case", code).unwrap_or_else(|e| panic!("{code}: {e}")).map(|o| o.text).unwrap_or_default()
}

fn check(model: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (svg, html) = (dir.path().join("a.svg"), dir.path().join("v.html"));
    let mut s = Session::new(SessionOptions::default());
    eval(&mut s, &format!("let m = load_model({model:?}); let text = {TEXT:?}; let h = m.heads(\"dec\")[0];"));
    let listing = eval(&mut s, "m.attention(h, text)");
    let table = eval(&mut s, "m.loss(text, #{per_token: true})");
    eval(&mut s, &format!("m.attention(h, text).heatmap().save({:?});", svg.display().to_string()));
    eval(&mut s, &format!("m.view(text).to_html({:?});", html.display().to_string()));
    let shown = [
        ("listing", listing),
        ("table", table),
        ("heatmap", std::fs::read_to_string(&svg).unwrap()),
        ("head view", std::fs::read_to_string(&html).unwrap()),
    ];
    for (what, text) in &shown {
        for c in SHOWN {
            assert!(text.contains(c), "{model}, {what}: {c} is not shown:\n{}", &text[..text.len().min(3000)]);
        }
        for raw in RAW {
            assert!(!text.contains(raw), "{model}, {what}: raw bytes {raw} shown");
        }
    }
    // The head view shows no tokenizer markers either (as the heatmaps).
    let (_, view) = &shown[3];
    assert!(!view.contains("\"Ġ") && !view.contains("\"▁"), "{model}: markers in the head view's tokens");
}

#[test]
fn non_ascii_tokens_read_as_typed_on_byte_level_bpe() {
    check("smollm2");
    // A character split over three tokens (SmolLM2 has `日` in no single token): the first two
    // show `⋯`, the third the character.
    let mut s = Session::new(SessionOptions::default());
    let t = eval(&mut s, "load_model(\"smollm2\").tokenize(\" 日\")");
    assert_eq!(t, r#"["<|im_start|>", "Ġ⋯", "⋯", "日"]"#);
}

#[test]
fn non_ascii_tokens_read_as_typed_on_sentencepiece() {
    check("gemma3");
}
