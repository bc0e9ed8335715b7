//! Delivered positions on their way to the workers: sessions report the highest `seq`
//! their device acked per conversation, and one flusher per node coalesces the reports
//! of every session into one entry per (tenant, conversation, user) per flush, written
//! into the conversation's ingress stream (after its sends, like a read receipt). The
//! worker moves the position and tells the senders (`worker/src/delivered.rs`).
//!
//! So the cost per ack is a map update in the session; the cost per flush is one XADD
//! per ingress shard (the positions of that shard's conversations in one entry), in one
//! pipeline, whatever the number of acks, users and conversations.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use herald_shared::keys::{shard_of, Keys};
use herald_shared::protocol::DeliveredEntry;
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

/// How long reports gather before they are written: acks of a burst move a position
/// once, and each ingress shard gets one batch of positions per flush, which a worker
/// writes with one statement (one commit). At 100 ms those commits cost the server a
/// third more CPU per message at 500 msg/s (docs/benchmarks.md, "Delivery status"); a
/// status is shown at most once a second anyway (`delivery.status_interval_ms`).
const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// Positions per stream entry at most (about 40 KiB of JSON with long ids): a flush
/// writes one entry per shard that has positions, or a few for a very busy shard.
const BATCH_MAX: usize = 512;

/// Sized for a flush period's reports of many sessions; a full queue drops the report
/// (the position moves with the user's next ack, and history still counts the read).
const QUEUE: usize = 65_536;

/// Where sessions report delivered positions.
#[derive(Clone, Debug)]
pub struct DeliveredReports(mpsc::Sender<DeliveredEntry>);

impl DeliveredReports {
    pub fn report(&self, entry: DeliveredEntry) {
        if self.0.try_send(entry).is_err() {
            metrics::counter!("herald_delivered_reports_dropped_total").increment(1);
        }
    }
}

/// The flusher: restartable, its queue outlives a restart.
#[derive(Clone, Debug)]
pub struct DeliveredFlusher {
    redis: Pool,
    keys: Keys,
    shards: u32,
    rx: Arc<Mutex<mpsc::Receiver<DeliveredEntry>>>,
}

/// A report queue and the flusher that drains it.
pub fn channel(redis: Pool, keys: Keys, shards: u32) -> (DeliveredReports, DeliveredFlusher) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (DeliveredReports(tx), DeliveredFlusher { redis, keys, shards, rx: Arc::new(Mutex::new(rx)) })
}

/// The highest position per (tenant, conversation, user) among `entries`.
fn coalesce(entries: impl IntoIterator<Item = DeliveredEntry>) -> Vec<DeliveredEntry> {
    let mut highest: HashMap<(String, String, String), u64> = HashMap::new();
    for e in entries {
        let seq = highest.entry((e.tenant, e.conv, e.user)).or_default();
        *seq = (*seq).max(e.seq);
    }
    highest.into_iter().map(|((tenant, conv, user), seq)| DeliveredEntry { tenant, user, conv, seq }).collect()
}

/// The positions grouped by the ingress shard of their conversation, at most
/// [`BATCH_MAX`] per group: each group is one stream entry.
fn by_shard(entries: Vec<DeliveredEntry>, shards: u32) -> Vec<(u32, Vec<DeliveredEntry>)> {
    let mut groups: BTreeMap<u32, Vec<DeliveredEntry>> = BTreeMap::new();
    for e in entries {
        groups.entry(shard_of(&e.tenant, &e.conv, shards)).or_default().push(e);
    }
    let mut out = Vec::new();
    for (shard, mut group) in groups {
        while group.len() > BATCH_MAX {
            let rest = group.split_off(BATCH_MAX);
            out.push((shard, std::mem::replace(&mut group, rest)));
        }
        out.push((shard, group));
    }
    out
}

impl DeliveredFlusher {
    /// Writes what arrived every [`FLUSH_EVERY`] until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::new();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            while let Ok(e) = rx.try_recv() {
                batch.push(e);
            }
            if batch.is_empty() {
                continue;
            }
            let entries = coalesce(std::mem::take(&mut batch));
            if let Err(e) = self.write(entries).await {
                // Positions only move forward: a later ack of the user carries them on.
                metrics::counter!("herald_redis_errors_total", "source" => "delivered").increment(1);
                tracing::debug!(error = %e, "delivered positions not written");
            }
        }
    }

    async fn write(&self, entries: Vec<DeliveredEntry>) -> Result<(), Error> {
        let count = entries.len();
        let pipe = self.redis.next().pipeline();
        for (shard, batch) in by_shard(entries, self.shards) {
            let _: () =
                pipe.xadd(self.keys.ingress(shard), false, None, "*", DeliveredEntry::batch_to_fields(&batch)).await?;
        }
        let _: Vec<Value> = pipe.all().await?;
        metrics::counter!("herald_delivered_positions_reported_total").increment(count as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_of_one_user_and_conversation_become_one_entry_with_the_highest_seq() {
        let e = |user: &str, conv: &str, seq| DeliveredEntry {
            tenant: "t".into(),
            user: user.into(),
            conv: conv.into(),
            seq,
        };
        let mut out =
            coalesce([e("bob", "ab", 3), e("bob", "ab", 7), e("bob", "ab", 5), e("carol", "ab", 2), e("bob", "g", 1)]);
        out.sort_by(|a, b| (&a.user, &a.conv).cmp(&(&b.user, &b.conv)));
        assert_eq!(out, vec![e("bob", "ab", 7), e("bob", "g", 1), e("carol", "ab", 2)]);
    }

    #[test]
    fn positions_go_to_their_conversations_shards_in_entries_of_at_most_a_batch() {
        let e = |user: String, conv: &str| DeliveredEntry { tenant: "t".into(), user, conv: conv.into(), seq: 1 };
        let mut entries: Vec<DeliveredEntry> = (0..BATCH_MAX + 3).map(|i| e(format!("u{i}"), "big")).collect();
        entries.extend((0..40).map(|i| e("bob".into(), &format!("c{i}"))));
        let groups = by_shard(entries.clone(), 8);
        let written: usize = groups.iter().map(|(_, g)| g.len()).sum();
        assert_eq!(written, entries.len(), "every position is written once");
        for (shard, group) in &groups {
            assert!(!group.is_empty() && group.len() <= BATCH_MAX);
            assert!(group.iter().all(|p| shard_of(&p.tenant, &p.conv, 8) == *shard), "{shard}: {group:?}");
        }
        let big = shard_of("t", "big", 8);
        assert_eq!(groups.iter().filter(|(s, g)| *s == big && g.iter().any(|p| p.conv == "big")).count(), 2);
        assert!(groups.len() <= 8 + 1, "one entry per shard, plus one for the shard over a batch");
    }
}
