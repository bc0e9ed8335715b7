//! The commit pipeline: one MySQL transaction per batch of ingress entries.
//!
//! A batch holds the entries of one shard or of several (a group commit, see
//! `group.rs`), with the fencing token of each.
//!
//! In one transaction: check the fencing tokens; lock the conversations in a
//! fixed order; check membership; number the messages (`seq`) in stream order; insert
//! them in one multi-row statement; move the conversations' `last_seq`; write one
//! outbox row covering the batch. Nothing is acknowledged before COMMIT returns.
//! Repeats of committed messages (same tenant, sender and cmid) are refused by the
//! unique key; only then does the batch run again, looking them up first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use herald_shared::db::TextColumns;
use herald_shared::error::ErrorCode;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::protocol::{IngressEntry, SendResult};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder, Row};

use crate::batch::{live_since, push_pairs, Committed, Recipient};
use crate::lease::{IdSource, NoIdLease};

/// What happened to one entry of the batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed now (`dup: false`) or earlier (`dup: true`).
    Done(SendResult),
    Rejected(ErrorCode, String),
}

#[derive(Debug, Default)]
pub struct BatchResult {
    /// One per entry, in entry order.
    pub outcomes: Vec<Outcome>,
    pub committed: Vec<Committed>,
    /// The outbox row covering `committed`.
    pub outbox_id: Option<u64>,
    /// Every device of every current member of the conversations in `committed`.
    pub recipients: Vec<Recipient>,
}

/// The answer to a cmid reused for another conversation.
const CMID_REUSED: &str = "this cmid was already used for a message to another conversation";

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    NoIds(#[from] NoIdLease),
    /// Another worker took the shard since this one's lease: it must stop.
    #[error("shard {0} was taken over (fencing token moved on)")]
    Fenced(u32),
    /// The batch's ids grew too old before COMMIT; run it again with new ones.
    #[error("ids drawn {0} ms before commit; drawing new ones")]
    StaleIds(u64),
}

/// What to do about a failed commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A deadlock, or a unique-key race with another worker during a takeover: run the
    /// batch again (dedup finds the winner).
    Conflict,
    /// MySQL unreachable, overloaded or restarting, or no snowflake ids: wait, retry.
    Transient,
    /// MySQL refused the data itself: the same batch will fail again, so find the
    /// entry that does it.
    Poison,
    /// The shard belongs to another worker now.
    Fenced,
}

impl CommitError {
    pub fn failure(&self) -> Failure {
        match self {
            CommitError::Fenced(_) => Failure::Fenced,
            CommitError::NoIds(_) => Failure::Transient,
            CommitError::StaleIds(_) => Failure::Conflict,
            CommitError::Db(sqlx::Error::Database(e)) => {
                let number = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|m| m.number());
                let state = e.code().unwrap_or_default();
                match number {
                    // Deadlock, duplicate key.
                    Some(1213 | 1062) => Failure::Conflict,
                    // Lock wait timeout, too many connections, shutdown, interrupted,
                    // statement time limit, read-only during a failover.
                    Some(1205 | 1040 | 1053 | 1317 | 1969 | 3024 | 1290 | 1836) => Failure::Transient,
                    _ if state == "40001" => Failure::Conflict,
                    _ if state.starts_with("08") || state.starts_with("HYT") => Failure::Transient,
                    _ => Failure::Poison,
                }
            }
            CommitError::Db(_) => Failure::Transient,
        }
    }
}

/// A shard's fencing token, as its current owner took it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub shard: u32,
    pub token: u64,
}

impl Fence {
    /// Takes the shard's next token: from now on only commits with it go through. Waits
    /// for a commit of the previous owner that is still running.
    pub async fn take(db: &MySqlPool, shard: u32) -> Result<Fence, sqlx::Error> {
        let mut tx = db.begin().await?;
        sqlx::query("INSERT INTO shard_fences (shard, token) VALUES (?, 1) ON DUPLICATE KEY UPDATE token = token + 1")
            .bind(shard)
            .execute(&mut *tx)
            .await?;
        let token: u64 = sqlx::query_scalar("SELECT token FROM shard_fences WHERE shard = ?")
            .bind(shard)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Fence { shard, token })
    }
}

