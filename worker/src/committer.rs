//! How a shard's batch of sends gets committed: in transactions bounded by the bytes
//! their statements take on the wire (every string goes hex-encoded, twice its size, and
//! a statement must stay below MySQL's `max_allowed_packet`, whatever `batch_max` is),
//! retried while MySQL is away or refuses for a reason of its own, and split when MySQL
//! refuses the data itself, until the one entry that does it is isolated and refused;
//! the shard goes on. Chunks and halves are committed in stream order, so a
//! conversation's messages keep it.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use herald_shared::error::ErrorCode;
use herald_shared::protocol::IngressEntry;

use crate::commit::{BatchResult, CommitPipeline, Failure, Fence};
use crate::lease::IdSource;

/// What a refused entry's sender hears.
const POISON: &str = "the message could not be stored (the database refused it)";
/// What the sender of a message too large for the database's packet hears.
const TOO_LARGE: &str = "the message is larger than the database accepts (its max_allowed_packet)";

/// Consecutive conflicts before the shard says it needs an operator.
const CONFLICTS_BEFORE_ALARM: u32 = 5;

/// Bytes of a transaction's statements beside its entries' own: the SQL text, the
/// statement caps, the outbox row (`worker.batch_max_bytes` plus this must fit in
/// `max_allowed_packet`).
pub const SCRIPT_OVERHEAD: usize = 4_096;

/// Bytes one entry adds to its transaction's writes on the wire: its strings hex-encoded
/// (twice their size; the tenant and conversation twice, in the message row and in the
/// conversation's), and a bound for its numbers, quotes, separators and its id in the
/// outbox row.
pub fn wire_bytes(e: &IngressEntry) -> usize {
    let strings = e.body.len() + 2 * (e.tenant.len() + e.conv.len()) + e.user.len() + e.device.len() + e.cmid.len();
    2 * strings + 400
}

/// The commit side of one owned shard.
#[derive(Debug)]
pub struct ShardCommitter<'a> {
    pub pipeline: &'a CommitPipeline,
    pub ids: &'a IdSource,
    pub fence: Fence,
    /// Most wire bytes of entries in one transaction (`worker.batch_max_bytes`).
    pub max_bytes: usize,
    /// The server's `max_allowed_packet`: an entry that cannot fit alone is refused.
    pub max_packet: usize,
}

/// Entry ranges whose wire bytes stay within `max_bytes` (one entry at least).
pub fn chunks_by_bytes(entries: &[IngressEntry], max_bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, e) in entries.iter().enumerate() {
        if i > start && bytes + wire_bytes(e) > max_bytes {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += wire_bytes(e);
    }
    if start < entries.len() {
        out.push(start..entries.len());
    }
    out
}

/// Waits before the next attempt: `step` ms times the attempt, at most `max` ms.
async fn back_off(step: u64, attempt: u32, max: u64) {
    tokio::time::sleep(Duration::from_millis((step * u64::from(attempt)).min(max))).await;
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
                let lone = range.len() == 1;
                if lone && wire_bytes(&entries[range.start]) + SCRIPT_OVERHEAD > self.max_packet {
                    // Sent, it would be cut off by the server (often as a broken
                    // connection, which would be retried forever).
                    self.refuse(&entries[range.start], "too large for max_allowed_packet", ErrorCode::TooLarge);
                    done.push((range, BatchResult::refused(1, ErrorCode::TooLarge, TOO_LARGE)));
                    break;
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
                        back_off(100, attempt, 5_000).await;
                    }
                    Failure::Transient => {
                        metrics::counter!("herald_mysql_errors_total").increment(1);
                        tracing::warn!(shard = self.fence.shard, error = %e, attempt, "batch commit failed; retrying");
                        back_off(50, attempt, 1_000).await;
                    }
                    Failure::Refused => {
                        e.report_refusal(self.fence.shard, attempt);
                        back_off(200, attempt, 5_000).await;
                    }
                    Failure::Poison | Failure::TooLarge if !lone => {
                        // Halves, first half first: the refusal is narrowed down.
                        let mid = range.start + range.len() / 2;
                        todo.push_front(mid..range.end);
                        todo.push_front(range.start..mid);
                        break;
                    }
                    Failure::TooLarge => {
                        self.refuse(&entries[range.start], &e.to_string(), ErrorCode::TooLarge);
                        done.push((range, BatchResult::refused(1, ErrorCode::TooLarge, TOO_LARGE)));
                        break;
                    }
                    Failure::Poison => {
                        self.refuse(&entries[range.start], &e.to_string(), ErrorCode::BadRequest);
                        done.push((range, BatchResult::refused(1, ErrorCode::BadRequest, POISON)));
                        break;
                    }
                }
            }
        }
        Some(done)
    }

    /// Counts and logs an entry refused alone.
    fn refuse(&self, e0: &IngressEntry, error: &str, code: ErrorCode) {
        metrics::counter!("herald_ingress_poison_total").increment(1);
        tracing::error!(shard = self.fence.shard, error, code = code.as_str(), tenant = %e0.tenant, conv = %e0.conv,
            cmid = %e0.cmid, "the database refuses this message; it is refused and the shard goes on");
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
            trace: None,
        }
    }

    #[test]
    fn chunks_stay_within_their_wire_bytes_and_hold_one_entry_at_least() {
        // Wire bytes: 2 * (body + 7) + 400 each: 614, 614, 1 014, 2 214, 434, 434.
        let e: Vec<IngressEntry> = [100, 100, 300, 900, 10, 10].iter().map(|n| entry(*n)).collect();
        assert_eq!(chunks_by_bytes(&e, 1_300), vec![0..2, 2..3, 3..4, 4..6]);
        assert_eq!(chunks_by_bytes(&e, 100_000), vec![0..6]);
        assert!(chunks_by_bytes(&[], 10).is_empty());
    }

    /// Bodies go hex-encoded: a chunk of bodies summing to the limit would have been
    /// twice the limit on the wire.
    #[test]
    fn an_entry_counts_at_least_twice_its_strings() {
        let e = entry(10_000);
        assert!(wire_bytes(&e) >= 2 * (10_000 + 5), "{}", wire_bytes(&e));
        let bodies: Vec<IngressEntry> = (0..10).map(|_| entry(1_000)).collect();
        let chunks = chunks_by_bytes(&bodies, 10_000);
        for c in &chunks {
            let on_wire: usize = bodies[c.clone()].iter().map(wire_bytes).sum();
            assert!(on_wire <= 10_000, "{c:?} is {on_wire} bytes on the wire");
        }
        assert!(chunks.len() >= 3, "10 000 bytes of bodies take over 20 000 on the wire: {chunks:?}");
    }
}
