//! Sends packed into one ingress entry (`k=sends`). A gateway's ingress writer puts the
//! sends of one shard that arrived while its previous write was under way into one
//! stream entry, so a send costs a row of a JSON array, not a stream entry and a Redis
//! round trip of its own. The worker unpacks the entry into [`IngressEntry`]s, commits
//! them in the order of the rows, and acknowledges the entry once every send in it is
//! answered.
//!
//! Fields: `k=sends`, `node` (the gateway waiting for the answers) and `p`, a JSON array
//! of `[tenant, user, device, cmid, conv, rid, body]` rows, the body as its JSON text.
//! A worker older than packs would drop such an entry as malformed, so gateways pack
//! only while every live worker has said it reads them (`Keys::packing_workers`).
//!
//! A traced send's row has an 8th element, its `traceparent` (`crate::otel`); only
//! traced sends have it, so with tracing off (the default) every row has seven. Packs
//! and this element came in the same release, so every pack reader knows it; rows are
//! read with seven elements or more, ignoring what is not known past the eighth (a
//! later release's addition).

use std::fmt;

use serde::de::{self, IgnoredAny, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::node::IngressEntry;
use crate::otel::TraceParent;

/// The entry kind of a pack.
pub const KIND: &str = "sends";

/// Bytes a `traceparent` adds to a row, its quotes and comma included.
const TRACE_BYTES: usize = 58;

/// One send on its way into a pack; its body is the JSON text the gateway checked.
#[derive(Debug)]
pub struct PackedSend {
    pub tenant: String,
    pub user: String,
    pub device: String,
    pub cmid: String,
    pub conv: String,
    pub rid: u64,
    pub body: Box<RawValue>,
    /// The send's span, when it is traced.
    pub trace: Option<TraceParent>,
}

impl PackedSend {
    /// The send as an entry of its own (the format of every version).
    pub fn entry(&self, node: &str) -> IngressEntry {
        IngressEntry {
            tenant: self.tenant.clone(),
            user: self.user.clone(),
            device: self.device.clone(),
            cmid: self.cmid.clone(),
            conv: self.conv.clone(),
            body: self.body.get().to_owned(),
            node: node.to_owned(),
            rid: self.rid,
            trace: self.trace,
        }
    }

    /// Bytes the send takes in a pack, about.
    pub fn packed_bytes(&self) -> usize {
        self.tenant.len()
            + self.user.len()
            + self.device.len()
            + self.cmid.len()
            + self.conv.len()
            + self.body.get().len()
            + 48
            + if self.trace.is_some() { TRACE_BYTES } else { 0 }
    }
}

/// A send as its row: seven elements, and its `traceparent` as an 8th when traced.
struct WriteRow<'a>(&'a PackedSend);

impl Serialize for WriteRow<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let p = self.0;
        let mut row = s.serialize_seq(Some(if p.trace.is_some() { 8 } else { 7 }))?;
        row.serialize_element(&p.tenant)?;
        row.serialize_element(&p.user)?;
        row.serialize_element(&p.device)?;
        row.serialize_element(&p.cmid)?;
        row.serialize_element(&p.conv)?;
        row.serialize_element(&p.rid)?;
        row.serialize_element(&*p.body)?;
        if let Some(trace) = &p.trace {
            row.serialize_element(&trace.to_string())?;
        }
        row.end()
    }
}

/// A row as read: its seven elements, the 8th when it is a `traceparent` (anything else
/// there, or after it, is ignored: a later version's addition).
struct ReadRow {
    tenant: String,
    user: String,
    device: String,
    cmid: String,
    conv: String,
    rid: u64,
    body: Box<RawValue>,
    trace: Option<TraceParent>,
}

impl<'de> Deserialize<'de> for ReadRow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(RowVisitor)
    }
}

struct RowVisitor;

impl<'de> Visitor<'de> for RowVisitor {
    type Value = ReadRow;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a row [tenant, user, device, cmid, conv, rid, body] and optional later elements")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ReadRow, A::Error> {
        fn required<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(seq: &mut A, at: usize) -> Result<T, A::Error> {
            seq.next_element()?.ok_or_else(|| de::Error::invalid_length(at, &RowVisitor))
        }
        let row = ReadRow {
            tenant: required(&mut seq, 0)?,
            user: required(&mut seq, 1)?,
            device: required(&mut seq, 2)?,
            cmid: required(&mut seq, 3)?,
            conv: required(&mut seq, 4)?,
            rid: required(&mut seq, 5)?,
            body: required(&mut seq, 6)?,
            trace: seq
                .next_element::<serde_json::Value>()?
                .as_ref()
                .and_then(|v| v.as_str())
                .and_then(TraceParent::parse),
        };
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(row)
    }
}

/// The fields of one pack entry.
pub fn to_fields(node: &str, sends: &[PackedSend]) -> Vec<(&'static str, String)> {
    let rows: Vec<WriteRow> = sends.iter().map(WriteRow).collect();
    vec![("k", KIND.into()), ("node", node.to_owned()), ("p", serde_json::to_string(&rows).expect("sends serialize"))]
}

