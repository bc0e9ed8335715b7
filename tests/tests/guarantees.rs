//! The delivery guarantees at the edges a new user finds at scale: a backlog larger
//! than the pending cap, answers after a gateway restart, a cmid reused elsewhere, a
//! member that joined late. Each test failed on the code before its fix.

use std::collections::BTreeSet;
use std::time::Duration;

use herald_client::{WsClient, WsEvent};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{Hello, Message, ServerFrame};
use herald_tests::faults::signal;
use herald_tests::{ack_frame, eventually, pending_ids, AutoDevice, Cluster};
use serde_json::json;

/// Reads a session to its `caught_up`, acking each page as it comes; the messages in
/// arrival order.
async fn drain(ws: &mut WsClient) -> (Vec<Message>, u64) {
    let mut got = Vec::new();
    let mut unacked = Vec::new();
    loop {
        match ws.next(Duration::from_millis(50)).await {
            Some(WsEvent::Frame(ServerFrame::Msg(m))) => {
                unacked.push(m.id);
                got.push(m);
                continue;
            }
            Some(WsEvent::Frame(ServerFrame::CaughtUp(c))) => return (got, c.delivered),
            Some(WsEvent::Frame(_) | WsEvent::Other(_)) => {}
            Some(WsEvent::Closed(code)) => panic!("closed {code:?} after {} messages", got.len()),
            None => {}
        }
        if !unacked.is_empty() {
            ws.send(&ack_frame(std::mem::take(&mut unacked))).await.unwrap();
        }
    }
}

/// A device offline while three times its pending cap arrive gets every message, once,
/// in order (the set holds the newest; the rest is read from MySQL), and is then done.
/// Before: `hello.pending` 2 000 of 3 500 and 1 500 never pushed (cap 1 000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_over_its_pending_cap_gets_every_message_in_order() {
    let mut c = Cluster::new("overcap");
    c.set("HERALD_DELIVERY__PENDING_CAP", "100");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__SEND_RATE", "100000"), ("HERALD_GATEWAY__SEND_BURST", "100000")]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    // bob's device is known and trusted, then offline.
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "phone")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    ws.close().await;
    let mut sent = Vec::new();
    for k in 0..300 {
        sent.push(alice.send_until_committed(&format!("m{k}"), "ab", &json!({ "k": k }), 50).await.unwrap());
    }
    // The fan-out follows the answer: wait for the last message to be pending, so that
    // all 300 are backlog (realtime pushes may overtake a backlog, section 4.4).
    let (redis, keys, last) = (c.redis().await, c.keys(), sent[299].id.0);
    eventually(Duration::from_secs(10), "the last message pending", || {
        let (redis, keys) = (redis.clone(), keys.clone());
        async move { pending_ids(&redis, &keys, "bob", "phone").await.contains(&last).then_some(()) }
    })
    .await;

    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "phone")).await.unwrap();
    let hello = ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    assert_eq!(hello.pending, 300, "the set's 100 and the band's 200");
    let (got, delivered) = drain(&mut ws).await;
    let seqs: Vec<u64> = got.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=300).collect::<Vec<_>>(), "every message once, in order");
    assert_eq!(delivered, 300);
    let ids: BTreeSet<u64> = got.iter().map(|m| m.id.0).collect();
    assert_eq!(ids, sent.iter().map(|r| r.id.0).collect(), "the committed messages");
    ws.close().await;

    // Nothing is left: not in the set, not in a band.
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "phone")).await.unwrap();
    assert_eq!(ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap().pending, 0);
    let (more, _) = drain(&mut ws).await;
    assert!(more.is_empty(), "{} pushed again", more.len());
}

