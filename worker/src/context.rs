//! What the worker's tasks share: configuration, pools, and the pipeline's parts.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use herald_shared::config::Config;
use herald_shared::keys::Keys;
use herald_shared::otel::Tracer;
use sqlx::mysql::MySqlPool;

use crate::commit::CommitPipeline;
use crate::delivered::DeliveredPositions;
use crate::fanout::Fanout;
use crate::lease::IdSource;
use crate::outbox::Outbox;
use crate::push::PushStore;
use crate::reads::ReadReceipts;
use crate::timeline::TimelineCommitter;

/// What every task of the worker shares.
#[derive(Debug)]
pub struct WorkerContext {
    pub cfg: Config,
    pub db: MySqlPool,
    /// The MySQL server as checked at start (its packet limit bounds commits).
    pub server: herald_shared::mysql_server::ServerInfo,
    pub redis: fred::prelude::Pool,
    pub keys: Keys,
    pub ids: IdSource,
    pub commit: CommitPipeline,
    pub fanout: Arc<Fanout>,
    pub outbox: Arc<Outbox>,
    pub reads: ReadReceipts,
    pub delivered: DeliveredPositions,
    /// Membership, title and role changes, recalls and edits.
    pub timeline: TimelineCommitter,
    /// Offline push notifications (the admin API lists them).
    pub push: Arc<PushStore>,
    /// Outbox events dispatched right after commit, to be marked SENT in batches.
    pub sent_marks: tokio::sync::mpsc::Sender<u64>,
    /// The last lease round succeeded (Redis reachable, ids leased).
    pub balancer_ok: AtomicBool,
    /// Where the spans of traced sends start (`crate::spans`); off unless `otel.endpoint` is set.
    pub tracer: Tracer,
}
