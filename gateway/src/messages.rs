//! `POST /v1/messages`: the durable send over HTTP.
//!
//! The gateway validates, appends the request to its conversation's ingress stream
//! and waits for the worker's answer, which comes only after COMMIT. Without an answer
//! in time it says `unavailable`: the client resends with the same `cmid` and gets the
//! first commit back with `dup: true`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use fred::prelude::*;
use herald_shared::auth::is_valid_ident;
use herald_shared::error::ErrorCode;
use herald_shared::keys::shard_of;
use herald_shared::protocol::{IngressEntry, SendOutcome, SendResult, MAX_CMID_LEN};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::auth::Caller;
use crate::error::{parse_json, ApiError, ApiResult};
use crate::notices::Waiter;
use crate::AppState;

#[derive(Deserialize)]
struct SendRequest {
    cmid: String,
    conv: String,
    body: Box<RawValue>,
}

/// Checks a send and turns it into an ingress entry (shared with the WebSocket `send`).
pub fn validate_send(state: &AppState, cmid: &str, conv: &str, body: &RawValue) -> ApiResult<()> {
    if cmid.is_empty() || cmid.chars().count() > MAX_CMID_LEN {
        return Err(ApiError::bad_request(format!("cmid must be 1..{MAX_CMID_LEN} characters")));
    }
    if !is_valid_ident(conv) {
        return Err(ApiError::bad_request("conv must be 1..64 printable ASCII characters"));
    }
    if body.get().len() > state.cfg.gateway.max_body_bytes {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("body is {} bytes serialized; the limit is {}", body.get().len(), state.cfg.gateway.max_body_bytes),
        ));
    }
    Ok(())
}

/// Appends to the ingress stream and waits for the committed answer.
pub async fn submit(
    state: &AppState,
    c: &herald_shared::auth::Claims,
    cmid: String,
    conv: String,
    body: String,
) -> ApiResult<SendResult> {
    let waiter = enqueue(state, c, cmid, conv, body).await?;
    wait_committed(state, waiter).await
}

/// Appends the send to its ingress stream. Sends of one session are enqueued in the
/// order they arrived, which is the order their `seq` follows.
pub async fn enqueue(
    state: &AppState,
    c: &herald_shared::auth::Claims,
    cmid: String,
    conv: String,
    body: String,
) -> ApiResult<Waiter> {
    let waiter = state.waiters.register();
    let shard = shard_of(&c.tid, &conv, state.cfg.ingress.shards);
    let entry = IngressEntry {
        tenant: c.tid.clone(),
        user: c.sub.clone(),
        device: c.dev.clone(),
        cmid,
        conv,
        body,
        node: state.cfg.node_id.clone(),
        rid: waiter.rid,
    };
    // No MAXLEN: an entry leaves the stream only when a worker has committed it (XDEL
    // after XACK), so a long worker outage cannot trim away accepted sends.
    let _: String = state.redis.xadd(state.keys.ingress(shard), false, None, "*", entry.to_fields()).await?;
    Ok(waiter)
}

/// Waits for the worker's answer, which comes only after COMMIT.
pub async fn wait_committed(state: &AppState, waiter: Waiter) -> ApiResult<SendResult> {
    match wait_outcome(state, waiter).await? {
        SendOutcome::Ok(r) => Ok(r),
        _ => Err(ApiError::new(ErrorCode::Internal, "unexpected answer")),
    }
}

/// Waits for the worker's answer to any ingress request.
pub async fn wait_outcome(state: &AppState, mut waiter: Waiter) -> ApiResult<SendOutcome> {
    let timeout = Duration::from_millis(state.cfg.gateway.send_timeout_ms);
    match tokio::time::timeout(timeout, &mut waiter.rx).await {
        Ok(Ok(SendOutcome::Err { code, message })) => Err(ApiError::new(code, message)),
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(_)) | Err(_) => {
            metrics::counter!("herald_send_timeouts_total").increment(1);
            Err(ApiError::new(ErrorCode::Unavailable, "not confirmed in time; retry (sends with the same cmid)"))
        }
    }
}

/// Appends a read receipt to the conversation's ingress stream (after its sends).
pub async fn enqueue_read(
    state: &AppState,
    c: &herald_shared::auth::Claims,
    conv: String,
    seq: u64,
) -> ApiResult<Waiter> {
    if !is_valid_ident(&conv) {
        return Err(ApiError::bad_request("conv must be 1..64 printable ASCII characters"));
    }
    let waiter = state.waiters.register();
    let shard = shard_of(&c.tid, &conv, state.cfg.ingress.shards);
    let entry = herald_shared::protocol::ReadEntry {
        tenant: c.tid.clone(),
        user: c.sub.clone(),
        device: c.dev.clone(),
        conv,
        seq,
        node: state.cfg.node_id.clone(),
        rid: waiter.rid,
    };
    let _: String = state.redis.xadd(state.keys.ingress(shard), false, None, "*", entry.to_fields()).await?;
    Ok(waiter)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadRequest {
    seq: u64,
}

/// `POST /v1/conversations/{id}/read` `{"seq": N}`: the HTTP `read`.
pub async fn read(
    State(state): State<AppState>,
    Caller(c): Caller,
    axum::extract::Path(conv): axum::extract::Path<String>,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    let req: ReadRequest = parse_json(&body)?;
    let waiter = enqueue_read(&state, &c, conv, req.seq).await?;
    match wait_outcome(&state, waiter).await? {
        SendOutcome::Read { conv, read_seq } => Ok(Json(serde_json::json!({"conv": conv, "read_seq": read_seq}))),
        _ => Err(ApiError::new(ErrorCode::Internal, "unexpected answer")),
    }
}

pub async fn send(State(state): State<AppState>, Caller(c): Caller, body: Bytes) -> ApiResult<Json<SendResult>> {
    let started = std::time::Instant::now();
    let req: SendRequest = parse_json(&body)?;
    validate_send(&state, &req.cmid, &req.conv, &req.body)?;
    if let Err(wait) = state.limits.http_send(&(c.tid.clone(), c.sub.clone(), c.dev.clone())) {
        metrics::counter!("herald_rate_limited_total", "what" => "send").increment(1);
        return Err(ApiError::rate_limited(wait));
    }
    let result = submit(&state, &c, req.cmid, req.conv, req.body.get().to_owned()).await?;
    metrics::histogram!("herald_send_ack_seconds", "transport" => "http").record(started.elapsed().as_secs_f64());
    Ok(Json(result))
}
