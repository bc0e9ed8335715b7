//! Herald's gateway: the public HTTP (and, next, WebSocket) edge.
//!
//! # Layout
//! - [`auth`]: tokens on every request; device registration.
//! - [`conversations`]: create, members, list.
//! - [`messages`]: the durable send.
//! - [`notices`]: the node channel (answers, deliveries, kicks).
//! - [`history`]: reads from MySQL (history, device sync, frames of backlog).
//! - [`ws`], [`session`], [`sessions`]: WebSocket sessions and their registry.
//! - [`error`]: the API error type.
//! - [`limits`]: rate and connection limits; [`listener`]: the public listener.

pub mod auth;
pub mod conversations;
pub mod error;
pub mod history;
pub mod limits;
pub mod listener;
pub mod messages;
pub mod notices;
pub mod recovery;
pub mod session;
pub mod sessions;
pub mod ws;

#[cfg(test)]
mod body_strategies;

use std::collections::HashSet;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{Json, Router};
use fred::prelude::*;
use herald_shared::config::Config;
use herald_shared::keys::Keys;
use herald_shared::ops::Readiness;
use sqlx::mysql::MySqlPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Caller;
use crate::notices::SendWaiters;
use crate::sessions::SessionRegistry;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    #[error("redis maxmemory-policy is {0:?}; pending sets must never be evicted. Set it to noeviction, or gateway.require_noeviction = false")]
    Eviction(String),
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
}

#[derive(Debug)]
pub struct GatewayState {
    pub cfg: Config,
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    pub waiters: Arc<SendWaiters>,
    /// Devices already registered in MySQL by this process.
    pub known_devices: Mutex<HashSet<(String, String, String)>>,
    pub sessions: Arc<SessionRegistry>,
    /// Every WebSocket session is tracked here: axum does not track upgraded sockets.
    pub tracker: TaskTracker,
    /// Cancelled when the gateway drains: sessions send `reconnect` and close.
    pub shutdown: CancellationToken,
    /// The current Redis epoch (see [`recovery`]), and a counter bumped when it changes,
    /// so sessions can check it every tick without copying the string.
    pub epoch: std::sync::RwLock<String>,
    pub epoch_generation: std::sync::atomic::AtomicU64,
    /// Watermark reports of sessions, flushed to MySQL in batches.
    pub marks: tokio::sync::mpsc::Sender<recovery::Mark>,
    pub limits: limits::NodeLimits,
}

impl GatewayState {
    pub fn epoch(&self) -> String {
        self.epoch.read().expect("epoch").clone()
    }
}

#[derive(Clone, Debug)]
pub struct AppState(Arc<GatewayState>);

impl Deref for AppState {
    type Target = GatewayState;
    fn deref(&self) -> &GatewayState {
        &self.0
    }
}

/// The public API.
pub fn router(state: AppState) -> Router {
    // The JSON envelope around a maximal body, with room for escaping.
    let body_limit = state.cfg.gateway.max_body_bytes * 2 + 4096;
    Router::new()
        .route("/v1/devices", post(register))
        .route("/v1/conversations", post(conversations::create).get(conversations::list))
        .route("/v1/conversations/{id}/members", post(conversations::change_members))
        .route("/v1/messages", post(messages::send))
        .route("/v1/conversations/{id}/messages", get(history::messages))
        .route("/v1/conversations/{id}/read", post(messages::read))
        .route("/v1/sync", get(history::sync))
        .route("/v1/ws", get(ws::upgrade))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::map_response(protocol_error_body))
        .with_state(state)
}

/// Refusals that come from axum itself (unknown path, body over the limit, a plain GET
/// on the WebSocket path) get the protocol's JSON error body like every other error.
async fn protocol_error_body(resp: axum::response::Response) -> axum::response::Response {
    use herald_shared::error::ErrorCode;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (code, message) = match status.as_u16() {
        401 => (ErrorCode::Unauthorized, "unauthorized"),
        403 => (ErrorCode::Forbidden, "forbidden"),
        404 => (ErrorCode::NotFound, "no such resource"),
        409 => (ErrorCode::Conflict, "conflict"),
        413 => (ErrorCode::TooLarge, "request body too large"),
        429 => (ErrorCode::RateLimited, "too many requests; retry later"),
        503 => (ErrorCode::Unavailable, "unavailable; retry"),
        500..=599 => (ErrorCode::Internal, "internal error"),
        _ => (ErrorCode::BadRequest, status.canonical_reason().unwrap_or("bad request")),
    };
    let mut out = herald_shared::ops::error_response(code, message);
    if let Some(retry) = resp.headers().get(axum::http::header::RETRY_AFTER) {
        out.headers_mut().insert(axum::http::header::RETRY_AFTER, retry.clone());
    }
    out
}

