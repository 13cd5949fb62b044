//! Every head name a result prints is accepted back where heads are taken: `m.head`,
//! `ablate`, `with_gates` (and `with_mask`, `attention`), on an encoder (MiniLM), a
//! translation model (EN->PT: enc and cross) and a decoder-only model (tiny GPT-2: dec).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_headscope");

/// For every head a confidence grid's `top` prints (all of them), and every head a pruning
/// result and a masked view print: the name parses back to the same head everywhere.
const SCRIPT: &str = r#"
let m = load_model(ARGS[0]);
let d = corpus(asset("pud_en.txt")).take(2);
let g = m.confidence(d);
let n = 0;
for k in g.kinds { n += m.layers(k) * m.heads_per_layer(k); }
let t = g.top(n);
assert(t.len() == n);
let names = [];
for i in 0..t.len() { names.push(t[i].head); }
let metric = if m.kinds.contains("cross") { "kl" } else { "cosine" };
for name in names {
    assert(m.head(name).to_string() == name);
    assert(m.with_gates([name]).masked[0].to_string() == name);
    assert(m.with_mask(name).masked[0].to_string() == name);
}
// ablate: each kind's first and last head by name equal the same heads as objects.
for k in g.kinds {
    let hs = m.heads(k);
    for h in [hs[0], hs[hs.len() - 1]] {
        let by_name = m.ablate(d, [h.to_string()], #{metric: metric});
        let by_head = m.ablate(d, [h], #{metric: metric});
        assert(by_name.heads == h.to_string() && by_name.value == by_head.value);
        assert(m.head(by_name.heads) == h);
    }
}
// The whole top table goes straight into ablate and with_gates.
let top = g.top(3);
let r = m.ablate(d, top, #{metric: metric});
let back = r.heads.split(" ");
assert(back.len() == 3);
for i in 0..3 { assert(back.contains(top[i].head)); }
assert(m.with_gates(top).masked.len() == 3);
// Heads printed by a masked view come back too.
for h in m.with_mask(top).masked { assert(m.head(h.to_string()) == h); }
print(`ok ${names.len()} names`);
"#;

fn check(model: &str, want: usize) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("names.rhai");
    std::fs::write(&script, SCRIPT).unwrap();
    let out =
        Command::new(BIN).arg("run").arg(&script).arg(model).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{model}: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("ok {want} names")), "{model}: {stdout}");
}

#[test]
fn names_printed_by_results_are_accepted_back_minilm() {
    check("minilm", 72);
}

#[test]
fn names_printed_by_results_are_accepted_back_enpt() {
    check("enpt", 64);
}

#[test]
fn names_printed_by_results_are_accepted_back_gpt2() {
    check("tests/fixtures/tiny_hf/gpt2", 8);
}

#[test]
fn bad_head_names_are_one_line_errors() {
    for (code, want) in [
        ("load_model(\"minilm\").head(\"enc.6.0\")", "layer 6 out of range"),
        ("load_model(\"minilm\").head(\"enc.1\")", "'enc.1' is not a head name"),
        ("load_model(\"minilm\").head(\"cross.0.0\")", "has no 'cross' attention"),
        ("load_model(\"minilm\").with_mask([\"enc.0.0\", 3])", "heads[1]: expected a Head or a head name"),
        ("let m = load_model(\"minilm\"); m.ablate([\"a\"], table([\"x\"], [[1]]))", "needs a 'head' column"),
    ] {
        let out = Command::new(BIN).arg("-e").arg(code).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{code}: {err}");
        assert!(err.contains(want), "{code}: want {want:?} in {err}");
        assert!(!err.contains("panicked"), "{code}: {err}");
    }
}
