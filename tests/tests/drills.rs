//! Fault drills (docs/reliability.md, "Fault drills"): each runs live traffic through a
//! real cluster, injects one fault in the middle, and then requires that every device
//! catches up within a bound after recovery and that the integrity check finds nothing
//! lost, shown twice or out of order.
//!
//! `cargo test -p herald-tests --test drills -- --test-threads 2`

use std::time::{Duration, Instant};

use herald_tests::drill::{drill_cluster, metric, Drill, Traffic};
use herald_tests::faults::{self, MariaDb, SwitchProxy, TcpProxy};
use herald_tests::{Cluster, RedisServer};

/// Generous for a loaded 2-core CI machine that runs two drills at once; measured
/// values (printed as `DRILL ...`) are a few seconds.
const CATCH_UP_BOUND: Duration = Duration::from_secs(30);

fn cluster(name: &str, redis_url: Option<String>) -> Cluster {
    drill_cluster(name, redis_url)
}

async fn start(c: &mut Cluster, workers: usize, gateways: usize) {
    for _ in 0..workers {
        c.start_worker(&[]).await;
    }
    for _ in 0..gateways {
        c.start_gateway(&[]).await;
    }
}

fn gateway_urls(c: &Cluster) -> Vec<String> {
    c.gateways.iter().map(|g| g.base_url()).collect()
}

async fn traffic(name: &'static str, c: &Cluster) -> Drill {
    Drill::start(name, gateway_urls(c), gateway_urls(c), Traffic::default()).await
}

fn admin_urls(c: &Cluster) -> Vec<String> {
    c.gateways.iter().map(|g| g.admin_url()).collect()
}

