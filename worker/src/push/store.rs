//! The `push_notifications` table: one row per device and conversation. A row waiting
//! (PENDING, FAILED) or being sent (SENDING) absorbs later messages of its conversation
//! (count, latest message); a delivered (SENT) or given up (DEAD) row starts over with
//! the next message. Claims use `FOR UPDATE SKIP LOCKED`, so every worker dispatches.

use std::collections::HashMap;

use herald_shared::db::TextColumns;
use herald_shared::ids::{now_ms, MsgId};
use serde::Serialize;
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{MySql, QueryBuilder, Row};

use super::schedule::Target;

/// A notification's messages: how many, and the latest with its sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collapsed {
    pub id: MsgId,
    pub sender: String,
    pub count: u32,
}

/// A claimed row, to be sent.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub row: u64,
    pub tenant: String,
    pub user: String,
    pub device: String,
    pub conv: String,
    pub msg: Collapsed,
    /// Failed attempts so far.
    pub failures: u32,
    /// When this notification began (a delivered row that starts over begins again).
    pub created_at: i64,
}

impl Claimed {
    /// The notification's id as the webhook sees it: the same over its retries, a new
    /// one for the next notification of the same device and conversation.
    pub fn key(&self) -> String {
        format!("{}-{}", self.row, self.created_at)
    }
}

/// A row as the admin API shows it.
#[derive(Debug, Serialize)]
pub struct Notification {
    pub id: u64,
    pub tenant: String,
    pub user: String,
    pub device: String,
    pub conv: String,
    pub msg_id: String,
    pub sender: String,
    pub count: u32,
    pub status: String,
    pub retry_count: u32,
    pub next_retry_at: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A device's push registration.
#[derive(Clone, Debug)]
pub struct Registration {
    pub platform: String,
    pub token: String,
}

#[derive(Debug)]
pub struct PushStore {
    pub db: MySqlPool,
    pub backoff_ms: Vec<u64>,
    pub max_attempts: u32,
    pub claim_batch: u32,
    /// A SENDING row claimed longer ago than this is taken again.
    pub sending_stale_ms: u64,
}

const REVIVE: &str = "status IN ('SENT', 'DEAD')";

impl PushStore {
    /// Records notifications due now, each collapsing into its target's row. Rows are
    /// written in key order, so two workers' statements never deadlock.
    pub async fn upsert(&self, rows: &[(Target, Collapsed)]) -> Result<(), sqlx::Error> {
        let now = now_ms() as i64;
        let mut sorted: Vec<&(Target, Collapsed)> = rows.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        for chunk in sorted.chunks(500) {
            let mut q = QueryBuilder::<MySql>::new(
                "INSERT INTO push_notifications (tenant_id, user_id, device_id, conv_id, msg_id, sender_id, count, \
                 status, retry_count, next_retry_at, created_at, updated_at) ",
            );
            q.push_values(chunk, |mut b, ((t, u, d, c), w)| {
                b.push_bind(t).push_bind(u).push_bind(d).push_bind(c).push_bind(w.id.0).push_bind(&w.sender);
                b.push_bind(w.count).push("'PENDING'").push("0").push_bind(now).push_bind(now).push_bind(now);
            });
            // MySQL applies these in order, each seeing the columns set before it: the
            // status, which every other one reads, goes last.
            q.push(format!(
                " ON DUPLICATE KEY UPDATE \
                 sender_id = IF({REVIVE} OR VALUES(msg_id) > msg_id, VALUES(sender_id), sender_id), \
                 msg_id = IF({REVIVE}, VALUES(msg_id), GREATEST(msg_id, VALUES(msg_id))), \
                 count = IF({REVIVE}, VALUES(count), count + VALUES(count)), \
                 retry_count = IF({REVIVE}, 0, retry_count), \
                 next_retry_at = IF({REVIVE}, VALUES(next_retry_at), next_retry_at), \
                 last_error = IF({REVIVE}, NULL, last_error), \
                 created_at = IF({REVIVE}, GREATEST(created_at + 1, VALUES(created_at)), created_at), \
                 updated_at = VALUES(updated_at), \
                 status = IF({REVIVE}, 'PENDING', status)"
            ));
            q.build().execute(&self.db).await?;
        }
        Ok(())
    }

