//! The transactional outbox: what guarantees that every committed batch is fanned out.
//!
//! A row is written with its batch (PENDING, due `first_retry_delay_ms` ahead). The
//! post-commit path dispatches at once and marks it SENT, or FAILED with the first
//! backoff. The [`OutboxDispatcher`] loop claims due rows with `FOR UPDATE SKIP LOCKED`
//! (so every worker may run it), plus SENDING rows whose claimer vanished, and moves
//! them to SENT, FAILED (next backoff) or DEAD. `retry_count` counts failed attempts;
//! after `max_attempts` failed retries the row is DEAD and waits for an operator.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use herald_shared::config::OutboxConfig;
use herald_shared::db::TextColumns;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::DeviceKey;
use serde::{Deserialize, Serialize};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder, Row};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::fanout::Fanout;

#[derive(Debug, Serialize, Deserialize)]
pub struct Payload {
    pub ids: Vec<MsgId>,
}

#[derive(Debug, Serialize)]
pub struct OutboxEvent {
    pub id: u64,
    pub kind: String,
    pub status: String,
    pub retry_count: u32,
    pub next_retry_at: i64,
    pub claimed_at: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub message_ids: Vec<MsgId>,
}

#[derive(Debug)]
pub struct Outbox {
    db: MySqlPool,
    cfg: OutboxConfig,
    /// Wakes the dispatcher early (an operator's retry).
    pub wake: Notify,
}

impl Outbox {
    pub fn new(db: MySqlPool, cfg: OutboxConfig) -> Self {
        Outbox { db, cfg, wake: Notify::new() }
    }

    fn backoff_ms(&self, failures: u32) -> u64 {
        let i = (failures.max(1) - 1) as usize;
        *self.cfg.backoff_ms.get(i).or(self.cfg.backoff_ms.last()).unwrap_or(&5_000)
    }

