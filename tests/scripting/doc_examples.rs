//! Every script function headscope registers is documented with a Rhai example, and every
//! example runs (as nushell runs each command's examples()).

use crate::common;

use headscope::engine::{docs, documented_examples, Session, SessionOptions};

#[test]
fn every_documented_example_runs() {
    let _rng = common::rng();
    let probe = Session::new(SessionOptions::default());
    let examples = documented_examples(probe.engine());
    assert!(examples.len() >= 40, "only {} examples found", examples.len());
    let mut failures = Vec::new();
    let mut took = Vec::new();
    for (sig, ex) in &examples {
        let t = std::time::Instant::now();
        let mut s = Session::new(SessionOptions::default());
        match (s.eval("example", &ex.code), ex.must_fail) {
            (Err(e), false) => failures.push(format!("{sig}:\n{}\n=> {e}", ex.code)),
            (Ok(_), true) => failures.push(format!("{sig}:\n{}\n=> succeeded but is documented to fail", ex.code)),
            _ => {}
        }
        // The session survives whatever the example did.
        assert_eq!(s.eval("after", "40 + 2").unwrap().unwrap().text, "42");
        took.push((t.elapsed().as_secs_f64(), sig));
    }
    // The slowest examples, for whoever keeps the suite's time down (`--nocapture`).
    took.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (secs, sig) in took.iter().take(15) {
        eprintln!("doc example {secs:7.2} s  {sig}");
    }
    assert!(failures.is_empty(), "{} failing examples:\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn every_headscope_function_has_an_example() {
    let s = Session::new(SessionOptions::default());
    let json: serde_json::Value = serde_json::from_str(&s.engine().gen_fn_metadata_to_json(false).unwrap()).unwrap();
    let documented: std::collections::HashSet<String> =
        docs::all_docs(s.engine()).into_iter().filter(|d| !d.examples().is_empty()).map(|d| d.name).collect();
    let mut missing = Vec::new();
    for f in json["functions"].as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        // Property setters share the getter's doc; conversions are used by print and `${}`.
        let exempt =
            name.starts_with("set$") || name.starts_with("index$") || name == "to_string" || name == "to_debug";
        let shown = name.strip_prefix("get$").unwrap_or(name);
        if !exempt && !documented.contains(shown) && !documented.contains(name) {
            missing.push(f["signature"].as_str().unwrap_or(name).to_string());
        }
    }
    assert!(missing.is_empty(), "functions without a documented example: {missing:#?}");
}

#[test]
fn stdlib_functions_are_documented() {
    let s = Session::new(SessionOptions::default());
    let names: Vec<String> = docs::all_docs(s.engine()).into_iter().map(|d| d.name).collect();
    for f in ["stats::mean", "stats::describe", "tables::from_matrix", "tables::top_cells"] {
        assert!(names.iter().any(|n| n == f), "{f} missing from docs: {names:?}");
    }
}

/// The examples written on the tiny decoder-only models (GPT-2, Llama) run on the hybrid
/// stacks too (issue 49): LFM2 (short-convolution layers without heads beside attention
/// layers) and Granite-4.0-H (Mamba-2 layers with heads of their own): each succeeds, or fails
/// in one line that names the other layer's mixer (`names`) where a method needs attention in
/// every layer, or an example's own assertion of the original model's numbers (its shape, its
/// values).
fn examples_run_on(hybrid: &str, names: &[&str]) {
    let _rng = common::rng();
    let probe = Session::new(SessionOptions::default());
    let examples = documented_examples(probe.engine());
    let (mut ran, mut refused, mut asserted, mut failures) = (0, Vec::new(), Vec::new(), Vec::new());
    for (sig, ex) in &examples {
        let code = ["gpt2", "llama"].iter().fold(ex.code.clone(), |c, m| {
            c.replace(&format!("tests/fixtures/tiny_hf/{m}\""), &format!("tests/fixtures/tiny_hf/{hybrid}\""))
        });
        if code == ex.code || ex.must_fail {
            continue;
        }
        ran += 1;
        let mut s = Session::new(SessionOptions::default());
        match s.eval("example", &code) {
            Ok(_) => {}
            Err(e) if names.iter().any(|n| e.to_string().contains(n)) => refused.push(format!("{sig}: {e}")),
            Err(e) if e.to_string().to_lowercase().contains("assertion failed") => asserted.push(format!("{sig}: {e}")),
            Err(e) => failures.push(format!("{sig}:\n{code}\n=> {e}")),
        }
        assert_eq!(s.eval("after", "40 + 2").unwrap().unwrap().text, "42");
    }
    eprintln!("{ran} examples on {hybrid}: {} refused by name, {} own assertions", refused.len(), asserted.len());
    for r in refused.iter().chain(&asserted) {
        eprintln!("  {r}");
    }
    assert!(ran >= 30, "only {ran} examples");
    assert!(failures.is_empty(), "{} examples fail on {hybrid}:\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn documented_examples_run_on_a_hybrid() {
    examples_run_on("lfm2", &["'shortconv'"]);
}

#[test]
fn documented_examples_run_on_a_mamba2_hybrid() {
    examples_run_on("granite_h", &["'mamba2'", "Mamba-2"]);
}

#[test]
fn documented_examples_run_on_a_deltanet_hybrid() {
    examples_run_on("qwen3_next", &["'deltanet'", "DeltaNet"]);
}

#[test]
fn documented_examples_run_on_a_mamba_hybrid() {
    examples_run_on("jamba", &["'mamba'", "Mamba"]);
}
