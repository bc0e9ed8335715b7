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
    bob.stop().await;
}
