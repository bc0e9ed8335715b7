//! Fan-out against the real Redis the tests use (`IT_REDIS_URL`, default the local one).

use fred::prelude::*;
use herald_shared::keys::{Keys, PresenceValue};
use herald_shared::protocol::{NodeEnvelope, TimelineEvent};

use super::calls::{calls, CALL_ENTRIES};
use super::*;

/// The test Redis (`IT_REDIS_URL`, default the local one), keys under a prefix of
/// their own, and a fan-out writing there (its MySQL pool is never used).
async fn setup() -> (Pool, Keys, Fanout) {
    let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let redis = herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis");
    let keys = Keys::new(format!("ut{:08x}", rand::random::<u32>()));
    let db = herald_shared::db::pool("mysql://nobody@127.0.0.1:1/none", 1, None).expect("lazy pool");
    let fanout = Fanout::new(db, redis.clone(), keys.clone(), 60, 10_000, 60_000);
    (redis, keys, fanout)
}

fn message(id: u64, seq: u64) -> Committed {
    Committed {
        id: MsgId(id),
        tenant: "t".into(),
        conv: "c".into(),
        seq,
        sender: "alice".into(),
        sender_device: "a1".into(),
        cmid: format!("m{seq}"),
        ts: 1,
        body: format!("{{\"n\":{seq}}}"),
        event: None,
        trace: None,
    }
}

fn member(user: &str, device: &str) -> Recipient {
    Recipient {
        tenant: "t".into(),
        conv: "c".into(),
        user: user.into(),
        joined_seq: 0,
        left_seq: None,
        device: device.into(),
        push: false,
    }
}

/// Two commits fanned out in one go: each message goes to the members its own commit
/// read (carol, removed between the commits, gets the first message and not the
/// second), the online device's node hears exactly its own deliveries, and both
/// outbox events are remembered as finished.
#[tokio::test]
async fn commits_fanned_out_together_keep_their_own_recipients() {
    let (redis, keys, fanout) = setup().await;
    // carol's phone is online on node gw-x.
    let _: i64 = redis
        .next()
        .hset(keys.presence("t", "carol"), ("p1", PresenceValue::new("gw-x", "s1").to_string()))
        .await
        .unwrap();
    let subscriber = redis.next().clone_new();
    subscriber.init().await.unwrap();
    let mut node = subscriber.message_rx();
    subscriber.subscribe(keys.node_channel("gw-x")).await.unwrap();

    let (first, second) = ([message(1_001, 1)], [message(1_002, 2)]);
    let before = [member("alice", "a1"), member("bob", "b1"), member("carol", "p1")];
    let after = [member("alice", "a1"), member("bob", "b1")];
    fanout.deliver_to(&[(&first, &before), (&second, &after)], &[71, 72]).await.expect("fan-out");

    let pending = |user: &str, device: &str| {
        let (redis, key) = (redis.next().clone(), keys.pending("t", user, device));
        async move { redis.zrange::<Vec<String>, _, _, _>(key, 0, -1, None, false, None, false).await.unwrap() }
    };
    assert_eq!(pending("bob", "b1").await, vec![MsgId(1_001).member(), MsgId(1_002).member()]);
    assert_eq!(pending("carol", "p1").await, vec![MsgId(1_001).member()]);
    assert!(pending("alice", "a1").await.is_empty(), "the sending device gets nothing");

    let published = tokio::time::timeout(std::time::Duration::from_secs(5), node.recv()).await.unwrap().unwrap();
    let env: NodeEnvelope = serde_json::from_str(&published.value.as_string().unwrap()).unwrap();
    let delivered: Vec<(MsgId, Vec<String>)> =
        env.deliver.iter().map(|d| (d.id, d.to.iter().map(|k| k.user.clone()).collect())).collect();
    assert_eq!(delivered, vec![(MsgId(1_001), vec!["carol".to_string()])]);
    assert!(fanout.is_done(71).await.unwrap() && fanout.is_done(72).await.unwrap());
    assert!(!fanout.is_done(73).await.unwrap());
}

