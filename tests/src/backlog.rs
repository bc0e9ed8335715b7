//! A device's backlog: the ids in its pending set, and filling it for tests of how a
//! device that comes back gets what it missed.

use std::collections::BTreeSet;
use std::time::Duration;

use fred::prelude::*;
use herald_client::HttpClient;
use herald_shared::ids::MsgId;
use herald_shared::keys::Keys;
use herald_shared::protocol::{msg_frame, Message};
use serde_json::json;
use serde_json::value::RawValue;

use crate::{eventually, Cluster, TENANT};

/// The ids in a device's pending set.
pub async fn pending_ids(redis: &Client, keys: &Keys, user: &str, device: &str) -> BTreeSet<u64> {
    let members: Vec<String> =
        redis.zrange(keys.pending(TENANT, user, device), 0, -1, None, false, None, false).await.expect("zrange");
    members.iter().map(|m| m.parse::<u64>().expect("fixed-width id member")).collect()
}

/// Where the messages of a backlog come from.
#[derive(Clone, Copy)]
pub enum Fill<'a> {
    /// `n` messages sent over HTTP by `sender`, `tasks` sends at a time, each retried
    /// with its cmid until committed: through gateway, worker and fan-out like any other.
    Sent { sender: &'a HttpClient, n: usize, tasks: usize },
    /// Messages with these ids written straight into Redis as the worker writes them (a
    /// frame per id, then the pending entries): ids no worker would make, such as
    /// hundreds sharing one `f64` score above 2^62.
    Written { ids: &'a [u64] },
}

/// Sends or writes the messages `fill` says to conversation `conv` while `user`'s
/// `device` is offline, and waits until its pending set holds exactly them; returns
/// their ids. The device must be known already (registered, or connected once) and
/// have nothing pending.
pub async fn fill_backlog(c: &Cluster, user: &str, device: &str, conv: &str, fill: Fill<'_>) -> BTreeSet<u64> {
    let (redis, keys) = (c.redis().await, c.keys());
    let want = match fill {
        Fill::Sent { sender, n, tasks } => send(sender, conv, n, tasks).await,
        Fill::Written { ids } => {
            write(&redis, &keys, user, device, conv, ids).await;
            ids.iter().copied().collect()
        }
    };
    let what = format!("{} messages pending for the offline device {user}/{device}", want.len());
    eventually(Duration::from_secs(30), &what, || {
        let (redis, keys, want) = (redis.clone(), keys.clone(), &want);
        async move { (pending_ids(&redis, &keys, user, device).await == *want).then_some(()) }
    })
    .await;
    want
}

/// `n` sends over HTTP, `tasks` at a time; the committed ids.
async fn send(sender: &HttpClient, conv: &str, n: usize, tasks: usize) -> BTreeSet<u64> {
    let mut running = Vec::new();
    for t in 0..tasks {
        let (sender, conv) = (sender.clone(), conv.to_owned());
        running.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for k in (t..n).step_by(tasks) {
                let r = sender.send_until_committed(&format!("{t}-{k}"), &conv, &json!({"n": k}), 50).await;
                ids.push(r.expect("a backlog message commits").id.0);
            }
            ids
        }));
    }
    let mut ids = BTreeSet::new();
    for t in running {
        ids.extend(t.await.expect("sender task"));
    }
    assert_eq!(ids.len(), n, "every send committed one message");
    ids
}

/// Frames and pending entries of `ids`, as the worker stores them (`seq` in the order given).
async fn write(redis: &Client, keys: &Keys, user: &str, device: &str, conv: &str, ids: &[u64]) {
    let key = keys.pending(TENANT, user, device);
    for (n, chunk) in ids.chunks(500).enumerate() {
        let frames: Vec<(String, String)> = chunk
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let m = Message {
                    id: MsgId(*id),
                    conv: conv.into(),
                    seq: (n * 500 + i + 1) as u64,
                    from: "x".into(),
                    cmid: format!("c{id}"),
                    ts: 0,
                    body: RawValue::from_string("{}".into()).expect("a JSON body"),
                    status: None,
                    event: None,
                    edited_seq: None,
                    recalled_seq: None,
                };
                (keys.message(m.id), msg_frame(&m))
            })
            .collect();
        let _: () = redis.mset(frames).await.expect("frames stored");
        // Added newest first: the set, not the order of arrival, puts them in id order.
        let pairs: Vec<(f64, String)> = chunk.iter().rev().map(|i| (MsgId(*i).score(), MsgId(*i).member())).collect();
        let _: i64 = redis.zadd(&key, None, None, false, false, pairs).await.expect("pending entries stored");
    }
}
