//! Layered, validated configuration shared by every Herald process.
//!
//! Layers, later ones winning: built-in defaults, a TOML file (`--config FILE` or
//! `HERALD_CONFIG`), `HERALD_*` environment variables, then command-line flags.
//! Every layer is flattened into dotted keys (`outbox.max_attempts`) and applied
//! through one setter, so all layers accept and reject exactly the same keys. All
//! problems are collected and reported together, each naming its key, before any
//! port is bound.
//!
//! Environment names: `HERALD_MYSQL_URL` is `mysql_url`; a double underscore
//! separates a section, `HERALD_OUTBOX__MAX_ATTEMPTS` is `outbox.max_attempts`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Which process the configuration is for; some defaults differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Gateway,
    Worker,
    Loadtest,
}

/// A secret that never shows up in `Debug` output or logs.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "<unset>" } else { "<redacted>" })
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub mysql_url: String,
    pub redis_url: String,
    /// Prefix of every Redis key and channel; lets clusters (and tests) share a Redis.
    pub redis_key_prefix: String,
    pub jwt_secret: Secret,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub admin_token: Secret,
    pub node_id: String,
    /// A tracing filter, as in `RUST_LOG` (which wins when set).
    pub log: String,
    pub ingress: IngressConfig,
    pub gateway: GatewayConfig,
    pub worker: WorkerConfig,
    pub outbox: OutboxConfig,
}

#[derive(Clone, Debug)]
pub struct IngressConfig {
    /// Number of ingress streams; a conversation always maps to the same one. Every
    /// process of a cluster must agree on it.
    pub shards: u32,
}

#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// How long `POST /v1/messages` waits for the commit notice before answering
    /// `unavailable` (the client retries with the same `cmid`).
    pub send_timeout_ms: u64,
    /// Largest serialized message body accepted.
    pub max_body_bytes: usize,
    /// Refuse to start when Redis may evict keys (pending sets must not vanish).
    pub require_noeviction: bool,
    pub db_pool_size: u32,
    /// Most members of one conversation.
    pub max_group_size: usize,
    /// Server ping interval; must stay below `nat_idle_timeout_ms`.
    pub heartbeat_ms: u64,
    /// The shortest NAT/load-balancer idle timeout clients sit behind.
    pub nat_idle_timeout_ms: u64,
    /// Unacked pushes per device before the gateway stops pushing.
    pub inflight_window: usize,
    /// An unacked push older than this triggers a ping; without a pong within
    /// `ack_probe_ms` the connection is closed as half-open (4000).
    pub ack_timeout_ms: u64,
    pub ack_probe_ms: u64,
    /// Backlog page sizes by platform class.
    pub backlog_page_desktop: usize,
    pub backlog_page_mobile: usize,
    /// Realtime deliveries queued per session before it falls back to re-reading its
    /// pending set.
    pub realtime_queue: usize,
    /// How long a draining gateway spreads `reconnect` hints and waits for sessions.
    pub drain_ms: u64,
    /// The device watermark stays this far behind "now": it must cover commit latency,
    /// clock skew between processes and fan-out delays, or a rebuild after Redis data
    /// loss could miss a message.
    pub watermark_margin_ms: u64,
    /// How often a session reports its watermark (flushed to MySQL in batches).
    pub watermark_flush_ms: u64,
    /// Backlog messages per second per device (desktop/web/server, mobile) and for the
    /// whole node (protects it in a login storm).
    pub backlog_rate_desktop: u32,
    pub backlog_rate_mobile: u32,
    pub backlog_rate_node: u32,
    /// Sends per second per device, and the burst allowed above it.
    pub send_rate: u32,
    pub send_burst: u32,
    /// New WebSocket sessions per second on this node, and the burst.
    pub admission_rate: u32,
    pub admission_burst: u32,
    /// Abuse limits (docs/reliability.md, "Abuse limits"); all per gateway node.
    /// WebSocket sessions of one user (tenant + user) on this node, counted by device:
    /// a new session of a device that is already connected replaces it and is not refused.
    pub max_connections_per_user: usize,
    /// WebSocket sessions from one IP address (the socket peer) on this node.
    pub max_connections_per_ip: usize,
    /// A client must finish each HTTP request head (the WebSocket upgrade included)
    /// within this time after the connection opened or went idle, or it is closed.
    pub handshake_timeout_ms: u64,
    /// Sends per second of one tenant through this node (HTTP and WebSocket), and the
    /// burst allowed above it.
    pub tenant_send_rate: u32,
    pub tenant_send_burst: u32,
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Most stream entries committed in one MySQL transaction.
    pub batch_max: usize,
    /// How long one XREADGROUP blocks waiting for entries.
    pub batch_block_ms: u64,
    /// Lease time of shard ownership and of the snowflake worker id; renewed at a third.
    pub lease_ttl_ms: u64,
    /// Apply migrations when the worker starts.
    pub migrate_on_start: bool,
    /// How long the serialized frame of a message is kept in Redis.
    pub message_ttl_s: u64,
    /// Largest pending set per device; past it the oldest entries are dropped and the
    /// device is marked for a rebuild from MySQL.
    pub pending_cap: u64,
    pub db_pool_size: u32,
    /// Group conversations up to this size send `read` frames to every member's
    /// devices; larger ones only to the reader's own other devices.
    pub read_fanout_max_group: usize,
    /// How long an undelivered read position waits for an offline device.
    pub read_state_ttl_s: u64,
}

