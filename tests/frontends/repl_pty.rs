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

    // Shift-Tab inside a call's parentheses shows the call's signatures; the line stays, to
    // be finished and run.
    p.send("let hm2 = heatmap(").unwrap();
    p.send("\x1b[Z").unwrap();
    p.flush().unwrap();
    p.exp_string("heatmap(matrix, options) -> Plot").unwrap();
    p.send_line("[[5, 6], [7, 8]]); hm2").unwrap();
    p.exp_string("<plot: heatmap 2x2").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Completion of a variable.
    p.send("kee").unwrap();
    p.send("\t").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send_line(" + 1000").unwrap();
    p.exp_string("1042").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Multi-line input decided by the parser: the function body spans three lines, each
    // after the continuation prompt.
    p.send_line("fn sq(x) {").unwrap();
    p.exp_string("... ").unwrap();
    p.send_line("  x * x").unwrap();
    p.exp_string("... ").unwrap();
    p.send_line("}").unwrap();
    p.exp_string(PROMPT).unwrap();
    p.send_line("sq(7)").unwrap();
    p.exp_string("49").unwrap();
    p.exp_string(PROMPT).unwrap();

    // An open backtick string continues on the next line too.
    p.send_line("let s = `ab").unwrap();
    p.exp_string("... ").unwrap();
    p.send_line("cd`; s.len()").unwrap();
    p.exp_string("5").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Python habits are errors shown at once (no silent wait for more input), and the next
    // line runs by itself.
    for habit in ["for h in [1]: print(h)", "def f(x): return x", "print(f\"{keep}\")", "[1, 2, 3][0:2]"] {
        p.send_line(habit).unwrap();
        p.exp_string("syntax error").unwrap();
        p.exp_string(PROMPT).unwrap();
    }
    p.send_line("keep - 2").unwrap();
    p.exp_string("40").unwrap();
    p.exp_string(PROMPT).unwrap();

    // A misspelt name suggests the near one; a wrong call shows the signatures; a session
    // command typed without its colon says how commands are written.
    p.send_line("heatmp([[1]])").unwrap();
    p.exp_string("did you mean 'heatmap'?").unwrap();
    p.exp_string(PROMPT).unwrap();
    p.send_line("heatmap()").unwrap();
    p.exp_string("'heatmap' is called as: heatmap(matrix) -> Plot; heatmap(matrix, options) -> Plot (:help heatmap)")
        .unwrap();
    p.exp_string(PROMPT).unwrap();
    p.send_line("help").unwrap();
    p.exp_string("type :help").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Type-ahead: three lines typed while a computation runs all run, in order, after it.
    p.send_line("let t = 0; for i in 0..6000000 { t += i; } print(\"slo\" + \"w done\")").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send_line("let ta = 1;").unwrap();
    p.send_line("let tb = ta + 1;").unwrap();
    p.send_line("print(\"ty\" + \"ped=\" + (ta + tb))").unwrap();
    p.exp_string("slow done").unwrap();
    p.exp_string("typed=3").unwrap();
    p.exp_string(PROMPT).unwrap();

    // A README block pasted with its prompts and output (bracketed paste, as terminals send
    // a paste): its inputs run, the output lines are dropped.
    p.send("\x1b[200~hs> let pasted = 40 + 2;\nhs> print(\"pa\" + \"sted=\" + pasted)\nold output of the transcript\x1b[201~").unwrap();
    p.send_line("").unwrap();
    p.exp_string("pasted=42").unwrap();
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

/// What a person sees: every byte the REPL wrote, played on a terminal emulator the size of
/// the pty.
struct Screen {
    raw: String,
}

impl Screen {
    fn feed(&mut self, s: &str) {
        self.raw.push_str(s);
    }
    /// The visible screen after everything so far.
    fn contents(&self) -> String {
        let mut p = vt100::Parser::new(24, 80, 0);
        p.process(&self.bytes());
        p.screen().contents()
    }
    /// rexpect hands out each byte as a char: the bytes again, for UTF-8.
    fn bytes(&self) -> Vec<u8> {
        self.raw.chars().map(|c| c as u32 as u8).collect()
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).to_string()
    }
}

/// Sends `line` and waits for the next prompt: first for rustyline leaving the line (it turns
/// bracketed paste off, `ESC[?2004l`, once the line is accepted), since its redraw of the
/// accepted line also prints the prompt and keys sent then, during the evaluation, are lost.
fn run_line(p: &mut PtySession, screen: &mut Screen, line: &str) {
    p.send_line(line).unwrap();
    expect(p, screen, "\u{1b}[?2004l");
    expect(p, screen, PROMPT);
}

/// Waits for `what`, keeping what came before it (and it) on the screen.
fn expect(p: &mut PtySession, screen: &mut Screen, what: &str) {
    let before = p
        .exp_string(what)
        .unwrap_or_else(|e| panic!("waiting for {what:?}: {e}\nscreen so far:\n{}", screen.contents()));
    screen.feed(&before);
    screen.feed(what);
}

