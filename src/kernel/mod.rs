//! The Jupyter frontend: headscope as a kernel speaking messaging protocol 5.3 over ZeroMQ
//! (the `jupyter-zmq-client` sockets, `jupyter-protocol` messages). It runs the same
//! [`Session`](crate::engine::Session) as the REPL on an engine thread ([`worker`]); this
//! side only moves messages.
//!
//! Tasks: shell (requests, one at a time, with busy/idle around each), control (kernel_info,
//! interrupt, shutdown; answered even while a cell runs), iopub (one writer, so messages keep
//! their order; answers subscriptions with `iopub_welcome`), and a watchdog that ends the
//! kernel when its parent process dies. The heartbeat is echoed by the guard itself.
//!
//! Hostile clients: the connection file's addresses are served by [`guard`], which closes a
//! connection whose ZMTP framing breaks its limits ([`guard::MAX_MESSAGE_BYTES`], 64 MiB per
//! message) before the ZeroMQ library reserves memory for it; every message is then read by
//! [`wire`]: a bad or missing signature, broken framing, a replay within the last
//! [`wire::REPLAY_WINDOW`] signed messages, or a header that does not parse drops the message
//! (one line on stderr); a signed request whose content does not fit its `msg_type` is
//! answered with status "error" and never reaches the engine.

pub mod guard;
pub mod spec;
pub mod wire;
mod worker;

use jupyter_protocol::{
    CodeMirrorMode, CommInfoReply, ConnectionInfo, HelpLink, HistoryReply, InterruptReply, IoPubWelcome,
    JupyterMessage, JupyterMessageContent, KernelInfoReply, LanguageInfo, ReplyStatus, ShutdownReply, Status,
};
use jupyter_zmq_client::{
    create_kernel_control_connection, create_kernel_iopub_xpub_connection, create_kernel_shell_connection,
    create_kernel_stdin_connection, RuntimeError, SubscriptionEvent,
};
use std::path::Path;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use worker::{Job, Request, WorkerMsg};

/// Reads and checks a connection file, with one-line errors naming it.
pub fn read_connection_file(path: &Path) -> Result<ConnectionInfo, String> {
    let p = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("connection file {p}: {e}"))?;
    let mut info: ConnectionInfo = serde_json::from_str(&text).map_err(|e| format!("connection file {p}: {e}"))?;
    if info.signature_scheme != "hmac-sha256" && !info.key.is_empty() {
        return Err(format!(
            "connection file {p}: unsupported signature_scheme '{}' (only hmac-sha256)",
            info.signature_scheme
        ));
    }
    if info.ip.trim().is_empty() {
        info.ip = "127.0.0.1".into();
    }
    Ok(info)
}

/// The next request of a channel, or `continue`/`return` in the enclosing loop: a dropped
/// message is logged; a malformed signed request is answered with an error reply between
/// busy and idle; a failed socket stops the kernel (the enclosing task returns).
macro_rules! next_message {
    ($conn:expr, $reply_to:expr, $replay:expr, $chan:literal, $stop:expr, $publish:expr) => {
        match wire::read(&mut $conn, &$replay).await {
            Ok(wire::Incoming::Message(m)) => m,
            Ok(wire::Incoming::Malformed(m, why)) => {
                log(format!(concat!($chan, ": error reply to a malformed {}: {}"), m.header.msg_type, why));
                if let Some(reply) = wire::error_reply(&m, &why) {
                    status(&$publish, &m, true);
                    let _ = $reply_to.send(JupyterMessage::new(reply, Some(&m))).await;
                    status(&$publish, &m, false);
                }
                continue;
            }
            Err(wire::Failure::Dropped(why)) => {
                log(format!(concat!($chan, ": dropped a message: {}"), why));
                continue;
            }
            Err(wire::Failure::Socket(e)) => {
                log(format!(concat!($chan, " socket failed: {}"), e));
                let _ = $stop.send(concat!($chan, " socket failed"));
                return;
            }
        }
    };
}

fn status(tx: &UnboundedSender<JupyterMessage>, parent: &JupyterMessage, busy: bool) {
    let s = if busy { Status::busy() } else { Status::idle() };
    let _ = tx.send(s.as_child_of(parent));
}

fn log(msg: impl std::fmt::Display) {
    eprintln!("[headscope kernel] {msg}");
}

