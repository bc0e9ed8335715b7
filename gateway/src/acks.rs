//! The node's ack writer: acked ids leave their devices' pending sets through it. A
//! session hands over what its device acked and goes on; the writer removes what
//! arrived while its previous write was under way, in one call of the acks script
//! (`acks_remove.lua`) per cluster slot: one command on a single Redis, however many
//! pending sets (the client writes each command of a pipeline on its own, so a ZREM per
//! set was a system call per set on both sides). There is no linger: a lone ack goes at once, and under load an ack costs
//! a member in a shared write instead of a Redis round trip of the session's own (with
//! a timer to batch it) on the session's task.
//!
//! A write that fails is tried again, with backoff, until it lands: an acked id is never
//! pushed to its device again because its removal was forgotten. What queues behind it
//! waits (Redis is down for every session of the node alike). When the node stops, what
//! is still queued gets a last, bounded round before the process exits.
//!
//! A session that needs its removals done (before it reads a backlog page, which would
//! return the ids again, and before it promises `caught_up`) waits on its [`Tally`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{Client, ClientLike, Pool, Value};
use fred::types::{ClusterHash, CustomCommand};
use herald_shared::ids::MsgId;
use herald_shared::scripts;
use tokio::sync::{mpsc, Mutex, Notify};
use tokio_util::sync::CancellationToken;

/// One hand-over: a pending set's key, the ids acked, and the session's tally.
#[derive(Debug)]
struct Removal {
    key: String,
    ids: Vec<MsgId>,
    tally: Arc<Tally>,
}

/// A session's removals handed over and not yet done.
#[derive(Debug, Default)]
pub struct Tally {
    waiting: AtomicUsize,
    landed: Notify,
}

impl Tally {
    fn handed(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
    }

    fn land(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        self.landed.notify_waiters();
    }

    /// Whether every removal handed over is done.
    pub fn is_clear(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) == 0
    }

    /// Until every removal handed over so far is done.
    pub async fn cleared(&self) {
        loop {
            let landed = self.landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            if self.is_clear() {
                return;
            }
            landed.await;
        }
    }
}

/// Where sessions hand over acked ids.
#[derive(Clone, Debug)]
pub struct AckQueue(mpsc::Sender<Removal>);

/// The queue is full (Redis has been failing for long): nothing was handed over, and
/// the ids come back to the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueFull(pub Vec<MsgId>);

impl AckQueue {
    /// Hands `ids` of the pending set `key` over to the writer, counted in `tally`.
    pub fn remove(&self, key: &str, ids: Vec<MsgId>, tally: &Arc<Tally>) -> Result<(), QueueFull> {
        if ids.is_empty() {
            return Ok(());
        }
        tally.handed();
        let removal = Removal { key: key.to_owned(), ids, tally: tally.clone() };
        self.0.try_send(removal).map_err(|e| {
            tally.land();
            metrics::counter!("herald_ack_queue_full_total").increment(1);
            QueueFull(e.into_inner().ids)
        })
    }
}

/// Hand-overs waiting at most; past it a session keeps its acks and tries again.
const QUEUE: usize = 65_536;
/// Hand-overs taken into one write at most.
const WRITE_MAX: usize = 4_096;
/// How long a stopping node keeps trying to write what is queued (within the process's
/// 10 s stop bound).
const FINAL_ROUND: Duration = Duration::from_secs(5);

/// The writer: restartable, its queue outlives a restart.
#[derive(Clone, Debug)]
pub struct AckWriter {
    redis: Pool,
    rx: Arc<Mutex<mpsc::Receiver<Removal>>>,
}

pub fn channel(redis: Pool) -> (AckQueue, AckWriter) {
    channel_of(redis, QUEUE)
}

fn channel_of(redis: Pool, capacity: usize) -> (AckQueue, AckWriter) {
    let (tx, rx) = mpsc::channel(capacity);
    (AckQueue(tx), AckWriter { redis, rx: Arc::new(Mutex::new(rx)) })
}

/// Ids per script call at most: a call runs alone in Redis, so a large write is cut
/// into calls of about this many ids (a set with more gets a call of its own).
const CALL_IDS: usize = 4_096;

