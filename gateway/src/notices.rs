//! The node channel: what workers tell this gateway (send answers now; deliveries
//! with the WebSocket sessions).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use herald_shared::protocol::{NodeEnvelope, SendOutcome};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::sessions::{Push, SessionRegistry};

/// Send requests waiting for their worker's answer, by request id.
#[derive(Debug, Default)]
pub struct SendWaiters {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<SendOutcome>>>,
}

/// Removes the waiter when the request ends, answered or not (timeouts, client gone).
#[derive(Debug)]
pub struct Waiter {
    pub rid: u64,
    pub rx: oneshot::Receiver<SendOutcome>,
    owner: std::sync::Arc<SendWaiters>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.owner.waiting.lock().expect("waiters").remove(&self.rid);
    }
}

impl SendWaiters {
    pub fn register(self: &std::sync::Arc<Self>) -> Waiter {
        let rid = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiters").insert(rid, tx);
        Waiter { rid, rx, owner: self.clone() }
    }

    fn resolve(&self, rid: u64, outcome: SendOutcome) {
        if let Some(tx) = self.waiting.lock().expect("waiters").remove(&rid) {
            let _ = tx.send(outcome);
        }
    }
}

/// Subscribes to this node's channel and dispatches what arrives. The subscription is
/// made before the gateway accepts requests, so no answer can precede it.
pub async fn subscribe(redis_url: &str, channel: String) -> Result<SubscriberClient, Error> {
    let mut builder = herald_shared::redis::builder(redis_url, std::time::Duration::from_secs(3))?;
    // fred's default (32 messages) overflows within one busy scheduling pause.
    builder.with_performance_config(|p| p.broadcast_channel_capacity = 8192);
    let client = builder.build_subscriber_client()?;
    client.init().await?;
    // Re-subscribes after every reconnect; the task lives as long as the client.
    drop(client.manage_subscriptions());
    client.subscribe(channel).await?;
    Ok(client)
}

pub async fn listen(
    client: SubscriberClient,
    waiters: std::sync::Arc<SendWaiters>,
    sessions: std::sync::Arc<SessionRegistry>,
    cancel: CancellationToken,
) {
    let mut rx = client.message_rx();
    let mut reconnects = client.reconnect_rx();
    loop {
        let msg = tokio::select! {
            _ = cancel.cancelled() => break,
            m = rx.recv() => m,
            r = reconnects.recv() => {
                if !matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                    // Pub/sub keeps nothing for a disconnected subscriber: once subscribed
                    // again, sessions read their pending sets for what they missed.
                    if let Err(e) = client.resubscribe_all().await {
                        tracing::warn!(error = %e, "node channel resubscribe failed");
                    }
                    tracing::info!("node channel reconnected; sessions read their pending sets again");
                    sessions.reread_all();
                }
                continue;
            }
        };
        let msg = match msg {
            Ok(m) => m,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                // Lost answers cost their senders a timeout and a resend (dup: true); lost
                // pushes would strand messages in pending sets of online devices, so every
                // session reads its pending set again.
                metrics::counter!("herald_node_channel_lagged_total").increment(n);
                tracing::warn!(lost = n, "node channel receiver lagged; sessions read their pending sets again");
                sessions.reread_all();
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
        };
        let Some(text) = msg.value.as_str() else {
            continue;
        };
        let env: NodeEnvelope = match serde_json::from_str(&text) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "undecodable node channel message");
                continue;
            }
        };
        for n in env.sent {
            waiters.resolve(n.rid, n.outcome);
        }
        for d in env.deliver {
            // One allocation per message per node, shared by its sessions here.
            let frame = axum::extract::ws::Utf8Bytes::from(d.frame.get());
            for key in d.to {
                sessions.push(&key, Push { id: d.id, frame: frame.clone() });
            }
        }
        for r in env.reads {
            for key in r.to {
                sessions.push_read(&key, &r.conv, &r.user, r.seq);
            }
        }
        for k in env.kick {
            sessions.kick(&herald_shared::keys::DeviceKey::new(k.tenant, k.user, k.device), &k.session);
        }
    }
    let _ = client.quit().await;
}
