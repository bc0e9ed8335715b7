//! Reads from MySQL, the backstop of push: a conversation's history (gap filling), the
//! device-level sync of everything after an id, and the `msg` frames of backlog ids
//! (from Redis, else rebuilt from MySQL).

use std::collections::HashMap;

use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::error::ErrorCode;
use herald_shared::ids::MsgId;
use herald_shared::keys::{DeviceKey, Keys};
use herald_shared::protocol::{Message, TimelineEvent};
use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::Row;

use crate::error::{ApiError, ApiResult};

/// Reads of committed messages.
#[derive(Clone, Debug)]
pub struct History {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    /// Most bytes of bodies in one page (`gateway.history_page_bytes`).
    pub page_bytes: usize,
    /// Device sync returns only messages this old (`delivery.sync_settle_ms`).
    pub settle_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct Page {
    pub items: Vec<Message>,
    pub more: bool,
    /// A conversation's page: the caller's membership starts after this seq (it
    /// joined then), so a client holds no gap below it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub joined_seq: Option<u64>,
    /// A conversation's page: where the calling device's timeline starts, at or above
    /// `joined_seq`: it receives by push everything after it (`crate::starts`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_seq: Option<u64>,
}

/// Frames read by one MGET at most (a desktop page is 200).
const FRAMES_PER_MGET: usize = 256;

const MESSAGE_COLUMNS: &str = "msg.id, msg.conv_id, msg.seq, msg.sender_id, msg.client_msg_id, msg.created_at, \
     msg.body, msg.event, msg.edited_seq, msg.recalled_seq";

/// A message (`msg`) within one of the ranges its reader (`m`, the member row) was a
/// member of: the current one, or an earlier one kept when it joined again.
const IN_RANGES: &str = "((msg.seq > m.joined_seq AND (m.left_seq IS NULL OR msg.seq <= m.left_seq)) \
     OR EXISTS (SELECT 1 FROM member_ranges r WHERE r.tenant_id = m.tenant_id AND r.conv_id = m.conv_id \
     AND r.user_id = m.user_id AND msg.seq > r.joined_seq AND msg.seq <= r.left_seq))";

/// What a device's band leaves out (binds its user and device): its own messages, which
/// it has from their `sent`; its own timeline events reach it like everyone's.
const NOT_OWN: &str = "AND NOT (msg.event IS NULL AND msg.sender_id = ? AND msg.sender_device = ?)";

/// A message or event as it is now: an edited message with its latest body, a recalled
/// one with a null body (docs/protocol.md section 4.11).
fn message(r: &MySqlRow) -> Result<Message, sqlx::Error> {
    let body = r.text(6)?;
    let event = match r.opt_text(7)? {
        Some(e) => Some(serde_json::from_str::<TimelineEvent>(&e).map_err(|e| sqlx::Error::Decode(Box::new(e)))?),
        None => None,
    };
    Ok(Message {
        id: MsgId(r.try_get::<u64, _>(0)?),
        conv: r.text(1)?,
        seq: r.try_get(2)?,
        from: r.text(3)?,
        cmid: r.text(4)?,
        ts: r.try_get::<i64, _>(5)? as u64,
        body: RawValue::from_string(body).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        status: None,
        event,
        edited_seq: r.try_get(8)?,
        recalled_seq: r.try_get(9)?,
    })
}

impl History {
    /// A conversation's messages after `after_seq`, within the caller's membership range.
    pub async fn conversation(
        &self,
        tenant: &str,
        user: &str,
        device: &str,
        conv: &str,
        after_seq: u64,
        limit: u32,
    ) -> ApiResult<Page> {
        let member =
            sqlx::query("SELECT joined_seq, left_seq FROM members WHERE tenant_id = ? AND conv_id = ? AND user_id = ?")
                .bind(tenant)
                .bind(conv)
                .bind(user)
                .fetch_optional(&self.db)
                .await?;
        let Some(member) = member else {
            let exists = herald_shared::db::conversation_exists(&self.db, tenant, conv).await?;
            return Err(if exists {
                ApiError::new(ErrorCode::Forbidden, "not a member of this conversation")
            } else {
                ApiError::not_found()
            });
        };
        let joined: u64 = member.try_get(0)?;
        // Retention may have deleted the conversation's oldest messages: the timeline
        // then starts after what is gone, as if the caller had joined there.
        let first: Option<u64> =
            sqlx::query_scalar("SELECT MIN(seq) FROM messages WHERE tenant_id = ? AND conv_id = ?")
                .bind(tenant)
                .bind(conv)
                .fetch_one(&self.db)
                .await?;
        let joined = joined.max(first.map_or(0, |f| f.saturating_sub(1)));
        let left: Option<u64> = member.try_get(1)?;
        let rows = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages msg WHERE msg.tenant_id = ? AND msg.conv_id = ? AND msg.seq > ? AND msg.seq <= ? \
             ORDER BY msg.seq LIMIT ?"
        ))
        .bind(tenant)
        .bind(conv)
        .bind(after_seq.max(joined))
        .bind(left.unwrap_or(u64::MAX >> 1))
        .bind(limit + 1)
        .fetch_all(&self.db)
        .await?;
        let mut page = page(rows, limit, self.page_bytes)?;
        page.joined_seq = Some(joined);
        let pushed_after = crate::starts::device_start(&self.db, tenant, user, device, conv).await?;
        page.start_seq = Some(joined.max(pushed_after.unwrap_or(0)));
        // The caller's own messages say how far they got: one read of the members.
        if page.items.iter().any(|m| m.from == user) {
            let members = crate::status::positions(&self.db, tenant, conv).await?;
            for m in page.items.iter_mut().filter(|m| m.from == user) {
                m.status = Some(crate::status::status_of(&members, user, m.seq));
            }
        }
        Ok(page)
    }

    /// Every message of every conversation of the user with id > `after`, in id order,
    /// as far as ids are settled: up to `settle_ms` ago, so that no message can still
    /// commit below an id returned (`more` says whether settled ones remain).
    pub async fn device_sync(&self, tenant: &str, user: &str, after: MsgId, limit: u32) -> ApiResult<Page> {
        let settled = MsgId::lowest_at(herald_shared::ids::now_ms().saturating_sub(self.settle_ms));
        let rows = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM members m JOIN messages msg ON msg.tenant_id = m.tenant_id AND msg.conv_id = m.conv_id \
             WHERE m.tenant_id = ? AND m.user_id = ? AND msg.id > ? AND msg.id < ? AND {IN_RANGES} ORDER BY msg.id LIMIT ?"
        ))
        .bind(tenant)
        .bind(user)
        .bind(after.0)
        .bind(settled.0)
        .bind(limit + 1)
        .fetch_all(&self.db)
        .await?;
        page(rows, limit, self.page_bytes)
    }

    /// A device's messages with ids in `after+1..=upto`, in id order: every message of
    /// the user's conversations within membership, except the device's own. What its
    /// overflow band holds (see `recovery`).
    pub async fn band(
        &self,
        d: &DeviceKey,
        after: MsgId,
        upto: MsgId,
        limit: u32,
    ) -> Result<Vec<Message>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM members m JOIN messages msg ON msg.tenant_id = m.tenant_id AND msg.conv_id = m.conv_id \
             WHERE m.tenant_id = ? AND m.user_id = ? AND msg.id > ? AND msg.id <= ? AND {IN_RANGES} {NOT_OWN} ORDER BY msg.id LIMIT ?"
        ))
        .bind(&d.tenant)
        .bind(&d.user)
        .bind(after.0)
        .bind(upto.0)
        .bind(&d.user)
        .bind(&d.device)
        .bind(limit)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(message).collect()
    }

    /// Whether the band after `after` may hold messages: whether any conversation the
    /// user is or was a member of has a message with a larger id. One dive per
    /// conversation, to its newest id (`messages.by_conv_id` read backwards: the id
    /// range itself would be a scan of the conversation's ids from its first). A
    /// superset of what [`History::band`] returns (which also leaves out ids past the
    /// band's end, what fell outside the user's membership, and the device's own), so
    /// `false` means the band is empty. The band's own query sorts what it finds in a
    /// temporary table, which costs MariaDB more than the dives even when it finds
    /// nothing, and most first sessions' bands are empty.
    pub async fn band_may_hold(&self, d: &DeviceKey, after: MsgId) -> Result<bool, sqlx::Error> {
        let any: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM members m WHERE m.tenant_id = ? AND m.user_id = ? AND \
             (SELECT x.id FROM messages x FORCE INDEX (by_conv_id) WHERE x.tenant_id = m.tenant_id \
             AND x.conv_id = m.conv_id ORDER BY x.id DESC LIMIT 1) > ? LIMIT 1",
        )
        .bind(&d.tenant)
        .bind(&d.user)
        .bind(after.0)
        .fetch_optional(&self.db)
        .await?;
        Ok(any.is_some())
    }

    /// How many messages a band holds, counting at most `max`.
    pub async fn band_count(&self, d: &DeviceKey, low: MsgId, high: MsgId, max: u32) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM members m JOIN messages msg ON msg.tenant_id = m.tenant_id AND msg.conv_id = m.conv_id \
             WHERE m.tenant_id = ? AND m.user_id = ? AND msg.id >= ? AND msg.id <= ? AND {IN_RANGES} {NOT_OWN} LIMIT ?) band"
        ))
        .bind(&d.tenant)
        .bind(&d.user)
        .bind(low.0)
        .bind(high.0)
        .bind(&d.user)
        .bind(&d.device)
        .bind(max)
        .fetch_one(&self.db)
        .await?;
        Ok(n as u64)
    }

    /// The `msg` frames of these ids: from Redis (`m:{id}`), else rebuilt from MySQL.
    pub async fn frames(&self, ids: &[MsgId]) -> Result<HashMap<MsgId, String>, sqlx::Error> {
        let mut out = HashMap::with_capacity(ids.len());
        if ids.is_empty() {
            return Ok(out);
        }
        // One MGET per cluster slot (one for the page on a single Redis), in one pipeline.
        let client = self.redis.next();
        let mut keys: Vec<String> = ids.iter().map(|id| self.keys.message(*id)).collect();
        let calls = herald_shared::redis::calls_by_slot(
            keys.iter().map(|k| (k.as_str(), 1)),
            client.is_clustered(),
            FRAMES_PER_MGET,
        );
        let pipe = client.pipeline();
        for call in &calls {
            let call_keys: Vec<String> = call.iter().map(|&i| std::mem::take(&mut keys[i])).collect();
            let _: Result<(), _> = pipe.mget::<(), _>(call_keys).await;
        }
        // A pipeline that failed as a whole (a timeout) answers with fewer results than
        // commands: every id without its own frame is read from MySQL, none is skipped.
        let mut results = pipe.try_all::<Vec<Option<String>>>().await.into_iter();
        let mut missing = Vec::new();
        for call in &calls {
            match results.next() {
                Some(Ok(frames)) if frames.len() == call.len() => {
                    for (&i, frame) in call.iter().zip(frames) {
                        match frame {
                            Some(frame) => {
                                out.insert(ids[i], frame);
                            }
                            None => missing.push(ids[i]),
                        }
                    }
                }
                _ => missing.extend(call.iter().map(|&i| ids[i])),
            }
        }
        if !missing.is_empty() {
            let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages msg WHERE msg.id IN ("
            ));
            let mut sep = q.separated(", ");
            for id in &missing {
                sep.push_bind(id.0);
            }
            q.push(")");
            // Not kept prepared: the text differs with every number of ids.
            // An error is not an absence: the caller must not take these ids for stale.
            for r in &q.build().persistent(false).fetch_all(&self.db).await? {
                if let Ok(m) = message(r) {
                    out.insert(m.id, herald_shared::protocol::msg_frame(&m));
                }
            }
        }
        Ok(out)
    }
}

