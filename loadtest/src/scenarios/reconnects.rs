//! When each device of a killed gateway had a session again and when it caught up,
//! counted from the kill: an [`Observer`] per device that records its first of each
//! after the kill and passes every callback on to the run's [`Recorder`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use herald_client::device::{Observer, Via};
use herald_shared::protocol::{Message, ServerFrame};

use crate::engine::{histogram, Pct, Recorder};

/// The devices' first session and first `caught_up` after the kill, in microseconds
/// from it (0: not yet).
pub struct Reconnects {
    killed_at: OnceLock<Instant>,
    online: Vec<AtomicU64>,
    caught_up: Vec<AtomicU64>,
    online_count: AtomicUsize,
    caught_up_count: AtomicUsize,
}

/// What the devices did after the kill.
#[derive(Debug)]
pub struct Summary {
    /// Seconds from the kill until every device had a session again (`None`: not all did).
    pub all_online_s: Option<f64>,
    /// Seconds from the kill until every device had caught up (`None`: not all did).
    pub all_caught_up_s: Option<f64>,
    /// Seconds from the kill to the first device's new session.
    pub first_online_s: Option<f64>,
    /// Per device, from the kill to its new session.
    pub online: Pct,
    /// Per device, from the kill to its `caught_up`.
    pub caught_up: Pct,
    /// The most new sessions in one second.
    pub peak_sessions_per_s: usize,
}

impl Reconnects {
    pub fn new(devices: usize) -> Arc<Reconnects> {
        let slots = || (0..devices).map(|_| AtomicU64::new(0)).collect();
        Arc::new(Reconnects {
            killed_at: OnceLock::new(),
            online: slots(),
            caught_up: slots(),
            online_count: AtomicUsize::new(0),
            caught_up_count: AtomicUsize::new(0),
        })
    }

    /// Device `index`'s observer, which records into this and into `rec`.
    pub fn observer(self: &Arc<Self>, index: usize, rec: &Arc<Recorder>) -> Arc<dyn Observer> {
        Arc::new(Watched { index, board: self.clone(), rec: rec.clone() })
    }

    /// The kill starts now: sessions and `caught_up`s from here on count.
    pub fn kill_now(&self) -> Instant {
        *self.killed_at.get_or_init(Instant::now)
    }

    /// Devices with a session since the kill.
    pub fn online(&self) -> usize {
        self.online_count.load(Ordering::Relaxed)
    }

    /// Devices caught up since the kill.
    pub fn caught_up(&self) -> usize {
        self.caught_up_count.load(Ordering::Relaxed)
    }

    fn mark(&self, slots: &[AtomicU64], count: &AtomicUsize, index: usize) {
        let Some(killed) = self.killed_at.get() else { return };
        let us = (killed.elapsed().as_micros() as u64).max(1);
        if slots[index].compare_exchange(0, us, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn summary(&self) -> Summary {
        let times = |slots: &[AtomicU64]| -> Vec<u64> {
            slots.iter().map(|s| s.load(Ordering::Relaxed)).filter(|&us| us > 0).collect()
        };
        let (online, caught_up) = (times(&self.online), times(&self.caught_up));
        let last =
            |t: &[u64]| (t.len() == self.online.len()).then(|| t.iter().max().copied().unwrap_or(0) as f64 / 1e6);
        let pct = |t: &[u64]| {
            let mut h = histogram();
            t.iter().for_each(|&us| {
                let _ = h.record(us);
            });
            Pct::of(&h)
        };
        let mut per_second = std::collections::HashMap::<u64, usize>::new();
        for us in &online {
            *per_second.entry(us / 1_000_000).or_default() += 1;
        }
        Summary {
            all_online_s: last(&online),
            all_caught_up_s: last(&caught_up),
            first_online_s: online.iter().min().map(|&us| us as f64 / 1e6),
            online: pct(&online),
            caught_up: pct(&caught_up),
            peak_sessions_per_s: per_second.values().copied().max().unwrap_or(0),
        }
    }
}

struct Watched {
    index: usize,
    board: Arc<Reconnects>,
    rec: Arc<Recorder>,
}

impl Observer for Watched {
    fn message(&self, msg: &Message, via: Via, into_session: Duration) {
        self.rec.message(msg, via, into_session);
    }

    fn caught_up(&self, after: Duration) {
        self.rec.caught_up(after);
        self.board.mark(&self.board.caught_up, &self.board.caught_up_count, self.index);
    }

    fn online(&self, up: bool) {
        self.rec.online(up);
        if up {
            self.board.mark(&self.board.online, &self.board.online_count, self.index);
        }
    }

    fn frame(&self, frame: &ServerFrame) {
        self.rec.frame(frame);
    }

    fn closed(&self, code: Option<u16>) {
        self.rec.closed(code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_session_and_catch_up_after_the_kill_count() {
        let rec = Recorder::new();
        let board = Reconnects::new(2);
        let (a, b) = (board.observer(0, &rec), board.observer(1, &rec));
        a.online(true);
        a.caught_up(Duration::from_millis(5));
        assert_eq!((board.online(), board.caught_up()), (0, 0), "before the kill nothing counts");
        board.kill_now();
        a.online(false);
        a.online(true);
        a.online(true);
        a.caught_up(Duration::from_millis(5));
        assert_eq!((board.online(), board.caught_up()), (1, 1), "a device counts once");
        let s = board.summary();
        assert_eq!((s.all_online_s, s.all_caught_up_s, s.online.count), (None, None, 1), "{s:?}");
        std::thread::sleep(Duration::from_millis(20));
        b.online(true);
        b.caught_up(Duration::from_millis(5));
        let s = board.summary();
        assert!(s.all_online_s.unwrap() >= 0.02 && s.all_caught_up_s.unwrap() >= 0.02, "{s:?}");
        assert!(s.first_online_s.unwrap() < 0.02, "{s:?}");
        assert_eq!((s.online.count, s.caught_up.count, s.peak_sessions_per_s), (2, 2, 2));
        assert_eq!(rec.caught_up.load(Ordering::Relaxed), 3, "callbacks reach the recorder");
        assert_eq!(rec.online.load(Ordering::Relaxed), 3);
    }
}
