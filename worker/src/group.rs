//! Group commit: the shards a worker owns commit together.
//!
//! Each shard's consumer hands its batch to the worker's [`GroupCommitter`] and
//! waits. The committer runs up to `worker.commits_in_flight` transactions at once,
//! but starts one beside another only once that one has run `worker.commit_overlap_ms`
//! ([`CommitSlots`]); when it may start one it takes every batch waiting at that moment
//! (no linger: a lone batch goes at once) and commits them in one transaction. So a
//! batch read while nothing commits commits at once, and batches read while a
//! transaction runs group up and share the next one's cost (its round trips and its
//! fsync); a commit stuck on a lock holds up the others for the overlap only. A shard still waits for its batch
//! before reading the next, so each stream's order is kept, and two transactions in
//! flight never hold the same shard (so never the same conversation). When the group fails, each batch runs on its own through the shard's
//! [`ShardCommitter`] (retries, poison isolation, fencing), so one shard's trouble
//! stays its own.
//!
//! After COMMIT the committer queues the fan-out for the [`FanoutStage`], in commit
//! order, and then lets the shards read on; it answers the senders meanwhile, so the
//! answers' round trip to Redis is not on the path of a shard's next batch. The stage
//! fans out every commit that finished meanwhile in one go. (Messages of one
//! conversation are in one shard, and a shard reads on only once its fan-out is
//! queued, so their fan-outs keep its order.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use herald_shared::protocol::{IngressEntry, NoticesOut, OutcomeOut, SendNoticeOut};
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::{Committed, Recipient};
use crate::commit::{BatchResult, Fence, Outcome};
use crate::commit_slots::CommitSlots;
use crate::committer::ShardCommitter;
use crate::context::WorkerContext;
use crate::lease::Lease;
use crate::notices::publish;
use crate::spans;

/// One shard's batch, waiting to be committed.
pub struct CommitRequest {
    pub entries: Vec<IngressEntry>,
    pub fence: Fence,
    pub lease: Arc<Lease>,
    pub cancel: CancellationToken,
    /// `true` once committed (or refused) and answered; `false` when the shard must
    /// stop with its batch left pending (lease lost, shutdown, shard taken over).
    pub done: oneshot::Sender<bool>,
}

impl CommitRequest {
    fn keep_going(&self) -> bool {
        !self.cancel.is_cancelled() && self.lease.is_valid()
    }

    /// The bytes its entries take in a transaction's statements.
    fn bytes(&self) -> usize {
        self.entries.iter().map(crate::committer::wire_bytes).sum()
    }
}

/// Where shards send their batches.
pub type CommitQueue = mpsc::Sender<CommitRequest>;

/// Batches waiting at most: one per shard is the most there can be.
const QUEUE: usize = 1_024;
/// Fan-outs waiting at most; past it commits wait, so Redis sets the pace.
const FANOUT_QUEUE: usize = 16;
/// Messages past which waiting fan-outs are not added to the one about to run.
const FANOUT_MAX_MESSAGES: usize = 2_000;

/// The worker's committer, restartable (its queues outlive a restart).
#[derive(Clone)]
pub struct GroupCommitter {
    shared: Arc<WorkerContext>,
    rx: Arc<Mutex<mpsc::Receiver<CommitRequest>>>,
    fanouts: mpsc::Sender<BatchResult>,
}

/// The fan-out of committed batches, one after another in commit order.
#[derive(Clone)]
pub struct FanoutStage {
    shared: Arc<WorkerContext>,
    rx: Arc<Mutex<mpsc::Receiver<BatchResult>>>,
}

/// The queue shards send to, the committer and its fan-out stage.
pub fn group_commit(shared: Arc<WorkerContext>) -> (CommitQueue, GroupCommitter, FanoutStage) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (ftx, frx) = mpsc::channel(FANOUT_QUEUE);
    (
        tx,
        GroupCommitter { shared: shared.clone(), rx: Arc::new(Mutex::new(rx)), fanouts: ftx },
        FanoutStage { shared, rx: Arc::new(Mutex::new(frx)) },
    )
}

