//! Read receipts: the stored read position (only forward, never past `last_seq`) and
//! the `read` frames to the reader's other devices and, in direct conversations and
//! groups up to `worker.read_fanout_max_group`, to the other members' devices.
//!
//! Positions are kept per recipient device in Redis (latest only) until the device has
//! confirmed them, so an offline device gets the final position on connect, not every
//! intermediate one.

use std::collections::BTreeMap;

use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::error::ErrorCode;
use herald_shared::keys::{DeviceKey, Keys, PresenceValue};
use herald_shared::protocol::{read_field, ConversationKind, NodeEnvelope, ReadEntry, ReadPush, SendOutcome};
use herald_shared::scripts;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

/// Why read positions could not be pushed (the stored position is right regardless).
#[derive(Debug, thiserror::Error)]
enum ReadFanoutError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
}

/// Members with a registered device among (user, device) rows in any order: a user
/// with several devices counts once.
fn member_count(rows: &[(String, String)]) -> usize {
    rows.iter().map(|(user, _)| user).collect::<std::collections::HashSet<_>>().len()
}

#[derive(Debug)]
pub struct ReadReceipts {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    pub max_group: usize,
    pub ttl_ms: u64,
    /// Devices unseen this long get no read positions.
    pub device_ttl_ms: u64,
}

/// A position that moved forward.
#[derive(Debug)]
struct Moved {
    tenant: String,
    conv: String,
    kind: Option<ConversationKind>,
    user: String,
    device: String,
    seq: u64,
}

impl ReadReceipts {
    /// Applies the reads in order, in one transaction; answers each.
    pub async fn apply(&self, reads: &[ReadEntry]) -> Result<Vec<SendOutcome>, sqlx::Error> {
        let mut tx = self.db.begin().await?;
        let mut outcomes = Vec::with_capacity(reads.len());
        let mut moved = Vec::new();
        for r in reads {
            let row = sqlx::query(
                "SELECT c.kind, c.last_seq, m.read_seq FROM conversations c JOIN members m \
                 ON m.tenant_id = c.tenant_id AND m.conv_id = c.id AND m.user_id = ? AND m.left_seq IS NULL \
                 WHERE c.tenant_id = ? AND c.id = ? FOR UPDATE",
            )
            .bind(&r.user)
            .bind(&r.tenant)
            .bind(&r.conv)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                let exists = herald_shared::db::conversation_exists(&mut *tx, &r.tenant, &r.conv).await?;
                outcomes.push(if exists {
                    SendOutcome::Err { code: ErrorCode::Forbidden, message: "not a member of this conversation".into() }
                } else {
                    SendOutcome::Err { code: ErrorCode::NotFound, message: "no such conversation".into() }
                });
                continue;
            };
            let (kind, last_seq, read_seq): (String, u64, u64) = (row.text(0)?, row.try_get(1)?, row.try_get(2)?);
            let kind = ConversationKind::parse(&kind);
            let new = read_seq.max(r.seq.min(last_seq));
            if new > read_seq {
                sqlx::query("UPDATE members SET read_seq = ? WHERE tenant_id = ? AND conv_id = ? AND user_id = ?")
                    .bind(new)
                    .bind(&r.tenant)
                    .bind(&r.conv)
                    .bind(&r.user)
                    .execute(&mut *tx)
                    .await?;
                moved.push(Moved {
                    tenant: r.tenant.clone(),
                    conv: r.conv.clone(),
                    kind,
                    user: r.user.clone(),
                    device: r.device.clone(),
                    seq: new,
                });
            }
            outcomes.push(SendOutcome::Read { conv: r.conv.clone(), read_seq: new });
        }
        tx.commit().await?;
        metrics::counter!("herald_reads_total").increment(reads.len() as u64);
        if let Err(e) = self.fan_out(&moved).await {
            // The stored position is right; devices see it with their next list or read.
            metrics::counter!("herald_read_fanout_errors_total").increment(1);
            tracing::warn!(error = %e, "read positions could not be pushed");
        }
        Ok(outcomes)
    }

    async fn fan_out(&self, moved: &[Moved]) -> Result<(), ReadFanoutError> {
        let mut by_node: BTreeMap<String, Vec<ReadPush>> = BTreeMap::new();
        for m in moved {
            let rows = sqlx::query(
                "SELECT m.user_id, d.device_id FROM members m JOIN devices d ON d.tenant_id = m.tenant_id AND d.user_id = m.user_id \
                 AND d.expired_at IS NULL AND d.last_seen_at >= ? WHERE m.tenant_id = ? AND m.conv_id = ? AND m.left_seq IS NULL",
            )
            .bind(crate::batch::live_since(self.device_ttl_ms))
            .bind(&m.tenant)
            .bind(&m.conv)
            .fetch_all(&self.db)
            .await?;
            let rows: Vec<(String, String)> =
                rows.iter().map(|r| Ok((r.text(0)?, r.text(1)?))).collect::<Result<_, sqlx::Error>>()?;
            let everyone = m.kind == Some(ConversationKind::Direct) || member_count(&rows) <= self.max_group;
            let mut per_user: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (user, device) in rows {
                let own_other_device = user == m.user && device != m.device;
                if own_other_device || (everyone && user != m.user) {
                    per_user.entry(user).or_default().push(device);
                }
            }
            let field = read_field(&m.conv, &m.user);
            for (user, devices) in per_user {
                let mut keys = vec![self.keys.presence(&m.tenant, &user)];
                keys.extend(devices.iter().map(|d| self.keys.reads(&m.tenant, &user, d)));
                let mut args = vec![field.clone(), m.seq.to_string(), self.ttl_ms.to_string()];
                args.extend(devices.iter().cloned());
                let out: Vec<Value> = scripts::READS_RECORD.call(self.redis.next(), keys, args).await?;
                for pair in out.chunks(2) {
                    if let [dev, Value::String(presence)] = pair {
                        let (Some(dev), Some(PresenceValue { node, .. })) =
                            (dev.as_string(), PresenceValue::parse(presence))
                        else {
                            continue;
                        };
                        let pushes = by_node.entry(node).or_default();
                        match pushes.iter_mut().find(|p| p.conv == m.conv && p.user == m.user && p.seq == m.seq) {
                            Some(p) => p.to.push(DeviceKey::new(m.tenant.as_str(), user.as_str(), dev)),
                            None => pushes.push(ReadPush {
                                conv: m.conv.clone(),
                                user: m.user.clone(),
                                seq: m.seq,
                                to: vec![DeviceKey::new(m.tenant.as_str(), user.as_str(), dev)],
                            }),
                        }
                    }
                }
            }
        }
        for (node, reads) in by_node {
            let env = NodeEnvelope { reads, ..Default::default() };
            let payload = serde_json::to_string(&env).expect("envelope serializes");
            herald_shared::redis::publish_to_node(self.redis.next(), self.keys.node_channel(&node), payload).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_counted_once_however_their_devices_are_ordered() {
        let rows: Vec<(String, String)> = [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("b", "2"), ("a", "3")]
            .iter()
            .map(|(u, d)| (u.to_string(), d.to_string()))
            .collect();
        assert_eq!(member_count(&rows), 3, "three users, whatever order MySQL returns their devices in");
        assert_eq!(member_count(&[]), 0);
    }
}