async fn register(Caller(c): Caller) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "tenant": c.tid, "user": c.sub, "device": c.dev, "platform": c.plat }))
}

/// Runs the gateway until `shutdown` completes.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), GatewayError> {
    let metrics = herald_shared::telemetry::init_metrics();
    let db = herald_shared::db::pool(&cfg.mysql_url, cfg.gateway.db_pool_size)?;
    let redis = herald_shared::redis::pool(&cfg.redis_url, 4).await?;
    let policy = herald_shared::redis::eviction_policy(redis.next()).await?;
    if cfg.gateway.require_noeviction && policy != "noeviction" {
        return Err(GatewayError::Eviction(policy));
    }
    let keys = Keys::new(cfg.redis_key_prefix.clone());
    let waiters = Arc::new(SendWaiters::default());
    let subscriber = notices::subscribe(&cfg.redis_url, keys.node_channel(&cfg.node_id)).await?;
    let epoch = recovery::current_epoch(&redis, &keys.epoch()).await?;
    // Sized for a flush period's reports of many sessions; a full queue only delays W.
    let (marks, marks_rx) = tokio::sync::mpsc::channel(65_536);

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
    tracing::info!(node = %cfg.node_id, listen = %bound(&listener, listen)?, admin = %bound(&admin, admin_listen)?, "gateway started");

    let cancel = CancellationToken::new();
    let tasks = TaskTracker::new();
    let sessions = Arc::new(SessionRegistry::default());
    let drain_ms = cfg.gateway.drain_ms;
    let cfg_gateway = cfg.gateway.clone();
    let state = AppState(Arc::new(GatewayState {
        cfg,
        db,
        redis,
        keys,
        waiters: waiters.clone(),
        known_devices: Mutex::new(HashSet::new()),
        sessions: sessions.clone(),
        tracker: tasks.clone(),
        shutdown: CancellationToken::new(),
        epoch: std::sync::RwLock::new(epoch),
        epoch_generation: std::sync::atomic::AtomicU64::new(0),
        marks,
        limits: limits::NodeLimits::new(&cfg_gateway),
    }));
    tasks.spawn(recovery::flush_watermarks(state.clone(), marks_rx, cancel.child_token()));
    let ready = Readiness::default();
    let listener_cancel = CancellationToken::new();
    tasks.spawn(notices::listen(subscriber, waiters, sessions, cancel.child_token()));
    tasks.spawn(health_loop(state.clone(), ready.clone(), cancel.child_token()));
    let admin_app = herald_shared::ops::router(metrics, ready.clone());
    let c = cancel.child_token();
    tasks.spawn(async move {
        if let Err(e) = axum::serve(admin, admin_app).with_graceful_shutdown(async move { c.cancelled().await }).await {
            tracing::error!(error = %e, "admin listener failed");
        }
    });
    let app = router(state.clone());
    let header_timeout = Duration::from_millis(state.cfg.gateway.handshake_timeout_ms);
    tasks.spawn(listener::serve(listener, app, header_timeout, listener_cancel.clone()));
    tasks.close();

    shutdown.await;
    // Drain: fail readiness, stop accepting, tell every session when to come back,
    // wait for them (bounded), then stop the rest.
    tracing::info!(sessions = state.sessions.len(), "gateway draining");
    ready.set(false);
    listener_cancel.cancel();
    state.shutdown.cancel();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(drain_ms + 5_000);
    while !state.sessions.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    if tokio::time::timeout(Duration::from_secs(10), tasks.wait()).await.is_err() {
        tracing::warn!("tasks did not stop within 10 s");
    }
    Ok(())
}

async fn health_loop(state: AppState, ready: Readiness, cancel: CancellationToken) {
    let mut rounds: u64 = 0;
    loop {
        if rounds.is_multiple_of(60) {
            // Someone may reconfigure Redis after we started: keep checking.
            if let Ok(policy) = herald_shared::redis::eviction_policy(state.redis.next()).await {
                metrics::gauge!("herald_redis_noeviction").set(if policy == "noeviction" { 1.0 } else { 0.0 });
            }
        }
        rounds += 1;
        let db_ok = herald_shared::db::migrations_applied(&state.db).await;
        let epoch = recovery::current_epoch(&state.redis, &state.keys.epoch()).await;
        if let Ok(epoch) = &epoch {
            if *epoch != state.epoch() {
                *state.epoch.write().expect("epoch") = epoch.clone();
                state.epoch_generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        }
        ready.set(db_ok && epoch.is_ok());
        state.limits.retain_recent();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
