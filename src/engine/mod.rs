//! The one engine every frontend uses. A [`Session`] owns a Rhai engine with every headscope
//! type registered, a scope whose variables, functions and imports persist across
//! evaluations, and an interrupt flag. Evaluation returns an output bundle; prints and
//! `display` calls go to the frontend's sink as they happen. A Rust panic under a call
//! becomes a script error and the session stays usable.

pub mod commands;
pub mod complete;
pub mod docs;
pub mod error;
pub mod fuzz;
mod habits;
pub mod merge;
pub mod registry;
mod resolver;
pub mod size;

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
        SessionOptions {
            sink: Box::new(|_| {}),
            args: vec![],
            base_dir: std::env::current_dir().unwrap_or_else(|_| ".".into()),
        }
    }
}

/// A variable as `:vars` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    pub name: String,
    pub type_name: String,
    /// The first line of its rendering, at most 60 characters.
    pub preview: String,
    /// The bytes it holds (`size::of`); `None` for a type that is not measured.
    pub size: Option<size::Size>,
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
    rebind: Rc<RefCell<Rebind>>,
    /// Show timings after each evaluation (`:time on`).
    pub time: bool,
    /// The inputs that ran without error, in order.
    pub history: Vec<Input>,
}

/// How a top-level `let` replaces a variable of an earlier input (`Session::eval`): the
/// session's scope holds each name once, so a re-run cell frees what it replaced.
#[derive(Default)]
struct Rebind {
    /// The evaluation is running (the filter also sees parse-time definitions).
    active: bool,
    /// Scope entries below this index come from earlier inputs (lowered as they are released).
    base: usize,
    /// Names whose every top-level `let` in this input leaves the name out of its value's
    /// expression: their old value can go before the new one is computed, so a re-run
    /// `let m = load_model(..)` never holds two models.
    early: std::collections::HashSet<String>,
    /// Names released early by this input (for the note on an error after the release).
    released: Vec<String>,
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
                if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
                    eprintln!("panic, in full: {msg}{at}\n{}", std::backtrace::Backtrace::force_capture());
                }
                // One line for the person: a libtorch message loses its C++ trace.
                let msg = crate::model::one_line(&msg);
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}")));
            } else {
                default(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err(message)` (one line: the panic's message, a libtorch
/// message without its C++ trace, and where; the full trace on stderr under `RUST_BACKTRACE`).
/// The script engine's calls and the library API (`api.rs`) run through it.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
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
        let temp_dir =
            Rc::new(std::env::temp_dir().join(format!("headscope-{}-{}", std::process::id(), next_session_id())));

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

        let rebind: Rc<RefCell<Rebind>> = Rc::default();
        let rb = rebind.clone();
        // Marked deprecated only as "volatile" (Rhai's words: "This API is NOT deprecated").
        #[allow(deprecated)]
        engine.on_def_var(move |runtime, info, mut ctx| {
            if !runtime || info.nesting_level() != 0 || ctx.call_level() != 0 || !info.will_shadow_other_variables() {
                return Ok(true);
            }
            let Ok(mut r) = rb.try_borrow_mut() else { return Ok(true) };
            if r.active && r.early.contains(info.name()) {
                let scope = ctx.scope_mut();
                let last =
                    (&*scope).into_iter().enumerate().filter(|(_, (n, _, _))| *n == info.name()).map(|(i, _)| i).last();
                // Only a variable of an earlier input: this input's own entries are addressed
                // by their offset from the end of the scope, which a removal below keeps.
                if last.is_some_and(|i| i < r.base) {
                    drop(scope.remove::<Dynamic>(info.name()));
                    r.base -= 1;
                    r.released.push(info.name().to_string());
                }
            }
            Ok(true)
        });

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
        Session {
            engine,
            scope,
            functions: AST::empty(),
            sources,
            resolver,
            interrupt,
            sink,
            temp_dir,
            inputs: 0,
            rebind,
            time: false,
            history: Vec::new(),
        }
    }

    pub fn interrupt_handle(&self) -> Interrupt {
        self.interrupt.clone()
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, to register more functions (an embedding program's own; the script-API
    /// fuzzer's test plants a defect this way).
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Evaluates `code` named `source` (a file path, `-e`, `repl:3`). Variables, functions
    /// and `import ... as` modules persist for later evaluations.
    pub fn eval(&mut self, source: &str, code: &str) -> Result<Option<Output>, ScriptError> {
        self.inputs += 1;
        self.sources.borrow_mut().insert(source.to_string(), code.to_string());
        let mut ast = self.engine.compile_with_scope(&self.scope, code).map_err(|e| {
            let mut e = ScriptError::from_parse(source, &e, &self.sources.borrow());
            e.notes.extend(habits::note(code, &e));
            e
        })?;
        ast.set_source(source);
        let mut full = self.functions.merge(&ast);
        full.set_source(source);
        self.interrupt.reset();
        *self.rebind.borrow_mut() =
            Rebind { active: true, base: self.scope.len(), early: early_lets(&ast), released: vec![] };
        let engine = &self.engine;
        let scope = &mut self.scope;
        let sink = self.sink.clone();
        let progress: crate::run::ProgressFn = Rc::new(move |label: &str, done, total| {
            if let Ok(mut f) = sink.try_borrow_mut() {
                f(Event::Progress { label: label.to_string(), done, total });
            }
        });
        let sink = self.sink.clone();
        let warn: crate::run::WarnFn = Rc::new(move |msg: &str| {
            if let Ok(mut f) = sink.try_borrow_mut() {
                f(Event::Print(format!("warning: {msg}")));
            }
        });
        let entered = crate::run::enter(crate::run::Context { interrupt: self.interrupt.clone(), progress, warn });
        let result = guarded(|| engine.eval_ast_with_scope::<Dynamic>(scope, &full));
        drop(entered);
        let released = std::mem::take(&mut *self.rebind.borrow_mut()).released;
        self.drop_shadowed();
        release_freed_heap();
        if let Ok(mut f) = self.sink.try_borrow_mut() {
            // `7 / 2` ran and gave 3: say so (a Python habit that is no error).
            if let Some(n) = matches!(result, Ok(Ok(_))).then(|| habits::integer_division(code)).flatten() {
                f(Event::Print(format!("note: {n}")));
            }
            f(Event::Finished);
        }
        let gone: Vec<String> = released.into_iter().filter(|n| !self.scope.contains(n)).collect();
        let note = (!gone.is_empty()).then(|| {
            let names = gone.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
            format!("{names}: the old value was released when its `let` began, so the name is undefined now")
        });
        // Functions defined by this input stay, even if it failed later on.
        self.functions = full.clone_functions_only();
        let value = match result {
            Err(panic) => {
                let mut e = ScriptError::new(ErrorKind::Panic, format!("a built-in function panicked: {panic}"));
                e.notes.push(format!("while evaluating {source}; the session is still usable"));
                e.notes.extend(note);
                return Err(e);
            }
            Ok(Err(e)) => {
                let mut e = ScriptError::from_eval(source, *e, &self.sources.borrow(), &self.resolver.files.borrow());
                // A computation that stopped at the interrupt returns its own error
                // ("analyze: interrupted"): the evaluation was interrupted all the same.
                if e.kind == ErrorKind::Runtime && self.interrupt.is_set() && e.message.ends_with("interrupted") {
                    e.notes.insert(0, std::mem::replace(&mut e.message, "interrupted".into()));
                    e.kind = ErrorKind::Interrupted;
                }
                e.notes.extend(note);
                if let Some(hint) = command_hint(code, &e) {
                    // The whole input was a command's bare name: the hint alone, on one line.
                    return Err(ScriptError::new(ErrorKind::Runtime, hint));
                } else {
                    self.teach(code, &mut e);
                }
                return Err(e);
            }
            Ok(Ok(v)) => v,
        };
        self.keep_imports(&ast, source);
        self.history.push(Input {
            source: source.to_string(),
            code: code.to_string(),
            shown: !value.is_unit(),
            file: false,
        });
        Ok(render_value(&value))
    }

    /// Keeps the last variable of each name: a top-level `let` of a name an earlier input
    /// defined replaces it (Rhai would shadow it, keeping the old value alive while the
    /// session lasts). Whatever else holds the old value (another variable, a closure, a
    /// view of the same model) keeps it.
    fn drop_shadowed(&mut self) {
        let mut seen = std::collections::HashSet::new();
        // In definition order (`iter_raw` goes from the newest).
        let names: Vec<String> = (&self.scope).into_iter().map(|(n, _, _)| n.to_string()).collect();
        let mut keep = vec![true; names.len()];
        for (i, name) in names.iter().enumerate().rev() {
            keep[i] = seen.insert(name.as_str());
        }
        if keep.iter().all(|k| *k) {
            return;
        }
        let old = std::mem::take(&mut self.scope);
        for ((name, value, aliases), keep) in old.into_iter().zip(keep) {
            if !keep {
                continue;
            }
            if value.is_read_only() {
                self.scope.push_constant_dynamic(name.clone(), value);
            } else {
                self.scope.push_dynamic(name.clone(), value);
            }
            for alias in aliases {
                self.scope.set_alias(name.as_str(), alias);
            }
        }
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

    /// What a "not found" error can say beyond Rhai's words: a function called with the wrong
    /// arguments gets its script-facing signatures and `:help NAME`; an unknown function,
    /// method or variable gets the nearest names. Rhai's Rust type names in the message become
    /// script types (`&str | ImmutableString | String` -> `string`).
    fn teach(&self, code: &str, e: &mut ScriptError) {
        if let Some(n) = habits::note(code, e) {
            if let Some(rest) = e.message.strip_prefix("Function not found: ") {
                e.message = format!("Function not found: {}", script_types(rest));
            }
            e.notes.push(n);
            return;
        }
        if let Some(rest) = e.message.strip_prefix("Function not found: ") {
            let name = rest.split([' ', '(']).next().unwrap_or_default().to_string();
            let plain = name.rsplit("::").next().unwrap_or(&name).to_string();
            let typed = script_types(rest);
            e.message = format!("Function not found: {typed}");
            let mut docs = docs::lookup(&self.engine, &plain);
            // A method call's first argument is its object: its type's overloads; a plain
            // call: the plain functions (all overloads where neither matches).
            let first = typed
                .split_once(" (")
                .and_then(|(_, a)| a.split([',', ')']).next())
                .map(str::trim)
                .unwrap_or_default()
                .to_string();
            // `r.keys()` on a result type (a map's method): what the type has instead.
            if plain == "keys" && docs::type_names(&self.engine).contains(&first) {
                let members = docs::members(&self.engine, &first);
                e.notes.push(format!(
                    "{first} is not a map; its properties and methods: {} (:help {first})",
                    members.join(", ")
                ));
                return;
            }
            if docs.iter().any(|d| d.receiver.as_deref() == Some(first.as_str())) {
                docs.retain(|d| d.receiver.as_deref() == Some(first.as_str()));
            } else if docs.iter().any(|d| d.receiver.is_none()) {
                docs.retain(|d| d.receiver.is_none());
            }
            if !docs.is_empty() {
                let mut sigs: Vec<&str> = docs.iter().map(|d| d.signature.as_str()).collect();
                sigs.dedup();
                e.notes.push(format!("'{plain}' is called as: {} (:help {plain})", sigs.join("; ")));
                return;
            }
            let mut names = docs::function_names(&self.engine);
            names.extend(self.functions.iter_functions().map(|f| f.name.to_string()));
            if let Some(hint) = crate::suggest::did_you_mean(&plain, names.iter().map(String::as_str)) {
                e.notes.push(hint);
            }
        } else if let Some(rest) = e.message.strip_prefix("Variable not found: ") {
            let name = rest.trim();
            let vars: Vec<String> = self.scope.iter().map(|(n, _, _)| n.to_string()).collect();
            if let Some(hint) = crate::suggest::did_you_mean(name, vars.iter().map(String::as_str)) {
                e.notes.push(hint);
            }
        }
    }

    /// The session's successful inputs as one script that `headscope run` replays: each
    /// input in order, ended by `;` (before a trailing `// comment`, which would swallow it),
    /// an input whose value was shown wrapped in `display(...)` at its last statement, inputs
    /// from `:load` marked with their file.
    pub fn history_script(&self) -> String {
        // Positions are read from an unoptimised parse: the session's engine folds constants
        // (`1+1` becomes one literal placed at the `+`).
        let mut parser = Engine::new_raw();
        parser.set_optimization_level(rhai::OptimizationLevel::None);
        parser.set_max_expr_depths(256, 256);
        let mut s = format!(
            "// headscope {} session: {} inputs. Replay with `headscope run FILE`.\n",
            env!("CARGO_PKG_VERSION"),
            self.history.len()
        );
        for input in &self.history {
            if input.file {
                s += &format!("// :load {}\n", input.source);
            }
            let (code, comment) = split_trailing_comment(&parser, input.code.trim_end());
            let mut code = code.trim_end().to_string();
            if input.shown {
                code = display_last(&parser, &code);
            }
            s += &code;
            if !code.ends_with(';') && !code.ends_with('}') {
                s.push(';');
            }
            if !comment.is_empty() {
                s.push(' ');
                s += comment;
            }
            s.push('\n');
        }
        s
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

    /// Variables in scope: (name, type, short preview, size).
    pub fn variables(&self) -> Vec<Variable> {
        (&self.scope)
            .into_iter()
            .map(|(name, v, _)| Variable {
                name: name.to_string(),
                type_name: self.engine.map_type_name(v.type_name()).to_string(),
                preview: preview(v),
                size: size::of(v),
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

/// The characters of a value's one-line preview in `:vars`.
const PREVIEW_CHARS: usize = 60;

/// The first line of what a value shows, cut at [`PREVIEW_CHARS`] (`...` marks the cut), made
/// without showing the whole value: arrays, maps and text are written only as far as the
/// preview reaches (a 200,000-number array took 50 ms to write whole), and other values are
/// rendered as text only (no PNG or SVG drawn for a plot or an attention map).
fn preview(v: &Dynamic) -> String {
    let mut text = String::new();
    if v.is_array() || v.is_map() || v.is_string() {
        write_bounded(v, false, &mut text);
    } else if let Some(o) = crate::output::text_only(|| render_value(v)) {
        text = o.text;
    }
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > PREVIEW_CHARS {
        format!("{}...", line.chars().take(PREVIEW_CHARS).collect::<String>())
    } else {
        line.to_string()
    }
}

/// Writes `v` as Rhai's `to_string` does (items of arrays and maps as their debug form), but
/// stops once `out` holds more than a preview's characters (or a line): what comes after is cut.
fn write_bounded(v: &Dynamic, debug: bool, out: &mut String) {
    let full = |out: &String| out.chars().count() > PREVIEW_CHARS || out.contains('\n');
    if let Some(items) = v.read_lock::<rhai::Array>() {
        out.push('[');
        for (i, item) in items.iter().enumerate() {
            if full(out) {
                return;
            }
            if i > 0 {
                out.push_str(", ");
            }
            write_bounded(item, true, out);
        }
        out.push(']');
    } else if let Some(map) = v.read_lock::<rhai::Map>() {
        out.push_str("#{");
        for (i, (key, item)) in map.iter().enumerate() {
            if full(out) {
                return;
            }
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(&format!("{:?}: ", key.as_str()));
            write_bounded(item, true, out);
        }
        out.push('}');
    } else if let Some(s) = v.read_lock::<rhai::ImmutableString>() {
        // One more character than a preview shows, so that a longer text is still cut.
        let head: String = s.chars().take(PREVIEW_CHARS + 1).collect();
        if debug {
            out.push_str(&format!("{head:?}"))
        } else {
            out.push_str(&head)
        }
    } else if debug {
        out.push_str(&format!("{v:?}"));
    } else {
        out.push_str(&v.to_string());
    }
}

/// Returns the heap freed during an input to the OS. `main` lets glibc keep up to 256 MiB of
/// freed heap (`M_TRIM_THRESHOLD`), which saves page faults between the tensor operations of
/// one computation; between inputs, what a finished or replaced value held (a model, a
/// cache, a dataset) should leave the process, or a session's resident memory creeps up to
/// that much above what it holds.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of glibc's arenas to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The names of `ast`'s top-level `let`/`const` statements whose value's expression does not
/// mention the name (as a variable, a closure's capture, a method's object): for these, the
/// variable of an earlier input can be released before the new value is computed.
fn early_lets(ast: &AST) -> std::collections::HashSet<String> {
    let mut early = std::collections::HashSet::new();
    let mut late = std::collections::HashSet::new();
    for stmt in ast.statements() {
        if let rhai::Stmt::Var(x, ..) = stmt {
            let (ident, expr, _) = &**x;
            let name = ident.name.as_str();
            let mut reads = false;
            expr.walk(&mut Vec::new(), &mut |path: &[rhai::ASTNode]| {
                if let Some(rhai::ASTNode::Expr(rhai::Expr::Variable(v, ..))) = path.last() {
                    if v.1.as_str() == name {
                        reads = true;
                        return false;
                    }
                }
                true
            });
            if reads {
                late.insert(name.to_string())
            } else {
                early.insert(name.to_string())
            };
        }
    }
    early.retain(|n| !late.contains(n));
    early
}

/// The character at a parser position (1-based line and column).
fn char_at(code: &str, pos: rhai::Position) -> Option<char> {
    code.lines().nth(pos.line()?.checked_sub(1)?)?.chars().nth(pos.position()?.checked_sub(1)?)
}

/// Whether `pos` is after the last non-blank character of `code`: where the parser stands
/// when the input ended before what it expects (`fn f(x) {`, `let a = [1,`). A token missing
/// before the end (`for h in xs: ...`, `f(x=1)`, `xs[0:3]`) is an error in what was typed.
fn is_at_end(code: &str, pos: rhai::Position) -> bool {
    byte_offset(code, pos).is_none_or(|at| at >= code.trim_end().len())
}

/// The byte offset in `code` of a parser position (line and column, both from 1).
fn byte_offset(code: &str, pos: rhai::Position) -> Option<usize> {
    let (line, col) = (pos.line()?, pos.position()?);
    let line_start: usize = code.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
    let rest = code.get(line_start..)?;
    Some(line_start + rest.chars().take(col.saturating_sub(1)).map(char::len_utf8).sum::<usize>())
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

/// Rhai's Rust type names in a "not found" message (`head (Model, &str | ImmutableString |
/// String, i64)`) as scripts name them (`head (Model, string, int)`).
fn script_types(text: &str) -> String {
    let Some((name, args)) = text.split_once(" (") else { return text.to_string() };
    let Some(args) = args.strip_suffix(')') else { return text.to_string() };
    let one = |t: &str| -> String {
        let t = t.trim().trim_start_matches("&mut ").trim_start_matches('&');
        match t.rsplit("::").next().unwrap_or(t) {
            "i64" | "INT" => "int".into(),
            "f64" | "FLOAT" => "float".into(),
            "str" | "String" | "ImmutableString" => "string".into(),
            "Array" => "array".into(),
            "Map" => "map".into(),
            "FnPtr" => "function".into(),
            "ScriptModel" | "View" => "Model".into(),
            other => other.into(),
        }
    };
    let args: Vec<String> = args
        .split(", ")
        .map(|a| {
            let mut alts: Vec<String> = a.split(" | ").map(one).collect();
            alts.dedup();
            alts.join(" | ")
        })
        .collect();
    format!("{name} ({})", args.join(", "))
}

/// `code` split before a `// comment` that ends its last line (not one inside a string): the
/// comment's start is the first `//` of that line before which the code parses.
fn split_trailing_comment<'a>(parser: &Engine, code: &'a str) -> (&'a str, &'a str) {
    let line_start = code.rfind('\n').map_or(0, |i| i + 1);
    for (i, _) in code[line_start..].match_indices("//") {
        let at = line_start + i;
        if parser.compile(&code[..at]).is_ok() {
            return (&code[..at], &code[at..]);
        }
    }
    (code, "")
}

/// `code` with its last statement wrapped in `display(...)` (unchanged where that does not
/// parse). `parser` does not optimise, so positions are where the user's text has them.
fn display_last(parser: &Engine, code: &str) -> String {
    let Ok(ast) = parser.compile(code) else { return code.to_string() };
    let Some(last) = ast.statements().last() else { return code.to_string() };
    // Where an expression starts: an operator call starts at its left operand.
    fn start(e: &rhai::Expr) -> rhai::Position {
        match e {
            rhai::Expr::FnCall(call, _)
                if call.is_operator_call() || !call.name.starts_with(|c: char| c.is_alphabetic() || c == '_') =>
            {
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
    let Some(mut off) = byte_offset(code, pos) else { return code.to_string() };
    // A namespaced call (`st::mean(x)`) starts at its namespace, which the position leaves out.
    while let Some(before) = code[..off].trim_end().strip_suffix("::") {
        let name_start = before.trim_end_matches(|c: char| c.is_alphanumeric() || c == '_').len();
        if name_start == before.len() {
            break;
        }
        off = name_start;
    }
    let tail = code[off..].trim_end().trim_end_matches(';');
    let wrapped = format!("{}display({tail});", &code[..off]);
    if parser.compile(&wrapped).is_ok() {
        wrapped
    } else {
        code.to_string()
    }
}

/// The inputs of a transcript pasted into a session (the README's sessions, as IPython takes
/// `>>> ` lines): a line starting with the prompt `hs> ` begins an input, a line starting with
/// `... ` continues it, and every other line (the output the transcript shows) is dropped.
/// `None` when the first non-blank line has no prompt: the input is code as typed.
pub fn pasted_inputs(input: &str) -> Option<Vec<String>> {
    fn after<'a>(line: &'a str, prompt: &str) -> Option<&'a str> {
        let l = line.trim_start();
        l.strip_prefix(prompt)
            .map(|rest| rest.strip_prefix(' ').unwrap_or(rest))
            .filter(|_| l.len() == prompt.len() || l[prompt.len()..].starts_with(' '))
    }
    let first = input.lines().find(|l| !l.trim().is_empty())?;
    after(first, "hs>")?;
    let mut inputs: Vec<String> = Vec::new();
    for line in input.lines() {
        if let Some(code) = after(line, "hs>") {
            inputs.push(code.to_string());
        } else if let (Some(code), Some(last)) = (after(line, "..."), inputs.last_mut()) {
            last.push('\n');
            last.push_str(code);
        }
    }
    inputs.retain(|i| !i.trim().is_empty());
    Some(inputs)
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
    docs::all_docs(engine)
        .into_iter()
        .flat_map(|d| d.examples().into_iter().map(move |e| (d.signature.clone(), e)))
        .collect()
}

/// A `:` command typed without its colon (`help`, `quit`, `exit`, `vars`...) is a variable
/// Rhai does not find: say how commands are written.
fn command_hint(code: &str, e: &ScriptError) -> Option<String> {
    let word = code.trim().trim_end_matches(';').trim().trim_end_matches("()");
    let is_command = commands::COMMANDS.iter().any(|c| c.name == word) || matches!(word, "exit" | "q");
    let command = if matches!(word, "exit" | "q") { "quit" } else { word };
    (is_command && e.message.contains("not found"))
        .then(|| format!("{word} is a session command: type :{command} (commands start with ':'; :help lists them)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_without_its_colon_says_how_commands_are_written() {
        let mut s = Session::new(SessionOptions::default());
        for (typed, command) in [
            ("help", ":help"),
            ("quit", ":quit"),
            ("exit", ":quit"),
            ("vars;", ":vars"),
            ("help()", ":help"),
            (" q ", ":quit"),
        ] {
            let e = s.eval("<input>", typed).expect_err(typed);
            let shown = e.to_string();
            assert!(shown.contains(&format!("is a session command: type {command}")), "{typed}: {shown}");
            assert!(
                !shown.contains('\n') && !shown.contains("not found"),
                "{typed}: one line, no 'not found': {shown}"
            );
        }
        // A variable of that name is the user's own.
        s.eval("<input>", "let help = 3;").expect("let");
        assert!(s.eval("<input>", "help").is_ok());
        // Another unknown variable gets no such note.
        let e = s.eval("<input>", "helpp").expect_err("helpp");
        assert!(e.message.contains("not found") && !e.to_string().contains("session command"), "{e}");
        // A command's name inside a longer input is an ordinary error.
        let e = s.eval("<input>", "vars + 1").expect_err("vars + 1");
        assert!(e.message.contains("not found") && !e.to_string().contains("session command"), "{e}");
    }

    #[test]
    fn not_found_errors_teach_signatures_and_near_names() {
        let mut s = Session::new(SessionOptions::default());
        s.eval("<input>", "let model_name = 1;").expect("let");
        // Wrong arguments: the script-facing signatures and :help, script type names.
        let e = s.eval("<input>", "heatmap(1, 2, 3)").expect_err("arity");
        assert!(e.message.contains("heatmap (int, int, int)"), "{}", e.message);
        assert!(
            e.notes.iter().any(|n| n.contains("'heatmap' is called as: heatmap(") && n.contains("(:help heatmap)")),
            "{:?}",
            e.notes
        );
        // A near name for an unknown function, and for a variable.
        let e = s.eval("<input>", "heatmapp([[1]])").expect_err("typo");
        assert!(e.notes.iter().any(|n| n == "did you mean 'heatmap'?"), "{:?}", e.notes);
        let e = s.eval("<input>", "model_nam + 1").expect_err("typo");
        assert!(e.notes.iter().any(|n| n == "did you mean 'model_name'?"), "{:?}", e.notes);
        // Nothing near: no suggestion.
        let e = s.eval("<input>", "qqqqqqqq(1)").expect_err("unknown");
        assert!(!e.notes.iter().any(|n| n.starts_with("did you mean")), "{:?}", e.notes);
        // A grid inside a map shows what it holds, not its type's name.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny_hf/gpt2");
        let shown = s
            .eval(
                "<input>",
                &format!("let g = load_model(\"{dir}\").head_importance([\"The cat sat.\"]); `${{#{{g: g}}}}`"),
            )
            .expect("a grid in a map")
            .expect("a value")
            .text;
        assert!(shown.contains("<Grid gradient importance") && shown.contains("dec 2x4>"), "{shown}");
        // `keys()` on a result type: what the type has instead of a map's keys.
        let e = s.eval("<input>", "table([\"a\"], [[1]]).keys()").expect_err("keys");
        assert!(
            e.notes.iter().any(|n| n.starts_with("Table is not a map; its properties and methods: ")
                && n.contains("column")
                && n.contains("to_csv")),
            "{:?}",
            e.notes
        );
    }

    /// What a session shows for each input, and what its `:save` script shows when run.
    #[test]
    fn a_saved_session_replays_and_shows_what_the_session_showed() {
        let inputs = [
            "let x = 2; // two",
            "1+1",
            "import \"stats\" as st;",
            "st::mean([1, 2, 3])",
            "x * 10 // the last",
            "let y = x; y",
        ];
        let mut s = Session::new(SessionOptions::default());
        let mut shown = Vec::new();
        for i in inputs {
            if let Some(o) = s.eval("repl", i).unwrap_or_else(|e| panic!("{i}: {e}")) {
                shown.push(o.text);
            }
        }
        assert_eq!(shown, ["2", "2.0", "20", "2"]);
        let script = s.history_script();
        let seen = Rc::new(RefCell::new(Vec::new()));
        let out = seen.clone();
        let sink: Sink = Box::new(move |e| {
            if let Event::Display(o) = e {
                out.borrow_mut().push(o.text);
            }
        });
        let mut replay = Session::new(SessionOptions { sink, ..Default::default() });
        replay.eval("saved.rhai", &script).unwrap_or_else(|e| panic!("the saved script does not run: {e}\n{script}"));
        assert_eq!(*seen.borrow(), shown, "{script}");
    }

    #[test]
    fn a_pasted_transcript_runs_its_inputs_without_prompts_or_output() {
        let t = "hs> let t = [1, 2];\nhs> fn f(x) {\n...   x + 1\n... }\nhs> f(t[1])\n3\n┌──┐\nhs> :vars\nhs>\n";
        assert_eq!(pasted_inputs(t).unwrap(), vec!["let t = [1, 2];", "fn f(x) {\n  x + 1\n}", "f(t[1])", ":vars"]);
        assert_eq!(pasted_inputs("  hs> 1 + 1").unwrap(), vec!["1 + 1"]);
        // Code as typed, including code that mentions the prompt.
        for code in ["1 + 1", "let hs = 1;\nhs> 0", "hsx> 1", ""] {
            assert!(pasted_inputs(code).is_none(), "{code:?}");
        }
    }

    /// What a frontend answers for an input, as the kernel's `is_complete` does: wait for more
    /// (`incomplete`), run it (`complete`), or show its syntax error at once (`invalid`).
    #[test]
    fn completeness_is_decided_by_the_parser() {
        let s = Session::new(SessionOptions::default());
        let status = |code: &str| match (s.is_complete(code), s.engine().compile(code).is_ok()) {
            (false, _) => "incomplete",
            (true, true) => "complete",
            (true, false) => "invalid",
        };
        let cases = [
            // Unfinished: open braces, brackets, parentheses or a backtick string.
            ("fn sq(x) {", "incomplete"),
            ("fn f(x) {", "incomplete"),
            ("let a = [1,", "incomplete"),
            ("let a = [1,\n2,", "incomplete"),
            ("let s = `multi\nline", "incomplete"),
            ("if x {\n  1\n} else {", "incomplete"),
            ("m.ablate(d, ", "incomplete"),
            // Complete.
            ("1 + 1", "complete"),
            ("fn f(x) { x }", "complete"),
            ("let s = `a\nb`;", "complete"),
            ("let a = [1,\n2];", "complete"),
            // Errors to show at once.
            ("let x = ;", "invalid"),
            ("}", "invalid"),
            ("let s = \"open", "invalid"),
            // Python habits (issue #30) are errors, not input to wait for.
            ("print(f\"{m}\")", "invalid"),
            ("m.ablate(d, heads=[1])", "invalid"),
            ("m.ablate(d, heads=[1, 2])", "invalid"),
            ("for h in xs: print(h)", "invalid"),
            ("def f(x): return x", "invalid"),
            ("xs[0:3]", "invalid"),
            ("def f(x):", "invalid"),
            ("for h in xs:", "invalid"),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .filter(|(code, want)| status(code) != *want)
            .map(|(code, want)| format!("{code:?}: {} (want {want})", status(code)))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// `:vars` shows the first line of what each value shows, cut at 60 characters; it is made
    /// without writing a whole array or drawing a plot, and must read the same.
    #[test]
    fn vars_previews_read_as_the_values_show() {
        let mut s = Session::new(SessionOptions::default());
        let code = r#"
            let big = []; big.pad(200000, 1.5);
            let short = [1, 2.0, "s", (), true, [3], #{a: 1}, 'c'];
            let nested = [[1, 2, 3], "a text \"quoted\" that goes on and on and on past the preview", #{k: [1, 2]}];
            let map = #{b: "x", a: [1.0, 2], c: #{d: ()}};
            let big_map = #{}; for i in 0..1000 { big_map[`k${i}`] = [i, i]; }
            let text = "one\ntwo";
            let long_text = ""; for i in 0..100 { long_text += "word "; }
            let exact = "123456789012345678901234567890123456789012345678901234567890";
            let p = heatmap([[0.1, 0.2]], #{title: "a plot"});
            let t = 3.5; let e = []; let none = ();
        "#;
        s.eval("a", code).unwrap();
        let vars = s.variables();
        assert_eq!(vars.len(), 13, "{:?}", vars.iter().map(|v| &v.name).collect::<Vec<_>>());
        for v in &vars {
            let value = s.scope.get_value::<Dynamic>(&v.name).unwrap();
            let shown = render_value(&value).map(|o| o.text).unwrap_or_default();
            let line = shown.lines().next().unwrap_or_default();
            let want = if line.chars().count() > 60 {
                format!("{}...", line.chars().take(60).collect::<String>())
            } else {
                line.to_string()
            };
            assert_eq!(v.preview, want, "{}", v.name);
        }
        let preview = |n: &str| vars.iter().find(|v| v.name == n).map(|v| v.preview.clone()).unwrap_or_default();
        assert!(preview("big").starts_with("[1.5, 1.5") && preview("big").ends_with("..."));
        assert_eq!(preview("exact").len(), 60, "sixty characters are shown whole");
        assert!(preview("p").contains("a plot"), "{}", preview("p"));
    }

    fn names(s: &Session) -> Vec<String> {
        s.variables().into_iter().map(|v| v.name).collect()
    }

    fn value(s: &mut Session, code: &str) -> String {
        s.eval("check", code).unwrap_or_else(|e| panic!("{code}: {e}")).map(|o| o.text).unwrap_or_default()
    }

    #[test]
    fn a_top_level_let_replaces_the_variable_of_an_earlier_input() {
        let mut s = Session::new(SessionOptions::default());
        for i in 0..10 {
            s.eval(&format!("cell[{i}]"), "let big = []; big.pad(1000, 1.5); let other = 1;").unwrap();
        }
        assert_eq!(names(&s), ["ARGS", "big", "other"]);
        // The old value is freed before the new one is computed when the expression does not
        // read the name; one that does reads the old value, and only one variable is left.
        s.eval("a", "let x = 1;").unwrap();
        s.eval("b", "let x = x + 1; let x = x * 10;").unwrap();
        assert_eq!(value(&mut s, "x"), "20");
        assert_eq!(names(&s).iter().filter(|n| *n == "x").count(), 1);
        // A `let` in a function or a block shadows as Rhai always did.
        s.eval("c", "fn f(x) { let x = x + 1; x } let y = { let x = 5; x };").unwrap();
        assert_eq!(value(&mut s, "[f(1), x, y]"), "[2, 20, 5]");
        // A closure keeps what it captured.
        s.eval("d", "let k = 5; let get = || k;").unwrap();
        s.eval("e", "let k = 6;").unwrap();
        assert_eq!(value(&mut s, "[get.call(), k]"), "[5, 6]");
        // Constants and variables may replace each other.
        s.eval("f", "const C = 1;").unwrap();
        s.eval("g", "let C = 2; C += 1;").unwrap();
        assert_eq!(value(&mut s, "C"), "3");
        assert_eq!(names(&s).iter().filter(|n| *n == "C").count(), 1);
    }

    #[test]
    fn a_let_that_fails_after_releasing_the_old_value_says_so() {
        let mut s = Session::new(SessionOptions::default());
        s.eval("a", "let z = 1; let w = 2;").unwrap();
        let e = s.eval("b", "let z = no_such_function(); let w = 3;").unwrap_err().to_string();
        assert!(e.contains("no_such_function") && e.contains("`z`: the old value was released"), "{e}");
        assert!(!e.contains("`w`"), "{e}");
        assert_eq!(value(&mut s, "w"), "2");
        assert!(s.eval("c", "z").is_err(), "z is undefined after its failed let");
        // A failed `let` that reads the name keeps the old value.
        s.eval("d", "let w = w + 1;").unwrap();
        assert!(s.eval("e", "let w = w + no_such_function();").is_err());
        assert_eq!(value(&mut s, "w"), "3");
    }

    #[test]
    fn rebinding_a_name_keeps_a_model_another_variable_holds() {
        let mut s = Session::new(SessionOptions::default());
        s.eval(
            "a",
            r#"let m = load_model("minilm", #{device: "cpu"}); let view = m.with_mask(["enc.0.1"]); let same = m;"#,
        )
        .unwrap();
        let vars = s.variables();
        let model = |n: &str| {
            vars.iter().find(|v| v.name == n).and_then(|v| v.size).unwrap_or_else(|| panic!("{n} has no size"))
        };
        let (m, view) = (model("m"), model("view"));
        assert!(m.bytes > 80_000_000 && m.bytes < 100_000_000, "MiniLM's f32 weights: {} bytes", m.bytes);
        assert_eq!(m.shared, view.shared, "a view shares its model's weights");
        let shown = commands::dispatch(&mut s, ":vars")
            .ok()
            .and_then(|o| match o {
                commands::Outcome::Show(o) => o,
                _ => None,
            })
            .map(|o| o.text)
            .unwrap_or_default();
        assert!(shown.contains("weights shared with view, same"), "{shown}");
        s.eval("b", "let m = 1;").unwrap();
        assert_eq!(value(&mut s, r#"[same.layers("enc"), view.layers("enc"), m]"#), "[6, 6, 1]");
        assert_eq!(
            value(&mut s, r#"[same.forward(["The cat sat."]).sentences, view.forward(["A dog."]).sentences]"#),
            "[1, 1]"
        );
    }
}
