//! A new device of a long-standing member is told where its timeline starts
//! (`start_seq`): it receives by push only what was committed from a minute before it
//! registered, so older messages are history to page back into, not a gap to wait for.
//! (`joined_seq` covered late members only: the new device's timeline waited on a gap
//! down to seq 1 and then read the whole history to fill it.)

use std::time::Duration;

use herald_client::device::{Device, DeviceSpec, Observer, Via};
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::protocol::Message;
use herald_tests::Cluster;
use serde_json::json;

struct Quiet;
impl Observer for Quiet {
    fn message(&self, _: &Message, _: Via, _: Duration) {}
    fn caught_up(&self, _: Duration) {}
    fn online(&self, _: bool) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_device_of_an_old_member_is_told_where_its_timeline_starts() {
    let mut c = Cluster::new("devstart");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let old_phone = c.client(0, "bob", "b1");
    old_phone.list_conversations(10, None).await.unwrap();
    for k in 1..=5 {
        alice.send(&format!("old{k}"), "g", &json!(k)).await.unwrap();
    }
    // An hour passes: ids are time. Bob's first phone was registered before all of it.
    let db = c.db().await;
    let hour_ago = MsgId::lowest_at(now_ms() - 3_600_000).0;
    for seq in 1..=5u64 {
        sqlx::query("UPDATE messages SET id = ? WHERE conv_id = 'g' AND seq = ?")
            .bind(hour_ago + seq * 4096)
            .bind(seq)
            .execute(&db)
            .await
            .unwrap();
    }
    sqlx::query("UPDATE devices SET registered_at = ? WHERE user_id = 'bob' AND device_id = 'b1'")
        .bind(now_ms() as i64 - 7_200_000)
        .execute(&db)
        .await
        .unwrap();

    // Bob's new phone registers (its first request), then a message arrives.
    let new_phone = c.client(0, "bob", "b2");
    let list = new_phone.list_conversations(10, None).await.unwrap();
    assert_eq!((&list["items"][0]["joined_seq"], &list["items"][0]["start_seq"]), (&json!(0), &json!(5)), "{list}");
    alice.send("new", "g", &json!("after the new phone")).await.unwrap();
    let list = old_phone.list_conversations(10, None).await.unwrap();
    assert_eq!(list["items"][0]["start_seq"], 0, "the old phone has it all: {list}");

    // History still holds the older messages, and says where the new phone starts.
    let (status, page) = new_phone.get_raw("/v1/conversations/g/messages").await.unwrap();
    assert_eq!(status, 200, "{page}");
    assert_eq!((&page["joined_seq"], &page["start_seq"]), (&json!(0), &json!(5)), "{page}");
    assert_eq!(page["items"].as_array().unwrap().len(), 6, "older messages stay readable: {page}");
    let (_, page) = old_phone.get_raw("/v1/conversations/g/messages").await.unwrap();
    assert_eq!(page["start_seq"], 0, "{page}");

    // The client library's device shows seq 6 only: its timeline starts at 5 once the
    // gap sync's page says so, instead of filling the gap with the whole history.
    let spec = DeviceSpec {
        gap_sync_after: Duration::from_millis(200),
        ..DeviceSpec::new("bob", "b2", &c.token("bob", "b2"), vec![c.gateways[0].base_url()])
    };
    let device = Device::spawn(spec, std::sync::Arc::new(Quiet));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = device.stop().await;
    let shown: Vec<u64> = log.shown.iter().map(|s| s.seq).collect();
    assert_eq!(shown, [6], "shown from where the new phone starts");
}
