//! Bad input on the send path, end to end: every malformed or oversized send gets the
//! protocol's error and nothing is stored; real gateway and worker processes, MariaDB
//! and Redis.

use herald_shared::error::ErrorCode;
use herald_tests::{Cluster, TENANT};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_protocol_errors_and_stores_nothing() {
    let mut c = Cluster::new("badinput");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__MAX_BODY_BYTES", "1024")]).await;
    let alice = c.client(0, "alice", "a1");
    let carol = c.client(0, "carol", "c1");
    assert_eq!(alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap().0, 201);
    // The same again is 200; other members is 409.
    assert_eq!(alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap().0, 200);
    let conflict = alice.create_conversation(Some("ab"), "group", &["alice", "bob", "dan"]).await.unwrap_err();
    assert_eq!(conflict.code(), Some(ErrorCode::Conflict));
    for (kind, members) in
        [("direct", vec!["alice", "bob", "dan"]), ("group", vec!["bob", "dan"]), ("chat", vec!["alice"])]
    {
        let e = alice.create_conversation(None, kind, &members).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{kind} {members:?}");
    }

    let body = json!({"text": "hi"});
    // Tokens: wrong secret, expired, garbage.
    let forged =
        herald_client::token("another-secret-0123456789", TENANT, "alice", "a1", herald_shared::auth::Platform::Ios);
    let expired = herald_shared::auth::sign(
        &herald_shared::auth::Claims {
            tid: TENANT.into(),
            sub: "alice".into(),
            dev: "a1".into(),
            plat: herald_shared::auth::Platform::Ios,
            exp: 1_000,
            iat: None,
        },
        herald_tests::SECRET.as_bytes(),
    );
    for bad in [forged, expired, "not-a-jwt".to_string()] {
        let e =
            herald_client::HttpClient::new(c.gateways[0].base_url(), bad).send("x1", "ab", &body).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    }
    // Another tenant's conversation is not found, whatever ids it sends.
    let mallory = c.client_in(0, "evil", "alice", "a1");
    assert_eq!(mallory.send("x2", "ab", &body).await.unwrap_err().code(), Some(ErrorCode::NotFound));
    assert_eq!(mallory.change_members("ab", &["mallory"], &[]).await.unwrap_err().code(), Some(ErrorCode::NotFound));
    // Non-member, unknown conversation.
    assert_eq!(carol.send("x3", "ab", &body).await.unwrap_err().code(), Some(ErrorCode::Forbidden));
    assert_eq!(carol.change_members("ab", &["carol"], &[]).await.unwrap_err().code(), Some(ErrorCode::Forbidden));
    assert_eq!(alice.send("x4", "nope", &body).await.unwrap_err().code(), Some(ErrorCode::NotFound));
    // Oversized body, over-long cmid, malformed JSON, missing fields.
    let big = json!({"text": "x".repeat(2_000)});
    assert_eq!(alice.send("x5", "ab", &big).await.unwrap_err().code(), Some(ErrorCode::TooLarge));
    assert_eq!(alice.send(&"c".repeat(65), "ab", &body).await.unwrap_err().code(), Some(ErrorCode::BadRequest));
    assert_eq!(alice.send("", "ab", &body).await.unwrap_err().code(), Some(ErrorCode::BadRequest));
    for raw in [&b"{not json"[..], br#"{"cmid":"x6","conv":"ab"}"#, br#"{"cmid":7,"conv":"ab","body":1}"#, br#"[]"#] {
        let (status, v) = alice.post_raw("/v1/messages", raw.to_vec()).await.unwrap();
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(raw));
        assert_eq!(v["error"]["code"], "bad_request");
    }
    // The admin API is not served on the public listener, token or not.
    let http = reqwest::Client::new();
    for path in ["/admin/outbox?status=DEAD", "/metrics"] {
        let r = http
            .get(format!("{}{path}", c.gateways[0].base_url()))
            .bearer_auth(herald_tests::ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404, "{path} on the public listener");
    }
    // A direct conversation's members are fixed.
    assert_eq!(alice.change_members("ab", &["dan"], &[]).await.unwrap_err().code(), Some(ErrorCode::Conflict));

    let db = c.db().await;
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&db).await.unwrap();
    assert_eq!(n, 0, "no bad request stored a message");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM conversations").fetch_one(&db).await.unwrap();
    assert_eq!(n, 1);
    let members: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT user_id FROM members ORDER BY user_id").fetch_all(&db).await.unwrap();
    assert_eq!(members, vec![b"alice".to_vec(), b"bob".to_vec()]);
    // And a good send still works afterwards.
    let ok = alice.send("x7", "ab", &body).await.unwrap();
    assert_eq!((ok.seq, ok.dup), (1, false));
}
