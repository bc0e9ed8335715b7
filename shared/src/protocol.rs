//! Wire frames (PROTOCOL.md section 3) and the internal messages between gateways and
//! workers (ingress stream entries, node-channel envelopes).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::ErrorCode;
use crate::ids::MsgId;

/// Longest client message id.
pub const MAX_CMID_LEN: usize = 64;

/// A committed message as clients see it (`msg` frames and history items).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Message {
    pub id: MsgId,
    pub conv: String,
    pub seq: u64,
    pub from: String,
    pub cmid: String,
    pub ts: u64,
    pub body: Box<RawValue>,
}

/// The answer to a send, over HTTP (`200`) or as a `sent` frame.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SendResult {
    pub id: MsgId,
    pub conv: String,
    pub seq: u64,
    pub ts: u64,
    pub dup: bool,
}

/// Serializes a `msg` frame once; its bytes are shared by every recipient.
pub fn msg_frame(m: &Message) -> String {
    #[derive(Serialize)]
    struct Frame<'a> {
        t: &'static str,
        #[serde(flatten)]
        m: &'a Message,
    }
    serde_json::to_string(&Frame { t: "msg", m }).expect("message serializes")
}

/// One send request, as the gateway writes it into an ingress stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressEntry {
    pub tenant: String,
    pub user: String,
    pub device: String,
    pub cmid: String,
    pub conv: String,
    /// The body's JSON text, already validated and size-checked by the gateway.
    pub body: String,
    /// Gateway node that waits for the answer, and its request id there.
    pub node: String,
    pub rid: u64,
}

impl IngressEntry {
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("tid", self.tenant.clone()),
            ("uid", self.user.clone()),
            ("dev", self.device.clone()),
            ("cmid", self.cmid.clone()),
            ("conv", self.conv.clone()),
            ("body", self.body.clone()),
            ("node", self.node.clone()),
            ("rid", self.rid.to_string()),
        ]
    }

    pub fn from_fields(f: &std::collections::HashMap<String, String>) -> Option<IngressEntry> {
        let get = |k: &str| f.get(k).cloned();
        Some(IngressEntry {
            tenant: get("tid")?,
            user: get("uid")?,
            device: get("dev")?,
            cmid: get("cmid")?,
            conv: get("conv")?,
            body: get("body")?,
            node: get("node")?,
            rid: get("rid")?.parse().ok()?,
        })
    }
}

/// A read receipt on its way to a worker (same stream as the conversation's sends).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadEntry {
    pub tenant: String,
    pub user: String,
    pub device: String,
    pub conv: String,
    pub seq: u64,
    pub node: String,
    pub rid: u64,
}

impl ReadEntry {
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("k", "read".into()),
            ("tid", self.tenant.clone()),
            ("uid", self.user.clone()),
            ("dev", self.device.clone()),
            ("conv", self.conv.clone()),
            ("seq", self.seq.to_string()),
            ("node", self.node.clone()),
            ("rid", self.rid.to_string()),
        ]
    }

    pub fn from_fields(f: &std::collections::HashMap<String, String>) -> Option<ReadEntry> {
        let get = |k: &str| f.get(k).cloned();
        Some(ReadEntry {
            tenant: get("tid")?,
            user: get("uid")?,
            device: get("dev")?,
            conv: get("conv")?,
            seq: get("seq")?.parse().ok()?,
            node: get("node")?,
            rid: get("rid")?.parse().ok()?,
        })
    }
}

/// Anything a gateway puts into an ingress stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IngressRequest {
    Send(IngressEntry),
    Read(ReadEntry),
}

impl IngressRequest {
    pub fn from_fields(f: &std::collections::HashMap<String, String>) -> Option<IngressRequest> {
        match f.get("k").map(String::as_str) {
            None | Some("send") => IngressEntry::from_fields(f).map(IngressRequest::Send),
            Some("read") => ReadEntry::from_fields(f).map(IngressRequest::Read),
            Some(_) => None,
        }
    }

    pub fn node_and_rid(&self) -> (&str, u64) {
        match self {
            IngressRequest::Send(e) => (&e.node, e.rid),
            IngressRequest::Read(e) => (&e.node, e.rid),
        }
    }
}

/// The field of a device's read-state hash: conversation and reader. A space cannot
/// occur in either id.
pub fn read_field(conv: &str, reader: &str) -> String {
    format!("{conv} {reader}")
}

/// What a worker tells a gateway node about one send request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SendNotice {
    pub rid: u64,
    #[serde(flatten)]
    pub outcome: SendOutcome,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SendOutcome {
    Ok(SendResult),
    /// A read receipt applied: the stored position (which only moves forward).
    Read {
        conv: String,
        read_seq: u64,
    },
    Err {
        code: ErrorCode,
        message: String,
    },
}

