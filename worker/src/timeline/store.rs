//! One timeline change as one MySQL transaction, taken like a batch of sends: the
//! shard's fencing token checked under a shared lock, repeats of the change's
//! idempotency key looked up, the conversation row locked (the lock sends and reads of
//! it take), its current members and the message a recall or edit is about read; then
//! the rules decide, and the events are inserted into `messages` with the next `seq`s
//! and snowflake ids above the conversation's last, with the membership, title, roles
//! or message they change, the conversation's position and an outbox row, in one round
//! trip ending in COMMIT, each statement capped so the ids are still fresh at the end
//! (on MySQL, which cannot cap writes, COMMIT goes after a check of the ids' age).

use std::collections::{BTreeMap, BTreeSet};

use herald_shared::db::TextColumns;
use herald_shared::error::ErrorCode;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::mysql_server::Dialect;
use herald_shared::protocol::timeline::MAX_EVENTS_PER_CHANGE;
use herald_shared::protocol::{
    ConversationKind, MemberRole, SendOutcome, SendResult, TimelineEntry, TimelineEvent, TimelineOp, MAX_CMID_LEN,
};
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::Row;

use super::rules::{plan, Actor, ConvView, Plan, PlannedEvent, Refusal, Target, TargetUpdate, Windows};
use crate::batch::{live_since, Committed, Recipient};
use crate::commit::{BatchResult, CommitError, Fence};
use crate::lease::IdSource;
use crate::seq_floor::SeqFloors;
use herald_shared::sql_script::Script;

/// Time kept back from the ids' freshness for the round trip and COMMIT itself.
const COMMIT_MARGIN_MS: u64 = 50;
/// The shortest cap a write statement is given.
const MIN_STATEMENT_MS: u64 = 10;

/// The answer to a key already used for something else.
const KEY_REUSED: &str = "this cmid was already used for another message or change";

/// What a change's transaction needs besides its connection.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub first_retry_delay_ms: u64,
    pub device_ttl_ms: u64,
    /// Ids older than this may not be committed (`delivery.sync_settle_ms` halved).
    pub max_id_age_ms: u64,
    pub windows: Windows,
    /// How the ids are kept fresh until COMMIT on this server.
    pub dialect: Dialect,
}

/// A current member as read under the lock.
struct Member {
    role: MemberRole,
    joined_seq: u64,
}