impl BatchResult {
    /// Every one of `n` entries refused, nothing committed.
    pub fn refused(n: usize, code: ErrorCode, message: &str) -> BatchResult {
        BatchResult { outcomes: vec![Outcome::Rejected(code, message.into()); n], ..BatchResult::default() }
    }
}

/// How repeats of committed messages are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dedup {
    /// The insert fails on the unique key if there is one (no extra round trip).
    ByUniqueKey,
    /// Looked up first, and answered with the first commit.
    Lookup,
}

/// A message insert refused because (tenant, sender, cmid) was committed before.
fn is_repeat(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => {
            d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|m| m.number() == 1062)
                && d.message().contains("uq_client_msg")
        }
        _ => false,
    }
}

#[derive(Debug)]
pub struct CommitPipeline {
    db: MySqlPool,
    first_retry_delay_ms: u64,
    /// Devices unseen this long are no recipients (`delivery.device_ttl_s`).
    device_ttl_ms: u64,
    /// Ids older than this may not be committed any more (`delivery.sync_settle_ms`
    /// halved): device sync returns ids once they are older than the settle time, so a
    /// later commit below them would be skipped.
    max_id_age_ms: u64,
}

struct ConvState {
    kind: String,
    created_at: i64,
    last_seq: u64,
    last_id: MsgId,
    last_active_at: i64,
    members: HashSet<String>,
    /// (user, joined_seq, device) of every registered device of a current member.
    devices: Vec<(String, u64, String)>,
    changed: bool,
}

impl CommitPipeline {
    pub fn new(db: MySqlPool, first_retry_delay_ms: u64, sync_settle_ms: u64, device_ttl_ms: u64) -> Self {
        CommitPipeline { db, first_retry_delay_ms, max_id_age_ms: sync_settle_ms / 2, device_ttl_ms }
    }

    /// Commits the batch. Repeats are rare (a client resending after a timeout, a batch
    /// taken over after a crash), so the batch is first inserted without looking for
    /// them: the unique key on (tenant, sender, cmid) refuses a repeat, and only then is
    /// the batch run again with the lookup.
    pub async fn commit(
        &self,
        entries: &[IngressEntry],
        ids: &IdSource,
        fences: &[Fence],
    ) -> Result<BatchResult, CommitError> {
        match self.commit_with(entries, ids, fences, Dedup::ByUniqueKey).await {
            Err(CommitError::Db(e)) if is_repeat(&e) => {
                metrics::counter!("herald_batches_with_repeats_total").increment(1);
                self.commit_with(entries, ids, fences, Dedup::Lookup).await
            }
            other => other,
        }
    }

