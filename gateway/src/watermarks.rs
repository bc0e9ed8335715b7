//! Device watermarks on their way to MySQL: sessions report them, one flusher writes
//! them in batches (a watermark only moves forward).

use std::sync::Arc;
use std::time::Duration;

use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::DeviceKey;
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder, Row};
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

/// One device's watermark report.
#[derive(Debug)]
pub struct Mark {
    pub device: DeviceKey,
    pub watermark: MsgId,
}

/// Where sessions report watermarks. A full queue only delays W: the session reports
/// again at its next flush period.
#[derive(Clone, Debug)]
pub struct Marks(mpsc::Sender<Mark>);

impl Marks {
    pub fn report(&self, mark: Mark) {
        let _ = self.0.try_send(mark);
    }
}

/// Devices per watermark upsert statement.
const WATERMARK_CHUNK: usize = 1_000;

/// Sized for a flush period's reports of many sessions.
const QUEUE: usize = 65_536;

/// The flusher: restartable, its queue outlives a restart.
#[derive(Clone, Debug)]
pub struct WatermarkFlusher {
    db: MySqlPool,
    rx: Arc<Mutex<mpsc::Receiver<Mark>>>,
}

/// A report queue and the flusher that drains it.
pub fn channel(db: MySqlPool) -> (Marks, WatermarkFlusher) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Marks(tx), WatermarkFlusher { db, rx: Arc::new(Mutex::new(rx)) })
}

impl WatermarkFlusher {
    /// Writes what arrives, in batches, until `cancel`; then what is still queued.
    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let mut batch: Vec<Mark> = Vec::new();
        loop {
            let closing = tokio::select! {
                _ = cancel.cancelled() => true,
                m = rx.recv() => match m { Some(m) => { batch.push(m); false } None => true },
            };
            while let Ok(m) = rx.try_recv() {
                batch.push(m);
            }
            if !batch.is_empty() {
                self.write(&batch).await;
                batch.clear();
            }
            if closing {
                return;
            }
            // Batch what arrives in the next moment.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn write(&self, batch: &[Mark]) {
        let now = now_ms() as i64;
        // 4 placeholders a row: stay far below MySQL's 65 535 per statement.
        for chunk in batch.chunks(WATERMARK_CHUNK) {
            match self.write_chunk(chunk, now).await {
                Ok(()) => {
                    metrics::counter!("herald_watermark_flushes_total").increment(1);
                    metrics::counter!("herald_watermark_rows_total").increment(chunk.len() as u64);
                }
                Err(e) => {
                    tracing::warn!(error = %e, devices = chunk.len(), "watermark flush failed; sessions report again")
                }
            }
        }
    }

    /// Only rows that exist are updated: a report queued before its device logged out
    /// must not bring the device back. A device in use that was expired meanwhile is
    /// live again, a change of its tenant's recipients: its rows are locked first (so
    /// the janitor cannot expire one in between), and the tenants of those found
    /// expired get their device epoch raised in the same transaction.
    async fn write_chunk(&self, chunk: &[Mark], now: i64) -> Result<(), sqlx::Error> {
        let mut tx = self.db.begin().await?;
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT CAST(d.tenant_id AS CHAR), d.expired_at IS NOT NULL FROM devices d JOIN ",
        );
        reports(&mut q, chunk, false);
        q.push(" FOR UPDATE");
        // Not kept prepared: the text differs with every batch size, and each
        // connection would keep a statement of every size it saw (sqlx's cache and
        // the server's), memory that grows with session churn.
        let rows = q.build().persistent(false).fetch_all(&mut *tx).await?;
        let mut back = Vec::new();
        for r in &rows {
            if r.try_get::<i64, _>(1)? == 1 {
                back.push(r.try_get::<String, _>(0)?);
            }
        }
        let mut q = QueryBuilder::<MySql>::new("UPDATE devices d JOIN ");
        reports(&mut q, chunk, true);
        q.push(" SET d.watermark = GREATEST(d.watermark, v.w), d.expired_at = NULL, d.last_seen_at = ");
        q.push_bind(now);
        q.build().persistent(false).execute(&mut *tx).await?;
        herald_shared::device_epochs::raise(&mut tx, back.iter().map(String::as_str)).await?;
        tx.commit().await
    }
}

