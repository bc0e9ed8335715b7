//! What a process knows of its shared dependencies (MySQL, Redis): each one's state
//! since when, for `/healthz`'s detail, the `herald_dependency_up{dependency}` gauge and
//! the readiness policy of the gateway.
//!
//! A dependency's outage is not the process's own failure: every gateway sees the same
//! Redis and MySQL, so taking them all out of their Service during a failover helps no
//! client. A gateway is unready for its dependencies only before it has reached them
//! once, and after an outage longer than its grace ([`Dependencies::ready_within`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The state of every dependency a process checks.
#[derive(Clone, Debug, Default)]
pub struct Dependencies(Arc<Mutex<BTreeMap<&'static str, State>>>);

#[derive(Clone, Debug)]
struct State {
    up: bool,
    /// When `up` last changed (or the first check).
    since: Instant,
    /// Whether it was ever up since the process started.
    reached: bool,
    error: Option<String>,
}

/// One dependency as `/healthz` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DependencyStatus {
    pub name: &'static str,
    pub up: bool,
    /// Seconds in this state.
    pub for_s: u64,
    /// Why it is down (the last check's error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Dependencies {
    /// Records one check of `name`: `Ok` when it answered as needed.
    pub fn record(&self, name: &'static str, outcome: Result<(), String>) {
        self.record_at(name, outcome, Instant::now());
    }

    fn record_at(&self, name: &'static str, outcome: Result<(), String>, now: Instant) {
        let up = outcome.is_ok();
        metrics::gauge!("herald_dependency_up", "dependency" => name).set(if up { 1.0 } else { 0.0 });
        let mut all = self.0.lock().expect("dependencies");
        let state = all.entry(name).or_insert(State { up, since: now, reached: false, error: None });
        if state.up != up {
            if up {
                tracing::info!(
                    dependency = name,
                    down_for_ms = now.duration_since(state.since).as_millis() as u64,
                    "dependency is back"
                );
            } else {
                tracing::warn!(
                    dependency = name,
                    error = outcome.as_ref().err().map(String::as_str).unwrap_or(""),
                    "dependency is down"
                );
            }
            state.up = up;
            state.since = now;
        }
        state.reached |= up;
        state.error = outcome.err();
    }

    /// Every dependency checked so far, by name.
    pub fn snapshot(&self) -> Vec<DependencyStatus> {
        self.snapshot_at(Instant::now())
    }

    fn snapshot_at(&self, now: Instant) -> Vec<DependencyStatus> {
        let all = self.0.lock().expect("dependencies");
        all.iter()
            .map(|(name, s)| DependencyStatus {
                name,
                up: s.up,
                for_s: now.duration_since(s.since).as_secs(),
                error: s.error.clone(),
            })
            .collect()
    }

    /// True when every one of `names` has been reached since the start, and none has been
    /// down longer than `grace` (`None`: an outage never makes the process unready).
    pub fn ready_within(&self, names: &[&'static str], grace: Option<Duration>) -> bool {
        self.ready_within_at(names, grace, Instant::now())
    }

    fn ready_within_at(&self, names: &[&'static str], grace: Option<Duration>, now: Instant) -> bool {
        let all = self.0.lock().expect("dependencies");
        names.iter().all(|name| match all.get(name) {
            None => false,
            Some(s) => s.reached && (s.up || grace.is_none_or(|g| now.duration_since(s.since) <= g)),
        })
    }

    /// True when every dependency checked so far is up.
    pub fn all_up(&self) -> bool {
        self.0.lock().expect("dependencies").values().all(|s| s.up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: &[&str] = &["mysql", "redis"];

    #[test]
    fn a_process_is_unready_until_it_reaches_every_dependency_once() {
        let d = Dependencies::default();
        let t0 = Instant::now();
        let grace = Some(Duration::from_secs(60));
        assert!(!d.ready_within_at(BOTH, grace, t0), "nothing checked yet");
        d.record_at("mysql", Ok(()), t0);
        d.record_at("redis", Err("connection refused".into()), t0);
        assert!(!d.ready_within_at(BOTH, grace, t0), "Redis never reached");
        d.record_at("redis", Ok(()), t0 + Duration::from_secs(1));
        assert!(d.ready_within_at(BOTH, grace, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn a_short_outage_degrades_and_a_long_one_makes_the_process_unready() {
        let d = Dependencies::default();
        let t0 = Instant::now();
        let grace = Some(Duration::from_secs(60));
        d.record_at("mysql", Ok(()), t0);
        d.record_at("redis", Ok(()), t0);
        d.record_at("mysql", Err("gone away".into()), t0 + Duration::from_secs(10));
        let at = |s| t0 + Duration::from_secs(s);
        assert!(d.ready_within_at(BOTH, grace, at(69)), "down 59 s of a 60 s grace: still ready");
        assert!(!d.all_up());
        let mysql = d.snapshot_at(at(40)).into_iter().find(|s| s.name == "mysql").expect("mysql");
        assert_eq!(mysql, DependencyStatus { name: "mysql", up: false, for_s: 30, error: Some("gone away".into()) });
        assert!(!d.ready_within_at(BOTH, grace, at(71)), "down past the grace: unready");
        assert!(d.ready_within_at(BOTH, None, at(10_000)), "without a grace an outage never makes it unready");
        d.record_at("mysql", Ok(()), at(80));
        assert!(d.ready_within_at(BOTH, grace, at(80)), "ready again once it is back");
        assert!(d.all_up());
        assert_eq!(d.snapshot_at(at(85))[0], DependencyStatus { name: "mysql", up: true, for_s: 5, error: None });
    }
}
