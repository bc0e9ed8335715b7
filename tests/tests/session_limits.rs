//! What bounds a WebSocket session: its token's expiry, the request buckets of `sync`
//! and `read`, a deadline on every write, history pages bounded by bytes, and an
//! admission budget that only valid tokens spend.

use std::time::Duration;

use herald_client::{WsClient, WsEvent};
use herald_shared::auth::{sign, Claims, Platform};
use herald_shared::error::ErrorCode;
use herald_shared::ids::now_ms;
use herald_shared::protocol::{ClientFrame, Hello, History, ReadFrame, ServerFrame, SyncFrame};
use herald_tests::drill::metric;
use herald_tests::{eventually, Cluster, SECRET, TENANT};
use serde_json::json;

fn token_expiring_in(user: &str, device: &str, secs: u64) -> String {
    let claims = Claims {
        tid: TENANT.into(),
        sub: user.into(),
        dev: device.into(),
        plat: Platform::Web,
        exp: now_ms() / 1000 + secs,
        iat: None,
    };
    sign(&claims, SECRET.as_bytes())
}

/// A session ends with 4001 when its token expires, as the protocol says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_with_4001_when_its_token_expires() {
    let mut c = Cluster::new("tokenexp");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &token_expiring_in("bob", "b1", 3)).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let closed = loop {
        match ws.next(Duration::from_secs(10)).await {
            Some(WsEvent::Closed(code)) => break code,
            Some(_) => continue,
            None => panic!("still open 10 s after its token expired"),
        }
    };
    assert_eq!(closed, Some(4001));
}

/// `sync` and `read` frames take from the device's request bucket like sends: over it
/// they are refused with `rate_limited` (and the request's `ref`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_and_read_frames_are_rate_limited() {
    let mut c = Cluster::new("reqlimit");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__SEND_RATE", "1"), ("HERALD_GATEWAY__SEND_BURST", "2")]).await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    for k in 0..4 {
        let f = SyncFrame { conv: "ab".into(), after_seq: 0, limit: None, reference: Some(format!("s{k}")) };
        ws.send(&ClientFrame::Sync(f)).await.unwrap();
    }
    for _ in 0..3 {
        ws.send(&ClientFrame::Read(ReadFrame { conv: "ab".into(), seq: 0 })).await.unwrap();
    }
    let (mut answered, mut limited) = (0, Vec::new());
    while let Some(ev) = ws.next(Duration::from_secs(2)).await {
        match ev {
            WsEvent::Frame(ServerFrame::History(_)) => answered += 1,
            WsEvent::Frame(ServerFrame::Error(e)) if e.code == ErrorCode::RateLimited => {
                assert!(e.retry_after_ms.is_some(), "{e:?}");
                limited.push(e.reference);
            }
            WsEvent::Frame(_) | WsEvent::Other(_) => {}
            WsEvent::Closed(code) => panic!("closed {code:?}"),
        }
    }
    assert_eq!(answered, 2, "the burst of two");
    assert_eq!(limited.len(), 5, "two syncs and three reads over it: {limited:?}");
    assert_eq!(limited[..2], [Some("s2".to_string()), Some("s3".to_string())], "a refused sync keeps its ref");
}

/// A client that stops reading (its buffers full) does not hold its session forever:
/// the write that cannot finish gives up after `gateway.write_timeout_ms` and the
/// session is closed as half-open. Before: the session loop blocked in that write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_closed_after_the_write_deadline() {
    let mut c = Cluster::new("stuckpeer");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__WRITE_TIMEOUT_MS", "1000"),
        ("HERALD_GATEWAY__MAX_BODY_BYTES", "65536"),
        ("HERALD_GATEWAY__SEND_RATE", "100000"),
        ("HERALD_GATEWAY__SEND_BURST", "100000"),
    ])
    .await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    // bob connects and never reads again.
    let mut stuck = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    stuck.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let big = "x".repeat(60_000);
    let senders: Vec<_> = (0..4)
        .map(|t| {
            let (alice, big) = (alice.clone(), big.clone());
            tokio::spawn(async move {
                for k in (t..400).step_by(4) {
                    let _ = alice.send(&format!("m{k}"), "ab", &json!({ "fill": big })).await;
                }
            })
        })
        .collect();
    let admin = c.gateways[0].admin_url();
    eventually(Duration::from_secs(60), "a write missed its deadline and the session closed", || {
        let admin = admin.clone();
        async move {
            let timeouts = metric(&admin, "herald_write_timeouts_total").await;
            let sessions = metric(&admin, "herald_gateway_sessions").await;
            (timeouts >= 1.0 && sessions == 0.0).then_some(())
        }
    })
    .await;
    for s in senders {
        s.abort();
    }
    drop(stuck);
}

/// A history page stops before its bodies pass `gateway.history_page_bytes` and says
/// there is more, so it always fits the socket's write buffer. Before: a page of large
/// messages was dropped without a word and the `sync` never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_page_of_large_messages_is_bounded_by_bytes() {
    let mut c = Cluster::new("histbytes");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__MAX_BODY_BYTES", "65536"),
        ("HERALD_GATEWAY__SEND_RATE", "100000"),
        ("HERALD_GATEWAY__SEND_BURST", "100000"),
    ])
    .await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let big = "y".repeat(60_000);
    for k in 0..30 {
        alice.send_until_committed(&format!("m{k}"), "ab", &json!({ "fill": big }), 20).await.unwrap();
    }
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b1")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let f = SyncFrame { conv: "ab".into(), after_seq: after, limit: Some(1_000), reference: Some("h".into()) };
        ws.send(&ClientFrame::Sync(f)).await.unwrap();
        let page: History = ws.next_of::<History>(Duration::from_secs(10)).await.expect("every sync is answered");
        pages += 1;
        assert!(!page.items.is_empty());
        let bytes: usize = page.items.iter().map(|m| m.body.get().len()).sum();
        assert!(bytes <= 512 * 1024 + 70_000, "{bytes} bytes in one page");
        after = page.items.last().unwrap().seq;
        if !page.more {
            break;
        }
    }
    assert_eq!(after, 30, "every message, page by page");
    assert!(pages >= 3, "1.8 MB of bodies in pages of 512 KiB: {pages}");
}

/// Connections with bad tokens do not spend the node's admission budget: after a burst
/// of them, a valid device is still admitted. Before: it was refused with 1013.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_do_not_spend_the_admission_budget() {
    let mut c = Cluster::new("admission");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__ADMISSION_RATE", "1"), ("HERALD_GATEWAY__ADMISSION_BURST", "1")]).await;
    let base = c.gateways[0].base_url();
    for _ in 0..10 {
        let mut ws = WsClient::connect(&base, "not-a-token").await.unwrap();
        assert!(matches!(ws.next(Duration::from_secs(5)).await, Some(WsEvent::Closed(Some(4001)))));
    }
    let mut ws = WsClient::connect(&base, &c.token("bob", "b1")).await.unwrap();
    assert!(ws.next_of::<Hello>(Duration::from_secs(5)).await.is_some(), "the valid device is admitted");
}
