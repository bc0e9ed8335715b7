//! Everything Herald keeps is bounded by what is pending or by a configured window, not
//! by history or by the devices ever seen: frames leave Redis after their window, SENT
//! outbox rows are purged as fast as they come, devices unseen for their TTL stop
//! costing (and catch up when they return), logged-out devices free everything, old
//! messages go after their retention, idle sessions write almost nothing, and slow
//! requests and statements are cut off.

use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, KeysInterface};
use herald_shared::ids::now_ms;
use herald_shared::protocol::Hello;
use herald_tests::drill::metric;
use herald_tests::{eventually, pending_ids, AutoDevice, Cluster, TENANT};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn keys_matching(c: &Cluster, pattern: &str) -> Vec<String> {
    let redis = c.redis().await;
    let (_, keys): (String, Vec<String>) = redis
        .custom(
            fred::types::CustomCommand::new_static("SCAN", fred::types::ClusterHash::Random, false),
            vec!["0".to_string(), "MATCH".into(), pattern.to_string(), "COUNT".into(), "100000".into()],
        )
        .await
        .unwrap();
    keys
}

/// With a frame window of a few seconds, Redis holds no message frames once they were
/// delivered and the window passed; a backlog older than the window is still delivered
/// (its frames rebuilt from MySQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_leave_redis_after_their_window() {
    let mut c = Cluster::new("framettl");
    c.set("HERALD_WORKER__MESSAGE_TTL_S", "2");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    let carol_later = c.client(0, "carol", "c1");
    carol_later.register_device().await.unwrap();
    alice.create_conversation(Some("ac"), "direct", &["alice", "carol"]).await.unwrap();
    for k in 0..20 {
        alice.send(&format!("b{k}"), "ab", &json!(k)).await.unwrap();
        alice.send(&format!("c{k}"), "ac", &json!(k)).await.unwrap();
    }
    eventually(Duration::from_secs(10), "bob received his 20", || async { (bob.ids().len() == 20).then_some(()) })
        .await;
    let pattern = format!("{}:m:*", c.prefix);
    assert!(!keys_matching(&c, &pattern).await.is_empty(), "frames are stored while they serve delivery");
    eventually(Duration::from_secs(10), "no frame left in Redis", || {
        let (c, pattern) = (&c, pattern.clone());
        async move { keys_matching(c, &pattern).await.is_empty().then_some(()) }
    })
    .await;
    // carol was offline: her backlog's frames are gone from Redis, and still arrive.
    let carol = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("carol", "c1"), "carol", "c1").await;
    eventually(Duration::from_secs(10), "carol's backlog from MySQL", || async {
        (carol.ids().len() == 20).then_some(())
    })
    .await;
    bob.stop().await;
    carol.stop().await;
}

/// SENT outbox rows are purged as fast as they are made: 1 000 a second for a minute,
/// with a retention of one second, leave the table near its retention's worth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_purge_keeps_up_with_a_thousand_batches_a_second() {
    let mut c = Cluster::new("purge");
    c.set("HERALD_OUTBOX__SENT_RETENTION_S", "1").set("HERALD_OUTBOX__FIXED_DELAY_MS", "500");
    c.start_worker(&[]).await;
    let db = c.db().await;
    let started = Instant::now();
    let mut made = 0u64;
    let mut largest = 0i64;
    while started.elapsed() < Duration::from_secs(60) {
        let now = now_ms() as i64;
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO outbox_events (kind, payload, status, retry_count, next_retry_at, created_at, updated_at) ",
        );
        q.push_values(0..100, |mut b, _| {
            b.push_bind("fanout")
                .push_bind("{\"ids\":[]}")
                .push_bind("SENT")
                .push_bind(0)
                .push_bind(now)
                .push_bind(now)
                .push_bind(now);
        });
        q.build().execute(&db).await.unwrap();
        made += 100;
        // 100 rows every 100 ms: 1 000 a second.
        let due = started + Duration::from_millis(made);
        tokio::time::sleep_until(due.into()).await;
        if made.is_multiple_of(5_000) {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events").fetch_one(&db).await.unwrap();
            largest = largest.max(n);
        }
    }
    assert!(made >= 55_000, "{made} rows made");
    // Retention 1 s + a round of 0.5 s + some slack: a few seconds' worth, not a minute's.
    assert!(largest < 6_000, "the table held {largest} rows at most");
    eventually(Duration::from_secs(10), "every SENT row purged", || {
        let db = db.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events").fetch_one(&db).await.unwrap();
            (n == 0).then_some(())
        }
    })
    .await;
}

