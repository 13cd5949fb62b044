//! Every REPL session shown in the README runs as written: each ```text block's `hs> ` inputs
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
    line: usize,
    inputs: Vec<String>,
    outputs: Vec<Vec<String>>,
}

/// The sessions of a Markdown text: per ```text block with `hs> ` inputs, what it shows.
fn sessions(md: &str) -> Vec<Shown> {
    let mut out = Vec::new();
    let mut block: Option<Shown> = None;
    for (i, line) in md.lines().enumerate() {
        match &mut block {
            None if line.trim() == "```text" => block = Some(Shown { line: i + 2, inputs: vec![], outputs: vec![] }),
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
        match rest.find(l.as_str()) {
            Some(i) => rest = &rest[i + l.len()..],
            None => stale.push(l),
        }
    }
    stale
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
        let unit = ["s", "ms"].into_iter().find(|u| after.strip_prefix(' ').and_then(|a| a.strip_prefix(u)).is_some_and(|a| !a.starts_with(|c: char| c.is_alphanumeric())));
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
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let found = sessions(&readme);
    assert!(found.len() >= 6, "only {} sessions found", found.len());
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    std::fs::create_dir_all("out").unwrap();
    let replay = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(replay.path().join("out")).unwrap();
    let mut failures = Vec::new();
    let mut n = 0;
    let mut replayed = 0;
    for (k, Shown { line, inputs, outputs }) in found.iter().enumerate() {
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
                s.eval(&format!("README.md:{line}"), input).map(|o| {
                    if let Some(o) = o {
                        shown.borrow_mut().push(o.text);
                    }
                    true
                }).map_err(|e| e.to_string())
            };
            if let Err(e) = result {
                failures.push(format!("README.md block at line {line}: {input}\n=> {e}"));
                ok = false;
                break;
            }
            // The README shows what this input prints now.
            let printed: Vec<String> = shown.borrow()[before..].iter().cloned().chain(command_out).collect();
            let stale = stale_lines(readme_out, &printed);
            if !stale.is_empty() {
                failures.push(format!("README.md block at line {line}: after `{input}` the README shows lines the session does not print:\n{}\n--- the session printed\n{}", stale.join("\n"), printed.join("\n")));
            }
        }
        if !ok {
            continue;
        }
        // `:save`, then `headscope run` in a directory of its own where the replays of the
        // sessions before ran (as the sessions ran in theirs): the same lines, in order.
        let saved = replay.path().join(format!("session{k}.rhai"));
        commands::dispatch(&mut s, &format!(":save {}", saved.display())).unwrap_or_else(|e| panic!(":save: {e}"));
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_headscope")).arg("run").arg(&saved).current_dir(replay.path()).output().unwrap();
        let out = String::from_utf8_lossy(&run.stdout);
        let script = std::fs::read_to_string(&saved).unwrap();
        if !run.status.success() {
            failures.push(format!("README.md block at line {line}: its :save script fails under headscope run:\n{}\n{script}", String::from_utf8_lossy(&run.stderr)));
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
                        failures.push(format!("README.md block at line {line}: the session showed {l:?}, which `headscope run` of its :save script did not print (in order)\n--- script\n{script}--- printed\n{out}"));
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
