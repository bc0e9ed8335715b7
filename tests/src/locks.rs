//! What tests read of MariaDB's waits.

use sqlx::MySqlPool;

/// Statements of this test's database (other than the caller's) that have been
/// running for a second or more: in a test that holds a row lock, those waiting for
/// it. (A waiting autocommit statement need not show in `innodb_trx`.)
pub async fn statements_waiting(db: &MySqlPool) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.processlist \
         WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND IN ('Query', 'Execute') AND TIME >= 1",
    )
    .fetch_one(db)
    .await
    .expect("information_schema answers")
}
