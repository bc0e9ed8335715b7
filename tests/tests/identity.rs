//! Identity a tenant's IdP can issue (docs/operations.md, "Identity"): tokens checked
//! against key sets from the trust file (per tenant, HS256 rotation, RS256 from JWKS
//! files and URLs, `iss` and `aud`), and the server API's disconnect and revoke.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use herald_client::{HttpClient, WsClient, WsEvent};
use herald_shared::auth::{sign_typed, Claims, Platform, SERVICE_TYP};
use herald_shared::ids::now_ms;
use herald_shared::protocol::ServerFrame;
use herald_shared::service_token::{Scope, ServiceClaims};
use herald_tests::{eventually, Cluster};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/identity").join(name)
}

/// A directory of the test's own for its trust file.
fn trust_dir(c: &Cluster) -> PathBuf {
    let d = std::env::temp_dir().join(format!("herald-it-trust-{}", c.db_name));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Replaces the trust file whole (a rename), so a gateway never reads half of one.
fn write_trust(path: &Path, issuers: Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json!({ "issuers": issuers }).to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

fn hs_key(kid: &str, secret: &str) -> Value {
    json!({"kty": "oct", "kid": kid, "alg": "HS256", "k": URL_SAFE_NO_PAD.encode(secret)})
}

fn now() -> u64 {
    now_ms() / 1000
}

fn claims(tid: &str, user: &str, device: &str, iat: u64) -> Claims {
    Claims {
        tid: tid.into(),
        sub: user.into(),
        dev: device.into(),
        plat: Platform::Web,
        exp: now() + 3600,
        iat: Some(iat),
    }
}

fn hs_token(kid: &str, secret: &str, c: &Claims) -> String {
    sign_typed("JWT", Some(kid), c, secret.as_bytes())
}

fn service_token(kid: &str, secret: &str, tid: &str, scopes: &[Scope]) -> String {
    let c = ServiceClaims { tid: tid.into(), svc: "backend".into(), scopes: scopes.to_vec(), exp: now() + 3600 };
    sign_typed(SERVICE_TYP, Some(kid), &c, secret.as_bytes())
}

/// A token of the test IdP's RSA key, with `extra` claims (`iss`, `aud`) added.
fn rs_token(c: &Claims, extra: Value) -> String {
    let mut payload = serde_json::to_value(c).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        payload[k] = v.clone();
    }
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("idp-rsa-1".into());
    let pem = std::fs::read(fixture("rsa-test-key.pem")).unwrap();
    jsonwebtoken::encode(&header, &payload, &EncodingKey::from_rsa_pem(&pem).unwrap()).unwrap()
}

/// Opens a session and waits for its `hello`; the close code when it is refused.
async fn session(base: &str, token: &str) -> Result<WsClient, Option<u16>> {
    let mut ws = WsClient::connect(base, token).await.map_err(|_| None)?;
    loop {
        match ws.next(WAIT).await {
            Some(WsEvent::Frame(ServerFrame::Hello(_))) => return Ok(ws),
            Some(WsEvent::Frame(_) | WsEvent::Other(_)) => continue,
            Some(WsEvent::Closed(code)) => return Err(code),
            None => panic!("no hello and no close within {WAIT:?}"),
        }
    }
}

/// The close code a session ends with, within `within`.
async fn closed_within(ws: &mut WsClient, within: Duration) -> Option<u16> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match ws.next(left).await {
            Some(WsEvent::Closed(code)) => return code,
            Some(_) => continue,
            None => panic!("the session was not closed within {within:?}"),
        }
    }
}

async fn status_of(base: &str, token: &str) -> u16 {
    HttpClient::new(base, token).post_raw("/v1/devices", Vec::new()).await.unwrap().0
}

