//! Delivery over WebSocket: real gateways and worker, real clients.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use herald_client::{WsClient, WsEvent};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ClientFrame, ErrorFrame, Hello, History, PingFrame, Pong, ServerFrame, SyncFrame};
use herald_tests::{ack_frame, eventually, fill_backlog, pending_ids, send_frame, AutoDevice, Cluster, Fill, TENANT};
use serde_json::json;
use sqlx::Row;

/// Two gateways, one worker, 50 devices of 20 users in direct and group
/// conversations, sending over WebSocket: every device but the sender's receives
/// every message, and each conversation's timeline is 1..N in seq order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn devices_on_two_gateways_receive_every_message_in_order() {
    let mut c = Cluster::new("fanout2gw");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    let user = |i: usize| format!("u{i:02}");
    let mut convs: Vec<(String, Vec<String>)> = Vec::new();
    for k in 0..5 {
        convs.push((format!("d{k}"), vec![user(2 * k), user(2 * k + 1)]));
    }
    convs.push(("g0".into(), (10..15).map(user).collect()));
    convs.push(("g1".into(), (15..20).map(user).collect()));
    convs.push(("g2".into(), [0, 5, 10, 15, 19].into_iter().map(user).collect()));
    for (id, members) in &convs {
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        let kind = if id.starts_with('d') { "direct" } else { "group" };
        c.client(0, &members[0], "x").create_conversation(Some(id), kind, &refs).await.unwrap();
    }
    let mut devices = Vec::new();
    for u in 0..20 {
        for d in 0..(if u < 10 { 3 } else { 2 }) {
            let (name, dev) = (user(u), format!("p{d}"));
            let gw = devices.len() % 2;
            devices.push(AutoDevice::connect(&c.gateways[gw].base_url(), &c.token(&name, &dev), &name, &dev).await);
        }
    }
    assert_eq!(devices.len(), 50);
    for (i, d) in devices.iter().enumerate() {
        let mine: Vec<&String> = convs.iter().filter(|(_, m)| m.contains(&d.user)).map(|(id, _)| id).collect();
        for n in 0..6 {
            d.send(&format!("{i}-{n}"), mine[(i + n) % mine.len()], json!({"n": n})).await;
        }
    }
    eventually(Duration::from_secs(30), "every send answered", || {
        let done = devices.iter().all(|d| d.sent.lock().unwrap().len() == 6);
        async move { done.then_some(()) }
    })
    .await;

    let db = c.db().await;
    let rows =
        sqlx::query("SELECT conv_id, seq, id, sender_id, sender_device FROM messages").fetch_all(&db).await.unwrap();
    assert_eq!(rows.len(), 300);
    let text = |r: &sqlx::mysql::MySqlRow, i: usize| String::from_utf8(r.get::<Vec<u8>, _>(i)).unwrap();
    for d in &devices {
        let want: BTreeSet<u64> = rows
            .iter()
            .filter(|r| convs.iter().any(|(id, m)| *id == text(r, 0) && m.contains(&d.user)))
            .filter(|r| !(text(r, 3) == d.user && text(r, 4) == d.device))
            .map(|r| r.get::<u64, _>(2))
            .collect();
        let received = d.received.clone();
        eventually(Duration::from_secs(30), "every message reaches every other device", || {
            let got: BTreeSet<u64> = received.lock().unwrap().iter().map(|(_, _, id)| *id).collect();
            let ok = got == want;
            async move { ok.then_some(()) }
        })
        .await;
        // Timeline per conversation: first sightings in increasing seq; with own sends, 1..N.
        let mut timeline: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (conv, seq, id) in d.received.lock().unwrap().iter() {
            if seen.insert(*id) {
                timeline.entry(conv.clone()).or_default().push(*seq);
            }
        }
        for (conv, seqs) in &timeline {
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{}/{} saw {conv} out of order: {seqs:?}", d.user, d.device);
            let mut all: BTreeSet<u64> = seqs.iter().copied().collect();
            all.extend(d.sent.lock().unwrap().values().filter(|(c, _, _)| c == conv).map(|(_, s, _)| *s));
            let n = rows.iter().filter(|r| text(r, 0) == *conv).count() as u64;
            assert_eq!(all, (1..=n).collect::<BTreeSet<u64>>(), "{conv} timeline on {}/{}", d.user, d.device);
        }
    }
    // Everything acked: no pending set holds anything.
    let redis = c.redis().await;
    for d in &devices {
        let (redis, keys) = (redis.clone(), c.keys());
        eventually(Duration::from_secs(10), "pending sets drain with the acks", || {
            let (redis, keys) = (redis.clone(), keys.clone());
            let (u, dv) = (d.user.clone(), d.device.clone());
            async move { pending_ids(&redis, &keys, &u, &dv).await.is_empty().then_some(()) }
        })
        .await;
    }
    for d in devices {
        d.stop().await;
    }
}

