//! `/metrics` of a running gateway and worker after traffic: the documented series
//! exist, with plausible values.

use std::time::Duration;

use herald_tests::{eventually, AutoDevice, Cluster};
use serde_json::json;

fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(series) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_traffic() {
    let mut c = Cluster::new("metrics");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    for n in 0..20 {
        alice.send(&format!("m{n}"), "ab", &json!({})).await.unwrap();
    }
    let received = bob.received.clone();
    eventually(Duration::from_secs(10), "bob has all 20", || {
        let n = received.lock().unwrap().len();
        async move { (n >= 20).then_some(()) }
    })
    .await;
    let gw = format!("{}/metrics", c.gateways[0].admin_url());
    let text = eventually(Duration::from_secs(10), "the gateway counted the acks", || {
        let gw = gw.clone();
        async move {
            let t = reqwest::get(&gw).await.ok()?.text().await.ok()?;
            (value(&t, "herald_acks_total") >= 20.0).then_some(t)
        }
    })
    .await;
    assert_eq!(value(&text, "herald_send_ack_seconds_count"), 20.0, "{text}");
    assert!(value(&text, "herald_deliveries_total") >= 20.0);
    assert!(value(&text, "herald_delivery_seconds_count") >= 20.0);
    assert_eq!(value(&text, "herald_gateway_sessions"), 1.0);
    assert!(text.contains("kind=\"realtime\""));
    // Base units: 20 sends of a few milliseconds sum to well under 100 seconds.
    assert!(value(&text, "herald_send_ack_seconds_sum") < 100.0, "send-ack times are seconds, not ms");

    let wk = reqwest::get(format!("{}/metrics", c.workers[0].admin_url())).await.unwrap().text().await.unwrap();
    assert_eq!(value(&wk, "herald_messages_committed_total"), 20.0, "{wk}");
    assert!(value(&wk, "herald_worker_batch_size_count") >= 1.0);
    assert!(value(&wk, "herald_worker_commit_seconds_count") >= 1.0);
    assert!(value(&wk, "herald_ingress_lag_seconds_count") >= 20.0);
    assert_eq!(value(&wk, "herald_fanout_messages_total"), 20.0);
    assert_eq!(value(&wk, "herald_worker_owned_shards"), 8.0);
    for forbidden in ["alice", "bob", "\"ab\""] {
        assert!(!wk.contains(forbidden) && !text.contains(forbidden), "no user or conversation ids in labels");
    }
    assert_eq!(value(&text, "herald_sends_received_total{transport=\"http\"}"), 20.0, "{text}");
    let reported = value(&wk, "herald_ingress_report_timestamp_seconds");
    let now = herald_shared::ids::now_ms() as f64 / 1000.0;
    assert!((now - 60.0..=now + 1.0).contains(&reported), "the ingress report is recent: {reported} at {now}");
    bob.stop().await;
    let text = eventually(Duration::from_secs(10), "the gateway counted bob's session as closed", || {
        let gw = gw.clone();
        async move {
            let t = reqwest::get(&gw).await.ok()?.text().await.ok()?;
            (value(&t, "herald_sessions_closed_total{reason=\"client_gone\"}") == 1.0).then_some(t)
        }
    })
    .await;
    for (process, text) in [("gateway", &text), ("worker", &wk)] {
        let version = format!("herald_build_info{{version=\"{}\"", env!("CARGO_PKG_VERSION"));
        assert!(text.lines().any(|l| l.starts_with(&version) && l.ends_with(" 1")), "{process}: {text}");
        assert_eq!(undescribed(text), Vec::<String>::new(), "{process}: metrics without # HELP");
        // Prometheus's conventions: CPU seconds are a counter, memory a gauge.
        assert!(text.contains("# TYPE process_cpu_seconds_total counter\n"), "{process}: {text}");
        assert!(text.contains("# TYPE process_resident_memory_bytes gauge\n"), "{process}: {text}");
        assert!(value(text, "process_start_time_seconds") > 1.6e9, "{process}: {text}");
    }
}

/// The metric families of a scrape that have no `# HELP` line.
fn undescribed(text: &str) -> Vec<String> {
    let families: std::collections::BTreeSet<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    assert!(families.len() > 10, "{text}");
    families.into_iter().filter(|f| !text.contains(&format!("# HELP {f} "))).map(str::to_string).collect()
}

/// The admin trace follows one message through committed, fanned out, pending, acked;
/// the device view shows presence, pending count and watermark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_trace_follows_a_message_and_a_device() {
    let mut c = Cluster::new("trace");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "offline").register_device().await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "online"), "bob", "online").await;
    let sent = alice.send("m1", "ab", &json!({})).await.unwrap();
    let received = bob.received.clone();
    eventually(Duration::from_secs(10), "bob's online device has it", || {
        let n = received.lock().unwrap().len();
        async move { (n == 1).then_some(()) }
    })
    .await;
    let admin = c.admin(0);
    let path = format!("/admin/messages/{}/trace", sent.id);
    assert_eq!(admin.get(&path, None).await.0, 401);
    let trace = eventually(Duration::from_secs(10), "the trace shows the ack", || {
        let (admin, path) = (c.admin(0), path.clone());
        async move {
            let (code, t) = admin.get(&path, Some(herald_tests::ADMIN_TOKEN)).await;
            let online = t["recipients"].as_array()?.iter().find(|r| r["device"] == "online")?.clone();
            (code == 200 && online["state"] == "acked").then_some(t)
        }
    })
    .await;
    assert_eq!(trace["seq"], 1);
    assert_eq!(trace["fanned_out"], true);
    assert_eq!(trace["outbox"]["status"], "SENT");
    assert!(trace["committed_at"].as_i64().unwrap() > 0);
    let offline = trace["recipients"].as_array().unwrap().iter().find(|r| r["device"] == "offline").unwrap();
    assert_eq!(offline["state"], "pending");
    assert!(!trace["recipients"].as_array().unwrap().iter().any(|r| r["device"] == "a1"), "not the sender's device");

    let (code, dev) = admin.get("/admin/devices/acme/bob/offline", Some(herald_tests::ADMIN_TOKEN)).await;
    assert_eq!(code, 200, "{dev}");
    assert_eq!(
        (dev["pending"].as_u64(), dev["oldest_pending"].as_str()),
        (Some(1), Some(sent.id.to_string().as_str()))
    );
    assert!(dev["connected"].is_null());
    let (_, dev) = admin.get("/admin/devices/acme/bob/online", Some(herald_tests::ADMIN_TOKEN)).await;
    assert_eq!(dev["pending"], 0);
    assert!(dev["connected"]["node"].as_str().unwrap().starts_with("gw"));
    assert_eq!(dev["pending_set_trusted"], true);
    assert_eq!(admin.get("/admin/devices/acme/nobody/x", Some(herald_tests::ADMIN_TOKEN)).await.0, 404);
    assert_eq!(admin.get("/admin/messages/12/trace", Some(herald_tests::ADMIN_TOKEN)).await.0, 404);
    assert_eq!(admin.get("/admin/messages/abc/trace", Some(herald_tests::ADMIN_TOKEN)).await.0, 400);
    bob.stop().await;
}
