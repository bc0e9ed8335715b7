//! Herald's worker: consumes the ingress streams, commits batches to MySQL, answers
//! the gateways, fans out into Redis and runs the outbox.
//!
//! This module only wires the parts together and runs them.
//!
//! # Layout (lower modules never import higher ones; docs/architecture.md)
//! - Leaves: [`lease`] (shard and snowflake-id leases), [`batch`] (what a committed
//!   batch hands on), [`projections`] (the `rebuild-projections` command).
//! - The pipeline: [`commit`] (one transaction per batch), [`committer`] (a shard's
//!   batch in byte-bounded chunks, poison entries isolated), [`fanout`] (pending sets,
//!   frames and node publishes), [`outbox`] (the transactional outbox and its
//!   dispatcher), [`reads`] (read receipts and their `read` frames), [`delivered`]
//!   (delivered positions and the senders' `delivered` frames), [`push`] (offline
//!   push: unacked messages handed to the tenant's webhook), [`timeline`] (membership,
//!   title and role changes, recalls and edits: timeline events), [`spans`] (the
//!   commit and fan-out spans of traced sends).
//! - [`server_check`]: the MySQL server checked at start (flavour, primary, packet).
//! - [`context`]: what the tasks share; [`ingress`]: shard balancing and the per-shard
//!   consumer; [`trace`]: operators' views; [`admin`]: the admin API;
//!   [`janitor`]: expired devices, message retention, stale stream consumers.

pub mod admin;
pub mod batch;
pub mod commit;
pub mod commit_slots;
pub mod committer;
pub mod context;
pub mod delivered;
pub mod fanout;
pub mod group;
pub mod ingress;
pub mod janitor;
pub mod lease;
pub mod notices;
pub mod outbox;
pub mod projections;
pub mod push;
pub mod reads;
pub mod seq_floor;
pub mod server_check;
pub mod spans;
pub mod timeline;
pub mod trace;

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use herald_shared::config::{Config, Role};
use herald_shared::keys::Keys;
use herald_shared::otel::Tracing;
use herald_shared::process::{Criticality, Process, Readiness};
use tokio_util::sync::CancellationToken;

use crate::commit::CommitPipeline;
use crate::context::WorkerContext;
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
    #[error("the MySQL server cannot be used: {0}")]
    Server(String),
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tracing(#[from] herald_shared::otel::TracingError),
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
    let db = herald_shared::db::pool(&cfg.mysql_url, 2, None)?;
    Ok(projections::rebuild(&db, dry_run).await?)
}

