//! The node's ingress writer: every send, read receipt and timeline change of this
//! gateway, HTTP and WebSocket alike, reaches the ingress streams through it. It writes
//! what arrived while its previous write was under way, in one batch of XADDs (one
//! socket write, `herald_shared::redis::Batch`), with each shard's consecutive sends
//! packed into one stream entry (`k=sends`, `herald_shared::protocol::pack`). There is no linger: a lone request goes at once,
//! and under load a send costs a row in a pack instead of a stream entry and a Redis
//! round trip of its own.
//!
//! Packs only while every live worker reads them (each says so in
//! `Keys::packing_workers`, checked every [`CHECK_EVERY`]): during a rolling upgrade or
//! a rollback next to a worker older than packs, every send goes as an entry of its own.
//!
//! Order: one writer and one write at a time, and the entries of a batch are sent in
//! order on the client's one connection to their Redis, so requests keep their arrival
//! order within a shard (a session's sends and its reads and timeline changes after
//! them). A write that fails answers its requests
//! `unavailable` at once, as a failed XADD of their own did; the client resends with the
//! same `cmid`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use herald_shared::error::ErrorCode;
use herald_shared::keys::Keys;
use herald_shared::protocol::pack::{self, PackedSend};
use herald_shared::protocol::SendOutcome;
use herald_shared::redis::Batch;
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, ApiResult};
use crate::waiters::SendWaiters;

/// Requests waiting for the writer at most; past it a request is answered
/// `unavailable` at once rather than queued behind a Redis that cannot keep up.
const QUEUE: usize = 65_536;
/// Requests taken into one write at most.
const WRITE_MAX: usize = 4_096;
/// Bytes of sends in one pack at most, about (a pack may pass it by one body).
const PACK_MAX_BYTES: usize = 1 << 20;
/// How often the writer asks whether every live worker reads packs.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// A request on its way into its shard's stream.
#[derive(Debug)]
pub enum Request {
    Send(PackedSend),
    /// Any other entry (a read receipt, a timeline change), with its waiter's id.
    Entry {
        fields: Vec<(&'static str, String)>,
        rid: u64,
    },
}

/// Where requests queue for the writer.
#[derive(Clone, Debug)]
pub struct IngressQueue(mpsc::Sender<(u32, Request)>);

impl IngressQueue {
    /// Queues a request for `shard`'s stream; its answer comes to its waiter.
    pub fn push(&self, shard: u32, request: Request) -> ApiResult<()> {
        self.0.try_send((shard, request)).map_err(|_| {
            metrics::counter!("herald_ingress_queue_full_total").increment(1);
            ApiError::new(ErrorCode::Unavailable, "the gateway's ingress queue is full; retry with the same cmid")
        })
    }
}

/// The writer: restartable, its queue outlives a restart.
#[derive(Clone, Debug)]
pub struct IngressWriter {
    redis: Pool,
    keys: Keys,
    waiters: Arc<SendWaiters>,
    node_id: String,
    /// Sends in one entry at most (`gateway.ingress_pack_max`; 1 writes each on its own).
    pack_max: usize,
    rx: Arc<Mutex<mpsc::Receiver<(u32, Request)>>>,
}

/// A queue and the writer that drains it.
pub fn channel(
    redis: Pool,
    keys: Keys,
    waiters: Arc<SendWaiters>,
    node_id: String,
    pack_max: usize,
) -> (IngressQueue, IngressWriter) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let writer = IngressWriter { redis, keys, waiters, node_id, pack_max, rx: Arc::new(Mutex::new(rx)) };
    (IngressQueue(tx), writer)
}

/// Whether the writer packs, and when it last asked.
#[derive(Debug, Default)]
struct PackGate {
    allowed: bool,
    checked: Option<Instant>,
}

/// Packs go only where every live worker reads them; with no worker live, the one to
/// come may be older than packs.
fn all_read_packs(live: &[String], packing: &[String]) -> bool {
    !live.is_empty() && live.iter().all(|w| packing.contains(w))
}

