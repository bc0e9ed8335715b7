//! Latency histograms (HDR, 1 us to 1 h, 3 significant digits) for the whole run and
//! per tick, sharded by thread: recording a send or a delivery takes no lock another
//! thread holds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

pub fn micros_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

/// p50/p95/p99/max in milliseconds.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Pct {
    pub count: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Pct {
    pub fn of(h: &Histogram<u64>) -> Pct {
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Pct { count: h.len(), p50: ms(0.5), p95: ms(0.95), p99: ms(0.99), max: h.max() as f64 / 1000.0 }
    }
}

/// One sample of the run, every `tick`.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Tick {
    pub t_s: f64,
    pub sends_per_s: f64,
    pub deliveries_per_s: f64,
    pub backlog_delivered: u64,
    pub send_ack_p99_ms: f64,
    /// How far behind their schedule sends went out (absent from older reports).
    #[serde(default)]
    pub send_lag_p99_ms: f64,
    pub realtime_p50_ms: f64,
    pub realtime_p99_ms: f64,
    pub online: i64,
    pub note: Option<String>,
}

/// A latency histogram for the whole run and one for the current tick.
pub(super) struct Hist {
    pub(super) total: Histogram<u64>,
    pub(super) window: Histogram<u64>,
}

impl Hist {
    pub(super) fn new() -> Hist {
        Hist { total: histogram(), window: histogram() }
    }

    pub(super) fn record(&mut self, micros: u64) {
        let v = micros.max(1);
        let _ = self.total.record(v);
        let _ = self.window.record(v);
    }
}

/// One shard of the recorder's histograms. Each thread records into its own shard, so
/// devices and senders never wait on one another for a lock; the shards are merged
/// when a tick or the report reads them.
/// Send-ack and realtime delivery latencies count from when the message was due by its
/// sender's schedule; the `_actual` ones from when it was sent.
pub(super) struct Shard {
    pub(super) send_ack: Hist,
    pub(super) send_ack_actual: Histogram<u64>,
    pub(super) realtime: Hist,
    pub(super) realtime_actual: Histogram<u64>,
    pub(super) send_lag: Hist,
    pub(super) own_lag: Histogram<u64>,
    pub(super) backlog: Histogram<u64>,
    pub(super) catch_up: Histogram<u64>,
}

impl Shard {
    pub(super) fn new() -> Mutex<Shard> {
        Mutex::new(Shard {
            send_ack: Hist::new(),
            send_ack_actual: histogram(),
            realtime: Hist::new(),
            realtime_actual: histogram(),
            send_lag: Hist::new(),
            own_lag: histogram(),
            backlog: histogram(),
            catch_up: histogram(),
        })
    }
}

pub(super) fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

/// This thread's number, for its shard.
pub(super) fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed));
    INDEX.with(|i| *i)
}
