//! Script errors as users see them: `file:line:col: error: message`, the source line with a
//! caret, and the chain of calls or module loads it came through.

use rhai::{EvalAltResult, ParseError, Position};
use std::collections::HashMap;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Syntax,
    Runtime,
    Interrupted,
    /// A Rust panic under a native function, turned into an error.
    Panic,
}

/// A place in a named source.
#[derive(Debug, Clone, PartialEq)]
pub struct Location {
    pub source: String,
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.source, self.line, self.col)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScriptError {
    pub kind: ErrorKind,
    pub message: String,
    pub location: Option<Location>,
    /// The source line at `location`, when known.
    pub source_line: Option<String>,
    /// Outer frames: "in call to `f` at file:3:5", "in module 'tables' (stdlib/tables.rhai)".
    pub notes: Vec<String>,
}

/// Source texts by name, to quote lines in errors.
pub type Sources = HashMap<String, String>;

fn loc(source: &str, pos: Position) -> Option<Location> {
    Some(Location { source: source.to_string(), line: pos.line()?, col: pos.position().unwrap_or(1) })
}

impl ScriptError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ScriptError { kind, message: message.into(), location: None, source_line: None, notes: vec![] }
    }

    fn with_line(mut self, sources: &Sources) -> Self {
        if let Some(l) = &self.location {
            self.source_line = sources.get(&l.source).and_then(|s| s.lines().nth(l.line - 1)).map(|s| s.to_string());
        }
        self
    }

    pub fn from_parse(source: &str, e: &ParseError, sources: &Sources) -> Self {
        let message = e.err_type().to_string();
        ScriptError {
            kind: ErrorKind::Syntax,
            message,
            location: loc(source, e.position()),
            source_line: None,
            notes: vec![],
        }
        .with_line(sources)
    }

    /// Unwraps nested call and module errors down to the innermost one, keeping the chain.
    /// `module_files` maps an import path ("tables") to its source name ("stdlib/tables.rhai").
    pub fn from_eval(
        source: &str,
        e: EvalAltResult,
        sources: &Sources,
        module_files: &HashMap<String, String>,
    ) -> Self {
        let mut current = source.to_string();
        let mut notes = Vec::new();
        let mut e = e;
        loop {
            match e {
                EvalAltResult::ErrorInFunctionCall(name, src, inner, pos) => {
                    let at = loc(&current, pos).map(|l| format!(" at {l}")).unwrap_or_default();
                    notes.push(format!("in call to `{name}`{at}"));
                    if !src.is_empty() {
                        current = src.to_string();
                    }
                    e = *inner;
                }
                EvalAltResult::ErrorInModule(path, inner, pos) => {
                    let file = module_files.get(&path).cloned().unwrap_or_else(|| path.clone());
                    let at = loc(&current, pos).map(|l| format!(", imported at {l}")).unwrap_or_default();
                    notes.push(format!("in module '{path}' ({file}){at}"));
                    current = file;
                    e = *inner;
                }
                EvalAltResult::ErrorParsing(t, pos) => {
                    let err = ScriptError {
                        kind: ErrorKind::Syntax,
                        message: t.to_string(),
                        location: loc(&current, pos),
                        source_line: None,
                        notes,
                    };
                    return err.with_line(sources);
                }
                EvalAltResult::ErrorTerminated(_, pos) => {
                    let err = ScriptError {
                        kind: ErrorKind::Interrupted,
                        message: "interrupted".into(),
                        location: loc(&current, pos),
                        source_line: None,
                        notes,
                    };
                    return err.with_line(sources);
                }
                mut other => {
                    let pos = other.take_position();
                    let message = match &other {
                        EvalAltResult::ErrorRuntime(v, _) if v.is_string() => v.to_string(),
                        _ => other.to_string(),
                    };
                    let err = ScriptError {
                        kind: ErrorKind::Runtime,
                        message,
                        location: loc(&current, pos),
                        source_line: None,
                        notes,
                    };
                    return err.with_line(sources);
                }
            }
        }
    }

    /// The first line alone: `file:line:col: error: message`.
    pub fn headline(&self) -> String {
        let what = match self.kind {
            ErrorKind::Syntax => "syntax error",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Panic => "internal error",
            ErrorKind::Runtime => "error",
        };
        let msg = if self.kind == ErrorKind::Interrupted { String::new() } else { format!(": {}", self.message) };
        match &self.location {
            Some(l) => format!("{l}: {what}{msg}"),
            None => format!("{what}{msg}"),
        }
    }
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.headline())?;
        if let (Some(l), Some(line)) = (&self.location, &self.source_line) {
            let n = l.line.to_string();
            let pad = " ".repeat(n.len());
            // Caret under the column, counting characters (tabs kept so alignment holds).
            let lead: String =
                line.chars().take(l.col.saturating_sub(1)).map(|c| if c == '\t' { '\t' } else { ' ' }).collect();
            write!(f, "\n{pad} |\n{n} | {line}\n{pad} | {lead}^")?;
        }
        for note in &self.notes {
            write!(f, "\n  note: {note}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ScriptError {}
