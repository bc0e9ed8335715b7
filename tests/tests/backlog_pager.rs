//! The gateway's backlog pager against real Redis: a pending set of ids far above 2^53,
//! hundreds of them sharing each `f64` score, is delivered exactly once, in id
//! order, page by page, to a client that acks each page in one frame.
//!
//! The pager lives inside the session loop (its reads are Redis calls), so it is tested
//! here end to end rather than as a pure function.

use std::time::Duration;

use herald_client::{token, WsClient, WsEvent};
use herald_shared::auth::Platform;
use herald_shared::ids::MsgId;
use herald_shared::protocol::{Hello, ServerFrame};
use herald_tests::{ack_frame, eventually, fill_backlog, pending_ids, Cluster, Fill, SECRET, TENANT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_ids_above_2_pow_62_are_paged_exactly_once_in_order() {
    let mut c = Cluster::new("pager");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__BACKLOG_RATE_DESKTOP", "100000")]).await;
    let base = c.gateways[0].base_url();
    let tok = token(SECRET, TENANT, "pat", "desk", Platform::Desktop);
    // A first session makes the device's pending set trusted in this epoch.
    let mut ws = WsClient::connect(&base, &tok).await.unwrap();
    ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    ws.close().await;

    // 1 300 consecutive ids from 2^62 (up to 1 024 share a score there), plus a sparse tail,
    // with their frames stored as the worker stores them.
    let start = 1u64 << 62;
    let mut ids: Vec<u64> = (start..start + 1_300).collect();
    ids.extend((1..=40).map(|k| start + 1_300 + k * 977));
    fill_backlog(&c, "pat", "desk", "pc", Fill::Written { ids: &ids }).await;
    let (redis, keys) = (c.redis().await, c.keys());
    assert_eq!(MsgId(start).score(), MsgId(start + 500).score(), "hundreds of ids share one score");

    // Acks a page's worth (or what arrived within 20 ms) in one frame, until caught_up.
    let mut ws = WsClient::connect(&base, &tok).await.unwrap();
    let hello = ws.next_of::<Hello>(Duration::from_secs(5)).await.unwrap();
    assert_eq!(hello.pending, ids.len() as u64);
    let mut seen: Vec<u64> = Vec::new();
    let mut unacked: Vec<MsgId> = Vec::new();
    let deadline = std::time::Instant::now();
    loop {
        match ws.next(Duration::from_millis(20)).await {
            Some(WsEvent::Frame(ServerFrame::Msg(m))) => {
                seen.push(m.id.0);
                unacked.push(m.id);
                if unacked.len() < 200 {
                    continue;
                }
            }
            Some(WsEvent::Frame(ServerFrame::CaughtUp(f))) => {
                assert_eq!(f.delivered, ids.len() as u64, "{f:?}");
                break;
            }
            Some(WsEvent::Frame(_) | WsEvent::Other(_)) => continue,
            Some(WsEvent::Closed(code)) => panic!("closed {code:?} after {} messages", seen.len()),
            None => assert!(deadline.elapsed() < Duration::from_secs(30), "no caught_up after {} messages", seen.len()),
        }
        if !unacked.is_empty() {
            ws.send(&ack_frame(std::mem::take(&mut unacked))).await.unwrap();
        }
    }
    assert_eq!(seen.len(), ids.len(), "every id exactly once");
    assert_eq!(seen, ids, "in id order");
    eventually(Duration::from_secs(5), "the pending set emptied by the acks", || {
        let (redis, keys) = (redis.clone(), keys.clone());
        async move { pending_ids(&redis, &keys, "pat", "desk").await.is_empty().then_some(()) }
    })
    .await;
}
