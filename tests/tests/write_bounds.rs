//! Every frame a session writes is under the write deadline and the frame-size bound
//! (issue 27): backlog pages stop at the first write that misses its deadline, and
//! history pages (the `sync` answer and `GET .../messages`) count whole items, timeline
//! events included, against `gateway.history_page_bytes`.

use std::time::{Duration, Instant};

use fred::prelude::*;
use herald_client::{WsClient, WsEvent};
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::protocol::{msg_frame, ClientFrame, Hello, Message, ServerFrame, SyncFrame};
use herald_tests::drill::metric;
use herald_tests::{eventually, Cluster, TENANT};
use serde_json::value::RawValue;
use serde_json::Value;

/// Writes `n` messages of `bytes` bytes each into bob's backlog as the worker stores
/// them (frame, then pending entry): 40 MB in a moment, no sender needed.
async fn large_backlog(c: &Cluster, n: usize, bytes: usize) -> Vec<String> {
    let (redis, keys) = (c.redis().await, c.keys());
    let body = format!("{{\"fill\":\"{}\"}}", "z".repeat(bytes));
    let first = MsgId::lowest_at(now_ms() - 60_000).0;
    let mut written = Vec::new();
    for k in 0..n as u64 {
        let id = MsgId(first + k);
        let m = Message {
            id,
            conv: "ab".into(),
            seq: k + 1,
            from: "alice".into(),
            cmid: format!("c{k}"),
            ts: 0,
            body: RawValue::from_string(body.clone()).unwrap(),
            status: None,
            event: None,
            edited_seq: None,
            recalled_seq: None,
        };
        let _: () = redis.set(keys.message(id), msg_frame(&m), None, None, false).await.unwrap();
        let _: i64 = redis
            .zadd(keys.pending(TENANT, "bob", "b1"), None, None, false, false, (id.score(), id.member()))
            .await
            .unwrap();
        written.push(keys.message(id));
    }
    written
}

/// A device that stops reading while its backlog is paged is closed once a write misses
/// `gateway.write_timeout_ms`, not after a deadline per frame of the page. Before: every
/// frame of the 200-frame page waited its own deadline after the socket filled (100 s
/// and more here) and the session held its slots all that time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_during_its_backlog_is_closed_after_one_deadline() {
    let mut c = Cluster::new("stuckbacklog");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__WRITE_TIMEOUT_MS", "1000"), ("HERALD_GATEWAY__MAX_BODY_BYTES", "262144")])
        .await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_device().await.unwrap();
    // 200 frames of 200 KB: more than loopback's socket buffers and the gateway's
    // write buffer take, in one backlog page (`backlog_page_desktop`).
    let stored = large_backlog(&c, 200, 200_000).await;

    let admin = c.gateways[0].admin_url();
    let mut stuck = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    stuck.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    // Bob reads nothing more.
    let stalled = eventually(Duration::from_secs(60), "a backlog write missed its deadline", || {
        let admin = admin.clone();
        async move { (metric(&admin, "herald_write_timeouts_total").await >= 1.0).then(Instant::now) }
    })
    .await;
    eventually(Duration::from_secs(120), "the stalled session is closed", || {
        let admin = admin.clone();
        async move { (metric(&admin, "herald_gateway_sessions").await == 0.0).then_some(()) }
    })
    .await;
    let took = stalled.elapsed();
    assert!(took < Duration::from_secs(6), "closed {took:?} after its first missed deadline (1 s)");
    assert_eq!(metric(&admin, "herald_write_timeouts_total").await, 1.0, "one missed deadline ends the session");
    drop(stuck);
    let _: i64 = c.redis().await.del(stored).await.unwrap();
}

/// A `sync` answer (and a history page over HTTP) whose items are membership events
/// listing hundreds of long user ids is paged by the size of whole items: every page
/// stays within `gateway.history_page_bytes` plus one item, and every event arrives.
/// Before: pages counted bodies only (an event's body is small), so six events of
/// 56 KB each went out as one frame past the socket's write buffer, and the `sync` was
/// never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_answers_with_large_membership_events_stay_within_the_frame_bound() {
    const PAGE_BYTES: usize = 16_384;
    let mut c = Cluster::new("eventpages");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__HISTORY_PAGE_BYTES", &PAGE_BYTES.to_string())]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let users: Vec<String> = (0..900).map(|i| format!("member-{i:0>53}")).collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    for _ in 0..3 {
        alice.change_members("g", &users, &[]).await.unwrap();
        alice.change_members("g", &[], &users).await.unwrap();
    }
    let events = 6;

    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let (mut after, mut pages, mut seen) = (0, 0, 0);
    loop {
        let f = SyncFrame { conv: "g".into(), after_seq: after, limit: Some(1_000), reference: Some("s".into()) };
        ws.send(&ClientFrame::Sync(f)).await.unwrap();
        let page = loop {
            match ws.next(Duration::from_secs(10)).await {
                Some(WsEvent::Frame(ServerFrame::History(h))) => break h,
                Some(WsEvent::Closed(code)) => panic!("closed ({code:?}) instead of answering the sync"),
                None => panic!("the sync after seq {after} was not answered"),
                Some(_) => continue,
            }
        };
        pages += 1;
        let largest = page.items.iter().map(|m| serde_json::to_string(m).unwrap().len()).max().unwrap_or(0);
        let frame = ServerFrame::History(page.clone()).to_json().len();
        assert!(frame <= PAGE_BYTES + largest + 1_024, "a page of {frame} bytes (largest item {largest})");
        seen += page.items.iter().filter(|m| m.event.is_some()).count();
        after = page.items.last().map_or(after, |m| m.seq);
        if !page.more {
            break;
        }
    }
    assert_eq!(seen, events, "every membership event, page by page");
    assert!(pages >= events, "one 56 KB event per page of 16 KiB: {pages} pages");

    // The same pages over HTTP.
    let bob = c.client(0, "bob", "b1");
    let (mut after, mut seen) = (0, 0);
    loop {
        let (code, page) =
            bob.get_raw(&format!("/v1/conversations/g/messages?after_seq={after}&limit=1000")).await.unwrap();
        assert_eq!(code, 200, "{page}");
        let items = page["items"].as_array().unwrap();
        let largest = items.iter().map(|m| m.to_string().len()).max().unwrap_or(0);
        let bytes = page.to_string().len();
        assert!(bytes <= PAGE_BYTES + largest + 1_024, "an HTTP page of {bytes} bytes (largest item {largest})");
        seen += items.iter().filter(|m| m.get("event").is_some_and(|e| !e.is_null())).count();
        after = items.last().and_then(|m| m["seq"].as_u64()).unwrap_or(after);
        if page["more"] != Value::Bool(true) {
            break;
        }
    }
    assert_eq!(seen, events, "every membership event over HTTP");
}
