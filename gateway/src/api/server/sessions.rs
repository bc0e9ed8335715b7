//! Ending sessions from the server (docs/protocol.md section 7.7): a service of the
//! tenant disconnects a user or one device now, or refuses a user's tokens issued
//! before a time. Both record a `not_before` ([`crate::identity::Revocations`]) and
//! close, on every gateway, the sessions whose token was issued before it (4004).

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use herald_shared::auth::is_valid_ident;
use herald_shared::ids::now_ms;
use herald_shared::protocol::Revocation;
use herald_shared::service_token::Scope;
use serde::{Deserialize, Serialize};

use super::Service;
use crate::error::{parse_json, ApiError, ApiResult};
use crate::state::AppState;

/// Whose sessions end now (section 7.7).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DisconnectRequest {
    /// The user whose sessions end.
    user: String,
    /// Only this device's sessions; absent, all the user's devices'.
    #[serde(default)]
    device: Option<String>,
}

/// Which of a user's tokens are refused from now on (section 7.7).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RevokeRequest {
    /// The user whose tokens are revoked.
    user: String,
    /// Tokens issued (`iat`) before this time, seconds since the Unix epoch, are
    /// refused; absent, now. Not after now.
    #[serde(default)]
    not_before: Option<u64>,
}

/// What is refused from now on.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Revoked {
    pub user: String,
    /// Present when only one device's tokens were revoked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Tokens issued before this time (seconds) are refused: the latest `not_before`
    /// recorded (an earlier one changes nothing).
    pub not_before: u64,
}

/// `POST /v1/server/sessions/disconnect`: the user's (or device's) sessions end on
/// every gateway, and the tokens they used are refused; a token issued from now on
/// opens a session again.
pub async fn disconnect(State(state): State<AppState>, service: Service, body: Bytes) -> ApiResult<Json<Revoked>> {
    service.require(Scope::SessionsRevoke)?;
    let req: DisconnectRequest = parse_json(&body)?;
    check_ident("user", &req.user)?;
    if let Some(device) = &req.device {
        check_ident("device", device)?;
    }
    revoke(&state, &service, req.user, req.device, now_ms() / 1000).await
}

/// `POST /v1/server/sessions/revoke`: the user's tokens issued before `not_before`
/// are refused, on every device, and the sessions they opened end.
pub async fn revoke_user(State(state): State<AppState>, service: Service, body: Bytes) -> ApiResult<Json<Revoked>> {
    service.require(Scope::SessionsRevoke)?;
    let req: RevokeRequest = parse_json(&body)?;
    check_ident("user", &req.user)?;
    let now = now_ms() / 1000;
    let not_before = req.not_before.unwrap_or(now);
    if not_before > now {
        return Err(ApiError::bad_request("not_before may not be in the future"));
    }
    revoke(&state, &service, req.user, None, not_before).await
}

async fn revoke(
    state: &AppState,
    service: &Service,
    user: String,
    device: Option<String>,
    not_before: u64,
) -> ApiResult<Json<Revoked>> {
    let r = Revocation { tenant: service.0.tid.clone(), user, device, not_before };
    let not_before = state
        .sessions
        .identity
        .revocations
        .revoke(&r)
        .await
        .map_err(|e| ApiError::new(herald_shared::error::ErrorCode::Unavailable, e.to_string()))?;
    // This gateway's sessions too, should its own announcement be late.
    state.sessions.directory.revoke(&Revocation { not_before, ..r.clone() });
    tracing::info!(tenant = %r.tenant, user = %r.user, device = ?r.device, not_before, service = %service.0.svc, "tokens revoked");
    Ok(Json(Revoked { user: r.user, device: r.device, not_before }))
}

fn check_ident(field: &str, v: &str) -> ApiResult<()> {
    if is_valid_ident(v) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!("{field} must be 1..64 printable ASCII characters")))
}
