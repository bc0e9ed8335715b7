//! `[gateway]`: the client-facing process: sends, sessions, backlog, limits.

use std::path::{Path, PathBuf};

use super::table::{section, GATEWAY};
use super::{Cidr, Problems};
use crate::tls;

/// Most members a conversation may be configured for: its largest membership event
/// (about 13 MB) stays within the event column's 16 MiB (MEDIUMTEXT).
pub const MAX_GROUP_SIZE: usize = 100_000;

/// A user id in a JSON list at most: 64 characters, each escaped (`\"`), quotes and a comma.
const MEMBER_JSON_BYTES: usize = 64 * 2 + 3;

section! {
    /// `[gateway]`: what the gateway needs to serve clients.
    pub struct GatewayConfig in "gateway", read by GATEWAY;
    {
        /// How long `POST /v1/messages` waits for the commit notice before answering `unavailable`.
        ///
        /// The client retries with the same `cmid`.
        pub send_timeout_ms: u64 = "5000",
        /// Largest serialized message body accepted, in bytes.
        pub max_body_bytes: usize = "32768",
        /// Most sends of one ingress shard packed into one stream entry per write.
        ///
        /// The node's ingress writer appends what arrived during its previous write, a
        /// shard's sends as one entry, while every live worker reads packs (an older
        /// worker during a rolling upgrade does not: then each send is an entry of its
        /// own). 1 never packs.
        pub ingress_pack_max: usize = "256",
        /// Refuse to start when Redis may evict keys (pending sets must not vanish).
        ///
        /// The check reads `maxmemory-policy` with `CONFIG GET`; turned off, the gateway
        /// never sends `CONFIG`, which managed Redis services often refuse.
        pub require_noeviction: bool = "true",
        /// MySQL connections of the gateway.
        pub db_pool_size: u32 = "16",
        /// Most session starts reading MySQL at once; more wait their turn.
        ///
        /// A device new to this Redis (a first session, or after a Redis data loss) has its
        /// watermark and its band's first page read at start. A login storm queues here
        /// instead of taking every pool connection (and failing past the pool's wait).
        pub start_db_reads: u32 = "8",
        /// Most members of one conversation (at most 100 000).
        ///
        /// A membership change of that many users, with the longest user ids, must fit
        /// the event column (16 MiB), a request body and a frame; the request and frame
        /// bounds grow with it.
        pub max_group_size: usize = "1000",
        /// Server ping interval; must stay below `gateway.nat_idle_timeout_ms`.
        pub heartbeat_ms: u64 = "25000",
        /// The shortest NAT or load-balancer idle timeout clients sit behind.
        pub nat_idle_timeout_ms: u64 = "30000",
        /// Unacked pushes per device before the gateway stops pushing.
        pub inflight_window: usize = "256",
        /// An unacked push older than this makes the gateway ping the client.
        ///
        /// Without a pong within `ack_probe_ms` the connection is closed as half-open (4000).
        pub ack_timeout_ms: u64 = "10000",
        /// How long a client has to answer that ping before its connection is closed.
        pub ack_probe_ms: u64 = "5000",
        /// Backlog page size for desktop, web and server devices.
        pub backlog_page_desktop: usize = "200",
        /// Backlog page size for mobile devices.
        pub backlog_page_mobile: usize = "50",
        /// Realtime deliveries queued per session before it re-reads its pending set instead.
        pub realtime_queue: usize = "1024",
        /// Typing and presence frames queued per session; more are dropped (they go first under load).
        ///
        /// Realtime messages have their own queue (`gateway.realtime_queue`) and are
        /// written first, so these never delay them.
        pub ephemeral_queue: usize = "64",
        /// Typing frames one session may send per conversation within `gateway.typing_window_ms`.
        ///
        /// More are dropped without an answer: a typing indicator is a hint, and a client
        /// that sends one per keystroke is not misbehaving enough to be told off.
        pub typing_burst: u32 = "4",
        /// The window of `gateway.typing_burst`.
        pub typing_window_ms: u64 = "5000",
        /// How long a client shows a typing indicator that is not renewed (`expires_in_ms`).
        pub typing_expiry_ms: u64 = "6000",
        /// Conversations with more members get no typing indicators (the fan-out's bound).
        pub typing_max_members: usize = "100",
        /// Most users in one presence query (`GET /v1/presence`) or one session's `presence_subscribe`.
        pub presence_max_users: usize = "200",
        /// How long a draining gateway spreads `reconnect` hints and waits for sessions.
        pub drain_ms: u64 = "10000",
        /// How far a device's watermark stays behind now (30 minutes).
        ///
        /// It must cover commit latency, clock skew and the outbox's whole retry schedule
        /// (checked at start), or a rebuild after Redis data loss could miss a message.
        pub watermark_margin_ms: u64 = "1800000",
        /// At most this often a session reports its watermark, and only when it moved (5 minutes).
        ///
        /// Reports are flushed to MySQL in batches with the device's `last_seen_at`, so an
        /// idle session costs a row write every few minutes, not every few seconds.
        pub watermark_flush_ms: u64 = "300000",
        /// Backlog messages per second per desktop, web or server device.
        pub backlog_rate_desktop: u32 = "4000",
        /// Backlog messages per second per mobile device.
        pub backlog_rate_mobile: u32 = "1000",
        /// Most backlog messages per second for the whole node: the ceiling of its adaptive budget.
        ///
        /// The budget starts here and is cut (AIMD) while the node is congested, see
        /// `gateway.backlog_lag_target_ms` and `gateway.backlog_realtime_target_ms`.
        pub backlog_rate_node: u32 = "100000",
        /// Least backlog messages per second for the whole node, however congested it is.
        ///
        /// At most `gateway.backlog_rate_node`; a backlog keeps draining at this rate.
        pub backlog_rate_node_floor: u32 = "2000",
        /// Event-loop lag (how late a 10 ms timer fires) above which the node's backlog budget is cut.
        pub backlog_lag_target_ms: u64 = "10",
        /// Realtime push latency, node channel to socket, above which the node's backlog budget is cut.
        ///
        /// Cut when more than 1 % of a 100 ms tick's realtime pushes took longer (its p99);
        /// time a push waits for room in the device's `gateway.inflight_window` is not counted.
        pub backlog_realtime_target_ms: u64 = "25",
        /// Sends per second per device.
        pub send_rate: u32 = "50",
        /// Sends per device allowed above `gateway.send_rate` in a burst.
        pub send_burst: u32 = "200",
        /// New WebSocket sessions per second on this node.
        pub admission_rate: u32 = "2000",
        /// New WebSocket sessions allowed above `gateway.admission_rate` in a burst.
        pub admission_burst: u32 = "500",
        /// WebSocket sessions of one user (tenant and user) on this node, counted by device.
        ///
        /// An abuse limit (docs/reliability.md, "Abuse limits"), like the four below: a new
        /// session of a device that is already connected replaces it and is not refused.
        pub max_connections_per_user: usize = "32",
        /// WebSocket sessions from one client IP address on this node.
        ///
        /// The client's address is the socket peer, or its `X-Forwarded-For` when the
        /// peer is one of `gateway.trusted_proxies`.
        pub max_connections_per_ip: usize = "1000",
        /// Proxies (ingress, load balancers) whose `X-Forwarded-For` names the client, as CIDRs.
        ///
        /// A comma-separated list (a TOML array), such as `10.0.0.0/8,fd00::/8`; empty,
        /// the header is ignored and every client is its socket peer. The client is the
        /// right-most forwarded address that is not itself trusted.
        pub trusted_proxies: Vec<Cidr> = "",
        /// Time a client has to finish each HTTP request head, the WebSocket upgrade included.
        ///
        /// Counted from when the connection opened or went idle; past it the connection is closed.
        pub handshake_timeout_ms: u64 = "10000",
        /// Sends per second of one tenant through this node (HTTP and WebSocket).
        pub tenant_send_rate: u32 = "5000",
        /// Sends of one tenant allowed above `gateway.tenant_send_rate` in a burst.
        pub tenant_send_burst: u32 = "10000",
        /// A write to a client that takes longer closes the connection as half-open (4000).
        ///
        /// Its slots are freed; what it had not acked stays pending for its next session.
        pub write_timeout_ms: u64 = "10000",
        /// Bytes of frames a session gathers before they go to the socket; 0 writes each frame alone.
        ///
        /// A backlog page, and realtime pushes that queued together, then go out in one
        /// socket write (a `sendto`) instead of one per frame. A session that wrote such a
        /// batch keeps a buffer of about twice this while it lives.
        pub write_batch_bytes: usize = "8192",
        /// Time an HTTP request has to arrive whole and be answered; past it, `bad_request`.
        ///
        /// Bounds a client that sends its head and then trickles (or never sends) the body.
        pub request_timeout_ms: u64 = "60000",
        /// Most bytes of message bodies in one history page (a `history` frame or an HTTP page).
        ///
        /// A page ends before it would pass this (it always holds at least one message);
        /// `more` tells the client to ask for the rest.
        pub history_page_bytes: usize = "524288",
        /// PEM certificate chain of the public listener; with `gateway.tls_key_file`, it serves `https://` and `wss://` only.
        ///
        /// For deployments without an ingress or load balancer that terminates TLS. The
        /// handshake counts against `gateway.handshake_timeout_ms`.
        pub tls_cert_file: String = "",
        /// PEM private key of `gateway.tls_cert_file`.
        pub tls_key_file: String = "",
        /// Origins whose pages may call the HTTP API (CORS), comma-separated, or `*` for any.
        ///
        /// Each is `scheme://host[:port]` as browsers send it in `Origin`
        /// (`https://chat.example.com`). Empty: no CORS headers, so only pages served from
        /// the gateway's own origin may call it. The WebSocket is not subject to CORS.
        pub cors_origins: String = "",
        /// How long Redis or MySQL may be unreachable before `/readyz` fails (5 minutes); 0: never.
        ///
        /// Every gateway shares them: a short outage (a failover) degrades the gateway
        /// (`/healthz` detail, `herald_dependency_up`) without taking it out of its Service.
        pub dependency_outage_grace_ms: u64 = "300000",
    }
}

