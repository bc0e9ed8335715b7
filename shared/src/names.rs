//! Maps keyed by owned names (tenant, user, conversation, device ids, cmids) and looked
//! up by borrowed ones, so that a lookup per message or per request copies no name.
//!
//! A key is a tuple of `String`s or a [`DeviceKey`]; a lookup names the same fields as
//! `&str`s ([`Names2`], [`Names3`]), hashed as the owned key is (a `String` hashes as
//! its `str`; a tuple, and a struct with a derived `Hash`, field by field in order) and
//! compared field by field. Hashed by std's SipHash with a random key, as std's maps
//! are: names come from clients.

use std::hash::RandomState;

use hashbrown::Equivalent;

use crate::keys::DeviceKey;

/// A map keyed by owned names; look it up with [`Names2`] or [`Names3`].
pub type NameMap<K, V> = hashbrown::HashMap<K, V, RandomState>;

/// Two borrowed names: the lookup of a `(String, String)` key.
#[derive(Debug, Hash)]
pub struct Names2<'a>(pub &'a str, pub &'a str);

/// Three borrowed names: the lookup of a `(String, String, String)` key or of a
/// [`DeviceKey`] (tenant, user, device).
#[derive(Debug, Hash)]
pub struct Names3<'a>(pub &'a str, pub &'a str, pub &'a str);

impl Equivalent<(String, String)> for Names2<'_> {
    fn equivalent(&self, k: &(String, String)) -> bool {
        self.0 == k.0 && self.1 == k.1
    }
}

impl Equivalent<(String, String, String)> for Names3<'_> {
    fn equivalent(&self, k: &(String, String, String)) -> bool {
        self.0 == k.0 && self.1 == k.1 && self.2 == k.2
    }
}

impl Equivalent<DeviceKey> for Names3<'_> {
    fn equivalent(&self, k: &DeviceKey) -> bool {
        self.0 == k.tenant && self.1 == k.user && self.2 == k.device
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    fn owned3(a: &str, b: &str, c: &str) -> (String, String, String) {
        (a.into(), b.into(), c.into())
    }

    #[test]
    fn borrowed_names_hash_as_their_owned_keys() {
        let s = RandomState::new();
        assert_eq!(s.hash_one(Names2("t", "c")), s.hash_one(("t".to_owned(), "c".to_owned())));
        assert_eq!(s.hash_one(Names3("t", "u", "d")), s.hash_one(owned3("t", "u", "d")));
        assert_eq!(s.hash_one(Names3("t", "u", "d")), s.hash_one(DeviceKey::new("t", "u", "d")));
    }

    #[test]
    fn a_lookup_finds_its_own_key_and_no_look_alike() {
        let mut pairs: NameMap<(String, String), u32> = NameMap::default();
        pairs.insert(("t".into(), "uc".into()), 1);
        assert_eq!(pairs.get(&Names2("t", "uc")), Some(&1));
        // Names that run together the same way when concatenated are other keys.
        for (a, b) in [("tu", "c"), ("t", "u"), ("", "tuc"), ("t", "uc ")] {
            assert_eq!(pairs.get(&Names2(a, b)), None, "{a:?} {b:?}");
        }
        let mut triples: NameMap<(String, String, String), u32> = NameMap::default();
        triples.insert(owned3("t", "u", "m"), 2);
        assert_eq!(triples.get(&Names3("t", "u", "m")), Some(&2));
        for (a, b, c) in [("t", "um", ""), ("tu", "", "m"), ("x", "u", "m"), ("t", "x", "m"), ("t", "u", "x")] {
            assert_eq!(triples.get(&Names3(a, b, c)), None, "{a:?} {b:?} {c:?}");
        }
        let mut devices: NameMap<DeviceKey, u32> = NameMap::default();
        devices.insert(DeviceKey::new("t", "u", "d"), 3);
        assert_eq!(devices.get(&Names3("t", "u", "d")), Some(&3));
        assert_eq!(devices.get(&Names3("t", "ud", "")), None);
        assert_eq!(devices.remove(&Names3("t", "u", "d")), Some(3));
    }
}
