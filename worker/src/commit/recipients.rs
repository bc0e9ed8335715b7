//! The commit's recipients cache: each conversation's current members and their live
//! devices, kept between commits, so that a transaction reads them from MySQL only when
//! they may have changed (docs/architecture.md section 3, "The commit's recipients
//! cache").
//!
//! An entry is used only when all of these still hold, each checked against what the
//! commit reads anyway or in the same round trip:
//! - **members**: every change of a conversation's members is a timeline event with a
//!   seq of its own (`timeline/store.rs`), so it moves the conversation's `last_seq`,
//!   which the commit's lock returns. An entry is valid at the `last_seq` it was read
//!   at. A commit of this process adds messages only, under the conversation's lock
//!   from the read to COMMIT, so once COMMIT returned its entry moves along to the new
//!   `last_seq` ([`Recipients::advance`]); any other writer's commit leaves the entry
//!   behind, and it is read again. No writer has to tell this process anything.
//! - **devices**: the tenant's device epoch (`herald_shared::device_epochs`), raised by
//!   every write that changes which devices receive, read before the devices are.
//! - **the device TTL**: each device keeps its `last_seen_at`; once the oldest would no
//!   longer be a recipient, the entry is read again (the device may have been seen
//!   since, or the janitor expires it, which raises the epoch).
//! - **the conversation**: its `created_at`.
//!
//! Bounded by devices held: past the bound it starts again empty.
//!
//! A writer of an older release changes devices without raising the epoch, so the
//! cache is used only while every live gateway and worker says it raises epochs
//! ([`Recipients::allow`], from `ingress/epoch_gate.rs`); each time that stops holding,
//! the cache empties, and what a commit read before is not kept.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use herald_shared::names::{NameMap, Names2};

/// A device of a current member: a recipient while it is seen within the device TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Device {
    pub user: String,
    /// The member's `joined_seq`.
    pub joined_seq: u64,
    pub device: String,
    /// It has a push token.
    pub push: bool,
    pub last_seen_at: i64,
}

/// A conversation's current members and their live devices.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Members {
    pub users: HashSet<String>,
    pub devices: Vec<Device>,
}

impl Members {
    /// The earliest `last_seen_at` of its devices.
    fn oldest_seen(&self) -> i64 {
        self.devices.iter().map(|d| d.last_seen_at).min().unwrap_or(i64::MAX)
    }
}

/// What an entry was read under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadAt {
    /// The conversation's `created_at`.
    pub created_at: i64,
    /// The conversation's `last_seq` as the lock read it.
    pub last_seq: u64,
    /// The tenant's device epoch, read before the devices.
    pub epoch: u64,
}

#[derive(Debug)]
struct Entry {
    at: ReadAt,
    oldest_seen: i64,
    members: Arc<Members>,
}

#[derive(Debug, Default)]
struct Held {
    entries: NameMap<(String, String), Entry>,
    /// Devices (and one per entry) held in all.
    size: usize,
    /// Every live process raises device epochs: the cache may be used.
    allowed: bool,
    /// Moves each time `allowed` changes: what was read under another one is not kept.
    generation: u64,
}

/// The cache as a commit found it before its reads: what it reads is kept only if the
/// cache is still in this generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Generation(u64);

pub(crate) struct Recipients {
    held: Mutex<Held>,
    /// Most devices held (`worker.recipient_cache_devices`); 0: nothing is kept.
    capacity: usize,
    /// `herald_recipient_cache_total` by result: hit, stale (held, read again), miss.
    hits: metrics::Counter,
    stale: metrics::Counter,
    misses: metrics::Counter,
}

