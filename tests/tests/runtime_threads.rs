//! `runtime_threads`: each process runs the async runtime threads it is given, and still
//! delivers with a single one (a value out of range: `operations_cli.rs`).

use std::time::Duration;

use herald_tests::{eventually, AutoDevice, Cluster};
use serde_json::json;

/// The thread count a process logged when its runtime started.
fn logged_threads(c: &Cluster, name: &str) -> Option<u64> {
    let log = std::fs::read_to_string(c.log_dir.join(format!("{name}.log"))).ok()?;
    let line = log.lines().find(|l| l.contains("async runtime started"))?;
    let plain: String = strip_ansi(line);
    plain.split("threads=").nth(1)?.split_whitespace().next()?.parse().ok()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_process_runs_the_threads_it_is_given_and_one_delivers() {
    let mut c = Cluster::new("rtthreads");
    c.start_worker(&[("HERALD_RUNTIME_THREADS", "3")]).await;
    c.start_gateway(&[("HERALD_RUNTIME_THREADS", "1")]).await;
    c.start_gateway(&[]).await;
    assert_eq!(logged_threads(&c, "wk-1"), Some(3), "the worker's log");
    assert_eq!(logged_threads(&c, "gw-2"), Some(1), "the one-thread gateway's log");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert_eq!(logged_threads(&c, "gw-3"), Some(cpus), "the default: one per CPU");

    // A send through the one-thread gateway reaches a device held by it.
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let base = c.gateways[0].base_url();
    let bob = AutoDevice::connect(&base, &c.token("bob", "b1"), "bob", "b1").await;
    let sent = alice.send("m1", "ab", &json!({"text": "hi"})).await.unwrap();
    eventually(Duration::from_secs(10), "bob's device shows the message", || {
        let has = bob.ids().contains(&sent.id.0);
        async move { has.then_some(()) }
    })
    .await;
    bob.stop().await;
}
