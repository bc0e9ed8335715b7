//! Sends packed per gateway write (`k=sends`): a session's burst shares stream entries
//! and still commits in send order, each send answered; while a worker older than
//! packs is live, every send goes as an entry of its own, which such a worker reads;
//! and a write Redis refuses answers its sends at once.

use std::time::Duration;

use fred::prelude::*;
use herald_client::ClientError;
use herald_shared::error::ErrorCode;
use herald_shared::ids::now_ms;
use herald_tests::drill::metric;
use herald_tests::{entries_added, eventually, AutoDevice, Cluster};
use serde_json::json;

/// One worker and one gateway on one ingress shard (so every send meets one stream),
/// device limits far above a burst, and the conversation `ab` of alice and bob.
async fn cluster(name: &str, extra: &[(&str, &str)]) -> Cluster {
    let mut c = Cluster::new(name);
    c.set("HERALD_INGRESS__SHARDS", "1");
    c.set("HERALD_GATEWAY__SEND_RATE", "10000").set("HERALD_GATEWAY__SEND_BURST", "10000");
    for (k, v) in extra {
        c.set(k, v);
    }
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c
}

/// Alice's session, once a first send of it is answered (the stream exists).
async fn session(c: &Cluster) -> AutoDevice {
    let dev = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("alice", "a1"), "alice", "a1").await;
    dev.send("first", "ab", json!("first")).await;
    eventually(Duration::from_secs(20), "the first send answered", || async {
        dev.sent.lock().unwrap().contains_key("first").then_some(())
    })
    .await;
    dev
}

/// Waits until the gateway's `herald_ingress_packing` gauge reads `value`.
async fn packing_is(c: &Cluster, value: f64) {
    let gw = c.gateways[0].admin_url();
    eventually(Duration::from_secs(20), "the gateway's packing gauge", || async {
        (metric(&gw, "herald_ingress_packing").await == value).then_some(())
    })
    .await;
}

/// Sends `n` in a row on one session without waiting, then waits for every answer:
/// their seqs, in send order.
async fn burst(dev: &AutoDevice, tag: &str, n: usize) -> Vec<u64> {
    for k in 0..n {
        dev.send(&format!("{tag}{k}"), "ab", json!({ "k": k })).await;
    }
    eventually(Duration::from_secs(30), "every send answered", || async {
        let sent = dev.sent.lock().unwrap();
        (0..n).map(|k| sent.get(&format!("{tag}{k}")).map(|s| s.1)).collect::<Option<Vec<u64>>>()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_sends_shares_stream_entries_and_commits_in_send_order() {
    let c = cluster("packs", &[]).await;
    packing_is(&c, 1.0).await;
    let redis = c.redis().await;
    let stream = c.keys().ingress(0);
    let dev = session(&c).await;
    let before = entries_added(&redis, &stream).await;

    let seqs = burst(&dev, "m", 300).await;
    assert_eq!(seqs, (2..=301).collect::<Vec<u64>>(), "committed in send order, gap-free");
    let added = entries_added(&redis, &stream).await - before;
    assert!(added < 300, "300 sends took {added} stream entries: they were not packed");
    let again = c.client(0, "alice", "a1").send("m7", "ab", &json!({ "k": 7 })).await.unwrap();
    assert!(again.dup && again.seq == 9, "a resent cmid of a pack answers its first commit: {again:?}");
    dev.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_worker_older_than_packs_is_live_every_send_is_an_entry_of_its_own() {
    // One shard: the stand-in of the older worker claims half the shards' fair share,
    // which with one shard leaves the real worker its shard.
    let c = cluster("nopacks", &[]).await;
    let redis = c.redis().await;
    let keys = c.keys();
    // A live worker that never said it reads packs: an older release.
    let _: i64 = redis.zadd(keys.workers(), None, None, false, false, (now_ms() as f64, "wk-older")).await.unwrap();
    packing_is(&c, 0.0).await;
    let dev = session(&c).await;
    let stream = keys.ingress(0);
    let before = entries_added(&redis, &stream).await;
    let seqs = burst(&dev, "m", 100).await;
    assert_eq!(seqs, (2..=101).collect::<Vec<u64>>());
    assert_eq!(entries_added(&redis, &stream).await - before, 100, "an entry per send, the format every worker reads");

    // The older worker gone, packing resumes.
    let _: i64 = redis.zrem(keys.workers(), "wk-older").await.unwrap();
    packing_is(&c, 1.0).await;
    dev.stop().await;
}

/// A write the stream refuses (here the stream's key holds a string, so XADD fails
/// with WRONGTYPE) answers its sends `unavailable` at once, not after the send
/// timeout, with nothing committed; once the stream takes writes again, the resend
/// with the same cmid commits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_answers_its_sends_unavailable_at_once_and_the_resend_commits() {
    // A send timeout no answer in this test could come near: a timeout would say "not
    // confirmed in time", a refused write says the queue was unavailable.
    let c = cluster(
        "packfault",
        &[("HERALD_GATEWAY__SEND_TIMEOUT_MS", "60000"), ("HERALD_GATEWAY__REQUEST_TIMEOUT_MS", "90000")],
    )
    .await;
    let alice = c.client(0, "alice", "a1");
    let first = alice.send("m1", "ab", &json!("before")).await.unwrap();
    let redis = c.redis().await;
    let stream = c.keys().ingress(0);
    let _: () = redis.set(&stream, "not a stream", None, None, false).await.unwrap();

    let refused = alice.send("m2", "ab", &json!("during")).await.expect_err("the write was refused");
    match &refused {
        ClientError::Api { status, code, message } => {
            assert_eq!((*status, *code), (503, ErrorCode::Unavailable), "{refused}");
            assert!(message.contains("queue unavailable"), "answered by the failed write, not a timeout: {message}");
        }
        other => panic!("expected 503 unavailable, got {other}"),
    }

    let _: i64 = redis.del(&stream).await.unwrap();
    let resent = eventually(Duration::from_secs(20), "the resend commits", || async {
        alice.send("m2", "ab", &json!("during")).await.ok()
    })
    .await;
    assert_eq!(resent.seq, first.seq + 1, "the refused send was not committed, the resend once");
    let again = alice.send("m2", "ab", &json!("during")).await.unwrap();
    assert!(again.dup && again.seq == resent.seq, "{again:?}");
}
