//! Typing and presence (issue 18, feature 5): ephemeral frames to the online devices
//! of a conversation's members only, never stored, limited per device and conversation;
//! presence of a user's contacts, queried within a bound or followed by sessions that
//! asked for it, and nothing new for clients that did not.

use std::time::Duration;

use herald_client::device::DeviceSpec;
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ErrorFrame, PresenceState, ServerFrame, TypingShown, TypingState};
use herald_tests::{eventually, pending_ids, AutoDevice, Cluster, SECRET};
use serde_json::{json, Value};

/// A worker and two gateways: typing and presence cross nodes.
async fn cluster(name: &str, extra: &[(&str, &str)]) -> Cluster {
    let mut c = Cluster::new(name);
    for (k, v) in extra {
        c.set(k, v);
    }
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    c
}

/// A device on gateway `gw`; with `asks`, it asks for `typing` and `presence` frames.
async fn device(c: &Cluster, gw: usize, user: &str, dev: &str, asks: bool) -> AutoDevice {
    device_with_token(c, gw, &c.token(user, dev), user, dev, asks).await
}

async fn device_with_token(c: &Cluster, gw: usize, token: &str, user: &str, dev: &str, asks: bool) -> AutoDevice {
    let base = c.gateways[gw].base_url();
    let spec = DeviceSpec { typing_and_presence: asks, ..AutoDevice::spec(&base, token, user, dev) };
    AutoDevice::start(spec).await.expect("the device says hello")
}

fn typing(d: &AutoDevice) -> Vec<TypingShown> {
    let others = d.others.lock().unwrap();
    others.iter().filter_map(|f| if let ServerFrame::Typing(t) = f { Some(t.clone()) } else { None }).collect()
}

fn presence(d: &AutoDevice) -> Vec<PresenceState> {
    let others = d.others.lock().unwrap();
    others.iter().filter_map(|f| if let ServerFrame::Presence(p) = f { Some(p.clone()) } else { None }).collect()
}

fn errors(d: &AutoDevice) -> Vec<ErrorFrame> {
    let others = d.others.lock().unwrap();
    others.iter().filter_map(|f| if let ServerFrame::Error(e) = f { Some(e.clone()) } else { None }).collect()
}

async fn error_with_ref(d: &AutoDevice, reference: &str) -> ErrorFrame {
    let what = format!("{}/{} is answered an error for {reference}", d.user, d.device);
    eventually(Duration::from_secs(10), &what, || async {
        errors(d).into_iter().find(|e| e.reference.as_deref() == Some(reference))
    })
    .await
}

async fn shown_typing(d: &AutoDevice, n: usize) -> Vec<TypingShown> {
    let what = format!("{}/{} is shown {n} typing frame(s)", d.user, d.device);
    eventually(Duration::from_secs(10), &what, || async {
        let t = typing(d);
        (t.len() >= n).then_some(t)
    })
    .await
}

async fn shown_presence(d: &AutoDevice, user: &str, online: bool) -> PresenceState {
    let what = format!("{}/{} is shown {user} online={online}", d.user, d.device);
    eventually(Duration::from_secs(10), &what, || async {
        presence(d).into_iter().rev().find(|p| p.user == user && p.online == online)
    })
    .await
}

async fn typing_frame(d: &AutoDevice, conv: &str, state: &str, reference: &str) {
    d.send_raw(json!({"t": "typing", "conv": conv, "state": state, "ref": reference})).await;
}

