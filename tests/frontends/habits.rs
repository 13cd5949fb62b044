//! Python habits (`tests/fixtures/python_habits.json`: each habit in two spellings and the note
//! that answers it) in the three frontends: `headscope run`, the REPL in a terminal, and the
//! Jupyter kernel (`kernel_client.py habits`). Each input gets its one-line `note:` with the
//! Rhai form, and the session goes on: the next line runs.

use rexpect::session::spawn_command;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_headscope");

/// (habit, input, the note's words) for every spelling.
fn habits() -> Vec<(String, String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/python_habits.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for h in v.as_array().unwrap() {
        let inputs = h["inputs"].as_array().unwrap();
        assert!(inputs.len() >= 2, "{h}: two spellings at least");
        for i in inputs {
            out.push((
                h["habit"].as_str().unwrap().into(),
                i.as_str().unwrap().into(),
                h["note"].as_str().unwrap().into(),
            ));
        }
    }
    out
}

#[test]
fn run_answers_each_python_habit_with_its_note() {
    let dir = tempfile::tempdir().unwrap();
    for (habit, input, note) in habits() {
        let file = dir.path().join("habit.rhai");
        std::fs::write(&file, format!("{input}\n")).unwrap();
        let out = Command::new(BIN).arg("run").arg(&file).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let line = text.lines().find(|l| l.contains("note: ") && l.contains(&note));
        assert!(line.is_some(), "{habit}: `{input}` through run gave no note containing {note:?}:\n{text}");
    }
}

#[test]
fn the_repl_answers_each_python_habit_and_runs_the_next_line() {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.env("XDG_DATA_HOME", home.path()).env("TERM", "xterm");
    let mut p = spawn_command(cmd, Some(20_000)).expect("spawn headscope in a pty");
    p.exp_string("hs> ").unwrap();
    for (k, (habit, input, note)) in habits().into_iter().enumerate() {
        p.send_line(&input).unwrap();
        p.exp_string("note: ").unwrap_or_else(|e| panic!("{habit}: `{input}`: {e}"));
        p.exp_string(&note).unwrap_or_else(|e| panic!("{habit}: `{input}`: {e}"));
        p.exp_string("hs> ").unwrap();
        // The next line runs.
        p.send_line(&format!("{k} + 1000")).unwrap();
        p.exp_string(&format!("{}", k + 1000)).unwrap_or_else(|e| panic!("after {habit}: `{input}`: {e}"));
        p.exp_string("hs> ").unwrap();
    }
    p.send_line(":quit").unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn the_kernel_answers_each_python_habit_and_runs_the_next_cell() {
    let (ok, text) = crate::common::run_fixture_script("kernel_client.py", &["habits"]);
    assert!(ok, "kernel case 'habits' failed:\n{text}");
}
