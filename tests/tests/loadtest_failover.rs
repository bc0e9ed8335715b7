//! The `failover` scenario, small, against a real cluster: the gateway holding every
//! device is SIGKILLed under traffic and stays down; the devices must move to the other
//! one, catch up with nothing lost, and the report must say how long that took.

use herald_tests::{assert_clean, run_scenario, scenario_cluster, scenario_out};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_moves_the_devices_of_a_killed_gateway_and_loses_nothing() {
    let c = scenario_cluster("lt-failover", 1).await;
    let kill = format!("kill -9 {}", c.gateways[0].pid());
    let args = [
        "failover",
        "--devices",
        "50",
        "--group",
        "10",
        "--rate",
        "20",
        "--baseline",
        "2",
        "--after",
        "1",
        "--kill",
        &kill,
    ];
    let (code, r) = run_scenario(&c, &args).await;
    let r = r.expect("failover report");
    assert_eq!(code, 0, "failover: {r}");
    assert_clean(&r);
    let e = &r["extra"];
    assert_eq!(e["kill_status"], "ok", "{e}");
    assert_eq!((e["reconnected"].as_u64(), e["caught_up"].as_u64()), (Some(50), Some(50)), "{e}");
    let (back, caught_up) = (e["reconnect_all_s"].as_f64().unwrap(), e["catch_up_all_s"].as_f64().unwrap());
    assert!(back > 0.0 && back <= caught_up && caught_up < 60.0, "{e}");
    assert!(e["reconnect_rate_per_s"].as_f64().unwrap() > 0.0, "{e}");
    assert!(e["sessions"].as_u64().unwrap() >= 100, "every device had a second session: {e}");
    assert!(e["realtime_p99_baseline_ms"].as_f64().unwrap() > 0.0, "{e}");
    let out = scenario_out(&c);
    let svg = std::fs::read_to_string(out.join("failover-sessions.svg")).unwrap();
    assert!(svg.contains("<polyline") && svg.contains("gateway killed"), "the reconnect curve is drawn");
    let md = std::fs::read_to_string(out.join("failover.md")).unwrap();
    assert!(md.contains("catch_up_all_s"), "the Markdown report has the catch-up time");
}
