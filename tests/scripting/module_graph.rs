//! How the modules of `src/` import each other.
//!
//! (1) The top-level modules form a DAG: the run context and the script helpers are leaves, only
//! the engine (and the frontends above it) sees every type. An edge is any `crate::NAME` (or
//! `use crate::{NAME, ...}`) outside `#[cfg(test)]`.
//!
//! (2) The numeric core knows nothing of Rhai: no file under `src/model/`, and no numeric file of
//! `src/analysis/` or `src/prune/` (every file but their `script` submodules), reaches `rhai` or
//! the script layer (`crate::script`, `crate::engine`, any module named `script*`), directly or
//! through other files. Here an edge joins two files: a path in a file (`use` trees included,
//! `crate::`, `super::`, `self::` and child modules resolved as rustc resolves them) points at
//! the file that defines the longest module prefix of the path. Files are found from `lib.rs`
//! through the `mod NAME;` declarations (`module_files`); a declaration itself is no edge (a
//! type's file declares its script file). `check_numeric_core` is a function of a source tree,
//! so the tests plant violations in a copy of `src/` and see them reported as paths, `file ->
//! file -> ... -> rhai`; no edge is exempt.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
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
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(g.len() >= 10, "found only {} modules: is the walk of src/ broken?", g.len());
    let c = cycles(&g);
    assert!(c.is_empty(), "import cycles among top-level modules: {c:?}\ngraph: {g:#?}");
    for leaf in ["run", "output", "script"] {
        let deps: Vec<_> = g[leaf].iter().filter(|d| g.contains_key(d.as_str()) && d.as_str() != "output").collect();
        assert!(deps.is_empty(), "{leaf} must stay a leaf (only `output` below it), imports {deps:?}");
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
// (2) Edges between files: the numeric core reaches neither Rhai nor the script layer.

/// Source reduced to what paths are made of: comments removed, the contents of string and
/// character literals blanked, and every `#[cfg(test)]` item (`mod tests { ... }`) dropped.
fn code(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let prev = if i > 0 { c[i - 1] } else { ' ' };
        let prev2 = if i > 1 { c[i - 2] } else { ' ' };
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && (at(i + 1) == '"' || at(i + 1) == '#')
            && (!ident(prev) || prev == 'b' && !ident(prev2))
        {
            // A raw string r"..." / r#"..."# (or br...); `r#ident` is a raw identifier.
            let mut j = i + 1;
            while at(j) == '#' {
                j += 1;
            }
            if at(j) != '"' {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            j += 1;
            while j < c.len() && !(c[j] == '"' && (0..hashes).all(|k| at(j + 1 + k) == '#')) {
                j += 1;
            }
            i = j + 1 + hashes;
            out.push_str("\"\"");
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A character literal ('x', '\n', '\'', '\u{..}'); otherwise a lifetime.
            i += if at(i + 1) == '\\' { 3 } else { 2 };
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    // Drop each `#[cfg(test)]` item: through its `;`, or its braces when one opens first.
    let mut kept = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(k) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..k]);
        let item = &rest[k + "#[cfg(test)]".len()..];
        let mut depth = 0;
        let mut end = item.len();
        for (j, ch) in item.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    kept.push_str(rest);
    kept
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Sep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

fn tokens(code: &str) -> Vec<Tok> {
    let c: Vec<char> = code.chars().collect();
    let mut t = vec![];
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_alphabetic() || ch == '_' {
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            t.push(Tok::Ident(c[s..i].iter().collect()));
            continue;
        }
        if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            t.push(Tok::Other);
            continue;
        }
        i += 1;
        t.push(match ch {
            ':' if c.get(i) == Some(&':') => {
                i += 1;
                Tok::Sep
            }
            '{' => Tok::Open,
            '}' => Tok::Close,
            ',' => Tok::Comma,
            ';' => Tok::Semi,
            '*' => Tok::Star,
            c if c.is_whitespace() => continue,
            _ => Tok::Other,
        });
    }
    t
}

