//! Acks that a session could not record before it ended (Redis down as the device
//! left): kept and retried by one loop of the node until they land, so an acked id is
//! never pushed to its device again because its removal was forgotten. When the node
//! stops, what is still queued gets a last, bounded round before the process exits.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::SortedSetsInterface;
use fred::prelude::Pool;
use herald_shared::ids::MsgId;
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

/// Removals waiting: (pending set key, acked ids).
type Removal = (String, Vec<MsgId>);

/// Where sessions leave the acks they could not record.
#[derive(Clone, Debug)]
pub struct LeftoverAcks(mpsc::Sender<Removal>);

impl LeftoverAcks {
    pub fn keep(&self, key: String, ids: Vec<MsgId>) {
        if ids.is_empty() {
            return;
        }
        if self.0.try_send((key, ids)).is_err() {
            metrics::counter!("herald_acks_dropped_total").increment(1);
            tracing::warn!("the leftover ack queue is full; those messages will be pushed again");
        }
    }
}

/// Sessions ending during a Redis outage; each entry holds one session's batch.
const QUEUE: usize = 65_536;
/// How long a stopping node keeps trying to record its leftover acks (within the
/// process's 10 s stop bound).
const FINAL_ROUND: Duration = Duration::from_secs(5);

/// The loop that retries leftover removals (restartable; its queue outlives it).
#[derive(Clone, Debug)]
pub struct AckRetrier {
    redis: Pool,
    rx: Arc<Mutex<mpsc::Receiver<Removal>>>,
}

pub fn channel(redis: Pool) -> (LeftoverAcks, AckRetrier) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (LeftoverAcks(tx), AckRetrier { redis, rx: Arc::new(Mutex::new(rx)) })
}

impl AckRetrier {
    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let mut backoff = Duration::from_millis(200);
        loop {
            let (key, ids) = tokio::select! {
                biased;
                r = rx.recv() => match r { Some(r) => r, None => return },
                _ = cancel.cancelled() => return self.final_round(None, &mut rx).await,
            };
            loop {
                match self.remove(&key, &ids).await {
                    Ok(()) => {
                        backoff = Duration::from_millis(200);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "leftover acks not recorded yet; retrying");
                        tokio::select! {
                            _ = cancel.cancelled() => return self.final_round(Some((key, ids)), &mut rx).await,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    }

    async fn remove(&self, key: &str, ids: &[MsgId]) -> Result<(), fred::error::Error> {
        let members: Vec<String> = ids.iter().map(|i| i.member()).collect();
        self.redis.next().zrem::<i64, _, _>(key, members).await.map(drop)
    }

    /// The node stops: every removal still queued (`current` first) is tried until it
    /// lands or [`FINAL_ROUND`] is over; what is left then is counted and logged (those
    /// messages will be pushed again, and the devices drop them by id).
    async fn final_round(&self, mut current: Option<Removal>, rx: &mut mpsc::Receiver<Removal>) {
        let deadline = tokio::time::Instant::now() + FINAL_ROUND;
        while let Some((key, ids)) = current.take().or_else(|| rx.try_recv().ok()) {
            loop {
                match self.remove(&key, &ids).await {
                    Ok(()) => break,
                    Err(_) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => {
                        metrics::counter!("herald_acks_dropped_total").increment(ids.len() as u64);
                        tracing::warn!(error = %e, "leftover acks not recorded before the node stopped; \
                            those messages will be pushed again");
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use fred::interfaces::KeysInterface;

    use super::*;

    /// Acks left by sessions that ended while Redis failed are recorded when the node
    /// stops, not dropped with the queue. Before: the retrier returned as soon as it was
    /// cancelled, whatever it still held.
    #[tokio::test]
    async fn leftover_acks_are_recorded_before_the_node_stops() {
        let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        let redis = herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis");
        let key = format!("ut{:08x}:pending", rand::random::<u32>());
        let ids: Vec<MsgId> = (0..20).map(|i| MsgId((1 << 62) + i)).collect();
        let pairs: Vec<(f64, String)> = ids.iter().map(|i| (i.score(), i.member())).collect();
        let _: i64 = redis.next().zadd(&key, None, None, false, false, pairs).await.unwrap();
        let (leftover, retrier) = channel(redis.clone());
        for pair in ids.chunks(2) {
            leftover.keep(key.clone(), pair.to_vec());
        }
        let stop = CancellationToken::new();
        stop.cancel();
        retrier.run(stop).await;
        let left: u64 = redis.next().zcard(&key).await.unwrap();
        let _: i64 = redis.next().del(&key).await.unwrap();
        assert_eq!(left, 0, "every leftover ack was recorded before the retrier ended");
    }
}
