//! The session's windows and clocks as plain state machines, driven by the session
//! loop with tokio's clock (so tests run them with paused time):
//!
//! - [`Inflight`]: pushes written and not yet acked, at most `inflight_window`.
//! - [`AckBatch`]: acked ids the node's ack writer did not take yet.
//! - [`Heartbeat`]: the ping cadence, the idle limit, and the half-open probe (an
//!   unacked push older than `ack_timeout_ms` sends a ping; without a pong within
//!   `ack_probe_ms` the connection is half-open).

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use herald_shared::ids::MsgId;
use tokio::time::Instant;

/// Pushes written to the device and not yet acked, with when they were written and
/// their frame (shared bytes, not a copy), which an ack reads for the delivered position.
#[derive(Debug)]
pub struct Inflight {
    sent: HashMap<MsgId, (Instant, Utf8Bytes)>,
    window: usize,
    /// When the window last had room again after being full.
    reopened: Instant,
}

impl Inflight {
    pub fn new(window: usize) -> Inflight {
        Inflight { sent: HashMap::new(), window, reopened: Instant::now() }
    }

    /// When the window last went from full to having room (or was made): realtime
    /// pushes wait in the session's queue while it is full.
    pub fn reopened(&self) -> Instant {
        self.reopened
    }

    pub fn has_room(&self) -> bool {
        self.sent.len() < self.window
    }

    /// How many more pushes the window takes.
    pub fn room(&self) -> usize {
        self.window.saturating_sub(self.sent.len())
    }

    pub fn contains(&self, id: MsgId) -> bool {
        self.sent.contains_key(&id)
    }

    /// Records a push of `frame`; false when the id is already in flight (not written
    /// again).
    pub fn insert(&mut self, id: MsgId, now: Instant, frame: &Utf8Bytes) -> bool {
        if self.sent.contains_key(&id) {
            return false;
        }
        self.sent.insert(id, (now, frame.clone()));
        true
    }

    /// An ack: the frame when the id was in flight. An emptied window gives its memory
    /// back (it grows to `inflight_window` entries under a backlog, and would keep that
    /// while the session idles).
    pub fn ack(&mut self, id: MsgId) -> Option<Utf8Bytes> {
        let full = !self.has_room();
        let acked = self.sent.remove(&id).map(|(_, frame)| frame);
        if full && acked.is_some() {
            self.reopened = Instant::now();
        }
        if self.sent.is_empty() {
            self.sent.shrink_to_fit();
        }
        acked
    }

    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// Whether some push has waited longer than `timeout` for its ack.
    pub fn overdue(&self, now: Instant, timeout: Duration) -> bool {
        self.sent.values().any(|(t, _)| now.duration_since(*t) > timeout)
    }

    /// The device answered a probe: slow, not dead. Its pushes get their time again.
    pub fn refresh(&mut self, now: Instant) {
        for (t, _) in self.sent.values_mut() {
            *t = now;
        }
    }
}

/// Acked ids the node's ack writer did not take yet (its queue was full): kept, and
/// handed over again at `due` or with the next ack.
#[derive(Debug, Default)]
pub struct AckBatch {
    ids: Vec<MsgId>,
    due: Option<Instant>,
}

impl AckBatch {
    /// Adds acked ids.
    pub fn add(&mut self, ids: impl IntoIterator<Item = MsgId>) {
        self.ids.extend(ids);
    }

    /// When the kept ids are due to be handed over again, if any are kept.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// A hand-over that failed: its ids are kept and tried again at `due`.
    pub fn restore(&mut self, ids: Vec<MsgId>, due: Instant) {
        self.ids.extend(ids);
        self.due = Some(self.due.map_or(due, |d| d.min(due)));
    }

    /// Everything kept, for one hand-over.
    pub fn take(&mut self) -> Vec<MsgId> {
        self.due = None;
        std::mem::take(&mut self.ids)
    }
}

/// How often a session with pushes in flight looks for overdue ones.
const BUSY_CHECK: Duration = Duration::from_secs(1);

/// Why the heartbeat gave a connection up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dead {
    /// Nothing at all from the client within the idle limit.
    Idle,
    /// Pushes unacked and the probe ping unanswered.
    HalfOpen,
}

