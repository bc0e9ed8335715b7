//! The devices this gateway has registered, with when it last wrote their
//! `last_seen_at`: looked up on every API request by the token's claims, without
//! copying their names into a key (`herald_shared::names`).

use std::time::Instant;

use herald_shared::auth::Claims;
use herald_shared::keys::DeviceKey;
use herald_shared::names::{NameMap, Names3};

/// Most devices remembered as registered; past it the memory starts afresh (a miss
/// only costs a place in the next batch).
const KNOWN_MAX: usize = 200_000;

#[derive(Debug, Default)]
pub(super) struct Known {
    seen: NameMap<DeviceKey, Instant>,
}

impl Known {
    /// When this gateway last wrote the `last_seen_at` of the device `c` names.
    pub(super) fn seen_at(&self, c: &Claims) -> Option<Instant> {
        self.seen.get(&Names3(&c.tid, &c.sub, &c.dev)).copied()
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

#[cfg(test)]
mod tests {
    use herald_shared::auth::Platform;

    use super::*;

    fn claims(tid: &str, sub: &str, dev: &str) -> Claims {
        Claims { tid: tid.into(), sub: sub.into(), dev: dev.into(), plat: Platform::Web, exp: 1, iat: None }
    }

    #[test]
    fn a_tokens_device_is_found_as_its_key_and_no_other() {
        let c = claims("t", "u", "d");
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
