//! The node's adaptive backlog budget on a running gateway: frozen for a second
//! (SIGSTOP, as a node starved of CPU), it sees its event loop lag, cuts the budget,
//! and grows it back to `gateway.backlog_rate_node` once clear. Realtime pushes are
//! measured as the budget's other signal.
//!
//! The targets are set far above what a busy test machine shows by itself, so only the
//! freeze is congestion; the test asserts what the controller does, never how fast.

use std::time::Duration;

use herald_tests::drill::metric;
use herald_tests::faults::signal;
use herald_tests::{eventually, AutoDevice, Cluster};
use serde_json::json;

const CEILING: f64 = 20_000.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_congested_node_cuts_its_backlog_budget_and_grows_it_back() {
    let mut c = Cluster::new("budget");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE", "20000"),
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE_FLOOR", "500"),
        ("HERALD_GATEWAY__BACKLOG_LAG_TARGET_MS", "300"),
        ("HERALD_GATEWAY__BACKLOG_REALTIME_TARGET_MS", "60000"),
    ])
    .await;
    let admin = c.gateways[0].admin_url();
    let budget = || {
        let admin = admin.clone();
        async move { metric(&admin, "herald_backlog_budget_per_second").await }
    };
    eventually(Duration::from_secs(30), "the budget at its ceiling", || {
        let b = budget();
        async move { (b.await == CEILING).then_some(()) }
    })
    .await;

    // Realtime pushes are measured from the node channel to the socket.
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    for n in 0..3 {
        alice.send(&format!("m{n}"), "ab", &json!({})).await.unwrap();
    }
    eventually(Duration::from_secs(10), "three realtime pushes measured", || {
        let admin = admin.clone();
        async move { (metric(&admin, "herald_realtime_push_seconds_count").await >= 3.0).then_some(()) }
    })
    .await;

    let pid = c.gateways[0].pid();
    signal(pid, "-STOP");
    tokio::time::sleep(Duration::from_secs(1)).await;
    signal(pid, "-CONT");
    let cut = eventually(Duration::from_secs(10), "a cut of the budget for event-loop lag", || {
        let (admin, b) = (admin.clone(), budget());
        async move {
            let cuts = metric(&admin, "herald_backlog_budget_cuts_total{signal=\"lag\"}").await;
            let b = b.await;
            (cuts >= 1.0 && b < CEILING).then_some(b)
        }
    })
    .await;
    assert!(cut <= CEILING * 0.7, "a cut keeps at most 70 %: {cut}");
    let lag = metric(&admin, "herald_event_loop_lag_seconds_sum").await;
    assert!(lag >= 0.5, "the freeze shows as lag: {lag} s in all");
    eventually(Duration::from_secs(60), "the budget back at its ceiling", || {
        let b = budget();
        async move { (b.await == CEILING).then_some(()) }
    })
    .await;
    bob.stop().await;
}
