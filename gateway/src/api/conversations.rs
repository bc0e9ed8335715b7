//! The conversations API: create and list (docs/protocol.md section 2). Changes of
//! members, title and roles are timeline changes, committed by the workers
//! (`api/timeline.rs`).

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use herald_shared::auth::is_valid_ident;
use herald_shared::db::TextColumns;
use herald_shared::error::ErrorCode;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::protocol::{ConversationKind, MemberRole};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::{MySql, QueryBuilder, Row};

use crate::api::auth::Caller;
use crate::error::{parse_json, ApiError, ApiResult};
use crate::state::AppState;

/// A conversation to create (docs/protocol.md sections 2.3 and 7.3).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "CreateConversationRequest")]
pub(crate) struct CreateRequest {
    /// 1..64 printable ASCII characters; a service must give it (its idempotency key).
    id: Option<String>,
    /// `direct` or `group`.
    kind: String,
    /// User ids; a direct conversation has exactly 2.
    members: Vec<String>,
    /// At most 256 characters.
    title: Option<String>,
}

/// A conversation with its current members.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Conversation {
    id: String,
    kind: ConversationKind,
    title: Option<String>,
    members: Vec<String>,
    /// Each current member's role (`owner`, `admin`, `member`).
    roles: BTreeMap<String, MemberRole>,
    last_seq: u64,
    created_at: i64,
}

pub(crate) fn check_members(members: &[String], max: usize) -> ApiResult<BTreeSet<String>> {
    let set: BTreeSet<String> = members.iter().cloned().collect();
    if let Some(bad) = set.iter().find(|m| !is_valid_ident(m)) {
        return Err(ApiError::bad_request(format!(
            "member {bad:?} is not a valid user id (1..64 printable ASCII characters)"
        )));
    }
    if set.len() > max {
        return Err(ApiError::bad_request(format!("a conversation has at most {max} members")));
    }
    Ok(set)
}

pub async fn create(
    State(state): State<AppState>,
    Caller(c): Caller,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Conversation>)> {
    create_in(&state, &c.tid, Some(&c.sub), &body).await
}

/// Creates a conversation of `tenant` (or answers the one with the same id, kind and
/// members: a repeat is safe). A device's user (`creator`) must be among the members;
/// a service (`None`) creates any, and must name its id.
pub(crate) async fn create_in(
    state: &AppState,
    tenant: &str,
    creator: Option<&str>,
    body: &[u8],
) -> ApiResult<(StatusCode, Json<Conversation>)> {
    let req: CreateRequest = parse_json(body)?;
    let kind = ConversationKind::parse(&req.kind)
        .ok_or_else(|| ApiError::bad_request("kind must be \"direct\" or \"group\""))?;
    let members = check_members(&req.members, state.cfg.gateway.max_group_size)?;
    if creator.is_some_and(|user| !members.contains(user)) {
        return Err(ApiError::bad_request("the caller must be one of the members"));
    }
    if kind == ConversationKind::Direct && members.len() != 2 {
        return Err(ApiError::bad_request("a direct conversation has exactly 2 members"));
    }
    if req.title.as_ref().is_some_and(|t| t.chars().count() > 256) {
        return Err(ApiError::bad_request("title is at most 256 characters"));
    }
    let id = match req.id {
        Some(id) if is_valid_ident(&id) => id,
        Some(_) => return Err(ApiError::bad_request("id must be 1..64 printable ASCII characters")),
        // A service retries a create by its id: without one, a retry makes a second one.
        None if creator.is_none() => {
            return Err(ApiError::bad_request("id is required: it is the create's idempotency key"))
        }
        None => format!("c{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>()),
    };
    let now = now_ms() as i64;
    let mut tx = state.db.begin().await?;
    let inserted = sqlx::query(
        "INSERT IGNORE INTO conversations (tenant_id, id, kind, title, last_seq, created_at, last_active_at) VALUES (?, ?, ?, ?, 0, ?, ?)",
    )
    .bind(tenant)
    .bind(&id)
    .bind(kind.as_str())
    .bind(&req.title)
    .bind(now)
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !inserted {
        tx.rollback().await?;
        let existing = load(state, tenant, &id).await?.ok_or_else(ApiError::not_found)?;
        let same_members: BTreeSet<String> = existing.members.iter().cloned().collect();
        if existing.kind == kind && same_members == members {
            return Ok((StatusCode::OK, Json(existing)));
        }
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "a conversation with this id exists with another kind or other members",
        ));
    }
    // A group's creator owns it; a direct conversation, or a group a service made, has
    // no owner.
    let role_of = |m: &str| match creator {
        Some(c) if c == m && kind == ConversationKind::Group => MemberRole::Owner,
        _ => MemberRole::Member,
    };
    let mut q = QueryBuilder::<MySql>::new(
        "INSERT INTO members (tenant_id, conv_id, user_id, joined_seq, read_seq, joined_at, role) ",
    );
    q.push_values(&members, |mut b, m| {
        b.push_bind(tenant).push_bind(&id).push_bind(m).push_bind(0u64).push_bind(0u64).push_bind(now);
        b.push_bind(role_of(m).as_str());
    });
    // Not kept prepared: the text differs with every number of members.
    q.build().persistent(false).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(Conversation {
            id,
            kind,
            title: req.title,
            roles: members.iter().map(|m| (m.clone(), role_of(m))).collect(),
            members: members.into_iter().collect(),
            last_seq: 0,
            created_at: now,
        }),
    ))
}

