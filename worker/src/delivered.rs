//! Delivered positions and the senders' delivery status (docs/architecture.md section
//! 4, "Delivery status").
//!
//! Gateways write a member's delivered position (the highest `seq` a device of the user
//! acked) into the conversation's ingress stream, coalesced per flush. A batch of them
//! is applied in one transaction (a position only moves forward); then, per
//! conversation whose positions moved, the senders of the messages the move covered
//! are told how far their latest such message got: one read of the members, counted in
//! memory, and one `delivered` push per sender to the nodes holding its devices that
//! asked for `delivered` frames (their presence value says so). The work is per batch
//! and conversation, not per ack or per recipient.
//!
//! A position stays below the lowest `seq` of its conversation whose fan-out has not
//! finished ([`unfinished`]): delivered means a device acked the message.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::keys::{DeviceKey, Keys, PresenceValue};
use herald_shared::protocol::{ConversationKind, DeliveredEntry, DeliveryStatus, NodeEnvelope, StatusPush};
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};
use sqlx::Row;

use herald_shared::sql_script::Script;

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

/// A member's membership range and position (delivered or read, whichever is higher).
struct Member {
    user: String,
    joined_seq: u64,
    left_seq: Option<u64>,
    delivered_seq: u64,
    has: u64,
}

/// A conversation of the batch: its kind and members, and the range of positions the
/// batch moved.
#[derive(Default)]
struct Conversation {
    direct: bool,
    members: Vec<Member>,
    /// The lowest old and the highest new position that moved; `None`: nothing moved.
    moved: Option<(u64, u64)>,
    /// The members whose position moved, and to where.
    movers: Vec<(String, u64)>,
}

/// How many members other than `sender` that received `seq` have it.
fn count(members: &[Member], sender: &str, seq: u64) -> u64 {
    members
        .iter()
        .filter(|m| m.user != sender && m.joined_seq < seq && m.left_seq.is_none_or(|l| seq <= l) && m.has >= seq)
        .count() as u64
}

impl DeliveredPositions {
    /// Moves the positions of `entries` forward, then tells the senders: one read of
    /// the conversations' members (with the outbox's unfinished events), one upsert of
    /// the positions that moved (text scripts, no prepared statements), and per
    /// group one read of the senders the move covered. Only a MySQL failure of the
    /// read or the upsert is an error (retried by the caller); a status that could not
    /// be pushed is counted and left to history.
    pub async fn apply(&self, entries: &[DeliveredEntry]) -> Result<(), sqlx::Error> {
        let mut highest: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
        for e in entries {
            let seq = highest.entry((e.tenant.as_str(), e.conv.as_str(), e.user.as_str())).or_default();
            *seq = (*seq).max(e.seq);
        }
        let mut conn = self.db.acquire().await?;
        let pairs: BTreeSet<(&str, &str)> = highest.keys().map(|(t, c, _)| (*t, *c)).collect();
        let (mut convs, events) = self.read(&mut conn, &pairs).await?;
        let held = unfinished::lowest_unfinished(&mut conn, &self.redis, &self.keys, events, &pairs).await?;
        // Only this shard's position lane moves these positions, so what was read is current.
        let mut moves: Vec<(&str, &str, &str, u64)> = Vec::new();
        for (&(tenant, conv, user), &seq) in &highest {
            let key = (tenant.to_owned(), conv.to_owned());
            // Below a message whose fan-out is unfinished: no device may have it yet.
            let capped = held.get(&key).map_or(seq, |low| seq.min(low.saturating_sub(1)));
            if capped < seq {
                metrics::counter!("herald_delivered_held_total").increment(1);
            }
            let seq = capped;
            let Some(c) = convs.get_mut(&key) else { continue };
            let Some(m) = c.members.iter_mut().find(|m| m.user == user && m.delivered_seq < seq) else { continue };
            let old = m.delivered_seq;
            (m.delivered_seq, m.has) = (seq, m.has.max(seq));
            c.moved = Some(c.moved.map_or((old, seq), |(from, to)| (from.min(old), to.max(seq))));
            c.movers.push((user.to_owned(), seq));
            moves.push((tenant, conv, user, seq));
        }
        if moves.is_empty() {
            return Ok(());
        }
        // Every row exists (read above; members are never deleted), so nothing is
        // inserted: one statement for the batch, rows in key order, only forward.
        let mut upsert = Script::default();
        upsert.push(
            "INSERT INTO members (tenant_id, conv_id, user_id, joined_seq, read_seq, joined_at, delivered_seq) VALUES ",
        );
        for (n, (tenant, conv, user, seq)) in moves.iter().enumerate() {
            upsert.push(if n > 0 { ", (" } else { "(" }).str(tenant).push(", ").str(conv).push(", ").str(user);
            upsert.push(", 0, 0, 0, ").int(*seq).push(")");
        }
        upsert.push(" ON DUPLICATE KEY UPDATE delivered_seq = GREATEST(delivered_seq, VALUES(delivered_seq))");
        upsert.run(&mut conn).await?;
        drop(conn);
        metrics::counter!("herald_delivered_positions_total").increment(moves.len() as u64);
        if let Err(e) = self.tell_senders(&convs).await {
            metrics::counter!("herald_status_errors_total").increment(1);
            tracing::warn!(error = %e, "delivery status could not be pushed");
        }
        Ok(())
    }

