//! The server API: backends and bots, authenticated by service tokens
//! ([`herald_shared::service_token`]), never by device tokens (docs/protocol.md
//! section 7).
//!
//! # Layout
//! - [`Service`]: the authenticated service and its scope check.
//! - [`messages`]: `POST /v1/server/messages`, a send as one of the tenant's users.
//! - [`conversations`]: creating conversations and changing their members.
//! - [`sessions`]: ending users' and devices' sessions, revoking their tokens.
//! - [`openapi`]: the OpenAPI document of these routes (`docs/openapi.json`).

pub mod conversations;
pub mod messages;
pub mod openapi;
pub mod sessions;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use herald_shared::error::ErrorCode;
use herald_shared::service_token::{Scope, ServiceClaims};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The authenticated service making the request.
#[derive(Debug, Clone)]
pub struct Service(pub ServiceClaims);

impl Service {
    /// Refuses a request whose token lacks `scope` (403).
    pub fn require(&self, scope: Scope) -> ApiResult<()> {
        if self.0.allows(scope) {
            return Ok(());
        }
        Err(ApiError::new(ErrorCode::Forbidden, format!("this service token lacks the scope {}", scope.as_str())))
    }
}

impl FromRequestParts<AppState> for Service {
    type Rejection = ApiError;

    /// Only `Authorization: Bearer`: services are not browsers, and a token in a URL
    /// ends up in access logs.
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let identity = &state.sessions.identity;
        if !identity.serves_services() {
            return Err(ApiError::new(
                ErrorCode::Unauthorized,
                "the server API is not enabled (no service_secret, and no service issuer in auth.trust_file)",
            ));
        }
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "missing bearer token"))?;
        let claims = identity.service(token).map_err(|e| ApiError::new(ErrorCode::Unauthorized, e.to_string()))?;
        Ok(Service(claims))
    }
}