    /// Claims due rows: PENDING and FAILED past their time, SENDING gone stale.
    pub async fn claim(&self) -> Result<Vec<Claimed>, sqlx::Error> {
        let now = now_ms() as i64;
        let mut tx = self.db.begin().await?;
        let rows = sqlx::query(
            "SELECT id, tenant_id, user_id, device_id, conv_id, msg_id, sender_id, count, retry_count, created_at \
             FROM push_notifications \
             WHERE (status IN ('PENDING', 'FAILED') AND next_retry_at <= ?) OR (status = 'SENDING' AND claimed_at < ?) \
             ORDER BY next_retry_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(now)
        .bind(now - self.sending_stale_ms as i64)
        .bind(self.claim_batch)
        .fetch_all(&mut *tx)
        .await?;
        let claimed: Vec<Claimed> = rows.iter().map(claimed).collect::<Result<_, _>>()?;
        if !claimed.is_empty() {
            let mut q = QueryBuilder::<MySql>::new("UPDATE push_notifications SET status = 'SENDING', claimed_at = ");
            q.push_bind(now).push(", updated_at = ").push_bind(now).push(" WHERE id IN (");
            let mut sep = q.separated(", ");
            for c in &claimed {
                sep.push_bind(c.row);
            }
            q.push(")");
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// The webhook took the notification. A message that joined the row meanwhile
    /// makes it due again with what is left to tell.
    pub async fn delivered(&self, c: &Claimed) -> Result<(), sqlx::Error> {
        let now = now_ms() as i64;
        let done = sqlx::query(
            "UPDATE push_notifications SET status = 'SENT', claimed_at = NULL, last_error = NULL, updated_at = ? \
             WHERE id = ? AND status = 'SENDING' AND msg_id = ?",
        )
        .bind(now)
        .bind(c.row)
        .bind(c.msg.id.0)
        .execute(&self.db)
        .await?;
        if done.rows_affected() == 0 {
            self.again(c, Some(c.msg.count)).await?;
        }
        Ok(())
    }

    /// Nothing to send: the device acked the message, or has no push token any more.
    pub async fn quiet(&self, c: &Claimed) -> Result<(), sqlx::Error> {
        let done = sqlx::query("DELETE FROM push_notifications WHERE id = ? AND status = 'SENDING' AND msg_id = ?")
            .bind(c.row)
            .bind(c.msg.id.0)
            .execute(&self.db)
            .await?;
        if done.rows_affected() == 0 {
            // A newer message joined: it is checked on its own.
            self.again(c, None).await?;
        }
        Ok(())
    }

    /// A claimed row whose latest message changed while it was claimed: due now, with
    /// `told` messages (the ones just sent) taken off its count. After a delivery
    /// (`told`), what is left is a new notification: it begins now, so its id (row and
    /// beginning, [`Claimed::key`]) is not the one the webhook just took, which a receiver
    /// deduplicating by id would drop. A notification that was not sent keeps its id.
    async fn again(&self, c: &Claimed, told: Option<u32>) -> Result<(), sqlx::Error> {
        let now = now_ms() as i64;
        let begins = if told.is_some() { ", created_at = GREATEST(created_at + 1, ?)" } else { "" };
        let sql = format!(
            "UPDATE push_notifications SET status = 'PENDING', count = GREATEST(CAST(count AS SIGNED) - ?, 1), \
             retry_count = 0, next_retry_at = ?, claimed_at = NULL, updated_at = ?{begins} \
             WHERE id = ? AND status = 'SENDING'"
        );
        let mut q = sqlx::query(&sql).bind(told.unwrap_or(0)).bind(now).bind(now);
        if told.is_some() {
            q = q.bind(now);
        }
        q.bind(c.row).execute(&self.db).await?;
        Ok(())
    }

    /// A failed attempt: FAILED with the next backoff, DEAD past `push.max_attempts`.
    /// Answers whether it is DEAD.
    pub async fn failed(&self, c: &Claimed, error: &str) -> Result<bool, sqlx::Error> {
        let failures = c.failures + 1;
        let now = now_ms();
        let dead = failures > self.max_attempts;
        let next = if dead { now } else { now + backoff_ms(&self.backoff_ms, failures) };
        let error: String = error.chars().take(500).collect();
        sqlx::query(
            "UPDATE push_notifications SET status = ?, retry_count = ?, next_retry_at = ?, claimed_at = NULL, \
             last_error = ?, updated_at = ? WHERE id = ?",
        )
        .bind(if dead { "DEAD" } else { "FAILED" })
        .bind(failures)
        .bind(next as i64)
        .bind(error)
        .bind(now as i64)
        .bind(c.row)
        .execute(&self.db)
        .await?;
        Ok(dead)
    }

    /// The push registrations of the claimed rows' devices.
    pub async fn registrations(
        &self,
        claimed: &[Claimed],
    ) -> Result<HashMap<(String, String, String), Registration>, sqlx::Error> {
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT tenant_id, user_id, device_id, push_platform, push_token FROM devices \
             WHERE push_token IS NOT NULL AND (",
        );
        for (n, c) in claimed.iter().enumerate() {
            q.push(if n > 0 { " OR (tenant_id = " } else { "(tenant_id = " }).push_bind(&c.tenant);
            q.push(" AND user_id = ").push_bind(&c.user).push(" AND device_id = ").push_bind(&c.device).push(")");
        }
        q.push(")");
        let rows = q.build().fetch_all(&self.db).await?;
        rows.iter()
            .map(|r| {
                Ok(((r.text(0)?, r.text(1)?, r.text(2)?), Registration { platform: r.text(3)?, token: r.text(4)? }))
            })
            .collect()
    }

    /// Each user's unread total (the badge): over the conversations the user is a
    /// member of, `last_seq - read_seq`.
    pub async fn badges(&self, users: &[(&str, &str)]) -> Result<HashMap<(String, String), u64>, sqlx::Error> {
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT m.tenant_id, m.user_id, \
             CAST(SUM(GREATEST(CAST(c.last_seq AS SIGNED) - CAST(m.read_seq AS SIGNED), 0)) AS SIGNED) \
             FROM members m JOIN conversations c ON c.tenant_id = m.tenant_id AND c.id = m.conv_id \
             WHERE m.left_seq IS NULL AND ",
        );
        crate::batch::push_pairs(&mut q, "m.tenant_id", "m.user_id", users);
        q.push(" GROUP BY m.tenant_id, m.user_id");
        let rows = q.build().fetch_all(&self.db).await?;
        rows.iter().map(|r| Ok(((r.text(0)?, r.text(1)?), r.try_get::<i64, _>(2)?.max(0) as u64))).collect()
    }

    /// Message bodies, for text previews.
    pub async fn bodies(&self, ids: &[MsgId]) -> Result<HashMap<MsgId, String>, sqlx::Error> {
        let mut q = QueryBuilder::<MySql>::new("SELECT id, body FROM messages WHERE id IN (");
        let mut sep = q.separated(", ");
        for id in ids {
            sep.push_bind(id.0);
        }
        q.push(")");
        let rows = q.build().fetch_all(&self.db).await?;
        rows.iter().map(|r| Ok((MsgId(r.try_get::<u64, _>(0)?), r.text(1)?))).collect()
    }

    /// Deletes SENT rows older than `retention_ms`, a bounded number per call.
    pub async fn purge(&self, retention_ms: u64) -> Result<u64, sqlx::Error> {
        let cutoff = now_ms().saturating_sub(retention_ms) as i64;
        let r = sqlx::query("DELETE FROM push_notifications WHERE status = 'SENT' AND updated_at < ? LIMIT 1000")
            .bind(cutoff)
            .execute(&self.db)
            .await?;
        Ok(r.rows_affected())
    }

    /// Rows of one status, for the admin API.
    pub async fn list(&self, status: &str, limit: u32) -> Result<Vec<Notification>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, tenant_id, user_id, device_id, conv_id, msg_id, sender_id, count, status, retry_count, \
             next_retry_at, last_error, created_at, updated_at FROM push_notifications WHERE status = ? \
             ORDER BY id LIMIT ?",
        )
        .bind(status)
        .bind(limit)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Notification {
                    id: r.try_get(0)?,
                    tenant: r.text(1)?,
                    user: r.text(2)?,
                    device: r.text(3)?,
                    conv: r.text(4)?,
                    msg_id: r.try_get::<u64, _>(5)?.to_string(),
                    sender: r.text(6)?,
                    count: r.try_get(7)?,
                    status: r.text(8)?,
                    retry_count: r.try_get(9)?,
                    next_retry_at: r.try_get(10)?,
                    last_error: r.opt_text(11)?,
                    created_at: r.try_get(12)?,
                    updated_at: r.try_get(13)?,
                })
            })
            .collect()
    }

    /// An operator's retry of a DEAD notification: due now, attempts reset.
    pub async fn retry(&self, id: u64) -> Result<bool, sqlx::Error> {
        let now = now_ms() as i64;
        let r = sqlx::query(
            "UPDATE push_notifications SET status = 'PENDING', retry_count = 0, next_retry_at = ?, updated_at = ? \
             WHERE id = ? AND status = 'DEAD'",
        )
        .bind(now)
        .bind(now)
        .bind(id)
        .execute(&self.db)
        .await?;
        Ok(r.rows_affected() == 1)
    }
}

/// The delay before retry `failures` (1-based); the last one repeats.
pub fn backoff_ms(schedule: &[u64], failures: u32) -> u64 {
    let i = (failures.max(1) - 1) as usize;
    *schedule.get(i).or(schedule.last()).unwrap_or(&5_000)
}

fn claimed(r: &MySqlRow) -> Result<Claimed, sqlx::Error> {
    Ok(Claimed {
        row: r.try_get(0)?,
        tenant: r.text(1)?,
        user: r.text(2)?,
        device: r.text(3)?,
        conv: r.text(4)?,
        msg: Collapsed { id: MsgId(r.try_get::<u64, _>(5)?), sender: r.text(6)?, count: r.try_get(7)? },
        failures: r.try_get(8)?,
        created_at: r.try_get(9)?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_last_backoff_repeats() {
        let schedule = [100, 400];
        assert_eq!(super::backoff_ms(&schedule, 1), 100);
        assert_eq!(super::backoff_ms(&schedule, 2), 400);
        assert_eq!(super::backoff_ms(&schedule, 7), 400);
    }
}
