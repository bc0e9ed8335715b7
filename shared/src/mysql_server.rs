//! The MySQL server behind `mysql_url`, as found at start: its flavour and version
//! (which statements give Herald's guarantees there, [`Dialect`]), whether it is the
//! writable primary (band pages, recovery and sync read `mysql_url`: a replica or a
//! reader endpoint would let them move past rows not yet replicated, and lose pushes for
//! good), and its packet limit (a commit's statement must fit in it).
//!
//! Supported (docs/operations.md, "Supported MySQL servers"): MariaDB 10.6 and later,
//! MySQL 8.0 and 8.4 (Percona Server and Amazon RDS report as MySQL), Aurora MySQL 3.
//! Anything else (MySQL 5.7, Aurora MySQL 2, TiDB, Vitess) is refused at start.

use sqlx::mysql::MySqlPool;
use sqlx::Row;

/// Which server it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    MariaDb,
    MySql,
    /// Amazon Aurora MySQL; its version is Aurora's own (3.x for MySQL 8.0).
    AuroraMySql,
}

/// A version as (major, minor, patch).
pub type Version = (u32, u32, u32);

/// How a commit keeps its ids fresh until COMMIT (docs/architecture.md, device sync).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// Each write statement is capped (`SET STATEMENT max_statement_time = s FOR ...`)
    /// and COMMIT goes in the same round trip: a held-up statement fails instead.
    MariaDb,
    /// MySQL caps only SELECTs (`max_execution_time`): the writes go without COMMIT,
    /// the ids' age is checked when they return, then COMMIT or ROLLBACK, one round trip
    /// more.
    MySql,
}

impl Dialect {
    /// What goes before a write statement to cap it at `ms`.
    pub fn write_cap(self, ms: u64) -> String {
        match self {
            Dialect::MariaDb => format!("SET STATEMENT max_statement_time = {:.3} FOR ", ms as f64 / 1000.0),
            Dialect::MySql => String::new(),
        }
    }

    /// True when the writes and COMMIT go in one round trip; false when the commit
    /// checks the ids' age after the writes, then commits or rolls back.
    pub fn commits_with_writes(self) -> bool {
        self == Dialect::MariaDb
    }

    /// The error a capped statement ends with when its time is up.
    pub fn is_statement_timeout(self, number: u16) -> bool {
        match self {
            Dialect::MariaDb => number == 1969,
            Dialect::MySql => number == 3024,
        }
    }
}

/// What replication says of the server, when it is a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub source: String,
    pub io_running: bool,
    pub sql_running: bool,
    pub seconds_behind: Option<u64>,
}

/// The server, as `inspect` found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// `SELECT VERSION()`.
    pub version: String,
    /// `@@version_comment`.
    pub comment: String,
    pub read_only: bool,
    pub innodb_read_only: bool,
    /// `@@super_read_only` (MySQL only; false elsewhere).
    pub super_read_only: bool,
    /// `SHOW REPLICA STATUS` (or `SLAVE`), when it has a row and could be read.
    pub replica: Option<Replica>,
    pub max_allowed_packet: u64,
}

/// Leading `a.b.c` of `s` (missing parts are 0); `None` without a number first.
fn leading_version(s: &str) -> Option<Version> {
    let head: String = s.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let mut parts = head.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    Some((major, parts.next().flatten().unwrap_or(0), parts.next().flatten().unwrap_or(0)))
}

impl ServerInfo {
    /// The flavour and version, or why Herald cannot run on this server.
    pub fn flavour(&self) -> Result<(Flavour, Version), String> {
        let v = self.version.as_str();
        let lower = format!("{v} {}", self.comment).to_ascii_lowercase();
        let parsed = |s: &str| leading_version(s).ok_or_else(|| format!("cannot read the server version {v:?}"));
        if lower.contains("mariadb") {
            return Ok((Flavour::MariaDb, parsed(v)?));
        }
        if let Some((_, aurora)) = v.split_once("mysql_aurora.") {
            return Ok((Flavour::AuroraMySql, parsed(aurora)?));
        }
        for other in ["tidb", "vitess", "singlestore", "memsql", "oceanbase", "doris", "starrocks"] {
            if lower.contains(other) {
                return Err(format!(
                    "the server is {other} ({v}), not MariaDB or MySQL: its transactions do not give Herald's guarantees"
                ));
            }
        }
        Ok((Flavour::MySql, parsed(v)?))
    }