/// A stored conversation's kind; the schema allows no other.
fn stored_kind(text: &str) -> ApiResult<ConversationKind> {
    ConversationKind::parse(text).ok_or_else(|| {
        tracing::error!(kind = text, "a stored conversation has an unknown kind");
        ApiError::new(ErrorCode::Internal, "internal error")
    })
}

/// A conversation of the tenant with its current members.
pub(crate) async fn load(state: &AppState, tenant: &str, id: &str) -> ApiResult<Option<Conversation>> {
    let Some(row) =
        sqlx::query("SELECT kind, title, last_seq, created_at FROM conversations WHERE tenant_id = ? AND id = ?")
            .bind(tenant)
            .bind(id)
            .fetch_optional(&state.db)
            .await?
    else {
        return Ok(None);
    };
    let roles = sqlx::query(
        "SELECT user_id, role FROM members WHERE tenant_id = ? AND conv_id = ? AND left_seq IS NULL ORDER BY user_id",
    )
    .bind(tenant)
    .bind(id)
    .fetch_all(&state.db)
    .await?
    .iter()
    .map(|r| Ok((r.text(0)?, MemberRole::parse(&r.text(1)?).unwrap_or(MemberRole::Member))))
    .collect::<Result<BTreeMap<_, _>, sqlx::Error>>()?;
    Ok(Some(Conversation {
        id: id.to_owned(),
        kind: stored_kind(&row.text(0)?)?,
        title: row.opt_text(1)?,
        last_seq: row.try_get(2)?,
        created_at: row.try_get(3)?,
        members: roles.keys().cloned().collect(),
        roles,
    }))
}

#[derive(Deserialize)]
pub struct ListQuery {
    limit: Option<u32>,
    cursor: Option<String>,
}