/// Which browser origins may call the HTTP API (`gateway.cors_origins`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CorsOrigins {
    /// No CORS headers at all.
    None,
    /// Any origin (`*`).
    Any,
    /// Exactly these origins.
    List(Vec<String>),
}

impl GatewayConfig {
    /// The listener's certificate and key files, when TLS is on.
    pub fn tls_files(&self) -> Option<(PathBuf, PathBuf)> {
        let path = |v: &str| (!v.is_empty()).then(|| PathBuf::from(v));
        path(&self.tls_cert_file).zip(path(&self.tls_key_file))
    }

    /// `gateway.cors_origins`, parsed; [`GatewayConfig::validate`] refuses malformed entries.
    pub fn cors(&self) -> CorsOrigins {
        let origins: Vec<String> =
            self.cors_origins.split(',').map(str::trim).filter(|o| !o.is_empty()).map(str::to_owned).collect();
        match origins.as_slice() {
            [] => CorsOrigins::None,
            [any] if any == "*" => CorsOrigins::Any,
            _ => CorsOrigins::List(origins),
        }
    }

    fn validate_cors(&self, bad: &mut Problems) {
        let CorsOrigins::List(origins) = self.cors() else { return };
        for o in origins {
            let host = o.strip_prefix("https://").or_else(|| o.strip_prefix("http://"));
            let ok = host.is_some_and(|h| !h.is_empty() && !h.contains('/') && h.bytes().all(|b| b.is_ascii_graphic()));
            if !ok {
                let why = format!("{o:?} is not an origin (scheme://host[:port], no path), nor `*` alone");
                bad.push("gateway.cors_origins", &why);
            }
        }
    }

