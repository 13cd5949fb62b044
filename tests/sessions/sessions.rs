//! Sessions that last: re-running a cell does not keep the values it replaced. Ten re-runs of
//! `let m = load_model("minilm")` through the REPL (piped stdin, and `:load` of a file that
//! does the same) peak within 10% of one run (the child's `ru_maxrss`, from `wait4`; before
//! `let` replaced variables: 529 MB after one load, 1359 MB after ten), and `:vars` lists `m`
//! once. The kernel's side of this is the `rerun` case of tests/frontends/kernel.rs.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

const LOAD: &str = "let m = load_model(\"minilm\", #{device: \"cpu\"});\n";

/// Runs the REPL on `input` (piped stdin) and reaps it with `wait4` for its peak RSS.
// The child is reaped by wait4, not Child::wait (which cannot report its rusage).
#[allow(clippy::zombie_processes)]
fn repl(dir: &std::path::Path, input: &str) -> (String, i64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_headscope"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("XDG_DATA_HOME", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn headscope");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    let mut out = String::new();
    child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read stdout");
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4 failed: {}", std::io::Error::last_os_error());
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the REPL failed:\n{out}\n{err}");
    (out, usage.ru_maxrss * 1024)
}

/// The rows of `:vars` whose name is `name`.
fn rows_named(vars: &str, name: &str) -> Vec<String> {
    vars.lines()
        .filter(|l| {
            l.split('┆').next().is_some_and(|c| c.trim_matches(|c: char| c == '│' || c.is_whitespace()) == name)
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn ten_reruns_of_a_model_load_peak_as_one_and_list_the_variable_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (one_out, one) = repl(dir.path(), &format!("{LOAD}:vars\n"));
    let file = dir.path().join("load.rhai");
    std::fs::write(&file, LOAD).expect("write load.rhai");
    let mut input = LOAD.repeat(7);
    for _ in 0..3 {
        input += &format!(":load {}\n", file.display());
    }
    input += ":vars\n";
    let (ten_out, ten) = repl(dir.path(), &input);
    let mb = |b: i64| b as f64 / 1e6;
    println!(
        "peak RSS: one load {:.0} MB, ten loads {:.0} MB ({:+.1}%)",
        mb(one),
        mb(ten),
        100.0 * (ten - one) as f64 / one as f64
    );
    assert!(
        (ten as f64) <= one as f64 * 1.10,
        "ten re-runs peak at {:.0} MB, one run at {:.0} MB: more than 10% apart",
        mb(ten),
        mb(one)
    );
    for out in [&one_out, &ten_out] {
        let m = rows_named(out, "m");
        assert_eq!(m.len(), 1, ":vars lists m {} times:\n{out}", m.len());
        assert!(
            m[0].contains("Model") && m[0].contains("90.3 MB"),
            "m's row gives its type and its weights' size: {}",
            m[0]
        );
    }
}
