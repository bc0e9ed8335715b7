//! Delivery status to the sender (issue 18): acks move the recipients' delivered
//! positions, the sender's devices that opted in get `delivered` frames (at most one
//! per conversation per interval), history carries the counts, and the sender alone
//! can ask for one message's state per recipient.

use std::time::Duration;

use herald_client::device::DeviceSpec;
use herald_shared::protocol::{DeliveryStatus, ServerFrame};
use herald_tests::{eventually, statements_waiting, AutoDevice, Cluster, TENANT};
use serde_json::json;

/// A device of `user` that acks everything and, with `status`, asks for `delivered`.
async fn device(c: &Cluster, user: &str, dev: &str, status: bool) -> AutoDevice {
    let base = c.gateways[0].base_url();
    let spec = DeviceSpec { delivery_status: status, ..AutoDevice::spec(&base, &c.token(user, dev), user, dev) };
    AutoDevice::start(spec).await.expect("the device says hello")
}

fn statuses(d: &AutoDevice) -> Vec<DeliveryStatus> {
    let others = d.others.lock().unwrap();
    others
        .iter()
        .filter_map(|f| match f {
            ServerFrame::Delivered(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// Waits until `d` was shown a status of `conv` at `seq` with `count`.
async fn shown(d: &AutoDevice, conv: &str, seq: u64, count: u64) -> DeliveryStatus {
    let what = format!("{}/{} is shown {conv}@{seq} delivered to {count}", d.user, d.device);
    eventually(Duration::from_secs(15), &what, || async {
        statuses(d).into_iter().find(|s| s.conv == conv && s.seq == seq && s.count == count)
    })
    .await
}

async fn cluster(name: &str, interval_ms: &str) -> Cluster {
    let mut c = Cluster::new(name);
    c.set("HERALD_DELIVERY__STATUS_INTERVAL_MS", interval_ms);
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_message_acked_by_a_device_is_delivered_to_the_senders_devices_that_asked() {
    let c = cluster("dlv-direct", "200").await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let a1 = device(&c, "alice", "a1", true).await;
    let a2 = device(&c, "alice", "a2", true).await;
    let old = device(&c, "alice", "a3", false).await;
    c.client(0, "bob", "b2").register_device().await.unwrap();

    // Nobody has it yet: no status, and history says so.
    a1.send("m1", "ab", json!({"text": "hi"})).await;
    eventually(Duration::from_secs(10), "a1's send is committed", || async {
        a1.sent.lock().unwrap().get("m1").cloned()
    })
    .await;
    let page = c.client(0, "alice", "a1").get_raw("/v1/conversations/ab/messages").await.unwrap().1;
    assert_eq!(page["items"][0]["status"], json!({"of": 1, "delivered": 0, "read": 0}), "{page}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(statuses(&a1).is_empty(), "nothing is delivered before a device of bob acked");

    let b1 = device(&c, "bob", "b1", false).await;
    let status = shown(&a1, "ab", 1, 1).await;
    assert_eq!(status.user.as_deref(), Some("bob"), "a direct conversation names the recipient");
    shown(&a2, "ab", 1, 1).await;
    let db = c.db().await;
    let position: u64 =
        sqlx::query_scalar("SELECT delivered_seq FROM members WHERE conv_id = 'ab' AND user_id = 'bob'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(position, 1);

    // Bob's second device acks it too: still one recipient with it, not two.
    let b2 = device(&c, "bob", "b2", false).await;
    eventually(Duration::from_secs(10), "b2 gets the message", || async { (!b2.ids().is_empty()).then_some(()) }).await;
    let page = c.client(0, "alice", "a1").get_raw("/v1/conversations/ab/messages").await.unwrap().1;
    assert_eq!(page["items"][0]["status"], json!({"of": 1, "delivered": 1, "read": 0}), "{page}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(statuses(&a1).iter().all(|s| s.count == 1), "never double counted: {:?}", statuses(&a1));
    // Bob's own view of alice's message carries no status; his own acks of his own
    // messages move nothing.
    let page = c.client(0, "bob", "b1").get_raw("/v1/conversations/ab/messages").await.unwrap().1;
    assert!(page["items"][0].get("status").is_none(), "{page}");

    // A client that did not ask never sees the frame.
    assert!(statuses(&old).is_empty(), "an old-style client gets no delivered frame: {:?}", statuses(&old));
    for d in [a1, a2, old, b1, b2] {
        d.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_counts_the_members_that_have_it_and_reading_counts_as_delivered() {
    let c = cluster("dlv-group", "200").await;
    let members = ["alice", "bob", "carol", "dave"];
    c.client(0, "alice", "a1").create_conversation(Some("g"), "group", &members).await.unwrap();
    c.client(0, "dave", "d1").register_device().await.unwrap();
    let a1 = device(&c, "alice", "a1", true).await;
    let b1 = device(&c, "bob", "b1", false).await;
    a1.send("g1", "g", json!({"n": 1})).await;
    shown(&a1, "g", 1, 1).await;
    assert!(statuses(&a1).iter().all(|s| s.user.is_none()), "a group names nobody");
    let c1 = device(&c, "carol", "c1", false).await;
    shown(&a1, "g", 1, 2).await;

    // Dave never connects but reads it: delivered to all three, read by one.
    let (code, _) =
        c.client(0, "dave", "d1").post_raw("/v1/conversations/g/read", br#"{"seq": 1}"#.to_vec()).await.unwrap();
    assert_eq!(code, 200);
    let page = c.client(0, "alice", "a1").get_raw("/v1/conversations/g/messages").await.unwrap().1;
    assert_eq!(page["items"][0]["status"], json!({"of": 3, "delivered": 3, "read": 1}), "{page}");
    for d in [a1, b1, c1] {
        d.stop().await;
    }
}

/// Delivered positions that reach the worker within `worker.delivered_linger_ms` of
/// each other are applied in one round: here bob's and carol's acks leave the gateway
/// in different flushes, and the sender is told once, with both counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_within_the_workers_linger_are_applied_together() {
    let mut c = Cluster::new("dlv-linger");
    c.set("HERALD_DELIVERY__STATUS_INTERVAL_MS", "10");
    c.set("HERALD_WORKER__DELIVERED_LINGER_MS", "4000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.client(0, "alice", "a1").create_conversation(Some("g"), "group", &["alice", "bob", "carol"]).await.unwrap();
    let a1 = device(&c, "alice", "a1", true).await;
    a1.send("g1", "g", json!({"n": 1})).await;
    eventually(Duration::from_secs(10), "a1's send is committed", || async {
        a1.sent.lock().unwrap().get("g1").cloned()
    })
    .await;
    let b1 = device(&c, "bob", "b1", false).await;
    eventually(Duration::from_secs(10), "b1 gets the message", || async { (!b1.ids().is_empty()).then_some(()) }).await;
    // Past the gateway's flush period (500 ms): carol's position is another entry.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let c1 = device(&c, "carol", "c1", false).await;
    shown(&a1, "g", 1, 2).await;
    let told: Vec<u64> = statuses(&a1).iter().filter(|s| s.conv == "g" && s.seq == 1).map(|s| s.count).collect();
    assert_eq!(told, vec![2], "one round told alice of both acks");
    for d in [a1, b1, c1] {
        d.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_acks_give_at_most_one_frame_per_conversation_per_interval() {
    let c = cluster("dlv-batch", "1000").await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let a1 = device(&c, "alice", "a1", true).await;
    let b1 = device(&c, "bob", "b1", false).await;
    // 60 messages over 3 seconds, each acked at once by bob's device.
    let started = std::time::Instant::now();
    for n in 1..=60 {
        a1.send(&format!("m{n}"), "ab", json!({"n": n})).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shown(&a1, "ab", 60, 1).await;
    let elapsed = started.elapsed().as_secs_f64();
    let frames = statuses(&a1);
    // One at once, then at most one per second: the acks alone would move the
    // position every flush (100 ms).
    let most = 2 + elapsed.ceil() as usize;
    assert!(frames.len() <= most, "{} frames in {elapsed:.1} s: {frames:?}", frames.len());
    assert!(frames.windows(2).all(|w| w[0].seq < w[1].seq), "each frame is newer than the last: {frames:?}");
    for d in [a1, b1] {
        d.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_of_a_message_is_for_its_sender_alone() {
    let c = cluster("dlv-api", "200").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "carol"]).await.unwrap();
    c.client(0, "carol", "c1").register_device().await.unwrap();
    let sent = alice.send("g1", "g", &json!({"n": 1})).await.unwrap();
    let b1 = device(&c, "bob", "b1", false).await;
    let path = format!("/v1/messages/{}/status", sent.id.0);
    let answer = eventually(Duration::from_secs(15), "bob's delivery is recorded", || async {
        let (code, body) = alice.get_raw(&path).await.unwrap();
        (code == 200 && body["delivered"] == 1).then_some(body)
    })
    .await;
    assert_eq!(answer["id"], sent.id.0.to_string(), "ids are strings");
    assert_eq!((answer["conv"].as_str(), answer["seq"].as_u64(), answer["of"].as_u64()), (Some("g"), Some(1), Some(2)));
    assert_eq!(
        answer["recipients"],
        json!([{"user": "bob", "delivered": true, "read": false}, {"user": "carol", "delivered": false, "read": false}]),
        "{answer}"
    );

    let code_of = |r: (u16, serde_json::Value)| (r.0, r.1["error"]["code"].as_str().map(str::to_owned));
    let forbidden = code_of(c.client(0, "bob", "b1").get_raw(&path).await.unwrap());
    assert_eq!(forbidden, (403, Some("forbidden".into())), "a recipient is not the sender");
    let other_tenant = code_of(c.client_in(0, "globex", "alice", "a1").get_raw(&path).await.unwrap());
    assert_eq!(other_tenant, (404, Some("not_found".into())), "another tenant's message does not exist");
    let unknown = code_of(alice.get_raw(&format!("/v1/messages/{}/status", sent.id.0 + 1)).await.unwrap());
    assert_eq!(unknown, (404, Some("not_found".into())));
    let malformed = code_of(alice.get_raw("/v1/messages/abc/status").await.unwrap());
    assert_eq!(malformed, (400, Some("bad_request".into())));
    b1.stop().await;
}

/// A status is published only to the sender's devices that asked for `delivered`
/// frames (their presence says so): a sender whose connected devices did not ask costs
/// no push, one that asked gets its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_are_published_only_to_the_senders_devices_that_asked() {
    let c = cluster("dlv-asked", "200").await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let worker = c.workers[0].admin_url();
    let pushes = || herald_tests::drill::metric(&worker, "herald_status_pushes_total");
    let old = device(&c, "alice", "a1", false).await;
    let b1 = device(&c, "bob", "b1", false).await;

    old.send("m1", "ab", json!({"text": "hi"})).await;
    let db = c.db().await;
    eventually(Duration::from_secs(15), "bob's delivered position reaches 1", || async {
        let position: u64 =
            sqlx::query_scalar("SELECT delivered_seq FROM members WHERE conv_id = 'ab' AND user_id = 'bob'")
                .fetch_one(&db)
                .await
                .unwrap();
        (position == 1).then_some(())
    })
    .await;

    // A device of alice that asks: the next message's status is pushed to it alone.
    let asked = device(&c, "alice", "a2", true).await;
    asked.send("m2", "ab", json!({"text": "again"})).await;
    shown(&asked, "ab", 2, 1).await;
    assert_eq!(pushes().await, 1.0, "one push, for m2 to a2; m1's sender had no device that asked");
    assert!(statuses(&old).is_empty(), "{:?}", statuses(&old));
    for d in [old, asked, b1] {
        d.stop().await;
    }
}

/// A presence value without flags, as a gateway of the release before them writes it,
/// counts as asking: while gateways are upgraded after the workers, the sessions that
/// asked still get their statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presence_without_flags_from_an_older_gateway_still_gets_statuses() {
    use fred::prelude::HashesInterface;
    let c = cluster("dlv-oldgw", "200").await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let a1 = device(&c, "alice", "a1", true).await;
    let redis = c.redis().await;
    let key = c.keys().presence(TENANT, "alice");
    let value: String = redis.hget(&key, "a1").await.unwrap();
    let old = value.strip_suffix("|d").unwrap_or_else(|| panic!("a session that asked is flagged: {value}"));
    let _: () = redis.hset(&key, ("a1", old)).await.unwrap();

    let b1 = device(&c, "bob", "b1", false).await;
    a1.send("m1", "ab", json!({"text": "hi"})).await;
    shown(&a1, "ab", 1, 1).await;
    let still: String = redis.hget(&key, "a1").await.unwrap();
    assert_eq!(still, old, "the unflagged value was what the worker read");
    for d in [a1, b1] {
        d.stop().await;
    }
}

/// A delivered position whose write waits on a member row's lock holds up positions
/// only: a send to another conversation of the same shard is still answered, and the
/// position is written once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_position_waiting_on_a_lock_holds_up_no_send_of_its_shard() {
    let mut c = Cluster::new("dlv-lane");
    c.set("HERALD_INGRESS__SHARDS", "1");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("x"), "direct", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("y"), "direct", &["alice", "carol"]).await.unwrap();

    // Bob's member row in x is held by another transaction: his delivered position
    // there cannot be written until it ends.
    let db = c.db().await;
    let mut holder = db.begin().await.unwrap();
    let _: u64 = sqlx::query_scalar(
        "SELECT delivered_seq FROM members WHERE tenant_id = ? AND conv_id = 'x' AND user_id = 'bob' FOR UPDATE",
    )
    .bind(TENANT)
    .fetch_one(&mut *holder)
    .await
    .unwrap();
    let b1 = device(&c, "bob", "b1", false).await;
    alice.send("x1", "x", &json!({"text": "to bob"})).await.unwrap();
    eventually(Duration::from_secs(10), "bob's device acks x1", || async { (!b1.ids().is_empty()).then_some(()) })
        .await;
    eventually(Duration::from_secs(15), "bob's delivered position waits on the lock", || async {
        (statements_waiting(&db).await > 0).then_some(())
    })
    .await;

    // The shard's next sends do not wait for it.
    let sent = alice.send("y1", "y", &json!({"text": "to carol"})).await;
    assert_eq!(sent.expect("a send on the shard is answered while a position waits").seq, 1);

    holder.rollback().await.unwrap();
    eventually(Duration::from_secs(15), "bob's delivered position in x is written", || async {
        let seq: u64 = sqlx::query_scalar("SELECT delivered_seq FROM members WHERE conv_id = 'x' AND user_id = 'bob'")
            .fetch_one(&db)
            .await
            .unwrap();
        (seq == 1).then_some(())
    })
    .await;
    b1.stop().await;
}
