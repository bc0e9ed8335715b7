//! What a device shows: each conversation's timeline in `seq` order, repeats dropped by
//! `id`, what arrives above a gap held until the gap is filled; and the records of what
//! it saw ([`DeviceLog`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use herald_shared::protocol::Message;

use super::screen::{Line, Screens};

/// How a message reached the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Pushed while the device was caught up.
    Realtime,
    /// Pushed before this session's `caught_up`.
    Backlog,
    /// Pulled with `sync` to fill a gap.
    Sync,
}

/// One `msg` as it arrived (repeats included), or one item of a `history` answer.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub id: u64,
    pub conv: String,
    pub seq: u64,
    pub via: Via,
}

/// A message put on screen: each conversation's timeline in display order.
#[derive(Clone, Debug)]
pub struct Shown {
    pub id: u64,
    pub conv: String,
    pub seq: u64,
}

/// Everything a device saw, returned by [`Device::stop`].
#[derive(Debug, Default)]
pub struct DeviceLog {
    pub arrivals: Vec<Arrival>,
    pub shown: Vec<Shown>,
    /// Per session: time from the upgrade to `caught_up`.
    pub catch_ups: Vec<Duration>,
    pub sessions: u32,
    /// What the device would keep across a restart, for the next instance's
    /// [`DeviceSpec::resume`](super::DeviceSpec::resume).
    pub stored: Stored,
    /// Each conversation's screen, when the spec asked to keep it
    /// ([`DeviceSpec::keep_screen`](super::DeviceSpec::keep_screen)).
    pub screens: HashMap<String, Vec<Line>>,
}

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
    /// A sync answer said more follows: the gap is synced again at once.
    more: bool,
}

impl Timeline {
    /// A sync answered (or the session ended): the gap may be synced again later, or at
    /// once when the answer said `more`.
    pub(super) fn settle(&mut self, more: bool) {
        self.syncing = false;
        self.gap_since = None;
        self.more = more;
    }
}

/// What an app keeps of its timelines across restarts (its local store): per
/// conversation the highest seq shown and what arrived (and was acked) above a gap.
/// A device started with it goes on where the stopped one left off, instead of
/// showing everything again from seq 1.
#[derive(Clone, Debug, Default)]
pub struct Stored {
    timelines: HashMap<String, (u64, BTreeMap<u64, u64>)>,
}

impl Stored {
    /// The highest seq shown in `conv` (0: nothing).
    pub fn shown(&self, conv: &str) -> u64 {
        self.timelines.get(conv).map_or(0, |t| t.0)
    }
}

/// Everything the device knows across its sessions.
#[derive(Default)]
pub(super) struct State {
    pub(super) log: DeviceLog,
    seen: HashSet<u64>,
    pub(super) timelines: HashMap<String, Timeline>,
    /// What the screen shows, when kept: messages' text, edits, recalls, changes.
    pub(super) screens: Option<Screens>,
}

impl State {
    /// A device that goes on from what an earlier instance stored.
    pub(super) fn resume(stored: &Stored) -> State {
        let mut st = State::default();
        for (conv, (shown, waiting)) in &stored.timelines {
            st.seen.extend(waiting.values());
            st.timelines
                .insert(conv.clone(), Timeline { shown: *shown, waiting: waiting.clone(), ..Timeline::default() });
        }
        st
    }

    /// What an app would keep of these timelines across a restart.
    pub(super) fn stored(&self) -> Stored {
        Stored { timelines: self.timelines.iter().map(|(c, t)| (c.clone(), (t.shown, t.waiting.clone()))).collect() }
    }

    /// Keeps each conversation's screen from now on.
    pub(super) fn keep_screens(&mut self) {
        self.screens.get_or_insert_with(Screens::default);
    }

