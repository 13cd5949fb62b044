//! The terminal frontend: a rustyline REPL over one [`Session`]. With piped stdin it reads
//! complete inputs line by line without prompts or editing.

use crate::engine::commands::{self, Outcome};
use crate::engine::{Event, Session, SessionOptions};
use crate::output::Output;
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{
    Cmd, ConditionalEventHandler, Config, Context, Editor, EventContext, EventHandler, Helper, KeyCode, KeyEvent,
    Modifiers, RepeatCount,
};
use std::cell::RefCell;
use std::io::{BufRead, IsTerminal, Write};
use std::rc::Rc;
use std::time::Instant;

const PROMPT: &str = "hs> ";
/// The prompt of an input's next line (as the README's transcripts show it, and as a pasted
/// transcript is read back).
const CONTINUATION: &str = "... ";

/// A whole line already typed on the terminal and not yet read (the terminal is in its cooked
/// mode between inputs, so only finished lines are readable), without waiting.
fn typed_ahead_line() -> Option<String> {
    let mut fds = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, a zero timeout.
    let ready = unsafe { libc::poll(&mut fds, 1, 0) };
    if ready != 1 || fds.revents & libc::POLLIN == 0 {
        return None;
    }
    let mut line = String::new();
    // In the cooked mode one read returns at most one line, so nothing past it is buffered.
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(n) if n > 0 => Some(line.trim_end_matches(['\n', '\r']).to_string()),
        _ => None,
    }
}

fn print_output(out: &Output) {
    println!("{}", out.text);
}

/// A progress bar on stderr (indicatif: rate and ETA), cleared when its work ends.
struct Bar {
    bar: indicatif::ProgressBar,
    done: usize,
    pace: crate::run::Pace,
}

fn new_bar(total: usize) -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(Some(total as u64), indicatif::ProgressDrawTarget::stderr_with_hz(10));
    // The rate and time left (the prefix) only once measured (`run::Pace`).
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}{prefix}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// The sink of terminal frontends: prints go to stdout as they happen; progress is a bar on
/// stderr when stderr is a terminal (nothing otherwise, so logs stay clean), cleared when its
/// work ends or the evaluation stops.
pub fn terminal_sink() -> crate::engine::Sink {
    let tty = std::io::stderr().is_terminal();
    let mut current: Option<Bar> = None;
    Box::new(move |ev| {
        match ev {
            Event::Print(s) => match &current {
                Some(b) => b.bar.suspend(|| println!("{s}")),
                None => println!("{s}"),
            },
            Event::Display(o) => match &current {
                Some(b) => b.bar.suspend(|| print_output(&o)),
                None => print_output(&o),
            },
            Event::Progress { label, done, total } if tty => {
                // A new computation (or one that started over) gets a new bar.
                let fresh = current.as_ref().is_none_or(|b| b.bar.length() != Some(total as u64) || done < b.done);
                if fresh {
                    if let Some(old) = current.take() {
                        old.bar.finish_and_clear();
                    }
                    current = Some(Bar { bar: new_bar(total), done, pace: crate::run::Pace::new(done) });
                }
                if let Some(b) = &mut current {
                    b.done = done;
                    b.bar.set_message(label);
                    b.bar.set_prefix(b.pace.describe(done, total));
                    b.bar.set_position(done as u64);
                }
                if done >= total {
                    if let Some(b) = current.take() {
                        b.bar.finish_and_clear();
                    }
                }
            }
            Event::Progress { .. } => {}
            Event::Finished => {
                if let Some(b) = current.take() {
                    b.bar.finish_and_clear();
                }
            }
        }
        let _ = std::io::stdout().flush();
    })
}

/// Shift-Tab: the line and cursor are kept and the line is handed back to `run`, which shows
/// what the notebook's Shift-Tab shows there ([`Session::inspect`]: the function under the
/// cursor, or the call whose parentheses the cursor is in) and lets the line be edited on.
struct InspectKey(std::sync::Arc<std::sync::Mutex<Option<(String, usize)>>>);

