//! What gateways and workers tell each other: entries of the ingress streams (sends
//! and read receipts on their way to a worker) and envelopes on a gateway node's
//! channel (answers, deliveries, read positions, kicks). Internal: not part of the
//! client protocol, but every process of a cluster must agree on it.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::ephemeral::{PresenceState, TypingShown};
use super::server::DeliveryStatus;
use super::timeline::TimelineEntry;
use super::SendResult;
use crate::error::ErrorCode;
use crate::ids::MsgId;
use crate::keys::DeviceKey;
use crate::otel::TraceParent;

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
    /// The gateway's `herald.send` span, for a send that is traced (`otel.*`): field
    /// `tp`, a W3C `traceparent`. Absent otherwise; a worker older than traces ignores
    /// the field, and one that cannot read it commits the send untraced.
    pub trace: Option<TraceParent>,
}

impl IngressEntry {
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("tid", self.tenant.clone()),
            ("uid", self.user.clone()),
            ("dev", self.device.clone()),
            ("cmid", self.cmid.clone()),
            ("conv", self.conv.clone()),
            ("body", self.body.clone()),
            ("node", self.node.clone()),
            ("rid", self.rid.to_string()),
        ];
        if let Some(trace) = &self.trace {
            fields.push(("tp", trace.to_string()));
        }
        fields
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
            trace: f.get("tp").and_then(|tp| TraceParent::parse(tp)),
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

/// A member's delivered position on its way to a worker: a device of `user` acked
/// `conv` up to `seq` (the highest of a gateway's batch). Nobody waits for an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveredEntry {
    pub tenant: String,
    pub user: String,
    pub conv: String,
    pub seq: u64,
}

impl DeliveredEntry {
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("k", "dlv".into()),
            ("tid", self.tenant.clone()),
            ("uid", self.user.clone()),
            ("conv", self.conv.clone()),
            ("seq", self.seq.to_string()),
        ]
    }

    pub fn from_fields(f: &std::collections::HashMap<String, String>) -> Option<DeliveredEntry> {
        let get = |k: &str| f.get(k).cloned();
        Some(DeliveredEntry {
            tenant: get("tid")?,
            user: get("uid")?,
            conv: get("conv")?,
            seq: get("seq")?.parse().ok()?,
        })
    }

    /// Many positions as one ingress entry (`k=dlvs`, `p`: a JSON array of `[tenant,
    /// user, conv, seq]`): a gateway writes one such entry per shard and flush, so the
    /// streams carry a few entries per flush, not one per member.
    pub fn batch_to_fields(entries: &[DeliveredEntry]) -> Vec<(&'static str, String)> {
        let rows: Vec<(&str, &str, &str, u64)> =
            entries.iter().map(|e| (e.tenant.as_str(), e.user.as_str(), e.conv.as_str(), e.seq)).collect();
        vec![("k", "dlvs".into()), ("p", serde_json::to_string(&rows).expect("positions serialize"))]
    }

    fn batch_from_fields(f: &std::collections::HashMap<String, String>) -> Option<Vec<DeliveredEntry>> {
        let rows: Vec<(String, String, String, u64)> = serde_json::from_str(f.get("p")?).ok()?;
        let entries: Vec<DeliveredEntry> =
            rows.into_iter().map(|(tenant, user, conv, seq)| DeliveredEntry { tenant, user, conv, seq }).collect();
        (!entries.is_empty()).then_some(entries)
    }
}

/// Anything a gateway puts into an ingress stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IngressRequest {
    Send(IngressEntry),
    Read(ReadEntry),
    /// One position (`k=dlv`, written by gateways before batches) or a batch (`k=dlvs`).
    Delivered(Vec<DeliveredEntry>),
    /// A change to the conversation's timeline (`k=tl`): committed in stream order with
    /// the sends around it. A worker older than timeline events drops it as malformed
    /// (its sender hears `unavailable`): upgrade workers first.
    Timeline(TimelineEntry),
    /// Sends packed into one entry (`k=sends`: [`super::pack`]), in their order.
    Sends(Vec<IngressEntry>),
}

