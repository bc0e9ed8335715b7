//! One ingress stream's consumer ([`IngressShard`]): it takes over what a previous
//! owner left pending, then reads batches and commits each in stream order: runs of
//! sends (single entries and gateways' packs of sends, unpacked in order) through the
//! group committer, and timeline changes one by one; its read receipts and delivered
//! positions then go to the shard's position lane (`position_lane`), so that neither a
//! flood of reads nor a position write waiting on a lock or an fsync holds up the next
//! batch. Committed entries leave the stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::streams::XReadValue;
use herald_shared::ids::now_ms;
use herald_shared::keys::INGRESS_GROUP;
use herald_shared::protocol::{IngressEntry, IngressRequest, TimelineEntry};
use herald_shared::redis::Batch;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::commit::{BatchResult, Fence};
use crate::context::WorkerContext;
use crate::group::{CommitQueue, CommitRequest};
use crate::lease::Lease;
use crate::notices::publish;

use super::position_lane::{PositionLane, Positions};

type Entry = XReadValue<String, String, String>;

/// The consumer of one ingress stream.
pub struct IngressShard {
    pub(super) shard: u32,
    pub(super) key: String,
    pub(super) shared: Arc<WorkerContext>,
    pub(super) lease: Arc<Lease>,
    /// Taken with the lease: commits of a worker whose lease lapsed are refused.
    pub(super) fence: Fence,
    pub(super) commits: CommitQueue,
    /// The fan-out stage, for timeline changes (sends reach it through `commits`).
    pub(super) fanouts: mpsc::Sender<BatchResult>,
}

/// A run of a batch's entries committed together: sends, or one timeline change.
enum Step {
    Sends(Vec<IngressEntry>, Vec<String>),
    Timeline(Box<TimelineEntry>, String),
}

/// Adds an entry's sends (one, or a gateway's pack) to the batch's steps: to the run of
/// sends before them, in runs of at most `batch_max` sends (one commit request each).
/// The entry is acknowledged with the run that holds its last send, so only once all of
/// them are answered.
fn add_sends(steps: &mut Vec<Step>, sends: Vec<IngressEntry>, xid: &str, batch_max: usize) {
    for e in sends {
        match steps.last_mut() {
            Some(Step::Sends(run, _)) if run.len() < batch_max.max(1) => run.push(e),
            _ => steps.push(Step::Sends(vec![e], Vec::new())),
        }
    }
    if let Some(Step::Sends(_, ids)) = steps.last_mut() {
        ids.push(xid.to_owned());
    }
}