/// A device offline while 1 000 messages arrive gets them in pages of its platform's
/// size, each page waiting for its acks, then `caught_up`; its pending set ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_device_drains_its_backlog_in_pages() {
    let mut c = Cluster::new("backlog");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__BACKLOG_PAGE_MOBILE", "50"),
        ("HERALD_GATEWAY__SEND_RATE", "100000"),
        ("HERALD_GATEWAY__SEND_BURST", "100000"),
    ])
    .await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "phone").register_device().await.unwrap();
    fill_backlog(&c, "bob", "phone", "ab", Fill::Sent { sender: &alice, n: 1000, tasks: 10 }).await;
    let (redis, keys) = (c.redis().await, c.keys());

    // bob's token says ios: pages of 50.
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "phone")).await.unwrap();
    let hello = ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    assert_eq!(hello.pending, 1000);
    let mut got: Vec<u64> = Vec::new();
    let mut pages = Vec::new();
    loop {
        // Read until the server goes quiet: that is one page.
        let mut page = Vec::new();
        let mut caught_up = None;
        while let Some(ev) = ws.next(Duration::from_millis(400)).await {
            match ev {
                WsEvent::Frame(ServerFrame::Msg(m)) => page.push(m.id),
                WsEvent::Frame(ServerFrame::CaughtUp(f)) => {
                    caught_up = Some(f.delivered);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if let Some(delivered) = caught_up {
            assert!(page.is_empty());
            assert_eq!(delivered, 1000);
            break;
        }
        assert!(!page.is_empty(), "the backlog stalled after {} messages", got.len());
        pages.push(page.len());
        got.extend(page.iter().map(|i| i.0));
        ws.send(&ack_frame(page)).await.unwrap();
    }
    assert_eq!(pages.len(), 20, "pages of 50: {pages:?}");
    assert!(pages.iter().all(|p| *p == 50), "{pages:?}");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "oldest first");
    assert_eq!(got.len(), 1000);
    eventually(Duration::from_secs(5), "the pending set is empty after the acks", || {
        let (redis, keys) = (redis.clone(), keys.clone());
        async move { pending_ids(&redis, &keys, "bob", "phone").await.is_empty().then_some(()) }
    })
    .await;
}

/// Tokens, replaced sessions and malformed frames get the protocol's answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_refusals_and_protocol_errors() {
    let mut c = Cluster::new("wsproto");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__MAX_BODY_BYTES", "1024")]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();

    // Bad and expired tokens: accepted, then closed with 4001.
    let expired = herald_shared::auth::sign(
        &herald_shared::auth::Claims {
            tid: TENANT.into(),
            sub: "a".into(),
            dev: "d".into(),
            plat: herald_shared::auth::Platform::Web,
            exp: 1,
            iat: None,
        },
        herald_tests::SECRET.as_bytes(),
    );
    for token in ["garbage".to_string(), expired] {
        let mut ws = WsClient::connect(&base, &token).await.unwrap();
        assert_eq!(ws.next(Duration::from_secs(5)).await, Some(WsEvent::Closed(Some(4001))));
    }

    // A newer session of the same device replaces the older, across gateways: 4002.
    let mut first = WsClient::connect(&base, &c.token("alice", "a1")).await.unwrap();
    first.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let mut second = WsClient::connect(&c.gateways[1].base_url(), &c.token("alice", "a1")).await.unwrap();
    second.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let closed = loop {
        match first.next(Duration::from_secs(5)).await {
            Some(WsEvent::Closed(code)) => break code,
            Some(WsEvent::Frame(_) | WsEvent::Other(_)) => continue,
            None => panic!("the replaced session was not closed"),
        }
    };
    assert_eq!(closed, Some(4002));

    // Garbage, unknown types, missing fields, oversized frames: error frames, then 4009.
    let mut ws = WsClient::connect(&base, &c.token("bob", "b1")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    ws.send_text("{not json").await.unwrap();
    let e = ws.next_of::<ErrorFrame>(Duration::from_secs(5)).await.unwrap();
    assert_eq!(e.code, ErrorCode::BadRequest);
    ws.send_json(&json!({"t": "dance"})).await.unwrap();
    assert!(ws.next_of::<ErrorFrame>(Duration::from_secs(5)).await.unwrap().message.contains("unknown frame type"));
    ws.send_json(&json!({"t": "send", "cmid": "m1", "conv": "x"})).await.unwrap();
    let e = ws.next_of::<ErrorFrame>(Duration::from_secs(5)).await.unwrap();
    assert_eq!((e.code, e.reference.as_deref()), (ErrorCode::BadRequest, Some("m1")));
    ws.send(&send_frame("m2", "x", &json!("y".repeat(3_000)))).await.unwrap();
    assert_eq!(ws.next_of::<ErrorFrame>(Duration::from_secs(5)).await.unwrap().code, ErrorCode::TooLarge);
    ws.send(&send_frame("m3", "nope", &json!({}))).await.unwrap();
    let e = ws.next_of::<ErrorFrame>(Duration::from_secs(5)).await.unwrap();
    assert_eq!((e.code, e.reference.as_deref()), (ErrorCode::NotFound, Some("m3")));
    ws.send(&ClientFrame::Ping(PingFrame { ts: Some(42) })).await.unwrap();
    assert_eq!(ws.next_of::<Pong>(Duration::from_secs(5)).await.unwrap().ts, 42);
    for _ in 0..10 {
        ws.send_text("]]").await.unwrap();
    }
    let code = loop {
        match ws.next(Duration::from_secs(5)).await {
            Some(WsEvent::Closed(code)) => break code,
            Some(WsEvent::Frame(_) | WsEvent::Other(_)) => continue,
            None => panic!("not closed after repeated protocol errors"),
        }
    };
    assert_eq!(code, Some(4009));
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&c.db().await).await.unwrap();
    assert_eq!(n, 0, "nothing stored");
}

