//! Every metric Herald exports, with its kind and the `# HELP` text `/metrics` shows,
//! described once when a process installs its recorder ([`describe_all`]). A test
//! keeps the catalog and the code in step both ways, and the chart's checks accept in
//! alerts and dashboards only metrics listed here.

/// What a metric is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its name, kind and help text.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

const fn counter(name: &'static str, help: &'static str) -> Metric {
    Metric { name, kind: Kind::Counter, help }
}

const fn gauge(name: &'static str, help: &'static str) -> Metric {
    Metric { name, kind: Kind::Gauge, help }
}

const fn histogram(name: &'static str, help: &'static str) -> Metric {
    Metric { name, kind: Kind::Histogram, help }
}

/// The catalog, by area.
pub const METRICS: &[Metric] = &[
    // Every process.
    gauge("herald_build_info", "Always 1; the labels name the running build (version, commit)."),
    counter("herald_task_restarts_total", "Background loops restarted after an error or panic, by task."),
    gauge(
        "herald_clock_offset_seconds",
        "This process's clock minus Redis's (TIME), in seconds: device sync assumes it within the bound.",
    ),
    gauge(
        "herald_clock_offset_bound_seconds",
        "How far this process's clock may be from Redis's: a quarter of delivery.sync_settle_ms.",
    ),
    counter(
        "herald_otel_spans_exported_total",
        "Spans the collector (otel.endpoint) took; none while tracing is off.",
    ),
    counter(
        "herald_otel_export_failures_total",
        "Batches of spans the collector refused or did not answer within otel.timeout_ms; their spans are lost.",
    ),
    // The standard process metrics (process_metrics.rs writes them, not the recorder).
    counter("process_cpu_seconds_total", "CPU time used by the process, user and system, in seconds."),
    gauge("process_resident_memory_bytes", "Resident memory of the process, in bytes."),
    gauge("process_virtual_memory_bytes", "Virtual memory of the process, in bytes."),
    gauge("process_open_fds", "Open file descriptors of the process."),
    gauge("process_max_fds", "The process's limit of open file descriptors (soft)."),
    gauge("process_start_time_seconds", "When the process started, in seconds since the Unix epoch."),
    gauge("process_threads", "Threads of the process."),
    // Gateway: sessions and frames.
    gauge("herald_gateway_sessions", "WebSocket sessions open on this gateway."),
    counter("herald_token_refreshes_total", "In-session token refreshes, by outcome (refreshed or refused)."),
    gauge("herald_auth_keys", "Keys that verify tokens on this gateway (shared secrets, trust file, JWKS URLs)."),
    counter(
        "herald_auth_key_refreshes_total",
        "Reads of the trust file and its JWKS, by outcome (ok, or failed: the last good keys stayed).",
    ),
    counter("herald_sessions_revoked_total", "Sessions closed because their token was revoked (close 4004)."),
    counter(
        "herald_sessions_closed_total",
        "WebSocket sessions ended, by reason (a close code's name, or client_gone).",
    ),
    counter("herald_frames_in_total", "Frames received from clients, by type."),
    counter("herald_frames_out_total", "Text frames written to clients."),
    counter("herald_protocol_errors_total", "Malformed or unexpected client frames."),
    counter("herald_rate_limited_total", "Requests and sessions refused by a limit, by limit (what)."),
    counter("herald_request_timeouts_total", "HTTP requests not received whole within gateway.request_timeout_ms."),
    counter("herald_write_timeouts_total", "Writes to a client that missed gateway.write_timeout_ms (session closed)."),
    // Gateway: sends.
    counter(
        "herald_sends_received_total",
        "Sends received, by transport (http, ws, server: the server API), before any check.",
    ),
    histogram(
        "herald_send_ack_seconds",
        "Time from a send's arrival to its answer (sent frame or HTTP response), by transport.",
    ),
    counter(
        "herald_send_timeouts_total",
        "Sends answered unavailable: no commit confirmed within gateway.send_timeout_ms, by transport (http, ws, server; timeline: a timeline change).",
    ),
    counter(
        "herald_read_timeouts_total",
        "Read positions answered unavailable: not confirmed within gateway.send_timeout_ms.",
    ),
    counter("herald_notices_mismatched_total", "Worker answers carrying another request's id; dropped."),
    // Gateway: delivery.
    counter("herald_deliveries_total", "Messages written to devices, by kind (realtime, backlog)."),
    histogram("herald_delivery_seconds", "Time from commit to the device's ack, by kind (realtime, backlog)."),
    counter("herald_pushes_total", "Pushes from the node channel to sessions, by outcome (dropped ones included)."),
    counter(
        "herald_ephemeral_total",
        "Typing and presence frames handed to sessions, by outcome (queued, dropped_full, or dropped_rate for typing frames over their limit, not_relayed for groups over gateway.typing_max_members).",
    ),
    counter("herald_acks_total", "Message ids acknowledged by devices."),
    counter("herald_acks_recorded_total", "Acked ids the node's ack writer removed from their pending sets."),
    counter(
        "herald_ack_queue_full_total",
        "Hand-overs of acked ids the node's ack writer's queue refused (the session keeps them and tries again).",
    ),
    counter("herald_acks_dropped_total", "Acked ids not removed before the node stopped (they are pushed again)."),
    counter(
        "herald_presence_changes_dropped_total",
        "Presence changes the node's announcer could not publish or had no room for (followers see the next one).",
    ),
    histogram(
        "herald_ingress_write_requests",
        "Requests (sends, reads, timeline changes) a gateway's ingress writer appended in one write.",
    ),
    gauge(
        "herald_ingress_packing",
        "1 while the gateway packs sends (every live worker reads packs), 0 while it writes an entry per send.",
    ),
    counter(
        "herald_ingress_queue_full_total",
        "Requests answered unavailable because the gateway's ingress writer queue was full.",
    ),
    counter(
        "herald_delivered_positions_reported_total",
        "Delivered positions (user, conversation) written into the ingress streams by the gateway.",
    ),
    counter(
        "herald_delivered_reports_dropped_total",
        "Delivered positions of sessions dropped because the node's report queue was full.",
    ),
    counter(
        "herald_status_frames_total",
        "Delivery status pushes at sessions that opted in, by outcome (shown, or held for the interval's end).",
    ),
    counter("herald_ack_timeouts_total", "Unacked pushes past gateway.ack_timeout_ms (the client is pinged)."),
    counter("herald_half_open_closes_total", "Sessions closed as half-open (4000): no pong, or writes stalled."),
    counter(
        "herald_dead_gateways_swept_total",
        "Dead gateway nodes whose presence entries this gateway cleared and whose users it announced offline.",
    ),
    counter("herald_heartbeat_timeouts_total", "Sessions closed for missing heartbeats."),
    counter("herald_backlog_throttled_total", "Backlog reads held by the per-device rate or waiting in the node budget's line."),
    gauge(
        "herald_backlog_budget_per_second",
        "The node's adaptive backlog budget, in messages per second (AIMD between its floor and ceiling).",
    ),
    counter("herald_backlog_budget_cuts_total", "Cuts of the node's backlog budget, by the signal over its target."),
    histogram("herald_event_loop_lag_seconds", "How late the gateway's 10 ms probe timer fires: its scheduling lag."),
    histogram(
        "herald_realtime_push_seconds",
        "Time from a realtime push's arrival on the node channel to its frame written to the socket.",
    ),
    histogram("herald_pending_at_connect", "Messages pending for a device when its session starts."),
    counter(
        "herald_node_channel_lagged_total",
        "Node channel notices missed by a slow session (its pending set is re-read).",
    ),
    // Gateway: devices, recovery, watermarks.
    counter("herald_devices_returned_total", "Expired devices that came back and were registered again."),
    histogram(
        "herald_device_registration_batch",
        "Devices registered by one batch (one SELECT, at most one UPDATE and one INSERT).",
    ),
    counter(
        "herald_redis_epochs_total",
        "New Redis epochs started by this gateway (Redis lost its data or is new, or a master was replaced).",
    ),
    counter(
        "herald_redis_promotions_total",
        "Redis shards (standalone: the one master) whose master changed its replication id: a promoted replica.",
    ),
    counter("herald_pending_rebuilds_total", "Pending sets rebuilt from MySQL after a Redis data loss."),
    counter("herald_watermark_flushes_total", "Batches of device watermarks written to MySQL."),
    counter("herald_watermark_rows_total", "Device watermark rows written to MySQL."),
    gauge(
        "herald_redis_noeviction",
        "1 when Redis runs maxmemory-policy noeviction, else 0 (read only while the check is on).",
    ),
    // Errors by dependency.
    gauge(
        "herald_dependency_up",
        "1 while the health loop reaches a dependency (mysql: with the schema applied; redis), else 0.",
    ),
    counter("herald_mysql_errors_total", "Requests failed by a MySQL error."),
    counter(
        "herald_mysql_refusals_total",
        "Commits MySQL refused for a reason not the messages' own (read-only, disk full, a privilege), by error number; retried.",
    ),
    gauge("herald_mysql_primary", "1 when the MySQL server is the writable primary (not read-only, not replicating)."),
    counter("herald_redis_errors_total", "Operations failed by a Redis error, by source."),
    // Worker: ingress and commits.
    gauge("herald_worker_owned_shards", "Ingress shards whose lease this worker holds."),
    gauge("herald_ingress_stream_length", "Entries in a shard's ingress stream, by shard."),
    gauge(
        "herald_ingress_oldest_age_seconds",
        "Age of the oldest entry of a shard's ingress stream, by shard, in seconds.",
    ),
    gauge(
        "herald_ingress_report_timestamp_seconds",
        "When this worker last read the ingress streams' lengths and ages (Unix seconds).",
    ),
    histogram("herald_ingress_lag_seconds", "Time from a send entering its stream to its commit."),
    counter(
        "herald_seq_rollbacks_total",
        "Conversations whose last_seq was below a seq already fanned out (a failover lost commits); numbered past it.",
    ),
    counter("herald_ingress_poison_total", "Ingress entries refused by MySQL one by one and set aside."),
    histogram("herald_worker_batch_size", "Sends per committed batch."),
    histogram("herald_worker_group_batches", "Batches per group commit."),
    counter(
        "herald_worker_commit_overlaps_total",
        "Transactions of sends started beside another still in flight (it had run worker.commit_overlap_ms).",
    ),
    histogram("herald_worker_commit_seconds", "Time to commit one group of batches to MySQL."),
    histogram(
        "herald_fanout_seconds",
        "Time to fan one committed group out into Redis (the fan-out stage's busy time).",
    ),
    counter(
        "herald_worker_commit_connections_dropped_total",
        "Kept commit connections found dead by their ping and dropped.",
    ),
    counter("herald_batches_redrawn_total", "Batches given new ids because theirs were older than allowed."),
    counter("herald_batches_with_repeats_total", "Batches that held repeated sends and were committed by lookup."),
    counter(
        "herald_recipient_cache_total",
        "Conversations of commits by where their recipients came from: hit (the worker's cache), stale or miss (read).",
    ),
    counter("herald_recipient_reads_total", "Commits that read recipients their worker's cache did not hold (a second round trip)."),
    gauge(
        "herald_recipient_cache_in_use",
        "1 while the worker keeps recipients between commits (every live gateway and worker raises device epochs).",
    ),
    counter("herald_recipient_cache_resets_total", "Times the worker's recipients cache was emptied at its bound."),
    counter("herald_messages_committed_total", "Messages committed to MySQL."),
    counter("herald_messages_duplicate_total", "Sends found already committed (a retry with the same cmid)."),
    counter("herald_send_rejected_total", "Sends refused by the worker, by error code."),
    gauge(
        "herald_mysql_durable",
        "1 when MySQL flushes each commit to disk (innodb_flush_log_at_trx_commit = 1, sync_binlog = 1).",
    ),
    // Worker: fan-out, outbox, reads.
    counter("herald_fanout_messages_total", "Messages fanned out into pending sets."),
    counter("herald_fanout_errors_total", "Fan-outs that failed and were left to the outbox."),
    counter(
        "herald_fanout_partial_total",
        "Fan-outs that failed for some devices only: the others were told, and the redo skips them.",
    ),
    counter("herald_outbox_events_total", "Outbox events finished, by status."),
    counter("herald_outbox_dead_total", "Outbox events given up after outbox.max_attempts."),
    counter("herald_outbox_redo_skipped_total", "Outbox retries skipped because the fan-out had already happened."),
    counter("herald_outbox_purged_total", "Finished outbox rows deleted."),
    gauge("herald_outbox_rows", "Outbox rows, by status."),
    gauge("herald_outbox_oldest_unfinished_seconds", "Age of the oldest outbox event not yet sent, in seconds."),
    counter("herald_reads_total", "Read positions committed."),
    counter("herald_read_fanout_errors_total", "Read positions committed but not pushed to devices."),
    counter("herald_delivered_positions_total", "Delivered positions moved forward in MySQL."),
    counter(
        "herald_delivered_held_total",
        "Delivered positions held below a message whose fan-out has not finished.",
    ),
    counter("herald_status_pushes_total", "Delivery status pushes published to gateway nodes."),
    counter("herald_status_errors_total", "Delivered positions committed whose senders' status could not be pushed."),
    counter(
        "herald_timeline_changes_total",
        "Timeline changes (members, title, roles, recalls, edits) answered, by outcome: committed, unchanged, \
         repeat, or the refusal's error code.",
    ),
    // Worker: offline push.
    gauge("herald_push_waiting", "Collapsed notifications waiting out push.delay_ms in this worker."),
    counter(
        "herald_push_dropped_total",
        "Messages given no push notification: push.max_waiting were already waiting, or the hand-off queue was full.",
    ),
    counter(
        "herald_push_quiet_total",
        "Notifications not sent because the device acked the message (it was or came online) or has no push token.",
    ),
    counter("herald_push_notifications_total", "Webhook attempts, by outcome (sent, failed, dead)."),
    histogram("herald_push_webhook_seconds", "Time from a webhook request to its answer (or its failure)."),
    counter("herald_push_errors_total", "Push rounds that failed on MySQL or Redis, by stage (schedule, dispatch)."),
    // Worker: janitor.
    counter("herald_devices_expired_total", "Devices expired for inactivity."),
    counter("herald_devices_forgotten_total", "Expired devices deleted for good."),
    counter("herald_messages_purged_total", "Messages deleted past their retention."),
    counter(
        "herald_stream_consumers_removed_total",
        "Idle consumers of departed workers removed from ingress streams.",
    ),
    // The probe (herald-loadtest probe).
    counter("herald_probe_sent_total", "Probe messages sent."),
    counter("herald_probe_received_total", "Probe messages received for the first time."),
    counter("herald_probe_lost_total", "Probe messages acknowledged and not received within the loss window."),
    counter("herald_probe_duplicates_total", "Probe numbers received under two message ids."),
    counter("herald_probe_disorder_total", "Probe numbers received after a higher one."),
    counter("herald_probe_repeats_total", "Probe messages received again under the same id (allowed)."),
    histogram("herald_probe_latency_seconds", "Time from a probe message's send to its receipt."),
];

