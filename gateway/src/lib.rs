//! Herald's gateway: the public HTTP and WebSocket edge. This module only wires the
//! parts together and runs them.
//!
//! # Layout (lower modules never import higher ones; docs/architecture.md)
//! - [`tls`]: the listener's optional TLS; [`mailbox`]: what the node hands a session;
//!   [`budget`]: the node's adaptive backlog budget.
//! - Leaves: [`error`] (the API error), [`limits`] (rate and connection limits),
//!   [`listener`] (the public listener), [`client_ip`] (the client behind trusted
//!   proxies), [`waiters`] (requests awaiting answers),
//!   [`epoch`] (the Redis epoch), [`sessions`] (the directory of sessions here),
//!   [`acks`] (the node's ack writer: acked ids out of the pending sets); [`watchers`] (who follows
//!   whose presence here) sits with the mailbox.
//! - Services: [`history`] (reads from MySQL), [`ingress`] (sends and reads into the
//!   streams, through the node's [`ingress_writer`]), [`send_span`] (a send's trace
//!   span), [`devices`] (device registration), [`recovery`] (pending-set rebuilds),
//!   [`identity`] (tokens' key sets and revocations), [`watermarks`] (their flusher),
//!   [`delivered`] (delivered positions' flusher), [`notices`] (the node and presence
//!   channels), [`typing`] (typing indicators relayed), [`roster`] (presence announced,
//!   through the node's [`announcer`], and read). [`status`] (a message's status per
//!   recipient) sits with the leaves.
//! - [`session`]: one WebSocket session.
//! - [`state`]: the services bundled for the handlers; [`api`]: the HTTP handlers and
//!   the WebSocket upgrade.

