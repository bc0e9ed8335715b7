//! A commit checked on the server, in one round trip (MariaDB).
//!
//! The commit of `mod.rs` takes two round trips: the reads (fencing tokens, the
//! conversations under their locks, the tenants' device epochs), then, once the batch
//! is numbered here, the writes with COMMIT. When this process committed last to every
//! conversation of a batch, its recipients cache (`recipients.rs`) holds what those
//! reads would answer: each conversation's `created_at`, `last_seq`, `last_msg_id`,
//! kind, members and live devices, and its tenant's device epoch. The batch is then
//! numbered from what is held, and one anonymous block (`BEGIN NOT ATOMIC ... END`)
//! takes the same locks in the same order, checks under them that the fencing tokens,
//! the conversations and the epochs are what the numbering assumed, writes, and commits.
//!
//! When anything differs (another writer moved a conversation, a member changed, a
//! device changed, the shard was taken over), when a lock is held by another
//! transaction (the locking reads do not wait: `NOWAIT`), or when the block ran past
//! the time the ids stay fresh, the block rolls back and signals; the batch then runs
//! the two-round-trip commit on the same connection, with new ids. So every guarantee
//! is checked where the two-round-trip commit checks it, under the same locks: the
//! fence before anything is written, the seqs numbered from the `last_seq` the lock
//! holds, the recipients as of that `last_seq` and epoch, COMMIT only while the ids
//! are fresh.
//!
//! `max_statement_time` does not reach the statements of a compound statement, so the
//! block times itself: before COMMIT it compares the time it has run with what was left
//! of the ids' freshness when it was sent (the margin kept back covers the trip).

use std::collections::BTreeMap;

use herald_shared::ids::now_ms;
use herald_shared::protocol::IngressEntry;
use herald_shared::sql_script::Script;
use sqlx::mysql::MySqlConnection;
use sqlx::Row;

use super::numbering::{number, Planned};
use super::{mysql_error, push_writes, BatchResult, CommitError, CommitPipeline, ConvState, Dedup, Repeats};
use super::{Fence, COMMIT_MARGIN_MS, MIN_STATEMENT_MS};
use crate::batch::live_since;
use crate::lease::IdSource;

/// The text every refusal of the block starts with.
const REFUSED: &str = "herald: commit refused: ";

/// The block refused the batch (what it assumed moved, a lock was held, its time ran
/// out): the two-round-trip commit runs it instead.
fn is_refusal(e: &sqlx::Error) -> bool {
    // 1644: a SIGNAL of the block; 1205: a locking read found the row locked (NOWAIT).
    mysql_error(e).is_some_and(|(n, message)| (n == 1644 && message.starts_with(REFUSED)) || n == 1205)
}

/// `IF <failed> THEN` refuse with `why` (the block's handler rolls back).
fn refuse_if(block: &mut Script, failed: &str, why: &str) {
    block.push(" IF ").push(failed).push(" THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '");
    block.push(REFUSED).push(why).push("'; END IF;");
}

/// The block: the checks under the locks, the writes (`writes`: statements separated
/// by `;`), COMMIT if it ran for at most `left_ms`, and the outbox row's id.
fn block(
    fences: &[Fence],
    convs: &BTreeMap<(String, String), ConvState>,
    epochs: &BTreeMap<&str, u64>,
    writes: &Script,
    left_ms: u64,
) -> Script {
    let mut b = Script::default();
    b.push("BEGIN NOT ATOMIC DECLARE started DATETIME(6) DEFAULT SYSDATE(6); DECLARE n BIGINT DEFAULT 0;");
    // Any error (a refusal, a repeat refused by the unique key) rolls back and leaves
    // the session's lock wait as it was.
    b.push(" DECLARE wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;");
    b.push(" DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN SET SESSION innodb_lock_wait_timeout = wait; ROLLBACK; RESIGNAL; END;");
    // The locking reads do not wait for another transaction's locks (`NOWAIT` is not
    // allowed in a compound statement): a held lock refuses the block.
    b.push(" START TRANSACTION; SET SESSION innodb_lock_wait_timeout = 0;");
    // The fencing tokens, under the shared lock a new owner's bump waits for.
    b.push(" SELECT COUNT(*) INTO n FROM shard_fences WHERE shard IN (");
    for (i, f) in fences.iter().enumerate() {
        b.push(if i > 0 { ", " } else { "" }).int(f.shard);
    }
    b.push(") AND (shard, token) IN (");
    for (i, f) in fences.iter().enumerate() {
        b.push(if i > 0 { ", (" } else { "(" }).int(f.shard).push(", ").int(f.token).push(")");
    }
    b.push(") LOCK IN SHARE MODE;");
    refuse_if(&mut b, &format!("n <> {}", fences.len()), "fenced");
    // The conversations, locked (in key order, as the point lookups read them), each
    // as the numbering assumed it.
    let pairs: Vec<(&str, &str)> = convs.keys().map(|(t, c)| (t.as_str(), c.as_str())).collect();
    b.push(" SELECT COUNT(*) INTO n FROM conversations WHERE ").pairs("tenant_id", "id", &pairs);
    b.push(" AND (tenant_id, id, created_at, last_seq, COALESCE(last_msg_id, 0)) IN (");
    for (i, ((t, c), s)) in convs.iter().enumerate() {
        b.push(if i > 0 { ", (" } else { "(" }).str(t).push(", ").str(c).push(", ").int(s.created_at);
        b.push(", ").int(s.read_seq).push(", ").int(s.read_id.0).push(")");
    }
    b.push(") FOR UPDATE; SET SESSION innodb_lock_wait_timeout = wait;");
    refuse_if(&mut b, &format!("n <> {}", convs.len()), "a conversation moved");
    // The tenants' device epochs, read after the locks, as the two-round-trip commit does.
    b.push(" SELECT COUNT(*) INTO n FROM device_epochs WHERE ");
    for (i, (t, e)) in epochs.iter().enumerate() {
        b.push(if i > 0 { " OR (" } else { "(" }).push("tenant_id = ").str(t).push(" AND epoch = ").int(*e).push(")");
    }
    b.push(";");
    refuse_if(&mut b, &format!("n <> {}", epochs.len()), "devices changed");
    b.push(" ").push(writes.as_str()).push(";");
    let left_us = left_ms * 1000;
    refuse_if(&mut b, &format!("TIMESTAMPDIFF(MICROSECOND, started, SYSDATE(6)) > {left_us}"), "out of time");
    b.push(" COMMIT; SELECT LAST_INSERT_ID(); END");
    b
}