    /// The statements to commit with, or why this server cannot give Herald's
    /// guarantees (refused at start).
    pub fn dialect(&self) -> Result<Dialect, String> {
        let (flavour, version) = self.flavour()?;
        let v = &self.version;
        match flavour {
            // 10.6: `SKIP LOCKED` (outbox, push and janitor claims).
            Flavour::MariaDb if version < (10, 6, 0) => {
                Err(format!("MariaDB {v} is too old: Herald needs 10.6 or later"))
            }
            Flavour::MariaDb => Ok(Dialect::MariaDb),
            Flavour::MySql if version.0 < 8 => Err(format!("MySQL {v} is too old: Herald needs MySQL 8.0 or later")),
            Flavour::MySql => Ok(Dialect::MySql),
            Flavour::AuroraMySql if version.0 < 3 => {
                Err(format!("Aurora MySQL {v} (MySQL 5.7) is too old: Herald needs Aurora MySQL 3 or later"))
            }
            Flavour::AuroraMySql => Ok(Dialect::MySql),
        }
    }

    /// A newer server than any Herald was checked on: allowed, with a warning.
    pub fn unchecked(&self) -> Option<String> {
        let (flavour, (major, minor, _)) = self.flavour().ok()?;
        let newer = match flavour {
            Flavour::MariaDb => major > 11,
            Flavour::MySql => major > 8 || (major == 8 && minor > 4),
            Flavour::AuroraMySql => major > 3,
        };
        newer.then(|| format!("{} is newer than the servers Herald was checked on", self.version))
    }

    /// Why this server is not the writable, current primary Herald must use; empty when
    /// it is. Reads of a replica could move past rows not yet replicated.
    pub fn role_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (on, name) in [
            (self.read_only, "read_only"),
            (self.super_read_only, "super_read_only"),
            (self.innodb_read_only, "innodb_read_only"),
        ] {
            if on {
                out.push(format!(
                    "@@{name} is ON: this is a replica or a reader endpoint; Herald must use the primary (writer endpoint)"
                ));
            }
        }
        if let Some(r) = &self.replica {
            if r.io_running || r.sql_running {
                let behind = r.seconds_behind.map_or("unknown".into(), |s| format!("{s} s"));
                out.push(format!(
                    "the server replicates from {} ({behind} behind): Herald must use the primary, not a replica",
                    r.source
                ));
            }
        }
        out
    }

    /// `worker.batch_max_bytes` plus a script's own bytes (`overhead`) must fit in a
    /// packet; otherwise a full batch would be cut off by the server.
    pub fn packet_problem(&self, batch_max_bytes: usize, overhead: usize) -> Option<String> {
        let needed = (batch_max_bytes + overhead) as u64;
        (needed > self.max_allowed_packet).then(|| {
            format!(
                "worker.batch_max_bytes ({batch_max_bytes}) plus {overhead} bytes of SQL exceeds the server's \
                 max_allowed_packet ({}): lower worker.batch_max_bytes to at most {} or raise max_allowed_packet",
                self.max_allowed_packet,
                self.max_allowed_packet.saturating_sub(overhead as u64)
            )
        })
    }
}

