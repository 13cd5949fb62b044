//! Every REPL session shown in the README and the guide (`docs/guide.md`, the sections the
//! README's recipes link) runs as written: each ```text block's `hs> ` inputs
//! (with their `... ` continuation lines) are evaluated in order in one fresh session, `:`
//! commands included, and none may fail. Files they write land in a temporary directory.
//! Each session is then written with `:save` and replayed by `headscope run`, which must print
//! what the session showed, in the same order; and what the README shows after each input is
//! what that input prints now (durations aside), so the README cannot go stale.

use headscope::engine::commands::{self, Outcome};
use headscope::engine::{Event, Session, SessionOptions};
use std::cell::RefCell;
use std::rc::Rc;

/// A README session: the line its block starts at, its inputs, and the lines the README shows
/// each input printing (`outputs[i]`: the lines between input i and the next).
struct Shown {
    /// The file the block is in (`README.md`, `docs/guide.md`).
    file: &'static str,
    line: usize,
    inputs: Vec<String>,
    outputs: Vec<Vec<String>>,
}

/// The sessions of a Markdown text: per ```text block with `hs> ` inputs, what it shows.
fn sessions(file: &'static str, md: &str) -> Vec<Shown> {
    let mut out = Vec::new();
    let mut block: Option<Shown> = None;
    for (i, line) in md.lines().enumerate() {
        match &mut block {
            None if line.trim() == "```text" => {
                block = Some(Shown { file, line: i + 2, inputs: vec![], outputs: vec![] })
            }
            Some(_) if line.trim() == "```" => {
                let b = block.take().unwrap();
                if !b.inputs.is_empty() {
                    out.push(b);
                }
            }
            Some(b) => {
                if let Some(code) = line.strip_prefix("hs> ") {
                    b.inputs.push(code.to_string());
                    b.outputs.push(vec![]);
                } else if let (Some(more), Some(last)) = (line.strip_prefix("... "), b.inputs.last_mut()) {
                    last.push('\n');
                    last.push_str(more);
                } else if let Some(o) = b.outputs.last_mut() {
                    o.push(line.to_string());
                }
            }
            None => {}
        }
    }
    out
}

/// The README's lines for a session's output that the session did not show, in order (blank
/// lines, `...` lines and durations aside): `[]` when the README shows what the code prints now.
fn stale_lines(readme: &[String], shown: &[String]) -> Vec<String> {
    let shown = timeless(&shown.join("\n"));
    let mut rest = shown.as_str();
    let mut stale = Vec::new();
    // A line of `...` alone marks rows the README leaves out.
    for l in readme.iter().map(|l| timeless(l.trim_end())).filter(|l| !l.trim().is_empty() && l.trim() != "...") {
        match find_close(rest, &l) {
            Some(end) => rest = &rest[end..],
            None => stale.push(l),
        }
    }
    stale
}

/// How far a number the README shows may be from the one the session prints: float32 results
/// differ in their last digits between CPUs (libtorch and MKL pick AVX2 or AVX-512 kernels, whose
/// sums round in other orders). A README value is met by a printed one within `README_REL` of it
/// relatively (u32 = 6e-8 per rounding, times sqrt(accumulation length) ~ 100 for the
/// largest model the README runs, times a margin of 2 for the norms' and softmax's amplification:
/// 1.2e-5, rounded up to 2e-5), or within one unit of its last printed decimal (a table's 0.0062
/// may print as 0.0061 when the value lies on a rounding boundary). Everything else must match
/// exactly.
const README_REL: f64 = 2e-5;

/// A decimal number at the start of `s` (`-1.25`, `0.9`, `3e-5`; not an integer: counts, ids
/// and layer numbers must match exactly): its value, its length in bytes, its decimals.
fn number_at(s: &str) -> Option<(f64, usize, i32)> {
    let b = s.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == int_start || i >= b.len() || b[i] != b'.' {
        return None;
    }
    i += 1;
    let frac_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == frac_start {
        return None;
    }
    let decimals = (i - frac_start) as i32;
    let mut exp = 0;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
            j += 1;
        }
        let digits = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j > digits {
            exp = s[digits..j].parse::<i32>().ok()? * if b[digits - 1] == b'-' { -1 } else { 1 };
            i = j;
        }
    }
    Some((s[..i].parse().ok()?, i, decimals - exp))
}

