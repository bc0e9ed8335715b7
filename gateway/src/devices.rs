//! Device registration: MySQL's `devices` table is the fan-out's source of recipients,
//! so a device is recorded the first time this gateway sees it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use herald_shared::auth::Claims;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::DeviceKey;
use sqlx::mysql::MySqlPool;

use crate::error::ApiError;

/// Most devices remembered as registered; past it the cache starts afresh (a miss only
/// costs one read).
const KNOWN_MAX: usize = 200_000;

/// Devices registered in MySQL, remembered by this process.
#[derive(Clone, Debug)]
pub struct DeviceRegistry {
    db: MySqlPool,
    known: Arc<Mutex<HashSet<DeviceKey>>>,
}

impl DeviceRegistry {
    pub fn new(db: MySqlPool) -> DeviceRegistry {
        DeviceRegistry { db, known: Arc::default() }
    }

    /// Records the device the first time this gateway sees it. A new device starts with
    /// its watermark at "now": it receives messages committed from here on; history
    /// comes from sync.
    pub async fn register(&self, c: &Claims) -> Result<(), ApiError> {
        let key = DeviceKey::of(c);
        if self.known.lock().expect("device cache").contains(&key) {
            return Ok(());
        }
        // A device seen before (on another node, or before a restart) costs one read, not a
        // write and its fsync: a login storm of known devices stays off MySQL's log. Its
        // `last_seen_at` moves with the watermark flushes of its session.
        let known_platform: Option<String> = sqlx::query_scalar(
            "SELECT CAST(platform AS CHAR) FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?",
        )
        .bind(&c.tid)
        .bind(&c.sub)
        .bind(&c.dev)
        .fetch_optional(&self.db)
        .await?;
        if known_platform.as_deref() != Some(c.plat.as_str()) {
            self.upsert(c).await?;
        }
        let mut known = self.known.lock().expect("device cache");
        if known.len() > KNOWN_MAX {
            known.clear();
        }
        known.insert(key);
        Ok(())
    }

    async fn upsert(&self, c: &Claims) -> Result<(), ApiError> {
        let now = now_ms() as i64;
        let watermark = MsgId::lowest_at(now_ms().saturating_sub(60_000)).0;
        sqlx::query(
            "INSERT INTO devices (tenant_id, user_id, device_id, platform, watermark, registered_at, last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE platform = VALUES(platform), last_seen_at = VALUES(last_seen_at)",
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
}
