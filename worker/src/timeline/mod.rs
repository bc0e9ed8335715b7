//! Timeline changes (docs/protocol.md section 4.11): members added, removed or left, a
//! title or role changed, a message recalled or edited. Each comes through its
//! conversation's ingress stream like a send, so the shard's one consumer numbers it
//! in stream order with the conversation's messages; each is committed in a
//! transaction of its own ([`store`]), decided by the rules ([`rules`]) under the
//! conversation's lock, answered to the waiting gateway, and handed to the fan-out
//! stage after the sends committed before it.
//!
//! Changes are rare next to sends, so they do not join the group commit: a send batch
//! pays nothing for them but a look at each entry's kind.

pub mod rules;
mod store;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{NodeEnvelope, SendNotice, SendOutcome, TimelineEntry};
use sqlx::mysql::MySqlPool;

use crate::commit::{BatchResult, Failure, Fence};
use crate::lease::IdSource;
use crate::seq_floor::SeqFloors;
use herald_shared::sql_script::Script;
pub use store::Settings;

/// What a refused change's actor hears when MySQL refuses its data itself.
const POISON: &str = "the change could not be stored (the database refused it)";

/// Commits timeline changes, one transaction each.
#[derive(Debug)]
pub struct TimelineCommitter {
    pub db: MySqlPool,
    pub settings: Settings,
    /// The seqs devices may hold, which a `last_seq` gone back must not reuse.
    pub floors: Arc<SeqFloors>,
}

impl TimelineCommitter {
    /// Commits `e` (retrying while MySQL is away or the ids went stale): its answer,
    /// and what to fan out when it made events. `None` when the shard must stop
    /// (`keep_going` said no, or another worker took the shard) with `e` left pending.
    pub async fn commit(
        &self,
        e: &TimelineEntry,
        ids: &IdSource,
        fence: Fence,
        keep_going: impl Fn() -> bool,
    ) -> Option<(SendOutcome, Option<BatchResult>)> {
        let mut attempt: u32 = 0;
        loop {
            if !keep_going() {
                return None;
            }
            let err = match self.attempt(e, ids, fence).await {
                Ok(done) => {
                    metrics::counter!("herald_timeline_changes_total", "outcome" => outcome(&done.0)).increment(1);
                    return Some(done);
                }
                Err(err) => err,
            };
            attempt += 1;
            match err.failure() {
                Failure::Fenced => {
                    tracing::warn!(shard = fence.shard, "shard taken over by another worker; stopping");
                    return None;
                }
                Failure::Conflict => {
                    tracing::debug!(error = %err, attempt, "timeline change conflicted; running it again");
                    tokio::time::sleep(Duration::from_millis((20 * u64::from(attempt)).min(1_000))).await;
                }
                Failure::Transient => {
                    metrics::counter!("herald_mysql_errors_total").increment(1);
                    tracing::warn!(shard = fence.shard, error = %err, attempt, "timeline change failed; retrying");
                    tokio::time::sleep(Duration::from_millis((50 * u64::from(attempt)).min(1_000))).await;
                }
                Failure::Refused => {
                    err.report_refusal(fence.shard, attempt);
                    tokio::time::sleep(Duration::from_millis((200 * u64::from(attempt)).min(5_000))).await;
                }
                Failure::Poison | Failure::TooLarge => {
                    metrics::counter!("herald_ingress_poison_total").increment(1);
                    tracing::error!(shard = fence.shard, error = %err, tenant = %e.tenant, conv = %e.conv,
                        "the database refuses this timeline change; it is refused and the shard goes on");
                    let refused = SendOutcome::Err { code: ErrorCode::BadRequest, message: POISON.into() };
                    return Some((refused, None));
                }
            }
        }
    }

    /// Boxed: the transaction's future borrows its connection across statements, and
    /// only a concrete future proves it `Send` for the shard's task.
    fn attempt<'a>(
        &'a self,
        e: &'a TimelineEntry,
        ids: &'a IdSource,
        fence: Fence,
    ) -> BoxFuture<'a, Result<(SendOutcome, Option<BatchResult>), crate::commit::CommitError>> {
        Box::pin(async move {
            self.floors.prefetch(&[(e.tenant.as_str(), e.conv.as_str())]).await;
            let mut conn = self.db.acquire().await?;
            let result = store::attempt(&mut conn, e, ids, fence, self.settings, &self.floors).await;
            if result.is_err() {
                let mut rollback = Script::default();
                rollback.push("ROLLBACK");
                if rollback.run(&mut conn).await.is_err() {
                    // A connection whose transaction may still be open is not used again.
                    drop(conn.detach());
                }
            }
            result
        })
    }
}

fn outcome(o: &SendOutcome) -> &'static str {
    match o {
        SendOutcome::Timeline(events) if events.iter().any(|e| e.dup) => "repeat",
        SendOutcome::Timeline(events) if events.is_empty() => "unchanged",
        SendOutcome::Timeline(_) => "committed",
        SendOutcome::Err { code, .. } => code.as_str(),
        _ => "other",
    }
}

/// The notice that answers `e` on its gateway's node channel.
pub fn notice(e: &TimelineEntry, outcome: SendOutcome) -> BTreeMap<&str, NodeEnvelope> {
    let env = NodeEnvelope {
        sent: vec![SendNotice { rid: e.rid, echo: Some(e.echo()), outcome }],
        ..NodeEnvelope::default()
    };
    BTreeMap::from([(e.node.as_str(), env)])
}
