//! Acks that a session could not record before it ended (Redis down as the device
//! left): kept and retried by one loop of the node until they land, so an acked id is
//! never pushed to its device again because its removal was forgotten.

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
                _ = cancel.cancelled() => return,
                r = rx.recv() => match r { Some(r) => r, None => return },
            };
            loop {
                let members: Vec<String> = ids.iter().map(|i| i.member()).collect();
                match self.redis.next().zrem::<i64, _, _>(&key, members).await {
                    Ok(_) => {
                        backoff = Duration::from_millis(200);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "leftover acks not recorded yet; retrying");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    }
}