/// A gateway with a fixed node id dies while sends of one tenant wait on a paused
/// worker and comes back; another tenant's sends then get their own answers, never the
/// first tenant's. Before: 1 of 20 got `200` with the other tenant's conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_never_answers_a_send_with_another_sends_result() {
    let mut c = Cluster::new("answers");
    c.set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "30000");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_NODE_ID", "gw-fixed")]).await;
    let first = c.client_in(0, "tenant-a", "alice", "a1");
    first.create_conversation(Some("conv-a"), "group", &["alice"]).await.unwrap();
    let second = c.client_in(0, "tenant-b", "bob", "b1");
    second.create_conversation(Some("conv-b"), "group", &["bob"]).await.unwrap();

    let worker = c.workers[0].pid();
    signal(worker, "-STOP");
    let waiting: Vec<_> = (0..20)
        .map(|k| {
            let first = first.clone();
            tokio::spawn(async move { first.send(&format!("a{k}"), "conv-a", &json!({ "k": k })).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.gateways[0].kill().await;
    for w in waiting {
        assert!(w.await.unwrap().is_err(), "the killed gateway answered nothing");
    }
    c.respawn_gateway_with(0, &[("HERALD_NODE_ID", "gw-fixed")]).await;
    let second = c.client_in(0, "tenant-b", "bob", "b1");
    let answers: Vec<_> = (0..20)
        .map(|k| {
            let second = second.clone();
            tokio::spawn(async move { second.send(&format!("b{k}"), "conv-b", &json!({ "k": k })).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(worker, "-CONT");
    let mut committed = 0;
    for a in answers {
        match a.await.unwrap() {
            Ok(r) => {
                assert_eq!(r.conv, "conv-b", "an answer meant for another tenant's send");
                committed += 1;
            }
            Err(e) => assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}"),
        }
    }
    assert!(committed > 0, "the second tenant's sends were answered");
    // Its messages are its own, numbered 1.. in its conversation.
    let page = second.list_conversations(10, None).await.unwrap();
    assert_eq!(page["items"][0]["id"], "conv-b");
}

/// A `cmid` already used for a message to one conversation, sent again to another, is
/// refused with `conflict`, not answered `dup: true` for a message never stored there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cmid_reused_for_another_conversation_is_a_conflict() {
    let mut c = Cluster::new("cmidreuse");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("one"), "group", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("two"), "group", &["alice", "carol"]).await.unwrap();
    let first = alice.send("m-1", "one", &json!("hi")).await.unwrap();
    let again = alice.send("m-1", "one", &json!("hi")).await.unwrap();
    assert!(again.dup && again.id == first.id, "a true repeat is still a repeat");
    let e = alice.send("m-1", "two", &json!("hi")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    let history = c.client(0, "carol", "c1").send("x", "two", &json!("y")).await.unwrap();
    assert_eq!(history.seq, 1, "nothing was stored in the other conversation");
}

/// A member added late sees the messages after it joined: the history page tells it
/// where its timeline starts, so nothing is held above a gap from seq 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_member_is_told_where_its_timeline_starts() {
    let mut c = Cluster::new("latejoin");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    for k in 0..5 {
        alice.send(&format!("early{k}"), "g", &json!(k)).await.unwrap();
    }
    alice.change_members("g", &["carol"], &[]).await.unwrap();
    let carol = c.client(0, "carol", "c1");
    let list = carol.list_conversations(10, None).await.unwrap();
    assert_eq!(list["items"][0]["joined_seq"], 5);
    alice.send("late", "g", &json!("for carol")).await.unwrap();

    // The client library's device shows seq 6 (carol's join, a timeline event) and 7 at
    // once after its sync says joined_seq 5.
    let spec = herald_client::device::DeviceSpec {
        gap_sync_after: Duration::from_millis(200),
        ..herald_client::device::DeviceSpec::new("carol", "c1", &c.token("carol", "c1"), vec![c.gateways[0].base_url()])
    };
    struct Quiet;
    impl herald_client::device::Observer for Quiet {
        fn message(&self, _: &Message, _: herald_client::device::Via, _: Duration) {}
        fn caught_up(&self, _: Duration) {}
        fn online(&self, _: bool) {}
    }
    let device = herald_client::device::Device::spawn(spec, std::sync::Arc::new(Quiet));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = device.stop().await;
    let shown: Vec<u64> = log.shown.iter().map(|s| s.seq).collect();
    assert_eq!(shown, [6, 7], "shown from where carol joined");
}

/// A member removed and added again while its device was offline past its pending cap
/// gets both of its ranges, the part read from MySQL (the overflow band) included, and
/// nothing between them; a member never removed gets everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_removed_and_added_again_gets_both_ranges_past_its_pending_cap() {
    let mut c = Cluster::new("rejoin-band");
    c.set("HERALD_DELIVERY__PENDING_CAP", "4");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "carol"]).await.unwrap();
    // Both devices are known, then offline.
    for (user, dev) in [("bob", "b1"), ("carol", "c1")] {
        let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token(user, dev)).await.unwrap();
        ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
        ws.close().await;
    }
    // Seqs 1-10, bob removed at 11, 12-14, bob added at 15, 16-18.
    let mut seqs = Vec::new();
    for k in 0..16 {
        if k == 10 {
            alice.change_members("g", &[], &["bob"]).await.unwrap();
        }
        if k == 13 {
            alice.change_members("g", &["bob"], &[]).await.unwrap();
        }
        seqs.push(alice.send(&format!("m{k}"), "g", &json!({ "k": k })).await.unwrap().seq);
    }
    assert_eq!(seqs, (1..=10).chain(12..=14).chain(16..=18).collect::<Vec<u64>>());

    let seqs = |d: &AutoDevice| d.received.lock().unwrap().iter().map(|(_, s, _)| *s).collect::<BTreeSet<u64>>();
    let carol = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("carol", "c1"), "carol", "c1").await;
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    let all: BTreeSet<u64> = (1..=18).collect();
    let bobs: BTreeSet<u64> = (1..=11).chain(15..=18).collect();
    eventually(Duration::from_secs(20), "carol gets all 18", || async { (seqs(&carol) == all).then_some(()) }).await;
    eventually(Duration::from_secs(20), "bob gets both ranges", || async { (seqs(&bob) == bobs).then_some(()) }).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(seqs(&bob), bobs, "nothing from between bob's ranges");
    carol.stop().await;
    bob.stop().await;
}