/// Whether `printed` meets the README's `shown` (see [`README_REL`]).
fn close(shown: (f64, i32), printed: f64) -> bool {
    let (want, decimals) = shown;
    let unit = 10f64.powi(-decimals) * (1.0 + 1e-9);
    (printed - want).abs() <= (README_REL * want.abs()).max(unit)
}

/// Where the README line `line` ends in `text`, searched from the start: every character equal
/// except decimal numbers, which need only be [`close`]; `None` if the line is not there.
fn find_close(text: &str, line: &str) -> Option<usize> {
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    'start: for &from in &starts {
        let (mut t, mut l) = (from, 0);
        while l < line.len() {
            // A number starts at a digit or a minus sign not preceded by a word character.
            let at_word = line[..l].ends_with(|c: char| c.is_alphanumeric() || c == '.' || c == '_');
            if let (false, Some((want, lw, dec))) = (at_word, number_at(&line[l..])) {
                let prev_word = text[..t].ends_with(|c: char| c.is_alphanumeric() || c == '.' || c == '_' || c == '-');
                match number_at(&text[t..]) {
                    Some((got, tw, _)) if !prev_word && close((want, dec), got) => {
                        t += tw;
                        l += lw;
                        continue;
                    }
                    _ => continue 'start,
                }
            }
            let c = line[l..].chars().next()?;
            if !text[t..].starts_with(c) {
                continue 'start;
            }
            t += c.len_utf8();
            l += c.len_utf8();
        }
        return Some(t);
    }
    None
}

#[test]
fn numbers_match_within_the_stated_bound_and_nothing_else_does() {
    // The three values of issue 53, printed on an AVX2-only CPU.
    assert!(find_close("0.006188024395750514", "0.006188024700791361").is_some());
    assert!(find_close("4.535322666168213", "4.5353288650512695").is_some());
    assert!(find_close("x = 0.9162963007045517 y", "0.9162963042834726").is_some());
    // One unit of the last printed decimal (a rounding boundary), not two.
    assert!(find_close("| 0.0061 |", "| 0.0062 |").is_some());
    assert!(find_close("| 0.0060 |", "| 0.0062 |").is_none());
    assert!(find_close("4.6353288650512695", "4.5353288650512695").is_none(), "a real change");
    // Integers, signs, words and layer names exactly.
    assert!(find_close("enc.5.5 12 heads", "enc.5.4 12 heads").is_none());
    assert!(find_close("13 heads", "12 heads").is_none());
    assert!(find_close("-0.5", "0.5").is_none());
    assert_eq!(find_close("ab 1.25 cd", "1.25 c"), Some(9));
    assert!(find_close("loss 3.2e-5", "loss 3.20001e-5").is_some());
}

#[test]
fn stale_readme_output_is_found() {
    let shown = vec!["<Model x>".to_string(), "a  1.0 s\nb  2".to_string()];
    assert!(stale_lines(&["<Model x>".into(), "a  3.5 s".into(), "".into(), "b  2".into()], &shown).is_empty());
    assert_eq!(stale_lines(&["b  2".into(), "a  1.0 s".into()], &shown), vec!["a  # s".to_string()], "out of order");
    assert_eq!(stale_lines(&["b  3".into()], &shown), vec!["b  3".to_string()]);
    assert!(stale_lines(&["<Model x>".into(), "   ...".into(), "b  2".into()], &shown).is_empty(), "rows left out");
}

