//! The outbox under a Redis outage: a private redis-server is killed between a batch's
//! COMMIT and its fan-out, so the fan-out must fail and be retried with backoff.
//!
//! To make "between COMMIT and fan-out" deterministic, the test holds the
//! conversation's row lock; the worker's batch waits on it; Redis is killed; the lock
//! is released; the worker commits and its fan-out meets a dead Redis.

use std::future::Future;
use std::time::Duration;

use herald_tests::{eventually, pending_ids, Cluster, RedisServer, ADMIN_TOKEN, TENANT};
use serde_json::json;
use sqlx::mysql::MySqlPool;
use sqlx::{Connection, Row};

async fn outbox_row(db: &MySqlPool, message: u64) -> Option<(u64, String, u32, i64, i64)> {
    let rows = sqlx::query("SELECT id, status, retry_count, next_retry_at, updated_at, payload FROM outbox_events")
        .fetch_all(db)
        .await
        .ok()?;
    rows.iter()
        .find(|r| String::from_utf8(r.get::<Vec<u8>, _>(5)).unwrap().contains(&message.to_string()))
        .map(|r| (r.get(0), String::from_utf8(r.get::<Vec<u8>, _>(1)).unwrap(), r.get(2), r.get(3), r.get(4)))
}

fn futures_now<T>(h: &mut tokio::task::JoinHandle<T>) -> T {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match std::pin::Pin::new(h).poll(&mut cx) {
        std::task::Poll::Ready(v) => v.expect("task"),
        std::task::Poll::Pending => unreachable!("finished"),
    }
}