/// Tokens of a tenant's IdP: RS256 with its `iss` and `aud`, from a JWKS file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rs256_token_from_a_jwks_file_opens_a_session() {
    let mut c = Cluster::new("id-rs256");
    let trust = trust_dir(&c).join("trust.json");
    write_trust(
        &trust,
        json!([{"tenants": ["acme"], "iss": "https://idp.test/acme", "aud": ["herald"],
                "jwks_file": fixture("rsa-test.jwks.json")}]),
    );
    c.start_worker(&[]).await;
    // No shared secret: only the IdP's keys sign device tokens.
    c.start_gateway(&[("HERALD_JWT_SECRET", ""), ("HERALD_AUTH__TRUST_FILE", trust.to_str().unwrap())]).await;
    let base = c.gateways[0].base_url();
    let me = claims("acme", "alice", "laptop", now());
    let good = json!({"iss": "https://idp.test/acme", "aud": "herald"});
    let ws = session(&base, &rs_token(&me, good.clone())).await.expect("the IdP's token opens a session");
    ws.close().await;
    assert_eq!(status_of(&base, &rs_token(&me, good)).await, 200);
    // Another issuer, another audience, no audience, another tenant: refused.
    for (what, extra, who) in [
        ("iss", json!({"iss": "https://evil.test", "aud": "herald"}), me.clone()),
        ("aud", json!({"iss": "https://idp.test/acme", "aud": "other"}), me.clone()),
        ("no aud", json!({"iss": "https://idp.test/acme"}), me.clone()),
        ("tenant", json!({"iss": "https://idp.test/acme", "aud": "herald"}), claims("globex", "alice", "l", now())),
    ] {
        let t = rs_token(&who, extra);
        assert_eq!(session(&base, &t).await.err(), Some(Some(4001)), "{what}");
        assert_eq!(status_of(&base, &t).await, 401, "{what}");
    }
    // An HS256 token naming the RSA key's kid (alg confusion): refused.
    let confused = sign_typed("JWT", Some("idp-rsa-1"), &me, &std::fs::read(fixture("rsa-test.jwks.json")).unwrap());
    assert_eq!(status_of(&base, &confused).await, 401);
}

/// A JWKS URL is fetched at the start and again in the background; when it fails,
/// the last good keys stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwks_from_a_url_are_refreshed_and_kept_when_the_url_fails() {
    let mut c = Cluster::new("id-jwks-url");
    let jwks = std::fs::read_to_string(fixture("rsa-test.jwks.json")).unwrap();
    let (url, fetches, up, _) = serve_jwks(jwks).await;
    let trust = trust_dir(&c).join("trust.json");
    write_trust(&trust, json!([{"tenants": ["acme"], "jwks_url": url}]));
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_AUTH__TRUST_FILE", trust.to_str().unwrap()), ("HERALD_AUTH__JWKS_REFRESH_S", "1")])
        .await;
    let base = c.gateways[0].base_url();
    let token = rs_token(&claims("acme", "alice", "phone", now()), json!({}));
    assert_eq!(status_of(&base, &token).await, 200);
    // The URL starts failing: refreshes go on failing, the keys stay.
    up.store(false, Ordering::SeqCst);
    let failed_from = fetches.load(Ordering::SeqCst);
    eventually(WAIT, "two failed refreshes", || {
        let n = fetches.load(Ordering::SeqCst);
        async move { (n >= failed_from + 2).then_some(()) }
    })
    .await;
    assert_eq!(status_of(&base, &token).await, 200, "the last good keys stayed");
}

/// A tiny HTTP server of one JWKS document: its URL, how often it was asked, and a
/// switch that makes it answer 500.
async fn serve_jwks(body: String) -> (String, Arc<AtomicUsize>, Arc<AtomicBool>, Arc<Mutex<String>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/keys", listener.local_addr().unwrap());
    let fetches = Arc::new(AtomicUsize::new(0));
    let up = Arc::new(AtomicBool::new(true));
    let served = Arc::new(Mutex::new(body));
    let (f, u, b) = (fetches.clone(), up.clone(), served.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            f.fetch_add(1, Ordering::SeqCst);
            let body = b.lock().unwrap().clone();
            let answer = if u.load(Ordering::SeqCst) {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string()
            };
            let _ = sock.write_all(answer.as_bytes()).await;
            let _ = sock.shutdown().await;
        }
    });
    (url, fetches, up, served)
}

