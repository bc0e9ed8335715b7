//! The durable send path end to end: real gateway and worker processes, real MariaDB
//! and Redis, HTTP clients.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use herald_shared::protocol::SendResult;
use herald_tests::drill::metric;
use herald_tests::{eventually, pending_ids, Cluster, TENANT};
use serde_json::json;
use sqlx::Row;

const USERS: usize = 25;
const CONVS: usize = 20;

fn user(i: usize) -> String {
    format!("u{i:02}")
}

/// Conversation k's members: users k, k+4, ..., k+16 (mod 25); every user is in some.
fn members_of(k: usize) -> Vec<String> {
    (0..5).map(|j| user((k + 4 * j) % USERS)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sends_with_repeats_commit_exactly_once_and_fan_out() {
    let mut c = Cluster::new("concurrent");
    c.start_worker(&[]).await;
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;

    for k in 0..CONVS {
        let m = members_of(k);
        let refs: Vec<&str> = m.iter().map(String::as_str).collect();
        let (status, _) =
            c.client(0, &m[0], "d0").create_conversation(Some(&format!("g{k}")), "group", &refs).await.unwrap();
        assert_eq!(status, 201);
    }
    // 50 devices: two per user; each registers, then sends 200 times (20% repeats).
    let mut senders = Vec::new();
    for u in 0..USERS {
        for d in 0..2 {
            senders.push((user(u), format!("d{d}")));
        }
    }
    for (u, d) in &senders {
        c.client(0, u, d).register_device().await.unwrap();
    }
    let convs_of: Arc<HashMap<String, Vec<String>>> = Arc::new(
        (0..USERS)
            .map(|u| {
                (user(u), (0..CONVS).filter(|k| members_of(*k).contains(&user(u))).map(|k| format!("g{k}")).collect())
            })
            .collect(),
    );
    let mut tasks = Vec::new();
    for (i, (u, d)) in senders.iter().enumerate() {
        let client = c.client(i % 2, u, d);
        let (u, convs_of) = (u.clone(), convs_of.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng_state: u64 = 0x9e37_79b9_7f4a_7c15 ^ i as u64;
            let mut next = move || {
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 7;
                rng_state ^= rng_state << 17;
                rng_state
            };
            let convs = &convs_of[&u];
            // (cmid, conv, answer, was it a repeat)
            let mut log: Vec<(String, String, SendResult, bool)> = Vec::new();
            let mut bodies: Vec<serde_json::Value> = Vec::new();
            for n in 0..200 {
                let repeat = n > 0 && next() % 5 == 0;
                // A repeat is the same request again: its cmid, conversation and body.
                let (cmid, conv, body) = if repeat {
                    let k = (next() % log.len() as u64) as usize;
                    let (cmid, conv, _, _) = &log[k];
                    (cmid.clone(), conv.clone(), bodies[k].clone())
                } else {
                    (format!("{i}-{n}"), convs[(next() % convs.len() as u64) as usize].clone(), json!({"n": n}))
                };
                let r = client.send_until_committed(&cmid, &conv, &body, 20).await.expect("send commits");
                log.push((cmid, conv, r, repeat));
                bodies.push(body);
            }
            (i, log)
        }));
    }
    let mut first: HashMap<(usize, String), SendResult> = HashMap::new();
    let mut repeats = Vec::new();
    for t in tasks {
        let (i, log) = t.await.unwrap();
        for (cmid, _, r, repeat) in log {
            if repeat {
                repeats.push(((i, cmid), r));
            } else {
                first.insert((i, cmid), r);
            }
        }
    }
    assert!(repeats.len() > 1_500, "about 20% repeats expected, got {}", repeats.len());
    for (key, r) in &repeats {
        let f = &first[key];
        assert!(r.dup, "a repeat of {key:?} was not answered with dup: true");
        assert_eq!((r.id, r.seq), (f.id, f.seq), "a repeat of {key:?} got another id/seq");
    }
    // Batches are inserted without looking for repeats first; the unique key found them.
    let rerun = metric(&c.workers[0].admin_url(), "herald_batches_with_repeats_total").await;
    assert!(rerun > 0.0, "no batch met a repeat by its unique key");

    let db = c.db().await;
    let total: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&db).await.unwrap();
    assert_eq!(total as usize, first.len(), "the database holds exactly the unique messages");
    for row in sqlx::query("SELECT conv_id, COUNT(*), MIN(seq), MAX(seq) FROM messages GROUP BY conv_id")
        .fetch_all(&db)
        .await
        .unwrap()
    {
        let (count, min, max): (i64, u64, u64) = (row.get(1), row.get(2), row.get(3));
        assert_eq!((min, max), (1, count as u64), "seq of a conversation is 1..N without gaps");
    }
    let (convs_last,): (i64,) =
        sqlx::query_as("SELECT CAST(SUM(last_seq) AS SIGNED) FROM conversations").fetch_one(&db).await.unwrap();
    assert_eq!(convs_last, total, "conversations.last_seq matches the messages");

    // Every committed message is pending on every member device but the sender's.
    let rows = sqlx::query("SELECT id, conv_id, sender_id, sender_device FROM messages").fetch_all(&db).await.unwrap();
    let mut expected: BTreeMap<(String, String), BTreeSet<u64>> = BTreeMap::new();
    for r in &rows {
        let id: u64 = r.get(0);
        let conv = String::from_utf8(r.get::<Vec<u8>, _>(1)).unwrap();
        let (sender, sdev) =
            (String::from_utf8(r.get::<Vec<u8>, _>(2)).unwrap(), String::from_utf8(r.get::<Vec<u8>, _>(3)).unwrap());
        let k: usize = conv[1..].parse().unwrap();
        for m in members_of(k) {
            for d in ["d0", "d1"] {
                if !(m == sender && d == sdev) {
                    expected.entry((m.clone(), d.to_string())).or_default().insert(id);
                }
            }
        }
    }
    let redis = c.redis().await;
    let keys = c.keys();
    for ((u, d), want) in &expected {
        let got = eventually(Duration::from_secs(20), "pending sets match the committed messages", || {
            let (redis, keys) = (redis.clone(), keys.clone());
            async move {
                let got = pending_ids(&redis, &keys, u, d).await;
                (got == *want).then_some(got)
            }
        })
        .await;
        assert_eq!(got.len(), want.len());
    }
}

