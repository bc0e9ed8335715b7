//! Device registration and removal: MySQL's `devices` table is the fan-out's source of
//! recipients, so a device is recorded the first time this gateway sees it, its
//! `last_seen_at` is kept coarse (a write every few minutes, not every request), a
//! device the janitor expired is live again when it returns, and a device that logs
//! out is removed with all its Redis state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::interfaces::HashesInterface;
use fred::prelude::Pool;
use herald_shared::auth::Claims;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::{DeviceKey, Keys};
use sqlx::mysql::MySqlPool;

use crate::error::ApiError;

/// Most devices remembered as registered; past it the cache starts afresh (a miss only
/// costs one read).
const KNOWN_MAX: usize = 200_000;

/// Devices registered in MySQL, remembered by this process with when their
/// `last_seen_at` was last written.
#[derive(Clone, Debug)]
pub struct DeviceRegistry {
    db: MySqlPool,
    redis: Pool,
    keys: Keys,
    known: Arc<Mutex<HashMap<DeviceKey, Instant>>>,
    /// How often a device's `last_seen_at` is written at most, by this gateway
    /// (`DeliveryConfig::last_seen_every`).
    seen_every: Duration,
    /// `delivery.device_ttl_s`: a device unseen longer is no fan-out target any more.
    ttl: Duration,
}

impl DeviceRegistry {
    pub fn new(db: MySqlPool, redis: Pool, keys: Keys, seen_every: Duration, ttl: Duration) -> DeviceRegistry {
        DeviceRegistry { db, redis, keys, known: Arc::default(), seen_every, ttl }
    }

    /// Records the device on its first request here, and its `last_seen_at` now and then.
    /// A new device starts with its watermark at "now": it receives messages committed
    /// from here on; history comes from sync.
    pub async fn register(&self, c: &Claims) -> Result<(), ApiError> {
        let key = DeviceKey::of(c);
        let seen = self.known.lock().expect("device cache").get(&key).copied();
        if seen.is_some_and(|t| t.elapsed() < self.seen_every) {
            return Ok(());
        }
        // A device seen before (on another node, or before a restart) costs one read, not a
        // write and its fsync: a login storm of known devices stays off MySQL's log.
        let row: Option<(String, Option<i64>, i64)> = sqlx::query_as(
            "SELECT CAST(platform AS CHAR), expired_at, last_seen_at FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?",
        )
        .bind(&c.tid)
        .bind(&c.sub)
        .bind(&c.dev)
        .fetch_optional(&self.db)
        .await?;
        let now = now_ms() as i64;
        match row {
            // Past its TTL but not yet expired by the janitor: fan-out has skipped it
            // since its TTL passed, yet its pending set is still trusted. Expire it here
            // (its Redis state goes) so its session reads what it missed from MySQL.
            Some((platform, None, last_seen))
                if platform == c.plat.as_str() && now - last_seen > self.ttl.as_millis() as i64 =>
            {
                herald_shared::device_state::free(&self.redis, &self.keys, &key).await?;
                metrics::counter!("herald_devices_returned_total").increment(1);
                self.touch(c, now).await?;
            }
            Some((platform, None, last_seen)) if platform == c.plat.as_str() => {
                if now - last_seen > self.seen_every.as_millis() as i64 {
                    self.touch(c, now).await?;
                }
            }
            // Expired by the janitor: live again. Its Redis state was freed, so its first
            // session reads everything above its watermark from MySQL.
            Some((platform, Some(_), _)) if platform == c.plat.as_str() => {
                metrics::counter!("herald_devices_returned_total").increment(1);
                self.touch(c, now).await?;
            }
            _ => self.upsert(c).await?,
        }
        let mut known = self.known.lock().expect("device cache");
        if known.len() > KNOWN_MAX {
            known.clear();
        }
        known.insert(key, Instant::now());
        Ok(())
    }

    async fn touch(&self, c: &Claims, now: i64) -> Result<(), ApiError> {
        sqlx::query(
            "UPDATE devices SET last_seen_at = ?, expired_at = NULL WHERE tenant_id = ? AND user_id = ? AND device_id = ?",
        )
        .bind(now)
        .bind(&c.tid)
        .bind(&c.sub)
        .bind(&c.dev)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    async fn upsert(&self, c: &Claims) -> Result<(), ApiError> {
        let now = now_ms() as i64;
        let watermark = MsgId::lowest_at(now_ms().saturating_sub(60_000)).0;
        sqlx::query(
            "INSERT INTO devices (tenant_id, user_id, device_id, platform, watermark, registered_at, last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE platform = VALUES(platform), last_seen_at = VALUES(last_seen_at), expired_at = NULL",
        )
        .bind(&c.tid)
        .bind(&c.sub)
        .bind(&c.dev)
        .bind(c.plat.as_str())
        .bind(watermark)
        .bind(now)
        .bind(now)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// Removes the device (it logged out): no more fan-out to it, and its pending set,
    /// presence, marker, band and stored read positions go. The presence it had, if
    /// any, is returned so its session can be closed.
    pub async fn unregister(&self, d: &DeviceKey) -> Result<Option<String>, ApiError> {
        sqlx::query("DELETE FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?")
            .bind(&d.tenant)
            .bind(&d.user)
            .bind(&d.device)
            .execute(&self.db)
            .await?;
        self.known.lock().expect("device cache").remove(d);
        let redis = self.redis.next();
        let presence: Option<String> = redis.hget(self.keys.presence(&d.tenant, &d.user), d.device.as_str()).await?;
        herald_shared::device_state::free(&self.redis, &self.keys, d).await?;
        Ok(presence)
    }
}
