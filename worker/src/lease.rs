//! Leases in Redis: shard ownership and snowflake worker ids.
//!
//! A lease is a key holding a random token with a PX expiry. Only the holder of the
//! token can renew or release it (compare-and-set scripts). The holder also keeps a
//! local deadline: when it has not renewed in time it must behave as if the lease
//! were gone, because by then another process may hold it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::prelude::*;
use herald_shared::ids::{MsgId, Snowflake, MAX_WORKER_ID};
use herald_shared::scripts;

/// One lease held (or lost) by this process.
#[derive(Debug)]
pub struct Lease {
    key: String,
    token: String,
    ttl: Duration,
    /// Milliseconds since `origin` until which the lease is surely ours.
    valid_until: AtomicU64,
    origin: Instant,
}

impl Lease {
    /// Tries to take the lease; `None` when someone else holds it.
    pub async fn acquire(redis: &Pool, key: String, ttl: Duration) -> Result<Option<Arc<Lease>>, Error> {
        let token = format!("{:016x}", rand::random::<u64>());
        let started = Instant::now();
        let ok: Option<String> =
            redis.set(&key, &token, Some(Expiration::PX(ttl.as_millis() as i64)), Some(SetOptions::NX), false).await?;
        if ok.is_none() {
            return Ok(None);
        }
        let lease = Lease { key, token, ttl, valid_until: AtomicU64::new(0), origin: started };
        lease.mark_renewed(started);
        Ok(Some(Arc::new(lease)))
    }

    fn mark_renewed(&self, sent_at: Instant) {
        // Counted from when the command was sent, minus a safety margin for clock
        // drift between this process and Redis.
        let until = sent_at + self.ttl.mul_f64(0.8);
        self.valid_until.store(until.duration_since(self.origin).as_millis() as u64, Ordering::Release);
    }

    /// True while the lease is surely held.
    pub fn is_valid(&self) -> bool {
        (self.origin.elapsed().as_millis() as u64) < self.valid_until.load(Ordering::Acquire)
    }

    /// Extends the lease; `Ok(false)` when it was lost (expired and maybe taken).
    pub async fn renew(&self, redis: &Pool) -> Result<bool, Error> {
        let sent = Instant::now();
        let renewed: i64 = scripts::LEASE_RENEW
            .call(redis.next(), vec![self.key.clone()], vec![self.token.clone(), self.ttl.as_millis().to_string()])
            .await?;
        if renewed == 1 {
            self.mark_renewed(sent);
            Ok(true)
        } else {
            self.valid_until.store(0, Ordering::Release);
            Ok(false)
        }
    }

    pub async fn release(&self, redis: &Pool) {
        self.valid_until.store(0, Ordering::Release);
        let _: Result<i64, _> =
            scripts::LEASE_RELEASE.call(redis.next(), vec![self.key.clone()], vec![self.token.clone()]).await;
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

/// Snowflake ids under a leased worker id. Issues nothing once the lease lapsed.
#[derive(Debug)]
pub struct IdSource {
    generator: Mutex<Snowflake>,
    lease: Mutex<Option<Arc<Lease>>>,
}

#[derive(Debug, thiserror::Error)]
#[error("no valid snowflake worker id lease")]
pub struct NoIdLease;

impl IdSource {
    pub fn new() -> Self {
        IdSource { generator: Mutex::new(Snowflake::new(0)), lease: Mutex::new(None) }
    }

    /// Takes ids for `n` messages, each above `floor` (the last id of the conversation,
    /// which another worker may have issued with a clock ahead of ours).
    pub fn next_ids(&self, floors: &[MsgId]) -> Result<Vec<MsgId>, NoIdLease> {
        let valid = self.lease.lock().expect("lease lock").as_ref().is_some_and(|l| l.is_valid());
        if !valid {
            return Err(NoIdLease);
        }
        let mut g = self.generator.lock().expect("generator lock");
        Ok(floors
            .iter()
            .map(|floor| {
                g.observe(*floor);
                g.next_id()
            })
            .collect())
    }

    /// Keeps a worker id leased: renews the current one or takes a free one.
    pub async fn maintain(&self, redis: &Pool, keys: &herald_shared::keys::Keys, ttl: Duration) -> Result<(), Error> {
        let current = self.lease.lock().expect("lease lock").clone();
        if let Some(lease) = current {
            if lease.renew(redis).await? {
                return Ok(());
            }
            tracing::warn!(lease = lease.key(), "snowflake worker id lease lost; taking another");
        }
        let start = rand::random::<u16>() % (MAX_WORKER_ID + 1);
        for i in 0..=MAX_WORKER_ID {
            let id = (start + i) % (MAX_WORKER_ID + 1);
            if let Some(lease) = Lease::acquire(redis, keys.lease(&format!("snowflake:{id}")), ttl).await? {
                self.generator.lock().expect("generator lock").set_worker(id);
                *self.lease.lock().expect("lease lock") = Some(lease);
                tracing::info!(worker_id = id, "snowflake worker id leased");
                return Ok(());
            }
        }
        *self.lease.lock().expect("lease lock") = None;
        tracing::error!("all snowflake worker ids are leased");
        Ok(())
    }

    pub async fn release(&self, redis: &Pool) {
        let lease = self.lease.lock().expect("lease lock").take();
        if let Some(l) = lease {
            l.release(redis).await;
        }
    }
}

impl Default for IdSource {
    fn default() -> Self {
        Self::new()
    }
}
