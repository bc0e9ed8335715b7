//! The directory of sessions held by this gateway node, one per device, and the way
//! pushes, read positions and kicks from the node channel reach them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use herald_shared::protocol::{DeliveryStatus, ReadPosition, Revocation};

use crate::mailbox::Mailbox;
pub use crate::mailbox::{Control, Ephemeral, EphemeralKind, Push};

pub use herald_shared::keys::DeviceKey;

#[derive(Debug)]
struct Entry {
    session: String,
    /// The session shows `delivered` frames (its presence value says so).
    statuses: bool,
    /// The session's epoch among its device's sessions (drawn at admission).
    epoch: u64,
    mailbox: Arc<Mailbox>,
}

#[derive(Debug, Default)]
pub struct SessionRegistry {
    sessions: Mutex<HashMap<DeviceKey, Entry>>,
    /// (tenant, user) -> its sessions here (locked after `sessions`).
    users: Mutex<HashMap<(String, String), usize>>,
}

impl SessionRegistry {
    /// Registers a session, which reads its pushes and control messages from the
    /// mailbox returned (at most `queue` pushes and `ephemeral` typing and presence
    /// frames wait in it). Of two local sessions of the device, the one with the lower
    /// `epoch` (admitted first) is told it is replaced, whichever registers last.
    pub fn register(
        &self,
        key: DeviceKey,
        session: String,
        statuses: bool,
        epoch: u64,
        queue: usize,
        ephemeral: usize,
    ) -> Arc<Mailbox> {
        let mailbox = Arc::new(Mailbox::new(queue, ephemeral));
        let entry = Entry { session, statuses, epoch, mailbox: mailbox.clone() };
        let user = (key.tenant.clone(), key.user.clone());
        let mut map = self.sessions.lock().expect("sessions");
        if map.get(&key).is_some_and(|e| e.epoch > epoch) {
            // A newer session of the device is here already: this one ends (4002).
            mailbox.control(Control::Replaced);
            drop(map);
            metrics::gauge!("herald_gateway_sessions").increment(1.0);
            return mailbox;
        }
        match map.insert(key, entry) {
            Some(old) => {
                old.mailbox.control(Control::Replaced);
            }
            None => *self.users.lock().expect("users").entry(user).or_default() += 1,
        }
        drop(map);
        metrics::gauge!("herald_gateway_sessions").increment(1.0);
        mailbox
    }

    /// Removes the session if it is still the registered one for its device. True when
    /// it was the last session of its user here.
    pub fn unregister(&self, key: &DeviceKey, session: &str) -> bool {
        let mut map = self.sessions.lock().expect("sessions");
        let mut last = false;
        if map.get(key).is_some_and(|e| e.session == session) {
            map.remove(key);
            let mut users = self.users.lock().expect("users");
            let user = (key.tenant.clone(), key.user.clone());
            if let Some(n) = users.get_mut(&user) {
                *n -= 1;
                if *n == 0 {
                    users.remove(&user);
                    last = true;
                }
            }
        }
        metrics::gauge!("herald_gateway_sessions").decrement(1.0);
        last
    }

    /// Whether `session` is the device's session here.
    pub fn holds(&self, key: &DeviceKey, session: &str) -> bool {
        self.sessions.lock().expect("sessions").get(key).is_some_and(|e| e.session == session)
    }

    /// The users with a session here.
    pub fn users(&self) -> HashSet<(String, String)> {
        self.users.lock().expect("users").keys().cloned().collect()
    }

    /// The session registered for the device here, other than `me`: the newer session
    /// that replaced `me`, and whether it shows `delivered` frames.
    pub fn successor(&self, key: &DeviceKey, me: &str) -> Option<(String, bool)> {
        let map = self.sessions.lock().expect("sessions");
        map.get(key).filter(|e| e.session != me).map(|e| (e.session.clone(), e.statuses))
    }

    /// Closes the device's session if it is `session` (replaced on another node).
    pub fn kick(&self, key: &DeviceKey, session: &str) {
        let session = herald_shared::keys::kicked_session(session);
        let map = self.sessions.lock().expect("sessions");
        if let Some(e) = map.get(key).filter(|e| e.session == session) {
            e.mailbox.control(Control::Replaced);
        }
    }

