//! The commit pipeline: one MySQL transaction per batch of ingress entries.
//!
//! A batch holds the entries of one shard or of several (a group commit, see
//! `group.rs`), with the fencing token of each.
//!
//! In one transaction: check the fencing tokens; lock the conversations in a
//! fixed order; check membership; number the messages (`seq`) in stream order; insert
//! them in one multi-row statement; move the conversations' `last_seq`; write one
//! outbox row covering the batch. Nothing is acknowledged before COMMIT returns. The
//! transaction is two round trips: a script of the reads, and one of the writes with
//! COMMIT (`herald_shared::sql_script`); on MySQL, which cannot cap a write statement, three: the writes,
//! then COMMIT once the ids' age is checked (`herald_shared::mysql_server::Dialect`). The
//! members and devices come from the recipients cache (`recipients.rs`) while they have
//! not changed; a conversation it does not hold as of now costs one more round trip.
//! Repeats of committed messages (same tenant, sender and cmid) are refused by the
//! unique key; only then does the batch run again, looking them up first.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use herald_shared::db::TextColumns;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::mysql_server::Dialect;
use herald_shared::names::NameMap;
use herald_shared::protocol::{IngressEntry, SendResult};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::Row;

use crate::batch::{live_since, Committed, Recipient};
use crate::lease::IdSource;
use crate::seq_floor::SeqFloors;

mod connections;
mod errors;
mod fence;
mod numbering;
mod outcome;
mod recipients;
#[cfg(test)]
mod tests;

use connections::CommitConnections;
pub use errors::Failure;
pub use fence::Fence;
use herald_shared::sql_script::Script;
use numbering::number;
pub use outcome::{BatchResult, CommitError, Outcome};
use recipients::{Device, Members, ReadAt, Recipients};

/// The answer to a cmid reused for another request (another conversation or body, or
/// a timeline change).
const CMID_REUSED: &str = "this cmid was already used for another message or change";

/// The rows committed before under the batch's keys (tenant, sender, cmid), found by
/// an entry's borrowed names (`herald_shared::names`).
type Repeats = NameMap<(String, String, String), Repeat>;

/// A row committed before under an entry's key, as the lookup found it.
#[derive(Clone, Debug)]
pub(crate) struct Repeat {
    /// Its answer, `dup: true`.
    result: SendResult,
    /// It is a timeline change, not a message.
    change: bool,
    /// What its request asked for (`None` on rows older than digests).
    digest: Option<u64>,
}

impl Repeat {
    /// `e` is the request that made this row again (not another use of its key).
    fn answers(&self, e: &IngressEntry) -> bool {
        !self.change && self.result.conv == e.conv && self.digest.is_none_or(|d| d == e.digest())
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

/// Time kept back from the ids' freshness for the round trip and COMMIT itself.
const COMMIT_MARGIN_MS: u64 = 50;
/// The shortest cap a write statement is given; with less time left the batch is
/// numbered again at once.
const MIN_STATEMENT_MS: u64 = 10;

/// MariaDB's error number, when `e` is an error MariaDB answered.
fn mysql_error(e: &sqlx::Error) -> Option<(u16, &str)> {
    match e {
        sqlx::Error::Database(d) => {
            d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|m| (m.number(), d.message()))
        }
        _ => None,
    }
}

/// A message insert refused because (tenant, sender, cmid) was committed before (1062
/// on the client message key).
fn is_repeat(e: &sqlx::Error) -> bool {
    mysql_error(e).is_some_and(|(n, message)| n == 1062 && message.contains("uq_client_msg"))
}

/// Reads the (tenant, sender, cmid, id, conv, seq, created_at, is a change, request
/// digest) of the entries' keys found in `table` (`messages`, or `message_keys` of
/// messages retention deleted); `is_change` is the SQL of the fourth column.
fn lookup_keys(reads: &mut Script, table: &str, is_change: &str, entries: &[IngressEntry]) {
    reads.push(" SELECT tenant_id, sender_id, client_msg_id, id, conv_id, seq, created_at, ");
    reads.push(is_change).push(", op_digest FROM ").push(table).push(" WHERE ");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            reads.push(" OR ");
        }
        reads.push("(tenant_id = ").str(&e.tenant).push(" AND sender_id = ").str(&e.user);
        reads.push(" AND client_msg_id = ").str(&e.cmid).push(")");
    }
    reads.push(";");
}