/// A device unseen for the device TTL is expired: its Redis state goes and fan-out stops
/// adding to it. When it returns it catches up on what it missed, from MySQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_device_gets_no_fan_out_and_catches_up_when_it_returns() {
    let mut c = Cluster::new("devttl");
    c.set("HERALD_DELIVERY__DEVICE_TTL_S", "60").set("HERALD_WORKER__JANITOR_INTERVAL_MS", "200");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let phone = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "old"), "bob", "old").await;
    phone.stop().await;
    let first = alice.send("m1", "ab", &json!("before")).await.unwrap();
    let (redis, keys) = (c.redis().await, c.keys());
    eventually(Duration::from_secs(5), "pending for the offline device", || {
        let (redis, keys) = (redis.clone(), keys.clone());
        async move { (pending_ids(&redis, &keys, "bob", "old").await.len() == 1).then_some(()) }
    })
    .await;
    // Two minutes pass for this device.
    let db = c.db().await;
    sqlx::query("UPDATE devices SET last_seen_at = ? WHERE device_id = 'old'")
        .bind(now_ms() as i64 - 120_000)
        .execute(&db)
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the janitor expired it and freed its pending set", || {
        let (redis, keys, db) = (redis.clone(), keys.clone(), db.clone());
        async move {
            let expired: Option<i64> = sqlx::query_scalar("SELECT expired_at FROM devices WHERE device_id = 'old'")
                .fetch_one(&db)
                .await
                .unwrap();
            (expired.is_some() && pending_ids(&redis, &keys, "bob", "old").await.is_empty()).then_some(())
        }
    })
    .await;
    let second = alice.send("m2", "ab", &json!("while away")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(pending_ids(&redis, &keys, "bob", "old").await.is_empty(), "no fan-out to an expired device");
    // It returns: both messages arrive.
    let phone = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "old"), "bob", "old").await;
    eventually(Duration::from_secs(10), "the returning device catches up", || async {
        let ids = phone.ids();
        (ids.contains(&first.id.0) && ids.contains(&second.id.0)).then_some(())
    })
    .await;
    phone.stop().await;
}

/// `DELETE /v1/devices/me` frees everything at once and closes the device's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_out_device_frees_everything_at_once() {
    let mut c = Cluster::new("logout");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let online = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    alice.send("m1", "ab", &json!(1)).await.unwrap();
    eventually(Duration::from_secs(5), "delivered", || async { (online.ids().len() == 1).then_some(()) }).await;
    c.client(0, "bob", "b1").logout().await.expect("logged out");
    eventually(Duration::from_secs(5), "its session closed with 4002", || async {
        (*online.closed.lock().unwrap() == Some(Some(4002))).then_some(())
    })
    .await;
    let prefix = format!("{}:{{{TENANT}:bob}}", c.prefix);
    let redis = c.redis().await;
    let presence: Option<String> =
        fred::interfaces::HashesInterface::hget(&redis, format!("{prefix}:presence"), "b1").await.unwrap();
    assert_eq!(presence, None);
    let pending: i64 = redis.exists(format!("{prefix}:pend:b1")).await.unwrap();
    assert_eq!(pending, 0);
    let db = c.db().await;
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM devices WHERE device_id = 'b1'").fetch_one(&db).await.unwrap();
    assert_eq!(n, 0, "no longer a fan-out target");
    alice.send("m2", "ab", &json!(2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pending: i64 = redis.exists(format!("{prefix}:pend:b1")).await.unwrap();
    assert_eq!(pending, 0, "nothing queued for a logged-out device");
    online.stop().await;
}

/// Messages past their tenant's retention are deleted; the history then starts after
/// them (`joined_seq`), and other tenants keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_past_their_retention_are_deleted() {
    let mut c = Cluster::new("retention");
    c.set("HERALD_WORKER__RETENTION_OVERRIDES", "short=1").set("HERALD_WORKER__JANITOR_INTERVAL_MS", "200");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let short = c.client_in(0, "short", "alice", "a1");
    short.create_conversation(Some("s"), "group", &["alice"]).await.unwrap();
    let keep = c.client_in(0, "keep", "alice", "a1");
    keep.create_conversation(Some("k"), "group", &["alice"]).await.unwrap();
    for k in 0..3 {
        short.send(&format!("s{k}"), "s", &json!(k)).await.unwrap();
        keep.send(&format!("k{k}"), "k", &json!(k)).await.unwrap();
    }
    // Two days pass for the first two messages of each tenant: ids are time.
    let db = c.db().await;
    let old = herald_shared::ids::MsgId::lowest_at(now_ms() - 2 * 86_400_000).0;
    for conv in ["s", "k"] {
        for seq in 1..=2u64 {
            sqlx::query("UPDATE messages SET id = ? WHERE conv_id = ? AND seq = ?")
                .bind(old + seq * 4096 + u64::from(conv == "k"))
                .bind(conv)
                .bind(seq)
                .execute(&db)
                .await
                .unwrap();
        }
    }
    eventually(Duration::from_secs(10), "the short tenant's old messages deleted", || {
        let db = db.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE tenant_id = 'short'")
                .fetch_one(&db)
                .await
                .unwrap();
            (n == 1).then_some(())
        }
    })
    .await;
    let kept: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE tenant_id = 'keep'").fetch_one(&db).await.unwrap();
    assert_eq!(kept, 3, "another tenant keeps its messages");
    let page: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/v1/conversations/s/messages", c.gateways[0].base_url()))
        .bearer_auth(herald_client::token(
            herald_tests::SECRET,
            "short",
            "alice",
            "a1",
            herald_shared::auth::Platform::Web,
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["joined_seq"], 2, "the timeline starts after what retention removed");
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
}