    /// A `msg` (or history item) arrived: shown in `seq` order, on the screen too when
    /// it is kept.
    pub(super) fn arrive_message(&mut self, m: &Message, via: Via) {
        if let Some(s) = self.screens.as_mut().filter(|_| !self.seen.contains(&m.id.0)) {
            s.arrived(m);
        }
        self.arrive(m.id.0, &m.conv, m.seq, via);
    }

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
            if let Some(s) = self.screens.as_mut() {
                s.forget(id);
            }
            return;
        }
        t.waiting.entry(seq).or_insert(id);
        show_waiting(t, &mut self.log, &mut self.screens, conv);
    }

    /// The device's membership of `conv` starts after `seq` (a history page says so):
    /// nothing below it will come, so what waits just above it is shown.
    pub(super) fn joined(&mut self, conv: &str, seq: u64) {
        let t = self.timelines.entry(conv.to_owned()).or_default();
        if t.shown >= seq {
            return;
        }
        t.shown = seq;
        let screens = &mut self.screens;
        t.waiting.retain(|s, id| {
            if let Some(screens) = screens.as_mut().filter(|_| *s <= seq) {
                screens.forget(*id);
            }
            *s > seq
        });
        show_waiting(t, &mut self.log, &mut self.screens, conv);
    }

    /// Conversations whose gap has been open long enough: (conv, after_seq).
    pub(super) fn gaps_to_fill(&mut self, now: Instant, after: Duration) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (conv, t) in &mut self.timelines {
            if t.waiting.is_empty() || t.syncing {
                continue;
            }
            if std::mem::take(&mut t.more) {
                t.syncing = true;
                out.push((conv.clone(), t.shown));
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

/// Shows what waits just above `t`'s last shown seq, in order, and ends its gap once
/// nothing waits.
fn show_waiting(t: &mut Timeline, log: &mut DeviceLog, screens: &mut Option<Screens>, conv: &str) {
    while let Some(id) = t.waiting.remove(&(t.shown + 1)) {
        t.shown += 1;
        log.shown.push(Shown { id, conv: conv.to_owned(), seq: t.shown });
        if let Some(s) = screens.as_mut() {
            s.show(id);
        }
    }
    if t.waiting.is_empty() {
        t.gap_since = None;
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

    #[test]
    fn a_sync_answer_with_more_is_followed_at_once() {
        let mut st = State::default();
        st.arrive(15, "c", 5, Via::Realtime);
        let t0 = Instant::now();
        st.gaps_to_fill(t0, Duration::ZERO);
        assert_eq!(st.gaps_to_fill(t0, Duration::ZERO), [], "one sync at a time");
        st.arrive(11, "c", 1, Via::Sync);
        st.timelines.get_mut("c").unwrap().settle(true);
        assert_eq!(st.gaps_to_fill(t0, Duration::from_secs(60)), [("c".to_string(), 1)]);
    }

    #[test]
    fn a_kept_screen_applies_what_waited_above_a_gap_once_the_gap_fills() {
        use herald_shared::ids::MsgId;
        use herald_shared::protocol::TimelineEvent;
        let m = |id: u64, seq: u64, body: &str, event: Option<TimelineEvent>| Message {
            id: MsgId(id),
            conv: "c".into(),
            seq,
            from: "bob".into(),
            cmid: String::new(),
            ts: 0,
            body: serde_json::value::RawValue::from_string(body.into()).unwrap(),
            status: None,
            event,
            edited_seq: None,
            recalled_seq: None,
        };
        let mut st = State::default();
        st.keep_screens();
        let edit = TimelineEvent::Edited { target: MsgId(11), target_seq: 1 };
        st.arrive_message(&m(12, 2, r#"{"text":"fixed"}"#, Some(edit)), Via::Realtime);
        st.arrive_message(&m(12, 2, r#"{"text":"fixed"}"#, None), Via::Realtime);
        assert!(st.screens.as_ref().unwrap().lines.is_empty(), "the edit waits for its message");
        st.arrive_message(&m(11, 1, r#"{"text":"fxied"}"#, None), Via::Backlog);
        let lines = &st.screens.as_ref().unwrap().lines["c"];
        assert_eq!(lines.iter().map(|l| l.text()).collect::<Vec<_>>(), ["fixed (edited)"]);
    }

    #[test]
    fn a_resumed_device_goes_on_where_the_stopped_one_left_off() {
        let mut st = State::default();
        st.arrive(11, "c", 1, Via::Realtime);
        st.arrive(13, "c", 3, Via::Realtime);
        let stored = st.stored();
        assert_eq!(stored.shown("c"), 1);
        let mut next = State::resume(&stored);
        next.arrive(11, "c", 1, Via::Backlog);
        next.arrive(14, "c", 4, Via::Realtime);
        assert!(next.log.shown.is_empty(), "seq 1 was shown before; 3 and 4 wait for 2");
        next.arrive(12, "c", 2, Via::Sync);
        assert_eq!(next.log.shown.iter().map(|s| s.seq).collect::<Vec<_>>(), [2, 3, 4]);
    }
}
