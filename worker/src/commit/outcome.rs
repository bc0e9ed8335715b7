//! What a commit answers for each entry of its batch, and how a failed commit is
//! classified (run again, wait, find the poison entry, or stop).

use herald_shared::error::ErrorCode;
use herald_shared::protocol::SendResult;

use crate::batch::{Committed, Recipient};
use crate::lease::NoIdLease;

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

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    NoIds(#[from] NoIdLease),
    /// Another worker took the shard since this one's lease: it must stop.
    #[error("shard {0} was taken over (fencing token moved on)")]
    Fenced(u32),
    /// Redis did not say which seqs its conversations' devices may hold.
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
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
            CommitError::NoIds(_) | CommitError::Redis(_) => Failure::Transient,
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

impl BatchResult {
    /// Every one of `n` entries refused, nothing committed.
    pub fn refused(n: usize, code: ErrorCode, message: &str) -> BatchResult {
        BatchResult { outcomes: vec![Outcome::Rejected(code, message.into()); n], ..BatchResult::default() }
    }
}
