//! The worker's check of its MySQL server at start ([`at_start`]): a flavour and version
//! whose statements give Herald's guarantees, the writable primary (not a replica or a
//! reader endpoint), and a packet that holds a full batch. Anything wrong and the worker
//! refuses to start, saying what and how to fix it. The role is checked again now and
//! then (`herald_shared::mysql_server::report_role`).

use std::time::Duration;

use herald_shared::config::Config;
use herald_shared::mysql_server::{inspect, Dialect, ServerInfo};
use sqlx::MySqlPool;

use crate::committer::SCRIPT_OVERHEAD;

/// The server, once it answers; an error naming every problem when Herald cannot run on
/// it. Waits (and says so) while MySQL does not answer.
pub async fn at_start(db: &MySqlPool, cfg: &Config) -> Result<(ServerInfo, Dialect), String> {
    let server = loop {
        match inspect(db).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!(error = %e, "MySQL server not inspected yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let mut problems = server.role_problems();
    let dialect = server.dialect().map_err(|e| problems.insert(0, e)).ok();
    problems.extend(server.packet_problem(cfg.worker.batch_max_bytes, SCRIPT_OVERHEAD));
    if let Some(warning) = server.unchecked() {
        tracing::warn!(server = %server.version, "{warning}");
    }
    match dialect {
        Some(dialect) if problems.is_empty() => {
            tracing::info!(server = %server.version, comment = %server.comment, ?dialect,
                max_allowed_packet = server.max_allowed_packet, "MySQL server checked");
            metrics::gauge!("herald_mysql_primary").set(1.0);
            Ok((server, dialect))
        }
        _ => Err(problems.join("; ")),
    }
}