impl IngressShard {
    pub(super) async fn run(self, cancel: CancellationToken) {
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
        let lane =
            PositionLane::spawn(self.shared.clone(), self.key.clone(), self.shard, self.lease.clone(), cancel.clone());
        while !cancel.is_cancelled() && self.lease.is_valid() {
            match self.consume(&client, &cancel, &lane).await {
                Ok(()) => break,
                Err(e) => {
                    metrics::counter!("herald_redis_errors_total", "source" => "ingress").increment(1);
                    tracing::warn!(shard = self.shard, error = %e, "ingress consumer error; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
        lane.close().await;
        let _ = client.quit().await;
    }

    async fn consume(&self, client: &Client, cancel: &CancellationToken, lane: &PositionLane) -> Result<(), Error> {
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
                let Some(done) = self.process(client, entries, cancel, lane).await? else {
                    return Ok(());
                };
                self.acknowledge(client, done).await?;
            }
            if next == "0-0" {
                break;
            }
            cursor = next;
        }
        // Entries committed but not yet acknowledged: acknowledged in the same round trip
        // as the next read, so a batch costs one round trip to Redis, not two, and its
        // shard reads the next batch at once.
        let mut done: Vec<String> = Vec::new();
        loop {
            if cancel.is_cancelled() || !self.lease.is_valid() {
                return self.acknowledge(client, done).await;
            }
            let block = Some(self.shared.cfg.worker.batch_block_ms);
            let read = async {
                if done.is_empty() {
                    return client
                        .xreadgroup::<Value, _, _, _, _>(INGRESS_GROUP, me, Some(count), block, false, &self.key, ">")
                        .await;
                }
                let mut batch = Batch::new();
                batch.push(client.xack::<Value, _, _, _>(&self.key, INGRESS_GROUP, done.clone()));
                batch.push(client.xdel::<Value, _, _>(&self.key, done.clone()));
                batch.push(client.xreadgroup::<Value, _, _, _, _>(
                    INGRESS_GROUP,
                    me,
                    Some(count),
                    block,
                    false,
                    &self.key,
                    ">",
                ));
                let mut answers = batch.run().await.into_iter().collect::<Result<Vec<Value>, Error>>()?;
                answers.pop().ok_or_else(|| Error::new(ErrorKind::Protocol, "the read answered short"))
            };
            let value = tokio::select! {
                // Stopping: what was committed is acknowledged (again: XACK is idempotent),
                // so the next owner does not take it over.
                _ = cancel.cancelled() => return self.acknowledge(client, done).await,
                v = read => v?,
            };
            done.clear();
            if value.is_null() {
                continue;
            }
            let mut streams: HashMap<String, Vec<Entry>> = value.into_xread_response()?;
            let entries = streams.remove(&self.key).unwrap_or_default();
            if entries.is_empty() {
                continue;
            }
            match self.process(client, entries, cancel, lane).await? {
                Some(xids) => done = xids,
                None => return Ok(()),
            }
        }
    }

    /// Commits one batch (through the group committer, which answers and fans out): its
    /// sends and timeline changes in stream order, then hands its reads and delivered
    /// positions to the position lane (which acknowledges them once applied); the ids of
    /// its entries left to acknowledge (a timeline change is acknowledged as soon as it
    /// commits). `Ok(None)` when the shard must stop (lease lost or shutdown) with the
    /// rest of the batch left pending.
    async fn process(
        &self,
        client: &Client,
        entries: Vec<Entry>,
        cancel: &CancellationToken,
        lane: &PositionLane,
    ) -> Result<Option<Vec<String>>, Error> {
        let s = &self.shared;
        let mut xids = Vec::with_capacity(entries.len());
        let mut steps: Vec<Step> = Vec::new();
        let mut positions = Positions::default();
        let batch_max = s.cfg.worker.batch_max;
        let now = now_ms();
        for (xid, fields) in &entries {
            // Stream ids start with the XADD time in ms: how long the request waited.
            if let Some(added) = xid.split('-').next().and_then(|ms| ms.parse::<u64>().ok()) {
                metrics::histogram!("herald_ingress_lag_seconds").record(now.saturating_sub(added) as f64 / 1000.0);
            }
            match IngressRequest::from_fields(fields) {
                Some(IngressRequest::Send(e)) => add_sends(&mut steps, vec![e], xid, batch_max),
                Some(IngressRequest::Sends(pack)) => add_sends(&mut steps, pack, xid, batch_max),
                Some(IngressRequest::Timeline(t)) => steps.push(Step::Timeline(Box::new(t), xid.clone())),
                Some(IngressRequest::Read(r)) => {
                    positions.reads.push(r);
                    positions.xids.push(xid.clone());
                }
                Some(IngressRequest::Delivered(d)) => {
                    positions.delivered.extend(d);
                    positions.xids.push(xid.clone());
                }
                None => {
                    tracing::warn!(shard = self.shard, xid, "malformed ingress entry dropped");
                    xids.push(xid.clone());
                }
            }
        }

        // Sends and timeline changes in stream order. A change leaves the stream as soon
        // as it commits, with the sends before it: a takeover repeats only what came
        // after it, so a change that changed nothing cannot be taken again after a later
        // one changed the conversation.
        let mut committed: Vec<String> = Vec::new();
        for step in steps {
            match step {
                Step::Sends(valid, ids) => {
                    // Committed with the batches of the worker's other shards waiting now;
                    // answered and handed to the fan-out by the group committer.
                    let (done, finished) = tokio::sync::oneshot::channel();
                    let request = CommitRequest {
                        entries: valid,
                        fence: self.fence,
                        lease: self.lease.clone(),
                        cancel: cancel.clone(),
                        done,
                    };
                    if self.commits.send(request).await.is_err() || !finished.await.unwrap_or(false) {
                        return Ok(None);
                    }
                    committed.extend(ids);
                }
                Step::Timeline(t, xid) => {
                    let keep_going = || !cancel.is_cancelled() && self.lease.is_valid();
                    let Some((answer, fanout)) = s.timeline.commit(&t, &s.ids, self.fence, keep_going).await else {
                        return Ok(None);
                    };
                    if let Err(e) = publish(&s.redis, &s.keys, &crate::timeline::notice(&t, answer)).await {
                        tracing::warn!(error = %e, "could not publish a timeline notice");
                    }
                    // A fan-out stage gone (stopping) leaves the event to the outbox.
                    if let Some(fanout) = fanout {
                        let _ = self.fanouts.send(fanout).await;
                    }
                    committed.push(xid);
                    self.acknowledge(client, std::mem::take(&mut committed)).await?;
                }
            }
        }
        xids.append(&mut committed);

        // Positions after the sends of the batch, so a position of a message in it is not
        // capped; applied by the lane while this shard goes on.
        if !positions.is_empty() && lane.queue.send(positions).await.is_err() {
            return Ok(None);
        }
        Ok(Some(xids))
    }

    /// Committed entries leave the stream: it holds only work not yet done.
    async fn acknowledge(&self, client: &Client, xids: Vec<String>) -> Result<(), Error> {
        if xids.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new();
        batch.push(client.xack::<Value, _, _, _>(&self.key, INGRESS_GROUP, xids.clone()));
        batch.push(client.xdel::<Value, _, _>(&self.key, xids));
        batch.run().await.into_iter().try_for_each(|r| r.map(drop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(cmid: &str) -> IngressEntry {
        IngressEntry {
            tenant: "t".into(),
            user: "u".into(),
            device: "d".into(),
            cmid: cmid.into(),
            conv: "c".into(),
            body: "1".into(),
            node: "gw".into(),
            rid: 1,
            trace: None,
        }
    }

    #[test]
    fn a_pack_joins_the_run_before_it_in_runs_of_a_batch_and_is_acknowledged_with_its_last_send() {
        let mut steps = Vec::new();
        add_sends(&mut steps, vec![send("a")], "1-0", 3);
        add_sends(&mut steps, ["b", "c", "d", "e", "f"].map(send).into(), "2-0", 3);
        add_sends(&mut steps, vec![send("g")], "3-0", 3);
        let shape: Vec<(Vec<String>, Vec<String>)> = steps
            .iter()
            .map(|s| match s {
                Step::Sends(run, ids) => (run.iter().map(|e| e.cmid.clone()).collect(), ids.clone()),
                Step::Timeline(..) => panic!("no timeline here"),
            })
            .collect();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            shape,
            vec![
                (strings(&["a", "b", "c"]), strings(&["1-0"])),
                (strings(&["d", "e", "f"]), strings(&["2-0"])),
                (strings(&["g"]), strings(&["3-0"])),
            ]
        );
    }
}