/// A read position pushed to devices on one node (latest wins; confirmed by a pong).
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct ReadPush {
    pub conv: String,
    pub user: String,
    pub seq: u64,
    pub to: Vec<(String, String, String)>,
}

/// One message pushed to a set of devices on one node.
#[derive(Debug, Serialize, Deserialize)]
pub struct Delivery {
    pub id: MsgId,
    pub frame: Box<RawValue>,
    /// (tenant, user, device) of every recipient device on the node.
    pub to: Vec<(String, String, String)>,
}

/// Everything published to one node's channel in one go.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NodeEnvelope {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sent: Vec<SendNotice>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliver: Vec<Delivery>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kick: Vec<Kick>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<ReadPush>,
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
        };
        let f = msg_frame(&m);
        assert!(f.starts_with(r#"{"t":"msg","id":"7405329411723264001""#), "{f}");
        assert!(f.contains(r#""body":{"text":"hi"}"#));
    }

    #[test]
    fn notices_round_trip() {
        let n = SendNotice {
            rid: 4,
            outcome: SendOutcome::Err { code: ErrorCode::Forbidden, message: "not a member".into() },
        };
        let s = serde_json::to_string(&n).unwrap();
        assert_eq!(serde_json::from_str::<SendNotice>(&s).unwrap(), n);
    }
}

/// A client frame, parsed in two steps: `t` first, then the fields of that type (an
/// internally tagged enum cannot hold the raw `body`).
#[derive(Debug)]
pub enum ClientFrame {
    Send(SendFrame),
    Ack(AckFrame),
    Read(ReadFrame),
    Sync(SyncFrame),
    Ping(PingFrame),
}

#[derive(Debug, Deserialize)]
pub struct SendFrame {
    pub cmid: String,
    pub conv: String,
    pub body: Box<RawValue>,
}

#[derive(Debug, Deserialize)]
pub struct AckFrame {
    pub ids: Vec<MsgId>,
}

#[derive(Debug, Deserialize)]
pub struct ReadFrame {
    pub conv: String,
    pub seq: u64,
}

#[derive(Debug, Deserialize)]
pub struct SyncFrame {
    pub conv: String,
    #[serde(default)]
    pub after_seq: u64,
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(rename = "ref", default)]
    pub reference: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct PingFrame {
    #[serde(default)]
    pub ts: Option<u64>,
}

/// Why a client frame was refused; `reference` is its `cmid`/`ref` when readable.
#[derive(Debug)]
pub struct FrameError {
    pub message: String,
    pub reference: Option<String>,
}

impl ClientFrame {
    pub fn parse(text: &str) -> Result<ClientFrame, FrameError> {
        #[derive(Deserialize)]
        struct Head {
            t: Option<String>,
            cmid: Option<serde_json::Value>,
            #[serde(rename = "ref")]
            reference: Option<serde_json::Value>,
        }
        let head: Head = serde_json::from_str(text)
            .map_err(|e| FrameError { message: format!("malformed JSON frame: {e}"), reference: None })?;
        let reference = head.reference.or(head.cmid).and_then(|v| v.as_str().map(str::to_owned));
        let fail =
            |e: serde_json::Error| FrameError { message: format!("invalid frame: {e}"), reference: reference.clone() };
        match head.t.as_deref() {
            Some("send") => serde_json::from_str(text).map(ClientFrame::Send).map_err(fail),
            Some("ack") => serde_json::from_str(text).map(ClientFrame::Ack).map_err(fail),
            Some("read") => serde_json::from_str(text).map(ClientFrame::Read).map_err(fail),
            Some("sync") => serde_json::from_str(text).map(ClientFrame::Sync).map_err(fail),
            Some("ping") => serde_json::from_str(text).map(ClientFrame::Ping).map_err(fail),
            Some(other) => Err(FrameError { message: format!("unknown frame type {other:?}"), reference }),
            None => Err(FrameError { message: "frame has no type (t)".into(), reference }),
        }
    }
}

/// Tells a node to close a session replaced elsewhere (close code 4002).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Kick {
    pub tenant: String,
    pub user: String,
    pub device: String,
    pub session: String,
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
        assert!(ClientFrame::parse(r#"{"t":"dance"}"#).unwrap_err().message.contains("unknown frame type"));
        assert!(ClientFrame::parse("{nope").is_err());
        assert!(ClientFrame::parse("[]").is_err());
    }
}
