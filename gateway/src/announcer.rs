//! The node's presence announcer: users coming online and going offline here reach
//! every gateway on the cluster's presence channel, each PUBLISH carrying the changes
//! that arrived while the previous one was under way, in their order. There is no
//! linger: a lone change goes at once. A change published on its own cost a PUBLISH
//! here, a copy to every gateway in Redis and an envelope parsed by each of them: a
//! login storm paid that once per session.
//!
//! Presence is a hint (docs/protocol.md section 4.12): a change that cannot be
//! published is dropped, counted in `herald_presence_changes_dropped_total`, as one
//! the queue has no room for; followers see the user's next change.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Pool;
use herald_shared::keys::Keys;
use herald_shared::protocol::{NodeEnvelope, PresenceChange};
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

/// Changes waiting at most.
const QUEUE: usize = 65_536;
/// Changes in one PUBLISH at most (a change is about 100 bytes of JSON).
const PUBLISH_MAX: usize = 2_048;
/// How long a stopping node keeps publishing what is queued.
const FINAL_ROUND: Duration = Duration::from_secs(2);

/// Where presence changes are handed over.
#[derive(Clone, Debug)]
pub struct Announcements(mpsc::Sender<PresenceChange>);

impl Announcements {
    /// Queues a change; never waits.
    pub fn announce(&self, change: PresenceChange) {
        if self.0.try_send(change).is_err() {
            metrics::counter!("herald_presence_changes_dropped_total").increment(1);
        }
    }
}

/// The announcer: restartable, its queue outlives a restart.
#[derive(Clone, Debug)]
pub struct Announcer {
    redis: Pool,
    channel: String,
    rx: Arc<Mutex<mpsc::Receiver<PresenceChange>>>,
}

/// The queue and the announcer that empties it onto the presence channel.
pub fn channel(redis: Pool, keys: &Keys) -> (Announcements, Announcer) {
    channel_of(redis, keys, QUEUE)
}

fn channel_of(redis: Pool, keys: &Keys, capacity: usize) -> (Announcements, Announcer) {
    let (tx, rx) = mpsc::channel(capacity);
    (Announcements(tx), Announcer { redis, channel: keys.presence_channel(), rx: Arc::new(Mutex::new(rx)) })
}