/// The sends of a pack entry, in their order; `None` when it is malformed or empty.
pub(super) fn from_fields(f: &std::collections::HashMap<String, String>) -> Option<Vec<IngressEntry>> {
    let node = f.get("node")?;
    let rows: Vec<ReadRow> = serde_json::from_str(f.get("p")?).ok()?;
    let entries: Vec<IngressEntry> = rows
        .into_iter()
        .map(|r| IngressEntry {
            tenant: r.tenant,
            user: r.user,
            device: r.device,
            cmid: r.cmid,
            conv: r.conv,
            body: Box::<str>::from(r.body).into_string(),
            node: node.clone(),
            rid: r.rid,
            trace: r.trace,
        })
        .collect();
    (!entries.is_empty()).then_some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::IngressRequest;
    use std::collections::HashMap;

    fn send(cmid: &str, body: &str) -> PackedSend {
        PackedSend {
            tenant: "t".into(),
            user: "u \"1\"".into(),
            device: "d".into(),
            cmid: cmid.into(),
            conv: "c".into(),
            rid: 7,
            body: RawValue::from_string(body.into()).unwrap(),
            trace: None,
        }
    }

    fn fields(v: Vec<(&'static str, String)>) -> HashMap<String, String> {
        v.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    #[test]
    fn a_pack_unpacks_into_its_sends_in_order_with_their_bodies_verbatim() {
        let sends = [send("m1", r#"{"text":"héllo \"x\"","n":[1, 2]}"#), send("m2", "\"plain\"")];
        let f = fields(to_fields("gw-1", &sends));
        let Some(IngressRequest::Sends(read)) = IngressRequest::from_fields(&f) else { panic!("{f:?}") };
        assert_eq!(read, vec![sends[0].entry("gw-1"), sends[1].entry("gw-1")]);
        assert_eq!(read[0].body, r#"{"text":"héllo \"x\"","n":[1, 2]}"#, "the body's text is kept byte for byte");
    }

    #[test]
    fn malformed_and_empty_packs_are_refused() {
        let good = fields(to_fields("gw-1", &[send("m1", "1")]));
        let mut broken = good.clone();
        broken.insert("p".into(), r#"[["t","u","d","m","c",1]]"#.into());
        assert_eq!(IngressRequest::from_fields(&broken), None, "a row without its body");
        broken.insert("p".into(), "[]".into());
        assert_eq!(IngressRequest::from_fields(&broken), None, "an empty pack");
        let mut nodeless = good;
        nodeless.remove("node");
        assert_eq!(IngressRequest::from_fields(&nodeless), None);
    }

    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traced_send_carries_its_context_in_an_eighth_element_and_others_keep_seven() {
        let traced = PackedSend { trace: TraceParent::parse(TRACE), ..send("m1", r#"{"text":"hi"}"#) };
        let sends = [traced, send("m2", "2")];
        let f = fields(to_fields("gw-1", &sends));
        let rows: Vec<Vec<serde_json::Value>> = serde_json::from_str(&f["p"]).unwrap();
        assert_eq!((rows[0].len(), rows[1].len()), (8, 7));
        assert_eq!(rows[0][7], TRACE);
        let Some(IngressRequest::Sends(read)) = IngressRequest::from_fields(&f) else { panic!("{f:?}") };
        assert_eq!(read[0].trace, TraceParent::parse(TRACE));
        assert_eq!(read[1].trace, None);
        assert_eq!(read, vec![sends[0].entry("gw-1"), sends[1].entry("gw-1")]);
    }

    /// A later version may add elements: they are ignored, as an 8th that is no
    /// `traceparent` is (the send is then untraced, never refused).
    #[test]
    fn rows_longer_than_seven_are_read_and_what_is_unknown_ignored() {
        let mut f = fields(to_fields("gw-1", &[send("m1", "1")]));
        for (p, trace) in [
            (format!(r#"[["t","u","d","m1","c",7,1,"{TRACE}",{{"later":true}},3]]"#), TraceParent::parse(TRACE)),
            (r#"[["t","u","d","m1","c",7,1,null]]"#.to_owned(), None),
            (r#"[["t","u","d","m1","c",7,1,"not-a-traceparent"]]"#.to_owned(), None),
            (r#"[["t","u","d","m1","c",7,1,42]]"#.to_owned(), None),
        ] {
            f.insert("p".into(), p.clone());
            let Some(IngressRequest::Sends(read)) = IngressRequest::from_fields(&f) else { panic!("{p}") };
            assert_eq!((read[0].cmid.as_str(), read[0].body.as_str(), read[0].trace), ("m1", "1", trace), "{p}");
        }
    }

    #[test]
    fn a_lone_send_carries_its_context_in_a_field_older_workers_ignore() {
        let traced = PackedSend { trace: TraceParent::parse(TRACE), ..send("m1", "1") };
        let mut f = fields(traced.entry("gw-1").to_fields());
        assert_eq!(f["tp"], TRACE);
        let Some(IngressRequest::Send(read)) = IngressRequest::from_fields(&f) else { panic!("{f:?}") };
        assert_eq!(read.trace, TraceParent::parse(TRACE));
        f.insert("tp".into(), "garbage".into());
        let Some(IngressRequest::Send(read)) = IngressRequest::from_fields(&f) else { panic!("{f:?}") };
        assert_eq!(read.trace, None, "an unreadable context leaves the send untraced");
        assert!(!fields(send("m1", "1").entry("gw").to_fields()).contains_key("tp"));
    }
}
