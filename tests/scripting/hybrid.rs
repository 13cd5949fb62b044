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

/// Granite-4.0-H's Mamba-2 layers through the script API (issue 49): their heads are units as
/// attention heads are (rows of 8 in the confidence and sweep grids, where the attention layers
/// have 4 and 4 absent), L0 pruning gates all 24, a Mamba-2 head masks, `prune_heads` refuses to
/// remove one from the weights (saying to mask it), a head past an attention layer's 4 is named
/// absent with the layer's mixer, and AttnLRP runs over both kinds with its conservation error
/// printed by the test.
#[test]
fn a_mamba2_hybrid_reads_its_ssm_heads_as_heads() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Session::new(SessionOptions { base_dir: dir.path().to_path_buf(), ..Default::default() });
    let script = format!(
        r#"
        let m = load_model("{}/tests/fixtures/tiny_hf/granite_h");
        let d = corpus(["the cat sat on the mat", "a dog ran in the park and sat down"]);
        let c = m.confidence(d).dec;
        assert(c.len() == 4 && c[0].len() == 8);
        for h in 0..8 {{ assert(!c[0][h].is_nan() && !c[2][h].is_nan()); }}
        for h in 0..4 {{ assert(!c[1][h].is_nan() && c[1][h + 4].is_nan()); }}
        let sweep = m.ablation_sweep(d).dec;
        for h in 0..4 {{ assert(!sweep[0][h].is_nan() && !sweep[1][h].is_nan() && sweep[3][h + 4].is_nan()); }}
        let r = m.prune(d, #{{steps: 2, batch_tokens: 200}});
        assert(r.to_string().contains(" of 24 heads open"));
        let v = m.with_mask(["dec.0.3", "dec.2.7"]);
        assert(v.loss(d) != m.loss(d));
        let e = "";
        try {{ m.prune_heads(["dec.0.3"]); }} catch (err) {{ e = `${{err}}`; }}
        assert(e.contains("Mamba-2") && e.contains("mask"));
        e = "";
        try {{ m.with_mask(["dec.1.5"]); }} catch (err) {{ e = `${{err}}`; }}
        assert(e.contains("layer 1 of granite_h is an 'attention' layer with 4 heads"));
        e = "";
        try {{ m.with_streaming(["dec.0.1"]); }} catch (err) {{ e = `${{err}}`; }}
        assert(e.contains("'mamba2' head") && e.contains("only attention heads stream"));
        let l = m.lrp(d, #{{rule: "attnlrp", seeds: "summed"}});
        print(`AttnLRP conservation error ${{l.options.max_conservation_error}}`);
        assert(l.options.max_conservation_error < 0.5);
        "#,
        env!("CARGO_MANIFEST_DIR")
    );
    let out = s.eval("mamba2", &script);
    assert!(out.is_ok(), "{:?}", out.err().map(|e| e.to_string()));
}

/// Qwen3-Next's gated DeltaNet layers through the script API (issue 49): their heads are units
/// as attention heads are (rows of 4 in the confidence and sweep grids, beside the gated
/// attention layers' 4), L0 pruning gates all 16, a DeltaNet head masks, `prune_heads` refuses
/// to remove one from the weights (saying to mask it) and removes an attention head of the
/// layer whose key/value heads are its own, the head view reads every layer, and AttnLRP runs
/// over both kinds with its conservation error printed by the test.
#[test]
fn a_deltanet_hybrid_reads_its_linear_heads_as_heads() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Session::new(SessionOptions { base_dir: dir.path().to_path_buf(), ..Default::default() });
    let script = format!(
        r#"
        let m = load_model("{}/tests/fixtures/tiny_hf/qwen3_next_moe");
        let d = corpus(["the cat sat on the mat", "a dog ran in the park and sat down"]);
        let c = m.confidence(d).dec;
        assert(c.len() == 4 && c[0].len() == 4);
        for l in 0..4 {{ for h in 0..4 {{ assert(!c[l][h].is_nan()); }} }}
        let sweep = m.ablation_sweep(d).dec;
        for l in 0..4 {{ for h in 0..4 {{ assert(!sweep[l][h].is_nan()); }} }}
        let r = m.prune(d, #{{steps: 2, batch_tokens: 200}});
        assert(r.to_string().contains(" of 16 heads open"));
        let v = m.with_mask(["dec.1.3", "dec.2.0"]);
        assert(v.loss(d) != m.loss(d));
        let e = "";
        try {{ m.prune_heads(["dec.1.3"]); }} catch (err) {{ e = `${{err}}`; }}
        assert(e.contains("DeltaNet") && e.contains("mask"));
        let p = m.prune_heads(["dec.0.1"]);
        assert(p.loss(d) == m.with_mask(["dec.0.1"]).loss(d));
        assert(m.view("the cat sat").to_string().contains("dec 4 layers x 4 heads"));
        let l = m.lrp(d, #{{rule: "attnlrp", seeds: "summed"}});
        print(`AttnLRP conservation error ${{l.options.max_conservation_error}}`);
        assert(l.options.max_conservation_error < 0.5);
        "#,
        env!("CARGO_MANIFEST_DIR")
    );
    let out = s.eval("deltanet", &script);
    assert!(out.is_ok(), "{:?}", out.err().map(|e| e.to_string()));
}

/// Jamba's Mamba layers through the script API (issue 49): their channel groups are units as
/// heads are (rows of 4 in the confidence and sweep grids beside the attention layers' 4), a
/// group masks, `prune_heads` refuses to remove one (saying to mask it), and AttnLRP runs over
/// both kinds.
#[test]
fn a_mamba_hybrid_reads_its_channel_groups_as_heads() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Session::new(SessionOptions { base_dir: dir.path().to_path_buf(), ..Default::default() });
    let script = format!(
        r#"
        let m = load_model("{}/tests/fixtures/tiny_hf/jamba_moe");
        let d = corpus(["the cat sat on the mat", "a dog ran in the park and sat down"]);
        let c = m.confidence(d).dec;
        assert(c.len() == 4 && c[1].len() == 4);
        for l in 0..4 {{ for h in 0..4 {{ assert(!c[l][h].is_nan()); }} }}
        let sweep = m.ablation_sweep(d).dec;
        for l in 0..4 {{ for h in 0..4 {{ assert(!sweep[l][h].is_nan()); }} }}
        let v = m.with_mask(["dec.1.3", "dec.2.0"]);
        assert(v.loss(d) != m.loss(d));
        let e = "";
        try {{ m.prune_heads(["dec.1.3"]); }} catch (err) {{ e = `${{err}}`; }}
        assert(e.contains("Mamba") && e.contains("mask"));
        let l = m.lrp(d, #{{rule: "attnlrp", seeds: "summed"}});
        assert(l.options.max_conservation_error < 0.5);
        "#,
        env!("CARGO_MANIFEST_DIR")
    );
    let out = s.eval("mamba", &script);
    assert!(out.is_ok(), "{:?}", out.err().map(|e| e.to_string()));
}
