//! Timeline changes under faults (issue 18, feature 4): a change whose answer timed
//! out is committed once, however often it is retried with its key; a worker killed
//! while changes and sends wait loses none of them and repeats none, and the devices
//! see one gap-free timeline.

use std::collections::BTreeMap;
use std::time::Duration;

use herald_client::ClientError;
use herald_shared::error::ErrorCode;
use herald_tests::{eventually, AutoDevice, Cluster};
use serde_json::json;

fn unavailable<T: std::fmt::Debug>(r: &Result<T, ClientError>) -> bool {
    matches!(r, Err(e) if e.code() == Some(ErrorCode::Unavailable))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_whose_answer_timed_out_is_committed_once_when_retried_with_its_key() {
    let mut c = Cluster::new("tl-timeout");
    c.set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "1000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let m1 = alice.send("m1", "g", &json!({"text": "helo"})).await.unwrap();

    // No worker: the edit waits in the stream and its answer times out.
    c.workers[0].kill().await;
    let first = alice.edit(m1.id, "e1", &json!({"text": "hello"})).await;
    assert!(unavailable(&first), "{first:?}");
    let again = alice.edit(m1.id, "e1", &json!({"text": "hello"})).await;
    assert!(unavailable(&again), "{again:?}");
    c.start_worker(&[]).await;
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;

    // The retry with the same key gets the one commit, whichever entry made it.
    let committed = eventually(Duration::from_secs(20), "the edit is committed", || async {
        alice.edit(m1.id, "e1", &json!({"text": "hello"})).await.ok()
    })
    .await;
    assert_eq!((committed.seq, committed.dup), (2, true), "{committed:?}");
    let db = c.db().await;
    let rows: Vec<(u64, u64)> =
        sqlx::query_as("SELECT id, seq FROM messages WHERE event IS NOT NULL").fetch_all(&db).await.unwrap();
    assert_eq!(rows, [(committed.id.0, 2)], "three tries, one edit");
    eventually(Duration::from_secs(10), "bob's device gets the edit", || async {
        (bob.events("g").len() == 1).then_some(())
    })
    .await;
    let body: String = sqlx::query_scalar("SELECT CAST(body AS CHAR) FROM messages WHERE id = ?")
        .bind(m1.id.0)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(body, r#"{"text":"hello"}"#);
    bob.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_changes_wait_loses_none_and_repeats_none() {
    let mut c = Cluster::new("tl-kill");
    c.set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "1500");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;

    // Messages and title changes, one after another, each retried until answered (a
    // send with its cmid; a title change again, which changes nothing the second time).
    // The worker is killed in the middle and a new one started a moment later.
    let mut killed = false;
    for i in 0..12 {
        if i == 6 {
            c.workers[0].kill().await;
            killed = true;
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let r = if i % 2 == 0 {
                alice.send(&format!("m{i}"), "g", &json!({"text": i})).await.map(drop)
            } else {
                alice.change_title("g", Some(&format!("title {i}"))).await.map(drop)
            };
            match r {
                Ok(()) => break,
                Err(e) if e.code() == Some(ErrorCode::Unavailable) => {
                    if killed && c.workers.len() == 1 {
                        c.start_worker(&[]).await;
                    }
                    assert!(tries < 20, "step {i} never committed");
                }
                Err(e) => panic!("step {i}: {e}"),
            }
        }
    }
    let db = c.db().await;
    let rows: Vec<(u64, Option<String>)> =
        sqlx::query_as("SELECT seq, CAST(event AS CHAR) FROM messages WHERE conv_id = 'g' ORDER BY seq")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), (1..=12).collect::<Vec<u64>>(), "gap-free, no repeats");
    let titles: Vec<String> = rows.iter().filter_map(|r| r.1.clone()).collect();
    assert_eq!(titles.len(), 6, "every title change once: {titles:?}");
    let title: String = sqlx::query_scalar("SELECT CAST(title AS CHAR) FROM conversations WHERE id = 'g'")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(title, "title 11");

    // Bob's device got all twelve, each seq once (repeats are dropped by id).
    eventually(Duration::from_secs(20), "bob receives all twelve", || async {
        let got: BTreeMap<u64, u64> = bob.received.lock().unwrap().iter().map(|(_, s, id)| (*s, *id)).collect();
        (got.len() == 12).then_some(())
    })
    .await;
    let mut ids_by_seq: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for (_, seq, id) in bob.received.lock().unwrap().iter() {
        ids_by_seq.entry(*seq).or_default().insert(*id);
    }
    assert!(ids_by_seq.values().all(|ids| ids.len() == 1), "one message per seq: {ids_by_seq:?}");
    bob.stop().await;
}
