//! The Rust client library's `Device` follows docs/client.md: it sends its token as the
//! first frame and offers `herald.v1` (section 1), stops instead of reconnecting when
//! its session is replaced, gets a new token after a 4001 or stops without a way to
//! (section 2), refreshes its token in the session before it expires (section 3), and
//! acks a burst of messages in a few frames, not one each. What it puts on the wire is
//! read through a recording proxy.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::interfaces::SortedSetsInterface;
use herald_client::device::{DeviceSpec, EndedBy, TokenIn, TokenReason, TokenSource};
use herald_client::{WsClient, WsEvent};
use herald_shared::auth::{sign, Claims, Platform};
use herald_shared::ids::now_ms;
use herald_shared::keys::DeviceKey;
use herald_shared::protocol::{ClientFrame, Hello, PingFrame, ServerFrame, SUBPROTOCOL};
use herald_tests::{eventually, AutoDevice, Cluster, WireTap, SECRET, TENANT};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_authenticates_by_its_first_frame_offering_herald_v1() {
    let c = one_gateway("rdevauth").await;
    let tap = WireTap::start(c.gateways[0].listen()).await;
    let token = c.token("alice", "a1");
    let alice = AutoDevice::connect(&tap.url(), &token, "alice", "a1").await;
    let bob = c.client(0, "bob", "b1");
    bob.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    bob.send("m-1", "ab", &json!("hi")).await.unwrap();
    eventually(WAIT, "the session delivers", || async { (!alice.ids().is_empty()).then_some(()) }).await;

    let wire = tap.connections();
    assert_eq!(wire.len(), 1, "one session");
    let (request, response) = (wire[0].request_head().to_lowercase(), wire[0].response_head().to_lowercase());
    assert!(request.starts_with("get /v1/ws http/1.1\r\n"), "no token in the URL: {request}");
    assert!(!request.contains(&token.to_lowercase()), "the token is nowhere in the request head: {request}");
    assert!(request.contains(&format!("\r\nsec-websocket-protocol: {SUBPROTOCOL}")), "herald.v1 offered: {request}");
    assert!(response.contains(&format!("\r\nsec-websocket-protocol: {SUBPROTOCOL}")), "and chosen: {response}");
    let first = wire[0].first_client_text().expect("a first text frame");
    match ClientFrame::parse(&first) {
        Ok(ClientFrame::Auth(f)) => assert_eq!(f.token, token, "the device's token"),
        other => panic!("the first frame is not auth: {first}: {other:?}"),
    }
    alice.stop().await;

    // The query string and no subprotocol remain available, for gateways older than both.
    let spec = DeviceSpec {
        token_in: TokenIn::Query,
        offer_subprotocol: false,
        ..AutoDevice::spec(&tap.url(), &token, "alice", "a1")
    };
    let old_style = AutoDevice::start(spec).await.expect("hello with the token in the URL");
    let wire = tap.connections();
    let request = wire[1].request_head().to_lowercase();
    assert!(request.starts_with("get /v1/ws?access_token="), "{request}");
    assert!(!request.contains("sec-websocket-protocol"), "{request}");
    assert!(wire[1].first_client_text().is_none_or(|t| !t.contains("\"auth\"")), "no auth frame");
    old_style.stop().await;
}

