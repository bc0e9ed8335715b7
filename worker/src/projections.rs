//! `herald-worker rebuild-projections`: the conversation list's numbers are projections
//! of the messages table (`last_seq`, last message, activity, and through them
//! `unread`). This recomputes them, reports every drift found and repairs it, one
//! conversation at a time under its row lock, so it is safe while traffic flows.

use herald_shared::db::TextColumns;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

#[derive(Debug, Default)]
pub struct Report {
    pub conversations: u64,
    pub drifted: Vec<String>,
    pub read_positions_clamped: u64,
}

/// Finds and (unless `dry_run`) fixes drift; prints progress to stderr.
pub async fn rebuild(db: &MySqlPool, dry_run: bool) -> Result<Report, sqlx::Error> {
    let mut report = Report {
        conversations: sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM conversations").fetch_one(db).await? as u64,
        ..Report::default()
    };
    eprintln!("checking {} conversations against their messages ...", report.conversations);
    let rows = sqlx::query(
        "SELECT c.tenant_id, c.id, c.last_seq, c.last_msg_id, s.max_seq, msg.id FROM conversations c \
         LEFT JOIN (SELECT tenant_id, conv_id, MAX(seq) AS max_seq FROM messages GROUP BY tenant_id, conv_id) s \
           ON s.tenant_id = c.tenant_id AND s.conv_id = c.id \
         LEFT JOIN messages msg ON msg.tenant_id = c.tenant_id AND msg.conv_id = c.id AND msg.seq = s.max_seq \
         WHERE c.last_seq <> COALESCE(s.max_seq, 0) OR COALESCE(c.last_msg_id, 0) <> COALESCE(msg.id, 0)",
    )
    .fetch_all(db)
    .await?;
    for (i, r) in rows.iter().enumerate() {
        let (tenant, conv) = (r.text(0)?, r.text(1)?);
        let (last_seq, last_id): (u64, Option<u64>) = (r.try_get(2)?, r.try_get(3)?);
        let (max_seq, max_id): (Option<u64>, Option<u64>) = (r.try_get(4)?, r.try_get(5)?);
        let line = format!(
            "{tenant}/{conv}: last_seq {last_seq} -> {}, last message {} -> {}",
            max_seq.unwrap_or(0),
            last_id.map_or("none".into(), |v| v.to_string()),
            max_id.map_or("none".into(), |v| v.to_string())
        );
        eprintln!("[{}/{}] drift {line}", i + 1, rows.len());
        report.drifted.push(line);
        if dry_run {
            continue;
        }
        let mut tx = db.begin().await?;
        sqlx::query("SELECT last_seq FROM conversations WHERE tenant_id = ? AND id = ? FOR UPDATE")
            .bind(&tenant)
            .bind(&conv)
            .fetch_one(&mut *tx)
            .await?;
        // Recomputed under the lock: a message committed meanwhile is counted.
        let truth = sqlx::query(
            "SELECT seq, id, created_at FROM messages WHERE tenant_id = ? AND conv_id = ? ORDER BY seq DESC LIMIT 1",
        )
        .bind(&tenant)
        .bind(&conv)
        .fetch_optional(&mut *tx)
        .await?;
        let (seq, id, at): (u64, Option<u64>, Option<i64>) = match &truth {
            Some(t) => (t.try_get(0)?, Some(t.try_get(1)?), Some(t.try_get(2)?)),
            None => (0, None, None),
        };
        sqlx::query(
            "UPDATE conversations SET last_seq = ?, last_msg_id = ?, last_active_at = GREATEST(last_active_at, COALESCE(?, 0)) \
             WHERE tenant_id = ? AND id = ?",
        )
        .bind(seq)
        .bind(id)
        .bind(at)
        .bind(&tenant)
        .bind(&conv)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
    }
    let over: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM members m JOIN conversations c ON c.tenant_id = m.tenant_id AND c.id = m.conv_id WHERE m.read_seq > c.last_seq",
    )
    .fetch_one(db)
    .await?;
    report.read_positions_clamped = over as u64;
    if over > 0 {
        eprintln!("{over} read positions beyond their conversation's last_seq");
        if !dry_run {
            sqlx::query(
                "UPDATE members m JOIN conversations c ON c.tenant_id = m.tenant_id AND c.id = m.conv_id \
                 SET m.read_seq = c.last_seq WHERE m.read_seq > c.last_seq",
            )
            .execute(db)
            .await?;
        }
    }
    eprintln!(
        "checked {} conversations: {} drifted, {} read positions clamped{}",
        report.conversations,
        report.drifted.len(),
        report.read_positions_clamped,
        if dry_run { " (dry run: nothing changed)" } else { "; repaired" }
    );
    Ok(report)
}
