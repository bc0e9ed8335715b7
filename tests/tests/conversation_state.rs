//! Conversation state: read receipts, unread counts, membership, projections.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use herald_shared::protocol::{ClientFrame, ReadFrame, ServerFrame};
use herald_tests::{eventually, AutoDevice, Cluster, TENANT};
use serde_json::json;
use sqlx::Row;

async fn read_seq(c: &Cluster, user: &str, conv: &str) -> u64 {
    sqlx::query_scalar("SELECT read_seq FROM members WHERE tenant_id = ? AND conv_id = ? AND user_id = ?")
        .bind(TENANT)
        .bind(conv)
        .bind(user)
        .fetch_one(&c.db().await)
        .await
        .unwrap()
}

async fn http_read(c: &Cluster, user: &str, device: &str, conv: &str, seq: u64) -> (u16, serde_json::Value) {
    let body = json!({ "seq": seq }).to_string().into_bytes();
    c.client(0, user, device).post_raw(&format!("/v1/conversations/{conv}/read"), body).await.unwrap()
}

fn reads_of(d: &AutoDevice) -> Vec<(String, String, u64)> {
    d.others
        .lock()
        .unwrap()
        .iter()
        .filter_map(|f| match f {
            ServerFrame::Read(r) => Some((r.conv.clone(), r.user.clone(), r.seq)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_positions_only_move_forward_and_reach_the_other_devices() {
    let mut c = Cluster::new("reads");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();
    let bob = c.client(0, "bob", "b0");
    bob.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "alice", "a3").register_device().await.unwrap();
    for n in 0..10 {
        bob.send(&format!("m{n}"), "ab", &json!({"n": n})).await.unwrap();
    }
    let a1 = AutoDevice::connect(&base, &c.token("alice", "a1"), "alice", "a1").await;
    let a2 = AutoDevice::connect(&base, &c.token("alice", "a2"), "alice", "a2").await;
    let b1 = AutoDevice::connect(&base, &c.token("bob", "b1"), "bob", "b1").await;

    // Higher first, then lower: the lower one changes nothing.
    a1.send_frame(ClientFrame::Read(ReadFrame { conv: "ab".into(), seq: 7 })).await;
    a1.send_frame(ClientFrame::Read(ReadFrame { conv: "ab".into(), seq: 3 })).await;
    let db = c.db().await;
    eventually(Duration::from_secs(10), "the WebSocket reads are applied", || {
        let db = db.clone();
        async move {
            let r: u64 = sqlx::query_scalar("SELECT read_seq FROM members WHERE conv_id = 'ab' AND user_id = 'alice'")
                .fetch_one(&db)
                .await
                .ok()?;
            (r == 7).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(read_seq(&c, "alice", "ab").await, 7, "the lower read moved nothing");
    let (status, body) = http_read(&c, "alice", "a1", "ab", 5).await;
    assert_eq!((status, body["read_seq"].as_u64()), (200, Some(7)), "{body}");
    assert_eq!(read_seq(&c, "alice", "ab").await, 7);
    // Beyond last_seq: clamped to it.
    let (_, body) = http_read(&c, "alice", "a1", "ab", 99).await;
    assert_eq!(body["read_seq"], 10);

    for d in [&a2, &b1] {
        let others = d.others.clone();
        let name = format!("{}/{}", d.user, d.device);
        eventually(Duration::from_secs(10), "read frames reach the other devices", || {
            let last = others.lock().unwrap().iter().rev().find_map(|f| match f {
                ServerFrame::Read(r) => Some(r.seq),
                _ => None,
            });
            async move { (last == Some(10)).then_some(()) }
        })
        .await;
        let seqs: Vec<u64> = reads_of(d).iter().map(|r| r.2).collect();
        assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "{name} saw the position go back: {seqs:?}");
        assert!(!seqs.contains(&3) && !seqs.contains(&5), "{name} saw a position that never was: {seqs:?}");
    }
    assert!(reads_of(&a1).is_empty(), "the reading device gets no echo");

    // The offline device gets the final position on connect, once, not the steps.
    let a3 = AutoDevice::connect(&base, &c.token("alice", "a3"), "alice", "a3").await;
    let others = a3.others.clone();
    eventually(Duration::from_secs(10), "the offline device gets the final position", || {
        let n = others.lock().unwrap().iter().filter(|f| matches!(f, ServerFrame::Read(_))).count();
        async move { (n > 0).then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(reads_of(&a3), vec![("ab".to_string(), "alice".to_string(), 10)]);
    // Confirmed by the pong: a reconnect does not get it again.
    a3.stop().await;
    let key = c.keys().reads(TENANT, "alice", "a3");
    let redis = c.redis().await;
    eventually(Duration::from_secs(30), "the confirmed position leaves Redis", || {
        let (redis, key) = (redis.clone(), key.clone());
        async move {
            let left: HashMap<String, u64> = fred::prelude::HashesInterface::hgetall(&redis, key).await.ok()?;
            left.is_empty().then_some(())
        }
    })
    .await;

    let list = c.client(0, "alice", "a1").list_conversations(50, None).await.unwrap();
    assert_eq!((list["items"][0]["read_seq"].as_u64(), list["items"][0]["unread"].as_u64()), (Some(10), Some(0)));
    let list = c.client(0, "bob", "b0").list_conversations(50, None).await.unwrap();
    assert_eq!(list["items"][0]["unread"], 10);
    for d in [a1, a2, b1] {
        d.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unread_counts_stay_exact_through_interleaved_sends_and_reads() {
    let mut c = Cluster::new("unread");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let users: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
    // 30 conversations of 3 members each.
    let mut members: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in 0..30 {
        let m: Vec<String> = (0..3).map(|j| users[(k + j * 3) % 10].clone()).collect();
        let refs: Vec<&str> = m.iter().map(String::as_str).collect();
        c.client(0, &m[0], "d").create_conversation(Some(&format!("c{k}")), "group", &refs).await.unwrap();
        members.insert(format!("c{k}"), m);
    }
    let members = std::sync::Arc::new(members);
    let mut tasks = Vec::new();
    for (i, u) in users.iter().enumerate() {
        let (client, u, members) = (c.client(0, u, "d"), u.clone(), members.clone());
        let gw = c.gateways[0].base_url();
        let token = c.token(&u, "d");
        tasks.push(tokio::spawn(async move {
            let mine: Vec<String> = members.iter().filter(|(_, m)| m.contains(&u)).map(|(k, _)| k.clone()).collect();
            let reader = herald_client::HttpClient::new(gw, token);
            // (conv, highest seq this user asked to read)
            let mut reads: HashMap<String, u64> = HashMap::new();
            for n in 0..40u64 {
                let conv = &mine[(n as usize * 7 + i) % mine.len()];
                let sent = client.send_until_committed(&format!("{u}-{n}"), conv, &json!({}), 20).await.unwrap();
                if n % 3 == 0 {
                    let seq = sent.seq.saturating_sub(n % 2);
                    let (status, _) = reader
                        .post_raw(
                            &format!("/v1/conversations/{conv}/read"),
                            json!({"seq": seq}).to_string().into_bytes(),
                        )
                        .await
                        .unwrap();
                    assert_eq!(status, 200);
                    let r = reads.entry(conv.clone()).or_default();
                    *r = (*r).max(seq);
                }
            }
            (u, reads)
        }));
    }
    let mut model: HashMap<(String, String), u64> = HashMap::new();
    for t in tasks {
        let (u, reads) = t.await.unwrap();
        for (conv, seq) in reads {
            model.insert((u.clone(), conv), seq);
        }
    }
    let db = c.db().await;
    let last: HashMap<String, u64> = sqlx::query("SELECT conv_id, COUNT(*) FROM messages GROUP BY conv_id")
        .fetch_all(&db)
        .await
        .unwrap()
        .iter()
        .map(|r| (String::from_utf8(r.get::<Vec<u8>, _>(0)).unwrap(), r.get::<i64, _>(1) as u64))
        .collect();
    for u in &users {
        let list = c.client(0, u, "d").list_conversations(200, None).await.unwrap();
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), members.values().filter(|m| m.contains(u)).count());
        for item in items {
            let conv = item["id"].as_str().unwrap().to_string();
            let last_seq = last.get(&conv).copied().unwrap_or(0);
            let read = model.get(&(u.clone(), conv.clone())).copied().unwrap_or(0);
            assert_eq!(item["last_seq"].as_u64(), Some(last_seq), "{u} {conv}");
            assert_eq!(item["unread"].as_u64(), Some(last_seq - read), "{u} {conv}: unread");
        }
        // Most recently active first (commit time, millisecond resolution).
        let ts: Vec<u64> = items.iter().map(|i| i["last_message"]["ts"].as_u64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] >= w[1]), "{u}'s list is not most recent first: {ts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiners_see_only_later_messages_and_removed_members_nothing_more() {
    let mut c = Cluster::new("members");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let base = c.gateways[0].base_url();
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&base, &c.token("bob", "b1"), "bob", "b1").await;
    for n in 0..50 {
        alice.send_until_committed(&format!("m{n}"), "g", &json!({}), 20).await.unwrap();
    }
    alice.change_members("g", &["carol"], &[]).await.unwrap();
    let carol = AutoDevice::connect(&base, &c.token("carol", "c1"), "carol", "c1").await;
    for n in 50..60 {
        alice.send_until_committed(&format!("m{n}"), "g", &json!({}), 20).await.unwrap();
    }
    // Carol's join is seq 51 (a timeline event): she gets it and what follows.
    let received = carol.received.clone();
    eventually(Duration::from_secs(10), "carol gets 51..61", || {
        let seqs: Vec<u64> = received.lock().unwrap().iter().map(|r| r.1).collect();
        async move { (seqs.len() >= 11).then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seqs: Vec<u64> = carol.received.lock().unwrap().iter().map(|r| r.1).collect();
    assert_eq!(seqs, (51..=61).collect::<Vec<u64>>());

    // bob removed by the event at seq 62: his send is refused, he receives that event
    // and nothing later.
    alice.change_members("g", &[], &["bob"]).await.unwrap();
    let e = c.client(0, "bob", "b1").send("late", "g", &json!({})).await.unwrap_err();
    assert_eq!(e.code(), Some(herald_shared::error::ErrorCode::Forbidden));
    for n in 60..65 {
        alice.send_until_committed(&format!("m{n}"), "g", &json!({}), 20).await.unwrap();
    }
    let received = carol.received.clone();
    eventually(Duration::from_secs(10), "carol gets the later ones", || {
        let n = received.lock().unwrap().len();
        async move { (n >= 17).then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bob_max = bob.received.lock().unwrap().iter().map(|r| r.1).max();
    assert_eq!(bob_max, Some(62), "bob receives his removal and nothing after it");
    assert!(pending_is_empty(&c, "bob", "b1").await);
    carol.stop().await;
    bob.stop().await;
}

async fn pending_is_empty(c: &Cluster, user: &str, device: &str) -> bool {
    let redis = c.redis().await;
    herald_tests::pending_ids(&redis, &c.keys(), user, device).await.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_projections_reports_and_repairs_drift() {
    let mut c = Cluster::new("projections");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("ok"), "direct", &["alice", "carol"]).await.unwrap();
    let mut last = None;
    for n in 0..5 {
        last = Some(alice.send(&format!("m{n}"), "ab", &json!({})).await.unwrap());
        alice.send(&format!("o{n}"), "ok", &json!({})).await.unwrap();
    }
    let db = c.db().await;
    // Drift: last_seq behind (the next send would collide), last message lost, a read
    // position past the end.
    sqlx::query("UPDATE conversations SET last_seq = 2, last_msg_id = NULL WHERE id = 'ab'")
        .execute(&db)
        .await
        .unwrap();
    sqlx::query("UPDATE members SET read_seq = 100 WHERE conv_id = 'ok' AND user_id = 'carol'")
        .execute(&db)
        .await
        .unwrap();

    let run = |dry: bool| {
        let mut cmd = std::process::Command::new(herald_tests::bin("herald-worker"));
        cmd.arg("rebuild-projections")
            .env("HERALD_MYSQL_URL", &c.mysql_url)
            .env("HERALD_JWT_SECRET", herald_tests::SECRET);
        if dry {
            cmd.arg("--dry-run");
        }
        cmd.output().unwrap()
    };
    let out = run(true);
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("acme/ab: last_seq 2 -> 5"), "{text}");
    assert!(text.contains("1 drifted, 1 read positions clamped (dry run"), "{text}");
    let (seq,): (u64,) =
        sqlx::query_as("SELECT last_seq FROM conversations WHERE id = 'ab'").fetch_one(&db).await.unwrap();
    assert_eq!(seq, 2, "a dry run changes nothing");

    let out = run(false);
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success() && text.contains("repaired"), "{text}");
    let row =
        sqlx::query("SELECT last_seq, last_msg_id FROM conversations WHERE id = 'ab'").fetch_one(&db).await.unwrap();
    assert_eq!((row.get::<u64, _>(0), row.get::<Option<u64>, _>(1)), (5, Some(last.unwrap().id.0)));
    assert_eq!(read_seq(&c, "carol", "ok").await, 5);
    let again = run(true);
    assert!(String::from_utf8_lossy(&again.stderr).contains("0 drifted, 0 read positions clamped"));
    // And the conversation takes messages again.
    let next = alice.send("m5", "ab", &json!({})).await.unwrap();
    assert_eq!(next.seq, 6);
}

/// Keyset paging of the conversation list: while messages arrive, no conversation that
/// did not change is repeated or skipped; one that changed moves to the front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_paging_stays_consistent_while_messages_arrive() {
    let mut c = Cluster::new("paging");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    for k in 0..30 {
        alice.create_conversation(Some(&format!("c{k:02}")), "direct", &["alice", &format!("p{k}")]).await.unwrap();
        alice.send(&format!("m{k}"), &format!("c{k:02}"), &json!({})).await.unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let page1 = alice.list_conversations(10, None).await.unwrap();
    let ids = |p: &serde_json::Value| {
        p["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    let first = ids(&page1);
    assert_eq!(first[0], "c29", "most recent first");
    // A conversation further down gets a message: it jumps to the front.
    alice.send("bump", "c05", &json!({})).await.unwrap();
    let page2 = alice.list_conversations(10, page1["next_cursor"].as_str()).await.unwrap();
    let page3 = alice.list_conversations(10, page2["next_cursor"].as_str()).await.unwrap();
    assert!(page3.get("next_cursor").is_none() || ids(&page3).len() < 10);
    let mut seen: Vec<String> = first.clone();
    seen.extend(ids(&page2));
    seen.extend(ids(&page3));
    let unique: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no conversation twice: {seen:?}");
    assert_eq!(seen.len(), 29, "all but the bumped one, which moved to the front");
    assert!(!seen.contains(&"c05".to_string()));
    let fresh = alice.list_conversations(10, None).await.unwrap();
    assert_eq!(ids(&fresh)[0], "c05");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_outside_the_users_conversations_is_refused() {
    let mut c = Cluster::new("reads-refused");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let bob = c.client(0, "bob", "b0");
    bob.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    bob.send("m0", "ab", &json!({})).await.unwrap();
    let (status, body) = http_read(&c, "carol", "c1", "ab", 1).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");
    let (status, body) = http_read(&c, "carol", "c1", "nowhere", 1).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{body}");
    let (status, _) = http_read(&c, "alice", "a1", "ab", 1).await;
    assert_eq!(status, 200);
}
