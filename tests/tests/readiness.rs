//! Readiness is the gateway's own ability to serve: a short Redis or MySQL outage (a
//! failover) degrades it (`/healthz` detail, `herald_dependency_up`) but keeps `/readyz`
//! at 200, so a failover does not take every gateway out of its Service at once. Only an
//! outage past `gateway.dependency_outage_grace_ms` makes it unready. Private Redis and
//! MariaDB servers, killed and restarted.

use std::time::Duration;

use herald_tests::faults::MariaDb;
use herald_tests::{eventually, Cluster, RedisServer};
use serde_json::Value;

async fn readyz(admin: &str) -> u16 {
    match reqwest::get(format!("{admin}/readyz")).await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// `/healthz`: its status and the JSON body.
async fn healthz(admin: &str) -> (u16, Value) {
    let r = reqwest::get(format!("{admin}/healthz")).await.expect("/healthz answers");
    let status = r.status().as_u16();
    (status, r.json().await.expect("/healthz answers JSON"))
}

/// Whether `/healthz` lists `name` as up (`None` when it does not list it).
fn dependency_up(body: &Value, name: &str) -> Option<bool> {
    body["dependencies"].as_array()?.iter().find(|d| d["name"] == name)?["up"].as_bool()
}

async fn gauge(admin: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{admin}/metrics")).await.ok()?.text().await.ok()?;
    let series = format!("herald_dependency_up{{dependency=\"{name}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.parse().ok())
}

/// While `name` is down: `/healthz` says so (200, `degraded`, the gauge at 0) and
/// `/readyz` stays 200 for `hold`.
async fn degraded_but_ready(admin: &str, name: &str, hold: Duration) {
    let body = eventually(Duration::from_secs(15), &format!("/healthz reports {name} down"), || async {
        let (status, body) = healthz(admin).await;
        assert_eq!(status, 200, "/healthz (liveness) fails during a {name} outage: {body}");
        (dependency_up(&body, name) == Some(false)).then_some(body)
    })
    .await;
    assert_eq!(body["status"], "degraded", "{body}");
    assert!(body["dependencies"].as_array().unwrap().iter().any(|d| d["name"] == name && d["error"].is_string()));
    assert_eq!(gauge(admin, name).await, Some(0.0), "herald_dependency_up{{dependency={name:?}}}");
    let until = tokio::time::Instant::now() + hold;
    while tokio::time::Instant::now() < until {
        assert_eq!(readyz(admin).await, 200, "/readyz failed during a short {name} outage");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn healthy_again(admin: &str) {
    eventually(Duration::from_secs(30), "/healthz reports every dependency up", || async {
        let (_, body) = healthz(admin).await;
        (body["status"] == "ok").then_some(())
    })
    .await;
    assert_eq!(gauge(admin, "mysql").await, Some(1.0));
    assert_eq!(gauge(admin, "redis").await, Some(1.0));
    assert_eq!(readyz(admin).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_redis_or_mysql_outage_degrades_the_gateway_but_keeps_it_ready() {
    let mut redis = RedisServer::start().await;
    let mut db = MariaDb::start().await;
    let mut c = Cluster::with_redis("readiness", redis.url());
    c.mysql_url = format!("{}/{}", db.base_url(), c.db_name);
    c.start_worker(&[]).await;
    let gw = c.start_gateway(&[]).await;
    let admin = c.gateways[gw].admin_url();
    let (status, body) = healthz(&admin).await;
    assert_eq!((status, &body["status"]), (200, &Value::from("ok")), "{body}");
    assert_eq!((dependency_up(&body, "mysql"), dependency_up(&body, "redis")), (Some(true), Some(true)));

    redis.kill();
    degraded_but_ready(&admin, "redis", Duration::from_secs(3)).await;
    redis.restart().await;
    healthy_again(&admin).await;

    db.kill().await;
    degraded_but_ready(&admin, "mysql", Duration::from_secs(3)).await;
    db.restart().await;
    healthy_again(&admin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_past_its_grace_makes_the_gateway_unready_until_it_ends() {
    let mut redis = RedisServer::start().await;
    let mut c = Cluster::with_redis("readiness_grace", redis.url());
    c.start_worker(&[]).await;
    let gw = c.start_gateway(&[("HERALD_GATEWAY__DEPENDENCY_OUTAGE_GRACE_MS", "2000")]).await;
    let admin = c.gateways[gw].admin_url();
    redis.kill();
    eventually(Duration::from_secs(15), "/readyz fails once Redis is down past the grace", || async {
        (readyz(&admin).await == 503).then_some(())
    })
    .await;
    let (status, body) = healthz(&admin).await;
    assert_eq!(status, 200, "liveness holds while unready: {body}");
    assert_eq!(dependency_up(&body, "redis"), Some(false));
    redis.restart().await;
    eventually(Duration::from_secs(30), "/readyz is 200 again once Redis is back", || async {
        (readyz(&admin).await == 200).then_some(())
    })
    .await;
}
