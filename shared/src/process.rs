//! The skeleton every Herald process runs on: one cancellation tree, tracked tasks,
//! supervised background loops, readiness, and the admin listener.
//!
//! A background loop (an outbox dispatcher, a node-channel listener, a watermark
//! flusher) must not die silently: [`Process::spawn_supervised`] restarts one that
//! panics or returns before shutdown, with capped backoff, counts it in
//! `herald_task_restarts_total{task}`, and keeps `/readyz` false while a critical one
//! is down.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::dependencies::Dependencies;

/// Whether the process can serve: its health loop says its dependencies allow it, no
/// critical loop is down, and it is not draining. It also holds what the health loop
/// found of each dependency, for `/healthz`.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<ReadinessState>);

#[derive(Debug, Default)]
struct ReadinessState {
    dependencies: AtomicBool,
    detail: Dependencies,
    draining: AtomicBool,
    down: Mutex<BTreeSet<&'static str>>,
}

impl Readiness {
    /// The state of each dependency, as the health loop records it.
    pub fn dependencies(&self) -> &Dependencies {
        &self.0.detail
    }

    /// Whether the process's dependencies let it serve, as its health loop decides (the
    /// worker: MySQL with the schema and its leases; the gateway: reached once, and no
    /// outage past its grace).
    pub fn set_dependencies(&self, ok: bool) {
        self.0.dependencies.store(ok, Ordering::Release);
    }

    /// Draining for shutdown: never ready again.
    pub fn set_draining(&self) {
        self.0.draining.store(true, Ordering::Release);
    }

    fn set_down(&self, task: &'static str, down: bool) {
        let mut set = self.0.down.lock().expect("readiness");
        if down {
            set.insert(task);
        } else {
            set.remove(task);
        }
    }

    pub fn get(&self) -> bool {
        self.0.dependencies.load(Ordering::Acquire)
            && !self.0.draining.load(Ordering::Acquire)
            && self.0.down.lock().expect("readiness").is_empty()
    }
}

/// Whether readiness depends on a supervised loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Criticality {
    /// The process cannot serve while it is down (a node-channel listener).
    Critical,
    /// Its work waits, nothing is wrong for clients (a periodic purge).
    Background,
}

/// Restart backoff of a supervised loop: doubling from the first step, capped.
const RESTART_FIRST: Duration = Duration::from_millis(100);
const RESTART_MAX: Duration = Duration::from_secs(30);
/// A loop that ran this long before failing starts its backoff afresh.
const RESTART_RESET_AFTER: Duration = Duration::from_secs(60);

/// One process: its cancellation tree, tasks, readiness and metrics.
#[derive(Debug)]
pub struct Process {
    cancel: CancellationToken,
    tasks: TaskTracker,
    readiness: Readiness,
    restarts: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl Default for Process {
    fn default() -> Self {
        Process::new()
    }
}

impl Process {
    pub fn new() -> Process {
        Process {
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
            readiness: Readiness::default(),
            restarts: Arc::default(),
        }
    }

    /// The root of the cancellation tree: cancelled when the process stops.
    pub fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// Runs a task until it ends; [`Process::stop`] waits for it.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Runs `make(cancel)` as a loop that is restarted whenever it panics or returns
    /// before the process stops.
    pub fn spawn_supervised<F, Fut>(&self, name: &'static str, criticality: Criticality, mut make: F)
    where
        F: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (cancel, readiness, restarts) = (self.cancel.clone(), self.readiness.clone(), self.restarts.clone());
        self.tasks.spawn(async move {
            let mut backoff = RESTART_FIRST;
            loop {
                let started = tokio::time::Instant::now();
                let outcome = tokio::spawn(make(cancel.child_token())).await;
                if cancel.is_cancelled() {
                    return;
                }
                match outcome {
                    Ok(()) => tracing::error!(task = name, "background loop returned; restarting it"),
                    Err(e) if e.is_panic() => tracing::error!(task = name, "background loop panicked; restarting it"),
                    Err(e) => tracing::error!(task = name, error = %e, "background loop ended; restarting it"),
                }
                metrics::counter!("herald_task_restarts_total", "task" => name).increment(1);
                *restarts.lock().expect("restarts").entry(name).or_insert(0) += 1;
                if criticality == Criticality::Critical {
                    readiness.set_down(name, true);
                }
                if started.elapsed() >= RESTART_RESET_AFTER {
                    backoff = RESTART_FIRST;
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(RESTART_MAX);
                readiness.set_down(name, false);
            }
        });
    }

    /// How often the loop `name` was restarted.
    pub fn restarts(&self, name: &str) -> u64 {
        self.restarts.lock().expect("restarts").get(name).copied().unwrap_or(0)
    }

    /// Serves the admin router (`/healthz`, `/readyz`, `/metrics`, and whatever the
    /// process adds) until the process stops.
    pub fn serve_admin(&self, listener: tokio::net::TcpListener, app: axum::Router) {
        let cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move { cancel.cancelled().await });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "admin listener failed");
            }
        });
    }

    /// Cancels everything and waits for the tasks, at most `within`; false when some
    /// did not stop in time.
    pub async fn stop(self, within: Duration) -> bool {
        self.readiness.set_draining();
        self.cancel.cancel();
        self.tasks.close();
        tokio::time::timeout(within, self.tasks.wait()).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_panics_or_returns_is_restarted_counted_and_not_ready_meanwhile() {
        let p = Process::new();
        p.readiness().set_dependencies(true);
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        p.spawn_supervised("flaky", Criticality::Critical, move |cancel| {
            let run = r.fetch_add(1, Ordering::SeqCst);
            async move {
                match run {
                    0 => panic!("made to panic"),
                    1 => {} // returns before shutdown
                    _ => cancel.cancelled().await,
                }
            }
        });
        // The first failure: down until the restart after its backoff.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(p.restarts("flaky"), 1);
        assert!(!p.readiness().get(), "not ready while a critical loop is down");
        tokio::time::sleep(RESTART_FIRST + RESTART_FIRST * 2 + Duration::from_millis(50)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "restarted twice, now running");
        assert_eq!(p.restarts("flaky"), 2);
        assert!(p.readiness().get(), "ready again once it runs");
        assert!(p.stop(Duration::from_secs(1)).await, "a running loop stops with the process");
    }

    #[tokio::test(start_paused = true)]
    async fn a_background_loop_does_not_affect_readiness_and_backoff_is_capped() {
        let p = Process::new();
        p.readiness().set_dependencies(true);
        p.spawn_supervised("purge", Criticality::Background, |_| async {});
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(p.readiness().get());
        // 100 ms doubling to 30 s: ~8 restarts to reach the cap, then one per 30 s.
        let n = p.restarts("purge");
        assert!((14..=20).contains(&n), "{n} restarts in 300 s");
        let readiness = p.readiness().clone();
        assert!(p.stop(Duration::from_secs(1)).await);
        assert!(!readiness.get(), "a stopped process is not ready");
    }
}
