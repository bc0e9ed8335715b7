//! The integrity check every scenario ends with: for every message acknowledged to its
//! sender, did every recipient device get it (loss), was anything shown twice, is every
//! timeline in `seq` order? Timeline events (edits, recalls) count like messages: each
//! takes a `seq` and is owed to every recipient device, its actor's own too.
//!
//! It works on a plain event log so that it can be tested on doctored logs: a checker
//! that cannot fail would make the zeros in the reports meaningless.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

/// A send the server acknowledged (`sent` or HTTP `200`), or a timeline change it
/// committed (an edit or recall: an event with a `seq` of its own, owed to every
/// recipient device like a message).
#[derive(Clone, Debug)]
pub struct Acked {
    pub id: u64,
    pub conv: String,
    pub seq: u64,
    pub sender: String,
    pub sender_device: String,
    pub cmid: String,
    /// A timeline event: owed to its actor's own device too (a message is not: that
    /// device has its `sent`).
    pub event: bool,
}

impl Acked {
    /// From the server's answer to a send.
    pub fn of(r: &herald_shared::protocol::SendResult, sender: &str, sender_device: &str, cmid: String) -> Acked {
        Acked {
            id: r.id.0,
            conv: r.conv.clone(),
            seq: r.seq,
            sender: sender.into(),
            sender_device: sender_device.into(),
            cmid,
            event: false,
        }
    }

    /// From the server's answer to a timeline change (its first event).
    pub fn event(r: &herald_shared::protocol::SendResult, actor: &str, actor_device: &str, key: String) -> Acked {
        Acked { event: true, ..Acked::of(r, actor, actor_device, key) }
    }
}

/// One `msg` frame as a device received it (`received`: arrival order, repeats
/// included; `via_sync` when it came in a `history` answer), or as it put it on screen
/// (`shown`: display order).
#[derive(Clone, Debug)]
pub struct Received {
    pub device: (String, String),
    pub id: u64,
    pub conv: String,
    pub seq: u64,
    pub via_sync: bool,
}

#[derive(Debug, Default)]
pub struct EventLog {
    pub acked: Vec<Acked>,
    /// Frames as they arrived, per device in arrival order.
    pub received: Vec<Received>,
    /// Messages as each device showed them, per device in display order.
    pub shown: Vec<Received>,
    /// Every (user, device) expected to receive each conversation's messages.
    pub recipients: HashMap<String, Vec<(String, String)>>,
    /// Recipients that joined during the run: only messages with ids from this one on
    /// are expected there (those before were committed without them).
    pub since: HashMap<(String, String), u64>,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct IntegrityReport {
    pub acknowledged: u64,
    /// (message, recipient device) pairs never shown.
    pub lost: u64,
    /// Messages committed twice for one (sender, cmid), or one message shown twice on
    /// one device: a user would see them twice.
    pub shown_twice: u64,
    /// Displayed timelines where `seq` does not rise, a message shows under another
    /// `seq` than its sender was told, or one `seq` holds two messages.
    pub out_of_order: u64,
    /// Repeated frames of one message to one device (allowed; dropped by id).
    pub repeats_on_wire: u64,
    /// Shown messages whose first copy came from `sync` rather than a push: the push
    /// path missed them and the client's gap filling recovered them (history from
    /// before a device joined is not counted: it was never pushed to it).
    pub recovered_by_sync: u64,
    /// The first few failures, described, to start an investigation from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<String>,
}

impl IntegrityReport {
    pub fn is_clean(&self) -> bool {
        self.lost == 0 && self.shown_twice == 0 && self.out_of_order == 0
    }

    fn sample(&mut self, what: impl FnOnce() -> String) {
        if self.samples.len() < 10 {
            self.samples.push(what());
        }
    }