async fn sum_metric(admin_urls: &[String], name: &str) -> f64 {
    let mut total = 0.0;
    for url in admin_urls {
        total += metric(url, name).await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_sigkill() {
    let mut c = cluster("drill-gwkill", None);
    start(&mut c, 1, 2).await;
    let mut d = traffic("gateway_sigkill", &c).await;
    d.traffic(Duration::from_secs(3)).await;
    d.note("SIGKILL gateway 0");
    c.gateways[0].kill().await;
    // Nothing to repair by hand: its devices and senders move to the other gateway.
    d.catch_up(CATCH_UP_BOUND).await;
    d.note("gateway 0 started again on its addresses");
    c.respawn_gateway(0).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_sigkill() {
    let mut c = cluster("drill-wkkill", None);
    start(&mut c, 2, 2).await;
    let mut d = traffic("worker_sigkill", &c).await;
    d.traffic(Duration::from_secs(3)).await;
    d.note("SIGKILL worker 0");
    c.workers[0].kill().await;
    // The other worker takes its shards when their leases lapse.
    d.catch_up(CATCH_UP_BOUND).await;
    d.note("a replacement worker starts");
    c.start_worker(&[]).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_gateway_restart() {
    let mut c = cluster("drill-rolling", None);
    start(&mut c, 1, 2).await;
    let mut d = traffic("rolling_gateway_restart", &c).await;
    d.traffic(Duration::from_secs(3)).await;
    for i in 0..2 {
        d.note(format!("rolling restart: gateway {i} drains (SIGTERM) and starts again"));
        faults::restart_gateway(&mut c, i, Duration::from_secs(10)).await;
        d.traffic(Duration::from_secs(1)).await;
    }
    d.catch_up(CATCH_UP_BOUND).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_empty() {
    let mut redis = RedisServer::start().await;
    let mut c = cluster("drill-redisempty", Some(redis.url()));
    start(&mut c, 1, 2).await;
    let mut d = traffic("redis_restarted_empty", &c).await;
    d.traffic(Duration::from_secs(3)).await;
    d.note("Redis killed and started again, empty");
    redis.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.restart().await;
    d.catch_up(CATCH_UP_BOUND).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
    let rebuilds = sum_metric(&admin_urls(&c), "herald_pending_rebuilds_total").await;
    assert!(rebuilds > 0.0, "the gateways rebuilt pending sets from MySQL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_paused_longer_than_ack_timeout() {
    let redis = RedisServer::start().await;
    let mut c = cluster("drill-redispause", Some(redis.url()));
    start(&mut c, 1, 2).await;
    let mut d = traffic("redis_paused_longer_than_ack_timeout", &c).await;
    d.traffic(Duration::from_secs(3)).await;
    // Ack timeout and probe are 2 s each: a 5 s pause outlasts both.
    d.note("Redis paused (SIGSTOP) for 5 s");
    faults::pause_redis(&redis);
    tokio::time::sleep(Duration::from_secs(5)).await;
    faults::resume_redis(&redis);
    d.note("Redis resumed (SIGCONT)");
    d.catch_up(CATCH_UP_BOUND).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
}

/// Redis fails over to a replica that had not received the master's last writes: the
/// replication link is cut (the writes stay behind it), the master SIGKILLed, the
/// replica promoted (`REPLICAOF NO ONE`) and Herald's Redis address switched to it. The
/// promoted replica keeps the epoch and the device markers but lacks the last pending
/// entries; Herald notices the new master (its replication id) and reads every pending
/// set again from MySQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_failover_to_a_lagging_replica() {
    let mut master = RedisServer::start().await;
    let link = TcpProxy::start(([127, 0, 0, 1], master.port).into()).await;
    let replica = RedisServer::replica_of(link.addr.port()).await;
    let proxy = SwitchProxy::start(([127, 0, 0, 1], master.port).into()).await;
    let mut c = cluster("drill-failover", Some(proxy.redis_url()));
    start(&mut c, 1, 2).await;
    // An offline device: what reaches it during the fault waits in its pending set.
    let sender = c.client(0, "olga", "o1");
    sender.create_conversation(Some("away"), "direct", &["olga", "otto"]).await.unwrap();
    let otto = herald_tests::AutoDevice::connect(&c.gateways[1].base_url(), &c.token("otto", "o1"), "otto", "o1").await;
    otto.stop().await;
    let mut d = traffic("redis_failover_to_a_lagging_replica", &c).await;
    d.traffic(Duration::from_secs(3)).await;
    let epochs_before = sum_metric(&admin_urls(&c), "herald_redis_epochs_total").await;
    d.note("replication link cut: the master's writes stop reaching the replica");
    link.cut();
    let mut for_otto = std::collections::BTreeSet::new();
    for k in 0..20 {
        let r = sender.send_until_committed(&format!("away{k}"), "away", &serde_json::json!(k), 20).await.unwrap();
        for_otto.insert(r.id.0);
    }
    d.traffic(Duration::from_secs(1)).await;
    d.note("master SIGKILLed; the replica is promoted and takes the address");
    master.kill();
    let promoted = std::process::Command::new("redis-cli")
        .args(["-p", &replica.port.to_string(), "REPLICAOF", "NO", "ONE"])
        .output()
        .expect("redis-cli runs");
    assert!(promoted.status.success(), "{promoted:?}");
    proxy.switch(([127, 0, 0, 1], replica.port).into());
    d.catch_up(CATCH_UP_BOUND).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
    // The offline device comes back: everything sent to it during the fault arrives.
    let otto = herald_tests::AutoDevice::connect(&c.gateways[0].base_url(), &c.token("otto", "o1"), "otto", "o1").await;
    herald_tests::eventually(Duration::from_secs(20), "every message sent to the offline device", || async {
        for_otto.is_subset(&otto.ids()).then_some(())
    })
    .await;
    otto.stop().await;
    let epochs = sum_metric(&admin_urls(&c), "herald_redis_epochs_total").await;
    assert!(epochs > epochs_before, "a gateway began a new epoch for the promoted replica");
}

/// A Redis Cluster master fails over to its replica, which had not received the
/// master's last writes: the link is cut, an offline device (its keys on that master)
/// gets 20 messages, the master is SIGKILLed and the replica takes its slots over. The
/// other masters, the epoch's among them, keep their data; Herald notices the shard's
/// new master (its replication id) and reads every pending set again from MySQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_failover_to_a_lagging_replica() {
    use herald_tests::redis_cluster::RedisCluster;
    let mut rc = RedisCluster::start().await;
    let mut c = cluster("drill-rcfailover", Some(rc.url()));
    let keys = c.keys();
    let failing = (0..3).find(|&i| i != rc.node_of(&keys.epoch())).expect("a master without the epoch");
    let away = (0..200)
        .map(|i| format!("otto{i}"))
        .find(|u| rc.node_of(&keys.presence(herald_tests::TENANT, u)) == failing)
        .expect("a user on the failing master");
    let replica = rc.add_replica(failing).await;
    start(&mut c, 1, 2).await;
    let sender = c.client(0, "olga", "o1");
    sender.create_conversation(Some("away"), "direct", &["olga", &away]).await.unwrap();
    let device = herald_tests::AutoDevice::connect(&c.gateways[1].base_url(), &c.token(&away, "o1"), &away, "o1").await;
    device.stop().await;
    let mut d = traffic("redis_cluster_failover_to_a_lagging_replica", &c).await;
    d.traffic(Duration::from_secs(3)).await;
    let epochs_before = sum_metric(&admin_urls(&c), "herald_redis_epochs_total").await;
    d.note(format!("replication link of master {failing} cut"));
    rc.cut_replication(replica).await;
    let mut for_away = std::collections::BTreeSet::new();
    for k in 0..20 {
        let r = sender.send_until_committed(&format!("away{k}"), "away", &serde_json::json!(k), 20).await.unwrap();
        for_away.insert(r.id.0);
    }
    d.traffic(Duration::from_secs(1)).await;
    d.note(format!("master {failing} SIGKILLed; its replica takes its slots over"));
    rc.kill(failing);
    let alive: Vec<usize> = (0..3).filter(|&i| i != failing).collect();
    rc.take_over(replica, &alive).await;
    d.catch_up(CATCH_UP_BOUND).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
    let device = herald_tests::AutoDevice::connect(&c.gateways[0].base_url(), &c.token(&away, "o1"), &away, "o1").await;
    herald_tests::eventually(Duration::from_secs(20), "every message sent to the offline device", || async {
        for_away.is_subset(&device.ids()).then_some(())
    })
    .await;
    device.stop().await;
    let epochs = sum_metric(&admin_urls(&c), "herald_redis_epochs_total").await;
    assert!(epochs > epochs_before, "a gateway began a new epoch for the promoted replica");
    let promotions = sum_metric(&admin_urls(&c), "herald_redis_promotions_total").await;
    assert!(promotions >= 1.0, "the promotion was counted: {promotions}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_restarted_while_sends_continue() {
    let mut db = MariaDb::start().await;
    let mut c = cluster("drill-mariadb", None);
    c.mysql_url = format!("{}/{}", db.base_url(), c.db_name);
    start(&mut c, 1, 2).await;
    let mut d = traffic("mariadb_restarted_while_sends_continue", &c).await;
    d.traffic(Duration::from_secs(3)).await;
    let before = d.acknowledged();
    d.note("MariaDB SIGKILL; down for 4 s while sends continue");
    db.kill().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = d.acknowledged();
    db.restart().await;
    d.note("MariaDB restarted on its data");
    d.catch_up(CATCH_UP_BOUND).await;
    d.traffic(Duration::from_secs(2)).await;
    let timeouts = sum_metric(&admin_urls(&c), "herald_send_timeouts_total").await;
    let dups = metric(&c.workers[0].admin_url(), "herald_messages_duplicate_total").await;
    let report = d.finish().await;
    report.assert_clean();
    eprintln!("{timeouts} sends answered `unavailable`, {dups} retries found already committed");
    // A send or two may have committed just before the kill and been answered late.
    assert!(during - before <= 30, "sends kept being acknowledged without a database: {}", during - before);
    assert!(timeouts > 0.0, "no send was answered `unavailable` while the database was down");
    assert!(dups > 0.0, "no retry with the same cmid reached the worker after a commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_cut_without_fin_for_30s() {
    let mut c = cluster("drill-netcut", None);
    start(&mut c, 1, 2).await;
    let proxies = [TcpProxy::start(c.gateways[0].listen()).await, TcpProxy::start(c.gateways[1].listen()).await];
    // Devices reach the gateways through the proxies (their network); senders directly.
    let via_proxy = proxies.iter().map(TcpProxy::url).collect();
    let mut d = Drill::start("network_cut_without_fin_for_30s", gateway_urls(&c), via_proxy, Traffic::default()).await;
    d.traffic(Duration::from_secs(3)).await;
    let closed_before = half_open_closes(&c).await;
    let acked_before = d.acknowledged();
    d.note("network cut: packets dropped both ways, no FIN, no RST, for 30 s");
    let cut = Instant::now();
    proxies.iter().for_each(TcpProxy::cut);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let closed = half_open_closes(&c).await - closed_before;
    let online = d.online();
    let committed = d.acknowledged() - acked_before;
    proxies.iter().for_each(TcpProxy::restore);
    d.note(format!("network restored after {:.1} s", cut.elapsed().as_secs_f64()));
    d.catch_up(CATCH_UP_BOUND).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
    assert!(committed > 1000, "sends kept being committed during the cut: {committed}");
    assert_eq!(online, 0, "every device gave its silent session up during the cut");
    assert!(closed >= 30.0, "the gateways closed the silent sessions themselves: {closed} of 30");
}

/// Sessions the gateways closed because the client went silent (heartbeat timeout) or
/// left pushes unacked without answering a ping (half-open).
async fn half_open_closes(c: &Cluster) -> f64 {
    let urls = admin_urls(c);
    sum_metric(&urls, "herald_heartbeat_timeouts_total").await
        + sum_metric(&urls, "herald_half_open_closes_total").await
}

/// Regression (found by the 5 000-device storm): a backlog page whose frames could be
/// read neither from Redis nor from MySQL (the database down, not the messages gone) took
/// its entries for stale and removed them from the pending set: lost. Now the session
/// ends and nothing is removed; the device gets every message once MySQL is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_page_unreadable_from_mysql_removes_nothing() {
    use herald_tests::{eventually, fill_backlog, pending_ids, AutoDevice, Fill};
    let mut db = MariaDb::start().await;
    let mut c = cluster("drill-frames", None);
    c.mysql_url = format!("{}/{}", db.base_url(), c.db_name);
    start(&mut c, 1, 1).await;
    let conv = c.client(0, "alice", "a1").create_conversation(None, "direct", &["alice", "bob"]).await.unwrap();
    let conv = conv.1["id"].as_str().unwrap().to_string();
    // Bob's device is known to the gateway and trusted in this epoch, then goes offline.
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    bob.stop().await;
    let alice = c.client(0, "alice", "a1");
    let pending = fill_backlog(&c, "bob", "b1", &conv, Fill::Sent { sender: &alice, n: 5, tasks: 1 }).await;
    assert_eq!(pending.len(), 5);
    let (redis, keys) = (c.redis().await, c.keys());
    // The frames are gone from Redis (expired), and MySQL is down.
    for id in &pending {
        let _: i64 =
            fred::interfaces::KeysInterface::del(&redis, keys.message(herald_shared::ids::MsgId(*id))).await.unwrap();
    }
    db.kill().await;
    let dev = AutoDevice::connect_soft(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    if let Some(dev) = dev {
        eventually(Duration::from_secs(10), "the session ends without its backlog", || async {
            dev.is_closed().then_some(())
        })
        .await;
        assert!(dev.ids().is_empty());
        dev.stop().await;
    }
    assert_eq!(pending_ids(&redis, &keys, "bob", "b1").await, pending, "nothing left the pending set");
    db.restart().await;
    let dev = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    eventually(Duration::from_secs(20), "all five messages, rebuilt from MySQL", || async {
        (dev.ids() == pending).then_some(())
    })
    .await;
    dev.stop().await;
}
