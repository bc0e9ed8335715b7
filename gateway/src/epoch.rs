//! The Redis epoch: which life of the Redis data this node believes in.
//!
//! `epoch` names the current life of the Redis data: when the key is missing, Redis
//! lost its data, and the first process to notice sets a new one. A device's pending
//! set is trusted only when its marker names the current epoch (otherwise it is
//! rebuilt from MySQL). The node's health loop reads the epoch every half second; a
//! session is woken when the counter moves and reads the string only then.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use fred::interfaces::ClusterInterface;
use fred::prelude::*;
use fred::types::config::Server;
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::watch;

/// Reads the epoch, starting a new one when Redis has none (it lost its data).
pub async fn current_epoch(redis: &Pool, key: &str) -> Result<String, Error> {
    let fresh = format!("{:016x}", rand::random::<u64>());
    let set: Option<String> = redis.set(key, fresh.as_str(), None, Some(SetOptions::NX), false).await?;
    if set.is_some() {
        tracing::warn!(epoch = %fresh, "no Redis epoch: Redis lost its data or is new; pending sets will be rebuilt from MySQL");
        metrics::counter!("herald_redis_epochs_total").increment(1);
    }
    let epoch: Option<String> = redis.get(key).await?;
    Ok(epoch.unwrap_or(fresh))
}

/// Starts a new epoch when the master of a Redis shard is not the one seen before: a
/// replica promoted after a failover lacks the writes it had not received yet. A
/// standalone Redis is one shard; in a cluster each master is asked (a promoted replica
/// serves its old master's slots, so it is known by the lowest of them). A master that
/// does not answer is left for the next round, once the slot map was read again.
pub async fn check_master(redis: &Pool, keys: &herald_shared::keys::Keys) -> Result<(), Error> {
    let client = redis.next();
    let shards = if client.is_clustered() {
        cluster_masters(client).await
    } else {
        master_replid(client).await?.map(|id| ("master".to_owned(), id)).into_iter().collect()
    };
    if shards.is_empty() {
        return Ok(());
    }
    let fresh = format!("{:016x}", rand::random::<u64>());
    let mut args = vec![fresh.clone()];
    for (shard, replid) in shards {
        args.extend([shard, replid]);
    }
    let changed: Vec<String> =
        herald_shared::scripts::REPLIDS_CHECK.call(client, vec![keys.replids(), keys.epoch()], args).await?;
    if !changed.is_empty() {
        tracing::warn!(epoch = %fresh, shards = ?changed, "a Redis master changed (a promoted replica?); pending sets will be read again from MySQL");
        metrics::counter!("herald_redis_epochs_total").increment(1);
        metrics::counter!("herald_redis_promotions_total").increment(changed.len() as u64);
    }
    Ok(())
}

/// The replication id of the server `c` reaches, when it is a master.
async fn master_replid<C: ClientLike>(c: &C) -> Result<Option<String>, Error> {
    let info: String =
        c.custom(CustomCommand::new_static("INFO", ClusterHash::Random, false), vec!["replication"]).await?;
    Ok(replid_of_master(&info))
}

fn replid_of_master(info: &str) -> Option<String> {
    let is_master = info.lines().any(|l| l.trim() == "role:master");
    let replid = info.lines().find_map(|l| l.trim().strip_prefix("master_replid:"));
    replid.filter(|_| is_master).map(str::to_owned)
}

/// (shard, replication id) of every master of the cluster's slot map that answers as
/// a master. When one does not (it died, or is a replica now) the slot map is read
/// again for the next round.
async fn cluster_masters(client: &Client) -> Vec<(String, String)> {
    let Some(routing) = client.cached_cluster_state() else { return Vec::new() };
    let mut lowest: BTreeMap<Server, u16> = BTreeMap::new();
    for range in routing.slots() {
        let slot = lowest.entry(range.primary.clone()).or_insert(range.start);
        *slot = (*slot).min(range.start);
    }
    let mut shards = Vec::with_capacity(lowest.len());
    let mut stale = false;
    for (server, slot) in lowest {
        match master_replid(&client.with_cluster_node(server)).await {
            Ok(Some(replid)) => shards.push((format!("slot{slot}"), replid)),
            Ok(None) | Err(_) => stale = true,
        }
    }
    if stale {
        if let Err(e) = client.sync_cluster().await {
            tracing::debug!(error = %e, "Redis Cluster slot map not read again");
        }
    }
    shards
}