/// Runs the worker until `shutdown` completes.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), WorkerError> {
    let metrics = herald_shared::telemetry::init_metrics();
    // Off (nothing built, nothing recorded) unless otel.endpoint is set.
    let traces = Tracing::start(&cfg.otel, Role::Worker, &cfg.node_id)?;
    let db = herald_shared::db::pool(
        &cfg.mysql_url,
        cfg.worker.db_pool_size,
        Some(Duration::from_millis(cfg.mysql_statement_timeout_ms)),
    )?;
    if cfg.worker.migrate_on_start {
        migrate(&cfg).await?;
    }
    tokio::pin!(shutdown);
    // Before any commit: a server Herald cannot run on is refused.
    let (server, dialect) = tokio::select! {
        checked = server_check::at_start(&db, &cfg) => checked.map_err(WorkerError::Server)?,
        () = &mut shutdown => return Ok(()),
    };
    let redis = herald_shared::redis::pool(&cfg.redis_url, &cfg.redis.tls(), 4).await?;
    let keys = Keys::new(cfg.redis_key_prefix.clone());
    let floors = Arc::new(seq_floor::SeqFloors::new(redis.clone(), keys.clone()));
    let mut fanout = Fanout::new(
        db.clone(),
        redis.clone(),
        keys.clone(),
        cfg.worker.message_ttl_s,
        cfg.delivery.pending_cap,
        cfg.outbox.retry_window_ms(),
    )
    .with_device_ttl(cfg.delivery.device_ttl_s * 1000)
    .with_seq_floors(floors.clone());
    // Sized for a few seconds of fan-outs; when full, their messages get no notification.
    let (push_queue, push_rx) = tokio::sync::mpsc::channel(1_024);
    if cfg.push.enabled() {
        fanout = fanout.with_push(push_queue);
    }
    let fanout = Arc::new(fanout);
    let push_store = Arc::new(push::PushStore {
        db: db.clone(),
        backoff_ms: cfg.push.backoff_ms.clone(),
        max_attempts: cfg.push.max_attempts,
        claim_batch: cfg.push.claim_batch,
        sending_stale_ms: push_sending_stale_ms(&cfg.push),
    });
    let outbox = Arc::new(Outbox::new(db.clone(), cfg.outbox.clone()));
    // Sized for a few seconds of batches; when full, events stay PENDING for the dispatcher.
    let (sent_marks, sent_rx) = tokio::sync::mpsc::channel(10_000);
    let read_receipts = reads::ReadReceipts {
        db: db.clone(),
        redis: redis.clone(),
        keys: keys.clone(),
        max_group: cfg.worker.read_fanout_max_group,
        ttl_ms: cfg.worker.read_state_ttl_s * 1000,
        device_ttl_ms: cfg.delivery.device_ttl_s * 1000,
    };
    let delivered = delivered::DeliveredPositions { db: db.clone(), redis: redis.clone(), keys: keys.clone() };
    let timeline = timeline::TimelineCommitter {
        db: db.clone(),
        settings: timeline::Settings {
            first_retry_delay_ms: cfg.outbox.first_retry_delay_ms,
            device_ttl_ms: cfg.delivery.device_ttl_s * 1000,
            max_id_age_ms: cfg.delivery.sync_settle_ms / 2,
            windows: timeline::rules::Windows {
                recall_ms: cfg.worker.recall_window_s.saturating_mul(1000),
                edit_ms: cfg.worker.edit_window_s.saturating_mul(1000),
            },
            dialect,
        },
        floors: floors.clone(),
    };
    let mut commit = CommitPipeline::new(
        db.clone(),
        cfg.worker.commits_in_flight,
        cfg.outbox.first_retry_delay_ms,
        cfg.delivery.sync_settle_ms,
        cfg.delivery.device_ttl_s * 1000,
        dialect,
        floors.clone(),
        cfg.worker.recipient_cache_devices,
    );
    // Keys of deleted messages are looked up while retention deletes messages, or once
    // it did (a retention since turned off leaves its keys).
    commit.keys_outlive_messages = cfg.worker.retention_enabled() || janitor::keys_kept(&db).await?;
    let shared = Arc::new(WorkerContext {
        commit,
        server,
        cfg,
        db,
        redis,
        keys,
        ids: IdSource::new(),
        fanout: fanout.clone(),
        outbox: outbox.clone(),
        reads: read_receipts,
        delivered,
        timeline,
        push: push_store.clone(),
        sent_marks,
        balancer_ok: AtomicBool::new(false),
        tracer: traces.as_ref().map(Tracing::tracer).unwrap_or_default(),
    });

    let admin_addr = shared.cfg.admin_listen;
    let listener = tokio::net::TcpListener::bind(admin_addr)
        .await
        .map_err(|source| WorkerError::Bind { addr: admin_addr, source })?;
    tracing::info!(node = %shared.cfg.node_id, admin = %listener.local_addr().map_err(|source| WorkerError::Bind { addr: admin_addr, source })?, "worker started");

    let process = Process::new();
    let (commits, committer, fanouts) = group::group_commit(shared.clone());
    let fanout_queue = committer.fanout_queue();
    process.spawn_supervised("group_committer", Criticality::Critical, move |c| committer.clone().run(c));
    process.spawn_supervised("fanout_stage", Criticality::Critical, move |c| fanouts.clone().run(c));
    let balancer = shared.clone();
    process.spawn_supervised("shard_balancer", Criticality::Critical, move |c| {
        ShardBalancer::new(balancer.clone(), commits.clone(), fanout_queue.clone()).run(c)
    });
    let dispatcher =
        OutboxDispatcher { outbox, fanout, fixed_delay: Duration::from_millis(shared.cfg.outbox.fixed_delay_ms) };
    process.spawn_supervised("outbox_dispatcher", Criticality::Background, move |c| dispatcher.clone().run(c));
    let marker = SentMarker {
        outbox: shared.outbox.clone(),
        rx: Arc::new(tokio::sync::Mutex::new(sent_rx)),
        linger: Duration::from_millis(shared.cfg.outbox.sent_mark_linger_ms),
    };
    process.spawn_supervised("sent_marker", Criticality::Background, move |c| marker.clone().run(c));
    if shared.cfg.push.enabled() {
        spawn_push(&process, &shared, push_store, push_rx);
    }
    let janitor = janitor::Janitor {
        db: shared.db.clone(),
        redis: shared.redis.clone(),
        keys: shared.keys.clone(),
        node_id: shared.cfg.node_id.clone(),
        shards: shared.cfg.ingress.shards,
        interval: Duration::from_millis(shared.cfg.worker.janitor_interval_ms),
        device_ttl_ms: shared.cfg.delivery.device_ttl_s * 1000,
        device_forget_ms: shared.cfg.worker.device_forget_s * 1000,
        retention_days: shared.cfg.worker.retention_days,
        retention_overrides: shared.cfg.worker.retention_by_tenant().unwrap_or_default(),
        message_key_days: shared.cfg.worker.message_key_days,
    };
    process.spawn_supervised("janitor", Criticality::Background, move |c| janitor.clone().run(c));
    let (health, ready) = (shared.clone(), process.readiness().clone());
    process.spawn_supervised("health", Criticality::Critical, move |c| health_loop(health.clone(), ready.clone(), c));
    let clock = herald_shared::clock::ClockWatch::new(shared.redis.clone(), shared.cfg.delivery.sync_settle_ms);
    process.spawn_supervised("clock_watch", Criticality::Background, move |c| clock.clone().run(c));
    process.serve_admin(listener, admin::router(shared.clone(), metrics, process.readiness().clone()));

    shutdown.await;
    tracing::info!("worker shutting down");
    if !process.stop(Duration::from_secs(20)).await {
        tracing::warn!("tasks did not stop within 20 s");
    }
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    Ok(())
}