    /// Both files or neither, each readable, the key the certificate's.
    fn validate_tls(&self, bad: &mut Problems) {
        match (self.tls_cert_file.is_empty(), self.tls_key_file.is_empty()) {
            (true, true) => {}
            (false, true) => bad.push("gateway.tls_key_file", "required with gateway.tls_cert_file"),
            (true, false) => bad.push("gateway.tls_cert_file", "required with gateway.tls_key_file"),
            (false, false) => {
                let (cert, key) = (Path::new(&self.tls_cert_file), Path::new(&self.tls_key_file));
                let cert_ok = tls::certificates(cert).map_err(|e| bad.push("gateway.tls_cert_file", &e.to_string()));
                let key_ok = tls::private_key(key).map_err(|e| bad.push("gateway.tls_key_file", &e.to_string()));
                if cert_ok.is_ok() && key_ok.is_ok() {
                    if let Err(e) = tls::server_config(cert, key) {
                        bad.push("gateway.tls_key_file", &format!("does not fit gateway.tls_cert_file: {e}"));
                    }
                }
            }
        }
    }

    /// The adaptive node budget's floor and targets.
    fn validate_backlog_budget(&self, bad: &mut Problems) {
        if self.backlog_rate_node_floor == 0 || self.backlog_rate_node_floor > self.backlog_rate_node {
            let why = format!("must be 1..=gateway.backlog_rate_node ({})", self.backlog_rate_node);
            bad.push("gateway.backlog_rate_node_floor", &why);
        }
        if !(1..=10_000).contains(&self.backlog_lag_target_ms) {
            bad.push("gateway.backlog_lag_target_ms", "must be 1..=10000");
        }
        if !(1..=60_000).contains(&self.backlog_realtime_target_ms) {
            bad.push("gateway.backlog_realtime_target_ms", "must be 1..=60000");
        }
    }

