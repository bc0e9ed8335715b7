//! Gateways that die (SIGKILL, a lost machine) end no session: nothing clears their
//! devices' presence or tells the users' followers. Every gateway keeps a liveness key
//! (`hd:gw:live:{node}`, three heartbeats) and the set of users it holds sessions of
//! (`hd:gw:users:{node}`); every heartbeat it looks for nodes of `hd:gw:nodes` whose
//! liveness key expired, and one gateway (a sweep lock) drops their presence entries
//! and announces each user left with no device online as offline, with a last-seen
//! time. So a follower is told within four heartbeats of the death.
//!
//! A gateway that starts again under the same node id does the same to the entries of
//! its previous life (those naming sessions it does not hold) before anything else.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use futures::stream::{self, StreamExt};
use herald_shared::keys::{node_user, parse_node_user, DeviceKey, Keys, PresenceValue};
use herald_shared::scripts;
use tokio_util::sync::CancellationToken;

use crate::roster::Roster;
use crate::sessions::SessionRegistry;

/// Users swept at once.
const SWEEP_CONCURRENCY: usize = 32;

/// Every this many rounds (half heartbeats), the users of the sessions held here are
/// added to the node's set again: a removal at a session's end can race a new session
/// of the same user.
const READD_EVERY: u64 = 10;

#[derive(Clone, Debug)]
pub struct NodeLiveness {
    pub redis: Pool,
    pub keys: Keys,
    pub node: String,
    pub heartbeat: Duration,
    pub roster: Roster,
    pub sessions: Arc<SessionRegistry>,
}

impl NodeLiveness {
    pub async fn run(self, cancel: CancellationToken) {
        let mut round: u64 = 0;
        loop {
            if let Err(e) = self.round(round).await {
                tracing::debug!(error = %e, "liveness round failed");
            }
            round += 1;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.heartbeat / 2) => {}
            }
        }
    }

    async fn round(&self, round: u64) -> Result<(), Error> {
        let client = self.redis.next();
        let ttl = Expiration::PX((self.heartbeat.as_millis() * 3) as i64);
        let _: () = client.set(self.keys.node_live(&self.node), 1, Some(ttl), None, false).await?;
        // This node raises device epochs: said before it counts as a node, so no worker
        // sees it as a node that does not (`Keys::epoch_nodes`).
        let _: i64 = client.sadd(self.keys.epoch_nodes(), self.node.as_str()).await?;
        let _: i64 = client.sadd(self.keys.nodes(), self.node.as_str()).await?;
        if round == 0 {
            // Entries of this node's previous life (same node id) name no session here.
            self.sweep(&self.node).await?;
        }
        if round % READD_EVERY == READD_EVERY - 1 {
            let users: Vec<String> = self.sessions.users().iter().map(|(t, u)| node_user(t, u)).collect();
            for chunk in users.chunks(1_000) {
                let _: i64 = client.sadd(self.keys.node_users(&self.node), chunk.to_vec()).await?;
            }
        }
        let nodes: Vec<String> = client.smembers(self.keys.nodes()).await?;
        for node in nodes.iter().filter(|n| **n != self.node) {
            let live: i64 = client.exists(self.keys.node_live(node)).await?;
            if live == 1 {
                continue;
            }
            // One gateway sweeps a dead node; another takes over if it dies meanwhile.
            let lock = Expiration::PX((self.heartbeat.as_millis() * 10) as i64);
            let won: Option<String> = client
                .set(self.keys.node_sweep(node), self.node.as_str(), Some(lock), Some(SetOptions::NX), false)
                .await?;
            if won.is_none() {
                continue;
            }
            let swept = self.sweep(node).await?;
            let _: i64 = client.srem(self.keys.nodes(), node.as_str()).await?;
            let _: i64 = client.srem(self.keys.epoch_nodes(), node.as_str()).await?;
            let _: i64 = client.del(self.keys.node_users(node)).await?;
            metrics::counter!("herald_dead_gateways_swept_total").increment(1);
            tracing::warn!(node = %node, users = swept, "a gateway died; its users' presence was cleared");
        }
        Ok(())
    }

    /// Drops the presence entries of `node` that name no live session (all of them for
    /// another node) for every user of its set; announces offline each user left with
    /// no device connected. Answers how many users were announced.
    async fn sweep(&self, node: &str) -> Result<usize, Error> {
        let members: Vec<String> = self.redis.next().smembers(self.keys.node_users(node)).await?;
        let users: Vec<(String, String)> = members.iter().filter_map(|m| parse_node_user(m)).collect();
        let own = node == self.node;
        let announced: Vec<Result<bool, Error>> = stream::iter(users)
            .map(|(tenant, user)| self.sweep_user(node, own, tenant, user))
            .buffer_unordered(SWEEP_CONCURRENCY)
            .collect()
            .await;
        let mut n = 0;
        for a in announced {
            if a? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// One user of a swept node; true when announced offline.
    async fn sweep_user(&self, node: &str, own: bool, tenant: String, user: String) -> Result<bool, Error> {
        let (tenant, user) = (tenant.as_str(), user.as_str());
        let client = self.redis.next();
        let key = self.keys.presence(tenant, user);
        let entries: HashMap<String, String> = client.hgetall(&key).await?;
        let mut stale = Vec::new();
        for (device, value) in entries {
            let Some(p) = PresenceValue::parse(&value) else { continue };
            let held_here = own && self.sessions.holds(&DeviceKey::new(tenant, user, device.as_str()), &p.session);
            if p.node == node && !held_here {
                stale.push(device);
                stale.push(value);
            }
        }
        if own && stale.is_empty() {
            return Ok(false);
        }
        let (dropped, left): (i64, i64) = if stale.is_empty() {
            (0, client.hlen(&key).await?)
        } else {
            let r: Vec<i64> = scripts::PRESENCE_DROP.call(client, vec![key], stale).await?;
            (r.first().copied().unwrap_or(0), r.get(1).copied().unwrap_or(0))
        };
        // A dead node's user whose entry expired already was not announced either.
        if left == 0 && (dropped > 0 || !own) {
            self.roster.disconnected(tenant, user).await;
            return Ok(true);
        }
        Ok(false)
    }
}
