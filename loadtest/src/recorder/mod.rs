//! The recorder of a scenario: HDR histograms for the whole run and per-tick series,
//! counters shared by senders and devices, and the progress line. The histograms are
//! sharded by thread: recording a send or a delivery takes no lock another thread holds.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use herald_client::device::{Observer, Via};
use herald_shared::protocol::{Message, ServerFrame};

mod latency;

pub use latency::{histogram, micros_now, Pct, Tick};
use latency::{micros, thread_index, Shard};

/// Counters and histograms shared by senders, devices and the progress display.
pub struct Recorder {
    started: Instant,
    pub sends: AtomicU64,
    pub send_errors: AtomicU64,
    /// Sends that went out (first attempts; retries are not counted).
    pub sent: AtomicU64,
    /// Sends due before their sender stopped that never went out.
    pub unsent_due: AtomicU64,
    pub delivered: AtomicU64,
    pub backlog_delivered: AtomicU64,
    pub caught_up: AtomicU64,
    /// `history` answers to the devices' `sync` (gaps being filled).
    pub histories: AtomicU64,
    /// `typing` frames shown (another member typing).
    pub typing: AtomicU64,
    /// `presence` frames shown (a followed user's presence, at subscription or a change).
    pub presence: AtomicU64,
    pub online: AtomicI64,
    shards: Box<[Mutex<Shard>]>,
    series: Mutex<Vec<Tick>>,
    notes: Mutex<Vec<String>>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        // Twice the cores: the runtime's threads rarely share a shard.
        let shards = (std::thread::available_parallelism().map_or(1, |n| n.get()) * 2).clamp(4, 64);
        Arc::new(Recorder {
            started: Instant::now(),
            sends: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            unsent_due: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            backlog_delivered: AtomicU64::new(0),
            caught_up: AtomicU64::new(0),
            histories: AtomicU64::new(0),
            typing: AtomicU64::new(0),
            presence: AtomicU64::new(0),
            online: AtomicI64::new(0),
            shards: (0..shards).map(|_| Shard::new()).collect(),
            series: Mutex::new(Vec::new()),
            notes: Mutex::new(Vec::new()),
        })
    }

    /// This thread's shard (uncontended but for the monitor's reads once a tick).
    fn shard(&self) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[thread_index() % self.shards.len()].lock().expect("histograms")
    }

    /// One histogram of every shard, merged.
    fn merged(&self, pick: impl Fn(&Shard) -> &Histogram<u64>) -> Histogram<u64> {
        let mut out = histogram();
        for s in self.shards.iter() {
            out.add(pick(&s.lock().expect("histograms"))).expect("same bounds");
        }
        out
    }

    /// The current tick's values of one histogram at quantiles `q` (ms), over every
    /// shard; the tick's histograms start again.
    fn take_window(&self, pick: impl Fn(&mut Shard) -> &mut Histogram<u64>, q: &[f64]) -> Vec<f64> {
        let mut h = histogram();
        for s in self.shards.iter() {
            let mut s = s.lock().expect("histograms");
            let w = pick(&mut s);
            h.add(&*w).expect("same bounds");
            w.reset();
        }
        q.iter().map(|q| h.value_at_quantile(*q) as f64 / 1000.0).collect()
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// A send without a schedule was acknowledged `took` after it went out.
    pub fn send_acked(&self, took: Duration) {
        self.send_done(took, took);
    }

    /// A send was acknowledged, `from_due` after its schedule wanted it sent and
    /// `from_sent` after it went out.
    pub fn send_done(&self, from_due: Duration, from_sent: Duration) {
        self.sends.fetch_add(1, Ordering::Relaxed);
        let mut s = self.shard();
        s.send_ack.record(micros(from_due));
        let _ = s.send_ack_actual.record(micros(from_sent));
    }

    /// A scheduled send went out `lag` after it was due, `own` of it with a send slot free
    /// (the load generator's own delay).
    pub fn send_issued(&self, lag: Duration, own: Duration) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let mut s = self.shard();
        s.send_lag.record(micros(lag));
        let _ = s.own_lag.record(micros(own));
    }

    /// A line in the series at the next tick (chaos actions, phase changes).
    pub fn note(&self, text: impl Into<String>) {
        let text = text.into();
        eprintln!("[{:>6.1}s] {text}", self.elapsed().as_secs_f64());
        self.notes.lock().expect("notes").push(text);
    }

    /// Send to ack, from when the send was due.
    pub fn send_ack(&self) -> Pct {
        Pct::of(&self.merged(|s| &s.send_ack.total))
    }
    /// Send to ack, from when the send went out.
    pub fn send_ack_from_actual(&self) -> Pct {
        Pct::of(&self.merged(|s| &s.send_ack_actual))
    }
    /// Realtime delivery, from when the send was due.
    pub fn realtime(&self) -> Pct {
        Pct::of(&self.merged(|s| &s.realtime.total))
    }
    /// Realtime delivery, from when the send went out.
    pub fn realtime_from_actual(&self) -> Pct {
        Pct::of(&self.merged(|s| &s.realtime_actual))
    }
    pub fn send_lag(&self) -> Pct {
        Pct::of(&self.merged(|s| &s.send_lag.total))
    }
    pub fn own_lag(&self) -> Pct {
        Pct::of(&self.merged(|s| &s.own_lag))
    }
    pub fn backlog(&self) -> Pct {
        Pct::of(&self.merged(|s| &s.backlog))
    }
    pub fn catch_up(&self) -> Pct {
        Pct::of(&self.merged(|s| &s.catch_up))
    }
    pub fn series(&self) -> Vec<Tick> {
        self.series.lock().expect("series").clone()
    }

    /// Realtime delivery latency of the ticks in `[from, to)` seconds (from the per-tick
    /// p99s: the worst tick's p99 is reported).
    pub fn realtime_p99_between(&self, from: f64, to: f64) -> f64 {
        self.series
            .lock()
            .expect("series")
            .iter()
            .filter(|t| t.t_s > from && t.t_s <= to + 1e-9)
            .map(|t| t.realtime_p99_ms)
            .fold(0.0, f64::max)
    }

    /// Samples the counters every `every` and prints a progress line about once a
    /// second, until `stop`.
    pub fn monitor(
        self: &Arc<Self>,
        label: &'static str,
        every: Duration,
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let rec = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            let (mut sends, mut delivered) = (0u64, 0u64);
            let mut printed = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let secs = every.as_secs_f64();
                let (s, d) = (rec.sends.load(Ordering::Relaxed), rec.delivered.load(Ordering::Relaxed));
                let ack = rec.take_window(|s| &mut s.send_ack.window, &[0.99]);
                let lag = rec.take_window(|s| &mut s.send_lag.window, &[0.99]);
                let rt = rec.take_window(|s| &mut s.realtime.window, &[0.5, 0.99]);
                let notes = std::mem::take(&mut *rec.notes.lock().expect("notes"));
                let t = Tick {
                    t_s: rec.elapsed().as_secs_f64(),
                    sends_per_s: (s - sends) as f64 / secs,
                    deliveries_per_s: (d - delivered) as f64 / secs,
                    backlog_delivered: rec.backlog_delivered.load(Ordering::Relaxed),
                    send_ack_p99_ms: ack[0],
                    send_lag_p99_ms: lag[0],
                    realtime_p50_ms: rt[0],
                    realtime_p99_ms: rt[1],
                    online: rec.online.load(Ordering::Relaxed),
                    note: (!notes.is_empty()).then(|| notes.join("; ")),
                };
                (sends, delivered) = (s, d);
                if printed.elapsed() >= Duration::from_millis(990) {
                    printed = Instant::now();
                    eprintln!(
                        "[{:>6.1}s] {label}: sends {:>6.0}/s (ack p99 {:>6.1} ms, lag p99 {:>6.1} ms, errors {})  deliveries {:>7.0}/s (realtime p99 {:>6.1} ms)  backlog delivered {}  online {}",
                        t.t_s,
                        t.sends_per_s,
                        t.send_ack_p99_ms,
                        t.send_lag_p99_ms,
                        rec.send_errors.load(Ordering::Relaxed),
                        t.deliveries_per_s,
                        t.realtime_p99_ms,
                        t.backlog_delivered,
                        t.online,
                    );
                }
                rec.series.lock().expect("series").push(t);
            }
        })
    }
}