#[derive(Clone, Debug)]
pub struct OutboxConfig {
    /// Period of the dispatcher loop.
    pub fixed_delay_ms: u64,
    /// A new row is due this far ahead, so the loop only sees what the immediate
    /// post-commit dispatch did not finish.
    pub first_retry_delay_ms: u64,
    /// Delay before retry n (the last value repeats).
    pub backoff_ms: Vec<u64>,
    /// Attempts before an event is DEAD.
    pub max_attempts: u32,
    /// A SENDING row claimed longer ago than this is taken again.
    pub sending_stale_ms: u64,
    /// Rows claimed per dispatcher round.
    pub claim_batch: u32,
    /// SENT rows older than this are purged.
    pub sent_retention_s: u64,
    /// Rows deleted per purge statement (small, to keep locks short).
    pub purge_batch: u32,
}

impl Config {
    pub fn defaults(role: Role) -> Config {
        let (listen, admin) = match role {
            Role::Gateway => ("127.0.0.1:8080", "127.0.0.1:9090"),
            Role::Worker => ("127.0.0.1:8080", "127.0.0.1:9091"),
            Role::Loadtest => ("127.0.0.1:8080", "127.0.0.1:9099"),
        };
        let kind = match role {
            Role::Gateway => "gw",
            Role::Worker => "wk",
            Role::Loadtest => "lt",
        };
        Config {
            mysql_url: "mysql://root@127.0.0.1:3306/herald".into(),
            redis_url: "redis://127.0.0.1:6379/0".into(),
            redis_key_prefix: "hd".into(),
            jwt_secret: Secret::default(),
            listen: listen.parse().expect("default address"),
            admin_listen: admin.parse().expect("default address"),
            admin_token: Secret::default(),
            node_id: format!("{kind}-{:08x}", rand::random::<u32>()),
            log: "info".into(),
            ingress: IngressConfig { shards: 8 },
            gateway: GatewayConfig {
                send_timeout_ms: 5_000,
                max_body_bytes: 32 * 1024,
                require_noeviction: true,
                db_pool_size: 16,
                max_group_size: 1_000,
                heartbeat_ms: 25_000,
                nat_idle_timeout_ms: 30_000,
                inflight_window: 256,
                ack_timeout_ms: 10_000,
                ack_probe_ms: 5_000,
                backlog_page_desktop: 200,
                backlog_page_mobile: 50,
                realtime_queue: 1_024,
                drain_ms: 10_000,
                watermark_margin_ms: 300_000,
                watermark_flush_ms: 5_000,
                backlog_rate_desktop: 4_000,
                backlog_rate_mobile: 1_000,
                backlog_rate_node: 100_000,
                send_rate: 50,
                send_burst: 200,
                admission_rate: 2_000,
                admission_burst: 500,
                max_connections_per_user: 32,
                max_connections_per_ip: 1_000,
                handshake_timeout_ms: 10_000,
                tenant_send_rate: 5_000,
                tenant_send_burst: 10_000,
            },
            worker: WorkerConfig {
                batch_max: 512,
                batch_block_ms: 1_000,
                lease_ttl_ms: 6_000,
                migrate_on_start: true,
                message_ttl_s: 7 * 24 * 3600,
                pending_cap: 10_000,
                db_pool_size: 16,
                read_fanout_max_group: 50,
                read_state_ttl_s: 30 * 24 * 3600,
            },
            outbox: OutboxConfig {
                fixed_delay_ms: 3_000,
                first_retry_delay_ms: 5_000,
                backoff_ms: vec![5_000, 20_000, 80_000, 320_000, 1_280_000],
                max_attempts: 5,
                sending_stale_ms: 60_000,
                claim_batch: 100,
                sent_retention_s: 24 * 3600,
                purge_batch: 1_000,
            },
        }
    }

