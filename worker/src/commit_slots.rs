//! When the group committer may start a transaction ([`CommitSlots`]).
//!
//! Up to `worker.commits_in_flight` transactions of sends may run at once, but a new
//! one starts beside those in flight only once the latest of them has run for
//! `worker.commit_overlap_ms`; until then the batches read meanwhile wait and go into
//! the next transaction together. So a worker runs one transaction at a time while its
//! commits are quick (the cheapest: a second transaction beside a quick first one only
//! splits what would have grouped up, with its own statements, round trips and fsync),
//! and a commit held up (a lock wait on a conversation row, a slow batch of a very
//! large group) holds up the other shards for that long only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The transactions a worker's group committer may run, and when.
pub struct CommitSlots {
    slots: Arc<Semaphore>,
    total: usize,
    overlap: Duration,
    /// When the latest transaction in flight started.
    latest: Mutex<Option<Instant>>,
    /// Woken when a transaction ends.
    ended: Arc<Notify>,
}

/// A running transaction's slot; dropping it ends the transaction's turn.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    ended: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.ended.notify_one();
    }
}

/// Whether a transaction may start now, given how many run and since when the latest
/// one does; else until when to wait (unless one ends first).
fn may_start(running: usize, latest: Option<Instant>, now: Instant, overlap: Duration) -> Result<(), Instant> {
    match latest {
        Some(since) if running > 0 && now < since + overlap => Err(since + overlap),
        _ => Ok(()),
    }
}

impl CommitSlots {
    pub fn new(total: usize, overlap: Duration) -> CommitSlots {
        CommitSlots {
            slots: Arc::new(Semaphore::new(total)),
            total,
            overlap,
            latest: Mutex::new(None),
            ended: Arc::new(Notify::new()),
        }
    }

    /// Waits until a transaction may start, and takes its slot.
    pub async fn take(&self) -> Slot {
        loop {
            let running = self.total - self.slots.available_permits();
            let latest = *self.latest.lock().expect("not poisoned");
            match may_start(running, latest, Instant::now(), self.overlap) {
                Ok(()) => {
                    let permit = self.slots.clone().acquire_owned().await.expect("never closed");
                    // A slot freed while this waited may make it the only one in flight.
                    if running > 0 {
                        metrics::counter!("herald_worker_commit_overlaps_total").increment(1);
                    }
                    *self.latest.lock().expect("not poisoned") = Some(Instant::now());
                    return Slot { _permit: permit, ended: self.ended.clone() };
                }
                Err(until) => {
                    tokio::select! {
                        _ = self.ended.notified() => {}
                        _ = tokio::time::sleep_until(until) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_starts_beside_another_only_once_the_latest_has_run_the_overlap() {
        let overlap = Duration::from_millis(20);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        assert_eq!(may_start(0, None, t0, overlap), Ok(()), "nothing in flight");
        assert_eq!(may_start(0, Some(t0), ms(1), overlap), Ok(()), "the last one ended");
        assert_eq!(may_start(1, Some(t0), ms(5), overlap), Err(ms(20)), "a quick one in flight: wait and group up");
        assert_eq!(may_start(1, Some(t0), ms(20), overlap), Ok(()), "held up: start beside it");
        assert_eq!(may_start(2, Some(ms(30)), ms(40), overlap), Err(ms(50)), "the latest counts");
        assert_eq!(may_start(1, Some(t0), t0, Duration::ZERO), Ok(()), "no overlap: start at once");
    }
}
