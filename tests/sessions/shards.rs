//! Sharded runs merge exactly (docs/methods.md#shards): for analyze (every statistic), the
//! single-head sweep (loss, KL, BLEU), LRP, gradient importance and BLEU, the data is split
//! into 1, 3 and 7 shards, and the merged result equals the one-process result (counts
//! identical, sums within 1e-9 relative: the models run in float64, so batching a sentence
//! with other companions changes its values only by rounding). Bad merges are refused with a
//! one-line error naming the shard and the field, through `merge_results` and `headscope merge`.

use crate::common::root;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_headscope");

/// The Rhai every case shares: `split(dir, name, f)` writes `f(())` (one process) as
/// `NAME-one.json` and the merges of 1, 3 and 7 shards as `NAME-N.json`; `pairs(n)` is a
/// parallel dataset (source PUD line i, reference line i + 1).
const PRELUDE: &str = r#"
let dir = ARGS[0];
let root = ARGS[1];
fn split(dir, name, f) {
    f.call(()).to_json(`${dir}/${name}-one.json`);
    for n in [1, 3, 7] {
        let parts = [];
        for i in 0..n { parts.push(f.call(`${i}/${n}`)); }
        merge_results(parts).to_json(`${dir}/${name}-${n}.json`);
    }
}
fn pairs(n) {
    let l = read_lines(asset("pud_en.txt"));
    let tsv = "";
    for i in 0..n { tsv += `${l[i]}	${l[i + 1]}
`; }
    let p = temp_path(`pairs-${n}.tsv`);
    write_text(p, tsv);
    parallel(p)
}
fn tiny(root, name) { load_model(`${root}/tests/fixtures/tiny_hf/${name}`, #{dtype: "f64"}) }
"#;

fn run_script(body: &str) -> PathBuf {
    run_script_after(PRELUDE, body)
}

/// A case after its own prelude (patching's `pairs` is the built-in, not the prelude's).
fn run_script_after(prelude: &str, body: &str) -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let script = dir.join("case.rhai");
    std::fs::write(&script, format!("{prelude}\n{body}")).unwrap();
    let out = Command::new(BIN)
        .args(["run", script.to_str().unwrap(), dir.to_str().unwrap(), root().to_str().unwrap()])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "script failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Compares two results: integers equal, floats within `rel` (and 1e-15 absolute), everything else equal; timings
/// (`seconds`) are the one thing allowed to differ. Returns how many numbers were compared.
fn compare(a: &Value, b: &Value, path: &str, rel: f64) -> usize {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> =
                x.keys().chain(y.keys()).filter(|k| *k != "seconds").collect();
            keys.into_iter()
                .map(|k| {
                    compare(
                        x.get(k).unwrap_or_else(|| panic!("{path}.{k}: only in the merge")),
                        y.get(k).unwrap_or_else(|| panic!("{path}.{k}: missing from the merge")),
                        &format!("{path}.{k}"),
                        rel,
                    )
                })
                .sum()
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}: lengths differ");
            x.iter().zip(y).enumerate().map(|(i, (p, q))| compare(p, q, &format!("{path}[{i}]"), rel)).sum()
        }
        (Value::Number(p), Value::Number(q)) if p.is_u64() || p.is_i64() => {
            assert_eq!(p, q, "{path}: counts differ");
            1
        }
        (Value::Number(p), Value::Number(q)) => {
            let (p, q) = (p.as_f64().unwrap(), q.as_f64().unwrap());
            // Values that are zero but for rounding (KL of the unmasked model against itself,
            // ~1e-19) get an absolute floor.
            assert!((p - q).abs() <= rel * p.abs().max(q.abs()) + 1e-15, "{path}: {p} vs {q}");
            1
        }
        // The stat line of a sweep quotes the base value rounded: compare the numbers in it.
        (Value::String(p), Value::String(q)) => {
            assert_eq!(p, q, "{path}");
            0
        }
        _ => {
            assert_eq!(a, b, "{path}");
            0
        }
    }
}

