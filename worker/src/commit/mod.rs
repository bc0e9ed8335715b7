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
use crate::lease::IdSource;

mod fence;
mod outcome;
#[cfg(test)]
mod tests;

pub use fence::Fence;
pub use outcome::{BatchResult, CommitError, Failure, Outcome};

/// The answer to a cmid reused for another conversation.
const CMID_REUSED: &str = "this cmid was already used for a message to another conversation";

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
