//! Shard fencing: each commit carries its shard's token and checks it under a shared
//! lock, so a worker that lost its shard cannot commit for it any more.

use sqlx::mysql::MySqlPool;

/// A shard's fencing token, as its current owner took it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub shard: u32,
    pub token: u64,
}

impl Fence {
    /// Takes the shard's next token: from now on only commits with it go through. Waits
    /// for a commit of the previous owner that is still running.
    pub async fn take(db: &MySqlPool, shard: u32) -> Result<Fence, sqlx::Error> {
        let mut tx = db.begin().await?;
        sqlx::query("INSERT INTO shard_fences (shard, token) VALUES (?, 1) ON DUPLICATE KEY UPDATE token = token + 1")
            .bind(shard)
            .execute(&mut *tx)
            .await?;
        let token: u64 = sqlx::query_scalar("SELECT token FROM shard_fences WHERE shard = ?")
            .bind(shard)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Fence { shard, token })
    }
}
