//! Every frame the server sends (docs/protocol.md section 3, "Server to client"), as
//! one enum tagged by `t`. The gateway serializes these; the client library, the
//! load-test and the tests parse them, so both sides share one definition.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ephemeral::{PresenceState, TypingShown};
use super::{Message, SendResult};
use crate::error::ErrorCode;
use crate::ids::MsgId;

/// A server frame. Serialized with its type in `t` (`{"t":"hello",...}`).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ServerFrame {
    Hello(Hello),
    Msg(Message),
    Sent(Sent),
    Read(ReadPosition),
    CaughtUp(CaughtUp),
    History(History),
    Pong(Pong),
    Error(ErrorFrame),
    Reconnect(Reconnect),
    Refreshed(Refreshed),
    Delivered(DeliveryStatus),
    Typing(TypingShown),
    Presence(PresenceState),
}

/// The first frame of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Hello {
    pub session: String,
    /// The server's heartbeat interval.
    pub hb_ms: u64,
    /// Messages waiting for this device when the session started.
    pub pending: u64,
}

/// The answer to a `send`, only after the message is committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Sent {
    pub cmid: String,
    pub id: MsgId,
    pub conv: String,
    pub seq: u64,
    pub ts: u64,
    pub dup: bool,
}

impl Sent {
    pub fn new(cmid: impl Into<String>, r: &SendResult) -> Sent {
        Sent { cmid: cmid.into(), id: r.id, conv: r.conv.clone(), seq: r.seq, ts: r.ts, dup: r.dup }
    }
}

/// A member (or this user on another device) has read `conv` up to `seq`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReadPosition {
    pub conv: String,
    pub user: String,
    pub seq: u64,
}

/// The delivery status of the receiving user's own messages in `conv`, sent only to
/// sessions that opted in (`features=delivered`, docs/protocol.md section 3.2): `count`
/// other members have every message up to `seq` delivered to a device (or read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeliveryStatus {
    pub conv: String,
    /// The user's latest message the status is about; earlier ones have at least `count`.
    pub seq: u64,
    /// Other members (not the user) whose delivered position is at least `seq`.
    pub count: u64,
    /// In a direct conversation, the other member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// The device's backlog is delivered and acked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CaughtUp {
    pub delivered: u64,
}

/// The answer to `sync`: a page of one conversation's history in `seq` order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct History {
    pub conv: String,
    pub items: Vec<Message>,
    pub more: bool,
    /// The request's `ref` (null when it had none).
    #[serde(rename = "ref", default)]
    pub reference: Option<String>,
    /// The caller's membership starts after this seq: there is nothing to show below it.
    /// Absent from servers older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_seq: Option<u64>,
    /// Where this device's timeline starts, at or above `joined_seq`: the device
    /// receives by push every message after it; what is older is history to page back
    /// into. Absent from servers older than this field (use `joined_seq`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_seq: Option<u64>,
}

/// The answer to `ping`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Pong {
    pub ts: u64,
}

/// A request failed. `ref` echoes the request's `cmid` or `ref` when it had one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorFrame {
    pub code: ErrorCode,
    pub message: String,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl ErrorFrame {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorFrame {
        ErrorFrame { code, message: message.into(), reference: None, retry_after_ms: None }
    }

    pub fn with_ref(mut self, reference: Option<String>) -> ErrorFrame {
        self.reference = reference;
        self
    }

    pub fn retry_after(mut self, ms: u64) -> ErrorFrame {
        self.retry_after_ms = Some(ms);
        self
    }
}

/// The server is draining: reconnect after this delay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Reconnect {
    pub after_ms: u64,
}

/// The answer to `refresh`: the session now ends at the new token's expiry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Refreshed {
    /// The new token's `exp` (seconds since the Unix epoch, as in JWTs).
    pub exp: u64,
    /// The `ref` of the `refresh` (null when it had none).
    #[serde(rename = "ref", default)]
    pub reference: Option<String>,
}

/// Why a text could not be read as a server frame.
#[derive(Debug, thiserror::Error)]
pub enum ServerFrameError {
    #[error("not a JSON object with a string `t`: {0}")]
    Malformed(String),
    /// A frame type this build does not know (a newer server): clients skip it.
    #[error("unknown frame type {0:?}")]
    Unknown(String),
    #[error("invalid {t} frame: {error}")]
    Invalid { t: String, error: serde_json::Error },
}

