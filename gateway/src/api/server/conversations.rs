//! `POST /v1/server/conversations` and `POST /v1/server/conversations/{id}/members`:
//! a service creates its tenant's conversations and changes their members.
//!
//! The same rules and statements as the device routes ([`crate::api::conversations`]),
//! without the device's rule that its user be a member. Repeats are safe: a create
//! names its `id`, which is its idempotency key (the same id, kind and members answer
//! 200 with the conversation; other ones 409), and adding a member or removing a
//! non-member changes nothing.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use herald_shared::service_token::Scope;

use super::Service;
use crate::api::conversations::{change_members_in, create_in, Conversation};
use crate::error::ApiResult;
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    service: Service,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Conversation>)> {
    service.require(Scope::ConversationsWrite)?;
    create_in(&state, &service.0.tid, None, &body).await
}

pub async fn change_members(
    State(state): State<AppState>,
    service: Service,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Conversation>> {
    service.require(Scope::ConversationsWrite)?;
    change_members_in(&state, &service.0.tid, None, &id, &body).await
}