pub mod acks;
pub mod announcer;
pub mod api;
pub mod budget;
pub mod client_ip;
pub mod delivered;
pub mod devices;
pub mod epoch;
pub mod error;
pub mod history;
pub mod identity;
pub mod ingress;
pub mod ingress_writer;
pub mod limits;
pub mod listener;
pub mod liveness;
pub mod mailbox;
pub mod meters;
pub mod notices;
pub mod recovery;
pub mod roster;
pub mod send_span;
pub mod session;
pub mod sessions;
pub mod starts;
pub mod state;
pub mod status;
pub mod tls;
pub mod typing;
pub mod waiters;
pub mod watchers;
pub mod watermarks;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use herald_shared::config::{Config, Role};
use herald_shared::keys::Keys;
use herald_shared::otel::Tracing;
use herald_shared::process::{Criticality, Process, Readiness};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::epoch::EpochWatch;
use crate::history::History;
use crate::ingress::Ingress;
use crate::notices::NodeChannel;
use crate::recovery::Recovery;
use crate::session::SessionEnv;
use crate::sessions::SessionRegistry;
use crate::state::{AppState, Gateway};
use crate::waiters::SendWaiters;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    #[error("redis maxmemory-policy is {0:?}; pending sets must never be evicted. Set it to noeviction, or gateway.require_noeviction = false")]
    Eviction(String),
    #[error("cannot read Redis maxmemory-policy: CONFIG GET was refused ({0}). Managed Redis services often refuse CONFIG. If this Redis never evicts keys (maxmemory-policy noeviction), turn the check off: gateway.require_noeviction = false (HERALD_GATEWAY__REQUIRE_NOEVICTION=false; chart: redis.requireNoeviction=false)")]
    EvictionUnknown(fred::error::Error),
    #[error("the MySQL server cannot be used: {0}")]
    MysqlServer(String),
    #[error("gateway TLS: {0}")]
    Tls(#[from] herald_shared::tls::TlsError),
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tracing(#[from] herald_shared::otel::TracingError),
}

/// Runs the gateway until `shutdown` completes.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), GatewayError> {
    let metrics = herald_shared::telemetry::init_metrics();
    // Off (nothing built, nothing recorded) unless otel.endpoint is set.
    let traces = Tracing::start(&cfg.otel, Role::Gateway, &cfg.node_id)?;
    let cfg = Arc::new(cfg);
    let db = herald_shared::db::pool(&cfg.mysql_url, cfg.gateway.db_pool_size, Some(statement_timeout(&cfg)))?;
    let redis = herald_shared::redis::pool(&cfg.redis_url, &cfg.redis.tls(), 4).await?;
    // Only with the check on: where CONFIG is refused (managed Redis) the check is
    // turned off, and nothing else needs CONFIG.
    if cfg.gateway.require_noeviction {
        let policy =
            herald_shared::redis::eviction_policy(redis.next()).await.map_err(GatewayError::EvictionUnknown)?;
        if policy != "noeviction" {
            return Err(GatewayError::Eviction(policy));
        }
    }
    check_mysql_server(&db).await?;
    let keys = Keys::new(cfg.redis_key_prefix.clone());
    let waiters = Arc::new(SendWaiters::default());
    let channels = vec![keys.node_channel(&cfg.node_id), keys.presence_channel()];
    let subscriber = notices::subscribe(&cfg.redis_url, &cfg.redis.tls(), channels).await?;
    let epoch = EpochWatch::new(epoch::current_epoch(&redis, &keys.epoch()).await?);

    let tls = match cfg.gateway.tls_files() {
        Some((cert, key)) => Some(tls::ListenerTls::from_files(&cert, &key)?),
        None => None,
    };
    let (listen, admin_listen) = (cfg.listen, cfg.admin_listen);
    let listener =
        tokio::net::TcpListener::bind(listen).await.map_err(|source| GatewayError::Bind { addr: listen, source })?;
    let admin = tokio::net::TcpListener::bind(admin_listen)
        .await
        .map_err(|source| GatewayError::Bind { addr: admin_listen, source })?;
    // The bound addresses (a port of 0 in the configuration picks a free one); test
    // harnesses read them from this line.
    let bound =
        |l: &tokio::net::TcpListener, addr| l.local_addr().map_err(|source| GatewayError::Bind { addr, source });
    tracing::info!(node = %cfg.node_id, listen = %bound(&listener, listen)?, tls = tls.is_some(), admin = %bound(&admin, admin_listen)?, "gateway started");

    let process = Process::new();
    let directory = Arc::new(SessionRegistry::default());
    let (marks, flusher) = watermarks::channel(db.clone());
    let (ack_queue, ack_writer) = acks::channel(redis.clone());
    let (delivered, delivered_flusher) = delivered::channel(redis.clone(), keys.clone(), cfg.ingress.shards);
    let history = History {
        db: db.clone(),
        redis: redis.clone(),
        keys: keys.clone(),
        page_bytes: cfg.gateway.history_page_bytes,
        settle_ms: cfg.delivery.sync_settle_ms,
    };
    let g = &cfg.gateway;
    let (ingress_queue, ingress_writer) =
        ingress_writer::channel(redis.clone(), keys.clone(), waiters.clone(), cfg.node_id.clone(), g.ingress_pack_max);
    let ingress = Ingress {
        queue: ingress_queue,
        waiters: waiters.clone(),
        node_id: cfg.node_id.clone(),
        shards: cfg.ingress.shards,
        send_timeout: Duration::from_millis(g.send_timeout_ms),
        max_body_bytes: g.max_body_bytes,
        tracer: traces.as_ref().map(Tracing::tracer).unwrap_or_default(),
    };
    let limits = Arc::new(limits::NodeLimits::new(g));
    let watchers = Arc::new(watchers::PresenceWatchers::default());
    let (announcements, announcer) = announcer::channel(redis.clone(), &keys);
    let roster = roster::Roster {
        db: db.clone(),
        redis: redis.clone(),
        keys: keys.clone(),
        max_users: g.presence_max_users,
        seen_ttl_s: cfg.delivery.device_ttl_s,
        announcements,
    };
    let typing = Arc::new(typing::TypingRelay::new(
        db.clone(),
        redis.clone(),
        keys.clone(),
        g.typing_expiry_ms,
        g.typing_max_members,
    ));
    let drain = process.cancel().child_token();
    let identity = Arc::new(identity::Identity::new(
        herald_shared::identity::KeySet::default(),
        identity::Revocations::new(redis.clone(), keys.clone(), cfg.auth.max_token_lifetime_s + cfg.auth.leeway_s),
    ));
    let key_refresher = identity::KeyRefresher::new(&cfg, identity.clone());
    // Before any request is served: a JWKS URL that does not answer leaves its tenant
    // without keys until a later read (tried every few seconds) gets them.
    if !key_refresher.refresh().await {
        tracing::warn!("some keys could not be read; their tenants' tokens are refused until they are");
    }
    let devices = devices::DeviceRegistry::new(
        db.clone(),
        redis.clone(),
        keys.clone(),
        cfg.delivery.last_seen_every(),
        Duration::from_secs(cfg.delivery.device_ttl_s),
    );
    let sessions = Arc::new(SessionEnv {
        identity: identity.clone(),
        devices: devices.clone(),
        cfg: cfg.clone(),
        redis: redis.clone(),
        keys: keys.clone(),
        history: history.clone(),
        ingress: ingress.clone(),
        recovery: Recovery {
            db: db.clone(),
            redis: redis.clone(),
            keys: keys.clone(),
            watermark_margin_ms: g.watermark_margin_ms,
            start_reads: Arc::new(tokio::sync::Semaphore::new(g.start_db_reads as usize)),
        },
        marks,
        acks: ack_queue,
        delivered,
        epoch: epoch.clone(),
        directory: directory.clone(),
        limits: limits.clone(),
        roster: roster.clone(),
        typing,
        watchers: watchers.clone(),
        drain: drain.clone(),
    });
    let state = AppState(Arc::new(Gateway {
        cfg: cfg.clone(),
        db: db.clone(),
        history,
        ingress,
        devices,
        limits: limits.clone(),
        roster,
        sessions,
        session_tasks: TaskTracker::new(),
    }));

    let liveness = liveness::NodeLiveness {
        redis: redis.clone(),
        keys: keys.clone(),
        node: cfg.node_id.clone(),
        heartbeat: Duration::from_millis(g.heartbeat_ms),
        roster: state.roster.clone(),
        sessions: directory.clone(),
    };
    process.spawn_supervised("liveness", Criticality::Background, move |c| liveness.clone().run(c));
    let registry = state.devices.clone();
    process.spawn_supervised("device_registrar", Criticality::Critical, move |c| registry.clone().run(c));
    process.spawn_supervised("watermark_flusher", Criticality::Background, move |c| flusher.clone().run(c));
    process.spawn_supervised("ack_writer", Criticality::Critical, move |c| ack_writer.clone().run(c));
    process.spawn_supervised("presence_announcer", Criticality::Background, move |c| announcer.clone().run(c));
    process.spawn_supervised("ingress_writer", Criticality::Critical, move |c| ingress_writer.clone().run(c));
    let delivered_flusher = delivered_flusher.clone();
    process.spawn_supervised("delivered_flusher", Criticality::Background, move |c| delivered_flusher.clone().run(c));
    let budget = budget::BudgetController::new(g, limits.backlog.clone(), limits.realtime.clone());
    process.spawn_supervised("backlog_budget", Criticality::Background, move |c| budget.clone().run(c));
    let devices = state.devices.clone();
    let channel = NodeChannel {
        client: subscriber.clone(),
        waiters,
        sessions: directory.clone(),
        watchers,
        devices,
        identity: identity.clone(),
    };
    process.spawn_supervised("key_refresher", Criticality::Background, move |c| key_refresher.clone().run(c));
    process.spawn_supervised("node_channel", Criticality::Critical, move |c| channel.clone().run(c));
    let check_policy = g.require_noeviction;
    let grace = Some(g.dependency_outage_grace_ms).filter(|&ms| ms > 0).map(Duration::from_millis);
    let health = Health {
        redis: redis.clone(),
        db,
        keys,
        epoch,
        limits,
        check_policy,
        grace,
        ready: process.readiness().clone(),
    };
    process.spawn_supervised("health", Criticality::Critical, move |c| health.clone().run(c));
    let clock = herald_shared::clock::ClockWatch::new(redis.clone(), cfg.delivery.sync_settle_ms);
    process.spawn_supervised("clock_watch", Criticality::Background, move |c| clock.clone().run(c));
    process.serve_admin(admin, herald_shared::ops::router(metrics, process.readiness().clone()));
    let listener_cancel = process.cancel().child_token();
    let header_timeout = Duration::from_millis(g.handshake_timeout_ms);
    process.spawn(listener::serve(listener, tls, api::router(state.clone()), header_timeout, listener_cancel.clone()));

    shutdown.await;
    // Drain: fail readiness, stop accepting, tell every session when to come back,
    // wait for them (bounded), then stop the rest.
    tracing::info!(sessions = directory.len(), "gateway draining");
    process.readiness().set_draining();
    listener_cancel.cancel();
    drain.cancel();
    state.session_tasks.close();
    let bound = Duration::from_millis(cfg.gateway.drain_ms + 5_000);
    if tokio::time::timeout(bound, state.session_tasks.wait()).await.is_err() {
        tracing::warn!(sessions = directory.len(), "sessions did not end within the drain period");
    }
    if !process.stop(Duration::from_secs(10)).await {
        tracing::warn!("tasks did not stop within 10 s");
    }
    let _ = subscriber.quit().await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    Ok(())
}

