//! The gateway's API error: a protocol error code and a message safe to show.

use axum::response::{IntoResponse, Response};
use herald_shared::error::ErrorCode;
use herald_shared::ops::error_response;

#[derive(Clone, Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// For `rate_limited`: when to try again.
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into(), retry_after: None }
    }
    pub fn rate_limited(wait: std::time::Duration) -> Self {
        ApiError {
            code: ErrorCode::RateLimited,
            message: "too many requests; retry later".into(),
            retry_after: Some(wait),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }
    pub fn not_found() -> Self {
        Self::new(ErrorCode::NotFound, "no such conversation")
    }
}

/// Database errors are logged with their cause and shown to clients without it.
impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        metrics::counter!("herald_mysql_errors_total").increment(1);
        tracing::warn!(error = %e, source = "mysql", "request failed");
        match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                ApiError::new(ErrorCode::Unavailable, "database unavailable; retry")
            }
            _ => ApiError::new(ErrorCode::Internal, "internal error"),
        }
    }
}

impl From<fred::error::Error> for ApiError {
    fn from(e: fred::error::Error) -> Self {
        metrics::counter!("herald_redis_errors_total", "source" => "gateway").increment(1);
        tracing::warn!(error = %e, source = "redis", "request failed");
        ApiError::new(ErrorCode::Unavailable, "message queue unavailable; retry with the same cmid")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = error_response(self.code, self.message);
        if let Some(wait) = self.retry_after {
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Parses a JSON body with protocol errors instead of axum's plain-text rejections.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => ApiError::bad_request(format!("invalid request: {e}")),
            _ => ApiError::bad_request(format!("malformed JSON: {e}")),
        }
    })
}
