//! Who follows whose presence on this node: each session's `presence_subscribe` list,
//! indexed by the user followed, so that a change reaches its followers here in one
//! lookup. Bounded by `gateway.presence_max_users` users per session.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use herald_shared::keys::DeviceKey;

#[derive(Debug, Default)]
pub struct PresenceWatchers {
    inner: Mutex<Follows>,
}

#[derive(Debug, Default)]
struct Follows {
    /// (tenant, user followed) -> the devices here that follow it.
    by_user: HashMap<(String, String), HashSet<DeviceKey>>,
    /// Device -> the session that set its list, and the users on it.
    by_device: HashMap<DeviceKey, (String, Vec<String>)>,
}

impl Follows {
    fn drop_list(&mut self, device: &DeviceKey) {
        let Some((_, users)) = self.by_device.remove(device) else { return };
        for u in users {
            let key = (device.tenant.clone(), u);
            if let Some(set) = self.by_user.get_mut(&key) {
                set.remove(device);
                if set.is_empty() {
                    self.by_user.remove(&key);
                }
            }
        }
    }
}

impl PresenceWatchers {
    /// The device's session `session` now follows `users` (of its own tenant), instead
    /// of what it followed before; an empty list follows no one.
    pub fn follow(&self, device: &DeviceKey, session: &str, users: Vec<String>) {
        let mut f = self.inner.lock().expect("watchers");
        f.drop_list(device);
        if users.is_empty() {
            return;
        }
        for u in &users {
            f.by_user.entry((device.tenant.clone(), u.clone())).or_default().insert(device.clone());
        }
        f.by_device.insert(device.clone(), (session.to_owned(), users));
    }

    /// The session ended: its list goes, unless a newer session of the device set one.
    pub fn forget(&self, device: &DeviceKey, session: &str) {
        let mut f = self.inner.lock().expect("watchers");
        if f.by_device.get(device).is_some_and(|(s, _)| s == session) {
            f.drop_list(device);
        }
    }

    /// The devices here that follow this user.
    pub fn followers(&self, tenant: &str, user: &str) -> Vec<DeviceKey> {
        let f = self.inner.lock().expect("watchers");
        f.by_user.get(&(tenant.to_owned(), user.to_owned())).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_replaces_the_last_and_an_older_session_leaves_a_newer_ones_alone() {
        let w = PresenceWatchers::default();
        let d = DeviceKey::new("t", "alice", "p1");
        w.follow(&d, "s1", vec!["bob".into(), "carol".into()]);
        assert_eq!(w.followers("t", "bob"), vec![d.clone()]);
        assert!(w.followers("t2", "bob").is_empty(), "tenants apart");
        w.follow(&d, "s1", vec!["carol".into()]);
        assert!(w.followers("t", "bob").is_empty(), "bob is no longer followed");
        w.follow(&d, "s2", vec!["dave".into()]);
        w.forget(&d, "s1");
        assert_eq!(w.followers("t", "dave"), vec![d.clone()], "the newer session's list stays");
        w.forget(&d, "s2");
        assert!(w.followers("t", "dave").is_empty());
        assert!(w.inner.lock().unwrap().by_user.is_empty());
    }
}
