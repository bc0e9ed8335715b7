//! HTTP reads, syncs and history pages take from the device's request bucket
//! (`gateway.send_rate`, `gateway.send_burst`) as the WebSocket's `read` and `sync`
//! frames do: a flood from one device is answered `429` with `Retry-After`. And a
//! measurement (run with `--ignored`; figures in docs/benchmarks.md): another tenant's
//! send latency on the same ingress shard while one tenant floods reads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_shared::auth::Platform;
use herald_tests::{Cluster, SECRET};
use serde_json::{json, Value};

fn token(tenant: &str, user: &str, device: &str) -> String {
    herald_client::token(SECRET, tenant, user, device, Platform::Web)
}

/// Sends `n` requests of one kind as one device, one after another; answers the
/// refusals' (status, Retry-After, body code) and how many were accepted.
async fn flood(base: &str, token: &str, kind: &str, n: usize) -> (Vec<(u16, Option<String>, Value)>, usize) {
    let http = reqwest::Client::new();
    let (mut refused, mut ok) = (Vec::new(), 0);
    for k in 0..n {
        let req = match kind {
            "read" => http.post(format!("{base}/v1/conversations/g/read")).json(&json!({"seq": k % 3})),
            "sync" => http.get(format!("{base}/v1/sync")),
            _ => http.get(format!("{base}/v1/conversations/g/messages?limit=1")),
        };
        let resp = req.bearer_auth(token).send().await.unwrap();
        let status = resp.status().as_u16();
        let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status == 200 {
            ok += 1;
        } else {
            refused.push((status, retry, body));
        }
    }
    (refused, ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reads_syncs_and_history_pages_are_rate_limited_per_device() {
    let mut c = Cluster::new("httplimits");
    c.set("HERALD_GATEWAY__SEND_RATE", "5").set("HERALD_GATEWAY__SEND_BURST", "10");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();
    let alice = c.client_in(0, "t", "alice", "setup");
    alice.create_conversation(Some("g"), "group", &["alice"]).await.unwrap();
    alice.send("m1", "g", &json!("one")).await.unwrap();

    for kind in ["read", "sync", "history"] {
        // A device of its own per kind: one bucket per device.
        let (refused, ok) = flood(&base, &token("t", "alice", kind), kind, 30).await;
        assert!((10..=20).contains(&ok), "{kind}: the burst and a little more pass, not all 30: {ok}");
        assert!(!refused.is_empty(), "{kind}: a flood is refused");
        for (status, retry, body) in &refused {
            assert_eq!((*status, body["error"]["code"].as_str()), (429, Some("rate_limited")), "{kind}: {body}");
            let secs: u64 = retry.as_deref().expect("Retry-After").parse().expect("seconds");
            assert!((1..=5).contains(&secs), "{kind}: Retry-After {secs}");
        }
    }
    // Another device of the same user is not held back by them.
    let (refused, ok) = flood(&base, &token("t", "alice", "other"), "history", 5).await;
    assert_eq!((refused.len(), ok), (0, 5), "{refused:?}");
}

/// Latencies of sequential HTTP sends of `quiet` for `span`, in ms, sorted.
async fn quiet_sends(base: &str, span: Duration, tag: &str) -> Vec<f64> {
    let http = reqwest::Client::new();
    let token = token("quiet", "qa", "q1");
    let (mut lat, started) = (Vec::new(), Instant::now());
    let mut k = 0;
    while started.elapsed() < span {
        k += 1;
        let t = Instant::now();
        let resp = http
            .post(format!("{base}/v1/messages"))
            .bearer_auth(&token)
            .json(&json!({"cmid": format!("{tag}-{k}"), "conv": "q", "body": k}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    lat
}

/// [`quiet_sends`] on a thread and runtime of its own: the flood's tasks in this
/// process do not delay it, only the cluster does.
fn quiet_apart(base: &str, span: Duration, tag: &str) -> std::thread::JoinHandle<Vec<f64>> {
    let (base, tag) = (base.to_owned(), tag.to_owned());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(quiet_sends(&base, span, &tag))
    })
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// `devices` devices of the noisy tenant, `loops` request loops each, post reads for
/// `span` at `rate` per second in all (the flood: 2 400 reads in 2.6 s), so
/// that the load generator, on the same machine, costs the same before and after.
async fn read_flood(base: &str, devices: usize, loops: usize, span: Duration, rate: u64) -> (u64, u64) {
    let (ok, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for d in 0..devices {
        for l in 0..loops {
            let (base, ok, refused) = (base.to_owned(), ok.clone(), refused.clone());
            let token = token("noisy", "na", &format!("n{d}"));
            tasks.push(tokio::spawn(async move {
                let http = reqwest::Client::new();
                let (started, mut k) = (Instant::now(), l as u64);
                let every = Duration::from_secs_f64((devices * loops) as f64 / rate as f64);
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while started.elapsed() < span {
                    tick.tick().await;
                    k += loops as u64;
                    let r = http
                        .post(format!("{base}/v1/conversations/n/read"))
                        .bearer_auth(&token)
                        .json(&json!({"seq": k}))
                        .send()
                        .await;
                    match r.map(|r| r.status().as_u16()) {
                        Ok(200) => ok.fetch_add(1, Ordering::Relaxed),
                        _ => refused.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    (ok.load(Ordering::Relaxed), refused.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for docs/benchmarks.md: cargo test --test http_limits -- --ignored --nocapture"]
async fn measure_another_tenants_sends_under_a_read_flood() {
    let mut c = Cluster::new("readflood");
    // One ingress shard: both tenants' conversations share it.
    c.set("HERALD_INGRESS__SHARDS", "1");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();
    let noisy = c.client_in(0, "noisy", "na", "setup");
    noisy.create_conversation(Some("n"), "group", &["na"]).await.unwrap();
    for k in 0..150 {
        noisy.send(&format!("n{k}"), "n", &json!(k)).await.unwrap();
    }
    c.client_in(0, "quiet", "qa", "q1").create_conversation(Some("q"), "group", &["qa"]).await.unwrap();
    let span = Duration::from_secs(3);
    let report = |name: &str, lat: &[f64], reads: Option<(u64, u64)>| {
        println!(
            "READFLOOD {name}: quiet sends {} p50 {:.1} ms p95 {:.1} ms max {:.1} ms; noisy reads accepted {}, refused {}",
            lat.len(),
            pct(lat, 0.5),
            pct(lat, 0.95),
            lat[lat.len() - 1],
            reads.map_or(0, |r| r.0),
            reads.map_or(0, |r| r.1),
        );
    };
    let quiet = quiet_apart(&base, span, "base");
    let lat = tokio::task::spawn_blocking(move || quiet.join().unwrap()).await.unwrap();
    report("no flood", &lat, None);
    for (name, devices, loops) in [("one device, 900 reads/s", 1, 8), ("24 devices, 900 reads/s in all", 24, 2)] {
        let quiet = quiet_apart(&base, span, name);
        let reads = read_flood(&base, devices, loops, span, 900).await;
        let lat = tokio::task::spawn_blocking(move || quiet.join().unwrap()).await.unwrap();
        report(name, &lat, Some(reads));
    }
}