/// An identity provider that starts signing with a new key: the first token naming it
/// makes the gateways read the JWKS again at once, not at the next refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_naming_a_new_key_makes_the_jwks_be_read_again_early() {
    let mut c = Cluster::new("id-jwks-new-key");
    let (k1, k2) = ("first-idp-secret-0123456789", "second-idp-secret-012345678");
    let set = |keys: Vec<Value>| json!({ "keys": keys }).to_string();
    let (url, fetches, _, served) = serve_jwks(set(vec![hs_key("k1", k1)])).await;
    let trust = trust_dir(&c).join("trust.json");
    write_trust(&trust, json!([{"tenants": ["acme"], "jwks_url": url}]));
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_AUTH__TRUST_FILE", trust.to_str().unwrap())]).await;
    let base = c.gateways[0].base_url();
    assert_eq!(status_of(&base, &hs_token("k1", k1, &claims("acme", "a", "d", now()))).await, 200);
    let before = fetches.load(Ordering::SeqCst);
    *served.lock().unwrap() = set(vec![hs_key("k1", k1), hs_key("k2", k2)]);
    let new = hs_token("k2", k2, &claims("acme", "a", "d", now()));
    let b = base.clone();
    eventually(WAIT, "the new key is fetched and trusted", || {
        let (b, t) = (b.clone(), new.clone());
        async move { (status_of(&b, &t).await == 200).then_some(()) }
    })
    .await;
    assert_eq!(fetches.load(Ordering::SeqCst), before + 1, "one early read, not one per token");
}

/// Rotation of an HS256 key set without logging anyone out: the new key is added,
/// both verify during the overlap, the old one is removed; sessions opened with the
/// old key stay open throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_hs_key_set_keeps_sessions_and_accepts_both_keys_during_the_overlap() {
    let mut c = Cluster::new("id-rotate");
    let trust = trust_dir(&c).join("trust.json");
    let (old, new) = ("old-secret-0123456789abcdef", "new-secret-0123456789abcdef");
    let issuer = |keys: Vec<Value>| json!([{"tenants": ["acme"], "jwks": {"keys": keys}}]);
    write_trust(&trust, issuer(vec![hs_key("2026-01", old)]));
    c.start_worker(&[]).await;
    let trust_env = ("HERALD_AUTH__TRUST_FILE", trust.to_str().unwrap());
    c.start_gateway(&[("HERALD_JWT_SECRET", ""), trust_env, ("HERALD_AUTH__JWKS_REFRESH_S", "1")]).await;
    let base = c.gateways[0].base_url();
    let old_token = hs_token("2026-01", old, &claims("acme", "alice", "phone", now()));
    let new_token = hs_token("2026-02", new, &claims("acme", "bob", "phone", now()));
    let mut alice = session(&base, &old_token).await.expect("the old key opens a session");
    assert_eq!(status_of(&base, &new_token).await, 401, "the new key is not trusted yet");

    write_trust(&trust, issuer(vec![hs_key("2026-01", old), hs_key("2026-02", new)]));
    let b = base.clone();
    let t = new_token.clone();
    eventually(WAIT, "the new key is trusted", || {
        let (b, t) = (b.clone(), t.clone());
        async move { (status_of(&b, &t).await == 200).then_some(()) }
    })
    .await;
    assert_eq!(status_of(&base, &old_token).await, 200, "both keys verify during the overlap");
    let mut bob = session(&base, &new_token).await.expect("the new key opens a session");

    write_trust(&trust, issuer(vec![hs_key("2026-02", new)]));
    let b = base.clone();
    let t = old_token.clone();
    eventually(WAIT, "the old key is retired", || {
        let (b, t) = (b.clone(), t.clone());
        async move { (status_of(&b, &t).await == 401).then_some(()) }
    })
    .await;
    // Both sessions lived through the rotation: they still answer pings.
    for ws in [&mut alice, &mut bob] {
        ws.send_json(&json!({"t": "ping"})).await.unwrap();
        let pong = ws.next_of::<herald_shared::protocol::Pong>(WAIT).await;
        assert!(pong.is_some(), "the session is still open");
    }
}

