//! What browsers need from the gateway (docs/protocol.md sections 2 and 3.1): CORS for
//! the HTTP API, the token as the first frame instead of in the URL, an in-session token
//! refresh, and the `herald.v1` subprotocol echoed. Each with the bad input it must
//! refuse: an origin not configured, a first frame that is not `auth`, a garbage or
//! expired token, a refresh token of another tenant, user or device.

use std::time::Duration;

use herald_client::{WsClient, WsEvent};
use herald_shared::auth::{sign, Claims, Platform};
use herald_shared::error::ErrorCode;
use herald_shared::ids::now_ms;
use herald_shared::protocol::{ErrorFrame, Hello, Message, Pong, Refreshed, ServerFrame, SUBPROTOCOL};
use herald_tests::{Cluster, SECRET, TENANT};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(5);
const PAGE: &str = "https://chat.example.com";

/// A web device's token of `tenant`, valid for `secs` more seconds.
fn token(tenant: &str, user: &str, device: &str, secs: i64) -> String {
    let exp = (now_ms() / 1000) as i64 + secs;
    let claims = Claims {
        tid: tenant.into(),
        sub: user.into(),
        dev: device.into(),
        plat: Platform::Web,
        exp: exp as u64,
        iat: None,
    };
    sign(&claims, SECRET.as_bytes())
}

fn auth(token: &str) -> serde_json::Value {
    json!({"t": "auth", "token": token})
}

/// The close code a session ends with within `WAIT`, skipping frames before it.
async fn closed(ws: &mut WsClient, within: Duration) -> Option<u16> {
    loop {
        match ws.next(within).await {
            Some(WsEvent::Closed(code)) => return code,
            Some(_) => continue,
            None => panic!("still open after {within:?}"),
        }
    }
}

