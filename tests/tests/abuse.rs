//! Abuse limits, end to end: sessions per user and per IP, slow request heads
//! (slowloris), silent WebSockets, the per-tenant send quota, group and body sizes,
//! the pinned JWT algorithm and the admin API's token and listener.

use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use herald_client::{WsClient, WsEvent};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ErrorFrame, Hello, Sent, ServerFrame};
use herald_tests::{send_frame, Cluster, ADMIN_TOKEN, SECRET, TENANT};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(5);

/// Connects from `ip` (per-IP limits need several addresses) and returns the socket with
/// its first event (hello, or the refusal).
async fn connect_from(base: &str, token: &str, ip: &str) -> (WsClient, Option<WsEvent>) {
    let mut ws = WsClient::connect_from(base, token, Some(ip.parse().unwrap())).await.expect("upgrade");
    let first = ws.next(WAIT).await;
    (ws, first)
}

fn is_hello(ev: &Option<WsEvent>) -> bool {
    matches!(ev, Some(WsEvent::Frame(ServerFrame::Hello(_))))
}

/// A refused session: `error rate_limited` with a retry hint, then close 4008.
async fn assert_refused(ws: &mut WsClient, first: Option<WsEvent>, what: &str) {
    let Some(WsEvent::Frame(ServerFrame::Error(e))) = first else {
        panic!("{what}: expected an error frame, got {first:?}")
    };
    assert_eq!(e.code, ErrorCode::RateLimited, "{what}: {e:?}");
    assert!(e.retry_after_ms.unwrap() >= 1_000, "{what}: {e:?}");
    assert_eq!(ws.next(WAIT).await, Some(WsEvent::Closed(Some(4008))), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_limited_per_user_and_per_ip() {
    let mut c = Cluster::new("abuse-conns");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_USER", "2"),
        ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP", "3"),
    ])
    .await;
    let base = c.gateways[0].base_url();

    // Per user, counted by device: two devices in, a third refused.
    let (mut d1, first) = connect_from(&base, &c.token("ursula", "d1"), "127.0.0.1").await;
    assert!(is_hello(&first), "{first:?}");
    let (d2, first) = connect_from(&base, &c.token("ursula", "d2"), "127.0.0.1").await;
    assert!(is_hello(&first), "{first:?}");
    let (mut d3, first) = connect_from(&base, &c.token("ursula", "d3"), "127.0.0.1").await;
    assert_refused(&mut d3, first, "third device of one user").await;
    // A device that reconnects replaces its own session instead of being refused.
    let (_d1_again, first) = connect_from(&base, &c.token("ursula", "d1"), "127.0.0.1").await;
    assert!(is_hello(&first), "a reconnecting device is let in: {first:?}");
    let mut closed = None;
    while let Some(ev) = d1.next(WAIT).await {
        if let WsEvent::Closed(code) = ev {
            closed = code;
            break;
        }
    }
    assert_eq!(closed, Some(4002), "the old session of d1 is replaced");
    // The same user name in another tenant is another user.
    let other = herald_client::token(SECRET, "globex", "ursula", "d3", herald_shared::auth::Platform::Web);
    let (_o, first) = connect_from(&base, &other, "127.0.0.5").await;
    assert!(is_hello(&first), "{first:?}");
    // A slot comes back when a session ends.
    d2.close().await;
    let token = c.token("ursula", "d3");
    let base2 = base.clone();
    herald_tests::eventually(WAIT, "d3 admitted once d2 left", || {
        let (base, token) = (base2.clone(), token.clone());
        async move { is_hello(&connect_from(&base, &token, "127.0.0.1").await.1).then_some(()) }
    })
    .await;

    // Per IP address (the socket peer): three sessions from 127.0.0.2, the fourth refused,
    // while another address still gets in.
    let mut keep = Vec::new();
    for n in 0..3 {
        let (ws, first) = connect_from(&base, &c.token(&format!("ip{n}"), "x"), "127.0.0.2").await;
        assert!(is_hello(&first), "{first:?}");
        keep.push(ws);
    }
    let (mut ws, first) = connect_from(&base, &c.token("ip3", "x"), "127.0.0.2").await;
    assert_refused(&mut ws, first, "fourth session from one address").await;
    let (_ws, first) = connect_from(&base, &c.token("ip3", "x"), "127.0.0.3").await;
    assert!(is_hello(&first), "{first:?}");
}