/// A write's removals: the ids of each pending set, in one list per set.
fn by_key(batch: &[Removal]) -> Vec<(&str, Vec<String>)> {
    let mut sets: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in batch {
        sets.entry(r.key.as_str()).or_default().extend(r.ids.iter().map(|id| id.member()));
    }
    sets.into_iter().collect()
}

/// The script calls of a write: indexes into `sets`, each call's sets sharing a
/// cluster slot (any sets on a single Redis), at most [`CALL_IDS`] ids per call.
fn calls(sets: &[(&str, Vec<String>)], clustered: bool) -> Vec<Vec<usize>> {
    herald_shared::redis::calls_by_slot(sets.iter().map(|(key, ids)| (*key, ids.len())), clustered, CALL_IDS)
}

impl AckWriter {
    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let mut backoff = Duration::from_millis(200);
        let mut batch: Vec<Removal> = Vec::new();
        loop {
            if batch.is_empty() {
                tokio::select! {
                    biased;
                    r = rx.recv() => match r { Some(r) => batch.push(r), None => return },
                    _ = cancel.cancelled() => return self.final_round(batch, &mut rx).await,
                }
                while batch.len() < WRITE_MAX {
                    match rx.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
            }
            match self.write(&batch).await {
                Ok(()) => {
                    backoff = Duration::from_millis(200);
                    done(std::mem::take(&mut batch));
                }
                Err(e) => {
                    metrics::counter!("herald_redis_errors_total", "source" => "acks").increment(1);
                    tracing::debug!(error = %e, "acks not recorded yet; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return self.final_round(batch, &mut rx).await,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// The acks script once per cluster slot, in one pipeline (loaded first when Redis
    /// does not know it). A set Redis refuses the removal for (its key holds another
    /// type) is logged and skipped, not retried forever ahead of every other session's
    /// acks.
    async fn write(&self, batch: &[Removal]) -> Result<(), fred::error::Error> {
        let client = self.redis.next();
        match remove(client, batch).await {
            Err(e) if e.to_string().contains("NOSCRIPT") => {
                scripts::ACKS_REMOVE.script().load(client).await?;
                remove(client, batch).await?;
            }
            other => other?,
        }
        let ids: usize = batch.iter().map(|r| r.ids.len()).sum();
        metrics::counter!("herald_acks_recorded_total").increment(ids as u64);
        Ok(())
    }

    /// The node stops: what is queued (`batch` first) is written until it lands or
    /// [`FINAL_ROUND`] is over; what is left then is counted and logged (those messages
    /// will be pushed again, and the devices drop them by id).
    async fn final_round(&self, mut batch: Vec<Removal>, rx: &mut mpsc::Receiver<Removal>) {
        let deadline = tokio::time::Instant::now() + FINAL_ROUND;
        loop {
            while batch.len() < WRITE_MAX {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                return;
            }
            match self.write(&batch).await {
                Ok(()) => done(std::mem::take(&mut batch)),
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    let ids: usize = batch.iter().map(|r| r.ids.len()).sum();
                    let left: usize = std::iter::from_fn(|| rx.try_recv().ok()).map(|r| r.ids.len()).sum();
                    metrics::counter!("herald_acks_dropped_total").increment((ids + left) as u64);
                    tracing::warn!(error = %e, "acks not recorded before the node stopped; \
                        those messages will be pushed again");
                    return;
                }
            }
        }
    }
}

/// Redis answered the command with an error of its own (not a lost connection): trying
/// again would get the same answer.
fn is_refusal(e: &fred::error::Error) -> bool {
    matches!(e.kind(), fred::error::ErrorKind::InvalidArgument | fred::error::ErrorKind::Parse)
        || e.details().starts_with("WRONGTYPE")
}

/// One write's script calls; an error when any call failed other than by a refusal.
async fn remove(client: &Client, batch: &[Removal]) -> Result<(), fred::error::Error> {
    let mut sets = by_key(batch);
    let calls = calls(&sets, client.is_clustered());
    let pipe = client.pipeline();
    for call in &calls {
        let ids: usize = call.iter().map(|&i| sets[i].1.len()).sum();
        let mut command: Vec<Value> = Vec::with_capacity(2 + 2 * call.len() + ids);
        command.push(scripts::ACKS_REMOVE.script().sha1().clone().into());
        command.push((call.len() as i64).into());
        command.extend(call.iter().map(|&i| Value::from(sets[i].0)));
        for &i in call {
            let members = std::mem::take(&mut sets[i].1);
            command.push((members.len() as i64).into());
            command.extend(members.into_iter().map(Value::from));
        }
        // EVALSHA through `custom`: pipelines have no Lua interface. The slot is the
        // first key's (offset 2: sha, numkeys, key...).
        let _: () = pipe.custom(CustomCommand::new("EVALSHA", ClusterHash::Offset(2), false), command).await?;
    }
    let answers: Vec<Result<Value, fred::error::Error>> = pipe.try_all().await;
    if answers.len() != calls.len() {
        let first_error = answers.into_iter().find_map(Result::err);
        return Err(first_error.unwrap_or_else(|| {
            fred::error::Error::new(fred::error::ErrorKind::Unknown, "acks pipeline answered short")
        }));
    }
    for (call, answer) in calls.iter().zip(answers) {
        let flags = match answer {
            Ok(flags) => flags.into_array(),
            Err(e) if is_refusal(&e) => {
                let keys: Vec<&str> = call.iter().map(|&i| sets[i].0).collect();
                tracing::warn!(?keys, error = %e, "pending sets refused their acks' removal; skipped");
                continue;
            }
            Err(e) => return Err(e),
        };
        for (&i, flag) in call.iter().zip(flags) {
            if flag.as_i64() != Some(1) {
                tracing::warn!(key = sets[i].0, "a pending set refused its acks' removal; skipped");
            }
        }
    }
    Ok(())
}

fn done(batch: Vec<Removal>) {
    for r in batch {
        r.tally.land();
    }
}

#[cfg(test)]
mod tests {
    use fred::interfaces::{KeysInterface, SortedSetsInterface};

    use super::*;

    async fn redis() -> Pool {
        let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis")
    }

    async fn pending(redis: &Pool, ids: &[MsgId]) -> String {
        let key = format!("ut{:08x}:pending", rand::random::<u32>());
        let pairs: Vec<(f64, String)> = ids.iter().map(|i| (i.score(), i.member())).collect();
        let _: i64 = redis.next().zadd(&key, None, None, false, false, pairs).await.unwrap();
        key
    }

    /// Acks handed over by sessions leave their pending sets, and each session's tally
    /// clears once its own are done.
    #[tokio::test]
    async fn handed_acks_leave_their_pending_sets_and_clear_the_tally() {
        let redis = redis().await;
        let ids: Vec<MsgId> = (0..10).map(|i| MsgId((1 << 62) + i)).collect();
        let (a, b) = (pending(&redis, &ids).await, pending(&redis, &ids).await);
        let (queue, writer) = channel(redis.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(writer.run(stop.clone()));
        let (ta, tb) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
        for pair in ids.chunks(2) {
            queue.remove(&a, pair.to_vec(), &ta).unwrap();
        }
        queue.remove(&b, ids[..3].to_vec(), &tb).unwrap();
        tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(ta.cleared(), tb.cleared()) })
            .await
            .expect("both tallies clear");
        let left_a: u64 = redis.next().zcard(&a).await.unwrap();
        let left_b: u64 = redis.next().zcard(&b).await.unwrap();
        stop.cancel();
        task.await.unwrap();
        let _: i64 = redis.next().del(vec![a, b]).await.unwrap();
        assert_eq!((left_a, left_b), (0, 7), "each set lost exactly the ids acked for it");
    }

    /// Acks still queued when the node stops are recorded before the writer ends, not
    /// dropped with the queue.
    #[tokio::test]
    async fn queued_acks_are_recorded_before_the_node_stops() {
        let redis = redis().await;
        let ids: Vec<MsgId> = (0..20).map(|i| MsgId((1 << 62) + i)).collect();
        let key = pending(&redis, &ids).await;
        let (queue, writer) = channel(redis.clone());
        let tally = Arc::new(Tally::default());
        for pair in ids.chunks(2) {
            queue.remove(&key, pair.to_vec(), &tally).unwrap();
        }
        let stop = CancellationToken::new();
        stop.cancel();
        writer.run(stop).await;
        let left: u64 = redis.next().zcard(&key).await.unwrap();
        let _: i64 = redis.next().del(&key).await.unwrap();
        assert_eq!(left, 0, "every queued ack was recorded before the writer ended");
        assert!(tally.is_clear());
    }

    /// A set acked more ids at once than the script removes per ZREM (a backlog
    /// page's worth and more) loses them all, beside a set acked a few.
    #[tokio::test]
    async fn a_set_acked_many_ids_at_once_loses_them_all() {
        let redis = redis().await;
        let ids: Vec<MsgId> = (0..1_203).map(|i| MsgId((1 << 62) + i)).collect();
        let (many, few) = (pending(&redis, &ids).await, pending(&redis, &ids[..5]).await);
        let (queue, writer) = channel(redis.clone());
        let tally = Arc::new(Tally::default());
        queue.remove(&many, ids.clone(), &tally).unwrap();
        queue.remove(&few, ids[..2].to_vec(), &tally).unwrap();
        let stop = CancellationToken::new();
        stop.cancel();
        writer.run(stop).await;
        let left_many: u64 = redis.next().zcard(&many).await.unwrap();
        let left_few: u64 = redis.next().zcard(&few).await.unwrap();
        let _: i64 = redis.next().del(vec![many, few]).await.unwrap();
        assert_eq!((left_many, left_few), (0, 3));
        assert!(tally.is_clear());
    }

    /// A write is one script call on a single Redis, however many sets; in a cluster one
    /// per slot; and a call carries at most [`CALL_IDS`] ids unless one set has more.
    #[test]
    fn a_write_is_one_call_per_slot_of_bounded_size() {
        let ids = |n: usize| vec![String::from("1"); n];
        let sets = vec![("{a}:p:1", ids(3)), ("{b}:p:1", ids(2)), ("{a}:p:2", ids(1))];
        assert_eq!(calls(&sets, false), vec![vec![0, 1, 2]]);
        let mut by_slot = calls(&sets, true);
        by_slot.sort();
        assert_eq!(by_slot, vec![vec![0, 2], vec![1]], "{{a}} and {{b}} hash to different slots");
        let big = vec![("k1", ids(CALL_IDS - 1)), ("k2", ids(2)), ("k3", ids(CALL_IDS + 5)), ("k4", ids(1))];
        assert_eq!(calls(&big, false), vec![vec![0], vec![1], vec![2], vec![3]]);
        let fits = vec![("k1", ids(CALL_IDS - 2)), ("k2", ids(2)), ("k3", ids(1))];
        assert_eq!(calls(&fits, false), vec![vec![0, 1], vec![2]]);
    }

    /// A hand-over the full queue refuses gives its ids back (the session keeps them) and
    /// leaves the tally as it was; nothing is lost.
    #[tokio::test]
    async fn a_full_queue_gives_the_ids_back() {
        let (queue, _writer) = channel_of(redis().await, 1);
        let tally = Arc::new(Tally::default());
        queue.remove("k", vec![MsgId(1)], &tally).unwrap();
        let refused = queue.remove("k", vec![MsgId(2), MsgId(3)], &tally);
        assert_eq!(refused, Err(QueueFull(vec![MsgId(2), MsgId(3)])));
        assert_eq!(tally.waiting.load(Ordering::SeqCst), 1, "only the first hand-over is waited for");
    }

    /// A pending set Redis refuses the removal for (its key holds a string) does not hold
    /// up the other sets' removals.
    #[tokio::test]
    async fn a_refused_set_does_not_hold_up_the_others() {
        let redis = redis().await;
        let ids: Vec<MsgId> = (0..4).map(|i| MsgId((1 << 62) + i)).collect();
        let good = pending(&redis, &ids).await;
        let bad = format!("ut{:08x}:pending", rand::random::<u32>());
        let _: () = redis.next().set(&bad, "not a sorted set", None, None, false).await.unwrap();
        let (queue, writer) = channel(redis.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(writer.run(stop.clone()));
        let tally = Arc::new(Tally::default());
        queue.remove(&bad, ids.clone(), &tally).unwrap();
        queue.remove(&good, ids.clone(), &tally).unwrap();
        tokio::time::timeout(Duration::from_secs(5), tally.cleared()).await.expect("the tally clears");
        let left: u64 = redis.next().zcard(&good).await.unwrap();
        stop.cancel();
        task.await.unwrap();
        let _: i64 = redis.next().del(vec![good, bad]).await.unwrap();
        assert_eq!(left, 0);
    }
}
