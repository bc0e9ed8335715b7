//! Where a device's timeline starts in a conversation (`start_seq`, docs/protocol.md
//! section 2.7). A device receives by push (backlog or realtime) every message of its
//! user's conversations committed from its first watermark on: a minute before it
//! registered. A device registered after a conversation had older messages (a new
//! phone of a long-standing member) therefore starts its timeline just below the first
//! message it receives; what is older is history to page back into, not a gap to wait
//! for. Membership (`joined_seq`) may start it later still.

use herald_shared::ids::MsgId;
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder};

/// How far back a new device's watermark starts: its first session reads the messages
/// committed in the minute before it registered.
pub const NEW_DEVICE_LOOKBACK_MS: u64 = 60_000;

/// The first watermark of a device registered at `registered_at` (ms): it receives
/// by push every message with a larger id.
pub fn first_watermark(registered_at: i64) -> MsgId {
    MsgId::lowest_at((registered_at.max(0) as u64).saturating_sub(NEW_DEVICE_LOOKBACK_MS))
}

/// Pushes the seq of the first message of conversation `c` (an alias in the query)
/// with an id above `watermark`: one step down the conversation's id index. Messages of
/// a conversation take ids in the order of their seqs (one shard commits them in turn).
pub fn push_first_pushed_seq(qb: &mut QueryBuilder<'_, MySql>, watermark: MsgId) {
    qb.push("(SELECT x.seq FROM messages x WHERE x.tenant_id = c.tenant_id AND x.conv_id = c.id AND x.id > ")
        .push_bind(watermark.0)
        .push(" ORDER BY x.id LIMIT 1)");
}

/// The device's first watermark, when it is registered.
pub async fn device_watermark(
    db: &MySqlPool,
    tenant: &str,
    user: &str,
    device: &str,
) -> Result<Option<MsgId>, sqlx::Error> {
    let at: Option<i64> =
        sqlx::query_scalar("SELECT registered_at FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?")
            .bind(tenant)
            .bind(user)
            .bind(device)
            .fetch_optional(db)
            .await?;
    Ok(at.map(first_watermark))
}

/// The seq below which the device receives nothing of `conv` by push: just below the
/// first message after its first watermark, or the conversation's `last_seq` when none
/// is (everything after it will be pushed).
pub fn pushed_after(first_pushed: Option<u64>, last_seq: u64) -> u64 {
    first_pushed.map_or(last_seq, |s| s.saturating_sub(1))
}

/// [`pushed_after`] for one conversation; `None` when the device is not registered or
/// the conversation does not exist.
pub async fn device_start(
    db: &MySqlPool,
    tenant: &str,
    user: &str,
    device: &str,
    conv: &str,
) -> Result<Option<u64>, sqlx::Error> {
    let Some(watermark) = device_watermark(db, tenant, user, device).await? else {
        return Ok(None);
    };
    let mut qb = QueryBuilder::<MySql>::new("SELECT c.last_seq, ");
    push_first_pushed_seq(&mut qb, watermark);
    qb.push(" FROM conversations c WHERE c.tenant_id = ").push_bind(tenant).push(" AND c.id = ").push_bind(conv);
    let row: Option<(u64, Option<u64>)> = qb.build_query_as().fetch_optional(db).await?;
    Ok(row.map(|(last_seq, first)| pushed_after(first, last_seq)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_starts_below_the_first_message_it_receives() {
        assert_eq!(pushed_after(Some(95), 100), 94);
        assert_eq!(pushed_after(Some(1), 100), 0, "a device older than the conversation starts at 0");
        assert_eq!(pushed_after(None, 100), 100, "nothing received yet: everything after last_seq will be");
        let w = first_watermark(1_000_000);
        assert_eq!(w, MsgId::lowest_at(1_000_000 - NEW_DEVICE_LOOKBACK_MS));
    }
}
