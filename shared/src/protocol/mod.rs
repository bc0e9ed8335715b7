//! The wire protocol (docs/protocol.md) and the messages gateways and workers exchange.
//!
//! - [`server`]: every frame the server sends, as one tagged enum ([`ServerFrame`]).
//! - [`client`]: every frame a client sends ([`ClientFrame`]), parsed with a reference
//!   kept for errors.
//! - [`close`]: the WebSocket close codes.
//! - [`node`]: ingress stream entries and node-channel envelopes (internal).
//! - [`ephemeral`]: typing and presence frames, never stored.
//! - [`timeline`]: timeline events (membership, title, roles, recalls, edits) and the
//!   changes that make them.

pub mod client;
pub mod close;
pub mod digest;
pub mod ephemeral;
pub mod node;
pub mod pack;
pub mod schema;
pub mod server;
pub mod timeline;

#[cfg(test)]
mod client_proptests;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::ids::MsgId;

pub use client::{
    AckFrame, ClientFrame, FrameError, PingFrame, PresenceSubscribeFrame, ReadFrame, SendFrame, SyncFrame, TokenFrame,
    TypingFrame,
};
pub use close::CloseCode;
pub use ephemeral::{PresenceState, TypingShown, TypingState};
pub use node::{
    read_field, DeliveredEntry, DeliveriesOut, Delivery, DeliveryOut, Echo, EchoOut, IngressEntry, IngressRequest,
    Kick, NodeEnvelope, NoticesOut, OutcomeOut, PresenceChange, ReadEntry, ReadPush, Revocation, SendNotice,
    SendNoticeOut, SendOutcome, StatusPush, TypingPush,
};
pub use server::{
    CaughtUp, DeliveryStatus, ErrorFrame, FrameKind, Hello, History, Pong, ReadPosition, Reconnect, Refreshed, Sent,
    ServerFrame,
};
pub use timeline::{MemberRole, TimelineEntry, TimelineEvent, TimelineOp};

/// The WebSocket subprotocol naming this protocol's version (`Sec-WebSocket-Protocol`).
pub const SUBPROTOCOL: &str = "herald.v1";

/// Longest client message id.
pub const MAX_CMID_LEN: usize = 64;

/// A committed message as clients see it (`msg` frames and history items).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Message {
    pub id: MsgId,
    pub conv: String,
    pub seq: u64,
    pub from: String,
    pub cmid: String,
    pub ts: u64,
    pub body: Box<RawValue>,
    /// Only in history pages, on the caller's own messages: how far they got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<MessageStatus>,
    /// On a timeline event: what happened (`body` is null, or an edit's new body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<TimelineEvent>,
    /// On a message edited before it was read from the database: the `seq` of its
    /// latest edit, whose body `body` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_seq: Option<u64>,
    /// On a message recalled before it was read from the database: the `seq` of the
    /// recall (`body` is null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recalled_seq: Option<u64>,
}

/// How far one of the caller's own messages got (history pages): of the `of` members
/// it went to, `delivered` have it on a device (or read it), `read` read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MessageStatus {
    pub of: u64,
    pub delivered: u64,
    pub read: u64,
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        (self.id, &self.conv, self.seq, &self.from, &self.cmid, self.ts, self.body.get())
            == (other.id, &other.conv, other.seq, &other.from, &other.cmid, other.ts, other.body.get())
            && (&self.event, self.edited_seq, self.recalled_seq) == (&other.event, other.edited_seq, other.recalled_seq)
    }
}

/// The answer to a send, over HTTP (`200`) or as a `sent` frame.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct SendResult {
    pub id: MsgId,
    pub conv: String,
    pub seq: u64,
    pub ts: u64,
    pub dup: bool,
}

/// Serializes a `msg` frame once; its bytes are shared by every recipient.
pub fn msg_frame(m: &Message) -> String {
    ServerFrame::Msg(m.clone()).to_json()
}

/// The `msg` frame of a message given up for it: no copy of the message, and the
/// frame kept as JSON text that is not parsed again (`to_raw_value` wraps what it wrote).
pub fn msg_frame_raw(m: Message) -> Box<RawValue> {
    serde_json::value::to_raw_value(&ServerFrame::Msg(m)).expect("server frames serialize")
}

/// A conversation's kind (docs/protocol.md section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConversationKind {
    /// Exactly two members, fixed.
    Direct,
    Group,
}

impl ConversationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConversationKind::Direct => "direct",
            ConversationKind::Group => "group",
        }
    }

    pub fn parse(s: &str) -> Option<ConversationKind> {
        match s {
            "direct" => Some(ConversationKind::Direct),
            "group" => Some(ConversationKind::Group),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_frames_carry_ids_as_strings_and_the_body_verbatim() {
        let m = Message {
            id: MsgId(7_405_329_411_723_264_001),
            conv: "c1".into(),
            seq: 3,
            from: "alice".into(),
            cmid: "m-1".into(),
            ts: 1,
            body: RawValue::from_string(r#"{"text":"hi"}"#.into()).unwrap(),
            status: None,
            event: None,
            edited_seq: None,
            recalled_seq: None,
        };
        let f = msg_frame(&m);
        assert!(f.starts_with(r#"{"t":"msg","id":"7405329411723264001""#), "{f}");
        assert!(f.contains(r#""body":{"text":"hi"}"#));
    }

    #[test]
    fn conversation_kinds_parse_their_own_names_only() {
        for k in [ConversationKind::Direct, ConversationKind::Group] {
            assert_eq!(ConversationKind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{}\"", k.as_str()));
        }
        assert_eq!(ConversationKind::parse("Direct"), None);
    }
}
