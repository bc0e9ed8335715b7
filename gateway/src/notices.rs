//! The node channel: what workers tell this gateway (answers to sends and read
//! receipts, deliveries, read positions, kicks of sessions replaced elsewhere) and what
//! other gateways tell it (typing indicators); and the cluster's presence channel
//! (presence changes, shown to the sessions here that follow the user).

use std::sync::Arc;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use herald_shared::keys::DeviceKey;
use herald_shared::protocol::NodeEnvelope;
use tokio_util::sync::CancellationToken;

use crate::devices::DeviceRegistry;
use crate::identity::Identity;
use crate::sessions::{Ephemeral, EphemeralKind, Push, SessionRegistry};
use crate::waiters::SendWaiters;
use crate::watchers::PresenceWatchers;

/// Subscribes to this node's channel and the presence channel, and dispatches what
/// arrives. The subscriptions are made before the gateway accepts requests, so no
/// answer can precede them.
pub async fn subscribe(
    redis_url: &str,
    tls: &herald_shared::tls::ClientTls,
    channels: Vec<String>,
) -> Result<SubscriberClient, Error> {
    let mut builder = herald_shared::redis::builder(redis_url, tls, std::time::Duration::from_secs(3))?;
    // fred's default (32 messages) overflows within one busy scheduling pause.
    builder.with_performance_config(|p| p.broadcast_channel_capacity = 8192);
    let client = builder.build_subscriber_client()?;
    client.init().await.map_err(|e| herald_shared::redis::connect_error(redis_url, e))?;
    // Re-subscribes after every reconnect; the task lives as long as the client.
    let again = client.clone();
    tokio::spawn(async move {
        let mut reconnects = again.reconnect_rx();
        loop {
            match reconnects.recv().await {
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                _ => {
                    if let Err(e) = resubscribe(&again).await {
                        tracing::warn!(error = %e, "node channel resubscribe failed");
                    }
                }
            }
        }
    });
    // Sharded in a cluster, as workers publish there (`publish_to_node`).
    for channel in channels {
        if client.is_clustered() {
            client.ssubscribe(channel).await?;
        } else {
            client.subscribe(channel).await?;
        }
    }
    Ok(client)
}

/// Subscribes again to the channels the client tracks. Not fred's `resubscribe_all`:
/// it also sends a PSUBSCRIBE without patterns, which Redis refuses, and stops there,
/// before the sharded channels (so in a cluster it never subscribed again).
async fn resubscribe(client: &SubscriberClient) -> Result<(), Error> {
    let channels: Vec<String> = client.tracked_channels().iter().map(|c| c.to_string()).collect();
    if !channels.is_empty() {
        client.subscribe(channels).await?;
    }
    for channel in client.tracked_shard_channels() {
        client.ssubscribe(channel.to_string()).await?;
    }
    Ok(())
}

/// The listener of this node's channel: answers go to their waiters, deliveries,
/// read positions and kicks to the sessions here.
#[derive(Clone, Debug)]
pub struct NodeChannel {
    pub client: SubscriberClient,
    pub waiters: Arc<SendWaiters>,
    pub sessions: Arc<SessionRegistry>,
    pub watchers: Arc<PresenceWatchers>,
    /// Forgets devices that logged out through other gateways.
    pub devices: DeviceRegistry,
    /// Revocations announced by any gateway (this one too).
    pub identity: Arc<Identity>,
}

impl NodeChannel {
    /// Runs until `cancel`; restarted by its supervisor if it fails. The subscription
    /// outlives a restart (fred keeps it), so nothing is missed but what arrived while
    /// it was down, and sessions read their pending sets again for that.
    pub async fn run(self, cancel: CancellationToken) {
        read_again(&self);
        listen(self, cancel).await
    }
}

/// What was announced while the channel was down is read again: pending sets by
/// sessions, registrations and revocations from MySQL and Redis.
fn read_again(channel: &NodeChannel) {
    channel.sessions.reread_all();
    channel.devices.forget_all();
    channel.identity.revocations.forget_all();
}

async fn listen(channel: NodeChannel, cancel: CancellationToken) {
    let NodeChannel { client, waiters, sessions, watchers, devices, identity } = channel;
    let mut rx = client.message_rx();
    let mut reconnects = client.reconnect_rx();
    loop {
        let msg = tokio::select! {
            _ = cancel.cancelled() => break,
            m = rx.recv() => m,
            r = reconnects.recv() => {
                if !matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                    // Pub/sub keeps nothing for a disconnected subscriber: the subscription
                    // is made again (`subscribe`'s task), and sessions read their pending
                    // sets for what they missed.
                    tracing::info!("node channel reconnected; sessions read their pending sets again");
                    sessions.reread_all();
                    // A logout or revocation announced meanwhile was missed:
                    // registrations are made again, revocations read again.
                    devices.forget_all();
                    identity.revocations.forget_all();
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
                devices.forget_all();
                identity.revocations.forget_all();
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
            waiters.resolve(n.rid, n.echo.as_ref(), n.outcome);
        }
        let arrived = tokio::time::Instant::now();
        for d in env.deliver {
            // One allocation per message per node, shared by its sessions here.
            let frame = axum::extract::ws::Utf8Bytes::from(d.frame.get());
            for key in d.to {
                sessions.push(&key, Push { id: d.id, frame: frame.clone(), arrived });
            }
        }
        for r in env.reads {
            for key in r.to {
                sessions.push_read(&key, &r.conv, &r.user, r.seq);
            }
        }
        for p in env.status {
            for key in p.to {
                sessions.push_status(&key, &p.status);
            }
        }
        for d in &env.logouts {
            devices.forget(d);
        }
        for r in &env.revocations {
            identity.revocations.forget(&r.tenant, &r.user);
            sessions.revoke(r);
        }
        for k in env.kick {
            sessions.kick(&DeviceKey::new(k.tenant, k.user, k.device), &k.session);
        }
        for t in env.typing {
            let frame = herald_shared::protocol::ServerFrame::from(t.frame).to_json();
            let frame = axum::extract::ws::Utf8Bytes::from(frame);
            for key in t.to {
                sessions.push_ephemeral(&key, Ephemeral { kind: EphemeralKind::Typing, frame: frame.clone() });
            }
        }
        for p in env.presence {
            let followers = watchers.followers(&p.tenant, &p.state.user);
            if followers.is_empty() {
                continue;
            }
            let frame =
                axum::extract::ws::Utf8Bytes::from(herald_shared::protocol::ServerFrame::from(p.state).to_json());
            for key in followers {
                sessions.push_ephemeral(&key, Ephemeral { kind: EphemeralKind::Presence, frame: frame.clone() });
            }
        }
    }
}
