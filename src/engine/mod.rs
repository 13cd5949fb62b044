//! The one engine every frontend uses. A [`Session`] owns a Rhai engine with every headscope
//! type registered, a scope whose variables, functions and imports persist across
//! evaluations, and an interrupt flag. Evaluation returns an output bundle; prints and
//! `display` calls go to the frontend's sink as they happen. A Rust panic under a call
//! becomes a script error and the session stays usable.

pub mod commands;
pub mod complete;
pub mod docs;
pub mod error;
pub mod merge;
pub mod registry;
mod resolver;

pub use error::{ErrorKind, ScriptError};
pub use resolver::STDLIB;

use crate::output::Output;
use error::Sources;
use resolver::{Resolver, SharedResolver};
use rhai::{Dynamic, Engine, Scope, AST};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;

/// What a session sends its frontend while evaluating.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Text from `print` (a newline is implied).
    Print(String),
    /// A value shown with `display(x)` / `x.show()`.
    Display(Output),
    /// A long computation's progress; frontends draw a bar (or nothing).
    Progress { label: String, done: usize, total: usize },
    /// An evaluation ended (with or without error): a bar still drawn must go.
    Finished,
}

pub type Sink = Box<dyn FnMut(Event)>;
type SharedSink = Rc<RefCell<Sink>>;

pub use crate::run::Interrupt;

pub struct SessionOptions {
    pub sink: Sink,
    /// Visible to scripts as the constant `ARGS` (array of strings).
    pub args: Vec<String>,
    /// Where relative imports and `:load` paths start.
    pub base_dir: PathBuf,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { sink: Box::new(|_| {}), args: vec![], base_dir: std::env::current_dir().unwrap_or_else(|_| ".".into()) }
    }
}

/// An input that ran without error, kept for `:history` and `:save`.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// Where it came from: `repl[3]`, `cell[2]`, a script file.
    pub source: String,
    /// It is a whole file's code, run by `eval_file` (`:load`).
    pub file: bool,
    pub code: String,
    /// Its value was shown (a non-unit result): a saved script displays it too.
    pub shown: bool,
}

pub struct Session {
    engine: Engine,
    scope: Scope<'static>,
    /// Script functions defined so far.
    functions: AST,
    sources: Rc<RefCell<Sources>>,
    resolver: Rc<Resolver>,
    interrupt: Interrupt,
    sink: SharedSink,
    temp_dir: Rc<PathBuf>,
    inputs: usize,
    /// Show timings after each evaluation (`:time on`).
    pub time: bool,
    /// The inputs that ran without error, in order.
    pub history: Vec<Input>,
}