impl IngressRequest {
    pub fn from_fields(f: &std::collections::HashMap<String, String>) -> Option<IngressRequest> {
        match f.get("k").map(String::as_str) {
            None | Some("send") => IngressEntry::from_fields(f).map(IngressRequest::Send),
            Some("read") => ReadEntry::from_fields(f).map(IngressRequest::Read),
            Some("dlv") => DeliveredEntry::from_fields(f).map(|e| IngressRequest::Delivered(vec![e])),
            Some("dlvs") => DeliveredEntry::batch_from_fields(f).map(IngressRequest::Delivered),
            Some("tl") => TimelineEntry::from_fields(f).map(IngressRequest::Timeline),
            Some(super::pack::KIND) => super::pack::from_fields(f).map(IngressRequest::Sends),
            Some(_) => None,
        }
    }
}

/// The field of a device's read-state hash: conversation and reader. A space cannot
/// occur in either id.
pub fn read_field(conv: &str, reader: &str) -> String {
    format!("{conv} {reader}")
}

/// What a worker tells a gateway node about one request: its answer, and which request
/// it answers besides the id, so that a gateway never hands it to another request that
/// happens to have the same id (an earlier life of the node, say).
///
/// Read by hand (below), not derived: serde reads a `flatten`ed field by first copying
/// every field of the object into a buffer of its own values, and a gateway reads one
/// notice per message it answers.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SendNotice {
    pub rid: u64,
    /// Absent in notices of workers older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<Echo>,
    #[serde(flatten)]
    pub outcome: SendOutcome,
}

impl<'de> Deserialize<'de> for SendNotice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(SendNoticeVisitor)
    }
}

/// The fields of a [`SendOutcome`] variant with named fields, as they travel.
#[derive(Deserialize)]
struct ReadFields {
    conv: String,
    read_seq: u64,
}

#[derive(Deserialize)]
struct ErrFields {
    code: ErrorCode,
    message: String,
}

/// A notice's fields in one pass: `rid`, `echo`, and the outcome under its variant's
/// name (`ok`, `read`, `timeline` or `err`), as the derived form wrote them; other
/// fields are skipped, as the derived form did.
struct SendNoticeVisitor;

impl<'de> serde::de::Visitor<'de> for SendNoticeVisitor {
    type Value = SendNotice;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a send notice: rid, echo and one of ok, read, timeline, err")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<SendNotice, A::Error> {
        use serde::de::Error;
        let (mut rid, mut echo, mut outcome) = (None, None, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let read = match key.as_ref() {
                "rid" => {
                    rid = Some(map.next_value()?);
                    continue;
                }
                "echo" => {
                    echo = map.next_value()?;
                    continue;
                }
                "ok" => SendOutcome::Ok(map.next_value()?),
                "read" => {
                    let r: ReadFields = map.next_value()?;
                    SendOutcome::Read { conv: r.conv, read_seq: r.read_seq }
                }
                "timeline" => SendOutcome::Timeline(map.next_value()?),
                "err" => {
                    let e: ErrFields = map.next_value()?;
                    SendOutcome::Err { code: e.code, message: e.message }
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    continue;
                }
            };
            if outcome.replace(read).is_some() {
                return Err(A::Error::custom("a send notice has one outcome"));
            }
        }
        Ok(SendNotice {
            rid: rid.ok_or_else(|| A::Error::missing_field("rid"))?,
            echo,
            outcome: outcome.ok_or_else(|| A::Error::custom("a send notice needs one of ok, read, timeline, err"))?,
        })
    }
}

/// The request a notice answers: its tenant, sender, conversation and (for a send)
/// `cmid`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Echo {
    pub tenant: String,
    pub user: String,
    pub conv: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmid: Option<String>,
}

impl IngressEntry {
    pub fn echo(&self) -> Echo {
        Echo {
            tenant: self.tenant.clone(),
            user: self.user.clone(),
            conv: self.conv.clone(),
            cmid: Some(self.cmid.clone()),
        }
    }
}