/// One stream entry to write: its shard, fields, and the requests it carries.
#[derive(Debug, PartialEq)]
struct Entry {
    shard: u32,
    fields: Vec<(&'static str, String)>,
    rids: Vec<u64>,
}

/// The entries for a write's requests: per shard in arrival order, consecutive sends
/// packed (at most `pack_max` and about [`PACK_MAX_BYTES`] each), a lone send and every
/// other request an entry of its own.
fn entries(requests: Vec<(u32, Request)>, node: &str, pack_max: usize) -> Vec<Entry> {
    let mut shards: BTreeMap<u32, Vec<Request>> = BTreeMap::new();
    for (shard, r) in requests {
        shards.entry(shard).or_default().push(r);
    }
    let mut out = Vec::new();
    for (shard, requests) in shards {
        let mut pack: Vec<PackedSend> = Vec::new();
        let mut bytes = 0;
        let close = |pack: &mut Vec<PackedSend>, out: &mut Vec<Entry>| {
            let rids = pack.iter().map(|s| s.rid).collect();
            let fields = match pack.as_slice() {
                [] => return,
                [one] => one.entry(node).to_fields(),
                many => pack::to_fields(node, many),
            };
            pack.clear();
            out.push(Entry { shard, fields, rids });
        };
        for r in requests {
            match r {
                Request::Send(s) => {
                    if pack.len() >= pack_max || bytes >= PACK_MAX_BYTES {
                        close(&mut pack, &mut out);
                        bytes = 0;
                    }
                    bytes += s.packed_bytes();
                    pack.push(s);
                }
                Request::Entry { fields, rid } => {
                    close(&mut pack, &mut out);
                    bytes = 0;
                    out.push(Entry { shard, fields, rids: vec![rid] });
                }
            }
        }
        close(&mut pack, &mut out);
    }
    out
}

impl IngressWriter {
    /// Writes what arrived, one write at a time, until `cancel`; then what is still
    /// queued, so that requests accepted before the stop are not left to time out.
    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let sizes = metrics::histogram!("herald_ingress_write_requests");
        let mut gate = PackGate::default();
        loop {
            let first = tokio::select! {
                biased;
                r = rx.recv() => match r { Some(r) => r, None => return },
                _ = cancel.cancelled() => break,
                // Idle: the workers are asked all the same, so the first send after a
                // quiet spell does not wait for them (and the gauge stays current).
                _ = tokio::time::sleep(CHECK_EVERY) => {
                    self.packing(&mut gate).await;
                    continue;
                }
            };
            let mut batch = vec![first];
            while batch.len() < WRITE_MAX {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            sizes.record(batch.len() as f64);
            let pack_max = if self.packing(&mut gate).await { self.pack_max } else { 1 };
            self.write(batch, pack_max).await;
        }
        let rest: Vec<(u32, Request)> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        if !rest.is_empty() {
            let pack_max = if gate.allowed { self.pack_max } else { 1 };
            self.write(rest, pack_max).await;
        }
    }

    /// XADDs sent together (one socket write, [`Batch`]); the requests of an entry that was not added hear
    /// `unavailable`. No MAXLEN: an entry leaves its stream only when a worker has
    /// committed it (XDEL after XACK), so a long worker outage cannot trim away accepted
    /// sends.
    async fn write(&self, requests: Vec<(u32, Request)>, pack_max: usize) {
        let entries = entries(requests, &self.node_id, pack_max.max(1));
        let client = self.redis.next();
        let mut batch = Batch::new();
        let mut rids_of = Vec::with_capacity(entries.len());
        for Entry { shard, fields, rids } in entries {
            batch.push(client.xadd::<Value, _, _, _, _>(self.keys.ingress(shard), false, None, "*", fields));
            rids_of.push(rids);
        }
        for (rids, added) in rids_of.into_iter().zip(batch.run().await) {
            if added.is_err() {
                self.refuse(&rids);
            }
        }
    }

    /// Whether sends may be packed: every live worker reads packs. Asked at most every
    /// [`CHECK_EVERY`]; when Redis does not answer, the last answer stands.
    async fn packing(&self, gate: &mut PackGate) -> bool {
        if self.pack_max <= 1 {
            return false;
        }
        if gate.checked.is_some_and(|t| t.elapsed() < CHECK_EVERY) {
            return gate.allowed;
        }
        gate.checked = Some(Instant::now());
        let pipe = self.redis.next().pipeline();
        let _: Result<(), Error> = pipe.zrange(self.keys.workers(), 0, -1, None, false, None, false).await;
        let _: Result<(), Error> = pipe.zrange(self.keys.packing_workers(), 0, -1, None, false, None, false).await;
        match pipe.all::<(Vec<String>, Vec<String>)>().await {
            Ok((live, packing)) => {
                gate.allowed = all_read_packs(&live, &packing);
                metrics::gauge!("herald_ingress_packing").set(if gate.allowed { 1.0 } else { 0.0 });
            }
            Err(e) => tracing::debug!(error = %e, "workers not asked whether they read packs"),
        }
        gate.allowed
    }

