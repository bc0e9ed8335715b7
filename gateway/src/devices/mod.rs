//! Device registration and removal: MySQL's `devices` table is the fan-out's source of
//! recipients, so a device is recorded the first time this gateway sees it, its
//! `last_seen_at` is kept coarse (a write every few minutes, not every request), a
//! device the janitor expired is live again when it returns, and a device that logs
//! out is removed with all its Redis state. Devices this gateway does not know are
//! registered in batches (`batch`); those it knows, it remembers (`known`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::interfaces::HashesInterface;
use fred::prelude::Pool;
use herald_shared::auth::Claims;
use herald_shared::error::ErrorCode;
use herald_shared::ids::MsgId;
use herald_shared::keys::{DeviceKey, Keys};
use herald_shared::protocol::NodeEnvelope;
use sqlx::mysql::MySqlPool;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;

mod batch;
mod known;

use known::Known;

/// Registrations waiting for their batch; past it a request waits for room.
const QUEUE_MAX: usize = 16 * batch::BATCH_MAX;

/// Devices registered in MySQL, remembered by this process with when their
/// `last_seen_at` was last written.
#[derive(Clone, Debug)]
pub struct DeviceRegistry {
    db: MySqlPool,
    redis: Pool,
    keys: Keys,
    known: Arc<Mutex<Known>>,
    /// How often a device's `last_seen_at` is written at most, by this gateway
    /// (`DeliveryConfig::last_seen_every`).
    seen_every: Duration,
    queue: mpsc::Sender<batch::Request>,
    registrar: batch::Registrar,
}

impl DeviceRegistry {
    /// The registry; its batches are written by `run`, which the node keeps running.
    pub fn new(db: MySqlPool, redis: Pool, keys: Keys, seen_every: Duration, ttl: Duration) -> DeviceRegistry {
        let (queue, requests) = mpsc::channel(QUEUE_MAX);
        let registrar = batch::Registrar {
            db: db.clone(),
            redis: redis.clone(),
            keys: keys.clone(),
            seen_every_ms: seen_every.as_millis() as i64,
            ttl_ms: ttl.as_millis() as i64,
            queue: Arc::new(tokio::sync::Mutex::new(requests)),
        };
        DeviceRegistry { db, redis, keys, known: Arc::default(), seen_every, queue, registrar }
    }

    /// Writes the registrations' batches until cancelled.
    pub async fn run(self, cancel: CancellationToken) {
        self.registrar.run(cancel).await
    }

    /// Records the device on its first request here, and its `last_seen_at` now and then;
    /// a device the janitor expired is live again. Answers the watermark of the device's
    /// row when it was read or written (a new device's starts a minute back: its first
    /// session reads the messages committed in that minute), `None` when this gateway
    /// saw the device within the write period and did not look.
    pub async fn register(&self, c: &Claims) -> Result<Option<MsgId>, ApiError> {
        let seen = self.known.lock().expect("device cache").seen_at(c);
        if seen.is_some_and(|t| t.elapsed() < self.seen_every) {
            return Ok(None);
        }
        let key = DeviceKey::of(c);
        // Queued for the next batch: a login storm waits its turn instead of holding a
        // pool connection per device (and failing once the pool's wait times out).
        let (reply, answer) = oneshot::channel();
        let request = batch::Request { key: key.clone(), platform: c.plat.as_str(), reply };
        let gone = || ApiError::new(ErrorCode::Unavailable, "device registration unavailable; retry");
        self.queue.send(request).await.map_err(|_| gone())?;
        let watermark = answer.await.map_err(|_| gone())??;
        self.known.lock().expect("device cache").insert(key, Instant::now());
        Ok(Some(watermark))
    }

    /// Registers the device whatever this gateway remembers: its row was found gone
    /// (it logged out through another gateway, whose word did not reach this one).
    pub async fn register_again(&self, c: &Claims) -> Result<MsgId, ApiError> {
        self.forget(&DeviceKey::of(c));
        let again = self.register(c).await?;
        again.ok_or_else(|| ApiError::new(ErrorCode::Unavailable, "device registration unavailable; retry"))
    }

    /// Forgets that `d` is registered: its next request here registers it again.
    pub fn forget(&self, d: &DeviceKey) {
        self.known.lock().expect("device cache").remove(d);
    }

    /// Forgets every device (a logout may have been missed): each registers again on
    /// its next request here, in batches.
    pub fn forget_all(&self) {
        self.known.lock().expect("device cache").clear();
    }

    /// Removes the device (it logged out): no more fan-out to it, and its pending set,
    /// presence, marker, band and stored read positions go. Every gateway is told to
    /// forget it, so it registers again wherever it comes back. The presence it had,
    /// if any, is returned so its session can be closed.
    pub async fn unregister(&self, d: &DeviceKey) -> Result<Option<String>, ApiError> {
        // With its tenant's device epoch, so no worker keeps it among its recipients.
        let mut tx = self.db.begin().await?;
        sqlx::query("DELETE FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?")
            .bind(&d.tenant)
            .bind(&d.user)
            .bind(&d.device)
            .execute(&mut *tx)
            .await?;
        herald_shared::device_epochs::raise(&mut tx, [d.tenant.as_str()]).await?;
        tx.commit().await?;
        self.forget(d);
        let redis = self.redis.next();
        let presence: Option<String> = redis.hget(self.keys.presence(&d.tenant, &d.user), d.device.as_str()).await?;
        herald_shared::device_state::free(&self.redis, &self.keys, d).await?;
        let told = NodeEnvelope { logouts: vec![d.clone()], ..NodeEnvelope::default() };
        let told = serde_json::to_string(&told).expect("envelope serializes");
        // Best effort: a gateway that misses it finds the row gone where it matters
        // (a session's start, a push registration) and registers the device again.
        if let Err(e) = herald_shared::redis::publish_to_node(redis, self.keys.presence_channel(), told).await {
            tracing::debug!(error = %e, "logout not announced to the other gateways");
        }
        Ok(presence)
    }
}