impl CommitPipeline {
    /// Commits the batch in one round trip when every conversation of it is held by the
    /// recipients cache; `None` when it is not, or when the block refused (rolled back):
    /// the caller then runs the two-round-trip commit.
    pub(super) async fn commit_checked(
        &self,
        conn: &mut MySqlConnection,
        entries: &[IngressEntry],
        ids: &IdSource,
        fences: &[Fence],
        dedup: Dedup,
    ) -> Result<Option<BatchResult>, CommitError> {
        // Repeats looked up, or keys of deleted messages, are reads the block does not
        // make.
        if !self.dialect.runs_blocks()
            || dedup != Dedup::ByUniqueKey
            || self.keys_outlive_messages
            || fences.is_empty()
            || self.recipients.generation().is_none()
        {
            return Ok(None);
        }
        let live_since = live_since(self.device_ttl_ms);
        let mut convs: BTreeMap<(String, String), ConvState> = BTreeMap::new();
        let mut epochs: BTreeMap<&str, u64> = BTreeMap::new();
        for e in entries {
            if convs.keys().any(|(t, c)| *t == e.tenant && *c == e.conv) {
                continue;
            }
            // A tenant without an epoch row (no device ever registered) is read.
            let Some(known) = self.recipients.known(&e.tenant, &e.conv, live_since).filter(|k| k.at.epoch > 0) else {
                return Ok(None);
            };
            if *epochs.entry(&e.tenant).or_insert(known.at.epoch) != known.at.epoch {
                return Ok(None);
            }
            let state = ConvState {
                kind: known.kind,
                created_at: known.at.created_at,
                last_seq: known.at.last_seq,
                read_seq: known.at.last_seq,
                last_id: known.at.last_id,
                read_id: known.at.last_id,
                last_active_at: 0,
                members: known.members,
                changed: false,
            };
            convs.insert((e.tenant.clone(), e.conv.clone()), state);
        }

        // A seq floor above what is held: another writer of this process (a timeline
        // event) numbered past it, or seqs went back; the two-round-trip commit reads
        // the conversation and tells which (`seq_floor.rs`).
        let pairs: Vec<(&str, &str)> = convs.keys().map(|(t, c)| (t.as_str(), c.as_str())).collect();
        let floors = self.floors.highest(&pairs).await;
        if floors.iter().zip(convs.values()).any(|(floor, s)| *floor > s.last_seq) {
            return Ok(None);
        }
        let now = now_ms();
        let (mut result, planned) = number(entries, &Repeats::default(), &mut convs, ids, now)?;
        let Some(oldest) = planned.iter().map(|p: &Planned| p.3).min() else {
            // Nothing to write (refusals): the two-round-trip commit answers them.
            return Ok(None);
        };
        let age = now_ms().saturating_sub(oldest.unix_ms());
        let left = self.max_id_age_ms.saturating_sub(age + COMMIT_MARGIN_MS);
        if left < 3 * MIN_STATEMENT_MS {
            metrics::counter!("herald_batches_redrawn_total").increment(1);
            return Err(CommitError::StaleIds(age));
        }
        let mut writes = Script::default();
        push_writes(&mut writes, entries, &planned, &convs, "", now, now + self.first_retry_delay_ms);
        let block = block(fences, &convs, &epochs, &writes, left);
        let sets = match block.run(&mut *conn).await {
            Ok(sets) => sets,
            Err(e) if is_refusal(&e) => {
                tracing::debug!(error = %e, "checked commit refused; committing in two round trips");
                metrics::counter!("herald_checked_commits_total", "result" => "refused").increment(1);
                let mut rollback = Script::default();
                rollback.push("ROLLBACK");
                rollback.run(&mut *conn).await?;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let outbox = sets.iter().rev().find_map(|(rows, _)| rows.first());
        let outbox = outbox.ok_or_else(|| sqlx::Error::Protocol("the commit block answered no outbox id".into()))?;
        result.outbox_id = Some(outbox.try_get::<u64, _>(0)?);
        metrics::counter!("herald_checked_commits_total", "result" => "committed").increment(1);
        Ok(Some(self.finish(result, &planned, entries, convs, now)))
    }
}
