//! Delivered positions and the senders' delivery status (docs/architecture.md section
//! 4, "Delivery status").
//!
//! Gateways write a member's delivered position (the highest `seq` a device of the user
//! acked) into the conversation's ingress stream, coalesced per flush. A batch of them
//! is applied in one transaction (a position only moves forward); then, per
//! conversation whose positions moved, the senders of the messages the move covered
//! are told how far their latest such message got: one read of the members, counted in
//! memory, and one `delivered` push per sender to the nodes holding its devices. The
//! work is per batch and conversation, not per ack or per recipient.

use std::collections::{BTreeMap, HashMap};

use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::keys::{DeviceKey, Keys, PresenceValue};
use herald_shared::protocol::{ConversationKind, DeliveredEntry, DeliveryStatus, NodeEnvelope, StatusPush};
use sqlx::mysql::MySqlPool;
use sqlx::Row;

/// A move covers at most this many messages below its new position for the senders it
/// tells: a member back after a long absence does not make one batch read a long range
/// of messages (the senders of older ones see the status in history).
const STATUS_WINDOW: u64 = 1_000;

#[derive(Debug, thiserror::Error)]
enum StatusError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
}

#[derive(Debug)]
pub struct DeliveredPositions {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
}

/// The positions of one conversation that moved in a batch: from the lowest old one to
/// the highest new one.
#[derive(Debug, Default)]
struct Moved {
    from: u64,
    to: u64,
}

/// A member's membership range and position (delivered or read, whichever is higher).
struct Member {
    user: String,
    joined_seq: u64,
    left_seq: Option<u64>,
    has: u64,
}

/// How many members other than `sender` that received `seq` have it.
fn count(members: &[Member], sender: &str, seq: u64) -> u64 {
    members
        .iter()
        .filter(|m| m.user != sender && m.joined_seq < seq && m.left_seq.is_none_or(|l| seq <= l) && m.has >= seq)
        .count() as u64
}

impl DeliveredPositions {
    /// Moves the positions of `entries` forward in one transaction, then tells the
    /// senders. Only a MySQL failure of the transaction is an error (retried by the
    /// caller); a status that could not be pushed is counted and left to history.
    pub async fn apply(&self, entries: &[DeliveredEntry]) -> Result<(), sqlx::Error> {
        // One entry per member (the highest), locked in key order.
        let mut highest: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
        for e in entries {
            let seq = highest.entry((e.tenant.as_str(), e.conv.as_str(), e.user.as_str())).or_default();
            *seq = (*seq).max(e.seq);
        }
        let mut moved: BTreeMap<(&str, &str), Moved> = BTreeMap::new();
        let mut tx = self.db.begin().await?;
        for (&(tenant, conv, user), &seq) in &highest {
            let old: Option<u64> = sqlx::query_scalar(
                "SELECT delivered_seq FROM members WHERE tenant_id = ? AND conv_id = ? AND user_id = ? FOR UPDATE",
            )
            .bind(tenant)
            .bind(conv)
            .bind(user)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(old) = old.filter(|old| *old < seq) else { continue };
            sqlx::query("UPDATE members SET delivered_seq = ? WHERE tenant_id = ? AND conv_id = ? AND user_id = ?")
                .bind(seq)
                .bind(tenant)
                .bind(conv)
                .bind(user)
                .execute(&mut *tx)
                .await?;
            let m = moved.entry((tenant, conv)).or_insert(Moved { from: old, to: seq });
            (m.from, m.to) = (m.from.min(old), m.to.max(seq));
        }
        tx.commit().await?;
        metrics::counter!("herald_delivered_positions_total").increment(moved.len() as u64);
        for ((tenant, conv), m) in moved {
            if let Err(e) = self.tell_senders(tenant, conv, &m).await {
                metrics::counter!("herald_status_errors_total").increment(1);
                tracing::warn!(error = %e, "delivery status could not be pushed");
            }
        }
        Ok(())
    }

