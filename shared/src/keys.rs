//! The Redis key schema (docs/architecture.md, "Delivery state") and the values stored
//! under it that more than one process reads: device keys, presence values, epoch
//! markers. The Lua scripts that run on these keys are in [`crate::scripts`].
//!
//! `{t:u}` is a hash tag of tenant and user: every key of one user lives in one Redis
//! Cluster slot, so a script may touch all of them at once. Ingress streams carry their
//! shard number as the tag so they spread over slots.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::auth::Claims;
use crate::ids::MsgId;

/// One device of one user of one tenant: whom a session, a pending set or a push is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    pub tenant: String,
    pub user: String,
    pub device: String,
}

impl DeviceKey {
    pub fn new(tenant: impl Into<String>, user: impl Into<String>, device: impl Into<String>) -> DeviceKey {
        DeviceKey { tenant: tenant.into(), user: user.into(), device: device.into() }
    }

    /// The device a token names.
    pub fn of(c: &Claims) -> DeviceKey {
        DeviceKey::new(c.tid.clone(), c.sub.clone(), c.dev.clone())
    }
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.tenant, self.user, self.device)
    }
}

/// On the node channel a device key is `[tenant, user, device]`.
impl Serialize for DeviceKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.tenant, &self.user, &self.device).serialize(s)
    }
}

impl<'de> Deserialize<'de> for DeviceKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (tenant, user, device) = <(String, String, String)>::deserialize(d)?;
        Ok(DeviceKey { tenant, user, device })
    }
}

/// Where a device is connected: a field of the user's presence hash,
/// `node|session|flags`, where the flags are single letters: `d` when the session asked
/// for delivery statuses (`features=delivered`), so workers push a sender's `delivered`
/// frames to such devices only. A reader skips letters it does not know. A value
/// without the second `|` (`node|session`) was written by a gateway of a release before
/// the flags, which shows statuses to the sessions that asked itself: it counts as
/// asking, so nothing is lost while gateways are upgraded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PresenceValue {
    pub node: String,
    pub session: String,
    /// The session may show `delivered` frames.
    pub statuses: bool,
}

impl PresenceValue {
    pub fn new(node: impl Into<String>, session: impl Into<String>) -> PresenceValue {
        PresenceValue { node: node.into(), session: session.into(), statuses: false }
    }

    /// The same session, marked as showing `delivered` frames (or not).
    pub fn with_statuses(self, statuses: bool) -> PresenceValue {
        PresenceValue { statuses, ..self }
    }

    /// Reads a stored value; `None` for anything that is not `node|session[|flags]`
    /// (node ids and session ids cannot contain `|`).
    pub fn parse(value: &str) -> Option<PresenceValue> {
        let (node, rest) = value.split_once('|')?;
        let (session, statuses) = match rest.split_once('|') {
            Some((session, flags)) => (session, flags.contains('d')),
            None => (rest, true),
        };
        (!node.is_empty()).then(|| PresenceValue::new(node, session).with_statuses(statuses))
    }
}

/// A session id as a kick names it: a gateway of a release before the flags reads
/// `node|session|flags` as the node and `session|flags`, so the flags are cut off.
pub fn kicked_session(named: &str) -> &str {
    named.split_once('|').map_or(named, |(session, _)| session)
}

impl fmt::Display for PresenceValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}|{}", self.node, self.session, if self.statuses { "d" } else { "" })
    }
}

/// The field of a user's devices hash naming the Redis epoch in which the device's
/// pending set was last known complete (see the gateway's recovery).
pub fn epoch_marker(device: &str) -> String {
    format!("epoch:{device}")
}

