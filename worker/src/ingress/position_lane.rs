//! The members' positions of one ingress shard, applied beside its sends
//! ([`PositionLane`]): read receipts and delivered positions. A flood of reads, from any
//! tenant, delays reads, and a delivered-position write waiting on a lock or an fsync
//! delays positions, never the shard's next batch of sends. The shard hands each
//! batch's positions over once the batch's sends are committed (so a read or a
//! delivered position of a message in it is not capped) and goes on with its next
//! batch; the lane applies everything handed over since its last round together
//! (delivered positions alone first wait `worker.delivered_linger_ms` for more): the
//! reads of one user and conversation as one (the furthest: positions only move
//! forward, so a flood of reads costs a round what one read does), answering each read
//! with the position then stored, then the delivered positions (which tell the
//! senders); and only then removes their entries from the stream: a worker that dies
//! leaves them pending for the shard's next owner, and a position applied twice changes
//! nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use herald_shared::keys::INGRESS_GROUP;
use herald_shared::protocol::{DeliveredEntry, NodeEnvelope, ReadEntry, SendNotice};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::context::WorkerContext;
use crate::lease::Lease;
use crate::notices::publish;

/// Batches of positions waiting for the lane: when it is this far behind, the shard
/// waits for room (the flood is then slowed at its source, the stream).
const QUEUED_BATCHES: usize = 1_024;
/// Most reads taken into one round (their distinct positions are one transaction:
/// their conversation rows stay locked until it commits, so a round is kept short for
/// the senders of those conversations).
const ROUND_MAX: usize = 4_096;
/// Delivered positions applied per statement at most: a batch of entries may carry
/// many (a gateway writes up to 512 per entry).
const DELIVERED_CHUNK: usize = 2_048;

/// One batch's reads and delivered positions, and their stream entries.
#[derive(Default)]
pub(super) struct Positions {
    pub reads: Vec<ReadEntry>,
    pub delivered: Vec<DeliveredEntry>,
    pub xids: Vec<String>,
}

impl Positions {
    pub(super) fn is_empty(&self) -> bool {
        self.xids.is_empty()
    }

    fn len(&self) -> usize {
        self.reads.len() + self.delivered.len()
    }

    fn append(&mut self, more: Positions) {
        self.reads.extend(more.reads);
        self.delivered.extend(more.delivered);
        self.xids.extend(more.xids);
    }
}

/// The lane of one shard: where its consumer hands positions over.
pub(super) struct PositionLane {
    pub queue: mpsc::Sender<Positions>,
    task: JoinHandle<()>,
}

impl PositionLane {
    pub(super) fn spawn(
        shared: Arc<WorkerContext>,
        key: String,
        shard: u32,
        lease: Arc<Lease>,
        cancel: CancellationToken,
    ) -> PositionLane {
        let (queue, rx) = mpsc::channel(QUEUED_BATCHES);
        let task = tokio::spawn(run(rx, shared, key, shard, lease, cancel));
        PositionLane { queue, task }
    }

