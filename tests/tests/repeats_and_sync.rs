//! What the protocol says never happens: an acked message pushed to its device again
//! (a fan-out done twice, an ack removal that failed), and a device sync that skips a
//! message committed after a younger one.

use std::collections::BTreeSet;
use std::time::Duration;

use herald_client::WsClient;
use herald_shared::keys::shard_of;
use herald_shared::protocol::{Hello, Message};
use herald_tests::faults::{pause_redis, resume_redis};
use herald_tests::{ack_frame, eventually, pending_ids, AutoDevice, Cluster, RedisServer, TENANT};
use serde_json::json;

/// A fan-out done again after its devices acked (the worker died before the SENT mark,
/// here: the mark undone in MySQL) does not put the acked ids back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_done_again_does_not_bring_back_acked_messages() {
    let mut c = Cluster::new("redo");
    c.set("HERALD_OUTBOX__FIXED_DELAY_MS", "200");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    let sent = alice.send("m1", "ab", &json!("once")).await.unwrap();
    let (redis, keys) = (c.redis().await, c.keys());
    eventually(Duration::from_secs(10), "delivered and acked", || {
        let (redis, keys, bob) = (redis.clone(), keys.clone(), &bob);
        async move {
            (bob.ids().contains(&sent.id.0) && pending_ids(&redis, &keys, "bob", "b1").await.is_empty()).then_some(())
        }
    })
    .await;
    let db = c.db().await;
    eventually(Duration::from_secs(10), "the event marked SENT", || {
        let db = db.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events WHERE status = 'SENT'")
                .fetch_one(&db)
                .await
                .unwrap();
            (n == 1).then_some(())
        }
    })
    .await;
    // The SENT mark is lost: the dispatcher takes the event again.
    sqlx::query("UPDATE outbox_events SET status = 'PENDING', next_retry_at = 0").execute(&db).await.unwrap();
    eventually(Duration::from_secs(10), "the dispatcher finished the event again", || {
        let db = db.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events WHERE status = 'SENT'")
                .fetch_one(&db)
                .await
                .unwrap();
            (n == 1).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(pending_ids(&redis, &keys, "bob", "b1").await.is_empty(), "the acked id is not pending again");
    let times = bob.received.lock().unwrap().iter().filter(|(_, _, id)| *id == sent.id.0).count();
    assert_eq!(times, 1, "pushed once");
    bob.stop().await;
}

/// An ack whose removal fails (Redis paused) is kept and removed once Redis is back,
/// without the device acking again. Before: it was forgotten and the message came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_whose_removal_failed_is_retried() {
    let redis_server = RedisServer::start().await;
    let mut c = Cluster::with_redis("ackretry", redis_server.url());
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let sent = alice.send("m1", "ab", &json!("x")).await.unwrap();
    let m = ws.next_of::<Message>(Duration::from_secs(5)).await.unwrap();
    assert_eq!(m.id, sent.id);
    pause_redis(&redis_server);
    ws.send(&ack_frame([m.id])).await.unwrap();
    // The removal times out (3 s) and is kept.
    tokio::time::sleep(Duration::from_secs(4)).await;
    resume_redis(&redis_server);
    let (redis, keys) = (c.redis().await, c.keys());
    eventually(Duration::from_secs(15), "the acked id left the pending set", || {
        let (redis, keys) = (redis.clone(), keys.clone());
        async move { pending_ids(&redis, &keys, "bob", "b1").await.is_empty().then_some(()) }
    })
    .await;
}

/// Ids are drawn before COMMIT: a message whose commit waits (here on a row lock held
/// by the test) could commit below an id a device sync already returned. Sync returns
/// only settled ids and the worker redraws ids of a batch that waited, so paging
/// `GET /v1/sync` while it happens misses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_sync_misses_no_message_committed_late() {
    let mut c = Cluster::new("synccursor");
    c.set("HERALD_DELIVERY__SYNC_SETTLE_MS", "2000").set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "30000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    // Two conversations of bob's on different ingress shards.
    let late = "late".to_string();
    let other =
        (0..100).map(|k| format!("o{k}")).find(|o| shard_of(TENANT, o, 8) != shard_of(TENANT, &late, 8)).unwrap();
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some(&late), "direct", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some(&other), "group", &["alice", "bob"]).await.unwrap();
    // A row inserted with the cmid of the coming send, uncommitted: the worker's INSERT of
    // that send waits on its unique key, after its id was drawn.
    let db = c.db().await;
    let mut hold = db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO messages (id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at) \
         VALUES (1, ?, ?, 999, 'alice', 'a1', 'held', '\"x\"', 0)",
    )
    .bind(TENANT)
    .bind(&late)
    .execute(&mut *hold)
    .await
    .unwrap();
    let held = tokio::spawn({
        let (alice, late) = (alice.clone(), late.clone());
        async move { alice.send("held", &late, &json!("committed late")).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let younger = alice.send("younger", &other, &json!("committed first")).await.unwrap();
    // The held send waits 5 s (longer than the settle time) while bob pages sync.
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        hold.rollback().await.unwrap();
    });
    let mut seen = BTreeSet::new();
    let mut after: Option<String> = None;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(12) {
        for id in sync(&c, after.as_deref()).await {
            seen.insert(id);
            after = Some(id.to_string());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    release.await.unwrap();
    let held = held.await.unwrap().unwrap();
    assert!(seen.contains(&younger.id.0), "the younger message was synced");
    assert!(seen.contains(&held.id.0), "the message committed late was synced too (seen {seen:?})");
}

/// One page of bob's device sync after `after`: the ids.
async fn sync(c: &Cluster, after: Option<&str>) -> Vec<u64> {
    let url = match after {
        Some(a) => format!("{}/v1/sync?after={a}&limit=100", c.gateways[0].base_url()),
        None => format!("{}/v1/sync?limit=100", c.gateways[0].base_url()),
    };
    let v: serde_json::Value =
        reqwest::Client::new().get(url).bearer_auth(c.token("bob", "b1")).send().await.unwrap().json().await.unwrap();
    v["items"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().parse().unwrap()).collect()
}