    async fn commit_with(
        &self,
        entries: &[IngressEntry],
        ids: &IdSource,
        fences: &[Fence],
        dedup: Dedup,
    ) -> Result<BatchResult, CommitError> {
        let started = Instant::now();
        let mut tx = self.db.begin().await?;
        let now = now_ms();
        // 0. Still the owner of every shard of the batch? The shared lock holds a new
        // owner's token bump off until this transaction ends.
        let mut q = QueryBuilder::<MySql>::new("SELECT shard, token FROM shard_fences WHERE shard IN (");
        let mut sep = q.separated(", ");
        for f in fences {
            sep.push_bind(f.shard);
        }
        q.push(") LOCK IN SHARE MODE");
        let tokens: HashMap<u32, u64> =
            q.build_query_as::<(u32, u64)>().fetch_all(&mut *tx).await?.into_iter().collect();
        if let Some(f) = fences.iter().find(|f| tokens.get(&f.shard) != Some(&f.token)) {
            return Err(CommitError::Fenced(f.shard));
        }

        // 1. Repeats of already committed messages (when a first try found there are).
        let mut existing: HashMap<(String, String, String), SendResult> = HashMap::new();
        if dedup == Dedup::Lookup && !entries.is_empty() {
            let mut q = QueryBuilder::<MySql>::new(
                "SELECT tenant_id, sender_id, client_msg_id, id, conv_id, seq, created_at FROM messages WHERE ",
            );
            let mut sep = q.separated(" OR ");
            for e in entries {
                sep.push("(tenant_id = ")
                    .push_bind_unseparated(&e.tenant)
                    .push_unseparated(" AND sender_id = ")
                    .push_bind_unseparated(&e.user)
                    .push_unseparated(" AND client_msg_id = ")
                    .push_bind_unseparated(&e.cmid)
                    .push_unseparated(")");
            }
            for row in q.build().fetch_all(&mut *tx).await? {
                let key = (row.text(0)?, row.text(1)?, row.text(2)?);
                let r = SendResult {
                    id: MsgId(row.try_get::<u64, _>(3)?),
                    conv: row.text(4)?,
                    seq: row.try_get(5)?,
                    ts: row.try_get::<i64, _>(6)? as u64,
                    dup: true,
                };
                existing.insert(key, r);
            }
        }

        // 2. Lock the conversations the new messages go to, in a fixed order.
        let mut wanted: Vec<(&str, &str)> = entries
            .iter()
            .filter(|e| !existing.contains_key(&(e.tenant.clone(), e.user.clone(), e.cmid.clone())))
            .map(|e| (e.tenant.as_str(), e.conv.as_str()))
            .collect();
        wanted.sort();
        wanted.dedup();
        let mut convs: BTreeMap<(String, String), ConvState> = BTreeMap::new();
        if !wanted.is_empty() {
            for row in lock_conversations(&wanted).build().fetch_all(&mut *tx).await? {
                convs.insert(
                    (row.text(0)?, row.text(1)?),
                    ConvState {
                        kind: row.text(2)?,
                        created_at: row.try_get(3)?,
                        last_seq: row.try_get(4)?,
                        last_id: MsgId(row.try_get::<Option<u64>, _>(5)?.unwrap_or(0)),
                        last_active_at: row.try_get(6)?,
                        members: HashSet::new(),
                        devices: Vec::new(),
                        changed: false,
                    },
                );
            }
            // Current members (READ COMMITTED: as of now, under the conversation locks)
            // and their devices: the membership check and the fan-out's recipients.
            // Devices unseen for the device TTL are not recipients (the janitor frees them).
            let mut q = QueryBuilder::<MySql>::new(
                "SELECT m.tenant_id, m.conv_id, m.user_id, m.joined_seq, d.device_id FROM members m \
                 LEFT JOIN devices d ON d.tenant_id = m.tenant_id AND d.user_id = m.user_id \
                 AND d.expired_at IS NULL AND d.last_seen_at >= ",
            );
            q.push_bind(live_since(self.device_ttl_ms)).push(" WHERE m.left_seq IS NULL AND (");
            push_pairs(&mut q, "m.tenant_id", "m.conv_id", &wanted);
            q.push(")");
            for row in q.build().fetch_all(&mut *tx).await? {
                let key: (String, String) = (row.text(0)?, row.text(1)?);
                if let Some(c) = convs.get_mut(&key) {
                    let user = row.text(2)?;
                    if let Some(device) = row.opt_text(4)? {
                        c.devices.push((user.clone(), row.try_get(3)?, device));
                    }
                    c.members.insert(user);
                }
            }
        }

        // 3. Number the new messages in stream order.
        let mut result = BatchResult::default();
        let mut planned: Vec<(usize, (String, String), u64, MsgId)> = Vec::new();
        let mut seen_in_batch: HashMap<(String, String, String), usize> = HashMap::new();
        // (entry, earlier entry of the batch with the same cmid): answered like it.
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        let mut floors = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let dedup_key = (e.tenant.clone(), e.user.clone(), e.cmid.clone());
            if let Some(r) = existing.get(&dedup_key) {
                result.outcomes.push(if r.conv == e.conv {
                    Outcome::Done(r.clone())
                } else {
                    // Not a repeat: another message under a cmid already used.
                    Outcome::Rejected(ErrorCode::Conflict, CMID_REUSED.into())
                });
                continue;
            }
            if let Some(&first) = seen_in_batch.get(&dedup_key) {
                // A placeholder until the first occurrence has its id (below).
                repeats.push((i, first));
                result.outcomes.push(Outcome::Rejected(ErrorCode::Internal, String::new()));
                continue;
            }
            let key = (e.tenant.clone(), e.conv.clone());
            let Some(conv) = convs.get_mut(&key) else {
                result.outcomes.push(Outcome::Rejected(ErrorCode::NotFound, "no such conversation".into()));
                continue;
            };
            if !conv.members.contains(&e.user) {
                result
                    .outcomes
                    .push(Outcome::Rejected(ErrorCode::Forbidden, "not a member of this conversation".into()));
                continue;
            }
            conv.last_seq += 1;
            conv.changed = true;
            conv.last_active_at = now as i64;
            floors.push(conv.last_id);
            planned.push((i, key, conv.last_seq, MsgId(0)));
            seen_in_batch.insert(dedup_key, i);
            result.outcomes.push(Outcome::Done(SendResult {
                id: MsgId(0),
                conv: e.conv.clone(),
                seq: conv.last_seq,
                ts: now,
                dup: false,
            }));
        }
        let new_ids = ids.next_ids(&floors)?;
        for (p, id) in planned.iter_mut().zip(new_ids) {
            p.3 = id;
            if let Some(c) = convs.get_mut(&p.1) {
                c.last_id = c.last_id.max(id);
            }
            if let Outcome::Done(r) = &mut result.outcomes[p.0] {
                r.id = id;
            }
        }
        for (i, first) in repeats {
            if let Outcome::Done(r) = &result.outcomes[first] {
                result.outcomes[i] = if r.conv == entries[i].conv {
                    Outcome::Done(SendResult { dup: true, ..r.clone() })
                } else {
                    Outcome::Rejected(ErrorCode::Conflict, CMID_REUSED.into())
                };
            }
        }