impl GroupCommitter {
    /// Where other commits (timeline changes) queue their fan-outs, in order with the
    /// batches committed before them.
    pub fn fanout_queue(&self) -> mpsc::Sender<BatchResult> {
        self.fanouts.clone()
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let cfg = &self.shared.cfg.worker;
        let slots = CommitSlots::new(cfg.commits_in_flight, Duration::from_millis(cfg.commit_overlap_ms));
        let running = TaskTracker::new();
        let mut next: Option<CommitRequest> = None;
        loop {
            let first = match next.take() {
                Some(r) => r,
                None => tokio::select! {
                    _ = cancel.cancelled() => break,
                    r = rx.recv() => match r { Some(r) => r, None => break },
                },
            };
            // Then a slot: while the transactions in flight are busy (and the latest has
            // not run `worker.commit_overlap_ms`), batches wait and group up.
            let slot = tokio::select! {
                _ = cancel.cancelled() => {
                    next = Some(first);
                    break;
                }
                s = slots.take() => s,
            };
            // Everything waiting now, within one transaction's limits.
            let (mut count, mut bytes) = (first.entries.len(), first.bytes());
            let mut group = vec![first];
            while let Ok(r) = rx.try_recv() {
                if count + r.entries.len() > cfg.batch_max || bytes + r.bytes() > cfg.batch_max_bytes {
                    next = Some(r);
                    break;
                }
                (count, bytes) = (count + r.entries.len(), bytes + r.bytes());
                group.push(r);
            }
            let (me, cancel) = (self.clone(), cancel.clone());
            running.spawn(async move {
                me.commit(group, &cancel).await;
                drop(slot);
            });
        }
        // Stopping: commits under way finish; what waits stays pending in its stream,
        // for the next owner.
        running.close();
        running.wait().await;
        for r in next.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            let _ = r.done.send(false);
        }
    }

    async fn commit(&self, group: Vec<CommitRequest>, cancel: &CancellationToken) {
        let s = &self.shared;
        let started = spans::begin(&s.tracer);
        let (mut group, gone): (Vec<_>, Vec<_>) = group.into_iter().partition(CommitRequest::keep_going);
        for r in gone {
            let _ = r.done.send(false);
        }
        metrics::histogram!("herald_worker_group_batches").record(group.len() as f64);
        let mut results: Vec<(Vec<IngressEntry>, Vec<Outcome>)> = Vec::with_capacity(group.len());
        let mut dones = Vec::with_capacity(group.len());
        let mut committed: Vec<BatchResult> = Vec::new();
        // Together first; on any failure, each on its own.
        let together = if group.len() > 1 {
            // The batches' entries moved into one list and back, not copied.
            let lens: Vec<usize> = group.iter().map(|r| r.entries.len()).collect();
            let mut entries: Vec<IngressEntry> = Vec::with_capacity(lens.iter().sum());
            for r in &mut group {
                entries.append(&mut r.entries);
            }
            let fences: Vec<Fence> = group.iter().map(|r| r.fence).collect();
            let result = s.commit.commit(&entries, &s.ids, &fences).await;
            let mut entries = entries.into_iter();
            for (r, n) in group.iter_mut().zip(lens) {
                r.entries = entries.by_ref().take(n).collect();
            }
            match result {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::debug!(error = %e, batches = group.len(), "group commit failed; committing each batch alone");
                    None
                }
            }
        } else {
            None
        };
        match together {
            Some(mut result) => {
                let mut outcomes = std::mem::take(&mut result.outcomes).into_iter();
                for r in group {
                    let mine: Vec<Outcome> = outcomes.by_ref().take(r.entries.len()).collect();
                    results.push((r.entries, mine));
                    dones.push(r.done);
                }
                committed.push(result);
            }
            None => {
                for r in group {
                    let committer = ShardCommitter {
                        pipeline: &s.commit,
                        ids: &s.ids,
                        fence: r.fence,
                        max_bytes: s.cfg.worker.batch_max_bytes,
                        max_packet: s.server.max_allowed_packet as usize,
                    };
                    let Some(parts) = committer.commit(&r.entries, || r.keep_going()).await else {
                        let _ = r.done.send(false);
                        continue;
                    };
                    let mut mine = Vec::with_capacity(r.entries.len());
                    for (_, mut part) in parts {
                        mine.append(&mut part.outcomes);
                        committed.push(part);
                    }
                    results.push((r.entries, mine));
                    dones.push(r.done);
                }
            }
        }
        if started.is_some() {
            let batches: Vec<(&[IngressEntry], &[Outcome])> =
                results.iter().map(|(entries, outcomes)| (entries.as_slice(), outcomes.as_slice())).collect();
            spans::commits(&s.tracer, started, &batches, &mut committed);
        }
        // The senders are answered while the fan-outs are queued and the shards read on:
        // neither waits for the other (a full fan-out queue holds up the shards, not the
        // answers; the answers' round trip holds up neither).
        let read_on = async {
            for result in committed.into_iter().filter(|r| r.outbox_id.is_some()) {
                // A fan-out stage gone (stopping, restarting) leaves the event to the
                // outbox dispatcher, which redoes it after `outbox.first_retry_delay_ms`.
                tokio::select! {
                    _ = self.fanouts.send(result) => {}
                    _ = cancel.cancelled() => {}
                }
            }
            for done in dones {
                let _ = done.send(true);
            }
        };
        tokio::join!(self.answer(&results), read_on);
    }

    /// Answers the waiting gateways, one message per node.
    async fn answer(&self, results: &[(Vec<IngressEntry>, Vec<Outcome>)]) {
        let s = &self.shared;
        // Borrowed from the batch: nothing is copied but into the payloads.
        let mut by_node: BTreeMap<&str, NoticesOut> = BTreeMap::new();
        for (e, outcome) in results.iter().flat_map(|(entries, o)| entries.iter().zip(o)) {
            let outcome = match outcome {
                Outcome::Done(r) => {
                    if r.dup {
                        metrics::counter!("herald_messages_duplicate_total").increment(1);
                    }
                    OutcomeOut::Ok(r)
                }
                Outcome::Rejected(code, message) => {
                    metrics::counter!("herald_send_rejected_total", "code" => code.as_str()).increment(1);
                    OutcomeOut::Err { code: *code, message }
                }
            };
            by_node.entry(e.node.as_str()).or_default().sent.push(SendNoticeOut {
                rid: e.rid,
                echo: e.echo_out(),
                outcome,
            });
        }
        if let Err(e) = publish(&s.redis, &s.keys, &by_node).await {
            // The senders time out and resend with the same cmid; they get `dup: true`.
            tracing::warn!(error = %e, "could not publish send notices");
        }
    }
}

