//! The fan-out's reads from MySQL: committed messages read back for the outbox, and
//! the member devices they go to.

use herald_shared::db::TextColumns;
use herald_shared::ids::MsgId;
use herald_shared::protocol::TimelineEvent;
use sqlx::{MySql, QueryBuilder, Row};

use super::Fanout;
use crate::batch::{live_since, push_pairs, Committed, Recipient};

impl Fanout {
    /// Reads committed messages back from MySQL (for the outbox dispatcher).
    pub async fn load(&self, ids: &[MsgId]) -> Result<Vec<Committed>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at, event FROM messages WHERE id IN (",
        );
        let mut sep = q.separated(", ");
        for id in ids {
            sep.push_bind(id.0);
        }
        q.push(") ORDER BY id");
        let rows = q.build().fetch_all(&self.db).await?;
        rows.iter()
            .map(|r| {
                Ok(Committed {
                    id: MsgId(r.try_get::<u64, _>(0)?),
                    tenant: r.text(1)?,
                    conv: r.text(2)?,
                    seq: r.try_get(3)?,
                    sender: r.text(4)?,
                    sender_device: r.text(5)?,
                    cmid: r.text(6)?,
                    body: r.text(7)?,
                    ts: r.try_get::<i64, _>(8)? as u64,
                    event: r.opt_text(9)?.map(|e| serde_json::from_str(&e).unwrap_or(TimelineEvent::Unknown)),
                    trace: None,
                })
            })
            .collect()
    }

    /// Every member device of the conversations of `msgs`, with the member's range.
    pub(super) async fn recipients(&self, msgs: &[Committed]) -> Result<Vec<Recipient>, sqlx::Error> {
        let mut pairs: Vec<(&str, &str)> = msgs.iter().map(|m| (m.tenant.as_str(), m.conv.as_str())).collect();
        pairs.sort();
        pairs.dedup();
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT m.tenant_id, m.conv_id, m.user_id, m.joined_seq, m.left_seq, d.device_id, d.push_token IS NOT NULL FROM members m \
             JOIN devices d ON d.tenant_id = m.tenant_id AND d.user_id = m.user_id \
             AND d.expired_at IS NULL AND d.last_seen_at >= ",
        );
        q.push_bind(live_since(self.device_ttl_ms)).push(" WHERE ");
        push_pairs(&mut q, "m.tenant_id", "m.conv_id", &pairs);
        let rows = q.build().fetch_all(&self.db).await?;
        rows.iter()
            .map(|r| {
                Ok(Recipient {
                    tenant: r.text(0)?,
                    conv: r.text(1)?,
                    user: r.text(2)?,
                    joined_seq: r.try_get(3)?,
                    left_seq: r.try_get(4)?,
                    device: r.text(5)?,
                    push: r.try_get::<i64, _>(6)? == 1,
                })
            })
            .collect()
    }
}
