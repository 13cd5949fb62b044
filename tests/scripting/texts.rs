//! Text wherever text makes sense (issue #30): a string, an array of strings, a dataset row
//! or an array of rows is accepted wherever a dataset is (and `corpus([...])` names one), with
//! the same results as the corpus of those sentences read from a file; rows work where one
//! text is taken (`translate`, `attention`, `generate`); mistakes are one-line errors.

use headscope::engine::{Session, SessionOptions};

fn session(dir: &std::path::Path) -> Session {
    Session::new(SessionOptions { base_dir: dir.to_path_buf(), ..Default::default() })
}

#[test]
fn texts_arrays_and_rows_work_wherever_a_dataset_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = session(dir.path());
    let script = format!(
        r#"
        let f = "{}/two.txt";
        write_text(f, "a b c d\ne f g\n");
        let m = load_model("{}/tests/fixtures/tiny_hf/gpt2");
        let d = corpus(f);
        let texts = ["a b c d", "e f g"];
        let rows = [d[0], d[1]];
        // The same sentences as a file's corpus, an array of texts, an array of rows, corpus([...]).
        let want = m.confidence(d).dec;
        assert(m.confidence(texts).dec == want);
        assert(m.confidence(rows).dec == want);
        assert(m.confidence(corpus(texts)).dec == want);
        let sweep = m.ablation_sweep(d).dec;
        assert(m.ablation_sweep(texts).dec == sweep);
        // One text or one row is a one-sentence corpus.
        assert(m.confidence("a b c d").dec == m.confidence(d.take(1)).dec);
        assert(m.confidence(d[0]).dec == m.confidence(d.take(1)).dec);
        assert(m.analyze(texts).sentences == 2);
        // Where one text is taken, a row works too.
        assert(m.generate(d[0], 3) == m.generate("a b c d", 3));
        assert(m.head("dec", 1, 2).attention(d[0]).values == m.head("dec", 1, 2).attention("a b c d").values);
        let t = load_model("enpt");
        let tb = treebank(asset("pud_en.conllu"));
        assert(t.translate(tb[0]) == t.translate(tb[0].text));
        assert(type_of(t.translate([tb[0], tb[1]])) == "array");
        assert(t.attention("cross.1.3", tb[1]).keys == t.attention("cross.1.3", tb[1].text).keys);
        "#,
        dir.path().display(),
        env!("CARGO_MANIFEST_DIR")
    );
    s.eval("texts", &script).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn mistakes_with_texts_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("two.txt"), "a b\n").unwrap();
    let cases = [
        ("m.confidence(\"\")", "confidence: the text is empty: there is nothing to run the model on"),
        ("m.confidence([])", "confidence: no sentences given (an empty array)"),
        ("m.confidence([\"a b\", 3])", "confidence: expected a Dataset (corpus, parallel or treebank), a text, an array of texts or dataset rows, got 3"),
        ("m.confidence([\"a b\", \" \"])", "confidence: sentence 1 is empty"),
        ("m.confidence(#{txt: \"a b\"})", "confidence: a dataset row needs a string `text`"),
        ("m.confidence(#{text: \"a b\", target: 5})", "confidence: a dataset row's `target` must be a string, got 5"),
        ("m.analyze(\"two.txt\")", "analyze: \"two.txt\" looks like a file name, not a text: read the file with corpus(\"two.txt\")"),
        ("m.ablation_sweep(\"corpus.conllu\")", "ablation_sweep: \"corpus.conllu\" looks like a file name"),
        ("corpus([])", "corpus: no sentences given (an empty array)"),
        ("m.generate(#{text: \"\"}, 2)", "generate: the text is empty"),
        ("m.head(\"dec\", 0, 0).attention(#{words: 1})", "attention: a dataset row needs a string `text`"),
    ];
    let mut s = session(dir.path());
    s.eval("setup", &format!("let m = load_model(\"{}/tests/fixtures/tiny_hf/gpt2\");", env!("CARGO_MANIFEST_DIR")))
        .unwrap();
    for (code, want) in cases {
        let e = s.eval("case", code).err().unwrap_or_else(|| panic!("{code} should fail")).to_string();
        assert!(e.contains(want), "{code}:\n  got  {e}\n  want {want}");
        assert_eq!(
            e.trim_end().lines().next().map(|l| l.contains(want)),
            Some(true),
            "{code}: the message is not on the first line: {e}"
        );
    }
}