    /// Applies one dotted key. Errors name what the key expects.
    pub fn set(&mut self, key: &str, v: &str) -> Result<(), String> {
        match key {
            "mysql_url" => self.mysql_url = v.into(),
            "redis_url" => self.redis_url = v.into(),
            "redis_key_prefix" => self.redis_key_prefix = v.into(),
            "jwt_secret" => self.jwt_secret = Secret(v.into()),
            "listen" => self.listen = addr(v)?,
            "admin_listen" => self.admin_listen = addr(v)?,
            "admin_token" => self.admin_token = Secret(v.into()),
            "node_id" => self.node_id = v.into(),
            "log" => self.log = v.into(),
            "ingress.shards" => self.ingress.shards = num(v)?,
            "gateway.send_timeout_ms" => self.gateway.send_timeout_ms = num(v)?,
            "gateway.max_body_bytes" => self.gateway.max_body_bytes = num(v)?,
            "gateway.require_noeviction" => self.gateway.require_noeviction = boolean(v)?,
            "gateway.db_pool_size" => self.gateway.db_pool_size = num(v)?,
            "gateway.max_group_size" => self.gateway.max_group_size = num(v)?,
            "gateway.heartbeat_ms" => self.gateway.heartbeat_ms = num(v)?,
            "gateway.nat_idle_timeout_ms" => self.gateway.nat_idle_timeout_ms = num(v)?,
            "gateway.inflight_window" => self.gateway.inflight_window = num(v)?,
            "gateway.ack_timeout_ms" => self.gateway.ack_timeout_ms = num(v)?,
            "gateway.ack_probe_ms" => self.gateway.ack_probe_ms = num(v)?,
            "gateway.backlog_page_desktop" => self.gateway.backlog_page_desktop = num(v)?,
            "gateway.backlog_page_mobile" => self.gateway.backlog_page_mobile = num(v)?,
            "gateway.realtime_queue" => self.gateway.realtime_queue = num(v)?,
            "gateway.drain_ms" => self.gateway.drain_ms = num(v)?,
            "gateway.watermark_margin_ms" => self.gateway.watermark_margin_ms = num(v)?,
            "gateway.watermark_flush_ms" => self.gateway.watermark_flush_ms = num(v)?,
            "gateway.backlog_rate_desktop" => self.gateway.backlog_rate_desktop = num(v)?,
            "gateway.backlog_rate_mobile" => self.gateway.backlog_rate_mobile = num(v)?,
            "gateway.backlog_rate_node" => self.gateway.backlog_rate_node = num(v)?,
            "gateway.send_rate" => self.gateway.send_rate = num(v)?,
            "gateway.send_burst" => self.gateway.send_burst = num(v)?,
            "gateway.admission_rate" => self.gateway.admission_rate = num(v)?,
            "gateway.admission_burst" => self.gateway.admission_burst = num(v)?,
            "gateway.max_connections_per_user" => self.gateway.max_connections_per_user = num(v)?,
            "gateway.max_connections_per_ip" => self.gateway.max_connections_per_ip = num(v)?,
            "gateway.handshake_timeout_ms" => self.gateway.handshake_timeout_ms = num(v)?,
            "gateway.tenant_send_rate" => self.gateway.tenant_send_rate = num(v)?,
            "gateway.tenant_send_burst" => self.gateway.tenant_send_burst = num(v)?,
            "worker.batch_max" => self.worker.batch_max = num(v)?,
            "worker.batch_block_ms" => self.worker.batch_block_ms = num(v)?,
            "worker.lease_ttl_ms" => self.worker.lease_ttl_ms = num(v)?,
            "worker.migrate_on_start" => self.worker.migrate_on_start = boolean(v)?,
            "worker.message_ttl_s" => self.worker.message_ttl_s = num(v)?,
            "worker.pending_cap" => self.worker.pending_cap = num(v)?,
            "worker.db_pool_size" => self.worker.db_pool_size = num(v)?,
            "worker.read_fanout_max_group" => self.worker.read_fanout_max_group = num(v)?,
            "worker.read_state_ttl_s" => self.worker.read_state_ttl_s = num(v)?,
            "outbox.fixed_delay_ms" => self.outbox.fixed_delay_ms = num(v)?,
            "outbox.first_retry_delay_ms" => self.outbox.first_retry_delay_ms = num(v)?,
            "outbox.backoff_ms" => {
                self.outbox.backoff_ms = v.split(',').map(|p| num(p.trim())).collect::<Result<_, _>>()?
            }
            "outbox.max_attempts" => self.outbox.max_attempts = num(v)?,
            "outbox.sending_stale_ms" => self.outbox.sending_stale_ms = num(v)?,
            "outbox.claim_batch" => self.outbox.claim_batch = num(v)?,
            "outbox.sent_retention_s" => self.outbox.sent_retention_s = num(v)?,
            "outbox.purge_batch" => self.outbox.purge_batch = num(v)?,
            _ => return Err(UNKNOWN_KEY.into()),
        }
        Ok(())
    }

