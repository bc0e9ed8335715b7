//! The commit pipeline's statements against a real MariaDB.

use herald_shared::db::ScratchDb;
use sqlx::{Executor, MySql, QueryBuilder};

use super::connections::CommitConnections;
use super::*;

/// A batch of a few hundred conversations locks those without waiting for a
/// concurrent batch's other conversations of the same tenant. Before: past ~150
/// pairs MariaDB read the `(a AND b) OR ...` form through the tenant's key prefix,
/// so its locking read waited on every conversation of the tenant that another
/// batch held: concurrent batches of a tenant ran one after the other.
#[tokio::test]
async fn a_batch_locks_only_its_own_conversations() {
    let scratch = ScratchDb::create("locks").await.expect("a fresh schema");
    let db = herald_shared::db::pool(&scratch.url, 2, None).expect("pool");
    let mut q =
        QueryBuilder::<MySql>::new("INSERT INTO conversations (tenant_id, id, kind, created_at, last_active_at) ");
    // Ids as long as the load-test's, in a table of several pages.
    let ids: Vec<String> = (0..1_000).map(|i| format!("1a22fb1d16b-c{i:04}")).collect();
    q.push_values(&ids, |mut b, id| {
        b.push_bind("t").push_bind(id).push_bind("direct").push_bind(0i64).push_bind(0i64);
    });
    q.build().execute(&db).await.expect("conversations");
    // And one of another tenant, locked by the same batch.
    db.execute("INSERT INTO conversations (tenant_id, id, kind, created_at, last_active_at) VALUES ('u', '1a22fb1d16b-c0000', 'direct', 0, 0)")
        .await
        .expect("another tenant's conversation");
    db.execute("ANALYZE TABLE conversations").await.expect("statistics");

    // A concurrent batch holds another conversation of the tenant.
    let mut other = db.begin().await.expect("the other batch");
    sqlx::query("SELECT id FROM conversations WHERE tenant_id = 't' AND id = '1a22fb1d16b-c0999' FOR UPDATE")
        .fetch_all(&mut *other)
        .await
        .expect("the other batch's lock");
    let mut wanted: Vec<(&str, &str)> = ids[..300].iter().map(|id| ("t", id.as_str())).collect();
    wanted.push(("u", ids[0].as_str()));
    let mut tx = db.begin().await.expect("the batch");
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 1").execute(&mut *tx).await.expect("timeout");
    let mut script = Script::default();
    lock_conversations(&mut script, &wanted);
    let locked = script.run(&mut tx).await.map(|mut sets| sets.remove(0).0);
    drop((tx, other));
    db.close().await;
    scratch.remove().await;
    let locked = locked.expect("the batch waited for a conversation outside it");
    assert_eq!(locked.len(), 301);
}

/// Whatever a string holds (quotes, backslashes, comment markers, NUL, any script), the
/// scripts' literals carry it to MariaDB and back unchanged.
#[tokio::test]
async fn literals_carry_any_text_unchanged() {
    let scratch = ScratchDb::create("literals").await.expect("a fresh schema");
    let db = herald_shared::db::pool(&scratch.url, 1, None).expect("pool");
    let texts = [
        "plain",
        "it's",
        "back\\slash\\",
        "\"quoted\"",
        "emoji 🎉 中文",
        "",
        "nul\0byte",
        "x'; DROP TABLE messages; --",
    ];
    let mut script = Script::default();
    for (i, t) in texts.iter().enumerate() {
        script.push(if i > 0 { "; SELECT " } else { "SELECT " }).str(t);
    }
    let mut conn = db.acquire().await.expect("a connection");
    let sets = script.run(&mut conn).await;
    drop(conn);
    db.close().await;
    scratch.remove().await;
    let sets = sets.expect("the script runs");
    assert_eq!(sets.len(), texts.len());
    for (t, (rows, _)) in texts.iter().zip(&sets) {
        assert_eq!(rows[0].text(0).expect("text"), *t);
    }
}