/// When the load-test's schedule wanted a message sent (`ti` in its body, else `t0`) and
/// when it was sent (`t0`), in wall-clock microseconds.
fn sent_at(msg: &Message) -> Option<(u64, u64)> {
    #[derive(serde::Deserialize)]
    struct Body {
        t0: Option<u64>,
        ti: Option<u64>,
    }
    let b = serde_json::from_str::<Body>(msg.body.get()).ok()?;
    b.t0.map(|t0| (b.ti.unwrap_or(t0), t0))
}

impl Observer for Recorder {
    fn message(&self, msg: &Message, via: Via, into_session: Duration) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let now = micros_now();
        let age = sent_at(msg).map(|(due, sent)| (now.saturating_sub(due), now.saturating_sub(sent)));
        match via {
            Via::Realtime => {
                if let Some((from_due, from_sent)) = age {
                    let mut s = self.shard();
                    s.realtime.record(from_due);
                    let _ = s.realtime_actual.record(from_sent.max(1));
                }
            }
            Via::Backlog | Via::Sync => {
                self.backlog_delivered.fetch_add(1, Ordering::Relaxed);
                // Backlog latency counts from when the device came back, not from the send.
                let since = into_session.as_micros() as u64;
                let _ = self.shard().backlog.record(age.map_or(since, |(_, sent)| sent.min(since)).max(1));
            }
        }
    }

    fn caught_up(&self, after: Duration) {
        self.caught_up.fetch_add(1, Ordering::Relaxed);
        let _ = self.shard().catch_up.record((after.as_micros() as u64).max(1));
    }

    fn online(&self, up: bool) {
        self.online.fetch_add(if up { 1 } else { -1 }, Ordering::Relaxed);
    }

    fn frame(&self, frame: &ServerFrame) {
        let counter = match frame {
            ServerFrame::History(_) => &self.histories,
            ServerFrame::Typing(_) => &self.typing,
            ServerFrame::Presence(_) => &self.presence,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_every_thread_are_merged_and_a_tick_starts_afresh() {
        let rec = Recorder::new();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let rec = &rec;
                s.spawn(move || {
                    for k in 1..=1000u64 {
                        rec.send_acked(Duration::from_micros(t * 1000 + k));
                    }
                });
            }
        });
        let p = rec.send_ack();
        assert_eq!((p.count, rec.sends.load(Ordering::Relaxed)), (8000, 8000));
        assert!((p.max - 8.0).abs() < 0.01, "{p:?}");
        let tick = rec.take_window(|s| &mut s.send_ack.window, &[0.5, 1.0]);
        assert!((tick[1] - 8.0).abs() < 0.01, "{tick:?}");
        assert_eq!(rec.take_window(|s| &mut s.send_ack.window, &[1.0]), [0.0], "the tick's histograms were reset");
        assert_eq!(rec.send_ack().count, 8000, "the run's are kept");
    }

    fn msg(body: serde_json::Value) -> Message {
        Message {
            id: herald_shared::ids::MsgId(1),
            conv: "c".into(),
            seq: 1,
            from: "u".into(),
            cmid: "m0".into(),
            ts: 0,
            body: serde_json::value::to_raw_value(&body).unwrap(),
            status: None,
            event: None,
            edited_seq: None,
            recalled_seq: None,
        }
    }

    #[test]
    fn latencies_count_from_the_due_time_and_from_the_send() {
        let rec = Recorder::new();
        // due 300 ms ago, sent 100 ms ago (the sender was 200 ms behind), acked now
        rec.send_done(Duration::from_millis(300), Duration::from_millis(100));
        rec.send_issued(Duration::from_millis(200), Duration::from_millis(5));
        let now = micros_now();
        rec.message(&msg(serde_json::json!({"t0": now - 100_000, "ti": now - 300_000})), Via::Realtime, Duration::ZERO);
        // a body without a due time (a send without a schedule) counts from its send
        rec.message(&msg(serde_json::json!({"t0": now - 40_000})), Via::Realtime, Duration::ZERO);
        // Latencies count up to when they are recorded, a little after `now` (more on a
        // loaded machine): never less than meant, and far from the other cases.
        let near = |v: f64, want: f64| v > want * 0.95 - 2.0 && v < want + 30.0;
        let (ack, ack_sent) = (rec.send_ack(), rec.send_ack_from_actual());
        assert!(near(ack.max, 300.0) && near(ack_sent.max, 100.0), "{ack:?} {ack_sent:?}");
        let (rt, rt_sent) = (rec.realtime(), rec.realtime_from_actual());
        assert_eq!((rt.count, rt_sent.count), (2, 2));
        assert!(near(rt.max, 300.0) && near(rt_sent.max, 100.0), "{rt:?} {rt_sent:?}");
        assert!(near(rt.p50, 40.0) && near(rt_sent.p50, 40.0), "{rt:?} {rt_sent:?}");
        assert!(near(rec.send_lag().max, 200.0) && near(rec.own_lag().max, 5.0));
        assert_eq!((rec.sends.load(Ordering::Relaxed), rec.sent.load(Ordering::Relaxed)), (1, 1));
    }
}
