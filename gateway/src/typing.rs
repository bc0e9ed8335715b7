//! Typing indicators (docs/protocol.md section 4.12): who may send one (a current
//! member, checked against a short-lived copy of the conversation's members) and where
//! it goes (the online devices of the other members, by node, over the node channels,
//! the way workers push messages). Never stored: nothing is written but a PUBLISH, and a
//! node or session that cannot take it drops it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::error::ErrorCode;
use herald_shared::keys::{DeviceKey, Keys, PresenceValue};
use herald_shared::protocol::{NodeEnvelope, TypingPush, TypingShown, TypingState};
use sqlx::mysql::MySqlPool;

use crate::error::{ApiError, ApiResult};

/// How long a conversation's members, and where their devices are connected, are
/// reused: a member removed within it may still be shown typing that long, and a device
/// that connected within it may miss indicators that long. Typing comes in bursts of a
/// few frames per conversation, so this spares MySQL and Redis all but the first of them
/// (a presence read per member per frame cost Redis 9 us per indicator shown, about a
/// fifth of the server's CPU per indicator: docs/benchmarks.md, change 18).
const MEMBERS_FRESH: Duration = Duration::from_secs(2);
/// Conversations whose members are kept at most; past it the stale ones are dropped
/// (and all of them if none is stale), so the copy never grows without bound.
const MEMBERS_KEPT: usize = 10_000;

/// What became of a typing frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Relayed {
    /// Published to this many online devices.
    To(usize),
    /// The conversation has more than `gateway.typing_max_members` members.
    TooManyMembers,
}

#[derive(Debug)]
struct Members {
    users: Arc<Vec<String>>,
    /// Where the members' devices are connected, once a frame needed it.
    routes: Option<Arc<Routes>>,
    read_at: Instant,
}

/// Each online device of the members, with the node its session is on.
type Routes = Vec<(String, DeviceKey)>;

/// Relays typing frames of this node's sessions.
#[derive(Debug)]
pub struct TypingRelay {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    /// `gateway.typing_expiry_ms`, told to receivers as `expires_in_ms`.
    pub expiry_ms: u64,
    /// `gateway.typing_max_members`.
    pub max_members: usize,
    members: Mutex<HashMap<(String, String), Members>>,
}

impl TypingRelay {
    pub fn new(db: MySqlPool, redis: Pool, keys: Keys, expiry_ms: u64, max_members: usize) -> TypingRelay {
        TypingRelay { db, redis, keys, expiry_ms, max_members, members: Mutex::default() }
    }

    /// Shows `user` typing in `conv` to the other members' online devices. A
    /// conversation of the tenant that does not exist: `not_found`; one the user is not
    /// a member of (or no longer): `forbidden`.
    pub async fn relay(&self, tenant: &str, user: &str, conv: &str, state: TypingState) -> ApiResult<Relayed> {
        let members = self.members(tenant, conv).await?;
        if !members.iter().any(|m| m == user) {
            return Err(ApiError::new(ErrorCode::Forbidden, "not a member of this conversation"));
        }
        if members.len() > self.max_members {
            return Ok(Relayed::TooManyMembers);
        }
        if members.len() < 2 {
            return Ok(Relayed::To(0));
        }
        let routes = self.routes(tenant, conv, &members).await?;
        let frame = TypingShown { conv: conv.to_owned(), user: user.to_owned(), state, expires_in_ms: self.expiry_ms };
        let mut by_node: BTreeMap<&str, Vec<DeviceKey>> = BTreeMap::new();
        for (node, to) in routes.iter().filter(|(_, to)| to.user != user) {
            by_node.entry(node.as_str()).or_default().push(to.clone());
        }
        let mut devices = 0;
        for (node, to) in by_node {
            devices += to.len();
            let env = NodeEnvelope { typing: vec![TypingPush { frame: frame.clone(), to }], ..Default::default() };
            let payload = serde_json::to_string(&env).expect("envelope serializes");
            herald_shared::redis::publish_to_node(self.redis.next(), self.keys.node_channel(node), payload).await?;
        }
        Ok(Relayed::To(devices))
    }

    /// Where the members' devices are connected, from the copy while it is fresh: one
    /// read of each member's presence when it is not.
    async fn routes(&self, tenant: &str, conv: &str, members: &Arc<Vec<String>>) -> ApiResult<Arc<Routes>> {
        let key = (tenant.to_owned(), conv.to_owned());
        if let Some(m) = self.members.lock().expect("members").get(&key) {
            if let Some(routes) = m.routes.as_ref().filter(|_| Arc::ptr_eq(&m.users, members)) {
                return Ok(routes.clone());
            }
        }
        let pipe = self.redis.next().pipeline();
        for m in members.iter() {
            let _: () = pipe.hgetall(self.keys.presence(tenant, m)).await?;
        }
        let presences: Vec<HashMap<String, String>> = pipe.all().await?;
        let mut routes = Routes::new();
        for (member, presence) in members.iter().zip(presences) {
            for (device, value) in presence {
                let Some(PresenceValue { node, .. }) = PresenceValue::parse(&value) else { continue };
                routes.push((node, DeviceKey::new(tenant, member.as_str(), device)));
            }
        }
        let routes = Arc::new(routes);
        // Kept with the members they were read for (not with a newer copy of them).
        if let Some(m) = self.members.lock().expect("members").get_mut(&key) {
            if Arc::ptr_eq(&m.users, members) {
                m.routes = Some(routes.clone());
            }
        }
        Ok(routes)
    }

    /// The conversation's current members, from the copy when it is fresh.
    async fn members(&self, tenant: &str, conv: &str) -> ApiResult<Arc<Vec<String>>> {
        let key = (tenant.to_owned(), conv.to_owned());
        if let Some(m) = self.members.lock().expect("members").get(&key) {
            if m.read_at.elapsed() < MEMBERS_FRESH {
                return Ok(m.users.clone());
            }
        }
        let rows = sqlx::query("SELECT user_id FROM members WHERE tenant_id = ? AND conv_id = ? AND left_seq IS NULL")
            .bind(tenant)
            .bind(conv)
            .fetch_all(&self.db)
            .await?;
        let users = rows.iter().map(|r| r.text(0)).collect::<Result<Vec<String>, _>>()?;
        if users.is_empty() && !herald_shared::db::conversation_exists(&self.db, tenant, conv).await? {
            return Err(ApiError::not_found());
        }
        let users = Arc::new(users);
        let mut kept = self.members.lock().expect("members");
        if kept.len() >= MEMBERS_KEPT {
            kept.retain(|_, m| m.read_at.elapsed() < MEMBERS_FRESH);
            if kept.len() >= MEMBERS_KEPT {
                kept.clear();
            }
        }
        kept.insert(key, Members { users: users.clone(), routes: None, read_at: Instant::now() });
        Ok(users)
    }
}
