//! A worker that stops (SIGTERM: a rolling restart, a scale-down) hands its shards over
//! at once: it releases every shard lease before it exits, so the next owner starts
//! without waiting for the leases to lapse.

use std::time::Duration;

use fred::interfaces::KeysInterface;
use herald_tests::drill::metric;
use herald_tests::faults::signal;
use herald_tests::{eventually, Cluster};

/// 32 shards, each consumer blocked in a read of 2 s when the worker is told to stop.
/// Before: shards were given up one after another, each waiting for its blocked read,
/// so the process's 20 s stop bound passed with most leases still held (they lapse only
/// after `worker.lease_ttl_ms`, here a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_releases_every_shard_lease_before_it_exits() {
    const SHARDS: usize = 32;
    let mut c = Cluster::new("worker_stop");
    c.set("HERALD_INGRESS__SHARDS", &SHARDS.to_string())
        .set("HERALD_WORKER__BATCH_BLOCK_MS", "2000")
        .set("HERALD_WORKER__LEASE_TTL_MS", "60000");
    c.start_worker(&[]).await;
    let admin = c.workers[0].admin_url();
    eventually(Duration::from_secs(30), "the worker owns every shard", || async {
        (metric(&admin, "herald_worker_owned_shards").await == SHARDS as f64).then_some(())
    })
    .await;
    let redis = c.redis().await;
    let keys = c.keys();
    let leases: Vec<String> = (0..SHARDS).map(|s| keys.lease(&format!("shard:{s}"))).collect();
    let held: i64 = redis.exists(leases.clone()).await.unwrap();
    assert_eq!(held, SHARDS as i64, "every shard's lease is held while the worker runs");

    let w = &mut c.workers[0];
    signal(w.pid(), "-TERM");
    let exited = tokio::time::timeout(Duration::from_secs(60), w.child.wait()).await;
    assert!(matches!(exited, Ok(Ok(_))), "the worker exits after SIGTERM");
    let held: i64 = redis.exists(leases).await.unwrap();
    assert_eq!(held, 0, "every shard lease is released when the worker has exited");
}
