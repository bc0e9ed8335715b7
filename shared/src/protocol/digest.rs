//! Request digests: what a client key (`cmid`) was used for, as 64 bits stored beside
//! the row it made (`messages.op_digest`). A repeat with the same key is answered with
//! the first commit only when its digest is the same; otherwise it is a `conflict`
//! (docs/protocol.md section 4.2). FNV-1a: stable across processes, versions and
//! platforms; a collision only ever lets a caller's own reuse of its own key through.

use super::node::IngressEntry;
use super::timeline::{TimelineEntry, TimelineOp};

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// The FNV-1a digest of `parts`, each followed by a 0xff byte (never in UTF-8 text), so
/// no two lists of parts share their bytes.
pub fn digest(parts: &[&str]) -> u64 {
    let mut h = OFFSET;
    for p in parts {
        for b in p.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

impl IngressEntry {
    /// What this send asks for: its conversation and body.
    pub fn digest(&self) -> u64 {
        digest(&["send", &self.conv, &self.body])
    }
}

impl TimelineEntry {
    /// What this change asks for: its conversation and operation, with the target and
    /// body of a recall or edit.
    pub fn digest(&self) -> u64 {
        let op = match &self.op {
            TimelineOp::Recall { target } => digest(&["recall", &target.to_string()]),
            TimelineOp::Edit { target, body } => digest(&["edit", &target.to_string(), body]),
            other => digest(&[&serde_json::to_string(other).expect("ops serialize")]),
        };
        digest(&["change", &self.conv, &op.to_string()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MsgId;

    #[test]
    fn the_digest_is_fnv1a_with_separators() {
        // FNV-1a of the single byte 0xff, and of "a" then 0xff: fixed forever, since
        // digests are stored.
        assert_eq!(digest(&[""]), 0xaf64_724c_8602_eb6e);
        assert_ne!(digest(&["ab", "c"]), digest(&["a", "bc"]), "parts are separated");
        assert_ne!(digest(&["a"]), digest(&["a", ""]));
    }

    #[test]
    fn changes_differ_by_operation_target_and_body() {
        let change = |op| TimelineEntry {
            tenant: "t".into(),
            user: "u".into(),
            device: "d".into(),
            cmid: "k".into(),
            conv: "c".into(),
            by_service: false,
            op,
            node: "gw".into(),
            rid: 1,
        };
        let edit = |t, b: &str| change(TimelineOp::Edit { target: MsgId(t), body: b.into() });
        let recall = change(TimelineOp::Recall { target: MsgId(1) });
        assert_eq!(edit(1, "{}").digest(), edit(1, "{}").digest());
        assert_ne!(edit(1, "{}").digest(), edit(2, "{}").digest(), "another target");
        assert_ne!(edit(1, "{}").digest(), edit(1, "1").digest(), "another body");
        assert_ne!(edit(1, "null").digest(), recall.digest(), "another operation");
        let send = |conv: &str, body: &str| IngressEntry {
            tenant: "t".into(),
            user: "u".into(),
            device: "d".into(),
            cmid: "k".into(),
            conv: conv.into(),
            body: body.into(),
            node: "gw".into(),
            rid: 1,
            trace: None,
        };
        assert_eq!(send("c", "1").digest(), send("c", "1").digest());
        assert_ne!(send("c", "1").digest(), send("c", "2").digest());
        assert_ne!(send("c", "1").digest(), send("d", "1").digest());
    }
}
