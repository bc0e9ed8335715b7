//! Herald unchanged against a private 3-master Redis Cluster (`redis-cluster://` URL):
//! the send path, fan-out over sharded pub/sub to two gateways, paged backlog, reads and
//! kicks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface};
use herald_client::{WsClient, WsEvent};
use herald_shared::protocol::{Hello, ServerFrame};
use herald_tests::redis_cluster::RedisCluster;
use herald_tests::{ack_frame, eventually, fill_backlog, pending_ids, AutoDevice, Cluster, Fill, TENANT};
use serde_json::json;

fn user(i: usize) -> String {
    format!("u{i}")
}

/// Waits until `device` has seen exactly `want` (by id).
async fn receives(device: &AutoDevice, want: &BTreeSet<u64>) {
    let received = device.received.clone();
    let what = format!("{}/{} receives every message", device.user, device.device);
    eventually(Duration::from_secs(20), &what, || {
        let got: BTreeSet<u64> = received.lock().unwrap().iter().map(|(_, _, id)| *id).collect();
        let ok = got == *want;
        async move { ok.then_some(()) }
    })
    .await;
}

/// Eight users with two devices each, one per gateway, in direct and group
/// conversations: sends over HTTP and WebSocket commit and reach every other device in
/// seq order; acks drain the pending sets; reads reach the other devices; a second
/// session of a device on the other gateway closes the first (kick over pub/sub). The
/// keys land where the hash tags say: ingress streams and frames on several masters,
/// each user's keys in one slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delivery_fans_out_over_two_gateways_on_redis_cluster() {
    let rc = RedisCluster::start().await;
    let mut c = Cluster::with_redis("rc-fanout", rc.url());
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;

    let mut convs: Vec<(String, Vec<String>)> =
        (0..4).map(|k| (format!("d{k}"), vec![user(2 * k), user(2 * k + 1)])).collect();
    convs.push(("g0".into(), (0..5).map(user).collect()));
    convs.push(("g1".into(), (3..8).map(user).collect()));
    for (id, members) in &convs {
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        let kind = if id.starts_with('d') { "direct" } else { "group" };
        c.client(0, &members[0], "x").create_conversation(Some(id), kind, &refs).await.unwrap();
    }
    let mut devices = Vec::new();
    for u in 0..8 {
        for (gw, dev) in [(0, "p0"), (1, "p1")] {
            let name = user(u);
            devices.push(AutoDevice::connect(&c.gateways[gw].base_url(), &c.token(&name, dev), &name, dev).await);
        }
    }
    // Device p0 sends over WebSocket, p1 over HTTP through the other gateway.
    let mut http_ids = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let mine: Vec<&String> = convs.iter().filter(|(_, m)| m.contains(&d.user)).map(|(id, _)| id).collect();
        for n in 0..4 {
            let (cmid, conv) = (format!("{i}-{n}"), mine[(i + n) % mine.len()]);
            if d.device == "p0" {
                d.send(&cmid, conv, json!({"n": n})).await;
            } else {
                let http = c.client(0, &d.user, &d.device);
                let r = http.send_until_committed(&cmid, conv, &json!({"n": n}), 20).await.expect("send commits");
                http_ids.push((d.user.clone(), d.device.clone(), conv.clone(), r));
            }
        }
    }
    eventually(Duration::from_secs(20), "every WebSocket send answered", || {
        let done = devices.iter().filter(|d| d.device == "p0").all(|d| d.sent.lock().unwrap().len() == 4);
        async move { done.then_some(()) }
    })
    .await;

    // (conv, seq, id, sender, device) of every send.
    let mut sent: Vec<(String, u64, u64, String, String)> = Vec::new();
    for d in devices.iter().filter(|d| d.device == "p0") {
        for (conv, seq, id) in d.sent.lock().unwrap().values() {
            sent.push((conv.clone(), *seq, *id, d.user.clone(), d.device.clone()));
        }
    }
    for (u, dev, conv, r) in &http_ids {
        sent.push((conv.clone(), r.seq, r.id.0, u.clone(), dev.clone()));
    }
    assert_eq!(sent.len(), 64);
    for (conv, members) in &convs {
        let seqs: BTreeSet<u64> = sent.iter().filter(|s| s.0 == *conv).map(|s| s.1).collect();
        let n = sent.iter().filter(|s| s.0 == *conv).count() as u64;
        assert_eq!(seqs, (1..=n).collect(), "{conv} ({members:?}) has seq 1..N");
    }
    for d in &devices {
        let want: BTreeSet<u64> = sent
            .iter()
            .filter(|s| convs.iter().any(|(id, m)| *id == s.0 && m.contains(&d.user)))
            .filter(|s| !(s.3 == d.user && s.4 == d.device))
            .map(|s| s.2)
            .collect();
        receives(d, &want).await;
        let mut timeline: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (conv, seq, id) in d.received.lock().unwrap().iter() {
            if seen.insert(*id) {
                timeline.entry(conv.clone()).or_default().push(*seq);
            }
        }
        for (conv, seqs) in &timeline {
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{}/{} saw {conv} out of order: {seqs:?}", d.user, d.device);
        }
    }
    let redis = c.redis().await;
    let keys = c.keys();
    for d in &devices {
        let (u, dv) = (d.user.clone(), d.device.clone());
        eventually(Duration::from_secs(10), "pending sets drain with the acks", || {
            let (redis, keys, u, dv) = (redis.clone(), keys.clone(), u.clone(), dv.clone());
            async move { pending_ids(&redis, &keys, &u, &dv).await.is_empty().then_some(()) }
        })
        .await;
    }

    // A read of u0 in d0 (worker: one Lua call per user, then a publish per node).
    let (status, body) =
        c.client(0, "u0", "p0").post_raw("/v1/conversations/d0/read", br#"{"seq": 2}"#.to_vec()).await.unwrap();
    assert_eq!(status, 200, "{body}");
    for d in devices.iter().filter(|d| (d.user == "u0" && d.device == "p1") || d.user == "u1") {
        let others = d.others.clone();
        eventually(Duration::from_secs(10), "the read reaches the other devices", || {
            let ok = others
                .lock()
                .unwrap()
                .iter()
                .any(|f| matches!(f, ServerFrame::Read(r) if r.conv == "d0" && r.seq == 2));
            async move { ok.then_some(()) }
        })
        .await;
    }

    // The same device again on the other gateway: the first session is kicked (4002).
    let first = devices.iter().find(|d| d.user == "u7" && d.device == "p0").unwrap();
    let mut second = WsClient::connect(&c.gateways[1].base_url(), &c.token("u7", "p0")).await.unwrap();
    second.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let closed = first.closed.clone();
    let code = eventually(Duration::from_secs(10), "the replaced session is closed", || {
        let code = *closed.lock().unwrap();
        async move { code }
    })
    .await;
    assert_eq!(code, Some(4002));

    // Where the keys are: per node, by SCAN.
    let prefix = c.prefix.clone();
    let spread =
        |pattern: &str| rc.keys_by_node(&format!("{prefix}:{pattern}")).iter().filter(|k| !k.is_empty()).count();
    assert!(
        spread("ingress:*") > 1,
        "ingress streams on one master only: {:?}",
        rc.keys_by_node(&format!("{prefix}:ingress:*"))
    );
    assert!(spread("m:*") > 1, "message frames on one master only");
    let user_keys: BTreeSet<u16> = [
        keys.devices(TENANT, "u3"),
        keys.presence(TENANT, "u3"),
        keys.pending(TENANT, "u3", "p0"),
        keys.pending(TENANT, "u3", "p1"),
        keys.overflow(TENANT, "u3"),
        keys.reads(TENANT, "u3", "p1"),
    ]
    .iter()
    .map(|k| rc.slot_of(k))
    .collect();
    assert_eq!(user_keys.len(), 1, "one user's keys share a slot");
    let devs_on: Vec<usize> = rc
        .keys_by_node(&format!("{prefix}:{{{TENANT}:u3}}:*"))
        .iter()
        .enumerate()
        .filter(|(_, k)| !k.is_empty())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(devs_on.len(), 1, "one user's keys live on one master");
    // `redis-cli -c` follows the redirection to whichever master holds a frame.
    let (_, _, id, _, _) = &sent[0];
    let frame = rc.cli_follow(&["get", &keys.message(herald_shared::ids::MsgId(*id))]);
    assert!(frame.contains(&format!("\"{id}\"")), "frame of {id} readable through the cluster: {frame}");

    // Node channels are sharded: a message to a gateway goes to its channel's shard, not
    // over the cluster bus to every master.
    assert!(rc.calls("spublish") > 0, "answers, pushes, reads and kicks are SPUBLISHed");
    assert_eq!(rc.calls("publish"), 0, "no PUBLISH reaches the cluster");

    second.close().await;
    for d in devices {
        d.stop().await;
    }
}

