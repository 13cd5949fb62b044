//! The engine thread of the kernel. A [`Session`] is not `Send` (Rhai values are `Rc`), so it
//! lives on one thread of its own; the protocol side hands it [`Job`]s and it answers with a
//! stream of [`WorkerMsg`]s: iopub contents as they happen, then exactly one reply.

use crate::engine::commands::{self, Outcome};
use crate::engine::{ErrorKind, Event, Interrupt, ScriptError, Session, SessionOptions};
use crate::output::Output;
use base64::Engine as _;
use jupyter_protocol::{
    CompleteReply, DisplayData, ErrorOutput, ExecuteInput, ExecuteReply, ExecuteResult, ExecutionCount, InspectReply,
    IsCompleteReply, IsCompleteReplyStatus, JupyterMessageContent, Media, MediaType, ReplyError, ReplyStatus,
    StreamContent, Transient, UpdateDisplayData,
};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// A request the engine must answer.
#[derive(Debug)]
pub enum Request {
    Execute { code: String, silent: bool },
    Complete { code: String, cursor_pos: usize },
    Inspect { code: String, cursor_pos: usize },
    IsComplete { code: String },
}

/// What the engine sends back for one request.
#[derive(Debug)]
pub enum WorkerMsg {
    /// Published on iopub, as a child of the request.
    IoPub(JupyterMessageContent),
    /// The shell reply; always the last message of a job.
    Reply(JupyterMessageContent),
}

pub struct Job {
    pub request: Request,
    pub out: UnboundedSender<WorkerMsg>,
}

type Out = Rc<RefCell<Option<UnboundedSender<WorkerMsg>>>>;

/// Starts the engine thread. Returns the job queue and the session's interrupt (for
/// `interrupt_request` on the control channel).
pub fn spawn(base_dir: std::path::PathBuf) -> Result<(std::sync::mpsc::Sender<Job>, Interrupt), String> {
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Job>();
    let (int_tx, int_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("headscope-engine".into())
        .spawn(move || {
            let out: Out = Rc::default();
            let session = Session::new(SessionOptions { sink: sink(out.clone()), args: vec![], base_dir });
            let _ = int_tx.send(session.interrupt_handle());
            let mut worker = Worker { session, out, count: 0 };
            while let Ok(job) = jobs_rx.recv() {
                *worker.out.borrow_mut() = Some(job.out.clone());
                let reply = worker.handle(job.request);
                let _ = job.out.send(WorkerMsg::Reply(reply));
                *worker.out.borrow_mut() = None;
            }
        })
        .map_err(|e| format!("cannot start the engine thread: {e}"))?;
    let interrupt = int_rx.recv().map_err(|_| "the engine thread failed to start".to_string())?;
    Ok((jobs_tx, interrupt))
}

fn publish(out: &Out, content: JupyterMessageContent) {
    if let Some(tx) = out.borrow().as_ref() {
        let _ = tx.send(WorkerMsg::IoPub(content));
    }
}

/// The session's sink for a notebook: prints become stdout stream messages at once, displays
/// become `display_data`, progress is one display updated in place (at most every 200 ms)
/// showing the rate and the time left, as the terminal's bar does, and emptied when the cell
/// finishes (a saved notebook keeps the cell's results, not its progress bars).
fn sink(out: Out) -> crate::engine::Sink {
    struct Shown {
        id: String,
        last: Instant,
        pace: crate::run::Pace,
    }
    let mut progress: Option<Shown> = None;
    let mut n_bars = 0usize;
    // The progress displays of the running cell, emptied when it finishes.
    let mut bars: Vec<String> = Vec::new();
    Box::new(move |ev| match ev {
        Event::Print(s) => publish(&out, StreamContent::stdout(&format!("{s}\n")).into()),
        Event::Display(o) => publish(&out, DisplayData::new(media(&o)).into()),
        Event::Finished => {
            progress = None;
            for id in bars.drain(..) {
                publish(&out, UpdateDisplayData::new(media(&Output::default()), &id).into());
            }
        }
        Event::Progress { label, done, total } => {
            let finished = done >= total;
            match &mut progress {
                Some(p) if !finished && p.last.elapsed() < Duration::from_millis(200) => {}
                Some(p) => {
                    let data = media(&progress_output(&label, done, total, &p.pace.describe(done, total)));
                    publish(&out, UpdateDisplayData::new(data, &p.id).into());
                    p.last = Instant::now();
                    if finished {
                        progress = None;
                    }
                }
                None => {
                    n_bars += 1;
                    let id = format!("headscope-progress-{}-{n_bars}", std::process::id());
                    let mut d = DisplayData::new(media(&progress_output(&label, done, total, "")));
                    d.transient = Some(Transient { display_id: Some(id.clone()) });
                    publish(&out, d.into());
                    bars.push(id.clone());
                    if !finished {
                        progress = Some(Shown { id, last: Instant::now(), pace: crate::run::Pace::new(done) });
                    }
                }
            }
        }
    })
}

/// `label: done/total (pct%)` and `timing` (`, rate/s, ETA m:ss` once measured:
/// `run::Pace`) as text and as an HTML progress bar.
fn progress_output(label: &str, done: usize, total: usize, timing: &str) -> Output {
    let pct = if total == 0 { 100.0 } else { 100.0 * done as f64 / total as f64 };
    let text = format!("{label}: {done}/{total} ({pct:.0}%){timing}");
    let html = format!(
        "<div style=\"font-family:monospace\">{} <progress value=\"{done}\" max=\"{total}\" style=\"width:20em\"></progress> {done}/{total}{}</div>",
        crate::output::html_escape(label),
        crate::output::html_escape(timing)
    );
    Output { text, html: Some(html), ..Default::default() }
}

/// An output bundle as Jupyter media: text/plain always, then the rich forms it has.
pub fn media(o: &Output) -> Media {
    let mut content = vec![MediaType::Plain(o.text.clone())];
    if let Some(h) = &o.html {
        content.push(MediaType::Html(h.clone()));
    }
    if let Some(p) = &o.png {
        content.push(MediaType::Png(base64::engine::general_purpose::STANDARD.encode(p)));
    }
    if let Some(s) = &o.svg {
        content.push(MediaType::Svg(s.clone()));
    }
    Media { content }
}

fn error_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Syntax => "SyntaxError",
        ErrorKind::Runtime => "RuntimeError",
        ErrorKind::Interrupted => "Interrupted",
        ErrorKind::Panic => "InternalError",
    }
}