/// `text` with every duration (a number followed by ` s` or ` ms`) written `# s`: the time a
/// computation took is the one thing a replay may print differently.
fn timeless(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(|c: char| c.is_ascii_digit()) {
        let (before, from) = rest.split_at(i);
        let n = from.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(from.len());
        let after = &from[n..];
        let unit = ["s", "ms"].into_iter().find(|u| {
            after
                .strip_prefix(' ')
                .and_then(|a| a.strip_prefix(u))
                .is_some_and(|a| !a.starts_with(|c: char| c.is_alphanumeric()))
        });
        let starts_word = !before.ends_with(|c: char| c.is_alphanumeric() || c == '.');
        out.push_str(before);
        match unit {
            Some(u) if starts_word => {
                out.push_str("# ");
                out.push_str(u);
                rest = &after[1 + u.len()..];
            }
            _ => {
                out.push_str(&from[..n]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn durations_are_masked_and_nothing_else() {
    assert_eq!(timeless("<Analysis of enpt: 1000 sentences, 12.1 s>"), "<Analysis of enpt: 1000 sentences, # s>");
    assert_eq!(timeless("(took 3.5 ms) 2 sentences x2 0.5 sx"), "(took # ms) 2 sentences x2 0.5 sx");
    assert_eq!(timeless("enc.5.5 s 10 s"), "enc.5.5 s # s");
}

#[test]
fn every_readme_session_runs() {
    // The README's sessions, then the guide's, in one replay directory (a guide session may
    // read what an earlier one wrote, as the README's do).
    let mut found = Vec::new();
    for file in ["README.md", "docs/guide.md"] {
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let here = sessions(file, &text);
        assert!(!here.is_empty(), "{file}: no sessions found");
        found.extend(here);
    }
    assert!(found.len() >= 8, "only {} sessions found", found.len());
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    std::fs::create_dir_all("out").unwrap();
    let replay = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(replay.path().join("out")).unwrap();
    let mut failures = Vec::new();
    let mut n = 0;
    let mut replayed = 0;
    for (k, Shown { file, line, inputs, outputs }) in found.iter().enumerate() {
        // What the session shows: printed lines, displayed values and each input's value.
        let shown = Rc::new(RefCell::new(Vec::<String>::new()));
        let into = shown.clone();
        let sink = Box::new(move |e| match e {
            Event::Print(t) => into.borrow_mut().push(t),
            Event::Display(o) => into.borrow_mut().push(o.text),
            _ => {}
        });
        let mut s = Session::new(SessionOptions { base_dir: dir.path().to_path_buf(), sink, ..Default::default() });
        let mut ok = true;
        for (input, readme_out) in inputs.iter().zip(outputs) {
            n += 1;
            let before = shown.borrow().len();
            let mut command_out = None;
            let result = if input.trim_start().starts_with(':') {
                // What a `:` command shows is not in the replay (`:save` keeps code alone).
                commands::dispatch(&mut s, input).map(|o| match o {
                    Outcome::Show(shows) => {
                        command_out = shows.map(|o| o.text);
                        true
                    }
                    Outcome::Quit => false,
                })
            } else {
                s.eval(&format!("{file}:{line}"), input)
                    .map(|o| {
                        if let Some(o) = o {
                            shown.borrow_mut().push(o.text);
                        }
                        true
                    })
                    .map_err(|e| e.to_string())
            };
            if let Err(e) = result {
                failures.push(format!("{file} block at line {line}: {input}\n=> {e}"));
                ok = false;
                break;
            }
            // The README shows what this input prints now.
            let printed: Vec<String> = shown.borrow()[before..].iter().cloned().chain(command_out).collect();
            let stale = stale_lines(readme_out, &printed);
            if !stale.is_empty() {
                failures.push(format!("{file} block at line {line}: after `{input}` the README shows lines the session does not print:\n{}\n--- the session printed\n{}", stale.join("\n"), printed.join("\n")));
            }
        }
        if !ok {
            continue;
        }
        // `:save`, then `headscope run` in a directory of its own where the replays of the
        // sessions before ran (as the sessions ran in theirs): the same lines, in order.
        let saved = replay.path().join(format!("session{k}.rhai"));
        commands::dispatch(&mut s, &format!(":save {}", saved.display())).unwrap_or_else(|e| panic!(":save: {e}"));
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_headscope"))
            .arg("run")
            .arg(&saved)
            .current_dir(replay.path())
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&run.stdout);
        let script = std::fs::read_to_string(&saved).unwrap();
        if !run.status.success() {
            failures.push(format!(
                "{file} block at line {line}: its :save script fails under headscope run:\n{}\n{script}",
                String::from_utf8_lossy(&run.stderr)
            ));
            continue;
        }
        let printed = timeless(&out);
        let mut rest = printed.as_str();
        for want in shown.borrow().iter() {
            let want = timeless(want);
            for l in want.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
                match rest.find(l) {
                    Some(i) => rest = &rest[i + l.len()..],
                    None => {
                        failures.push(format!("{file} block at line {line}: the session showed {l:?}, which `headscope run` of its :save script did not print (in order)\n--- script\n{script}--- printed\n{out}"));
                        break;
                    }
                }
            }
        }
        replayed += 1;
    }
    println!("{replayed} sessions replayed through :save and headscope run");
    println!("{n} README inputs in {} sessions ran", found.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
