//! The devices this gateway has registered, with when it last wrote their
//! `last_seen_at`: looked up on every API request by the token's claims, without
//! copying their names into a key.

use std::hash::{Hash, Hasher, RandomState};
use std::time::Instant;

use hashbrown::{Equivalent, HashMap};
use herald_shared::auth::Claims;
use herald_shared::keys::DeviceKey;

/// Most devices remembered as registered; past it the memory starts afresh (a miss
/// only costs a place in the next batch).
const KNOWN_MAX: usize = 200_000;

/// Hashed by SipHash with a random key, as std's maps are: device ids come from tokens.
#[derive(Debug, Default)]
pub(super) struct Known {
    seen: HashMap<DeviceKey, Instant, RandomState>,
}

impl Known {
    /// When this gateway last wrote the `last_seen_at` of the device `c` names.
    pub(super) fn seen_at(&self, c: &Claims) -> Option<Instant> {
        self.seen.get(&ClaimedDevice(c)).copied()
    }

    pub(super) fn insert(&mut self, key: DeviceKey, at: Instant) {
        if self.seen.len() > KNOWN_MAX {
            self.seen.clear();
        }
        self.seen.insert(key, at);
    }

    pub(super) fn remove(&mut self, d: &DeviceKey) {
        self.seen.remove(d);
    }

    pub(super) fn clear(&mut self) {
        self.seen.clear();
    }
}

/// The device a token names, hashed and compared as its [`DeviceKey`] is.
struct ClaimedDevice<'a>(&'a Claims);

impl Hash for ClaimedDevice<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // DeviceKey's fields in their order, each hashed as a String is (its derived Hash).
        self.0.tid.hash(h);
        self.0.sub.hash(h);
        self.0.dev.hash(h);
    }
}

impl Equivalent<DeviceKey> for ClaimedDevice<'_> {
    fn equivalent(&self, k: &DeviceKey) -> bool {
        self.0.tid == k.tenant && self.0.sub == k.user && self.0.dev == k.device
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use herald_shared::auth::Platform;

    use super::*;

    fn claims(tid: &str, sub: &str, dev: &str) -> Claims {
        Claims { tid: tid.into(), sub: sub.into(), dev: dev.into(), plat: Platform::Web, exp: 1, iat: None }
    }

    #[test]
    fn a_tokens_device_is_found_as_its_key_and_no_other() {
        let c = claims("t", "u", "d");
        let s = RandomState::new();
        assert_eq!(s.hash_one(ClaimedDevice(&c)), s.hash_one(DeviceKey::of(&c)), "hashed as its key");
        let mut known = Known::default();
        let at = Instant::now();
        known.insert(DeviceKey::of(&c), at);
        assert_eq!(known.seen_at(&c), Some(at));
        // Names that would run together if concatenated, and each field alone changed.
        for other in [claims("t", "ud", ""), claims("tu", "", "d"), claims("x", "u", "d"), claims("t", "x", "d")] {
            assert_eq!(known.seen_at(&other), None, "{other:?}");
        }
        assert_eq!(known.seen_at(&claims("t", "u", "x")), None);
        known.remove(&DeviceKey::of(&c));
        assert_eq!(known.seen_at(&c), None);
    }

    #[test]
    fn a_full_memory_starts_afresh() {
        let mut known = Known::default();
        let at = Instant::now();
        for i in 0..=KNOWN_MAX {
            known.insert(DeviceKey::new("t", "u", i.to_string()), at);
        }
        known.insert(DeviceKey::new("t", "u", "last"), at);
        assert_eq!(known.seen.len(), 1);
        assert_eq!(known.seen_at(&claims("t", "u", "last")), Some(at));
    }
}
