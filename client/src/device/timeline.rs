//! What a device shows: each conversation's timeline in `seq` order, repeats dropped by
//! `id`, what arrives above a gap held until the gap is filled.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::{Arrival, DeviceLog, Shown, Via};

/// One conversation's display state.
#[derive(Default)]
pub(super) struct Timeline {
    /// Highest seq shown; everything up to it is on screen.
    shown: u64,
    /// Arrived above a gap: seq -> id.
    waiting: BTreeMap<u64, u64>,
    /// When the current gap was first seen open after `caught_up`.
    gap_since: Option<Instant>,
    syncing: bool,
}

impl Timeline {
    /// A sync answered (or the session ended): the gap may be synced again later.
    pub(super) fn settle(&mut self) {
        self.syncing = false;
        self.gap_since = None;
    }
}

/// Everything the device knows across its sessions.
#[derive(Default)]
pub(super) struct State {
    pub(super) log: DeviceLog,
    seen: HashSet<u64>,
    pub(super) timelines: HashMap<String, Timeline>,
}

impl State {
    pub(super) fn arrive(&mut self, id: u64, conv: &str, seq: u64, via: Via) {
        self.log.arrivals.push(Arrival { id, conv: conv.to_owned(), seq, via });
        if !self.seen.insert(id) {
            return;
        }
        // One allocation per conversation, not per message.
        if !self.timelines.contains_key(conv) {
            self.timelines.insert(conv.to_owned(), Timeline::default());
        }
        let t = self.timelines.get_mut(conv).expect("just inserted");
        if seq <= t.shown {
            return;
        }
        t.waiting.entry(seq).or_insert(id);
        while let Some(id) = t.waiting.remove(&(t.shown + 1)) {
            t.shown += 1;
            self.log.shown.push(Shown { id, conv: conv.to_owned(), seq: t.shown });
        }
        if t.waiting.is_empty() {
            t.gap_since = None;
        }
    }

    /// The device's membership of `conv` starts after `seq` (a history page says so):
    /// nothing below it will come, so what waits just above it is shown.
    pub(super) fn joined(&mut self, conv: &str, seq: u64) {
        let t = self.timelines.entry(conv.to_owned()).or_default();
        if t.shown >= seq {
            return;
        }
        t.shown = seq;
        t.waiting.retain(|s, _| *s > seq);
        while let Some(id) = t.waiting.remove(&(t.shown + 1)) {
            t.shown += 1;
            self.log.shown.push(Shown { id, conv: conv.to_owned(), seq: t.shown });
        }
        if t.waiting.is_empty() {
            t.gap_since = None;
        }
    }

    /// Conversations whose gap has been open long enough: (conv, after_seq).
    pub(super) fn gaps_to_fill(&mut self, now: Instant, after: Duration) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (conv, t) in &mut self.timelines {
            if t.waiting.is_empty() || t.syncing {
                continue;
            }
            let since = *t.gap_since.get_or_insert(now);
            if now.duration_since(since) >= after {
                t.syncing = true;
                out.push((conv.clone(), t.shown));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_in_seq_order_and_drops_repeats() {
        let mut st = State::default();
        st.arrive(13, "c", 3, Via::Realtime);
        st.arrive(11, "c", 1, Via::Backlog);
        assert_eq!(st.log.shown.iter().map(|s| s.seq).collect::<Vec<_>>(), [1]);
        st.arrive(11, "c", 1, Via::Backlog);
        st.arrive(12, "c", 2, Via::Backlog);
        assert_eq!(st.log.shown.iter().map(|s| s.id).collect::<Vec<_>>(), [11, 12, 13]);
        assert_eq!(st.log.arrivals.len(), 4);
    }

    #[test]
    fn a_late_member_shows_from_where_it_joined() {
        let mut st = State::default();
        st.arrive(42, "c", 41, Via::Realtime);
        st.arrive(43, "c", 42, Via::Realtime);
        assert!(st.log.shown.is_empty(), "held above a gap from seq 1");
        st.joined("c", 40);
        assert_eq!(st.log.shown.iter().map(|s| s.seq).collect::<Vec<_>>(), [41, 42]);
        st.joined("c", 10);
        st.arrive(44, "c", 43, Via::Realtime);
        assert_eq!(st.log.shown.len(), 3, "an older joined_seq changes nothing");
    }

    #[test]
    fn a_gap_is_synced_only_after_it_stayed_open() {
        let mut st = State::default();
        st.arrive(12, "c", 2, Via::Realtime);
        let t0 = Instant::now();
        assert!(st.gaps_to_fill(t0, Duration::from_secs(1)).is_empty());
        let due = st.gaps_to_fill(t0 + Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(due, [("c".to_string(), 0)]);
        assert!(st.gaps_to_fill(t0 + Duration::from_secs(3), Duration::from_secs(1)).is_empty(), "one sync at a time");
        st.arrive(11, "c", 1, Via::Sync);
        assert_eq!(st.log.shown.len(), 2);
    }
}
