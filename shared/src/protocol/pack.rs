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

use serde_json::value::RawValue;

use super::node::IngressEntry;

/// The entry kind of a pack.
pub const KIND: &str = "sends";

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
}

type Row<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str, u64, &'a RawValue);
type OwnedRow = (String, String, String, String, String, u64, Box<RawValue>);

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
    }
}

/// The fields of one pack entry.
pub fn to_fields(node: &str, sends: &[PackedSend]) -> Vec<(&'static str, String)> {
    let rows: Vec<Row> = sends
        .iter()
        .map(|s| {
            (s.tenant.as_str(), s.user.as_str(), s.device.as_str(), s.cmid.as_str(), s.conv.as_str(), s.rid, &*s.body)
        })
        .collect();
    vec![("k", KIND.into()), ("node", node.to_owned()), ("p", serde_json::to_string(&rows).expect("sends serialize"))]
}

/// The sends of a pack entry, in their order; `None` when it is malformed or empty.
pub(super) fn from_fields(f: &std::collections::HashMap<String, String>) -> Option<Vec<IngressEntry>> {
    let node = f.get("node")?;
    let rows: Vec<OwnedRow> = serde_json::from_str(f.get("p")?).ok()?;
    let entries: Vec<IngressEntry> = rows
        .into_iter()
        .map(|(tenant, user, device, cmid, conv, rid, body)| IngressEntry {
            tenant,
            user,
            device,
            cmid,
            conv,
            body: Box::<str>::from(body).into_string(),
            node: node.clone(),
            rid,
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
}
