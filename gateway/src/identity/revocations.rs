//! Revocation: a user's or a device's `not_before`. Tokens issued before it (their
//! `iat`), or without `iat`, are refused, and sessions opened with them end (close
//! 4004) on every gateway.
//!
//! Kept in Redis in one hash per user (`*` for the user, `dev:<id>` per device), for
//! `auth.max_token_lifetime_s` plus the leeway after its last change: by then every
//! token issued before it has expired anyway. Each gateway caches a user's hash for
//! [`CACHE_FOR`] so that an API call does not cost a Redis read; a revocation is
//! announced on the presence channel, and every gateway drops its cached copy and
//! closes the sessions it holds at once. One missed announcement (the subscriber was
//! reconnecting) is made good by the cache's short life.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fred::clients::Pool;
use fred::prelude::*;
use herald_shared::keys::Keys;
use herald_shared::protocol::{NodeEnvelope, Revocation};

/// How long a user's revocations are used from the cache before Redis is read again.
const CACHE_FOR: Duration = Duration::from_secs(5);
/// Cached users at most; past it the cache starts over (it only saves reads).
const CACHE_USERS: usize = 100_000;

/// The field of a user's hash that holds the user's own `not_before`.
const USER_FIELD: &str = "*";

fn device_field(device: &str) -> String {
    format!("dev:{device}")
}

#[derive(Debug, thiserror::Error)]
#[error("revocations unavailable: {0}")]
pub struct RevocationError(#[from] fred::error::Error);

#[derive(Debug)]
struct Cached {
    fields: HashMap<String, u64>,
    at: Instant,
}

#[derive(Debug)]
pub struct Revocations {
    redis: Pool,
    keys: Keys,
    /// How long a `not_before` is kept: the longest token lifetime, plus the leeway.
    keep_s: i64,
    cache: Mutex<HashMap<(String, String), Cached>>,
}

impl Revocations {
    pub fn new(redis: Pool, keys: Keys, keep_s: u64) -> Revocations {
        Revocations { redis, keys, keep_s: keep_s.min(i64::MAX as u64) as i64, cache: Mutex::default() }
    }

    /// The `not_before` that applies to a device's tokens: the later of its user's and
    /// its own.
    pub async fn not_before(&self, tenant: &str, user: &str, device: &str) -> Result<Option<u64>, RevocationError> {
        let key = (tenant.to_owned(), user.to_owned());
        let cached = {
            let cache = self.cache.lock().expect("revocations");
            cache.get(&key).filter(|c| c.at.elapsed() < CACHE_FOR).map(|c| later(&c.fields, device))
        };
        if let Some(nbf) = cached {
            return Ok(nbf);
        }
        let fields: HashMap<String, u64> = self.redis.next().hgetall(self.keys.revocations(tenant, user)).await?;
        let nbf = later(&fields, device);
        let mut cache = self.cache.lock().expect("revocations");
        if cache.len() >= CACHE_USERS {
            cache.clear();
        }
        cache.insert(key, Cached { fields, at: Instant::now() });
        Ok(nbf)
    }

    /// Records that the user's (or, with `device`, the device's) tokens issued before
    /// `not_before` are refused, and tells every gateway, which closes the sessions of
    /// such tokens. A `not_before` earlier than the one recorded changes nothing.
    pub async fn revoke(&self, r: &Revocation) -> Result<u64, RevocationError> {
        let key = self.keys.revocations(&r.tenant, &r.user);
        let field = r.device.as_deref().map_or_else(|| USER_FIELD.to_owned(), device_field);
        let redis = self.redis.next();
        let old: Option<u64> = redis.hget(&key, &field).await?;
        let nbf = old.map_or(r.not_before, |old| old.max(r.not_before));
        let _: () = redis.hset(&key, (field.as_str(), nbf)).await?;
        let _: () = redis.expire(&key, self.keep_s, None).await?;
        self.forget(&r.tenant, &r.user);
        let told =
            NodeEnvelope { revocations: vec![Revocation { not_before: nbf, ..r.clone() }], ..Default::default() };
        let told = serde_json::to_string(&told).expect("envelope serializes");
        herald_shared::redis::publish_to_node(redis, self.keys.presence_channel(), told).await?;
        Ok(nbf)
    }

    /// Drops the user's cached revocations: one was announced.
    pub fn forget(&self, tenant: &str, user: &str) {
        self.cache.lock().expect("revocations").remove(&(tenant.to_owned(), user.to_owned()));
    }

    /// Drops every cached revocation (announcements may have been missed).
    pub fn forget_all(&self) {
        self.cache.lock().expect("revocations").clear();
    }
}

fn later(fields: &HashMap<String, u64>, device: &str) -> Option<u64> {
    let user = fields.get(USER_FIELD).copied();
    let own = fields.get(&device_field(device)).copied();
    user.max(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_later_of_the_users_and_the_devices_applies() {
        let fields: HashMap<String, u64> = [("*".to_string(), 10), ("dev:a".to_string(), 20)].into();
        assert_eq!(later(&fields, "a"), Some(20));
        assert_eq!(later(&fields, "b"), Some(10));
        assert_eq!(later(&HashMap::new(), "a"), None);
        let only_device: HashMap<String, u64> = [("dev:a".to_string(), 5)].into();
        assert_eq!(later(&only_device, "b"), None);
    }
}