/// Idle sessions cost almost no MySQL writes: a watermark is written when it moved, at
/// most every `gateway.watermark_flush_ms`. 2 000 idle sessions over 20 s: before, a row
/// each every 5 s (400 rows/s); now, none (the first report comes after 5 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_cost_almost_no_mysql_writes() {
    let mut c = Cluster::new("idlewrites");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__ADMISSION_RATE", "20000"),
        ("HERALD_GATEWAY__ADMISSION_BURST", "20000"),
        ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP", "10000"),
    ])
    .await;
    let base = c.gateways[0].base_url();
    let mut sessions = Vec::new();
    for k in 0..2_000 {
        let token = c.token(&format!("u{}", k / 4), &format!("d{k}"));
        let mut ws = herald_client::WsClient::connect(&base, &token).await.unwrap();
        ws.next_of::<Hello>(Duration::from_secs(10)).await.unwrap();
        sessions.push(ws);
    }
    let admin = c.gateways[0].admin_url();
    let before = metric(&admin, "herald_watermark_rows_total").await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let rows = metric(&admin, "herald_watermark_rows_total").await - before;
    // At 10 000 sessions that would be under 100 writes a second.
    assert!(rows / 20.0 < 20.0, "{rows} watermark rows in 20 s from 2 000 idle sessions");
    drop(sessions);
}

/// An HTTP request whose body never comes whole is answered `bad_request` after
/// `gateway.request_timeout_ms` and its connection freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_body_never_arrives_is_cut_off() {
    let mut c = Cluster::new("slowbody");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__REQUEST_TIMEOUT_MS", "7000")]).await;
    let mut tcp = tokio::net::TcpStream::connect(c.gateways[0].listen()).await.unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"cmid\":",
        c.token("alice", "a1")
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut answer)).await.expect("answered").unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("not received in time"), "{text}");
    assert!(started.elapsed() >= Duration::from_secs(6), "after the deadline");
}

/// A MySQL statement running past `mysql_statement_timeout_ms` is aborted by the server.
#[tokio::test]
async fn a_statement_past_its_timeout_is_aborted() {
    let base = std::env::var("IT_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
    let pool = herald_shared::db::pool(&format!("{base}/mysql"), 1, Some(Duration::from_millis(300))).unwrap();
    let started = Instant::now();
    let r: Result<i64, _> = sqlx::query_scalar("SELECT SLEEP(3)").fetch_one(&pool).await;
    assert!(started.elapsed() < Duration::from_secs(2), "cut off after {:?}: {r:?}", started.elapsed());
    // MariaDB aborts with an error; MySQL's max_execution_time ends the SLEEP with 1.
    assert!(matches!(r, Err(_) | Ok(1)), "{r:?}");
}
