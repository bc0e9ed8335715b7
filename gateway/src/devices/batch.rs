//! Registrations in batches: the devices the node's cache does not know, from every
//! request that arrived meanwhile, are read with one SELECT and written with at most
//! one UPDATE and one INSERT. A first-login storm then costs MySQL a few statements per
//! batch instead of two per device, and takes one pool connection at a time however
//! many devices wait: they queue for the next batch, none fails for want of a
//! connection. A batch that changes which devices receive messages (a device new or
//! back) writes them with its tenants' device epochs (`herald_shared::device_epochs`)
//! in one transaction, sent as one script: one round trip, as before the epochs.

use std::collections::HashMap;
use std::sync::Arc;

use fred::prelude::Pool;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::{DeviceKey, Keys};
use herald_shared::sql_script::Script;
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;

/// Most devices registered by one batch. Statements are built for a power of two of
/// devices (the last one repeated), so a connection caches a few shapes of each.
pub(super) const BATCH_MAX: usize = 256;

/// A device to register, and where its outcome goes: the watermark of its row.
pub(super) struct Request {
    pub key: DeviceKey,
    pub platform: &'static str,
    pub reply: oneshot::Sender<Result<MsgId, ApiError>>,
}

/// What a device's row needs, found from the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Seen recently enough: nothing to write.
    Nothing,
    /// `last_seen_at` is older than the write period: written again.
    Touch,
    /// Past its TTL but not yet expired by the janitor: fan-out has skipped it since its
    /// TTL passed, yet its pending set is still trusted. Its Redis state is freed (so
    /// its session reads what it missed from MySQL), then it is touched.
    Revive,
    /// Expired by the janitor: touched, live again; its Redis state is already gone.
    Return,
    /// No row (or another platform): inserted, or its platform replaced.
    Upsert,
}

/// A device's row as the batch reads it.
#[derive(Clone, Debug)]
pub(super) struct Stored {
    pub platform: String,
    pub expired_at: Option<i64>,
    pub last_seen_at: i64,
    pub watermark: u64,
}

/// Decides a device's step from its row, at `now` (ms).
pub(super) fn step(row: Option<&Stored>, platform: &str, now: i64, seen_every_ms: i64, ttl_ms: i64) -> Step {
    match row {
        Some(r) if r.platform != platform => Step::Upsert,
        Some(r) if r.expired_at.is_some() => Step::Return,
        Some(r) if now - r.last_seen_at > ttl_ms => Step::Revive,
        Some(r) if now - r.last_seen_at > seen_every_ms => Step::Touch,
        Some(_) => Step::Nothing,
        None => Step::Upsert,
    }
}

/// The task that writes the batches; requests queue in its channel.
#[derive(Clone, Debug)]
pub(super) struct Registrar {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    pub seen_every_ms: i64,
    pub ttl_ms: i64,
    /// Shared so that a restarted task takes over the queue.
    pub queue: Arc<Mutex<mpsc::Receiver<Request>>>,
}