/// Starts the push scheduler and dispatcher.
fn spawn_push(
    process: &Process,
    shared: &Arc<WorkerContext>,
    store: Arc<push::PushStore>,
    rx: tokio::sync::mpsc::Receiver<Vec<batch::PushCandidate>>,
) {
    let cfg = &shared.cfg.push;
    let webhooks = Arc::new(push::Webhooks::new(cfg));
    let wake = Arc::new(tokio::sync::Notify::new());
    let traces = Arc::new(push::traces::PushTraces::default());
    let scheduler = push::PushScheduler {
        rx: Arc::new(tokio::sync::Mutex::new(rx)),
        redis: shared.redis.clone(),
        keys: shared.keys.clone(),
        store: store.clone(),
        webhooks: webhooks.clone(),
        delay: Duration::from_millis(cfg.delay_ms),
        max_waiting: cfg.max_waiting,
        dispatcher: wake.clone(),
        traces: traces.clone(),
    };
    process.spawn_supervised("push_scheduler", Criticality::Background, move |c| scheduler.clone().run(c));
    let dispatcher = push::PushDispatcher {
        store,
        redis: shared.redis.clone(),
        keys: shared.keys.clone(),
        webhooks,
        client: push::webhook::WebhookClient::new(
            cfg.webhook_secret.0.as_bytes(),
            Duration::from_millis(cfg.timeout_ms),
        ),
        poll: Duration::from_millis(cfg.poll_ms),
        sent_retention_ms: cfg.sent_retention_s * 1000,
        wake,
        tracer: shared.tracer.clone(),
        traces,
    };
    process.spawn_supervised("push_dispatcher", Criticality::Background, move |c| dispatcher.clone().run(c));
}

/// A SENDING notification is taken again once its dispatch round must have ended: every
/// wave of webhook calls timed out, plus a margin.
fn push_sending_stale_ms(cfg: &herald_shared::config::PushConfig) -> u64 {
    let waves = (cfg.claim_batch as u64).div_ceil(push::dispatch::CONCURRENCY as u64) + 1;
    waves * cfg.timeout_ms + 10_000
}

/// Keeps `/readyz` current: MySQL answers with the schema applied, Redis leases work.
/// Also checks, now and then, that MySQL makes every commit durable.
async fn health_loop(shared: Arc<WorkerContext>, ready: Readiness, cancel: CancellationToken) {
    let mut rounds: u64 = 0;
    loop {
        if rounds.is_multiple_of(600) {
            check_durability(&shared.db).await;
        }
        if rounds.is_multiple_of(60) && rounds > 0 {
            herald_shared::mysql_server::report_role(&shared.db).await;
        }
        rounds += 1;
        let db = herald_shared::db::schema_state(&shared.db).await;
        let db_ok = db.is_ok();
        ready.dependencies().record("mysql", db);
        let leases = shared.balancer_ok.load(std::sync::atomic::Ordering::Acquire);
        ready.dependencies().record("redis", if leases { Ok(()) } else { Err("shard leases not held".into()) });
        ready.set_dependencies(db_ok && leases);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Warns (log and `herald_mysql_durable` 0) when MySQL may lose a committed message in a
/// crash: Herald's `sent` promises the message survives one.
async fn check_durability(db: &sqlx::MySqlPool) {
    match herald_shared::db::durability(db).await {
        Ok(d) => {
            let problems = d.problems();
            metrics::gauge!("herald_mysql_durable").set(if problems.is_empty() { 1.0 } else { 0.0 });
            for p in problems {
                tracing::warn!(problem = %p, "MySQL is not configured for durable commits");
            }
        }
        Err(e) => tracing::debug!(error = %e, "durability settings not readable yet"),
    }
}
