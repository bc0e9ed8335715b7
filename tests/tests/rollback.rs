//! Rollback: migrations only expand the schema (shared/src/migration_rules.rs checks
//! each one), so the previous release's binaries must start on the schema a later
//! release applied. A rolled-back install runs the previous release's migrations Job and
//! workers against a database one migration ahead of them.
//!
//! This test stands the current binaries in for "the previous release": it applies a
//! later release's additive migration (a nullable column on `messages`, a new table and
//! an index) recorded as version 99999 in `_sqlx_migrations`, which no build knows; then
//! `herald-worker migrate` must succeed, a worker (migrating at start) and a gateway must
//! become ready, and a message must still go from one user to another.

use std::time::Duration;

use herald_tests::{bin, eventually, AutoDevice, Cluster};
use serde_json::json;

/// A later release's expand-only migration, applied as sqlx would apply it.
async fn apply_future_migration(c: &Cluster) {
    let db = c.db().await;
    sqlx::raw_sql(
        "ALTER TABLE messages ADD COLUMN future_flags INT NULL; \
         CREATE TABLE future_reactions (tenant_id VARCHAR(64) NOT NULL, msg_id BIGINT UNSIGNED NOT NULL, \
           PRIMARY KEY (tenant_id, msg_id)); \
         CREATE INDEX future_by_flags ON messages (future_flags);",
    )
    .execute(&db)
    .await
    .expect("the future migration applies");
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99999, 'a later release', TRUE, X'00', 1)",
    )
    .execute(&db)
    .await
    .expect("the future migration is recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_start_and_deliver_on_a_schema_one_migration_ahead() {
    let mut c = Cluster::new("rollback");
    c.start_worker(&[]).await;
    apply_future_migration(&c).await;

    // The migrations Job of the rolled-back release.
    let out = tokio::process::Command::new(bin("herald-worker"))
        .arg("migrate")
        .env("HERALD_MYSQL_URL", &c.mysql_url)
        .env("HERALD_REDIS_URL", &c.redis_url)
        .env("HERALD_JWT_SECRET", herald_tests::SECRET)
        .output()
        .await
        .expect("herald-worker migrate runs");
    assert!(
        out.status.success(),
        "`herald-worker migrate` refused a schema one migration ahead: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Its workers (migrating at start, the default) and gateways.
    c.start_worker(&[("HERALD_WORKER__MIGRATE_ON_START", "true")]).await;
    let gw = c.start_gateway(&[]).await;

    let alice = c.client(gw, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let bob = AutoDevice::connect(&c.gateways[gw].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    alice.send("after-rollback", "ab", &json!({"text": "still here"})).await.unwrap();
    let received = bob.received.clone();
    eventually(Duration::from_secs(15), "bob receives the message sent after the rollback", || {
        let n = received.lock().unwrap().len();
        std::future::ready((n == 1).then_some(()))
    })
    .await;
}
