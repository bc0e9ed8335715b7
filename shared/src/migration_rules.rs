//! Migrations only expand the schema, so a rollback works: the previous release's
//! binaries run on the schema the newer release applied (docs/reliability.md,
//! "Upgrades and rollback"). This test reads every file of `shared/migrations` and
//! refuses a statement an older binary could trip on:
//!
//! - dropping, renaming or retyping anything (`DROP`, `RENAME`, `MODIFY`, `CHANGE`,
//!   `TRUNCATE`): the old code still reads and writes it (a text or blob column made
//!   larger, still nullable, is accepted: the old code reads and writes it as before);
//! - a new column that is `NOT NULL` without a `DEFAULT`: the old code's `INSERT`s do not
//!   name it and would fail;
//! - a new `UNIQUE` key or `FOREIGN KEY` on an existing table: rows the old code writes
//!   could break it.
//!
//! A contract step (removing what no supported release reads any more) goes in a
//! release after the one that stopped reading it, in a file whose first line is
//! `-- contract: <what and since which release nothing reads it>`.

use std::path::Path;

/// The types a `MODIFY` may widen a text or blob column to.
const WIDER: [&str; 4] = ["MEDIUMTEXT", "LONGTEXT", "MEDIUMBLOB", "LONGBLOB"];

/// What is not expand-only in one migration's SQL, one line per statement.
fn contract_statements(sql: &str) -> Vec<String> {
    let text: String = sql.lines().map(|l| l.split("--").next().unwrap_or("")).collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    for statement in text.split(';') {
        let s = statement.split_whitespace().collect::<Vec<_>>().join(" ").to_uppercase();
        if s.is_empty() {
            continue;
        }
        let words: Vec<&str> = s.split(' ').collect();
        if ["DROP", "RENAME", "TRUNCATE"].contains(&words[0]) {
            out.push(s.clone());
            continue;
        }
        if !s.starts_with("ALTER TABLE") {
            continue;
        }
        for clause in top_level_clauses(&s) {
            let c: Vec<&str> = clause.split(' ').collect();
            let first = c.first().copied().unwrap_or("");
            let second = c.get(1).copied().unwrap_or("");
            let refused = match first {
                // A text or blob column made larger (TEXT to MEDIUMTEXT): the old code
                // reads and writes it as before.
                "MODIFY" => !WIDER.contains(&c.get(2).copied().unwrap_or("")) || clause.contains(" NOT NULL"),
                "DROP" | "RENAME" | "CHANGE" | "ALTER" => true,
                "ADD" => match second {
                    "UNIQUE" | "FOREIGN" | "CONSTRAINT" | "PRIMARY" => true,
                    "KEY" | "INDEX" | "FULLTEXT" | "SPATIAL" => false,
                    _ => clause.contains(" NOT NULL") && !clause.contains(" DEFAULT "),
                },
                _ => false,
            };
            if refused {
                out.push(format!("{}: {clause}", words[..3.min(words.len())].join(" ")));
            }
        }
    }
    out
}

/// The clauses of an `ALTER TABLE t ...` statement: split at commas outside parentheses,
/// the table name removed from the first.
fn top_level_clauses(statement: &str) -> Vec<String> {
    let body = statement.splitn(4, ' ').nth(3).unwrap_or("");
    let (mut depth, mut current, mut out) = (0i32, String::new(), Vec::new());
    for ch in body.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(ch);
    }
    out.push(current.trim().to_string());
    out
}

#[test]
fn every_migration_only_expands_the_schema() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("shared/migrations").map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 7, "found only {} migrations", files.len());
    let mut problems = Vec::new();
    for file in files {
        let sql = std::fs::read_to_string(&file).unwrap();
        if sql.lines().next().is_some_and(|l| l.starts_with("-- contract: ")) {
            continue;
        }
        for s in contract_statements(&sql) {
            problems.push(format!("{}: {s}", file.file_name().unwrap().to_string_lossy()));
        }
    }
    assert!(
        problems.is_empty(),
        "migrations that an older binary could trip on (see shared/src/migration_rules.rs):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_rules_refuse_what_breaks_an_older_binary_and_accept_what_only_adds() {
    let accepted = "CREATE TABLE t (a INT NOT NULL, UNIQUE KEY u (a)); -- drop nothing\n\
        ALTER TABLE m ADD COLUMN e TEXT NULL, ADD COLUMN r VARCHAR(8) NOT NULL DEFAULT 'member';\n\
        ALTER TABLE m ADD KEY k (a, b); CREATE INDEX i ON m (a); INSERT INTO t VALUES (1);\n\
        ALTER TABLE m MODIFY event MEDIUMTEXT NULL;";
    assert_eq!(contract_statements(accepted), Vec::<String>::new());
    for refused in [
        "DROP TABLE t",
        "ALTER TABLE m DROP COLUMN e",
        "ALTER TABLE m ADD COLUMN a INT, DROP KEY k",
        "ALTER TABLE m RENAME COLUMN a TO b",
        "ALTER TABLE m MODIFY body TEXT NULL",
        "ALTER TABLE m MODIFY body MEDIUMTEXT NOT NULL",
        "ALTER TABLE m CHANGE a b INT",
        "ALTER TABLE m ADD COLUMN n BIGINT NOT NULL",
        "ALTER TABLE m ADD n DECIMAL(10, 2) NOT NULL",
        "ALTER TABLE m ADD UNIQUE KEY u (a)",
        "ALTER TABLE m ADD CONSTRAINT f FOREIGN KEY (a) REFERENCES t (a)",
        "RENAME TABLE a TO b",
        "TRUNCATE TABLE t",
    ] {
        assert_eq!(contract_statements(refused).len(), 1, "accepted: {refused}");
    }
}