    pub(super) fn validate(&self, bad: &mut Problems) {
        self.validate_tls(bad);
        self.validate_cors(bad);
        if self.send_timeout_ms == 0 {
            bad.push("gateway.send_timeout_ms", "must be positive");
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > 1 << 20 {
            bad.push("gateway.max_body_bytes", "must be 1..=1048576");
        }
        if self.ingress_pack_max == 0 || self.ingress_pack_max > 4_096 {
            bad.push("gateway.ingress_pack_max", "must be 1..=4096");
        }
        if self.heartbeat_ms < 100 || self.heartbeat_ms >= self.nat_idle_timeout_ms {
            bad.push("gateway.heartbeat_ms", "must be at least 100 and below gateway.nat_idle_timeout_ms");
        }
        if self.inflight_window == 0 || self.realtime_queue == 0 {
            bad.push("gateway.inflight_window", "inflight_window and realtime_queue must be positive");
        }
        if self.backlog_page_desktop == 0 || self.backlog_page_mobile == 0 {
            bad.push("gateway.backlog_page_desktop", "backlog page sizes must be positive");
        }
        if self.ack_timeout_ms == 0 || self.ack_probe_ms == 0 {
            bad.push("gateway.ack_timeout_ms", "ack_timeout_ms and ack_probe_ms must be positive");
        }
        for (key, v) in [
            ("gateway.backlog_rate_desktop", self.backlog_rate_desktop),
            ("gateway.backlog_rate_mobile", self.backlog_rate_mobile),
            ("gateway.backlog_rate_node", self.backlog_rate_node),
            ("gateway.send_rate", self.send_rate),
            ("gateway.send_burst", self.send_burst),
            ("gateway.admission_rate", self.admission_rate),
            ("gateway.admission_burst", self.admission_burst),
            ("gateway.tenant_send_rate", self.tenant_send_rate),
            ("gateway.tenant_send_burst", self.tenant_send_burst),
            ("gateway.db_pool_size", self.db_pool_size),
            ("gateway.start_db_reads", self.start_db_reads),
            ("gateway.typing_burst", self.typing_burst),
        ] {
            if v == 0 {
                bad.push(key, "must be positive");
            }
        }
        self.validate_backlog_budget(bad);
        for (key, v) in [
            ("gateway.ephemeral_queue", self.ephemeral_queue as u64),
            ("gateway.typing_window_ms", self.typing_window_ms),
            ("gateway.typing_expiry_ms", self.typing_expiry_ms),
            ("gateway.presence_max_users", self.presence_max_users as u64),
        ] {
            if v == 0 {
                bad.push(key, "must be positive");
            }
        }
        if self.max_connections_per_user == 0 {
            bad.push("gateway.max_connections_per_user", "must be positive");
        }
        if self.max_connections_per_ip == 0 {
            bad.push("gateway.max_connections_per_ip", "must be positive");
        }
        if !(100..=600_000).contains(&self.handshake_timeout_ms) {
            bad.push("gateway.handshake_timeout_ms", "must be 100..=600000");
        }
        if !(2..=MAX_GROUP_SIZE).contains(&self.max_group_size) {
            bad.push("gateway.max_group_size", &format!("must be 2..={MAX_GROUP_SIZE}"));
        }
        if self.request_timeout_ms <= self.send_timeout_ms {
            bad.push("gateway.request_timeout_ms", "must exceed gateway.send_timeout_ms");
        }
        if !(100..=600_000).contains(&self.write_timeout_ms) {
            bad.push("gateway.write_timeout_ms", "must be 100..=600000");
        }
        if self.write_batch_bytes > 1 << 20 {
            bad.push("gateway.write_batch_bytes", "must be 0..=1048576");
        }
        if !(1_024..=16 << 20).contains(&self.history_page_bytes) {
            bad.push("gateway.history_page_bytes", "must be 1024..=16777216");
        }
    }

    /// The largest text frame the gateway writes: a history page over its byte budget by
    /// at most one item, with each item's fields around its body.
    pub fn largest_frame_bytes(&self) -> usize {
        self.history_page_bytes + self.largest_item_bytes() + 64 * 1024
    }

    /// The largest message or timeline event one item of a page (or one `msg` frame)
    /// can hold: a body of `max_body_bytes` (escaped, twice that at most), or a
    /// membership event naming a group's largest member list.
    pub fn largest_item_bytes(&self) -> usize {
        (self.max_body_bytes * 2).max(self.largest_member_list_bytes())
    }

    /// The largest list of members a request or an event carries, as JSON: every user id
    /// of the longest length with every character escaped.
    pub fn largest_member_list_bytes(&self) -> usize {
        self.max_group_size * MEMBER_JSON_BYTES + 2
    }

    /// The largest membership request body (`add` and `remove` both full), with room
    /// for the envelope.
    pub fn largest_members_body_bytes(&self) -> usize {
        2 * self.largest_member_list_bytes() + 4096
    }
}

#[cfg(test)]
#[path = "gateway_tests.rs"]
mod tests;