async fn presence_of(c: &Cluster, user: &str, query: &str) -> (u16, Value) {
    c.client(0, user, "http").get_raw(&format!("/v1/presence{query}")).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_reaches_the_other_members_online_devices_only_and_is_never_stored() {
    let c = cluster("tp-typing", &[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "dave"]).await.unwrap();
    let a1 = device(&c, 0, "alice", "a1", true).await;
    // Bob on the other gateway, and an old client of his that did not ask.
    let b1 = device(&c, 1, "bob", "b1", true).await;
    let b2 = device(&c, 0, "bob", "b2", false).await;
    // Carol is no member; a "bob" of another tenant shares only the name.
    let c1 = device(&c, 0, "carol", "c1", true).await;
    let other_bob = device_with_token(
        &c,
        1,
        &herald_client::token(SECRET, "t2", "bob", "x1", herald_shared::auth::Platform::Web),
        "bob",
        "x1",
        true,
    )
    .await;

    typing_frame(&a1, "g", "started", "ty1").await;
    let shown = shown_typing(&b1, 1).await;
    assert_eq!(
        shown[0],
        TypingShown { conv: "g".into(), user: "alice".into(), state: TypingState::Started, expires_in_ms: 6_000 }
    );
    typing_frame(&a1, "g", "stopped", "ty2").await;
    let shown = shown_typing(&b1, 2).await;
    assert_eq!(shown[1].state, TypingState::Stopped);

    // Nobody else: not the sender, not an old client, not a non-member, not another tenant.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for d in [&a1, &b2, &c1, &other_bob] {
        assert!(typing(d).is_empty(), "{}/{} is shown no typing: {:?}", d.user, d.device, typing(d));
    }
    assert!(errors(&a1).is_empty(), "a member's typing is not refused: {:?}", errors(&a1));

    // Never stored: not pending for anyone, not in history, not in sync.
    let (redis, keys) = (c.redis().await, c.keys());
    for (user, dev) in [("bob", "b1"), ("bob", "b2"), ("dave", "d1")] {
        assert!(pending_ids(&redis, &keys, user, dev).await.is_empty(), "{user}/{dev} has nothing pending");
    }
    let (status, page) = c.client(0, "bob", "b1").get_raw("/v1/conversations/g/messages").await.unwrap();
    assert_eq!((status, page["items"].as_array().map(Vec::len)), (200, Some(0)), "{page}");
    let (status, sync) = c.client(0, "dave", "d1").get_raw("/v1/sync").await.unwrap();
    assert_eq!((status, sync["items"].as_array().map(Vec::len)), (200, Some(0)), "{sync}");
    let db = c.db().await;
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&db).await.unwrap();
    assert_eq!(stored, 0, "no message row");
    for d in [a1, b1, b2, c1, other_bob] {
        d.stop().await;
    }
}