impl ConditionalEventHandler for InspectKey {
    fn handle(&self, _: &rustyline::Event, _: RepeatCount, _: bool, ctx: &EventContext) -> Option<Cmd> {
        if let Ok(mut r) = self.0.lock() {
            *r = Some((ctx.line().to_string(), ctx.pos()));
        }
        Some(Cmd::AcceptLine)
    }
}

struct ReplHelper {
    session: Rc<RefCell<Session>>,
}

impl Completer for ReplHelper {
    type Candidate = Pair;
    fn complete(&self, line: &str, pos: usize, _: &Context<'_>) -> rustyline::Result<(usize, Vec<Pair>)> {
        let Ok(session) = self.session.try_borrow() else { return Ok((pos, vec![])) };
        let c = session.complete(line, pos);
        Ok((
            c.start,
            c.candidates.into_iter().map(|c| Pair { display: c.display, replacement: c.replacement }).collect(),
        ))
    }
}

// The default validation accepts every line the editor reads; `run` joins lines until the
// input is complete and shows the continuation prompt meanwhile (a pasted block arrives whole).
impl Validator for ReplHelper {}

impl Hinter for ReplHelper {
    type Hint = String;
}
impl Highlighter for ReplHelper {}
impl Helper for ReplHelper {}

fn history_path() -> Option<std::path::PathBuf> {
    let dir = dirs::data_dir()?.join("headscope");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join("history.txt"))
}

/// Evaluates one input (code or `:` command) and shows the result. Returns false on `:quit`.
fn run_input(session: &Rc<RefCell<Session>>, input: &str, n: usize, failed: &mut bool) -> bool {
    if let Some(inputs) = crate::engine::pasted_inputs(input) {
        // A transcript pasted with its prompts and output: its inputs in order.
        return inputs.iter().all(|i| run_input(session, i, n, failed));
    }
    let started = Instant::now();
    let result = if input.trim_start().starts_with(':') {
        let mut s = session.borrow_mut();
        match commands::dispatch(&mut s, input) {
            Ok(Outcome::Quit) => return false,
            Ok(Outcome::Show(o)) => Ok(o),
            Err(e) => Err(e),
        }
    } else {
        session.borrow_mut().eval(&format!("repl[{n}]"), input).map_err(|e| e.to_string())
    };
    match result {
        Ok(Some(out)) => print_output(&out),
        Ok(None) => {}
        Err(e) => {
            *failed = true;
            eprintln!("{e}");
        }
    }
    if session.borrow().time {
        println!("(took {:.1} ms)", started.elapsed().as_secs_f64() * 1e3);
    }
    let _ = std::io::stdout().flush();
    true
}