        if !planned.is_empty() {
            // 4. The messages, in one statement.
            let mut q = QueryBuilder::<MySql>::new(
                "INSERT INTO messages (id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at) ",
            );
            q.push_values(&planned, |mut b, (i, _, seq, id)| {
                let e = &entries[*i];
                b.push_bind(id.0)
                    .push_bind(&e.tenant)
                    .push_bind(&e.conv)
                    .push_bind(*seq)
                    .push_bind(&e.user)
                    .push_bind(&e.device)
                    .push_bind(&e.cmid)
                    .push_bind(&e.body)
                    .push_bind(now as i64);
            });
            q.build().execute(&mut *tx).await?;

            // 5. The conversations' new positions, in one statement (the rows exist and are locked).
            let changed: Vec<(&(String, String), &ConvState)> = convs.iter().filter(|(_, c)| c.changed).collect();
            let mut q = QueryBuilder::<MySql>::new(
                "INSERT INTO conversations (tenant_id, id, kind, created_at, last_seq, last_msg_id, last_active_at) ",
            );
            q.push_values(&changed, |mut b, ((t, id), c)| {
                b.push_bind(t)
                    .push_bind(id)
                    .push_bind(&c.kind)
                    .push_bind(c.created_at)
                    .push_bind(c.last_seq)
                    .push_bind(c.last_id.0)
                    .push_bind(c.last_active_at);
            });
            q.push(" ON DUPLICATE KEY UPDATE last_seq = VALUES(last_seq), last_msg_id = VALUES(last_msg_id), last_active_at = VALUES(last_active_at)");
            q.build().execute(&mut *tx).await?;

            // 6. One outbox row for the whole batch, due a little later: the immediate
            // dispatch below normally finishes it first.
            let ids: Vec<String> = planned.iter().map(|p| p.3.to_string()).collect();
            let payload = serde_json::json!({ "ids": ids }).to_string();
            let res = sqlx::query(
                "INSERT INTO outbox_events (kind, payload, status, retry_count, next_retry_at, created_at, updated_at) VALUES ('fanout', ?, 'PENDING', 0, ?, ?, ?)",
            )
            .bind(payload)
            .bind((now + self.first_retry_delay_ms) as i64)
            .bind(now as i64)
            .bind(now as i64)
            .execute(&mut *tx)
            .await?;
            result.outbox_id = Some(res.last_insert_id());
        }
        // The batch's ids were drawn before its statements ran; if they took so long
        // (a lock wait, a stall) that a device sync may already have passed those ids,
        // the batch runs again with new ones.
        if let Some(oldest) = planned.iter().map(|p| p.3).min() {
            let age = now_ms().saturating_sub(oldest.unix_ms());
            if age > self.max_id_age_ms {
                tx.rollback().await?;
                metrics::counter!("herald_batches_redrawn_total").increment(1);
                return Err(CommitError::StaleIds(age));
            }
        }
        tx.commit().await?;

