//! Ingress: who consumes which stream, and the loop that consumes one.
//!
//! [`ShardBalancer`] keeps this worker's fair share of the ingress shards leased
//! (ceil(shards / live workers)), renews those leases, and runs one [`IngressShard`]
//! consumer per owned shard. A consumer stops as soon as its lease is no longer surely
//! held, and a new owner first claims every entry the previous one left pending
//! (XAUTOCLAIM), so no accepted send is dropped and each stream has one consumer at
//! a time (per-conversation order).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::streams::XReadValue;
use herald_shared::ids::now_ms;
use herald_shared::keys::INGRESS_GROUP;
use herald_shared::protocol::{IngressRequest, NodeEnvelope, SendNotice};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::commit::Fence;
use crate::context::WorkerContext;
use crate::group::{publish, CommitQueue, CommitRequest};
use crate::lease::Lease;

type Entry = XReadValue<String, String, String>;

/// Delivered positions applied per statement at most: a batch of entries may carry
/// many (a gateway writes up to 512 per entry).
const DELIVERED_CHUNK: usize = 2_048;

/// One owned shard: its lease and its consumer task.
struct OwnedShard {
    lease: Arc<Lease>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

pub struct ShardBalancer {
    shared: Arc<WorkerContext>,
    commits: CommitQueue,
    owned: BTreeMap<u32, OwnedShard>,
}

impl ShardBalancer {
    pub fn new(shared: Arc<WorkerContext>, commits: CommitQueue) -> Self {
        ShardBalancer { shared, commits, owned: BTreeMap::new() }
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
        let shards: Vec<u32> = self.owned.keys().copied().collect();
        for s in shards {
            self.give_up(s).await;
        }
        let redis = &self.shared.redis;
        let _: Result<i64, _> = redis.zrem(self.shared.keys.workers(), self.shared.cfg.node_id.as_str()).await;
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
            o.cancel.cancel();
            // A batch in flight finishes (bounded by MySQL's timeouts) before the lease goes.
            let _ = tokio::time::timeout(Duration::from_secs(10), o.task).await;
            o.lease.release(&self.shared.redis).await;
            tracing::info!(shard, "ingress shard released");
        }
    }

    async fn tick(&mut self) -> Result<(), Error> {
        let s = self.shared.clone();
        let ttl = Duration::from_millis(s.cfg.worker.lease_ttl_ms);
        s.ids.maintain(&s.redis, &s.keys, ttl).await?;

        let now = now_ms() as f64;
        let _: i64 = s.redis.zadd(s.keys.workers(), None, None, false, false, (now, s.cfg.node_id.as_str())).await?;
        let _: i64 =
            s.redis.zremrangebyscore(s.keys.workers(), f64::NEG_INFINITY, now - 3.0 * ttl.as_millis() as f64).await?;
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
                    };
                    let task = tokio::spawn(consumer.run(cancel.clone()));
                    self.owned.insert(shard, OwnedShard { lease, cancel, task });
                }
            }
        }
        Ok(())
    }
}

/// The consumer of one ingress stream.
pub struct IngressShard {
    shard: u32,
    key: String,
    shared: Arc<WorkerContext>,
    lease: Arc<Lease>,
    /// Taken with the lease: commits of a worker whose lease lapsed are refused.
    fence: Fence,
    commits: CommitQueue,
}