/// Most recently active first; the cursor is `<last_active_at>:<id>` of the last item.
pub async fn list(
    State(state): State<AppState>,
    Caller(c): Caller,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let limit = crate::history::check_limit(q.limit, 50, 200)?;
    let cursor = match q.cursor.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(cur) => {
            let (ts, id) = cur.split_once(':').ok_or_else(|| ApiError::bad_request("malformed cursor"))?;
            Some((ts.parse::<i64>().map_err(|_| ApiError::bad_request("malformed cursor"))?, id.to_owned()))
        }
    };
    // Where the caller's device starts each timeline: below the first message after
    // its first watermark (`crate::starts`); an unregistered caller starts at 0.
    let watermark = crate::starts::device_watermark(&state.db, &c.tid, &c.sub, &c.dev).await?;
    let mut qb = QueryBuilder::<MySql>::new(
        "SELECT c.id, c.kind, c.title, c.last_seq, m.read_seq, c.last_active_at, c.last_msg_id, m.joined_seq, ",
    );
    crate::starts::push_first_pushed_seq(&mut qb, watermark.unwrap_or(MsgId(0)));
    qb.push(
        " FROM members m JOIN conversations c ON c.tenant_id = m.tenant_id AND c.id = m.conv_id \
         WHERE m.tenant_id = ",
    );
    qb.push_bind(&c.tid).push(" AND m.user_id = ").push_bind(&c.sub).push(" AND m.left_seq IS NULL");
    if let Some((ts, id)) = &cursor {
        qb.push(" AND (c.last_active_at < ")
            .push_bind(*ts)
            .push(" OR (c.last_active_at = ")
            .push_bind(*ts)
            .push(" AND c.id < ")
            .push_bind(id)
            .push("))");
    }
    qb.push(" ORDER BY c.last_active_at DESC, c.id DESC LIMIT ").push_bind(limit + 1);
    let rows = qb.build().fetch_all(&state.db).await?;
    let more = rows.len() > limit as usize;
    let mut items = Vec::new();
    let mut next_cursor = None;
    let mut last_ids = Vec::new();
    for r in rows.iter().take(limit as usize) {
        let id: String = r.text(0)?;
        let last_seq: u64 = r.try_get(3)?;
        let read_seq: u64 = r.try_get(4)?;
        let active: i64 = r.try_get(5)?;
        let last_msg: Option<u64> = r.try_get(6)?;
        let joined: u64 = r.try_get(7)?;
        last_ids.extend(last_msg);
        next_cursor = Some(format!("{active}:{id}"));
        items.push(json!({
            "id": id,
            "kind": r.text(1)?,
            "title": r.opt_text(2)?,
            "last_seq": last_seq,
            "read_seq": read_seq.min(last_seq),
            "joined_seq": joined,
            "start_seq": joined.max(crate::starts::pushed_after(r.try_get(8)?, last_seq)),
            "unread": last_seq.saturating_sub(read_seq),
            "last_message_id": last_msg.map(|m| m.to_string()),
        }));
    }
    if !last_ids.is_empty() {
        let mut qb = QueryBuilder::<MySql>::new(
            "SELECT id, conv_id, seq, sender_id, client_msg_id, created_at, body, event, edited_seq, recalled_seq FROM messages WHERE id IN (",
        );
        let mut sep = qb.separated(", ");
        for id in &last_ids {
            sep.push_bind(*id);
        }
        qb.push(")");
        // Not kept prepared: the text differs with every number of ids.
        let msgs = qb.build().persistent(false).fetch_all(&state.db).await?;
        for item in items.iter_mut() {
            let Some(want) = item["last_message_id"].as_str().map(str::to_owned) else {
                continue;
            };
            if let Some(m) = msgs
                .iter()
                .find(|m| m.try_get::<u64, _>(0).ok().map(|v| v.to_string()).as_deref() == Some(want.as_str()))
            {
                let body: String = m.text(6)?;
                item["last_message"] = json!({
                    "id": want,
                    "conv": m.text(1)?,
                    "seq": m.try_get::<u64, _>(2)?,
                    "from": m.text(3)?,
                    "cmid": m.text(4)?,
                    "ts": m.try_get::<i64, _>(5)?,
                    "body": serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
                });
                // The latest entry may be a timeline event, or an edited or recalled
                // message (docs/protocol.md section 4.11).
                if let Some(event) = m.opt_text(7)?.and_then(|e| serde_json::from_str::<Value>(&e).ok()) {
                    item["last_message"]["event"] = event;
                }
                for (i, field) in [(8, "edited_seq"), (9, "recalled_seq")] {
                    if let Some(seq) = m.try_get::<Option<u64>, _>(i)? {
                        item["last_message"][field] = json!(seq);
                    }
                }
            }
        }
    }
    for item in items.iter_mut() {
        item.as_object_mut().map(|o| o.remove("last_message_id"));
    }
    let mut out = json!({ "items": items });
    if more {
        out["next_cursor"] = json!(next_cursor);
    }
    Ok(Json(out))
}

/// Property tests of the create and members bodies.
#[cfg(test)]
#[path = "conversations_proptests.rs"]
mod proptests;
