//! The janitor: what would otherwise grow with history or with every device ever seen
//! is trimmed here, every `worker.janitor_interval_ms`, by every worker at once (rows
//! are taken with `SKIP LOCKED`, and everything it does is idempotent):
//!
//! - devices unseen for `delivery.device_ttl_s` are expired: their Redis state (pending
//!   set, presence, marker, band, read positions) is freed and they stop being fan-out
//!   targets; one that returns is live again and catches up from its watermark;
//! - rows of devices expired `worker.device_forget_s` ago are deleted, so the table
//!   holds the devices of the last months, not every device ever seen;
//! - messages past their tenant's retention are deleted, oldest first, their keys kept
//!   (`message_keys`, for `worker.message_key_days`) and the text of the events about
//!   them (edits) removed with them;
//! - consumers of the ingress streams left by nodes that are gone are removed.

use std::time::{Duration, Instant};

use fred::interfaces::StreamsInterface;
use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::{DeviceKey, Keys, INGRESS_GROUP};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder};
use tokio_util::sync::CancellationToken;

/// Rows taken per statement: short locks.
const CHUNK: u32 = 500;
/// Work per kind per round, so a large backlog of work is spread over rounds.
const ROUND_BUDGET: Duration = Duration::from_secs(5);
/// A stream consumer with nothing pending and idle this long belongs to a node gone.
const CONSUMER_IDLE_MS: u64 = 10 * 60 * 1000;

#[derive(Clone, Debug)]
pub struct Janitor {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    pub node_id: String,
    pub shards: u32,
    pub interval: Duration,
    pub device_ttl_ms: u64,
    /// How long after its expiry a device's row is deleted; 0 keeps the rows.
    pub device_forget_ms: u64,
    /// Days of messages kept; 0 keeps them forever.
    pub retention_days: u64,
    /// Per-tenant retention (days; 0 forever), over `retention_days`.
    pub retention_overrides: Vec<(String, u64)>,
    /// Days the keys of deleted messages are kept; 0 keeps them forever.
    pub message_key_days: u64,
}

/// Whether `message_keys` holds a key: retention deleted messages once.
pub async fn keys_kept(db: &MySqlPool) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query_scalar::<_, i32>("SELECT 1 FROM message_keys LIMIT 1").fetch_optional(db).await?.is_some())
}

/// Appends the tenant filter of a retention round: one tenant, or all but `except`.
fn push_tenants(q: &mut QueryBuilder<'_, MySql>, tenant: Option<&str>, except: &[&str]) {
    if let Some(t) = tenant {
        q.push(" AND tenant_id = ").push_bind(t.to_owned());
    }
    if !except.is_empty() {
        q.push(" AND tenant_id NOT IN (");
        let mut sep = q.separated(", ");
        for t in except {
            sep.push_bind(t.to_string());
        }
        q.push(")");
    }
}

