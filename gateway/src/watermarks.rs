//! Device watermarks on their way to MySQL: sessions report them, one flusher writes
//! them in batches (a watermark only moves forward).

use std::sync::Arc;
use std::time::Duration;

use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::DeviceKey;
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder};
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
        // 4 placeholders a row: stay far below MySQL's 65 535 per statement. Only rows that
        // exist are updated: a report queued before its device logged out must not bring
        // the device back. A device in use that was expired meanwhile is live again.
        for chunk in batch.chunks(WATERMARK_CHUNK) {
            let mut q = QueryBuilder::<MySql>::new("UPDATE devices d JOIN (");
            for (i, m) in chunk.iter().enumerate() {
                q.push(if i == 0 { "SELECT " } else { " UNION ALL SELECT " });
                q.push_bind(&m.device.tenant)
                    .push(" AS t, ")
                    .push_bind(&m.device.user)
                    .push(" AS u, ")
                    .push_bind(&m.device.device)
                    .push(" AS dv, ")
                    .push_bind(m.watermark.0)
                    .push(" AS w");
            }
            q.push(") v ON d.tenant_id = v.t AND d.user_id = v.u AND d.device_id = v.dv ");
            q.push("SET d.watermark = GREATEST(d.watermark, v.w), d.expired_at = NULL, d.last_seen_at = ");
            q.push_bind(now);
            // Not kept prepared: the text differs with every batch size, and each
            // connection would keep a statement of every size it saw (sqlx's cache and
            // the server's), memory that grows with session churn.
            match q.build().persistent(false).execute(&self.db).await {
                Ok(_) => {
                    metrics::counter!("herald_watermark_flushes_total").increment(1);
                    metrics::counter!("herald_watermark_rows_total").increment(chunk.len() as u64);
                }
                Err(e) => {
                    tracing::warn!(error = %e, devices = chunk.len(), "watermark flush failed; sessions report again")
                }
            }
        }
    }
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

    fn mark(i: u64) -> Mark {
        Mark { device: DeviceKey::new("t", format!("u{i}"), "d"), watermark: MsgId(i) }
    }
}
