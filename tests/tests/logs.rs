//! Log lines as collectors read them: with `log_format = json` every line a process
//! writes is one JSON object, its event's fields at the top level.

use std::time::Duration;

use herald_client::{WsClient, WsEvent};
use herald_shared::protocol::{Hello, ServerFrame};
use herald_tests::Cluster;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_format_writes_one_object_per_line() {
    let mut c = Cluster::new("jsonlogs");
    c.set("HERALD_LOG_FORMAT", "json");
    c.start_worker(&[]).await;
    // Debug for the gateway, so a refused session logs the address it was counted as.
    c.start_gateway(&[("RUST_LOG", "info,herald_gateway=debug"), ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP", "1")])
        .await;
    let base = c.gateways[0].base_url();
    let mut first = WsClient::connect(&base, &c.token("ann", "a1")).await.unwrap();
    first.next_of::<Hello>(Duration::from_secs(5)).await.expect("hello");
    let mut second = WsClient::connect(&base, &c.token("bea", "b1")).await.unwrap();
    let refused = second.next(Duration::from_secs(5)).await;
    assert!(matches!(refused, Some(WsEvent::Frame(ServerFrame::Error(_)))), "{refused:?}");

    let mut messages = Vec::new();
    for entry in std::fs::read_dir(&c.log_dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.trim().is_empty(), "{} is empty", path.display());
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: not a JSON line ({e}): {line}", path.display()));
            for field in ["timestamp", "level", "target", "message"] {
                assert!(v.get(field).is_some(), "{}: no {field}: {line}", path.display());
            }
            messages.push(v);
        }
    }
    let started = messages.iter().find(|v| v["message"] == "gateway started").expect("the gateway's started line");
    assert!(started["listen"].as_str().is_some_and(|a| a.starts_with("127.0.0.1:")), "{started}");
    assert!(messages.iter().any(|v| v["message"] == "worker started"), "the worker's started line");
    let refusal = messages
        .iter()
        .find(|v| v["message"] == "too many connections from this address")
        .expect("the refusal, at debug");
    assert_eq!(refusal["ip"], "127.0.0.1", "{refusal}");
    assert_eq!(refusal["user"], "bea", "{refusal}");
}
