//! How the modules of `src/` import each other.
//!
//! (1) In each crate, the top-level modules form a DAG: the run context and the script helpers are leaves, only
//! the engine (and the frontends above it) sees every type. An edge is any `crate::NAME` (or
//! `use crate::{NAME, ...}`) outside `#[cfg(test)]`.
//!
//! (2) The numeric core knows nothing of Rhai: it is its own crate (`crates/core`), and the
//! compiler keeps Rhai out of it; the tests check the dependency stays out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `module -> modules it imports`, for the top-level modules of `src` (not `main`, `lib`).
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let word = regex::Regex::new(r"crate::(\w+)").unwrap();
    let group = regex::Regex::new(r"use crate::\{([^}]*)\}").unwrap();
    let mut files = vec![];
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "main" || top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        let edges = g.entry(top.clone()).or_default();
        for c in word.captures_iter(text) {
            edges.insert(c[1].to_string());
        }
        for c in group.captures_iter(text) {
            for part in c[1].split(',') {
                let name = part.trim().split("::").next().unwrap_or("").trim();
                if !name.is_empty() {
                    edges.insert(name.to_string());
                }
            }
        }
        edges.remove(&top);
    }
    g
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        idx: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn dfs<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.idx.len();
        t.idx.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !g.contains_key(w) {
                continue;
            }
            if !t.idx.contains_key(w) {
                dfs(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.idx[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.idx[v] {
            let mut comp = vec![];
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T { g, idx: BTreeMap::new(), low: BTreeMap::new(), stack: vec![], on: BTreeSet::new(), out: vec![] };
    for v in g.keys() {
        if !t.idx.contains_key(v.as_str()) {
            dfs(&mut t, v);
        }
    }
    t.out
}

#[test]
fn top_level_modules_form_a_dag() {
    // Each crate's own modules: the core's (crates/core/src) and the script layer's (src).
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, leaves, at_least) in
        [("crates/core/src", &["run", "output", "files", "optspec"][..], 10), ("src", &["script"][..], 10)]
    {
        let g = graph(&manifest.join(dir));
        assert!(g.len() >= at_least, "found only {} modules: is the walk of {dir} broken?", g.len());
        let c = cycles(&g);
        assert!(c.is_empty(), "import cycles among top-level modules of {dir}: {c:?}\ngraph: {g:#?}");
        for leaf in leaves {
            let deps: Vec<_> =
                g[*leaf].iter().filter(|d| g.contains_key(d.as_str()) && d.as_str() != "output").collect();
            assert!(deps.is_empty(), "{dir}: {leaf} must stay a leaf (only `output` below it), imports {deps:?}");
        }
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let edge = |g: &mut BTreeMap<String, BTreeSet<String>>, a: &str, b: &str| {
        g.entry(a.into()).or_default().insert(b.into());
    };
    edge(&mut g, "a", "b");
    edge(&mut g, "b", "c");
    edge(&mut g, "c", "a");
    edge(&mut g, "c", "d");
    edge(&mut g, "d", "e");
    g.entry("e".into()).or_default();
    assert_eq!(cycles(&g), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
}

// ---------------------------------------------------------------------------------------------
// (2) The numeric core knows nothing of Rhai: the compiler keeps it so. The core is its own
// crate (`crates/core`, `headscope-core`) without `rhai` among its dependencies, so a `use rhai`
// or a `rhai::` path in any of its files does not compile (checked by hand: a planted
// `use rhai::Engine as _Planted;` in crates/core/src/analysis/taxonomy.rs gives E0432
// "unresolved import `rhai`"); the script layer reaches the core, never the reverse (a crate
// cannot name the crate that depends on it). These tests check that the dependency stays out.

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_core_crate_depends_on_no_script_crate() {
    let manifest = std::fs::read_to_string(root().join("crates/core/Cargo.toml")).unwrap();
    for banned in ["rhai", "rustyline", "jupyter", "zeromq", "headscope ="] {
        assert!(!manifest.contains(banned), "crates/core/Cargo.toml names '{banned}':\n{manifest}");
    }
    // The resolved graph too (a dependency could bring Rhai in): `cargo tree` of the core.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["tree", "--offline", "--locked", "-p", "headscope-core", "-e", "normal,build", "--prefix", "none"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().count() > 20 && tree.contains("tch v"), "cargo tree printed too little:\n{tree}");
    let bad: Vec<&str> = tree.lines().filter(|l| l.starts_with("rhai") || l.starts_with("headscope v")).collect();
    assert!(bad.is_empty(), "the core crate's dependency tree holds {bad:?}");
    // And the script crate does depend on it (the test would pass vacuously on a wrong name).
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["tree", "--offline", "--locked", "-p", "headscope", "-e", "normal", "--prefix", "none", "--depth", "1"])
        .current_dir(root())
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(top.lines().any(|l| l.starts_with("rhai v")), "headscope's tree lacks rhai:\n{top}");
    assert!(top.lines().any(|l| l.starts_with("headscope-core v")), "headscope's tree lacks the core:\n{top}");
}

/// No file of the core names the script layer's modules either (they are not in its crate;
/// a doc comment may mention them, code may not).
#[test]
fn no_core_file_names_rhai_in_code() {
    let mut files = vec![];
    rust_files(&root().join("crates/core/src"), &mut files);
    assert!(files.len() >= 50, "only {} files in crates/core/src", files.len());
    let path = regex::Regex::new(r"\brhai::|\bextern crate rhai|use rhai\b").unwrap();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            assert!(!path.is_match(code), "{}:{}: {line}", f.display(), i + 1);
        }
    }
}
