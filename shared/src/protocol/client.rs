//! Every frame a client sends (docs/protocol.md section 3, "Client to server"),
//! parsed in two steps so that a refusal keeps the frame's `ref` (or `cmid`), and
//! serialized by the client library.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::ephemeral::TypingState;
use crate::ids::MsgId;

/// A client frame, parsed in two steps: `t` first, then the fields of that type (an
/// internally tagged enum cannot hold the raw `body`).
#[derive(Debug, Serialize, JsonSchema)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ClientFrame {
    Send(SendFrame),
    Ack(AckFrame),
    Read(ReadFrame),
    Sync(SyncFrame),
    Ping(PingFrame),
    /// The token, as the first frame of a session opened without one.
    Auth(TokenFrame),
    /// A new token for the same device, extending the session.
    Refresh(TokenFrame),
    /// The user is typing in a conversation (relayed, never stored).
    Typing(TypingFrame),
    /// The users whose presence this session follows (replacing the previous list).
    PresenceSubscribe(PresenceSubscribeFrame),
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SendFrame {
    pub cmid: String,
    pub conv: String,
    pub body: Box<RawValue>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct AckFrame {
    pub ids: Vec<MsgId>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadFrame {
    pub conv: String,
    pub seq: u64,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SyncFrame {
    pub conv: String,
    #[serde(default)]
    pub after_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PingFrame {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<u64>,
}

/// `auth` and `refresh`: a token (docs/protocol.md sections 3.1 and 3.3).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TokenFrame {
    pub token: String,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// `typing`: the user started (the default) or stopped typing in `conv`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TypingFrame {
    pub conv: String,
    #[serde(default)]
    pub state: TypingState,
    /// Echoed in an `error` when the frame is refused.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// `presence_subscribe`: follow these users' presence (at most
/// `gateway.presence_max_users`); an empty list follows no one.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PresenceSubscribeFrame {
    pub users: Vec<String>,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// Why a client frame was refused; `reference` is its `cmid`/`ref` when readable.
#[derive(Debug)]
pub struct FrameError {
    pub message: String,
    pub reference: Option<String>,
}

impl ClientFrame {
    /// The frame's `t`.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientFrame::Send(_) => "send",
            ClientFrame::Ack(_) => "ack",
            ClientFrame::Read(_) => "read",
            ClientFrame::Sync(_) => "sync",
            ClientFrame::Ping(_) => "ping",
            ClientFrame::Auth(_) => "auth",
            ClientFrame::Refresh(_) => "refresh",
            ClientFrame::Typing(_) => "typing",
            ClientFrame::PresenceSubscribe(_) => "presence_subscribe",
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("client frames serialize")
    }

    pub fn parse(text: &str) -> Result<ClientFrame, FrameError> {
        #[derive(Deserialize)]
        struct Head {
            // Any JSON value: a frame whose `t` is not a string still gets its `ref` back.
            t: Option<serde_json::Value>,
            cmid: Option<serde_json::Value>,
            #[serde(rename = "ref")]
            reference: Option<serde_json::Value>,
        }
        let head: Head = serde_json::from_str(text)
            .map_err(|e| FrameError { message: format!("malformed JSON frame: {e}"), reference: None })?;
        let reference = head.reference.or(head.cmid).and_then(|v| v.as_str().map(str::to_owned));
        let fail =
            |e: serde_json::Error| FrameError { message: format!("invalid frame: {e}"), reference: reference.clone() };
        let t = match &head.t {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(t)) => Some(t.as_str()),
            Some(_) => {
                return Err(FrameError { message: "the frame type (t) must be a string".into(), reference });
            }
        };
        match t {
            Some("send") => serde_json::from_str(text).map(ClientFrame::Send).map_err(fail),
            Some("ack") => serde_json::from_str(text).map(ClientFrame::Ack).map_err(fail),
            Some("read") => serde_json::from_str(text).map(ClientFrame::Read).map_err(fail),
            Some("sync") => serde_json::from_str(text).map(ClientFrame::Sync).map_err(fail),
            Some("ping") => serde_json::from_str(text).map(ClientFrame::Ping).map_err(fail),
            Some("auth") => serde_json::from_str(text).map(ClientFrame::Auth).map_err(fail),
            Some("refresh") => serde_json::from_str(text).map(ClientFrame::Refresh).map_err(fail),
            Some("typing") => serde_json::from_str(text).map(ClientFrame::Typing).map_err(fail),
            Some("presence_subscribe") => serde_json::from_str(text).map(ClientFrame::PresenceSubscribe).map_err(fail),
            Some(other) => Err(FrameError { message: format!("unknown frame type {other:?}"), reference }),
            None => Err(FrameError { message: "frame has no type (t)".into(), reference }),
        }
    }
}

#[cfg(test)]
mod frame_tests {
    use super::*;

    #[test]
    fn client_frames_parse_by_type_and_errors_keep_the_reference() {
        assert!(matches!(
            ClientFrame::parse(r#"{"t":"send","cmid":"a","conv":"c","body":{"x":1}}"#),
            Ok(ClientFrame::Send(_))
        ));
        assert!(matches!(ClientFrame::parse(r#"{"t":"ack","ids":["18446744073709551615"]}"#), Ok(ClientFrame::Ack(_))));
        assert!(matches!(ClientFrame::parse(r#"{"t":"ping"}"#), Ok(ClientFrame::Ping(_))));
        let e = ClientFrame::parse(r#"{"t":"send","cmid":"a1","conv":"c"}"#).unwrap_err();
        assert_eq!(e.reference.as_deref(), Some("a1"));
        assert!(ClientFrame::parse(r#"{"t":"ack","ids":[1]}"#).is_err(), "ids are strings");
        assert!(matches!(ClientFrame::parse(r#"{"t":"auth","token":"x"}"#), Ok(ClientFrame::Auth(_))));
        let e = ClientFrame::parse(r#"{"t":"refresh","ref":"r9"}"#).unwrap_err();
        assert_eq!(e.reference.as_deref(), Some("r9"), "a refresh without a token keeps its ref");
        assert!(ClientFrame::parse(r#"{"t":"dance"}"#).unwrap_err().message.contains("unknown frame type"));
        let Ok(ClientFrame::Typing(t)) = ClientFrame::parse(r#"{"t":"typing","conv":"c"}"#) else { panic!() };
        assert_eq!(t.state, TypingState::Started, "started by default");
        assert!(ClientFrame::parse(r#"{"t":"typing","conv":"c","state":"dancing"}"#).is_err());
        let e = ClientFrame::parse(r#"{"t":"presence_subscribe","users":"bob","ref":"p1"}"#).unwrap_err();
        assert_eq!(e.reference.as_deref(), Some("p1"), "users is a list");
        assert!(ClientFrame::parse("{nope").is_err());
        assert!(ClientFrame::parse("[]").is_err());
    }

    #[test]
    fn a_non_string_type_keeps_the_reference() {
        let e = ClientFrame::parse(r#"{"t":5,"cmid":"a"}"#).unwrap_err();
        assert_eq!(e.reference.as_deref(), Some("a"));
        assert!(e.message.contains("must be a string"), "{}", e.message);
        assert!(ClientFrame::parse(r#"{"t":null,"ref":"r"}"#).unwrap_err().reference.as_deref() == Some("r"));
    }

    #[test]
    fn client_frames_serialize_as_they_parse() {
        let body = RawValue::from_string(r#"{"x": [1]}"#.into()).unwrap();
        let frames = [
            ClientFrame::Send(SendFrame { cmid: "a".into(), conv: "c".into(), body }),
            ClientFrame::Ack(AckFrame { ids: vec![MsgId(u64::MAX)] }),
            ClientFrame::Read(ReadFrame { conv: "c".into(), seq: 3 }),
            ClientFrame::Sync(SyncFrame {
                conv: "c".into(),
                after_seq: 2,
                limit: Some(5),
                reference: Some("r".into()),
            }),
            ClientFrame::Ping(PingFrame { ts: None }),
            ClientFrame::Auth(TokenFrame { token: "a.b.c".into(), reference: None }),
            ClientFrame::Refresh(TokenFrame { token: "a.b.c".into(), reference: Some("r1".into()) }),
            ClientFrame::Typing(TypingFrame { conv: "c".into(), state: TypingState::Stopped, reference: None }),
            ClientFrame::PresenceSubscribe(PresenceSubscribeFrame {
                users: vec!["bob".into()],
                reference: Some("p".into()),
            }),
        ];
        for f in frames {
            let text = f.to_json();
            let back = ClientFrame::parse(&text).unwrap();
            assert_eq!(back.kind(), f.kind());
            assert_eq!(back.to_json(), text);
        }
        assert_eq!(ClientFrame::Ping(PingFrame { ts: None }).to_json(), r#"{"t":"ping"}"#);
    }
}