/// Runs the REPL until `:quit` or end of input. Returns whether any input failed (piped mode).
pub fn run() -> Result<bool, String> {
    let session = Rc::new(RefCell::new(Session::new(SessionOptions { sink: terminal_sink(), ..Default::default() })));
    let mut failed = false;
    if !std::io::stdin().is_terminal() {
        crate::install_ctrlc(session.borrow().interrupt_handle());
        let mut buf = String::new();
        let mut n = 0;
        // Whether stdin is a transcript (prompts and output, as the README shows sessions),
        // decided by its first non-blank line; its inputs then run as each next prompt arrives.
        let mut transcript: Option<bool> = None;
        for line in std::io::stdin().lock().lines() {
            let line = line.map_err(|e| format!("stdin: {e}"))?;
            if transcript.is_none() && !line.trim().is_empty() {
                transcript = Some(crate::engine::pasted_inputs(&line).is_some());
            }
            if transcript == Some(true) {
                // A prompt line (as `pasted_inputs` reads one) starts the next input.
                if crate::engine::pasted_inputs(&line).is_some() && !buf.trim().is_empty() {
                    n += 1;
                    if !run_input(&session, &std::mem::take(&mut buf), n, &mut failed) {
                        return Ok(failed);
                    }
                }
                buf.push_str(&line);
                buf.push('\n');
                continue;
            }
            buf.push_str(&line);
            buf.push('\n');
            let complete = buf.trim_start().starts_with(':') || session.borrow().is_complete(&buf);
            if complete {
                n += 1;
                let input = std::mem::take(&mut buf);
                if !input.trim().is_empty() && !run_input(&session, &input, n, &mut failed) {
                    return Ok(failed);
                }
            }
        }
        if !buf.trim().is_empty() {
            n += 1;
            run_input(&session, &buf, n, &mut failed);
        }
        return Ok(failed);
    }

    let config = Config::builder()
        .completion_type(rustyline::CompletionType::List)
        .auto_add_history(false)
        .history_ignore_space(true)
        .max_history_size(10_000)
        .map_err(|e| e.to_string())?
        .build();
    let mut rl: Editor<ReplHelper, DefaultHistory> =
        Editor::with_config(config).map_err(|e| format!("cannot start the line editor: {e}"))?;
    rl.set_helper(Some(ReplHelper { session: session.clone() }));
    // After the editor: it installs a SIGINT handler of its own when created. While it reads,
    // the terminal is raw and Ctrl-C arrives as a key; while code runs, as this signal.
    crate::install_ctrlc(session.borrow().interrupt_handle());
    let history = history_path();
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    let inspect = std::sync::Arc::new(std::sync::Mutex::new(None));
    rl.bind_sequence(
        KeyEvent(KeyCode::BackTab, Modifiers::NONE),
        EventHandler::Conditional(Box::new(InspectKey(inspect.clone()))),
    );
    println!(
        "headscope {} — Rhai for attention heads. :help for commands, Ctrl-D to leave.",
        env!("CARGO_PKG_VERSION")
    );
    let mut n = 0;
    // The input so far: lines join it until the parser says it is complete, each read after
    // the continuation prompt, so that unfinished input is visible as such.
    let mut buf = String::new();
    // A line handed back by Shift-Tab, to edit on: (before the cursor, after it).
    let mut resume: Option<(String, String)> = None;
    loop {
        let prompt = if buf.is_empty() { PROMPT } else { CONTINUATION };
        // Lines typed while the last input ran wait in the terminal, complete (its line
        // discipline is cooked between inputs): each is read here in turn and shown after its
        // prompt. Left to the editor, they would all be read at once and all but the first lost.
        let read = match typed_ahead_line() {
            Some(line) => {
                println!("{prompt}{line}");
                Ok(line)
            }
            None => match resume.take() {
                Some((left, right)) => rl.readline_with_initial(prompt, (&left, &right)),
                None => rl.readline(prompt),
            },
        };
        let asked = inspect.lock().ok().and_then(|mut r| r.take());
        if let (Ok(_), Some((line, pos))) = (&read, asked) {
            // The input so far (continuation lines included) gives the call's context.
            let code = if buf.is_empty() { line.clone() } else { format!("{buf}\n{line}") };
            let at = code.len() - line.len() + pos.min(line.len());
            match session.borrow().inspect(&code, at) {
                Some(text) => println!("{text}"),
                None => println!("(nothing to show here: Shift-Tab shows a function's signature and options, on its name or inside its parentheses)"),
            }
            let pos = crate::engine::complete::floor_boundary(&line, pos);
            resume = Some((line[..pos].to_string(), line[pos..].to_string()));
            continue;
        }
        match read {
            Ok(line) => {
                if buf.is_empty() && line.trim().is_empty() {
                    continue;
                }
                if !buf.is_empty() {
                    buf.push('\n');
                }
                buf.push_str(&line);
                let pasted = crate::engine::pasted_inputs(&buf);
                let last = pasted.as_ref().and_then(|p| p.last()).map_or(buf.as_str(), String::as_str);
                if !(buf.trim_start().starts_with(':')
                    || last.trim_start().starts_with(':')
                    || session.borrow().is_complete(last))
                {
                    continue;
                }
                let input = std::mem::take(&mut buf);
                let _ = rl.add_history_entry(input.as_str());
                if let Some(h) = &history {
                    let _ = rl.save_history(h);
                }
                n += 1;
                if !run_input(&session, &input, n, &mut failed) {
                    break;
                }
            }
            Err(ReadlineError::Interrupted) => {
                buf.clear();
                println!("^C");
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(format!("line editor: {e}")),
        }
    }
    Ok(false)
}