/// Sends one message while Redis dies between its COMMIT and its fan-out; returns its id.
async fn send_across_redis_death(c: &Cluster, redis: &mut RedisServer, cmid: &str) -> u64 {
    let db = c.db().await;
    let mut lock = sqlx::MySqlConnection::connect(&c.mysql_url).await.unwrap();
    let mut tx = lock.begin().await.unwrap();
    sqlx::query("SELECT last_seq FROM conversations WHERE tenant_id = ? AND id = 'ab' FOR UPDATE")
        .bind(TENANT)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let alice = c.client(0, "alice", "a1");
    let cmid_owned = cmid.to_string();
    let send = tokio::spawn(async move { alice.send(&cmid_owned, "ab", &json!({"text": "through the outage"})).await });
    let mut send = send;
    eventually(Duration::from_secs(20), "the worker's batch waits on the row lock", || {
        let db = db.clone();
        if send.is_finished() {
            let answer = futures_now(&mut send);
            panic!("the send was answered while its conversation was locked: {answer:?}");
        }
        async move {
            // The wait may sit in the optimizer's const-row read ("Statistics"), which
            // innodb_trx does not report as LOCK WAIT; the process list shows it.
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() AND info LIKE '%FROM conversations%FOR UPDATE%' AND id <> CONNECTION_ID()",
            )
            .fetch_one(&db)
            .await
            .ok()?;
            (waiting > 0).then_some(())
        }
    })
    .await;
    redis.kill();
    tx.commit().await.unwrap();
    // The answer never comes (Redis is gone): the client is told to retry.
    let answer = send.await.unwrap();
    assert!(answer.is_err(), "no answer can be published without Redis: {answer:?}");
    let id: u64 = sqlx::query_scalar("SELECT id FROM messages WHERE tenant_id = ? AND client_msg_id = ?")
        .bind(TENANT)
        .bind(cmid)
        .fetch_one(&db)
        .await
        .unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_during_fanout_retries_with_backoff_goes_dead_and_admin_retry_delivers() {
    let mut redis = RedisServer::start().await;
    let mut c = Cluster::with_redis("outbox", redis.url());
    c.set("HERALD_OUTBOX__BACKOFF_MS", "700,900,1100")
        .set("HERALD_OUTBOX__MAX_ATTEMPTS", "3")
        .set("HERALD_OUTBOX__FIXED_DELAY_MS", "100")
        .set("HERALD_OUTBOX__FIRST_RETRY_DELAY_MS", "2000")
        .set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "3000")
        .set("HERALD_WORKER__LEASE_TTL_MS", "1500");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_device().await.unwrap();
    let db = c.db().await;

    // 1. Redis dies after COMMIT: FAILED with the first backoff, then SENT once it is back.
    let first = send_across_redis_death(&c, &mut redis, "m1").await;
    let (_, status, retries, next, updated) = eventually(Duration::from_secs(10), "the outbox row is FAILED", || {
        let db = db.clone();
        async move { outbox_row(&db, first).await.filter(|r| r.1 == "FAILED") }
    })
    .await;
    assert_eq!(status, "FAILED");
    assert!(retries >= 1);
    let delay = next - updated;
    assert!([700, 900, 1100].contains(&delay), "the backoff is the configured one, got {delay} ms");
    redis.restart().await;
    eventually(Duration::from_secs(20), "the outbox row is SENT after Redis is back", || {
        let db = db.clone();
        async move { outbox_row(&db, first).await.filter(|r| r.1 == "SENT") }
    })
    .await;
    let r = c.redis().await;
    assert!(pending_ids(&r, &c.keys(), "bob", "b1").await.contains(&first), "bob's device has the message pending");
    let frame: Option<String> =
        fred::prelude::KeysInterface::get(&r, c.keys().message(herald_shared::ids::MsgId(first))).await.unwrap();
    assert!(frame.unwrap().contains("through the outage"));
    assert!(!pending_ids(&r, &c.keys(), "alice", "a1").await.contains(&first), "never on the sender's device");

    // 2. Redis stays down: every retry fails until the row is DEAD.
    eventually(Duration::from_secs(30), "the worker is back in service", || {
        let alice = c.client(0, "alice", "a1");
        async move { alice.send("warmup", "ab", &json!({})).await.ok() }
    })
    .await;
    let second = send_across_redis_death(&c, &mut redis, "m2").await;
    let (event, status, retries, _, _) = eventually(Duration::from_secs(30), "the outbox row is DEAD", || {
        let db = db.clone();
        async move { outbox_row(&db, second).await.filter(|r| r.1 == "DEAD") }
    })
    .await;
    assert_eq!((status.as_str(), retries), ("DEAD", 4), "the first attempt and three retries failed");

    // 3. The operator sees it, and its retry delivers it once Redis is back.
    let admin = c.admin(0);
    assert_eq!(admin.get("/admin/outbox?status=DEAD", None).await.0, 401, "admin API needs its token");
    assert_eq!(admin.get("/admin/outbox?status=DEAD", Some("wrong")).await.0, 401);
    let (code, list) = admin.get("/admin/outbox?status=DEAD", Some(ADMIN_TOKEN)).await;
    assert_eq!(code, 200);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], event);
    assert_eq!(items[0]["message_ids"][0], second.to_string());
    redis.restart().await;
    let (code, body) = admin.post(&format!("/admin/outbox/{event}/retry"), Some(ADMIN_TOKEN)).await;
    assert_eq!(code, 200, "{body}");
    eventually(Duration::from_secs(20), "the retried event is SENT", || {
        let db = db.clone();
        async move { outbox_row(&db, second).await.filter(|r| r.1 == "SENT") }
    })
    .await;
    let r = c.redis().await;
    assert!(
        pending_ids(&r, &c.keys(), "bob", "b1").await.contains(&second),
        "the retried message reached bob's device"
    );
    // Only DEAD events can be discarded; a SENT one is refused.
    let (code, body) = admin.post(&format!("/admin/outbox/{event}/discard"), Some(ADMIN_TOKEN)).await;
    assert_eq!((code, body["error"]["code"].as_str()), (409, Some("conflict")));
    let (code, _) = admin.post("/admin/outbox/999999/retry", Some(ADMIN_TOKEN)).await;
    assert_eq!(code, 409);
}

