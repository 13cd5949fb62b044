//! Every REPL session shown in the README runs as written: each ```text block's `hs> ` inputs
//! (with their `... ` continuation lines) are evaluated in order in one fresh session, `:`
//! commands included, and none may fail. Files they write land in a temporary directory.

use headscope::engine::commands::{self, Outcome};
use headscope::engine::{Session, SessionOptions};

/// The sessions of a Markdown text: per ```text block, its inputs.
fn sessions(md: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut block: Option<(usize, Vec<String>)> = None;
    for (i, line) in md.lines().enumerate() {
        match &mut block {
            None if line.trim() == "```text" => block = Some((i + 2, vec![])),
            Some(_) if line.trim() == "```" => {
                let (start, inputs) = block.take().unwrap();
                if !inputs.is_empty() {
                    out.push((start, inputs));
                }
            }
            Some((_, inputs)) => {
                if let Some(code) = line.strip_prefix("hs> ") {
                    inputs.push(code.to_string());
                } else if let (Some(more), Some(last)) = (line.strip_prefix("... "), inputs.last_mut()) {
                    last.push('\n');
                    last.push_str(more);
                }
            }
            None => {}
        }
    }
    out
}

#[test]
fn every_readme_session_runs() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let found = sessions(&readme);
    assert!(found.len() >= 6, "only {} sessions found", found.len());
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    std::fs::create_dir_all("out").unwrap();
    let mut failures = Vec::new();
    let mut n = 0;
    for (line, inputs) in &found {
        let mut s = Session::new(SessionOptions { base_dir: dir.path().to_path_buf(), ..Default::default() });
        for input in inputs {
            n += 1;
            let result = if input.trim_start().starts_with(':') {
                commands::dispatch(&mut s, input).map(|o| matches!(o, Outcome::Show(_)))
            } else {
                s.eval(&format!("README.md:{line}"), input).map(|_| true).map_err(|e| e.to_string())
            };
            if let Err(e) = result {
                failures.push(format!("README.md block at line {line}: {input}\n=> {e}"));
                break;
            }
        }
    }
    println!("{n} README inputs in {} sessions ran", found.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
