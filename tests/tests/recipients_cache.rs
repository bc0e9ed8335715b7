//! The commit's recipients cache (docs/architecture.md section 3): a worker keeps each
//! conversation's members and their devices between commits, so every change of who
//! receives must reach it. The drill changes them while a sender keeps sending: a
//! device registers, another logs out, a member is removed and added again, a device
//! takes a push token. Every message whose send started after a change returned is
//! fanned out as the change says, read off the devices' pending sets (offline devices:
//! nothing but the fan-out fills them). Run with the cache on, and off. And the rolling
//! upgrade: a gateway of an older release registers devices without raising the epoch,
//! so while one runs the cache is off, and what it held before is dropped.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::prelude::*;
use herald_tests::pending_ids;
use herald_tests::{eventually, Cluster, TENANT};
use serde_json::json;

/// A message the sender got acknowledged: when its send started, when it was
/// acknowledged, and its id.
type Sent = (Instant, Instant, u64);

/// The ids of the messages whose send started after `t` (and, with `until`, were
/// acknowledged before it: committed before it).
fn started_between(sent: &[Sent], t: Instant, until: Option<Instant>) -> BTreeSet<u64> {
    sent.iter().filter(|(s, a, _)| *s > t && until.is_none_or(|u| *a < u)).map(|(_, _, id)| *id).collect()
}

