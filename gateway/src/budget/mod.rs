//! The node's adaptive backlog budget: how many backlog messages per second this
//! gateway's sessions may push together, set by what the node carries next to realtime.
//!
//! A fixed node rate is either too low for a quiet node or more than a busy one can
//! serve beside its realtime pushes (a 5 000-device storm at 100 000/s took realtime p99
//! from 18 ms to 8 s). The [`BudgetController`] instead watches two congestion signals,
//! the runtime's scheduling lag (a timer that should fire every 10 ms, and how late it
//! is) and the latency of this node's realtime pushes ([`RealtimeLatency`]), and moves
//! the rate of the [`BacklogBudget`] by AIMD ([`aimd`]) between
//! `gateway.backlog_rate_node_floor` and `gateway.backlog_rate_node`.
//!
//! # Layout
//! - `bucket`: [`BacklogBudget`], a token bucket whose rate can change, with the line
//!   of sessions waiting for it.
//! - `turn`: [`Turn`], a session's place in that line.
//! - [`aimd`]: the control law as a plain state machine.
//! - this module: the realtime signal and the controller's loop.

pub mod aimd;
mod bucket;
mod turn;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herald_shared::config::GatewayConfig;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use aimd::{Aimd, Signals, Targets};
pub use bucket::BacklogBudget;
pub use turn::{served, Turn};

/// The probe timer's period: short enough to see lag within a tick, long enough to cost
/// nothing (100 wake-ups a second).
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How often the rate is set: a few probes per tick, and a cut acts within a fraction
/// of a second.
const TICK: Duration = Duration::from_millis(100);

/// Realtime pushes of this node written since the controller last looked, and how many
/// of them were slower than `gateway.backlog_realtime_target_ms`. Two relaxed counters
/// and a histogram resolved once: every realtime push records itself.
#[derive(Debug)]
pub struct RealtimeLatency {
    target: Duration,
    pushes: AtomicU64,
    slow: AtomicU64,
    /// `herald_realtime_push_seconds`, looked up once rather than per push (the
    /// metrics recorder is installed before the node's limits are built).
    histogram: metrics::Histogram,
}

impl RealtimeLatency {
    pub fn new(target: Duration) -> RealtimeLatency {
        RealtimeLatency {
            target,
            pushes: AtomicU64::new(0),
            slow: AtomicU64::new(0),
            histogram: metrics::histogram!("herald_realtime_push_seconds"),
        }
    }