    fn refuse(&self, rids: &[u64]) {
        metrics::counter!("herald_redis_errors_total", "source" => "gateway").increment(1);
        tracing::warn!(requests = rids.len(), "could not append to the ingress stream; answered unavailable");
        for &rid in rids {
            let outcome = SendOutcome::Err {
                code: ErrorCode::Unavailable,
                message: "message queue unavailable; retry with the same cmid".into(),
            };
            self.waiters.resolve(rid, None, outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_shared::protocol::{IngressRequest, ReadEntry};
    use serde_json::value::RawValue;
    use std::collections::HashMap;

    fn send(conv: &str, rid: u64) -> Request {
        Request::Send(PackedSend {
            tenant: "t".into(),
            user: "u".into(),
            device: "d".into(),
            cmid: format!("m{rid}"),
            conv: conv.into(),
            rid,
            body: RawValue::from_string(format!("{{\"n\":{rid}}}")).unwrap(),
            trace: None,
        })
    }

    fn read(rid: u64) -> Request {
        let r = ReadEntry {
            tenant: "t".into(),
            user: "u".into(),
            device: "d".into(),
            conv: "c".into(),
            seq: 1,
            node: "gw".into(),
            rid,
        };
        Request::Entry { fields: r.to_fields(), rid }
    }

    fn decoded(e: &Entry) -> IngressRequest {
        let f: HashMap<String, String> = e.fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        IngressRequest::from_fields(&f).expect("a well-formed entry")
    }

    #[test]
    fn consecutive_sends_of_a_shard_share_an_entry_and_other_requests_keep_their_place() {
        let requests = vec![(0, send("a", 1)), (1, send("b", 2)), (0, send("a", 3)), (0, read(4)), (0, send("a", 5))];
        let out = entries(requests, "gw", 256);
        let shape: Vec<(u32, Vec<u64>)> = out.iter().map(|e| (e.shard, e.rids.clone())).collect();
        assert_eq!(shape, vec![(0, vec![1, 3]), (0, vec![4]), (0, vec![5]), (1, vec![2])]);
        let IngressRequest::Sends(pack) = decoded(&out[0]) else { panic!("{:?}", out[0]) };
        assert_eq!(pack.iter().map(|s| s.rid).collect::<Vec<_>>(), vec![1, 3]);
        assert!(matches!(decoded(&out[1]), IngressRequest::Read(_)));
        assert!(matches!(decoded(&out[2]), IngressRequest::Send(ref s) if s.rid == 5), "a lone send as of old");
    }

    #[test]
    fn sends_are_packed_only_while_every_live_worker_reads_packs() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(all_read_packs(&names(&["wk-1", "wk-2"]), &names(&["wk-2", "wk-1", "wk-gone"])));
        assert!(!all_read_packs(&names(&["wk-1", "wk-old"]), &names(&["wk-1"])), "an older worker is live");
        assert!(!all_read_packs(&[], &names(&["wk-1"])), "no worker: the next one may be older");
    }

    #[test]
    fn packs_are_bounded_and_a_bound_of_one_writes_every_send_on_its_own() {
        let requests = |n: u64| (1..=n).map(|rid| (3, send("a", rid))).collect::<Vec<_>>();
        let out = entries(requests(7), "gw", 3);
        assert_eq!(out.iter().map(|e| e.rids.len()).collect::<Vec<_>>(), vec![3, 3, 1]);
        let flat: Vec<u64> = out.iter().flat_map(|e| e.rids.clone()).collect();
        assert_eq!(flat, (1..=7).collect::<Vec<_>>(), "in arrival order");
        let single = entries(requests(3), "gw", 1);
        assert!(single.iter().all(|e| matches!(decoded(e), IngressRequest::Send(_))), "{single:?}");
    }
}
