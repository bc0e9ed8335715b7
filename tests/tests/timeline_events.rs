//! Timeline events (issue 18, feature 4): membership, title and role changes, recalls
//! and edits take a `seq` of their own between the conversation's messages, reach
//! every member's devices (their actor's too) as `msg` frames a client that predates
//! them acks and counts, bound who receives what, and read back in their place from
//! history with messages as they are now.

use std::collections::BTreeSet;
use std::time::Duration;

use fred::prelude::*;
use herald_client::device::{Device, DeviceSpec, Observer, Via};
use herald_client::{WsClient, WsEvent};
use herald_shared::ids::MsgId;
use herald_shared::protocol::{ClientFrame, Message, ServerFrame, TimelineEvent};
use herald_tests::{ack_frame, eventually, pending_ids, AutoDevice, Cluster};
use serde_json::{json, Value};

async fn cluster(name: &str) -> Cluster {
    let mut c = Cluster::new(name);
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c
}

async fn device(c: &Cluster, user: &str, dev: &str) -> AutoDevice {
    AutoDevice::connect(&c.gateways[0].base_url(), &c.token(user, dev), user, dev).await
}

fn users(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The distinct seqs `d` received in `conv`.
fn seqs(d: &AutoDevice, conv: &str) -> BTreeSet<u64> {
    d.received.lock().unwrap().iter().filter(|(c, _, _)| c == conv).map(|(_, s, _)| *s).collect()
}

async fn received_seqs(d: &AutoDevice, conv: &str, want: &[u64]) {
    let want: BTreeSet<u64> = want.iter().copied().collect();
    let what = format!("{}/{} receives seqs {want:?} of {conv}", d.user, d.device);
    eventually(Duration::from_secs(15), &what, || async { (seqs(d, conv) == want).then_some(()) }).await;
}

async fn history(c: &Cluster, user: &str, conv: &str) -> Value {
    let (status, page) = c.client(0, user, "h").get_raw(&format!("/v1/conversations/{conv}/messages")).await.unwrap();
    assert_eq!(status, 200, "{page}");
    page
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_take_their_seq_between_messages_and_bound_who_receives() {
    let c = cluster("tl-members").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let (a1, b1, c1) =
        (device(&c, "alice", "a1").await, device(&c, "bob", "b1").await, device(&c, "carol", "c1").await);

    alice.send("m1", "g", &json!({"text": "one"})).await.unwrap();
    let conv = alice.change_members("g", &["carol"], &[]).await.unwrap();
    assert_eq!(conv["last_seq"], 2, "the join is seq 2: {conv}");
    assert_eq!(conv["roles"], json!({"alice": "owner", "bob": "member", "carol": "member"}), "{conv}");
    alice.send("m3", "g", &json!({"text": "three"})).await.unwrap();
    alice.change_members("g", &[], &["bob"]).await.unwrap();
    let last = alice.send("m5", "g", &json!({"text": "five"})).await.unwrap();
    assert_eq!(last.seq, 5, "messages and events share one gap-free numbering");

    // The actor's own device gets its events (not its messages: it has their `sent`).
    received_seqs(&a1, "g", &[2, 4]).await;
    assert_eq!(
        a1.events("g"),
        [
            (2, TimelineEvent::MemberAdded { users: users(&["carol"]) }),
            (4, TimelineEvent::MemberRemoved { users: users(&["bob"]) })
        ]
    );
    // Carol gets her own join and what follows; bob what came before his removal, and it.
    received_seqs(&c1, "g", &[2, 3, 4, 5]).await;
    received_seqs(&b1, "g", &[1, 2, 3, 4]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!seqs(&b1, "g").contains(&5), "nothing after the removal reaches bob");
    let removal = b1.messages.lock().unwrap().iter().find(|m| m.seq == 4).cloned().unwrap();
    assert_eq!((removal.from.as_str(), removal.body.get()), ("alice", "null"), "from the actor, no body");

    // History gives the same timeline, events in their place, within each membership.
    let bobs = history(&c, "bob", "g").await;
    let kinds: Vec<Value> = bobs["items"].as_array().unwrap().iter().map(|m| m["event"]["type"].clone()).collect();
    assert_eq!(kinds, [Value::Null, json!("member_added"), Value::Null, json!("member_removed")], "{bobs}");
    let carols = history(&c, "carol", "g").await;
    assert_eq!(carols["joined_seq"], 1, "carol's timeline starts at her join: {carols}");
    assert_eq!(carols["items"].as_array().unwrap().len(), 4);

    // Bob is out: he cannot send, change or read on.
    let refused = c.client(0, "bob", "b1").send("late", "g", &json!("x")).await.unwrap_err();
    assert_eq!(refused.code(), Some(herald_shared::error::ErrorCode::Forbidden));

    // Carol leaves: her devices get her leave and nothing after.
    let left = c.client(0, "carol", "c2").change_members("g", &[], &["carol"]).await.unwrap();
    assert_eq!(left["members"], json!(["alice"]), "{left}");
    alice.send("m7", "g", &json!({"text": "seven"})).await.unwrap();
    received_seqs(&c1, "g", &[2, 3, 4, 5, 6]).await;
    assert_eq!(c1.events("g").last(), Some(&(6, TimelineEvent::MemberLeft)));
    received_seqs(&a1, "g", &[2, 4, 6]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!seqs(&c1, "g").contains(&7));

    // The admin trace of an event names it and follows it to the actor's device too.
    let join: u64 = sqlx::query_scalar("SELECT id FROM messages WHERE conv_id = 'g' AND seq = 2")
        .fetch_one(&c.db().await)
        .await
        .unwrap();
    let (status, trace) =
        c.admin(0).get(&format!("/admin/messages/{join}/trace"), Some(herald_tests::ADMIN_TOKEN)).await;
    assert_eq!((status, &trace["event"]["type"]), (200, &json!("member_added")), "{trace}");
    let traced: Vec<&str> =
        trace["recipients"].as_array().unwrap().iter().map(|r| r["device"].as_str().unwrap()).collect();
    assert!(traced.contains(&"a1"), "{trace}");

    let db = c.db().await;
    let rows: Vec<(u64, i64)> =
        sqlx::query_as("SELECT seq, event IS NOT NULL FROM messages WHERE conv_id = 'g' ORDER BY seq")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6, 7], "no gaps, no repeats");
    assert_eq!(rows.iter().filter(|r| r.1 == 1).count(), 3, "three events, each once");
    for d in [a1, b1, c1] {
        d.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recalls_and_edits_change_the_message_for_everyone_and_history_shows_it_as_it_is_now() {
    let c = cluster("tl-edits").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let b1 = device(&c, "bob", "b1").await;
    let first = alice.send("m1", "g", &json!({"text": "helo"})).await.unwrap();
    let second = alice.send("m2", "g", &json!({"text": "oops"})).await.unwrap();

    let edit = alice.edit(first.id, "e1", &json!({"text": "hello"})).await.unwrap();
    assert_eq!((edit.seq, edit.dup), (3, false), "an edit is an event with its own seq");
    let recall = alice.recall(second.id, "r1").await.unwrap();
    assert_eq!(recall.seq, 4);
    received_seqs(&b1, "g", &[1, 2, 3, 4]).await;
    let events = b1.events("g");
    assert_eq!(events[0], (3, TimelineEvent::Edited { target: first.id, target_seq: 1 }));
    assert_eq!(events[1], (4, TimelineEvent::Recalled { target: second.id, target_seq: 2 }));
    let edited = b1.messages.lock().unwrap().iter().find(|m| m.seq == 3).cloned().unwrap();
    assert_eq!(edited.body.get(), r#"{"text":"hello"}"#, "the edit carries the new body");

    // History: the edited message with its latest body and edited_seq, the recalled one
    // with no body, and both events in their place.
    let page = history(&c, "bob", "g").await;
    let items = page["items"].as_array().unwrap();
    assert_eq!((&items[0]["body"], &items[0]["edited_seq"]), (&json!({"text": "hello"}), &json!(3)), "{page}");
    assert_eq!((&items[1]["body"], &items[1]["recalled_seq"]), (&Value::Null, &json!(4)), "{page}");
    assert_eq!(items[2]["event"], json!({"type": "edited", "target": first.id.to_string(), "target_seq": 1}));
    assert_eq!(items[3]["event"]["type"], "recalled");

    // A device that comes later reads the message as it is now, from the database: the
    // frame Redis kept of the recalled message is gone.
    let late = device(&c, "bob", "b2").await;
    received_seqs(&late, "g", &[1, 2, 3, 4]).await;
    let recalled = late.messages.lock().unwrap().iter().find(|m| m.seq == 2).cloned().unwrap();
    assert_eq!((recalled.body.get(), recalled.recalled_seq), ("null", Some(4)), "recalled for everyone");
    assert!(c.redis().await.get::<Option<String>, _>(c.keys().message(second.id)).await.unwrap().is_none());

    // The conversation list's latest entry is the recall.
    let list = alice.list_conversations(10, None).await.unwrap();
    assert_eq!(list["items"][0]["last_message"]["event"]["type"], "recalled", "{list}");
    assert_eq!(list["items"][0]["unread"], 4, "events count in the unread count like messages");

    // The same key again: the first commit, not a second edit.
    let again = alice.edit(first.id, "e1", &json!({"text": "hello"})).await.unwrap();
    assert_eq!((again.id, again.seq, again.dup), (edit.id, 3, true));
    b1.stop().await;
    late.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_predates_events_acks_and_counts_them_as_messages() {
    let c = cluster("tl-old-client").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_device().await.unwrap();
    let m1 = alice.send("m1", "g", &json!({"text": "hi"})).await.unwrap();
    alice.change_members("g", &["carol"], &[]).await.unwrap();
    alice.edit(m1.id, "e1", &json!({"text": "hi!"})).await.unwrap();

    // The frames as an old client reads them: msg frames with every field it knows.
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    let mut got: Vec<Message> = Vec::new();
    while got.len() < 3 {
        match ws.next(Duration::from_secs(10)).await {
            Some(WsEvent::Frame(ServerFrame::Msg(m))) => got.push(m),
            Some(WsEvent::Frame(_)) | Some(WsEvent::Other(_)) => {}
            other => panic!("the session ended: {other:?}"),
        }
    }
    got.sort_by_key(|m| m.seq);
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), [1, 2, 3], "a gap-free timeline");
    for m in &got[1..] {
        let text = serde_json::to_value(ServerFrame::Msg(m.clone())).unwrap();
        for field in ["t", "id", "conv", "seq", "from", "cmid", "ts", "body"] {
            assert!(text.get(field).is_some(), "an event is a complete msg frame: {text}");
        }
    }
    let ids: Vec<MsgId> = got.iter().map(|m| m.id).collect();
    ws.send(&ack_frame(ids)).await.unwrap();
    let redis = c.redis().await;
    eventually(Duration::from_secs(10), "bob's acks empty his pending set", || async {
        pending_ids(&redis, &c.keys(), "bob", "b1").await.is_empty().then_some(())
    })
    .await;
    let _ = ws.send(&ClientFrame::Ping(herald_shared::protocol::PingFrame { ts: None })).await;
}

/// Records the seqs that arrived; the test reads the device's screen once it stopped.
#[derive(Default)]
struct Arrived(std::sync::Mutex<BTreeSet<u64>>);

impl Observer for Arrived {
    fn message(&self, m: &Message, _: Via, _: Duration) {
        self.0.lock().unwrap().insert(m.seq);
    }
    fn caught_up(&self, _: Duration) {}
    fn online(&self, _: bool) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_device_shows_changes_recalled_messages_and_edited_text() {
    let c = cluster("tl-screen").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let spec = DeviceSpec {
        keep_screen: true,
        gap_sync_after: Duration::from_millis(300),
        ..DeviceSpec::new("bob", "b1", &c.token("bob", "b1"), vec![c.gateways[0].base_url()])
    };
    let arrived = std::sync::Arc::new(Arrived::default());
    let bob = Device::spawn(spec, arrived.clone());
    assert!(bob.wait_online(Duration::from_secs(15)).await);
    let m1 = alice.send("m1", "g", &json!({"text": "helo"})).await.unwrap();
    let m2 = alice.send("m2", "g", &json!({"text": "wrong room"})).await.unwrap();
    alice.edit(m1.id, "e1", &json!({"text": "hello"})).await.unwrap();
    alice.recall(m2.id, "r1").await.unwrap();
    alice.change_members("g", &["carol"], &[]).await.unwrap();
    alice.change_title("g", Some("Team")).await.unwrap();
    alice.change_role("g", "bob", "admin").await.unwrap();
    eventually(Duration::from_secs(15), "bob's device gets all seven", || async {
        (arrived.0.lock().unwrap().len() == 7).then_some(())
    })
    .await;
    let log = bob.stop().await;
    let lines: Vec<String> = log.screens["g"].iter().map(|l| l.text()).collect();
    assert_eq!(
        lines,
        [
            "hello (edited)",
            "message recalled",
            "alice added carol",
            "alice renamed the conversation \"Team\"",
            "alice made bob admin"
        ]
    );
}

/// Every `m:*` frame Redis holds for this cluster, as text.
async fn cached_frames(c: &Cluster) -> Vec<String> {
    let redis = c.redis().await;
    let pattern = format!("{}:m:*", c.prefix);
    let mut frames = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let (next, keys): (String, Vec<String>) =
            redis.scan_page(cursor.clone(), pattern.clone(), Some(1_000), None).await.unwrap();
        for k in keys {
            if let Some(f) = redis.get::<Option<String>, _>(k).await.unwrap() {
                frames.push(f);
            }
        }
        if next == "0" {
            return frames;
        }
        cursor = next;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recalled_message_leaves_no_text_after_several_edits() {
    let c = cluster("tl-recall-text").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    // b2 is registered but offline: its backlog is read once the recall committed.
    c.client(0, "bob", "b2").register_device().await.unwrap();
    let b1 = device(&c, "bob", "b1").await;
    let m1 = alice.send("m1", "g", &json!({"text": "secret-v0"})).await.unwrap();
    alice.edit(m1.id, "e1", &json!({"text": "secret-v1"})).await.unwrap();
    alice.edit(m1.id, "e2", &json!({"text": "secret-v2"})).await.unwrap();
    alice.recall(m1.id, "r1").await.unwrap();
    received_seqs(&b1, "g", &[1, 2, 3, 4]).await;
    let leaks = |what: &str, text: &str| assert!(!text.contains("secret"), "{what} still reads the text: {text}");

    // History, device sync over HTTP and the WebSocket `sync` frame: who and when, not what.
    leaks("history", &history(&c, "bob", "g").await.to_string());
    // Sync returns what is older than the settle time: wait for all four.
    let page = eventually(Duration::from_secs(15), "GET /v1/sync returns all four", || async {
        let (status, page) = c.client(0, "bob", "b1").get_raw("/v1/sync?limit=100").await.unwrap();
        assert_eq!(status, 200, "{page}");
        (page["items"].as_array().map(Vec::len) == Some(4)).then_some(page)
    })
    .await;
    leaks("GET /v1/sync", &page.to_string());
    let edits: Vec<&Value> =
        page["items"].as_array().unwrap().iter().filter(|m| m["event"]["type"] == "edited").collect();
    assert_eq!(edits.len(), 2, "the edits stay in the timeline, as who and when: {page}");
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b3")).await.unwrap();
    ws.send(&ClientFrame::Sync(herald_shared::protocol::SyncFrame {
        conv: "g".into(),
        after_seq: 0,
        limit: None,
        reference: Some("s1".into()),
    }))
    .await
    .unwrap();
    let answer = loop {
        match ws.next(Duration::from_secs(5)).await.expect("a sync answer") {
            WsEvent::Frame(ServerFrame::History(h)) => break h,
            _ => continue,
        }
    };
    assert_eq!(answer.items.len(), 4);
    leaks("the sync frame", &serde_json::to_string(&answer).unwrap());
    ws.close().await;

    // A device that was offline reads its backlog now: the earlier edits carry no text.
    let b2 = device(&c, "bob", "b2").await;
    received_seqs(&b2, "g", &[1, 2, 3, 4]).await;
    for m in b2.messages.lock().unwrap().iter() {
        leaks("the late device's backlog", &serde_json::to_string(m).unwrap());
    }
    // Nor does any frame Redis keeps.
    for f in cached_frames(&c).await {
        leaks("a cached frame", &f);
    }
    b1.stop().await;
    b2.stop().await;
}
