//! A session's presence: the `node|session|flags` value in the user's presence hash that
//! tells workers where to push, and makes one session per device (a newer one replaces
//! the older, here or on another node through a `kick`). Newer means admitted later:
//! each session draws an epoch from a per-device counter when admitted, and a claim
//! with a lower epoch than the device's last claim replaces nothing.

use fred::prelude::*;
use herald_shared::keys::{node_user, DeviceKey, Keys, PresenceValue};
use herald_shared::protocol::{Kick, NodeEnvelope};
use herald_shared::scripts;

#[derive(Debug)]
pub struct Presence {
    key: String,
    device: DeviceKey,
    value: PresenceValue,
    /// The entry outlives three missed heartbeats, no more.
    ttl_ms: u64,
    /// The session's place among the device's sessions, drawn when it was admitted
    /// ([`draw_epoch`]): a claim never replaces a session with a higher one.
    epoch: u64,
}

/// What a claim did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This session holds the device's presence; `true` when the user has just come
    /// online (the device was not connected, and no other device of the user is).
    Held(bool),
    /// A newer session of the device claimed it first: this one must end (4002).
    Superseded,
}

/// What keeping the presence found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    Held,
    /// It had vanished and was set again.
    SetAgain,
    /// A newer session of the device holds it (its kick did not arrive): end (4002).
    Superseded,
}

/// The next session epoch of the device: drawn when a session is admitted, before
/// anything slow (its registration, its start), so sessions are ordered by when they
/// came, whichever gateway's claim reaches Redis first.
pub async fn draw_epoch(redis: &Client, keys: &Keys, d: &DeviceKey) -> Result<u64, Error> {
    redis.hincrby(keys.devices(&d.tenant, &d.user), format!("session:{}", d.device), 1).await
}

impl Presence {
    pub fn new(keys: &Keys, device: &DeviceKey, value: PresenceValue, heartbeat_ms: u64, epoch: u64) -> Presence {
        Presence {
            key: keys.presence(&device.tenant, &device.user),
            device: device.clone(),
            value,
            ttl_ms: heartbeat_ms * 3,
            epoch,
        }
    }

    /// Marks the session's value as showing `delivered` frames: workers push a sender's
    /// statuses only to such devices. Set before the first claim.
    pub fn show_statuses(&mut self) {
        self.value.statuses = true;
    }

    /// Whether the session shows `delivered` frames.
    pub fn statuses(&self) -> bool {
        self.value.statuses
    }

    /// The session's epoch among its device's sessions.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    fn keys(&self, keys: &Keys) -> Vec<String> {
        vec![self.key.clone(), keys.devices(&self.device.tenant, &self.device.user)]
    }

    fn args(&self) -> Vec<String> {
        vec![self.device.device.clone(), self.value.to_string(), self.ttl_ms.to_string(), self.epoch.to_string()]
    }

    /// Takes the device's presence, unless a newer session of the device has. A session
    /// it replaces on another node is told to close (4002); one on this node was told
    /// when this session registered. The count of the user's connected devices comes
    /// with the claim, no second read.
    pub async fn claim(&self, redis: &Client, keys: &Keys) -> Result<Claim, Error> {
        // The node's user set first: should the node die once the claim landed, the
        // surviving gateways find the user there, clear its entry and announce it.
        let users = keys.node_users(&self.value.node);
        let _: i64 = redis.sadd(users, node_user(&self.device.tenant, &self.device.user)).await?;
        let (old, devices, claimed): (Option<String>, u64, u8) =
            scripts::PRESENCE_SET.call(redis, self.keys(keys), self.args()).await?;
        if claimed == 0 {
            return Ok(Claim::Superseded);
        }
        let Some(old) = old.as_deref().and_then(PresenceValue::parse) else { return Ok(Claim::Held(devices == 1)) };
        if old.node == self.value.node {
            return Ok(Claim::Held(false));
        }
        let kick = NodeEnvelope {
            kick: vec![Kick {
                tenant: self.device.tenant.clone(),
                user: self.device.user.clone(),
                device: self.device.device.clone(),
                session: old.session,
            }],
            ..Default::default()
        };
        let kick = serde_json::to_string(&kick).expect("serializes");
        herald_shared::redis::publish_to_node(redis, keys.node_channel(&old.node), kick).await?;
        Ok(Claim::Held(false))
    }

    /// Refreshes the entry's TTL, setting it again if it vanished (Redis lost its data,
    /// or the key expired while Redis was unreachable), unless a newer session of the
    /// device claimed it. An error counts as held: the next heartbeat tries again.
    pub async fn keep(&self, redis: &Client, keys: &Keys) -> Kept {
        let set: Result<i64, _> = scripts::PRESENCE_KEEP.call(redis, self.keys(keys), self.args()).await;
        match set {
            Ok(1) => Kept::SetAgain,
            Ok(2) => Kept::Superseded,
            _ => Kept::Held,
        }
    }

    /// The user has no session on this node any more (its last one gave its entry up):
    /// out of the node's user set. Best effort: a user left there is swept for nothing.
    pub async fn leave_node(&self, redis: &Client, keys: &Keys) {
        let users = keys.node_users(&self.value.node);
        let left: Result<i64, _> = redis.srem(users, node_user(&self.device.tenant, &self.device.user)).await;
        if let Err(e) = left {
            tracing::debug!(error = %e, "not taken out of the node's user set");
        }
    }

    /// Gives the entry up if it is still this session's: to `successor`, the device's
    /// newer session on this node (its id, and whether it shows `delivered` frames),
    /// when there is one; else it is cleared. True when it was cleared and the user has
    /// no device connected any more (it has gone offline).
    pub async fn give_up(&self, redis: &Client, successor: Option<(&str, bool)>) -> bool {
        let mut args = vec![self.device.device.clone(), self.value.to_string()];
        if let Some((session, statuses)) = successor {
            args.push(PresenceValue::new(self.value.node.as_str(), session).with_statuses(statuses).to_string());
        }
        let given: Result<i64, _> = scripts::PRESENCE_CLEAR.call(redis, vec![self.key.clone()], args).await;
        successor.is_none() && matches!(given, Ok(2))
    }
}