impl Janitor {
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            match self.expire_devices().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(devices = n, "devices unseen for the device TTL expired"),
                Err(e) => tracing::warn!(error = %e, "expiring devices failed"),
            }
            match self.forget_devices().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(devices = n, "rows of devices expired long ago deleted"),
                Err(e) => tracing::warn!(error = %e, "forgetting devices failed"),
            }
            match self.purge_messages().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(messages = n, "messages past their retention deleted"),
                Err(e) => tracing::warn!(error = %e, "message retention failed"),
            }
            if let Err(e) = self.forget_consumers().await {
                tracing::debug!(error = %e, "stale stream consumers not removed");
            }
        }
    }

    /// Expires devices unseen for the TTL, `CHUNK` at a time; how many.
    pub async fn expire_devices(&self) -> Result<u64, JanitorError> {
        let started = Instant::now();
        let cutoff = now_ms().saturating_sub(self.device_ttl_ms) as i64;
        let mut expired = 0;
        while started.elapsed() < ROUND_BUDGET {
            let mut tx = self.db.begin().await?;
            let rows = sqlx::query(
                "SELECT tenant_id, user_id, device_id FROM devices WHERE expired_at IS NULL AND last_seen_at < ? \
                 ORDER BY last_seen_at LIMIT ? FOR UPDATE SKIP LOCKED",
            )
            .bind(cutoff)
            .bind(CHUNK)
            .fetch_all(&mut *tx)
            .await?;
            if rows.is_empty() {
                break;
            }
            let devices: Vec<DeviceKey> = rows
                .iter()
                .map(|r| Ok(DeviceKey::new(r.text(0)?, r.text(1)?, r.text(2)?)))
                .collect::<Result<_, sqlx::Error>>()?;
            for d in &devices {
                herald_shared::device_state::free(&self.redis, &self.keys, d).await?;
            }
            let mut q = QueryBuilder::<MySql>::new("UPDATE devices SET expired_at = ");
            q.push_bind(now_ms() as i64).push(" WHERE (tenant_id, user_id, device_id) IN (");
            let mut sep = q.separated(", ");
            for d in &devices {
                sep.push("(")
                    .push_bind_unseparated(&d.tenant)
                    .push_unseparated(", ")
                    .push_bind_unseparated(&d.user)
                    .push_unseparated(", ")
                    .push_bind_unseparated(&d.device)
                    .push_unseparated(")");
            }
            q.push(")");
            q.build().execute(&mut *tx).await?;
            // No worker keeps them among its cached recipients past this commit.
            herald_shared::device_epochs::raise(&mut tx, devices.iter().map(|d| d.tenant.as_str())).await?;
            tx.commit().await?;
            expired += devices.len() as u64;
            metrics::counter!("herald_devices_expired_total").increment(devices.len() as u64);
            if devices.len() < CHUNK as usize {
                break;
            }
        }
        Ok(expired)
    }

    /// Deletes the rows of devices expired `device_forget_ms` ago, `CHUNK` at a time
    /// (through the `(expired_at, last_seen_at)` index); how many.
    pub async fn forget_devices(&self) -> Result<u64, JanitorError> {
        if self.device_forget_ms == 0 {
            return Ok(0);
        }
        let started = Instant::now();
        let cutoff = now_ms().saturating_sub(self.device_forget_ms) as i64;
        let mut forgotten = 0;
        while started.elapsed() < ROUND_BUDGET {
            let done = sqlx::query(
                "DELETE FROM devices WHERE expired_at IS NOT NULL AND expired_at < ? ORDER BY expired_at LIMIT ?",
            )
            .bind(cutoff)
            .bind(CHUNK)
            .execute(&self.db)
            .await?
            .rows_affected();
            forgotten += done;
            metrics::counter!("herald_devices_forgotten_total").increment(done);
            if done < u64::from(CHUNK) {
                break;
            }
        }
        Ok(forgotten)
    }

    /// Deletes messages past their tenant's retention, oldest first; how many. Then
    /// the keys of deleted messages past `message_key_days`.
    pub async fn purge_messages(&self) -> Result<u64, JanitorError> {
        let started = Instant::now();
        let mut purged = 0;
        let cutoff = |days: u64| MsgId::lowest_at(now_ms().saturating_sub(days * 86_400_000)).0;
        if self.retention_days > 0 {
            let others: Vec<&str> = self.retention_overrides.iter().map(|(t, _)| t.as_str()).collect();
            purged += self.purge_where(None, &others, cutoff(self.retention_days), started).await?;
        }
        for (tenant, days) in self.retention_overrides.iter().filter(|(_, d)| *d > 0) {
            purged += self.purge_where(Some(tenant), &[], cutoff(*days), started).await?;
        }
        metrics::counter!("herald_messages_purged_total").increment(purged);
        if self.message_key_days > 0 {
            while started.elapsed() < ROUND_BUDGET {
                let n = sqlx::query("DELETE FROM message_keys WHERE id < ? ORDER BY id LIMIT ?")
                    .bind(cutoff(self.message_key_days))
                    .bind(CHUNK)
                    .execute(&self.db)
                    .await?
                    .rows_affected();
                if n < u64::from(CHUNK) {
                    break;
                }
            }
        }
        Ok(purged)
    }

    /// One tenant's (or all but `except`'s) rows with ids below `below`, a chunk at a
    /// time: the events about them lose their text first (an edit's body; the event
    /// keeps its place in the timeline, so no gap opens), the keys of messages are
    /// copied to `message_keys`, then the rows are deleted. Every step is idempotent:
    /// a janitor that dies between them, or two at once, leave nothing inconsistent.
    async fn purge_where(
        &self,
        tenant: Option<&str>,
        except: &[&str],
        below: u64,
        started: Instant,
    ) -> Result<u64, JanitorError> {
        let mut purged = 0;
        while started.elapsed() < ROUND_BUDGET {
            let mut q = QueryBuilder::<MySql>::new("UPDATE messages SET body = 'null' WHERE target_id < ");
            q.push_bind(below).push(" AND body <> 'null'");
            push_tenants(&mut q, tenant, except);
            q.push(" ORDER BY target_id LIMIT ").push_bind(CHUNK);
            let stripped = q.build().execute(&self.db).await?.rows_affected();
            if stripped == u64::from(CHUNK) {
                continue;
            }
            let mut q = QueryBuilder::<MySql>::new("SELECT id FROM messages WHERE id < ");
            q.push_bind(below);
            push_tenants(&mut q, tenant, except);
            q.push(" ORDER BY id LIMIT ").push_bind(CHUNK);
            let ids: Vec<u64> = q.build_query_scalar().fetch_all(&self.db).await?;
            if ids.is_empty() {
                break;
            }
            let mut keep = QueryBuilder::<MySql>::new(
                "INSERT IGNORE INTO message_keys (tenant_id, sender_id, client_msg_id, conv_id, id, seq, created_at, op_digest) \
                 SELECT tenant_id, sender_id, client_msg_id, conv_id, id, seq, created_at, op_digest FROM messages \
                 WHERE event IS NULL AND id IN (",
            );
            let mut delete = QueryBuilder::<MySql>::new("DELETE FROM messages WHERE id IN (");
            for q in [&mut keep, &mut delete] {
                let mut sep = q.separated(", ");
                for id in &ids {
                    sep.push_bind(*id);
                }
                q.push(")");
            }
            // Not kept prepared: the text differs with every number of ids.
            keep.build().persistent(false).execute(&self.db).await?;
            let n = delete.build().persistent(false).execute(&self.db).await?.rows_affected();
            purged += n;
            if ids.len() < CHUNK as usize {
                break;
            }
        }
        Ok(purged)
    }

    /// Removes consumers of the ingress streams that hold nothing and were idle for
    /// long: each node that ever consumed left one, and random node ids make them pile up.
    async fn forget_consumers(&self) -> Result<(), JanitorError> {
        let client = self.redis.next();
        for shard in 0..self.shards {
            let key = self.keys.ingress(shard);
            let consumers: Value = match client.xinfo_consumers(&key, INGRESS_GROUP).await {
                Ok(v) => v,
                Err(_) => continue, // no stream or group yet
            };
            for c in consumers.into_array() {
                let fields: std::collections::HashMap<String, Value> = c.convert().unwrap_or_default();
                let name = fields.get("name").and_then(|v| v.as_string()).unwrap_or_default();
                let pending = fields.get("pending").and_then(Value::as_u64).unwrap_or(1);
                let idle = fields.get("idle").and_then(Value::as_u64).unwrap_or(0);
                if name != self.node_id && !name.is_empty() && pending == 0 && idle > CONSUMER_IDLE_MS {
                    let _: i64 = client.xgroup_delconsumer(&key, INGRESS_GROUP, name.as_str()).await?;
                    metrics::counter!("herald_stream_consumers_removed_total").increment(1);
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JanitorError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
}