    /// Checks values that parse but make no sense together.
    fn validate(&self, errors: &mut Vec<ConfigError>) {
        let mut bad = |key: &str, msg: &str| errors.push(ConfigError { key: key.into(), message: msg.into() });
        if self.jwt_secret.0.len() < 16 {
            bad("jwt_secret", "required, at least 16 bytes (HERALD_JWT_SECRET)");
        }
        if !self.mysql_url.starts_with("mysql://") && !self.mysql_url.starts_with("mariadb://") {
            bad("mysql_url", "must start with mysql://");
        }
        if !["redis://", "rediss://", "redis-cluster://"].iter().any(|s| self.redis_url.starts_with(s)) {
            bad("redis_url", "must start with redis:// or redis-cluster://");
        }
        if self.redis_key_prefix.is_empty() || self.redis_key_prefix.contains(['{', '}', ' ']) {
            bad("redis_key_prefix", "must be non-empty without braces or spaces");
        }
        if !crate::auth::is_valid_ident(&self.node_id) || self.node_id.contains(['{', '}']) {
            bad("node_id", "must be 1..64 printable ASCII characters without braces");
        }
        if self.ingress.shards == 0 || self.ingress.shards > 1024 {
            bad("ingress.shards", "must be 1..=1024");
        }
        if self.gateway.send_timeout_ms == 0 {
            bad("gateway.send_timeout_ms", "must be positive");
        }
        if self.gateway.max_body_bytes == 0 || self.gateway.max_body_bytes > 1 << 20 {
            bad("gateway.max_body_bytes", "must be 1..=1048576");
        }
        if self.gateway.heartbeat_ms < 100 || self.gateway.heartbeat_ms >= self.gateway.nat_idle_timeout_ms {
            bad("gateway.heartbeat_ms", "must be at least 100 and below gateway.nat_idle_timeout_ms");
        }
        if self.gateway.inflight_window == 0 || self.gateway.realtime_queue == 0 {
            bad("gateway.inflight_window", "inflight_window and realtime_queue must be positive");
        }
        if self.gateway.backlog_page_desktop == 0 || self.gateway.backlog_page_mobile == 0 {
            bad("gateway.backlog_page_desktop", "backlog page sizes must be positive");
        }
        if self.gateway.ack_timeout_ms == 0 || self.gateway.ack_probe_ms == 0 {
            bad("gateway.ack_timeout_ms", "ack_timeout_ms and ack_probe_ms must be positive");
        }
        let g = &self.gateway;
        for (key, v) in [
            ("gateway.backlog_rate_desktop", g.backlog_rate_desktop),
            ("gateway.backlog_rate_mobile", g.backlog_rate_mobile),
            ("gateway.backlog_rate_node", g.backlog_rate_node),
            ("gateway.send_rate", g.send_rate),
            ("gateway.send_burst", g.send_burst),
            ("gateway.admission_rate", g.admission_rate),
            ("gateway.admission_burst", g.admission_burst),
            ("gateway.tenant_send_rate", g.tenant_send_rate),
            ("gateway.tenant_send_burst", g.tenant_send_burst),
        ] {
            if v == 0 {
                bad(key, "must be positive");
            }
        }
        if g.max_connections_per_user == 0 {
            bad("gateway.max_connections_per_user", "must be positive");
        }
        if g.max_connections_per_ip == 0 {
            bad("gateway.max_connections_per_ip", "must be positive");
        }
        if !(100..=600_000).contains(&g.handshake_timeout_ms) {
            bad("gateway.handshake_timeout_ms", "must be 100..=600000");
        }
        if self.gateway.max_group_size < 2 {
            bad("gateway.max_group_size", "must be at least 2");
        }
        if self.worker.batch_max == 0 || self.worker.batch_max > 10_000 {
            bad("worker.batch_max", "must be 1..=10000");
        }
        if self.worker.lease_ttl_ms < 300 {
            bad("worker.lease_ttl_ms", "must be at least 300");
        }
        if self.worker.pending_cap == 0 {
            bad("worker.pending_cap", "must be positive");
        }
        for (key, size) in
            [("gateway.db_pool_size", self.gateway.db_pool_size), ("worker.db_pool_size", self.worker.db_pool_size)]
        {
            if size == 0 {
                bad(key, "must be positive");
            }
        }
        if self.outbox.backoff_ms.is_empty() {
            bad("outbox.backoff_ms", "needs at least one delay");
        }
        if self.outbox.max_attempts == 0 {
            bad("outbox.max_attempts", "must be positive");
        }
        if self.outbox.fixed_delay_ms == 0 {
            bad("outbox.fixed_delay_ms", "must be positive");
        }
        if self.outbox.claim_batch == 0 || self.outbox.purge_batch == 0 {
            bad("outbox.claim_batch", "claim_batch and purge_batch must be positive");
        }
        if self.outbox.sending_stale_ms <= self.gateway.send_timeout_ms.min(1_000) {
            bad("outbox.sending_stale_ms", "must exceed one second");
        }
    }
}