/// Where the members' devices are connected is kept with the copy of the members, at
/// most 2 s: a device that connects after it was read is shown the frames that come
/// once the copy is older than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_connects_is_shown_typing_once_the_copy_is_2_s_old() {
    let c = cluster("tp-routes", &[]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let a1 = device(&c, 0, "alice", "a1", true).await;
    let b1 = device(&c, 1, "bob", "b1", true).await;
    typing_frame(&a1, "g", "started", "ty1").await;
    shown_typing(&b1, 1).await;

    // Bob's second device, on the typist's own gateway, after the routes were read.
    let b2 = device(&c, 0, "bob", "b2", true).await;
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    typing_frame(&a1, "g", "stopped", "ty2").await;
    assert_eq!(shown_typing(&b2, 1).await[0].state, TypingState::Stopped);
    assert_eq!(shown_typing(&b1, 2).await[1].state, TypingState::Stopped);
    assert!(typing(&a1).is_empty(), "not the typist's own device: {:?}", typing(&a1));
    for d in [a1, b1, b2] {
        d.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_over_the_limit_is_dropped_and_a_non_member_is_refused() {
    let limits = [("HERALD_GATEWAY__TYPING_BURST", "2"), ("HERALD_GATEWAY__TYPING_WINDOW_MS", "60000")];
    let c = cluster("tp-limits", &limits).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("h"), "group", &["alice", "bob"]).await.unwrap();
    let a1 = device(&c, 0, "alice", "a1", true).await;
    let b1 = device(&c, 1, "bob", "b1", true).await;
    let c1 = device(&c, 0, "carol", "c1", true).await;

    for i in 0..5 {
        typing_frame(&a1, "g", "started", &format!("g{i}")).await;
    }
    shown_typing(&b1, 2).await;
    // Another conversation has its own count.
    typing_frame(&a1, "h", "started", "h0").await;
    let shown = shown_typing(&b1, 3).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let shown_now = typing(&b1);
    assert_eq!(shown_now.len(), 3, "two of g, one of h; the rest dropped: {shown_now:?}");
    assert_eq!(shown_now, shown);
    assert!(errors(&a1).is_empty(), "dropped without an answer: {:?}", errors(&a1));

    // A non-member, an unknown conversation, a state that is none.
    typing_frame(&c1, "g", "started", "c-g").await;
    assert_eq!(error_with_ref(&c1, "c-g").await.code, ErrorCode::Forbidden);
    typing_frame(&c1, "nowhere", "started", "c-x").await;
    assert_eq!(error_with_ref(&c1, "c-x").await.code, ErrorCode::NotFound);
    typing_frame(&c1, "g", "dancing", "c-d").await;
    assert_eq!(error_with_ref(&c1, "c-d").await.code, ErrorCode::BadRequest);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(typing(&b1).len(), 3, "a refused typing frame reaches nobody");
    for d in [a1, b1, c1] {
        d.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_is_queried_for_contacts_within_a_bound() {
    let c = cluster("tp-query", &[("HERALD_GATEWAY__PRESENCE_MAX_USERS", "3")]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "dave"]).await.unwrap();
    c.client(0, "carol", "c1").create_conversation(Some("cx"), "group", &["carol", "erin"]).await.unwrap();
    let b1 = device(&c, 1, "bob", "b1", false).await;

    let (status, answer) = presence_of(&c, "alice", "?users=bob,dave,carol").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"users": [
            {"user": "bob", "online": true, "last_seen": null},
            {"user": "dave", "online": false, "last_seen": null},
        ]}),
        "carol shares no conversation with alice: left out"
    );

    b1.stop().await;
    let last_seen = eventually(Duration::from_secs(10), "bob is offline, with a last-seen time", || async {
        let (_, answer) = presence_of(&c, "alice", "?users=bob").await;
        let bob = &answer["users"][0];
        (bob["online"] == false).then(|| bob["last_seen"].as_u64()).flatten()
    })
    .await;
    assert!(last_seen > 1_600_000_000_000, "{last_seen} is ms since the epoch");

    // The bound, and a query without users.
    let (status, answer) = presence_of(&c, "alice", "?users=bob,dave,carol,erin").await;
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("bad_request")), "{answer}");
    let (status, answer) = presence_of(&c, "alice", "").await;
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("bad_request")), "{answer}");
    // Repeats count once.
    let (status, answer) = presence_of(&c, "alice", "?users=bob,bob,bob,bob").await;
    assert_eq!((status, answer["users"].as_array().map(Vec::len)), (200, Some(1)), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_changes_reach_the_sessions_that_follow_the_user_only() {
    let c = cluster("tp-follow", &[("HERALD_GATEWAY__PRESENCE_MAX_USERS", "3")]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let a1 = device(&c, 0, "alice", "a1", true).await;
    let old = device(&c, 0, "alice", "a2", false).await;

    a1.send_raw(json!({"t": "presence_subscribe", "users": ["bob", "carol"], "ref": "p1"})).await;
    let now = shown_presence(&a1, "bob", false).await;
    assert_eq!(now.last_seen, None, "bob never connected");

    // Bob comes online on the other gateway, and leaves.
    let b1 = device(&c, 1, "bob", "b1", false).await;
    shown_presence(&a1, "bob", true).await;
    b1.stop().await;
    eventually(Duration::from_secs(10), "bob's leaving is shown, with a last-seen time", || async {
        presence(&a1).into_iter().find(|p| p.user == "bob" && !p.online && p.last_seen.is_some())
    })
    .await;
    assert!(presence(&a1).iter().all(|p| p.user == "bob"), "carol is no contact: {:?}", presence(&a1));

    // An old client never sees presence, and may not follow anyone.
    assert!(presence(&old).is_empty() && typing(&old).is_empty());
    old.send_raw(json!({"t": "presence_subscribe", "users": ["bob"], "ref": "p2"})).await;
    assert_eq!(error_with_ref(&old, "p2").await.code, ErrorCode::BadRequest);
    let shown = presence(&a1).len();
    let b1 = device(&c, 1, "bob", "b1", false).await;
    eventually(Duration::from_secs(10), "bob's return is shown", || async {
        let p = presence(&a1);
        (p.len() > shown && p.last().is_some_and(|p| p.online)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(presence(&old).is_empty(), "{:?}", presence(&old));

    // Over the bound: refused, and the list followed stays as it was.
    a1.send_raw(json!({"t": "presence_subscribe", "users": ["u1", "u2", "u3", "u4"], "ref": "p3"})).await;
    assert_eq!(error_with_ref(&a1, "p3").await.code, ErrorCode::BadRequest);
    // An empty list follows no one.
    a1.send_raw(json!({"t": "presence_subscribe", "users": [], "ref": "p4"})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = presence(&a1).len();
    b1.stop().await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(presence(&a1).len(), before, "unfollowed: {:?}", presence(&a1));
    for d in [a1, old] {
        d.stop().await;
    }
}

#[tokio::test]
async fn a_user_whose_two_devices_connect_at_once_is_shown_online() {
    let c = cluster("tp-together", &[]).await;
    let users: Vec<String> = (1..=12).map(|i| format!("u{i}")).collect();
    let mut members = vec!["alice"];
    members.extend(users.iter().map(String::as_str));
    c.client(0, "alice", "a1").create_conversation(Some("g"), "group", &members).await.unwrap();
    let a1 = device(&c, 0, "alice", "a1", true).await;
    a1.send_raw(json!({"t": "presence_subscribe", "users": users, "ref": "p1"})).await;
    for u in &users {
        shown_presence(&a1, u, false).await;
    }
    // Each user's two devices open their sessions together: whichever claims its
    // presence first finds itself the user's only device, and the change is announced.
    let opened =
        futures::future::join_all(users.iter().flat_map(|u| [(u.clone(), "d1"), (u.clone(), "d2")]).map(|(u, d)| {
            let c = &c;
            async move { device(c, 0, &u, d, false).await }
        }))
        .await;
    for u in &users {
        shown_presence(&a1, u, true).await;
    }
    futures::future::join_all(opened.into_iter().map(|d| d.stop())).await;
    for u in &users {
        eventually(Duration::from_secs(10), &format!("{u} is shown offline again"), || async {
            let last = presence(&a1).into_iter().rev().find(|p| p.user == *u)?;
            (!last.online && last.last_seen.is_some()).then_some(())
        })
        .await;
    }
    a1.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_whose_gateway_is_killed_is_queried_offline_within_three_heartbeats() {
    let mut c = cluster("tp-killed", &[("HERALD_GATEWAY__HEARTBEAT_MS", "1000")]).await;
    c.client(0, "alice", "a1").create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let b1 = device(&c, 1, "bob", "b1", false).await;
    let (_, answer) = presence_of(&c, "alice", "?users=bob").await;
    assert_eq!(answer["users"][0]["online"], true, "{answer}");

    // SIGKILL: no session ends, nothing clears bob's presence; its TTL (three
    // heartbeats) must.
    c.gateways[1].kill().await;
    eventually(Duration::from_secs(10), "bob is queried offline once his gateway is gone", || async {
        let (_, answer) = presence_of(&c, "alice", "?users=bob").await;
        (answer["users"][0]["online"] == false).then_some(())
    })
    .await;
    drop(b1);
}
