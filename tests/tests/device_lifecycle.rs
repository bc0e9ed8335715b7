//! A device's life: in use it is never expired, however short the TTL; back after its
//! TTL it gets what it missed; logged out, its sessions end and do not bring it back;
//! expired long enough ago it is forgotten, and returns as a new device.

use std::time::Duration;

use herald_client::{WsClient, WsEvent};
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::protocol::{AckFrame, ClientFrame, Hello, Message, ServerFrame};
use herald_tests::{eventually, AutoDevice, Cluster, TENANT};
use serde_json::json;

/// A device in use is never expired, however short the TTL: both an HTTP-only sender and
/// an idle WebSocket session refresh `last_seen_at` well within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_in_use_are_not_expired_under_a_short_ttl() {
    let mut c = Cluster::new("devinuse");
    c.set("HERALD_DELIVERY__DEVICE_TTL_S", "60").set("HERALD_WORKER__JANITOR_INTERVAL_MS", "200");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let phone = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    // Both were last written 40 s ago, as if they had been in use that long: unless
    // refreshed within a quarter of the TTL, they would expire 20 s from now.
    let db = c.db().await;
    sqlx::query("UPDATE devices SET last_seen_at = ?").bind(now_ms() as i64 - 40_000).execute(&db).await.unwrap();
    let started = now_ms() as i64;
    for i in 0..25 {
        alice.send(&format!("m{i}"), "ab", &json!(i)).await.unwrap();
        let expired: Vec<String> =
            sqlx::query_scalar("SELECT CAST(device_id AS CHAR) FROM devices WHERE expired_at IS NOT NULL")
                .fetch_all(&db)
                .await
                .unwrap();
        assert!(expired.is_empty(), "devices in use were expired after {i} s: {expired:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let stale: Vec<String> = sqlx::query_scalar("SELECT CAST(device_id AS CHAR) FROM devices WHERE last_seen_at < ?")
        .bind(started)
        .fetch_all(&db)
        .await
        .unwrap();
    assert!(stale.is_empty(), "last_seen_at not refreshed: {stale:?}");
    phone.stop().await;
}

/// A device expired more than `worker.device_forget_s` ago loses its row; when it
/// returns it is registered afresh, its watermark at about now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_expired_long_ago_is_forgotten_and_returns_as_new() {
    let mut c = Cluster::new("devforget");
    c.set("HERALD_WORKER__DEVICE_FORGET_S", "86400").set("HERALD_WORKER__JANITOR_INTERVAL_MS", "200");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.client(0, "alice", "old").create_conversation(Some("solo"), "group", &["alice"]).await.unwrap();
    c.client(0, "alice", "recent").create_conversation(Some("solo2"), "group", &["alice"]).await.unwrap();
    let db = c.db().await;
    let day = 86_400_000i64;
    let now = now_ms() as i64;
    // One expired two days ago, one expired an hour ago.
    sqlx::query("UPDATE devices SET expired_at = ?, watermark = 1 WHERE device_id = 'old'")
        .bind(now - 2 * day)
        .execute(&db)
        .await
        .unwrap();
    sqlx::query("UPDATE devices SET expired_at = ? WHERE device_id = 'recent'")
        .bind(now - day / 24)
        .execute(&db)
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the janitor forgot the device expired two days ago", || async {
        let left: Vec<String> = sqlx::query_scalar("SELECT CAST(device_id AS CHAR) FROM devices ORDER BY device_id")
            .fetch_all(&db)
            .await
            .unwrap();
        (left == ["recent"]).then_some(())
    })
    .await;
    // It returns (on another gateway, which has never seen it): registered anew.
    c.start_gateway(&[]).await;
    c.client(1, "alice", "old").list_conversations(10, None).await.unwrap();
    let watermark: u64 =
        sqlx::query_scalar("SELECT watermark FROM devices WHERE device_id = 'old'").fetch_one(&db).await.unwrap();
    let age_ms = now_ms().saturating_sub(MsgId(watermark).unix_ms());
    assert!(age_ms < 5 * 60_000, "a new device's watermark is about now, not 1: {age_ms} ms old");
}

/// A device back after its TTL but before the janitor's round (fan-out has skipped it
/// since the TTL passed, while its pending set still looked complete) gets what it
/// missed. Before: the message committed in between never reached it by push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_back_after_its_ttl_before_the_janitor_gets_what_it_missed() {
    let mut c = Cluster::new("devpastttl");
    c.set("HERALD_DELIVERY__DEVICE_TTL_S", "60").set("HERALD_WORKER__JANITOR_INTERVAL_MS", "3600000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let phone = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "phone"), "bob", "phone").await;
    phone.stop().await;
    // Its gateway goes (as in a restart), so no later report of it touches the row.
    c.gateways[0].kill().await;
    let db = c.db().await;
    sqlx::query("UPDATE devices SET last_seen_at = ? WHERE device_id = 'phone'")
        .bind(now_ms() as i64 - 120_000)
        .execute(&db)
        .await
        .unwrap();
    c.start_gateway(&[]).await;
    let alice = c.client(1, "alice", "a1");
    let missed = alice.send("m1", "ab", &json!("while past its ttl")).await.unwrap();
    let phone = AutoDevice::connect(&c.gateways[1].base_url(), &c.token("bob", "phone"), "bob", "phone").await;
    eventually(Duration::from_secs(10), "the message sent past its TTL arrives", || async {
        phone.ids().contains(&missed.id.0).then_some(())
    })
    .await;
    phone.stop().await;
}