/// Runs the change's transaction on `conn`: its answer, and what to fan out when it
/// committed events. An error leaves the transaction open for the caller to roll back.
pub async fn attempt(
    conn: &mut MySqlConnection,
    e: &TimelineEntry,
    ids: &IdSource,
    fence: Fence,
    s: Settings,
    floors: &SeqFloors,
) -> Result<(SendOutcome, Option<BatchResult>), CommitError> {
    let now = now_ms();
    let target_id = match &e.op {
        TimelineOp::Recall { target } | TimelineOp::Edit { target, .. } => Some(*target),
        _ => None,
    };
    let mut sets = reads(e, fence, target_id).run(&mut *conn).await?.into_iter().map(|(rows, _)| rows).skip(1);
    let mut next = || sets.next().ok_or_else(|| sqlx::Error::Protocol("the reads script answered short".into()));
    let token: Option<u64> = next()?.first().map(|r| r.try_get(0)).transpose()?;
    if token != Some(fence.token) {
        return Err(CommitError::Fenced(fence.shard));
    }
    let repeats = next()?;
    let conv = next()?;
    let member_rows = next()?;
    let target_rows = if target_id.is_some() { next()? } else { Vec::new() };
    if !repeats.is_empty() {
        finish(conn).await?;
        return Ok((repeat(e, &repeats)?, None));
    }
    let Some(conv) = conv.first() else {
        finish(conn).await?;
        return Ok((refused(ErrorCode::NotFound, "no such conversation"), None));
    };
    let kind = ConversationKind::parse(&conv.text(0)?).unwrap_or(ConversationKind::Group);
    let (mut last_seq, last_id): (u64, MsgId) =
        (conv.try_get(2)?, MsgId(conv.try_get::<Option<u64>, _>(3)?.unwrap_or(0)));
    // Seqs that went back are never numbered from (`seq_floor.rs`).
    floors.lift([(e.tenant.as_str(), e.conv.as_str(), &mut last_seq)]).await?;
    let mut members: BTreeMap<String, Member> = BTreeMap::new();
    for r in &member_rows {
        let role = MemberRole::parse(&r.text(1)?).unwrap_or(MemberRole::Member);
        members.insert(r.text(0)?, Member { role, joined_seq: r.try_get(2)? });
    }
    let target = match (target_id, target_rows.first()) {
        (Some(id), Some(r)) => Some(Target {
            id,
            seq: r.try_get(0)?,
            sender: r.text(1)?,
            created_at: r.try_get::<i64, _>(2)? as u64,
            is_event: r.try_get::<i64, _>(3)? == 1,
            recalled: r.try_get::<i64, _>(4)? == 1,
        }),
        _ => None,
    };
    let view = ConvView {
        kind,
        title: conv.opt_text(1)?,
        members: members.iter().map(|(u, m)| (u.clone(), m.role)).collect(),
    };
    let actor = Actor { user: &e.user, service: e.by_service };
    let plan = match plan(&view, actor, &e.op, target.as_ref(), now, s.windows) {
        Ok(p) if p.events.is_empty() => {
            finish(conn).await?;
            return Ok((SendOutcome::Timeline(Vec::new()), None));
        }
        Ok(p) => p,
        Err(Refusal(code, message)) => {
            finish(conn).await?;
            return Ok((refused(code, &message), None));
        }
    };

    // The recipients: every current member, those joining, with their live devices.
    let joins: BTreeMap<&str, u64> = numbered(&plan, last_seq, |p| &p.joins);
    let leaves: BTreeMap<&str, u64> = numbered(&plan, last_seq, |p| &p.leaves);
    let users: BTreeSet<&str> = members.keys().map(String::as_str).chain(joins.keys().copied()).collect();
    let devices = devices_of(conn, &e.tenant, &users, s.device_ttl_ms).await?;

    let new_ids = ids.next_ids(&vec![last_id; plan.events.len()])?;
    let age = now_ms().saturating_sub(new_ids[0].unix_ms());
    let left = s.max_id_age_ms.saturating_sub(age + COMMIT_MARGIN_MS);
    if left < 3 * MIN_STATEMENT_MS {
        return Err(CommitError::StaleIds(age));
    }
    let cap = s.dialect.write_cap(left / 3);
    let committed: Vec<Committed> = plan
        .events
        .iter()
        .zip(&new_ids)
        .enumerate()
        .map(|(n, (p, id))| Committed {
            id: *id,
            tenant: e.tenant.clone(),
            conv: e.conv.clone(),
            seq: last_seq + 1 + n as u64,
            sender: e.user.clone(),
            sender_device: e.device.clone(),
            cmid: e.event_cmid(n + 1),
            ts: now,
            body: p.body.clone(),
            event: Some(p.event.clone()),
            trace: None,
        })
        .collect();
    let mut writes = writes(e, &plan, &committed, &joins, &leaves, &cap, now, s.first_retry_delay_ms);
    let with_commit = s.dialect.commits_with_writes();
    if with_commit {
        writes.push("; COMMIT");
    }
    let done = match writes.run(&mut *conn).await {
        Ok(done) => done,
        Err(err) if is_statement_timeout(&err, s.dialect) => return Err(CommitError::StaleIds(age)),
        Err(err) => return Err(err.into()),
    };
    let outbox = done.len().checked_sub(if with_commit { 2 } else { 1 }).and_then(|i| done.get(i));
    let outbox = outbox.ok_or_else(|| sqlx::Error::Protocol("the writes script answered short".into()))?;
    if !with_commit {
        // MySQL: the writes were not capped; COMMIT only while the ids are fresh.
        let age = now_ms().saturating_sub(new_ids[0].unix_ms());
        if age + COMMIT_MARGIN_MS > s.max_id_age_ms {
            return Err(CommitError::StaleIds(age));
        }
        finish(conn).await?;
    }
    floors.remember(&e.tenant, &e.conv, last_seq + committed.len() as u64);

    let recipients = devices
        .into_iter()
        .map(|(user, device)| {
            let joined_seq = match joins.get(user.as_str()) {
                Some(seq) => seq - 1,
                None => members.get(&user).map_or(0, |m| m.joined_seq),
            };
            Recipient {
                tenant: e.tenant.clone(),
                conv: e.conv.clone(),
                left_seq: leaves.get(user.as_str()).copied(),
                user,
                joined_seq,
                device,
                push: false,
            }
        })
        .collect();
    let answers = committed
        .iter()
        .map(|c| SendResult { id: c.id, conv: c.conv.clone(), seq: c.seq, ts: now, dup: false })
        .collect();
    let result =
        BatchResult { outcomes: Vec::new(), committed, outbox_id: Some(outbox.1.last_insert_id()), recipients };
    Ok((SendOutcome::Timeline(answers), Some(result)))
}

