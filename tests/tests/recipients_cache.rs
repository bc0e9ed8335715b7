//! The commit's recipients cache (docs/architecture.md section 3): a worker keeps each
//! conversation's members and their devices between commits, so every change of who
//! receives must reach it. The drill changes them while a sender keeps sending: a
//! device registers, another logs out, a member is removed and added again, a device
//! takes a push token. Every message whose send started after a change returned is
//! fanned out as the change says, read off the devices' pending sets (offline devices:
//! nothing but the fan-out fills them). Run with the cache on, and off.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

    let worker_admin = c.workers[0].admin_url();
    let in_use = if cache_devices == "0" { 0.0 } else { 1.0 };
    eventually(Duration::from_secs(10), "the worker saw every process raise device epochs", || async {
        (herald_tests::drill::metric(&worker_admin, "herald_recipient_cache_in_use").await == in_use).then_some(())
    })
    .await;

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
    let metrics = reqwest::get(format!("{worker_admin}/metrics")).await.unwrap().text().await.unwrap();
    let hits: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("herald_recipient_cache_total{result=\"hit\"} ")?.parse().ok())
        .unwrap_or(0.0);
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