/// What a heartbeat tick asks of the session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Beat {
    /// Send a WebSocket ping now.
    pub ping: bool,
    /// The regular heartbeat: refresh the presence too.
    pub keepalive: bool,
    /// This ping probes a device with overdue pushes.
    pub probe: bool,
}

/// Liveness of one connection.
#[derive(Debug)]
pub struct Heartbeat {
    interval: Duration,
    idle_limit: Duration,
    ack_timeout: Duration,
    ack_probe: Duration,
    last_seen: Instant,
    last_ping: Instant,
    probe: Option<Instant>,
}

impl Heartbeat {
    /// Pings every `interval`; silent for 2.5 intervals is dead.
    pub fn new(interval: Duration, ack_timeout: Duration, ack_probe: Duration, now: Instant) -> Heartbeat {
        Heartbeat {
            interval,
            idle_limit: interval * 5 / 2,
            ack_timeout,
            ack_probe,
            last_seen: now,
            last_ping: now,
            probe: None,
        }
    }

    /// Any frame or pong from the client.
    pub fn seen(&mut self, now: Instant) {
        self.last_seen = now;
    }

    /// A pong: if it answers a probe, the device is slow, not dead.
    pub fn pong(&mut self, now: Instant, inflight: &mut Inflight) {
        self.seen(now);
        if self.probe.take().is_some() {
            inflight.refresh(now);
        }
    }

    /// When [`Heartbeat::tick`] next has something to do, after a tick at `last_tick`:
    /// the next ping or the idle limit; while pushes are in flight or a probe is out,
    /// also every second (or every interval, if shorter), where overdue pushes and an
    /// unanswered probe are found. An idle session is not woken between its pings.
    pub fn next_due(&self, last_tick: Instant, inflight: &Inflight) -> Instant {
        let due = (self.last_ping + self.interval).min(self.last_seen + self.idle_limit + Duration::from_millis(1));
        if self.probe.is_some() || !inflight.is_empty() {
            return due.min(last_tick + self.interval.min(BUSY_CHECK));
        }
        due
    }