/// One tenant's keys cannot act in another tenant: device keys, service keys, and
/// nothing is stored for the refused requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_key_cannot_open_a_session_or_call_the_server_api_in_another_tenant() {
    let mut c = Cluster::new("id-tenants");
    let trust = trust_dir(&c).join("trust.json");
    let (acme_dev, globex_dev) = ("acme-device-key-0123456789", "globex-device-key-012345678");
    let (acme_svc, globex_svc) = ("acme-service-key-012345678", "globex-service-key-01234567");
    write_trust(
        &trust,
        json!([
            {"tenants": ["acme"], "jwks": {"keys": [hs_key("acme-1", acme_dev)]}},
            {"tenants": ["globex"], "jwks": {"keys": [hs_key("globex-1", globex_dev)]}},
            {"tenants": ["acme"], "tokens": "service", "jwks": {"keys": [hs_key("acme-svc", acme_svc)]}},
            {"tenants": ["globex"], "tokens": "service", "jwks": {"keys": [hs_key("globex-svc", globex_svc)]}},
        ]),
    );
    c.start_worker(&[]).await;
    let trust_env = ("HERALD_AUTH__TRUST_FILE", trust.to_str().unwrap());
    c.start_gateway(&[("HERALD_JWT_SECRET", ""), ("HERALD_SERVICE_SECRET", ""), trust_env]).await;
    let base = c.gateways[0].base_url();

    // Each tenant's own keys work, also as operators mint tokens (`token --kid`).
    assert_eq!(status_of(&base, &hs_token("acme-1", acme_dev, &claims("acme", "a", "d", now()))).await, 200);
    let minted = std::process::Command::new(herald_tests::bin("herald-loadtest"))
        .args([
            "token", "--tenant", "acme", "--user", "ops", "--device", "cli", "--kid", "acme-1", "--secret", acme_dev,
        ])
        .output()
        .unwrap();
    assert!(minted.status.success(), "{}", String::from_utf8_lossy(&minted.stderr));
    assert_eq!(status_of(&base, String::from_utf8(minted.stdout).unwrap().trim()).await, 200);
    assert_eq!(status_of(&base, &hs_token("globex-1", globex_dev, &claims("globex", "g", "d", now()))).await, 200);
    // acme's device key claiming globex: 401 over HTTP, 4001 on the WebSocket, with or
    // without globex's kid.
    for kid in ["acme-1", "globex-1"] {
        let forged = hs_token(kid, acme_dev, &claims("globex", "mallory", "evil", now()));
        assert_eq!(status_of(&base, &forged).await, 401, "kid {kid}");
        assert_eq!(session(&base, &forged).await.err(), Some(Some(4001)), "kid {kid}");
    }
    // acme's service key claiming globex: 401; acme's own service works in acme only.
    let create = |conv: &str| json!({"id": conv, "kind": "group", "members": ["mallory", "gina"]}).to_string();
    for kid in ["acme-svc", "globex-svc"] {
        let forged = service_token(kid, acme_svc, "globex", &Scope::ALL);
        let (status, body) = HttpClient::new(&base, forged)
            .post_raw("/v1/server/conversations", create("stolen").into_bytes())
            .await
            .unwrap();
        assert_eq!(status, 401, "kid {kid}: {body}");
    }
    let acme_service = HttpClient::new(&base, service_token("acme-svc", acme_svc, "acme", &Scope::ALL));
    let (status, body) = acme_service.post_raw("/v1/server/conversations", create("ok").into_bytes()).await.unwrap();
    assert_eq!(status, 201, "{body}");
    // Reading (scope conversations:read) stays within the tenant too.
    let (status, conv) = acme_service.get_raw("/v1/server/conversations/ok").await.unwrap();
    assert_eq!((status, &conv["members"]), (200, &json!(["gina", "mallory"])), "{conv}");
    let globex_service = HttpClient::new(&base, service_token("globex-svc", globex_svc, "globex", &Scope::ALL));
    let (status, _) = globex_service.get_raw("/v1/server/conversations/ok").await.unwrap();
    assert_eq!(status, 404, "another tenant's conversation is not found");
    let writer = HttpClient::new(&base, service_token("acme-svc", acme_svc, "acme", &[Scope::ConversationsWrite]));
    assert_eq!(writer.get_raw("/v1/server/conversations/ok").await.unwrap().0, 403);
    // A device key is no service key, even in its own tenant.
    let as_service = sign_typed(
        SERVICE_TYP,
        Some("acme-1"),
        &json!({"tid": "acme", "svc": "x", "scopes": ["conversations:write"], "exp": now() + 60}),
        acme_dev.as_bytes(),
    );
    let (status, _) = HttpClient::new(&base, as_service)
        .post_raw("/v1/server/conversations", create("x").into_bytes())
        .await
        .unwrap();
    assert_eq!(status, 401);
    // Without the scope: 403.
    let unscoped = HttpClient::new(&base, service_token("acme-svc", acme_svc, "acme", &[Scope::MessagesSend]));
    let (status, _) = unscoped
        .post_raw("/v1/server/sessions/disconnect", json!({"user": "a"}).to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(status, 403);

    // Nothing of the refused requests was stored.
    let db = c.db().await;
    let devices: Vec<(Vec<u8>,)> =
        sqlx::query_as("SELECT user_id FROM devices WHERE tenant_id = 'globex'").fetch_all(&db).await.unwrap();
    assert_eq!(devices, vec![(b"g".to_vec(),)], "only globex's own device registered");
    let convs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM conversations WHERE tenant_id = 'globex'")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(convs, 0);
}