    /// Marks events SENT in one statement.
    pub async fn mark_sent(&self, ids: &[u64]) -> Result<(), sqlx::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE outbox_events SET status = 'SENT', claimed_at = NULL, last_error = NULL, updated_at = ",
        );
        q.push_bind(now_ms() as i64).push(" WHERE id IN (");
        let mut sep = q.separated(", ");
        for id in ids {
            sep.push_bind(*id);
        }
        q.push(")");
        q.build().execute(&self.db).await?;
        metrics::counter!("herald_outbox_events_total", "status" => "SENT").increment(ids.len() as u64);
        Ok(())
    }

    /// Records a failed attempt; `previous_failures` is the row's retry_count before it.
    /// `done`: the devices that got their entries all the same, kept with the event so
    /// that its redo skips them.
    pub async fn mark_failed(
        &self,
        id: u64,
        previous_failures: u32,
        error: &str,
        done: &[DeviceKey],
    ) -> Result<(), sqlx::Error> {
        let failures = previous_failures + 1;
        let now = now_ms();
        let (status, next) =
            if failures > self.cfg.max_attempts { ("DEAD", now) } else { ("FAILED", now + self.backoff_ms(failures)) };
        let error: String = error.chars().take(500).collect();
        let done: String = done.iter().map(|d| serde_json::to_string(d).expect("serializes") + "\n").collect();
        sqlx::query(
            "UPDATE outbox_events SET status = ?, retry_count = ?, next_retry_at = ?, claimed_at = NULL, last_error = ?, \
             updated_at = ?, done_devices = IF(? = '', done_devices, CONCAT(COALESCE(done_devices, ''), ?)) WHERE id = ?",
        )
            .bind(status)
            .bind(failures)
            .bind(next as i64)
            .bind(&error)
            .bind(now as i64)
            .bind(&done)
            .bind(&done)
            .bind(id)
            .execute(&self.db)
            .await?;
        metrics::counter!("herald_outbox_events_total", "status" => status).increment(1);
        if status == "DEAD" {
            metrics::counter!("herald_outbox_dead_total").increment(1);
            tracing::error!(event = id, failures, "outbox event is DEAD; retry it through the admin API");
        } else {
            tracing::warn!(event = id, failures, error = %error, "outbox dispatch failed; will retry");
        }
        Ok(())
    }

    /// Claims due rows: PENDING/FAILED past their time, and SENDING rows gone stale; each
    /// with the devices an earlier attempt gave their entries.
    async fn claim(&self) -> Result<Vec<Claimed>, sqlx::Error> {
        let now = now_ms() as i64;
        let mut tx = self.db.begin().await?;
        let rows = sqlx::query(
            "SELECT id, retry_count, payload, done_devices FROM outbox_events \
             WHERE (status IN ('PENDING', 'FAILED') AND next_retry_at <= ?) OR (status = 'SENDING' AND claimed_at < ?) \
             ORDER BY next_retry_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(now)
        .bind(now - self.cfg.sending_stale_ms as i64)
        .bind(self.cfg.claim_batch)
        .fetch_all(&mut *tx)
        .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for r in &rows {
            let payload: String = r.text(2)?;
            let payload = serde_json::from_str(&payload).unwrap_or(Payload { ids: Vec::new() });
            let done = done_devices(r.opt_text(3)?.as_deref().unwrap_or(""));
            claimed.push((r.try_get::<u64, _>(0)?, r.try_get::<u32, _>(1)?, payload, done));
        }
        if !claimed.is_empty() {
            let mut q = QueryBuilder::<MySql>::new("UPDATE outbox_events SET status = 'SENDING', claimed_at = ");
            q.push_bind(now).push(", updated_at = ").push_bind(now).push(" WHERE id IN (");
            let mut sep = q.separated(", ");
            for (id, _, _, _) in &claimed {
                sep.push_bind(*id);
            }
            q.push(")");
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// Deletes SENT rows older than the retention, `purge_batch` at a time (short locks)
    /// until none is left or `budget` is spent: it keeps up with the rate rows are created.
    async fn purge(&self, budget: Duration) -> Result<u64, sqlx::Error> {
        let cutoff = now_ms() as i64 - (self.cfg.sent_retention_s * 1000) as i64;
        let started = std::time::Instant::now();
        let mut purged = 0;
        loop {
            let r = sqlx::query("DELETE FROM outbox_events WHERE status = 'SENT' AND updated_at < ? LIMIT ?")
                .bind(cutoff)
                .bind(self.cfg.purge_batch)
                .execute(&self.db)
                .await?;
            purged += r.rows_affected();
            if r.rows_affected() < u64::from(self.cfg.purge_batch) || started.elapsed() >= budget {
                metrics::counter!("herald_outbox_purged_total").increment(purged);
                return Ok(purged);
            }
        }
    }

    pub async fn list(&self, status: &str, limit: u32) -> Result<Vec<OutboxEvent>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, kind, status, retry_count, next_retry_at, claimed_at, last_error, created_at, updated_at, payload \
             FROM outbox_events WHERE status = ? ORDER BY id LIMIT ?",
        )
        .bind(status)
        .bind(limit)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(row_to_event).collect()
    }

    pub async fn get(&self, id: u64) -> Result<Option<OutboxEvent>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT id, kind, status, retry_count, next_retry_at, claimed_at, last_error, created_at, updated_at, payload \
             FROM outbox_events WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.db)
        .await?;
        row.as_ref().map(row_to_event).transpose()
    }

    /// An operator's retry of a DEAD (or FAILED) event: due now, attempts reset.
    pub async fn retry(&self, id: u64) -> Result<bool, sqlx::Error> {
        let now = now_ms() as i64;
        let r = sqlx::query(
            "UPDATE outbox_events SET status = 'PENDING', retry_count = 0, next_retry_at = ?, updated_at = ? WHERE id = ? AND status IN ('DEAD', 'FAILED')",
        )
        .bind(now)
        .bind(now)
        .bind(id)
        .execute(&self.db)
        .await?;
        self.wake.notify_one();
        Ok(r.rows_affected() == 1)
    }

    /// An operator's discard of a DEAD event.
    pub async fn discard(&self, id: u64) -> Result<bool, sqlx::Error> {
        let r = sqlx::query("DELETE FROM outbox_events WHERE id = ? AND status = 'DEAD'")
            .bind(id)
            .execute(&self.db)
            .await?;
        if r.rows_affected() == 1 {
            tracing::warn!(event = id, "DEAD outbox event discarded by an operator");
        }
        Ok(r.rows_affected() == 1)
    }

    /// Age of the oldest event not yet SENT (0 when there is none), for alerting.
    pub async fn oldest_unfinished_age_s(&self) -> Result<f64, sqlx::Error> {
        let oldest: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(created_at) FROM outbox_events WHERE status IN ('PENDING', 'SENDING', 'FAILED')",
        )
        .fetch_one(&self.db)
        .await?;
        Ok(oldest.map_or(0.0, |t| (now_ms() as i64 - t).max(0) as f64 / 1000.0))
    }

    /// Rows of one status, for the metrics gauge: an index range, not a table scan.
    pub async fn count(&self, status: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events WHERE status = ?").bind(status).fetch_one(&self.db).await
    }
}

/// A claimed event: id, failed attempts, payload, the devices already done.
type Claimed = (u64, u32, Payload, HashSet<DeviceKey>);

