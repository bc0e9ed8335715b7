//! A device whose session is replaced by a newer one on the same gateway (a client that
//! retried its connect while the first was still starting) keeps receiving messages in
//! realtime on the newer session.

use std::time::Duration;

use futures::future::join_all;
use herald_client::ws::{WsClient, WsEvent};
use herald_shared::protocol::ServerFrame;
use herald_tests::Cluster;
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
