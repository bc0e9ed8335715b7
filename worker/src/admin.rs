//! The worker's admin API (bearer token): outbox DEAD events list, retry, discard; push
//! notifications list and retry.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use herald_shared::error::ErrorCode;
use herald_shared::ops::{error_response, require_admin_token};
use herald_shared::process::Readiness;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;

use crate::context::WorkerContext;

pub fn router(shared: Arc<WorkerContext>, metrics: PrometheusHandle, ready: Readiness) -> Router {
    let token = Arc::new(shared.cfg.admin_token.0.clone());
    let admin = Router::new()
        .route("/admin/outbox", get(list))
        .route("/admin/outbox/{id}", get(show))
        .route("/admin/outbox/{id}/retry", post(retry))
        .route("/admin/outbox/{id}/discard", post(discard))
        .route("/admin/push", get(push_list))
        .route("/admin/push/{id}/retry", post(push_retry))
        .route("/admin/messages/{id}/trace", get(message_trace))
        .route("/admin/devices/{tenant}/{user}/{device}", get(device_state))
        .layer(middleware::from_fn_with_state(token, require_admin_token))
        .with_state(shared);
    herald_shared::ops::router(metrics, ready).merge(admin)
}

#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
}

fn db_error(e: sqlx::Error) -> Response {
    tracing::warn!(error = %e, "admin query failed");
    error_response(ErrorCode::Unavailable, "database unavailable")
}

async fn list(State(s): State<Arc<WorkerContext>>, Query(q): Query<ListQuery>) -> Response {
    let status = q.status.unwrap_or_else(|| "DEAD".into()).to_ascii_uppercase();
    if !["PENDING", "SENDING", "SENT", "FAILED", "DEAD"].contains(&status.as_str()) {
        return error_response(ErrorCode::BadRequest, "status must be one of PENDING, SENDING, SENT, FAILED, DEAD");
    }
    match s.outbox.list(&status, q.limit.unwrap_or(100).clamp(1, 1000)).await {
        Ok(items) => Json(serde_json::json!({ "items": items })).into_response(),
        Err(e) => db_error(e),
    }
}

async fn push_list(State(s): State<Arc<WorkerContext>>, Query(q): Query<ListQuery>) -> Response {
    let status = q.status.unwrap_or_else(|| "DEAD".into()).to_ascii_uppercase();
    if !["PENDING", "SENDING", "SENT", "FAILED", "DEAD"].contains(&status.as_str()) {
        return error_response(ErrorCode::BadRequest, "status must be one of PENDING, SENDING, SENT, FAILED, DEAD");
    }
    match s.push.list(&status, q.limit.unwrap_or(100).clamp(1, 1000)).await {
        Ok(items) => Json(serde_json::json!({ "items": items })).into_response(),
        Err(e) => db_error(e),
    }
}

async fn push_retry(State(s): State<Arc<WorkerContext>>, Path(id): Path<u64>) -> Response {
    match s.push.retry(id).await {
        Ok(true) => Json(serde_json::json!({ "id": id, "status": "PENDING" })).into_response(),
        Ok(false) => error_response(ErrorCode::Conflict, "only DEAD notifications can be retried"),
        Err(e) => db_error(e),
    }
}

async fn show(State(s): State<Arc<WorkerContext>>, Path(id): Path<u64>) -> Response {
    match s.outbox.get(id).await {
        Ok(Some(ev)) => Json(ev).into_response(),
        Ok(None) => error_response(ErrorCode::NotFound, "no such outbox event"),
        Err(e) => db_error(e),
    }
}

async fn retry(State(s): State<Arc<WorkerContext>>, Path(id): Path<u64>) -> Response {
    match s.outbox.retry(id).await {
        Ok(true) => Json(serde_json::json!({ "id": id, "status": "PENDING" })).into_response(),
        Ok(false) => error_response(ErrorCode::Conflict, "only DEAD or FAILED events can be retried"),
        Err(e) => db_error(e),
    }
}

async fn discard(State(s): State<Arc<WorkerContext>>, Path(id): Path<u64>) -> Response {
    match s.outbox.discard(id).await {
        Ok(true) => Json(serde_json::json!({ "id": id, "discarded": true })).into_response(),
        Ok(false) => error_response(ErrorCode::Conflict, "only DEAD events can be discarded"),
        Err(e) => db_error(e),
    }
}

async fn message_trace(State(s): State<Arc<WorkerContext>>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<herald_shared::ids::MsgId>() else {
        return error_response(ErrorCode::BadRequest, "a message id is a decimal string");
    };
    match crate::trace::message(&s, id).await {
        Ok(Some(t)) => Json(t).into_response(),
        Ok(None) => error_response(ErrorCode::NotFound, "no such message"),
        Err(e) => {
            tracing::warn!(error = %e, "message trace failed");
            error_response(ErrorCode::Unavailable, "a dependency is unavailable")
        }
    }
}

async fn device_state(
    State(s): State<Arc<WorkerContext>>,
    Path((tenant, user, device)): Path<(String, String, String)>,
) -> Response {
    match crate::trace::device(&s, &tenant, &user, &device).await {
        Ok(Some(t)) => Json(t).into_response(),
        Ok(None) => error_response(ErrorCode::NotFound, "no such device"),
        Err(e) => {
            tracing::warn!(error = %e, "device state failed");
            error_response(ErrorCode::Unavailable, "a dependency is unavailable")
        }
    }
}