/// HTTP/1.1 pipelining: 100 sends written back to back on one connection before any
/// answer is read. Their `seq` must follow the order they were written in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_sends_of_one_device_get_increasing_seq() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut c = Cluster::new("order");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "carol"]).await.unwrap();
    // Another member sends concurrently, so seq is shared and batches interleave.
    let bob = c.client(0, "bob", "b1");
    let noise = tokio::spawn(async move {
        for n in 0..100 {
            bob.send_until_committed(&format!("b{n}"), "g", &json!({}), 20).await.unwrap();
        }
    });

    let token = c.token("alice", "a1");
    let mut requests = Vec::new();
    for n in 0..100 {
        let body = json!({"cmid": format!("a{n}"), "conv": "g", "body": {"n": n}}).to_string();
        requests.extend_from_slice(
            format!(
                "POST /v1/messages HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    }
    let mut conn = tokio::net::TcpStream::connect(c.gateways[0].listen()).await.unwrap();
    conn.write_all(&requests).await.unwrap();
    let mut seqs = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 65536];
    while seqs.len() < 100 {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut chunk))
            .await
            .expect("answers arrive")
            .unwrap();
        assert!(n > 0, "connection closed after {} answers", seqs.len());
        buf.extend_from_slice(&chunk[..n]);
        // Each answer: headers, blank line, a JSON body of content-length bytes.
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .expect("content-length")
                .trim()
                .parse()
                .unwrap();
            if buf.len() < end + 4 + len {
                break;
            }
            let v: serde_json::Value = serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap();
            seqs.push(v["seq"].as_u64().unwrap());
            buf.drain(..end + 4 + len);
        }
    }
    noise.await.unwrap();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seq must increase in send order: {seqs:?}");
}