    pub fn add(&mut self, other: &IntegrityReport) {
        self.acknowledged += other.acknowledged;
        self.lost += other.lost;
        self.shown_twice += other.shown_twice;
        self.out_of_order += other.out_of_order;
        self.repeats_on_wire += other.repeats_on_wire;
        self.recovered_by_sync += other.recovered_by_sync;
    }
}

type Dev<'a> = (&'a str, &'a str);

pub fn check(log: &EventLog) -> IntegrityReport {
    let mut report = IntegrityReport { acknowledged: log.acked.len() as u64, ..Default::default() };

    // Committed twice: one (sender, cmid) under two ids.
    let mut by_cmid: HashMap<(&str, &str), HashSet<u64>> = HashMap::new();
    for a in &log.acked {
        by_cmid.entry((&a.sender, &a.cmid)).or_default().insert(a.id);
    }
    report.shown_twice = by_cmid.values().map(|ids| ids.len() as u64 - 1).sum();

    // The wire: repeats, and where each device's first copy came from.
    let mut first_via_sync: HashMap<(Dev, u64), bool> = HashMap::new();
    for r in &log.received {
        let dev = (r.device.0.as_str(), r.device.1.as_str());
        match first_via_sync.entry((dev, r.id)) {
            std::collections::hash_map::Entry::Occupied(_) => {
                if !r.via_sync {
                    report.repeats_on_wire += 1;
                }
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(r.via_sync);
            }
        }
    }

    // The screen: each device's timeline per conversation, in display order.
    let mut unique: BTreeMap<u64, &Acked> = BTreeMap::new();
    for a in &log.acked {
        unique.insert(a.id, a);
    }
    let acked_seq: HashMap<u64, u64> = unique.values().map(|a| (a.id, a.seq)).collect();
    let mut shown: HashMap<Dev, HashSet<u64>> = HashMap::new();
    let mut last_seq: HashMap<(Dev, &str), u64> = HashMap::new();
    let mut seq_holder: HashMap<(&str, u64), u64> = HashMap::new();
    for r in &log.shown {
        let dev = (r.device.0.as_str(), r.device.1.as_str());
        if !shown.entry(dev).or_default().insert(r.id) {
            report.shown_twice += 1;
            report
                .sample(|| format!("shown twice: id {} (conv {} seq {}) on {}/{}", r.id, r.conv, r.seq, dev.0, dev.1));
            continue;
        }
        if first_via_sync.get(&(dev, r.id)).copied().unwrap_or(false) && !before_joining(log, dev, r.id) {
            report.recovered_by_sync += 1;
        }
        let last = last_seq.entry((dev, r.conv.as_str())).or_insert(0);
        let mut wrong = r.seq <= *last;
        *last = (*last).max(r.seq);
        wrong |= acked_seq.get(&r.id).is_some_and(|s| *s != r.seq);
        wrong |= *seq_holder.entry((r.conv.as_str(), r.seq)).or_insert(r.id) != r.id;
        if wrong {
            report.out_of_order += 1;
            report.sample(|| {
                format!("out of order: id {} shown as conv {} seq {} on {}/{}", r.id, r.conv, r.seq, dev.0, dev.1)
            });
        }
    }

    // Loss: every acknowledged message on every recipient device but the sender's.
    for a in unique.values() {
        for (user, device) in log.recipients.get(&a.conv).into_iter().flatten() {
            if !a.event && *user == a.sender && *device == a.sender_device {
                continue;
            }
            if before_joining(log, (user, device), a.id) {
                continue;
            }
            if !shown.get(&(user.as_str(), device.as_str())).is_some_and(|s| s.contains(&a.id)) {
                report.lost += 1;
                let dev = (user.as_str(), device.as_str());
                let arrived = first_via_sync.contains_key(&(dev, a.id));
                let upto = last_seq.get(&(dev, a.conv.as_str())).copied().unwrap_or(0);
                report.sample(|| {
                    format!(
                        "lost: id {} (conv {} seq {}) on {user}/{device}: {}, the device showed this conversation up to seq {upto}",
                        a.id,
                        a.conv,
                        a.seq,
                        if arrived { "arrived but was never shown" } else { "never arrived" }
                    )
                });
            }
        }
    }
    report
}

/// Message `id` was committed before `dev` joined the run (it is not owed it).
fn before_joining(log: &EventLog, dev: Dev, id: u64) -> bool {
    !log.since.is_empty() && log.since.get(&(dev.0.to_owned(), dev.1.to_owned())).is_some_and(|from| id < *from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(id: u64, seq: u64, cmid: &str) -> Acked {
        Acked {
            id,
            conv: "c".into(),
            seq,
            sender: "alice".into(),
            sender_device: "a1".into(),
            cmid: cmid.into(),
            event: false,
        }
    }

    fn got(device: &str, id: u64, seq: u64) -> Received {
        Received { device: ("bob".into(), device.into()), id, conv: "c".into(), seq, via_sync: false }
    }

    /// Arrives and is shown.
    fn deliver(log: &mut EventLog, device: &str, id: u64, seq: u64) {
        log.received.push(got(device, id, seq));
        log.shown.push(got(device, id, seq));
    }

    fn clean_log() -> EventLog {
        let mut log = EventLog::default();
        log.recipients.insert(
            "c".into(),
            vec![("alice".into(), "a1".into()), ("bob".into(), "b1".into()), ("bob".into(), "b2".into())],
        );
        for n in 1..=5 {
            log.acked.push(acked(100 + n, n, &format!("m{n}")));
            deliver(&mut log, "b1", 100 + n, n);
            deliver(&mut log, "b2", 100 + n, n);
        }
        log
    }

    #[test]
    fn a_clean_log_is_clean() {
        let r = check(&clean_log());
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.acknowledged, 5);
        assert_eq!((r.repeats_on_wire, r.recovered_by_sync), (0, 0));
    }

    #[test]
    fn a_withheld_message_is_lost() {
        let mut log = clean_log();
        log.received.retain(|r| !(r.device.1 == "b2" && r.id == 103));
        log.shown.retain(|r| !(r.device.1 == "b2" && r.id == 103));
        let r = check(&log);
        assert_eq!(r.lost, 1);
        assert!(!r.is_clean());
        assert!(r.samples[0].contains("id 103") && r.samples[0].contains("never arrived"), "{:?}", r.samples);
    }

    #[test]
    fn a_device_that_joined_late_owes_only_what_came_after() {
        let mut log = clean_log();
        log.received.retain(|r| !(r.device.1 == "b2" && r.id < 104));
        log.shown.retain(|r| !(r.device.1 == "b2" && r.id < 104));
        assert_eq!(check(&log).lost, 3);
        log.since.insert(("bob".into(), "b2".into()), 104);
        assert!(check(&log).is_clean());
        log.shown.retain(|r| !(r.device.1 == "b2" && r.id == 105));
        assert_eq!(check(&log).lost, 1, "what came after it joined is still owed");
    }

    #[test]
    fn history_synced_by_a_device_that_joined_late_is_not_a_recovery() {
        let mut log = clean_log();
        for r in log.received.iter_mut().filter(|r| r.device.1 == "b2" && (r.id == 102 || r.id == 105)) {
            r.via_sync = true;
        }
        assert_eq!(check(&log).recovered_by_sync, 2);
        log.since.insert(("bob".into(), "b2".into()), 104);
        assert_eq!(check(&log).recovered_by_sync, 1, "102 came before b2 joined, 105 after");
    }

    #[test]
    fn repeats_on_the_wire_are_counted_but_allowed() {
        let mut log = clean_log();
        log.received.push(got("b1", 102, 2));
        let r = check(&log);
        assert_eq!(r.repeats_on_wire, 1);
        assert!(r.is_clean());
    }

    #[test]
    fn one_cmid_committed_twice_is_shown_twice() {
        let mut log = clean_log();
        log.acked.push(acked(999, 6, "m3"));
        deliver(&mut log, "b1", 999, 6);
        deliver(&mut log, "b2", 999, 6);
        assert_eq!(check(&log).shown_twice, 1);
    }

    #[test]
    fn one_message_shown_twice_on_a_device_is_shown_twice() {
        let mut log = clean_log();
        log.shown.push(got("b2", 104, 4));
        let r = check(&log);
        assert_eq!(r.shown_twice, 1);
        assert!(!r.is_clean());
    }

    #[test]
    fn reordered_or_conflicting_timelines_are_out_of_order() {
        let mut log = clean_log();
        let i = log.shown.iter().position(|r| r.device.1 == "b1" && r.id == 102).unwrap();
        let j = log.shown.iter().position(|r| r.device.1 == "b1" && r.id == 104).unwrap();
        log.shown.swap(i, j);
        assert!(check(&log).out_of_order >= 1, "a timeline shown out of seq order");

        let mut log = clean_log();
        log.acked.push(Acked { sender: "carol".into(), sender_device: "c1".into(), ..acked(555, 3, "x") });
        log.shown.push(got("b1", 555, 6));
        assert!(check(&log).out_of_order >= 1, "shown under another seq than acknowledged");

        let mut log = clean_log();
        log.shown.push(Received { device: ("bob".into(), "b3".into()), ..got("b3", 777, 2) });
        assert!(check(&log).out_of_order >= 1, "two messages with one seq");
    }

    #[test]
    fn arrival_order_alone_is_not_disorder() {
        let mut log = clean_log();
        let i = log.received.iter().position(|r| r.device.1 == "b1" && r.id == 102).unwrap();
        let j = log.received.iter().position(|r| r.device.1 == "b1" && r.id == 104).unwrap();
        log.received.swap(i, j);
        assert!(check(&log).is_clean(), "the client reorders what arrives out of order");
    }

    /// The clean log with alice's edit (seq 6) and recall (seq 7) of her messages: shown
    /// on bob's devices and on alice's own a1, which is owed events (not messages).
    fn log_with_events() -> EventLog {
        let mut log = clean_log();
        for (id, seq) in [(106, 6), (107, 7)] {
            log.acked.push(Acked { event: true, ..acked(id, seq, &format!("e{seq}")) });
            deliver(&mut log, "b1", id, seq);
            deliver(&mut log, "b2", id, seq);
            let mine = Received { device: ("alice".into(), "a1".into()), ..got("a1", id, seq) };
            log.received.push(mine.clone());
            log.shown.push(mine);
        }
        log
    }

    #[test]
    fn events_count_like_messages() {
        let r = check(&log_with_events());
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.acknowledged, 7);
    }

