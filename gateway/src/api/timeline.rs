//! Timeline changes (docs/protocol.md sections 2.4 and 2.13 to 2.16): members, title
//! and roles of a conversation, recalls and edits of a message.
//!
//! The gateway checks each request's form, then appends the change to the
//! conversation's ingress stream and waits for the worker's answer, like a send: the
//! worker decides who may do what under the conversation's lock, numbers the change's
//! events with the conversation's messages, and answers only after COMMIT. So a join
//! or leave falls cleanly between two messages, and every device gets the events in
//! their place, as `msg` frames.

use std::collections::BTreeSet;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use herald_shared::auth::{is_valid_ident, Claims};
use herald_shared::db::TextColumns;
use herald_shared::error::ErrorCode;
use herald_shared::ids::MsgId;
use herald_shared::keys::DeviceKey;
use herald_shared::protocol::{MemberRole, SendResult, TimelineOp, MAX_CMID_LEN};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::api::auth::Caller;
use crate::api::conversations::{check_members, load, Conversation};
use crate::error::{parse_json, ApiError, ApiResult};
use crate::state::AppState;

/// Members to add and remove (docs/protocol.md sections 2.4 and 7.4).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "MembersChangeRequest")]
pub(crate) struct MembersRequest {
    #[serde(default)]
    add: Vec<String>,
    #[serde(default)]
    remove: Vec<String>,
}

/// A new title (docs/protocol.md sections 2.13 and 7.5).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "TitleChangeRequest")]
pub(crate) struct TitleRequest {
    /// At most 256 characters; null removes the title.
    title: Option<String>,
}

