//! Authentication of every public request, and device registration on first sight.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use herald_shared::auth::{verify, Claims};
use herald_shared::error::ErrorCode;
use herald_shared::ids::now_ms;

use crate::error::ApiError;
use crate::AppState;

/// The authenticated device making the request.
#[derive(Debug, Clone)]
pub struct Caller(pub Claims);

/// The token from `Authorization: Bearer` or `?access_token=` (browsers' WebSockets).
pub fn token_of(parts: &Parts) -> Option<String> {
    if let Some(v) = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return v.strip_prefix("Bearer ").map(str::to_owned);
    }
    parts.uri.query()?.split('&').find_map(|kv| kv.strip_prefix("access_token=").map(str::to_owned))
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let token = token_of(parts).ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "missing bearer token"))?;
        let claims = verify(&token, state.cfg.jwt_secret.0.as_bytes())
            .map_err(|e| ApiError::new(ErrorCode::Unauthorized, e.to_string()))?;
        register_device(state, &claims).await?;
        Ok(Caller(claims))
    }
}

/// Records the device in MySQL (the fan-out's source of recipients) the first time
/// this gateway sees it. A new device starts with its watermark at "now": it receives
/// messages committed from here on; history comes from sync.
pub async fn register_device(state: &AppState, c: &Claims) -> Result<(), ApiError> {
    let key = (c.tid.clone(), c.sub.clone(), c.dev.clone());
    if state.known_devices.lock().expect("device cache").contains(&key) {
        return Ok(());
    }
    // A device seen before (on another node, or before a restart) costs one read, not a
    // write and its fsync: a login storm of known devices stays off MySQL's log. Its
    // `last_seen_at` moves with the watermark flushes of its session.
    let known_platform: Option<String> = sqlx::query_scalar(
        "SELECT CAST(platform AS CHAR) FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?",
    )
    .bind(&c.tid)
    .bind(&c.sub)
    .bind(&c.dev)
    .fetch_optional(&state.db)
    .await?;
    if known_platform.as_deref() != Some(c.plat.as_str()) {
        upsert_device(state, c).await?;
    }
    let mut known = state.known_devices.lock().expect("device cache");
    // Bounded: a cache miss only costs one read.
    if known.len() > 200_000 {
        known.clear();
    }
    known.insert(key);
    Ok(())
}

async fn upsert_device(state: &AppState, c: &Claims) -> Result<(), ApiError> {
    let now = now_ms() as i64;
    let watermark = herald_shared::ids::MsgId::lowest_at(now_ms().saturating_sub(60_000)).0;
    sqlx::query(
        "INSERT INTO devices (tenant_id, user_id, device_id, platform, watermark, registered_at, last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE platform = VALUES(platform), last_seen_at = VALUES(last_seen_at)",
    )
    .bind(&c.tid)
    .bind(&c.sub)
    .bind(&c.dev)
    .bind(c.plat.as_str())
    .bind(watermark)
    .bind(now)
    .bind(now)
    .execute(&state.db)
    .await?;
    Ok(())
}
