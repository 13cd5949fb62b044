//! The REPL driven in a pseudo-terminal, as a person types: completion, multi-line input,
//! persistent history, Ctrl-C on an endless loop, a panic in a bound function.

use rexpect::session::{spawn_command, PtySession};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_headscope");
const PROMPT: &str = "hs> ";

fn start(data_home: &std::path::Path) -> PtySession {
    let mut cmd = Command::new(BIN);
    cmd.env("XDG_DATA_HOME", data_home).env("TERM", "xterm");
    let mut p = spawn_command(cmd, Some(20_000)).expect("spawn headscope in a pty");
    p.exp_string(PROMPT).expect("first prompt");
    p
}

#[test]
fn repl_in_a_terminal() {
    let home = tempfile::tempdir().unwrap();
    let mut p = start(home.path());

    // State persists across lines.
    p.send_line("let keep = 42;").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Tab completion of a function name: `heatm<TAB>` becomes `heatmap`.
    p.send("let hm = heatm").unwrap();
    p.send("\t").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send_line("([[1, 2], [3, 4]]); hm").unwrap();
    p.exp_string("<plot: heatmap 2x2").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Completion of a variable.
    p.send("kee").unwrap();
    p.send("\t").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send_line(" + 1000").unwrap();
    p.exp_string("1042").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Multi-line input decided by the parser: the function body spans three lines.
    p.send_line("fn sq(x) {").unwrap();
    p.send_line("  x * x").unwrap();
    p.send_line("}").unwrap();
    p.exp_string(PROMPT).unwrap();
    p.send_line("sq(7)").unwrap();
    p.exp_string("49").unwrap();
    p.exp_string(PROMPT).unwrap();

    // An open backtick string continues on the next line too.
    p.send_line("let s = `ab").unwrap();
    p.send_line("cd`; s.len()").unwrap();
    p.exp_string("5").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Ctrl-C stops an endless loop and the variables survive.
    p.send_line("loop { }").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    p.send_control('c').unwrap();
    p.exp_string("interrupted").unwrap();
    p.exp_string(PROMPT).unwrap();
    p.send_line("keep * 2").unwrap();
    p.exp_string("84").unwrap();
    p.exp_string(PROMPT).unwrap();

    // A panic in a bound function is an error, not the end of the REPL.
    p.send_line("debug_panic(\"kaboom\")").unwrap();
    p.exp_string("panicked: kaboom").unwrap();
    p.exp_string(PROMPT).unwrap();
    p.send_line("keep + 1").unwrap();
    p.exp_string("43").unwrap();
    p.exp_string(PROMPT).unwrap();

    // A : command and an unknown one.
    p.send_line(":vars").unwrap();
    p.exp_string("keep").unwrap();
    p.exp_string(PROMPT).unwrap();
    p.send_line(":nope").unwrap();
    p.exp_string("unknown command ':nope'").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Ctrl-D leaves.
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();

    // History persists in the user's data directory and is recalled with the Up arrow.
    let hist = std::fs::read_to_string(home.path().join("headscope/history.txt")).unwrap();
    assert!(hist.contains("let keep = 42;"), "history file: {hist}");
    // Each line prints a word its own text does not contain (`"se" + "t"` shows as `set`), and
    // the next keys go out only once that word is seen: keys that reach the REPL together with
    // the end of the line before may be read along with it, and rustyline drops what it read
    // past an accepted line.
    let mut p = start(home.path());
    p.send_line("let marker = 1000 + 337; print(\"se\" + \"t:\" + marker)").unwrap();
    p.exp_string("set:1337").unwrap();
    p.send_line("marker = 0; print(\"zer\" + \"oed\")").unwrap();
    p.exp_string("zeroed").unwrap();
    p.send("\x1b[A\x1b[A\r").unwrap(); // Up twice, Enter: the first line again
    p.flush().unwrap(); // `send` flushes only at a newline
    p.exp_string("set:1337").unwrap();
    p.send_line("print(\"mark\" + \"er=\" + marker)").unwrap();
    p.exp_string("marker=1337").unwrap();
    p.send_line(":quit").unwrap();
    p.exp_eof().unwrap();
}