fn check(dir: &Path, name: &str) {
    let read = |f: String| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(&f)).unwrap_or_else(|e| panic!("{f}: {e}"))).unwrap()
    };
    let one = read(format!("{name}-one.json"));
    for n in [1, 3, 7] {
        let merged = read(format!("{name}-{n}.json"));
        let numbers = compare(&one, &merged, name, 1e-9);
        assert!(numbers >= 8, "{name}: only {numbers} numbers compared");
        println!("{name}: {n} shards merge to the one-process result ({numbers} numbers)");
    }
}

#[test]
fn analyze_every_stat_merges_exactly() {
    let dir = run_script(
        r#"
        let m = load_model("minilm", #{dtype: "f64"});
        let d = treebank(asset("pud_en.conllu")).take(40);
        split(dir, "minilm", |s| m.analyze(d, #{stats: ["confidence", "positional", "rare", "syntactic"], shard: s}));
        let t = tiny(root, "marian");
        let p = pairs(21);
        split(dir, "marian", |s| t.analyze(p, #{stats: ["confidence", "positional", "rare"], shard: s}));
    "#,
    );
    check(&dir, "minilm");
    check(&dir, "marian");
    // Every statistic and kind took part.
    let a: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("minilm-7.json")).unwrap()).unwrap();
    let s = a.to_string();
    for key in ["confidence", "positional", "rare", "syntactic"] {
        assert!(s.contains(&format!("\"{key}\"")), "{key} missing from {}", &s[..200.min(s.len())]);
    }
    let m: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("marian-3.json")).unwrap()).unwrap();
    let ms = m.to_string();
    assert!(ms.contains("\"cross\"") && ms.contains("\"dec\""), "marian kinds");
}

#[test]
fn sweep_merges_exactly() {
    let dir = run_script(
        r#"
        let t = tiny(root, "marian");
        let p = pairs(14);
        split(dir, "loss", |s| t.ablation_sweep(p, #{metric: "loss", shard: s}));
        split(dir, "bleu", |s| t.ablation_sweep(p, #{metric: "bleu", kinds: ["cross"], shard: s}));
        let g = tiny(root, "gpt2");
        let c = corpus(asset("pud_en.txt")).take(15);
        split(dir, "kl", |s| g.ablation_sweep(c, #{metric: "kl", shard: s}));
        let m = load_model("minilm", #{dtype: "f64"});
        split(dir, "cosine", |s| m.ablation_sweep(c.take(7), #{kinds: ["enc"], shard: s}));
    "#,
    );
    for name in ["loss", "bleu", "kl", "cosine"] {
        check(&dir, name);
    }
}

#[test]
fn lrp_merges_exactly() {
    let dir = run_script(
        r#"
        let m = load_model("minilm", #{dtype: "f64"});
        let c = corpus(asset("pud_en.txt")).take(7);
        split(dir, "minilm", |s| m.lrp(c, #{seeds: "summed", shard: s}));
        let t = tiny(root, "marian");
        let p = pairs(8);
        split(dir, "marian", |s| t.lrp(p, #{shard: s}));
        let g = tiny(root, "gpt2");
        split(dir, "attnlrp", |s| g.lrp(c, #{rule: "attnlrp", shard: s}));
    "#,
    );
    for name in ["minilm", "marian", "attnlrp"] {
        check(&dir, name);
    }
}

#[test]
fn importance_merges_exactly() {
    let dir = run_script(
        r#"
        let g = tiny(root, "gpt2");
        let c = corpus(asset("pud_en.txt")).take(20);
        split(dir, "fisher", |s| g.head_importance(c, #{metric: "fisher", seed: 5, shard: s}));
        let t = tiny(root, "marian");
        let p = pairs(14);
        split(dir, "marian", |s| t.head_importance(p, #{normalize: "layer", shard: s}));
        // A masked view: its closed head has no importance in any shard.
        let v = t.with_mask([t.head("enc", 0, 1)]);
        split(dir, "masked", |s| v.head_importance(p, #{shard: s}));
    "#,
    );
    for name in ["fisher", "marian", "masked"] {
        check(&dir, name);
    }
}

#[test]
fn bleu_merges_exactly() {
    run_script(
        r#"
        let t = tiny(root, "marian");
        let p = pairs(14);
        let one = t.bleu(p);
        for n in [1, 3, 7] {
            let parts = [];
            for i in 0..n { parts.push(t.bleu(p, #{shard: `${i}/${n}`})); }
            let m = merge_results(parts);
            assert(m.sys_len == one.sys_len && m.ref_len == one.ref_len && m.sentences == 14, `${n} shards: lengths`);
            assert(abs(m.score - one.score) <= 1e-9 * abs(one.score) + 1e-300, `${n} shards: ${m.score} vs ${one.score}`);
            assert(m.precisions == one.precisions, `${n} shards: precisions`);
        }
        // bleu(hyps, refs) over slices of the lines.
        let h = t.translate(p);
        let r = []; for x in p { r.push(x.target); }
        let parts = []; for i in 0..3 { parts.push(bleu(h, r, #{shard: `${i}/3`})); }
        assert(merge_results(parts).text == bleu(h, r).text);
    "#,
    );
}

fn headscope(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).current_dir(dir).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn one_line_error(stderr: &str, wants: &[&str]) {
    let e = stderr.trim();
    assert_eq!(e.lines().count(), 1, "not one line: {e}");
    for w in wants {
        assert!(e.contains(w), "'{w}' not in: {e}");
    }
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn run_shard_and_headscope_merge_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // ARGS[0]: where a one-process run writes its results; ARGS[1]: the batch size (an option
    // that must agree across shards).
    std::fs::write(
        d.join("conf.rhai"),
        r#"
        let m = load_model("minilm", #{dtype: "f64"});
        let d = corpus(asset("pud_en.txt")).take(11);
        let a = m.analyze(d, #{stats: ["confidence", "positional"], batch_tokens: parse_int(ARGS[1])});
        let g = m.ablation_sweep(d.take(3));
        if ARGS[0] != "-" { a.to_json(ARGS[0] + "/analyze-1.json"); g.to_json(ARGS[0] + "/ablation_sweep-1.json"); }
    "#,
    )
    .unwrap();
    std::fs::create_dir(d.join("one")).unwrap();
    let (code, _, err) = headscope(d, &["run", "conf.rhai", "one", "512"]);
    assert_eq!(code, 0, "{err}");
    for i in 0..3 {
        let (code, _, err) =
            headscope(d, &["run", "--shard", &format!("{i}/3"), "--shard-dir", "parts", "conf.rhai", "-", "512"]);
        assert_eq!(code, 0, "{err}");
    }
    let (code, out, err) = headscope(d, &["merge", "-o", "merged", "parts"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("analyze-1: 3 shards, 11 sentences -> merged/analyze-1.json"), "{out}");
    assert!(out.contains("ablation_sweep-1: 3 shards, 3 sentences"), "{out}");
    for name in ["analyze-1", "ablation_sweep-1"] {
        let read = |p: PathBuf| -> Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
        compare(
            &read(d.join("one").join(format!("{name}.json"))),
            &read(d.join("merged").join(format!("{name}.json"))),
            name,
            1e-9,
        );
    }

    // A missing shard.
    std::fs::create_dir(d.join("two")).unwrap();
    std::fs::copy(d.join("parts/analyze-1.shard-0-of-3.json"), d.join("two/analyze-1.shard-0-of-3.json")).unwrap();
    std::fs::copy(d.join("parts/analyze-1.shard-2-of-3.json"), d.join("two/analyze-1.shard-2-of-3.json")).unwrap();
    let (code, _, err) = headscope(d, &["merge", "-o", "bad", "two"]);
    assert_eq!(code, 1);
    one_line_error(&err, &["analyze-1 is missing shard 1/3"]);
    assert!(!d.join("bad").exists(), "a refused merge wrote something");
    // The same shard twice.
    let (code, _, err) = headscope(d, &["merge", "-o", "bad", "parts", "two/analyze-1.shard-0-of-3.json"]);
    assert_eq!(code, 1);
    one_line_error(&err, &["shard 0/3 of analyze-1 is given twice"]);
    // A shard run with other options.
    std::fs::create_dir(d.join("three")).unwrap();
    let (code, _, err) = headscope(d, &["run", "--shard", "1/3", "--shard-dir", "three", "conf.rhai", "-", "256"]);
    assert_eq!(code, 0, "{err}");
    for f in [
        "analyze-1.shard-0-of-3.json",
        "analyze-1.shard-2-of-3.json",
        "ablation_sweep-1.shard-0-of-3.json",
        "ablation_sweep-1.shard-2-of-3.json",
    ] {
        std::fs::copy(d.join("parts").join(f), d.join("three").join(f)).unwrap();
    }
    let (code, _, err) = headscope(d, &["merge", "-o", "bad", "three"]);
    assert_eq!(code, 1);
    one_line_error(&err, &["differ in frame.options", "batch_tokens"]);
    // Shards of another split.
    let (code, _, err) = headscope(d, &["run", "--shard", "1/4", "--shard-dir", "four", "conf.rhai", "-", "512"]);
    assert_eq!(code, 0, "{err}");
    std::fs::copy(d.join("four/analyze-1.shard-1-of-4.json"), d.join("two/analyze-1.shard-1-of-4.json")).unwrap();
    let (code, _, err) = headscope(d, &["merge", "-o", "bad", "two"]);
    assert_eq!(code, 1);
    one_line_error(&err, &["is shard 1/4 but", "is shard 0/3"]);
    // Nothing to merge; a bad --shard.
    std::fs::create_dir(d.join("empty")).unwrap();
    let (code, _, err) = headscope(d, &["merge", "empty"]);
    assert_eq!(code, 1);
    one_line_error(&err, &["no shard results in empty"]);
    let (code, _, err) = headscope(d, &["run", "--shard", "3/3", "conf.rhai", "-", "512"]);
    assert_eq!(code, 2);
    one_line_error(&err, &["shard '3/3' is not I/N with 0 <= I < N"]);
}

#[test]
fn merge_results_refuses_mismatched_shards_naming_the_field() {
    run_script(
        r#"
        let m = load_model("minilm");
        let d = corpus(asset("pud_en.txt")).take(6);
        let a = |s, k| m.analyze(d, #{stats: ["confidence"], exclude_keys: k, shard: s});
        fn fails(f, want) {
            try { f.call(); throw "merged"; } catch (e) {
                let msg = `${e}`;
                if msg == "merged" || !msg.contains(want) { throw `expected '${want}', got: ${msg}`; }
            }
        }
        fails(|| merge_results([a.call("0/2", "eos"), a.call("1/2", "none")]), "differ in frame.options");
        fails(|| merge_results([a.call("0/2", "eos")]), "is missing shard 1/2");
        fails(|| merge_results([a.call("0/2", "eos"), a.call("0/2", "eos")]), "is given twice");
        fails(|| merge_results([a.call("0/2", "eos"), m.lrp(d, #{shard: "1/2"})]), "shards of different functions");
        fails(|| merge_results([a.call("0/2", "eos"), load_model("enpt").analyze(d, #{stats: ["confidence"], shard: "1/2"})]), "differ in model");
        fails(|| merge_results([a.call("0/2", "eos"), m.analyze(d.take(5), #{stats: ["confidence"], shard: "1/2"})]), "different data");
        fails(|| merge_results([m.analyze(d, #{stats: ["confidence"]})]), "not of a shard");
        fails(|| m.analyze(d, #{shard: "2/2"}), "shard '2/2' is not I/N");
        fails(|| m.analyze(d.take(2), #{shard: "4/7"}), "holds no sentences");
        fails(|| merge_results([]), "nothing to merge");
    "#,
    );
}

/// Patching merges exactly: every pair's metric is summed into the shard's accumulators, so the
/// merge of 2 and 3 shards gives the one-process grids (heads at all positions and per
/// position, a key/value site, noising with KL, path patching, attribution; the residual
/// stream's tables; a translation model's cross-attention) within 1e-9 relative.
#[test]
fn patch_merges_exactly() {
    run_script_after(
        "let root = ARGS[1];\nfn tiny(root, name) { load_model(`${root}/tests/fixtures/tiny_hf/${name}`, #{dtype: \"f64\"}) }",
        r#"
        fn close(a, b) { if a.is_nan() { return b.is_nan(); } abs(a - b) <= 1e-9 * abs(a) + 1e-12 }
        fn same_grid(a, b) {
            for k in a.kinds { for l in 0..a[k].len() { for h in 0..a[k][l].len() { if !close(a[k][l][h], b[k][l][h]) { return false; } } } }
            true
        }
        fn same_effect(a, b) {
            if type_of(a) == "Grid" { return same_grid(a, b); }
            if type_of(a) == "Table" {
                for c in a.columns { if c != "layer" { let x = a.column(c); let y = b.column(c); for i in 0..x.len() { if !close(x[i], y[i]) { return false; } } } }
                return true;
            }
            for i in 0..a.len() { if !same_grid(a[i], b[i]) { return false; } }
            true
        }
        fn check(m, p, opts, what) {
            let one = m.patch(p, opts);
            for n in [2, 3] {
                let parts = [];
                for i in 0..n { let o = opts; o.shard = `${i}/${n}`; parts.push(m.patch(p, o)); }
                let merged = merge_results(parts);
                assert(merged.pairs == one.pairs && close(merged.clean, one.clean) && close(merged.corrupted, one.corrupted), `${what}, ${n} shards: clean/corrupted`);
                assert(same_effect(one.effect, merged.effect) && same_effect(one.patched, merged.patched), `${what}, ${n} shards: the grids`);
                if one.tokens != () { assert(merged.tokens == one.tokens, `${what}: tokens`); }
            }
            print(`${what}: merges exactly`);
        }
        let g = tiny(root, "llama");
        let p = pairs([["a b c d", "a b e d", " c", " e"], ["b c d a", "b c e a", " d", " e"], ["c d a b", "c e a b", " d", " e"], ["d a b c", "e a b c", " d", " e"], ["a c b d", "a c e d", " b", " e"], ["b d c a", "b d e a", " c", " e"], ["c a d b", "c a e b", " d", " e"]]);
        check(g, p, #{}, "z");
        check(g, p, #{positions: "each"}, "z per position");
        check(g, p, #{site: "v", direction: "noise", metric: "kl"}, "v noising kl");
        check(g, p, #{receiver: "logits"}, "path to the logits");
        check(g, p, #{method: "attribution"}, "attribution");
        check(g, p, #{site: "resid_pre", positions: "each"}, "resid_pre per position");
        let t = tiny(root, "marian");
        let l = read_lines(asset("pud_en.txt"));
        let sp = [];
        for i in 0..5 { sp.push([l[i], l[i]]); }
        sp[1][1] = sp[2][0]; sp[3][1] = sp[4][0];
        // Pairs of one length: keep those whose sources tokenize alike.
        let kept = [];
        for x in sp { if t.tokenize(x[0]).len() == t.tokenize(x[1]).len() { kept.push(x); } }
        check(t, pairs(kept), #{kinds: ["cross"]}, "translation cross");
        // verify picks a shard's own top units: refused in one line.
        let e = "";
        try { g.patch(p, #{method: "attribution", verify: 3, shard: "0/2"}); } catch (x) { e = `${x}`; }
        assert(e.contains("patch: verify patches a shard's own top units exactly"), e);
    "#,
    );
}
