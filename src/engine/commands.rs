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
    Command { name: "help", usage: ":help [NAME]", help: "list commands; document a function (:help analyze), a type's methods (:help Model), one method (:help Model.analyze) or the hook points (:help hooks)", run: help },
    Command { name: "vars", usage: ":vars", help: "list the variables of this session: type, size in memory (bytes of weights, numbers and text held), value", run: vars },
    Command { name: "types", usage: ":types", help: "list the script types and how many methods each has", run: types },
    Command { name: "history", usage: ":history", help: "the inputs of this session that ran without error, numbered", run: history },
    Command { name: "save", usage: ":save FILE", help: "write those inputs as a .rhai script that `headscope run FILE` replays", run: save },
    Command { name: "load", usage: ":load FILE", help: "run a .rhai file in this session (its variables and functions stay)", run: load },
    Command { name: "time", usage: ":time on|off", help: "show how long each evaluation takes", run: time },
    Command { name: "device", usage: ":device", help: "torch version, CUDA devices and CPU threads", run: device },
    Command { name: "quit", usage: ":quit", help: "leave (Ctrl-D works too)", run: |_, _| Ok(Outcome::Quit) },
];

/// Runs a line starting with `:`.
pub fn dispatch(session: &mut Session, line: &str) -> Result<Outcome, String> {
    let body = line.trim().trim_start_matches(':');
    let (name, arg) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
    match COMMANDS
        .iter()
        .find(|c| c.name == name || (name == "q" && c.name == "quit") || (name == "exit" && c.name == "quit"))
    {
        Some(c) => (c.run)(session, arg.trim()),
        None => Err(format!(
            "unknown command ':{name}' (commands: {})",
            COMMANDS.iter().map(|c| format!(":{}", c.name)).collect::<Vec<_>>().join(", ")
        )),
    }
}

fn help(session: &mut Session, arg: &str) -> Result<Outcome, String> {
    if arg.is_empty() {
        let mut t = Table::new(vec!["command".into(), "what it does".into()]);
        for c in COMMANDS {
            let _ = t.push_row(vec![Cell::Text(c.usage.into()), Cell::Text(c.help.into())]);
        }
        let mut out = t.to_text();
        out += "\n";
        out += &modules_table().to_text();
        out += "\nAny other input is Rhai code. `:help NAME` documents a function (`:help heatmap`), a type (`:help Model`) or a stdlib module (`:help stats`); `:help functions` lists the global functions, `:types` the types, `:help hooks` the hook points.";
        return Ok(Outcome::Show(Some(Output::text(out))));
    }
    if arg == "hooks" {
        return Ok(Outcome::Show(Some(hooks_help())));
    }
    if arg == "functions" {
        return Ok(Outcome::Show(Some(functions_help(session))));
    }
    if let Some((module, _)) = super::STDLIB.iter().find(|(m, _)| *m == arg) {
        return Ok(Outcome::Show(Some(module_help(session, module))));
    }
    let types = super::docs::type_names(session.engine());
    if let Some(t) = types.iter().find(|t| t.as_str() == arg) {
        return Ok(Outcome::Show(Some(type_help(session, t))));
    }
    // `Type.method`: that type's overloads only.
    let (receiver, name) = match arg.split_once('.') {
        Some((t, m)) if types.iter().any(|x| x == t) => (Some(t), m),
        _ => (None, arg),
    };
    let mut docs = session.docs(name);
    if let Some(t) = receiver {
        docs.retain(|d| d.receiver.as_deref() == Some(t));
    }
    if docs.is_empty() {
        let mut topics = super::docs::function_names(session.engine());
        topics.extend(types.iter().cloned());
        topics.push("hooks".into());
        let near = crate::suggest::did_you_mean(arg, topics.iter().map(String::as_str))
            .map_or(String::new(), |d| format!("{d} "));
        return Err(format!("no documented function or type named '{arg}' ({near}:types lists the types)"));
    }
    Ok(Outcome::Show(Some(Output::text(super::complete::describe(&docs)))))
}

/// `:help hooks`: the hook table (`model::hooks::POINTS`), the names `run_with_cache` and the
/// interventions accept.
fn hooks_help() -> Output {
    use crate::model::hooks::POINTS;
    let mut t = Table::new(vec!["hook point".into(), "axes".into(), "what it holds".into()]);
    t.title = Some("hook points, in the order the forward meets them (docs/methods.md#hook-points)".into());
    for p in POINTS {
        let name = if p.per_layer { format!("KIND.blocks.L.{}", p.name) } else { format!("KIND.{}", p.name) };
        let _ = t.push_row(vec![Cell::Text(name), Cell::Text(p.axes.into()), Cell::Text(p.doc.into())]);
    }
    let mut out = crate::output::Render::render(&t);
    out.text += "\nKIND is enc, dec or cross (cross: the attention points only); a decoder-only model's `dec.` may be left out. \
                 m.hook_points() lists the names a model has; m.run_with_cache(text, [names]) records them, #{interventions: [...]} changes them.";
    out
}

