//! Delivery through faults: Redis data loss, half-open connections, gateway crashes and
//! drains. Real processes are killed; nothing acknowledged may be lost.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use herald_client::WsClient;
use herald_shared::protocol::{Hello, ServerFrame};
use herald_tests::{eventually, AutoDevice, Cluster, RedisServer, TENANT};
use serde_json::json;

async fn all_ids(c: &Cluster) -> BTreeSet<u64> {
    sqlx::query_scalar::<_, u64>("SELECT id FROM messages")
        .fetch_all(&c.db().await)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Keeps one device connected (reconnecting to the next gateway whenever its session
/// ends) until it has seen every id in `want`; returns how many frames were repeats.
async fn receive_all(c: &Cluster, user: &str, device: &str, want: &BTreeSet<u64>, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    let mut seen = BTreeSet::new();
    let mut frames = 0;
    let mut attempt = 0;
    while Instant::now() < deadline {
        let gw = attempt % c.gateways.len();
        attempt += 1;
        if c.gateways[gw].child.id().is_none() {
            continue;
        }
        let d = AutoDevice::connect_soft(&c.gateways[gw].base_url(), &c.token(user, device), user, device).await;
        let Some(d) = d else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while Instant::now() < deadline && !d.is_closed() {
            seen.extend(d.ids());
            if want.is_subset(&seen) {
                frames += d.received.lock().unwrap().len();
                d.stop().await;
                return frames - want.len();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let received = d.received.clone();
        d.stop().await;
        let received = received.lock().unwrap();
        seen.extend(received.iter().map(|(_, _, id)| *id));
        frames += received.len();
    }
    panic!("{user}/{device} is missing {} of {} messages", want.difference(&seen).count(), want.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_data_loss_during_traffic_loses_nothing() {
    let mut redis = RedisServer::start().await;
    let mut c = Cluster::with_redis("redisloss", redis.url());
    c // The watermark trails by the outbox's whole retry window (checked at start):
        // 1 s + 100 x 300 ms + a 2 s stale claim.
        .set("HERALD_GATEWAY__WATERMARK_MARGIN_MS", "35000")
        .set("HERALD_OUTBOX__SENDING_STALE_MS", "2000")
        .set("HERALD_GATEWAY__WATERMARK_FLUSH_MS", "300")
        .set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "2000")
        .set("HERALD_WORKER__LEASE_TTL_MS", "1500")
        .set("HERALD_OUTBOX__FIXED_DELAY_MS", "200")
        .set("HERALD_OUTBOX__FIRST_RETRY_DELAY_MS", "1000")
        .set("HERALD_OUTBOX__BACKOFF_MS", "300")
        .set("HERALD_OUTBOX__MAX_ATTEMPTS", "100");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "late").register_device().await.unwrap();
    let online = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "online"), "bob", "online").await;

    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut senders = Vec::new();
    for t in 0..4 {
        let (alice, acked) = (alice.clone(), acked.clone());
        senders.push(tokio::spawn(async move {
            for n in 0..75 {
                alice.send_until_committed(&format!("{t}-{n}"), "ab", &json!({"n": n}), 400).await.expect("committed");
                acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    eventually(Duration::from_secs(30), "a third acknowledged", || {
        let n = acked.load(std::sync::atomic::Ordering::Relaxed);
        async move { (n >= 100).then_some(()) }
    })
    .await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.restart().await;
    for s in senders {
        s.await.unwrap();
    }
    let want = all_ids(&c).await;
    assert_eq!(want.len(), 300);
    let before_loss = online.stop_with_ids().await;
    let repeats =
        receive_all(&c, "bob", "online", &want.difference(&before_loss).copied().collect(), Duration::from_secs(40))
            .await;
    eprintln!("online device: {repeats} repeats on the wire");
    receive_all(&c, "bob", "late", &want, Duration::from_secs(40)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connection_is_closed_and_unacked_messages_arrive_on_reconnect() {
    let mut c = Cluster::new("halfopen");
    c.set("HERALD_GATEWAY__HEARTBEAT_MS", "1000")
        .set("HERALD_GATEWAY__NAT_IDLE_TIMEOUT_MS", "3000")
        .set("HERALD_GATEWAY__ACK_TIMEOUT_MS", "1000")
        .set("HERALD_GATEWAY__ACK_PROBE_MS", "1000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    // bob connects, then stops reading and acking without closing: no pongs either.
    let mut silent = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    silent.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let started = Instant::now();
    for n in 0..5 {
        alice.send(&format!("m{n}"), "ab", &json!({"n": n})).await.unwrap();
    }
    let redis = c.redis().await;
    let presence = c.keys().presence(TENANT, "bob");
    eventually(Duration::from_secs(10), "the server closes the half-open session", || {
        let (redis, presence) = (redis.clone(), presence.clone());
        async move {
            let v: Option<String> = fred::prelude::HashesInterface::hget(&redis, presence, "b1").await.ok()?;
            v.is_none().then_some(())
        }
    })
    .await;
    let took = started.elapsed();
    // heartbeat (1 s) + ack timeout (1 s) + probe (1 s), with a tick of slack each.
    assert!(took < Duration::from_secs(7), "closed after {took:?}");
    drop(silent);
    let want = all_ids(&c).await;
    assert_eq!(want.len(), 5);
    receive_all(&c, "bob", "b1", &want, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_sigkill_and_sigterm_move_devices_without_loss() {
    let mut c = Cluster::new("gwkill");
    c.set("HERALD_GATEWAY__DRAIN_MS", "1000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    let members: Vec<String> = (0..50).map(|i| format!("u{i:02}")).collect();
    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
    c.client(2, "u00", "x").create_conversation(Some("all"), "group", &refs).await.unwrap();
    // 100 devices on gateway 0.
    let mut devices = Vec::new();
    for m in &members {
        for d in ["p", "q"] {
            devices.push(AutoDevice::connect(&c.gateways[0].base_url(), &c.token(m, d), m, d).await);
        }
    }
    let sender = c.client(2, "u00", "sender");
    let traffic = tokio::spawn(async move {
        for n in 0..60 {
            sender.send_until_committed(&format!("k{n}"), "all", &json!({"n": n}), 100).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    c.gateways[0].kill().await;
    traffic.await.unwrap();
    let want = all_ids(&c).await;
    assert_eq!(want.len(), 60);
    for d in devices.drain(..) {
        let (u, dev) = (d.user.clone(), d.device.clone());
        let before = d.stop_with_ids().await;
        let rest: BTreeSet<u64> = want.difference(&before).copied().collect();
        if !rest.is_empty() {
            receive_all(&c, &u, &dev, &rest, Duration::from_secs(30)).await;
        }
    }

    // SIGTERM: clients on gateway 1 get `reconnect`, then 4003.
    let mut moved = Vec::new();
    for m in members.iter().take(10) {
        moved.push(AutoDevice::connect(&c.gateways[1].base_url(), &c.token(m, "p"), m, "p").await);
    }
    let pid = c.gateways[1].pid();
    std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    for d in &moved {
        let (closed, others) = (d.closed.clone(), d.others.clone());
        eventually(Duration::from_secs(10), "drained sessions get reconnect and 4003", || {
            let code = *closed.lock().unwrap();
            let reconnect = others.lock().unwrap().iter().any(|f| matches!(f, ServerFrame::Reconnect(_)));
            async move { (code == Some(Some(4003)) && reconnect).then_some(()) }
        })
        .await;
    }
    let earlier = all_ids(&c).await;
    let after = c.client(2, "u01", "late-sender");
    for n in 0..5 {
        after.send(&format!("z{n}"), "all", &json!({})).await.unwrap();
    }
    let new: BTreeSet<u64> = all_ids(&c).await.difference(&earlier).copied().collect();
    assert_eq!(new.len(), 5);
    for d in moved {
        let (u, dev) = (d.user.clone(), d.device.clone());
        d.stop().await;
        receive_all(&c, &u, &dev, &new, Duration::from_secs(30)).await;
    }
}

/// A device that stops reading never holds others up: its queue overflows (counted),
/// the others get everything, and it gets what it missed from its pending set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_blocks_nobody_and_loses_nothing() {
    let mut c = Cluster::new("slowconsumer");
    c.set("HERALD_GATEWAY__REALTIME_QUEUE", "8").set("HERALD_GATEWAY__INFLIGHT_WINDOW", "8");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "carol"]).await.unwrap();
    let mut stuck = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "slow")).await.unwrap();
    stuck.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let fast = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("carol", "fast"), "carol", "fast").await;
    for n in 0..200 {
        alice.send_until_committed(&format!("m{n}"), "g", &json!({"pad": "x".repeat(500)}), 20).await.unwrap();
    }
    let want = all_ids(&c).await;
    let received = fast.received.clone();
    eventually(Duration::from_secs(20), "the fast device gets everything while the slow one reads nothing", || {
        let got: BTreeSet<u64> = received.lock().unwrap().iter().map(|r| r.2).collect();
        let done = got == want;
        async move { done.then_some(()) }
    })
    .await;
    fast.stop().await;
    drop(stuck);
    receive_all(&c, "bob", "slow", &want, Duration::from_secs(30)).await;
}

/// Redis forgets its scripts (a restart that kept the data, a `SCRIPT FLUSH`): the
/// fan-out loads them again, every frame of a run of several messages is stored under
/// its key with the messages' expiry, and every message reaches the online device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_forgot_its_scripts_still_gets_every_frame_and_delivery() {
    use fred::prelude::{KeysInterface, LuaInterface};
    let redis = RedisServer::start().await;
    let mut c = Cluster::with_redis("noscript", redis.url());
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    let r = c.redis().await;
    let _: () = r.script_flush(false).await.unwrap();

    // Concurrent sends: the gateway packs them, so several are committed and fanned out
    // as one run, whose frames go to Redis in one script call.
    let sends = (0..30).map(|n| {
        let alice = alice.clone();
        async move { alice.send_until_committed(&format!("f{n}"), "ab", &json!({"n": n}), 20).await.expect("committed") }
    });
    let sent = futures::future::join_all(sends).await;
    let mut per_commit = std::collections::BTreeMap::<u64, usize>::new();
    for s in &sent {
        *per_commit.entry(s.ts).or_default() += 1;
    }
    assert!(per_commit.values().any(|&n| n > 1), "no commit held several messages: {per_commit:?}");

    let keys = c.keys();
    for s in &sent {
        let key = keys.message(s.id);
        let frame: Option<String> = r.get(&key).await.unwrap();
        let frame = frame.unwrap_or_else(|| panic!("no frame stored for {}", s.id.0));
        assert!(frame.contains(&format!("\"id\":\"{}\"", s.id.0)), "{frame}");
        let ttl: i64 = r.ttl(&key).await.unwrap();
        assert!(ttl > 0, "the frame of {} has no expiry ({ttl})", s.id.0);
    }
    let want: BTreeSet<u64> = sent.iter().map(|s| s.id.0).collect();
    eventually(Duration::from_secs(10), "bob's device has every message", || {
        let got = bob.ids();
        let want = &want;
        async move { want.is_subset(&got).then_some(()) }
    })
    .await;
}

/// A script call lands while Redis keeps forgetting its scripts: loading it and then
/// calling it by hash would leave a window for the next `SCRIPT FLUSH` (a failover, a
/// restart) in between, where the call failed and the session that made it was closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_call_lands_while_redis_keeps_forgetting_its_scripts() {
    use fred::prelude::LuaInterface;
    use herald_shared::scripts::SEQ_RAISE;
    let redis = RedisServer::start().await;
    let c = Cluster::with_redis("forgetful", redis.url());
    let (caller, flusher) = (c.redis().await, c.redis().await);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flushes = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: () = flusher.script_flush(false).await.unwrap();
                n += 1;
            }
            n
        }
    });
    for seq in 1..=2_000i64 {
        let raised: Result<i64, _> = SEQ_RAISE.call(&caller, vec!["forgetful:seq"], vec![60, seq]).await;
        assert_eq!(raised.unwrap_or_else(|e| panic!("call {seq}: {e}")), 1, "call {seq}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(flushes.await.unwrap() > 100, "Redis was not made to forget its scripts often");
}