/// A dispatcher that died after claiming an event leaves it SENDING; once the claim is
/// older than `sending_stale_ms` another dispatcher takes it and fans it out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_sending_events_are_reclaimed() {
    let mut c = Cluster::new("reclaim");
    c.set("HERALD_OUTBOX__FIXED_DELAY_MS", "100").set("HERALD_OUTBOX__SENDING_STALE_MS", "1500");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_device().await.unwrap();
    let sent = alice.send("m1", "ab", &json!({"text": "again"})).await.unwrap();
    let db = c.db().await;
    let (event, ..) = eventually(Duration::from_secs(10), "the event is SENT", || {
        let db = db.clone();
        async move { outbox_row(&db, sent.id.0).await.filter(|r| r.1 == "SENT") }
    })
    .await;

    // Simulate a dispatcher that claimed the event just now and died before finishing;
    // Redis lost the set, and with it the mark of the first fan-out having finished
    // (a finished fan-out is not redone: acked ids never come back).
    let redis = c.redis().await;
    let keys = c.keys();
    let gone = vec![keys.pending(TENANT, "bob", "b1"), keys.fanned_out(event)];
    let _: i64 = fred::prelude::KeysInterface::del(&redis, gone).await.unwrap();
    let claimed = herald_shared::ids::now_ms() as i64;
    sqlx::query("UPDATE outbox_events SET status = 'SENDING', claimed_at = ? WHERE id = ?")
        .bind(claimed)
        .bind(event)
        .execute(&db)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(outbox_row(&db, sent.id.0).await.unwrap().1, "SENDING", "a fresh claim is left alone");
    eventually(Duration::from_secs(10), "the stale claim is redone", || {
        let (db, redis, keys) = (db.clone(), redis.clone(), keys.clone());
        async move {
            let row = outbox_row(&db, sent.id.0).await?;
            let pending = pending_ids(&redis, &keys, "bob", "b1").await;
            (row.1 == "SENT" && pending.contains(&sent.id.0)).then_some(())
        }
    })
    .await;
    let redone: i64 = sqlx::query_scalar("SELECT updated_at FROM outbox_events WHERE id = ?")
        .bind(event)
        .fetch_one(&db)
        .await
        .unwrap();
    assert!(redone - claimed >= 1_500, "reclaimed only after sending_stale_ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_outbox_rows_are_purged_after_retention() {
    let mut c = Cluster::new("purge");
    c.set("HERALD_OUTBOX__FIXED_DELAY_MS", "100").set("HERALD_OUTBOX__SENT_RETENTION_S", "1");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    for n in 0..5 {
        alice.send(&format!("m{n}"), "ab", &json!({})).await.unwrap();
    }
    let db = c.db().await;
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events").fetch_one(&db).await.unwrap();
    assert!(rows >= 1, "the batches left outbox rows");
    eventually(Duration::from_secs(15), "SENT rows older than the retention are purged", || {
        let db = db.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events").fetch_one(&db).await.ok()?;
            (n == 0).then_some(())
        }
    })
    .await;
    let messages: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&db).await.unwrap();
    assert_eq!(messages, 5, "purging the outbox touches no message");
}

/// The SENT marks of fan-outs that finish within `outbox.sent_mark_linger_ms` of each
/// other share one UPDATE (and one fsync), instead of one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_marks_within_the_linger_share_one_update() {
    let mut c = Cluster::new("sentlinger");
    c.set("HERALD_OUTBOX__SENT_MARK_LINGER_MS", "2000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    // One after another, each answered before the next: a commit, an outbox row and a
    // fan-out each.
    for n in 0..4 {
        alice.send(&format!("m{n}"), "ab", &json!({})).await.unwrap();
    }
    let db = c.db().await;
    let marked = eventually(Duration::from_secs(10), "every outbox row is SENT", || {
        let db = db.clone();
        async move {
            let rows: Vec<(String, i64)> = sqlx::query_as("SELECT CAST(status AS CHAR), updated_at FROM outbox_events")
                .fetch_all(&db)
                .await
                .ok()?;
            rows.iter().all(|(status, _)| status == "SENT").then_some(rows)
        }
    })
    .await;
    assert_eq!(marked.len(), 4, "one outbox row per commit");
    let updates: std::collections::BTreeSet<i64> = marked.iter().map(|(_, at)| *at).collect();
    assert_eq!(updates.len(), 1, "the four marks were written by one UPDATE: {marked:?}");
}
