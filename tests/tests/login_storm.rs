//! A first-login storm: never-seen devices connecting at once are registered in batches
//! and queue for MySQL instead of taking every pool connection, so none fails while
//! MySQL is slow, and each still gets what was committed in the minute before it
//! registered; and a session with nothing waiting takes none of the node's backlog
//! budget.

use std::time::Duration;

use herald_client::WsClient;
use herald_shared::protocol::{CaughtUp, Hello, Message};
use herald_tests::drill::metric;
use herald_tests::Cluster;
use serde_json::json;
use sqlx::Connection;

const USERS: usize = 100;
const DEVICES_PER_USER: usize = 3;

/// 300 never-seen devices connect while the `devices` table is locked for longer than
/// the pool's 5 s wait. Before, each registration took a pool connection and those past
/// the pool's wait failed (their sessions closed 1011); now they wait for the next
/// batch: every session starts, in a few batches, and gets the message committed just
/// before it registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_login_storm_waits_for_a_slow_mysql_in_batches_and_every_session_starts() {
    let mut c = Cluster::new("loginstorm");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__ADMISSION_RATE", "20000"),
        ("HERALD_GATEWAY__ADMISSION_BURST", "20000"),
        ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP", "10000"),
    ])
    .await;
    let users: Vec<String> = (0..USERS).map(|u| format!("u{u}")).collect();
    let mut members: Vec<&str> = users.iter().map(String::as_str).collect();
    members.push("alice");
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("storm"), "group", &members).await.unwrap();
    let sent = alice.send_until_committed("m1", "storm", &json!({"text": "before the storm"}), 20).await.unwrap();
    let admin = c.gateways[0].admin_url();
    let batches_before = metric(&admin, "herald_device_registration_batch_count").await;

    // MySQL stalls on the devices table: every registration waits behind the lock.
    let mut lock = sqlx::MySqlConnection::connect(&c.mysql_url).await.unwrap();
    sqlx::query("LOCK TABLES devices WRITE").execute(&mut lock).await.unwrap();
    let base = c.gateways[0].base_url();
    let sessions: Vec<_> = (0..USERS * DEVICES_PER_USER)
        .map(|k| {
            let (base, token) = (base.clone(), c.token(&users[k % USERS], &format!("d{k}")));
            tokio::spawn(async move {
                let mut ws = WsClient::connect(&base, &token).await.map_err(|e| format!("d{k}: {e}"))?;
                let hello = ws.next_of::<Hello>(Duration::from_secs(30)).await.ok_or(format!("d{k}: no hello"))?;
                let msg = ws.next_of::<Message>(Duration::from_secs(30)).await.ok_or(format!("d{k}: no message"))?;
                Ok::<_, String>((hello.pending, msg.id))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(7)).await;
    sqlx::query("UNLOCK TABLES").execute(&mut lock).await.unwrap();

    for s in sessions {
        let (pending, id) = s.await.unwrap().unwrap();
        assert_eq!(pending, 1, "hello counts the message of the minute before registering");
        assert_eq!(id, sent.id, "the message committed before the device registered");
    }
    let batches = metric(&admin, "herald_device_registration_batch_count").await - batches_before;
    let registered = metric(&admin, "herald_device_registration_batch_sum").await;
    assert!(registered >= (USERS * DEVICES_PER_USER) as f64, "{registered} devices registered in batches");
    // One batch waited on the lock; the rest queued behind it, 256 at most per batch.
    assert!(batches <= 5.0, "{batches} registration batches for a storm that queued behind one");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM devices WHERE user_id LIKE 'u%'")
        .fetch_one(&c.db().await)
        .await
        .unwrap();
    assert_eq!(rows, (USERS * DEVICES_PER_USER) as i64, "every device has its row");
}

/// The node's backlog budget pays for messages pushed, not for pages read: 60 devices
/// with nothing waiting start under a budget of 100 messages/s. Before, each start took
/// a desktop page (200) for its band and another for its pending set, whatever they
/// held: at 100/s, a session every 4 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_with_nothing_waiting_take_none_of_the_backlog_budget() {
    let mut c = Cluster::new("emptybudget");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE", "100"),
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE_FLOOR", "100"),
        ("HERALD_GATEWAY__ADMISSION_RATE", "20000"),
        ("HERALD_GATEWAY__ADMISSION_BURST", "20000"),
    ])
    .await;
    let base = c.gateways[0].base_url();
    let sessions: Vec<_> = (0..60)
        .map(|k| {
            let (base, token) = (base.clone(), c.token(&format!("e{k}"), "d"));
            tokio::spawn(async move {
                let mut ws = WsClient::connect(&base, &token).await.map_err(|e| format!("e{k}: {e}"))?;
                ws.next_of::<Hello>(Duration::from_secs(20)).await.ok_or(format!("e{k}: no hello"))?;
                ws.next_of::<CaughtUp>(Duration::from_secs(20)).await.ok_or(format!("e{k}: not caught up in 20 s"))?;
                Ok::<_, String>(ws)
            })
        })
        .collect();
    for s in sessions {
        s.await.unwrap().unwrap();
    }
}
