//! The probe's accounts, apart from its sockets so they can be tested alone: which sends
//! are awaiting the gateway's `sent` ([`Unacked`]), and for each direction what was
//! acknowledged and not yet received, and what was received ([`Ledger`]).
//!
//! Only acknowledged sends are expected: a send the gateway never confirmed (its
//! connection broke, the gateway crashed, the send was refused) may rightly never
//! arrive, and counting it as lost would page someone for nothing. Both structures are
//! bounded: the probe runs for months.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Numbers remembered per direction for telling repeats from duplicates.
pub const REMEMBERED: u64 = 10_000;

/// Sends of one session awaiting their `sent`, by `cmid`.
#[derive(Debug, Default)]
pub struct Unacked {
    waiting: HashMap<String, (u64, Instant)>,
}

impl Unacked {
    pub fn sent(&mut self, cmid: String, n: u64, at: Instant) {
        self.waiting.insert(cmid, (n, at));
    }

    /// The `sent` (or the refusal) of `cmid`: its number, if it was waiting.
    pub fn answered(&mut self, cmid: &str) -> Option<u64> {
        self.waiting.remove(cmid).map(|(n, _)| n)
    }

    /// Forgets sends unanswered for longer than `after`: their fate is unknown, so they
    /// are not expected. Keeps the map bounded when a gateway stops answering.
    pub fn forget_older(&mut self, now: Instant, after: Duration) {
        self.waiting.retain(|_, (_, at)| now.duration_since(*at) <= after);
    }

    /// The session ended: nothing still waiting will be answered on it.
    pub fn clear(&mut self) {
        self.waiting.clear();
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// How a received number was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receipt {
    /// First time; `disorder` when a higher number came before it.
    New { disorder: bool },
    /// The same message again (same id): allowed, at-least-once delivery.
    Repeat,
    /// The same number under another id: one send stored twice.
    Duplicate,
}

/// One direction (what one side expects from the other).
#[derive(Debug, Default)]
pub struct Ledger {
    /// Acknowledged and not yet received, with when the acknowledgement came.
    outstanding: BTreeMap<u64, Instant>,
    /// Received numbers (the latest [`REMEMBERED`] or so) and the id each came under.
    seen: HashMap<u64, String>,
    /// Numbers below this are no longer in `seen`.
    forgotten_below: u64,
    highest: u64,
    /// Acknowledged numbers never received within the loss window.
    pub lost: u64,
    /// Numbers received for the first time.
    pub received: u64,
}

impl Ledger {
    /// The sender got `sent` for `n`: expect it, unless it has already arrived (the push
    /// to the receiver can overtake the answer to the sender).
    pub fn acknowledged(&mut self, n: u64, at: Instant) {
        let arrived = if n < self.forgotten_below { true } else { self.seen.contains_key(&n) };
        if !arrived {
            self.outstanding.insert(n, at);
        }
    }

    /// Number `n` arrived as message `id`.
    pub fn received(&mut self, n: u64, id: &str) -> Receipt {
        if n < self.forgotten_below {
            // Older than what is remembered: a late first arrival if it was still
            // expected, else a repeat.
            return if self.outstanding.remove(&n).is_some() {
                self.received += 1;
                Receipt::New { disorder: true }
            } else {
                Receipt::Repeat
            };
        }
        match self.seen.get(&n) {
            Some(prev) if prev == id => Receipt::Repeat,
            Some(_) => Receipt::Duplicate,
            None => {
                let disorder = n < self.highest;
                self.highest = self.highest.max(n);
                self.seen.insert(n, id.to_owned());
                self.outstanding.remove(&n);
                self.received += 1;
                self.forget_old();
                Receipt::New { disorder }
            }
        }
    }

    /// Counts as lost, and stops expecting, what was acknowledged more than `window`
    /// before `now` and has not arrived. Returns how many.
    pub fn expire(&mut self, now: Instant, window: Duration) -> u64 {
        let before = self.outstanding.len();
        self.outstanding.retain(|_, acked| now.duration_since(*acked) <= window);
        let lost = (before - self.outstanding.len()) as u64;
        self.lost += lost;
        lost
    }

    /// Acknowledged numbers still expected.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Forgets numbers far below the highest seen, in batches.
    fn forget_old(&mut self) {
        if self.seen.len() as u64 > 2 * REMEMBERED {
            self.forgotten_below = self.highest.saturating_sub(REMEMBERED);
            let floor = self.forgotten_below;
            self.seen.retain(|n, _| *n >= floor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(5);

    #[test]
    fn only_acknowledged_sends_can_be_lost() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        // 1 acknowledged and never received; 2 never acknowledged (the gateway died).
        l.acknowledged(1, t0);
        assert_eq!(l.expire(t0 + WINDOW, WINDOW), 0, "not before the window has passed");
        assert_eq!(l.expire(t0 + WINDOW + Duration::from_millis(1), WINDOW), 1);
        assert_eq!((l.lost, l.outstanding()), (1, 0));
        assert_eq!(l.expire(t0 + 10 * WINDOW, WINDOW), 0, "counted once");
    }

    #[test]
    fn a_message_that_overtakes_its_acknowledgement_is_not_expected_again() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        assert_eq!(l.received(7, "m7"), Receipt::New { disorder: false });
        l.acknowledged(7, t0);
        assert_eq!(l.outstanding(), 0);
        assert_eq!(l.expire(t0 + 2 * WINDOW, WINDOW), 0);
        l.acknowledged(8, t0);
        assert_eq!(l.received(8, "m8"), Receipt::New { disorder: false });
        assert_eq!((l.outstanding(), l.received, l.lost), (0, 2, 0));
    }

    #[test]
    fn repeats_duplicates_and_disorder_are_told_apart() {
        let mut l = Ledger::default();
        assert_eq!(l.received(2, "a"), Receipt::New { disorder: false });
        assert_eq!(l.received(1, "b"), Receipt::New { disorder: true });
        assert_eq!(l.received(2, "a"), Receipt::Repeat);
        assert_eq!(l.received(2, "c"), Receipt::Duplicate);
        assert_eq!(l.received, 2);
    }

    #[test]
    fn memory_stays_bounded_over_a_long_run() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        for n in 1..=10 * REMEMBERED {
            l.acknowledged(n, t0);
            l.received(n, &format!("m{n}"));
        }
        assert!(l.seen.len() as u64 <= 2 * REMEMBERED + 1, "{} remembered", l.seen.len());
        assert_eq!((l.outstanding(), l.received), (0, 10 * REMEMBERED));
        // An old number: a repeat, unless it was still expected.
        assert_eq!(l.received(3, "m3"), Receipt::Repeat);
        l.acknowledged(5, t0);
        assert_eq!(l.outstanding(), 0, "a forgotten number has arrived");

        let mut u = Unacked::default();
        for n in 0..1_000 {
            u.sent(format!("c{n}"), n, t0);
        }
        assert_eq!(u.answered("c7"), Some(7));
        assert_eq!(u.answered("c7"), None);
        u.forget_older(t0 + WINDOW + Duration::from_millis(1), WINDOW);
        assert!(u.is_empty());
    }
}