/// `disconnect` ends a user's sessions on every gateway within a second (4004), and
/// their tokens are refused afterwards, on every gateway; a token issued after it
/// opens a session again. One device's disconnect leaves the user's others alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_ends_sessions_on_both_gateways_and_the_tokens_stay_refused() {
    let mut c = Cluster::new("id-disconnect");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    let (gw0, gw1) = (c.gateways[0].base_url(), c.gateways[1].base_url());
    let secret = herald_tests::SECRET;
    let earlier = now() - 5;
    let tok = |user: &str, dev: &str| herald_shared::auth::sign(&claims("acme", user, dev, earlier), secret.as_bytes());
    let mut alice_phone = session(&gw0, &tok("alice", "phone")).await.unwrap();
    let mut alice_laptop = session(&gw1, &tok("alice", "laptop")).await.unwrap();
    let mut bob_phone = session(&gw1, &tok("bob", "phone")).await.unwrap();
    let mut bob_laptop = session(&gw0, &tok("bob", "laptop")).await.unwrap();

    let service = c.service(0, "acme", "admin", &[Scope::SessionsRevoke]);
    let started = std::time::Instant::now();
    let (status, body) = service
        .post_raw("/v1/server/sessions/disconnect", json!({"user": "alice"}).to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["user"], "alice");
    assert_eq!(closed_within(&mut alice_phone, Duration::from_secs(1)).await, Some(4004));
    assert_eq!(closed_within(&mut alice_laptop, Duration::from_secs(1)).await, Some(4004));
    assert!(started.elapsed() < Duration::from_secs(2), "both closed within a second of the answer");
    // The same tokens are refused on reconnect, on both gateways.
    for gw in [&gw0, &gw1] {
        assert_eq!(session(gw, &tok("alice", "phone")).await.err(), Some(Some(4001)));
        assert_eq!(status_of(gw, &tok("alice", "laptop")).await, 401);
    }
    // A token issued from now on opens a session.
    let fresh = herald_shared::auth::sign(&claims("acme", "alice", "phone", now()), secret.as_bytes());
    session(&gw1, &fresh).await.expect("a new token opens a session").close().await;

    // One device of bob's: its session ends, the other stays.
    let (status, body) = service
        .post_raw("/v1/server/sessions/disconnect", json!({"user": "bob", "device": "phone"}).to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(closed_within(&mut bob_phone, Duration::from_secs(1)).await, Some(4004));
    assert_eq!(session(&gw0, &tok("bob", "phone")).await.err(), Some(Some(4001)));
    assert_eq!(status_of(&gw1, &tok("bob", "phone")).await, 401, "the API refuses the device's token too");
    bob_laptop.send_json(&json!({"t": "ping"})).await.unwrap();
    assert!(bob_laptop.next_of::<herald_shared::protocol::Pong>(WAIT).await.is_some(), "bob's laptop stays");
    assert_eq!(status_of(&gw1, &tok("bob", "laptop")).await, 200);

    // Another tenant's service cannot disconnect acme's users: it acts in its own.
    let other = c.service(1, "globex", "admin", &[Scope::SessionsRevoke]);
    let (status, _) = other
        .post_raw("/v1/server/sessions/disconnect", json!({"user": "bob"}).to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(status_of(&gw1, &tok("bob", "laptop")).await, 200, "acme's bob is untouched");
}

/// `revoke` refuses a user's tokens issued before a time: older tokens are refused
/// and their sessions end; newer ones go on. Bad requests are refused clearly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_refuses_tokens_issued_before_not_before() {
    let mut c = Cluster::new("id-revoke");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let gw = c.gateways[0].base_url();
    let secret = herald_tests::SECRET.as_bytes();
    let t = now();
    let old = herald_shared::auth::sign(&claims("acme", "carol", "phone", t - 100), secret);
    let newer = herald_shared::auth::sign(&claims("acme", "carol", "laptop", t - 10), secret);
    let no_iat = herald_shared::auth::sign(&Claims { iat: None, ..claims("acme", "carol", "tablet", 0) }, secret);
    let mut old_session = session(&gw, &old).await.unwrap();
    let mut newer_session = session(&gw, &newer).await.unwrap();
    // Accepted over HTTP first: the gateway now holds it as verified, and its
    // revocation must refuse it all the same.
    assert_eq!(status_of(&gw, &old).await, 200);
    let service = c.service(0, "acme", "admin", &[Scope::SessionsRevoke]);
    let (status, body) = service
        .post_raw("/v1/server/sessions/revoke", json!({"user": "carol", "not_before": t - 50}).to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["not_before"], t - 50);
    assert_eq!(closed_within(&mut old_session, Duration::from_secs(1)).await, Some(4004));
    assert_eq!(status_of(&gw, &old).await, 401);
    assert_eq!(status_of(&gw, &no_iat).await, 401, "a token without iat cannot show it is newer");
    assert_eq!(status_of(&gw, &newer).await, 200);
    newer_session.send_json(&json!({"t": "ping"})).await.unwrap();
    assert!(newer_session.next_of::<herald_shared::protocol::Pong>(WAIT).await.is_some());
    for bad in [json!({"user": "carol", "not_before": t + 3600}), json!({"user": "has space"}), json!({"usr": "x"})] {
        let (status, body) =
            service.post_raw("/v1/server/sessions/revoke", bad.to_string().into_bytes()).await.unwrap();
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{bad}");
    }
}

/// An HTTP request's token is verified once per key set and kept as verified: the kept
/// token is still refused once its `exp` (plus the leeway, here none) has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_verified_over_http_is_refused_once_it_expires() {
    let mut c = Cluster::new("id-expiry");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_AUTH__LEEWAY_S", "0")]).await;
    let gw = c.gateways[0].base_url();
    let expiring = Claims { exp: now() + 3, ..claims("acme", "dave", "phone", now()) };
    let token = herald_shared::auth::sign(&expiring, herald_tests::SECRET.as_bytes());
    for _ in 0..3 {
        assert_eq!(status_of(&gw, &token).await, 200, "valid until its exp");
    }
    tokio::time::sleep(Duration::from_millis((expiring.exp + 1) * 1000 - now_ms())).await;
    assert_eq!(status_of(&gw, &token).await, 401, "expired: refused though it was verified before");
}
