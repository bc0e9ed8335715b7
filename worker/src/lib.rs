//! Herald's worker: consumes the ingress streams, commits batches to MySQL, answers
//! the gateways, fans out into Redis and runs the outbox.
//!
//! # Layout
//! - [`lease`]: shard and snowflake-id leases in Redis.
//! - [`ingress`]: shard balancing and the per-shard consumer.
//! - [`commit`]: the one-transaction-per-batch commit pipeline.
//! - [`fanout`]: pending sets, frames and node publishes.
//! - [`outbox`]: the transactional outbox and its dispatcher.
//! - [`reads`]: read receipts and their `read` frames.
//! - [`projections`]: the `rebuild-projections` command.
//! - [`admin`]: the admin API; [`trace`]: its message and device views.

pub mod admin;
pub mod commit;
pub mod fanout;
pub mod ingress;
pub mod lease;
pub mod outbox;
pub mod projections;
pub mod reads;
pub mod trace;

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use herald_shared::config::Config;
use herald_shared::keys::Keys;
use herald_shared::ops::Readiness;
use sqlx::mysql::MySqlPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::commit::CommitPipeline;
use crate::fanout::Fanout;
use crate::ingress::ShardBalancer;
use crate::lease::IdSource;
use crate::outbox::{Outbox, OutboxDispatcher, SentMarker};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
}

/// What every task of the worker shares.
#[derive(Debug)]
pub struct Shared {
    pub cfg: Config,
    pub db: MySqlPool,
    pub redis: fred::prelude::Pool,
    pub keys: Keys,
    pub ids: IdSource,
    pub commit: CommitPipeline,
    pub fanout: Arc<Fanout>,
    pub outbox: Arc<Outbox>,
    pub reads: reads::ReadReceipts,
    /// Outbox events dispatched right after commit, to be marked SENT in batches.
    pub sent_marks: tokio::sync::mpsc::Sender<u64>,
    /// The last lease round succeeded (Redis reachable, ids leased).
    pub balancer_ok: AtomicBool,
}

/// Applies the schema and returns (`herald-worker migrate`).
pub async fn migrate(cfg: &Config) -> Result<(), WorkerError> {
    herald_shared::db::migrate(&cfg.mysql_url).await.map_err(|e| match e {
        sqlx::Error::Migrate(m) => WorkerError::Migrate(*m),
        other => WorkerError::Db(other),
    })
}

/// `herald-worker rebuild-projections [--dry-run]`.
pub async fn rebuild_projections(cfg: &Config, dry_run: bool) -> Result<projections::Report, WorkerError> {
    let db = herald_shared::db::pool(&cfg.mysql_url, 2)?;
    Ok(projections::rebuild(&db, dry_run).await?)
}

/// Runs the worker until `shutdown` completes.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), WorkerError> {
    let metrics = herald_shared::telemetry::init_metrics();
    if cfg.worker.migrate_on_start {
        migrate(&cfg).await?;
    }
    let db = herald_shared::db::pool(&cfg.mysql_url, cfg.worker.db_pool_size)?;
    let redis = herald_shared::redis::pool(&cfg.redis_url, 4).await?;
    let keys = Keys::new(cfg.redis_key_prefix.clone());
    let fanout = Arc::new(Fanout::new(
        db.clone(),
        redis.clone(),
        keys.clone(),
        cfg.worker.message_ttl_s,
        cfg.delivery.pending_cap,
    ));
    let outbox = Arc::new(Outbox::new(db.clone(), cfg.outbox.clone()));
    // Sized for a few seconds of batches; when full, events stay PENDING for the dispatcher.
    let (sent_marks, sent_rx) = tokio::sync::mpsc::channel(10_000);
    let read_receipts = reads::ReadReceipts {
        db: db.clone(),
        redis: redis.clone(),
        keys: keys.clone(),
        max_group: cfg.worker.read_fanout_max_group,
        ttl_ms: cfg.worker.read_state_ttl_s * 1000,
    };
    let shared = Arc::new(Shared {
        commit: CommitPipeline::new(db.clone(), cfg.outbox.first_retry_delay_ms),
        cfg,
        db,
        redis,
        keys,
        ids: IdSource::new(),
        fanout: fanout.clone(),
        outbox: outbox.clone(),
        reads: read_receipts,
        sent_marks,
        balancer_ok: AtomicBool::new(false),
    });

    let admin_addr = shared.cfg.admin_listen;
    let listener = tokio::net::TcpListener::bind(admin_addr)
        .await
        .map_err(|source| WorkerError::Bind { addr: admin_addr, source })?;
    tracing::info!(node = %shared.cfg.node_id, admin = %listener.local_addr().map_err(|source| WorkerError::Bind { addr: admin_addr, source })?, "worker started");

    let cancel = CancellationToken::new();
    let tasks = TaskTracker::new();
    let ready = Readiness::default();
    tasks.spawn(ShardBalancer::new(shared.clone()).run(cancel.child_token()));
    tasks.spawn(
        OutboxDispatcher { outbox, fanout, fixed_delay: Duration::from_millis(shared.cfg.outbox.fixed_delay_ms) }
            .run(cancel.child_token()),
    );
    tasks.spawn(SentMarker { outbox: shared.outbox.clone(), rx: sent_rx }.run(cancel.child_token()));
    tasks.spawn(health_loop(shared.clone(), ready.clone(), cancel.child_token()));
    let app = admin::router(shared.clone(), metrics, ready.clone());
    let admin_cancel = cancel.child_token();
    tasks.spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move { admin_cancel.cancelled().await });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "admin listener failed");
        }
    });
    tasks.close();

    shutdown.await;
    tracing::info!("worker shutting down");
    ready.set(false);
    cancel.cancel();
    if tokio::time::timeout(Duration::from_secs(20), tasks.wait()).await.is_err() {
        tracing::warn!("tasks did not stop within 20 s");
    }
    Ok(())
}

/// Keeps `/readyz` current: MySQL answers with the schema applied, Redis leases work.
async fn health_loop(shared: Arc<Shared>, ready: Readiness, cancel: CancellationToken) {
    loop {
        let db_ok = herald_shared::db::migrations_applied(&shared.db).await;
        ready.set(db_ok && shared.balancer_ok.load(std::sync::atomic::Ordering::Acquire));
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
