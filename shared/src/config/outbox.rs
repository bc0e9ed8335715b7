//! `[outbox]`: the transactional outbox's dispatcher, retries and purge.

use super::table::{section, WORKER};
use super::Problems;

section! {
    /// `[outbox]`: how the worker finishes fan-outs the immediate dispatch did not.
    pub struct OutboxConfig in "outbox", read by WORKER;
    {
        /// Period of the dispatcher loop.
        pub fixed_delay_ms: u64 = "3000",
        /// A new row is due this far ahead, so the loop sees only what the immediate dispatch left.
        ///
        /// The immediate post-commit dispatch normally finishes a row before it is due.
        pub first_retry_delay_ms: u64 = "5000",
        /// Delay before retry n, comma-separated (the last value repeats).
        pub backoff_ms: Vec<u64> = "5000,20000,80000,320000,1280000",
        /// Failed retries before an event is DEAD and waits for an operator.
        pub max_attempts: u32 = "5",
        /// A SENDING row claimed longer ago than this is taken again.
        pub sending_stale_ms: u64 = "60000",
        /// Rows claimed per dispatcher round.
        pub claim_batch: u32 = "100",
        /// SENT rows older than this are purged (1 day).
        pub sent_retention_s: u64 = "86400",
        /// Rows deleted per purge statement (small, to keep locks short).
        pub purge_batch: u32 = "1000",
    }
}

impl OutboxConfig {
    pub(super) fn validate(&self, bad: &mut Problems) {
        if self.backoff_ms.is_empty() {
            bad.push("outbox.backoff_ms", "needs at least one delay");
        }
        if self.max_attempts == 0 {
            bad.push("outbox.max_attempts", "must be positive");
        }
        if self.fixed_delay_ms == 0 {
            bad.push("outbox.fixed_delay_ms", "must be positive");
        }
        if self.claim_batch == 0 || self.purge_batch == 0 {
            bad.push("outbox.claim_batch", "claim_batch and purge_batch must be positive");
        }
    }
}
