//! `POST /v1/server/conversations` and `POST /v1/server/conversations/{id}/members`,
//! `.../title` and `.../roles`: a service creates its tenant's conversations and
//! changes their members, titles and roles; `GET /v1/server/conversations/{id}` reads
//! one.
//!
//! The same rules and statements as the device routes ([`crate::api::conversations`],
//! [`crate::api::timeline`]), without the device's rules on who may change what: a
//! service changes any conversation of its tenant, and its changes' events come from
//! `service:<name>`. Repeats are safe: a create names its `id`, which is its
//! idempotency key (the same id, kind and members answer 200 with the conversation;
//! other ones 409), and adding a member, removing a non-member or setting the same
//! title or role again changes nothing.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use herald_shared::auth::{Claims, Platform};
use herald_shared::service_token::Scope;

use super::Service;
use crate::api::conversations::{create_in, Conversation};
use crate::api::timeline::{change_members_as, change_role_as, change_title_as, Actor};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    service: Service,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Conversation>)> {
    service.require(Scope::ConversationsWrite)?;
    create_in(&state, &service.0.tid, None, &body).await
}

/// `GET /v1/server/conversations/{id}`: the conversation with its members (scope
/// `conversations:read`); another tenant's id is `not_found`, like one that exists nowhere.
pub async fn get(
    State(state): State<AppState>,
    service: Service,
    Path(id): Path<String>,
) -> ApiResult<Json<Conversation>> {
    service.require(Scope::ConversationsRead)?;
    let conv = crate::api::conversations::load(&state, &service.0.tid, &id).await?;
    conv.map(Json).ok_or_else(|| ApiError::new(herald_shared::error::ErrorCode::NotFound, "no such conversation"))
}

/// The service as the actor of its changes: `service:<name>`, from its own device.
fn actor(service: &Service) -> Actor {
    let s = &service.0;
    let name = s.sender_device();
    let claims =
        Claims { tid: s.tid.clone(), sub: name.clone(), dev: name, plat: Platform::Server, exp: s.exp, iat: None };
    Actor { claims, by_service: true }
}

pub async fn change_members(
    State(state): State<AppState>,
    service: Service,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Conversation>> {
    service.require(Scope::ConversationsWrite)?;
    change_members_as(&state, &actor(&service), &id, &body).await
}

pub async fn change_title(
    State(state): State<AppState>,
    service: Service,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Conversation>> {
    service.require(Scope::ConversationsWrite)?;
    change_title_as(&state, &actor(&service), &id, &body).await
}

pub async fn change_role(
    State(state): State<AppState>,
    service: Service,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Conversation>> {
    service.require(Scope::ConversationsWrite)?;
    change_role_as(&state, &actor(&service), &id, &body).await
}
