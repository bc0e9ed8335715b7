//! The server API (issue 18): backends and bots with service tokens send as a member
//! through the durable path, with idempotency keys; each token kind is refused where
//! the other is expected; scopes and tenants bound what a service may do.

use std::time::Duration;

use herald_client::{HttpClient, WsClient, WsEvent};
use herald_shared::auth::{sign, Claims, Platform};
use herald_shared::db::TextColumns;
use herald_shared::service_token::{sign_service, Scope, ServiceClaims};
use herald_tests::{eventually, service_token, AutoDevice, Cluster, SECRET, SERVICE_SECRET};
use serde_json::{json, Value};

const SEND: &[Scope] = &[Scope::MessagesSend];
const ALL: &[Scope] = &[Scope::MessagesSend, Scope::ConversationsWrite];

async fn cluster(name: &str) -> Cluster {
    let mut c = Cluster::new(name);
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c
}

/// A group `conv` of `members`, created by the first of them.
async fn group(c: &Cluster, conv: &str, members: &[&str]) {
    c.client(0, members[0], "d0").create_conversation(Some(conv), "group", members).await.unwrap();
}

fn send_body(conv: &str, sender: &str, key: &str, text: &str) -> Vec<u8> {
    json!({"conv": conv, "as": sender, "body": {"text": text}, "idempotency_key": key}).to_string().into_bytes()
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_send_is_committed_before_its_answer_and_delivered_to_members() {
    let c = cluster("srv-send").await;
    group(&c, "room", &["bob", "helpbot"]).await;
    let base = c.gateways[0].base_url();
    let bob = AutoDevice::connect(&base, &c.token("bob", "b1"), "bob", "b1").await;
    let bots_own = AutoDevice::connect(&base, &c.token("helpbot", "h1"), "helpbot", "h1").await;
    let svc = c.service(0, "acme", "helpdesk", SEND);

    let (status, sent) =
        svc.post_raw("/v1/server/messages", send_body("room", "helpbot", "k1", "hello")).await.unwrap();
    assert_eq!(status, 200, "{sent}");
    assert_eq!(
        (sent["conv"].as_str(), sent["seq"].as_u64(), sent["dup"].as_bool()),
        (Some("room"), Some(1), Some(false))
    );
    // Answered only after COMMIT: the row is there the moment the answer is, sent by
    // the bot from the service's own device.
    let id: u64 = sent["id"].as_str().unwrap().parse().unwrap();
    let row = sqlx::query("SELECT sender_id, sender_device, client_msg_id FROM messages WHERE id = ?")
        .bind(id)
        .fetch_one(&c.db().await)
        .await
        .expect("the message is committed when the answer comes");
    let row = (row.text(0).unwrap(), row.text(1).unwrap(), row.text(2).unwrap());
    assert_eq!(row, ("helpbot".into(), "service:helpdesk".into(), "k1".into()));

    // Every member's devices get it, the `as` user's own included (as from another device).
    for d in [&bob, &bots_own] {
        eventually(Duration::from_secs(10), &format!("{}'s device gets the bot's message", d.user), || async {
            d.received
                .lock()
                .unwrap()
                .iter()
                .any(|(conv, seq, got)| conv == "room" && *seq == 1 && *got == id)
                .then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_idempotency_key_twice_is_one_message_answered_dup() {
    let c = cluster("srv-idem").await;
    group(&c, "room", &["bob", "helpbot"]).await;
    let svc = c.service(0, "acme", "helpdesk", SEND);

    let (_, first) = svc.post_raw("/v1/server/messages", send_body("room", "helpbot", "k1", "once")).await.unwrap();
    let (status, again) =
        svc.post_raw("/v1/server/messages", send_body("room", "helpbot", "k1", "once")).await.unwrap();
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["dup"], json!(true), "{again}");
    assert_eq!((&again["id"], &again["seq"]), (&first["id"], &first["seq"]), "the first commit comes back");
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE conv_id = 'room'")
        .fetch_one(&c.db().await)
        .await
        .unwrap();
    assert_eq!(count, 1, "one message for one key");
    // Another key is another message.
    let (_, other) = svc.post_raw("/v1/server/messages", send_body("room", "helpbot", "k2", "twice")).await.unwrap();
    assert_eq!((other["seq"].as_u64(), other["dup"].as_bool()), (Some(2), Some(false)), "{other}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_token_is_refused_by_the_server_api_and_a_service_token_by_the_device_api() {
    let c = cluster("srv-kinds").await;
    group(&c, "room", &["bob", "helpbot"]).await;

    let device = c.client(0, "helpbot", "d1");
    let (status, body) = device.post_raw("/v1/server/messages", send_body("room", "helpbot", "k1", "x")).await.unwrap();
    assert_eq!((status, code(&body)), (401, "unauthorized"), "a device token on the server API: {body}");

    let svc = c.service(0, "acme", "helpdesk", ALL);
    let device_send = json!({"cmid": "c1", "conv": "room", "body": {"text": "x"}}).to_string().into_bytes();
    let (status, body) = svc.post_raw("/v1/messages", device_send).await.unwrap();
    assert_eq!((status, code(&body)), (401, "unauthorized"), "a service token on the device API: {body}");
    let (status, body) = svc.get_raw("/v1/conversations").await.unwrap();
    assert_eq!((status, code(&body)), (401, "unauthorized"), "{body}");
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &service_token("acme", "helpdesk", ALL)).await.unwrap();
    assert_eq!(ws.next(Duration::from_secs(10)).await, Some(WsEvent::Closed(Some(4001))), "no session for a service");

    // Each kind signed with the other's secret is still refused (its header's typ and its
    // claims are the other kind's).
    let claims = ServiceClaims { tid: "acme".into(), svc: "helpdesk".into(), scopes: ALL.to_vec(), exp: u64::MAX / 2 };
    let as_device = HttpClient::new(c.gateways[0].base_url(), sign_service(&claims, SECRET.as_bytes()));
    let (status, body) = as_device.get_raw("/v1/conversations").await.unwrap();
    assert_eq!((status, code(&body)), (401, "unauthorized"), "a service token with the devices' secret: {body}");
    let device = Claims {
        tid: "acme".into(),
        sub: "helpbot".into(),
        dev: "d1".into(),
        plat: Platform::Server,
        exp: u64::MAX / 2,
        iat: None,
    };
    let as_service = HttpClient::new(c.gateways[0].base_url(), sign(&device, SERVICE_SECRET.as_bytes()));
    let (status, body) =
        as_service.post_raw("/v1/server/messages", send_body("room", "helpbot", "k2", "x")).await.unwrap();
    assert_eq!((status, code(&body)), (401, "unauthorized"), "a device token with the services' secret: {body}");
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&c.db().await).await.unwrap();
    assert_eq!(count, 0, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_scope_is_forbidden() {
    let c = cluster("srv-scope").await;
    group(&c, "room", &["bob", "helpbot"]).await;
    let svc = c.service(0, "acme", "directory", &[Scope::ConversationsWrite]);
    let (status, body) = svc.post_raw("/v1/server/messages", send_body("room", "helpbot", "k1", "x")).await.unwrap();
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("messages:send"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_members_and_other_tenants_conversations_are_refused() {
    let c = cluster("srv-tenant").await;
    group(&c, "room", &["bob", "helpbot"]).await;

    let svc = c.service(0, "acme", "helpdesk", SEND);
    let (status, body) = svc.post_raw("/v1/server/messages", send_body("room", "mallory", "k1", "x")).await.unwrap();
    assert_eq!((status, code(&body)), (403, "forbidden"), "not a member: {body}");

    // globex's service, aiming at acme's conversation as one of its members.
    let foreign = c.service(0, "globex", "helpdesk", ALL);
    let (status, body) = foreign.post_raw("/v1/server/messages", send_body("room", "bob", "k2", "x")).await.unwrap();
    assert_eq!((status, code(&body)), (404, "not_found"), "another tenant's conversation: {body}");
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&c.db().await).await.unwrap();
    assert_eq!(count, 0, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_server_sends_are_refused_with_a_clear_message() {
    let c = cluster("srv-input").await;
    group(&c, "room", &["bob", "helpbot"]).await;
    let svc = c.service(0, "acme", "helpdesk", SEND);
    let long_key = "k".repeat(65);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"conv": "room", "as": "helpbot", "body": {}}), "idempotency_key"),
        (json!({"conv": "room", "as": "helpbot", "body": {}, "idempotency_key": ""}), "idempotency_key"),
        (json!({"conv": "room", "as": "helpbot", "body": {}, "idempotency_key": long_key}), "idempotency_key"),
        (json!({"conv": "room", "as": "help bot", "body": {}, "idempotency_key": "k"}), "as must be"),
        (json!({"conv": "room", "body": {}, "idempotency_key": "k"}), "`as`"),
        (json!({"conv": "room", "as": "helpbot", "body": {}, "idempotency_key": "k", "cmid": "c"}), "unknown field"),
        (json!({"conv": "", "as": "helpbot", "body": {}, "idempotency_key": "k"}), "conv must be"),
    ];
    for (req, says) in cases {
        let (status, body) = svc.post_raw("/v1/server/messages", req.to_string().into_bytes()).await.unwrap();
        assert_eq!((status, code(&body)), (400, "bad_request"), "{req}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{req}: {message:?} should name {says:?}");
    }
    let (status, body) = svc.post_raw("/v1/server/messages", b"{not json".to_vec()).await.unwrap();
    assert_eq!((status, code(&body)), (400, "bad_request"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_creates_a_conversation_and_changes_its_members_safely_repeated() {
    let c = cluster("srv-convs").await;
    let svc = c.service(0, "acme", "directory", &[Scope::ConversationsWrite]);
    let create = json!({"id": "team", "kind": "group", "members": ["alice", "bob"], "title": "Team"});
    let (status, conv) = svc.post_raw("/v1/server/conversations", create.to_string().into_bytes()).await.unwrap();
    assert_eq!(status, 201, "{conv}");
    assert_eq!(conv["members"], json!(["alice", "bob"]), "the service itself is no member");
    let (status, again) = svc.post_raw("/v1/server/conversations", create.to_string().into_bytes()).await.unwrap();
    assert_eq!((status, &again["members"]), (200, &json!(["alice", "bob"])), "a repeat answers the same: {again}");
    let other = json!({"id": "team", "kind": "group", "members": ["alice", "carol"]});
    let (status, body) = svc.post_raw("/v1/server/conversations", other.to_string().into_bytes()).await.unwrap();
    assert_eq!((status, code(&body)), (409, "conflict"), "another create under the same id: {body}");
    let unnamed = json!({"kind": "group", "members": ["alice"]});
    let (status, body) = svc.post_raw("/v1/server/conversations", unnamed.to_string().into_bytes()).await.unwrap();
    assert_eq!((status, code(&body)), (400, "bad_request"), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("id is required"), "{body}");

    // Alice sees it; the service adds carol and removes bob, twice.
    let listed = c.client(0, "alice", "a1").list_conversations(10, None).await.unwrap();
    assert_eq!(listed["items"][0]["id"], "team", "{listed}");
    let change = json!({"add": ["carol"], "remove": ["bob"]}).to_string().into_bytes();
    for _ in 0..2 {
        let (status, conv) = svc.post_raw("/v1/server/conversations/team/members", change.clone()).await.unwrap();
        assert_eq!((status, &conv["members"]), (200, &json!(["alice", "carol"])), "{conv}");
    }
    // Bob is no member any more: a send as him is refused; carol's is delivered.
    let sender = c.service(0, "acme", "helpdesk", SEND);
    let (status, body) = sender.post_raw("/v1/server/messages", send_body("team", "bob", "k1", "x")).await.unwrap();
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, body) = sender.post_raw("/v1/server/messages", send_body("team", "carol", "k2", "hi")).await.unwrap();
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_writes_need_their_scope_and_stay_in_the_tenant() {
    let c = cluster("srv-convs-scope").await;
    group(&c, "room", &["bob", "helpbot"]).await;
    let create = json!({"id": "new", "kind": "group", "members": ["alice"]}).to_string().into_bytes();
    let change = json!({"add": ["mallory"]}).to_string().into_bytes();

    let sender = c.service(0, "acme", "helpdesk", SEND);
    let (status, body) = sender.post_raw("/v1/server/conversations", create.clone()).await.unwrap();
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, body) = sender.post_raw("/v1/server/conversations/room/members", change.clone()).await.unwrap();
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");

    let foreign = c.service(0, "globex", "directory", ALL);
    let (status, body) = foreign.post_raw("/v1/server/conversations/room/members", change).await.unwrap();
    assert_eq!((status, code(&body)), (404, "not_found"), "another tenant's conversation: {body}");
    let members: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT user_id FROM members WHERE conv_id = 'room' ORDER BY user_id")
            .fetch_all(&c.db().await)
            .await
            .unwrap();
    assert_eq!(members, vec![b"bob".to_vec(), b"helpbot".to_vec()], "acme's room is unchanged");

    let device = c.client(0, "bob", "b1");
    let (status, body) = device.post_raw("/v1/server/conversations", create).await.unwrap();
    assert_eq!((status, code(&body)), (401, "unauthorized"), "a device token: {body}");
}

/// The token operators mint with `herald-loadtest service-token` is accepted, and its
/// scopes are the ones asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_tests_service_token_command_mints_a_working_token() {
    let c = cluster("srv-mint").await;
    let out = std::process::Command::new(herald_tests::bin("herald-loadtest"))
        .args(["service-token", "--service", "ops", "--scope", "conversations:write", "--tenant", "acme"])
        .env("HERALD_SERVICE_SECRET", herald_tests::SERVICE_SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let ops = HttpClient::new(c.gateways[0].base_url(), token);
    let create = json!({"id": "ops-room", "kind": "group", "members": ["alice"]}).to_string().into_bytes();
    let (status, body) = ops.post_raw("/v1/server/conversations", create).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, body) = ops.post_raw("/v1/server/messages", send_body("ops-room", "alice", "k1", "x")).await.unwrap();
    assert_eq!((status, code(&body)), (403, "forbidden"), "only the scope asked for: {body}");
}