impl std::fmt::Debug for Recipients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recipients").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl Recipients {
    pub fn new(capacity: usize) -> Recipients {
        let counter = |result: &'static str| metrics::counter!("herald_recipient_cache_total", "result" => result);
        Recipients {
            held: Mutex::new(Held::default()),
            capacity,
            hits: counter("hit"),
            stale: counter("stale"),
            misses: counter("miss"),
        }
    }

    /// Whether the cache may be used now: the generation a commit's reads belong to
    /// (`None`: every commit reads its recipients).
    pub fn generation(&self) -> Option<Generation> {
        let held = self.held.lock().expect("recipients cache");
        (self.capacity > 0 && held.allowed).then_some(Generation(held.generation))
    }

    /// Whether every live gateway and worker raises device epochs: when it stops
    /// holding, everything is dropped.
    pub fn allow(&self, allowed: bool) {
        let in_use = allowed && self.capacity > 0;
        metrics::gauge!("herald_recipient_cache_in_use").set(if in_use { 1.0 } else { 0.0 });
        let mut held = self.held.lock().expect("recipients cache");
        if held.allowed != allowed {
            let generation = held.generation + 1;
            *held = Held { allowed, generation, ..Held::default() };
            tracing::info!(
                allowed,
                "recipients cache {}",
                if allowed { "in use" } else { "off: a process of an older release runs" }
            );
        }
    }

    /// The conversation's recipients, if an entry read at `at` is held and none of its
    /// devices was last seen before `live_since`.
    pub fn get(&self, tenant: &str, conv: &str, at: ReadAt, live_since: i64) -> Option<Arc<Members>> {
        let held = self.held.lock().expect("recipients cache");
        let Some(entry) = held.entries.get(&Names2(tenant, conv)) else {
            self.misses.increment(1);
            return None;
        };
        if entry.at != at || entry.oldest_seen < live_since {
            self.stale.increment(1);
            return None;
        }
        self.hits.increment(1);
        Some(entry.members.clone())
    }

    /// Keeps what was read at `at` in generation `read_in`, unless a later read is held.
    pub fn put(&self, read_in: Generation, tenant: &str, conv: &str, at: ReadAt, members: Arc<Members>) {
        let mut held = self.held.lock().expect("recipients cache");
        if !held.allowed || held.generation != read_in.0 {
            return;
        }
        if let Some(e) = held.entries.get(&Names2(tenant, conv)) {
            if (e.at.last_seq, e.at.epoch) > (at.last_seq, at.epoch) {
                return;
            }
        }
        if let Some(old) = held.entries.remove(&Names2(tenant, conv)) {
            held.size -= old.members.devices.len() + 1;
        }
        let size = members.devices.len() + 1;
        if held.size + size > self.capacity {
            metrics::counter!("herald_recipient_cache_resets_total").increment(1);
            held.entries.clear();
            held.size = 0;
        }
        let entry = Entry { at, oldest_seen: members.oldest_seen(), members };
        held.size += size;
        held.entries.insert((tenant.to_owned(), conv.to_owned()), entry);
    }

    /// This process committed messages (and no member change) to the conversation,
    /// taking its `last_seq` from `from` to `to` under the lock its read took: an entry
    /// valid at `from` is valid at `to`.
    pub fn advance(&self, tenant: &str, conv: &str, from: u64, to: u64) {
        let mut held = self.held.lock().expect("recipients cache");
        if let Some(e) = held.entries.get_mut(&Names2(tenant, conv)) {
            if e.at.last_seq == from {
                e.at.last_seq = to;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(seen: &[i64]) -> Arc<Members> {
        let devices = seen
            .iter()
            .enumerate()
            .map(|(i, &s)| Device {
                user: "bob".into(),
                joined_seq: 0,
                device: format!("d{i}"),
                push: false,
                last_seen_at: s,
            })
            .collect();
        Arc::new(Members { users: ["alice".to_owned(), "bob".to_owned()].into(), devices })
    }

    const AT: ReadAt = ReadAt { created_at: 1, last_seq: 10, epoch: 3 };

    /// A cache in use, and the generation its reads belong to.
    fn open(capacity: usize) -> (Recipients, Generation) {
        let cache = Recipients::new(capacity);
        cache.allow(true);
        let g = cache.generation().expect("in use");
        (cache, g)
    }

    #[test]
    fn an_entry_is_used_only_as_read() {
        let (cache, g) = open(100);
        cache.put(g, "t", "c", AT, members(&[50, 60]));
        assert_eq!(cache.get("t", "c", AT, 50), Some(members(&[50, 60])));
        assert!(cache.get("t", "c", ReadAt { last_seq: 11, ..AT }, 0).is_none(), "another writer committed");
        assert!(cache.get("t", "c", ReadAt { epoch: 4, ..AT }, 0).is_none(), "the tenant's devices changed");
        assert!(cache.get("t", "c", ReadAt { created_at: 2, ..AT }, 0).is_none(), "another conversation");
        assert!(cache.get("t", "c", AT, 51).is_none(), "a device past its TTL by what was read");
        assert!(cache.get("u", "c", AT, 0).is_none(), "another tenant");
        assert!(cache.get("t", "d", AT, 0).is_none(), "another conversation id");
    }

    #[test]
    fn own_commits_move_an_entry_along_and_others_leave_it_behind() {
        let (cache, g) = open(100);
        cache.put(g, "t", "c", AT, members(&[50]));
        cache.advance("t", "c", 10, 12);
        assert!(cache.get("t", "c", ReadAt { last_seq: 12, ..AT }, 0).is_some());
        cache.advance("t", "c", 10, 14);
        assert!(cache.get("t", "c", ReadAt { last_seq: 14, ..AT }, 0).is_none(), "moved from a seq it is not at");
        // A slower read does not replace a later one.
        cache.put(g, "t", "c", AT, Arc::new(Members::default()));
        assert_eq!(cache.get("t", "c", ReadAt { last_seq: 12, ..AT }, 0), Some(members(&[50])));
    }

    #[test]
    fn the_cache_is_bounded_by_devices_and_can_be_off() {
        let (cache, g) = open(10);
        cache.put(g, "t", "a", AT, members(&[1, 2, 3, 4]));
        cache.put(g, "t", "b", AT, members(&[1, 2, 3, 4]));
        cache.put(g, "t", "a", AT, members(&[1, 2, 3, 4]));
        assert_eq!(cache.held.lock().unwrap().size, 10, "a replaced entry is counted once");
        cache.put(g, "t", "c", AT, members(&[1]));
        assert!(cache.get("t", "a", AT, 0).is_none(), "past the bound it starts again");
        assert!(cache.get("t", "c", AT, 0).is_some());
        let off = Recipients::new(0);
        off.allow(true);
        assert_eq!(off.generation(), None, "a bound of 0 keeps nothing");
    }

    /// While a process of an older release runs (it changes devices without raising
    /// epochs), nothing is used or kept; what was read before it came is dropped, and
    /// so is what a commit read while it ran, even if it is gone by the time of `put`.
    #[test]
    fn nothing_is_used_or_kept_while_an_older_process_runs() {
        let cache = Recipients::new(100);
        assert_eq!(cache.generation(), None, "closed until every process is known to raise epochs");
        cache.allow(true);
        let before = cache.generation().expect("in use");
        cache.put(before, "t", "c", AT, members(&[1]));
        cache.allow(false);
        assert_eq!(cache.generation(), None);
        assert!(cache.get("t", "c", AT, 0).is_none(), "dropped when an older process came");
        cache.put(before, "t", "c", AT, members(&[1]));
        cache.allow(true);
        assert!(cache.get("t", "c", AT, 0).is_none(), "a read from before is not kept");
        let now = cache.generation().expect("in use again");
        assert_ne!(now, before);
        cache.put(now, "t", "c", AT, members(&[1]));
        assert!(cache.get("t", "c", AT, 0).is_some());
    }
}
