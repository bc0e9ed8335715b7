//! The integrity check proven on doctored logs: each kind of failure it must catch.

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
