//! `GET /v1/presence?users=a,b`: whether the caller's contacts are online, and when
//! they were last (docs/protocol.md section 2.17).

use axum::extract::{Query, State};
use axum::Json;
use herald_shared::protocol::PresenceState;
use serde::{Deserialize, Serialize};

use crate::api::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

#[derive(Deserialize)]
pub struct PresenceQuery {
    users: Option<String>,
}

#[derive(Serialize)]
pub struct PresenceAnswer {
    /// The users asked for that are the caller's contacts, in the order asked.
    users: Vec<PresenceState>,
}

/// `GET /v1/presence`
pub async fn query(
    State(state): State<AppState>,
    Caller(c): Caller,
    Query(q): Query<PresenceQuery>,
) -> ApiResult<Json<PresenceAnswer>> {
    let asked: Vec<String> =
        q.users.as_deref().unwrap_or("").split(',').filter(|u| !u.is_empty()).map(str::to_owned).collect();
    if asked.is_empty() {
        return Err(ApiError::bad_request("users: a comma-separated list of user ids is required"));
    }
    let users = state.roster.users_of(asked)?;
    let contacts = state.roster.contacts(&c.tid, &c.sub, &users).await?;
    Ok(Json(PresenceAnswer { users: state.roster.states(&c.tid, &contacts).await? }))
}
