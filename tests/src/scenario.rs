//! Running a load-test scenario against a test's cluster: the `herald-loadtest` binary
//! with the cluster's gateways, its report read back, and the integrity check every
//! scenario must pass.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::{bin, Cluster, SECRET};

/// A cluster for scenarios: `workers` workers, two gateways, send limits lifted.
pub async fn scenario_cluster(name: &str, workers: usize) -> Cluster {
    let mut c = Cluster::new(name);
    c.set("HERALD_GATEWAY__SEND_RATE", "100000").set("HERALD_GATEWAY__SEND_BURST", "100000");
    for _ in 0..workers {
        c.start_worker(&[]).await;
    }
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    c
}

/// Where the scenarios of this cluster write their reports.
pub fn scenario_out(c: &Cluster) -> PathBuf {
    c.log_dir.join("reports")
}

/// Runs one scenario (`args[0]` names it) against the first two gateways; returns its
/// exit code and its JSON report (if written).
pub async fn run_scenario(c: &Cluster, args: &[&str]) -> (i32, Option<Value>) {
    let gateways = format!("{},{}", c.gateways[0].base_url(), c.gateways[1].base_url());
    let out = scenario_out(c);
    let status = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new(bin("herald-loadtest"))
            .args(args)
            .args(["--gateways", &gateways, "--tenant", "lt", "--out", out.to_str().unwrap()])
            .env("HERALD_JWT_SECRET", SECRET)
            .kill_on_drop(true)
            .status(),
    )
    .await
    .expect("the scenario ends within 180 s")
    .expect("herald-loadtest runs");
    let report =
        std::fs::read_to_string(out.join(format!("{}.json", args[0]))).ok().map(|t| serde_json::from_str(&t).unwrap());
    (status.code().unwrap_or(-1), report)
}

/// The report's integrity check: something acknowledged, nothing lost, shown twice or
/// out of order.
pub fn assert_clean(r: &Value) {
    let i = &r["integrity"];
    assert!(i["acknowledged"].as_u64().unwrap() > 0, "{i}");
    assert_eq!(
        (i["lost"].as_u64(), i["shown_twice"].as_u64(), i["out_of_order"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{i}"
    );
}