impl ReadEntry {
    pub fn echo(&self) -> Echo {
        Echo { tenant: self.tenant.clone(), user: self.user.clone(), conv: self.conv.clone(), cmid: None }
    }
}

/// A node's answers as a worker writes them, borrowed from its batch: the same JSON as
/// a [`NodeEnvelope`] with only `sent`, and read back as one.
#[derive(Debug, Default, Serialize)]
pub struct NoticesOut<'a> {
    pub sent: Vec<SendNoticeOut<'a>>,
}

/// A [`SendNotice`] borrowed: its request's echo and its answer.
#[derive(Debug, Serialize)]
pub struct SendNoticeOut<'a> {
    pub rid: u64,
    pub echo: EchoOut<'a>,
    #[serde(flatten)]
    pub outcome: OutcomeOut<'a>,
}

/// An [`Echo`] borrowed.
#[derive(Debug, Serialize)]
pub struct EchoOut<'a> {
    pub tenant: &'a str,
    pub user: &'a str,
    pub conv: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmid: Option<&'a str>,
}

/// The answers of [`SendOutcome`] a commit gives (`ok`, `err`), borrowed.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeOut<'a> {
    Ok(&'a SendResult),
    Err { code: ErrorCode, message: &'a str },
}

impl IngressEntry {
    /// The echo of this send, borrowed.
    pub fn echo_out(&self) -> EchoOut<'_> {
        EchoOut { tenant: &self.tenant, user: &self.user, conv: &self.conv, cmid: Some(&self.cmid) }
    }
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
    /// A timeline change committed: its events (none when it changed nothing), or, for
    /// a repeat of its idempotency key, those of its first commit (`dup: true`).
    Timeline(Vec<SendResult>),
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
    pub to: Vec<DeviceKey>,
}

/// A sender's delivery status pushed to its devices on one node (sessions that opted
/// in show it, at most one per conversation per `delivery.status_interval_ms`).
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct StatusPush {
    pub status: DeliveryStatus,
    pub to: Vec<DeviceKey>,
}

/// A typing indicator relayed to a set of devices on one node by the gateway that got
/// it (never stored; sessions that did not ask for `typing` drop it).
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct TypingPush {
    pub frame: TypingShown,
    pub to: Vec<DeviceKey>,
}

/// A user came online or went offline, announced on the cluster's presence channel to
/// every gateway; each shows it to its sessions that follow the user.
#[derive(Debug, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct PresenceChange {
    pub tenant: String,
    pub state: PresenceState,
}

/// One message pushed to a set of devices on one node.
#[derive(Debug, Serialize, Deserialize)]
pub struct Delivery {
    pub id: MsgId,
    pub frame: Box<RawValue>,
    /// (tenant, user, device) of every recipient device on the node.
    pub to: Vec<DeviceKey>,
}

/// A node's deliveries as a worker writes them, borrowed from its fan-out: the same
/// JSON as a [`NodeEnvelope`] with only `deliver`, and read back as one. Recipients
/// are (tenant, user, device), as a [`DeviceKey`] travels.
#[derive(Debug, Default, Serialize)]
pub struct DeliveriesOut<'a> {
    pub deliver: Vec<DeliveryOut<'a>>,
}

/// One message for a set of devices on one node, borrowed ([`Delivery`] when read).
#[derive(Debug, Serialize)]
pub struct DeliveryOut<'a> {
    pub id: MsgId,
    pub frame: &'a RawValue,
    pub to: Vec<(&'a str, &'a str, &'a str)>,
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
    /// Absent from workers older than delivery status; ignored by older gateways.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status: Vec<StatusPush>,
    /// Typing indicators, from gateways; ignored by gateways older than them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub typing: Vec<TypingPush>,
    /// Presence changes, on the presence channel only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub presence: Vec<PresenceChange>,
    /// Devices that logged out, on the presence channel only: every gateway forgets
    /// them, so their next request registers them again. Ignored by older gateways.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logouts: Vec<crate::keys::DeviceKey>,
    /// Users' and devices' tokens revoked, on the presence channel only: every gateway
    /// closes the sessions of such tokens (4004). Ignored by older gateways.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revocations: Vec<Revocation>,
}