/// Builds key names under one prefix (`hd` by default; tests use their own).
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys { prefix: prefix.into() }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// [`Keys::pending`] of a device key.
    pub fn pending_of(&self, d: &DeviceKey) -> String {
        self.pending(&d.tenant, &d.user, &d.device)
    }

    /// ZSET of a device's unacked messages: score = id (as f64), member = fixed-width id.
    pub fn pending(&self, tenant: &str, user: &str, device: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:pend:{device}", self.prefix)
    }

    /// HASH of a user's devices: `device` -> platform, `epoch:{device}` -> the Redis
    /// epoch in which the device's pending set was last known complete, and the
    /// device's session epochs: `session:{device}` -> the last one drawn (a session's
    /// admission), `claimed:{device}` -> the one holding its presence.
    pub fn devices(&self, tenant: &str, user: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:devs", self.prefix)
    }

    /// HASH device -> "node|session" of a user's connected devices.
    pub fn presence(&self, tenant: &str, user: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:presence", self.prefix)
    }

    /// STRING: when the user's last device went offline (ms), kept `delivery.device_ttl_s`.
    pub fn last_seen(&self, tenant: &str, user: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:seen", self.prefix)
    }

    /// The pub/sub channel every gateway listens on for presence changes.
    /// HASH `*` | `dev:<device>` -> `not_before` (seconds): tokens of the user (or
    /// device) issued before it are refused; kept `auth.max_token_lifetime_s`.
    pub fn revocations(&self, tenant: &str, user: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:nbf", self.prefix)
    }

    pub fn presence_channel(&self) -> String {
        format!("{}:presence", self.prefix)
    }

    /// HASH device -> lowest id dropped when its pending set went over the cap: the
    /// device must be rebuilt from MySQL.
    pub fn overflow(&self, tenant: &str, user: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:ovf", self.prefix)
    }

    /// HASH of read positions waiting for a device: `{conv} {reader}` -> seq. The
    /// latest position only; removed once the device has confirmed it (pong).
    pub fn reads(&self, tenant: &str, user: &str, device: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:reads:{device}", self.prefix)
    }

    /// The serialized `msg` frame, stored once for every recipient.
    pub fn message(&self, id: MsgId) -> String {
        format!("{}:m:{id}", self.prefix)
    }

    /// STRING set once outbox event `event`'s fan-out finished (kept for the outbox's
    /// retry window): a redo of a finished fan-out is skipped.
    pub fn fanned_out(&self, event: u64) -> String {
        format!("{}:fo:{event}", self.prefix)
    }

    pub fn ingress(&self, shard: u32) -> String {
        format!("{}:ingress:{{{shard}}}", self.prefix)
    }

    /// Pub/sub channel of one gateway node.
    pub fn node_channel(&self, node: &str) -> String {
        format!("{}:gw:{node}", self.prefix)
    }

    /// STRING set by a live gateway node, expiring three of its heartbeats after its
    /// last refresh: a node whose key is gone died.
    pub fn node_live(&self, node: &str) -> String {
        format!("{}:gw:live:{node}", self.prefix)
    }

    /// SET of the gateway nodes that announced themselves (and were not swept yet).
    pub fn nodes(&self) -> String {
        format!("{}:gw:nodes", self.prefix)
    }

    /// SET of the gateway nodes that raise device epochs (`device_epochs`) when they
    /// change devices: workers keep recipients between commits only while every node
    /// of [`Keys::nodes`] is in it, so a gateway of an older release during a rolling
    /// upgrade or a rollback never registers a device a worker's cache would miss.
    pub fn epoch_nodes(&self) -> String {
        format!("{}:gw:nodes:epochs", self.prefix)
    }

    /// SET of the users ([`node_user`]) with a session on a gateway node: whose presence
    /// to clear, and whom to announce offline, if the node dies.
    pub fn node_users(&self, node: &str) -> String {
        format!("{}:gw:users:{node}", self.prefix)
    }

    /// STRING held by the gateway sweeping a dead node's presence (one at a time).
    pub fn node_sweep(&self, node: &str) -> String {
        format!("{}:gw:sweep:{node}", self.prefix)
    }

    pub fn lease(&self, name: &str) -> String {
        format!("{}:lease:{name}", self.prefix)
    }

    /// ZSET worker node -> last heartbeat (ms): the live workers sharing the shards.
    pub fn workers(&self) -> String {
        format!("{}:workers", self.prefix)
    }

    /// ZSET worker node -> last heartbeat (ms) of the workers that read packed sends
    /// (`k=sends`): gateways pack only while every live worker is in it, so a rolling
    /// upgrade or a rollback never hands a pack to a worker that would drop it.
    pub fn packing_workers(&self) -> String {
        format!("{}:workers:packs", self.prefix)
    }

    /// ZSET worker node -> last heartbeat (ms) of the workers whose janitor raises
    /// device epochs when it expires devices: the same gate as [`Keys::epoch_nodes`].
    pub fn epoch_workers(&self) -> String {
        format!("{}:workers:epochs", self.prefix)
    }

    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.prefix)
    }

    /// The highest seq of a conversation fanned out, which devices may hold: a
    /// `last_seq` in MySQL below it went back (a failover to a replica that missed the
    /// last commits) and is never numbered from.
    pub fn seq_seen(&self, tenant: &str, conv: &str) -> String {
        format!("{}:seq:{{{tenant}:{conv}}}", self.prefix)
    }

    /// Hash: the replication id of each Redis shard's master last seen (a promotion
    /// changes it). Its hash tag is the epoch's key, so one script can compare these and
    /// start a new epoch on a cluster too (the prefix has no braces).
    pub fn replids(&self) -> String {
        format!("{{{}:epoch}}:replids", self.prefix)
    }
}