/// Runs the kernel until a shutdown request, or until its parent process dies.
pub fn run(connection_file: &Path) -> Result<(), String> {
    let parent = std::os::unix::process::parent_id();
    let info = read_connection_file(connection_file)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the kernel's runtime: {e}"))?;
    rt.block_on(serve(info, parent))
}

fn kernel_info() -> KernelInfoReply {
    KernelInfoReply {
        status: ReplyStatus::Ok,
        protocol_version: "5.3".into(),
        implementation: "headscope".into(),
        implementation_version: env!("CARGO_PKG_VERSION").into(),
        language_info: LanguageInfo {
            name: "rhai".into(),
            version: "1".into(),
            mimetype: Some("text/x-rhai".into()),
            file_extension: Some(".rhai".into()),
            pygments_lexer: Some("rust".into()),
            codemirror_mode: Some(CodeMirrorMode::Simple("rust".into())),
            nbconvert_exporter: None,
        },
        banner: format!("headscope {} — Rhai for attention heads. :help for commands.", env!("CARGO_PKG_VERSION")),
        help_links: vec![HelpLink { text: "Rhai book".into(), url: "https://rhai.rs/book/".into() }],
        debugger: false,
        error: None,
    }
}

async fn serve(info: ConnectionInfo, parent: u32) -> Result<(), String> {
    let session_id = uuid_like();
    // The ZeroMQ sockets listen in a private directory; the guard serves the public addresses.
    let private = guard::private(&info)?;
    let inner = &private.inner;
    let bind = |what: &str, e: RuntimeError| format!("cannot bind the inner {what} socket in {}: {e}", inner.ip);
    let shell = create_kernel_shell_connection(inner, &session_id).await.map_err(|e| bind("shell", e))?;
    let mut control = create_kernel_control_connection(inner, &session_id).await.map_err(|e| bind("control", e))?;
    let mut stdin = create_kernel_stdin_connection(inner, &session_id).await.map_err(|e| bind("stdin", e))?;
    let mut iopub = create_kernel_iopub_xpub_connection(inner, &session_id).await.map_err(|e| bind("iopub", e))?;
    guard::expose(&info, &private).await?;
    let (mut shell_tx, mut shell_rx) = shell.split();
    let replay = std::sync::Arc::new(std::sync::Mutex::new(wire::Replay::default()));

    let base_dir = std::env::current_dir().unwrap_or_else(|_| ".".into());
    let (jobs, interrupt) = worker::spawn(base_dir)?;

    // The one iopub writer: everything published goes through this queue, in order.
    let (pub_tx, mut pub_rx) = unbounded_channel::<JupyterMessage>();
    let iopub_task = tokio::spawn(async move {
        loop {
            tokio::select! {
                msg = pub_rx.recv() => match msg {
                    Some(m) => if let Err(e) = iopub.send(m).await { log(format!("iopub send failed: {e}")) },
                    None => break,
                },
                ev = iopub.recv_subscription() => if let Ok(SubscriptionEvent::Subscribe(topic)) = ev {
                    let _ = iopub.send(IoPubWelcome::new(topic).into()).await;
                },
            }
        }
    });
    let (stop_tx, mut stop_rx) = unbounded_channel::<&'static str>();

    // Heartbeat: the guard echoes it (`guard::heartbeat`); there is no ZeroMQ socket for it.

    // Stdin: the kernel never asks for input, so anything that comes is read and dropped.
    let in_replay = replay.clone();
    let in_stop = stop_tx.clone();
    tokio::spawn(async move {
        loop {
            match wire::read(&mut stdin, &in_replay).await {
                Ok(wire::Incoming::Message(m) | wire::Incoming::Malformed(m, _)) => {
                    log(format!("stdin: ignoring {}", m.header.msg_type))
                }
                Err(wire::Failure::Dropped(why)) => log(format!("stdin: dropped a message: {why}")),
                Err(wire::Failure::Socket(e)) => {
                    log(format!("stdin socket failed: {e}"));
                    let _ = in_stop.send("stdin socket failed");
                    return;
                }
            }
        }
    });

    // Control: answered at once, even while the engine is busy with a cell.
    let ctl_pub = pub_tx.clone();
    let ctl_stop = stop_tx.clone();
    let ctl_replay = replay.clone();
    tokio::spawn(async move {
        loop {
            let msg = next_message!(control, control, ctl_replay, "control", ctl_stop, ctl_pub);
            status(&ctl_pub, &msg, true);
            let reply: Option<JupyterMessageContent> = match &msg.content {
                JupyterMessageContent::KernelInfoRequest(_) => Some(kernel_info().into()),
                JupyterMessageContent::InterruptRequest(_) => {
                    interrupt.trigger();
                    Some(InterruptReply::new().into())
                }
                JupyterMessageContent::ShutdownRequest(r) => {
                    Some(ShutdownReply { restart: r.restart, status: ReplyStatus::Ok, error: None }.into())
                }
                other => {
                    log(format!("control: ignoring {}", other.message_type()));
                    None
                }
            };
            if let Some(r) = reply {
                let _ = control.send(JupyterMessage::new(r, Some(&msg))).await;
            }
            status(&ctl_pub, &msg, false);
            if matches!(msg.content, JupyterMessageContent::ShutdownRequest(_)) {
                let _ = ctl_stop.send("shutdown requested");
                return;
            }
        }
    });

    // Shell: one request at a time; the engine's outputs are published as they come.
    let sh_pub = pub_tx.clone();
    let sh_stop = stop_tx.clone();
    let sh_replay = replay.clone();
    tokio::spawn(async move {
        loop {
            let msg = next_message!(shell_rx, shell_tx, sh_replay, "shell", sh_stop, sh_pub);
            status(&sh_pub, &msg, true);
            let request = match &msg.content {
                JupyterMessageContent::ExecuteRequest(r) => {
                    Some(Request::Execute { code: r.code.clone(), silent: r.silent })
                }
                JupyterMessageContent::CompleteRequest(r) => {
                    Some(Request::Complete { code: r.code.clone(), cursor_pos: r.cursor_pos })
                }
                JupyterMessageContent::InspectRequest(r) => {
                    Some(Request::Inspect { code: r.code.clone(), cursor_pos: r.cursor_pos })
                }
                JupyterMessageContent::IsCompleteRequest(r) => Some(Request::IsComplete { code: r.code.clone() }),
                _ => None,
            };
            let reply: Option<JupyterMessageContent> = match request {
                Some(request) => {
                    let (out_tx, mut out_rx) = unbounded_channel();
                    if jobs.send(Job { request, out: out_tx }).is_err() {
                        log("the engine thread is gone");
                        let _ = sh_stop.send("engine thread ended");
                        return;
                    }
                    let mut reply = None;
                    while let Some(m) = out_rx.recv().await {
                        match m {
                            WorkerMsg::IoPub(c) => {
                                let _ = sh_pub.send(JupyterMessage::new(c, Some(&msg)));
                            }
                            WorkerMsg::Reply(c) => {
                                reply = Some(c);
                                break;
                            }
                        }
                    }
                    reply
                }
                None => match &msg.content {
                    JupyterMessageContent::KernelInfoRequest(_) => Some(kernel_info().into()),
                    JupyterMessageContent::HistoryRequest(_) => Some(HistoryReply::default().into()),
                    JupyterMessageContent::CommInfoRequest(_) => Some(CommInfoReply::default().into()),
                    JupyterMessageContent::ShutdownRequest(r) => {
                        Some(ShutdownReply { restart: r.restart, status: ReplyStatus::Ok, error: None }.into())
                    }
                    other => {
                        log(format!("shell: ignoring {}", other.message_type()));
                        None
                    }
                },
            };
            if let Some(r) = reply {
                if let Err(e) = shell_tx.send(JupyterMessage::new(r, Some(&msg))).await {
                    log(format!("shell send failed: {e}"));
                }
            }
            status(&sh_pub, &msg, false);
            if matches!(msg.content, JupyterMessageContent::ShutdownRequest(_)) {
                let _ = sh_stop.send("shutdown requested");
                return;
            }
        }
    });

    // Watchdog: a kernel whose parent (the notebook server, a test) died ends too: it has been
    // adopted by another process, or by init (also when the parent died before this started).
    let wd_stop = stop_tx.clone();
    tokio::spawn(async move {
        loop {
            let now = std::os::unix::process::parent_id();
            if now != parent || now == 1 {
                let _ = wd_stop.send("parent process died");
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    });

    drop(pub_tx);
    let why = stop_rx.recv().await.unwrap_or("all tasks ended");
    log(format!("exiting: {why}"));
    // Let the last replies and the final idle leave the sockets before the process ends; a
    // cell still running on the engine thread is abandoned.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(iopub_task);
    drop(private);
    Ok(())
}

/// A random-enough session id without another dependency: time and pid.
fn uuid_like() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("headscope-{}-{t:x}", std::process::id())
}
