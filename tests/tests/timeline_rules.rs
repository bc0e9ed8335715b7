//! Who may change a conversation's timeline (issue 18, feature 4), end to end: roles
//! owner, admin and member decide who removes whom, who changes the title and who
//! gives roles; a sender recalls and edits its own messages within the configured
//! windows, a group's managers recall lower-ranked members' messages; every refusal
//! is one of the protocol's codes and commits nothing; tenants stay apart.

use std::time::Duration;

use herald_client::{ClientError, HttpClient};
use herald_shared::error::ErrorCode;
use herald_shared::ids::MsgId;
use herald_shared::service_token::Scope;
use herald_tests::Cluster;
use serde_json::{json, Value};

async fn cluster(name: &str, extra: &[(&str, &str)]) -> Cluster {
    let mut c = Cluster::new(name);
    for (k, v) in extra {
        c.set(k, v);
    }
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c
}

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    r.expect_err("refused").code().expect("an API error")
}

async fn last_seq(c: &Cluster, conv: &str) -> u64 {
    sqlx::query_scalar("SELECT last_seq FROM conversations WHERE id = ?")
        .bind(conv)
        .fetch_one(&c.db().await)
        .await
        .unwrap()
}

/// owner alice (the creator), then bob made admin; carol and dave members.
async fn team(c: &Cluster) -> [HttpClient; 4] {
    let [a, b, cl, d] = ["alice", "bob", "carol", "dave"].map(|u| c.client(0, u, "d1"));
    a.create_conversation(Some("g"), "group", &["alice", "bob", "carol", "dave"]).await.unwrap();
    let conv = a.change_role("g", "bob", "admin").await.unwrap();
    assert_eq!(conv["roles"], json!({"alice": "owner", "bob": "admin", "carol": "member", "dave": "member"}));
    [a, b, cl, d]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_decide_who_removes_whom_changes_the_title_and_gives_roles() {
    let c = cluster("tl-roles", &[]).await;
    let [alice, bob, carol, dave] = team(&c).await;
    assert_eq!(last_seq(&c, "g").await, 1, "the promotion is the first event");

    // Members add, and remove only themselves.
    assert!(carol.change_members("g", &["erin"], &[]).await.is_ok());
    assert_eq!(code(carol.change_members("g", &[], &["dave"]).await), ErrorCode::Forbidden);
    assert_eq!(code(carol.change_title("g", Some("mine")).await), ErrorCode::Forbidden);
    assert_eq!(code(carol.change_role("g", "carol", "admin").await), ErrorCode::Forbidden);
    // Admins remove members and rename, not the owner, and give no roles.
    assert_eq!(code(bob.change_members("g", &[], &["alice"]).await), ErrorCode::Forbidden);
    assert_eq!(code(bob.change_role("g", "dave", "admin").await), ErrorCode::Forbidden);
    let after = bob.change_members("g", &[], &["erin"]).await.unwrap();
    assert!(!after["members"].as_array().unwrap().contains(&json!("erin")));
    let renamed = bob.change_title("g", Some("Team")).await.unwrap();
    assert_eq!(renamed["title"], "Team");
    let before = last_seq(&c, "g").await;
    bob.change_title("g", Some("Team")).await.unwrap();
    assert_eq!(last_seq(&c, "g").await, before, "the same title again is no event");

    // The owner hands ownership over and is an admin from then on.
    let handed = alice.change_role("g", "dave", "owner").await.unwrap();
    assert_eq!((&handed["roles"]["dave"], &handed["roles"]["alice"]), (&json!("owner"), &json!("admin")));
    assert_eq!(code(alice.change_members("g", &[], &["dave"]).await), ErrorCode::Forbidden);
    assert!(dave.change_members("g", &[], &["alice"]).await.is_ok(), "the owner removes an admin");
    assert_eq!(code(dave.change_role("g", "zed", "admin").await), ErrorCode::BadRequest, "zed is no member");

    // A direct conversation keeps its members, title and roles.
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    assert_eq!(code(alice.change_title("ab", Some("x")).await), ErrorCode::Conflict);
    assert_eq!(code(alice.change_members("ab", &["carol"], &[]).await), ErrorCode::Conflict);
    assert_eq!(code(alice.change_role("ab", "bob", "admin").await), ErrorCode::Conflict);
    assert_eq!(last_seq(&c, "ab").await, 0, "refusals commit nothing");

    // Outsiders, unknown conversations, other tenants.
    let mallory = c.client(0, "mallory", "m1");
    assert_eq!(code(mallory.change_title("g", Some("x")).await), ErrorCode::Forbidden);
    assert_eq!(code(alice.change_title("nope", Some("x")).await), ErrorCode::NotFound);
    let other = c.client_in(0, "globex", "dave", "d1");
    assert_eq!(code(other.change_members("g", &[], &["bob"]).await), ErrorCode::NotFound, "another tenant's g");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_from_before_roles_is_managed_by_every_member_and_a_service_names_an_owner() {
    let c = cluster("tl-legacy", &[]).await;
    let svc = c.service(0, "acme", "crm", &[Scope::ConversationsWrite]);
    let body = json!({"id": "old", "kind": "group", "members": ["alice", "bob", "carol"]}).to_string();
    let (status, created) = svc.post_raw("/v1/server/conversations", body.into_bytes()).await.unwrap();
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["roles"], json!({"alice": "member", "bob": "member", "carol": "member"}), "no owner");
    // Nobody manages it: every member removes and renames, as before roles.
    let bob = c.client(0, "bob", "b1");
    assert!(bob.change_members("old", &[], &["carol"]).await.is_ok());
    assert!(bob.change_title("old", Some("ours")).await.is_ok());
    assert_eq!(code(bob.change_role("old", "alice", "owner").await), ErrorCode::Forbidden);
    // A service names an owner: the ranks apply from then on.
    let role = json!({"user": "alice", "role": "owner"}).to_string().into_bytes();
    let (status, owned) = svc.post_raw("/v1/server/conversations/old/roles", role).await.unwrap();
    assert_eq!((status, &owned["roles"]["alice"]), (200, &json!("owner")), "{owned}");
    assert_eq!(code(bob.change_members("old", &[], &["alice"]).await), ErrorCode::Forbidden);
    let title = json!({"title": "by the crm"}).to_string().into_bytes();
    let (status, renamed) = svc.post_raw("/v1/server/conversations/old/title", title).await.unwrap();
    assert_eq!((status, &renamed["title"]), (200, &json!("by the crm")));
    let page = c.client(0, "alice", "a1").get_raw("/v1/conversations/old/messages").await.unwrap().1;
    let froms: Vec<&str> = page["items"].as_array().unwrap().iter().map(|m| m["from"].as_str().unwrap()).collect();
    assert_eq!(froms, ["bob", "bob", "service:crm", "service:crm"], "a service's events come from it: {page}");
    let (status, refused) = c
        .service(0, "acme", "bot", &[Scope::MessagesSend])
        .post_raw("/v1/server/conversations/old/title", b"{\"title\":null}".to_vec())
        .await
        .unwrap();
    assert_eq!((status, refused["error"]["code"].as_str()), (403, Some("forbidden")), "the scope is needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn senders_recall_and_edit_within_their_windows_and_managers_moderate() {
    let c = cluster("tl-windows", &[("HERALD_WORKER__EDIT_WINDOW_S", "2")]).await;
    let [alice, bob, carol, _dave] = team(&c).await;
    let alices = alice.send("a1", "g", &json!({"text": "mine"})).await.unwrap();
    let carols = carol.send("c1", "g", &json!({"text": "spam"})).await.unwrap();

    // Only the sender edits; nobody but the sender and the group's managers recall.
    assert_eq!(code(carol.edit(alices.id, "x1", &json!("no")).await), ErrorCode::Forbidden);
    assert_eq!(code(alice.edit(carols.id, "x2", &json!("no")).await), ErrorCode::Forbidden, "not even the owner");
    assert_eq!(code(carol.recall(alices.id, "x3").await), ErrorCode::Forbidden);
    assert_eq!(code(bob.recall(alices.id, "x4").await), ErrorCode::Forbidden, "an admin does not outrank the owner");
    assert!(bob.recall(carols.id, "r1").await.is_ok(), "an admin recalls a member's message");
    assert_eq!(code(carol.edit(carols.id, "x5", &json!("x")).await), ErrorCode::Conflict, "it was recalled");
    assert_eq!(code(carol.recall(carols.id, "x6").await), ErrorCode::Conflict);

    // An event is no message; an unknown id, or another tenant's, is not found.
    let event_id: u64 = sqlx::query_scalar("SELECT id FROM messages WHERE event IS NOT NULL ORDER BY seq LIMIT 1")
        .fetch_one(&c.db().await)
        .await
        .unwrap();
    assert_eq!(code(alice.recall(MsgId(event_id), "x7").await), ErrorCode::BadRequest);
    assert_eq!(code(alice.recall(MsgId(12345), "x8").await), ErrorCode::NotFound);
    let outsider = c.client_in(0, "globex", "alice", "a1");
    assert_eq!(code(outsider.edit(alices.id, "x9", &json!("x")).await), ErrorCode::NotFound, "another tenant's id");
    // A bad key or body is refused before anything is queued.
    assert_eq!(code(alice.recall(alices.id, "").await), ErrorCode::BadRequest);
    let huge = json!({"text": "x".repeat(40_000)});
    assert_eq!(code(alice.edit(alices.id, "x10", &huge).await), ErrorCode::TooLarge);
    let (status, _) =
        alice.post_raw(&format!("/v1/messages/{}/edit", alices.id), b"{\"cmid\":\"k\"}".to_vec()).await.unwrap();
    assert_eq!(status, 400, "an edit needs its body");

    // Within the window the sender edits; past it, not (a recall's window is a day).
    assert!(alice.edit(alices.id, "e1", &json!({"text": "mine, fixed"})).await.is_ok());
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(code(alice.edit(alices.id, "e2", &json!("late")).await), ErrorCode::Forbidden);
    assert!(alice.recall(alices.id, "r2").await.is_ok());

    // A key of a message is not a key of a change.
    assert_eq!(code(alice.recall(alices.id, "a1").await), ErrorCode::Conflict, "a1 is the send's cmid");
    let edits: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE event LIKE '%\"edited\"%'")
        .fetch_one(&c.db().await)
        .await
        .unwrap();
    assert_eq!(edits, 1, "refused edits commit nothing");
    let page: Value = alice.get_raw("/v1/conversations/g/messages").await.unwrap().1;
    let first = &page["items"].as_array().unwrap()[1];
    assert_eq!((&first["body"], &first["recalled_seq"].is_u64()), (&Value::Null, &true), "{page}");
}
