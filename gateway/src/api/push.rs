//! The device's push registration (docs/protocol.md section 2.12): the platform and
//! token the push webhook gets for it when a message waits unacked (offline push).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use herald_shared::auth::Claims;
use herald_shared::error::ErrorCode;
use herald_shared::ids::now_ms;
use serde::{Deserialize, Serialize};

use crate::api::auth::Caller;
use crate::error::{parse_json, ApiError, ApiResult};
use crate::state::AppState;

/// The push services a token may belong to; the webhook routes by it.
pub const PLATFORMS: &[&str] = &["apns", "apns_sandbox", "fcm", "hms", "webpush"];

/// Longest token: APNs tokens are 64 hex digits, FCM's ~160 characters, and a Web Push
/// subscription (endpoint URL and keys, as JSON) under 1 KiB.
pub const TOKEN_MAX: usize = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PushRequest {
    platform: String,
    token: String,
}

#[derive(Serialize)]
pub struct PushRegistration {
    platform: String,
    token: String,
    updated_at: i64,
}

fn check(req: &PushRequest) -> ApiResult<()> {
    if !PLATFORMS.contains(&req.platform.as_str()) {
        return Err(ApiError::bad_request(format!("platform must be one of {}", PLATFORMS.join(", "))));
    }
    if req.token.is_empty() || req.token.len() > TOKEN_MAX {
        return Err(ApiError::bad_request(format!("token must be 1..={TOKEN_MAX} bytes")));
    }
    if req.token.chars().any(char::is_control) {
        return Err(ApiError::bad_request("token must not contain control characters"));
    }
    Ok(())
}

/// `PUT /v1/devices/me/push` `{"platform": "apns", "token": "..."}`: registers (or
/// replaces) the calling device's push token.
pub async fn register(
    State(state): State<AppState>,
    Caller(c): Caller,
    body: Bytes,
) -> ApiResult<Json<PushRegistration>> {
    let req: PushRequest = parse_json(&body)?;
    check(&req)?;
    let now = now_ms() as i64;
    // Authentication registered the device, unless this gateway still took it for
    // registered after it logged out through another one: then it is registered again.
    if store(&state, &c, &req, now).await? == 0 {
        state.devices.register_again(&c).await?;
        if store(&state, &c, &req, now).await? == 0 {
            return Err(ApiError::new(ErrorCode::Unavailable, "the device is not registered yet; retry"));
        }
    }
    Ok(Json(PushRegistration { platform: req.platform, token: req.token, updated_at: now }))
}

/// Writes the push registration on the caller's row: the rows changed (0: no row).
async fn store(state: &AppState, c: &Claims, req: &PushRequest, now: i64) -> Result<u64, sqlx::Error> {
    // With its tenant's device epoch: the worker's cached recipients carry whether a
    // device has a push token.
    let mut tx = state.db.begin().await?;
    let done = sqlx::query(
        "UPDATE devices SET push_platform = ?, push_token = ?, push_updated_at = ? \
         WHERE tenant_id = ? AND user_id = ? AND device_id = ?",
    )
    .bind(&req.platform)
    .bind(&req.token)
    .bind(now)
    .bind(&c.tid)
    .bind(&c.sub)
    .bind(&c.dev)
    .execute(&mut *tx)
    .await?;
    herald_shared::device_epochs::raise(&mut tx, [c.tid.as_str()]).await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// `DELETE /v1/devices/me/push`: the device gets no more push notifications; the
/// notifications still waiting for it are dropped. Idempotent.
pub async fn unregister(State(state): State<AppState>, Caller(c): Caller) -> ApiResult<StatusCode> {
    let mut tx = state.db.begin().await?;
    sqlx::query(
        "UPDATE devices SET push_platform = NULL, push_token = NULL, push_updated_at = ? \
         WHERE tenant_id = ? AND user_id = ? AND device_id = ?",
    )
    .bind(now_ms() as i64)
    .bind(&c.tid)
    .bind(&c.sub)
    .bind(&c.dev)
    .execute(&mut *tx)
    .await?;
    herald_shared::device_epochs::raise(&mut tx, [c.tid.as_str()]).await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