impl Registrar {
    pub async fn run(self, cancel: CancellationToken) {
        let mut queue = self.queue.lock().await;
        let mut batch = Vec::with_capacity(BATCH_MAX);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                n = queue.recv_many(&mut batch, BATCH_MAX) => if n == 0 { return },
            }
            metrics::histogram!("herald_device_registration_batch").record(batch.len() as f64);
            match self.register(&batch).await {
                Ok(watermarks) => {
                    for r in batch.drain(..) {
                        let w = watermarks.get(&r.key).copied().expect("every device of the batch has its watermark");
                        let _ = r.reply.send(Ok(w));
                    }
                }
                Err(e) => {
                    for r in batch.drain(..) {
                        let _ = r.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Registers the batch's devices (one platform per device: a request's later
    /// duplicate wins); answers each device's watermark.
    async fn register(&self, batch: &[Request]) -> Result<HashMap<DeviceKey, MsgId>, ApiError> {
        let devices: HashMap<&DeviceKey, &'static str> = batch.iter().map(|r| (&r.key, r.platform)).collect();
        let devices: Vec<(&DeviceKey, &'static str)> = devices.into_iter().collect();
        let rows = self.read(&devices).await?;
        let now = now_ms() as i64;
        let new_watermark = crate::starts::first_watermark(now);
        let (mut touch, mut upsert) = (Vec::new(), Vec::new());
        // Tenants whose receiving devices change: a device new, back from expiry or
        // from past its TTL (its tenant's device epoch is raised with the writes).
        let mut changed = Vec::new();
        let mut watermarks = HashMap::with_capacity(devices.len());
        for &(key, platform) in &devices {
            let row = rows.get(key);
            match step(row, platform, now, self.seen_every_ms, self.ttl_ms) {
                Step::Nothing => {}
                Step::Touch => touch.push(key),
                Step::Revive => {
                    herald_shared::device_state::free(&self.redis, &self.keys, key).await?;
                    metrics::counter!("herald_devices_returned_total").increment(1);
                    touch.push(key);
                    changed.push(key.tenant.as_str());
                }
                Step::Return => {
                    metrics::counter!("herald_devices_returned_total").increment(1);
                    touch.push(key);
                    changed.push(key.tenant.as_str());
                }
                Step::Upsert => {
                    upsert.push((key, platform));
                    changed.push(key.tenant.as_str());
                }
            }
            watermarks.insert(key.clone(), row.map_or(new_watermark, |r| MsgId(r.watermark)));
        }
        if changed.is_empty() {
            // Only `last_seen_at` moves: no recipient changes, no transaction.
            self.touch(&touch, now).await?;
        } else {
            self.write_changes(&touch, &upsert, &changed, now, new_watermark).await?;
        }
        Ok(watermarks)
    }

    async fn read(&self, devices: &[(&DeviceKey, &str)]) -> Result<HashMap<DeviceKey, Stored>, ApiError> {
        let sql = format!(
            "SELECT CAST(tenant_id AS CHAR), CAST(user_id AS CHAR), CAST(device_id AS CHAR), CAST(platform AS CHAR), expired_at, last_seen_at, watermark FROM devices WHERE {}",
            where_keys(padded_len(devices.len()))
        );
        let mut q = sqlx::query(&sql);
        for (key, _) in padded(devices) {
            q = q.bind(&key.tenant).bind(&key.user).bind(&key.device);
        }
        let mut rows = HashMap::with_capacity(devices.len());
        for r in q.fetch_all(&self.db).await? {
            let key =
                DeviceKey::new(r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?, r.try_get::<String, _>(2)?);
            let row = Stored {
                platform: r.try_get(3)?,
                expired_at: r.try_get(4)?,
                last_seen_at: r.try_get(5)?,
                watermark: r.try_get(6)?,
            };
            rows.insert(key, row);
        }
        Ok(rows)
    }

    async fn touch(&self, devices: &[&DeviceKey], now: i64) -> Result<(), ApiError> {
        if devices.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "UPDATE devices SET last_seen_at = ?, expired_at = NULL WHERE {}",
            where_keys(padded_len(devices.len()))
        );
        let mut q = sqlx::query(&sql).bind(now);
        for key in padded(devices) {
            q = q.bind(&key.tenant).bind(&key.user).bind(&key.device);
        }
        q.execute(&self.db).await?;
        Ok(())
    }

    /// Writes a batch that changes which devices receive, in one transaction and one
    /// round trip: the touched devices' `last_seen_at` (live again), the new devices (a
    /// device whose row has another platform keeps its watermark and gets the new
    /// platform), and their tenants' device epochs (`herald_shared::device_epochs`).
    async fn write_changes(
        &self,
        touch: &[&DeviceKey],
        upsert: &[(&DeviceKey, &str)],
        tenants: &[&str],
        now: i64,
        watermark: MsgId,
    ) -> Result<(), ApiError> {
        let mut script = Script::default();
        script.push("BEGIN");
        if !touch.is_empty() {
            script.push("; UPDATE devices SET last_seen_at = ").int(now);
            script.push(", expired_at = NULL WHERE (tenant_id, user_id, device_id) IN (");
            for (i, key) in touch.iter().enumerate() {
                script.push(if i > 0 { ", (" } else { "(" }).str(&key.tenant).push(", ").str(&key.user);
                script.push(", ").str(&key.device).push(")");
            }
            script.push(")");
        }
        if !upsert.is_empty() {
            script.push(
                "; INSERT INTO devices (tenant_id, user_id, device_id, platform, watermark, registered_at, last_seen_at) VALUES ",
            );
            for (i, (key, platform)) in upsert.iter().enumerate() {
                script.push(if i > 0 { ", (" } else { "(" }).str(&key.tenant).push(", ").str(&key.user);
                script.push(", ").str(&key.device).push(", ").str(platform).push(", ").int(watermark.0);
                script.push(", ").int(now).push(", ").int(now).push(")");
            }
            script.push(
                " ON DUPLICATE KEY UPDATE platform = VALUES(platform), last_seen_at = VALUES(last_seen_at), expired_at = NULL",
            );
        }
        script.push("; ");
        herald_shared::device_epochs::push_raise(&mut script, tenants.iter().copied());
        script.push("; COMMIT");
        script.run_transaction(&self.db).await?;
        Ok(())
    }
}

/// The number of devices a statement is built for: the next power of two.
fn padded_len(n: usize) -> usize {
    n.next_power_of_two()
}

/// The items, the last one repeated up to `padded_len` (a repeated key changes nothing).
fn padded<T: Copy>(items: &[T]) -> impl Iterator<Item = T> + '_ {
    let last = *items.last().expect("a batch is never empty");
    items.iter().copied().chain(std::iter::repeat_n(last, padded_len(items.len()) - items.len()))
}

/// `n` devices by primary key, as point ranges the optimizer reads through the index.
/// A list of rows, not `n` OR-ed conditions: MariaDB's range optimizer took twice as
/// long over 64 OR-ed keys (920 against 460 us per statement).
fn where_keys(n: usize) -> String {
    format!("(tenant_id, user_id, device_id) IN ({})", vec!["(?, ?, ?)"; n].join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(platform: &str, expired_at: Option<i64>, last_seen_at: i64) -> Stored {
        Stored { platform: platform.into(), expired_at, last_seen_at, watermark: 7 }
    }

    #[test]
    fn a_row_decides_what_is_written() {
        let (seen, ttl) = (600_000, 86_400_000);
        let now = 100_000_000;
        assert_eq!(step(None, "ios", now, seen, ttl), Step::Upsert, "a new device is inserted");
        assert_eq!(step(Some(&row("web", None, now)), "ios", now, seen, ttl), Step::Upsert, "another platform");
        assert_eq!(step(Some(&row("ios", None, now - 1_000)), "ios", now, seen, ttl), Step::Nothing);
        assert_eq!(step(Some(&row("ios", None, now - seen - 1)), "ios", now, seen, ttl), Step::Touch);
        assert_eq!(step(Some(&row("ios", None, now - ttl - 1)), "ios", now, seen, ttl), Step::Revive);
        assert_eq!(step(Some(&row("ios", Some(now - 5), now - ttl - 1)), "ios", now, seen, ttl), Step::Return);
    }

    #[test]
    fn statements_come_in_powers_of_two_with_the_last_device_repeated() {
        assert_eq!(padded(&[1, 2, 3]).collect::<Vec<_>>(), vec![1, 2, 3, 3]);
        assert_eq!(padded(&[1]).collect::<Vec<_>>(), vec![1]);
        assert_eq!(padded(&[1, 2, 3, 4, 5]).count(), 8);
        assert_eq!(where_keys(2).matches('?').count(), 6);
    }
}