/// A `LIKE` pattern matching the stored `edited` events of message `target` (the
/// event's JSON as [`TimelineEvent::to_json`] writes it: `type` first, then `target`).
fn edits_of(target: MsgId) -> String {
    format!(r#"{{"type":"edited","target":"{target}",%"#)
}

fn refused(code: ErrorCode, message: &str) -> SendOutcome {
    SendOutcome::Err { code, message: message.to_owned() }
}

/// Ends a transaction that wrote nothing (its locks go).
async fn finish(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    let mut commit = Script::default();
    commit.push("COMMIT");
    commit.run(conn).await.map(drop)
}

/// A statement stopped by its cap.
fn is_statement_timeout(e: &sqlx::Error, dialect: Dialect) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| dialect.is_statement_timeout(m.number())),
        _ => false,
    }
}

/// The reads, in one round trip: `BEGIN`, the shard's token (shared lock), rows
/// committed before under the change's keys, the conversation (locked), its current
/// members and, for a recall or edit, the message it is about.
fn reads(e: &TimelineEntry, fence: Fence, target: Option<MsgId>) -> Script {
    let mut r = Script::default();
    r.push("BEGIN; SELECT token FROM shard_fences WHERE shard = ").int(fence.shard).push(" LOCK IN SHARE MODE; ");
    r.push("SELECT id, conv_id, seq, created_at, event IS NOT NULL, op_digest FROM messages WHERE tenant_id = ");
    r.str(&e.tenant).push(" AND sender_id = ").str(&e.user).push(" AND client_msg_id IN (");
    // Only a membership change makes more than one event (`K#2`, `K#3`, under the
    // gateway's own key): a recall or edit keyed `K` is `K` alone, whatever else a
    // client once sent as `K#2`.
    let events = if matches!(e.op, TimelineOp::Members { .. }) { MAX_EVENTS_PER_CHANGE } else { 1 };
    let keys = (1..=events).map(|n| e.event_cmid(n)).filter(|k| k.chars().count() <= MAX_CMID_LEN);
    for (i, k) in keys.enumerate() {
        if i > 0 {
            r.push(", ");
        }
        r.str(&k);
    }
    r.push(") ORDER BY seq; SELECT kind, title, last_seq, last_msg_id FROM conversations WHERE tenant_id = ");
    r.str(&e.tenant).push(" AND id = ").str(&e.conv).push(" FOR UPDATE; ");
    r.push("SELECT user_id, role, joined_seq FROM members WHERE tenant_id = ").str(&e.tenant);
    r.push(" AND conv_id = ").str(&e.conv).push(" AND left_seq IS NULL");
    if let Some(id) = target {
        r.push("; SELECT seq, sender_id, created_at, event IS NOT NULL, recalled_seq IS NOT NULL FROM messages WHERE id = ");
        r.int(id.0).push(" AND tenant_id = ").str(&e.tenant).push(" AND conv_id = ").str(&e.conv);
    }
    r
}

