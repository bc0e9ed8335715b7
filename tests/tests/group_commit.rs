//! Group commit: the batches a worker's shards hold at the same moment commit in one
//! transaction, each stream's order kept; a group that fails (here: a message MySQL
//! refuses) commits batch by batch, the refused message alone refused.

use std::time::Duration;

use herald_shared::error::ErrorCode;
use herald_shared::protocol::ServerFrame;
use herald_tests::drill::metric;
use herald_tests::faults::signal;
use herald_tests::{eventually, AutoDevice, Cluster};
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