/// A session whose device row is gone (it logged out on another gateway, whose kick
/// did not arrive) ends with 4002 once it notices its presence went, and its last
/// watermark report does not bring the row back. Before: it paged the whole history
/// from watermark 0 and its report re-created the device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_a_logged_out_device_ends_and_does_not_bring_it_back() {
    let mut c = Cluster::new("devgone");
    c.set("HERALD_GATEWAY__HEARTBEAT_MS", "500").set("HERALD_GATEWAY__WATERMARK_FLUSH_MS", "1000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let mut ws = WsClient::connect(&c.gateways[0].base_url(), &c.token("bob", "phone")).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    // History the device has seen and acked.
    alice.send("m1", "ab", &json!(1)).await.unwrap();
    let m1 = ws.next_of::<Message>(Duration::from_secs(5)).await.expect("m1 pushed");
    ws.send(&ClientFrame::Ack(AckFrame { ids: vec![m1.id] })).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // What a logout elsewhere does, without its kick arriving here.
    let db = c.db().await;
    sqlx::query("DELETE FROM devices WHERE device_id = 'phone'").execute(&db).await.unwrap();
    let device = herald_shared::keys::DeviceKey::new(TENANT, "bob", "phone");
    herald_shared::device_state::free(&c.redis_pool().await, &c.keys(), &device).await.unwrap();
    let mut code = None;
    let started = std::time::Instant::now();
    while code.is_none() && started.elapsed() < Duration::from_secs(10) {
        match ws.next(Duration::from_millis(200)).await {
            Some(WsEvent::Closed(c)) => code = Some(c),
            Some(WsEvent::Frame(ServerFrame::Msg(m))) => panic!("history paged to a logged-out device: {m:?}"),
            _ => {}
        }
    }
    assert_eq!(code, Some(Some(4002)), "the session ends as its device logged out");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM devices WHERE device_id = 'phone'").fetch_one(&db).await.unwrap();
    assert_eq!(rows, 0, "no watermark report re-created the device");
}

/// `PUT /v1/devices/me/push` through gateway `gw`: its status.
async fn register_push(c: &Cluster, gw: usize, user: &str, device: &str) -> u16 {
    let r = reqwest::Client::new()
        .put(format!("{}/v1/devices/me/push", c.gateways[gw].base_url()))
        .bearer_auth(c.token(user, device))
        .json(&json!({"platform": "fcm", "token": "t-1"}))
        .send()
        .await
        .unwrap();
    r.status().as_u16()
}

/// A worker, two gateways, alice and bob's conversation, and bob's device b1 registered
/// (and remembered) by gateway 1, where its session has ended.
async fn known_to_gateway_1(name: &str) -> Cluster {
    let mut c = Cluster::new(name);
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let first = AutoDevice::connect(&c.gateways[1].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    first.stop().await;
    c
}

/// A device that logged out and comes back, on whichever gateway: registered again at
/// once, its session stays, and it gets every message from then on.
async fn comes_back_on_the_other_gateway(c: &Cluster) {
    let alice = c.client(0, "alice", "a1");
    let back = AutoDevice::connect(&c.gateways[1].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    assert_eq!(register_push(c, 1, "bob", "b1").await, 200, "its push registration is taken at once");
    let m = alice.send("after", "ab", &json!("after")).await.unwrap();
    eventually(Duration::from_secs(10), "the device that came back gets the next message", || async {
        back.ids().contains(&m.id.0).then_some(())
    })
    .await;
    assert_eq!(*back.closed.lock().unwrap(), None, "its session was not closed as logged out");
    back.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_logged_out_on_one_gateway_is_registered_again_on_another() {
    // Gateway 1 knows the device (it registered it), then it logs out through gateway 0.
    let c = known_to_gateway_1("logout-two-gw").await;
    c.client(0, "bob", "b1").logout().await.expect("logged out");
    comes_back_on_the_other_gateway(&c).await;
}

/// The same when gateway 1 never heard of the logout (the announcement is best effort):
/// the device's row and Redis state are gone, as a logout leaves them, and nothing said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_whose_logout_went_unheard_is_registered_again_when_it_returns() {
    let c = known_to_gateway_1("logout-unheard").await;
    let db = c.db().await;
    sqlx::query("DELETE FROM devices WHERE device_id = 'b1'").execute(&db).await.unwrap();
    let d = herald_shared::keys::DeviceKey::new(TENANT, "bob", "b1");
    herald_shared::device_state::free(&c.redis_pool().await, &c.keys(), &d).await.unwrap();
    comes_back_on_the_other_gateway(&c).await;
}
