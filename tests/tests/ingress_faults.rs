//! What a worker does when MySQL refuses or delays a batch: a message the database
//! will not store is isolated and refused while the rest of its batch commits in order;
//! a shard whose commits are stuck shows it in its backlog gauges; a database that may
//! lose commits is reported.

use std::time::Duration;

use herald_shared::error::ErrorCode;
use herald_shared::protocol::ServerFrame;
use herald_tests::drill::metric;
use herald_tests::faults::MariaDb;
use herald_tests::{eventually, AutoDevice, Cluster, TENANT};
use serde_json::json;

/// A batch holding one message MySQL refuses (here a trigger refuses its body): that
/// message alone is refused with `bad_request`, every other one commits, in send order,
/// and the shard goes on. Before: the batch was retried forever and every send in it,
/// and after it, waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_database_refuses_is_refused_alone_and_the_shard_goes_on() {
    let mut c = Cluster::new("poison");
    c.set("HERALD_INGRESS__SHARDS", "1");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let db = c.db().await;
    sqlx::raw_sql(
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON messages FOR EACH ROW BEGIN \
         IF NEW.body LIKE '%\"poison\"%' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF; END",
    )
    .execute(&db)
    .await
    .unwrap();
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();

    let dev = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("alice", "a1"), "alice", "a1").await;
    for k in 0..10 {
        let body = if k == 4 { json!("poison") } else { json!({ "k": k }) };
        dev.send(&format!("m{k}"), "ab", body).await;
    }
    let refused = eventually(Duration::from_secs(20), "nine sent and one refused", || async {
        let sent = dev.sent.lock().unwrap().len();
        let refused = dev.others.lock().unwrap().iter().find_map(|f| match f {
            ServerFrame::Error(e) if e.reference.as_deref() == Some("m4") => Some(e.clone()),
            _ => None,
        });
        refused.filter(|_| sent == 9)
    })
    .await;
    assert_eq!(refused.code, ErrorCode::BadRequest, "{refused:?}");
    let sent = dev.sent.lock().unwrap().clone();
    let seqs: Vec<u64> = [0, 1, 2, 3, 5, 6, 7, 8, 9].iter().map(|k| sent[&format!("m{k}")].1).collect();
    assert_eq!(seqs, (1..=9).collect::<Vec<_>>(), "the others commit in send order");
    let after = alice.send("later", "ab", &json!("still going")).await.unwrap();
    assert_eq!(after.seq, 10, "the shard goes on");
    assert!(metric(&c.workers[0].admin_url(), "herald_ingress_poison_total").await >= 1.0);
    dev.stop().await;
}

/// A shard whose commit waits (a conversation row locked elsewhere) shows its backlog:
/// the gauges of its stream length and oldest entry age rise, reported by the
/// balancer, not by the stuck consumer; they fall once it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_shard_shows_in_its_backlog_gauges() {
    let mut c = Cluster::new("stuckshard");
    c.set("HERALD_INGRESS__SHARDS", "1").set("HERALD_WORKER__LEASE_TTL_MS", "1500");
    c.set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "30000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let db = c.db().await;
    let mut lock = db.begin().await.unwrap();
    sqlx::query("SELECT id FROM conversations WHERE tenant_id = ? AND id = 'ab' FOR UPDATE")
        .bind(TENANT)
        .fetch_one(&mut *lock)
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { alice.send("m1", "ab", &json!("held")).await });
    let admin = c.workers[0].admin_url();
    eventually(Duration::from_secs(15), "the shard's oldest entry is seconds old", || {
        let admin = admin.clone();
        async move {
            let (len, age) = (
                metric(&admin, "herald_ingress_stream_length").await,
                metric(&admin, "herald_ingress_oldest_age_seconds").await,
            );
            (len >= 1.0 && age >= 2.0).then_some(())
        }
    })
    .await;
    lock.rollback().await.unwrap();
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(r.seq, 1);
    eventually(Duration::from_secs(10), "the backlog gauges fall back", || {
        let admin = admin.clone();
        async move { (metric(&admin, "herald_ingress_stream_length").await == 0.0).then_some(()) }
    })
    .await;
}

