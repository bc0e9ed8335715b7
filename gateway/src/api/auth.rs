//! Authentication of every public request: the token, then device registration.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use herald_shared::auth::Claims;
use herald_shared::error::ErrorCode;

use crate::error::ApiError;
use crate::identity::DeviceRefusal;
use crate::state::AppState;

/// The authenticated device making the request.
#[derive(Debug, Clone)]
pub struct Caller(pub Claims);

/// The token from `Authorization: Bearer` or `?access_token=` (browsers' WebSockets).
pub fn token_of(parts: &Parts) -> Option<&str> {
    if let Some(v) = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return v.strip_prefix("Bearer ");
    }
    parts.uri.query()?.split('&').find_map(|kv| kv.strip_prefix("access_token="))
}

/// A refused token is 401; revocations that could not be read, 503 (retry).
pub fn refusal(e: DeviceRefusal) -> ApiError {
    match e {
        DeviceRefusal::Token(e) => ApiError::new(ErrorCode::Unauthorized, e.to_string()),
        DeviceRefusal::Unavailable(e) => ApiError::new(ErrorCode::Unavailable, e.to_string()),
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let token = token_of(parts).ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "missing bearer token"))?;
        let claims = state.sessions.identity.device_of_request(token).await.map_err(refusal)?;
        state.devices.register(&claims).await?;
        Ok(Caller(claims))
    }
}