const UNKNOWN_KEY: &str = "unknown key";

fn addr(v: &str) -> Result<SocketAddr, String> {
    v.parse().map_err(|_| format!("expected host:port, got {v:?}"))
}

fn num<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.trim().parse().map_err(|_| format!("expected a non-negative whole number, got {v:?}"))
}

fn boolean(v: &str) -> Result<bool, String> {
    match v.trim() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(format!("expected true or false, got {v:?}")),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// All problems found, printed one per line.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration:")?;
        for e in &self.0 {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Where environment variables come from; tests pass a map instead of mutating the
/// process environment.
pub trait Env {
    fn vars(&self) -> Vec<(String, String)>;
}

#[derive(Debug, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars().collect()
    }
}

impl Env for BTreeMap<String, String> {
    fn vars(&self) -> Vec<(String, String)> {
        self.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// What the command line said, besides configuration keys.
#[derive(Debug, Default, Clone)]
pub struct Cli {
    /// Positional words (subcommands), in order.
    pub args: Vec<String>,
    /// `HERALD_*` variables that name no key. Not fatal: orchestrators set such
    /// variables themselves (Kubernetes: `HERALD_SERVICE_HOST` for a Service named
    /// herald). Logged as warnings once tracing is up.
    pub ignored_env: Vec<String>,
}

/// Loads the configuration from every layer. `argv` excludes the program name.
pub fn load(role: Role, argv: &[String], env: &dyn Env) -> Result<(Config, Cli), ConfigErrors> {
    let mut cfg = Config::defaults(role);
    let mut errors = Vec::new();
    let mut cli = Cli::default();
    let mut file: Option<PathBuf> = None;
    let mut flag_sets: Vec<(String, String)> = Vec::new();

    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value =
            |name: &str| inline.clone().or_else(|| it.next().cloned()).ok_or_else(|| format!("{name} needs a value"));
        match name.as_str() {
            "--config" => match value("--config") {
                Ok(v) => file = Some(v.into()),
                Err(e) => errors.push(ConfigError { key: "--config".into(), message: e }),
            },
            "--set" => match value("--set").map(|v| v.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))) {
                Ok(Some(kv)) => flag_sets.push(kv),
                _ => errors.push(ConfigError { key: "--set".into(), message: "expects key=value".into() }),
            },
            "--listen" | "--admin-listen" | "--node-id" | "--mysql-url" | "--redis-url" => match value(&name) {
                Ok(v) => flag_sets.push((name.trim_start_matches("--").replace('-', "_"), v)),
                Err(e) => errors.push(ConfigError { key: name.clone(), message: e }),
            },
            // Command switches, kept for the command to read.
            "--dry-run" => cli.args.push(name.clone()),
            flag if flag.starts_with('-') => {
                errors.push(ConfigError { key: flag.into(), message: "unknown flag".into() })
            }
            word => cli.args.push(word.into()),
        }
    }

    let mut env_sets = Vec::new();
    for (k, v) in env.vars() {
        let Some(rest) = k.strip_prefix("HERALD_") else {
            continue;
        };
        if rest == "CONFIG" {
            file = file.or(Some(v.into()));
            continue;
        }
        env_sets.push((k.clone(), rest.to_ascii_lowercase().replace("__", "."), v));
    }

    if let Some(path) = &file {
        match std::fs::read_to_string(path) {
            Ok(text) => match text.parse::<toml::Table>() {
                Ok(table) => {
                    let mut flat = Vec::new();
                    flatten("", &toml::Value::Table(table), &mut flat);
                    for (k, v) in flat {
                        if let Err(e) = cfg.set(&k, &v) {
                            errors.push(ConfigError { key: format!("{k} (in {})", path.display()), message: e });
                        }
                    }
                }
                Err(e) => errors
                    .push(ConfigError { key: path.display().to_string(), message: format!("not valid TOML: {e}") }),
            },
            Err(e) => {
                errors.push(ConfigError { key: path.display().to_string(), message: format!("cannot read: {e}") })
            }
        }
    }
    for (var, key, v) in env_sets {
        match cfg.set(&key, &v) {
            Ok(()) => {}
            Err(e) if e == UNKNOWN_KEY => cli.ignored_env.push(var),
            Err(e) => errors.push(ConfigError { key: format!("{key} ({var})"), message: e }),
        }
    }
    for (k, v) in flag_sets {
        if let Err(e) = cfg.set(&k, &v) {
            errors.push(ConfigError { key: format!("{k} (flag)"), message: e });
        }
    }
    cfg.validate(&mut errors);
    if errors.is_empty() {
        Ok((cfg, cli))
    } else {
        Err(ConfigErrors(errors))
    }
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut Vec<(String, String)>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        toml::Value::String(s) => out.push((prefix.into(), s.clone())),
        toml::Value::Array(items) => {
            let parts: Vec<String> = items
                .iter()
                .map(|i| match i {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            out.push((prefix.into(), parts.join(",")));
        }
        other => out.push((prefix.into(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn layers_apply_in_order_file_env_flags() {
        let dir = std::env::temp_dir().join(format!("herald-cfg-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("h.toml");
        std::fs::write(
            &file,
            "node_id = \"from-file\"\n[outbox]\nmax_attempts = 7\nbackoff_ms = [1, 2]\n[worker]\nbatch_max = 9\n",
        )
        .unwrap();
        let e = env(&[
            ("HERALD_JWT_SECRET", "0123456789abcdef"),
            ("HERALD_OUTBOX__MAX_ATTEMPTS", "3"),
            ("HERALD_NODE_ID", "from-env"),
            ("PATH", "/x"),
        ]);
        let argv: Vec<String> = ["--config", file.to_str().unwrap(), "--node-id", "from-flag", "migrate"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (cfg, cli) = load(Role::Worker, &argv, &e).unwrap();
        assert_eq!(cfg.node_id, "from-flag");
        assert_eq!(cfg.outbox.max_attempts, 3);
        assert_eq!(cfg.outbox.backoff_ms, vec![1, 2]);
        assert_eq!(cfg.worker.batch_max, 9);
        assert_eq!(cli.args, vec!["migrate".to_string()]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn every_bad_key_is_reported_at_once() {
        let e = env(&[("HERALD_LISTEN", "nope"), ("HERALD_OUTBOX__MAX_ATTEMPTS", "-1")]);
        let argv: Vec<String> = ["--wat", "--set", "worker.bogus=1"].iter().map(|s| s.to_string()).collect();
        let err = load(Role::Gateway, &argv, &e).unwrap_err();
        let text = err.to_string();
        for key in ["listen (HERALD_LISTEN)", "outbox.max_attempts", "worker.bogus (flag)", "--wat", "jwt_secret"] {
            assert!(text.contains(key), "{key} missing from:\n{text}");
        }
    }

    #[test]
    fn the_heartbeat_must_stay_below_the_nat_idle_timeout() {
        let e = env(&[("HERALD_JWT_SECRET", "0123456789abcdef"), ("HERALD_GATEWAY__HEARTBEAT_MS", "30000")]);
        let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
        assert!(err.contains("gateway.heartbeat_ms"), "{err}");
        let e = env(&[
            ("HERALD_JWT_SECRET", "0123456789abcdef"),
            ("HERALD_GATEWAY__HEARTBEAT_MS", "30000"),
            ("HERALD_GATEWAY__NAT_IDLE_TIMEOUT_MS", "45000"),
        ]);
        assert_eq!(load(Role::Gateway, &[], &e).unwrap().0.gateway.heartbeat_ms, 30_000);
    }

    #[test]
    fn unknown_environment_variables_are_reported_not_fatal() {
        let e = env(&[("HERALD_JWT_SECRET", "0123456789abcdef"), ("HERALD_SERVICE_HOST", "10.0.0.1")]);
        let (_, cli) = load(Role::Gateway, &[], &e).unwrap();
        assert_eq!(cli.ignored_env, vec!["HERALD_SERVICE_HOST".to_string()]);
    }

    #[test]
    fn abuse_limits_are_validated() {
        let e = env(&[
            ("HERALD_JWT_SECRET", "0123456789abcdef"),
            ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_USER", "0"),
            ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP", "0"),
            ("HERALD_GATEWAY__HANDSHAKE_TIMEOUT_MS", "50"),
            ("HERALD_GATEWAY__TENANT_SEND_RATE", "0"),
            ("HERALD_GATEWAY__TENANT_SEND_BURST", "x"),
        ]);
        let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
        for key in [
            "gateway.max_connections_per_user",
            "gateway.max_connections_per_ip",
            "gateway.handshake_timeout_ms",
            "gateway.tenant_send_rate",
            "gateway.tenant_send_burst",
        ] {
            assert!(err.contains(key), "{key} missing from:\n{err}");
        }
        let (cfg, _) = load(Role::Gateway, &[], &env(&[("HERALD_JWT_SECRET", "0123456789abcdef")])).unwrap();
        assert_eq!(cfg.gateway.handshake_timeout_ms, 10_000);
        assert_eq!(cfg.gateway.max_connections_per_user, 32);
    }

    #[test]
    fn secrets_are_not_printed() {
        let e = env(&[("HERALD_JWT_SECRET", "supersecretsupersecret")]);
        let (cfg, _) = load(Role::Gateway, &[], &e).unwrap();
        assert!(!format!("{cfg:?}").contains("supersecret"));
    }
}