/// `:help TYPE`: every method and property of the type with its one-line doc.
/// The stdlib modules, each with the first line of its file's comment.
fn modules_table() -> Table {
    let mut t = Table::new(vec!["stdlib module".into(), "what it holds".into()]);
    t.title = Some("stdlib modules: import \"stats\" as s; then s::mean(xs) (:help stats lists one)".into());
    for (name, text) in super::STDLIB {
        let first = text.lines().next().and_then(|l| l.strip_prefix("//")).map(str::trim).unwrap_or_default();
        let what = first.strip_prefix(&format!("{name}:")).map(str::trim).unwrap_or(first);
        let _ = t.push_row(vec![Cell::Text((*name).into()), Cell::Text(what.into())]);
    }
    t
}

/// `:help functions`: the global functions (not methods), each signature with its summary.
fn functions_help(session: &Session) -> Output {
    let mut t = Table::new(vec!["function".into(), "what it does".into()]);
    t.title = Some("global functions (:help NAME for one; methods: :help TYPE)".into());
    let mut seen = std::collections::HashSet::new();
    for d in super::docs::all_docs(session.engine()).iter().filter(|d| d.receiver.is_none() && !d.name.contains("::")) {
        if d.signature.contains(" = ") || d.signature.contains('[') || !seen.insert(d.signature.clone()) {
            continue;
        }
        let _ = t.push_row(vec![Cell::Text(d.signature.clone()), Cell::Text(d.summary())]);
    }
    crate::output::Render::render(&t)
}

/// `:help MODULE`: a stdlib module's functions.
fn module_help(session: &Session, module: &str) -> Output {
    let mut t = Table::new(vec!["function".into(), "what it does".into()]);
    t.title = Some(format!(
        "stdlib module {module}: import \"{module}\" as m; then m::NAME(...) (:help {module}::NAME for one)"
    ));
    let prefix = format!("{module}::");
    for d in super::docs::all_docs(session.engine()).iter().filter(|d| d.name.starts_with(&prefix)) {
        let _ = t.push_row(vec![Cell::Text(d.signature.clone()), Cell::Text(d.summary())]);
    }
    crate::output::Render::render(&t)
}

fn type_help(session: &Session, type_name: &str) -> Output {
    let docs = super::docs::all_docs(session.engine());
    let mut t = Table::new(vec!["member".into(), "what it does".into()]);
    t.title = Some(format!("{type_name}: methods and properties (:help {type_name}.NAME for one)"));
    let mut seen = std::collections::HashSet::new();
    for d in docs.iter().filter(|d| d.receiver.as_deref() == Some(type_name)) {
        if d.signature.contains(" = ") || !seen.insert(d.signature.clone()) {
            continue;
        }
        let _ = t.push_row(vec![Cell::Text(d.signature.clone()), Cell::Text(d.summary())]);
    }
    crate::output::Render::render(&t)
}

fn types(session: &mut Session, _: &str) -> Result<Outcome, String> {
    let mut t = Table::new(vec!["type".into(), "methods and properties".into(), "for example".into()]);
    let mut by_type = super::docs::members_by_type(session.engine());
    for name in super::docs::type_names(session.engine()) {
        let members = by_type.remove(&name).unwrap_or_default();
        let some = members.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let _ = t.push_row(vec![Cell::Text(name), Cell::Int(members.len() as i64), Cell::Text(some)]);
    }
    Ok(Outcome::Show(Some(crate::output::Render::render(&t))))
}

fn history(session: &mut Session, _: &str) -> Result<Outcome, String> {
    if session.history.is_empty() {
        return Ok(Outcome::Show(Some(Output::text("no inputs yet"))));
    }
    let width = session.history.len().to_string().len();
    let text = session
        .history
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let mut lines = input.code.trim_end().lines();
            let first = format!("{:>width$}  {}", i + 1, lines.next().unwrap_or_default());
            lines.fold(first, |acc, l| format!("{acc}\n{:>width$}  {l}", ""))
        })
        .collect::<Vec<_>>()
        .join("\n");
    Ok(Outcome::Show(Some(Output::text(text))))
}

