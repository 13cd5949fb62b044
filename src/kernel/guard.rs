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
//! The heartbeat has no ZeroMQ socket: the guard speaks ZMTP 3 itself on that channel
//! ([`heartbeat`]) and echoes every message, as a REP socket would to the REQ sockets Jupyter
//! clients ping with. (The `zeromq` crate's REP socket removed a peer the guard had cut off
//! under a blocking map lock that never came free on the kernel's one-thread runtime: a
//! client flooding pings without reading the echoes froze the whole kernel.)
//!
//! Signatures, replays and JSON are checked above ZeroMQ (`wire`), on whole messages.

use jupyter_protocol::connection_info::Transport;
use jupyter_protocol::ConnectionInfo;
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
/// [`STALLED_PEER`] on the heartbeat, whose clients wait for each echo: a peer that pings and
/// never reads its echoes is cut off after this long (it holds only its own connection).
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
/// socket (which must already be bound), except the heartbeat, which the guard echoes itself.
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
            Transport::TCP => {
                tokio::net::TcpListener::bind((if public.ip == "*" { "0.0.0.0" } else { public.ip.as_str() }, port))
                    .await
                    .map(Listener::Tcp)
            }
            Transport::IPC => tokio::net::UnixListener::bind(format!("{}-{port}", public.ip)).map(Listener::Unix),
        }
        .map_err(|e| format!("cannot bind the {chan} socket on {}: {e}", public.ip))?;
        let to = if chan == "heartbeat" { To::Echo } else { To::Inner(ipc_path(&private.inner, port)) };
        tokio::spawn(serve(listener, to, chan));
    }
    Ok(())
}

/// Where a channel's connections go.
#[derive(Clone)]
enum To {
    /// Copied to the kernel's ZeroMQ socket at this path.
    Inner(PathBuf),
    /// Answered by the guard: the heartbeat.
    Echo,
}

