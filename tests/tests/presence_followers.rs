//! Who is shown a user's presence, and when it goes offline (issue 27): a follow list
//! is checked again when a membership change reaches the follower's session, so a user
//! who no longer shares a conversation stops being shown; and a gateway that dies has
//! its users announced offline by the surviving gateways once its liveness key expires.

use std::time::{Duration, Instant};

use herald_client::device::DeviceSpec;
use herald_shared::protocol::{PresenceState, ServerFrame, TimelineEvent};
use herald_tests::{eventually, AutoDevice, Cluster};
use serde_json::json;

/// A worker and two gateways with a heartbeat of one second.
async fn cluster(name: &str) -> Cluster {
    let mut c = Cluster::new(name);
    c.set("HERALD_GATEWAY__HEARTBEAT_MS", "1000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    c
}

/// A device on gateway `gw`; with `asks`, it asks for `presence` frames.
async fn device(c: &Cluster, gw: usize, user: &str, dev: &str, asks: bool) -> AutoDevice {
    let base = c.gateways[gw].base_url();
    let spec = DeviceSpec { typing_and_presence: asks, ..AutoDevice::spec(&base, &c.token(user, dev), user, dev) };
    AutoDevice::start(spec).await.expect("the device says hello")
}

fn presence(d: &AutoDevice) -> Vec<PresenceState> {
    let others = d.others.lock().unwrap();
    others.iter().filter_map(|f| if let ServerFrame::Presence(p) = f { Some(p.clone()) } else { None }).collect()
}

async fn shown_presence(d: &AutoDevice, user: &str, online: bool, within: Duration) -> PresenceState {
    let what = format!("{}/{} is shown {user} online={online}", d.user, d.device);
    eventually(within, &what, || async {
        let last = presence(d).into_iter().rev().find(|p| p.user == user)?;
        (last.online == online).then_some(last)
    })
    .await
}

/// Alice follows bob while they share a group; bob is removed. Once the removal reached
/// alice's session, bob's coming and going are no longer shown to her. Before: her
/// follow list was never checked again, and a former contact stayed visible for the
/// life of her session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_contact_is_no_longer_shown_once_the_last_shared_conversation_ends() {
    let c = cluster("pf-former").await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("g"), "group", &["alice", "bob", "carol"]).await.unwrap();
    let a1 = device(&c, 0, "alice", "a1", true).await;
    a1.send_raw(json!({"t": "presence_subscribe", "users": ["bob", "carol"], "ref": "p1"})).await;
    shown_presence(&a1, "bob", false, Duration::from_secs(10)).await;
    let b1 = device(&c, 1, "bob", "b1", false).await;
    shown_presence(&a1, "bob", true, Duration::from_secs(10)).await;
    b1.stop().await;
    shown_presence(&a1, "bob", false, Duration::from_secs(10)).await;

    alice.change_members("g", &[], &["bob"]).await.unwrap();
    eventually(Duration::from_secs(10), "the removal reached alice's session", || async {
        a1.events("g").into_iter().any(|(_, e)| matches!(e, TimelineEvent::MemberRemoved { .. })).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let shown = presence(&a1).len();
    let b1 = device(&c, 1, "bob", "b1", false).await;
    let c1 = device(&c, 1, "carol", "c1", false).await;
    // Carol, still a contact, is shown: the changes flow, and bob's would have by now.
    shown_presence(&a1, "carol", true, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: Vec<PresenceState> = presence(&a1).into_iter().skip(shown).collect();
    assert!(after.iter().all(|p| p.user != "bob"), "bob is no contact any more: {after:?}");
    for d in [a1, b1, c1] {
        d.stop().await;
    }
}

/// Bob's gateway is SIGKILLed: nothing ends his session, so nothing announced him
/// offline. The surviving gateway sweeps the dead node once its liveness key expired
/// (three heartbeats) and announces it; alice, on that gateway, is shown bob offline
/// within four heartbeats and a margin. Before: she was shown bob online until she
/// reconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_are_told_offline_when_a_gateway_dies() {
    let mut c = cluster("pf-killed").await;
    c.client(0, "alice", "a1").create_conversation(Some("g"), "group", &["alice", "bob"]).await.unwrap();
    let a1 = device(&c, 0, "alice", "a1", true).await;
    a1.send_raw(json!({"t": "presence_subscribe", "users": ["bob"], "ref": "p1"})).await;
    shown_presence(&a1, "bob", false, Duration::from_secs(10)).await;
    let b1 = device(&c, 1, "bob", "b1", false).await;
    shown_presence(&a1, "bob", true, Duration::from_secs(10)).await;

    let killed = Instant::now();
    c.gateways[1].kill().await;
    let state = shown_presence(&a1, "bob", false, Duration::from_secs(15)).await;
    let took = killed.elapsed();
    assert!(state.last_seen.is_some(), "with a last-seen time: {state:?}");
    // Documented bound: four heartbeats (4 s here), plus a loaded machine's margin.
    assert!(took < Duration::from_secs(7), "shown offline {took:?} after the kill");
    let (_, answer) = c.client(0, "alice", "http").get_raw("/v1/presence?users=bob").await.unwrap();
    assert_eq!(answer["users"][0]["online"], false, "{answer}");
    drop(b1);
    a1.stop().await;
}
