//! Surviving Redis data loss: epochs, pending-set rebuilds and device watermarks.
//!
//! Redis holds soft state. `epoch` names the current life of the Redis data: when it
//! is missing, Redis lost its data and the first gateway to notice sets a new one. A
//! device's pending set is trusted only when its marker (`devs` field
//! `epoch:{device}`) names the current epoch; otherwise it is rebuilt from MySQL: every
//! message of the user's conversations (within membership) with id above the device's
//! watermark W, except the device's own. W is flushed to MySQL from live sessions: below
//! the oldest pending id, and at least `watermark_margin_ms` behind now, so a rebuild can
//! only add repeats (which clients drop by id), never lose.

use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface, LuaInterface, SortedSetsInterface};
use fred::prelude::*;
use herald_shared::auth::Claims;
use herald_shared::ids::{now_ms, MsgId};
use sqlx::{MySql, QueryBuilder, Row};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::AppState;

/// Reads the pending set's oldest member only if the set is trusted in this epoch.
/// KEYS: devs, pending. ARGV: marker field, epoch. Returns false (not trusted), "" (empty)
/// or the oldest member.
const OLDEST_IF_TRUSTED_LUA: &str = "if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return false end \
     local m = redis.call('ZRANGE', KEYS[2], 0, 0) return m[1] or ''";

/// Reads the epoch, starting a new one when Redis has none (it lost its data).
pub async fn current_epoch(redis: &Pool, key: &str) -> Result<String, Error> {
    let fresh = format!("{:016x}", rand::random::<u64>());
    let set: Option<String> = redis.set(key, fresh.as_str(), None, Some(SetOptions::NX), false).await?;
    if set.is_some() {
        tracing::warn!(epoch = %fresh, "no Redis epoch: Redis lost its data or is new; pending sets will be rebuilt from MySQL");
        metrics::counter!("herald_redis_epochs_total").increment(1);
    }
    let epoch: Option<String> = redis.get(key).await?;
    Ok(epoch.unwrap_or(fresh))
}

fn marker(device: &str) -> String {
    format!("epoch:{device}")
}

/// Makes the device's pending set complete for `epoch`; returns whether it rebuilt.
pub async fn ensure_pending(state: &AppState, c: &Claims, epoch: &str) -> Result<bool, anyhow::Error> {
    let redis = state.redis.next();
    let devs = state.keys.devices(&c.tid, &c.sub);
    let trusted: Option<String> = redis.hget(&devs, marker(&c.dev)).await?;
    let overflowed: Option<String> = redis.hget(state.keys.overflow(&c.tid, &c.sub), c.dev.as_str()).await?;
    if trusted.as_deref() == Some(epoch) && overflowed.is_none() {
        return Ok(false);
    }
    let watermark: u64 =
        sqlx::query_scalar("SELECT watermark FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?")
            .bind(&c.tid)
            .bind(&c.sub)
            .bind(&c.dev)
            .fetch_optional(&state.db)
            .await?
            .unwrap_or(0);
    let cap = state.cfg.delivery.pending_cap;
    let ids: Vec<u64> = sqlx::query(
        "SELECT msg.id FROM members m JOIN messages msg ON msg.tenant_id = m.tenant_id AND msg.conv_id = m.conv_id \
         WHERE m.tenant_id = ? AND m.user_id = ? AND msg.id > ? AND msg.seq > m.joined_seq \
         AND (m.left_seq IS NULL OR msg.seq <= m.left_seq) AND NOT (msg.sender_id = ? AND msg.sender_device = ?) \
         ORDER BY msg.id LIMIT ?",
    )
    .bind(&c.tid)
    .bind(&c.sub)
    .bind(watermark)
    .bind(&c.sub)
    .bind(&c.dev)
    .bind(cap)
    .fetch_all(&state.db)
    .await?
    .iter()
    .map(|r| r.try_get::<u64, _>(0))
    .collect::<Result<_, _>>()?;
    let pending = state.keys.pending(&c.tid, &c.sub, &c.dev);
    for chunk in ids.chunks(500) {
        let pairs: Vec<(f64, String)> = chunk.iter().map(|id| (MsgId(*id).score(), MsgId(*id).member())).collect();
        let _: i64 = redis.zadd(&pending, None, None, false, false, pairs).await?;
    }
    let _: i64 = redis.hset(&devs, (marker(&c.dev), epoch)).await?;
    let _: i64 = redis.hdel(state.keys.overflow(&c.tid, &c.sub), c.dev.as_str()).await?;
    metrics::counter!("herald_pending_rebuilds_total").increment(1);
    tracing::info!(tenant = %c.tid, user = %c.sub, device = %c.dev, restored = ids.len(), watermark, "pending set rebuilt from MySQL");
    Ok(true)
}