    /// One realtime push, from its arrival on the node channel to its frame written.
    pub fn record(&self, latency: Duration) {
        self.histogram.record(latency.as_secs_f64());
        self.pushes.fetch_add(1, Ordering::Relaxed);
        if latency > self.target {
            self.slow.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (pushes, slow ones) since the last call.
    pub(crate) fn take(&self) -> (u64, u64) {
        (self.pushes.swap(0, Ordering::Relaxed), self.slow.swap(0, Ordering::Relaxed))
    }
}

/// Sets the node's backlog rate every tick from the signals of the tick before.
#[derive(Clone, Debug)]
pub struct BudgetController {
    budget: Arc<BacklogBudget>,
    realtime: Arc<RealtimeLatency>,
    targets: Targets,
    floor: u32,
    ceiling: u32,
}

impl BudgetController {
    pub fn new(cfg: &GatewayConfig, budget: Arc<BacklogBudget>, realtime: Arc<RealtimeLatency>) -> BudgetController {
        let targets = Targets { lag: Duration::from_millis(cfg.backlog_lag_target_ms) };
        let (floor, ceiling) = (cfg.backlog_rate_node_floor, cfg.backlog_rate_node);
        BudgetController { budget, realtime, targets, floor, ceiling }
    }

    /// Probes the lag every 10 ms, serving the budget's line each time, and sets the
    /// rate every 100 ms, until cancelled. A restarted loop goes on from the rate the
    /// budget has.
    pub async fn run(self, cancel: CancellationToken) {
        let budget = &self.budget;
        let mut aimd = Aimd::new(self.floor, self.ceiling, budget.rate());
        metrics::gauge!("herald_backlog_budget_per_second").set(f64::from(aimd.rate()));
        let mut tick_from = Instant::now();
        let mut worst_lag = Duration::ZERO;
        loop {
            let asleep = Instant::now();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(PROBE_EVERY) => {}
            }
            budget.serve();
            let now = Instant::now();
            let lag = now.duration_since(asleep).saturating_sub(PROBE_EVERY);
            metrics::histogram!("herald_event_loop_lag_seconds").record(lag.as_secs_f64());
            worst_lag = worst_lag.max(lag);
            if now.duration_since(tick_from) < TICK {
                continue;
            }
            let (pushes, slow) = self.realtime.take();
            let signals = Signals { lag: worst_lag, pushes, slow };
            let congestion = signals.congestion(&self.targets);
            if let Some(c) = congestion {
                metrics::counter!("herald_backlog_budget_cuts_total", "signal" => c.label()).increment(1);
                tracing::debug!(
                    signal = c.label(),
                    lag_ms = worst_lag.as_millis() as u64,
                    pushes,
                    slow,
                    "backlog budget cut"
                );
            }
            let used = budget.taken() as f64 / now.duration_since(tick_from).as_secs_f64();
            let rate = aimd.tick(congestion.is_some(), used);
            budget.set_rate(rate);
            metrics::gauge!("herald_backlog_budget_per_second").set(f64::from(rate));
            (tick_from, worst_lag) = (now, Duration::ZERO);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller(floor: u32, ceiling: u32) -> BudgetController {
        let cfg = GatewayConfig { backlog_rate_node: ceiling, backlog_rate_node_floor: floor, ..Default::default() };
        let budget = Arc::new(BacklogBudget::new(ceiling, 200));
        BudgetController::new(&cfg, budget, Arc::new(RealtimeLatency::new(Duration::from_millis(25))))
    }

    #[test]
    fn realtime_pushes_are_counted_and_the_slow_ones_apart() {
        let r = RealtimeLatency::new(Duration::from_millis(25));
        r.record(Duration::from_millis(25));
        r.record(Duration::from_millis(26));
        r.record(Duration::from_millis(1));
        assert_eq!(r.take(), (3, 1));
        assert_eq!(r.take(), (0, 0), "each tick sees its own pushes");
    }

    /// Sessions taking all the budget there is, for `ticks` ticks.
    async fn busy(budget: &BacklogBudget, ticks: u32) {
        for _ in 0..ticks * 10 {
            // A turn let go of at once: the line drops it untaken.
            while budget.take_or_wait(50).is_ok() {}
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// With time paused nothing is late: the budget follows its use, and only slow
    /// realtime pushes cut it.
    #[tokio::test(start_paused = true)]
    async fn the_budget_grows_while_used_and_slow_realtime_pushes_cut_it() {
        let c = controller(1_000, 10_000);
        let (budget, realtime) = (c.budget.clone(), c.realtime.clone());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(c.run(cancel.clone()));
        tokio::time::sleep(TICK * 10 + PROBE_EVERY / 2).await;
        assert_eq!(budget.rate(), 1_000, "an idle node comes to rest at the floor");
        busy(&budget, 5).await;
        let grown = budget.rate();
        assert!((1_300..=1_600).contains(&grown), "steps of 1 % of the ceiling while used: {grown}");
        realtime.record(Duration::from_secs(1));
        busy(&budget, 1).await;
        let cut = budget.rate();
        assert!(cut < grown && cut >= 1_000, "a cut for a slow push: {grown} -> {cut}");
        busy(&budget, 120).await;
        assert_eq!(budget.rate(), 10_000, "the ceiling");
        tokio::time::sleep(TICK * 10).await;
        assert_eq!(budget.rate(), 1_000, "unused, back to the floor");
        cancel.cancel();
        task.await.unwrap();
    }
}