/// A MySQL that acknowledges commits before they are on disk is reported at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_may_lose_commits_is_reported() {
    let db = MariaDb::start().await;
    let admin = sqlx::MySqlPool::connect(&db.base_url()).await.unwrap();
    sqlx::query("SET GLOBAL innodb_flush_log_at_trx_commit = 2").execute(&admin).await.unwrap();
    let mut c = Cluster::new("durability");
    c.mysql_url = format!("{}/{}", db.base_url(), c.db_name);
    c.start_worker(&[]).await;
    let url = c.workers[0].admin_url();
    eventually(Duration::from_secs(10), "herald_mysql_durable is 0", || {
        let url = url.clone();
        async move { metric_present(&url, "herald_mysql_durable 0").await.then_some(()) }
    })
    .await;
    let log = std::fs::read_to_string(c.log_dir.join(format!("{}.log", c.workers[0].name))).unwrap();
    assert!(log.contains("innodb_flush_log_at_trx_commit is 2"), "the log names the setting");
}

async fn metric_present(admin: &str, line: &str) -> bool {
    let text = reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap();
    text.lines().any(|l| l == line)
}

/// A worker whose shard was taken over (here: the shard's fencing token bumped behind
/// its back, as a new owner does) commits nothing more with its old token: its commit
/// is refused, it gives the shard up, takes it again with a new token and commits the
/// waiting send once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_shard_was_taken_over_commits_nothing_with_its_old_token() {
    let mut c = Cluster::new("fencing");
    c.set("HERALD_INGRESS__SHARDS", "1").set("HERALD_WORKER__LEASE_TTL_MS", "1500");
    c.set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "30000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    assert_eq!(alice.send("m1", "ab", &json!(1)).await.unwrap().seq, 1);
    let db = c.db().await;
    let token: u64 = sqlx::query_scalar("SELECT token FROM shard_fences WHERE shard = 0").fetch_one(&db).await.unwrap();
    sqlx::query("UPDATE shard_fences SET token = token + 1 WHERE shard = 0").execute(&db).await.unwrap();
    let r = alice.send("m2", "ab", &json!(2)).await.unwrap();
    assert_eq!((r.seq, r.dup), (2, false), "committed once, after the worker took the shard again");
    let now: u64 = sqlx::query_scalar("SELECT token FROM shard_fences WHERE shard = 0").fetch_one(&db).await.unwrap();
    assert_eq!(now, token + 2, "the worker took a new token");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&db).await.unwrap();
    assert_eq!(n, 2);
    let log = std::fs::read_to_string(c.log_dir.join(format!("{}.log", c.workers[0].name))).unwrap();
    assert!(log.contains("shard taken over by another worker; stopping"), "the old token's commit was refused");
}

/// A server that refuses every write for a reason of its own (here a privilege revoked
/// from the worker's user; a read-only server, a full disk or a statement the server
/// does not know fail alike) is not the messages' fault: the sends wait, their senders
/// get `unavailable` when the send deadline passes, and a resend commits once the server
/// takes writes again, exactly once. Before: each send was refused alone as poison,
/// `bad_request`, and never stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_wait_while_the_database_refuses_writes_and_commit_once_it_takes_them() {
    let server = MariaDb::start().await;
    let mut c = Cluster::new("refusedwrites");
    c.mysql_url = format!("{}/{}", server.base_url(), c.db_name);
    herald_shared::db::migrate(&c.mysql_url).await.unwrap();
    let root = sqlx::MySqlPool::connect(&c.mysql_url).await.unwrap();
    // The worker's own user, with privileges per table: a table privilege revoked takes
    // effect at its connections' next statement.
    sqlx::raw_sql("CREATE USER 'herald'@'%'").execute(&root).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables WHERE table_schema = DATABASE()",
    )
    .fetch_all(&root)
    .await
    .unwrap();
    for t in &tables {
        let grant = format!("GRANT SELECT, INSERT, UPDATE, DELETE ON `{}`.`{t}` TO 'herald'@'%'", c.db_name);
        sqlx::raw_sql(&grant).execute(&root).await.unwrap();
    }
    let worker_url = format!("mysql://herald@127.0.0.1:{}/{}", server.port, c.db_name);
    c.set("HERALD_INGRESS__SHARDS", "1").set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "3000");
    c.start_gateway(&[]).await;
    c.start_worker(&[("HERALD_MYSQL_URL", worker_url.as_str()), ("HERALD_WORKER__MIGRATE_ON_START", "false")]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    assert_eq!(alice.send("m1", "ab", &json!(1)).await.unwrap().seq, 1);

    let on_messages = format!("`{}`.`messages`", c.db_name);
    sqlx::raw_sql(&format!("REVOKE INSERT ON {on_messages} FROM 'herald'@'%'")).execute(&root).await.unwrap();
    let refused = alice.send("m2", "ab", &json!(2)).await.unwrap_err();
    assert!(
        matches!(refused, herald_client::ClientError::Api { code: ErrorCode::Unavailable, .. }),
        "answered unavailable at the send deadline, not refused: {refused:?}"
    );
    let admin = c.workers[0].admin_url();
    assert!(metric(&admin, "herald_mysql_refusals_total").await >= 1.0, "the refusals are counted for the alert");
    assert_eq!(metric(&admin, "herald_ingress_poison_total").await, 0.0, "nothing was taken for poison");

    sqlx::raw_sql(&format!("GRANT INSERT ON {on_messages} TO 'herald'@'%'")).execute(&root).await.unwrap();
    let r = alice.send_until_committed("m2", "ab", &json!(2), 5).await.unwrap();
    assert_eq!(r.seq, 2, "committed once the server took writes again");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&root).await.unwrap();
    assert_eq!(n, 2, "m2 stored once, the resend answered with it");
    let log = std::fs::read_to_string(c.log_dir.join(format!("{}.log", c.workers[0].name))).unwrap();
    assert!(log.contains("MySQL refuses commits for a reason that is not the messages'"), "logged for operators");
}

