//! A device whose session is replaced by a newer one on the same gateway (a client that
//! retried its connect while the first was still starting) keeps receiving messages in
//! realtime on the newer session.

use std::time::Duration;

use futures::future::join_all;
use herald_client::ws::{WsClient, WsEvent};
use herald_shared::protocol::ServerFrame;
use herald_tests::{AutoDevice, Cluster};
use serde_json::json;

/// Many devices each open two sessions at once, the second replacing the first; then
/// every device is sent one message, which its surviving session must show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_replaced_on_the_same_gateway_still_gets_its_pushes() {
    const DEVICES: usize = 150;
    let mut c = Cluster::new("session_replace");
    c.set("HERALD_GATEWAY__ADMISSION_RATE", "100000").set("HERALD_GATEWAY__ADMISSION_BURST", "100000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();
    let sender = c.client(0, "sender", "s");
    for i in 0..DEVICES {
        sender.create_conversation(Some(&format!("c{i}")), "direct", &["sender", &format!("u{i}")]).await.unwrap();
    }
    // Both sessions of each device at once: whichever the gateway registered second
    // replaces the other (4002) and is kept.
    let opened = join_all((0..DEVICES).map(|i| {
        let (base, token) = (base.clone(), c.token(&format!("u{i}"), "d"));
        async move {
            let second = async {
                tokio::time::sleep(Duration::from_millis((i % 7) as u64)).await;
                WsClient::connect(&base, &token).await
            };
            let (a, b) = tokio::join!(WsClient::connect(&base, &token), second);
            (a.expect("a session opens"), b.expect("a session opens"))
        }
    }))
    .await;
    let mut kept = Vec::new();
    for (i, (a, b)) in opened.into_iter().enumerate() {
        kept.push(keeper(i, a, b).await);
    }
    for i in 0..DEVICES {
        sender.send(&format!("m{i}"), &format!("c{i}"), &json!({ "n": i })).await.unwrap();
    }
    let mut missing = Vec::new();
    for (i, s) in kept.iter_mut().enumerate() {
        let mut got = false;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            match s.next(Duration::from_millis(500)).await {
                Some(WsEvent::Frame(ServerFrame::Msg(m))) if m.conv == format!("c{i}") => {
                    got = true;
                    break;
                }
                Some(WsEvent::Closed(code)) => panic!("device u{i}'s kept session closed: {code:?}"),
                _ => {}
            }
        }
        if !got {
            missing.push(i);
        }
    }
    assert!(missing.is_empty(), "devices whose kept session got no push within 10 s: {missing:?}");
}

/// The session of the two that was not replaced: the other one is closed with 4002.
async fn keeper(i: usize, a: WsClient, b: WsClient) -> WsClient {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut both = [Some(a), Some(b)];
    loop {
        assert!(tokio::time::Instant::now() < deadline, "device u{i}: neither session was replaced");
        for k in 0..2 {
            let closed = match both[k].as_mut().expect("both open").next(Duration::from_millis(100)).await {
                Some(WsEvent::Closed(code)) => Some(code),
                _ => None,
            };
            if let Some(code) = closed {
                assert_eq!(code, Some(4002), "device u{i}: a session closed otherwise than replaced");
                return both[1 - k].take().expect("the other one");
            }
        }
    }
}

/// The close code `ws` ends with, reading (and skipping) its frames for up to `within`;
/// `None` when it is still open then.
async fn closes_with(ws: &mut WsClient, within: Duration) -> Option<Option<u16>> {
    let deadline = tokio::time::Instant::now() + within;
    while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
        match ws.next(left).await {
            Some(WsEvent::Closed(code)) => return Some(code),
            Some(_) => continue,
            None => return None,
        }
    }
    None
}

/// A session whose start is held up on one gateway (here its device's registration waits
/// on a row lock) claims the device's presence only after a newer session of the device
/// opened on another gateway: the late claim replaces nothing, the older session is the
/// one closed (4002), and the newer keeps the device and its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_session_whose_claim_lands_late_never_replaces_a_newer_one() {
    let mut c = Cluster::new("session_epoch");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let token = c.token("bob", "b1");
    // Gateway 1 registers the device (and remembers it); for gateway 0 it is due a
    // `last_seen_at` write, which the lock below holds up.
    let first = AutoDevice::connect(&c.gateways[1].base_url(), &token, "bob", "b1").await;
    first.stop().await;
    let db = c.db().await;
    let old = herald_shared::ids::now_ms() as i64 - 11 * 60 * 1_000;
    sqlx::query("UPDATE devices SET last_seen_at = ?").bind(old).execute(&db).await.unwrap();
    let mut lock = db.begin().await.unwrap();
    sqlx::query("SELECT * FROM devices WHERE device_id = 'b1' FOR UPDATE").execute(&mut *lock).await.unwrap();

    // The older session: admitted on gateway 0, its start waiting on the registration.
    let base0 = c.gateways[0].base_url();
    let older = tokio::spawn({
        let token = token.clone();
        async move { WsClient::connect(&base0, &token).await.expect("upgrade") }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The newer session, on gateway 1, starts at once.
    let newer = AutoDevice::connect(&c.gateways[1].base_url(), &token, "bob", "b1").await;
    lock.rollback().await.unwrap();
    let mut older = older.await.unwrap();
    assert_eq!(
        closes_with(&mut older, Duration::from_secs(10)).await,
        Some(Some(4002)),
        "the older session, claiming late, is the one replaced"
    );
    let m = alice.send("m1", "ab", &json!({"n": 1})).await.unwrap();
    herald_tests::eventually(Duration::from_secs(10), "the newer session gets the message", || async {
        newer.ids().contains(&m.id.0).then_some(())
    })
    .await;
    assert_eq!(*newer.closed.lock().unwrap(), None, "the newer session was not kicked");
    newer.stop().await;
}