impl Announcer {
    /// Runs until `cancel`, then publishes what is still queued (bounded in time).
    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let mut batch = Vec::new();
        loop {
            tokio::select! {
                biased;
                n = rx.recv_many(&mut batch, PUBLISH_MAX) => if n == 0 { return },
                _ = cancel.cancelled() => break,
            }
            self.publish(&mut batch).await;
        }
        // What is still queued, a PUBLISH at a time.
        let last = async {
            while !batch.is_empty() || !rx.is_empty() {
                let room = PUBLISH_MAX - batch.len();
                batch.extend(std::iter::from_fn(|| rx.try_recv().ok()).take(room));
                self.publish(&mut batch).await;
            }
        };
        let _ = tokio::time::timeout(FINAL_ROUND, last).await;
    }

    /// One envelope of the changes, in their order; emptied whether or not it landed.
    async fn publish(&self, batch: &mut Vec<PresenceChange>) {
        let n = batch.len() as u64;
        let env = NodeEnvelope { presence: std::mem::take(batch), ..Default::default() };
        let payload = serde_json::to_string(&env).expect("envelope serializes");
        if let Err(e) = herald_shared::redis::publish_to_node(self.redis.next(), self.channel.clone(), payload).await {
            metrics::counter!("herald_presence_changes_dropped_total").increment(n);
            tracing::debug!(error = %e, changes = n, "presence changes not announced");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::prelude::*;
    use herald_shared::protocol::PresenceState;

    /// The test Redis, a fresh prefix, and a subscriber to its presence channel (kept
    /// alive by the caller) with its messages.
    async fn listening(
    ) -> (Pool, Keys, fred::clients::SubscriberClient, tokio::sync::broadcast::Receiver<fred::types::Message>) {
        let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        let redis = herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis");
        let keys = Keys::new(format!("ut-announcer-{:08x}", rand::random::<u32>()));
        let subscriber = herald_shared::redis::builder(&url, &Default::default(), Duration::from_secs(3))
            .expect("a builder")
            .build_subscriber_client()
            .expect("a subscriber");
        subscriber.init().await.expect("connected");
        let messages = subscriber.message_rx();
        subscriber.subscribe(keys.presence_channel()).await.expect("subscribed");
        (redis, keys, subscriber, messages)
    }

    /// Changes handed over while a PUBLISH is under way go out together, in their
    /// order, none lost: 500 changes reach a subscriber in far fewer messages (before,
    /// a PUBLISH each).
    #[tokio::test]
    async fn changes_go_out_together_in_their_order() {
        let (redis, keys, _subscriber, mut messages) = listening().await;

        let (announcements, announcer) = channel(redis, &keys);
        let cancel = CancellationToken::new();
        let running = tokio::spawn(announcer.run(cancel.clone()));
        let users: Vec<String> = (0..500).map(|i| format!("u{i}")).collect();
        for u in &users {
            let state = PresenceState { user: u.clone(), online: true, last_seen: None };
            announcements.announce(PresenceChange { tenant: "t".into(), state });
        }
        let (mut seen, mut publishes) = (Vec::new(), 0);
        while seen.len() < users.len() {
            let msg = tokio::time::timeout(Duration::from_secs(5), messages.recv()).await.expect("in time").unwrap();
            let env: NodeEnvelope = serde_json::from_str(&msg.value.as_string().unwrap()).expect("an envelope");
            seen.extend(env.presence.into_iter().map(|c| c.state.user));
            publishes += 1;
        }
        assert_eq!(seen, users, "every change, once, in order");
        assert!(publishes < 50, "500 changes took {publishes} publishes");

        // Changes queued as the node stops still go out.
        for u in &users[..10] {
            let state = PresenceState { user: u.clone(), online: false, last_seen: Some(1) };
            announcements.announce(PresenceChange { tenant: "t".into(), state });
        }
        cancel.cancel();
        running.await.unwrap();
        let mut last = Vec::new();
        while last.len() < 10 {
            let msg = tokio::time::timeout(Duration::from_secs(5), messages.recv()).await.expect("in time").unwrap();
            let env: NodeEnvelope = serde_json::from_str(&msg.value.as_string().unwrap()).expect("an envelope");
            last.extend(env.presence.into_iter().map(|c| (c.state.user, c.state.online)));
        }
        let expected: Vec<(String, bool)> = users[..10].iter().map(|u| (u.clone(), false)).collect();
        assert_eq!(last, expected, "the changes queued at the stop, in order");
    }

    /// While the queue is full (Redis slow or down), a change is dropped at once, never
    /// waited for; those queued before it still go out, in order.
    #[tokio::test]
    async fn a_full_queue_drops_changes_without_waiting() {
        let (redis, keys, _subscriber, mut messages) = listening().await;

        // No announcer running yet: the queue of 3 fills, the next two are dropped.
        let (announcements, announcer) = channel_of(redis, &keys, 3);
        let started = std::time::Instant::now();
        for i in 0..5 {
            let state = PresenceState { user: format!("u{i}"), online: true, last_seen: None };
            announcements.announce(PresenceChange { tenant: "t".into(), state });
        }
        assert!(started.elapsed() < Duration::from_secs(1), "announcing never waits for room");
        let cancel = CancellationToken::new();
        let running = tokio::spawn(announcer.run(cancel.clone()));
        let msg = tokio::time::timeout(Duration::from_secs(5), messages.recv()).await.expect("in time").unwrap();
        let env: NodeEnvelope = serde_json::from_str(&msg.value.as_string().unwrap()).expect("an envelope");
        let users: Vec<String> = env.presence.into_iter().map(|c| c.state.user).collect();
        assert_eq!(users, ["u0", "u1", "u2"], "the queued changes, the dropped ones not");
        cancel.cancel();
        running.await.unwrap();
        let more = tokio::time::timeout(Duration::from_millis(300), messages.recv()).await;
        assert!(more.is_err(), "nothing else was published: {more:?}");
    }
}