impl FanoutStage {
    pub async fn run(self, cancel: CancellationToken) {
        let s = &self.shared;
        let mut rx = self.rx.lock().await;
        loop {
            let first = tokio::select! {
                // Stopping: the few fan-outs still queued are done first (the outbox
                // would redo them, later).
                _ = cancel.cancelled() => match rx.try_recv() { Ok(r) => r, Err(_) => return },
                r = rx.recv() => match r { Some(r) => r, None => return },
            };
            // Every commit that finished while the last fan-out ran goes in this one, in
            // commit order: its round trips are shared the way a group commit shares a
            // transaction's.
            let mut results = vec![first];
            let mut messages = results[0].committed.len();
            while messages < FANOUT_MAX_MESSAGES {
                let Ok(r) = rx.try_recv() else { break };
                messages += r.committed.len();
                results.push(r);
            }
            results.retain(|r| r.outbox_id.is_some());
            if results.is_empty() {
                continue;
            }
            let spans = spans::fanouts(&s.tracer, &mut results);
            let events: Vec<u64> = results.iter().filter_map(|r| r.outbox_id).collect();
            let groups: Vec<(&[Committed], &[Recipient])> =
                results.iter().map(|r| (r.committed.as_slice(), r.recipients.as_slice())).collect();
            let started = std::time::Instant::now();
            let delivered = s.fanout.deliver_to(&groups, &events).await;
            metrics::histogram!("herald_fanout_seconds").record(started.elapsed().as_secs_f64());
            spans::fanned_out(spans, &delivered);
            match delivered {
                Ok(()) => {
                    for &event in &events {
                        if s.sent_marks.try_send(event).is_err() {
                            tracing::debug!(
                                outbox = event,
                                "SENT marker queue full; the dispatcher will redo the event"
                            );
                        }
                    }
                }
                Err(e) => {
                    metrics::counter!("herald_fanout_errors_total").increment(1);
                    for &event in &events {
                        if let Err(db) = s.outbox.mark_failed(event, 0, &e.to_string(), e.done()).await {
                            tracing::warn!(outbox = event, error = %db,
                                "could not record the failed fan-out; the dispatcher will redo it");
                        }
                    }
                }
            }
        }
    }
}
