//! MySQL/MariaDB: the schema migrations and pool setup.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::ConnectOptions;

/// The schema, embedded at build time from `shared/migrations`.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

fn options(url: &str) -> Result<MySqlConnectOptions, sqlx::Error> {
    let url = url.replacen("mariadb://", "mysql://", 1);
    Ok(MySqlConnectOptions::from_str(&url)?
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1)))
}

/// What is wrong with the TLS files a MySQL URL names (`ssl-ca`, `ssl-cert`, `ssl-key`),
/// read now: sqlx reads them only when it connects, so a wrong path would otherwise
/// show as a pool that never connects, long after the start.
pub fn tls_file_problems(url: &str) -> Vec<String> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let mut out = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let checked = match key {
            "ssl-ca" | "ssl-cert" => crate::tls::certificates(std::path::Path::new(value)).map(drop),
            "ssl-key" => crate::tls::private_key(std::path::Path::new(value)).map(drop),
            _ => continue,
        };
        if let Err(e) = checked {
            out.push(format!("{key}: {e}"));
        }
    }
    out
}

/// A pool that connects lazily, so a process can start (and report not-ready) while
/// the database is down.
///
/// Sessions run READ COMMITTED: a transaction that locks a conversation row and then
/// reads its members must see the membership committed before it got the lock, not a
/// snapshot from its first read (REPEATABLE READ would let a member removed in between
/// still send). It also takes no gap locks, so concurrent batches do not block each other.
///
/// Every statement runs under `statement_timeout` (MariaDB's `max_statement_time`, or
/// MySQL's `max_execution_time`, which bounds reads only): a stuck query frees its
/// connection instead of holding it forever. `None` for tools whose statements may run
/// long (projection rebuilds).
pub fn pool(url: &str, size: u32, statement_timeout: Option<Duration>) -> Result<MySqlPool, sqlx::Error> {
    Ok(MySqlPoolOptions::new()
        .max_connections(size)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(&mut *conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
                if let Some(t) = statement_timeout {
                    let mariadb = format!("SET SESSION max_statement_time = {:.3}", t.as_secs_f64());
                    if sqlx::Executor::execute(&mut *conn, mariadb.as_str()).await.is_err() {
                        let mysql = format!("SET SESSION max_execution_time = {}", t.as_millis());
                        sqlx::Executor::execute(&mut *conn, mysql.as_str()).await?;
                    }
                }
                Ok(())
            })
        })
        .connect_lazy_with(options(url)?))
}

