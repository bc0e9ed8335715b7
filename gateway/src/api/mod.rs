//! The public HTTP API and the WebSocket upgrade: the only modules that take axum's
//! `State<AppState>`.

pub mod auth;
pub mod conversations;
pub mod history;
pub mod messages;
pub mod presence;
pub mod push;
pub mod server;
pub mod timeline;
pub mod ws;

#[cfg(test)]
mod body_strategies;

use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_shared::config::CorsOrigins;
use herald_shared::error::ErrorCode;
use herald_shared::keys::{DeviceKey, PresenceValue};
use herald_shared::protocol::{Kick, NodeEnvelope};

use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::state::AppState;
use auth::Caller;

/// The public API.
pub fn router(state: AppState) -> Router {
    // The JSON envelope around a maximal body, with room for escaping.
    let body_limit = state.cfg.gateway.max_body_bytes * 2 + 4096;
    // Member lists may be longer than a message: a group of the largest size with the
    // longest user ids (the inner limit wins over the router's).
    let members_limit = || DefaultBodyLimit::max(body_limit.max(state.cfg.gateway.largest_members_body_bytes()));
    let deadline = Duration::from_millis(state.cfg.gateway.request_timeout_ms);
    // Every HTTP request must arrive whole and be answered within the deadline; the
    // WebSocket upgrade answers at once and its session is bounded by its own rules.
    let bounded = Router::new()
        .route("/v1/devices", post(register))
        .route("/v1/devices/me", axum::routing::delete(unregister))
        .route("/v1/devices/me/push", axum::routing::put(push::register).delete(push::unregister))
        .route("/v1/conversations", post(conversations::create).layer(members_limit()).get(conversations::list))
        .route("/v1/conversations/{id}/members", post(timeline::change_members).layer(members_limit()))
        .route("/v1/conversations/{id}/title", post(timeline::change_title))
        .route("/v1/conversations/{id}/roles", post(timeline::change_role))
        .route("/v1/messages", post(messages::send))
        .route("/v1/messages/{id}/status", get(messages::status))
        .route("/v1/messages/{id}/recall", post(timeline::recall))
        .route("/v1/messages/{id}/edit", post(timeline::edit))
        .route("/v1/conversations/{id}/messages", get(history::messages))
        .route("/v1/conversations/{id}/read", post(messages::read))
        .route("/v1/sync", get(history::sync))
        .route("/v1/presence", get(presence::query))
        .route("/v1/server/messages", post(server::messages::send))
        .route("/v1/server/conversations", post(server::conversations::create).layer(members_limit()))
        .route("/v1/server/conversations/{id}", get(server::conversations::get))
        .route(
            "/v1/server/conversations/{id}/members",
            post(server::conversations::change_members).layer(members_limit()),
        )
        .route("/v1/server/conversations/{id}/title", post(server::conversations::change_title))
        .route("/v1/server/conversations/{id}/roles", post(server::conversations::change_role))
        .route("/v1/server/sessions/disconnect", post(server::sessions::disconnect))
        .route("/v1/server/sessions/revoke", post(server::sessions::revoke_user))
        .layer(axum::middleware::from_fn_with_state(deadline, within_deadline));
    let router = Router::new()
        .merge(bounded)
        .route("/v1/ws", get(ws::upgrade))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::map_response(protocol_error_body));
    // Outermost, so that errors (401, 404, 429 ...) carry the headers too: a page must
    // read a refusal's body and `Retry-After` to act on it.
    match cors(&state.cfg.gateway.cors()) {
        Some(cors) => router.layer(cors).with_state(state),
        None => router.with_state(state),
    }
}

/// The CORS layer for `gateway.cors_origins`: preflights answered for the API's methods
/// and the headers clients send; `Retry-After` readable. No credentials: the token is a
/// header, not a cookie, so pages of other origins get nothing a token does not give.
fn cors(origins: &CorsOrigins) -> Option<CorsLayer> {
    let allow = match origins {
        CorsOrigins::None => return None,
        CorsOrigins::Any => AllowOrigin::any(),
        CorsOrigins::List(list) => {
            AllowOrigin::list(list.iter().map(|o| HeaderValue::from_str(o).expect("validated origin")))
        }
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .expose_headers([header::RETRY_AFTER])
            .max_age(Duration::from_secs(600)),
    )
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
    if status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        // Refused before the body was read: the server closes the connection after
        // answering, so the client is told not to send its next request on it (else it
        // may, and fail with an incomplete message).
        out.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    out
}

/// A request not received and answered within `gateway.request_timeout_ms` (a client
/// that sends its head and trickles its body) is refused, freeing its task.
async fn within_deadline(State(deadline): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(deadline, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            metrics::counter!("herald_request_timeouts_total").increment(1);
            crate::error::ApiError::bad_request("the request was not received in time").into_response()
        }
    }
}

/// `DELETE /v1/devices/me`: the caller's device logs out. It stops being a fan-out
/// target and everything Herald keeps for it goes at once; its session, if any, is
/// closed (4002).
async fn unregister(
    State(state): State<crate::state::AppState>,
    Caller(c): Caller,
) -> Result<StatusCode, crate::error::ApiError> {
    let device = DeviceKey::of(&c);
    let presence = state.devices.unregister(&device).await?;
    if let Some(p) = presence.as_deref().and_then(PresenceValue::parse) {
        if p.node == state.cfg.node_id {
            state.sessions.directory.kick(&device, &p.session);
        } else {
            let kick = NodeEnvelope {
                kick: vec![Kick { tenant: c.tid, user: c.sub, device: c.dev, session: p.session }],
                ..Default::default()
            };
            let channel = state.sessions.keys.node_channel(&p.node);
            let kick = serde_json::to_string(&kick).expect("serializes");
            let _ = herald_shared::redis::publish_to_node(state.sessions.redis.next(), channel, kick).await;
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/devices`: registers the caller's device (any authenticated request does).
async fn register(Caller(c): Caller) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "tenant": c.tid, "user": c.sub, "device": c.dev, "platform": c.plat }))
}
