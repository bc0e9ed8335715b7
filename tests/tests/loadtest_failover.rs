//! The `failover` scenario, small, against a real cluster: the gateway holding every
//! device is SIGKILLed under traffic and stays down; the devices must move to the other
//! one, catch up with nothing lost, and the report must say how long that took.

use std::time::Duration;

use herald_tests::{bin, Cluster, SECRET};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_moves_the_devices_of_a_killed_gateway_and_loses_nothing() {
    let mut c = Cluster::new("lt-failover");
    c.set("HERALD_GATEWAY__SEND_RATE", "100000").set("HERALD_GATEWAY__SEND_BURST", "100000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    let gateways = format!("{},{}", c.gateways[0].base_url(), c.gateways[1].base_url());
    let out = c.log_dir.join("reports");
    let kill = format!("kill -9 {}", c.gateways[0].pid());
    let args = ["--devices", "50", "--group", "10", "--rate", "20", "--baseline", "2", "--after", "1", "--kill", &kill];
    let status = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new(bin("herald-loadtest"))
            .arg("failover")
            .args(args)
            .args(["--gateways", &gateways, "--tenant", "lt", "--out", out.to_str().unwrap()])
            .env("HERALD_JWT_SECRET", SECRET)
            .kill_on_drop(true)
            .status(),
    )
    .await
    .expect("the scenario ends within 180 s")
    .expect("herald-loadtest runs");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("failover.json")).unwrap()).unwrap();
    assert_eq!(status.code(), Some(0), "failover: {r}");

    let i = &r["integrity"];
    assert!(i["acknowledged"].as_u64().unwrap() > 0, "{i}");
    assert_eq!(
        (i["lost"].as_u64(), i["shown_twice"].as_u64(), i["out_of_order"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{i}"
    );
    let e = &r["extra"];
    assert_eq!(e["kill_status"], "ok", "{e}");
    assert_eq!((e["reconnected"].as_u64(), e["caught_up"].as_u64()), (Some(50), Some(50)), "{e}");
    let (back, caught_up) = (e["reconnect_all_s"].as_f64().unwrap(), e["catch_up_all_s"].as_f64().unwrap());
    assert!(back > 0.0 && back <= caught_up && caught_up < 60.0, "{e}");
    assert!(e["reconnect_rate_per_s"].as_f64().unwrap() > 0.0, "{e}");
    assert!(e["sessions"].as_u64().unwrap() >= 100, "every device had a second session: {e}");
    assert!(e["realtime_p99_baseline_ms"].as_f64().unwrap() > 0.0, "{e}");
    let svg = std::fs::read_to_string(out.join("failover-sessions.svg")).unwrap();
    assert!(svg.contains("<polyline") && svg.contains("gateway killed"), "the reconnect curve is drawn");
    let md = std::fs::read_to_string(out.join("failover.md")).unwrap();
    assert!(md.contains("catch_up_all_s"), "the Markdown report has the catch-up time");
}
