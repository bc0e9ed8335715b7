//! What browsers need from the gateway (docs/protocol.md section 2): CORS for the HTTP
//! API, and the bad input it must refuse: an origin not configured.

use herald_shared::auth::{sign, Claims, Platform};
use herald_shared::ids::now_ms;
use herald_tests::{Cluster, SECRET, TENANT};

const PAGE: &str = "https://chat.example.com";

/// A web device's token of `tenant`, valid for `secs` more seconds.
fn token(tenant: &str, user: &str, device: &str, secs: i64) -> String {
    let exp = (now_ms() / 1000) as i64 + secs;
    let claims =
        Claims { tid: tenant.into(), sub: user.into(), dev: device.into(), plat: Platform::Web, exp: exp as u64 };
    sign(&claims, SECRET.as_bytes())
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
    assert!(["get", "post", "delete"].iter().all(|m| methods.contains(m)), "{methods}");
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