/// A session of the same device elsewhere replaces the device's (4002): the device stops
/// and says why, and the newer session stays; with the load-test's opt-in it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_stops_when_its_session_is_replaced() {
    let c = one_gateway("rdevreplaced").await;
    let base = c.gateways[0].base_url();
    let token = c.token("alice", "a1");
    let spec = DeviceSpec { reconnect: true, ..AutoDevice::spec(&base, &token, "alice", "a1") };
    let device = AutoDevice::start(spec.clone()).await.expect("hello");

    let mut newer = WsClient::connect(&base, &token).await.unwrap();
    newer.next_of::<Hello>(WAIT).await.expect("the newer session starts");
    eventually(WAIT, "the device stopped", || async { device.ended_by() }).await;
    assert_eq!(device.ended_by(), Some(EndedBy::Replaced));
    assert_eq!(*device.closed.lock().unwrap(), Some(Some(4002)));
    // Had it come back (its first backoff is below 500 ms), the newer session would be
    // the one replaced now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(alive(&mut newer).await, Ok(()), "the newer session was left alone");
    device.stop().await;

    // Told to come back whatever happened, it does, and replaces the newer session.
    let spec = DeviceSpec { reconnect_after_stop_codes: true, ..spec };
    let device = AutoDevice::start(spec).await.expect("hello");
    assert_eq!(alive(&mut newer).await, Err(Some(4002)), "the device's second instance replaced it");
    let mut newest = WsClient::connect(&base, &token).await.unwrap();
    newest.next_of::<Hello>(WAIT).await.expect("another session starts");
    let closed = loop {
        match newest.next(WAIT).await {
            Some(WsEvent::Closed(code)) => break code,
            Some(_) => continue,
            None => panic!("the device did not come back within {WAIT:?}"),
        }
    };
    assert_eq!(closed, Some(4002), "the device came back and replaced it");
    assert_eq!(device.ended_by(), None, "still running");
    device.stop().await;
}

/// `Ok` while a session answers a ping; else the code it was closed with.
async fn alive(ws: &mut WsClient) -> Result<(), Option<u16>> {
    // A send to a session the server closed may fail; its close frame is read below.
    let _ = ws.send(&ClientFrame::Ping(PingFrame { ts: Some(1) })).await;
    loop {
        match ws.next(WAIT).await {
            Some(WsEvent::Frame(ServerFrame::Pong(_))) => return Ok(()),
            Some(WsEvent::Closed(code)) => return Err(code),
            Some(_) => continue,
            None => return Err(None),
        }
    }
}

/// One worker and one gateway.
async fn one_gateway(name: &str) -> Cluster {
    let mut c = Cluster::new(name);
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c
}

/// A token source answering with `answer`, and the reasons it was asked for, in order.
fn recording_source(
    answer: impl Fn(TokenReason) -> Option<String> + Send + Sync + 'static,
) -> (Arc<Mutex<Vec<TokenReason>>>, TokenSource) {
    let asked: Arc<Mutex<Vec<TokenReason>>> = Arc::default();
    let record = asked.clone();
    let source = TokenSource::new(move |why| {
        record.lock().unwrap().push(why);
        std::future::ready(answer(why))
    });
    (asked, source)
}

/// A web token of alice's `device` that expires `secs` from now.
fn short_token(device: &str, secs: u64) -> String {
    let claims = Claims {
        tid: TENANT.into(),
        sub: "alice".into(),
        dev: device.into(),
        plat: Platform::Web,
        exp: now_ms() / 1000 + secs,
        iat: None,
    };
    sign(&claims, SECRET.as_bytes())
}

/// With a token source, the device refreshes its five-second tokens in the session two
/// seconds before each expires: one session outlives several tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_refreshes_its_token_before_it_expires() {
    let c = one_gateway("rdevrefresh").await;
    let base = c.gateways[0].base_url();
    let (asked, source) = recording_source(|_| Some(short_token("a1", 5)));
    let spec = DeviceSpec {
        reconnect: true,
        token_source: Some(source),
        refresh_before: Duration::from_secs(2),
        ..AutoDevice::spec(&base, &short_token("a1", 5), "alice", "a1")
    };
    let started = std::time::Instant::now();
    let device = AutoDevice::start(spec).await.expect("hello");
    let bob = c.client(0, "bob", "b1");
    bob.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(13).saturating_sub(started.elapsed())).await;
    // Past two of its tokens' lifetimes, the first session still delivers.
    bob.send("m-1", "ab", &json!("still there?")).await.unwrap();
    eventually(WAIT, "the message arrives", || async { (!device.ids().is_empty()).then_some(()) }).await;

    assert_eq!(*device.closed.lock().unwrap(), None, "no session ended (a 4001 would have)");
    let refreshed: Vec<u64> = device
        .others
        .lock()
        .unwrap()
        .iter()
        .filter_map(|f| match f {
            ServerFrame::Refreshed(r) => Some(r.exp),
            _ => None,
        })
        .collect();
    assert!(refreshed.len() >= 3, "a refresh about every 3 s: {refreshed:?}");
    assert!(refreshed.windows(2).all(|w| w[0] <= w[1]), "each new token's exp: {refreshed:?}");
    let asked = asked.lock().unwrap().clone();
    // (A token this short is renewed before the first connection too: `Connect`.)
    assert!(!asked.contains(&TokenReason::Expired), "no session ended for its token: {asked:?}");
    assert!(asked.iter().filter(|why| **why == TokenReason::Refresh).count() >= 3, "{asked:?}");
    device.stop().await;
}