/// The reports as a derived table `v` (t, u, dv and, `with_watermarks`, w) joined to
/// their rows of `devices d`.
fn reports<'a>(q: &mut QueryBuilder<'a, MySql>, chunk: &'a [Mark], with_watermarks: bool) {
    q.push("(");
    for (i, m) in chunk.iter().enumerate() {
        q.push(if i == 0 { "SELECT " } else { " UNION ALL SELECT " });
        q.push_bind(&m.device.tenant).push(" AS t, ").push_bind(&m.device.user).push(" AS u, ");
        q.push_bind(&m.device.device).push(" AS dv");
        if with_watermarks {
            q.push(", ").push_bind(m.watermark.0).push(" AS w");
        }
    }
    q.push(") v ON d.tenant_id = v.t AND d.user_id = v.u AND d.device_id = v.dv");
}

#[cfg(test)]
mod tests {
    use herald_shared::db::ScratchDb;
    use sqlx::Connection;

    use super::*;

    /// One flusher statement per batch size must not stay prepared: sessions end in
    /// batches of every size, and each connection would keep (client and server side) a
    /// statement of each size it ever saw, up to sqlx's 100 per connection.
    #[tokio::test]
    async fn batches_of_every_size_leave_no_statements_prepared() {
        let scratch = ScratchDb::create("marks").await.expect("a fresh schema");
        // One connection: every batch goes through it.
        let db = herald_shared::db::pool(&scratch.url, 1, None).expect("pool");
        let (_marks, flusher) = channel(db.clone());
        let cached = || async { db.acquire().await.expect("the connection").cached_statements_size() };
        flusher.write(&[mark(0)]).await;
        let before = cached().await;
        for size in 2..=12 {
            flusher.write(&(0..size).map(mark).collect::<Vec<_>>()).await;
        }
        let after = cached().await;
        db.close().await;
        scratch.remove().await;
        assert_eq!(after, before, "a statement stayed prepared for each batch size");
    }

    /// A report of a device the janitor expired brings it back in the same transaction
    /// as its tenant's device epoch (a worker's cached recipients lack it); reports of
    /// live devices leave the epoch alone.
    #[tokio::test]
    async fn a_report_that_brings_an_expired_device_back_raises_its_tenants_epoch() {
        let scratch = ScratchDb::create("marksback").await.expect("a fresh schema");
        let db = herald_shared::db::pool(&scratch.url, 2, None).expect("pool");
        sqlx::query(
            "INSERT INTO devices (tenant_id, user_id, device_id, platform, watermark, registered_at, last_seen_at, expired_at) \
             VALUES ('t', 'u0', 'd', 'web', 0, 1, 1, 5), ('t', 'u1', 'd', 'web', 0, 1, 1, NULL), ('t2', 'u2', 'd', 'web', 0, 1, 1, NULL)",
        )
        .execute(&db)
        .await
        .expect("devices");
        let epoch = |tenant: &'static str| {
            let db = db.clone();
            async move {
                sqlx::query_scalar::<_, u64>("SELECT epoch FROM device_epochs WHERE tenant_id = ?")
                    .bind(tenant)
                    .fetch_optional(&db)
                    .await
                    .expect("epoch")
            }
        };
        let (_marks, flusher) = channel(db.clone());
        flusher.write(&[mark(1), mark(2)]).await;
        assert_eq!((epoch("t").await, epoch("t2").await), (None, None), "live devices change no recipients");
        flusher.write(&[mark(0), mark(1), mark(2)]).await;
        assert_eq!((epoch("t").await, epoch("t2").await), (Some(1), None), "the expired device's tenant only");
        let expired: Option<i64> = sqlx::query_scalar("SELECT expired_at FROM devices WHERE user_id = 'u0'")
            .fetch_one(&db)
            .await
            .expect("row");
        assert_eq!(expired, None, "the device is live again");
        flusher.write(&[mark(0)]).await;
        assert_eq!(epoch("t").await, Some(1), "a device already back raises nothing");
        db.close().await;
        scratch.remove().await;
    }

    fn mark(i: u64) -> Mark {
        let tenant = if i == 2 { "t2" } else { "t" };
        Mark { device: DeviceKey::new(tenant, format!("u{i}"), "d"), watermark: MsgId(i) }
    }
}
