//! `[worker]`: the committing process: batches, leases, fan-out, read receipts, and the
//! rules of timeline events it checks at commit (recall and edit windows).

use super::table::{section, WORKER};
use super::Problems;

section! {
    /// `[worker]`: what the worker needs to commit and fan out.
    pub struct WorkerConfig in "worker", read by WORKER;
    {
        /// Most stream entries committed in one MySQL transaction.
        pub batch_max: usize = "512",
        /// Most bytes a MySQL transaction's statements carry for its messages (4 MiB).
        ///
        /// Counted as sent: every string hex-encoded (twice its size) plus each row's
        /// numbers. With 4 KiB of SQL around it, it must fit in the server's
        /// `max_allowed_packet`: the worker refuses to start otherwise. A message alone
        /// always goes, unless it cannot fit in a packet (answered `too_large`).
        pub batch_max_bytes: usize = "4194304",
        /// MySQL transactions of sends a worker runs at once.
        ///
        /// While all are busy, the batches its shards read meanwhile wait and are then
        /// committed together in one transaction (group commit): fewer, larger
        /// transactions cost MariaDB less per message (docs/benchmarks.md).
        pub commits_in_flight: usize = "2",
        /// Milliseconds the latest transaction of sends runs before another may start beside it.
        ///
        /// Up to `worker.commits_in_flight`; until then the batches read meanwhile wait
        /// and group up into the next one. 0 starts one whenever a slot is free.
        ///
        /// One transaction at a time is the cheapest while commits are quick; a commit
        /// held up (a lock wait, a very large group) holds up the worker's other shards
        /// for this long only (docs/capacity.md).
        pub commit_overlap_ms: u64 = "20",
        /// Devices the worker keeps between commits as conversations' recipients; 0 reads them in every commit.
        ///
        /// A commit reads a conversation's members and their devices only when the
        /// conversation changed since (another writer's commit, a member change) or its
        /// tenant's devices did (a device registered, back, logged out, expired, given a
        /// push token); otherwise they come from memory (docs/architecture.md section 3).
        /// 200 - 300 bytes a device; past the bound the cache starts again empty.
        /// Membership or devices edited in MySQL by hand are seen once the conversation's
        /// `last_seq` or the tenant's `device_epochs` row moves: raise the epoch (or set
        /// this to 0) when editing them outside Herald.
        pub recipient_cache_devices: usize = "500000",
        /// Milliseconds a shard's delivered positions wait for more before they are applied.
        ///
        /// Positions that arrive meanwhile are applied together: one read of their
        /// conversations' members and one upsert per round, however many acks and
        /// gateways' flushes it covers. The senders' `delivered` frames come up to this
        /// much later (a sender is shown one per `delivery.status_interval_ms` anyway).
        /// Read receipts never wait: a round with one applies at once. 0 applies every
        /// batch's positions as soon as its sends are committed.
        pub delivered_linger_ms: u64 = "500",
        /// How long one XREADGROUP blocks waiting for entries.
        pub batch_block_ms: u64 = "1000",
        /// Lease time of shard ownership and of the snowflake worker id; renewed at a third.
        pub lease_ttl_ms: u64 = "6000",
        /// Apply migrations when the worker starts.
        pub migrate_on_start: bool = "true",
        /// How long the serialized frame of a message is kept in Redis (5 minutes).
        ///
        /// Realtime pushes carry their frame; a backlog page reads frames from Redis and
        /// rebuilds the rest from MySQL, so this window sizes Redis memory, not delivery.
        pub message_ttl_s: u64 = "300",
        /// MySQL connections of the worker's pool; its commits keep up to `worker.commits_in_flight` more.
        pub db_pool_size: u32 = "16",
        /// Groups up to this size send `read` frames to every member's devices.
        ///
        /// Larger ones send them only to the reader's own other devices.
        pub read_fanout_max_group: usize = "50",
        /// How long an undelivered read position waits for an offline device (30 days).
        pub read_state_ttl_s: u64 = "2592000",
        /// Messages older than this many days are deleted; 0 keeps them forever.
        pub retention_days: u64 = "0",
        /// Retention of particular tenants, `tenant=days` comma-separated (0 days: forever).
        pub retention_overrides: String = "",
        /// Days the key (`cmid`) of a message deleted by retention is kept; 0 keeps it forever.
        ///
        /// A resend of a deleted message (an outbox that was offline past the retention)
        /// is a repeat while its key is kept (about 100 bytes a message, `message_keys`).
        /// Counted from the message's commit, so it must exceed every retention.
        pub message_key_days: u64 = "0",
        /// Seconds after its expiry that a device's row is deleted (a year); 0 keeps the rows.
        ///
        /// A device forgotten this way that returns is registered as a new device: it
        /// gets messages committed from then on and reads older ones by sync, like a
        /// reinstalled app. Until then an expired device returns with its watermark.
        pub device_forget_s: u64 = "31536000",
        /// Period of the janitor: expired and forgotten devices, retention, dead consumers.
        pub janitor_interval_ms: u64 = "60000",
        /// How long after sending its sender may recall a message (1 day); 0: never.
        ///
        /// Checked when the recall commits, against the message's commit time. A
        /// group's owner and admins recall lower-ranked members' messages at any time.
        pub recall_window_s: u64 = "86400",
        /// How long after sending its sender may edit a message (15 minutes); 0: never.
        ///
        /// Checked when the edit commits, against the message's commit time; only the
        /// sender ever edits.
        pub edit_window_s: u64 = "900",
    }
}

