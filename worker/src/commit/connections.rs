//! The connections commits run on, kept out of the pool.
//!
//! sqlx's pool pings a connection when it is taken (`test_before_acquire`) and again,
//! unconditionally, when it is given back: two round trips more for each commit's
//! three, and at low load (a message or two per batch) a third of everything MariaDB
//! was asked. Commits therefore keep their connections: taken from the pool once and
//! detached, handed from one commit to the next, and pinged only when one has been idle
//! long enough that the server may have closed it. A connection whose commit failed is
//! not kept (its transaction may still be open), so a broken one costs one failed
//! commit, which the shard runs again, never more.
//!
//! At most `worker.commits_in_flight` commits run at once, so at most that many
//! connections are kept, on top of the pool's `worker.db_pool_size`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::Connection;

/// A connection idle longer than this is pinged before a commit uses it.
const IDLE_CHECK: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct CommitConnections {
    pool: MySqlPool,
    idle: Mutex<Vec<(MySqlConnection, Instant)>>,
    keep: usize,
}

impl CommitConnections {
    /// Connections from `pool`, at most `keep` of them kept between commits.
    pub fn new(pool: MySqlPool, keep: usize) -> Self {
        CommitConnections { pool, idle: Mutex::new(Vec::new()), keep }
    }

    /// A connection for one commit: the one given back last, or a new one.
    pub async fn take(&self) -> Result<MySqlConnection, sqlx::Error> {
        loop {
            // The most recent first: it is the least likely to have been closed.
            let kept = self.idle.lock().expect("never poisoned").pop();
            let Some((mut conn, since)) = kept else {
                return Ok(self.pool.acquire().await?.detach());
            };
            if since.elapsed() < IDLE_CHECK || conn.ping().await.is_ok() {
                return Ok(conn);
            }
            metrics::counter!("herald_worker_commit_connections_dropped_total").increment(1);
        }
    }

    /// Gives back a connection whose commit (or rollback) succeeded.
    pub fn give_back(&self, conn: MySqlConnection) {
        let mut idle = self.idle.lock().expect("never poisoned");
        if idle.len() < self.keep {
            idle.push((conn, Instant::now()));
        }
    }

    /// How many connections are kept now.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.idle.lock().expect("never poisoned").len()
    }
}