async fn recipients_follow_every_change_during_sends(name: &str, cache_devices: &str) {
    let mut c = Cluster::new(name);
    c.set("HERALD_WORKER__RECIPIENT_CACHE_DEVICES", cache_devices)
        // Push hand-off on (to nowhere): an offline device with a push token gets a
        // notification row.
        .set("HERALD_PUSH__TENANT_WEBHOOKS", &format!("{TENANT}=http://127.0.0.1:9/hook"))
        .set("HERALD_PUSH__WEBHOOK_SECRET", "drill-secret-0123456789")
        .set("HERALD_PUSH__DELAY_MS", "200");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "carol"]).await.unwrap();
    // bob's first device and carol's device: registered, never connected.
    c.client(0, "bob", "b1").register_device().await.unwrap();
    c.client(0, "carol", "c1").register_device().await.unwrap();

    cache_in_use(&c, if cache_devices == "0" { 0.0 } else { 1.0 }).await;

    // The sender: one message every 25 ms (under the device's send rate), until stopped.
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let sender = tokio::spawn({
        let (alice, sent, stop) = (alice.clone(), sent.clone(), stop.clone());
        async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let r = alice.send_until_committed(&format!("m{n}"), "g", &json!(n), 20).await.expect("committed");
                sent.lock().unwrap().push((started, Instant::now(), r.id.0));
                n += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    });
    let phase = || tokio::time::sleep(Duration::from_millis(400));
    phase().await;
    // A device registers: a recipient from then on.
    c.client(0, "bob", "b2").register_device().await.unwrap();
    let registered = Instant::now();
    phase().await;
    // A device takes a push token (the cached recipients carry whether it has one).
    c.client(0, "bob", "b2").register_push("fcm", "t-b2").await.unwrap();
    let pushable = Instant::now();
    phase().await;
    // A device logs out: no recipient from then on.
    c.client(0, "bob", "b1").logout().await.expect("logged out");
    let logged_out = Instant::now();
    phase().await;
    // A member is removed, then added again.
    alice.change_members("g", &[], &["carol"]).await.unwrap();
    let removed = Instant::now();
    phase().await;
    let adding = Instant::now();
    alice.change_members("g", &["carol"], &[]).await.unwrap();
    let added = Instant::now();
    phase().await;
    stop.store(true, Ordering::Relaxed);
    sender.await.unwrap();
    let sent = sent.lock().unwrap().clone();
    assert!(sent.len() > 60, "the sender kept sending: {} messages", sent.len());

    let (redis, keys) = (c.redis().await, c.keys());
    let want_b2 = started_between(&sent, registered, None);
    eventually(Duration::from_secs(10), "every message sent after b2 registered is pending for it", || {
        let (redis, keys, want) = (redis.clone(), keys.clone(), want_b2.clone());
        async move {
            let have = pending_ids(&redis, &keys, "bob", "b2").await;
            want.is_subset(&have).then_some(())
        }
    })
    .await;
    let want_back = started_between(&sent, added, None);
    eventually(Duration::from_secs(10), "every message sent after carol was added again is pending for her", || {
        let (redis, keys, want) = (redis.clone(), keys.clone(), want_back.clone());
        async move { want.is_subset(&pending_ids(&redis, &keys, "carol", "c1").await).then_some(()) }
    })
    .await;
    // Everything is fanned out by now (the last messages reached b2 and c1).
    let b1 = pending_ids(&redis, &keys, "bob", "b1").await;
    let after_logout = started_between(&sent, logged_out, None);
    assert!(
        b1.is_disjoint(&after_logout),
        "messages sent after the logout reached b1: {:?}",
        b1.intersection(&after_logout)
    );
    let c1 = pending_ids(&redis, &keys, "carol", "c1").await;
    let while_away = started_between(&sent, removed, Some(adding));
    assert!(!while_away.is_empty(), "messages were sent while carol was away");
    assert!(
        c1.is_disjoint(&while_away),
        "messages sent while carol was away reached her: {:?}",
        c1.intersection(&while_away)
    );

    // The push token: the messages after it are handed to push for b2 (it is offline;
    // its notifications collapse into one row, holding the latest message).
    let db = c.db().await;
    let after_token = started_between(&sent, pushable, None);
    eventually(Duration::from_secs(10), "a message sent after b2 took a push token is handed to push", || {
        let (db, after_token) = (db.clone(), after_token.clone());
        async move {
            let pushed: Vec<u64> =
                sqlx::query_scalar("SELECT msg_id FROM push_notifications WHERE user_id = 'bob' AND device_id = 'b2'")
                    .fetch_all(&db)
                    .await
                    .unwrap();
            pushed.iter().any(|id| after_token.contains(id)).then_some(())
        }
    })
    .await;

    // With the cache on, it was used (else this drill would prove nothing of it).
    let hits = cache_hits(&c).await;
    if cache_devices == "0" {
        assert_eq!(hits, 0.0, "the cache is off");
    } else {
        assert!(
            hits > sent.len() as f64 / 4.0,
            "the cache served few commits: {hits} hits for {} messages",
            sent.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipients_follow_every_change_during_sends_with_the_cache() {
    recipients_follow_every_change_during_sends("rcache-on", "1000000").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipients_follow_every_change_during_sends_without_the_cache() {
    recipients_follow_every_change_during_sends("rcache-off", "0").await;
}

/// Conversations whose recipients the worker's cache served.
async fn cache_hits(c: &Cluster) -> f64 {
    let url = format!("{}/metrics", c.workers[0].admin_url());
    let metrics = reqwest::get(url).await.unwrap().text().await.unwrap();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("herald_recipient_cache_total{result=\"hit\"} ")?.parse().ok())
        .unwrap_or(0.0)
}

/// Waits until the worker's recipients cache is in use (1) or off (0).
async fn cache_in_use(c: &Cluster, in_use: f64) {
    let admin = c.workers[0].admin_url();
    eventually(Duration::from_secs(15), &format!("the recipients cache in use = {in_use}"), || async {
        (herald_tests::drill::metric(&admin, "herald_recipient_cache_in_use").await == in_use).then_some(())
    })
    .await;
}

/// A device registered the way a gateway of an older release registers it: its row
/// written, its tenant's epoch left alone.
async fn register_as_an_older_gateway(c: &Cluster, user: &str, device: &str) {
    let now = herald_shared::ids::now_ms() as i64;
    sqlx::query(
        "INSERT INTO devices (tenant_id, user_id, device_id, platform, watermark, registered_at, last_seen_at) \
         VALUES (?, ?, ?, 'web', 0, ?, ?)",
    )
    .bind(TENANT)
    .bind(user)
    .bind(device)
    .bind(now)
    .bind(now)
    .execute(&c.db().await)
    .await
    .unwrap();
}

/// Whether a gateway of an older release (announced as a live node, not among those
/// that raise device epochs) runs beside the cluster's own.
async fn older_gateway_runs(c: &Cluster, runs: bool) {
    let (redis, keys) = (c.redis().await, c.keys());
    if runs {
        let live = Expiration::PX(120_000);
        let _: () = redis.set(keys.node_live("older-gw"), 1, Some(live), None, false).await.unwrap();
        let _: i64 = redis.sadd(keys.nodes(), "older-gw").await.unwrap();
    } else {
        let _: i64 = redis.srem(keys.nodes(), "older-gw").await.unwrap();
        let _: i64 = redis.del(keys.node_live("older-gw")).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_an_older_gateway_registers_are_recipients_during_a_rolling_upgrade() {
    let mut c = Cluster::new("rcache-upgrade");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_device().await.unwrap();
    cache_in_use(&c, 1.0).await;
    let (redis, keys) = (c.redis().await, c.keys());
    let pending_for = |device: &'static str, id: u64| {
        let (redis, keys) = (redis.clone(), keys.clone());
        async move {
            eventually(Duration::from_secs(10), &format!("message {id} pending for {device}"), || {
                let (redis, keys) = (redis.clone(), keys.clone());
                async move { pending_ids(&redis, &keys, "bob", device).await.contains(&id).then_some(()) }
            })
            .await
        }
    };
    // The conversation's recipients are cached (a second send is served from memory).
    for n in 0..2 {
        let m = alice.send(&format!("m{n}"), "g", &json!(n)).await.unwrap();
        pending_for("b1", m.id.0).await;
    }
    assert!(cache_hits(&c).await >= 1.0, "the second send was served from the cache");

    // An older gateway joins: the cache is off. Messages keep going; a device it
    // registers between two of them gets the second.
    older_gateway_runs(&c, true).await;
    cache_in_use(&c, 0.0).await;
    let m = alice.send("m2", "g", &json!(2)).await.unwrap();
    pending_for("b1", m.id.0).await;
    register_as_an_older_gateway(&c, "bob", "b2").await;
    let m = alice.send("m3", "g", &json!(3)).await.unwrap();
    pending_for("b2", m.id.0).await;

    // It goes, the cache is used again; another older gateway comes and registers a
    // device, and goes before any message is sent: what was cached before it came is
    // not used after it went.
    older_gateway_runs(&c, false).await;
    cache_in_use(&c, 1.0).await;
    for n in 4..6 {
        let m = alice.send(&format!("m{n}"), "g", &json!(n)).await.unwrap();
        pending_for("b2", m.id.0).await;
    }
    older_gateway_runs(&c, true).await;
    cache_in_use(&c, 0.0).await;
    register_as_an_older_gateway(&c, "bob", "b3").await;
    older_gateway_runs(&c, false).await;
    cache_in_use(&c, 1.0).await;
    let m = alice.send("m6", "g", &json!(6)).await.unwrap();
    pending_for("b3", m.id.0).await;
}
