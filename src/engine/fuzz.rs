//! The script-API fuzzer (docs/fuzzing.md#the-script-api): every function the engine registers,
//! found in its own metadata, called from its documented example with one argument (or one
//! option of an options map) changed at a time to a value from a hostile dictionary; each
//! outcome checked against the defect classes, in a fresh session per call.
//!
//! A function counts as covered when one call of it succeeded (its unchanged example). The
//! runner is deterministic for a seed; `tests/scripting/fuzz_api.rs` runs the short form and
//! `scripts/fuzz-api` the long one (a process per stretch of cases, so a crash, a hang or the
//! memory watchdog costs one case, recorded as a defect, and the run goes on).

use super::{docs, ErrorKind, Session, SessionOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// One function as the fuzzer reaches it: its name as called, and its examples' code.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub examples: Vec<String>,
}

/// The functions of the engine's metadata with their (succeeding) examples, by name, sorted:
/// overloads share a name and pool their examples.
pub fn targets(s: &Session) -> Vec<Target> {
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in docs::all_docs(s.engine()) {
        let ex = d.examples().into_iter().filter(|e| !e.must_fail).map(|e| e.code);
        let v = by_name.entry(d.name.clone()).or_default();
        for code in ex {
            if !v.contains(&code) {
                v.push(code);
            }
        }
    }
    by_name.into_iter().map(|(name, examples)| Target { name, examples }).collect()
}

/// One call to make: the example with one argument changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub func: String,
    pub code: String,
    /// What was changed: `argument 2`, or `option 'k'`, and the value put there.
    pub changed: String,
    /// The option's name when an option was changed.
    pub option: Option<String>,
    /// The 1-based line of the changed call in `code`.
    pub line: usize,
    /// The 1-based line and column (in characters) of the changed call's closing parenthesis:
    /// an error positioned after it comes from what reads the call's result on that line
    /// (`d.skip(n)[0]`), not from the call.
    pub close: (usize, usize),
    /// Whether the value put there is NaN or infinite (a NaN result may then be due).
    pub non_finite: bool,
}

/// A found defect.
#[derive(Debug, Clone)]
pub struct Defect {
    pub class: &'static str,
    pub case: Case,
    pub detail: String,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub calls: usize,
    /// Functions of the metadata (with an example).
    pub functions: usize,
    /// Functions with a call that succeeded.
    pub covered: BTreeSet<String>,
    /// Functions whose example did not run unchanged (nothing to change from).
    pub unrunnable: BTreeMap<String, String>,
    /// Distinct error messages (first line, numbers and quoted values blurred).
    pub errors: BTreeSet<String>,
    pub defects: Vec<Defect>,
}

/// The hostile dictionary: what any argument or option value is replaced by.
pub fn hostile() -> Vec<&'static str> {
    vec![
        "0",
        "-1",
        "9223372036854775807",
        "-9223372036854775807",
        "1000000000",
        "0.0",
        "-1.0",
        "1e300",
        "1e-300",
        "(0.0 / 0.0)",
        "(1.0 / 0.0)",
        "(-1.0 / 0.0)",
        "\"\"",
        "\"dec.99.0\"",
        "\"enc.0.999\"",
        "\"no such thing\"",
        "HUGE_STRING",
        "[]",
        "[[[]]]",
        "[1, \"a\", ()]",
        "[\"dec.0.999\"]",
        "[-1]",
        "#{}",
        "#{bogus: 1}",
        "()",
        "true",
        "5..1",
        "-3..2",
    ]
}

/// The dictionary's `HUGE_STRING`: 100,000 characters.
fn expand(v: &str) -> String {
    if v == "HUGE_STRING" {
        format!("\"{}\"", "ab".repeat(50_000))
    } else {
        v.to_string()
    }
}

/// A call site: the byte spans of each argument (trimmed).
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    pub args: Vec<(usize, usize)>,
    /// The byte index of the closing parenthesis.
    pub close: usize,
}