fn save(session: &mut Session, arg: &str) -> Result<Outcome, String> {
    if arg.is_empty() {
        return Err("usage: :save FILE".into());
    }
    let script = session.history_script();
    crate::files::write_atomic(std::path::Path::new(arg), script.as_bytes())
        .map_err(|e| format!(":save: cannot write '{arg}': {e}"))?;
    Ok(Outcome::Show(Some(Output::text(format!(
        "saved {} inputs to {arg}; replay with `headscope run {arg}`",
        session.history.len()
    )))))
}

fn vars(session: &mut Session, _: &str) -> Result<Outcome, String> {
    use super::size::human;
    let vars = session.variables();
    if vars.is_empty() {
        return Ok(Outcome::Show(Some(Output::text("no variables yet"))));
    }
    // Variables sharing one model's weights: each names the others, the total counts them once.
    let mut sharing: std::collections::HashMap<usize, Vec<&str>> = std::collections::HashMap::new();
    for v in &vars {
        if let Some((at, _)) = v.size.and_then(|s| s.shared) {
            sharing.entry(at).or_default().push(&v.name);
        }
    }
    let mut t = Table::new(vec!["name".into(), "type".into(), "size".into(), "value".into()]);
    let mut total = 0u64;
    let mut counted = std::collections::HashSet::new();
    for v in &vars {
        let size = match v.size {
            None => "-".to_string(),
            Some(s) => {
                total += s.bytes;
                match s.shared {
                    Some((at, weights)) => {
                        if !counted.insert(at) {
                            total -= weights;
                        }
                        let others: Vec<&str> =
                            sharing.get(&at).into_iter().flatten().copied().filter(|n| *n != v.name).collect();
                        if others.is_empty() {
                            human(s.bytes)
                        } else {
                            format!("{} (weights shared with {})", human(s.bytes), others.join(", "))
                        }
                    }
                    None => human(s.bytes),
                }
            }
        };
        let _ = t.push_row(vec![
            Cell::Text(v.name.clone()),
            Cell::Text(v.type_name.clone()),
            Cell::Text(size),
            Cell::Text(v.preview.clone()),
        ]);
    }
    t.title = Some(format!(
        "{} variables holding {} (the bytes of their tensors, numbers and text; shared weights counted once)",
        vars.len(),
        human(total)
    ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SessionOptions;

    #[test]
    fn help_lists_the_global_functions_and_the_stdlib_modules() {
        let mut s = Session::new(SessionOptions::default());
        let show = |s: &mut Session, c: &str| match dispatch(s, c) {
            Ok(Outcome::Show(Some(o))) => o.text,
            _ => panic!("{c} showed nothing"),
        };
        let all = show(&mut s, ":help");
        for m in ["stats", "tables", "heads", "prune", "summary statistics", ":help functions"] {
            assert!(all.contains(m), "{m} missing from :help:\n{all}");
        }
        let f = show(&mut s, ":help functions");
        for name in ["heatmap(matrix", "table(", "bleu(", "corpus("] {
            assert!(f.contains(name), "{name} missing from :help functions");
        }
        assert!(!f.contains("m.analyze"), "methods are listed by type, not here");
        let m = show(&mut s, ":help stats");
        assert!(m.contains("stats::mean(") && m.contains("Arithmetic mean."), "{m}");
    }

    #[test]
    fn help_on_a_mistyped_topic_suggests_the_near_one() {
        let mut s = Session::new(SessionOptions::default());
        for (typed, near) in [
            (":help Modle", "did you mean 'Model'?"),
            (":help heatmapp", "did you mean 'heatmap'?"),
            (":help hoks", "'hooks'"),
        ] {
            let Err(e) = dispatch(&mut s, typed) else { panic!("{typed} found something") };
            assert!(e.contains(near), "{typed}: {e}");
        }
    }

    #[test]
    fn help_hooks_lists_every_hook_point_with_its_axes() {
        let mut s = Session::new(SessionOptions::default());
        let Ok(Outcome::Show(Some(out))) = dispatch(&mut s, ":help hooks") else {
            panic!(":help hooks showed nothing")
        };
        for p in crate::model::hooks::POINTS {
            let name = if p.per_layer { format!("KIND.blocks.L.{}", p.name) } else { format!("KIND.{}", p.name) };
            assert!(out.text.contains(&name), "{name} missing from:\n{}", out.text);
            assert!(out.text.contains(p.axes), "{} missing", p.axes);
        }
        assert!(out.html.is_some(), "a notebook gets the table as HTML");
        let Ok(Outcome::Show(Some(list))) = dispatch(&mut s, ":help") else { panic!() };
        assert!(list.text.contains(":help hooks"));
    }
}