async fn serve(listener: Listener, to: To, chan: &'static str) {
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
        let to = to.clone();
        tokio::spawn(async move {
            let done = match &to {
                To::Inner(inner) => pump(client, inner, STALLED_PEER).await,
                To::Echo => heartbeat(client, STALLED_HEARTBEAT_PEER).await,
            };
            if let Err(why) = done {
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
    let server =
        tokio::net::UnixStream::connect(inner).await.map_err(|e| format!("cannot reach the inner socket: {e}"))?;
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

/// The greeting the heartbeat sends: ZMTP 3.0, the NULL mechanism (no security; Jupyter's
/// security is the HMAC on shell and control), `as-server` 0, filler.
fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// The READY command of the NULL handshake, naming the socket type REP.
fn ready() -> Vec<u8> {
    let mut body = vec![5];
    body.extend(b"READY");
    body.push(11);
    body.extend(b"Socket-Type");
    body.extend(3u32.to_be_bytes());
    body.extend(b"REP");
    let mut f = vec![0x04, body.len() as u8];
    f.extend(body);
    f
}

/// Serves one heartbeat connection: the ZMTP 3 greeting and NULL handshake, then every
/// message echoed frame by frame as it arrives (a REQ client's envelope, the empty delimiter,
/// comes back with it, as REP would send it), and a ZMTP 3.1 PING command answered by PONG.
/// Memory per peer is one read buffer, whatever it sends. A peer that sends another protocol,
/// another mechanism, a frame over the limits or reserved flag bits is disconnected; one that
/// takes none of its echoes for `stall` is disconnected too. Nothing here waits on the rest
/// of the kernel, so no peer can hold it up.
async fn heartbeat(client: Box<dyn Io>, stall: std::time::Duration) -> Result<(), String> {
    let (rx, mut tx) = tokio::io::split(client);
    let mut rx = tokio::io::BufReader::with_capacity(16 << 10, rx);
    let stalled = || format!("it read nothing for {} s (STALLED_HEARTBEAT_PEER)", stall.as_secs());
    macro_rules! send {
        ($bytes:expr) => {
            match tokio::time::timeout(stall, tx.write_all($bytes)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Ok(()),
                Err(_) => return Err(stalled()),
            }
        };
    }
    // A peer gone (end of stream, reset) is no error.
    macro_rules! read {
        ($buf:expr) => {
            if rx.read_exact($buf).await.is_err() {
                return Ok(());
            }
        };
    }
    send!(&greeting());
    let mut peer = [0u8; 64];
    read!(&mut peer[..10]);
    if peer[0] != 0xff || peer[9] & 1 != 1 {
        return Err("not a ZMTP 3 greeting".into());
    }
    read!(&mut peer[10..]);
    if peer[10] < 3 {
        return Err(format!("ZMTP version {}.{}: the heartbeat speaks ZMTP 3", peer[10], peer[11]));
    }
    let mechanism = &peer[12..32];
    if mechanism != &greeting()[12..32] {
        let name = String::from_utf8_lossy(mechanism.split(|b| *b == 0).next().unwrap_or_default()).into_owned();
        return Err(format!("security mechanism {name:?}: the heartbeat accepts NULL"));
    }
    send!(&ready());
    let (mut message_bytes, mut message_frames) = (0u64, 0u64);
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let mut flags = [0u8];
        read!(&mut flags);
        let flags = flags[0];
        if flags & !0b111 != 0 {
            return Err(format!("frame flags {flags:#04x} set reserved bits"));
        }
        let (more, long, command) = (flags & 1 != 0, flags & 2 != 0, flags & 4 != 0);
        let mut size = [0u8; 8];
        let len = if long {
            read!(&mut size);
            u64::from_be_bytes(size)
        } else {
            read!(&mut size[..1]);
            u64::from(size[0])
        };
        if command {
            if len > MAX_COMMAND_BYTES {
                return Err(format!("a {len}-byte command frame (MAX_COMMAND_BYTES is {MAX_COMMAND_BYTES})"));
            }
            let mut body = vec![0u8; len as usize];
            read!(&mut body);
            let name_len = body.first().map_or(0, |n| *n as usize);
            let name = body.get(1..1 + name_len).unwrap_or_default();
            // PING: name, a 2-byte TTL, up to 16 bytes of context that PONG returns.
            if name == b"PING" {
                let context = body.get(1 + name_len + 2..).unwrap_or_default();
                let context = &context[..context.len().min(16)];
                let mut pong = vec![0x04, (5 + context.len()) as u8, 4];
                pong.extend(b"PONG");
                pong.extend(context);
                send!(&pong);
            } else if name == b"ERROR" {
                return Ok(());
            }
            // READY (the peer's socket type) and anything else: nothing to answer.
            continue;
        }
        message_frames += 1;
        message_bytes = message_bytes.saturating_add(len);
        if message_bytes > MAX_MESSAGE_BYTES {
            return Err(format!(
                "a message over {MAX_MESSAGE_BYTES} bytes (MAX_MESSAGE_BYTES; this frame declares {len})"
            ));
        }
        if message_frames > MAX_FRAMES {
            return Err(format!("a message of more than {MAX_FRAMES} frames (MAX_FRAMES)"));
        }
        // The echo: the same header, then the body as it arrives.
        let mut header = vec![flags];
        if long {
            header.extend(len.to_be_bytes())
        } else {
            header.push(len as u8)
        }
        send!(&header);
        let mut left = len;
        while left > 0 {
            let k = (left.min(buf.len() as u64)) as usize;
            read!(&mut buf[..k]);
            send!(&buf[..k]);
            left -= k as u64;
        }
        if !more {
            (message_bytes, message_frames) = (0, 0);
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum State {
    /// Bytes of the 64-byte ZMTP 3 greeting still to come.
    Greeting(usize),
    Flags,
    Length {
        long: bool,
        more: bool,
        command: bool,
        have: usize,
        buf: [u8; 8],
    },
    Body {
        left: u64,
        more: bool,
        command: bool,
    },
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
                    self.state = State::Length {
                        long: first & 0b10 != 0,
                        more: first & 0b1 != 0,
                        command: first & 0b100 != 0,
                        have: 0,
                        buf: [0; 8],
                    };
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
            return Err(format!(
                "a message over {MAX_MESSAGE_BYTES} bytes (MAX_MESSAGE_BYTES; this frame declares {len})"
            ));
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
        super::greeting().to_vec()
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

    /// Runs the heartbeat on one end of an in-memory stream of `capacity` bytes each way.
    fn with_heartbeat<T>(
        capacity: usize,
        stall_ms: u64,
        client: impl AsyncFnOnce(tokio::io::DuplexStream) -> T,
    ) -> (T, Result<(), String>) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (ours, theirs) = tokio::io::duplex(capacity);
            let server = tokio::spawn(heartbeat(Box::new(theirs), std::time::Duration::from_millis(stall_ms)));
            let t = tokio::time::timeout(std::time::Duration::from_secs(20), client(ours))
                .await
                .expect("the client side took over 20 s");
            (
                t,
                tokio::time::timeout(std::time::Duration::from_secs(20), server)
                    .await
                    .expect("the heartbeat took over 20 s")
                    .unwrap(),
            )
        })
    }

    async fn handshake(c: &mut tokio::io::DuplexStream) {
        // As libzmq does: the greeting and READY at once, then the server's.
        let mut hello = greeting();
        hello.extend([0x04, 25, 5]);
        hello.extend(b"READY\x0bSocket-Type\0\0\0\x03REQ");
        c.write_all(&hello).await.unwrap();
        let mut g = [0u8; 64];
        c.read_exact(&mut g).await.unwrap();
        assert_eq!((g[0], g[9], g[10], &g[12..16]), (0xff, 0x7f, 3, &b"NULL"[..]));
        let mut ready = vec![0u8; 2];
        c.read_exact(&mut ready).await.unwrap();
        let mut body = vec![0u8; ready[1] as usize];
        c.read_exact(&mut body).await.unwrap();
        assert!(body.starts_with(b"\x05READY\x0bSocket-Type\0\0\0\x03REP"), "{body:?}");
    }

    #[test]
    fn the_heartbeat_echoes_req_messages_and_answers_ping() {
        let (echo, end) = with_heartbeat(1 << 20, 2000, async |mut c| {
            handshake(&mut c).await;
            // A REQ message: the empty delimiter, then the ping; a long frame as well.
            let mut msg = frame(true, b"");
            msg.extend(frame(false, b"ping-1"));
            msg.extend(frame(false, &[9u8; 300]));
            // A ZMTP 3.1 PING (TTL 0, context "ctx") in the middle.
            msg.extend([0x04, 10, 4]);
            msg.extend(b"PING\0\0ctx");
            c.write_all(&msg).await.unwrap();
            let mut back = vec![0u8; msg.len() - 12 + 10];
            c.read_exact(&mut back).await.unwrap();
            back
        });
        let mut want = frame(true, b"");
        want.extend(frame(false, b"ping-1"));
        want.extend(frame(false, &[9u8; 300]));
        want.extend([0x04, 8, 4]);
        want.extend(b"PONGctx");
        assert_eq!(echo, want);
        assert_eq!(end, Ok(()), "a peer that hangs up is no error");
    }

    #[test]
    fn a_heartbeat_peer_that_reads_nothing_is_cut_off_and_bad_peers_are_refused() {
        let (_, end) = with_heartbeat(4096, 200, async |mut c| {
            handshake(&mut c).await;
            let ping = frame(false, &[1u8; 60_000]);
            // Never read: the echo fills the 4 KiB pipe, the heartbeat stops reading, the
            // writes here stop too; the heartbeat gives up on the peer after 200 ms.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while c.write_all(&ping).await.is_ok() {}
            })
            .await;
            c
        });
        assert!(end.as_ref().is_err_and(|e| e.contains("read nothing")), "{end:?}");
        let (_, end) = with_heartbeat(1 << 16, 2000, async |mut c| {
            let mut g = greeting();
            g[12..16].copy_from_slice(b"CURV");
            c.write_all(&g).await.unwrap();
            c
        });
        assert!(end.is_err_and(|e| e.contains("mechanism")));
        let (_, end) = with_heartbeat(1 << 16, 2000, async |mut c| {
            handshake(&mut c).await;
            let mut huge = vec![0b10];
            huge.extend((1u64 << 40).to_be_bytes());
            c.write_all(&huge).await.unwrap();
            c
        });
        assert!(end.is_err_and(|e| e.contains("MAX_MESSAGE_BYTES")));
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
