//! A client key (`cmid`) names one request (docs/protocol.md section 4.2): the same key
//! with the same request answers the first commit (`dup`), the same key with another
//! operation, target, conversation or body is a `conflict` (409) and changes nothing,
//! and a recall or edit keyed `K` is never taken for a message once sent as `K#2`.

use herald_client::ClientError;
use herald_shared::error::ErrorCode;
use herald_tests::Cluster;
use serde_json::{json, Value};

async fn cluster(name: &str) -> Cluster {
    let mut c = Cluster::new(name);
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c
}

fn conflict<T: std::fmt::Debug>(what: &str, r: Result<T, ClientError>) {
    match r {
        Err(ClientError::Api { status: 409, code: ErrorCode::Conflict, .. }) => {}
        other => panic!("{what}: want 409 conflict, got {other:?}"),
    }
}

/// Bob's history of `conv`: (seq, body, event type) of each item.
async fn history(c: &Cluster, conv: &str) -> Vec<(u64, Value, Value)> {
    let (status, page) = c.client(0, "bob", "h").get_raw(&format!("/v1/conversations/{conv}/messages")).await.unwrap();
    assert_eq!(status, 200, "{page}");
    let items = page["items"].as_array().unwrap();
    items.iter().map(|m| (m["seq"].as_u64().unwrap(), m["body"].clone(), m["event"]["type"].clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_for_another_request_is_a_conflict_and_changes_nothing() {
    let c = cluster("keys-reuse").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("h"), "group", &["alice", "bob"]).await.unwrap();
    let m1 = alice.send("m1", "g", &json!({"text": "one"})).await.unwrap();
    let m2 = alice.send("m2", "g", &json!({"text": "two"})).await.unwrap();

    let edit = alice.edit(m1.id, "k", &json!({"text": "one!"})).await.unwrap();
    assert_eq!((edit.seq, edit.dup), (3, false));
    conflict("a recall of another message under an edit's key", alice.recall(m2.id, "k").await);
    conflict("an edit of another message under the key", alice.edit(m2.id, "k", &json!({"text": "one!"})).await);
    conflict("the same edit with another body", alice.edit(m1.id, "k", &json!({"text": "ONE"})).await);
    conflict("a send under a change's key", alice.send("k", "g", &json!({"text": "new"})).await);
    let again = alice.edit(m1.id, "k", &json!({"text": "one!"})).await.unwrap();
    assert_eq!((again.id, again.seq, again.dup), (edit.id, 3, true), "the same request answers its first commit");

    // A send's key: the same body again is a repeat, another body or conversation is not.
    conflict("a send with another body", alice.send("m1", "g", &json!({"text": "uno"})).await);
    conflict("a send to another conversation", alice.send("m1", "h", &json!({"text": "one"})).await);
    let resent = alice.send("m1", "g", &json!({"text": "one"})).await.unwrap();
    assert_eq!((resent.id, resent.dup), (m1.id, true));
    // A recall's key is the recall's.
    let recall = alice.recall(m2.id, "r").await.unwrap();
    conflict("an edit under a recall's key", alice.edit(m1.id, "r", &json!({"text": "x"})).await);
    assert_eq!(alice.recall(m2.id, "r").await.unwrap().id, recall.id);

    // Nothing refused was committed: m2 was recalled once, by `r`, and m1 reads as edited.
    let h = history(&c, "g").await;
    let seqs: Vec<u64> = h.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "{h:?}");
    assert_eq!(h[0].1, json!({"text": "one!"}), "{h:?}");
    assert_eq!((&h[1].1, &h[3].2), (&Value::Null, &json!("recalled")), "{h:?}");
    assert!(history(&c, "h").await.is_empty(), "nothing reached the other conversation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_key_is_not_taken_for_a_message_sent_as_key_hash_2() {
    let c = cluster("keys-suffix").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let m1 = alice.send("K#2", "g", &json!({"text": "one"})).await.unwrap();
    alice.send("E#3", "g", &json!({"text": "two"})).await.unwrap();
    // `K` and `E` were never used: the recall and the edit commit.
    let recall = alice.recall(m1.id, "K").await.unwrap();
    assert_eq!((recall.seq, recall.dup), (3, false));
    let m3 = alice.send("m3", "g", &json!({"text": "three"})).await.unwrap();
    let edit = alice.edit(m3.id, "E", &json!({"text": "3"})).await.unwrap();
    assert_eq!((edit.seq, edit.dup), (5, false));
    let h = history(&c, "g").await;
    assert_eq!((&h[0].1, &h[2].2, &h[4].2), (&Value::Null, &json!("recalled"), &json!("edited")), "{h:?}");
}