    async fn tell_senders(&self, tenant: &str, conv: &str, m: &Moved) -> Result<(), StatusError> {
        let from = m.from.max(m.to.saturating_sub(STATUS_WINDOW));
        let senders = sqlx::query(
            "SELECT sender_id, MAX(seq) FROM messages WHERE tenant_id = ? AND conv_id = ? AND seq > ? AND seq <= ? \
             GROUP BY sender_id",
        )
        .bind(tenant)
        .bind(conv)
        .bind(from)
        .bind(m.to)
        .fetch_all(&self.db)
        .await?;
        if senders.is_empty() {
            return Ok(());
        }
        let kind = sqlx::query("SELECT kind FROM conversations WHERE tenant_id = ? AND id = ?")
            .bind(tenant)
            .bind(conv)
            .fetch_optional(&self.db)
            .await?
            .map(|r| r.text(0))
            .transpose()?;
        let direct = kind.as_deref().and_then(ConversationKind::parse) == Some(ConversationKind::Direct);
        let rows = sqlx::query(
            "SELECT user_id, joined_seq, left_seq, GREATEST(delivered_seq, read_seq) FROM members \
             WHERE tenant_id = ? AND conv_id = ?",
        )
        .bind(tenant)
        .bind(conv)
        .fetch_all(&self.db)
        .await?;
        let members = rows
            .iter()
            .map(|r| {
                Ok(Member { user: r.text(0)?, joined_seq: r.try_get(1)?, left_seq: r.try_get(2)?, has: r.try_get(3)? })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        let mut statuses = Vec::with_capacity(senders.len());
        for r in &senders {
            let (sender, seq): (String, u64) = (r.text(0)?, r.try_get(1)?);
            let other = members.iter().find(|m| m.user != sender).filter(|_| direct).map(|m| m.user.clone());
            let count = count(&members, &sender, seq);
            statuses.push((sender, DeliveryStatus { conv: conv.to_owned(), seq, count, user: other }));
        }
        // Where each sender's devices are connected: one read of its presence.
        let pipe = self.redis.next().pipeline();
        for (sender, _) in &statuses {
            let _: () = pipe.hgetall(self.keys.presence(tenant, sender)).await?;
        }
        let presences: Vec<HashMap<String, String>> = pipe.all().await?;
        let mut by_node: BTreeMap<String, NodeEnvelope> = BTreeMap::new();
        for ((sender, status), presence) in statuses.into_iter().zip(presences) {
            for (device, value) in presence {
                let Some(PresenceValue { node, .. }) = PresenceValue::parse(&value) else { continue };
                let env = by_node.entry(node).or_default();
                let key = DeviceKey::new(tenant, sender.as_str(), device);
                match env.status.iter_mut().find(|p| p.status == status) {
                    Some(p) => p.to.push(key),
                    None => env.status.push(StatusPush { status: status.clone(), to: vec![key] }),
                }
            }
        }
        for (node, env) in by_node {
            let pushes = env.status.len() as u64;
            let payload = serde_json::to_string(&env).expect("envelope serializes");
            herald_shared::redis::publish_to_node(self.redis.next(), self.keys.node_channel(&node), payload).await?;
            metrics::counter!("herald_status_pushes_total").increment(pushes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_counts_the_other_members_that_received_its_message_and_have_it() {
        let m = |user: &str, joined, left, has| Member { user: user.into(), joined_seq: joined, left_seq: left, has };
        let members = [m("alice", 0, None, 9), m("bob", 0, None, 4), m("carol", 4, None, 9), m("dave", 0, Some(3), 9)];
        assert_eq!(count(&members, "alice", 4), 1, "bob; carol joined at 4, dave left at 3");
        assert_eq!(count(&members, "alice", 3), 2, "bob and dave");
        assert_eq!(count(&members, "bob", 4), 1, "alice, never bob itself");
        assert_eq!(count(&members, "alice", 5), 1, "carol only");
    }
}