/// Gives every catalogued metric its `# HELP` text. The exporter shows a description
/// only next to a metric that has a value, so describing all of them in every process
/// adds nothing to a process that never records one.
pub fn describe_all() {
    for m in METRICS.iter().filter(|m| !m.name.starts_with("process_")) {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
        }
    }
}

/// Sets `herald_build_info` to 1 with the build's version and commit (`HERALD_GIT_COMMIT`
/// when the binary was built, as the Dockerfile passes it).
pub fn record_build_info() {
    metrics::gauge!("herald_build_info", "version" => env!("CARGO_PKG_VERSION"), "commit" => build_commit()).set(1.0);
}

/// The commit this binary was built from (`HERALD_GIT_COMMIT` at build time), or `unknown`.
pub fn build_commit() -> &'static str {
    option_env!("HERALD_GIT_COMMIT").filter(|c| !c.is_empty()).unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};

    use super::*;

    /// The `.rs` files under `dir`.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every metric the code records: (name, kind, file), from the string literal that
    /// opens each `counter!(`, `gauge!(` and `histogram!(`.
    fn recorded() -> Vec<(String, Kind, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for crate_dir in ["shared", "gateway", "worker", "loadtest"] {
            sources(&root.join(crate_dir).join("src"), &mut files);
        }
        let mut found = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source file");
            for (mac, kind) in
                [("counter!(", Kind::Counter), ("gauge!(", Kind::Gauge), ("histogram!(", Kind::Histogram)]
            {
                for (at, _) in text.match_indices(mac) {
                    // Descriptions, and the macro names in this test's own strings.
                    if text[..at].ends_with("describe_") || text[..at].ends_with('"') {
                        continue;
                    }
                    let rest = text[at + mac.len()..].trim_start();
                    let Some(rest) = rest.strip_prefix('"') else { continue };
                    let name = &rest[..rest.find('"').expect("closing quote")];
                    found.push((name.to_string(), kind, file.display().to_string()));
                }
            }
        }
        found
    }

    #[test]
    fn every_recorded_metric_is_catalogued_with_its_kind_and_every_entry_is_recorded() {
        let found = recorded();
        assert!(found.len() > 50, "the scan found only {} uses", found.len());
        for (name, kind, file) in &found {
            let entry = METRICS.iter().find(|m| m.name == name);
            assert!(entry.is_some(), "{file}: {name} is not in the metric catalog (no # HELP)");
            assert_eq!(entry.map(|m| m.kind), Some(*kind), "{file}: {name} is recorded as another kind");
        }
        let process = crate::process_metrics::render(&crate::process_metrics::ProcessSample {
            max_fds: Some(1024),
            ..Default::default()
        });
        for m in METRICS {
            if m.name.starts_with("process_") {
                let kind = format!("{:?}", m.kind).to_lowercase();
                assert!(
                    process.contains(&format!("# TYPE {} {kind}\n", m.name)),
                    "{} not rendered as a {kind}",
                    m.name
                );
                continue;
            }
            assert!(found.iter().any(|(name, ..)| name == m.name), "{} is catalogued but never recorded", m.name);
        }
    }

    #[test]
    fn entries_are_unique_named_and_described_on_one_line() {
        let mut names = HashSet::new();
        for m in METRICS {
            assert!(names.insert(m.name), "{} twice", m.name);
            assert!(m.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{}", m.name);
            assert!(m.kind != Kind::Counter || m.name.ends_with("_total"), "counter {} must end in _total", m.name);
            assert!(!m.help.is_empty() && !m.help.contains('\n') && m.help.ends_with('.'), "{}: {:?}", m.name, m.help);
        }
    }
}