/// The paths of one `use` tree starting at `t[i]` (after `use`), each with `prefix` in front;
/// returns the index after the tree.
fn use_tree(t: &[Tok], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    if t.get(i) == Some(&Tok::Sep) {
        i += 1;
    }
    loop {
        match t.get(i) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                i += 1;
                if t.get(i) == Some(&Tok::Sep) {
                    i += 1;
                    continue;
                }
                if t.get(i) == Some(&Tok::Ident("as".into())) {
                    i += 2;
                }
                out.push(path);
                return i;
            }
            Some(Tok::Star) => {
                out.push(path);
                return i + 1;
            }
            Some(Tok::Open) => {
                i += 1;
                while i < t.len() && t[i] != Tok::Close {
                    i = use_tree(t, i, &path, out);
                    if t.get(i) == Some(&Tok::Comma) {
                        i += 1;
                    }
                }
                return i + 1;
            }
            _ => {
                out.push(path);
                return i;
            }
        }
    }
}

/// The module path of a file of `src`: `model/nn.rs` -> `model::nn`, `model/mod.rs` -> `model`,
/// `lib.rs` -> the crate root.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// `module path -> file` of the library, found as rustc finds them: from `lib.rs` through each
/// `mod NAME;` declaration (outside `#[cfg(test)]`) to `NAME.rs` or `NAME/mod.rs` beside the
/// declaring file (`a/mod.rs` and `lib.rs` declare into their folder, `a/b.rs` into `a/b/`).
/// `main.rs` is the binary, its own crate. Files are named relative to `src`, with `/`.
fn module_files(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut files = BTreeMap::new();
    let mut todo = vec![(vec![], "lib.rs".to_string())];
    while let Some((module, file)) = todo.pop() {
        let text = std::fs::read_to_string(src.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!text.contains("#[path"), "{file}: #[path] attributes are not followed by this check");
        let dir = match file.rsplit_once('/') {
            _ if file == "lib.rs" => String::new(),
            Some((d, "mod.rs")) => format!("{d}/"),
            _ => format!("{}/", file.trim_end_matches(".rs")),
        };
        let t = tokens(&code(&text));
        for w in t.windows(3) {
            if let [Tok::Ident(m), Tok::Ident(name), Tok::Semi] = w {
                if m == "mod" {
                    let (flat, nested) = (format!("{dir}{name}.rs"), format!("{dir}{name}/mod.rs"));
                    let child = if src.join(&flat).is_file() { flat } else { nested };
                    assert!(src.join(&child).is_file(), "{file}: mod {name}; has no file");
                    let mut m = module.clone();
                    m.push(name.clone());
                    todo.push((m, child));
                }
            }
        }
        files.insert(module, file);
    }
    files
}

