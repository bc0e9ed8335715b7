//! Ingress: who consumes which stream, and the loop that consumes one.
//!
//! [`ShardBalancer`] keeps this worker's fair share of the ingress shards leased
//! (ceil(shards / live workers)), renews those leases, and runs one [`IngressShard`]
//! consumer per owned shard. A consumer stops as soon as its lease is no longer surely
//! held, and a new owner first claims every entry the previous one left pending
//! (XAUTOCLAIM), so no accepted send is dropped and each stream has one consumer at
//! a time (per-conversation order). The consumer and its batches: [`shard`]; its read
//! receipts and delivered positions, applied beside it: [`position_lane`].

mod epoch_gate;
mod position_lane;
mod shard;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use herald_shared::ids::now_ms;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::commit::{BatchResult, Fence};
use crate::context::WorkerContext;
use crate::group::CommitQueue;
use crate::lease::Lease;
pub use shard::IngressShard;

/// One owned shard: its lease and its consumer task.
struct OwnedShard {
    lease: Arc<Lease>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl OwnedShard {
    /// Stops the consumer and releases the lease.
    async fn stop(self, shard: u32, redis: &Pool) {
        self.cancel.cancel();
        // A batch in flight finishes (bounded by MySQL's timeouts) before the lease goes.
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        self.lease.release(redis).await;
        tracing::info!(shard, "ingress shard released");
    }
}

pub struct ShardBalancer {
    shared: Arc<WorkerContext>,
    commits: CommitQueue,
    fanouts: mpsc::Sender<BatchResult>,
    owned: BTreeMap<u32, OwnedShard>,
}

impl ShardBalancer {
    pub fn new(shared: Arc<WorkerContext>, commits: CommitQueue, fanouts: mpsc::Sender<BatchResult>) -> Self {
        ShardBalancer { shared, commits, fanouts, owned: BTreeMap::new() }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let period = Duration::from_millis(self.shared.cfg.worker.lease_ttl_ms / 3);
        loop {
            match self.tick().await {
                Ok(()) => self.shared.balancer_ok.store(true, std::sync::atomic::Ordering::Release),
                Err(e) => {
                    self.shared.balancer_ok.store(false, std::sync::atomic::Ordering::Release);
                    metrics::counter!("herald_redis_errors_total", "source" => "lease").increment(1);
                    tracing::warn!(error = %e, "shard lease round failed");
                }
            }
            metrics::gauge!("herald_worker_owned_shards").set(self.owned.len() as f64);
            if let Err(e) = self.report_streams().await {
                tracing::debug!(error = %e, "ingress streams not measured");
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(period) => {}
            }
        }
        // Every shard at once: each consumer may sit in a blocked read for up to
        // `worker.batch_block_ms` before it stops, and one after another that added up to
        // a second per shard, past the process's stop bound with a few dozen shards.
        let owned = std::mem::take(&mut self.owned);
        futures::future::join_all(owned.into_iter().map(|(shard, o)| o.stop(shard, &self.shared.redis))).await;
        let redis = &self.shared.redis;
        let _: Result<i64, _> = redis.zrem(self.shared.keys.workers(), self.shared.cfg.node_id.as_str()).await;
        let _: Result<i64, _> = redis.zrem(self.shared.keys.packing_workers(), self.shared.cfg.node_id.as_str()).await;
        let _: Result<i64, _> = redis.zrem(self.shared.keys.epoch_workers(), self.shared.cfg.node_id.as_str()).await;
        self.shared.ids.release(redis).await;
    }

    /// Every shard's backlog, whoever owns it: entries not yet committed and the age of
    /// the oldest (committed entries leave the stream), so a stalled shard shows even
    /// when its consumer is stuck and reports nothing itself.
    async fn report_streams(&self) -> Result<(), Error> {
        let s = &self.shared;
        let pipe = s.redis.next().pipeline();
        for shard in 0..s.cfg.ingress.shards {
            let key = s.keys.ingress(shard);
            let _: () = pipe.xlen(&key).await?;
            let _: () = pipe.xrange::<(), _, _, _>(&key, "-", "+", Some(1)).await?;
        }
        let answers: Vec<Value> = pipe.all().await?;
        let now = now_ms();
        for (shard, pair) in answers.chunks(2).enumerate() {
            let [len, first] = pair else { continue };
            let len = len.as_u64().unwrap_or(0);
            // The oldest entry's id starts with the time it was added, in ms.
            let oldest = first
                .clone()
                .into_array()
                .first()
                .and_then(|e| e.clone().into_array().first().and_then(|id| id.as_string()))
                .and_then(|id| id.split('-').next().and_then(|ms| ms.parse::<u64>().ok()));
            let age = oldest.map_or(0.0, |t| now.saturating_sub(t) as f64 / 1000.0);
            metrics::gauge!("herald_ingress_stream_length", "shard" => shard.to_string()).set(len as f64);
            metrics::gauge!("herald_ingress_oldest_age_seconds", "shard" => shard.to_string()).set(age);
        }
        // Those gauges keep their last values if this stops: their age tells.
        metrics::gauge!("herald_ingress_report_timestamp_seconds").set(now as f64 / 1000.0);
        Ok(())
    }

