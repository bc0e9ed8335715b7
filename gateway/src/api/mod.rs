//! The public HTTP API and the WebSocket upgrade: the only modules that take axum's
//! `State<AppState>`.

pub mod auth;
pub mod conversations;
pub mod history;
pub mod messages;
pub mod ws;

#[cfg(test)]
mod body_strategies;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_shared::error::ErrorCode;

use crate::state::AppState;
use auth::Caller;

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

/// `POST /v1/devices`: registers the caller's device (any authenticated request does).
async fn register(Caller(c): Caller) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "tenant": c.tid, "user": c.sub, "device": c.dev, "platform": c.plat }))
}