/// The watermark a session may report now, or `None` while its set is not trusted.
pub async fn watermark(state: &AppState, c: &Claims, epoch: &str) -> Result<Option<MsgId>, Error> {
    let keys = vec![state.keys.devices(&c.tid, &c.sub), state.keys.pending(&c.tid, &c.sub, &c.dev)];
    let oldest: Option<String> =
        state.redis.next().eval(OLDEST_IF_TRUSTED_LUA, keys, vec![marker(&c.dev), epoch.to_string()]).await?;
    let Some(oldest) = oldest else { return Ok(None) };
    let floor = MsgId::lowest_at(now_ms().saturating_sub(state.cfg.gateway.watermark_margin_ms)).0.saturating_sub(1);
    let w = match MsgId::from_member(&oldest) {
        Some(id) => floor.min(id.0.saturating_sub(1)),
        None => floor,
    };
    Ok(Some(MsgId(w)))
}

/// One device's watermark report.
#[derive(Debug)]
pub struct Mark {
    pub tenant: String,
    pub user: String,
    pub device: String,
    pub platform: &'static str,
    pub watermark: MsgId,
}

/// Devices per watermark upsert statement.
const WATERMARK_CHUNK: usize = 1_000;

/// Writes watermarks to MySQL in batches; a watermark only moves forward.
pub async fn flush_watermarks(state: AppState, mut rx: mpsc::Receiver<Mark>, cancel: CancellationToken) {
    let mut batch: Vec<Mark> = Vec::new();
    loop {
        let closing = tokio::select! {
            _ = cancel.cancelled() => true,
            m = rx.recv() => match m { Some(m) => { batch.push(m); false } None => true },
        };
        while let Ok(m) = rx.try_recv() {
            batch.push(m);
        }
        if !batch.is_empty() {
            let now = now_ms() as i64;
            // 7 placeholders a row: stay far below MySQL's 65 535 per statement.
            for chunk in batch.chunks(WATERMARK_CHUNK) {
                let mut q = QueryBuilder::<MySql>::new(
                    "INSERT INTO devices (tenant_id, user_id, device_id, platform, watermark, registered_at, last_seen_at) ",
                );
                q.push_values(chunk, |mut b, m| {
                    b.push_bind(&m.tenant)
                        .push_bind(&m.user)
                        .push_bind(&m.device)
                        .push_bind(m.platform)
                        .push_bind(m.watermark.0)
                        .push_bind(now)
                        .push_bind(now);
                });
                q.push(" ON DUPLICATE KEY UPDATE watermark = GREATEST(watermark, VALUES(watermark)), last_seen_at = VALUES(last_seen_at)");
                match q.build().execute(&state.db).await {
                    Ok(_) => metrics::counter!("herald_watermark_flushes_total").increment(1),
                    Err(e) => {
                        tracing::warn!(error = %e, devices = chunk.len(), "watermark flush failed; sessions report again")
                    }
                }
            }
            batch.clear();
        }
        if closing {
            return;
        }
        // Batch what arrives in the next moment.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
