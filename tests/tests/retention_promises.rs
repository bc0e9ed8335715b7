//! What retention deletes, and what it must not break (docs/protocol.md section 4.8):
//! a message's key (`cmid`) outlives its row, so an outbox resending a deleted message
//! gets the first commit's answer instead of committing it again; and the events about
//! a deleted message (an edit carries the new text) lose their text with it.
//! Windows are shrunk as in `bounded.rs`: a tenant kept 1 day, ids moved 2 days back.

use std::time::Duration;

use herald_shared::error::ErrorCode;
use herald_shared::ids::{now_ms, MsgId};
use herald_tests::{eventually, Cluster};
use serde_json::json;
use sqlx::MySqlPool;

async fn short_retention_cluster(name: &str) -> Cluster {
    let mut c = Cluster::new(name);
    c.set("HERALD_WORKER__RETENTION_OVERRIDES", "short=1").set("HERALD_WORKER__JANITOR_INTERVAL_MS", "200");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c
}

/// Moves message `id` two days back (ids are time), and the events about it along.
async fn age(db: &MySqlPool, id: MsgId, k: u64) -> MsgId {
    let old = MsgId(MsgId::lowest_at(now_ms() - 2 * 86_400_000).0 + k * 4096);
    sqlx::query("UPDATE messages SET id = ? WHERE id = ?").bind(old.0).bind(id.0).execute(db).await.unwrap();
    sqlx::query("UPDATE messages SET event = REPLACE(event, ?, ?) WHERE event LIKE ?")
        .bind(format!("\"{}\"", id.0))
        .bind(format!("\"{}\"", old.0))
        .bind(format!("%\"{}\"%", id.0))
        .execute(db)
        .await
        .unwrap();
    old
}

async fn purged(db: &MySqlPool, id: MsgId) {
    eventually(Duration::from_secs(15), "the old message deleted by retention", || async move {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE id = ?").bind(id.0).fetch_one(db).await.unwrap();
        (n == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_resent_after_its_retention_is_still_a_repeat() {
    let c = short_retention_cluster("ret-keys").await;
    let alice = c.client_in(0, "short", "alice", "a1");
    alice.create_conversation(Some("s"), "group", &["alice"]).await.unwrap();
    alice.create_conversation(Some("t"), "group", &["alice"]).await.unwrap();
    let first = alice.send("k1", "s", &json!("sent once")).await.unwrap();
    alice.send("k2", "s", &json!("kept")).await.unwrap();
    let db = c.db().await;
    let old = age(&db, first.id, 1).await;
    purged(&db, old).await;

    // The outbox comes back online and resends k1: the first commit's answer, no new row.
    let again = alice.send("k1", "s", &json!("sent once")).await.unwrap();
    assert!(again.dup, "a repeat, not a new message: {again:?}");
    assert_eq!((again.id, again.seq), (old, first.seq), "the first commit's id and seq");
    let rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE client_msg_id = 'k1'").fetch_one(&db).await.unwrap();
    assert_eq!(rows, 0, "nothing committed again");
    let last_seq: u64 = sqlx::query_scalar("SELECT last_seq FROM conversations WHERE tenant_id = 'short' AND id = 's'")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(last_seq, 2, "no seq taken");
    // The key still names that message: for another conversation it is a conflict.
    let reused = alice.send("k1", "t", &json!("another")).await.unwrap_err();
    assert_eq!(reused.code(), Some(ErrorCode::Conflict), "{reused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_about_a_message_past_its_retention_lose_their_text_with_it() {
    let c = short_retention_cluster("ret-events").await;
    let alice = c.client_in(0, "short", "alice", "a1");
    alice.create_conversation(Some("s"), "group", &["alice", "bob"]).await.unwrap();
    let m1 = alice.send("m1", "s", &json!({"text": "secret draft"})).await.unwrap();
    let edit = alice.edit(m1.id, "e1", &json!({"text": "secret final"})).await.unwrap();
    alice.send("m3", "s", &json!({"text": "later"})).await.unwrap();
    let db = c.db().await;
    let old = age(&db, m1.id, 1).await;
    purged(&db, old).await;

    // The edit keeps its place (seq 2: no gap opens in the timeline), not its text.
    let bob = c.client_in(0, "short", "bob", "b1");
    let (status, page) = bob.get_raw("/v1/conversations/s/messages").await.unwrap();
    assert_eq!(status, 200, "{page}");
    let items = page["items"].as_array().unwrap();
    let seqs: Vec<u64> = items.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [edit.seq, 3], "{page}");
    assert_eq!((&items[0]["event"]["type"], &items[0]["body"]), (&json!("edited"), &json!(null)), "{page}");
    assert!(!page.to_string().contains("secret"), "no text of the deleted message is left: {page}");
    let left: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE tenant_id = 'short' AND body LIKE '%secret%'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(left, 0, "nowhere in the database either");
}
