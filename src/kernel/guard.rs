//! The byte-level guard in front of the kernel's ZeroMQ sockets.
//!
//! The ZeroMQ library (the pure-Rust `zeromq` crate) reserves a frame's declared length before
//! any of its bytes arrive and has no maximum message size (libzmq's `ZMQ_MAXMSGSIZE`): a
//! peer that sends a 64-byte greeting and a 9-byte frame header claiming 2^40 bytes aborts the
//! process ("memory allocation failed"), before any signature is checked. So the kernel's
//! ZeroMQ sockets listen on private Unix sockets (in a fresh `0700` directory), and the
//! addresses in the connection file are served by this guard: it copies bytes both ways and
//! reads the client's ZMTP 3 framing as it passes, closing the connection (one line on stderr)
//! before forwarding a frame header that would take a message over [`MAX_MESSAGE_BYTES`] or
//! [`MAX_FRAMES`], a command over [`MAX_COMMAND_BYTES`], or that sets reserved flag bits. At
//! most [`MAX_PEERS`] connections per channel are served at once, and a client that reads
//! nothing of what the kernel sends it for [`STALLED_PEER`] is disconnected.
//!
//! Signatures, replays and JSON are checked above ZeroMQ (`wire`), on whole messages.

use jupyter_protocol::ConnectionInfo;
use jupyter_protocol::connection_info::Transport;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

/// The largest message a client may send, all frames together (identities, delimiter,
/// signature, the four JSON frames, buffers): 64 MiB, as libzmq's `ZMQ_MAXMSGSIZE` would set
/// it. A peer that sends more is disconnected; the message never reaches the kernel.
pub const MAX_MESSAGE_BYTES: u64 = 64 << 20;
/// The most frames in one message (a Jupyter message has identities, the delimiter, the
/// signature, four JSON frames and its buffers): each frame costs memory beyond its bytes.
pub const MAX_FRAMES: u64 = 1024;
/// The largest ZMTP command frame (READY, PING, SUBSCRIBE, ...).
pub const MAX_COMMAND_BYTES: u64 = 64 << 10;
/// The most connections served at once on one channel; more are closed at once.
pub const MAX_PEERS: usize = 64;
/// A client that takes none of the bytes sent to it for this long is disconnected: the ZeroMQ
/// library waits for a slow peer (where libzmq would drop its messages at the high-water
/// mark), so one iopub subscriber that never reads stalled every client's output and queued
/// the kernel's messages in memory without end.
pub const STALLED_PEER: std::time::Duration = std::time::Duration::from_secs(10);
/// [`STALLED_PEER`] on the heartbeat, whose clients wait for each echo: the heartbeat socket
/// waits for a peer that pings and never reads, holding up everyone's echo until it is cut.
pub const STALLED_HEARTBEAT_PEER: std::time::Duration = std::time::Duration::from_secs(2);

fn log(msg: impl std::fmt::Display) {
    eprintln!("[headscope kernel] {msg}");
}

/// The private directory of the kernel's inner sockets; removed when dropped. The kernel holds
/// an exclusive `flock` on its `lock` file while it lives, so that a later kernel can tell a
/// dead kernel's directory (the lock is free) from a live one's, in any PID namespace.
pub struct Private {
    dir: PathBuf,
    _lock: std::fs::File,
    /// The connection info the ZeroMQ sockets bind: the same ports and key, over `ipc` in
    /// the private directory.
    pub inner: ConnectionInfo,
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const DIR_PREFIX: &str = "headscope-kernel-";

/// Opens `dir/lock` and takes its exclusive lock without waiting.
fn lock(dir: &Path) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("lock")).ok()?;
    // SAFETY: flock on a file descriptor this function owns.
    (unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0).then_some(file)
}

/// Makes the private directory (mode 0700, so only this user reaches the unguarded sockets),
/// first removing those of kernels that are gone (a killed kernel cannot remove its own). The
/// directory is made under a `.new` name and renamed once locked, so no kernel removes
/// another's before its lock is taken.
pub fn private(info: &ConnectionInfo) -> Result<Private, String> {
    use std::os::unix::fs::DirBuilderExt;
    let tmp = std::env::temp_dir();
    for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let ours = name.to_str().is_some_and(|n| n.starts_with(DIR_PREFIX) && !n.ends_with(".new"));
        if ours && entry.file_type().is_ok_and(|t| t.is_dir()) && lock(&entry.path()).is_some() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = tmp.join(format!("{DIR_PREFIX}{}-{t:x}", std::process::id()));
    let new = dir.with_extension("new");
    let fail = |e: std::io::Error| format!("cannot create the kernel's socket directory {}: {e}", dir.display());
    std::fs::DirBuilder::new().mode(0o700).create(&new).map_err(fail)?;
    let Some(lock) = lock(&new) else {
        let _ = std::fs::remove_dir_all(&new);
        return Err(format!("cannot lock the kernel's socket directory {}", new.display()));
    };
    std::fs::rename(&new, &dir).map_err(fail)?;
    let mut inner = info.clone();
    inner.transport = Transport::IPC;
    inner.ip = dir.join("s").to_string_lossy().into_owned();
    Ok(Private { dir, _lock: lock, inner })
}