/// Reads what [`ServerInfo`] holds from the server behind `pool`. Replication status
/// needs a privilege (`REPLICATION CLIENT`, MariaDB's `SLAVE MONITOR`): without it, or
/// on a server that has neither statement, it is left out.
pub async fn inspect(pool: &MySqlPool) -> Result<ServerInfo, sqlx::Error> {
    let row = sqlx::query(
        "SELECT VERSION(), CAST(@@version_comment AS CHAR), CAST(@@read_only AS SIGNED), \
         CAST(@@innodb_read_only AS SIGNED), CAST(@@GLOBAL.max_allowed_packet AS SIGNED)",
    )
    .fetch_one(pool)
    .await?;
    let text = |i: usize| row.try_get_unchecked::<String, _>(i);
    let mut info = ServerInfo {
        version: text(0)?,
        comment: text(1)?,
        read_only: row.try_get::<i64, _>(2)? != 0,
        innodb_read_only: row.try_get::<i64, _>(3)? != 0,
        super_read_only: false,
        replica: None,
        max_allowed_packet: row.try_get::<i64, _>(4)?.max(0) as u64,
    };
    if !matches!(info.flavour(), Ok((Flavour::MariaDb, _))) {
        let sro: Result<i64, _> = sqlx::query_scalar("SELECT CAST(@@super_read_only AS SIGNED)").fetch_one(pool).await;
        info.super_read_only = sro.is_ok_and(|v| v != 0);
    }
    for statement in ["SHOW REPLICA STATUS", "SHOW SLAVE STATUS"] {
        if let Ok(rows) = sqlx::raw_sql(statement).fetch_all(pool).await {
            info.replica = rows.first().map(replica_of);
            break;
        }
    }
    Ok(info)
}

/// Reports (log and `herald_mysql_primary` 0) a server that is no longer the writable
/// primary, as after a failover that left `mysql_url` on the old primary; 1 when it is.
pub async fn report_role(pool: &MySqlPool) {
    match inspect(pool).await {
        Ok(server) => {
            let problems = server.role_problems();
            metrics::gauge!("herald_mysql_primary").set(if problems.is_empty() { 1.0 } else { 0.0 });
            for p in problems {
                tracing::error!(problem = %p, "the MySQL server is not the primary");
            }
        }
        Err(e) => tracing::debug!(error = %e, "MySQL server role not readable now"),
    }
}