/// The `done_devices` column: a JSON device key a line (an unreadable line is skipped:
/// that device gets its entries again, a repeat and never a loss).
fn done_devices(text: &str) -> HashSet<DeviceKey> {
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn row_to_event(r: &sqlx::mysql::MySqlRow) -> Result<OutboxEvent, sqlx::Error> {
    let payload: String = r.text(9)?;
    Ok(OutboxEvent {
        id: r.try_get(0)?,
        kind: r.text(1)?,
        status: r.text(2)?,
        retry_count: r.try_get(3)?,
        next_retry_at: r.try_get(4)?,
        claimed_at: r.try_get(5)?,
        last_error: r.opt_text(6)?,
        created_at: r.try_get(7)?,
        updated_at: r.try_get(8)?,
        message_ids: serde_json::from_str::<Payload>(&payload).map(|p| p.ids).unwrap_or_default(),
    })
}

/// The periodic loop that finishes what the immediate dispatch did not.
#[derive(Clone, Debug)]
pub struct OutboxDispatcher {
    pub outbox: Arc<Outbox>,
    pub fanout: Arc<Fanout>,
    pub fixed_delay: Duration,
}

impl OutboxDispatcher {
    pub async fn run(self, cancel: CancellationToken) {
        let mut rounds: u64 = 0;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.fixed_delay) => {}
                _ = self.outbox.wake.notified() => {}
            }
            if let Err(e) = self.round().await {
                metrics::counter!("herald_mysql_errors_total").increment(1);
                tracing::warn!(error = %e, "outbox dispatcher round failed");
            }
            rounds += 1;
            // Every round: the purge must keep up with batches, not fall behind them.
            match self.outbox.purge(self.fixed_delay / 2).await {
                Ok(n) if n > 0 => tracing::debug!(purged = n, "old SENT outbox rows purged"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "outbox purge failed"),
            }
            if rounds.is_multiple_of(10) {
                if let Ok(age) = self.outbox.oldest_unfinished_age_s().await {
                    metrics::gauge!("herald_outbox_oldest_unfinished_seconds").set(age);
                }
                for status in ["PENDING", "SENDING", "SENT", "FAILED", "DEAD"] {
                    if let Ok(n) = self.outbox.count(status).await {
                        metrics::gauge!("herald_outbox_rows", "status" => status).set(n as f64);
                    }
                }
            }
        }
    }

    async fn round(&self) -> Result<(), sqlx::Error> {
        loop {
            let claimed = self.outbox.claim().await?;
            let full = claimed.len() as u32 >= self.outbox.cfg.claim_batch;
            for (id, failures, payload, done) in claimed {
                // A fan-out that finished (its SENT mark was lost) is not done again: its
                // devices may have acked since, and acked ids never come back.
                if self.fanout.is_done(id).await.unwrap_or(false) {
                    metrics::counter!("herald_outbox_redo_skipped_total").increment(1);
                    self.outbox.mark_sent(&[id]).await?;
                    continue;
                }
                let result = match self.fanout.load(&payload.ids).await {
                    Ok(msgs) => {
                        self.fanout.deliver(&msgs, id, &done).await.map_err(|e| (e.to_string(), e.done().to_vec()))
                    }
                    Err(e) => Err((e.to_string(), Vec::new())),
                };
                match result {
                    Ok(()) => self.outbox.mark_sent(&[id]).await?,
                    Err((e, done)) => self.outbox.mark_failed(id, failures, &e, &done).await?,
                }
            }
            if !full {
                return Ok(());
            }
        }
    }
}

/// Marks immediately dispatched events SENT in batches: one UPDATE (and one fsync) for
/// every event finished since the last one, instead of one per committed batch. An event
/// whose mark is lost (crash, MySQL error) stays PENDING and the dispatcher fans it out
/// again: harmless, fan-out is idempotent.
#[derive(Clone, Debug)]
pub struct SentMarker {
    pub outbox: Arc<Outbox>,
    /// Outlives a restart of the loop: marks queued meanwhile are not lost.
    pub rx: Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<u64>>>,
    /// How long marks gather before one UPDATE (`outbox.sent_mark_linger_ms`).
    pub linger: std::time::Duration,
}

impl SentMarker {
    /// Most ids in one UPDATE.
    const MAX_IDS: usize = 1_000;

    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let mut ids = Vec::with_capacity(Self::MAX_IDS);
        loop {
            let first = tokio::select! {
                _ = cancel.cancelled() => None,
                id = rx.recv() => id,
            };
            let Some(first) = first else { break };
            ids.push(first);
            // The marks of the next fan-outs join this one's UPDATE (off the send path:
            // the senders were answered at COMMIT).
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(self.linger) => {}
            }
            while ids.len() < Self::MAX_IDS {
                match rx.try_recv() {
                    Ok(id) => ids.push(id),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.outbox.mark_sent(&ids).await {
                tracing::warn!(error = %e, events = ids.len(), "could not mark outbox events SENT; the dispatcher will redo them");
            }
            ids.clear();
        }
        // Whatever is still queued at shutdown.
        while let Ok(id) = rx.try_recv() {
            ids.push(id);
        }
        let _ = self.outbox.mark_sent(&ids).await;
    }
}
