//! A private MariaDB primary with a semi-synchronous replica, as Herald needs a MySQL
//! with a replica to run (docs/operations.md, "MySQL replication"): `AFTER_SYNC`, and a
//! timeout long enough that the primary never falls back to asynchronous replication.

use std::time::Duration;

use sqlx::{Connection, MySqlConnection, Row};

use crate::eventually;
use crate::faults::MariaDb;

/// How long the primary waits for the replica's acknowledgement before it would fall
/// back to asynchronous replication: an hour, so never within a test.
const SEMI_SYNC_TIMEOUT_MS: &str = "3600000";

pub struct SemiSyncPair {
    pub primary: MariaDb,
    pub replica: MariaDb,
}

impl SemiSyncPair {
    /// Starts both and connects the replica (GTID positions), then waits until the
    /// primary counts it as a semi-synchronous client.
    pub async fn start() -> SemiSyncPair {
        let timeout = format!("--rpl-semi-sync-master-timeout={SEMI_SYNC_TIMEOUT_MS}");
        let primary = MariaDb::start_with(&[
            "--log-bin=binlog",
            "--server-id=1",
            "--binlog-format=ROW",
            "--sync-binlog=1",
            "--rpl-semi-sync-master-enabled=ON",
            "--rpl-semi-sync-master-wait-point=AFTER_SYNC",
            &timeout,
        ])
        .await;
        let replica = MariaDb::start_with(&[
            "--log-bin=binlog",
            "--server-id=2",
            "--binlog-format=ROW",
            "--log-slave-updates=ON",
            "--rpl-semi-sync-slave-enabled=ON",
            "--read-only=ON",
        ])
        .await;
        let mut r = connect(&replica).await;
        let change = format!(
            "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'root', \
             MASTER_PASSWORD = '', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
            primary.port
        );
        sqlx::raw_sql(&change).execute(&mut r).await.expect("CHANGE MASTER");
        sqlx::raw_sql("START SLAVE").execute(&mut r).await.expect("START SLAVE");
        let pair = SemiSyncPair { primary, replica };
        eventually(Duration::from_secs(30), "the primary has a semi-synchronous replica", || async {
            let mut p = connect(&pair.primary).await;
            let on = status(&mut p, "Rpl_semi_sync_master_status").await == "ON";
            let clients = status(&mut p, "Rpl_semi_sync_master_clients").await;
            (on && clients == "1").then_some(())
        })
        .await;
        pair
    }

    /// Commits the primary acknowledged only after the replica had them
    /// (`Rpl_semi_sync_master_yes_tx`), and those it acknowledged without
    /// (`Rpl_semi_sync_master_no_tx`: it fell back to asynchronous replication).
    pub async fn semi_sync_commits(&self) -> (u64, u64) {
        let mut p = connect(&self.primary).await;
        let yes = status(&mut p, "Rpl_semi_sync_master_yes_tx").await.parse().unwrap_or(0);
        let no = status(&mut p, "Rpl_semi_sync_master_no_tx").await.parse().unwrap_or(0);
        (yes, no)
    }

    /// Promotes the replica once the primary is gone: replication stopped, the relay
    /// log applied, writes allowed (what an operator or an orchestrator does).
    pub async fn promote(&self) {
        let mut r = connect(&self.replica).await;
        eventually(Duration::from_secs(30), "the replica applied everything it received", || async {
            let mut r = connect(&self.replica).await;
            let row = sqlx::query("SHOW SLAVE STATUS").fetch_optional(&mut r).await.ok()??;
            let relay_done = row.try_get::<String, _>("Slave_SQL_Running_State").ok()?;
            relay_done.contains("has read all relay log").then_some(())
        })
        .await;
        for sql in ["STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF"] {
            sqlx::raw_sql(sql).execute(&mut r).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }
}

async fn connect(db: &MariaDb) -> MySqlConnection {
    MySqlConnection::connect(&format!("{}/mysql", db.base_url())).await.expect("private MariaDB answers")
}

async fn status(conn: &mut MySqlConnection, name: &str) -> String {
    let row = sqlx::query(&format!("SHOW GLOBAL STATUS LIKE '{name}'")).fetch_optional(conn).await.expect(name);
    row.and_then(|r| r.try_get::<String, _>(1).ok()).unwrap_or_default()
}
