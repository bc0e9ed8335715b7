//! Group commit: the batches a worker's shards hold at the same moment commit in one
//! transaction, each stream's order kept; a group that fails (here: a message MySQL
//! refuses) commits batch by batch, the refused message alone refused; a commit held up
//! holds up the other shards for `worker.commit_overlap_ms` only.

use std::time::Duration;

use herald_shared::error::ErrorCode;
use herald_shared::keys::shard_of;
use herald_shared::protocol::ServerFrame;
use herald_tests::drill::metric;
use herald_tests::faults::signal;
use herald_tests::{eventually, statements_waiting, AutoDevice, Cluster, TENANT};
use serde_json::json;

const CONVS: usize = 16;
const PER_CONV: usize = 10;

/// Sixteen conversations spread over eight shards fill their streams while the worker
/// is paused; when it resumes, its shards' batches commit together (the group metric
/// counts more than one batch per transaction), every conversation's messages carry
/// seq 1..n in send order, and one message the database refuses is refused alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_several_shards_commit_together_in_stream_order() {
    let mut c = Cluster::new("groupcommit");
    c.set("HERALD_INGRESS__SHARDS", "8").set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "30000");
    // One transaction at a time: the batches read while it runs wait and group up.
    c.set("HERALD_WORKER__COMMITS_IN_FLIGHT", "1");
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
    let mut senders = Vec::new();
    for k in 0..CONVS {
        let user = format!("u{k}");
        let conv = format!("c{k}");
        c.client(0, &user, "d").create_conversation(Some(&conv), "direct", &[user.as_str(), "bob"]).await.unwrap();
        let dev = AutoDevice::connect(&c.gateways[0].base_url(), &c.token(&user, "d"), &user, "d").await;
        senders.push((conv, dev));
    }
    let worker = c.workers[0].pid();
    signal(worker, "-STOP");
    for (k, (conv, dev)) in senders.iter().enumerate() {
        for i in 0..PER_CONV {
            let body = if k == 3 && i == 5 { json!("poison") } else { json!({ "i": i }) };
            dev.send(&format!("m{i}"), conv, body).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(worker, "-CONT");

    for (k, (conv, dev)) in senders.iter().enumerate() {
        let expected = if k == 3 { PER_CONV - 1 } else { PER_CONV };
        eventually(Duration::from_secs(20), "every send of the conversation answered", || async {
            (dev.sent.lock().unwrap().len() == expected).then_some(())
        })
        .await;
        let sent = dev.sent.lock().unwrap().clone();
        let seqs: Vec<u64> = (0..PER_CONV).filter(|i| !(k == 3 && *i == 5)).map(|i| sent[&format!("m{i}")].1).collect();
        assert_eq!(seqs, (1..=expected as u64).collect::<Vec<_>>(), "{conv}: seq follows send order");
        if k == 3 {
            let refused = dev.others.lock().unwrap().iter().find_map(|f| match f {
                ServerFrame::Error(e) if e.reference.as_deref() == Some("m5") => Some(e.code),
                _ => None,
            });
            assert_eq!(refused, Some(ErrorCode::BadRequest), "the refused message alone is refused");
        }
    }
    let admin = c.workers[0].admin_url();
    let (batches, transactions) = (
        metric(&admin, "herald_worker_group_batches_sum").await,
        metric(&admin, "herald_worker_group_batches_count").await,
    );
    assert!(batches > transactions, "several shards' batches shared a transaction: {batches} in {transactions}");
    for (_, dev) in senders {
        dev.stop().await;
    }
}

/// A commit held up on a conversation's row lock holds up the worker's other shards
/// for `worker.commit_overlap_ms` only: then a transaction starts beside it, and a send
/// on another shard is answered while the held one still waits. With an overlap longer
/// than the hold, that send waits for the held commit too (one transaction at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_up_commit_holds_up_the_other_shards_for_the_overlap_only() {
    for (overlap, answered_while_held) in [("200", true), ("600000", false)] {
        let mut c = Cluster::new(&format!("overlap-{overlap}"));
        c.set("HERALD_INGRESS__SHARDS", "2").set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "30000");
        c.set("HERALD_WORKER__COMMITS_IN_FLIGHT", "2").set("HERALD_WORKER__COMMIT_OVERLAP_MS", overlap);
        c.start_worker(&[]).await;
        c.start_gateway(&[]).await;
        let in_shard =
            |shard| (0..).map(|i| format!("c{i}")).find(|conv| shard_of(TENANT, conv, 2) == shard).expect("a name");
        let (held, other) = (in_shard(0), in_shard(1));
        let alice = c.client(0, "alice", "a1");
        for conv in [&held, &other] {
            alice.create_conversation(Some(conv), "direct", &["alice", "bob"]).await.unwrap();
        }

        // The held conversation's row is locked by another transaction: its send's
        // commit waits for it.
        let db = c.db().await;
        let mut holder = db.begin().await.unwrap();
        let _: u64 = sqlx::query_scalar("SELECT last_seq FROM conversations WHERE tenant_id = ? AND id = ? FOR UPDATE")
            .bind(TENANT)
            .bind(&held)
            .fetch_one(&mut *holder)
            .await
            .unwrap();
        let send = |cmid: &'static str, conv: String| {
            let alice = alice.clone();
            tokio::spawn(async move { alice.send(cmid, &conv, &json!({"text": cmid})).await })
        };
        let held_send = send("h1", held.clone());
        eventually(Duration::from_secs(15), "the held send's commit waits on the lock", || async {
            (statements_waiting(&db).await > 0).then_some(())
        })
        .await;
        let mut other_send = send("o1", other.clone());
        let early = tokio::time::timeout(Duration::from_secs(5), &mut other_send).await.ok();
        assert_eq!(
            early.is_some(),
            answered_while_held,
            "overlap {overlap} ms: the other shard's send answered while held"
        );

        holder.rollback().await.unwrap();
        let other_sent = match early {
            Some(answer) => answer,
            None => other_send.await,
        };
        for (what, answer) in [("held", held_send.await), ("other", other_sent)] {
            let sent = answer.unwrap().unwrap_or_else(|e| panic!("the {what} send is answered once free: {e}"));
            assert_eq!(sent.seq, 1, "{what}");
        }
    }
}