struct Worker {
    session: Session,
    out: Out,
    count: usize,
}

impl Worker {
    fn handle(&mut self, request: Request) -> JupyterMessageContent {
        match request {
            Request::Execute { code, silent } => self.execute(&code, silent),
            Request::Complete { code, cursor_pos } => {
                let pos = byte_index(&code, cursor_pos);
                let c = self.session.complete(&code, pos);
                let matches = c.candidates.into_iter().map(|c| c.replacement).collect();
                CompleteReply {
                    matches,
                    cursor_start: code[..c.start].chars().count(),
                    cursor_end: code[..pos].chars().count(),
                    metadata: Default::default(),
                    status: ReplyStatus::Ok,
                    error: None,
                }
                .into()
            }
            Request::Inspect { code, cursor_pos } => {
                let text = self.session.inspect(&code, byte_index(&code, cursor_pos));
                InspectReply {
                    found: text.is_some(),
                    data: text.map_or_else(Media::default, |t| Media { content: vec![MediaType::Plain(t)] }),
                    metadata: Default::default(),
                    status: ReplyStatus::Ok,
                    error: None,
                }
                .into()
            }
            Request::IsComplete { code } => {
                let status = if code.trim_start().starts_with(':') {
                    IsCompleteReplyStatus::Complete
                } else if !self.session.is_complete(&code) {
                    IsCompleteReplyStatus::Incomplete
                } else if self.session.engine().compile(&code).is_ok() {
                    IsCompleteReplyStatus::Complete
                } else {
                    IsCompleteReplyStatus::Invalid
                };
                let indent = if status == IsCompleteReplyStatus::Incomplete { "    ".into() } else { String::new() };
                IsCompleteReply { status, indent }.into()
            }
        }
    }

    fn execute(&mut self, code: &str, silent: bool) -> JupyterMessageContent {
        if !silent {
            self.count += 1;
        }
        let count = ExecutionCount::new(self.count);
        if !silent {
            publish(&self.out, ExecuteInput { code: code.to_string(), execution_count: count }.into());
        }
        let started = Instant::now();
        let result: Result<Option<Output>, ScriptError> = if code.trim_start().starts_with(':') {
            match commands::dispatch(&mut self.session, code) {
                Ok(Outcome::Show(o)) => Ok(o),
                Ok(Outcome::Quit) => {
                    Ok(Some(Output::text("(:quit does not end a notebook's kernel; use Kernel > Shut Down)")))
                }
                Err(e) => Err(ScriptError::new(ErrorKind::Runtime, e)),
            }
        } else {
            self.session.eval(&format!("cell[{}]", self.count), code)
        };
        let reply = match result {
            Ok(value) => {
                if let (Some(o), false) = (value, silent) {
                    publish(&self.out, ExecuteResult::new(count, media(&o)).into());
                }
                ExecuteReply {
                    status: ReplyStatus::Ok,
                    execution_count: count,
                    user_expressions: Some(Default::default()),
                    ..Default::default()
                }
            }
            Err(e) => {
                let ename = error_name(e.kind).to_string();
                let traceback: Vec<String> = e.to_string().lines().map(str::to_string).collect();
                let evalue = e.message.clone();
                publish(
                    &self.out,
                    ErrorOutput { ename: ename.clone(), evalue: evalue.clone(), traceback: traceback.clone() }.into(),
                );
                ExecuteReply {
                    status: ReplyStatus::Error,
                    execution_count: count,
                    error: Some(Box::new(ReplyError { ename, evalue, traceback })),
                    user_expressions: Some(Default::default()),
                    ..Default::default()
                }
            }
        };
        if self.session.time && !silent {
            publish(
                &self.out,
                StreamContent::stdout(&format!("(took {:.1} ms)\n", started.elapsed().as_secs_f64() * 1e3)).into(),
            );
        }
        reply.into()
    }
}

/// The byte index of the `chars`-th character (Jupyter cursors count code points).
fn byte_index(code: &str, chars: usize) -> usize {
    code.char_indices().nth(chars).map_or(code.len(), |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_counts_code_points() {
        assert_eq!(byte_index("é = heat", 8), "é = heat".len());
        assert_eq!(byte_index("é = heat", 1), 2);
    }

    #[test]
    fn media_carries_every_form() {
        let o = Output {
            text: "t".into(),
            html: Some("<b>t</b>".into()),
            png: Some(vec![1, 2, 3]),
            svg: Some("<svg/>".into()),
        };
        let m = serde_json::to_value(media(&o)).unwrap();
        assert_eq!(m["text/plain"], "t");
        assert_eq!(m["text/html"], "<b>t</b>");
        assert_eq!(m["image/png"], "AQID");
        assert_eq!(m["image/svg+xml"], "<svg/>");
    }
}
