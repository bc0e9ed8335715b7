//! Surviving Redis data loss: pending-set rebuilds from MySQL and device watermarks.
//!
//! A device's pending set is trusted only when its marker (`devs` field
//! `epoch:{device}`) names the current epoch (see [`crate::epoch`]) and it did not
//! overflow; otherwise it is rebuilt from MySQL: every message of the user's
//! conversations (within membership) with id above the device's watermark W, except the
//! device's own. W is flushed to MySQL from live sessions (see [`crate::watermarks`]):
//! below the oldest pending id, and at least `watermark_margin_ms` behind now, so a
//! rebuild can only add repeats (which clients drop by id), never lose.

use fred::interfaces::{HashesInterface, SortedSetsInterface};
use fred::prelude::*;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::{epoch_marker, DeviceKey, Keys};
use herald_shared::scripts;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

/// Why a pending set could not be made complete.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
}

/// Rebuilds pending sets and computes watermarks.
#[derive(Clone, Debug)]
pub struct Recovery {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    /// Most entries restored into one pending set (the worker's cap).
    pub pending_cap: u64,
    /// How far a watermark trails now.
    pub watermark_margin_ms: u64,
}

impl Recovery {
    /// Makes the device's pending set complete for `epoch`; returns whether it rebuilt.
    pub async fn ensure_pending(&self, d: &DeviceKey, epoch: &str) -> Result<bool, RecoveryError> {
        let redis = self.redis.next();
        let devs = self.keys.devices(&d.tenant, &d.user);
        let trusted: Option<String> = redis.hget(&devs, epoch_marker(&d.device)).await?;
        let overflowed: Option<String> = redis.hget(self.keys.overflow(&d.tenant, &d.user), d.device.as_str()).await?;
        if trusted.as_deref() == Some(epoch) && overflowed.is_none() {
            return Ok(false);
        }
        let watermark: u64 =
            sqlx::query_scalar("SELECT watermark FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?")
                .bind(&d.tenant)
                .bind(&d.user)
                .bind(&d.device)
                .fetch_optional(&self.db)
                .await?
                .unwrap_or(0);
        let ids: Vec<u64> = sqlx::query(
            "SELECT msg.id FROM members m JOIN messages msg ON msg.tenant_id = m.tenant_id AND msg.conv_id = m.conv_id \
             WHERE m.tenant_id = ? AND m.user_id = ? AND msg.id > ? AND msg.seq > m.joined_seq \
             AND (m.left_seq IS NULL OR msg.seq <= m.left_seq) AND NOT (msg.sender_id = ? AND msg.sender_device = ?) \
             ORDER BY msg.id LIMIT ?",
        )
        .bind(&d.tenant)
        .bind(&d.user)
        .bind(watermark)
        .bind(&d.user)
        .bind(&d.device)
        .bind(self.pending_cap)
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(|r| r.try_get::<u64, _>(0))
        .collect::<Result<_, _>>()?;
        let pending = self.keys.pending_of(d);
        for chunk in ids.chunks(500) {
            let pairs: Vec<(f64, String)> = chunk.iter().map(|id| (MsgId(*id).score(), MsgId(*id).member())).collect();
            let _: i64 = redis.zadd(&pending, None, None, false, false, pairs).await?;
        }
        let _: i64 = redis.hset(&devs, (epoch_marker(&d.device), epoch)).await?;
        let _: i64 = redis.hdel(self.keys.overflow(&d.tenant, &d.user), d.device.as_str()).await?;
        metrics::counter!("herald_pending_rebuilds_total").increment(1);
        tracing::info!(device = %d, restored = ids.len(), watermark, "pending set rebuilt from MySQL");
        Ok(true)
    }

    /// The watermark a session may report now, or `None` while its set is not trusted.
    pub async fn watermark(&self, d: &DeviceKey, epoch: &str) -> Result<Option<MsgId>, Error> {
        let keys = vec![self.keys.devices(&d.tenant, &d.user), self.keys.pending_of(d)];
        let oldest: Option<String> = scripts::OLDEST_IF_TRUSTED
            .call(self.redis.next(), keys, vec![epoch_marker(&d.device), epoch.to_string()])
            .await?;
        let Some(oldest) = oldest else { return Ok(None) };
        let floor = MsgId::lowest_at(now_ms().saturating_sub(self.watermark_margin_ms)).0.saturating_sub(1);
        let w = match MsgId::from_member(&oldest) {
            Some(id) => floor.min(id.0.saturating_sub(1)),
            None => floor,
        };
        Ok(Some(MsgId(w)))
    }
}
