//! This process's clock against Redis's (`TIME`), the one clock every process reaches.
//!
//! Device sync is gap-free only while clocks agree (docs/reliability.md, "Assumptions
//! checked at run time"): a worker stamps message ids with its clock and commits them
//! within half of `delivery.sync_settle_ms`, and a gateway's sync returns ids older than
//! the settle window by its own clock. A gateway ahead of a worker by more than the other
//! half could return an id above one that still commits. Each process keeps its offset
//! from Redis within a quarter of the settle window, so any two stay within half of it:
//! it is measured every [`CHECK_EVERY`], exported (`herald_clock_offset_seconds`, with
//! the bound in `herald_clock_offset_bound_seconds`) and warned about past the bound.

use std::time::Duration;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use tokio_util::sync::CancellationToken;

use crate::ids::now_ms;

/// Clocks drift slowly; one `TIME` every few seconds is plenty.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// How far one process's clock may be from Redis's: a quarter of the settle window.
pub fn offset_bound_ms(sync_settle_ms: u64) -> u64 {
    sync_settle_ms / 4
}

/// The offset of this clock from Redis's, in ms (positive: this clock is ahead), from
/// the local time before and after a `TIME` and Redis's answer (seconds, microseconds).
/// The answer is taken to be from the middle of the round trip, so the error is at most
/// half of it.
pub fn offset_ms(before_ms: u64, after_ms: u64, redis_secs: u64, redis_micros: u64) -> f64 {
    let local = (before_ms as f64 + after_ms as f64) / 2.0;
    let redis = redis_secs as f64 * 1000.0 + redis_micros as f64 / 1000.0;
    local - redis
}

/// Measures this clock's offset from Redis's, in ms.
pub async fn measure(client: &Client) -> Result<f64, Error> {
    let before = now_ms();
    let time: Vec<String> =
        client.custom(CustomCommand::new_static("TIME", ClusterHash::Random, false), Vec::<Value>::new()).await?;
    let after = now_ms();
    let part = |i: usize| time.get(i).and_then(|v| v.parse::<u64>().ok());
    match (part(0), part(1)) {
        (Some(secs), Some(micros)) => Ok(offset_ms(before, after, secs, micros)),
        _ => Err(Error::new(ErrorKind::Protocol, format!("TIME answered {time:?}"))),
    }
}

/// The supervised loop that keeps the offset measured and exported.
#[derive(Clone, Debug)]
pub struct ClockWatch {
    pub redis: Pool,
    pub bound_ms: u64,
}

impl ClockWatch {
    pub fn new(redis: Pool, sync_settle_ms: u64) -> ClockWatch {
        ClockWatch { redis, bound_ms: offset_bound_ms(sync_settle_ms) }
    }

    pub async fn run(self, cancel: CancellationToken) {
        metrics::gauge!("herald_clock_offset_bound_seconds").set(self.bound_ms as f64 / 1000.0);
        loop {
            match measure(self.redis.next()).await {
                Ok(offset) => {
                    metrics::gauge!("herald_clock_offset_seconds").set(offset / 1000.0);
                    if offset.abs() > self.bound_ms as f64 {
                        tracing::warn!(
                            offset_ms = offset.round(),
                            bound_ms = self.bound_ms,
                            "this clock is off from Redis's by more than a quarter of delivery.sync_settle_ms: \
                             device sync may skip a message; synchronize the clocks (NTP)"
                        );
                    }
                }
                Err(e) => tracing::debug!(error = %e, "clock offset not measured"),
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_from_the_middle_of_the_round_trip() {
        // Sent at 1 000 ms, answered at 1 010 ms; Redis said 1.000 500 s.
        assert_eq!(offset_ms(1_000, 1_010, 1, 500), 4.5);
        // A clock 3 s behind Redis.
        assert_eq!(offset_ms(7_000, 7_000, 10, 0), -3_000.0);
    }

    #[test]
    fn each_process_gets_a_quarter_so_two_stay_within_half_the_settle_window() {
        assert_eq!(offset_bound_ms(5_000), 1_250);
        assert!(2 * offset_bound_ms(5_000) <= 5_000 / 2);
    }
}
