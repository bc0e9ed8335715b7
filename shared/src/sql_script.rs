//! SQL as multi-statement text scripts, one round trip each. The worker's commit runs
//! two: the reads (`BEGIN`, the fencing tokens, repeats when looked for, the
//! conversations locked, the tenants' device epochs) and the writes (messages,
//! positions, outbox row, each capped by `max_statement_time` so that the batch's ids
//! are still fresh at the end) with `COMMIT`. The position lane's delivered positions
//! run two more: their reads, and the upsert (`worker/src/delivered.rs`). A gateway's
//! registration batch writes its devices and their tenants' epochs in one.
//!
//! Prepared statements cost a round trip each, and a new prepare whenever a batch's
//! size changes the SQL; at low load every message is its own batch, so the nine round
//! trips of a commit (with the pool's ping) were most of its latency and of MariaDB's CPU per message. Text
//! scripts need literals: strings are written as `_utf8mb4 X'<hex>'`, which no input can
//! break out of whatever the SQL mode, and which still compares with the columns'
//! collation (so the key lookups stay point lookups).

use std::collections::BTreeMap;
use std::fmt::Write;

use futures::future::BoxFuture;
use futures::TryStreamExt;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlQueryResult, MySqlRow};
use sqlx::{Either, Executor};

/// SQL text with literals.
#[derive(Default)]
pub struct Script {
    sql: String,
}

impl Script {
    pub fn push(&mut self, text: &str) -> &mut Self {
        self.sql.push_str(text);
        self
    }

    /// A string literal. Hex digits through a table, a chunk at a time: formatting each
    /// byte (`{:02x}`) was a twentieth of the worker's CPU under load.
    pub fn str(&mut self, s: &str) -> &mut Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        self.sql.reserve(s.len() * 2 + 12);
        self.sql.push_str("_utf8mb4 X'");
        let mut buf = [0u8; 128];
        for chunk in s.as_bytes().chunks(buf.len() / 2) {
            for (i, b) in chunk.iter().enumerate() {
                buf[2 * i] = DIGITS[usize::from(b >> 4)];
                buf[2 * i + 1] = DIGITS[usize::from(b & 15)];
            }
            self.sql.push_str(std::str::from_utf8(&buf[..2 * chunk.len()]).expect("hex digits are ASCII"));
        }
        self.sql.push('\'');
        self
    }

    pub fn int(&mut self, n: impl Into<i128>) -> &mut Self {
        let _ = write!(self.sql, "{}", n.into());
        self
    }

    /// `(<tenant_col> = ? AND <col> IN (?, ...)) OR ...`, one term per tenant (the form
    /// MariaDB plans as point lookups at any count).
    pub fn pairs(&mut self, tenant_col: &str, col: &str, pairs: &[(&str, &str)]) -> &mut Self {
        self.push("(");
        for (n, (tenant, ids)) in by_tenant(pairs).into_iter().enumerate() {
            if n > 0 {
                self.push(" OR ");
            }
            self.push("(").push(tenant_col).push(" = ").str(tenant).push(" AND ").push(col).push(" IN (");
            for (i, id) in ids.into_iter().enumerate() {
                if i > 0 {
                    self.push(", ");
                }
                self.str(id);
            }
            self.push("))");
        }
        self.push(")")
    }

    /// The SQL written so far.
    pub fn as_str(&self) -> &str {
        &self.sql
    }

    /// Runs the script: each statement's rows and its result, in order. The first
    /// failing statement's error ends it (MySQL runs none after it). Boxed: the stream
    /// borrows the connection, and only a concrete future proves it `Send` for the
    /// commit tasks.
    pub fn run<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
    ) -> BoxFuture<'c, Result<Vec<StatementResult>, sqlx::Error>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut rows = Vec::new();
            let mut stream = conn.fetch_many(sqlx::raw_sql(&self.sql));
            while let Some(item) = stream.try_next().await? {
                match item {
                    Either::Left(done) => out.push((std::mem::take(&mut rows), done)),
                    Either::Right(row) => rows.push(row),
                }
            }
            Ok(out)
        })
    }
}

impl Script {
    /// Runs a script that is one transaction (`BEGIN; ...; COMMIT`) on a connection of
    /// `pool`. A failing statement ends the script with the transaction still open: it
    /// is rolled back, or the connection is closed instead of going back to the pool.
    pub async fn run_transaction(&self, pool: &MySqlPool) -> Result<Vec<StatementResult>, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        match self.run(&mut conn).await {
            Ok(done) => Ok(done),
            Err(e) => {
                let mut rollback = Script::default();
                rollback.push("ROLLBACK");
                if rollback.run(&mut conn).await.is_err() {
                    conn.close_on_drop();
                }
                Err(e)
            }
        }
    }
}

/// One statement's rows (none but for a SELECT) and its result.
pub type StatementResult = (Vec<MySqlRow>, MySqlQueryResult);

/// `(tenant, id)` pairs as one id list per tenant, tenants in order: the form both the
/// bound statements and the scripts write.
pub fn by_tenant<'a>(pairs: &[(&'a str, &'a str)]) -> BTreeMap<&'a str, Vec<&'a str>> {
    let mut by_tenant: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (t, id) in pairs {
        by_tenant.entry(*t).or_default().push(*id);
    }
    by_tenant
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_become_hex_literals_that_nothing_escapes() {
        let mut s = Script::default();
        s.str("a'b\\").push(", ").str("").push(", ").int(7u64).push(", ").int(-1i64);
        assert_eq!(s.as_str(), "_utf8mb4 X'6127625c', _utf8mb4 X'', 7, -1");
    }

    #[test]
    fn long_and_multibyte_strings_are_hex_of_every_byte() {
        let text: String = "é'x".repeat(50);
        let mut s = Script::default();
        s.str(&text);
        let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(s.as_str(), format!("_utf8mb4 X'{hex}'"));
    }

    #[test]
    fn pairs_are_listed_per_tenant() {
        let mut s = Script::default();
        s.pairs("t", "c", &[("u", "2"), ("t", "1"), ("u", "3")]);
        let (t, u) = ("_utf8mb4 X'74'", "_utf8mb4 X'75'");
        let lit = |c: &str| format!("_utf8mb4 X'{:02x}'", c.as_bytes()[0]);
        assert_eq!(
            s.as_str(),
            format!("((t = {t} AND c IN ({})) OR (t = {u} AND c IN ({}, {})))", lit("1"), lit("2"), lit("3"))
        );
    }
}
