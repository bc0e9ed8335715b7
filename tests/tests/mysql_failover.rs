//! MySQL failover (docs/operations.md, "MySQL replication"): with semi-synchronous
//! replication a promoted replica holds every commit Herald acknowledged; with
//! asynchronous replication it may not, and a conversation's `last_seq` goes back, which
//! Herald detects and moves past instead of reusing seqs that devices already show.

use std::collections::BTreeMap;
use std::time::Duration;

use herald_tests::drill::{drill_cluster, metric, Drill, Traffic};
use herald_tests::replication::SemiSyncPair;
use herald_tests::{eventually, AutoDevice, Cluster};
use serde_json::json;

/// As in `drills.rs`: generous for a loaded 2-core machine.
const CATCH_UP_BOUND: Duration = Duration::from_secs(30);

/// The primary is SIGKILLed under traffic, the semi-synchronous replica promoted and
/// Herald pointed at it (every process restarted with the new URL, gateways on their
/// addresses): nothing acknowledged is lost, nothing shown twice, and no
/// conversation's seqs went back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_failover_to_a_semi_synchronous_replica() {
    let mut pair = SemiSyncPair::start().await;
    let mut c = drill_cluster("drill-mysqlfailover", None);
    c.mysql_url = format!("{}/{}", pair.primary.base_url(), c.db_name);
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    let urls: Vec<String> = c.gateways.iter().map(|g| g.base_url()).collect();
    let mut d =
        Drill::start("mysql_failover_to_a_semi_synchronous_replica", urls.clone(), urls, Traffic::default()).await;
    d.traffic(Duration::from_secs(3)).await;
    let (waited, fell_back) = pair.semi_sync_commits().await;
    assert!(waited > 0, "the primary waited for the replica's acknowledgement");
    assert_eq!(fell_back, 0, "the primary never fell back to asynchronous replication");
    d.note("MySQL primary SIGKILLed under traffic");
    pair.primary.kill().await;
    pair.promote().await;
    d.note("replica promoted; Herald restarted against it");
    c.mysql_url = format!("{}/{}", pair.replica.base_url(), c.db_name);
    c.workers[0].kill().await;
    let worker = c.start_worker(&[]).await;
    for i in 0..2 {
        // Killed: a drain would wait on requests held up by the dead primary.
        c.gateways[i].kill().await;
        c.respawn_gateway(i).await;
    }
    d.catch_up(CATCH_UP_BOUND).await;
    d.traffic(Duration::from_secs(2)).await;
    d.finish().await.assert_clean();
    let rollbacks = metric(&c.workers[worker].admin_url(), "herald_seq_rollbacks_total").await;
    assert_eq!(rollbacks, 0.0, "with semi-synchronous replication no conversation's seqs went back");
}

/// What an asynchronous replica promoted too early looks like: the last two messages of
/// a conversation, already on its devices, are gone from MySQL and `last_seq` is back
/// at 3. The worker, restarted against it (nothing in its memory), numbers the next
/// message past what devices hold (from Redis), and reports the conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_whose_seqs_went_back_is_numbered_past_what_devices_hold() {
    let mut c = Cluster::new("seqback");
    c.set("HERALD_WORKER__LEASE_TTL_MS", "1500");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("dm"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    let mut sent = Vec::new();
    for n in 0..5 {
        sent.push(alice.send_until_committed(&format!("m{n}"), "dm", &json!({"n": n}), 20).await.unwrap());
    }
    assert_eq!(sent.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    let want: std::collections::BTreeSet<u64> = sent.iter().map(|r| r.id.0).collect();
    eventually(Duration::from_secs(20), "bob has all five", || async { want.is_subset(&bob.ids()).then_some(()) })
        .await;

    let db = c.db().await;
    sqlx::query("DELETE FROM messages WHERE conv_id = 'dm' AND seq > 3").execute(&db).await.unwrap();
    sqlx::query("UPDATE conversations SET last_seq = 3, last_msg_id = ? WHERE id = 'dm'")
        .bind(sent[2].id.0)
        .execute(&db)
        .await
        .unwrap();
    c.workers[0].kill().await;
    let worker = c.start_worker(&[]).await;

    let after = alice.send_until_committed("after", "dm", &json!({"n": "after"}), 20).await.unwrap();
    assert!(after.seq > 5, "seq {} is one bob already shows as another message", after.seq);
    eventually(Duration::from_secs(20), "bob gets the new message", || async {
        bob.ids().contains(&after.id.0).then_some(())
    })
    .await;
    let mut by_seq: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for (_, seq, id) in bob.received.lock().unwrap().iter() {
        by_seq.entry(*seq).or_default().insert(*id);
    }
    assert!(by_seq.values().all(|ids| ids.len() == 1), "one message per seq on bob's device: {by_seq:?}");
    bob.stop().await;
    let admin = c.workers[worker].admin_url();
    assert!(metric(&admin, "herald_seq_rollbacks_total").await >= 1.0, "the rollback was counted");
    let log = std::fs::read_to_string(c.log_dir.join(format!("{}.log", c.workers[worker].name))).unwrap();
    let line = log.lines().find(|l| l.contains("last_seq is below")).expect("the rollback is logged");
    let line = without_colours(line);
    assert!(line.contains("conv=\"dm\"") && line.contains("last_seq=3") && line.contains("seen=5"), "{line}");
}

/// A log line without its terminal colour codes (`ESC [ ... m`).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(ch);
        }
    }
    out
}