/// The answer to a change whose key was committed before: its events again (`dup`),
/// or a conflict when the key belongs to something else (a message, another
/// conversation, another operation, target or body).
fn repeat(e: &TimelineEntry, rows: &[MySqlRow]) -> Result<SendOutcome, sqlx::Error> {
    let mut answers = Vec::new();
    let digest = e.digest();
    for r in rows {
        let same = r.try_get::<Option<u64>, _>(5)?.is_none_or(|d| d == digest);
        if r.text(1)? != e.conv || r.try_get::<i64, _>(4)? != 1 || !same {
            return Ok(refused(ErrorCode::Conflict, KEY_REUSED));
        }
        let ts = r.try_get::<i64, _>(3)? as u64;
        answers.push(SendResult { id: MsgId(r.try_get(0)?), conv: e.conv.clone(), seq: r.try_get(2)?, ts, dup: true });
    }
    Ok(SendOutcome::Timeline(answers))
}

/// The users of `which` of each planned event, with that event's `seq`.
fn numbered<'a>(
    plan: &'a Plan,
    last_seq: u64,
    which: impl Fn(&'a PlannedEvent) -> &'a Vec<String>,
) -> BTreeMap<&'a str, u64> {
    let mut out = BTreeMap::new();
    for (n, p) in plan.events.iter().enumerate() {
        for u in which(p) {
            out.insert(u.as_str(), last_seq + 1 + n as u64);
        }
    }
    out
}

/// The live devices of `users` (at most `gateway.max_group_size` and those joining).
async fn devices_of(
    conn: &mut MySqlConnection,
    tenant: &str,
    users: &BTreeSet<&str>,
    device_ttl_ms: u64,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    if users.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = Script::default();
    q.push("SELECT user_id, device_id FROM devices WHERE tenant_id = ").str(tenant);
    q.push(" AND expired_at IS NULL AND last_seen_at >= ").int(live_since(device_ttl_ms)).push(" AND user_id IN (");
    for (i, u) in users.iter().enumerate() {
        if i > 0 {
            q.push(", ");
        }
        q.str(u);
    }
    q.push(")");
    let rows = q.run(&mut *conn).await?.into_iter().next().map(|(rows, _)| rows).unwrap_or_default();
    rows.iter().map(|r| Ok((r.text(0)?, r.text(1)?))).collect()
}

