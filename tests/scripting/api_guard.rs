//! The library API (`src/api.rs`) under the fuzzer's hostile dictionary (src/engine/fuzz.rs):
//! every entry returns an error, never panics, and an error is one line that names the
//! function, for each hostile string (names, heads, texts, paths) and each hostile number in
//! each numeric field of the typed options: the values a script's option map cannot even
//! express (`usize::MAX`, NaN in a float field) included. A panic that got past a check would
//! come back as `FUNC: internal error: ...` from the API's guard; the test fails on it.

use crate::common;
use headscope::api::{self, corpus, AnalyzeOptions, LrpOptions, Model, PruneOptions, SweepOptions};

/// The dictionary's strings (fuzz.rs `hostile()`), as Rust strings.
fn strings() -> Vec<String> {
    vec![
        String::new(),
        "dec.99.0".into(),
        "enc.0.999".into(),
        "enc.-1.0".into(),
        "no such thing".into(),
        "ab".repeat(50_000),
        "\u{0}".into(),
        "/".into(),
        "../../../../etc/passwd".into(),
    ]
}

const FLOATS: &[f64] = &[0.0, -1.0, 1e300, 1e-300, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 9.2e18, 1e9];
const SIZES: &[usize] = &[0, 1_000_000_000, usize::MAX, i64::MAX as usize];

/// Checks one outcome: no panic escaped, and an error is one line naming the function.
fn check<T>(what: &str, func: &str, r: std::thread::Result<api::Result<T>>, tally: &mut (usize, usize)) {
    let r = r.unwrap_or_else(|_| panic!("{what}: a panic escaped the library API"));
    match r {
        Ok(_) => {
            tally.0 += 1;
            if std::env::var_os("HEADSCOPE_API_GUARD_VERBOSE").is_some() {
                println!("ok: {what}");
            }
        }
        Err(api::Error(e)) => {
            tally.1 += 1;
            assert!(!e.contains("internal error") && !e.contains("panicked"), "{what}: {e}");
            assert!(!e.contains('\n'), "{what}: not one line: {e}");
            assert!(e.contains(func), "{what}: the error does not name {func}: {e}");
        }
    }
}

fn run<T>(f: impl FnOnce() -> api::Result<T>) -> std::thread::Result<api::Result<T>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

