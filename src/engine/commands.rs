//! The `:` commands, one table of (name, usage, help, handler) shared by every frontend.

use super::Session;
use crate::output::Output;
use crate::table::{Cell, Table};

pub enum Outcome {
    /// Show this (or nothing).
    Show(Option<Output>),
    /// The frontend should end the session.
    Quit,
}

type Handler = fn(&mut Session, &str) -> Result<Outcome, String>;

pub struct Command {
    pub name: &'static str,
    pub usage: &'static str,
    pub help: &'static str,
    pub run: Handler,
}

pub const COMMANDS: &[Command] = &[
    Command { name: "help", usage: ":help [NAME]", help: "list commands, or show the documentation of a function", run: help },
    Command { name: "vars", usage: ":vars", help: "list the variables of this session with their types", run: vars },
    Command { name: "load", usage: ":load FILE", help: "run a .rhai file in this session (its variables and functions stay)", run: load },
    Command { name: "time", usage: ":time on|off", help: "show how long each evaluation takes", run: time },
    Command { name: "device", usage: ":device", help: "torch version, CUDA devices and CPU threads", run: device },
    Command { name: "quit", usage: ":quit", help: "leave (Ctrl-D works too)", run: |_, _| Ok(Outcome::Quit) },
];

/// Runs a line starting with `:`.
pub fn dispatch(session: &mut Session, line: &str) -> Result<Outcome, String> {
    let body = line.trim().trim_start_matches(':');
    let (name, arg) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
    match COMMANDS.iter().find(|c| c.name == name || (name == "q" && c.name == "quit") || (name == "exit" && c.name == "quit")) {
        Some(c) => (c.run)(session, arg.trim()),
        None => Err(format!("unknown command ':{name}' (commands: {})", COMMANDS.iter().map(|c| format!(":{}", c.name)).collect::<Vec<_>>().join(", "))),
    }
}

fn help(session: &mut Session, arg: &str) -> Result<Outcome, String> {
    if arg.is_empty() {
        let mut t = Table::new(vec!["command".into(), "what it does".into()]);
        for c in COMMANDS {
            let _ = t.push_row(vec![Cell::Text(c.usage.into()), Cell::Text(c.help.into())]);
        }
        let mut out = t.to_text();
        out += "\nAny other input is Rhai code. `:help NAME` documents a function, e.g. `:help heatmap`.";
        return Ok(Outcome::Show(Some(Output::text(out))));
    }
    let docs = session.docs(arg);
    if docs.is_empty() {
        return Err(format!("no documented function named '{arg}'"));
    }
    let text = docs.iter().map(|d| format!("{}\n\n{}", d.signature, d.doc)).collect::<Vec<_>>().join("\n\n---\n\n");
    Ok(Outcome::Show(Some(Output::text(text))))
}

fn vars(session: &mut Session, _: &str) -> Result<Outcome, String> {
    let mut t = Table::new(vec!["name".into(), "type".into(), "value".into()]);
    for (name, ty, preview) in session.variables() {
        let _ = t.push_row(vec![Cell::Text(name), Cell::Text(ty), Cell::Text(preview)]);
    }
    if t.rows.is_empty() {
        return Ok(Outcome::Show(Some(Output::text("no variables yet"))));
    }
    Ok(Outcome::Show(Some(crate::output::Render::render(&t))))
}

fn load(session: &mut Session, arg: &str) -> Result<Outcome, String> {
    if arg.is_empty() {
        return Err("usage: :load FILE".into());
    }
    session.eval_file(std::path::Path::new(arg)).map(Outcome::Show).map_err(|e| e.to_string())
}

fn time(session: &mut Session, arg: &str) -> Result<Outcome, String> {
    session.time = match arg {
        "on" => true,
        "off" => false,
        "" => !session.time,
        other => return Err(format!("usage: :time on|off (got '{other}')")),
    };
    Ok(Outcome::Show(Some(Output::text(format!("timing {}", if session.time { "on" } else { "off" })))))
}

fn device(_: &mut Session, _: &str) -> Result<Outcome, String> {
    Ok(Outcome::Show(Some(Output::text(crate::device::torch_info().to_string()))))
}
