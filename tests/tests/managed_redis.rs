//! A Redis that refuses `CONFIG`, as managed services do: the gateway's noeviction
//! check says so and how to turn it off; turned off, the gateway never sends `CONFIG`
//! and serves.

use std::time::Duration;

use fred::prelude::*;
use herald_tests::{bin, eventually, AutoDevice, Cluster, RedisServer, SECRET};
use serde_json::json;

/// Error replies Redis gave since it started, from `INFO errorstats` (`ERR` is what an
/// unknown or renamed command gets).
async fn err_replies(url: &str) -> u64 {
    let client = Builder::from_config(Config::from_url(url).unwrap()).build().unwrap();
    client.init().await.unwrap();
    let info: String = client
        .custom(
            fred::types::CustomCommand::new_static("INFO", fred::types::ClusterHash::Random, false),
            vec!["errorstats".to_string()],
        )
        .await
        .unwrap();
    let _ = client.quit().await;
    info.lines().find_map(|l| l.strip_prefix("errorstat_ERR:count=")).map_or(0, |n| n.trim().parse().expect("a count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_refusing_config_is_explained_and_served_with_the_check_off() {
    let redis = RedisServer::without_config().await;
    let mut c = Cluster::with_redis("managed-redis", redis.url());
    c.start_worker(&[]).await;

    // The check on (the default): the gateway stops at start and says why and what to do.
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(bin("herald-gateway"))
            .env_clear()
            .env("HERALD_MYSQL_URL", &c.mysql_url)
            .env("HERALD_REDIS_URL", redis.url())
            .env("HERALD_REDIS_KEY_PREFIX", &c.prefix)
            .env("HERALD_JWT_SECRET", SECRET)
            .env("HERALD_LISTEN", "127.0.0.1:0")
            .env("HERALD_ADMIN_LISTEN", "127.0.0.1:0")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the gateway exits at once")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for needle in ["CONFIG GET was refused", "gateway.require_noeviction = false", "HERALD_GATEWAY__REQUIRE_NOEVICTION"]
    {
        assert!(stderr.contains(needle), "{needle:?} missing from:\n{stderr}");
    }
    let refused = err_replies(&redis.url()).await;
    assert!(refused >= 1, "the refused CONFIG GET is an error reply");

    // The check off: it starts, serves a send and its delivery, and sends no CONFIG.
    c.start_gateway(&[("HERALD_GATEWAY__REQUIRE_NOEVICTION", "false")]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    alice.send("m1", "ab", &json!({"text": "hi"})).await.unwrap();
    let received = bob.received.clone();
    eventually(Duration::from_secs(10), "bob got the message", || {
        let n = received.lock().unwrap().len();
        async move { (n >= 1).then_some(()) }
    })
    .await;
    bob.stop().await;
    assert_eq!(err_replies(&redis.url()).await, refused, "no command was refused while the check was off");
}