/// Reads until the server closes the connection; how long that took.
async fn time_until_closed(stream: &mut tokio::net::TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit.saturating_sub(started.elapsed()), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the connection was still open after {limit:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_heads_and_silent_websockets_are_cut_off() {
    let mut c = Cluster::new("abuse-slow");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__HANDSHAKE_TIMEOUT_MS", "700"),
        ("HERALD_GATEWAY__HEARTBEAT_MS", "200"),
        ("HERALD_GATEWAY__NAT_IDLE_TIMEOUT_MS", "1000"),
    ])
    .await;
    let addr = c.gateways[0].listen();

    // Connects and never sends a byte.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    // Sends a request line, then one header byte every 100 ms (slowloris).
    let mut dribble = tokio::net::TcpStream::connect(addr).await.unwrap();
    let token = c.token("sam", "s1");
    dribble.write_all(format!("GET /v1/ws?access_token={token} HTTP/1.1\r\nHost: x\r\n").as_bytes()).await.unwrap();
    let dribbler = tokio::spawn(async move {
        let started = Instant::now();
        for b in b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter().cycle() {
            if dribble.write_all(&[*b]).await.is_err() {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if started.elapsed() > Duration::from_secs(10) {
                panic!("still writing after 10 s: the slow head was not cut off");
            }
        }
        unreachable!()
    });
    let took = time_until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(500), "closed too early: {took:?}");
    let took = dribbler.await.unwrap();
    assert!(took <= Duration::from_secs(4), "dribbling client held on for {took:?}");

    // An idle keep-alive connection is cut off as well, after its first request.
    let mut keepalive = tokio::net::TcpStream::connect(addr).await.unwrap();
    keepalive.write_all(b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let took = time_until_closed(&mut keepalive, Duration::from_secs(5)).await;
    assert!(took <= Duration::from_secs(3), "idle keep-alive held on for {took:?}");

    // Requests that finish their head in time are served as usual.
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();

    // The protocol has no client hello (auth is at the upgrade): a WebSocket that upgrades
    // and then says nothing, not even pongs, is closed at the idle limit with 4000. Raw
    // bytes: a client library would answer the server's pings.
    let mut ws = tokio::net::TcpStream::connect(addr).await.unwrap();
    let token = c.token("sam", "s2");
    ws.write_all(
        format!(
            "GET /v1/ws?access_token={token} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.read(&mut buf)).await.expect("closed within 5 s") {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    let took = started.elapsed();
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 101"), "upgraded");
    // An unmasked close frame whose payload starts with 4000 (0x0fa0).
    let close_4000 = seen.windows(4).any(|w| w[0] == 0x88 && w[2] == 0x0f && w[3] == 0xa0);
    assert!(close_4000, "no close 4000 in {:?}", String::from_utf8_lossy(&seen));
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(4), "closed after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_send_quota_answers_rate_limited_with_retry_hints() {
    let mut c = Cluster::new("abuse-tenant");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__TENANT_SEND_RATE", "1"),
        ("HERALD_GATEWAY__TENANT_SEND_BURST", "4"),
        ("HERALD_GATEWAY__SEND_RATE", "1000"),
        ("HERALD_GATEWAY__SEND_BURST", "1000"),
    ])
    .await;
    let alice = c.client(0, "alice", "a1");
    let bob = c.client(0, "bob", "b1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    // Two devices of one tenant share its bucket: 4 pass, the rest wait.
    let mut limited = Vec::new();
    for n in 0..3 {
        alice.send(&format!("a{n}"), "ab", &json!({"n": n})).await.unwrap();
    }
    for n in 0..3 {
        if let Err(e) = bob.send(&format!("b{n}"), "ab", &json!({"n": n})).await {
            limited.push(e);
        }
    }
    assert!(!limited.is_empty(), "a burst of 4 cannot take 6 sends");
    assert!(limited.iter().all(|e| e.code() == Some(ErrorCode::RateLimited)), "{limited:?}");
    // HTTP: 429 with Retry-After in seconds.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/messages", c.gateways[0].base_url()))
        .bearer_auth(c.token("bob", "b1"))
        .json(&json!({"cmid": "b-x", "conv": "ab", "body": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    // WebSocket: error rate_limited with retry_after_ms and the cmid as ref.
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "b2")).await.unwrap();
    ws.next_of::<Hello>(WAIT).await.unwrap();
    ws.send(&send_frame("w1", "ab", &json!({}))).await.unwrap();
    let e = ws.next_of::<ErrorFrame>(WAIT).await.expect("an error frame");
    assert_eq!(e.code, ErrorCode::RateLimited);
    assert_eq!(e.reference.as_deref(), Some("w1"));
    assert!(e.retry_after_ms.unwrap() > 0);
    // Another tenant is not affected.
    let g = c.client_in(0, "globex", "gina", "g1");
    g.create_conversation(Some("gh"), "direct", &["gina", "hal"]).await.unwrap();
    g.send("g0", "gh", &json!({})).await.expect("another tenant's quota is its own");
    // And the tenant's bucket refills.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    bob.send_until_committed("late", "ab", &json!({}), 20).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_and_body_sizes_are_enforced() {
    let mut c = Cluster::new("abuse-sizes");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__MAX_GROUP_SIZE", "3"), ("HERALD_GATEWAY__MAX_BODY_BYTES", "1024")]).await;
    let alice = c.client(0, "alice", "a1");

    // Groups: at most 3 members on create and after adding.
    let e = alice.create_conversation(Some("big"), "group", &["alice", "b", "c", "d"]).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    alice.create_conversation(Some("g"), "group", &["alice", "b"]).await.unwrap();
    let e = alice.change_members("g", &["c", "d"], &[]).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    let v = alice.change_members("g", &["c", "d"], &["b"]).await.expect("3 after the change");
    assert_eq!(v["members"], json!(["alice", "c", "d"]));
    let e = alice.change_members("g", &["e"], &[]).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");

    // Bodies over HTTP: 1024 bytes pass, 1025 are too_large, and so is a request far
    // beyond the envelope limit (refused before it is parsed).
    let body_of = |n: usize| json!("x".repeat(n - 2)); // a JSON string: quotes count
    alice.send("ok", "g", &body_of(1024)).await.expect("a body at the limit");
    let e = alice.send("big", "g", &body_of(1025)).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::TooLarge), "{e}");
    let huge = serde_json::to_vec(&json!({"cmid": "huge", "conv": "g", "body": body_of(64 * 1024)})).unwrap();
    // Refused before the body is read, so the connection cannot be used again: the
    // answer says so (`Connection: close`), or the client's next request on it fails.
    for _ in 0..20 {
        for path in ["/v1/messages", "/v1/conversations"] {
            let (status, v) = alice.post_raw(path, huge.clone()).await.unwrap();
            assert_eq!((status, v["error"]["code"].as_str()), (413, Some("too_large")), "{v}");
        }
    }
    let mut raw = tokio::net::TcpStream::connect(c.gateways[0].listen()).await.unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        c.token("alice", "a1"),
        huge.len()
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    raw.write_all(&huge[..8 * 1024]).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(WAIT, raw.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 413") && answer.contains("\r\nconnection: close\r\n"), "{answer}");

    // WebSocket frames: a body over the limit is too_large (with its cmid), and so is a
    // frame over the frame limit; the session stays open.
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("alice", "a2")).await.unwrap();
    ws.next_of::<Hello>(WAIT).await.unwrap();
    ws.send(&send_frame("w-big", "g", &body_of(1025))).await.unwrap();
    let e = ws.next_of::<ErrorFrame>(WAIT).await.unwrap();
    assert_eq!((e.code, e.reference.as_deref()), (ErrorCode::TooLarge, Some("w-big")), "{e:?}");
    ws.send(&send_frame("w-huge", "g", &body_of(64 * 1024))).await.unwrap();
    let e = ws.next_of::<ErrorFrame>(WAIT).await.unwrap();
    assert_eq!(e.code, ErrorCode::TooLarge, "{e:?}");
    ws.send(&send_frame("w-ok", "g", &body_of(1024))).await.unwrap();
    let sent = ws.next_of::<Sent>(WAIT).await.expect("the session survived");
    assert_eq!(sent.cmid, "w-ok");
}

/// A token with the given header, the test claims and a signature made with the secret.
fn token_with_header(header: &Value) -> String {
    let good = c_token();
    let payload = good.split('.').nth(1).unwrap().to_owned();
    let h = URL_SAFE_NO_PAD.encode(header.to_string());
    let input = format!("{h}.{payload}");
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()))
}

