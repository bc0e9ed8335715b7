//! A fan-out that failed part-way and is done again (issue 27): devices that acked
//! what the first attempt gave them do not get it again, and no message is reported
//! delivered while its fan-out is still being retried.
//!
//! The fault: one recipient's pending set is a Redis string (WRONGTYPE), so the fan-out
//! script stops at that user, after the users sorted before it got their entries.

use std::time::Duration;

use fred::prelude::*;
use herald_shared::ids::MsgId;
use herald_tests::{eventually, pending_ids, AutoDevice, Cluster, ADMIN_TOKEN, TENANT};
use serde_json::{json, Value};

/// Breaks or repairs a device's pending set.
async fn break_pending(c: &Cluster, user: &str, device: &str, broken: bool) {
    let (redis, key) = (c.redis().await, c.keys().pending(TENANT, user, device));
    if broken {
        let _: () = redis.set(&key, "not a sorted set", None, None, false).await.unwrap();
    } else {
        let _: i64 = redis.del(&key).await.unwrap();
    }
}

/// The outbox event of status `status`, once there is one.
async fn event_in(c: &Cluster, status: &str) -> Value {
    eventually(Duration::from_secs(20), &format!("an outbox event is {status}"), || async {
        let (code, page) = c.admin(0).get(&format!("/admin/outbox?status={status}"), Some(ADMIN_TOKEN)).await;
        assert_eq!(code, 200, "{page}");
        page["items"].as_array().and_then(|items| items.first().cloned())
    })
    .await
}

async fn retry(c: &Cluster, event: &Value) {
    let id = event["id"].as_u64().unwrap();
    let (code, answer) = c.admin(0).post(&format!("/admin/outbox/{id}/retry"), Some(ADMIN_TOKEN)).await;
    assert_eq!(code, 200, "{answer}");
}

/// Whether a device of `user` has message `id` delivered, as its sender alice sees it.
async fn delivered_to(c: &Cluster, id: MsgId, user: &str) -> bool {
    let (code, status) = c.client(0, "alice", "a1").get_raw(&format!("/v1/messages/{id}/status")).await.unwrap();
    assert_eq!(code, 200, "{status}");
    let recipients = status["recipients"].as_array().unwrap();
    let r = recipients.iter().find(|r| r["user"] == user).unwrap_or_else(|| panic!("{user} in {status}"));
    r["delivered"] == true
}

/// Bob got m1 from the fan-out's first, failed attempt and acked it; the operator's
/// retry of the dead event gives zed its entry and leaves bob alone. Before: the retry
/// put m1 back into bob's pending set and pushed it to him a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_fan_out_retried_does_not_bring_back_what_a_device_acked() {
    let mut c = Cluster::new("partial-redo");
    c.set("HERALD_OUTBOX__FIXED_DELAY_MS", "200")
        .set("HERALD_OUTBOX__BACKOFF_MS", "300")
        .set("HERALD_OUTBOX__MAX_ATTEMPTS", "2");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "zed"]).await.unwrap();
    c.client(0, "bob", "b1").register_device().await.unwrap();
    c.client(0, "zed", "z1").register_device().await.unwrap();
    break_pending(&c, "zed", "z1", true).await;
    let m1 = alice.send("m1", "g", &json!("to everyone")).await.unwrap();
    let dead = event_in(&c, "DEAD").await;
    let (redis, keys) = (c.redis().await, c.keys());
    assert!(pending_ids(&redis, &keys, "bob", "b1").await.contains(&m1.id.0), "bob's part was done");

    // Bob comes, gets m1 from his pending set, and acks it.
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    eventually(Duration::from_secs(10), "bob acked m1", || {
        let (redis, keys, bob) = (redis.clone(), keys.clone(), &bob);
        async move {
            (bob.ids().contains(&m1.id.0) && pending_ids(&redis, &keys, "bob", "b1").await.is_empty()).then_some(())
        }
    })
    .await;

    // Repaired, and retried by an operator: zed gets m1.
    break_pending(&c, "zed", "z1", false).await;
    retry(&c, &dead).await;
    eventually(Duration::from_secs(15), "zed's entry written by the retry", || {
        let (redis, keys) = (redis.clone(), keys.clone());
        async move { pending_ids(&redis, &keys, "zed", "z1").await.contains(&m1.id.0).then_some(()) }
    })
    .await;
    event_in(&c, "SENT").await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(pending_ids(&redis, &keys, "bob", "b1").await.is_empty(), "bob's acked m1 is not pending again");
    let times = bob.received.lock().unwrap().iter().filter(|(_, _, id)| *id == m1.id.0).count();
    assert_eq!(times, 1, "m1 reached bob once");
    bob.stop().await;
}

/// m1's fan-out fails for bob and waits for its retry; m2's succeeds and bob acks it.
/// m1 is not delivered to bob (no device of his has it), so it must not be reported
/// delivered; once the retry brings it and bob acks, both are. Before: bob's delivered
/// position moved to m2's `seq` and claimed m1 with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_fan_out_is_retried_is_not_delivered_until_a_device_acks_it() {
    let mut c = Cluster::new("early-delivered");
    // The retry waits for the operator: a minute away.
    c.set("HERALD_OUTBOX__FIXED_DELAY_MS", "200").set("HERALD_OUTBOX__BACKOFF_MS", "60000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("control"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    // Bob's session is past its first backlog read once a message pushed in realtime
    // reaches it: a read of the broken set below would close the session instead.
    let m0 = alice.send("m0", "control", &json!("hello")).await.unwrap();
    eventually(Duration::from_secs(10), "bob is online", || async { bob.ids().contains(&m0.id.0).then_some(()) }).await;

    break_pending(&c, "bob", "b1", true).await;
    let m1 = alice.send("m1", "g", &json!("first")).await.unwrap();
    let failed = event_in(&c, "FAILED").await;
    break_pending(&c, "bob", "b1", false).await;
    let m2 = alice.send("m2", "g", &json!("second")).await.unwrap();
    eventually(Duration::from_secs(10), "bob gets m2", || async { bob.ids().contains(&m2.id.0).then_some(()) }).await;
    // Bob's acks are applied: a later message of another conversation is delivered.
    let m3 = alice.send("m3", "control", &json!("control")).await.unwrap();
    eventually(Duration::from_secs(15), "bob's acks applied", || async {
        delivered_to(&c, m3.id, "bob").await.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!bob.ids().contains(&m1.id.0), "m1 has not reached bob");
    assert!(!delivered_to(&c, m1.id, "bob").await, "m1 is reported delivered to bob, whose devices never had it");

    // The retry brings m1; bob acks it, and both are delivered.
    retry(&c, &failed).await;
    eventually(Duration::from_secs(15), "m1 and m2 delivered to bob", || async {
        (delivered_to(&c, m1.id, "bob").await && delivered_to(&c, m2.id, "bob").await).then_some(())
    })
    .await;
    assert!(bob.ids().contains(&m1.id.0));
    bob.stop().await;
}
