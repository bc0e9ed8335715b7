//! What a commit answers for each entry of its batch, and how a failed commit is
//! classified (`errors.rs`: run again, wait, find the poison entry, or stop).

use herald_shared::error::ErrorCode;
use herald_shared::protocol::SendResult;

use super::errors::{classify, mysql_code, Failure};
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

impl CommitError {
    pub fn failure(&self) -> Failure {
        match self {
            CommitError::Fenced(_) => Failure::Fenced,
            CommitError::NoIds(_) | CommitError::Redis(_) => Failure::Transient,
            CommitError::StaleIds(_) => Failure::Conflict,
            CommitError::Db(e) => match mysql_code(e) {
                Some((number, state)) => classify(number, &state),
                // No answer from the server: the connection, the pool, the protocol.
                None => Failure::Transient,
            },
        }
    }

    /// A batch the server refused for a reason of its own (read-only, disk full, a
    /// privilege, a statement it does not know): counted for the alert
    /// (`HeraldMysqlRefusesCommits`) and logged; the batch waits.
    pub fn report_refusal(&self, shard: u32, attempt: u32) {
        let code = self.mysql_number().map_or_else(|| "none".to_owned(), |n| n.to_string());
        metrics::counter!("herald_mysql_refusals_total", "code" => code).increment(1);
        metrics::counter!("herald_mysql_errors_total").increment(1);
        tracing::error!(shard, error = %self, attempt,
            "MySQL refuses commits for a reason that is not the messages' (read-only? disk full? a privilege?); waiting");
    }

    /// The MySQL error number, for the refusal metric's label.
    pub fn mysql_number(&self) -> Option<u16> {
        match self {
            CommitError::Db(e) => mysql_code(e).map(|(n, _)| n),
            _ => None,
        }
    }
}

impl BatchResult {
    /// Every one of `n` entries refused, nothing committed.
    pub fn refused(n: usize, code: ErrorCode, message: &str) -> BatchResult {
        BatchResult { outcomes: vec![Outcome::Rejected(code, message.into()); n], ..BatchResult::default() }
    }
}