fn c_token() -> String {
    herald_client::token(SECRET, TENANT, "mallory", "m1", herald_shared::auth::Platform::Web)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_algorithm_is_pinned_and_the_admin_api_is_guarded() {
    let mut c = Cluster::new("abuse-auth");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();
    let good = c_token();
    let payload = good.split('.').nth(1).unwrap();
    let none = format!("{}.{payload}.", URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#));
    let rs256 = token_with_header(&json!({"alg": "RS256", "typ": "JWT"}));
    let lower = token_with_header(&json!({"alg": "hs256", "typ": "JWT"}));
    let http = reqwest::Client::new();
    for (name, token) in [("alg none", &none), ("RS256 label", &rs256), ("lowercase hs256", &lower)] {
        let r = http.get(format!("{base}/v1/conversations")).bearer_auth(token).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{name}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "unauthorized", "{name}");
        let mut ws = WsClient::connect(&base, token).await.unwrap();
        assert_eq!(ws.next(WAIT).await, Some(WsEvent::Closed(Some(4001))), "{name}");
    }
    let r = http.get(format!("{base}/v1/conversations")).bearer_auth(&good).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "the same claims, properly signed");

    // The admin API is not on the public listener, nor on the gateway's admin listener.
    for path in ["/admin/outbox", "/admin/outbox/1", "/admin/devices/acme/u/d"] {
        for (name, url) in [("public", &base), ("gateway admin", &c.gateways[0].admin_url())] {
            let r = http.get(format!("{url}{path}")).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 404, "{path} on the {name} listener");
        }
        let r = http.post(format!("{base}{path}/retry")).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 404, "POST {path}/retry on the public listener");
    }
    // On the worker's admin listener: 401 without or with a wrong token.
    let admin = c.admin(0);
    for path in ["/admin/outbox", "/admin/messages/1/trace", "/admin/devices/acme/u/d"] {
        for token in [None, Some("wrong"), Some(""), Some("test-admin-token-and-more")] {
            let (status, v) = admin.get(path, token).await;
            assert_eq!(status, 401, "{path} with {token:?}");
            assert_eq!(v["error"]["code"], "unauthorized");
        }
    }
    let (status, _) = admin.post("/admin/outbox/1/discard", Some("wrong")).await;
    assert_eq!(status, 401);
    let (status, _) = admin.get("/admin/outbox", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200);
}