/// An offline device's backlog is served from frames spread over the masters (one
/// pipeline of GETs routed per key): with the messages gone from MySQL, every frame
/// still arrives, in pages with acks, then `caught_up`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_pages_read_frames_from_every_master() {
    let rc = RedisCluster::start().await;
    let mut c = Cluster::with_redis("rc-backlog", rc.url());
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__BACKLOG_PAGE_MOBILE", "25"),
        ("HERALD_GATEWAY__SEND_RATE", "100000"),
        ("HERALD_GATEWAY__SEND_BURST", "100000"),
    ])
    .await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "phone").register_device().await.unwrap();
    let pending = fill_backlog(&c, "bob", "phone", "ab", Fill::Sent { sender: &alice, n: 100, tasks: 4 }).await;
    let (redis, keys) = (c.redis().await, c.keys());
    let frames_by_node = rc.keys_by_node(&format!("{}:m:*", c.prefix));
    assert!(
        frames_by_node.iter().filter(|k| !k.is_empty()).count() > 1,
        "the frames spread over the masters: {:?}",
        frames_by_node.iter().map(Vec::len).collect::<Vec<_>>()
    );
    // Only Redis can serve the frames now.
    sqlx::query("DELETE FROM messages").execute(&c.db().await).await.unwrap();

    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "phone")).await.unwrap();
    let hello = ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    assert_eq!(hello.pending, 100);
    let mut got: Vec<u64> = Vec::new();
    let mut pages = 0;
    loop {
        let mut page = Vec::new();
        let mut caught_up = false;
        while let Some(ev) = ws.next(Duration::from_millis(400)).await {
            match ev {
                WsEvent::Frame(ServerFrame::Msg(m)) => page.push(m.id),
                WsEvent::Frame(ServerFrame::CaughtUp(_)) => {
                    caught_up = true;
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if caught_up {
            assert!(page.is_empty());
            break;
        }
        assert!(!page.is_empty(), "the backlog stalled after {} messages", got.len());
        pages += 1;
        got.extend(page.iter().map(|i| i.0));
        ws.send(&ack_frame(page)).await.unwrap();
    }
    assert_eq!(pages, 4, "pages of 25");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "oldest first");
    assert_eq!(got.into_iter().collect::<BTreeSet<u64>>(), pending);
    eventually(Duration::from_secs(5), "the pending set is empty after the acks", || {
        let (redis, keys) = (redis.clone(), keys.clone());
        async move { pending_ids(&redis, &keys, "bob", "phone").await.is_empty().then_some(()) }
    })
    .await;
    ws.close().await;
}

/// One master loses its data while the epoch, on another master, stays: a connected
/// device of a user on that master finds its presence gone at the next heartbeat and
/// restores its pending set from MySQL (the marker went with the data), so everything
/// above its watermark arrives again (repeats, dropped by id by clients).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_losing_its_data_rebuilds_its_users_pending_sets() {
    let rc = RedisCluster::start().await;
    let mut c = Cluster::with_redis("rc-loss", rc.url());
    c.set("HERALD_GATEWAY__HEARTBEAT_MS", "300");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let keys = c.keys();
    let epoch_node = rc.node_of(&keys.epoch());
    let bob = (0..100)
        .map(|i| format!("bob{i}"))
        .find(|u| rc.node_of(&keys.presence(TENANT, u)) != epoch_node)
        .expect("a user on another master");
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", &bob]).await.unwrap();
    let phone = AutoDevice::connect(&c.gateways[0].base_url(), &c.token(&bob, "phone"), &bob, "phone").await;
    let mut want = BTreeSet::new();
    for n in 0..5 {
        want.insert(alice.send_until_committed(&format!("m{n}"), "ab", &json!({"n": n}), 20).await.unwrap().id.0);
    }
    receives(&phone, &want).await;
    let redis = c.redis().await;
    eventually(Duration::from_secs(10), "the acks empty the pending set", || {
        let (redis, keys, bob) = (redis.clone(), keys.clone(), bob.clone());
        async move { pending_ids(&redis, &keys, &bob, "phone").await.is_empty().then_some(()) }
    })
    .await;

    rc.flush(rc.node_of(&keys.presence(TENANT, &bob)));
    let received = phone.received.clone();
    eventually(Duration::from_secs(15), "every message arrives again after the rebuild", || {
        let again = want.iter().all(|id| received.lock().unwrap().iter().filter(|(_, _, r)| r == id).count() == 2);
        async move { again.then_some(()) }
    })
    .await;
    let epoch: Option<String> = redis.get(keys.epoch()).await.unwrap();
    let marker: Option<String> = redis.hget(keys.devices(TENANT, &bob), "epoch:phone").await.unwrap();
    assert!(epoch.is_some() && marker == epoch, "the epoch stayed and the device is trusted in it again");
    phone.stop().await;
}

/// A gateway whose sharded subscription is cut (its connection closed by the master)
/// subscribes again: sends through it are answered and pushes reach its devices, both
/// of which travel on its node channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_subscribes_again_after_its_node_channel_connection_is_cut() {
    let rc = RedisCluster::start().await;
    let mut c = Cluster::with_redis("rc-resub", rc.url());
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__SEND_TIMEOUT_MS", "2000")]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("dm"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    let first = alice.send("before", "dm", &json!({"n": 0})).await.expect("answered before the cut");

    assert!(rc.kill_subscribers() >= 1, "the gateway's subscription was cut");
    // Answers come back on the node channel: once subscribed again, a send is answered.
    let second = eventually(Duration::from_secs(20), "a send answered after the cut", || {
        let alice = &alice;
        async move { alice.send("after", "dm", &json!({"n": 1})).await.ok() }
    })
    .await;
    receives(&bob, &[first.id.0, second.id.0].into()).await;
    bob.stop().await;
    let name = format!("gw-{}.log", c.workers.len() + 1);
    let log = std::fs::read_to_string(c.log_dir.join(&name)).expect("the gateway's log");
    assert!(!log.contains("resubscribe failed"), "the subscription was made again without an error:\n{log}");
}