/// A user as a member of a node's user set ([`Keys::node_users`]): `[tenant, user]`.
pub fn node_user(tenant: &str, user: &str) -> String {
    serde_json::to_string(&(tenant, user)).expect("strings serialize")
}

/// The user a member of a node's user set names.
pub fn parse_node_user(member: &str) -> Option<(String, String)> {
    serde_json::from_str(member).ok()
}

/// The consumer group every worker reads the ingress streams with.
pub const INGRESS_GROUP: &str = "workers";

/// Stable shard of a conversation: FNV-1a over tenant and conversation id. Every process
/// must agree on it, so it must never change.
pub fn shard_of(tenant: &str, conv: &str, shards: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tenant.bytes().chain([0u8]).chain(conv.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(shards)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_user_share_a_hash_tag() {
        let k = Keys::new("hd");
        assert_eq!(k.pending("acme", "alice", "p1"), "hd:{acme:alice}:pend:p1");
        assert_eq!(k.presence("acme", "alice"), "hd:{acme:alice}:presence");
        assert_eq!(k.ingress(3), "hd:ingress:{3}");
        assert_eq!(k.replids(), "{hd:epoch}:replids", "in the epoch's slot");
    }

    #[test]
    fn presence_values_round_trip_with_their_flags_and_refuse_garbage() {
        let v = PresenceValue::new("gw-1", "gw-1-00ff");
        assert_eq!(v.to_string(), "gw-1|gw-1-00ff|");
        assert_eq!(PresenceValue::parse(&v.to_string()), Some(v));
        assert_eq!(PresenceValue::parse("no-bar"), None);
        assert_eq!(PresenceValue::parse("|s|"), None);
        let asked = PresenceValue::new("gw-1", "gw-1-00ff").with_statuses(true);
        assert_eq!(asked.to_string(), "gw-1|gw-1-00ff|d");
        assert_eq!(PresenceValue::parse("gw-1|gw-1-00ff|d"), Some(asked.clone()));
        assert_eq!(PresenceValue::parse("gw-1|gw-1-00ff|xd"), Some(asked.clone()), "unknown flags are skipped");
        assert_eq!(PresenceValue::parse("gw-1|gw-1-00ff|x").map(|p| p.statuses), Some(false));
        assert_eq!(PresenceValue::parse("gw-1|gw-1-00ff"), Some(asked), "an older gateway's session may show them");
        assert_eq!(kicked_session("gw-1-00ff|d"), "gw-1-00ff");
        assert_eq!(kicked_session("gw-1-00ff|"), "gw-1-00ff");
        assert_eq!(kicked_session("gw-1-00ff"), "gw-1-00ff");
        assert_eq!(epoch_marker("p1"), "epoch:p1");
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("acme", "c1", 8), shard_of("acme", "c1", 8));
        let used: std::collections::HashSet<u32> = (0..200).map(|i| shard_of("acme", &format!("c{i}"), 8)).collect();
        assert_eq!(used.len(), 8);
        assert_ne!(shard_of("a", "bc", 1 << 20), shard_of("ab", "c", 1 << 20));
    }
}