/// The inner socket path of a port (`ipc://IP-PORT`, as `ConnectionInfo` forms it).
fn ipc_path(inner: &ConnectionInfo, port: u16) -> PathBuf {
    PathBuf::from(format!("{}-{port}", inner.ip))
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Box<dyn Io>> {
        Ok(match self {
            Listener::Tcp(l) => Box::new(l.accept().await?.0),
            Listener::Unix(l) => Box::new(l.accept().await?.0),
        })
    }
}

/// Binds the connection file's five addresses and serves each through the guard to its inner
/// socket (which must already be bound).
pub async fn expose(public: &ConnectionInfo, private: &Private) -> Result<(), String> {
    let channels = [
        ("shell", public.shell_port),
        ("control", public.control_port),
        ("stdin", public.stdin_port),
        ("iopub", public.iopub_port),
        ("heartbeat", public.hb_port),
    ];
    for (chan, port) in channels {
        let listener = match public.transport {
            // "*" (all interfaces, as libzmq spells it) is 0.0.0.0 to the OS.
            Transport::TCP => tokio::net::TcpListener::bind((if public.ip == "*" { "0.0.0.0" } else { public.ip.as_str() }, port)).await.map(Listener::Tcp),
            Transport::IPC => tokio::net::UnixListener::bind(format!("{}-{port}", public.ip)).map(Listener::Unix),
        }
        .map_err(|e| format!("cannot bind the {chan} socket on {}: {e}", public.ip))?;
        let stall = if chan == "heartbeat" { STALLED_HEARTBEAT_PEER } else { STALLED_PEER };
        tokio::spawn(serve(listener, ipc_path(&private.inner, port), chan, stall));
    }
    Ok(())
}

async fn serve(listener: Listener, inner: PathBuf, chan: &'static str, stall: std::time::Duration) {
    let peers = Arc::new(Semaphore::new(MAX_PEERS));
    loop {
        let client = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors, say: wait a little rather than spin.
                log(format!("{chan}: accept failed: {e}"));
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = peers.clone().try_acquire_owned() else {
            log(format!("{chan}: refused a connection: {MAX_PEERS} peers already connected (MAX_PEERS)"));
            continue;
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            if let Err(why) = pump(client, &inner, stall).await {
                log(format!("{chan}: disconnected a peer: {why}"));
            }
            drop(permit);
        });
    }
}

/// Copies one connection both ways until either side ends; the client's bytes are checked
/// before they are forwarded. Only a breach of the limits is an error (I/O errors are a peer
/// going away).
async fn pump(client: Box<dyn Io>, inner: &Path, stall: std::time::Duration) -> Result<(), String> {
    let server = tokio::net::UnixStream::connect(inner).await.map_err(|e| format!("cannot reach the inner socket: {e}"))?;
    let (mut client_rx, mut client_tx) = tokio::io::split(client);
    let (mut server_rx, mut server_tx) = server.into_split();
    let up = async move {
        let mut wire = Zmtp::default();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return Ok(()),
                Ok(n) => n,
            };
            wire.check(&buf[..n])?;
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return Ok(());
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return Ok(()),
                Ok(n) => n,
            };
            let mut sent = 0;
            while sent < n {
                match tokio::time::timeout(stall, client_tx.write(&buf[sent..n])).await {
                    Ok(Ok(0) | Err(_)) => return Ok(()),
                    Ok(Ok(k)) => sent += k,
                    Err(_) => return Err(format!("it read nothing for {} s (STALLED_PEER)", stall.as_secs())),
                }
            }
        }
    };
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}

#[derive(Clone, Copy, Debug)]
enum State {
    /// Bytes of the 64-byte ZMTP 3 greeting still to come.
    Greeting(usize),
    Flags,
    Length { long: bool, more: bool, command: bool, have: usize, buf: [u8; 8] },
    Body { left: u64, more: bool, command: bool },
}

/// One direction of a ZMTP 3 connection, read as it passes: frame headers and the size of the
/// message being received.
#[derive(Debug)]
struct Zmtp {
    state: State,
    message_bytes: u64,
    message_frames: u64,
}

impl Default for Zmtp {
    fn default() -> Self {
        Zmtp { state: State::Greeting(64), message_bytes: 0, message_frames: 0 }
    }
}