/// SIGKILL one of two workers during a stream of sends. The survivor takes over its
/// shards and pending entries; clients resend unconfirmed sends with the same cmid.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_sigkill_mid_stream_loses_and_doubles_nothing() {
    let mut c = Cluster::new("wkkill");
    c.set("HERALD_WORKER__LEASE_TTL_MS", "1500")
        .set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "2000")
        .set("HERALD_OUTBOX__FIXED_DELAY_MS", "200")
        .set("HERALD_OUTBOX__FIRST_RETRY_DELAY_MS", "1000");
    c.start_worker(&[]).await;
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let members = ["u0", "u1", "u2", "u3", "u4"];
    for k in 0..10 {
        c.client(0, "u0", "d0").create_conversation(Some(&format!("g{k}")), "group", &members).await.unwrap();
    }
    for u in members {
        for d in ["d0", "d1"] {
            c.client(0, u, d).register_device().await.unwrap();
        }
    }
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, u) in members.iter().enumerate() {
        for d in ["d0", "d1"] {
            let client = c.client(0, u, d);
            let acked = acked.clone();
            let tag = format!("{u}{d}");
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                for n in 0..150 {
                    let conv = format!("g{}", (n + i) % 10);
                    let cmid = format!("{tag}-{n}");
                    let r = client
                        .send_until_committed(&cmid, &conv, &json!({"n": n}), 100)
                        .await
                        .expect("committed eventually");
                    acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    out.push((cmid, r));
                }
                out
            }));
        }
    }
    eventually(Duration::from_secs(30), "a third of the sends acknowledged", || {
        let acked = acked.clone();
        async move { (acked.load(std::sync::atomic::Ordering::Relaxed) >= 500).then_some(()) }
    })
    .await;
    c.workers[0].kill().await;
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    assert_eq!(answers.len(), 1500);

    let db = c.db().await;
    for (cmid, r) in &answers {
        let rows = sqlx::query("SELECT id, seq FROM messages WHERE tenant_id = ? AND client_msg_id = ?")
            .bind(TENANT)
            .bind(cmid)
            .fetch_all(&db)
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "acknowledged {cmid} exists exactly once");
        assert_eq!(
            (rows[0].get::<u64, _>(0), rows[0].get::<u64, _>(1)),
            (r.id.0, r.seq),
            "{cmid} stored as acknowledged"
        );
    }
    let total: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&db).await.unwrap();
    assert_eq!(total, 1500);
    for row in
        sqlx::query("SELECT conv_id, COUNT(*), MAX(seq) FROM messages GROUP BY conv_id").fetch_all(&db).await.unwrap()
    {
        assert_eq!(row.get::<i64, _>(1) as u64, row.get::<u64, _>(2), "no seq gap");
    }
    // Every committed message reaches every other device, including batches whose
    // worker died between COMMIT and fan-out (the outbox redoes them).
    let ids: Vec<(u64, String, String)> = sqlx::query("SELECT id, sender_id, sender_device FROM messages")
        .fetch_all(&db)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get(0),
                String::from_utf8(r.get::<Vec<u8>, _>(1)).unwrap(),
                String::from_utf8(r.get::<Vec<u8>, _>(2)).unwrap(),
            )
        })
        .collect();
    let redis = c.redis().await;
    let keys = c.keys();
    for u in members {
        for d in ["d0", "d1"] {
            let want: BTreeSet<u64> =
                ids.iter().filter(|(_, su, sd)| !(su == u && sd == d)).map(|(id, _, _)| *id).collect();
            eventually(Duration::from_secs(30), "every committed message is pending on every other device", || {
                let (redis, keys, want) = (redis.clone(), keys.clone(), want.clone());
                async move { (pending_ids(&redis, &keys, u, d).await == want).then_some(()) }
            })
            .await;
        }
    }
}

/// Twenty copies of one send at once (most land in one batch): one message, one
/// `dup: false`, every answer the same id and seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_repeats_of_one_cmid_make_one_message() {
    let mut c = Cluster::new("samecmid");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let alice = alice.clone();
        tasks.push(tokio::spawn(async move { alice.send("same", "ab", &json!({"text": "once"})).await.unwrap() }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert_eq!(answers.iter().filter(|r| !r.dup).count(), 1, "exactly one first commit: {answers:?}");
    assert!(answers.iter().all(|r| (r.id, r.seq) == (answers[0].id, 1)), "{answers:?}");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&c.db().await).await.unwrap();
    assert_eq!(n, 1);
}