    /// Tells the sessions here of the revoked user (or device) that tokens issued
    /// before `not_before` are refused: those whose token is closes (4004).
    pub fn revoke(&self, r: &Revocation) {
        let map = self.sessions.lock().expect("sessions");
        let of_user = map.iter().filter(|(k, _)| k.tenant == r.tenant && k.user == r.user);
        for (_, e) in of_user.filter(|(k, _)| r.device.as_ref().is_none_or(|d| *d == k.device)) {
            e.mailbox.control(Control::Revoked(r.not_before));
        }
    }

    /// Hands a push to the device's session, if it is here. Never waits: a full queue
    /// marks the session lagged instead.
    pub fn push(&self, key: &DeviceKey, push: Push) {
        let map = self.sessions.lock().expect("sessions");
        let Some(e) = map.get(key) else {
            metrics::counter!("herald_pushes_total", "outcome" => "not_here").increment(1);
            return;
        };
        if e.mailbox.push(push) {
            crate::meters::PUSHES_QUEUED.increment(1);
        } else {
            metrics::counter!("herald_pushes_total", "outcome" => "dropped_slow_consumer").increment(1);
        }
    }

    /// Hands a read position to the device's session, if it is here. A full queue
    /// loses nothing: the position waits in Redis for the next session.
    pub fn push_read(&self, key: &DeviceKey, conv: &str, user: &str, seq: u64) {
        let map = self.sessions.lock().expect("sessions");
        if let Some(e) = map.get(key) {
            let position = ReadPosition { conv: conv.to_owned(), user: user.to_owned(), seq };
            e.mailbox.control(Control::Read(position));
        }
    }

    /// Hands a delivery status to the device's session, if it is here (a session that
    /// did not opt in drops it).
    pub fn push_status(&self, key: &DeviceKey, status: &DeliveryStatus) {
        let map = self.sessions.lock().expect("sessions");
        if let Some(e) = map.get(key) {
            e.mailbox.control(Control::Status(status.clone()));
        }
    }

    /// Hands a typing or presence frame to the device's session, if it is here. Never
    /// waits: a full queue drops it (they are the first thing shed under load).
    pub fn push_ephemeral(&self, key: &DeviceKey, e: Ephemeral) {
        let map = self.sessions.lock().expect("sessions");
        let Some(entry) = map.get(key) else { return };
        let outcome = if entry.mailbox.ephemeral(e) { "queued" } else { "dropped_full" };
        metrics::counter!("herald_ephemeral_total", "outcome" => outcome).increment(1);
    }

    /// Makes every session here read its pending set again: pushes published while the
    /// node channel was disconnected never arrived, but they are still pending.
    pub fn reread_all(&self) {
        for e in self.sessions.lock().expect("sessions").values() {
            e.mailbox.mark_lagged();
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.lock().expect("sessions").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_replaced_session_names_its_successor_with_its_flag_and_a_flagged_kick_closes_it() {
        let directory = SessionRegistry::default();
        let key = DeviceKey::new("t", "alice", "a1");
        let _old = directory.register(key.clone(), "gw-1-0001".into(), false, 1, 8, 8);
        let new = directory.register(key.clone(), "gw-1-0002".into(), true, 2, 8, 8);
        assert_eq!(directory.successor(&key, "gw-1-0001"), Some(("gw-1-0002".to_owned(), true)));
        assert_eq!(directory.successor(&key, "gw-1-0002"), None, "a session is not its own successor");

        // A gateway of the release before the flags names the session with them.
        directory.kick(&key, "gw-1-0001|d");
        let quiet = tokio::time::timeout(Duration::from_millis(50), new.next_control()).await;
        assert!(quiet.is_err(), "a kick of another session leaves this one");
        directory.kick(&key, "gw-1-0002|d");
        let told = tokio::time::timeout(Duration::from_secs(1), new.next_control()).await.expect("told to close");
        assert!(matches!(told, Control::Replaced));
    }
}