impl Zmtp {
    /// Reads the next bytes of the stream; an error names the limit a frame header breaks.
    fn check(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while let Some(&first) = bytes.first() {
            match &mut self.state {
                State::Greeting(left) => {
                    let k = (*left).min(bytes.len());
                    *left -= k;
                    bytes = &bytes[k..];
                    if *left == 0 {
                        self.state = State::Flags;
                    }
                }
                State::Flags => {
                    if first & !0b111 != 0 {
                        return Err(format!("frame flags {first:#04x} set reserved bits"));
                    }
                    bytes = &bytes[1..];
                    self.state = State::Length { long: first & 0b10 != 0, more: first & 0b1 != 0, command: first & 0b100 != 0, have: 0, buf: [0; 8] };
                }
                State::Length { long, more, command, have, buf } => {
                    let need = if *long { 8 } else { 1 };
                    let k = (need - *have).min(bytes.len());
                    buf[*have..*have + k].copy_from_slice(&bytes[..k]);
                    *have += k;
                    bytes = &bytes[k..];
                    if *have == need {
                        let len = if *long { u64::from_be_bytes(*buf) } else { u64::from(buf[0]) };
                        let (more, command) = (*more, *command);
                        self.frame(len, command)?;
                        self.state = State::Body { left: len, more, command };
                        self.end_of_body();
                    }
                }
                State::Body { left, .. } => {
                    let k = (*left).min(bytes.len() as u64);
                    *left -= k;
                    bytes = &bytes[k as usize..];
                    self.end_of_body();
                }
            }
        }
        Ok(())
    }

    /// Counts a frame whose header has just been read, against the limits.
    fn frame(&mut self, len: u64, command: bool) -> Result<(), String> {
        if command {
            if len > MAX_COMMAND_BYTES {
                return Err(format!("a {len}-byte command frame (MAX_COMMAND_BYTES is {MAX_COMMAND_BYTES})"));
            }
            return Ok(());
        }
        self.message_frames += 1;
        self.message_bytes = self.message_bytes.saturating_add(len);
        if self.message_bytes > MAX_MESSAGE_BYTES {
            return Err(format!("a message over {MAX_MESSAGE_BYTES} bytes (MAX_MESSAGE_BYTES; this frame declares {len})"));
        }
        if self.message_frames > MAX_FRAMES {
            return Err(format!("a message of more than {MAX_FRAMES} frames (MAX_FRAMES)"));
        }
        Ok(())
    }

    /// After a frame's last byte: the next frame header, and a new message unless MORE was set.
    fn end_of_body(&mut self) {
        if let State::Body { left: 0, more, command } = self.state {
            if !more && !command {
                self.message_bytes = 0;
                self.message_frames = 0;
            }
            self.state = State::Flags;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting() -> Vec<u8> {
        let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
        g.resize(64, 0);
        g
    }

    fn frame(more: bool, body: &[u8]) -> Vec<u8> {
        let flags = u8::from(more);
        let mut f = if body.len() > 255 {
            let mut f = vec![flags | 0b10];
            f.extend((body.len() as u64).to_be_bytes());
            f
        } else {
            vec![flags, body.len() as u8]
        };
        f.extend(body);
        f
    }

    #[test]
    fn messages_under_the_limit_pass_in_any_split() {
        let mut stream = greeting();
        stream.extend([0x04, 3, b'a', b'b', b'c']); // a command
        for _ in 0..3 {
            stream.extend(frame(true, b"<IDS|MSG>"));
            stream.extend(frame(true, &[7u8; 300]));
            stream.extend(frame(false, b""));
        }
        for chunk in [1, 2, 7, 64, 1000] {
            let mut z = Zmtp::default();
            for piece in stream.chunks(chunk) {
                z.check(piece).unwrap();
            }
            assert!(matches!(z.state, State::Flags), "{chunk}: {:?}", z.state);
            assert_eq!((z.message_bytes, z.message_frames), (0, 0));
        }
    }

    #[test]
    fn a_huge_declared_frame_is_refused_at_its_header() {
        let mut z = Zmtp::default();
        let mut stream = greeting();
        stream.push(0b10);
        stream.extend((1u64 << 40).to_be_bytes());
        let err = z.check(&stream).unwrap_err();
        assert!(err.contains("MAX_MESSAGE_BYTES"), "{err}");
    }

    #[test]
    fn frames_add_up_to_the_message_limit() {
        let mut z = Zmtp::default();
        z.check(&greeting()).unwrap();
        let half = MAX_MESSAGE_BYTES / 2 + 1;
        let mut header = vec![0b11];
        header.extend(half.to_be_bytes());
        z.check(&header).unwrap();
        z.check(&vec![0u8; half as usize]).unwrap();
        let err = z.check(&header).unwrap_err();
        assert!(err.contains("MAX_MESSAGE_BYTES"), "{err}");
    }

    #[test]
    fn too_many_frames_reserved_bits_and_big_commands_are_refused() {
        let mut z = Zmtp::default();
        z.check(&greeting()).unwrap();
        let err = (0..=MAX_FRAMES).map(|_| z.check(&[1, 0])).find_map(Result::err).unwrap();
        assert!(err.contains("MAX_FRAMES"), "{err}");
        let mut z = Zmtp::default();
        assert!(z.check(&[greeting(), vec![0x80, 0]].concat()).unwrap_err().contains("reserved"));
        let mut z = Zmtp::default();
        let mut cmd = vec![0b110];
        cmd.extend((MAX_COMMAND_BYTES + 1).to_be_bytes());
        assert!(z.check(&[greeting(), cmd].concat()).unwrap_err().contains("MAX_COMMAND_BYTES"));
    }
}