/// Commits reuse the connection the last one gave back (no pool round trips), and one
/// the server closed while it was kept is noticed and replaced before a commit uses it.
#[tokio::test]
async fn commit_connections_are_reused_and_replaced_when_closed() {
    let scratch = ScratchDb::create("commitconns").await.expect("a fresh schema");
    let db = herald_shared::db::pool(&scratch.url, 2, None).expect("pool");
    let conns = CommitConnections::new(db.clone(), 2);
    let id = |mut c: sqlx::mysql::MySqlConnection| async move {
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()").fetch_one(&mut c).await.expect("an id");
        (c, id)
    };
    let (first, first_id) = id(conns.take().await.expect("a connection")).await;
    conns.give_back(first);
    let (again, again_id) = id(conns.take().await.expect("a connection")).await;
    assert_eq!(again_id, first_id, "the kept connection is taken again");
    conns.give_back(again);
    assert_eq!(conns.kept(), 1);

    db.execute(format!("KILL CONNECTION {first_id}").as_str()).await.expect("kill");
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let (fresh, fresh_id) = id(conns.take().await.expect("a connection")).await;
    drop(fresh);
    db.close().await;
    scratch.remove().await;
    assert_ne!(fresh_id, first_id, "the closed connection was replaced");
}

/// The MySQL dialect's commit (writes without a cap, then the ids' age checked, then
/// COMMIT in a round trip of its own), run against MariaDB, which takes its statements
/// too: the batch commits with its outbox row and the conversation's position, and a
/// batch whose ids are too old by the time its writes return is rolled back, not
/// committed.
#[tokio::test]
async fn the_mysql_dialect_commits_only_while_the_ids_are_fresh() {
    let scratch = ScratchDb::create("mysqldialect").await.expect("a fresh schema");
    let db = herald_shared::db::pool(&scratch.url, 2, None).expect("pool");
    db.execute(
        "INSERT INTO conversations (tenant_id, id, kind, created_at, last_active_at) VALUES ('t', 'c', 'direct', 0, 0); \
         INSERT INTO members (tenant_id, conv_id, user_id, joined_at) VALUES ('t', 'c', 'alice', 0), ('t', 'c', 'bob', 0); \
         INSERT INTO shard_fences (shard, token) VALUES (0, 1)",
    )
    .await
    .expect("a conversation");
    let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let redis = herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis");
    let keys = herald_shared::keys::Keys::new(format!("ut{:08x}", rand::random::<u32>()));
    let ids = IdSource::new();
    ids.maintain(&redis, &keys, std::time::Duration::from_secs(30)).await.expect("an id lease");
    let entry = |cmid: &str| IngressEntry {
        tenant: "t".into(),
        user: "alice".into(),
        device: "a1".into(),
        cmid: cmid.into(),
        conv: "c".into(),
        body: "{}".into(),
        node: "n".into(),
        rid: 0,
        trace: None,
    };
    let fence = [Fence { shard: 0, token: 1 }];
    let floors = std::sync::Arc::new(crate::seq_floor::SeqFloors::new(redis.clone(), keys.clone()));

    let fresh = CommitPipeline::new(db.clone(), 1, 1_000, 2_000, 60_000, Dialect::MySql, floors.clone(), 1_000);
    let done = fresh.commit(&[entry("m1")], &ids, &fence).await.expect("committed");
    assert!(matches!(&done.outcomes[..], [Outcome::Done(r)] if r.seq == 1 && !r.dup), "{:?}", done.outcomes);
    assert!(done.outbox_id.is_some());

    // Ids may be at most 100 ms old at COMMIT: with the 50 ms margin, enough to send
    // the writes (the check before them passes), too little once a lock held elsewhere
    // keeps the outbox insert waiting for 300 ms.
    let stale = CommitPipeline::new(db.clone(), 1, 1_000, 200, 60_000, Dialect::MySql, floors, 1_000);
    let mut holder = db.begin().await.expect("another transaction");
    sqlx::query("LOCK TABLES outbox_events WRITE").execute(&mut *holder).await.ok();
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let _ = sqlx::query("UNLOCK TABLES").execute(&mut *holder).await;
        holder.rollback().await.ok();
    });
    let refused = stale.commit(&[entry("m2")], &ids, &fence).await;
    release.await.expect("released");
    let (messages, last_seq): (i64, u64) =
        sqlx::query_as("SELECT (SELECT COUNT(*) FROM messages), (SELECT last_seq FROM conversations WHERE id = 'c')")
            .fetch_one(&db)
            .await
            .expect("counts");
    db.close().await;
    scratch.remove().await;
    assert!(matches!(refused, Err(CommitError::StaleIds(_))), "{refused:?}");
    assert_eq!((messages, last_seq), (1, 1), "the stale batch was rolled back");
}
