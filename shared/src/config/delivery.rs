//! `[delivery]`: what the gateway and the worker must agree on about devices' pending sets.

use super::table::{section, BOTH};
use super::Problems;

section! {
    /// `[delivery]`: read by the worker that fills pending sets and the gateway that rebuilds them.
    pub struct DeliveryConfig in "delivery", read by BOTH;
    {
        /// Largest pending set per device; past it the oldest entries are dropped.
        ///
        /// What is dropped joins the device's overflow band, read from MySQL before the
        /// set when the device catches up. Formerly `worker.pending_cap`, still accepted
        /// as a deprecated alias.
        pub pending_cap: u64 = "10000",
        /// Device sync (`GET /v1/sync`) returns messages at least this old, by their id's time.
        ///
        /// Ids are drawn before COMMIT, so a younger message could still commit below
        /// an id already returned; the worker redraws ids of a batch not committed within
        /// half of this. Newer messages come by push or the next sync.
        pub sync_settle_ms: u64 = "5000",
        /// Devices unseen this long stop being fan-out targets and their Redis state is freed (30 days).
        ///
        /// A device in use writes its `last_seen_at` every 10 minutes, or every quarter of
        /// this TTL when that is shorter. A device that comes back is live again and
        /// catches up from its watermark (read from MySQL), so nothing is lost; only
        /// abandoned devices stop costing.
        pub device_ttl_s: u64 = "2592000",
        /// A sender's session shows at most one `delivered` frame per conversation this often.
        ///
        /// Acks move the members' delivered positions in batches, and each batch may
        /// change a sender's status; what arrives within an interval is held and the
        /// latest shown at its end (docs/protocol.md section 4.9).
        pub status_interval_ms: u64 = "1000",
    }
}

impl DeliveryConfig {
    /// How often a device in use has its `last_seen_at` written at most: every 10
    /// minutes, or a quarter of the device TTL when that is shorter, so a device in use
    /// is never taken for abandoned.
    pub fn last_seen_every(&self) -> std::time::Duration {
        std::time::Duration::from_secs((self.device_ttl_s / 4).min(600))
    }

    pub(super) fn validate(&self, bad: &mut Problems) {
        if self.pending_cap == 0 {
            bad.push("delivery.pending_cap", "must be positive");
        }
        if self.device_ttl_s < 60 {
            bad.push("delivery.device_ttl_s", "must be at least 60");
        }
        if !(10..=60_000).contains(&self.status_interval_ms) {
            bad.push("delivery.status_interval_ms", "must be 10..=60000");
        }
        if !(200..=600_000).contains(&self.sync_settle_ms) {
            bad.push("delivery.sync_settle_ms", "must be 200..=600000");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{argv, env, SECRET};
    use super::super::{load, Role};

    #[test]
    fn the_old_worker_key_still_sets_the_cap_and_is_reported() {
        let e = env(&[SECRET, ("HERALD_WORKER__PENDING_CAP", "77")]);
        let (cfg, cli) = load(Role::Gateway, &[], &e).unwrap();
        assert_eq!(cfg.delivery.pending_cap, 77);
        assert_eq!(cli.deprecated.len(), 1);
        assert_eq!(cli.deprecated[0].given, "worker.pending_cap (HERALD_WORKER__PENDING_CAP)");
        assert_eq!(cli.deprecated[0].replacement, "delivery.pending_cap");
        assert!(cli.ignored_env.is_empty(), "an alias is not an unknown variable");
        let text = cli.deprecated[0].to_string();
        assert!(text.contains("HERALD_DELIVERY__PENDING_CAP"), "{text}");

        let (cfg, cli) = load(Role::Worker, &argv(&["--set", "worker.pending_cap=5"]), &env(&[SECRET])).unwrap();
        assert_eq!(cfg.delivery.pending_cap, 5);
        assert_eq!(cli.deprecated[0].given, "worker.pending_cap (flag)");
    }

    #[test]
    fn the_new_key_wins_over_the_old_one_in_the_same_layer() {
        let e = env(&[SECRET, ("HERALD_WORKER__PENDING_CAP", "77"), ("HERALD_DELIVERY__PENDING_CAP", "88")]);
        assert_eq!(load(Role::Worker, &[], &e).unwrap().0.delivery.pending_cap, 88);
        let flags = argv(&["--set", "delivery.pending_cap=3", "--set", "worker.pending_cap=4"]);
        assert_eq!(load(Role::Worker, &flags, &e).unwrap().0.delivery.pending_cap, 3);
        // A later layer still wins, whatever name it uses.
        let e = env(&[SECRET, ("HERALD_DELIVERY__PENDING_CAP", "88")]);
        let flags = argv(&["--set", "worker.pending_cap=4"]);
        assert_eq!(load(Role::Worker, &flags, &e).unwrap().0.delivery.pending_cap, 4);
    }

    #[test]
    fn the_cap_must_be_positive() {
        let err = load(Role::Gateway, &[], &env(&[SECRET, ("HERALD_DELIVERY__PENDING_CAP", "0")])).unwrap_err();
        assert!(err.to_string().contains("delivery.pending_cap: must be positive"), "{err}");
        assert_eq!(super::DeliveryConfig::default().pending_cap, 10_000);
    }
}
