//! A group of the largest size (`gateway.max_group_size`) with the longest user ids
//! (64 characters, each of which may need escaping in JSON): its membership change is
//! accepted, committed as one event, pushed, and read back whole from history and sync.
//! (The event column was TEXT, 64 KiB, and a change of 1 000 such users was refused.)

use std::time::Duration;

use herald_shared::protocol::TimelineEvent;
use herald_tests::{eventually, AutoDevice, Cluster};
use serde_json::{json, Value};

/// 64 characters, a quote or a backslash every other one: escaped, twice as long.
fn long_user(k: usize) -> String {
    let mut id = format!("u{k:05}");
    while id.len() < 64 {
        id.push(if id.len() % 2 == 0 { '"' } else { '\\' });
    }
    id
}

/// 64 characters that need no escaping.
fn plain_user(k: usize) -> String {
    format!("p{k:05}{}", "x".repeat(58))
}

/// The users of the `member_added` event of `conv` among `items`.
fn added_users(items: &Value, conv: &str) -> Option<Vec<String>> {
    items
        .as_array()?
        .iter()
        .find(|m| m["conv"] == conv && m["event"]["type"] == "member_added")
        .map(|m| m["event"]["users"].as_array().unwrap().iter().map(|u| u.as_str().unwrap().to_owned()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_group_of_the_longest_user_ids_is_added_in_one_change() {
    let mut c = Cluster::new("largegroup");
    c.set("HERALD_DELIVERY__SYNC_SETTLE_MS", "300");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice"]).await.unwrap();
    // The case: 999 plain ids of 64 characters, a 67 KB event.
    alice.create_conversation(Some("plain"), "group", &["alice"]).await.unwrap();
    let plain: Vec<String> = (0..999).map(plain_user).collect();
    let refs: Vec<&str> = plain.iter().map(String::as_str).collect();
    let conv = alice.change_members("plain", &refs, &[]).await.expect("999 plain long ids are accepted");
    assert_eq!(conv["members"].as_array().unwrap().len(), 1_000, "every member is in");

    let a1 = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("alice", "a1"), "alice", "a1").await;

    // 999 more: the group holds the default maximum of 1 000.
    let mut users: Vec<String> = (0..999).map(long_user).collect();
    users.sort();
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let conv = alice.change_members("g", &refs, &[]).await.expect("the largest change is accepted");
    assert_eq!(conv["members"].as_array().unwrap().len(), 1_000, "every member is in");
    assert_eq!(conv["last_seq"], 1, "one event");

    // Pushed whole to the actor's device.
    eventually(Duration::from_secs(15), "alice's device gets the event", || async {
        a1.events("g").into_iter().find(|(seq, _)| *seq == 1)
    })
    .await;
    assert_eq!(a1.events("g"), [(1, TimelineEvent::MemberAdded { users: users.clone() })]);

    // History, read back whole.
    let (status, page) = alice.get_raw("/v1/conversations/g/messages").await.unwrap();
    assert_eq!(status, 200, "{page}");
    assert_eq!(added_users(&page["items"], "g").as_ref(), Some(&users), "history holds every user");

    // Device sync (once the event's id is settled), and the new members' history.
    let synced = eventually(Duration::from_secs(10), "sync gives the event", || async {
        let (status, page) = alice.get_raw("/v1/sync").await.unwrap();
        assert_eq!(status, 200, "{page}");
        added_users(&page["items"], "g")
    })
    .await;
    assert_eq!(synced, users, "sync holds every user");
    let newcomer = c.client(0, &users[998], "n1");
    let (status, page) = newcomer.get_raw("/v1/conversations/g/messages").await.unwrap();
    assert_eq!((status, page["joined_seq"].clone()), (200, json!(0)), "{page}");
    assert_eq!(added_users(&page["items"], "g").as_ref(), Some(&users));
    a1.stop().await;
}
