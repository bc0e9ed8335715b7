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

    #[test]
    fn a_non_string_type_keeps_the_reference() {
        let e = ClientFrame::parse(r#"{"t":5,"cmid":"a"}"#).unwrap_err();
        assert_eq!(e.reference.as_deref(), Some("a"));
        assert!(e.message.contains("must be a string"), "{}", e.message);
        assert!(ClientFrame::parse(r#"{"t":null,"ref":"r"}"#).unwrap_err().reference.as_deref() == Some("r"));
    }
}

/// Property tests of the client frame decoder; `PROPTEST_CASES=100000` runs them longer
/// (docs/reliability.md).
#[cfg(test)]
mod frame_proptests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// Any JSON value, nested a few levels.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(Value::from),
            ".{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z_]{0,6}|t|cmid|ref|conv|ids|seq", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Objects that look like frames: a known or unknown `t` and the fields of any
    /// frame type with values of any type.
    fn frame_like() -> impl Strategy<Value = Value> {
        let field = prop_oneof![
            Just("cmid"),
            Just("conv"),
            Just("body"),
            Just("ids"),
            Just("seq"),
            Just("after_seq"),
            Just("limit"),
            Just("ref"),
            Just("ts"),
            Just("x"),
        ];
        let t = prop_oneof![
            Just(json!("send")),
            Just(json!("ack")),
            Just(json!("read")),
            Just(json!("sync")),
            Just(json!("ping")),
            Just(json!("dance")),
            json_value(),
        ];
        (proptest::option::of(t), proptest::collection::btree_map(field, json_value(), 0..6)).prop_map(|(t, fields)| {
            let mut o: serde_json::Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            if let Some(t) = t {
                o.insert("t".into(), t);
            }
            Value::Object(o)
        })
    }

    fn ident() -> impl Strategy<Value = String> {
        "[!-~]{1,64}"
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ClientFrame::parse(&String::from_utf8_lossy(&bytes));
        }

        #[test]
        fn arbitrary_json_ish_text_never_panics(text in r#"[{}\[\]":,. 0-9a-z\\tnulefrs-]{0,96}"#) {
            let _ = ClientFrame::parse(&text);
        }

        /// Any object with frame-like fields parses or is refused with a message; a
        /// readable string `ref` (or `cmid`) is kept on the refusal.
        #[test]
        fn frame_like_objects_parse_or_are_refused_with_their_reference(v in frame_like()) {
            let text = v.to_string();
            if let Err(e) = ClientFrame::parse(&text) {
                prop_assert!(!e.message.is_empty());
                // `ref` wins over `cmid` when it is there and not null.
                let want = match v.get("ref") {
                    Some(r) if !r.is_null() => r.as_str(),
                    _ => v.get("cmid").and_then(Value::as_str),
                };
                prop_assert_eq!(e.reference.as_deref(), want);
            }
        }

        #[test]
        fn send_frames_round_trip(cmid in ".{1,64}", conv in ident(), body in json_value()) {
            let body_text = body.to_string();
            let text = json!({"t": "send", "cmid": cmid, "conv": conv, "body": body}).to_string();
            match ClientFrame::parse(&text) {
                Ok(ClientFrame::Send(f)) => {
                    prop_assert_eq!(f.cmid, cmid);
                    prop_assert_eq!(f.conv, conv);
                    // The body is kept verbatim, as sent.
                    prop_assert_eq!(f.body.get(), body_text.as_str());
                }
                other => prop_assert!(false, "{text} parsed as {other:?}"),
            }
        }

        #[test]
        fn ack_read_sync_and_ping_frames_round_trip(
            ids in proptest::collection::vec(any::<u64>(), 0..16),
            conv in ident(),
            seq in any::<u64>(),
            limit in proptest::option::of(any::<u32>()),
            reference in proptest::option::of(".{0,16}"),
            ts in proptest::option::of(any::<u64>()),
        ) {
            let strs: Vec<String> = ids.iter().map(u64::to_string).collect();
            match ClientFrame::parse(&json!({"t": "ack", "ids": strs}).to_string()) {
                Ok(ClientFrame::Ack(a)) => prop_assert_eq!(a.ids, ids.iter().map(|i| MsgId(*i)).collect::<Vec<_>>()),
                other => prop_assert!(false, "ack: {other:?}"),
            }
            match ClientFrame::parse(&json!({"t": "read", "conv": conv, "seq": seq}).to_string()) {
                Ok(ClientFrame::Read(r)) => prop_assert_eq!((r.conv.as_str(), r.seq), (conv.as_str(), seq)),
                other => prop_assert!(false, "read: {other:?}"),
            }
            let mut sync = json!({"t": "sync", "conv": conv, "after_seq": seq});
            if let Some(l) = limit { sync["limit"] = json!(l); }
            if let Some(r) = &reference { sync["ref"] = json!(r); }
            match ClientFrame::parse(&sync.to_string()) {
                Ok(ClientFrame::Sync(s)) => {
                    prop_assert_eq!((s.conv.as_str(), s.after_seq, s.limit), (conv.as_str(), seq, limit));
                    prop_assert_eq!(s.reference, reference);
                }
                other => prop_assert!(false, "sync: {other:?}"),
            }
            let mut ping = json!({"t": "ping"});
            if let Some(ts) = ts { ping["ts"] = json!(ts); }
            match ClientFrame::parse(&ping.to_string()) {
                Ok(ClientFrame::Ping(p)) => prop_assert_eq!(p.ts, ts),
                other => prop_assert!(false, "ping: {other:?}"),
            }
        }
    }
}
