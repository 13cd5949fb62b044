//! Each type's `evcxr_display` writes evcxr's content markers with the right MIME types:
//! tables and analyses as HTML, plots, grids and attention maps as PNG and SVG, always a
//! text/plain fallback; blocks are well formed and the PNG decodes.

use crate::common;

use base64::Engine as _;
use headscope::api::{corpus, AnalyzeOptions, Model, PruneOptions, Stat};

/// The (mime, body) blocks of evcxr content, checking the markers pair up.
fn blocks(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(String, Vec<&str>)> = None;
    for line in s.lines() {
        if let Some(mime) = line.strip_prefix("EVCXR_BEGIN_CONTENT ") {
            assert!(cur.is_none(), "nested BEGIN in:\n{s}");
            cur = Some((mime.to_string(), vec![]));
        } else if line == "EVCXR_END_CONTENT" {
            let (m, body) = cur.take().expect("END without BEGIN");
            out.push((m, body.join("\n")));
        } else {
            cur.as_mut().expect("text outside a block").1.push(line);
        }
    }
    assert!(cur.is_none(), "unterminated block");
    out
}

fn mimes(s: &str) -> Vec<String> {
    blocks(s).into_iter().map(|(m, _)| m).collect()
}

#[test]
fn every_type_writes_its_mime_types() {
    let _rng = common::rng();
    let m = Model::load("minilm").unwrap();
    let d = corpus("assets/pud_en.txt").unwrap().take(3);
    let a = m
        .analyze(&d, &AnalyzeOptions { stats: vec![Stat::Confidence, Stat::Positional], ..m.analyze_options(&d) })
        .unwrap();
    let g = a.stat("confidence").unwrap();
    let t = g.table();
    let p = g.heatmap(headscope::api::Kind::Enc).unwrap();
    let att = m.attention("enc.0.0", "The cat sleeps.").unwrap();
    let r = m.prune(&d, &PruneOptions { steps: 1, batch_tokens: 300, ..m.prune_options() }).unwrap();

    assert_eq!(mimes(&t.evcxr_content()), ["text/html", "text/plain"]);
    assert_eq!(mimes(&a.evcxr_content()), ["text/html", "text/plain"]);
    assert_eq!(mimes(&p.evcxr_content()), ["image/png", "image/svg+xml", "text/plain"]);
    assert_eq!(mimes(&att.evcxr_content()), ["image/png", "image/svg+xml", "text/plain"]);
    let gm = mimes(&g.evcxr_content());
    assert!(gm.contains(&"image/png".to_string()) && gm.last().map(String::as_str) == Some("text/plain"), "{gm:?}");
    assert_eq!(mimes(&r.evcxr_content()).last().map(String::as_str), Some("text/plain"));
    assert_eq!(mimes(&m.evcxr_content()), ["text/plain"]);

    // The bodies are what the MIME type says.
    let b = blocks(&p.evcxr_content());
    let png = base64::engine::general_purpose::STANDARD.decode(&b[0].1).expect("base64 PNG");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(b[1].1.starts_with("<svg") || b[1].1.starts_with("<?xml"), "{}", &b[1].1[..40]);
    assert!(blocks(&t.evcxr_content())[0].1.contains("<table"));
    assert!(blocks(&g.evcxr_content()).last().unwrap().1.contains("enc.5"));
}
