//! Admin views for operators: where one message is (committed, fanned out, pending on
//! which devices, acked), and one device's delivery state.

use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::ids::MsgId;
use serde_json::{json, Value};
use sqlx::Row;

use crate::context::WorkerContext;

/// Why a view could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
}

/// `None` when the message does not exist.
pub async fn message(s: &WorkerContext, id: MsgId) -> Result<Option<Value>, TraceError> {
    let Some(m) = sqlx::query(
        "SELECT tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, created_at, event FROM messages WHERE id = ?",
    )
    .bind(id.0)
    .fetch_optional(&s.db)
    .await?
    else {
        return Ok(None);
    };
    let (tenant, conv, seq) = (m.text(0)?, m.text(1)?, m.try_get::<u64, _>(2)?);
    let (sender, sender_device) = (m.text(3)?, m.text(4)?);
    // A timeline event reaches its actor's device too (a message does not).
    let event: Option<Value> = m.opt_text(7)?.and_then(|e| serde_json::from_str(&e).ok());
    // The outbox row of its batch (an admin lookup: scans the retained outbox rows).
    let outbox = sqlx::query(
        "SELECT id, status, retry_count, updated_at FROM outbox_events WHERE payload LIKE ? ORDER BY id DESC LIMIT 1",
    )
    .bind(format!("%\"{id}\"%"))
    .fetch_optional(&s.db)
    .await?;
    let (fanned_out, outbox_json) = match &outbox {
        Some(o) => {
            let status = o.text(1)?;
            let at: i64 = o.try_get(3)?;
            (
                status == "SENT",
                json!({"event": o.try_get::<u64, _>(0)?, "status": status, "retry_count": o.try_get::<u32, _>(2)?, "updated_at": at}),
            )
        }
        // Purged after the retention period: it was SENT.
        None => (true, Value::Null),
    };
    let devices = sqlx::query(
        "SELECT m.user_id, d.device_id, d.watermark FROM members m JOIN devices d ON d.tenant_id = m.tenant_id AND d.user_id = m.user_id \
         WHERE m.tenant_id = ? AND m.conv_id = ? AND m.joined_seq < ? AND (m.left_seq IS NULL OR m.left_seq >= ?)",
    )
    .bind(&tenant)
    .bind(&conv)
    .bind(seq)
    .bind(seq)
    .fetch_all(&s.db)
    .await?;
    let redis = s.redis.next();
    let mut recipients = Vec::new();
    for d in &devices {
        let (user, device, watermark): (String, String, u64) = (d.text(0)?, d.text(1)?, d.try_get(2)?);
        if event.is_none() && user == sender && device == sender_device {
            continue;
        }
        let score: Option<f64> = redis.zscore(s.keys.pending(&tenant, &user, &device), id.member()).await?;
        let state = if score.is_some() {
            "pending"
        } else if fanned_out || watermark >= id.0 {
            "acked"
        } else {
            "not fanned out yet"
        };
        recipients.push(json!({"user": user, "device": device, "state": state}));
    }
    let frame_cached: bool = redis.exists(s.keys.message(id)).await?;
    Ok(Some(json!({
        "id": id,
        "tenant": tenant,
        "conv": conv,
        "seq": seq,
        "from": sender,
        "from_device": sender_device,
        "cmid": m.text(5)?,
        "committed_at": m.try_get::<i64, _>(6)?,
        "event": event,
        "outbox": outbox_json,
        "fanned_out": fanned_out,
        "frame_cached": frame_cached,
        "recipients": recipients,
    })))
}

/// A device's presence, pending set and watermark; `None` when it is not registered.
pub async fn device(s: &WorkerContext, tenant: &str, user: &str, device: &str) -> Result<Option<Value>, TraceError> {
    let Some(d) = sqlx::query(
        "SELECT platform, watermark, registered_at, last_seen_at FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?",
    )
    .bind(tenant)
    .bind(user)
    .bind(device)
    .fetch_optional(&s.db)
    .await?
    else {
        return Ok(None);
    };
    let redis = s.redis.next();
    let pending_key = s.keys.pending(tenant, user, device);
    let pending: u64 = redis.zcard(&pending_key).await?;
    let oldest: Vec<String> = redis.zrange(&pending_key, 0, 0, None, false, None, false).await?;
    let presence: Option<String> = redis.hget(s.keys.presence(tenant, user), device).await?;
    let epoch: Option<String> = redis.get(s.keys.epoch()).await?;
    let marker: Option<String> = redis.hget(s.keys.devices(tenant, user), format!("epoch:{device}")).await?;
    Ok(Some(json!({
        "tenant": tenant,
        "user": user,
        "device": device,
        "platform": d.text(0)?,
        "watermark": d.try_get::<u64, _>(1)?.to_string(),
        "registered_at": d.try_get::<i64, _>(2)?,
        "last_seen_at": d.try_get::<i64, _>(3)?,
        "connected": presence.as_deref().map(|p| {
            let (node, session) = p.split_once('|').unwrap_or((p, ""));
            json!({"node": node, "session": session})
        }),
        "pending": pending,
        "oldest_pending": oldest.first().and_then(|m| MsgId::from_member(m)),
        "pending_set_trusted": epoch.is_some() && epoch == marker,
    })))
}