    async fn give_up(&mut self, shard: u32) {
        if let Some(o) = self.owned.remove(&shard) {
            o.stop(shard, &self.shared.redis).await;
        }
    }

    async fn tick(&mut self) -> Result<(), Error> {
        let s = self.shared.clone();
        let ttl = Duration::from_millis(s.cfg.worker.lease_ttl_ms);
        s.ids.maintain(&s.redis, &s.keys, ttl).await?;

        let now = now_ms() as f64;
        // This worker reads packed sends: gateways pack while every live worker says so
        // (said before it counts as live, so no gateway sees it live and not packing).
        let packs = s.keys.packing_workers();
        let _: i64 = s.redis.zadd(&packs, None, None, false, false, (now, s.cfg.node_id.as_str())).await?;
        let _: i64 = s.redis.zremrangebyscore(&packs, f64::NEG_INFINITY, now - 3.0 * ttl.as_millis() as f64).await?;
        // Its janitor raises device epochs (`epoch_gate.rs`), said the same way.
        let epochs = s.keys.epoch_workers();
        let _: i64 = s.redis.zadd(&epochs, None, None, false, false, (now, s.cfg.node_id.as_str())).await?;
        let _: i64 = s.redis.zremrangebyscore(&epochs, f64::NEG_INFINITY, now - 3.0 * ttl.as_millis() as f64).await?;
        let _: i64 = s.redis.zadd(s.keys.workers(), None, None, false, false, (now, s.cfg.node_id.as_str())).await?;
        let _: i64 =
            s.redis.zremrangebyscore(s.keys.workers(), f64::NEG_INFINITY, now - 3.0 * ttl.as_millis() as f64).await?;
        // Unknown (Redis failing) counts as not.
        s.commit.allow_recipient_cache(epoch_gate::all_raise_epochs(&s.redis, &s.keys).await.unwrap_or(false));
        let live: u64 = s.redis.zcard(s.keys.workers()).await?;
        let shards = s.cfg.ingress.shards;
        let target = shards.div_ceil(live.max(1) as u32);

        // Keep what we hold; drop what we lost or what stopped.
        let held: Vec<u32> = self.owned.keys().copied().collect();
        for shard in held {
            let o = &self.owned[&shard];
            let alive = !o.task.is_finished() && o.lease.renew(&s.redis).await.unwrap_or(false);
            if !alive || !o.lease.is_valid() {
                tracing::warn!(shard, "ingress shard lease lost or consumer stopped");
                self.give_up(shard).await;
            }
        }
        while self.owned.len() as u32 > target {
            let shard = *self.owned.keys().next_back().expect("non-empty");
            self.give_up(shard).await;
        }
        if (self.owned.len() as u32) < target {
            // Start at a node-specific offset so workers do not all race for shard 0.
            let offset = herald_shared::keys::shard_of("", &s.cfg.node_id, shards);
            for i in 0..shards {
                if self.owned.len() as u32 >= target {
                    break;
                }
                let shard = (offset + i) % shards;
                if self.owned.contains_key(&shard) {
                    continue;
                }
                if let Some(lease) = Lease::acquire(&s.redis, s.keys.lease(&format!("shard:{shard}")), ttl).await? {
                    let fence = match Fence::take(&s.db, shard).await {
                        Ok(f) => f,
                        Err(e) => {
                            // Without a token no commit could go through: try again later.
                            tracing::warn!(shard, error = %e, "cannot take the shard's fencing token");
                            lease.release(&s.redis).await;
                            continue;
                        }
                    };
                    tracing::info!(shard, token = fence.token, "ingress shard acquired");
                    let cancel = CancellationToken::new();
                    let consumer = IngressShard {
                        shard,
                        key: s.keys.ingress(shard),
                        shared: s.clone(),
                        lease: lease.clone(),
                        fence,
                        commits: self.commits.clone(),
                        fanouts: self.fanouts.clone(),
                    };
                    let task = tokio::spawn(consumer.run(cancel.clone()));
                    self.owned.insert(shard, OwnedShard { lease, cancel, task });
                }
            }
        }
        Ok(())
    }
}