    pub fn tick(&mut self, now: Instant, inflight: &Inflight) -> Result<Beat, Dead> {
        if now.duration_since(self.last_seen) > self.idle_limit {
            return Err(Dead::Idle);
        }
        let mut beat = Beat::default();
        match self.probe {
            Some(sent) if now.duration_since(sent) > self.ack_probe => return Err(Dead::HalfOpen),
            Some(_) => {}
            None if inflight.overdue(now, self.ack_timeout) => {
                self.probe = Some(now);
                self.last_ping = now;
                beat.ping = true;
                beat.probe = true;
            }
            None => {}
        }
        if now.duration_since(self.last_ping) >= self.interval {
            self.last_ping = now;
            beat.ping = true;
            beat.keepalive = true;
        }
        Ok(beat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn the_inflight_window_fills_refuses_repeats_and_empties_on_acks() {
        let mut w = Inflight::new(2);
        let now = Instant::now();
        let f = Utf8Bytes::from_static("{}");
        assert!(w.insert(MsgId(1), now, &f) && !w.insert(MsgId(1), now, &f), "an id in flight is not pushed twice");
        assert!(w.has_room() && w.room() == 1);
        assert!(w.insert(MsgId(2), now, &f));
        assert!(!w.has_room());
        assert!(w.ack(MsgId(1)).is_some() && w.ack(MsgId(1)).is_none() && w.ack(MsgId(7)).is_none());
        assert!(w.has_room() && w.contains(MsgId(2)) && !w.contains(MsgId(1)));
        assert_eq!(w.ack(MsgId(2)).as_deref(), Some("{}"), "an ack gives the frame back");
        assert_eq!(w.sent.capacity(), 0, "an emptied window holds no memory");
        w.insert(MsgId(2), now, &f);
        tokio::time::advance(ms(1_001)).await;
        assert!(w.overdue(Instant::now(), ms(1_000)));
        w.refresh(Instant::now());
        assert!(!w.overdue(Instant::now(), ms(1_000)));
    }

    #[tokio::test(start_paused = true)]
    async fn acks_the_writer_did_not_take_are_kept_until_due() {
        let mut b = AckBatch::default();
        assert_eq!(b.due(), None);
        b.add([MsgId(1), MsgId(2)]);
        assert_eq!(b.due(), None, "acks are handed over at once, not lingered");
        let ids = b.take();
        let later = Instant::now() + ms(1_000);
        b.restore(ids, later);
        b.add([MsgId(3)]);
        assert_eq!(b.due(), Some(later));
        assert_eq!((b.take(), b.due()), (vec![MsgId(1), MsgId(2), MsgId(3)], None), "a refused hand-over is kept");
        b.restore(vec![MsgId(1)], later + ms(5));
        b.restore(vec![MsgId(2)], later);
        assert_eq!(b.due(), Some(later), "the earliest retry wins");
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_pings_each_interval_and_gives_up_a_silent_connection() {
        let mut hb = Heartbeat::new(ms(1_000), ms(10_000), ms(5_000), Instant::now());
        let w = Inflight::new(4);
        tokio::time::advance(ms(999)).await;
        assert_eq!(hb.tick(Instant::now(), &w), Ok(Beat::default()));
        tokio::time::advance(ms(1)).await;
        assert_eq!(hb.tick(Instant::now(), &w), Ok(Beat { ping: true, keepalive: true, probe: false }));
        // Silent for 2.5 intervals: dead; any frame restarts the count.
        tokio::time::advance(ms(1_500)).await;
        hb.seen(Instant::now());
        tokio::time::advance(ms(2_500)).await;
        assert!(hb.tick(Instant::now(), &w).is_ok(), "2.5 intervals exactly is still alive");
        tokio::time::advance(ms(1)).await;
        assert_eq!(hb.tick(Instant::now(), &w), Err(Dead::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_session_is_due_at_its_next_ping_a_busy_one_every_second() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(ms(25_000), ms(10_000), ms(5_000), t0);
        let mut w = Inflight::new(4);
        assert_eq!(hb.next_due(t0, &w), t0 + ms(25_000), "idle: nothing until the ping");
        w.insert(MsgId(1), t0, &Utf8Bytes::from_static("{}"));
        assert_eq!(hb.next_due(t0, &w), t0 + ms(1_000), "a push in flight: checked every second");
        w.ack(MsgId(1));
        // A silent client: after two pings, the idle limit comes before the third.
        tokio::time::advance(ms(50_000)).await;
        assert_eq!(hb.tick(Instant::now(), &w).map(|b| b.ping), Ok(true));
        assert_eq!(hb.next_due(Instant::now(), &w), t0 + ms(62_501));
        tokio::time::advance(ms(12_501)).await;
        assert_eq!(hb.tick(Instant::now(), &w), Err(Dead::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn an_overdue_push_is_probed_a_pong_saves_it_silence_closes_it_as_half_open() {
        let (timeout, probe) = (ms(10_000), ms(5_000));
        let mut hb = Heartbeat::new(ms(25_000), timeout, probe, Instant::now());
        let mut w = Inflight::new(4);
        w.insert(MsgId(9), Instant::now(), &Utf8Bytes::from_static("{}"));
        tokio::time::advance(ms(10_001)).await;
        assert_eq!(hb.tick(Instant::now(), &w), Ok(Beat { ping: true, keepalive: false, probe: true }));
        // A slow device answers: its push gets its time again, no new probe yet.
        tokio::time::advance(ms(3_000)).await;
        hb.pong(Instant::now(), &mut w);
        tokio::time::advance(ms(3_000)).await;
        assert_eq!(hb.tick(Instant::now(), &w), Ok(Beat::default()));
        // Overdue again, probed again, and this time no pong: half-open.
        tokio::time::advance(ms(7_001)).await;
        assert!(hb.tick(Instant::now(), &w).unwrap().probe);
        hb.seen(Instant::now()); // frames keep coming, acks do not
        tokio::time::advance(ms(5_001)).await;
        assert_eq!(hb.tick(Instant::now(), &w), Err(Dead::HalfOpen));
    }
}