/// The node's view of the epoch, shared by its sessions.
#[derive(Clone, Debug)]
pub struct EpochWatch(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    epoch: RwLock<String>,
    /// Bumped whenever `epoch` changes.
    generation: AtomicU64,
    /// Wakes the sessions when `generation` moves: one node-wide signal instead of a
    /// check on every session's timer.
    changes: watch::Sender<u64>,
}

impl EpochWatch {
    pub fn new(epoch: String) -> EpochWatch {
        let changes = watch::Sender::new(0);
        EpochWatch(Arc::new(Inner { epoch: RwLock::new(epoch), generation: AtomicU64::new(0), changes }))
    }

    /// The generation first: a change after this read is noticed at the next check.
    pub fn snapshot(&self) -> (u64, String) {
        let generation = self.0.generation.load(Ordering::Acquire);
        (generation, self.0.epoch.read().expect("epoch").clone())
    }

    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    /// Changes from now on: `changed()` is ready once the epoch moved.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.changes.subscribe()
    }

    /// Records what Redis says now.
    pub fn update(&self, epoch: &str) {
        let mut current = self.0.epoch.write().expect("epoch");
        if *current != epoch {
            *current = epoch.to_owned();
            let generation = self.0.generation.fetch_add(1, Ordering::AcqRel) + 1;
            self.0.changes.send_replace(generation);
        }
    }
}

/// A session's view: the epoch its pending set was checked against.
#[derive(Clone, Debug, Default)]
pub struct EpochSeen {
    pub epoch: String,
    generation: u64,
}

impl EpochSeen {
    pub fn new(watch: &EpochWatch) -> EpochSeen {
        let (generation, epoch) = watch.snapshot();
        EpochSeen { epoch, generation }
    }

    /// The node's epoch when it differs from the one seen; a counter compare otherwise.
    pub fn changed(&mut self, watch: &EpochWatch) -> Option<(u64, String)> {
        if watch.generation() == self.generation {
            return None;
        }
        let (generation, epoch) = watch.snapshot();
        if epoch == self.epoch {
            self.generation = generation;
            return None;
        }
        Some((generation, epoch))
    }

    /// Whether the node's epoch moved since this one was seen (cheap: a counter).
    pub fn is_behind(&self, watch: &EpochWatch) -> bool {
        watch.generation() != self.generation
    }

    /// The session's pending set is now complete for this epoch.
    pub fn accept(&mut self, generation: u64, epoch: String) {
        self.generation = generation;
        self.epoch = epoch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_master_reports_its_replication_id() {
        let master = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:abc123\r\n";
        assert_eq!(replid_of_master(master).as_deref(), Some("abc123"));
        let replica = "# Replication\r\nrole:slave\r\nmaster_replid:abc123\r\n";
        assert_eq!(replid_of_master(replica), None, "a replica's id is its master's");
    }

    #[test]
    fn a_session_sees_a_new_epoch_once_and_only_when_it_differs() {
        let watch = EpochWatch::new("a".into());
        let mut seen = EpochSeen::new(&watch);
        let changes = watch.subscribe();
        assert_eq!(seen.changed(&watch), None);
        watch.update("a");
        assert_eq!(seen.changed(&watch), None, "same epoch: no generation bump");
        assert!(!changes.has_changed().unwrap(), "sessions are not woken for the same epoch");
        watch.update("b");
        assert!(changes.has_changed().unwrap() && seen.is_behind(&watch), "a new epoch wakes the sessions");
        let (generation, epoch) = seen.changed(&watch).expect("a new epoch");
        assert_eq!(epoch, "b");
        assert!(seen.changed(&watch).is_some(), "still changed until accepted (a rebuild may fail)");
        seen.accept(generation, epoch);
        assert_eq!(seen.changed(&watch), None);
        assert_eq!(seen.epoch, "b");
    }
}