/// A replication status row; column names differ by server and version.
fn replica_of(row: &sqlx::mysql::MySqlRow) -> Replica {
    let col = |names: &[&str]| {
        names.iter().find_map(|n| row.try_get_unchecked::<Option<String>, _>(*n).ok().flatten()).unwrap_or_default()
    };
    Replica {
        source: col(&["Source_Host", "Master_Host"]),
        io_running: col(&["Replica_IO_Running", "Slave_IO_Running"]) == "Yes",
        sql_running: col(&["Replica_SQL_Running", "Slave_SQL_Running"]) == "Yes",
        seconds_behind: col(&["Seconds_Behind_Source", "Seconds_Behind_Master"]).parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(version: &str, comment: &str) -> ServerInfo {
        ServerInfo {
            version: version.into(),
            comment: comment.into(),
            read_only: false,
            innodb_read_only: false,
            super_read_only: false,
            replica: None,
            max_allowed_packet: 16 << 20,
        }
    }

    #[test]
    fn each_supported_server_gets_its_dialect() {
        for (version, comment, flavour, dialect) in [
            ("10.11.19-MariaDB-0+deb12u1", "Debian 12", Flavour::MariaDb, Dialect::MariaDb),
            ("10.6.18-MariaDB-log", "MariaDB Server", Flavour::MariaDb, Dialect::MariaDb),
            ("11.4.2-MariaDB", "mariadb.org binary distribution", Flavour::MariaDb, Dialect::MariaDb),
            ("8.0.36", "MySQL Community Server - GPL", Flavour::MySql, Dialect::MySql),
            ("8.4.3", "MySQL Community Server - GPL", Flavour::MySql, Dialect::MySql),
            ("8.0.35", "Source distribution", Flavour::MySql, Dialect::MySql),
            ("8.0.36-28", "Percona Server (GPL), Release 28", Flavour::MySql, Dialect::MySql),
            ("8.0.mysql_aurora.3.05.2", "Source distribution", Flavour::AuroraMySql, Dialect::MySql),
        ] {
            let s = server(version, comment);
            assert_eq!(s.flavour().map(|f| f.0), Ok(flavour), "{version}");
            assert_eq!(s.dialect(), Ok(dialect), "{version}");
            assert_eq!(s.unchecked(), None, "{version}");
        }
        assert_eq!(server("8.0.mysql_aurora.3.05.2", "").flavour(), Ok((Flavour::AuroraMySql, (3, 5, 2))));
    }

    #[test]
    fn servers_that_cannot_give_the_guarantees_are_refused_by_name() {
        for (version, comment, says) in [
            ("10.5.25-MariaDB", "", "needs 10.6"),
            ("5.7.44", "MySQL Community Server (GPL)", "needs MySQL 8.0"),
            ("5.7.mysql_aurora.2.11.2", "", "needs Aurora MySQL 3"),
            ("8.0.11-TiDB-v7.5.0", "", "tidb"),
            ("8.0.31-Vitess", "Version: 17.0.0", "vitess"),
            ("not a version", "", "cannot read the server version"),
        ] {
            let why = server(version, comment).dialect().unwrap_err();
            assert!(why.contains(says), "{version}: {why}");
        }
        assert!(server("9.1.0", "MySQL Community Server - GPL").unchecked().is_some(), "newer: a warning");
        assert!(server("12.0.1-MariaDB", "").unchecked().is_some());
    }

    /// The statements each dialect's commit sends (the commit's own tests run MariaDB's
    /// against a real server; MySQL's cannot run here).
    #[test]
    fn mariadb_caps_each_write_and_mysql_checks_the_age_before_commit() {
        assert_eq!(Dialect::MariaDb.write_cap(250), "SET STATEMENT max_statement_time = 0.250 FOR ");
        assert!(Dialect::MariaDb.commits_with_writes());
        assert!(Dialect::MariaDb.is_statement_timeout(1969));
        assert_eq!(Dialect::MySql.write_cap(250), "", "MySQL has no cap for writes: no MariaDB syntax");
        assert!(!Dialect::MySql.commits_with_writes(), "COMMIT waits for the age check");
        assert!(Dialect::MySql.is_statement_timeout(3024) && !Dialect::MySql.is_statement_timeout(1969));
    }

    #[test]
    fn a_read_only_or_replicating_server_is_not_the_primary() {
        assert!(server("10.11.19-MariaDB", "").role_problems().is_empty());
        let mut s = server("8.0.mysql_aurora.3.05.2", "");
        s.innodb_read_only = true;
        let p = s.role_problems();
        assert!(p.len() == 1 && p[0].contains("innodb_read_only"), "an Aurora reader: {p:?}");
        let mut s = server("10.11.19-MariaDB", "");
        s.read_only = true;
        assert!(s.role_problems()[0].contains("@@read_only is ON"));
        let mut s = server("8.4.3", "");
        let replica = Replica { source: "db-0".into(), io_running: true, sql_running: true, seconds_behind: Some(12) };
        s.replica = Some(replica.clone());
        assert!(s.role_problems()[0].contains("replicates from db-0 (12 s behind)"));
        s.replica = Some(Replica { io_running: false, sql_running: false, ..replica });
        assert!(s.role_problems().is_empty(), "a former replica whose replication is stopped (a promoted one)");
    }

    #[test]
    fn a_batch_that_cannot_fit_in_a_packet_is_refused() {
        let mut s = server("10.11.19-MariaDB", "");
        s.max_allowed_packet = 1 << 20;
        assert!(s.packet_problem(1_000_000, 4_096).is_none());
        let why = s.packet_problem(4 << 20, 4_096).unwrap();
        assert!(why.contains("max_allowed_packet (1048576)") && why.contains("at most 1044480"), "{why}");
    }
}