thread_local! {
    static GUARDED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that, inside a guarded evaluation, records the panic instead
/// of printing a trace; elsewhere it defers to the default hook.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(|g| g.get()) > 0 {
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                let at = info.location().map(|l| format!(" (at {}:{})", l.file(), l.line())).unwrap_or_default();
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}")));
            } else {
                default(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err(message)`.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_panic_hook();
    GUARDED.with(|g| g.set(g.get() + 1));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    r.map_err(|_| LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| "unknown panic".into()))
}

/// Renders a value for display: `None` for unit.
pub fn render_value(v: &Dynamic) -> Option<Output> {
    if v.is_unit() {
        return None;
    }
    for r in registry::RENDERERS {
        if let Some(out) = r(v) {
            return Some(out);
        }
    }
    Some(Output::text(v.to_string()))
}

impl Session {
    pub fn new(opts: SessionOptions) -> Self {
        let sink = Rc::new(RefCell::new(opts.sink));
        let sources: Rc<RefCell<Sources>> = Rc::default();
        let resolver = Rc::new(Resolver::new(sources.clone(), opts.base_dir));
        let interrupt = Interrupt::default();
        let temp_dir = Rc::new(std::env::temp_dir().join(format!("headscope-{}-{}", std::process::id(), next_session_id())));

        let mut engine = Engine::new();
        engine.set_module_resolver(SharedResolver(resolver.clone()));
        engine.set_max_expr_depths(256, 256);
        let s = sink.clone();
        engine.on_print(move |text| (s.borrow_mut())(Event::Print(text.to_string())));
        let s = sink.clone();
        engine.on_debug(move |text, src, pos| {
            let at = match (src, pos.line()) {
                (Some(src), Some(l)) => format!("{src}:{l}: "),
                (None, Some(l)) => format!("line {l}: "),
                _ => String::new(),
            };
            (s.borrow_mut())(Event::Print(format!("{at}{text}")))
        });
        let flag = interrupt.clone();
        engine.on_progress(move |_| if flag.is_set() { Some(Dynamic::from("interrupted")) } else { None });

        registry::register_types(&mut engine);
        let s = sink.clone();
        let display: crate::script::core::DisplayFn = Rc::new(move |v: Dynamic| {
            if let Some(out) = render_value(&v) {
                (s.borrow_mut())(Event::Display(out));
            }
        });
        crate::script::core::register(&mut engine, display, temp_dir.clone());

        let mut scope = Scope::new();
        let args: rhai::Array = opts.args.into_iter().map(Dynamic::from).collect();
        scope.push_constant("ARGS", args);
        Session { engine, scope, functions: AST::empty(), sources, resolver, interrupt, sink, temp_dir, inputs: 0, time: false, history: Vec::new() }
    }

    pub fn interrupt_handle(&self) -> Interrupt {
        self.interrupt.clone()
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Evaluates `code` named `source` (a file path, `-e`, `repl:3`). Variables, functions
    /// and `import ... as` modules persist for later evaluations.
    pub fn eval(&mut self, source: &str, code: &str) -> Result<Option<Output>, ScriptError> {
        self.inputs += 1;
        self.sources.borrow_mut().insert(source.to_string(), code.to_string());
        let mut ast = self.engine.compile_with_scope(&self.scope, code).map_err(|e| ScriptError::from_parse(source, &e, &self.sources.borrow()))?;
        ast.set_source(source);
        let mut full = self.functions.merge(&ast);
        full.set_source(source);
        self.interrupt.reset();
        let engine = &self.engine;
        let scope = &mut self.scope;
        let sink = self.sink.clone();
        let progress: crate::run::ProgressFn = Rc::new(move |label: &str, done, total| {
            if let Ok(mut f) = sink.try_borrow_mut() {
                f(Event::Progress { label: label.to_string(), done, total });
            }
        });
        let entered = crate::run::enter(crate::run::Context { interrupt: self.interrupt.clone(), progress });
        let result = guarded(|| engine.eval_ast_with_scope::<Dynamic>(scope, &full));
        drop(entered);
        if let Ok(mut f) = self.sink.try_borrow_mut() {
            f(Event::Finished);
        }
        // Functions defined by this input stay, even if it failed later on.
        self.functions = full.clone_functions_only();
        let value = match result {
            Err(panic) => {
                let mut e = ScriptError::new(ErrorKind::Panic, format!("a built-in function panicked: {panic}"));
                e.notes.push(format!("while evaluating {source}; the session is still usable"));
                return Err(e);
            }
            Ok(Err(e)) => return Err(ScriptError::from_eval(source, *e, &self.sources.borrow(), &self.resolver.files.borrow())),
            Ok(Ok(v)) => v,
        };
        self.keep_imports(&ast, source);
        self.history.push(Input { source: source.to_string(), code: code.to_string(), shown: !value.is_unit(), file: false });
        Ok(render_value(&value))
    }

    /// Registers the modules imported at the top level of `ast` under their aliases, so that
    /// later inputs (REPL lines, notebook cells) can use them.
    fn keep_imports(&mut self, ast: &AST, source: &str) {
        for stmt in ast.statements() {
            if let rhai::Stmt::Import(x, pos) = stmt {
                let (expr, alias) = &**x;
                if alias.name.is_empty() {
                    continue;
                }
                if let rhai::Expr::StringConstant(path, _) = expr {
                    if let Ok(m) = self.resolver.load(&self.engine, Some(source), path, *pos) {
                        self.engine.register_static_module(alias.name.as_str(), m);
                    }
                }
            }
        }
    }

    /// The session's successful inputs as one script that `headscope run` replays: each
    /// input in order, ended by `;`, an input whose value was shown wrapped in `display(...)`
    /// at its last statement, inputs from `:load` marked with their file.
    pub fn history_script(&self) -> String {
        let mut s = format!("// headscope {} session: {} inputs. Replay with `headscope run FILE`.\n", env!("CARGO_PKG_VERSION"), self.history.len());
        for input in &self.history {
            if input.file {
                s += &format!("// :load {}\n", input.source);
            }
            let mut code = input.code.trim_end().to_string();
            if input.shown {
                code = self.display_last(&code);
            }
            s += &code;
            if !code.ends_with(';') && !code.ends_with('}') {
                s.push(';');
            }
            s.push('\n');
        }
        s
    }

    /// `code` with its last statement wrapped in `display(...)`.
    fn display_last(&self, code: &str) -> String {
        let Ok(ast) = self.engine.compile_with_scope(&self.scope, code) else { return code.to_string() };
        let Some(last) = ast.statements().last() else { return code.to_string() };
        // Where an expression starts: an operator call starts at its left operand.
        fn start(e: &rhai::Expr) -> rhai::Position {
            match e {
                rhai::Expr::FnCall(call, _) if call.is_operator_call() || !call.name.starts_with(|c: char| c.is_alphabetic() || c == '_') => {
                    call.args.first().map_or(e.start_position(), start)
                }
                other => other.start_position(),
            }
        }
        let pos = match last {
            rhai::Stmt::Expr(e) => start(e),
            rhai::Stmt::FnCall(call, pos) => match call.args.first() {
                Some(a) if !call.name.starts_with(|c: char| c.is_alphabetic() || c == '_') => start(a),
                _ => *pos,
            },
            other => other.position(),
        };
        let (Some(line), Some(col)) = (pos.line(), pos.position()) else { return code.to_string() };
        let line_start: usize = code.split_inclusive('\n').take(line - 1).map(str::len).sum();
        let off = line_start + code[line_start..].chars().take(col - 1).map(char::len_utf8).sum::<usize>();
        let tail = code[off..].trim_end().trim_end_matches(';');
        let wrapped = format!("{}display({tail});", &code[..off]);
        if self.engine.compile_with_scope(&self.scope, &wrapped).is_ok() {
            wrapped
        } else {
            code.to_string()
        }
    }

    /// Reads and evaluates a script file; relative imports start from its directory.
    pub fn eval_file(&mut self, path: &Path) -> Result<Option<Output>, ScriptError> {
        let name = path.display().to_string();
        let code = read_script(path).map_err(|m| ScriptError::new(ErrorKind::Runtime, m))?;
        let out = self.eval(&name, &code)?;
        if let Some(input) = self.history.last_mut() {
            input.file = true;
        }
        Ok(out)
    }

    /// Variables in scope: (name, type, short preview).
    pub fn variables(&self) -> Vec<(String, String, String)> {
        self.scope
            .iter()
            .map(|(name, _, v)| {
                let preview = render_value(&v).map(|o| o.text.lines().next().unwrap_or_default().to_string()).unwrap_or_default();
                let preview = if preview.chars().count() > 60 { format!("{}...", preview.chars().take(60).collect::<String>()) } else { preview };
                (name.to_string(), self.engine.map_type_name(v.type_name()).to_string(), preview)
            })
            .collect()
    }

    pub fn docs(&self, name: &str) -> Vec<docs::FnDoc> {
        docs::lookup(&self.engine, name)
    }

    /// Candidates for completing `word` (the identifier before the cursor, possibly with
    /// a `module::` prefix): functions, variables, `:` commands and keywords.
    pub fn completions(&self, word: &str) -> Vec<String> {
        let mut c: Vec<String> = if word.starts_with(':') {
            commands::COMMANDS.iter().map(|c| format!(":{}", c.name)).collect()
        } else {
            let mut v = docs::function_names(&self.engine);
            v.extend(self.scope.iter().map(|(n, _, _)| n.to_string()));
            v.extend(self.functions.iter_functions().map(|f| f.name.to_string()));
            v.extend(docs::KEYWORDS.iter().map(|k| k.to_string()));
            v
        };
        c.retain(|s| s.starts_with(word) && s != word);
        c.sort();
        c.dedup();
        c
    }

    /// Whether `code` is a complete input, or needs more lines: open braces or brackets, or an
    /// open backtick string (the only Rhai string that may span lines). Real errors are
    /// "complete" so that they are reported at once.
    pub fn is_complete(&self, code: &str) -> bool {
        use rhai::{LexError, ParseErrorType as P};
        let Err(e) = self.engine.compile(code) else { return true };
        match e.err_type() {
            P::BadInput(LexError::UnterminatedString) => char_at(code, e.position()) != Some('`'),
            P::UnexpectedEOF | P::MissingToken(..) => !(e.position().is_none() || is_at_end(code, e.position())),
            _ => true,
        }
    }
}