#[derive(Debug)]
pub struct CommitPipeline {
    conns: CommitConnections,
    /// How the ids are kept fresh until COMMIT on this server.
    dialect: Dialect,
    first_retry_delay_ms: u64,
    /// Devices unseen this long are no recipients (`delivery.device_ttl_s`).
    device_ttl_ms: u64,
    /// Ids older than this may not be committed any more (`delivery.sync_settle_ms`
    /// halved): device sync returns ids once they are older than the settle time, so a
    /// later commit below them would be skipped.
    max_id_age_ms: u64,
    /// Retention deletes messages (or did): their keys are looked up in `message_keys`
    /// too, so a resend of a deleted message is still a repeat.
    pub keys_outlive_messages: bool,
    /// The seqs devices may hold, which a `last_seq` gone back must not reuse.
    floors: Arc<SeqFloors>,
    /// The conversations' members and devices kept between commits (`recipients.rs`).
    recipients: Recipients,
}

struct ConvState {
    kind: String,
    created_at: i64,
    last_seq: u64,
    /// `last_seq` as the lock read it.
    read_seq: u64,
    last_id: MsgId,
    last_active_at: i64,
    /// The current members and their live devices.
    members: Arc<Members>,
    changed: bool,
}

impl CommitPipeline {
    /// Commits on connections of `db`, keeping up to `commits_in_flight` of them between
    /// commits (`connections.rs`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        db: MySqlPool,
        commits_in_flight: usize,
        first_retry_delay_ms: u64,
        sync_settle_ms: u64,
        device_ttl_ms: u64,
        dialect: Dialect,
        floors: Arc<SeqFloors>,
        recipient_cache_devices: usize,
    ) -> Self {
        CommitPipeline {
            floors,
            recipients: Recipients::new(recipient_cache_devices),
            conns: CommitConnections::new(db, commits_in_flight),
            dialect,
            first_retry_delay_ms,
            max_id_age_ms: sync_settle_ms / 2,
            device_ttl_ms,
            keys_outlive_messages: false,
        }
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
        let convs: Vec<(&str, &str)> = entries.iter().map(|e| (e.tenant.as_str(), e.conv.as_str())).collect();
        self.floors.prefetch(&convs).await;
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
        let mut conn = self.conns.take().await?;
        let result = self.run(&mut conn, entries, ids, fences, dedup).await;
        if result.is_ok() {
            self.conns.give_back(conn);
        } else {
            // The scripts stop at their first error, so the transaction may still be
            // open: rolled back, or the connection is not used again.
            let mut rollback = Script::default();
            rollback.push("ROLLBACK");
            if rollback.run(&mut conn).await.is_ok() {
                self.conns.give_back(conn);
            }
        }
        let result = result?;
        metrics::histogram!("herald_worker_commit_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("herald_worker_batch_size").record(entries.len() as f64);
        metrics::counter!("herald_messages_committed_total").increment(result.committed.len() as u64);
        Ok(result)
    }

    /// The transaction, in two round trips: the reads script, then the writes script
    /// (once the batch is numbered here) ending in COMMIT, its statements capped so that
    /// the ids are still fresh when COMMIT runs.
    async fn run(
        &self,
        conn: &mut MySqlConnection,
        entries: &[IngressEntry],
        ids: &IdSource,
        fences: &[Fence],
        dedup: Dedup,
    ) -> Result<BatchResult, CommitError> {
        let now = now_ms();
        // The conversations of the batch, sorted: locked in key order, so concurrent
        // batches never deadlock. (With repeats looked up, those of the repeats too:
        // locking one more conversation is harmless, a round trip more is not.)
        let mut wanted: Vec<(&str, &str)> = entries.iter().map(|e| (e.tenant.as_str(), e.conv.as_str())).collect();
        wanted.sort();
        wanted.dedup();

        let mut reads = Script::default();
        // 0. Still the owner of every shard of the batch? The shared lock holds a new
        // owner's token bump off until this transaction ends.
        reads.push("BEGIN; SELECT shard, token FROM shard_fences WHERE shard IN (");
        for (i, f) in fences.iter().enumerate() {
            if i > 0 {
                reads.push(", ");
            }
            reads.int(f.shard);
        }
        reads.push(") LOCK IN SHARE MODE;");
        // 1. Repeats of already committed messages (when a first try found there are),
        // and of messages retention deleted, whose keys outlive them (`message_keys`).
        if dedup == Dedup::Lookup {
            lookup_keys(&mut reads, "messages", "event IS NOT NULL", entries);
        }
        if self.keys_outlive_messages {
            lookup_keys(&mut reads, "message_keys", "0", entries);
        }
        // 2. The conversations, locked. Their current members and those members' live
        // devices (the membership check and the fan-out's recipients) come from the
        // recipients cache when it holds them as of this `last_seq` and of the tenant's
        // device epoch, read under the locks and before any device is
        // (`recipients.rs`); otherwise they are read under the locks (READ COMMITTED: as
        // of now), in one more round trip, or in this one with the cache off.
        reads.push(" ");
        lock_conversations(&mut reads, &wanted);
        let mut tenants: Vec<&str> = wanted.iter().map(|(t, _)| *t).collect();
        tenants.dedup();
        reads.push("; SELECT tenant_id, epoch FROM device_epochs WHERE tenant_id IN (");
        for (i, t) in tenants.iter().enumerate() {
            reads.push(if i > 0 { ", " } else { "" }).str(t);
        }
        reads.push(")");
        let live_since = live_since(self.device_ttl_ms);
        let caching = self.recipients.generation();
        if caching.is_none() {
            reads.push("; ");
            read_recipients(&mut reads, &wanted, live_since);
        }
        let mut sets = reads.run(&mut *conn).await?.into_iter().map(|(rows, _)| rows).skip(1);
        let mut next = || sets.next().ok_or_else(|| sqlx::Error::Protocol("the reads script answered short".into()));

        let tokens: HashMap<u32, u64> =
            next()?.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect::<Result<_, sqlx::Error>>()?;
        if let Some(f) = fences.iter().find(|f| tokens.get(&f.shard) != Some(&f.token)) {
            return Err(CommitError::Fenced(f.shard));
        }
        let mut existing = Repeats::default();
        let lookups = usize::from(dedup == Dedup::Lookup) + usize::from(self.keys_outlive_messages);
        for _ in 0..lookups {
            for row in next()? {
                let key = (row.text(0)?, row.text(1)?, row.text(2)?);
                let result = SendResult {
                    id: MsgId(row.try_get::<u64, _>(3)?),
                    conv: row.text(4)?,
                    seq: row.try_get(5)?,
                    ts: row.try_get::<i64, _>(6)? as u64,
                    dup: true,
                };
                let change = row.try_get::<i64, _>(7)? == 1;
                existing.insert(key, Repeat { result, change, digest: row.try_get(8)? });
            }
        }
        let mut convs: BTreeMap<(String, String), ConvState> = BTreeMap::new();
        // Those whose recipients are read, with what they are read under.
        let mut unread: Vec<((String, String), ReadAt)> = Vec::new();
        let locked = next()?;
        let mut epochs: HashMap<String, u64> = HashMap::new();
        for row in next()? {
            epochs.insert(row.text(0)?, row.try_get(1)?);
        }
        let epoch_of = |tenant: &str| epochs.get(tenant).copied().unwrap_or(0);
        for row in locked {
            let (tenant, conv) = (row.text(0)?, row.text(1)?);
            let at = ReadAt { created_at: row.try_get(3)?, last_seq: row.try_get(4)?, epoch: epoch_of(&tenant) };
            let cached = caching.and_then(|_| self.recipients.get(&tenant, &conv, at, live_since));
            let members = cached.unwrap_or_else(|| {
                unread.push(((tenant.clone(), conv.clone()), at));
                Arc::default()
            });
            convs.insert(
                (tenant, conv),
                ConvState {
                    kind: row.text(2)?,
                    created_at: at.created_at,
                    last_seq: at.last_seq,
                    read_seq: at.last_seq,
                    last_id: MsgId(row.try_get::<Option<u64>, _>(5)?.unwrap_or(0)),
                    last_active_at: row.try_get(6)?,
                    members,
                    changed: false,
                },
            );
        }
        if !unread.is_empty() {
            let rows = if caching.is_some() {
                let mut script = Script::default();
                let pairs: Vec<(&str, &str)> = unread.iter().map(|((t, c), _)| (t.as_str(), c.as_str())).collect();
                read_recipients(&mut script, &pairs, live_since);
                metrics::counter!("herald_recipient_reads_total").increment(1);
                script.run(&mut *conn).await?.into_iter().next().map(|(rows, _)| rows).unwrap_or_default()
            } else {
                next()?
            };
            let mut read: BTreeMap<(String, String), Members> = BTreeMap::new();
            for row in rows {
                let m = read.entry((row.text(0)?, row.text(1)?)).or_default();
                let user = row.text(2)?;
                if let Some(device) = row.opt_text(4)? {
                    m.devices.push(Device {
                        user: user.clone(),
                        joined_seq: row.try_get(3)?,
                        device,
                        push: row.try_get::<Option<i64>, _>(5)? == Some(1),
                        last_seen_at: row.try_get(6)?,
                    });
                }
                m.users.insert(user);
            }
            for (key, at) in unread {
                let members = Arc::new(read.remove(&key).unwrap_or_default());
                if let Some(generation) = caching {
                    self.recipients.put(generation, &key.0, &key.1, at, members.clone());
                }
                if let Some(state) = convs.get_mut(&key) {
                    state.members = members;
                }
            }
        }

        // Seqs that went back are never numbered from (`seq_floor.rs`).
        let lift = convs.iter_mut().map(|((t, c), s)| (t.as_str(), c.as_str(), &mut s.last_seq));
        self.floors.lift(lift).await?;

        // 3. Number the new messages in stream order.
        let (mut result, planned) = number(entries, &existing, &mut convs, ids, now)?;

        // The batch's ids are drawn now; they must still be fresh when COMMIT runs (a
        // device sync returns ids once they are older than the settle time, so a later
        // commit below them would be skipped). The writes go with COMMIT in one round
        // trip, each statement capped at a third of the time left: one held up (a lock
        // wait, a stall) fails instead, and the batch runs again with new ids.
        let oldest = planned.iter().map(|p| p.3).min();
        let cap = match oldest {
            Some(oldest) => {
                let age = now_ms().saturating_sub(oldest.unix_ms());
                let left = self.max_id_age_ms.saturating_sub(age + COMMIT_MARGIN_MS);
                if left < 3 * MIN_STATEMENT_MS {
                    metrics::counter!("herald_batches_redrawn_total").increment(1);
                    return Err(CommitError::StaleIds(age));
                }
                self.dialect.write_cap(left / 3)
            }
            None => String::new(),
        };
        let mut writes = Script::default();
        if !planned.is_empty() {
            // 4. The messages, in one statement.
            writes.push(&cap).push(
                "INSERT INTO messages (id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at, op_digest) VALUES ",
            );
            for (n, (i, _, seq, id)) in planned.iter().enumerate() {
                let e = &entries[*i];
                writes.push(if n > 0 { ", (" } else { "(" }).int(id.0).push(", ").str(&e.tenant).push(", ");
                writes.str(&e.conv).push(", ").int(*seq).push(", ").str(&e.user).push(", ").str(&e.device);
                writes.push(", ").str(&e.cmid).push(", ").str(&e.body).push(", ").int(now);
                writes.push(", ").int(e.digest()).push(")");
            }
            // 5. The conversations' new positions, in one statement (the rows exist and are locked).
            writes.push("; ").push(&cap).push(
                "INSERT INTO conversations (tenant_id, id, kind, created_at, last_seq, last_msg_id, last_active_at) VALUES ",
            );
            for (n, ((t, id), c)) in convs.iter().filter(|(_, c)| c.changed).enumerate() {
                writes.push(if n > 0 { ", (" } else { "(" }).str(t).push(", ").str(id).push(", ").str(&c.kind);
                writes.push(", ").int(c.created_at).push(", ").int(c.last_seq).push(", ").int(c.last_id.0);
                writes.push(", ").int(c.last_active_at).push(")");
            }
            writes.push(
                " ON DUPLICATE KEY UPDATE last_seq = VALUES(last_seq), last_msg_id = VALUES(last_msg_id), \
                 last_active_at = VALUES(last_active_at)",
            );
            // 6. One outbox row for the whole batch, due a little later: the immediate
            // dispatch normally finishes it first.
            let ids: Vec<String> = planned.iter().map(|p| p.3.to_string()).collect();
            let payload = serde_json::json!({ "ids": ids }).to_string();
            writes.push("; ").push(&cap).push("INSERT INTO outbox_events (kind, payload, status, retry_count, next_retry_at, created_at, updated_at) VALUES ('fanout', ");
            writes.str(&payload).push(", 'PENDING', 0, ").int(now + self.first_retry_delay_ms).push(", ");
            writes.int(now).push(", ").int(now).push(")");
            if self.dialect.commits_with_writes() {
                writes.push("; COMMIT");
            }
            let is_timeout =
                |e: &sqlx::Error| mysql_error(e).is_some_and(|(n, _)| self.dialect.is_statement_timeout(n));
            let done = match writes.run(&mut *conn).await {
                Ok(done) => done,
                Err(e) if is_timeout(&e) => {
                    metrics::counter!("herald_batches_redrawn_total").increment(1);
                    let age = oldest.map_or(0, |o| now_ms().saturating_sub(o.unix_ms()));
                    return Err(CommitError::StaleIds(age));
                }
                Err(e) => return Err(e.into()),
            };
            let outbox = done.get(2).ok_or_else(|| sqlx::Error::Protocol("the writes script answered short".into()))?;
            result.outbox_id = Some(outbox.1.last_insert_id());
            if !self.dialect.commits_with_writes() {
                self.commit_if_fresh(conn, oldest).await?;
            }
        } else {
            // Nothing new (repeats, refusals): the reads' locks go.
            let mut commit = Script::default();
            commit.push("COMMIT");
            commit.run(&mut *conn).await?;
        }

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
                    event: None,
                    trace: None,
                }
            })
            .collect();
        for ((tenant, conv), c) in convs {
            if c.changed {
                self.floors.remember(&tenant, &conv, c.last_seq);
                // Committed under the lock the read took, with no member change.
                self.recipients.advance(&tenant, &conv, c.read_seq, c.last_seq);
                result.recipients.extend(c.members.devices.iter().map(|d| Recipient {
                    tenant: tenant.clone(),
                    conv: conv.clone(),
                    user: d.user.clone(),
                    joined_seq: d.joined_seq,
                    left_seq: None,
                    device: d.device.clone(),
                    push: d.push,
                }));
            }
        }
        Ok(result)
    }
}