/// Creates the URL's database if it does not exist (a fresh install), then applies
/// every pending migration.
pub async fn migrate(url: &str) -> Result<(), sqlx::Error> {
    let opts = options(url)?;
    if let Some(db) = opts.get_database().map(str::to_owned) {
        let mut conn = opts.clone().database("information_schema").connect().await?;
        let quoted = format!("`{}`", db.replace('`', "``"));
        sqlx::raw_sql(&format!("CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
            .execute(&mut conn)
            .await?;
    }
    let mut conn = opts.connect().await?;
    rollback_tolerant().run(&mut conn).await?;
    Ok(())
}

/// [`MIGRATOR`], accepting a database with migrations this build does not know: after a
/// rollback the previous release's binary (its migrations Job, a worker migrating at
/// start) meets the schema a later release applied. Migrations only expand the schema
/// (`migration_rules`), so that schema serves it; sqlx would refuse it
/// (`VersionMissing`). The migrations it knows are still checked (checksums, order).
fn rollback_tolerant() -> Migrator {
    Migrator {
        migrations: MIGRATOR.migrations.clone(),
        ignore_missing: true,
        locking: MIGRATOR.locking,
        no_tx: MIGRATOR.no_tx,
    }
}

/// A fresh, migrated database on the MySQL server the tests use (`IT_MYSQL_URL`, default
/// the local one): for a crate's own tests that need real MySQL. [`ScratchDb::remove`]
/// drops it.
#[derive(Debug)]
pub struct ScratchDb {
    server: String,
    name: String,
    /// The database's URL.
    pub url: String,
}

impl ScratchDb {
    /// Creates `herald_ut_<label>_<random>` with every migration applied.
    pub async fn create(label: &str) -> Result<ScratchDb, sqlx::Error> {
        let server = std::env::var("IT_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
        let name = format!("herald_ut_{label}_{:08x}", rand::random::<u32>());
        let url = format!("{}/{name}", server.trim_end_matches('/'));
        migrate(&url).await?;
        Ok(ScratchDb { server, name, url })
    }

    /// Drops the database (best effort: a test's own outcome is what it reports).
    pub async fn remove(self) {
        if let Ok(opts) = options(&self.server) {
            if let Ok(mut conn) = opts.database("information_schema").connect().await {
                let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{}`", self.name)).execute(&mut conn).await;
            }
        }
    }
}

/// True when every migration this build knows has been applied.
pub async fn migrations_applied(pool: &MySqlPool) -> bool {
    schema_state(pool).await.is_ok()
}

/// `Ok` when MySQL answers and every migration this build knows has been applied (a
/// newer schema, from a later release, is fine: migrations only add); else why not.
pub async fn schema_state(pool: &MySqlPool) -> Result<(), String> {
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success = 1")
        .fetch_one(pool)
        .await
        .map_err(|e| e.to_string())?;
    match applied {
        Some(v) if v >= latest => Ok(()),
        v => Err(format!("schema at migration {}, this build needs {latest}", v.unwrap_or(0))),
    }
}

/// The server settings that decide whether a COMMIT survives a crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Durability {
    pub innodb_flush_log_at_trx_commit: u64,
    pub sync_binlog: u64,
    pub log_bin: bool,
}

impl Durability {
    /// What is not durable, in words for the log; empty when every commit is.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.innodb_flush_log_at_trx_commit != 1 {
            out.push(format!(
                "innodb_flush_log_at_trx_commit is {}: a crash of the database host can lose acknowledged messages (set it to 1)",
                self.innodb_flush_log_at_trx_commit
            ));
        }
        if self.log_bin && self.sync_binlog != 1 {
            out.push(format!(
                "sync_binlog is {} with the binary log on: a replica promoted after a crash can lack acknowledged messages (set it to 1)",
                self.sync_binlog
            ));
        }
        out
    }
}

/// Reads the durability settings of the server behind `pool`.
pub async fn durability(pool: &MySqlPool) -> Result<Durability, sqlx::Error> {
    let (flush, sync, log_bin): (i64, i64, i64) = sqlx::query_as(
        "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), CAST(@@sync_binlog AS SIGNED), CAST(@@log_bin AS SIGNED)",
    )
    .fetch_one(pool)
    .await?;
    Ok(Durability {
        innodb_flush_log_at_trx_commit: flush.max(0) as u64,
        sync_binlog: sync.max(0) as u64,
        log_bin: log_bin != 0,
    })
}

/// Whether the tenant has the conversation: what tells `not_found` from `forbidden`
/// once a membership read found nothing.
pub async fn conversation_exists<'e, E>(db: E, tenant: &str, conv: &str) -> Result<bool, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::MySql>,
{
    let row = sqlx::query("SELECT 1 FROM conversations WHERE tenant_id = ? AND id = ?")
        .bind(tenant)
        .bind(conv)
        .fetch_optional(db)
        .await?;
    Ok(row.is_some())
}

/// Reads text columns. Herald's identifiers are compared byte-wise (`utf8mb4_bin`:
/// `Alice` and `alice` are different users, `m1` and `M1` different cmids), and MySQL
/// flags such columns BINARY, which sqlx refuses to decode as `String`. These read
/// them as the UTF-8 they are.
pub trait TextColumns {
    fn text(&self, index: usize) -> Result<String, sqlx::Error>;
    fn opt_text(&self, index: usize) -> Result<Option<String>, sqlx::Error>;
}

impl TextColumns for sqlx::mysql::MySqlRow {
    fn text(&self, index: usize) -> Result<String, sqlx::Error> {
        use sqlx::Row;
        self.try_get_unchecked::<String, _>(index)
    }

    fn opt_text(&self, index: usize) -> Result<Option<String>, sqlx::Error> {
        use sqlx::Row;
        self.try_get_unchecked::<Option<String>, _>(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_files_of_the_url_are_checked() {
        assert!(tls_file_problems("mysql://u:p@db:3306/herald?ssl-mode=REQUIRED").is_empty());
        let problems = tls_file_problems("mysql://u:p@db/h?ssl-mode=VERIFY_CA&ssl-ca=/nonexistent/ca.pem");
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("ssl-ca: cannot read /nonexistent/ca.pem"), "{problems:?}");
        assert!(!problems[0].contains("u:p"), "no credentials in the message");
    }

    #[test]
    fn only_flush_at_every_commit_and_a_synced_binlog_are_durable() {
        let d = |flush, sync, log_bin| Durability { innodb_flush_log_at_trx_commit: flush, sync_binlog: sync, log_bin };
        assert!(d(1, 1, true).problems().is_empty());
        assert!(d(1, 0, false).problems().is_empty(), "sync_binlog does not matter without a binlog");
        assert_eq!(d(2, 1, true).problems().len(), 1);
        assert!(d(1, 0, true).problems()[0].contains("sync_binlog is 0"));
        assert_eq!(d(0, 0, true).problems().len(), 2);
    }
}