/// The largest batch whose INSERT stays within MySQL's 65 535 placeholders.
pub const MAX_BATCH: usize = 65_535 / 9;

impl WorkerConfig {
    /// Whether retention deletes messages of any tenant.
    pub fn retention_enabled(&self) -> bool {
        self.retention_days > 0 || self.retention_by_tenant().is_ok_and(|o| o.iter().any(|(_, d)| *d > 0))
    }

    /// `worker.retention_overrides` as (tenant, days).
    pub fn retention_by_tenant(&self) -> Result<Vec<(String, u64)>, String> {
        let mut out = Vec::new();
        for part in self.retention_overrides.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let parsed = part.split_once('=').and_then(|(t, d)| {
                let t = t.trim();
                crate::auth::is_valid_tenant(t).then_some(())?;
                Some((t.to_owned(), d.trim().parse::<u64>().ok()?))
            });
            match parsed {
                Some(p) => out.push(p),
                None => return Err(format!("expected tenant=days, comma-separated; got {part:?}")),
            }
        }
        Ok(out)
    }

    pub(super) fn validate(&self, bad: &mut Problems) {
        // A batch's message rows are one INSERT of 9 placeholders each, and MySQL takes
        // at most 65 535 placeholders in one statement.
        if self.batch_max == 0 || self.batch_max > MAX_BATCH {
            bad.push("worker.batch_max", &format!("must be 1..={MAX_BATCH} (MySQL's placeholder limit)"));
        }
        match self.retention_by_tenant() {
            Err(e) => bad.push("worker.retention_overrides", &e),
            Ok(overrides) => {
                let longest = overrides.iter().map(|(_, d)| *d).chain([self.retention_days]).max().unwrap_or(0);
                if self.message_key_days != 0 && self.message_key_days <= longest {
                    bad.push(
                        "worker.message_key_days",
                        &format!("must be 0 (forever) or more than the longest retention ({longest} days)"),
                    );
                }
            }
        }
        // Redis refuses an expiry of 0: every fan-out would fail.
        if self.message_ttl_s == 0 {
            bad.push("worker.message_ttl_s", "must be at least 1");
        }
        if self.janitor_interval_ms < 100 {
            bad.push("worker.janitor_interval_ms", "must be at least 100");
        }
        if !(1..=64).contains(&self.commits_in_flight) {
            bad.push("worker.commits_in_flight", "must be 1..=64");
        }
        if self.batch_max_bytes < 1_024 {
            bad.push("worker.batch_max_bytes", "must be at least 1024");
        }
        if self.delivered_linger_ms > 10_000 {
            bad.push("worker.delivered_linger_ms", "must be at most 10000");
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

    #[test]
    fn a_message_ttl_of_zero_is_refused() {
        let at = |n: &str| load(Role::Worker, &[], &env(&[SECRET, ("HERALD_WORKER__MESSAGE_TTL_S", n)]));
        assert!(at("1").is_ok());
        let err = at("0").unwrap_err().to_string();
        assert!(err.contains("worker.message_ttl_s: must be at least 1"), "{err}");
    }

    #[test]
    fn the_message_key_window_must_outlast_every_retention() {
        let at = |keys: &str, days: &str, overrides: &str| {
            load(
                Role::Worker,
                &[],
                &env(&[
                    SECRET,
                    ("HERALD_WORKER__MESSAGE_KEY_DAYS", keys),
                    ("HERALD_WORKER__RETENTION_DAYS", days),
                    ("HERALD_WORKER__RETENTION_OVERRIDES", overrides),
                ]),
            )
        };
        assert!(at("0", "30", "legal=400").is_ok(), "0 keeps keys forever");
        assert!(at("401", "30", "legal=400,acme=0").is_ok());
        for (keys, days, overrides) in [("30", "30", ""), ("100", "30", "legal=400")] {
            let err = at(keys, days, overrides).unwrap_err().to_string();
            assert!(err.contains("worker.message_key_days: must be 0 (forever) or more than the longest"), "{err}");
        }
        let (cfg, _) = at("0", "0", "short=1").unwrap();
        assert!(cfg.worker.retention_enabled(), "an override deletes messages");
        let (cfg, _) = at("0", "0", "legal=0").unwrap();
        assert!(!cfg.worker.retention_enabled());
    }
}
