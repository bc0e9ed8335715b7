//! Whether every live gateway and worker raises device epochs when it changes devices
//! (`Keys::epoch_nodes`, `Keys::epoch_workers`): the commit's recipients cache
//! (`commit/recipients.rs`) is used only then. A gateway of an older release, during a
//! rolling upgrade or after a rollback, registers devices without raising the epoch; a
//! worker of one expires them without raising it.

use fred::prelude::*;
use herald_shared::keys::Keys;

/// Reads the gate: this worker's own heartbeat is written before (`Keys::workers`).
pub(super) async fn all_raise_epochs(redis: &Pool, keys: &Keys) -> Result<bool, Error> {
    let nodes: Vec<String> = redis.smembers(keys.nodes()).await?;
    let raising_nodes: Vec<String> = redis.smembers(keys.epoch_nodes()).await?;
    let workers: Vec<String> = redis.zrange(keys.workers(), 0, -1, None, false, None, false).await?;
    let raising_workers: Vec<String> = redis.zrange(keys.epoch_workers(), 0, -1, None, false, None, false).await?;
    Ok(open(&nodes, &raising_nodes, &workers, &raising_workers))
}

/// Every gateway node (at least one) and every live worker raises epochs.
fn open(nodes: &[String], raising_nodes: &[String], workers: &[String], raising_workers: &[String]) -> bool {
    !nodes.is_empty()
        && nodes.iter().all(|n| raising_nodes.contains(n))
        && workers.iter().all(|w| raising_workers.contains(w))
}

#[cfg(test)]
mod tests {
    use super::open;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_gate_opens_only_when_every_gateway_and_worker_raises_epochs() {
        let (gw, w) = (names(&["g1", "g2"]), names(&["w1"]));
        assert!(open(&gw, &gw, &w, &w));
        assert!(!open(&gw, &names(&["g1"]), &w, &w), "a gateway of an older release");
        assert!(!open(&gw, &gw, &names(&["w1", "w0"]), &w), "a worker of an older release");
        assert!(!open(&[], &[], &w, &w), "no gateway known (Redis lost its sets): wait for them");
        assert!(
            open(&gw, &names(&["g1", "g2", "g3"]), &w, &names(&["w1", "w9"])),
            "raising ones that left count for nothing"
        );
    }
}
