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

/// A pool that connects lazily, so a process can start (and report not-ready) while
/// the database is down.
///
/// Sessions run READ COMMITTED: a transaction that locks a conversation row and then
/// reads its members must see the membership committed before it got the lock, not a
/// snapshot from its first read (REPEATABLE READ would let a member removed in between
/// still send). It also takes no gap locks, so concurrent batches do not block each other.
pub fn pool(url: &str, size: u32) -> Result<MySqlPool, sqlx::Error> {
    Ok(MySqlPoolOptions::new()
        .max_connections(size)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(&mut *conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
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
    MIGRATOR.run(&mut conn).await?;
    Ok(())
}

/// True when every migration this build knows has been applied.
pub async fn migrations_applied(pool: &MySqlPool) -> bool {
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Result<Option<i64>, _> =
        sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success = 1").fetch_one(pool).await;
    matches!(applied, Ok(Some(v)) if v >= latest)
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
