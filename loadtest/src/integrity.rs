//! The integrity check every scenario ends with: for every message acknowledged to its
//! sender, did every recipient device get it (loss), was anything shown twice, is every
//! timeline in `seq` order?
//!
//! It works on a plain event log so that it can be tested on doctored logs: a checker
//! that cannot fail would make the zeros in the reports meaningless.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

/// A send the server acknowledged (`sent` or HTTP `200`).
#[derive(Clone, Debug)]
pub struct Acked {
    pub id: u64,
    pub conv: String,
    pub seq: u64,
    pub sender: String,
    pub sender_device: String,
    pub cmid: String,
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
        }
    }
}

/// One `msg` frame as a device received it, in arrival order per device.
#[derive(Clone, Debug)]
pub struct Received {
    pub device: (String, String),
    pub id: u64,
    pub conv: String,
    pub seq: u64,
}

#[derive(Debug, Default)]
pub struct EventLog {
    pub acked: Vec<Acked>,
    pub received: Vec<Received>,
    /// Every (user, device) expected to receive each conversation's messages.
    pub recipients: HashMap<String, Vec<(String, String)>>,
}

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct IntegrityReport {
    pub acknowledged: u64,
    /// (message, recipient device) pairs never received.
    pub lost: u64,
    /// Messages committed twice for one (sender, cmid): a user would see them twice.
    pub shown_twice: u64,
    /// Timelines where, after dropping repeats by id and ordering by seq, two different
    /// messages share a seq or a message arrived after a later one of its sender.
    pub out_of_order: u64,
    /// Repeated frames of one message to one device (allowed; dropped by id).
    pub repeats_on_wire: u64,
}

impl IntegrityReport {
    pub fn is_clean(&self) -> bool {
        self.lost == 0 && self.shown_twice == 0 && self.out_of_order == 0
    }
}

/// First sightings on one device in one conversation: (seq, id), in arrival order.
type Timeline = Vec<(u64, u64)>;

pub fn check(log: &EventLog) -> IntegrityReport {
    let mut report = IntegrityReport { acknowledged: log.acked.len() as u64, ..Default::default() };

    // Shown twice: one (sender, cmid) committed under two ids.
    let mut by_cmid: HashMap<(&str, &str), HashSet<u64>> = HashMap::new();
    for a in &log.acked {
        by_cmid.entry((&a.sender, &a.cmid)).or_default().insert(a.id);
    }
    report.shown_twice = by_cmid.values().map(|ids| ids.len() as u64 - 1).sum();

    // What each device got, first sightings in arrival order.
    let mut seen: HashMap<(&str, &str), HashSet<u64>> = HashMap::new();
    // (user, device, conv) -> [(seq, id)]
    let mut timeline: HashMap<(&str, &str, &str), Timeline> = HashMap::new();
    for r in &log.received {
        let dev = (r.device.0.as_str(), r.device.1.as_str());
        if !seen.entry(dev).or_default().insert(r.id) {
            report.repeats_on_wire += 1;
            continue;
        }
        timeline.entry((dev.0, dev.1, r.conv.as_str())).or_default().push((r.seq, r.id));
    }

    // Loss: every acknowledged message on every recipient device but the sender's.
    let mut unique: BTreeMap<u64, &Acked> = BTreeMap::new();
    for a in &log.acked {
        unique.insert(a.id, a);
    }
    for a in unique.values() {
        for (user, device) in log.recipients.get(&a.conv).into_iter().flatten() {
            if *user == a.sender && *device == a.sender_device {
                continue;
            }
            if !seen.get(&(user.as_str(), device.as_str())).is_some_and(|s| s.contains(&a.id)) {
                report.lost += 1;
            }
        }
    }

    // Order: per device and conversation, no seq held by two messages; and messages of
    // one sender device arrive in their seq order (the protocol's ordering promise).
    let acked_seq: HashMap<u64, u64> = unique.values().map(|a| (a.id, a.seq)).collect();
    for r in &log.received {
        if acked_seq.get(&r.id).is_some_and(|s| *s != r.seq) {
            // Delivered under another seq than its sender was told.
            report.out_of_order += 1;
        }
    }
    let sender_of: HashMap<u64, (&str, &str)> =
        unique.values().map(|a| (a.id, (a.sender.as_str(), a.sender_device.as_str()))).collect();
    for items in timeline.values() {
        let mut by_seq: HashMap<u64, u64> = HashMap::new();
        for (seq, id) in items {
            if by_seq.insert(*seq, *id).is_some_and(|other| other != *id) {
                report.out_of_order += 1;
            }
        }
        let mut last_per_sender: HashMap<(&str, &str), u64> = HashMap::new();
        for (seq, id) in items {
            let Some(sender) = sender_of.get(id) else { continue };
            let last = last_per_sender.entry(*sender).or_insert(0);
            if *seq < *last {
                report.out_of_order += 1;
            }
            *last = (*last).max(*seq);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(id: u64, seq: u64, cmid: &str) -> Acked {
        Acked { id, conv: "c".into(), seq, sender: "alice".into(), sender_device: "a1".into(), cmid: cmid.into() }
    }

    fn got(device: &str, id: u64, seq: u64) -> Received {
        Received { device: ("bob".into(), device.into()), id, conv: "c".into(), seq }
    }

    fn clean_log() -> EventLog {
        let mut log = EventLog::default();
        log.recipients.insert(
            "c".into(),
            vec![("alice".into(), "a1".into()), ("bob".into(), "b1".into()), ("bob".into(), "b2".into())],
        );
        for n in 1..=5 {
            log.acked.push(acked(100 + n, n, &format!("m{n}")));
            log.received.push(got("b1", 100 + n, n));
            log.received.push(got("b2", 100 + n, n));
        }
        log
    }

    #[test]
    fn a_clean_log_is_clean() {
        let r = check(&clean_log());
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.acknowledged, 5);
    }

    #[test]
    fn a_withheld_message_is_lost() {
        let mut log = clean_log();
        log.received.retain(|r| !(r.device.1 == "b2" && r.id == 103));
        let r = check(&log);
        assert_eq!(r.lost, 1);
        assert!(!r.is_clean());
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
        log.received.push(got("b1", 999, 6));
        log.received.push(got("b2", 999, 6));
        assert_eq!(check(&log).shown_twice, 1);
    }

    #[test]
    fn reordered_or_conflicting_timelines_are_out_of_order() {
        let mut log = clean_log();
        let i = log.received.iter().position(|r| r.device.1 == "b1" && r.id == 102).unwrap();
        let j = log.received.iter().position(|r| r.device.1 == "b1" && r.id == 104).unwrap();
        log.received.swap(i, j);
        assert!(check(&log).out_of_order >= 1, "a sender's messages arrived out of seq order");

        let mut log = clean_log();
        log.acked.push(Acked { sender: "carol".into(), sender_device: "c1".into(), ..acked(555, 3, "x") });
        log.received.push(got("b1", 555, 3));
        assert!(check(&log).out_of_order >= 1, "two messages with one seq");
    }
}
