//! `[worker]`: the committing process: batches, leases, fan-out, read receipts.

use super::table::{section, WORKER};
use super::Problems;

section! {
    /// `[worker]`: what the worker needs to commit and fan out.
    pub struct WorkerConfig in "worker", read by WORKER;
    {
        /// Most stream entries committed in one MySQL transaction.
        pub batch_max: usize = "512",
        /// Most bytes of message bodies committed in one MySQL transaction (4 MiB).
        ///
        /// Its statement must stay below the server's `max_allowed_packet`; one message
        /// always goes, whatever its size.
        pub batch_max_bytes: usize = "4194304",
        /// How long one XREADGROUP blocks waiting for entries.
        pub batch_block_ms: u64 = "1000",
        /// Lease time of shard ownership and of the snowflake worker id; renewed at a third.
        pub lease_ttl_ms: u64 = "6000",
        /// Apply migrations when the worker starts.
        pub migrate_on_start: bool = "true",
        /// How long the serialized frame of a message is kept in Redis (7 days).
        pub message_ttl_s: u64 = "604800",
        /// MySQL connections of the worker.
        pub db_pool_size: u32 = "16",
        /// Groups up to this size send `read` frames to every member's devices.
        ///
        /// Larger ones send them only to the reader's own other devices.
        pub read_fanout_max_group: usize = "50",
        /// How long an undelivered read position waits for an offline device (30 days).
        pub read_state_ttl_s: u64 = "2592000",
    }
}

/// The largest batch whose INSERT stays within MySQL's 65 535 placeholders.
pub const MAX_BATCH: usize = 65_535 / 9;

impl WorkerConfig {
    pub(super) fn validate(&self, bad: &mut Problems) {
        // A batch's message rows are one INSERT of 9 placeholders each, and MySQL takes
        // at most 65 535 placeholders in one statement.
        if self.batch_max == 0 || self.batch_max > MAX_BATCH {
            bad.push("worker.batch_max", &format!("must be 1..={MAX_BATCH} (MySQL's placeholder limit)"));
        }
        if self.batch_max_bytes < 1_024 {
            bad.push("worker.batch_max_bytes", "must be at least 1024");
        }
        if self.lease_ttl_ms < 300 {
            bad.push("worker.lease_ttl_ms", "must be at least 300");
        }
        if self.db_pool_size == 0 {
            bad.push("worker.db_pool_size", "must be positive");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, SECRET};
    use super::super::{load, Role};

    #[test]
    fn a_batch_over_mysqls_placeholder_limit_is_refused() {
        let at = |n: &str| load(Role::Worker, &[], &env(&[SECRET, ("HERALD_WORKER__BATCH_MAX", n)]));
        assert!(at("7281").is_ok());
        let err = at("7282").unwrap_err().to_string();
        assert!(err.contains("worker.batch_max: must be 1..=7281"), "{err}");
    }
}