        result.committed = planned
            .iter()
            .map(|(i, _, seq, id)| {
                let e = &entries[*i];
                Committed {
                    id: *id,
                    tenant: e.tenant.clone(),
                    conv: e.conv.clone(),
                    seq: *seq,
                    sender: e.user.clone(),
                    sender_device: e.device.clone(),
                    cmid: e.cmid.clone(),
                    ts: now,
                    body: e.body.clone(),
                }
            })
            .collect();
        for ((tenant, conv), c) in convs {
            if c.changed {
                result.recipients.extend(c.devices.into_iter().map(|(user, joined_seq, device)| Recipient {
                    tenant: tenant.clone(),
                    conv: conv.clone(),
                    user,
                    joined_seq,
                    left_seq: None,
                    device,
                }));
            }
        }
        metrics::histogram!("herald_worker_commit_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("herald_worker_batch_size").record(entries.len() as f64);
        metrics::counter!("herald_messages_committed_total").increment(result.committed.len() as u64);
        Ok(result)
    }
}
/// The statement that locks a batch's conversations (`wanted`: sorted, distinct,
/// not empty), in key order so that concurrent batches never deadlock. It must lock
/// those rows only: a plan that scans the tenant's conversations would lock them all
/// and serialize every concurrent batch of the tenant.
fn lock_conversations(wanted: &[(&str, &str)]) -> QueryBuilder<'static, MySql> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT tenant_id, id, kind, created_at, last_seq, last_msg_id, last_active_at FROM conversations WHERE ",
    );
    push_pairs(&mut q, "tenant_id", "id", wanted);
    q.push(" ORDER BY tenant_id, id FOR UPDATE");
    q
}

#[cfg(test)]
mod tests {
    use sqlx::{Connection, Executor};

    use super::*;

    /// The MySQL server the tests use (`IT_MYSQL_URL`, default the local one).
    fn mysql_base() -> String {
        std::env::var("IT_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
    }

    /// A batch of a few hundred conversations locks those without waiting for a
    /// concurrent batch's other conversations of the same tenant. Before: past ~150
    /// pairs MariaDB read the `(a AND b) OR ...` form through the tenant's key prefix,
    /// so its locking read waited on every conversation of the tenant that another
    /// batch held: concurrent batches of a tenant ran one after the other.
    #[tokio::test]
    async fn a_batch_locks_only_its_own_conversations() {
        let name = format!("herald_ut_locks_{:08x}", rand::random::<u32>());
        let url = format!("{}/{name}", mysql_base());
        herald_shared::db::migrate(&url).await.expect("a fresh schema");
        let db = herald_shared::db::pool(&url, 2, None).expect("pool");
        let mut q =
            QueryBuilder::<MySql>::new("INSERT INTO conversations (tenant_id, id, kind, created_at, last_active_at) ");
        // Ids as long as the load-test's, in a table of several pages.
        let ids: Vec<String> = (0..1_000).map(|i| format!("1a22fb1d16b-c{i:04}")).collect();
        q.push_values(&ids, |mut b, id| {
            b.push_bind("t").push_bind(id).push_bind("direct").push_bind(0i64).push_bind(0i64);
        });
        q.build().execute(&db).await.expect("conversations");
        db.execute("ANALYZE TABLE conversations").await.expect("statistics");

        // A concurrent batch holds another conversation of the tenant.
        let mut other = db.begin().await.expect("the other batch");
        sqlx::query("SELECT id FROM conversations WHERE tenant_id = 't' AND id = '1a22fb1d16b-c0999' FOR UPDATE")
            .fetch_all(&mut *other)
            .await
            .expect("the other batch's lock");
        let wanted: Vec<(&str, &str)> = ids[..300].iter().map(|id| ("t", id.as_str())).collect();
        let mut tx = db.begin().await.expect("the batch");
        sqlx::query("SET SESSION innodb_lock_wait_timeout = 1").execute(&mut *tx).await.expect("timeout");
        let locked = lock_conversations(&wanted).build().fetch_all(&mut *tx).await;
        drop((tx, other));
        db.close().await;
        let mut conn = sqlx::MySqlConnection::connect(&mysql_base()).await.expect("mysql");
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{name}`")).execute(&mut conn).await;
        let locked = locked.expect("the batch waited for a conversation outside it");
        assert_eq!(locked.len(), 300);
    }
}
