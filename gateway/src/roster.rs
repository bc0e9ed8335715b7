//! Presence beyond one session (docs/protocol.md section 4.12): a user's coming online
//! and going offline, announced on the cluster's presence channel, and the presence of
//! a user's contacts (users who share a current conversation with it), at most
//! `gateway.presence_max_users` at a time.
//!
//! A user is online while its presence hash (the devices connected, kept by their
//! sessions) has an entry; its last-seen time is written when its last device leaves.

use std::collections::HashSet;

use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::keys::Keys;
use herald_shared::protocol::{PresenceChange, PresenceState};
use sqlx::mysql::MySqlPool;

use crate::announcer::Announcements;
use crate::error::{ApiError, ApiResult};

#[derive(Clone, Debug)]
pub struct Roster {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    /// `gateway.presence_max_users`.
    pub max_users: usize,
    /// How long a last-seen time is kept (`delivery.device_ttl_s`).
    pub seen_ttl_s: u64,
    /// Where changes go out to every gateway (`crate::announcer`).
    pub announcements: Announcements,
}

impl Roster {
    /// The users of a query or subscription, each once, in their order: at most
    /// `max_users` (else `bad_request`), none empty.
    pub fn users_of(&self, users: Vec<String>) -> ApiResult<Vec<String>> {
        let mut seen = HashSet::new();
        let users: Vec<String> = users.into_iter().filter(|u| seen.insert(u.clone())).collect();
        if users.len() > self.max_users {
            let why =
                format!("{} users; at most {} at a time (gateway.presence_max_users)", users.len(), self.max_users);
            return Err(ApiError::bad_request(why));
        }
        if users.iter().any(|u| u.is_empty() || u.len() > 64) {
            return Err(ApiError::bad_request("a user id must be 1..64 characters"));
        }
        Ok(users)
    }

    /// Which of `users` are `user`'s contacts: they share a conversation it is a current
    /// member of (the user itself is one when it is a member of any). Others are left
    /// out, as if unknown: presence is not for every user of the tenant.
    pub async fn contacts(&self, tenant: &str, user: &str, users: &[String]) -> ApiResult<Vec<String>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT DISTINCT other.user_id FROM members me JOIN members other \
             ON other.tenant_id = me.tenant_id AND other.conv_id = me.conv_id AND other.left_seq IS NULL \
             WHERE me.tenant_id = ",
        );
        q.push_bind(tenant).push(" AND me.user_id = ").push_bind(user).push(" AND me.left_seq IS NULL");
        q.push(" AND other.user_id IN (");
        let mut sep = q.separated(", ");
        for u in users {
            sep.push_bind(u);
        }
        q.push(")");
        let rows = q.build().fetch_all(&self.db).await?;
        let found = rows.iter().map(|r| r.text(0)).collect::<Result<HashSet<String>, _>>()?;
        Ok(users.iter().filter(|u| found.contains(*u)).cloned().collect())
    }

    /// The presence of these users now, in their order.
    pub async fn states(&self, tenant: &str, users: &[String]) -> ApiResult<Vec<PresenceState>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let pipe = self.redis.next().pipeline();
        for u in users {
            let _: () = pipe.hlen(self.keys.presence(tenant, u)).await?;
            let _: () = pipe.get(self.keys.last_seen(tenant, u)).await?;
        }
        let answers: Vec<Value> = pipe.all().await?;
        let mut answers = answers.into_iter();
        let mut states = Vec::with_capacity(users.len());
        for u in users {
            let devices = answers.next().and_then(|v| v.as_u64()).unwrap_or(0);
            let seen = answers.next().and_then(|v| v.as_u64());
            let online = devices > 0;
            states.push(PresenceState { user: u.clone(), online, last_seen: if online { None } else { seen } });
        }
        Ok(states)
    }

    /// `user` has just come online (its first device connected; the claim of the
    /// presence tells). Best effort: presence is a hint, and a failed announcement costs
    /// followers one change.
    pub fn connected(&self, tenant: &str, user: &str) {
        self.announce(tenant, PresenceState { user: user.to_owned(), online: true, last_seen: None });
    }

    /// `user`'s last device gave up its presence (the clearing tells): offline, with
    /// its last-seen time written.
    pub async fn disconnected(&self, tenant: &str, user: &str) {
        let now = herald_shared::ids::now_ms();
        let ttl = Some(Expiration::EX(self.seen_ttl_s.max(1) as i64));
        let seen = self.redis.next().set(self.keys.last_seen(tenant, user), now, ttl, None, false).await;
        let _: Result<(), _> = seen;
        self.announce(tenant, PresenceState { user: user.to_owned(), online: false, last_seen: Some(now) });
    }

    fn announce(&self, tenant: &str, state: PresenceState) {
        self.announcements.announce(PresenceChange { tenant: tenant.to_owned(), state });
    }
}
