//! Options are declared once (docs/methods.md, ARCHITECTURE.md "A function's options are
//! declared once"): every function that takes `kinds` parses it through one function whose
//! errors name the function the user called; the free `bleu(hyps, refs, #{...})` and the method
//! `m.bleu(data, #{...})` check maps against their own lists; and the options a result echoes
//! when none were given are the defaults of the function's `OptSpec` list, so a default
//! changed there is the one the code runs with.

use crate::common::{self, root};

use headscope::engine::registry::{options_of, options_of_call};
use headscope::engine::{Session, SessionOptions};

/// A session with `m` (a tiny checkpoint) and `d` (a few sentences) defined.
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

fn error_of(s: &mut Session, code: &str) -> String {
    match s.eval("case", code) {
        Ok(v) => panic!("{code}: expected an error, got {:?}", v.map(|o| o.text)),
        Err(e) => e.message,
    }
}

#[test]
fn a_bad_kinds_option_names_the_function_called() {
    let _rng = common::rng();
    let mut s = session("gpt2");
    // Each function that takes `kinds`, called with the option map `OPTS`.
    let calls: &[(&str, &str)] = &[
        ("analyze", "m.analyze(d, OPTS)"),
        ("ablate", "m.ablate(d, [], OPTS)"),
        ("ablation_sweep", "m.ablation_sweep(d, OPTS)"),
        ("head_importance", "m.head_importance(d, OPTS)"),
        ("diversity", "m.diversity(d, OPTS)"),
        ("prune", "m.prune(d, OPTS)"),
    ];
    // A bad `kinds` and what follows the function's name in the error.
    let bad: &[(&str, &str)] = &[
        ("#{kinds: 3}", "option 'kinds' must be an array of strings, got 3 (i64)"),
        // One string is read as an array of it, with the same checks.
        (
            "#{kinds: \"encoder\"}",
            "option 'kinds': unknown attention kind 'encoder' (expected \"enc\", \"dec\" or \"cross\")",
        ),
        ("#{kinds: [1]}", "option 'kinds'[0] must be a string, got 1 (i64)"),
        (
            "#{kinds: [\"encoder\"]}",
            "option 'kinds': unknown attention kind 'encoder' (expected \"enc\", \"dec\" or \"cross\")",
        ),
        ("#{kinds: [\"cross\"]}", "gpt2 has no 'cross' attention (it has: dec)"),
    ];
    let mut wrong = Vec::new();
    for (func, call) in calls {
        for (opts, rest) in bad {
            let code = call.replace("OPTS", opts);
            let e = error_of(&mut s, &code);
            let want = format!("{func}: {rest}");
            if e != want {
                wrong.push(format!("{code}\n  want: {want}\n  got:  {e}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The session goes on.
    assert_eq!(s.eval("after", "40 + 2").unwrap().unwrap().text, "42");
}

#[test]
fn the_two_bleu_forms_have_their_own_options() {
    let _rng = common::rng();
    let free = options_of("bleu").unwrap();
    let method = options_of_call("bleu", Some("Model")).unwrap();
    let names = |o: &[headscope::script::convert::OptSpec]| o.iter().map(|o| o.name).collect::<Vec<_>>();
    assert_eq!(names(free), ["shard"]);
    assert_eq!(names(method), ["batch_tokens", "shard", "tgt_lang"]);
    assert_eq!(options_of_call("bleu", Some("")).map(names), Some(names(method)), "a method call of unknown type");
    let mut s = session("gpt2");
    // The free form refuses the method's batch_tokens; each lists its own options.
    assert_eq!(
        error_of(&mut s, "bleu([\"a b c\"], [\"a b c\"], #{batch_tokens: 64})"),
        "bleu: unknown option 'batch_tokens' (valid options: shard)"
    );
    assert_eq!(
        error_of(&mut s, "m.bleu(d, #{lines: 2})"),
        "bleu: unknown option 'lines' (valid options: batch_tokens, shard, tgt_lang)"
    );
    assert_eq!(
        error_of(&mut s, "bleu([\"a b c\"], [\"a b c\"], #{lines: 2})"),
        "bleu: unknown option 'lines' (valid options: shard)"
    );
    // Completion offers each form's list.
    let offered = |s: &Session, code: &str| {
        s.complete(code, code.len()).candidates.into_iter().map(|c| c.display).collect::<Vec<_>>()
    };
    assert_eq!(offered(&s, "bleu(h, r, #{"), ["shard"]);
    assert_eq!(offered(&s, "m.bleu(d, #{"), ["batch_tokens", "shard", "tgt_lang"]);
    // `:help bleu` (Shift-Tab) shows the two lists, each under the form it belongs to.
    let help = s.inspect("bleu", 2).unwrap();
    let free_at = help.find("Options of bleu (name, default, meaning):").unwrap_or_else(|| panic!("{help}"));
    let method_at = help.find("Options of Model.bleu (name, default, meaning):").unwrap_or_else(|| panic!("{help}"));
    let section = |from: usize| help[from..].split("\n\n").next().unwrap().to_string();
    assert!(!section(free_at).contains("batch_tokens") && section(method_at).contains("batch_tokens  "), "{help}");
}

/// The echoed options of a result called without options, against the defaults of the
/// function's option list: every option the result echoes and the list gives a fixed default
/// must equal it.
#[test]
fn echoed_options_are_the_defaults_of_the_option_list() {
    let _rng = common::rng();
    let freq = root().join("tests/fixtures/lrp_tiny/text.txt").display().to_string();
    // (model, function, its options as the registry finds them, code giving the echo as JSON,
    // the options that must be compared)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, String, &'a [&'a str]);
    let cases: Vec<Case> = vec![
        (
            "gpt2",
            "analyze",
            Some("Model"),
            format!("m.analyze(d, #{{freq: {freq:?}}}).meta.to_json()"),
            &["batch_tokens", "positional_threshold", "rare_top_n", "rare_threshold"],
        ),
        ("gpt2", "ablate", Some("Model"), "m.ablate(d, []).to_json()".into(), &["batch_tokens"]),
        ("gpt2", "ablation_sweep", Some("Model"), "m.ablation_sweep(d).options.to_json()".into(), &["batch_tokens"]),
        (
            "gpt2",
            "head_importance",
            Some("Model"),
            "m.head_importance(d).options.to_json()".into(),
            &["metric", "normalize", "batch_tokens"],
        ),
        ("gpt2", "lrp", Some("Model"), "m.lrp(d).options.to_json()".into(), &["rule", "seeds"]),
        (
            "gpt2",
            "head_types",
            Some("Model"),
            "m.head_types().probe.to_json()".into(),
            &["seed", "n", "len", "needle", "haystack"],
        ),
        (
            "gpt2",
            "prune",
            Some("Model"),
            "m.prune(d, #{steps: 1}).options.to_json()".into(),
            &[
                "lambda",
                "lr",
                "model_lr",
                "batch_tokens",
                "joint",
                "seed",
                "eval_every",
                "beta",
                "penalty_scale",
                "distill",
                "eval_gates",
            ],
        ),
    ];
    let mut wrong = Vec::new();
    for (model, func, receiver, code, must) in &cases {
        let mut s = session(model);
        let out = s.eval("case", code).unwrap_or_else(|e| panic!("{code}: {e}")).unwrap().text;
        let echo: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{code}: {e}: {out}"));
        let specs = options_of_call(func, *receiver).unwrap_or_else(|| panic!("{func} has no option list"));
        for name in *must {
            let spec = specs.iter().find(|o| o.name == *name).unwrap_or_else(|| panic!("{func}: no option '{name}'"));
            let want = spec.default.json().unwrap_or_else(|| panic!("{func}: '{name}' has no fixed default"));
            let got = &echo[*name];
            let same = match (want.as_f64(), got.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => &want == got,
            };
            if !same {
                wrong.push(format!("{func}: option '{name}': the list says {want}, the result echoes {got}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The defaults that depend on another option or on the model: LRP's `batch_tokens` follows
/// `seeds`, and the Rust API's option structs start from the same lists.
#[test]
fn dependent_defaults_and_the_rust_api_follow_the_lists() {
    let _rng = common::rng();
    let mut s = session("gpt2");
    let bt = |s: &mut Session, code: &str| s.eval("case", code).unwrap_or_else(|e| panic!("{code}: {e}")).unwrap().text;
    assert_eq!(bt(&mut s, "m.lrp(d).options.batch_tokens"), "64");
    assert_eq!(bt(&mut s, "m.lrp(d, #{seeds: \"summed\"}).options.batch_tokens"), "256");
    let lrp = options_of("lrp").unwrap().iter().find(|o| o.name == "batch_tokens").unwrap();
    assert_eq!(lrp.default.to_string(), "64 (seeds \"each\"), 256 (seeds \"summed\")");

    use headscope::analysis::options::{Options, Stat};
    use headscope::model::Kind;
    let o = Options::new(vec![Stat::Syntactic], vec![Kind::Enc], "brown.txt".into());
    let echo: serde_json::Map<String, serde_json::Value> = o.echo().into_iter().collect();
    for spec in options_of("analyze").unwrap() {
        if let (Some(want), Some(got)) = (spec.default.json(), echo.get(spec.name)) {
            assert_eq!(
                want.as_f64().map_or(want.clone(), |x| serde_json::json!(x)),
                got.as_f64().map_or(got.clone(), |x| serde_json::json!(x)),
                "analyze: '{}'",
                spec.name
            );
        }
    }
    assert!(echo.contains_key("relations") && echo.contains_key("margin") && echo.contains_key("subtypes"));
    let p = headscope::prune::PruneOptions::new(vec![Kind::Enc]);
    let echo: serde_json::Map<String, serde_json::Value> = p.echo().into_iter().collect();
    let mut compared = 0;
    // `init` echoes the distribution it draws from ("uniform(-0.61, 0.61)"), not its name.
    for spec in options_of("prune").unwrap().iter().filter(|o| o.name != "init") {
        if let (Some(want), Some(got)) = (spec.default.json(), echo.get(spec.name)) {
            assert_eq!(
                want.as_f64().map_or(want.clone(), |x| serde_json::json!(x)),
                got.as_f64().map_or(got.clone(), |x| serde_json::json!(x)),
                "prune: '{}'",
                spec.name
            );
            compared += 1;
        }
    }
    assert!(compared >= 11, "compared {compared} prune options");
}

/// The library API's option structs start where a script without options starts: a result
/// echoes the same options whether `m.lrp(d)` ran in a script or
/// `Model::lrp(&d, &LrpOptions::default())` in Rust; likewise the sweep, `analyze` (the
/// frequency corpus given to both: tokenizing the Brown corpus is slow), `prune` (one step
/// given to both), and the device and precision `load_model` picks.
#[test]
fn the_rust_api_defaults_are_a_scripts() {
    use headscope::api::{self, AnalyzeOptions, FreqSource, LrpOptions, PruneOptions, SweepOptions};
    let _rng = common::rng();
    let dir = root().join("tests/fixtures/tiny_hf/gpt2");
    let text = root().join("tests/fixtures/lrp_tiny/text.txt");
    let freq = text.display().to_string();
    let mut s = session("gpt2");
    // The script's model is loaded on the CPU (`session`); so is the API's.
    let m = api::Model::load_with(
        &dir.display().to_string(),
        &api::LoadOptions { device: api::Device::Cpu, ..Default::default() },
    )
    .unwrap();
    let d = api::corpus(&text).unwrap().take(3);
    // Numbers compared as numbers (a script's map writes `1.0` where Rust echoes `1`).
    fn norm(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Number(n) => serde_json::json!(n.as_f64()),
            serde_json::Value::Array(a) => a.into_iter().map(norm).collect(),
            serde_json::Value::Object(o) => o.into_iter().map(|(k, v)| (k, norm(v))).collect(),
            other => other,
        }
    }
    let script = |s: &mut Session, code: &str| -> serde_json::Map<String, serde_json::Value> {
        let out = s.eval("case", code).unwrap_or_else(|e| panic!("{code}: {e}")).unwrap().text;
        match norm(serde_json::from_str(&out).unwrap_or_else(|e| panic!("{code}: {e}: {out}"))) {
            serde_json::Value::Object(o) => o,
            other => panic!("{code}: not a map: {other}"),
        }
    };
    let rust = |echo: &headscope::output::Echo| {
        echo.iter().map(|(k, v)| (k.clone(), norm(v.clone()))).collect::<serde_json::Map<_, _>>()
    };

    let lrp = m.lrp(&d, &LrpOptions::default()).unwrap();
    assert_eq!(script(&mut s, "m.lrp(d).options.to_json()"), rust(&lrp.options), "lrp");
    let summed = m.lrp(&d, &LrpOptions::summed()).unwrap();
    assert_eq!(
        script(&mut s, "m.lrp(d, #{seeds: \"summed\"}).options.to_json()"),
        rust(&summed.options),
        "lrp, seeds summed"
    );

    let sweep = m.ablation_sweep(&d, &SweepOptions::default()).unwrap();
    assert_eq!(script(&mut s, "m.ablation_sweep(d).options.to_json()"), rust(&sweep.options), "ablation_sweep");

    let a = m.analyze(&d, &AnalyzeOptions { freq: FreqSource::Text(text.clone()), ..m.analyze_options(&d) }).unwrap();
    let meta = script(&mut s, &format!("m.analyze(d, #{{freq: {freq:?}}}).meta.to_json()"));
    let want = rust(&a.0.options);
    assert!(want.contains_key("rare_top_n") && want.contains_key("freq"), "{want:?}");
    for (k, v) in &want {
        assert_eq!(meta.get(k), Some(v), "analyze: option '{k}'");
    }

    let p = m.prune(&d, &PruneOptions { steps: 1, ..m.prune_options() }).unwrap();
    assert_eq!(script(&mut s, "m.prune(d, #{steps: 1}).options.to_json()"), rust(&p.run.options.echo()), "prune");

    // `load_model(dir)` without options: the same device and precision as `LoadOptions::default()`.
    let out =
        s.eval("case", &format!("load_model({:?}).to_string()", dir.display().to_string())).unwrap().unwrap().text;
    assert_eq!(out, api::Model::load(&dir.display().to_string()).unwrap().to_string());
}

/// `tgt_lang` chooses a translation model's target language for one call of any verb that reads
/// its targets: the call equals the same call on the model loaded with that language, differs
/// from the model's own language, and leaves the model's own language in place afterwards (also
/// after a call that failed).
#[test]
fn tgt_lang_chooses_the_target_language_of_one_call() {
    let _rng = common::rng();
    let mut s = session("m2m100");
    let dir = root().join("tests/fixtures/tiny_hf/m2m100").display().to_string();
    s.eval(
        "setup",
        &format!("let de = load_model({dir:?}, #{{device: \"cpu\", tgt_lang: \"deu_Latn\"}}); let own = m.loss(d);"),
    )
    .unwrap();
    let calls: &[(&str, &str)] = &[
        ("loss", "M.loss(d, #{OPTS})"),
        ("ablation_sweep", "M.ablation_sweep(d, #{OPTS}).top(24).to_text()"),
        ("head_importance", "M.head_importance(d, #{OPTS}).top(24).to_text()"),
        ("confidence", "M.confidence(d, #{OPTS}).top(24).to_text()"),
        ("ablate", "M.ablate(d, [\"cross.0.1\"], #{OPTS}).value"),
        ("prune", "M.prune(d, #{steps: 2, batch_tokens: 200, OPTS}).curve.to_string()"),
        ("patch", "M.patch(pairs([[\"The cat sat.\", \"The hat sat.\"]]), #{OPTS}).clean"),
    ];
    let mut wrong = Vec::new();
    for (func, call) in calls {
        let per_call = call.replace('M', "m").replace("OPTS", "tgt_lang: \"deu_Latn\"");
        let loaded = call.replace('M', "de").replace("OPTS", "");
        let own = call.replace('M', "m").replace("OPTS", "");
        let value = |s: &mut Session, code: &str| {
            s.eval("case", code).map(|o| o.map(|o| o.text).unwrap_or_default()).map_err(|e| e.message)
        };
        match (value(&mut s, &per_call), value(&mut s, &loaded), value(&mut s, &own)) {
            (Ok(a), Ok(b), Ok(c)) => {
                if a != b {
                    wrong.push(format!("{func}: per call {a}\n  loaded with the language {b}"));
                }
                if a == c {
                    wrong.push(format!("{func}: the same in the model's own language: {a}"));
                }
            }
            (a, b, c) => wrong.push(format!("{func}: {a:?} / {b:?} / {c:?}")),
        }
        let restored = value(&mut s, "m.loss(d) == own").unwrap();
        if restored != "true" {
            wrong.push(format!("{func}: the model's own language is not back after the call"));
        }
    }
    let e = error_of(&mut s, "m.loss(d, #{tgt_lang: \"xx_Yyyy\"})");
    assert_eq!(e, "loss: tgt_lang 'xx_Yyyy' is not a language code of m2m100 (eng_Latn, fra_Latn, deu_Latn, por_Latn)");
    assert_eq!(
        error_of(&mut s, "load_model(\"minilm\").loss(d, #{tgt_lang: \"deu_Latn\"})").split(':').next(),
        Some("loss")
    );
    assert_eq!(s.eval("case", "m.loss(d) == own").unwrap().map(|o| o.text).as_deref(), Some("true"));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