/// Tokens of a user (or of one of its devices) issued before `not_before` (seconds
/// since the Unix epoch) are refused, and their sessions closed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Revocation {
    pub tenant: String,
    pub user: String,
    /// Only this device's tokens; absent, all the user's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub not_before: u64,
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
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn notices_round_trip() {
        let n = SendNotice {
            rid: 4,
            echo: Some(Echo { tenant: "t".into(), user: "u".into(), conv: "c".into(), cmid: Some("m1".into()) }),
            outcome: SendOutcome::Err { code: ErrorCode::Forbidden, message: "not a member".into() },
        };
        let s = serde_json::to_string(&n).unwrap();
        assert_eq!(serde_json::from_str::<SendNotice>(&s).unwrap(), n);
        // A notice of an older worker, without its echo, still reads.
        let old: SendNotice = serde_json::from_str(r#"{"rid":4,"err":{"code":"internal","message":"x"}}"#).unwrap();
        assert_eq!(old.echo, None);
    }

    /// The hand-written reader takes what the derived (`flatten`) one took, and refuses
    /// what it refused.
    #[test]
    fn notices_read_by_hand_as_the_derived_form_read_them() {
        #[derive(Debug, Deserialize, PartialEq)]
        struct Derived {
            rid: u64,
            #[serde(default)]
            echo: Option<Echo>,
            #[serde(flatten)]
            outcome: SendOutcome,
        }
        let result = SendResult { id: MsgId(9), conv: "c".into(), seq: 3, ts: 5, dup: false };
        let echo = Some(Echo { tenant: "t".into(), user: "u\"1".into(), conv: "c".into(), cmid: None });
        for outcome in [
            SendOutcome::Ok(result.clone()),
            SendOutcome::Read { conv: "c".into(), read_seq: 7 },
            SendOutcome::Timeline(vec![result.clone(), SendResult { dup: true, ..result.clone() }]),
            SendOutcome::Timeline(vec![]),
            SendOutcome::Err { code: ErrorCode::Conflict, message: "cmid reused".into() },
        ] {
            let n = SendNotice { rid: 11, echo: echo.clone(), outcome };
            let s = serde_json::to_string(&n).unwrap();
            assert_eq!(serde_json::from_str::<SendNotice>(&s).unwrap(), n, "{s}");
        }
        let later_field = r#"{"later":{"x":[1,2]},"ok":{"id":"9","conv":"c","seq":3,"ts":5,"dup":false},"rid":2}"#;
        let derived: Derived = serde_json::from_str(later_field).unwrap();
        let by_hand: SendNotice = serde_json::from_str(later_field).unwrap();
        assert_eq!((by_hand.rid, by_hand.echo, by_hand.outcome), (derived.rid, derived.echo, derived.outcome));
        for refused in [
            r#"{"rid":2}"#,
            r#"{"ok":{"id":"9","conv":"c","seq":3,"ts":5,"dup":false}}"#,
            r#"{"rid":2,"read":{"conv":"c"}}"#,
            r#"{"rid":"2","err":{"code":"internal","message":"x"}}"#,
            r#"[2]"#,
        ] {
            assert!(serde_json::from_str::<Derived>(refused).is_err(), "the derived form took {refused}");
            assert!(serde_json::from_str::<SendNotice>(refused).is_err(), "took {refused}");
        }
        let two = r#"{"rid":2,"ok":{"id":"9","conv":"c","seq":3,"ts":5,"dup":false},"err":{"code":"internal","message":"x"}}"#;
        assert!(serde_json::from_str::<SendNotice>(two).is_err(), "two outcomes");
    }

    #[test]
    fn delivered_entries_round_trip_and_unknown_kinds_are_refused() {
        let e = DeliveredEntry { tenant: "t".into(), user: "u".into(), conv: "c".into(), seq: 9 };
        let fields: std::collections::HashMap<String, String> =
            e.to_fields().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        assert_eq!(IngressRequest::from_fields(&fields), Some(IngressRequest::Delivered(vec![e.clone()])));
        let f = DeliveredEntry { tenant: "t2".into(), user: "u \"2\"".into(), conv: "g".into(), seq: 3 };
        let batch: std::collections::HashMap<String, String> =
            DeliveredEntry::batch_to_fields(&[e, f.clone()]).into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        let Some(IngressRequest::Delivered(read)) = IngressRequest::from_fields(&batch) else { panic!("{batch:?}") };
        assert_eq!(read[1], f);
        let mut broken = batch.clone();
        broken.insert("p".into(), "[[\"t\", \"u\", \"c\"]]".into());
        assert_eq!(IngressRequest::from_fields(&broken), None, "a row without its seq");
        broken.insert("p".into(), "[]".into());
        assert_eq!(IngressRequest::from_fields(&broken), None, "an empty batch");
        let mut other = fields.clone();
        other.insert("k".into(), "later".into());
        assert_eq!(IngressRequest::from_fields(&other), None);
    }

    #[test]
    fn borrowed_answers_read_back_as_the_notices_they_stand_for() {
        let entry = IngressEntry {
            tenant: "t".into(),
            user: "u".into(),
            device: "d".into(),
            cmid: "m\"1".into(),
            conv: "c".into(),
            body: "{}".into(),
            node: "n".into(),
            rid: 4,
            trace: None,
        };
        let result = SendResult { id: MsgId(9), conv: "c".into(), seq: 3, ts: 5, dup: true };
        let out = NoticesOut {
            sent: vec![
                SendNoticeOut { rid: 4, echo: entry.echo_out(), outcome: OutcomeOut::Ok(&result) },
                SendNoticeOut {
                    rid: 5,
                    echo: entry.echo_out(),
                    outcome: OutcomeOut::Err { code: ErrorCode::Forbidden, message: "not a member" },
                },
            ],
        };
        let back: NodeEnvelope = serde_json::from_str(&serde_json::to_string(&out).unwrap()).unwrap();
        let owned = |rid, outcome| SendNotice { rid, echo: Some(entry.echo()), outcome };
        assert_eq!(
            back.sent,
            vec![
                owned(4, SendOutcome::Ok(result.clone())),
                owned(5, SendOutcome::Err { code: ErrorCode::Forbidden, message: "not a member".into() }),
            ]
        );
        assert!(back.deliver.is_empty());
    }

    #[test]
    fn borrowed_deliveries_read_back_as_an_envelope() {
        let frame = RawValue::from_string(r#"{"type":"msg","body":{"t":"a\"b"}}"#.into()).unwrap();
        let out = DeliveriesOut {
            deliver: vec![DeliveryOut { id: MsgId(7), frame: &frame, to: vec![("t", "u", "d1"), ("t", "u", "d2")] }],
        };
        let back: NodeEnvelope = serde_json::from_str(&serde_json::to_string(&out).unwrap()).unwrap();
        assert_eq!(back.deliver.len(), 1);
        assert_eq!(back.deliver[0].id, MsgId(7));
        assert_eq!(back.deliver[0].frame.get(), frame.get());
        assert_eq!(back.deliver[0].to, vec![DeviceKey::new("t", "u", "d1"), DeviceKey::new("t", "u", "d2")]);
        assert!(back.sent.is_empty() && back.reads.is_empty() && back.status.is_empty());
    }

    #[test]
    fn device_keys_travel_as_three_strings() {
        let env = NodeEnvelope {
            kick: vec![Kick { tenant: "t".into(), user: "u".into(), device: "d".into(), session: "s".into() }],
            reads: vec![ReadPush {
                conv: "c".into(),
                user: "u".into(),
                seq: 1,
                to: vec![DeviceKey::new("t", "u", "d")],
            }],
            ..Default::default()
        };
        let s = serde_json::to_string(&env).unwrap();
        assert!(s.contains(r#""to":[["t","u","d"]]"#), "{s}");
        let back: NodeEnvelope = serde_json::from_str(&s).unwrap();
        assert_eq!(back.reads[0].to, vec![DeviceKey::new("t", "u", "d")]);
    }
}
