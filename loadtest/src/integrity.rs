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
#[path = "integrity_tests.rs"]
mod tests;
