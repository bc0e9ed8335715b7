//! Messages whose fan-out has not finished: what a delivered position must stay below.
//!
//! A member's delivered position claims every `seq` up to it (docs/protocol.md section
//! 4.9). A message whose fan-out failed, and waits for the outbox's retry (or for an
//! operator), has reached no device, or only some; a later message of the same
//! conversation may have been fanned out and acked meanwhile. So a position is held
//! below the lowest `seq` of its conversation whose fan-out is unfinished: an outbox
//! event not SENT whose finished marker is not set (PENDING ones only once older than
//! [`IN_FLIGHT_MS`], the immediate fan-out's time to run and be marked).

use std::collections::{BTreeSet, HashMap};

use fred::prelude::*;
use herald_shared::db::TextColumns;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::Keys;
use serde::Deserialize;
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::Row;

use herald_shared::sql_script::Script;

/// An outbox event's payload (the outbox writes it): the messages it fans out.
#[derive(Deserialize)]
struct Payload {
    ids: Vec<MsgId>,
}

/// A PENDING event younger than this is the immediate fan-out at work (its SENT mark
/// follows within `outbox.sent_mark_linger_ms`); an older one was left by a worker that
/// died before fanning it out.
const IN_FLIGHT_MS: u64 = 1_000;

/// Adds to `script` the read of the outbox events that may be unfinished fan-outs: not
/// SENT, and PENDING ones only once older than [`IN_FLIGHT_MS`]. Their rows go to
/// [`lowest_unfinished`].
pub fn suspects(script: &mut Script) {
    script.push(
        "SELECT id, payload FROM outbox_events WHERE status IN ('SENDING', 'FAILED', 'DEAD') \
         OR (status = 'PENDING' AND created_at < ",
    );
    script.int(now_ms().saturating_sub(IN_FLIGHT_MS)).push(")");
}

/// The lowest `seq` with an unfinished fan-out, per conversation of `convs` that has
/// one, from the rows of [`suspects`]. Redis unreachable: every event not SENT counts
/// as unfinished (a position held back a little longer, never one claimed too early).
pub async fn lowest_unfinished(
    conn: &mut MySqlConnection,
    redis: &Pool,
    keys: &Keys,
    suspects: Vec<MySqlRow>,
    convs: &BTreeSet<(&str, &str)>,
) -> Result<HashMap<(String, String), u64>, sqlx::Error> {
    if convs.is_empty() || suspects.is_empty() {
        return Ok(HashMap::new());
    }
    let mut events = Vec::with_capacity(suspects.len());
    for r in &suspects {
        let payload: Payload = serde_json::from_str(&r.text(1)?).unwrap_or(Payload { ids: Vec::new() });
        events.push((r.try_get::<u64, _>(0)?, payload.ids));
    }
    let finished = finished(redis, keys, events.iter().map(|(id, _)| *id)).await;
    let ids: Vec<MsgId> =
        events.into_iter().zip(finished).filter(|(_, done)| !done).flat_map(|((_, ids), _)| ids).collect();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let pairs: Vec<(&str, &str)> = convs.iter().copied().collect();
    let mut lowest = HashMap::new();
    for chunk in ids.chunks(1_000) {
        let mut q = Script::default();
        q.push("SELECT tenant_id, conv_id, MIN(seq) FROM messages WHERE id IN (");
        for (i, id) in chunk.iter().enumerate() {
            q.push(if i > 0 { ", " } else { "" }).int(id.0);
        }
        q.push(") AND ").pairs("tenant_id", "conv_id", &pairs).push(" GROUP BY tenant_id, conv_id");
        for (rows, _) in q.run(&mut *conn).await? {
            for r in rows {
                let seq: u64 = r.try_get(2)?;
                let low = lowest.entry((r.text(0)?, r.text(1)?)).or_insert(seq);
                *low = (*low).min(seq);
            }
        }
    }
    Ok(lowest)
}

/// Whether each event's fan-out left its finished marker (false when Redis cannot say).
async fn finished(redis: &Pool, keys: &Keys, events: impl Iterator<Item = u64>) -> Vec<bool> {
    let events: Vec<u64> = events.collect();
    let pipe = redis.next().pipeline();
    for e in &events {
        if pipe.exists::<(), _>(keys.fanned_out(*e)).await.is_err() {
            return vec![false; events.len()];
        }
    }
    match pipe.all::<Vec<i64>>().await {
        Ok(found) if found.len() == events.len() => found.into_iter().map(|n| n == 1).collect(),
        _ => vec![false; events.len()],
    }
}