/// A timeline event reaches its actor's own device too (a message does not), raises no
/// push, and a recall drops the stored frame of the message it recalls.
#[tokio::test]
async fn an_event_reaches_its_actors_device_and_a_recall_drops_its_targets_frame() {
    let (redis, keys, fanout) = setup().await;
    let (push, mut pushed) = tokio::sync::mpsc::channel(8);
    let fanout = fanout.with_push(push);
    let target = message(2_001, 1);
    fanout.deliver_to(&[(std::slice::from_ref(&target), &[member("bob", "b1")])], &[81]).await.unwrap();
    let frame = |id: u64| {
        let (redis, key) = (redis.next().clone(), keys.message(MsgId(id)));
        async move { redis.get::<Option<String>, _>(key).await.unwrap() }
    };
    assert!(frame(2_001).await.is_some());
    let _ = pushed.try_recv();

    let recall = Committed {
        body: "null".into(),
        event: Some(TimelineEvent::Recalled { target: MsgId(2_001), target_seq: 1 }),
        ..message(2_002, 2)
    };
    let members = [Recipient { push: true, ..member("alice", "a1") }, Recipient { push: true, ..member("bob", "b1") }];
    fanout.deliver_to(&[(std::slice::from_ref(&recall), &members)], &[82]).await.unwrap();
    let pending = |user: &str, device: &str| {
        let (redis, key) = (redis.next().clone(), keys.pending("t", user, device));
        async move { redis.zrange::<Vec<String>, _, _, _>(key, 0, -1, None, false, None, false).await.unwrap() }
    };
    assert_eq!(pending("alice", "a1").await, vec![MsgId(2_002).member()], "the actor's device gets its event");
    assert!(frame(2_001).await.is_none(), "the recalled message's frame is gone");
    let stored = frame(2_002).await.unwrap();
    assert!(stored.contains(r#""event":{"type":"recalled","target":"2001","target_seq":1}"#), "{stored}");
    assert!(pushed.try_recv().is_err(), "no push notification for an event");
}

/// A device whose pending key cannot take entries fails the fan-out for itself only:
/// the others get their entries and their push, the error names them, the event is not
/// remembered as finished, and a redo that skips them writes only the failed device's.
#[tokio::test]
async fn a_fan_out_failing_for_one_device_names_the_devices_done() {
    let (redis, keys, fanout) = setup().await;
    let _: () = redis.next().set(keys.pending("t", "bob", "b1"), "not a set", None, None, false).await.unwrap();
    let msg = [message(3_001, 1)];
    let members = [member("alice", "a1"), member("bob", "b1"), member("carol", "p1")];
    let e = fanout.deliver_to(&[(&msg, &members)], &[91]).await.expect_err("bob's entries cannot be written");
    assert_eq!(e.done(), [DeviceKey::new("t", "carol", "p1")], "{e}");
    assert!(!fanout.is_done(91).await.unwrap(), "not remembered as finished");
    let pending = |user: &str, device: &str| {
        let (redis, key) = (redis.next().clone(), keys.pending("t", user, device));
        async move { redis.zrange::<Vec<String>, _, _, _>(key, 0, -1, None, false, None, false).await.unwrap() }
    };
    assert_eq!(pending("carol", "p1").await, vec![MsgId(3_001).member()]);

    // Carol acks; bob's key is repaired; the redo skips carol.
    let _: i64 = redis.next().del(keys.pending("t", "carol", "p1")).await.unwrap();
    let _: i64 = redis.next().del(keys.pending("t", "bob", "b1")).await.unwrap();
    let done: HashSet<DeviceKey> = e.done().iter().cloned().collect();
    fanout.deliver_except(&[(&msg, &members)], &[91], &done).await.expect("the redo");
    assert_eq!(pending("bob", "b1").await, vec![MsgId(3_001).member()]);
    assert!(pending("carol", "p1").await.is_empty(), "carol's acked id is not put back");
    assert!(fanout.is_done(91).await.unwrap());
}

/// A fan-out's users go in few script calls: all in one on a single Redis, cut where
/// the entries would pass the limit; on a cluster, only users of one slot together.
#[test]
fn users_go_in_calls_by_slot_and_size() {
    let keys = Keys::new("hd");
    let plan = |ids: usize| -> UserPlan { [("d1", (0..ids as u64).map(MsgId).collect())].into() };
    let names: Vec<String> = (0..300).map(|i| format!("u{i}")).collect();
    let users: Vec<((&str, &str), UserPlan)> = names
        .iter()
        .enumerate()
        .map(|(i, u)| (("t", u.as_str()), plan(if i == 7 { CALL_ENTRIES + 5 } else { 10 })))
        .collect();
    let plans: Vec<(&(&str, &str), &UserPlan)> = users.iter().map(|(k, p)| (k, p)).collect();
    let entries = |call: &Vec<usize>| -> usize { call.iter().map(|&i| plans[i].1["d1"].len()).sum() };

    let single = calls(&keys, &plans, false);
    let mut seen: Vec<usize> = single.iter().flatten().copied().collect();
    seen.sort();
    assert_eq!(seen, (0..300).collect::<Vec<_>>(), "every user in exactly one call");
    assert!(single.iter().any(|c| c == &vec![7]), "the user over the limit alone: {single:?}");
    assert!(single.iter().filter(|c| c != &&vec![7]).all(|c| entries(c) <= CALL_ENTRIES));
    assert!(single.len() <= 4, "{} calls for 300 users", single.len());

    let clustered = calls(&keys, &plans, true);
    assert_eq!(clustered.iter().map(Vec::len).sum::<usize>(), 300);
    for call in &clustered {
        let slots: std::collections::BTreeSet<u16> = call
            .iter()
            .map(|&i| fred::util::redis_keyslot(keys.presence(plans[i].0 .0, plans[i].0 .1).as_bytes()))
            .collect();
        assert_eq!(slots.len(), 1, "one slot per call: {call:?}");
    }
}

/// A fan-out run's frames and pending entries leave in one socket write, and its
/// publishes and markers in another: not a write per command, as a pipeline of fred
/// sends them (100 messages took over 100 writes that way).
#[tokio::test]
async fn a_fan_out_runs_commands_leave_in_a_few_socket_writes() {
    let (redis, keys, fanout) = setup().await;
    // Loaded first, so that the run below sends no SCRIPT LOAD of its own.
    scripts::FANOUT.script().load(redis.next()).await.unwrap();
    scripts::FRAMES_SET.script().load(redis.next()).await.unwrap();
    let _: i64 = redis
        .next()
        .hset(keys.presence("t", "carol"), ("p1", PresenceValue::new("gw-x", "s1").to_string()))
        .await
        .unwrap();
    let msgs: Vec<Committed> = (1..=100).map(|seq| message(4_000 + seq, seq)).collect();
    let members = [member("alice", "a1"), member("bob", "b1"), member("carol", "p1")];
    let writes = || herald_shared::process_metrics::thread_write_calls().expect("/proc/thread-self/io");
    let before = writes();
    fanout.deliver_to(&[(&msgs, &members)], &[101, 102]).await.expect("fan-out");
    let written = writes() - before;
    assert!(written <= 6, "a fan-out of 100 messages took {written} write system calls");
    let stored: i64 = redis.next().exists(msgs.iter().map(|m| keys.message(m.id)).collect::<Vec<_>>()).await.unwrap();
    assert_eq!(stored, 100, "every frame is stored");
    let pending: i64 = redis.next().zcard(keys.pending("t", "carol", "p1")).await.unwrap();
    assert_eq!(pending, 100, "every entry is written");
    assert!(fanout.is_done(101).await.unwrap() && fanout.is_done(102).await.unwrap());
}

/// A run of several messages (their frames through the frames script) and a run of one
/// (its frame by a SET) store every frame exactly as made, with the messages' expiry.
#[tokio::test]
async fn a_runs_frames_are_stored_with_their_expiry() {
    let (redis, keys, fanout) = setup().await;
    let members = [member("alice", "a1"), member("bob", "b1")];
    for msgs in [(1..=5).map(|seq| message(6_000 + seq, seq)).collect::<Vec<_>>(), vec![message(6_100, 9)]] {
        fanout.deliver_to(&[(&msgs, &members)], &[]).await.expect("fan-out");
        for m in &msgs {
            let stored: Option<String> = redis.next().get(keys.message(m.id)).await.unwrap();
            assert_eq!(stored.as_deref(), Some(m.frame().expect("a frame").get()), "message {}", m.id.0);
            let ttl: i64 = redis.next().ttl(keys.message(m.id)).await.unwrap();
            assert!((1..=60).contains(&ttl), "message {}: ttl {ttl}", m.id.0);
        }
    }
}