impl ServerFrame {
    /// The frame's `t`.
    pub fn kind(&self) -> &'static str {
        match self {
            ServerFrame::Hello(_) => Hello::T,
            ServerFrame::Msg(_) => Message::T,
            ServerFrame::Sent(_) => Sent::T,
            ServerFrame::Read(_) => ReadPosition::T,
            ServerFrame::CaughtUp(_) => CaughtUp::T,
            ServerFrame::History(_) => History::T,
            ServerFrame::Pong(_) => Pong::T,
            ServerFrame::Error(_) => ErrorFrame::T,
            ServerFrame::Reconnect(_) => Reconnect::T,
            ServerFrame::Refreshed(_) => Refreshed::T,
            ServerFrame::Delivered(_) => DeliveryStatus::T,
            ServerFrame::Typing(_) => TypingShown::T,
            ServerFrame::Presence(_) => PresenceState::T,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("server frames serialize")
    }

    /// Parses a frame in two steps, `t` first: a tagged enum cannot hold a message's raw
    /// `body`, which is kept byte for byte.
    pub fn parse(text: &str) -> Result<ServerFrame, ServerFrameError> {
        #[derive(Deserialize)]
        struct Head<'a> {
            #[serde(borrow)]
            t: std::borrow::Cow<'a, str>,
        }
        let head: Head = serde_json::from_str(text).map_err(|e| ServerFrameError::Malformed(e.to_string()))?;
        fn read<T: serde::de::DeserializeOwned>(
            text: &str,
            t: &str,
            wrap: fn(T) -> ServerFrame,
        ) -> Result<ServerFrame, ServerFrameError> {
            serde_json::from_str(text).map(wrap).map_err(|error| ServerFrameError::Invalid { t: t.to_owned(), error })
        }
        let t = head.t.as_ref();
        match t {
            Hello::T => read(text, t, ServerFrame::Hello),
            Message::T => read(text, t, ServerFrame::Msg),
            Sent::T => read(text, t, ServerFrame::Sent),
            ReadPosition::T => read(text, t, ServerFrame::Read),
            CaughtUp::T => read(text, t, ServerFrame::CaughtUp),
            History::T => read(text, t, ServerFrame::History),
            Pong::T => read(text, t, ServerFrame::Pong),
            ErrorFrame::T => read(text, t, ServerFrame::Error),
            Reconnect::T => read(text, t, ServerFrame::Reconnect),
            Refreshed::T => read(text, t, ServerFrame::Refreshed),
            DeliveryStatus::T => read(text, t, ServerFrame::Delivered),
            TypingShown::T => read(text, t, ServerFrame::Typing),
            PresenceState::T => read(text, t, ServerFrame::Presence),
            other => Err(ServerFrameError::Unknown(other.to_owned())),
        }
    }
}

/// One kind of server frame: its `t`, and how to take it out of a [`ServerFrame`]
/// (`ws.next_of::<Hello>(..)`).
pub trait FrameKind: Sized {
    const T: &'static str;
    fn from_frame(frame: ServerFrame) -> Option<Self>;
    fn into_frame(self) -> ServerFrame;
}

macro_rules! frame_kind {
    ($($ty:ty => $variant:ident, $t:literal;)*) => {$(
        impl FrameKind for $ty {
            const T: &'static str = $t;
            fn from_frame(frame: ServerFrame) -> Option<Self> {
                match frame {
                    ServerFrame::$variant(f) => Some(f),
                    _ => None,
                }
            }
            fn into_frame(self) -> ServerFrame {
                ServerFrame::$variant(self)
            }
        }
        impl From<$ty> for ServerFrame {
            fn from(f: $ty) -> ServerFrame {
                ServerFrame::$variant(f)
            }
        }
    )*};
}