async fn ping(ws: &mut WsClient, ts: u64) -> Option<Pong> {
    ws.send_json(&json!({"t": "ping", "ts": ts})).await.ok()?;
    ws.next_of::<Pong>(WAIT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_the_configured_origins_only() {
    let mut c = Cluster::new("cors");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__CORS_ORIGINS", &format!("{PAGE},http://localhost:5173"))]).await;
    c.start_gateway(&[]).await;
    let (with, without) = (c.gateways[0].base_url(), c.gateways[1].base_url());
    let http = reqwest::Client::new();
    let preflight = |base: &str, origin: &str| {
        http.request(reqwest::Method::OPTIONS, format!("{base}/v1/conversations"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization, content-type")
            .send()
    };
    let header = |r: &reqwest::Response, name: &str| r.headers().get(name).map(|v| v.to_str().unwrap().to_owned());

    let r = preflight(&with, PAGE).await.unwrap();
    assert!(r.status().is_success(), "preflight: {}", r.status());
    assert_eq!(header(&r, "access-control-allow-origin").as_deref(), Some(PAGE));
    let methods = header(&r, "access-control-allow-methods").unwrap().to_lowercase();
    assert!(["get", "post", "put", "delete"].iter().all(|m| methods.contains(m)), "{methods}");
    let headers = header(&r, "access-control-allow-headers").unwrap().to_lowercase();
    assert!(headers.contains("authorization") && headers.contains("content-type"), "{headers}");
    assert_eq!(header(&r, "access-control-allow-credentials"), None, "no cookies: the token is a header");

    // Another origin gets no permission, and neither does any origin without the setting.
    let r = preflight(&with, "https://evil.example").await.unwrap();
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    let r = preflight(&without, PAGE).await.unwrap();
    assert_eq!(header(&r, "access-control-allow-origin"), None, "default: no CORS headers");
    assert_eq!(r.status().as_u16(), 400, "an OPTIONS request is a wrong method without CORS");

    // Real requests, refusals included: a page must read a 401's body and a 429's Retry-After.
    let me = token(TENANT, "alice", "web-1", 3600);
    let r = http.get(format!("{with}/v1/conversations")).header("origin", PAGE).bearer_auth(&me).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(header(&r, "access-control-allow-origin").as_deref(), Some(PAGE));
    let r = http.get(format!("{with}/v1/conversations")).header("origin", PAGE).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(header(&r, "access-control-allow-origin").as_deref(), Some(PAGE));
    assert!(header(&r, "access-control-expose-headers").unwrap().to_lowercase().contains("retry-after"));
    let r =
        http.get(format!("{without}/v1/conversations")).header("origin", PAGE).bearer_auth(&me).send().await.unwrap();
    assert_eq!((r.status().as_u16(), header(&r, "access-control-allow-origin")), (200, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_may_come_as_the_first_frame() {
    let mut c = Cluster::new("authframe");
    c.start_worker(&[]).await;
    // The auth frame must come within the handshake deadline.
    c.start_gateway(&[("HERALD_GATEWAY__HANDSHAKE_TIMEOUT_MS", "1500")]).await;
    let base = c.gateways[0].base_url();
    let bob = c.client_in(0, TENANT, "bob", "b-http");
    bob.create_conversation(Some("dm-1"), "direct", &["alice", "bob"]).await.unwrap();

    let (mut ws, _) = WsClient::connect_offering(&base, None, &[]).await.unwrap();
    ws.send_json(&auth(&token(TENANT, "alice", "web-1", 3600))).await.unwrap();
    ws.next_of::<Hello>(WAIT).await.expect("hello after a valid auth frame");
    bob.send("m-1", "dm-1", &json!({"text": "hi"})).await.unwrap();
    let m = ws.next_of::<Message>(WAIT).await.expect("the session delivers");
    assert_eq!((m.conv.as_str(), m.seq), ("dm-1", 1));
    // In a session that has its token, `auth` is a protocol error (answered, not fatal).
    ws.send_json(&json!({"t": "auth", "token": "x", "ref": "late"})).await.unwrap();
    let e = ws.next_of::<ErrorFrame>(WAIT).await.unwrap();
    assert_eq!((e.code, e.reference.as_deref()), (ErrorCode::BadRequest, Some("late")));
    assert!(ping(&mut ws, 7).await.is_some(), "the session goes on");

    // Refused, each with 4001 and nothing before it.
    let expired = token(TENANT, "alice", "web-2", -10);
    let cases: [(&str, serde_json::Value); 5] = [
        ("garbage token", auth("garbage")),
        ("expired token", auth(&expired)),
        ("a token that is not a string", json!({"t": "auth", "token": 42})),
        ("ping first", json!({"t": "ping"})),
        ("send first", json!({"t": "send", "cmid": "x", "conv": "dm-1", "body": 1})),
    ];
    for (name, first) in cases {
        let (mut ws, _) = WsClient::connect_offering(&base, None, &[]).await.unwrap();
        ws.send_json(&first).await.unwrap();
        match ws.next(WAIT).await {
            Some(WsEvent::Closed(code)) => assert_eq!(code, Some(4001), "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    let (mut ws, _) = WsClient::connect_offering(&base, None, &[]).await.unwrap();
    ws.send_text("{not json").await.unwrap();
    assert_eq!(closed(&mut ws, WAIT).await, Some(4001), "malformed first frame");
    // Silence: closed when the handshake deadline passes.
    let (mut ws, _) = WsClient::connect_offering(&base, None, &[]).await.unwrap();
    let started = std::time::Instant::now();
    assert_eq!(closed(&mut ws, WAIT).await, Some(4001), "no auth frame");
    assert!(started.elapsed() >= Duration::from_millis(1_000), "waited for the deadline: {:?}", started.elapsed());
    // A token at the upgrade still wins, as before.
    let mut ws = WsClient::connect(&base, &token(TENANT, "alice", "web-3", 3600)).await.unwrap();
    ws.next_of::<Hello>(WAIT).await.expect("query token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_moves_the_session_expiry_for_the_same_device_only() {
    let mut c = Cluster::new("refresh");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();
    // Both sessions' tokens end in 3 s.
    let mut kept = WsClient::connect(&base, &token(TENANT, "alice", "web-1", 3)).await.unwrap();
    kept.next_of::<Hello>(WAIT).await.unwrap();
    let mut refused = WsClient::connect(&base, &token(TENANT, "alice", "web-2", 3)).await.unwrap();
    refused.next_of::<Hello>(WAIT).await.unwrap();

    let other_platform = sign(
        &Claims {
            tid: TENANT.into(),
            sub: "alice".into(),
            dev: "web-1".into(),
            plat: Platform::Ios,
            exp: now_ms() / 1000 + 3600,
            iat: None,
        },
        SECRET.as_bytes(),
    );
    let bad = [
        ("garbage", "garbage".to_string(), ErrorCode::Unauthorized),
        ("expired", token(TENANT, "alice", "web-1", -5), ErrorCode::Unauthorized),
        ("another tenant", token("globex", "alice", "web-1", 3600), ErrorCode::Forbidden),
        ("another user", token(TENANT, "mallory", "web-1", 3600), ErrorCode::Forbidden),
        ("another device", token(TENANT, "alice", "web-9", 3600), ErrorCode::Forbidden),
        ("another platform", other_platform, ErrorCode::Forbidden),
    ];
    for (name, t, code) in &bad {
        for ws in [&mut kept, &mut refused] {
            ws.send_json(&json!({"t": "refresh", "token": t, "ref": name})).await.unwrap();
            let e = ws.next_of::<ErrorFrame>(WAIT).await.unwrap_or_else(|| panic!("{name}: no error"));
            assert_eq!((e.code, e.reference.as_deref()), (*code, Some(*name)), "{name}");
        }
    }
    let fresh = token(TENANT, "alice", "web-1", 3600);
    kept.send_json(&json!({"t": "refresh", "token": fresh, "ref": "r1"})).await.unwrap();
    let r = kept.next_of::<Refreshed>(WAIT).await.expect("refreshed");
    assert_eq!(r.reference.as_deref(), Some("r1"));
    assert!(r.exp > now_ms() / 1000 + 3000, "the new token's exp: {}", r.exp);

    // Past the first tokens' expiry: the refused session ended with 4001, the other lives.
    assert_eq!(closed(&mut refused, Duration::from_secs(8)).await, Some(4001), "refusals changed nothing");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(ping(&mut kept, 9).await.is_some(), "the refreshed session outlives its first token");
}

/// The response head of a WebSocket upgrade offering `protocols` (raw, so that the
/// server's answer is seen whatever a client library would make of it).
async fn upgrade_head(base: &str, protocols: Option<&str>) -> String {
    let addr = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let offer = protocols.map(|p| format!("Sec-WebSocket-Protocol: {p}\r\n")).unwrap_or_default();
    let t = token(TENANT, "alice", "web-sp", 3600);
    let head = format!(
        "GET /v1/ws?access_token={t} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{offer}\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, tcp.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed before the response head");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).to_lowercase()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_v1_is_echoed_when_offered_and_optional() {
    let mut c = Cluster::new("subprotocol");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();
    let echoed = format!("sec-websocket-protocol: {SUBPROTOCOL}\r\n");
    for (offer, echo) in
        [(Some("herald.v1"), true), (Some("chat, herald.v1"), true), (Some("chat"), false), (None, false)]
    {
        let head = upgrade_head(&base, offer).await;
        assert!(head.starts_with("http/1.1 101"), "{offer:?}: {head}");
        assert_eq!(head.contains(&echoed), echo, "{offer:?}: {head}");
        assert_eq!(head.contains("sec-websocket-protocol"), echo, "{offer:?}: nothing else is chosen: {head}");
    }
    // A client that insists on the subprotocol gets a working session, token in the first frame.
    let (mut ws, chosen) = WsClient::connect_offering(&base, None, &[SUBPROTOCOL]).await.unwrap();
    assert_eq!(chosen.as_deref(), Some(SUBPROTOCOL));
    ws.send_json(&auth(&token(TENANT, "alice", "web-1", 3600))).await.unwrap();
    assert!(matches!(ws.next(WAIT).await, Some(WsEvent::Frame(ServerFrame::Hello(_)))));
}