/// Whether `c` can be part of an identifier.
fn ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The end of the string or comment starting at `i` (a quote or `//`), else `i`.
fn skip_literal(b: &[u8], i: usize) -> usize {
    match b[i] {
        q @ (b'"' | b'`') => {
            let mut j = i + 1;
            while j < b.len() && b[j] != q {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        }
        b'\'' if i + 2 < b.len() => {
            // A char literal ('a', '\n'); an apostrophe elsewhere is left alone.
            let end = if b[i + 1] == b'\\' { i + 3 } else { i + 2 };
            if end < b.len() && b[end] == b'\'' {
                end + 1
            } else {
                i
            }
        }
        b'/' if b.get(i + 1) == Some(&b'/') => b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p),
        _ => i,
    }
}

/// The spans of the comma-separated items between `open + 1` and the matching closer, and the
/// closer's index; `None` when unbalanced.
fn items(b: &[u8], open: usize) -> Option<(Vec<(usize, usize)>, usize)> {
    let mut depth = 0usize;
    let mut start = open + 1;
    let mut out = Vec::new();
    let mut i = open + 1;
    while i < b.len() {
        let j = skip_literal(b, i);
        if j != i {
            i = j;
            continue;
        }
        match b[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth == 0 => {
                push_trimmed(b, start, i, &mut out);
                return Some((out, i));
            }
            b')' | b']' | b'}' => depth -= 1,
            b',' if depth == 0 => {
                push_trimmed(b, start, i, &mut out);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn push_trimmed(b: &[u8], mut s: usize, mut e: usize, out: &mut Vec<(usize, usize)>) {
    while s < e && b[s].is_ascii_whitespace() {
        s += 1;
    }
    while e > s && b[e - 1].is_ascii_whitespace() {
        e -= 1;
    }
    if e > s {
        out.push((s, e));
    }
}

/// Every call `name(...)` or `.name(...)` in `code` (not a definition `fn name(`), outside
/// strings and comments.
pub fn call_sites(code: &str, name: &str) -> Vec<Site> {
    let b = code.as_bytes();
    let n = name.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let j = skip_literal(b, i);
        if j != i {
            i = j;
            continue;
        }
        if b[i..].starts_with(n) && (i == 0 || !ident(b[i - 1]) && b[i - 1] != b':') {
            let mut k = i + n.len();
            while k < b.len() && b[k] == b' ' {
                k += 1;
            }
            let defined = code[..i].trim_end().ends_with("fn");
            if k < b.len() && b[k] == b'(' && !ident(*b.get(i + n.len()).unwrap_or(&b' ')) && !defined {
                if let Some((args, close)) = items(b, k) {
                    out.push(Site { args, close });
                }
            }
        }
        i += 1;
    }
    out
}

/// The entries `key: value` of a map literal `#{...}` spanning `s..e` of `code`: each value's
/// span and its key.
fn map_entries(code: &str, s: usize, e: usize) -> Vec<(String, (usize, usize))> {
    let b = code.as_bytes();
    if !code[s..e].starts_with("#{") {
        return vec![];
    }
    let Some((entries, _)) = items(b, s + 1) else { return vec![] };
    entries
        .into_iter()
        .filter_map(|(es, ee)| {
            let text = &code[es..ee];
            let colon = text.find(':')?;
            let key = text[..colon].trim().trim_matches('"').to_string();
            let mut vs = es + colon + 1;
            while vs < ee && b[vs].is_ascii_whitespace() {
                vs += 1;
            }
            (vs < ee && !key.is_empty()).then_some((key, (vs, ee)))
        })
        .collect()
}

/// A hostile value as a report names it.
fn shown(v: &str) -> &str {
    if v == "HUGE_STRING" {
        "a 100,000-character string"
    } else {
        v
    }
}

/// Every case of one example: each argument of each call of `func` in it, and each entry of an
/// options map, replaced by each hostile value; and each option `func` declares
/// (`registry::options_of_call`) that the example's map leaves out, added with each value.
pub fn cases(func: &str, code: &str) -> Vec<Case> {
    let mut out = Vec::new();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    // The line and column of byte `at` of `new` (a case's code).
    let position = |new: &str, at: usize| {
        let mut at = at.min(new.len());
        while !new.is_char_boundary(at) {
            at -= 1;
        }
        let start = new[..at].rfind('\n').map_or(0, |p| p + 1);
        (new[..at].matches('\n').count() + 1, new[start..at].chars().count() + 1)
    };
    // The example up to the end of the changed call's line: what follows reads its result
    // (asserts of the unchanged values), and would only cost time.
    let replaced = |(s, e): (usize, usize), v: &str| {
        let end = code[e..].find('\n').map_or(code.len(), |p| e + p);
        format!("{}{}{}", &code[..s], expand(v), &code[e..end])
    };
    for site in call_sites(code, func) {
        for (ai, &span) in site.args.iter().enumerate() {
            let mut spans = vec![(format!("argument {}", ai + 1), None, span)];
            for (key, vspan) in map_entries(code, span.0, span.1) {
                spans.push((format!("option '{key}'"), Some(key), vspan));
            }
            // The declared options the example leaves out, each put in front of its map.
            let present: Vec<String> = spans.iter().filter_map(|(_, k, _)| k.clone()).collect();
            if code[span.0..span.1].starts_with("#{") {
                let declared = super::registry::options_of_call(func, Some("")).unwrap_or_default();
                let empty = code[span.0 + 2..span.1 - 1].trim().is_empty();
                for o in declared.iter().filter(|o| !present.iter().any(|p| p == o.name)) {
                    for v in hostile() {
                        let end = code[span.1..].find('\n').map_or(code.len(), |p| span.1 + p);
                        let sep = if empty { "" } else { ", " };
                        let added = format!("{}: {}{sep}", o.name, expand(v));
                        let new = format!("{}{added}{}", &code[..span.0 + 2], &code[span.0 + 2..end]);
                        out.push(Case {
                            func: func.to_string(),
                            close: position(&new, site.close + added.len()),
                            code: new,
                            changed: format!("option '{}' (added) = {}", o.name, shown(v)),
                            option: Some(o.name.to_string()),
                            line: line_of(span.0),
                            non_finite: v.contains("/ 0.0"),
                        });
                    }
                }
            }
            for (what, option, span) in spans {
                for v in hostile() {
                    if code[span.0..span.1].trim() == v {
                        continue;
                    }
                    let new = replaced(span, v);
                    out.push(Case {
                        func: func.to_string(),
                        close: position(&new, site.close + expand(v).len() - (span.1 - span.0)),
                        code: new,
                        changed: format!("{what} = {}", shown(v)),
                        option: option.clone(),
                        line: line_of(span.0),
                        non_finite: v.contains("/ 0.0"),
                    });
                }
            }
        }
    }
    out
}

/// The outcome of one call, in words: `Ok(text)` or the error (kind, message, line).
#[derive(Debug, Clone)]
pub enum Outcome {
    Ok(String),
    Err {
        kind: ErrorKind,
        message: String,
        /// The error's line and column in the case's code.
        at: Option<(usize, usize)>,
    },
    /// Still running past the limit (after an interrupt was sent).
    Hang,
}

/// Words of errors that must never reach a user.
const LEAKS: &[&str] = &[
    "panicked",
    "enforce fail",
    "c10::",
    "backtrace",
    "unwrap()",
    "Result::unwrap",
    "Exception raised from",
    "frame #",
];

/// Results that may hold NaN by definition (docs/fuzzing.md#the-script-api): grids and tables
/// mark removed or unswept heads and empty cells NaN.
pub const NAN_ALLOWED: &[&str] = &["Grid", "Table", "grid", "table"];

/// The defect `case`'s outcome shows, if any. `baseline_nan`: the unchanged example's result
/// held NaN already. `alive`: the session answered the next valid call.
pub fn classify(case: &Case, outcome: &Outcome, baseline_nan: bool, alive: bool) -> Option<Defect> {
    let defect = |class: &'static str, detail: String| Some(Defect { class, case: case.clone(), detail });
    if !alive {
        return defect("session died", "the next valid call failed".into());
    }
    match outcome {
        Outcome::Hang => defect("hang", "still running after the limit and an interrupt".into()),
        Outcome::Ok(text) => {
            let nan = text.contains("NaN") || text.contains("nan");
            let allowed = NAN_ALLOWED.iter().any(|t| text.contains(t));
            if nan && !baseline_nan && !case.non_finite && !allowed {
                return defect("NaN result", first_line(text));
            }
            None
        }
        Outcome::Err { kind, message, at } => {
            if *kind == ErrorKind::Panic || LEAKS.iter().any(|w| message.contains(w)) {
                return defect("panic", first_line(message));
            }
            // libtorch refused an operation headscope should have checked first: its message
            // names a tensor shape, not the argument at fault.
            if message.contains("Internal torch error") {
                return defect("unchecked tensor op", first_line(message));
            }
            // An error on the changed call must say which function; an option changed, which
            // option. The example's own assertions (on the same line or not) may fail.
            let assertion = message.to_lowercase().starts_with("assertion failed");
            // An index (`c["name"]`) has no function name a person types.
            let indexed = case.func.starts_with("index$");
            // An error after the call's closing parenthesis is what read its result.
            let on_call = matches!(at, Some(p) if p.0 == case.line && *p <= case.close);
            if on_call && matches!(kind, ErrorKind::Runtime) && !assertion && !indexed {
                let short = case.func.rsplit("::").next().unwrap_or(&case.func);
                if !message.contains(short) {
                    return defect("unnamed function", first_line(message));
                }
                if let Some(k) = &case.option {
                    let generic = message.contains("Function not found");
                    if !generic && !message.contains(k.as_str()) {
                        return defect("unnamed option", first_line(message));
                    }
                }
            }
            None
        }
    }
}

fn first_line(s: &str) -> String {
    let l = s.lines().next().unwrap_or_default();
    if l.chars().count() > 300 {
        format!("{}...", l.chars().take(300).collect::<String>())
    } else {
        l.to_string()
    }
}

/// An error's first line with numbers and quoted values blurred, to count distinct messages.
pub fn blurred(message: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    for c in first_line(message).chars() {
        match c {
            '\'' | '"' | '`' => {
                quoted = !quoted;
                out.push('_');
            }
            _ if quoted => {}
            c if c.is_ascii_digit() => {
                if !out.ends_with('#') {
                    out.push('#');
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// What the long form calls before each case (its index and the case).
pub type BeforeFn = Box<dyn FnMut(usize, &Case)>;
/// What is called on each defect as it is found.
pub type DefectFn = Box<dyn FnMut(&Defect)>;

/// How a run is set up.
pub struct Config {
    /// Cases are shuffled by this seed (a splitmix64 stream).
    pub seed: u64,
    /// Stop after this long.
    pub budget: Duration,
    /// A call still running after this is interrupted; after twice this, a hang.
    pub limit: Duration,
    /// Only functions whose name contains one of these (all when empty).
    pub only: Vec<String>,
    /// Called on each fresh session (a test registers a planted defect here).
    pub setup: Option<fn(&mut Session)>,
    /// Run each function's examples unchanged first (coverage). The short form leaves this to
    /// `tests/scripting/doc_examples.rs`, which runs every example anyway, and counts as
    /// covered the functions a changed call of which succeeded.
    pub coverage: bool,
    /// The first case to run (the long form's restarts skip the ones done).
    pub skip: usize,
    /// Called before each case with its index (the long form records where it is).
    pub before: Option<BeforeFn>,
    /// At most this many changed calls (the short form's fixed set: the first N of the seed's
    /// order, the same on every machine); `None`: until the budget is spent.
    pub max_cases: Option<usize>,
    /// Called on each defect as it is found (the long form writes it before anything can kill
    /// the process).
    pub on_defect: Option<DefectFn>,
    /// The long form's watchdog: a call still running after this exits the process (code 3),
    /// and a resident set above `memory` bytes exits it (code 4); its driver records the case
    /// as a hang or a memory defect and restarts past it. `None`: interrupt only.
    pub hard: Option<Hard>,
}

/// The long form's process-level limits.
#[derive(Debug, Clone, Copy)]
pub struct Hard {
    pub limit: Duration,
    pub memory: u64,
}

/// This process's peak resident set in bytes (Linux `VmHWM`), else 0.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()))
        })
        .map_or(0, |kb| kb * 1024)
}

/// This process's resident set in bytes (Linux), else 0.
pub fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

/// A fresh session, the process-wide settings a call may have changed put back (the memory
/// budget, libtorch's threads: a changed example may stop before it restores them).
fn fresh(setup: Option<fn(&mut Session)>) -> Session {
    crate::budget::set_limit(0);
    crate::budget::set_past_positions(None);
    THREADS.with(|t| {
        let n = *t.get_or_init(tch::get_num_threads);
        if tch::get_num_threads() != n {
            tch::set_num_threads(n);
        }
    });
    let mut s = Session::new(SessionOptions::default());
    if let Some(f) = setup {
        f(&mut s);
    }
    s
}

thread_local! {
    /// libtorch's threads when the fuzzer first made a session.
    static THREADS: std::cell::OnceCell<i32> = const { std::cell::OnceCell::new() };
}

/// Runs `code` in `s` with a watchdog: interrupted after `limit`; a hang when it is still running
/// after twice that (the thread is left to finish; the long form exits instead).
fn run_one(s: &mut Session, code: &str, limit: Duration, hard: Option<Hard>) -> Outcome {
    let handle = s.interrupt_handle();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let watchdog = std::thread::spawn(move || {
        let t = Instant::now();
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            if t.elapsed() > limit {
                handle.trigger();
            }
            if let Some(h) = hard {
                if t.elapsed() > h.limit {
                    eprintln!("fuzz: hang: still running after {:?}", h.limit);
                    std::process::exit(3);
                }
                let r = rss();
                if r > h.memory {
                    eprintln!("fuzz: memory: resident {r} bytes over the budget of {}", h.memory);
                    std::process::exit(4);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let t = Instant::now();
    let r = s.eval("fuzz", code);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = watchdog.join();
    let slow = t.elapsed() > 2 * limit;
    match r {
        _ if slow => Outcome::Hang,
        Ok(out) => Outcome::Ok(out.map(|o| o.text).unwrap_or_default()),
        Err(e) => Outcome::Err {
            kind: e.kind,
            message: format!("{}\n{}", e.message, e.notes.join("\n")),
            at: e.location.as_ref().filter(|l| l.source == "fuzz").map(|l| (l.line, l.col)),
        },
    }
}

/// The entries of the working directory, by name.
fn entries() -> BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(".").map(|d| d.filter_map(|e| e.ok().map(|e| e.file_name())).collect()).unwrap_or_default()
}

/// Removes what a call wrote into the working directory under a name of the dictionary that
/// was not there before the run (a changed call writes where its hostile path says:
/// `g.to_csv("enc.0.999")`).
fn tidy(before: &BTreeSet<std::ffi::OsString>) {
    let hostile_names = ["dec.99.0", "enc.0.999", "no such thing"];
    for name in entries().difference(before) {
        // Only what the dictionary's strings name (other tests may be writing here too).
        if !hostile_names.iter().any(|h| name.to_string_lossy().contains(h)) {
            continue;
        }
        let p = std::path::Path::new(name);
        let _ = if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
    }
}

/// Whether the function `name` is fuzzed under `only` (every one when it is empty).
fn wanted(only: &[String], name: &str) -> bool {
    only.is_empty() || only.iter().any(|o| name.contains(o.as_str()))
}

/// A splitmix64 step.
fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Every case of every target (in `only`), shuffled by `seed`: the unchanged examples first
/// (coverage), then the changed calls.
pub fn plan(targets: &[Target], only: &[String], seed: u64) -> (Vec<(String, String)>, Vec<Case>) {
    let chosen = |t: &&Target| wanted(only, &t.name);
    let mut base = Vec::new();
    let mut all = Vec::new();
    for t in targets.iter().filter(chosen) {
        for code in &t.examples {
            base.push((t.name.clone(), code.clone()));
            all.extend(cases(&t.name, code));
        }
    }
    let mut state = seed;
    for i in (1..all.len()).rev() {
        let j = (mix(&mut state) % (i as u64 + 1)) as usize;
        all.swap(i, j);
    }
    (base, all)
}

/// Runs the fuzzer: each function's examples unchanged (coverage, and whether their result
/// holds NaN), then changed calls until the budget is spent.
pub fn run(mut cfg: Config) -> Report {
    let start = Instant::now();
    let probe = fresh(cfg.setup);
    let targets = targets(&probe);
    drop(probe);
    let (base, cases) = plan(&targets, &cfg.only, cfg.seed);
    let mut report =
        Report { functions: targets.iter().filter(|t| wanted(&cfg.only, &t.name)).count(), ..Report::default() };
    let before = entries();
    let mut nan_base: BTreeSet<String> = BTreeSet::new();
    for t in targets.iter().filter(|t| t.examples.is_empty()) {
        if wanted(&cfg.only, &t.name) {
            report.unrunnable.insert(t.name.clone(), "no example that runs (only examples of errors)".into());
        }
    }
    for (name, code) in base.iter().filter(|_| cfg.coverage) {
        let mut s = fresh(cfg.setup);
        report.calls += 1;
        match run_one(&mut s, code, cfg.limit, cfg.hard) {
            Outcome::Ok(text) => {
                report.covered.insert(name.clone());
                if text.contains("NaN") {
                    nan_base.insert(code.clone());
                }
            }
            Outcome::Err { message, .. } => {
                report.unrunnable.entry(name.clone()).or_insert_with(|| first_line(&message));
            }
            Outcome::Hang => {
                report.unrunnable.entry(name.clone()).or_insert_with(|| "hang".into());
            }
        }
    }
    for name in &report.covered {
        report.unrunnable.remove(name);
    }
    let base_of = |c: &Case| base.iter().find(|(n, _)| *n == c.func).map(|(_, code)| nan_base.contains(code));
    let last = cfg.max_cases.map_or(cases.len(), |n| (cfg.skip + n).min(cases.len()));
    for (i, case) in cases.iter().enumerate().take(last).skip(cfg.skip) {
        if start.elapsed() > cfg.budget {
            break;
        }
        if let Some(f) = cfg.before.as_mut() {
            f(i, case);
        }
        let mut s = fresh(cfg.setup);
        report.calls += 1;
        let outcome = run_one(&mut s, &case.code, cfg.limit, cfg.hard);
        tidy(&before);
        let alive =
            matches!(&outcome, Outcome::Hang) || matches!(s.eval("after", "40 + 2"), Ok(Some(o)) if o.text == "42");
        match &outcome {
            Outcome::Err { message, .. } => {
                report.errors.insert(blurred(message));
            }
            Outcome::Ok(_) => {
                report.covered.insert(case.func.clone());
            }
            Outcome::Hang => {}
        }
        if let Some(d) = classify(case, &outcome, base_of(case).unwrap_or(false), alive) {
            if let Some(f) = cfg.on_defect.as_mut() {
                f(&d);
            }
            report.defects.push(d);
        }
    }
    report
}

impl Report {
    /// The summary the long form prints: counts, then each defect class with an example.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "calls {}, functions covered {} of {}, distinct errors {}, defects {}\n",
            self.calls,
            self.covered.len(),
            self.functions,
            self.errors.len(),
            self.defects.len()
        );
        for (name, why) in &self.unrunnable {
            out.push_str(&format!("  not covered: {name}: {why}\n"));
        }
        let mut by_class: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for d in &self.defects {
            *by_class.entry((d.class, d.case.func.as_str())).or_default() += 1;
        }
        for ((class, func), n) in by_class {
            let d = self.defects.iter().find(|d| d.class == class && d.case.func == func);
            let (changed, detail) =
                d.map_or((String::new(), String::new()), |d| (d.case.changed.clone(), d.detail.clone()));
            out.push_str(&format!("  defect {class}: {func} x{n}: {changed}: {detail}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_sites_split_arguments_and_skip_strings_and_definitions() {
        let code = "fn f(x) { x }\nlet a = m.f(d, [1, 2], #{k: \"a, b\", n: 3});\nprint(\"f(1)\"); g.f( 7 )";
        let sites = call_sites(code, "f");
        assert_eq!(sites.len(), 2, "{sites:?}");
        let args: Vec<&str> = sites[0].args.iter().map(|&(s, e)| &code[s..e]).collect();
        assert_eq!(args, ["d", "[1, 2]", "#{k: \"a, b\", n: 3}"]);
        assert_eq!(&code[sites[1].args[0].0..sites[1].args[0].1], "7");
        let (s, e) = sites[0].args[2];
        let entries: Vec<(String, &str)> =
            map_entries(code, s, e).into_iter().map(|(k, (a, b))| (k, &code[a..b])).collect();
        assert_eq!(entries, [("k".to_string(), "\"a, b\""), ("n".to_string(), "3")]);
    }

    #[test]
    fn cases_change_one_argument_or_option_at_a_time() {
        let code = "let r = m.top(5, #{by: \"x\"});";
        let cs = cases("top", code);
        let n = hostile().len();
        // Argument 1 and 2 each take every value (but their own); the option too.
        assert!(cs.len() >= 3 * (n - 1), "{}", cs.len());
        assert!(cs.iter().any(|c| c.code == "let r = m.top(-1, #{by: \"x\"});" && c.changed == "argument 1 = -1"));
        assert!(cs.iter().any(|c| c.code == "let r = m.top(5, #{by: ()});" && c.option.as_deref() == Some("by")));
        // A declared option the example leaves out is added to its map, in front.
        let cs = cases("prune", "let r = m.prune(d, #{steps: 2});");
        assert!(cs.iter().any(|c| c.code == "let r = m.prune(d, #{beta: 1e-300, steps: 2});"
            && c.option.as_deref() == Some("beta")
            && c.changed == "option 'beta' (added) = 1e-300"));
        let cs = cases("prune", "let r = m.prune(d, #{});");
        assert!(cs.iter().any(|c| c.code == "let r = m.prune(d, #{lambda: -1});"));
        // What follows the changed call's line is left out.
        let cs = cases("f", "let a = f(1);\nassert(a == 2);\n");
        assert!(cs.iter().all(|c| !c.code.contains("assert")), "{:?}", cs[0].code);
        // `close` is the changed call's closing parenthesis in the case's code.
        let cs = cases("skip", "let d = c;\nlet x = d.skip(5)[0] + f(#{a: 1});");
        for c in cases("prune", "let r = m.prune(d, #{steps: 2})[0];").iter().chain(&cs) {
            let line = c.code.lines().nth(c.close.0 - 1).unwrap();
            assert_eq!(line.chars().nth(c.close.1 - 1), Some(')'), "{} at {:?}", c.code, c.close);
            assert_eq!(line.chars().nth(c.close.1), Some('['), "{} at {:?}", c.code, c.close);
        }
    }

    #[test]
    fn classes() {
        let case = Case {
            func: "top".into(),
            code: String::new(),
            changed: "option 'k' = -1".into(),
            option: Some("k".into()),
            line: 1,
            close: (1, 20),
            non_finite: false,
        };
        let err =
            |kind, m: &str, line: Option<usize>| Outcome::Err { kind, message: m.into(), at: line.map(|l| (l, 5)) };
        assert_eq!(classify(&case, &err(ErrorKind::Panic, "x", Some(1)), false, true).unwrap().class, "panic");
        assert_eq!(
            classify(&case, &err(ErrorKind::Runtime, "bad", Some(1)), false, true).unwrap().class,
            "unnamed function"
        );
        let torch = "top: torch: Internal torch error: shape '[2, 3]' is invalid (libtorch's C++ trace left out)";
        assert_eq!(
            classify(&case, &err(ErrorKind::Runtime, torch, Some(1)), false, true).unwrap().class,
            "unchecked tensor op"
        );
        assert_eq!(
            classify(&case, &err(ErrorKind::Runtime, "top: bad", Some(1)), false, true).unwrap().class,
            "unnamed option"
        );
        assert!(classify(&case, &err(ErrorKind::Runtime, "top: option 'k' is -1", Some(1)), false, true).is_none());
        // An error on another line (the example's own assert) is the example's business.
        assert!(classify(&case, &err(ErrorKind::Runtime, "assertion failed", Some(2)), false, true).is_none());
        assert!(classify(&case, &err(ErrorKind::Runtime, "assertion failed", Some(1)), false, true).is_none());
        assert_eq!(classify(&case, &Outcome::Ok("NaN".into()), false, true).unwrap().class, "NaN result");
        assert!(classify(&case, &Outcome::Ok("NaN".into()), true, true).is_none());
        assert_eq!(classify(&case, &Outcome::Ok("1".into()), false, false).unwrap().class, "session died");
        assert_eq!(blurred("top: k is 12 ('abc')"), "top: k is # (__)");
        // An error after the call's closing parenthesis (an index of its result) is not the call's.
        let after =
            Outcome::Err { kind: ErrorKind::Runtime, message: "index 0 out of range".into(), at: Some((1, 21)) };
        assert!(classify(&case, &after, false, true).is_none());
        let inside =
            Outcome::Err { kind: ErrorKind::Runtime, message: "index 0 out of range".into(), at: Some((1, 20)) };
        assert_eq!(classify(&case, &inside, false, true).unwrap().class, "unnamed function");
    }
}
