//! Reading one message of a channel: the signature (HMAC-SHA256 over the four JSON frames,
//! checked in constant time by `ring` in `RawMessage::from_multipart`), then the replay
//! window, then the JSON. Nothing from the wire is trusted before its signature checks, and
//! nothing parsed from it panics: every failure is a one-line reason.

use jupyter_protocol::{Header, JupyterMessage, JupyterMessageContent, UnknownMessage};
use jupyter_zmq_client::{Connection, RawMessage, RuntimeError};
use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use zeromq::SocketRecv;

/// How many signatures of recent messages the kernel remembers to refuse replays (as the
/// Jupyter messaging spec recommends, and ipykernel's `digest_history_size`): 65536, about
/// 9 MB at most, shared by every channel. A message seen within the last 65536 signed
/// messages is dropped; the oldest signature is forgotten when a new one comes.
pub const REPLAY_WINDOW: usize = 1 << 16;

/// The signatures of the last [`REPLAY_WINDOW`] verified messages.
#[derive(Default)]
pub struct Replay {
    seen: HashSet<[u8; 64]>,
    order: VecDeque<[u8; 64]>,
}

impl Replay {
    /// Records a verified signature; false if it was seen within the window.
    pub fn first_time(&mut self, sig: [u8; 64]) -> bool {
        if !self.seen.insert(sig) {
            return false;
        }
        self.order.push_back(sig);
        if self.order.len() > REPLAY_WINDOW {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

/// A message read from a channel.
pub enum Incoming {
    /// Signed, fresh, and well-formed.
    Message(JupyterMessage),
    /// Signed and fresh with a readable header, but its metadata or content does not parse
    /// as its `msg_type` requires: answered with an error reply, never run. The message
    /// carries the header and routing identities; its content is empty.
    Malformed(JupyterMessage, String),
}

/// Why no message came.
pub enum Failure {
    /// One message was dropped (unsigned, bad signature, replay, unreadable header): log it
    /// and read the next.
    Dropped(String),
    /// The socket failed: the kernel stops.
    Socket(String),
}

const DELIMITER: &[u8] = b"<IDS|MSG>";

/// Reads the next message of a kernel socket.
pub async fn read<S: SocketRecv>(conn: &mut Connection<S>, replay: &Mutex<Replay>) -> Result<Incoming, Failure> {
    let multipart = conn.socket.recv().await.map_err(|e| Failure::Socket(e.to_string()))?;
    // The signature frame follows the delimiter; `from_multipart` checks framing and HMAC.
    let sig = multipart.iter().position(|f| &f[..] == DELIMITER).and_then(|i| multipart.get(i + 1)).map(|f| f.to_vec());
    let raw = RawMessage::from_multipart(multipart, &conn.mac).map_err(|e| Failure::Dropped(framing_error(&e)))?;
    if conn.mac.is_some() {
        // Verified, so the signature is 64 hex digits; lowercased, so that a replay cannot
        // pass as new by changing the case of its digits.
        let mut sig: [u8; 64] = sig
            .as_deref()
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| Failure::Dropped("signature is not 64 hex digits".into()))?;
        sig.make_ascii_lowercase();
        let fresh = replay.lock().unwrap_or_else(|p| p.into_inner()).first_time(sig);
        if !fresh {
            return Err(Failure::Dropped("replayed message (its signature was seen before)".into()));
        }
    }
    parse(raw)
}

fn framing_error(e: &RuntimeError) -> String {
    match e {
        RuntimeError::VerifyError(_) => "bad signature".into(),
        RuntimeError::DecodeError(_) => "signature is not hex".into(),
        RuntimeError::MissingDelimiter => "no <IDS|MSG> delimiter".into(),
        RuntimeError::MissingHmac => "no signature frame".into(),
        RuntimeError::InsufficientMessageParts(n) => format!("{n} JSON frames, 4 needed"),
        other => other.to_string().lines().next().unwrap_or("unreadable message").to_string(),
    }
}

/// The JSON of a verified message. Only a header that does not parse drops it (there is
/// nothing to reply to); any other error becomes [`Incoming::Malformed`].
fn parse(raw: RawMessage) -> Result<Incoming, Failure> {
    let j = &raw.jparts;
    let header: Header =
        serde_json::from_slice(&j[0]).map_err(|e| Failure::Dropped(format!("unreadable header: {e}")))?;
    let parent_header = serde_json::from_slice(&j[1]).ok();
    let mut msg = JupyterMessage {
        zmq_identities: raw.zmq_identities.clone(),
        header,
        parent_header,
        metadata: serde_json::Value::Object(Default::default()),
        content: JupyterMessageContent::UnknownMessage(UnknownMessage::default()),
        buffers: j[4..].to_vec(),
        channel: None,
    };
    let metadata = match serde_json::from_slice(&j[2]) {
        Ok(m) => m,
        Err(e) => return Ok(Incoming::Malformed(msg, format!("metadata: {e}"))),
    };
    let content = serde_json::from_slice(&j[3])
        .and_then(|c| JupyterMessageContent::from_type_and_content(&msg.header.msg_type, c));
    match content {
        Ok(c) => {
            msg.metadata = metadata;
            msg.content = c;
            Ok(Incoming::Message(msg))
        }
        Err(e) => {
            let why = format!("content of {}: {e}", msg.header.msg_type);
            Ok(Incoming::Malformed(msg, why))
        }
    }
}

/// The error reply to a malformed `X_request`: an `X_reply` with status "error" (none for a
/// message that is not a request).
pub fn error_reply(request: &JupyterMessage, why: &str) -> Option<JupyterMessageContent> {
    let kind = request.header.msg_type.strip_suffix("_request")?;
    Some(JupyterMessageContent::UnknownMessage(UnknownMessage {
        msg_type: format!("{kind}_reply"),
        content: serde_json::json!({ "status": "error", "ename": "BadRequest", "evalue": why, "traceback": [] }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_window_forgets_the_oldest_and_stays_bounded() {
        let mut r = Replay::default();
        let sig = |i: usize| {
            let mut s = [b'0'; 64];
            s[..8].copy_from_slice(format!("{i:08x}").as_bytes());
            s
        };
        assert!(r.first_time(sig(0)));
        assert!(!r.first_time(sig(0)));
        for i in 1..=REPLAY_WINDOW {
            assert!(r.first_time(sig(i)));
        }
        assert_eq!(r.len(), REPLAY_WINDOW);
        // 0 fell out of the window; the newest is still refused.
        assert!(r.first_time(sig(0)));
        assert!(!r.first_time(sig(REPLAY_WINDOW)));
        assert_eq!(r.len(), REPLAY_WINDOW);
    }

    fn raw(header: &str, content: &str) -> RawMessage {
        RawMessage {
            zmq_identities: vec![],
            jparts: vec![
                header.as_bytes().to_vec().into(),
                b"{}".to_vec().into(),
                b"{}".to_vec().into(),
                content.as_bytes().to_vec().into(),
            ],
        }
    }

    const H: &str = r#"{"msg_id":"1","username":"u","session":"s","date":"2024-01-01T00:00:00Z","msg_type":"execute_request","version":"5.3"}"#;

    #[test]
    fn wrong_types_are_malformed_with_a_header_and_dropped_without() {
        assert!(matches!(
            parse(raw(H, r#"{"code":"1","silent":false,"store_history":true,"user_expressions":{}}"#)),
            Ok(Incoming::Message(_))
        ));
        for content in [r#"{"code":{},"silent":false}"#, r#"{"code":"1","silent":"yes"}"#, "not json", "[]"] {
            match parse(raw(H, content)) {
                Ok(Incoming::Malformed(m, why)) => {
                    assert!(why.starts_with("content of execute_request"), "{why}");
                    let reply = error_reply(&m, &why).unwrap();
                    assert_eq!(reply.message_type(), "execute_reply");
                    assert_eq!(serde_json::to_value(&reply).unwrap()["status"], "error");
                }
                _ => panic!("{content} was not malformed"),
            }
        }
        for header in [r#"{"msg_type": 7}"#, &H.replace(r#""session":"s","#, ""), "{", "null"] {
            assert!(
                matches!(parse(raw(header, "{}")), Err(Failure::Dropped(w)) if w.starts_with("unreadable header")),
                "{header}"
            );
        }
    }
}