    /// One round trip: the members of every conversation of the batch, with the
    /// conversation's kind; and the outbox events that may be unfinished fan-outs
    /// ([`unfinished::suspects`]).
    async fn read(
        &self,
        conn: &mut MySqlConnection,
        pairs: &BTreeSet<(&str, &str)>,
    ) -> Result<(BTreeMap<(String, String), Conversation>, Vec<MySqlRow>), sqlx::Error> {
        let pairs: Vec<(&str, &str)> = pairs.iter().copied().collect();
        let mut reads = Script::default();
        reads.push(
            "SELECT m.tenant_id, m.conv_id, m.user_id, m.joined_seq, m.left_seq, m.delivered_seq, m.read_seq, c.kind \
             FROM members m JOIN conversations c ON c.tenant_id = m.tenant_id AND c.id = m.conv_id WHERE ",
        );
        reads.pairs("m.tenant_id", "m.conv_id", &pairs).push("; ");
        unfinished::suspects(&mut reads);
        let mut sets = reads.run(conn).await?.into_iter().map(|(rows, _)| rows);
        let (Some(rows), Some(events)) = (sets.next(), sets.next()) else {
            return Err(sqlx::Error::Protocol("the delivered positions' reads answered short".into()));
        };
        let mut convs: BTreeMap<(String, String), Conversation> = BTreeMap::new();
        for r in &rows {
            let c = convs.entry((r.text(0)?, r.text(1)?)).or_default();
            c.direct = ConversationKind::parse(&r.text(7)?) == Some(ConversationKind::Direct);
            let (delivered_seq, read_seq): (u64, u64) = (r.try_get(5)?, r.try_get(6)?);
            c.members.push(Member {
                user: r.text(2)?,
                joined_seq: r.try_get(3)?,
                left_seq: r.try_get(4)?,
                delivered_seq,
                has: delivered_seq.max(read_seq),
            });
        }
        Ok((convs, events))
    }

    /// Each sender of the messages a move covered, with its status.
    async fn statuses<'a>(
        &self,
        convs: &'a BTreeMap<(String, String), Conversation>,
    ) -> Result<Vec<(&'a str, String, DeliveryStatus)>, sqlx::Error> {
        let mut statuses = Vec::new();
        for ((tenant, conv), c) in convs {
            let Some((from, to)) = c.moved else { continue };
            if c.direct {
                // A position moves on the other member's messages only: that member sent
                // the message at the new position, and no query is needed to know it.
                for (mover, seq) in &c.movers {
                    let Some(sender) = c.members.iter().find(|m| &m.user != mover) else { continue };
                    let count = count(&c.members, &sender.user, *seq);
                    let status = DeliveryStatus { conv: conv.clone(), seq: *seq, count, user: Some(mover.clone()) };
                    statuses.push((tenant.as_str(), sender.user.clone(), status));
                }
                continue;
            }
            let senders = sqlx::query(
                "SELECT sender_id, MAX(seq) FROM messages WHERE tenant_id = ? AND conv_id = ? AND seq > ? AND seq <= ? \
                 GROUP BY sender_id",
            )
            .bind(tenant)
            .bind(conv)
            .bind(from.max(to.saturating_sub(STATUS_WINDOW)))
            .bind(to)
            .fetch_all(&self.db)
            .await?;
            for r in &senders {
                let (sender, seq): (String, u64) = (r.text(0)?, r.try_get(1)?);
                let count = count(&c.members, &sender, seq);
                statuses.push((tenant.as_str(), sender, DeliveryStatus { conv: conv.clone(), seq, count, user: None }));
            }
        }
        Ok(statuses)
    }

    /// One push per sender to the nodes holding its devices that show statuses (asked
    /// for `delivered` frames): a sender with none gets nothing published.
    async fn tell_senders(&self, convs: &BTreeMap<(String, String), Conversation>) -> Result<(), StatusError> {
        let statuses = self.statuses(convs).await?;
        if statuses.is_empty() {
            return Ok(());
        }
        // Where each sender's devices are connected: one read of its presence.
        let pipe = self.redis.next().pipeline();
        for (tenant, sender, _) in &statuses {
            let _: () = pipe.hgetall(self.keys.presence(tenant, sender)).await?;
        }
        let presences: Vec<HashMap<String, String>> = pipe.all().await?;
        let mut by_node: BTreeMap<String, NodeEnvelope> = BTreeMap::new();
        for ((tenant, sender, status), presence) in statuses.into_iter().zip(presences) {
            for (device, value) in presence {
                let Some(PresenceValue { node, statuses: true, .. }) = PresenceValue::parse(&value) else { continue };
                let env = by_node.entry(node).or_default();
                let key = DeviceKey::new(tenant, sender.as_str(), device);
                match env.status.iter_mut().find(|p| p.status == status) {
                    Some(p) => p.to.push(key),
                    None => env.status.push(StatusPush { status: status.clone(), to: vec![key] }),
                }
            }
        }
        // One pipeline for every node.
        crate::notices::publish(&self.redis, &self.keys, &by_node).await?;
        let pushes: usize = by_node.values().map(|env| env.status.len()).sum();
        metrics::counter!("herald_status_pushes_total").increment(pushes as u64);
        Ok(())
    }
}

mod unfinished;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_counts_the_other_members_that_received_its_message_and_have_it() {
        let m = |user: &str, joined, left, has| Member {
            user: user.into(),
            joined_seq: joined,
            left_seq: left,
            delivered_seq: has,
            has,
        };
        let members = [m("alice", 0, None, 9), m("bob", 0, None, 4), m("carol", 4, None, 9), m("dave", 0, Some(3), 9)];
        assert_eq!(count(&members, "alice", 4), 1, "bob; carol joined at 4, dave left at 3");
        assert_eq!(count(&members, "alice", 3), 2, "bob and dave");
        assert_eq!(count(&members, "bob", 4), 1, "alice, never bob itself");
        assert_eq!(count(&members, "alice", 5), 1, "carol only");
    }
}