/// A member's new role (docs/protocol.md sections 2.14 and 7.6).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "RoleChangeRequest")]
pub(crate) struct RoleRequest {
    /// A current member.
    user: String,
    /// `owner` hands ownership over (the previous owner becomes an admin).
    role: MemberRole,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecallRequest {
    cmid: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditRequest {
    cmid: String,
    body: Box<RawValue>,
}

/// Who makes a change: a device's user, or a service (`by_service`) acting under its
/// own name.
pub(crate) struct Actor {
    pub claims: Claims,
    pub by_service: bool,
}

impl Actor {
    fn user(c: Claims) -> Actor {
        Actor { claims: c, by_service: false }
    }

    /// A change counts against the send limits of its device and tenant.
    fn admit(&self, state: &AppState) -> ApiResult<()> {
        if let Err(wait) = state.limits.http_send(&DeviceKey::of(&self.claims)) {
            metrics::counter!("herald_rate_limited_total", "what" => "send").increment(1);
            return Err(ApiError::rate_limited(wait));
        }
        if let Err(wait) = state.limits.tenant_send(&self.claims.tid) {
            metrics::counter!("herald_rate_limited_total", "what" => "tenant_send").increment(1);
            return Err(ApiError::rate_limited(wait));
        }
        Ok(())
    }

    /// Appends the change under a key of the gateway's own: membership, title and
    /// role changes are repeats by nature (the same change again changes nothing).
    async fn change(&self, state: &AppState, conv: &str, op: TimelineOp) -> ApiResult<Vec<SendResult>> {
        self.admit(state)?;
        let cmid = format!("chg-{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        state.ingress.timeline(&self.claims, self.by_service, conv.to_owned(), cmid, op).await
    }
}

pub async fn change_members(
    State(state): State<AppState>,
    Caller(c): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Conversation>> {
    change_members_as(&state, &Actor::user(c), &id, &body).await
}

/// Adds and removes members of the actor's tenant's conversation `id`. Adding a member
/// or removing a non-member changes nothing, so a repeat is safe.
pub(crate) async fn change_members_as(
    state: &AppState,
    actor: &Actor,
    id: &str,
    body: &[u8],
) -> ApiResult<Json<Conversation>> {
    let req: MembersRequest = parse_json(body)?;
    let max = state.cfg.gateway.max_group_size;
    let add = check_members(&req.add, max)?;
    let remove = check_members(&req.remove, max)?;
    if let Some(both) = add.intersection(&remove).next() {
        return Err(ApiError::bad_request(format!("{both:?} is both added and removed")));
    }
    let op = TimelineOp::Members { add: sorted(add), remove: sorted(remove), max_members: max };
    actor.change(state, id, op).await?;
    conversation(state, &actor.claims.tid, id).await
}

pub async fn change_title(
    State(state): State<AppState>,
    Caller(c): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Conversation>> {
    change_title_as(&state, &Actor::user(c), &id, &body).await
}

/// Sets the title of conversation `id`; the same title again changes nothing.
pub(crate) async fn change_title_as(
    state: &AppState,
    actor: &Actor,
    id: &str,
    body: &[u8],
) -> ApiResult<Json<Conversation>> {
    let req: TitleRequest = parse_json(body)?;
    if req.title.as_ref().is_some_and(|t| t.chars().count() > 256) {
        return Err(ApiError::bad_request("title is at most 256 characters"));
    }
    actor.change(state, id, TimelineOp::Title { title: req.title }).await?;
    conversation(state, &actor.claims.tid, id).await
}

pub async fn change_role(
    State(state): State<AppState>,
    Caller(c): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Conversation>> {
    change_role_as(&state, &Actor::user(c), &id, &body).await
}

/// Gives a member of conversation `id` a role; the same role again changes nothing.
pub(crate) async fn change_role_as(
    state: &AppState,
    actor: &Actor,
    id: &str,
    body: &[u8],
) -> ApiResult<Json<Conversation>> {
    let req: RoleRequest = parse_json(body)?;
    if !is_valid_ident(&req.user) {
        return Err(ApiError::bad_request("user must be a user id (1..64 printable ASCII characters)"));
    }
    actor.change(state, id, TimelineOp::Role { user: req.user, role: req.role }).await?;
    conversation(state, &actor.claims.tid, id).await
}

/// `POST /v1/messages/{id}/recall` `{"cmid"}`: the recall's event, committed.
pub async fn recall(
    State(state): State<AppState>,
    Caller(c): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<SendResult>> {
    let req: RecallRequest = parse_json(&body)?;
    let target = parse_id(&id)?;
    message_change(&state, Actor::user(c), target, req.cmid, |target| TimelineOp::Recall { target }).await
}

/// `POST /v1/messages/{id}/edit` `{"cmid", "body"}`: the edit's event, committed.
pub async fn edit(
    State(state): State<AppState>,
    Caller(c): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<SendResult>> {
    let req: EditRequest = parse_json(&body)?;
    let target = parse_id(&id)?;
    let max = state.cfg.gateway.max_body_bytes;
    if req.body.get().len() > max {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("body is {} bytes serialized; the limit is {max}", req.body.get().len()),
        ));
    }
    let body = req.body.get().to_owned();
    message_change(&state, Actor::user(c), target, req.cmid, move |target| TimelineOp::Edit { target, body }).await
}

fn parse_id(id: &str) -> ApiResult<MsgId> {
    id.parse().map_err(|_| ApiError::bad_request("the id must be a message id (decimal string)"))
}

/// A recall or edit of message `target` under the client's `cmid`: the change goes to
/// the message's conversation (read here, to find its stream; checked again by the
/// worker under the lock). A repeated `cmid` answers the first commit, `dup: true`.
async fn message_change(
    state: &AppState,
    actor: Actor,
    target: MsgId,
    cmid: String,
    op: impl FnOnce(MsgId) -> TimelineOp,
) -> ApiResult<Json<SendResult>> {
    if cmid.is_empty() || cmid.chars().count() > MAX_CMID_LEN {
        return Err(ApiError::bad_request(format!("cmid must be 1..{MAX_CMID_LEN} characters")));
    }
    let conv: Option<String> = sqlx::query("SELECT conv_id FROM messages WHERE id = ? AND tenant_id = ?")
        .bind(target.0)
        .bind(&actor.claims.tid)
        .fetch_optional(&state.db)
        .await?
        .map(|r| r.text(0))
        .transpose()?;
    let conv = conv.ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no such message"))?;
    actor.admit(state)?;
    let events = state.ingress.timeline(&actor.claims, actor.by_service, conv, cmid, op(target)).await?;
    let first = events.into_iter().next().ok_or_else(|| ApiError::new(ErrorCode::Internal, "unexpected answer"))?;
    Ok(Json(first))
}

/// The conversation after a change.
async fn conversation(state: &AppState, tenant: &str, id: &str) -> ApiResult<Json<Conversation>> {
    Ok(Json(load(state, tenant, id).await?.ok_or_else(ApiError::not_found)?))
}

fn sorted(users: BTreeSet<String>) -> Vec<String> {
    users.into_iter().collect()
}

/// Property tests of the change bodies: any JSON parses or is refused with
/// `bad_request`, never a panic.
#[cfg(test)]
mod proptests {
    use super::*;
    use crate::api::body_strategies::fields_of;
    use proptest::prelude::*;
    use serde_json::Value;

    fn strings(v: &Value) -> bool {
        v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_bytes_are_refused_as_bad_request(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            if let Some(e) = parse_json::<MembersRequest>(&bytes).err() {
                prop_assert_eq!(e.code, ErrorCode::BadRequest);
            }
        }

        #[test]
        fn member_bodies_parse_exactly_when_well_typed(v in fields_of(&["add", "remove", "extra"])) {
            let o = v.as_object().unwrap();
            let ok = !o.contains_key("extra") && o.get("add").is_none_or(strings) && o.get("remove").is_none_or(strings);
            match parse_json::<MembersRequest>(v.to_string().as_bytes()) {
                Ok(_) => prop_assert!(ok, "accepted {v}"),
                Err(e) => {
                    prop_assert!(!ok, "refused {v}: {}", e.message);
                    prop_assert_eq!(e.code, ErrorCode::BadRequest);
                }
            }
        }

        #[test]
        fn change_bodies_parse_exactly_when_well_typed(v in fields_of(&["title", "user", "role", "cmid", "body"])) {
            let o = v.as_object().unwrap();
            let text = v.to_string();
            let only = |allowed: &[&str]| o.keys().all(|k| allowed.contains(&k.as_str()));
            let title_ok = only(&["title"]) && o.get("title").is_none_or(|t| t.is_string() || t.is_null());
            prop_assert_eq!(parse_json::<TitleRequest>(text.as_bytes()).is_ok(), title_ok, "{}", text);
            let role_ok = only(&["user", "role"])
                && o.get("user").is_some_and(Value::is_string)
                && o.get("role").and_then(Value::as_str).and_then(MemberRole::parse).is_some();
            prop_assert_eq!(parse_json::<RoleRequest>(text.as_bytes()).is_ok(), role_ok, "{}", text);
            let recall_ok = only(&["cmid"]) && o.get("cmid").is_some_and(Value::is_string);
            prop_assert_eq!(parse_json::<RecallRequest>(text.as_bytes()).is_ok(), recall_ok, "{}", text);
            let edit_ok = only(&["cmid", "body"]) && o.get("cmid").is_some_and(Value::is_string) && o.contains_key("body");
            prop_assert_eq!(parse_json::<EditRequest>(text.as_bytes()).is_ok(), edit_ok, "{}", text);
            for r in [
                parse_json::<TitleRequest>(text.as_bytes()).err(),
                parse_json::<RoleRequest>(text.as_bytes()).err(),
                parse_json::<EditRequest>(text.as_bytes()).err(),
            ]
            .into_iter()
            .flatten()
            {
                prop_assert_eq!(r.code, ErrorCode::BadRequest);
            }
        }
    }
}