    /// Lets the lane finish what it was handed (it stops at once when the lease is
    /// lost or the worker stops: the entries stay for the next owner).
    pub(super) async fn close(self) {
        drop(self.queue);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

async fn run(
    mut rx: mpsc::Receiver<Positions>,
    s: Arc<WorkerContext>,
    key: String,
    shard: u32,
    lease: Arc<Lease>,
    cancel: CancellationToken,
) {
    let keep_going = || !cancel.is_cancelled() && lease.is_valid();
    let linger = Duration::from_millis(s.cfg.worker.delivered_linger_ms);
    while let Some(mut round) = rx.recv().await {
        while round.len() < ROUND_MAX {
            let Ok(more) = rx.try_recv() else { break };
            round.append(more);
        }
        gather(&mut rx, &mut round, linger, &cancel).await;
        if !round.reads.is_empty() && !apply_reads(&s, &round.reads, shard, keep_going).await {
            return;
        }
        if !apply_delivered(&s, &mut round.delivered, shard, keep_going).await {
            return;
        }
        // Applied: the entries leave the stream (a failure leaves them pending, and a
        // later owner applies them again, which changes nothing).
        let xids = round.xids;
        let pipe = s.redis.next().pipeline();
        let acked = async {
            let _: () = pipe.xack(&key, INGRESS_GROUP, xids.clone()).await?;
            let _: () = pipe.xdel(&key, xids).await?;
            pipe.all::<Vec<Value>>().await
        };
        if let Err(e) = acked.await {
            metrics::counter!("herald_redis_errors_total", "source" => "ingress").increment(1);
            tracing::warn!(shard, error = %e, "applied positions not acknowledged");
        }
    }
}

/// Waits up to `linger` for more positions to join a round of delivered positions, so
/// that the flushes of every gateway in that time cost one round; stops early when a
/// read receipt arrives (its reader waits for the answer), the round is full, the
/// shard closes the lane or the worker stops.
async fn gather(
    rx: &mut mpsc::Receiver<Positions>,
    round: &mut Positions,
    linger: Duration,
    cancel: &CancellationToken,
) {
    if linger.is_zero() || !round.reads.is_empty() || round.len() >= ROUND_MAX {
        return;
    }
    let until = tokio::time::Instant::now() + linger;
    loop {
        let more = tokio::select! {
            _ = tokio::time::sleep_until(until) => return,
            _ = cancel.cancelled() => return,
            more = rx.recv() => more,
        };
        let Some(more) = more else { return };
        round.append(more);
        if !round.reads.is_empty() || round.len() >= ROUND_MAX {
            return;
        }
    }
}

/// Applies a round's reads (retrying MySQL failures) and answers them; `false` when
/// the lane must stop (lease lost or shutdown) with them left pending.
async fn apply_reads(s: &WorkerContext, reads: &[ReadEntry], shard: u32, keep_going: impl Fn() -> bool) -> bool {
    let (positions, of_read) = collapse(reads);
    let outcomes = loop {
        if !keep_going() {
            return false;
        }
        match s.reads.apply(&positions).await {
            Ok(o) => break o,
            Err(e) => {
                metrics::counter!("herald_mysql_errors_total").increment(1);
                tracing::warn!(shard, error = %e, "read receipts failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let mut by_node: BTreeMap<&str, NodeEnvelope> = BTreeMap::new();
    for (r, k) in reads.iter().zip(of_read) {
        let Some(outcome) = outcomes.get(k).cloned() else { continue };
        by_node.entry(r.node.as_str()).or_default().sent.push(SendNotice { rid: r.rid, echo: Some(r.echo()), outcome });
    }
    if let Err(e) = publish(&s.redis, &s.keys, &by_node).await {
        tracing::warn!(error = %e, "could not publish read notices");
    }
    true
}

/// Applies a round's delivered positions in bounded statements, each conversation's
/// positions together (retrying MySQL failures); `false` when the lane must stop with
/// them left pending.
async fn apply_delivered(
    s: &WorkerContext,
    delivered: &mut [DeliveredEntry],
    shard: u32,
    keep_going: impl Fn() -> bool,
) -> bool {
    delivered.sort_by(|a, b| (&a.tenant, &a.conv).cmp(&(&b.tenant, &b.conv)));
    for chunk in delivered.chunks(DELIVERED_CHUNK) {
        loop {
            if !keep_going() {
                return false;
            }
            match s.delivered.apply(chunk).await {
                Ok(()) => break,
                Err(e) => {
                    metrics::counter!("herald_mysql_errors_total").increment(1);
                    tracing::warn!(shard, error = %e, "delivered positions failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    true
}

/// The reads of a round as positions to store, one per (tenant, user, conversation):
/// the furthest read (with its device, which its own read frame skips); and for each
/// read, the index of its position, whose outcome answers it.
fn collapse(reads: &[ReadEntry]) -> (Vec<ReadEntry>, Vec<usize>) {
    let mut positions: Vec<ReadEntry> = Vec::new();
    let mut at: HashMap<(&str, &str, &str), usize> = HashMap::new();
    let mut of_read = Vec::with_capacity(reads.len());
    for r in reads {
        let k = *at.entry((&r.tenant, &r.user, &r.conv)).or_insert_with(|| {
            positions.push(r.clone());
            positions.len() - 1
        });
        if r.seq > positions[k].seq {
            positions[k] = r.clone();
        }
        of_read.push(k);
    }
    (positions, of_read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(user: &str, conv: &str, seq: u64, rid: u64) -> ReadEntry {
        ReadEntry {
            tenant: "t".into(),
            user: user.into(),
            device: format!("{user}-{rid}"),
            conv: conv.into(),
            seq,
            node: "n".into(),
            rid,
        }
    }

    #[test]
    fn reads_of_one_user_and_conversation_collapse_into_the_furthest() {
        let reads = [
            read("a", "c", 3, 1),
            read("a", "c", 9, 2),
            read("b", "c", 1, 3),
            read("a", "d", 2, 4),
            read("a", "c", 5, 5),
        ];
        let (positions, of_read) = collapse(&reads);
        let seqs: Vec<(&str, &str, u64, u64)> =
            positions.iter().map(|p| (p.user.as_str(), p.conv.as_str(), p.seq, p.rid)).collect();
        assert_eq!(seqs, [("a", "c", 9, 2), ("b", "c", 1, 3), ("a", "d", 2, 4)]);
        assert_eq!(of_read, [0, 0, 1, 2, 0], "every read is answered by its position");
    }
}