/// `file -> files (or "rhai") it points at`, over every file of the library under `src`
/// (`main.rs` is the binary, its own crate). Files are named relative to `src`, with `/`.
fn file_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = module_files(src);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        let t = tokens(&code(&text));
        let mut found: Vec<(Vec<String>, Vec<String>)> = vec![]; // (module the path is written in, path)
        let (mut depth, mut inline): (usize, Vec<(String, usize)>) = (0, vec![]);
        let here = |inline: &[(String, usize)]| {
            module.iter().cloned().chain(inline.iter().map(|(m, _)| m.clone())).collect::<Vec<_>>()
        };
        let mut i = 0;
        while i < t.len() {
            match &t[i] {
                Tok::Open => depth += 1,
                Tok::Close => {
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                    depth = depth.saturating_sub(1);
                }
                Tok::Ident(w) if w == "mod" => {
                    if let (Some(Tok::Ident(name)), Some(Tok::Open)) = (t.get(i + 1), t.get(i + 2)) {
                        inline.push((name.clone(), depth + 1));
                    }
                }
                Tok::Ident(w) if w == "use" => {
                    let mut out = vec![];
                    i = use_tree(&t, i + 1, &[], &mut out);
                    let m = here(&inline);
                    found.extend(out.into_iter().map(|p| (m.clone(), p)));
                    continue;
                }
                Tok::Ident(w) if w == "extern" && t.get(i + 1) == Some(&Tok::Ident("crate".into())) => {
                    if let Some(Tok::Ident(name)) = t.get(i + 2) {
                        found.push((here(&inline), vec![name.clone()]));
                    }
                }
                // `rhai::...` anywhere, `::rhai::...` included: no module of the crate is named rhai.
                Tok::Ident(w) if w == "rhai" && t.get(i + 1) == Some(&Tok::Sep) => {
                    found.push((here(&inline), vec![w.clone()]))
                }
                Tok::Ident(w) if t.get(i + 1) == Some(&Tok::Sep) && (i == 0 || t[i - 1] != Tok::Sep) => {
                    let mut p = vec![w.clone()];
                    let mut j = i + 1;
                    while t.get(j) == Some(&Tok::Sep) {
                        let Some(Tok::Ident(s)) = t.get(j + 1) else { break };
                        p.push(s.clone());
                        j += 2;
                    }
                    found.push((here(&inline), p));
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        let out = edges.entry(file.clone()).or_default();
        for (at, p) in found {
            if let Some(target) = resolve(&files, &at, &p) {
                if &target != file {
                    out.insert(target);
                }
            }
        }
    }
    edges
}

/// The file a path written in module `at` points at (the file of its longest module prefix),
/// `rhai` for the Rhai crate, `None` for other crates and names that are no module path.
fn resolve(files: &BTreeMap<Vec<String>, String>, at: &[String], path: &[String]) -> Option<String> {
    let mut base: Vec<String> = at.to_vec();
    let mut k = 0;
    match path[0].as_str() {
        "crate" => {
            base.clear();
            k = 1;
        }
        "super" => {
            while path.get(k).map(String::as_str) == Some("super") {
                base.pop();
                k += 1;
            }
        }
        "self" => k = 1,
        "rhai" => return Some("rhai".into()),
        first => {
            let mut child = at.to_vec();
            child.push(first.to_string());
            if !files.contains_key(&child) {
                return None;
            }
        }
    }
    base.extend(path[k..].iter().filter(|s| *s != "self").cloned());
    (0..=base.len()).rev().find_map(|n| files.get(&base[..n]).cloned())
}

/// The numeric core: every file under `model/`, `analysis/` and `prune/` but their script
/// submodules.
fn is_numeric(file: &str) -> bool {
    ["model/", "analysis/", "prune/"].iter().any(|d| file.starts_with(d))
        && !file.split('/').any(|c| c.starts_with("script"))
}

/// Rhai and the script layer: `rhai`, `engine/`, and any module named `script*`
/// (`script/`, `model/script/`, `data/script.rs`, ...).
fn is_script_layer(node: &str) -> bool {
    node == "rhai"
        || node.starts_with("engine/")
        || node == "engine.rs"
        || node.split('/').any(|c| c.starts_with("script"))
}

/// One line per numeric file that reaches Rhai or the script layer: the file and the shortest
/// path of edges, `model/gguf.rs -> model/bytes.rs -> rhai`. Empty when the core is clean.
fn check_numeric_core(src: &Path) -> Vec<String> {
    let g = file_edges(src);
    let mut found = vec![];
    for start in g.keys().filter(|f| is_numeric(f)) {
        let mut from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start.as_str()]);
        from.insert(start, "");
        let mut hit = None;
        while let Some(v) = queue.pop_front() {
            if is_script_layer(v) {
                hit = Some(v);
                break;
            }
            for w in g.get(v).into_iter().flatten() {
                if !from.contains_key(w.as_str()) {
                    from.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        if let Some(mut v) = hit {
            let mut chain = vec![v];
            while !from[v].is_empty() {
                v = from[v];
                chain.push(v);
            }
            chain.reverse();
            found.push(format!("{start} reaches {}: {}", chain.last().unwrap(), chain.join(" -> ")));
        }
    }
    found
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_numeric_core_reaches_neither_rhai_nor_the_script_layer() {
    let g = file_edges(&src_dir());
    let numeric = g.keys().filter(|f| is_numeric(f)).count();
    assert!(numeric >= 30, "only {numeric} numeric files: is the walk of src/ broken?");
    // The edges are seen at all: `use` trees, `super::` and child-module paths, the script layer's own.
    for (from, to) in [
        ("model/mod.rs", "device.rs"),
        ("model/gguf.rs", "model/bytes.rs"),
        ("analysis/ablation.rs", "metrics/bleu.rs"),
        ("analysis/result.rs", "table.rs"),
        ("data/script.rs", "rhai"),
        ("device/script.rs", "script/convert.rs"),
        ("engine/registry.rs", "device/script.rs"),
    ] {
        assert!(g.get(from).is_some_and(|e| e.contains(to)), "{from} -> {to} not found: {:#?}", g.get(from));
    }
    let found = check_numeric_core(&src_dir());
    assert!(found.is_empty(), "the numeric core reaches Rhai or the script layer:\n{}", found.join("\n"));
}

/// The check itself finds a path into Rhai: a planted tree where a numeric file reaches `rhai`
/// through a helper outside the core, and one where it does not.
#[test]
fn a_planted_edge_into_rhai_is_found() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod model;\npub mod output;\npub mod engine;\n");
    write("model/mod.rs", "pub mod gguf;\n");
    write("model/gguf.rs", "use crate::output::fixed;\npub fn f() -> String { fixed(1.0) }\n");
    write("output.rs", "pub fn fixed(x: f64) -> String { format!(\"{x}\") }\n");
    write("engine/mod.rs", "pub fn run() {}\n");
    assert!(check_numeric_core(src).is_empty(), "a clean tree reported: {:?}", check_numeric_core(src));
    write("output.rs", "use rhai::Dynamic;\npub fn fixed(x: f64) -> String { Dynamic::from(x).to_string() }\n");
    let found = check_numeric_core(src);
    assert!(
        found
            .iter()
            .any(|l| l.starts_with("model/gguf.rs reaches rhai") && l.contains("model/gguf.rs -> output.rs -> rhai")),
        "the planted edge was not found: {found:?}"
    );
}

#[test]
fn every_file_is_found_through_its_mod_declaration() {
    let files = module_files(&src_dir());
    let mut all = vec![];
    rust_files(&src_dir(), &mut all);
    let named: BTreeSet<String> = files.values().cloned().collect();
    let rel = |p: &Path| p.strip_prefix(src_dir()).unwrap().to_string_lossy().replace('\\', "/");
    let missing: Vec<String> = all.iter().map(|p| rel(p)).filter(|r| r != "main.rs" && !named.contains(r)).collect();
    assert!(missing.is_empty(), "files no `mod` declaration reaches: {missing:?}");
    for (module, file) in &files {
        assert_eq!(module, &module_of(file), "{file}");
    }
}

/// A copy of `src/` with `line` appended to `file`.
fn planted(file: &str, line: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut files = vec![];
    rust_files(&src_dir(), &mut files);
    for f in files {
        let to = dir.path().join(f.strip_prefix(src_dir()).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&f, &to).unwrap();
    }
    let p = dir.path().join(file);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{file}: {e}"));
    std::fs::write(&p, format!("{text}\n{line}\n")).unwrap();
    dir
}

#[test]
fn a_planted_use_of_rhai_in_the_model_is_reported() {
    assert!(check_numeric_core(&src_dir()).is_empty(), "the real tree must pass first");
    let dir = planted("model/bytes.rs", "use rhai::Dynamic;");
    let found = check_numeric_core(dir.path());
    assert!(found.contains(&"model/bytes.rs reaches rhai: model/bytes.rs -> rhai".to_string()), "{found:#?}");
    // The readers that use the cursor reach Rhai through it.
    assert!(
        found.contains(&"model/gguf.rs reaches rhai: model/gguf.rs -> model/bytes.rs -> rhai".to_string()),
        "{found:#?}"
    );
    assert!(found.iter().all(|l| l.ends_with("-> rhai")), "{found:#?}");
    // A leading `::` and a path in an expression are edges too.
    let dir = planted("model/loss.rs", "fn planted() -> ::rhai::INT { 0 }");
    assert!(check_numeric_core(dir.path()).contains(&"model/loss.rs reaches rhai: model/loss.rs -> rhai".to_string()));
}

#[test]
fn a_planted_edge_to_a_file_that_uses_rhai_is_reported() {
    // grid.rs is no script file, but it uses rhai.
    assert!(file_edges(&src_dir())["grid.rs"].contains("rhai"), "the test needs a non-script file that uses rhai");
    let dir = planted("model/hooks.rs", "use crate::grid::Grid;");
    let found = check_numeric_core(dir.path());
    // grid.rs uses rhai and the script layer (a grid is indexed by a script `Head`): the
    // shortest path to either is reported.
    assert!(
        found.iter().any(|l| l.starts_with("model/hooks.rs reaches ") && l.contains(": model/hooks.rs -> grid.rs -> ")),
        "{found:#?}"
    );
    // Every numeric file that uses the trace reaches it through hooks.rs, the transformer among them.
    assert!(
        found
            .iter()
            .any(|l| l.starts_with("model/transformer.rs reaches ") && l.contains("model/hooks.rs -> grid.rs -> ")),
        "{found:#?}"
    );
}

#[test]
fn a_script_import_reached_through_another_file_is_reported() {
    // shard.rs is no numeric file, but data/mod.rs (which the analyses use) uses it.
    let dir = planted("shard.rs", "use crate::script::convert::Opts;");
    let found = check_numeric_core(dir.path());
    let line = found
        .iter()
        .find(|l| l.starts_with("analysis/ablation.rs "))
        .unwrap_or_else(|| panic!("analysis/ablation.rs not reported: {found:#?}"));
    assert!(line.ends_with("-> data/mod.rs -> shard.rs -> script/convert.rs"), "{line}");
    // A test module may use anything.
    let dir = planted("model/bytes.rs", "#[cfg(test)]\nmod planted_tests {\n    use rhai::Dynamic;\n}");
    assert!(check_numeric_core(dir.path()).is_empty());
}

#[test]
fn use_trees_and_relative_paths_resolve_to_files() {
    let files: BTreeMap<Vec<String>, String> = ["lib.rs", "a/mod.rs", "a/b.rs", "a/c/mod.rs", "a/c/d.rs", "e.rs"]
        .iter()
        .map(|f| (module_of(f), f.to_string()))
        .collect();
    let at = |m: &str| if m.is_empty() { vec![] } else { m.split("::").map(String::from).collect::<Vec<_>>() };
    let mut paths = vec![];
    let t = tokens(&code("use crate::{a::{self, b::X}, e::{f as g, *}}; // crate::nothing\n"));
    use_tree(&t, 1, &[], &mut paths);
    let got: Vec<Option<String>> = paths.iter().map(|p| resolve(&files, &at("a::c::d"), p)).collect();
    assert_eq!(got, [Some("a/mod.rs"), Some("a/b.rs"), Some("e.rs"), Some("e.rs")].map(|s| s.map(String::from)));
    let p = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    assert_eq!(resolve(&files, &at("a::c::d"), &p("super::super::b::Y")), Some("a/b.rs".into()));
    assert_eq!(resolve(&files, &at("a::c"), &p("d::Z")), Some("a/c/d.rs".into()));
    assert_eq!(resolve(&files, &at("a::c"), &p("tch::Tensor")), None);
    assert_eq!(resolve(&files, &at("a"), &p("rhai::Map")), Some("rhai".into()));
    // Comments and strings hold no paths.
    assert_eq!(
        tokens(&code("/* crate::x */ let s = \"crate::y\"; let r = r#\"rhai::Z\"#; let c = '{';"))
            .iter()
            .filter(|t| matches!(t, Tok::Sep))
            .count(),
        0
    );
}