#[test]
fn the_library_api_never_panics_on_the_hostile_dictionary() {
    let _lock = common::rng();
    let mut tally = (0usize, 0usize);
    let t = &mut tally;
    let m = Model::load("minilm").unwrap();
    let dec = Model::load(&common::tiny_hf_dir().join("llama").to_string_lossy()).unwrap();
    let d = corpus("assets/pud_en.txt").unwrap().take(2);

    for s in strings() {
        let short: String = s.chars().take(20).collect();
        check(&format!("load({short:?})"), "load_model", run(|| Model::load(&s)), t);
        check(&format!("corpus({short:?})"), "", run(|| corpus(&s)), t);
        check(&format!("treebank({short:?})"), "", run(|| api::treebank(&s)), t);
        check(&format!("head({short:?})"), "head", run(|| m.head(&s)), t);
        check(&format!("with_mask([{short:?}])"), "with_mask", run(|| m.with_mask(&[&s])), t);
        check(&format!("attention({short:?}, text)"), "attention", run(|| m.attention(&s, "The cat sleeps.")), t);
        check(&format!("attention(enc.0.0, {short:?})"), "attention", run(|| m.attention("enc.0.0", &s)), t);
        check(&format!("dec attention(dec.0.0, {short:?})"), "attention", run(|| dec.attention("dec.0.0", &s)), t);
        let a = m.analyze(&d, &AnalyzeOptions { stats: vec![api::Stat::Confidence], ..m.analyze_options(&d) }).unwrap();
        check(&format!("stat({short:?})"), "", run(|| a.stat(&s)), t);
    }

    for &x in FLOATS {
        type Set = fn(&mut AnalyzeOptions, f64);
        let fields: [(&str, Set); 3] = [
            ("positional_threshold", |o, x| o.positional_threshold = x),
            ("rare_threshold", |o, x| o.rare_threshold = x),
            ("margin", |o, x| o.margin = x),
        ];
        for (name, set) in fields {
            let mut o = m.analyze_options(&d);
            set(&mut o, x);
            check(&format!("analyze {name} = {x}"), "analyze", run(|| m.analyze(&d, &o)), t);
        }
        type PSet = fn(&mut PruneOptions, f64);
        let fields: [(&str, PSet); 8] = [
            ("lambda", |o, x| o.lambda = x),
            ("lr", |o, x| o.lr = x),
            ("target", |o, x| o.target = Some(x)),
            ("concrete.beta", |o, x| o.concrete.beta = x),
            ("concrete.l", |o, x| o.concrete.l = x),
            ("concrete.r", |o, x| o.concrete.r = x),
            ("concrete.eps", |o, x| o.concrete.eps = x),
            ("model_lr", |o, x| {
                o.joint = true;
                o.model_lr = x
            }),
        ];
        for (name, set) in fields {
            let mut o = PruneOptions { steps: 2, batch_tokens: 200, ..m.prune_options() };
            set(&mut o, x);
            let r = run(|| m.prune(&d, &o));
            if let Ok(Ok(p)) = &r {
                let la = &p.run.state.log_alpha;
                assert!(la.iter().all(|v| v.is_finite()), "prune {name} = {x}: gates not finite: {la:?}");
            }
            check(&format!("prune {name} = {x}"), "prune", r, t);
        }
    }

    for &n in SIZES {
        let mut o = m.analyze_options(&d);
        o.batch_tokens = n;
        check(&format!("analyze batch_tokens = {n}"), "analyze", run(|| m.analyze(&d, &o)), t);
        let mut o = m.analyze_options(&d);
        o.rare_top_n = n;
        check(&format!("analyze rare_top_n = {n}"), "analyze", run(|| m.analyze(&d, &o)), t);
        let o = SweepOptions { batch_tokens: n, ..Default::default() };
        check(&format!("ablation_sweep batch_tokens = {n}"), "ablation_sweep", run(|| m.ablation_sweep(&d, &o)), t);
        let o = SweepOptions { mean_batch_tokens: n, ablation: api::Ablation::Mean, ..Default::default() };
        check(
            &format!("ablation_sweep mean_batch_tokens = {n}"),
            "ablation_sweep",
            run(|| dec.ablation_sweep(&d, &o)),
            t,
        );
        let o = LrpOptions { batch_tokens: n, ..Default::default() };
        check(&format!("lrp batch_tokens = {n}"), "lrp", run(|| m.lrp(&d, &o)), t);
        let o = PruneOptions { steps: 2, batch_tokens: n, ..m.prune_options() };
        check(&format!("prune batch_tokens = {n}"), "prune", run(|| m.prune(&d, &o)), t);
        let o = PruneOptions { steps: 2, batch_tokens: 200, eval_every: n, ..m.prune_options() };
        check(&format!("prune eval_every = {n}"), "prune", run(|| m.prune(&d, &o)), t);
        let o = PruneOptions { steps: 2, batch_tokens: 200, seed: n as u64, ..m.prune_options() };
        check(&format!("prune seed = {n}"), "prune", run(|| m.prune(&d, &o)), t);
        let g = m.confidence(&d).unwrap();
        check(&format!("top_table({n})"), "top", run(|| g.top_table(n)), t);
    }
    // An empty dataset everywhere.
    let empty = d.take(0);
    check("analyze on no sentences", "analyze", run(|| m.analyze(&empty, &m.analyze_options(&empty))), t);
    check(
        "ablation_sweep on no sentences",
        "ablation_sweep",
        run(|| m.ablation_sweep(&empty, &SweepOptions::default())),
        t,
    );
    check("lrp on no sentences", "lrp", run(|| m.lrp(&empty, &LrpOptions::default())), t);
    let o = PruneOptions { steps: 0, ..m.prune_options() };
    check("prune with steps 0", "prune", run(|| m.prune(&d, &o)), t);
    check("prune on no sentences", "prune", run(|| m.prune(&empty, &m.prune_options())), t);
    println!(
        "library API under the hostile dictionary: {} calls returned, {} refused in one line, no panic",
        tally.0, tally.1
    );
    assert!(tally.1 > 50, "too few refusals: the cases did not reach the checks ({tally:?})");
}