/// Pull is the backstop: the `sync` frame, `GET /v1/conversations/{id}/messages` and
/// `GET /v1/sync` read MySQL, within the caller's membership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_sync_read_the_database_within_membership() {
    let mut c = Cluster::new("history");
    // Device sync returns settled messages only (docs/protocol.md section 2.9).
    c.set("HERALD_DELIVERY__SYNC_SETTLE_MS", "200");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("h"), "group", &["alice", "carol"]).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(alice.send(&format!("g{n}"), "g", &json!({"n": n})).await.unwrap().id);
    }
    alice.send("h0", "h", &json!({})).await.unwrap();
    // dan joins g after seq 5 (his join is the event at seq 6): sees nothing before.
    alice.change_members("g", &["dan"], &[]).await.unwrap();
    let late = alice.send("g5", "g", &json!({"n": 5})).await.unwrap();

    let http = reqwest::Client::new();
    let get = |path: String, user: &str| {
        let token = c.token(user, "x");
        let http = http.clone();
        let url = format!("{}{path}", c.gateways[0].base_url());
        async move { http.get(url).bearer_auth(token).send().await.unwrap() }
    };
    let page: serde_json::Value =
        get("/v1/conversations/g/messages?after_seq=2&limit=2".into(), "bob").await.json().await.unwrap();
    let seqs: Vec<u64> = page["items"].as_array().unwrap().iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!((seqs, page["more"].as_bool()), (vec![3, 4], Some(true)));
    assert_eq!(page["items"][0]["id"], ids[2].to_string(), "ids are strings");
    let dan: serde_json::Value = get("/v1/conversations/g/messages".into(), "dan").await.json().await.unwrap();
    let seqs: Vec<u64> = dan["items"].as_array().unwrap().iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![6, 7], "a joiner sees its join and what came after it");
    assert_eq!(get("/v1/conversations/h/messages".into(), "bob").await.status(), 403);
    assert_eq!(get("/v1/conversations/zzz/messages".into(), "bob").await.status(), 404);

    tokio::time::sleep(Duration::from_millis(300)).await;
    let sync: serde_json::Value =
        get(format!("/v1/sync?after={}&limit=100", ids[0]), "bob").await.json().await.unwrap();
    let got: Vec<String> =
        sync["items"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    let join: u64 = sqlx::query_scalar("SELECT id FROM messages WHERE conv_id = 'g' AND seq = 6")
        .fetch_one(&c.db().await)
        .await
        .unwrap();
    let mut want: Vec<String> = ids[1..].iter().map(|i| i.to_string()).collect();
    want.extend([join.to_string(), late.id.to_string()]);
    assert_eq!(got, want, "bob's sync: his conversations only, in id order");
    assert_eq!(get("/v1/sync?after=abc".into(), "bob").await.status(), 400);

    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let sync = SyncFrame { conv: "g".into(), after_seq: 4, limit: Some(10), reference: Some("r1".into()) };
    ws.send(&ClientFrame::Sync(sync)).await.unwrap();
    let h = ws.next_of::<History>(Duration::from_secs(5)).await.unwrap();
    assert_eq!((h.conv.as_str(), h.reference.as_deref(), h.more), ("g", Some("r1"), false));
    let seqs: Vec<u64> = h.items.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![5, 6, 7]);
    let sync = SyncFrame { conv: "h".into(), after_seq: 0, limit: None, reference: Some("r2".into()) };
    ws.send(&ClientFrame::Sync(sync)).await.unwrap();
    let e = ws.next_of::<ErrorFrame>(Duration::from_secs(5)).await.unwrap();
    assert_eq!((e.code, e.reference.as_deref()), (ErrorCode::Forbidden, Some("r2")));
}