#[test]
fn typed_completion_help_text_heatmap_progress_and_save() {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.env("XDG_DATA_HOME", home.path()).env("TERM", "xterm").current_dir(env!("CARGO_MANIFEST_DIR"));
    let mut p = spawn_command(cmd, Some(120_000)).expect("spawn headscope in a pty");
    let mut s = Screen { raw: String::new() };
    expect(&mut p, &mut s, PROMPT);
    run_line(&mut p, &mut s, "let m = load_model(\"minilm\"); let d = corpus(asset(\"pud_en.txt\")).take(300);");

    // `m.` Tab Tab lists the methods of the value's type (Model), not every function.
    p.send("m.").unwrap();
    p.send("\t\t").unwrap();
    p.flush().unwrap();
    expect(&mut p, &mut s, "ablation_sweep");
    expect(&mut p, &mut s, "analyze");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let screen = s.contents();
    let listing = &screen[screen.rfind("hs> m.").unwrap_or(0)..];
    assert!(
        !listing.contains("load_model") && !listing.contains("corpus"),
        "a free function offered after `m.`:\n{screen}"
    );
    p.send_control('u').unwrap(); // clear the line

    // A unique method completes in place: `m.heads_p<TAB>` -> `m.heads_per_layer`.
    p.send("m.heads_p").unwrap();
    p.send("\t").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send_line("(\"enc\") * 1000 + 7").unwrap();
    expect(&mut p, &mut s, "12007");
    expect(&mut p, &mut s, PROMPT);

    // A sweep-sized analysis draws a progress bar (its rate and ETA once measured) that is gone
    // when it ends.
    run_line(&mut p, &mut s, "let r = m.confidence(d);");
    assert!(
        s.raw.contains("confidence ["),
        "no progress bar was drawn:\n{:?}",
        &s.raw[s.raw.len().saturating_sub(600)..]
    );
    let screen = s.contents();
    assert!(!screen.contains("confidence [") && !screen.contains("[=="), "a progress bar stayed on screen:\n{screen}");
    // And after a single-head sweep.
    p.send_line("let sw = m.ablation_sweep(d.take(12)); sw.kinds").unwrap();
    expect(&mut p, &mut s, "[\"enc\"]");
    expect(&mut p, &mut s, PROMPT);
    assert!(s.raw.contains("ablation sweep (sentence x head) ["), "no sweep progress bar was drawn");
    let screen = s.contents();
    assert!(
        !screen.contains("ablation sweep") && !screen.contains("[=="),
        "the sweep's bar stayed on screen:\n{screen}"
    );

    // `r["` Tab offers the result's kinds: MiniLM has one, so it completes to `r["enc"]`.
    p.send("r[\"").unwrap();
    p.send("\t").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send_line(".len() * 100 + 1").unwrap();
    expect(&mut p, &mut s, "601");
    expect(&mut p, &mut s, PROMPT);

    // `:help Model` lists the type's methods with their one-line docs.
    p.send_line(":help Model").unwrap();
    expect(&mut p, &mut s, "m.analyze(data, options) -> Analysis");
    expect(&mut p, &mut s, PROMPT);

    // The heatmap of a grid is drawn in text as well.
    p.send_line("r.heatmap()").unwrap();
    expect(&mut p, &mut s, "enc.5");
    expect(&mut p, &mut s, "legend:");
    expect(&mut p, &mut s, PROMPT);
    assert!(s.text().contains("legend: · "), "no shaded legend:\n{}", s.text());

    // Numbers shown in the session, then :save; `headscope run` prints the same ones.
    run_line(&mut p, &mut s, "print(`value ${r[\"enc\"][2][5]}`)");
    run_line(&mut p, &mut s, "let x = m.ablate(d.take(5), \"enc.1.2\"); x.value");
    run_line(&mut p, &mut s, "this_fails(1)"); // an error: not saved
    let script = home.path().join("session.rhai");
    p.send_line(&format!(":save {}", script.display())).unwrap();
    expect(&mut p, &mut s, "saved");
    expect(&mut p, &mut s, PROMPT);
    p.send_line(":history").unwrap();
    expect(&mut p, &mut s, PROMPT);
    p.send_line(":quit").unwrap();
    p.exp_eof().unwrap();

    let screen_text = s.text().replace("\r\n", "\n");
    let value_line =
        screen_text.lines().find(|l| l.starts_with("value ")).expect("the printed value").trim().to_string();
    let ablate_value = screen_text
        .lines()
        .skip_while(|l| !l.contains("x.value"))
        .nth(1)
        .expect("the shown ablate value")
        .trim()
        .to_string();
    assert!(ablate_value.parse::<f64>().is_ok(), "not a number: {ablate_value:?}");
    let saved = std::fs::read_to_string(&script).unwrap();
    assert!(!saved.contains("this_fails"), "a failed input was saved:\n{saved}");
    let out = Command::new(BIN).arg("run").arg(&script).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
    let replay = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "replay failed: {}\n{saved}", String::from_utf8_lossy(&out.stderr));
    assert!(replay.lines().any(|l| l.trim() == value_line), "replay lacks {value_line:?}:\n{replay}");
    assert!(
        replay.lines().any(|l| l.trim() == ablate_value),
        "replay lacks the ablate value {ablate_value:?}:\n{replay}"
    );
}