impl IngressShard {
    async fn run(self, cancel: CancellationToken) {
        let cfg = &self.shared.cfg;
        let block = cfg.worker.batch_block_ms;
        let client = match herald_shared::redis::builder(
            cfg.redis_url.as_str(),
            &cfg.redis.tls(),
            Duration::from_millis(block + 3_000),
        )
        .and_then(|b| b.build())
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the ingress client");
                return;
            }
        };
        let _ = client.init().await;
        while !cancel.is_cancelled() && self.lease.is_valid() {
            match self.consume(&client, &cancel).await {
                Ok(()) => break,
                Err(e) => {
                    metrics::counter!("herald_redis_errors_total", "source" => "ingress").increment(1);
                    tracing::warn!(shard = self.shard, error = %e, "ingress consumer error; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
        let _ = client.quit().await;
    }

    async fn consume(&self, client: &Client, cancel: &CancellationToken) -> Result<(), Error> {
        let me = self.shared.cfg.node_id.as_str();
        let count = self.shared.cfg.worker.batch_max as u64;
        match client.xgroup_create::<(), _, _, _>(&self.key, INGRESS_GROUP, "0", true).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("BUSYGROUP") => {}
            Err(e) => return Err(e),
        }
        // Whatever a previous owner (or an earlier life of this node) read but did not
        // acknowledge comes first.
        let mut cursor = "0-0".to_string();
        loop {
            let (next, entries): (String, Vec<Entry>) =
                client.xautoclaim_values(&self.key, INGRESS_GROUP, me, 0, cursor.as_str(), Some(count), false).await?;
            if !entries.is_empty() {
                tracing::info!(shard = self.shard, entries = entries.len(), "took over pending ingress entries");
                if !self.process(client, entries, cancel).await? {
                    return Ok(());
                }
            }
            if next == "0-0" {
                break;
            }
            cursor = next;
        }
        loop {
            if cancel.is_cancelled() || !self.lease.is_valid() {
                return Ok(());
            }
            let read = client.xreadgroup::<Value, _, _, _, _>(
                INGRESS_GROUP,
                me,
                Some(count),
                Some(self.shared.cfg.worker.batch_block_ms),
                false,
                &self.key,
                ">",
            );
            let value = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                v = read => v?,
            };
            if value.is_null() {
                continue;
            }
            let mut streams: HashMap<String, Vec<Entry>> = value.into_xread_response()?;
            let entries = streams.remove(&self.key).unwrap_or_default();
            if !entries.is_empty() && !self.process(client, entries, cancel).await? {
                return Ok(());
            }
        }
    }

    /// Commits (through the group committer, which answers and fans out) and
    /// acknowledges one batch. `Ok(false)` when the
    /// shard must stop (lease lost or shutdown) with the batch left pending.
    async fn process(&self, client: &Client, entries: Vec<Entry>, cancel: &CancellationToken) -> Result<bool, Error> {
        let s = &self.shared;
        let mut xids = Vec::with_capacity(entries.len());
        let mut valid = Vec::with_capacity(entries.len());
        let mut reads = Vec::new();
        let mut delivered = Vec::new();
        let now = now_ms();
        for (xid, fields) in &entries {
            xids.push(xid.clone());
            // Stream ids start with the XADD time in ms: how long the request waited.
            if let Some(added) = xid.split('-').next().and_then(|ms| ms.parse::<u64>().ok()) {
                metrics::histogram!("herald_ingress_lag_seconds").record(now.saturating_sub(added) as f64 / 1000.0);
            }
            match IngressRequest::from_fields(fields) {
                Some(IngressRequest::Send(e)) => valid.push(e),
                Some(IngressRequest::Read(r)) => reads.push(r),
                Some(IngressRequest::Delivered(d)) => delivered.extend(d),
                None => tracing::warn!(shard = self.shard, xid, "malformed ingress entry dropped"),
            }
        }

        if !valid.is_empty() {
            // Committed with the batches of the worker's other shards waiting now; answered
            // and handed to the fan-out by the group committer.
            let (done, committed) = tokio::sync::oneshot::channel();
            let request = CommitRequest {
                entries: valid,
                fence: self.fence,
                lease: self.lease.clone(),
                cancel: cancel.clone(),
                done,
            };
            if self.commits.send(request).await.is_err() || !committed.await.unwrap_or(false) {
                return Ok(false);
            }
        }

        // Reads after the sends of the batch, so a read of a message in it is not capped.
        if !reads.is_empty() {
            let outcomes = loop {
                if cancel.is_cancelled() || !self.lease.is_valid() {
                    return Ok(false);
                }
                match s.reads.apply(&reads).await {
                    Ok(o) => break o,
                    Err(e) => {
                        metrics::counter!("herald_mysql_errors_total").increment(1);
                        tracing::warn!(shard = self.shard, error = %e, "read receipts failed; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            let mut by_node: BTreeMap<&str, NodeEnvelope> = BTreeMap::new();
            for (r, outcome) in reads.iter().zip(outcomes) {
                by_node.entry(r.node.as_str()).or_default().sent.push(SendNotice {
                    rid: r.rid,
                    echo: Some(r.echo()),
                    outcome,
                });
            }
            if let Err(e) = publish(&s.redis, &s.keys, &by_node).await {
                tracing::warn!(error = %e, "could not publish read notices");
            }
        }
        // Delivered positions last: nobody waits for them. In bounded statements, each
        // conversation's positions together.
        delivered.sort_by(|a, b| (&a.tenant, &a.conv).cmp(&(&b.tenant, &b.conv)));
        for chunk in delivered.chunks(DELIVERED_CHUNK) {
            loop {
                if cancel.is_cancelled() || !self.lease.is_valid() {
                    return Ok(false);
                }
                match s.delivered.apply(chunk).await {
                    Ok(()) => break,
                    Err(e) => {
                        metrics::counter!("herald_mysql_errors_total").increment(1);
                        tracing::warn!(shard = self.shard, error = %e, "delivered positions failed; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
        // Committed entries leave the stream: it holds only work not yet done.
        let pipe = client.pipeline();
        let _: () = pipe.xack(&self.key, INGRESS_GROUP, xids.clone()).await?;
        let _: () = pipe.xdel(&self.key, xids).await?;
        let _: Vec<Value> = pipe.all().await?;
        Ok(true)
    }
}
