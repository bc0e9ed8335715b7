//! How a shard's batch of sends gets committed: in transactions bounded by bytes (a
//! statement must stay below MySQL's `max_allowed_packet`, whatever `batch_max` is),
//! retried while MySQL is away, and split when MySQL refuses the data itself, until
//! the one entry that does it is isolated and refused; the shard goes on. Chunks and
//! halves are committed in stream order, so a conversation's messages keep it.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use herald_shared::error::ErrorCode;
use herald_shared::protocol::IngressEntry;

use crate::commit::{BatchResult, CommitPipeline, Failure, Fence};
use crate::lease::IdSource;

/// What a refused entry's sender hears.
const POISON: &str = "the message could not be stored (the database refused it)";

/// Consecutive conflicts before the shard says it needs an operator.
const CONFLICTS_BEFORE_ALARM: u32 = 5;

/// The commit side of one owned shard.
#[derive(Debug)]
pub struct ShardCommitter<'a> {
    pub pipeline: &'a CommitPipeline,
    pub ids: &'a IdSource,
    pub fence: Fence,
    pub max_bytes: usize,
}

/// Entry ranges whose bodies stay within `max_bytes` (one entry at least).
pub fn chunks_by_bytes(entries: &[IngressEntry], max_bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, e) in entries.iter().enumerate() {
        if i > start && bytes + e.body.len() > max_bytes {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += e.body.len();
    }
    if start < entries.len() {
        out.push(start..entries.len());
    }
    out
}

impl ShardCommitter<'_> {
    /// Commits `entries`; each range of them with its result, in order. `None` when the
    /// shard must stop (`keep_going` said no, or another worker took it) with the
    /// entries left pending.
    pub async fn commit(
        &self,
        entries: &[IngressEntry],
        keep_going: impl Fn() -> bool,
    ) -> Option<Vec<(Range<usize>, BatchResult)>> {
        let mut todo: VecDeque<Range<usize>> = chunks_by_bytes(entries, self.max_bytes).into();
        let mut done = Vec::new();
        while let Some(range) = todo.pop_front() {
            let mut attempt: u32 = 0;
            loop {
                if !keep_going() {
                    return None;
                }
                let e = match self.pipeline.commit(&entries[range.clone()], self.ids, &[self.fence]).await {
                    Ok(result) => {
                        done.push((range, result));
                        break;
                    }
                    Err(e) => e,
                };
                attempt += 1;
                match e.failure() {
                    Failure::Fenced => {
                        tracing::warn!(shard = self.fence.shard, "shard taken over by another worker; stopping");
                        return None;
                    }
                    Failure::Conflict if attempt < CONFLICTS_BEFORE_ALARM => {
                        tracing::debug!(error = %e, "batch conflict; running it again");
                    }
                    Failure::Conflict => {
                        // A conflict that does not go away: a conversation's last_seq is
                        // behind its messages (edited rows?). Nothing is skipped; the
                        // shard waits until an operator repairs the projections.
                        metrics::counter!("herald_mysql_errors_total").increment(1);
                        tracing::error!(shard = self.fence.shard, error = %e, attempt,
                            "batch keeps conflicting; run `herald-worker rebuild-projections`");
                        tokio::time::sleep(Duration::from_millis((100 * u64::from(attempt)).min(5_000))).await;
                    }
                    Failure::Transient => {
                        metrics::counter!("herald_mysql_errors_total").increment(1);
                        tracing::warn!(shard = self.fence.shard, error = %e, attempt, "batch commit failed; retrying");
                        tokio::time::sleep(Duration::from_millis((50 * u64::from(attempt)).min(1_000))).await;
                    }
                    Failure::Poison if range.len() > 1 => {
                        // Halves, first half first: the refusal is narrowed down.
                        let mid = range.start + range.len() / 2;
                        todo.push_front(mid..range.end);
                        todo.push_front(range.start..mid);
                        break;
                    }
                    Failure::Poison => {
                        metrics::counter!("herald_ingress_poison_total").increment(1);
                        let e0 = &entries[range.start];
                        tracing::error!(shard = self.fence.shard, error = %e, tenant = %e0.tenant, conv = %e0.conv,
                            cmid = %e0.cmid, "the database refuses this message; it is refused and the shard goes on");
                        done.push((range, BatchResult::refused(1, ErrorCode::BadRequest, POISON)));
                        break;
                    }
                }
            }
        }
        Some(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body_len: usize) -> IngressEntry {
        IngressEntry {
            tenant: "t".into(),
            user: "u".into(),
            device: "d".into(),
            cmid: "c".into(),
            conv: "v".into(),
            body: "x".repeat(body_len),
            node: "n".into(),
            rid: 0,
        }
    }

    #[test]
    fn chunks_stay_within_their_bytes_and_hold_one_entry_at_least() {
        let e: Vec<IngressEntry> = [400, 400, 300, 900, 2_000, 10, 10].iter().map(|n| entry(*n)).collect();
        assert_eq!(chunks_by_bytes(&e, 1_000), vec![0..2, 2..3, 3..4, 4..5, 5..7]);
        assert_eq!(chunks_by_bytes(&e, 100_000), vec![0..7]);
        assert!(chunks_by_bytes(&[], 10).is_empty());
    }
}
