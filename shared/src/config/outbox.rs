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
        /// How long the SENT marks of finished fan-outs gather before one UPDATE writes them.
        ///
        /// Each UPDATE is a transaction of its own (and an fsync): at low load, with a
        /// batch or two per commit, marking each at once cost MariaDB as much as the
        /// commit. Less than `outbox.first_retry_delay_ms`, or the dispatcher redoes them.
        pub sent_mark_linger_ms: u64 = "100",
        /// Delay before retry n, comma-separated (the last value repeats).
        pub backoff_ms: Vec<u64> = "5000,20000,80000,320000,1280000",
        /// Failed retries before an event is DEAD and waits for an operator.
        pub max_attempts: u32 = "5",
        /// A SENDING row claimed longer ago than this is taken again; more than one second.
        ///
        /// It must outlast the dispatch that claimed the row, or two dispatches fan the
        /// event out at once.
        pub sending_stale_ms: u64 = "60000",
        /// Rows claimed per dispatcher round.
        pub claim_batch: u32 = "100",
        /// SENT rows are kept this long for the admin trace, then purged (1 hour).
        ///
        /// The purge runs every dispatcher round and keeps up with the rate rows are made.
        pub sent_retention_s: u64 = "3600",
        /// Rows deleted per purge statement (small, to keep locks short).
        pub purge_batch: u32 = "1000",
    }
}

impl OutboxConfig {
    /// How long after its commit an event may still be fanned out: due after the first
    /// delay, then each failed attempt's backoff, and a claim gone stale once more.
    pub fn retry_window_ms(&self) -> u64 {
        let backoff = |n: usize| self.backoff_ms.get(n).or(self.backoff_ms.last()).copied().unwrap_or(0);
        let retries: u64 = (0..self.max_attempts as usize).map(backoff).sum();
        self.first_retry_delay_ms + retries + self.sending_stale_ms
    }

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
        if self.sent_mark_linger_ms >= self.first_retry_delay_ms {
            bad.push("outbox.sent_mark_linger_ms", "must be less than outbox.first_retry_delay_ms");
        }
        if self.claim_batch == 0 || self.purge_batch == 0 {
            bad.push("outbox.claim_batch", "claim_batch and purge_batch must be positive");
        }
        // A claim younger than this may belong to a dispatch still running; taking it
        // again would fan the event out twice at once. No other setting lowers the bound.
        if self.sending_stale_ms <= 1_000 {
            bad.push("outbox.sending_stale_ms", "must exceed one second (1000)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, SECRET};
    use super::super::{load, Role};

    fn stale(send_timeout_ms: &str, sending_stale_ms: &str) -> Result<u64, String> {
        let e = env(&[
            SECRET,
            ("HERALD_GATEWAY__SEND_TIMEOUT_MS", send_timeout_ms),
            ("HERALD_OUTBOX__SENDING_STALE_MS", sending_stale_ms),
        ]);
        load(Role::Worker, &[], &e).map(|(cfg, _)| cfg.outbox.sending_stale_ms).map_err(|e| e.to_string())
    }

    #[test]
    fn a_sending_row_is_not_reclaimed_within_one_second() {
        // A short gateway send timeout used to lower the bound below one second.
        for (timeout, value) in [("500", "800"), ("500", "1000"), ("5000", "1000"), ("100", "0")] {
            let err = stale(timeout, value).expect_err(value);
            assert!(err.contains("outbox.sending_stale_ms: must exceed one second"), "{err}");
        }
        assert_eq!(stale("500", "1001"), Ok(1_001));
        assert_eq!(stale("5000", "1500"), Ok(1_500), "as the reclaim end-to-end test sets it");
    }

    #[test]
    fn sent_marks_gather_for_less_than_the_first_retry_delay() {
        let linger = |first: &str, linger: &str| {
            let e = env(&[
                SECRET,
                ("HERALD_OUTBOX__FIRST_RETRY_DELAY_MS", first),
                ("HERALD_OUTBOX__SENT_MARK_LINGER_MS", linger),
            ]);
            load(Role::Worker, &[], &e).map(|(cfg, _)| cfg.outbox.sent_mark_linger_ms).map_err(|e| e.to_string())
        };
        assert_eq!(linger("1000", "100"), Ok(100));
        assert_eq!(linger("1000", "0"), Ok(0));
        let err = linger("1000", "1000").unwrap_err();
        assert!(err.contains("outbox.sent_mark_linger_ms: must be less than outbox.first_retry_delay_ms"), "{err}");
    }

    #[test]
    fn the_watermark_margin_must_cover_the_outbox_retry_window() {
        let o = super::OutboxConfig::default();
        assert_eq!(o.retry_window_ms(), 5_000 + 5_000 + 20_000 + 80_000 + 320_000 + 1_280_000 + 60_000);
        assert!(load(Role::Gateway, &[], &env(&[SECRET])).is_ok(), "the defaults agree");
        let short = env(&[SECRET, ("HERALD_GATEWAY__WATERMARK_MARGIN_MS", "1000")]);
        let err = load(Role::Worker, &[], &short).unwrap_err().to_string();
        assert!(
            err.contains("gateway.watermark_margin_ms: must be at least the outbox's whole retry schedule"),
            "{err}"
        );
        let fast_outbox = env(&[
            SECRET,
            ("HERALD_GATEWAY__WATERMARK_MARGIN_MS", "1000"),
            ("HERALD_OUTBOX__FIRST_RETRY_DELAY_MS", "100"),
            ("HERALD_OUTBOX__SENT_MARK_LINGER_MS", "50"),
            ("HERALD_OUTBOX__BACKOFF_MS", "100"),
            ("HERALD_OUTBOX__MAX_ATTEMPTS", "3"),
            ("HERALD_OUTBOX__SENDING_STALE_MS", "1500"),
        ]);
        let err = load(Role::Gateway, &[], &fast_outbox).unwrap_err().to_string();
        assert!(err.contains("1900 ms"), "100 + 3 x 100 + 1500: {err}");
        let fits = env(&[
            SECRET,
            ("HERALD_GATEWAY__WATERMARK_MARGIN_MS", "1900"),
            ("HERALD_OUTBOX__FIRST_RETRY_DELAY_MS", "100"),
            ("HERALD_OUTBOX__SENT_MARK_LINGER_MS", "50"),
            ("HERALD_OUTBOX__BACKOFF_MS", "100"),
            ("HERALD_OUTBOX__MAX_ATTEMPTS", "3"),
            ("HERALD_OUTBOX__SENDING_STALE_MS", "1500"),
        ]);
        assert!(load(Role::Gateway, &[], &fits).is_ok());
    }
}