/// The change's writes, as one script (COMMIT is added by the caller).
#[allow(clippy::too_many_arguments)]
fn writes(
    e: &TimelineEntry,
    plan: &Plan,
    committed: &[Committed],
    joins: &BTreeMap<&str, u64>,
    leaves: &BTreeMap<&str, u64>,
    cap: &str,
    now: u64,
    first_retry_delay_ms: u64,
) -> Script {
    let mut w = Script::default();
    w.push(cap).push(
        "INSERT INTO messages (id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at, event, op_digest) VALUES ",
    );
    let digest = e.digest();
    for (n, c) in committed.iter().enumerate() {
        w.push(if n > 0 { ", (" } else { "(" }).int(c.id.0).push(", ").str(&c.tenant).push(", ").str(&c.conv);
        w.push(", ").int(c.seq).push(", ").str(&c.sender).push(", ").str(&c.sender_device).push(", ").str(&c.cmid);
        let event = c.event.as_ref().map(|ev| ev.to_json()).unwrap_or_default();
        w.push(", ").str(&c.body).push(", ").int(now).push(", ").str(&event).push(", ").int(digest).push(")");
    }
    let member = |w: &mut Script, user: &str| {
        w.push(" WHERE tenant_id = ").str(&e.tenant).push(" AND conv_id = ").str(&e.conv);
        w.push(" AND user_id = ").str(user);
    };
    if !joins.is_empty() {
        // A former member's range is kept before it rejoins (its row then holds the new
        // one): what reads a device's messages by membership still finds it.
        w.push("; ").push(cap);
        w.push("INSERT INTO member_ranges (tenant_id, conv_id, user_id, joined_seq, left_seq) ");
        w.push("SELECT tenant_id, conv_id, user_id, joined_seq, left_seq FROM members WHERE tenant_id = ");
        w.str(&e.tenant).push(" AND conv_id = ").str(&e.conv).push(" AND left_seq IS NOT NULL AND user_id IN (");
        for (n, user) in joins.keys().enumerate() {
            w.push(if n > 0 { ", " } else { "" }).str(user);
        }
        w.push(") ON DUPLICATE KEY UPDATE left_seq = VALUES(left_seq)");
        // A former member rejoins from here on, as a member.
        w.push("; ").push(cap);
        w.push("INSERT INTO members (tenant_id, conv_id, user_id, joined_seq, read_seq, joined_at, role) VALUES ");
        for (n, (user, seq)) in joins.iter().enumerate() {
            w.push(if n > 0 { ", (" } else { "(" }).str(&e.tenant).push(", ").str(&e.conv).push(", ").str(user);
            w.push(", ").int(seq - 1).push(", ").int(seq - 1).push(", ").int(now).push(", 'member')");
        }
        w.push(
            " ON DUPLICATE KEY UPDATE joined_seq = VALUES(joined_seq), read_seq = GREATEST(read_seq, VALUES(read_seq)), \
             left_seq = NULL, joined_at = VALUES(joined_at), role = 'member'",
        );
    }
    for (user, seq) in leaves {
        w.push("; ").push(cap).push("UPDATE members SET left_seq = ").int(*seq);
        member(&mut w, user);
        w.push(" AND left_seq IS NULL");
    }
    for (user, role) in &plan.roles {
        w.push("; ").push(cap).push("UPDATE members SET role = ").str(role.as_str());
        member(&mut w, user);
    }
    let last = committed.last().expect("a change with events");
    w.push("; ").push(cap).push("UPDATE conversations SET last_seq = ").int(last.seq);
    w.push(", last_msg_id = ").int(last.id.0).push(", last_active_at = ").int(now);
    if let Some(title) = &plan.title {
        w.push(", title = ");
        match title {
            Some(t) => w.str(t),
            None => w.push("NULL"),
        };
    }
    w.push(" WHERE tenant_id = ").str(&e.tenant).push(" AND id = ").str(&e.conv);
    if let (Some(update), Some(target)) = (&plan.target, last.event.as_ref().and_then(|ev| ev.target())) {
        w.push("; ").push(cap);
        match update {
            TargetUpdate::Recall => w.push("UPDATE messages SET body = 'null', recalled_seq = ").int(last.seq),
            TargetUpdate::Edit(body) => {
                w.push("UPDATE messages SET body = ").str(body).push(", edited_seq = ").int(last.seq)
            }
        };
        w.push(" WHERE id = ").int(target.0).push(" AND tenant_id = ").str(&e.tenant);
        if let (TargetUpdate::Recall, Some(TimelineEvent::Recalled { target_seq, .. })) = (update, &last.event) {
            // The recall's promise: the text is gone for everyone, the earlier edits'
            // too. They stay in the timeline as who and when (their rows, `null`).
            w.push("; ").push(cap).push("UPDATE messages SET body = 'null' WHERE tenant_id = ").str(&e.tenant);
            w.push(" AND conv_id = ").str(&e.conv).push(" AND seq > ").int(*target_seq);
            w.push(" AND event LIKE ").str(&edits_of(target));
        }
    }
    let ids: Vec<String> = committed.iter().map(|c| c.id.to_string()).collect();
    let payload = serde_json::json!({ "ids": ids }).to_string();
    w.push("; ").push(cap).push(
        "INSERT INTO outbox_events (kind, payload, status, retry_count, next_retry_at, created_at, updated_at) VALUES ('fanout', ",
    );
    w.str(&payload).push(", 'PENDING', 0, ").int(now + first_retry_delay_ms).push(", ");
    w.int(now).push(", ").int(now).push(")");
    w
}
