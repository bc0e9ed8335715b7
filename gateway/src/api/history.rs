//! `GET /v1/conversations/{id}/messages` and `GET /v1/sync`: reads from MySQL.

use axum::extract::{Path, Query, State};
use axum::Json;
use herald_shared::ids::MsgId;
use herald_shared::keys::DeviceKey;
use serde::Deserialize;

use crate::api::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::history::{check_limit, Page};
use crate::state::AppState;

#[derive(Deserialize)]
pub struct MessagesQuery {
    after_seq: Option<u64>,
    limit: Option<u32>,
}

/// `GET /v1/conversations/{id}/messages`
pub async fn messages(
    State(state): State<AppState>,
    Caller(c): Caller,
    Path(conv): Path<String>,
    Query(q): Query<MessagesQuery>,
) -> ApiResult<Json<Page>> {
    state.limits.http_request(&DeviceKey::of(&c), "history").map_err(ApiError::rate_limited)?;
    let limit = check_limit(q.limit, 100, 1_000)?;
    Ok(Json(state.history.conversation(&c.tid, &c.sub, &c.dev, &conv, q.after_seq.unwrap_or(0), limit).await?))
}

#[derive(Deserialize)]
pub struct SyncQuery {
    after: Option<String>,
    limit: Option<u32>,
}

/// `GET /v1/sync`
pub async fn sync(
    State(state): State<AppState>,
    Caller(c): Caller,
    Query(q): Query<SyncQuery>,
) -> ApiResult<Json<Page>> {
    state.limits.http_request(&DeviceKey::of(&c), "sync").map_err(ApiError::rate_limited)?;
    let limit = check_limit(q.limit, 200, 1_000)?;
    let after = match q.after.as_deref() {
        None | Some("") => MsgId(0),
        Some(s) => s.parse().map_err(|_| ApiError::bad_request("after must be a message id (decimal string)"))?,
    };
    Ok(Json(state.history.device_sync(&c.tid, &c.sub, after, limit).await?))
}