    #[test]
    fn a_withheld_event_is_lost_on_its_actors_own_device_too() {
        let mut log = log_with_events();
        log.shown.retain(|r| !(r.device.1 == "a1" && r.id == 107));
        let r = check(&log);
        assert_eq!(r.lost, 1, "{r:?}");
        assert!(r.samples[0].contains("id 107") && r.samples[0].contains("alice/a1"), "{:?}", r.samples);
        let mut log = log_with_events();
        log.shown.retain(|r| !(r.device.1 == "b2" && r.id == 106));
        assert_eq!(check(&log).lost, 1);
    }

    #[test]
    fn an_event_shown_twice_or_out_of_its_place_is_caught() {
        let mut log = log_with_events();
        log.shown.push(got("b1", 106, 6));
        assert_eq!(check(&log).shown_twice, 1);

        let mut log = log_with_events();
        let i = log.shown.iter().position(|r| r.device.1 == "b2" && r.id == 106).unwrap();
        let j = log.shown.iter().position(|r| r.device.1 == "b2" && r.id == 103).unwrap();
        log.shown.swap(i, j);
        assert!(check(&log).out_of_order >= 1, "an event shown before an earlier message");

        let mut log = log_with_events();
        for r in log.shown.iter_mut().filter(|r| r.device.1 == "b1" && r.id == 107) {
            r.seq = 8;
        }
        assert!(check(&log).out_of_order >= 1, "an event under another seq than committed");

        let mut log = log_with_events();
        log.acked.push(Acked { event: true, ..acked(108, 8, "e6") });
        deliver(&mut log, "b1", 108, 8);
        deliver(&mut log, "b2", 108, 8);
        assert_eq!(check(&log).shown_twice, 1, "one change's key committed twice");
    }

    #[test]
    fn gaps_filled_by_sync_are_counted() {
        let mut log = clean_log();
        for r in log.received.iter_mut().filter(|r| r.device.1 == "b2" && r.id == 105) {
            r.via_sync = true;
        }
        let r = check(&log);
        assert_eq!(r.recovered_by_sync, 1);
        assert!(r.is_clean());
    }
}
