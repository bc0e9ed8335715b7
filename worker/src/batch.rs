//! What a committed batch hands on: the messages with what fan-out needs, and the
//! member devices they go to. Shared by the commit pipeline, the fan-out and the
//! outbox, so none of them imports another for its types.

use herald_shared::ids::{now_ms, MsgId};
use herald_shared::otel::TraceParent;
use herald_shared::protocol::{msg_frame_raw, Message, TimelineEvent};
use herald_shared::sql_script::by_tenant;
use serde_json::value::RawValue;
use sqlx::{MySql, QueryBuilder};

/// A message committed by this batch, with what fan-out needs.
#[derive(Clone, Debug)]
pub struct Committed {
    pub id: MsgId,
    pub tenant: String,
    pub conv: String,
    pub seq: u64,
    pub sender: String,
    pub sender_device: String,
    pub cmid: String,
    pub ts: u64,
    pub body: String,
    /// A timeline event (docs/protocol.md section 4.11); `None` for a message.
    pub event: Option<TimelineEvent>,
    /// The message's latest span on this worker (its commit's, then its fan-out's),
    /// when its send is traced: the parent of the next.
    pub trace: Option<TraceParent>,
}

impl Committed {
    /// The `msg` frame, serialized once for every recipient; `None` when the stored
    /// body is not JSON.
    pub fn frame(&self) -> Option<Box<RawValue>> {
        Some(msg_frame_raw(Message {
            id: self.id,
            conv: self.conv.clone(),
            seq: self.seq,
            from: self.sender.clone(),
            cmid: self.cmid.clone(),
            ts: self.ts,
            body: RawValue::from_string(self.body.clone()).ok()?,
            status: None,
            event: self.event.clone(),
            edited_seq: None,
            recalled_seq: None,
        }))
    }

    /// A message (not an event) is not pushed back to the device that sent it, which
    /// has its `sent`; an event reaches every device, its actor's too.
    pub fn skips(&self, user: &str, device: &str) -> bool {
        self.event.is_none() && user == self.sender && device == self.sender_device
    }
}

/// One device of one member of a conversation.
#[derive(Clone, Debug)]
pub struct Recipient {
    pub tenant: String,
    pub conv: String,
    pub user: String,
    pub joined_seq: u64,
    pub left_seq: Option<u64>,
    pub device: String,
    /// The device has a push token (offline push hands its unacked messages on).
    pub push: bool,
}

/// A message for a device with a push token, handed from the fan-out to the push
/// scheduler, which waits `push.delay_ms` for its ack.
#[derive(Clone, Debug)]
pub struct PushCandidate {
    pub tenant: String,
    pub user: String,
    pub device: String,
    pub conv: String,
    pub id: MsgId,
    pub sender: String,
    /// The message's fan-out span, when its send is traced.
    pub trace: Option<TraceParent>,
}

impl Recipient {
    /// A member receives what was sent after it joined and, once removed, nothing after.
    pub fn receives(&self, seq: u64) -> bool {
        self.joined_seq < seq && self.left_seq.is_none_or(|l| seq <= l)
    }
}

/// The `last_seen_at` from which a device is a recipient (its TTL ago): devices unseen
/// longer stop costing a pending entry per message.
pub fn live_since(device_ttl_ms: u64) -> i64 {
    now_ms().saturating_sub(device_ttl_ms) as i64
}

/// `(<tenant_col> = ? AND <col> IN (?, ...)) OR ...`, one term per tenant; `pairs` is
/// not empty.
///
/// Two forms were measured and refused. `(a = ? AND b = ?) OR ...`: past ~150 pairs
/// MariaDB reads it through the key's tenant prefix, so a locking read then waits on
/// every row of the tenant that another transaction holds. `(a, b) IN ((?, ?), ...)`
/// stays point lookups but its range analysis grows with the square of the pairs
/// (300 pairs: 174 ms per lock-and-members transaction against 8 ms in this form), which
/// was the largest part of MariaDB's CPU per message under load. A list per tenant is
/// sorted once and stays point lookups (`herald_shared::sql_script::by_tenant`, the
/// form the commit scripts write too).
pub fn push_pairs(q: &mut QueryBuilder<'_, MySql>, tenant_col: &str, col: &str, pairs: &[(&str, &str)]) {
    q.push("(");
    for (n, (tenant, ids)) in by_tenant(pairs).into_iter().enumerate() {
        if n > 0 {
            q.push(" OR ");
        }
        q.push(format!("({tenant_col} = ")).push_bind(tenant.to_string()).push(format!(" AND {col} IN ("));
        let mut sep = q.separated(", ");
        for id in ids {
            sep.push_bind(id.to_string());
        }
        q.push("))");
    }
    q.push(")");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_receives_what_was_sent_while_it_was_a_member() {
        let r = |joined_seq, left_seq| Recipient {
            tenant: "t".into(),
            conv: "c".into(),
            user: "u".into(),
            joined_seq,
            left_seq,
            device: "d".into(),
            push: false,
        };
        assert!(!r(3, None).receives(3) && r(3, None).receives(4));
        assert!(r(3, Some(5)).receives(5) && !r(3, Some(5)).receives(6));
    }
}