/// A worker whose `worker.batch_max_bytes` a statement cannot carry under the server's
/// `max_allowed_packet` refuses to start, saying which settings to change. Before: it
/// started, and its first full batch was cut off by the server and retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_a_batch_size_the_servers_packet_cannot_carry() {
    let server = MariaDb::start_with(&["--max-allowed-packet=1M"]).await;
    let mut c = Cluster::new("packetcheck");
    c.mysql_url = format!("{}/{}", server.base_url(), c.db_name);
    let log = c.try_start_worker(&[]).await.expect_err("the default 4 MiB of batch does not fit in 1 MiB");
    assert!(
        log.contains("worker.batch_max_bytes (4194304)") && log.contains("max_allowed_packet (1048576)"),
        "the refusal names both settings:\n{log}"
    );
    c.start_worker(&[("HERALD_WORKER__BATCH_MAX_BYTES", "1000000")]).await;
}

/// Bodies go to MySQL hex-encoded, twice their size: batches are sized by the bytes of
/// their statements, so one of many large messages still fits in `max_allowed_packet`.
/// Before: batches were sized by their bodies alone, a batch of 900 KB of bodies was a
/// 1.8 MB statement, the server cut it off, and the shard retried it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_large_messages_is_sized_by_its_bytes_on_the_wire() {
    let server = MariaDb::start_with(&["--max-allowed-packet=1M"]).await;
    let mut c = Cluster::new("packetwire");
    c.mysql_url = format!("{}/{}", server.base_url(), c.db_name);
    herald_shared::db::migrate(&c.mysql_url).await.unwrap();
    c.set("HERALD_INGRESS__SHARDS", "1").set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "30000");
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    // 40 sends of 24 KB wait in the stream, so the worker reads them as one batch.
    let dev = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("alice", "a1"), "alice", "a1").await;
    for k in 0..40 {
        dev.send(&format!("m{k}"), "ab", json!("x".repeat(24_000))).await;
    }
    let db = c.db().await;
    let streams = c.redis().await;
    eventually(Duration::from_secs(10), "the 40 sends wait in the stream", || {
        let (streams, key) = (streams.clone(), c.keys().ingress(0));
        async move {
            use fred::interfaces::StreamsInterface;
            (streams.xlen::<u64, _>(key).await.ok()? == 40).then_some(())
        }
    })
    .await;
    c.start_worker(&[("HERALD_WORKER__BATCH_MAX_BYTES", "900000")]).await;
    let admin = c.workers[0].admin_url();
    eventually(Duration::from_secs(30), "all 40 committed", || {
        let db = db.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&db).await.ok()?;
            (n == 40).then_some(())
        }
    })
    .await;
    let sent = dev.sent.lock().unwrap().len();
    assert!(sent <= 40);
    assert_eq!(metric(&admin, "herald_ingress_poison_total").await, 0.0, "none refused");
    let seqs: Vec<u64> =
        sqlx::query_scalar("SELECT seq FROM messages ORDER BY CAST(SUBSTRING(client_msg_id, 2) AS UNSIGNED)")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(seqs, (1..=40).collect::<Vec<u64>>(), "in send order");
    dev.stop().await;
}