/// The character at a parser position (1-based line and column).
fn char_at(code: &str, pos: rhai::Position) -> Option<char> {
    code.lines().nth(pos.line()?.checked_sub(1)?)?.chars().nth(pos.position()?.checked_sub(1)?)
}

/// Whether `pos` is at or after the last non-blank character of `code`.
fn is_at_end(code: &str, pos: rhai::Position) -> bool {
    let Some(line) = pos.line() else { return true };
    let last = code.trim_end().lines().count().max(1);
    line >= last
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&*self.temp_dir);
    }
}

fn next_session_id() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Reads a script file with one-line errors for the usual mistakes.
pub fn read_script(path: &Path) -> Result<String, String> {
    let p = path.display();
    if path.is_dir() {
        return Err(format!("{p}: is a directory, not a script"));
    }
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{p}: no such file"),
        _ => format!("{p}: cannot read: {e}"),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let off = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..off].iter().filter(|&&b| b == b'\n').count() + 1;
        format!("{p}:{line}: not valid UTF-8 (byte offset {off}); scripts must be UTF-8 text")
    })
}

/// Every documented example, for tests and `headscope doctor --examples`.
pub fn documented_examples(engine: &Engine) -> Vec<(String, docs::Example)> {
    docs::all_docs(engine).into_iter().flat_map(|d| d.examples().into_iter().map(move |e| (d.signature.clone(), e))).collect()
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completeness_is_decided_by_the_parser() {
        let s = Session::new(SessionOptions::default());
        for code in ["fn f(x) {", "let a = [1,\n2,", "let s = `multi\nline", "if x {\n  1\n} else {"] {
            assert!(!s.is_complete(code), "should wait for more: {code:?}");
        }
        for code in ["1 + 1", "fn f(x) { x }", "let s = `a\nb`;", "let x = ;", "}", "let s = \"open"] {
            assert!(s.is_complete(code), "should be complete (valid or a real error): {code:?}");
        }
    }
}
