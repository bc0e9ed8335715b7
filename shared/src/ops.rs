//! The operations listener shared by every process: `/healthz`, `/readyz`, `/metrics`,
//! and the bearer-token guard of `/admin/...`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::error::{ErrorBody, ErrorCode, ErrorDetail};
use crate::process::Readiness;

/// The protocol's error body with its status.
pub fn error_response(code: ErrorCode, message: impl Into<String>) -> Response {
    let status = StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(ErrorBody { error: ErrorDetail { code, message: message.into() } })).into_response()
}

/// `/healthz`, `/readyz` and `/metrics`.
///
/// `/healthz` (liveness) answers 200 while the process runs, with the state of each
/// dependency in its body: `{"status": "ok" | "degraded", "dependencies": [...]}`.
/// `/readyz` answers 200 when the process can serve ([`Readiness::get`]).
pub fn router(metrics: PrometheusHandle, ready: Readiness) -> Router {
    let health = ready.clone();
    Router::new()
        .route(
            "/healthz",
            get(move || {
                let deps = health.dependencies();
                let status = if deps.all_up() { "ok" } else { "degraded" };
                let body = serde_json::json!({ "status": status, "dependencies": deps.snapshot() });
                std::future::ready(Json(body))
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = ready.get();
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let mut text = metrics.render();
                text.push_str(&crate::process_metrics::rendered());
                std::future::ready(text)
            }),
        )
}

/// Middleware for `/admin/...`: the configured bearer token, compared in constant
/// time. With no token configured every admin call is refused.
pub async fn require_admin_token(State(token): State<Arc<String>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if token.is_empty() || !constant_time_eq(given.as_bytes(), token.as_bytes()) {
        return error_response(ErrorCode::Unauthorized, "admin token missing or wrong");
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
