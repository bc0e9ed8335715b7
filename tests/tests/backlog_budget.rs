//! The node's adaptive backlog budget on a running gateway: it grows while a backlog
//! drains through it; frozen for a second (SIGSTOP, as a node starved of CPU), the
//! gateway sees its event loop lag and cuts the budget, grows it back once clear while
//! the backlog goes on draining, and lets it fall back to the floor when nothing uses
//! it. Realtime pushes are measured as the budget's other signal.
//!
//! The targets are set far above what a busy test machine shows by itself, so only the
//! freeze is congestion; the test asserts what the controller does, never how fast.

use std::time::Duration;

use herald_tests::drill::metric;
use herald_tests::faults::signal;
use herald_tests::{eventually, fill_backlog, AutoDevice, Cluster, Fill};
use serde_json::json;

const FLOOR: f64 = 500.0;
/// The budget must climb to here from the floor: only a backlog in use takes it there.
const IN_USE: f64 = 1_500.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_congested_node_cuts_its_backlog_budget_and_grows_it_back_while_in_use() {
    let mut c = Cluster::new("budget");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE", "20000"),
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE_FLOOR", "500"),
        ("HERALD_GATEWAY__BACKLOG_RATE_DESKTOP", "3000"),
        ("HERALD_GATEWAY__BACKLOG_LAG_TARGET_MS", "300"),
        ("HERALD_GATEWAY__BACKLOG_REALTIME_TARGET_MS", "60000"),
    ])
    .await;
    let (base, admin) = (c.gateways[0].base_url(), c.gateways[0].admin_url());
    let budget = || {
        let admin = admin.clone();
        async move { metric(&admin, "herald_backlog_budget_per_second").await }
    };
    let budget_is = |what: &'static str, ok: fn(f64) -> bool| {
        let budget = &budget;
        eventually(Duration::from_secs(60), what, move || {
            let b = budget();
            async move { ok(b.await).then_some(()) }
        })
    };
    budget_is("an idle node's budget at its floor", |b| b == FLOOR).await;

    // Realtime pushes are measured from the node channel to the socket.
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&base, &c.token("bob", "b1"), "bob", "b1").await;
    // (A message fanned out before bob's presence shows comes from his pending set.)
    let mut n = 0;
    eventually(Duration::from_secs(20), "a realtime push measured", || {
        n += 1;
        let (admin, alice) = (admin.clone(), alice.clone());
        async move {
            alice.send(&format!("m{n}"), "ab", &json!({})).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            (metric(&admin, "herald_realtime_push_seconds_count").await >= 1.0).then_some(())
        }
    })
    .await;

    // A backlog of 30 000 for one device, drained through the budget.
    let first = AutoDevice::connect(&base, &c.token("carol", "c1"), "carol", "c1").await;
    first.stop().await;
    let ids: Vec<u64> = (0..30_000).map(|k| (1u64 << 62) + k).collect();
    fill_backlog(&c, "carol", "c1", "cc", Fill::Written { ids: &ids }).await;
    let carol = AutoDevice::connect(&base, &c.token("carol", "c1"), "carol", "c1").await;
    budget_is("the budget grown by the backlog using it", |b| b >= IN_USE).await;

    let pid = c.gateways[0].pid();
    signal(pid, "-STOP");
    tokio::time::sleep(Duration::from_secs(1)).await;
    signal(pid, "-CONT");
    let cut = eventually(Duration::from_secs(10), "a cut of the budget for event-loop lag", || {
        let (admin, b) = (admin.clone(), budget());
        async move {
            let cuts = metric(&admin, "herald_backlog_budget_cuts_total{signal=\"lag\"}").await;
            let b = b.await;
            (cuts >= 1.0 && b < IN_USE).then_some(b)
        }
    })
    .await;
    let lag = metric(&admin, "herald_event_loop_lag_seconds_sum").await;
    assert!(lag >= 0.5, "the freeze shows as lag: {lag} s in all");
    budget_is("the budget grown back while the backlog drains", |b| b >= IN_USE).await;
    assert!(carol.ids().len() < ids.len(), "the backlog was still draining after the cut to {cut}");
    let total = ids.len();
    eventually(Duration::from_secs(120), "the whole backlog delivered", || {
        let n = carol.ids().len();
        async move { (n == total).then_some(()) }
    })
    .await;
    budget_is("the unused budget back at its floor", |b| b == FLOOR).await;
    carol.stop().await;
    bob.stop().await;
}

/// Sessions that wait for the node's budget wait in line: each is woken when its turn is
/// served, not all of them whenever a page's tokens come (a storm of 5 000 devices woke
/// about ten sessions in vain per message pushed). Counted, not timed: the reads held
/// for the budget (`herald_backlog_throttled_total`) against the pages read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_waiting_for_the_budget_are_woken_in_turn() {
    const DEVICES: usize = 100;
    const BACKLOG: usize = 100;
    const PAGE: usize = 20;
    let mut c = Cluster::new("budget-line");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        // A fixed node rate far below what the sessions would take together.
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE", "2000"),
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE_FLOOR", "2000"),
        ("HERALD_GATEWAY__BACKLOG_RATE_DESKTOP", "100000"),
        ("HERALD_GATEWAY__BACKLOG_PAGE_DESKTOP", "20"),
        ("HERALD_GATEWAY__BACKLOG_LAG_TARGET_MS", "10000"),
        ("HERALD_GATEWAY__BACKLOG_REALTIME_TARGET_MS", "60000"),
    ])
    .await;
    let (base, admin) = (c.gateways[0].base_url(), c.gateways[0].admin_url());
    let users: Vec<String> = (0..DEVICES).map(|d| format!("u{d}")).collect();
    let tokens: Vec<String> = users.iter().map(|u| c.token(u, "d")).collect();
    // Each device known to the gateway, then offline with a backlog of its own.
    let known = users.iter().zip(&tokens).map(|(u, t)| AutoDevice::connect(&base, t, u, "d"));
    for dev in futures::future::join_all(known).await {
        dev.stop().await;
    }
    for (d, u) in users.iter().enumerate() {
        let ids: Vec<u64> = (0..BACKLOG as u64).map(|k| (1u64 << 62) + (d * BACKLOG) as u64 + k).collect();
        fill_backlog(&c, u, "d", &format!("c{d}"), Fill::Written { ids: &ids }).await;
    }
    let held_before = metric(&admin, "herald_backlog_throttled_total").await;
    let storm = users.iter().zip(&tokens).map(|(u, t)| AutoDevice::connect(&base, t, u, "d"));
    let devices = futures::future::join_all(storm).await;
    eventually(Duration::from_secs(120), "every backlog delivered", || {
        let done = devices.iter().all(|d| d.ids().len() == BACKLOG);
        async move { done.then_some(()) }
    })
    .await;
    let held = metric(&admin, "herald_backlog_throttled_total").await - held_before;
    let pages = (DEVICES * BACKLOG / PAGE) as f64;
    // A read waits at most twice per page (its turn, and a look of its own if the
    // turn is late); with every session woken per page's tokens it was about
    // DEVICES / 2 per page.
    assert!(held <= 2.0 * pages, "{held} reads held for the budget for {pages} pages");
    for d in devices {
        d.stop().await;
    }
}
