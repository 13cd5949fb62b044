//! A hybrid stack through the script API (issue 49).

use headscope::engine::{Session, SessionOptions};

/// A hybrid stack as a user meets it (issue 49): the analyses run over its attention layers, and
/// its conv layers read as absent heads: NaN rows in grids, no gates to prune (the count of
/// heads open is over the attention layers' 8), an error naming the layer's mixer for a head
/// named there, and the head view as wide as the attention layers.
#[test]
fn a_hybrid_reads_its_conv_layers_as_absent_heads() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Session::new(SessionOptions { base_dir: dir.path().to_path_buf(), ..Default::default() });
    let script = format!(
        r#"
        let m = load_model("{}/tests/fixtures/tiny_hf/lfm2");
        let d = corpus(["the cat sat on the mat", "a dog ran in the park and sat down"]);
        let c = m.confidence(d).dec;
        assert(c.len() == 4 && c[0].len() == 4 && c[1].len() == 4);
        for h in 0..4 {{ assert(c[0][h].is_nan() && c[2][h].is_nan() && !c[1][h].is_nan() && !c[3][h].is_nan()); }}
        let sweep = m.ablation_sweep(d).dec;
        for h in 0..4 {{ assert(sweep[0][h].is_nan() && !sweep[1][h].is_nan()); }}
        let r = m.prune(d, #{{steps: 2, batch_tokens: 200}});
        assert(r.to_string().contains(" of 8 heads open"));
        for h in r.retained {{ let l = parse_int(`${{h}}`.split(".")[1]); assert(l == 1 || l == 3); }}
        let e = "";
        try {{ m.with_mask(["dec.2.1"]); }} catch (err) {{ e = `${{err}}`; }}
        assert(e.contains("layer 2 of lfm2 is a 'shortconv' layer"));
        assert(m.view("the cat sat").to_string().contains("dec 4 layers x 4 heads"));
        "#,
        env!("CARGO_MANIFEST_DIR")
    );
    let out = s.eval("hybrid", &script);
    assert!(out.is_ok(), "{:?}", out.err().map(|e| e.to_string()));
}
