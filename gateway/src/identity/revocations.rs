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
use herald_shared::names::{NameMap, Names2};
use herald_shared::protocol::{NodeEnvelope, Revocation};

/// How long a user's revocations are used from the cache before Redis is read again.
const CACHE_FOR: Duration = Duration::from_secs(5);
/// Cached users at most; past it the cache starts over (it only saves reads).
const CACHE_USERS: usize = 100_000;

/// The field of a user's hash that holds the user's own `not_before`.
const USER_FIELD: &str = "*";

/// The prefix of a device's field: `dev:<id>`.
const DEVICE_PREFIX: &str = "dev:";

fn device_field(device: &str) -> String {
    format!("{DEVICE_PREFIX}{device}")
}

#[derive(Debug, thiserror::Error)]
#[error("revocations unavailable: {0}")]
pub struct RevocationError(#[from] fred::error::Error);

/// A user's hash as read: the user's own `not_before` and its devices'.
#[derive(Debug)]
struct Cached {
    user: Option<u64>,
    devices: HashMap<String, u64>,
    at: Instant,
}

impl Cached {
    fn of(fields: HashMap<String, u64>) -> Cached {
        let mut cached = Cached { user: None, devices: HashMap::new(), at: Instant::now() };
        for (field, nbf) in fields {
            if field == USER_FIELD {
                cached.user = Some(nbf);
            } else if let Some(device) = field.strip_prefix(DEVICE_PREFIX) {
                cached.devices.insert(device.to_owned(), nbf);
            }
        }
        cached
    }

    /// The later of the user's and the device's `not_before`.
    fn later(&self, device: &str) -> Option<u64> {
        self.user.max(self.devices.get(device).copied())
    }
}

/// Cached users by (tenant, user), looked up by borrowed names (an API call copies
/// none; `herald_shared::names`).
#[derive(Debug, Default)]
struct Cache {
    users: NameMap<(String, String), Cached>,
}

impl Cache {
    fn get(&self, tenant: &str, user: &str) -> Option<&Cached> {
        self.users.get(&Names2(tenant, user))
    }

    fn insert(&mut self, tenant: &str, user: &str, cached: Cached) {
        if self.users.len() >= CACHE_USERS {
            self.users.clear();
        }
        self.users.insert((tenant.to_owned(), user.to_owned()), cached);
    }

    fn remove(&mut self, tenant: &str, user: &str) {
        self.users.remove(&Names2(tenant, user));
    }

    fn clear(&mut self) {
        self.users.clear();
    }
}

#[derive(Debug)]
pub struct Revocations {
    redis: Pool,
    keys: Keys,
    /// How long a `not_before` is kept: the longest token lifetime, plus the leeway.
    keep_s: i64,
    cache: Mutex<Cache>,
}

impl Revocations {
    pub fn new(redis: Pool, keys: Keys, keep_s: u64) -> Revocations {
        Revocations { redis, keys, keep_s: keep_s.min(i64::MAX as u64) as i64, cache: Mutex::default() }
    }

    /// The `not_before` that applies to a device's tokens: the later of its user's and
    /// its own.
    pub async fn not_before(&self, tenant: &str, user: &str, device: &str) -> Result<Option<u64>, RevocationError> {
        let cached = {
            let cache = self.cache.lock().expect("revocations");
            cache.get(tenant, user).filter(|c| c.at.elapsed() < CACHE_FOR).map(|c| c.later(device))
        };
        if let Some(nbf) = cached {
            return Ok(nbf);
        }
        let fields: HashMap<String, u64> = self.redis.next().hgetall(self.keys.revocations(tenant, user)).await?;
        let cached = Cached::of(fields);
        let nbf = cached.later(device);
        self.cache.lock().expect("revocations").insert(tenant, user, cached);
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
        self.cache.lock().expect("revocations").remove(tenant, user);
    }

    /// Drops every cached revocation (announcements may have been missed).
    pub fn forget_all(&self) {
        self.cache.lock().expect("revocations").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(fields: &[(&str, u64)]) -> Cached {
        Cached::of(fields.iter().map(|&(f, n)| (f.to_owned(), n)).collect())
    }

    #[test]
    fn the_later_of_the_users_and_the_devices_applies() {
        let both = cached(&[("*", 10), (device_field("a").as_str(), 20), ("other", 30)]);
        assert_eq!(both.later("a"), Some(20));
        assert_eq!(both.later("b"), Some(10), "a field that is neither the user's nor a device's is ignored");
        assert_eq!(cached(&[]).later("a"), None);
        let only_device = cached(&[(device_field("a").as_str(), 5)]);
        assert_eq!(only_device.later("b"), None);
        assert_eq!(only_device.later("dev:a"), None, "a device is named by its id, not its field");
        assert_eq!(cached(&[("*", 40), (device_field("a").as_str(), 20)]).later("a"), Some(40));
    }

    #[test]
    fn the_cache_finds_users_by_tenant_and_stays_within_its_bound() {
        let mut cache = Cache::default();
        cache.insert("t1", "u", cached(&[("*", 1)]));
        cache.insert("t2", "u", cached(&[("*", 2)]));
        cache.insert("t1", "u", cached(&[("*", 3)]));
        assert_eq!(cache.users.len(), 2, "a user cached again is one user");
        assert_eq!(cache.get("t1", "u").map(|c| c.later("d")), Some(Some(3)));
        assert_eq!(cache.get("t2", "u").map(|c| c.later("d")), Some(Some(2)));
        assert!(cache.get("t1", "v").is_none() && cache.get("t3", "u").is_none());
        cache.remove("t1", "u");
        cache.remove("t1", "u");
        assert!(cache.get("t1", "u").is_none());
        assert_eq!(cache.users.len(), 1);
        for i in cache.users.len()..CACHE_USERS {
            cache.insert("t", &i.to_string(), cached(&[]));
        }
        assert_eq!(cache.users.len(), CACHE_USERS);
        cache.insert("t", "last", cached(&[]));
        assert_eq!(cache.users.len(), 1, "a full cache starts over");
        assert!(cache.get("t", "last").is_some() && cache.get("t2", "u").is_none());
    }
}