/// Band pages, recovery and sync read `mysql_url`: on a replica or a reader endpoint
/// they could move past rows not yet replicated, and lose pushes for good. A server that
/// is not the writable primary, or not one Herald supports, is refused; one that does
/// not answer yet is checked by the health loop once it does.
async fn check_mysql_server(db: &sqlx::MySqlPool) -> Result<(), GatewayError> {
    match tokio::time::timeout(Duration::from_secs(5), herald_shared::mysql_server::inspect(db)).await {
        Ok(Ok(server)) => {
            let mut problems = server.role_problems();
            if let Err(e) = server.dialect() {
                problems.insert(0, e);
            }
            if !problems.is_empty() {
                return Err(GatewayError::MysqlServer(problems.join("; ")));
            }
            metrics::gauge!("herald_mysql_primary").set(1.0);
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "MySQL server not checked at start; the health loop checks it"),
        Err(_) => tracing::warn!("MySQL did not answer at start; the health loop checks its role"),
    }
    Ok(())
}

fn statement_timeout(cfg: &Config) -> Duration {
    Duration::from_millis(cfg.mysql_statement_timeout_ms)
}

/// Keeps `/readyz`, `/healthz`'s dependencies, the epoch and the eviction-policy gauge
/// current. Readiness is the gateway's own ability to serve: it waits for MySQL (with
/// the schema) and Redis once, then an outage of theirs fails it only past `grace`.
#[derive(Clone, Debug)]
struct Health {
    redis: Pool,
    db: sqlx::MySqlPool,
    keys: Keys,
    epoch: EpochWatch,
    limits: Arc<limits::NodeLimits>,
    /// `gateway.require_noeviction`: off, the policy is not read (CONFIG may be refused).
    check_policy: bool,
    /// `gateway.dependency_outage_grace_ms`; `None`: never unready for a dependency.
    grace: Option<Duration>,
    ready: Readiness,
}

impl Health {
    async fn run(self, cancel: CancellationToken) {
        let mut rounds: u64 = 0;
        loop {
            if self.check_policy && rounds.is_multiple_of(60) {
                // Someone may reconfigure Redis after we started: keep checking.
                if let Ok(policy) = herald_shared::redis::eviction_policy(self.redis.next()).await {
                    metrics::gauge!("herald_redis_noeviction").set(if policy == "noeviction" { 1.0 } else { 0.0 });
                }
            }
            if rounds.is_multiple_of(60) {
                herald_shared::mysql_server::report_role(&self.db).await;
            }
            rounds += 1;
            let deps = self.ready.dependencies();
            deps.record("mysql", herald_shared::db::schema_state(&self.db).await);
            if let Err(e) = epoch::check_master(&self.redis, &self.keys).await {
                tracing::debug!(error = %e, "Redis master not checked");
            }
            let epoch = epoch::current_epoch(&self.redis, &self.keys.epoch()).await;
            if let Ok(epoch) = &epoch {
                self.epoch.update(epoch);
            }
            deps.record("redis", epoch.map(drop).map_err(|e| e.to_string()));
            self.ready.set_dependencies(deps.ready_within(&["mysql", "redis"], self.grace));
            self.limits.retain_recent();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}