/// Up to `limit` rows, fewer when their bodies would pass `max_bytes` (never none):
/// `more` says there is more either way.
/// A page of `rows` (read with `limit + 1`), bounded by `max_bytes` of whole items as
/// they go on the wire (a timeline event's member list counts, not only its body): one
/// item at least, and over the budget by one item at most.
fn page(rows: Vec<MySqlRow>, limit: u32, max_bytes: usize) -> ApiResult<Page> {
    let mut items = Vec::new();
    let mut bytes = 0;
    for r in rows.iter().take(limit as usize) {
        let m = message(r)?;
        bytes += wire_bytes(&m);
        if bytes > max_bytes && !items.is_empty() {
            return Ok(Page { items, more: true, joined_seq: None, start_seq: None });
        }
        items.push(m);
    }
    Ok(Page { items, more: rows.len() > limit as usize, joined_seq: None, start_seq: None })
}

/// What an item adds to a page's JSON: its body, its event and its other fields.
fn wire_bytes(m: &Message) -> usize {
    let event = m.event.as_ref().map_or(0, |e| serde_json::to_string(e).map_or(0, |e| e.len()));
    m.body.get().len() + event + m.conv.len() + m.from.len() + m.cmid.len() + 160
}

/// A page size within 1..=max, `default` when absent.
pub fn check_limit(limit: Option<u32>, default: u32, max: u32) -> ApiResult<u32> {
    let limit = limit.unwrap_or(default);
    if !(1..=max).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit must be 1..{max}")));
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use herald_shared::db::ScratchDb;

    use super::*;

    /// A history over a fresh schema (one connection: a test may read its session's
    /// counters) and the test Redis under a prefix of its own.
    async fn scratch_history(name: &str) -> (ScratchDb, History) {
        let scratch = ScratchDb::create(name).await.expect("a fresh schema");
        let db = herald_shared::db::pool(&scratch.url, 1, None).expect("pool");
        let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        let redis = herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis");
        let keys = Keys::new(format!("ut-{name}-{:08x}", rand::random::<u32>()));
        (scratch, History { db, redis, keys, page_bytes: 1 << 20, settle_ms: 0 })
    }

    /// A page's frames: those in Redis are taken from there (whatever slot call they
    /// came in), each under its own id; the one gone from Redis is rebuilt from MySQL;
    /// the one in neither is absent, for the caller to drop as stale.
    #[tokio::test]
    async fn frames_come_from_redis_by_id_and_the_missing_from_mysql() {
        let (scratch, history) = scratch_history("frames").await;
        let History { db, redis, keys, .. } = history.clone();
        for id in [1u64, 3, 5] {
            let _: () =
                redis.next().set(keys.message(MsgId(id)), format!("redis {id}"), None, None, false).await.unwrap();
        }
        sqlx::query(
            "INSERT INTO messages (id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at) \
             VALUES (2, 't', 'c', 2, 'alice', 'a1', 'm2', '{\"n\":2}', 1)",
        )
        .execute(&db)
        .await
        .expect("a committed message");
        let frames = history.frames(&[MsgId(5), MsgId(1), MsgId(2), MsgId(4), MsgId(3)]).await.expect("read");
        for id in [1u64, 3, 5] {
            assert_eq!(frames.get(&MsgId(id)).map(String::as_str), Some(format!("redis {id}").as_str()));
        }
        let rebuilt: serde_json::Value = serde_json::from_str(&frames[&MsgId(2)]).expect("a frame");
        assert_eq!((rebuilt["id"].as_str(), rebuilt["seq"].as_u64()), (Some("2"), Some(2)), "{rebuilt}");
        assert!(!frames.contains_key(&MsgId(4)), "in neither");
        assert_eq!(frames.len(), 4);
        db.close().await;
        scratch.remove().await;
    }

    /// Whether a band may hold messages: the check looks at the newest message of every
    /// conversation of the user (joined or left) and at nothing else, whenever it says
    /// no the band's own query finds nothing either, and it reads an index entry or so
    /// per conversation however long the conversation is.
    #[tokio::test]
    async fn a_band_may_hold_messages_only_where_the_users_conversations_have_newer_ones() {
        let (scratch, history) = scratch_history("bandhold").await;
        let db = history.db.clone();
        sqlx::query(
            "INSERT INTO members (tenant_id, conv_id, user_id, joined_seq, left_seq, joined_at) VALUES \
             ('t', 'c', 'alice', 0, NULL, 0), ('t', 'gone', 'alice', 0, 5, 0), ('t', 'other', 'bob', 0, NULL, 0)",
        )
        .execute(&db)
        .await
        .expect("members");
        // 10 and 20 in alice's conversation, 15 in the one she left, 30 in bob's only.
        for (id, conv, seq) in [(10u64, "c", 1u64), (15, "gone", 1), (20, "c", 2), (30, "other", 1)] {
            sqlx::query(
                "INSERT INTO messages (id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at) \
                 VALUES (?, 't', ?, ?, 'carol', 'c1', ?, '{}', 1)",
            )
            .bind(id)
            .bind(conv)
            .bind(seq)
            .bind(format!("m{id}"))
            .execute(&db)
            .await
            .expect("a committed message");
        }
        let alice = DeviceKey::new("t", "alice", "a1");
        // Her conversations' newest ids are 20 and 15; 30 is not hers.
        for (after, may) in [(0u64, true), (14, true), (19, true), (20, false), (29, false), (40, false)] {
            assert_eq!(history.band_may_hold(&alice, MsgId(after)).await.expect("checked"), may, "after {after}");
        }
        for (after, upto) in [(0u64, 9u64), (10, 14), (20, 40), (29, 30)] {
            let said = history.band_may_hold(&alice, MsgId(after)).await.expect("checked");
            let band = history.band(&alice, MsgId(after), MsgId(upto), 200).await.expect("read");
            assert!(said || band.is_empty(), "band {after}..={upto} said empty but holds {band:?}");
        }
        assert_eq!(history.band(&alice, MsgId(19), MsgId(40), 200).await.expect("read").len(), 1, "20 is in it");
        // A long conversation costs the check one dive, not a scan of its ids (the pool
        // has one connection: the session's counters are the check's).
        let values: Vec<String> = (0..2_000u64)
            .map(|n| format!("({}, 't', 'c', {}, 'carol', 'c1', 'l{n}', '{{}}', 1)", 1_000 + n, 3 + n))
            .collect();
        sqlx::query(&format!(
            "INSERT INTO messages (id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at) VALUES {}",
            values.join(", ")
        ))
        .execute(&db)
        .await
        .expect("a long conversation");
        // Statistics as a long-running database has them. (A first form of the check,
        // an id range through the same index, scanned a 200 000-message conversation
        // by hand but not this one: the count guards the newest-id form.)
        sqlx::query("ANALYZE TABLE messages, members").execute(&db).await.expect("statistics");
        let read_next = || async {
            let n: String = sqlx::query_scalar(
                "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'HANDLER_READ_NEXT'",
            )
            .fetch_one(&db)
            .await
            .expect("the session's counters");
            n.parse::<u64>().expect("a count")
        };
        let before = read_next().await;
        assert!(history.band_may_hold(&alice, MsgId(2_500)).await.expect("checked"));
        assert!(!history.band_may_hold(&alice, MsgId(3_000)).await.expect("checked"));
        let reads = read_next().await - before;
        assert!(reads < 20, "{reads} index entries read for two checks");
        db.close().await;
        scratch.remove().await;
    }
}