impl CommitPipeline {
    /// Whether every live gateway and worker raises device epochs, so that the
    /// recipients cache may be used (`recipients.rs`).
    pub fn allow_recipient_cache(&self, allowed: bool) {
        self.recipients.allow(allowed);
    }

    /// Where writes cannot be capped (MySQL): COMMIT only if the ids are still fresh
    /// now that the writes are done; otherwise the batch runs again with new ones (the
    /// caller rolls back).
    async fn commit_if_fresh(&self, conn: &mut MySqlConnection, oldest: Option<MsgId>) -> Result<(), CommitError> {
        let age = oldest.map_or(0, |o| now_ms().saturating_sub(o.unix_ms()));
        if age + COMMIT_MARGIN_MS > self.max_id_age_ms {
            metrics::counter!("herald_batches_redrawn_total").increment(1);
            return Err(CommitError::StaleIds(age));
        }
        let mut commit = Script::default();
        commit.push("COMMIT");
        commit.run(conn).await?;
        Ok(())
    }
}

/// The statement that reads the current members of `pairs` (sorted) and their devices
/// seen since `live_since` and not expired (the janitor frees those unseen for the TTL):
/// (tenant, conversation, user, joined_seq, device, has a push token, last seen).
fn read_recipients(script: &mut Script, pairs: &[(&str, &str)], live_since: i64) {
    script.push(
        "SELECT m.tenant_id, m.conv_id, m.user_id, m.joined_seq, d.device_id, d.push_token IS NOT NULL, d.last_seen_at \
         FROM members m LEFT JOIN devices d ON d.tenant_id = m.tenant_id AND d.user_id = m.user_id \
         AND d.expired_at IS NULL AND d.last_seen_at >= ",
    );
    script.int(live_since).push(" WHERE m.left_seq IS NULL AND ");
    script.pairs("m.tenant_id", "m.conv_id", pairs);
}

/// The statement that locks a batch's conversations (`wanted`: sorted, distinct,
/// not empty), in key order so that concurrent batches never deadlock. It must lock
/// those rows only: a plan that scans the tenant's conversations would lock them all
/// and serialize every concurrent batch of the tenant.
fn lock_conversations(script: &mut Script, wanted: &[(&str, &str)]) {
    script.push(
        "SELECT tenant_id, id, kind, created_at, last_seq, last_msg_id, last_active_at FROM conversations WHERE ",
    );
    script.pairs("tenant_id", "id", wanted);
    script.push(" ORDER BY tenant_id, id FOR UPDATE");
}
