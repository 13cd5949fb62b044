//! Which positions AttnLRP seeds over a dataset (docs/methods.md#attnlrp): with `seed: "norm"`,
//! the real positions only (not special, not padding), as the other LRP rules seed them
//! (docs/methods.md#lrp-head-relevance): `[CLS]`/`[SEP]` are no predictions. So AttnLRP and the
//! ab rule count the same predictions, the number of non-special tokens of the data. (How each
//! seed propagates is checked against LXT in tests/attribution/attnlrp.rs.)

use crate::common::{self, root};

use headscope::engine::{Session, SessionOptions};

#[test]
fn norm_seeds_are_the_real_positions_only() {
    let bert = root().join("tests/fixtures/lrp_tiny/bert");
    let text = root().join("tests/fixtures/lrp_tiny/text.txt");
    let sentences: Vec<String> = std::fs::read_to_string(&text)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .map(String::from)
        .collect();
    assert_eq!(sentences.len(), 4);
    let m = common::load(&bert, "f32");
    let (mut real, mut special) = (0usize, 0usize);
    for s in &sentences {
        let e = m.tokenize(s).unwrap();
        real += e.special.iter().filter(|&&sp| !sp).count();
        special += e.special.iter().filter(|&&sp| sp).count();
    }
    assert!(special >= 2 * sentences.len(), "the tokenizer adds [CLS] and [SEP] ({special} special tokens)");

    let mut s = Session::new(SessionOptions::default());
    s.eval(
        "setup",
        &format!(
            "let m = load_model({:?}, #{{device: \"cpu\"}}); let d = corpus({:?}).take(4);",
            bert.display().to_string(),
            text.display().to_string()
        ),
    )
    .unwrap();
    let count = |s: &mut Session, code: &str| -> usize {
        s.eval("case", code).unwrap_or_else(|e| panic!("{code}: {e}")).unwrap().text.parse().unwrap()
    };
    let attnlrp = count(&mut s, "m.lrp(d, #{rule: \"attnlrp\", seed: \"norm\"}).options.predictions");
    let ab = count(&mut s, "m.lrp(d, #{rule: \"ab\", seed: \"norm\"}).options.predictions");
    assert_eq!(ab, real, "the ab rule's predictions are the real tokens");
    assert_eq!(
        attnlrp, real,
        "AttnLRP seeds {attnlrp} positions; the data has {real} real tokens and {special} special ones"
    );
    // Summed per sentence: one seed set per sentence either way.
    assert_eq!(
        count(&mut s, "m.lrp(d, #{rule: \"attnlrp\", seed: \"norm\", seeds: \"summed\"}).options.predictions"),
        sentences.len()
    );
}