/// A session that ends at its token's `exp` (4001, here because the source has no
/// refresh to give): with a token source the device asks it for a new token and comes
/// back; with only its first token it stops and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_4001_the_device_gets_a_new_token_or_stops() {
    let c = one_gateway("rdevexpired").await;
    let base = c.gateways[0].base_url();
    let (asked, source) = recording_source(|why| (why != TokenReason::Refresh).then(|| short_token("a1", 3_600)));
    let renewing = DeviceSpec {
        reconnect: true,
        token_source: Some(source),
        ..AutoDevice::spec(&base, &short_token("a1", 7), "alice", "a1")
    };
    let fixed = DeviceSpec { reconnect: true, ..AutoDevice::spec(&base, &short_token("a2", 7), "alice", "a2") };
    let (renewing, fixed) = (AutoDevice::start(renewing).await.unwrap(), AutoDevice::start(fixed).await.unwrap());

    eventually(Duration::from_secs(15), "the fixed token's device stopped", || async { fixed.ended_by() }).await;
    assert_eq!(fixed.ended_by(), Some(EndedBy::Unauthorized));
    assert_eq!(*fixed.closed.lock().unwrap(), Some(Some(4001)));
    eventually(WAIT, "a new token asked for after the 4001", || async {
        asked.lock().unwrap().contains(&TokenReason::Expired).then_some(())
    })
    .await;
    assert_eq!(*renewing.closed.lock().unwrap(), Some(Some(4001)), "its first session ended at exp");
    // Its new session delivers.
    let bob = c.client(0, "bob", "b1");
    bob.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    bob.send("m-1", "ab", &json!("welcome back")).await.unwrap();
    eventually(WAIT, "the message arrives", || async { (!renewing.ids().is_empty()).then_some(()) }).await;
    assert_eq!(renewing.ended_by(), None);
    renewing.stop().await;
    fixed.stop().await;
}

/// A backlog page arrives as a burst: the device acks its ids in a few frames (the
/// gateway counts them), where it sent one frame per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_acks_a_burst_in_a_few_frames() {
    let c = one_gateway("rdevacks").await;
    let bob = c.client(0, "bob", "b1");
    bob.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    // Registered, then away while 100 messages wait for it.
    c.client(0, "alice", "a1").register_device().await.unwrap();
    let mut sent = std::collections::BTreeSet::new();
    for k in 0..100 {
        sent.insert(bob.send(&format!("m-{k}"), "ab", &json!(k)).await.unwrap().id.0);
    }
    let admin = c.gateways[0].admin_url();
    let acks = || herald_tests::drill::metric(&admin, "herald_frames_in_total{type=\"ack\"}");
    let before = acks().await;
    let alice = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("alice", "a1"), "alice", "a1").await;
    eventually(WAIT, "the backlog arrives", || async { (alice.ids().len() >= 100).then_some(()) }).await;
    eventually(WAIT, "and is acked", || async {
        let pending: u64 =
            c.redis().await.zcard(c.keys().pending_of(&DeviceKey::new(TENANT, "alice", "a1"))).await.unwrap();
        (pending == 0).then_some(())
    })
    .await;
    let frames = acks().await - before;
    assert!(frames >= 1.0, "acks were counted");
    assert!(frames <= 20.0, "{frames} ack frames for a backlog of 100");
    assert_eq!(alice.ids(), sent, "every message");
    alice.stop().await;
}
