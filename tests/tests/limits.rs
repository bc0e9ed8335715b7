//! Pacing and limits: realtime overtakes backlog, token buckets pace the backlog,
//! sends and connections are rate limited with retry hints.

use std::time::{Duration, Instant};

use herald_client::{WsClient, WsEvent};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ErrorFrame, Hello, ServerFrame};
use herald_tests::{ack_frame, fill_backlog, send_frame, Cluster, Fill};
use serde_json::json;

/// While a device drains a 5 000-message backlog (paced at 1 000/s), a new message
/// sent to it arrives long before the backlog ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn realtime_overtakes_a_long_paced_backlog() {
    let mut c = Cluster::new("overtake");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__BACKLOG_RATE_DESKTOP", "1000"),
        ("HERALD_GATEWAY__SEND_RATE", "100000"),
        ("HERALD_GATEWAY__SEND_BURST", "100000"),
    ])
    .await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "desk").register_device().await.unwrap();
    fill_backlog(&c, "bob", "desk", "ab", Fill::Sent { sender: &alice, n: 5000, tasks: 25 }).await;

    let token = herald_client::token(
        herald_tests::SECRET,
        herald_tests::TENANT,
        "bob",
        "desk",
        herald_shared::auth::Platform::Desktop,
    );
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &token).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let started = Instant::now();
    let mut backlog_seen = 0usize;
    let mut realtime_at = None;
    let mut sent_realtime = false;
    let realtime_sender = alice.clone();
    let mut realtime_task = None;
    loop {
        let ev = ws.next(Duration::from_secs(20)).await.expect("frames keep coming");
        let f = match ev {
            WsEvent::Frame(f) => f,
            WsEvent::Other(_) => continue,
            WsEvent::Closed(_) => panic!("closed: {ev:?}"),
        };
        match f {
            ServerFrame::Msg(m) => {
                if m.cmid == "urgent" {
                    realtime_at = Some(backlog_seen);
                } else {
                    backlog_seen += 1;
                }
                ws.send(&ack_frame([m.id])).await.unwrap();
                if backlog_seen == 500 && !sent_realtime {
                    sent_realtime = true;
                    let s = realtime_sender.clone();
                    realtime_task =
                        Some(tokio::spawn(async move { s.send("urgent", "ab", &json!({"now": true})).await.unwrap() }));
                }
            }
            ServerFrame::CaughtUp(_) => break,
            _ => {}
        }
    }
    let took = started.elapsed();
    realtime_task.unwrap().await.unwrap();
    let at = realtime_at.expect("the realtime message arrived");
    assert!(at < 2_500, "the realtime message waited behind {at} backlog messages");
    assert_eq!(backlog_seen, 5000);
    // Paced at 1 000/s with a burst of 200: at least ~4.8 s for 5 000.
    assert!(took >= Duration::from_millis(4_500), "the backlog was not paced: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_and_connections_are_rate_limited_with_retry_hints() {
    let mut c = Cluster::new("ratelimit");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__SEND_RATE", "2"),
        ("HERALD_GATEWAY__SEND_BURST", "3"),
        ("HERALD_GATEWAY__ADMISSION_RATE", "1"),
        ("HERALD_GATEWAY__ADMISSION_BURST", "3"),
    ])
    .await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();

    // HTTP: the burst passes, then 429 with Retry-After.
    let mut limited = 0;
    for n in 0..6 {
        match alice.send(&format!("h{n}"), "ab", &json!({})).await {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::RateLimited));
                limited += 1;
            }
        }
    }
    assert!(limited >= 2, "a burst of 3 at 2/s cannot take 6 sends at once");

    // WebSocket: `rate_limited` with retry_after_ms, echoing the cmid.
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    for n in 0..6 {
        ws.send(&send_frame(&format!("w{n}"), "ab", &json!({}))).await.unwrap();
    }
    let e = ws.next_of::<ErrorFrame>(Duration::from_secs(5)).await.unwrap();
    assert_eq!(e.code, ErrorCode::RateLimited);
    assert!(e.retry_after_ms.unwrap() > 0);
    assert!(e.reference.unwrap().starts_with('w'));

    // Admission: a burst of 3 connections (bob's is one), then refusals with a hint.
    let mut refused = 0;
    let mut keep = Vec::new();
    for n in 0..4 {
        let mut w = WsClient::connect(&c.gateways[0].base_url(), &c.token("carol", &format!("c{n}"))).await.unwrap();
        match w.next(Duration::from_secs(5)).await {
            Some(WsEvent::Frame(ServerFrame::Hello(_))) => keep.push(w),
            Some(WsEvent::Frame(ServerFrame::Error(e))) => {
                assert_eq!(e.code, ErrorCode::RateLimited);
                assert!(e.retry_after_ms.unwrap() >= 100);
                assert_eq!(w.next(Duration::from_secs(5)).await, Some(WsEvent::Closed(Some(1013))));
                refused += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(refused >= 1, "admission was not limited");
}