frame_kind! {
    Hello => Hello, "hello";
    Message => Msg, "msg";
    Sent => Sent, "sent";
    ReadPosition => Read, "read";
    CaughtUp => CaughtUp, "caught_up";
    History => History, "history";
    Pong => Pong, "pong";
    ErrorFrame => Error, "error";
    Reconnect => Reconnect, "reconnect";
    Refreshed => Refreshed, "refreshed";
    DeliveryStatus => Delivered, "delivered";
    TypingShown => Typing, "typing";
    PresenceState => Presence, "presence";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::TypingState;
    use serde_json::value::RawValue;

    fn message(id: u64, seq: u64) -> Message {
        Message {
            id: MsgId(id),
            conv: "c1".into(),
            seq,
            from: "alice".into(),
            cmid: format!("m-{seq}"),
            ts: 1_700_000_000_000,
            body: RawValue::from_string(r#"{"text": "hi", "n": [1, 2.5]}"#.into()).unwrap(),
            status: None,
            event: None,
            edited_seq: None,
            recalled_seq: None,
        }
    }

    /// One frame of every type.
    fn every_frame() -> Vec<ServerFrame> {
        vec![
            Hello { session: "gw-1-00ff".into(), hb_ms: 25_000, pending: 3 }.into(),
            message(u64::MAX - 1, 7).into(),
            Sent {
                cmid: "m-1".into(),
                id: MsgId(7_405_329_411_723_264_001),
                conv: "c1".into(),
                seq: 1,
                ts: 5,
                dup: true,
            }
            .into(),
            ReadPosition { conv: "c1".into(), user: "bob".into(), seq: 9 }.into(),
            CaughtUp { delivered: 200 }.into(),
            History {
                conv: "c1".into(),
                items: vec![message(1 << 60, 1), message((1 << 60) + 1, 2)],
                more: true,
                reference: Some("r".into()),
                joined_seq: Some(7),
                start_seq: Some(9),
            }
            .into(),
            History {
                conv: "c1".into(),
                items: vec![],
                more: false,
                reference: None,
                joined_seq: None,
                start_seq: None,
            }
            .into(),
            Pong { ts: 42 }.into(),
            ErrorFrame::new(ErrorCode::RateLimited, "slow down").with_ref(Some("m-2".into())).retry_after(250).into(),
            ErrorFrame::new(ErrorCode::Forbidden, "not a member").into(),
            Reconnect { after_ms: 1_234 }.into(),
            Refreshed { exp: 1_900_000_000, reference: Some("r1".into()) }.into(),
            DeliveryStatus { conv: "ab".into(), seq: 4, count: 1, user: Some("bob".into()) }.into(),
            DeliveryStatus { conv: "g".into(), seq: 9, count: 12, user: None }.into(),
            TypingShown { conv: "g".into(), user: "bob".into(), state: TypingState::Started, expires_in_ms: 6_000 }
                .into(),
            PresenceState { user: "bob".into(), online: false, last_seen: Some(1_700_000_000_000) }.into(),
            PresenceState { user: "carol".into(), online: true, last_seen: None }.into(),
        ]
    }

    #[test]
    fn every_server_frame_round_trips() {
        let frames = every_frame();
        let kinds: std::collections::BTreeSet<&str> = frames.iter().map(ServerFrame::kind).collect();
        assert_eq!(kinds.len(), 13, "every frame type is covered: {kinds:?}");
        for f in frames {
            let text = f.to_json();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["t"], f.kind(), "{text}");
            assert_eq!(ServerFrame::parse(&text).unwrap(), f, "{text}");
        }
    }

    #[test]
    fn ids_are_strings_bodies_verbatim_and_optional_fields_as_documented() {
        let text = ServerFrame::from(message(u64::MAX, 1)).to_json();
        assert!(text.contains(r#""id":"18446744073709551615""#), "{text}");
        assert!(text.contains(r#""body":{"text": "hi", "n": [1, 2.5]}"#), "the body is kept byte for byte: {text}");
        let e = ServerFrame::from(ErrorFrame::new(ErrorCode::Internal, "x")).to_json();
        assert_eq!(e, r#"{"t":"error","code":"internal","message":"x"}"#);
        let h = ServerFrame::from(History {
            conv: "c".into(),
            items: vec![],
            more: false,
            reference: None,
            joined_seq: None,
            start_seq: None,
        })
        .to_json();
        assert_eq!(h, r#"{"t":"history","conv":"c","items":[],"more":false,"ref":null}"#);
    }

    #[test]
    fn unknown_and_malformed_frames_are_told_apart() {
        assert!(
            matches!(ServerFrame::parse(r#"{"t":"huddle","conv":"c"}"#), Err(ServerFrameError::Unknown(t)) if t == "huddle")
        );
        assert!(matches!(ServerFrame::parse(r#"{"t":5}"#), Err(ServerFrameError::Malformed(_))));
        assert!(matches!(ServerFrame::parse(r#"{"t":"hello"}"#), Err(ServerFrameError::Invalid { .. })));
        // Fields a newer server adds are ignored.
        let f = ServerFrame::parse(r#"{"t":"pong","ts":3,"extra":true}"#).unwrap();
        assert_eq!(f, Pong { ts: 3 }.into());
        assert_eq!(Pong::from_frame(f), Some(Pong { ts: 3 }));
    }
}
