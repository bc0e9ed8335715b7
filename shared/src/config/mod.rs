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
//!
//! # Layout
//! - this module: the process-wide keys (URLs, addresses, secrets, node id) and the
//!   [`Config`] that holds every section.
//! - `table`: the key table behind the loader and the documentation ([`keys`],
//!   [`markdown_table`]).
//! - `auth`, `redis`, `ingress`, `gateway`, `worker`, `delivery`, `outbox`, `push`, `otel`: one section each
//!   ([`GatewayConfig`], ...), owning its keys, defaults and validation.
//! - `cidr`: IP networks ([`Cidr`]), for `gateway.trusted_proxies`.
//! - [`cli`]: the command line ([`Cli`]) and `--help`; `load`: the layers ([`load`]).
//! - `environment`: the `HERALD_*` variables that are not keys and still allowed
//!   (Kubernetes service links), and the nearest key of a misspelt one.

use std::fmt;
use std::net::SocketAddr;

mod auth;
mod cidr;
pub mod cli;
mod delivery;
#[cfg(test)]
mod docs;
mod environment;
mod gateway;
mod ingress;
mod load;
mod otel;
mod outbox;
mod push;
mod redis;
mod table;
mod worker;

pub use auth::AuthConfig;
pub use cidr::Cidr;
pub use cli::{Cli, Deprecated};
pub use delivery::DeliveryConfig;
pub use gateway::{CorsOrigins, GatewayConfig};
pub use ingress::IngressConfig;
pub use load::{load, Env, ProcessEnv};
pub use otel::{OtelConfig, TRACES_PATH};
pub use outbox::OutboxConfig;
pub use push::{PreviewPolicy, PushConfig};
pub use redis::RedisConfig;
pub use table::{env_name, keys, lookup, markdown_table, Alias, DefaultText, Key, Lookup, ALIASES};
pub use worker::WorkerConfig;

use table::{parse, BOTH, GATEWAY, WORKER};

use crate::telemetry::LogFormat;

/// Which process the configuration is for; some defaults differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Gateway,
    Worker,
    Loadtest,
}

impl Role {
    /// The role as the key table names it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::Worker => "worker",
            Role::Loadtest => "loadtest",
        }
    }
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
    /// Longest a MySQL statement may run before the server aborts it.
    pub mysql_statement_timeout_ms: u64,
    /// Worker threads of the process's async runtime; 0, one per CPU it may use.
    pub runtime_threads: usize,
    /// Prefix of every Redis key and channel; lets clusters (and tests) share a Redis.
    pub redis_key_prefix: String,
    /// HS256 key of device tokens for every tenant (the shared-key deployment).
    pub jwt_secret: Secret,
    /// HS256 key of service tokens (the server API); empty, that API refuses everything.
    pub service_secret: Secret,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub admin_token: Secret,
    pub node_id: String,
    /// A tracing filter, as in `RUST_LOG` (which wins when set).
    pub log: String,
    /// How log lines are written: text or JSON.
    pub log_format: LogFormat,
    /// Key sets per tenant, leeway, revocation.
    pub auth: AuthConfig,
    /// TLS of Redis connections.
    pub redis: RedisConfig,
    pub ingress: IngressConfig,
    pub gateway: GatewayConfig,
    pub worker: WorkerConfig,
    /// Read by both the gateway and the worker.
    pub delivery: DeliveryConfig,
    pub outbox: OutboxConfig,
    /// The offline push hand-off (worker).
    pub push: PushConfig,
    /// Traces of sends, exported over OTLP/HTTP (both processes); off by default.
    pub otel: OtelConfig,
}

/// The process-wide keys, outside any section.
const ROOT_KEYS: &[Key] = &[
    Key::new(
        "mysql_url",
        "mysql://root@127.0.0.1:3306/herald",
        BOTH,
        "URL of the MySQL or MariaDB primary (never a replica, reader endpoint or read/write-splitting proxy); TLS with its `ssl-mode` and `ssl-ca` parameters (docs/operations.md).",
    ),
    Key::new(
        "redis_url",
        "redis://127.0.0.1:6379/0",
        BOTH,
        "Redis URL; `redis-cluster://h1:p1,h2:p2` for a Redis Cluster; `rediss://`, `rediss-cluster://` with TLS.",
    ),
    Key::new(
        "mysql_statement_timeout_ms",
        "30000",
        BOTH,
        "Longest a MySQL statement may run before the server aborts it (a stuck query frees its connection).",
    ),
    Key::new(
        "runtime_threads",
        "0",
        BOTH,
        "Worker threads of the process's async runtime; 0, one per CPU the process may use. Fewer threads than CPUs cost fewer context switches per message; the process then uses at most that many cores (docs/capacity.md).",
    ),
    Key::new("redis_key_prefix", "hd", BOTH, "Prefix of every Redis key and channel; lets clusters share a Redis."),
    Key::new(
        "jwt_secret",
        "",
        BOTH,
        "HS256 key of client tokens, trusted for every tenant (the shared-key deployment): at least 16 bytes; gateways need it unless `auth.trust_file` is set.",
    ),
    Key::new(
        "service_secret",
        "",
        GATEWAY,
        "HS256 key of service tokens (the server API), trusted for every tenant: at least 16 bytes, not `jwt_secret`; empty, only the trust file's service issuers are.",
    ),
    Key::new("listen", "127.0.0.1:8080", GATEWAY, "Address of the client API (HTTP and WebSocket)."),
    Key::described(
        "admin_listen",
        "gateway `127.0.0.1:9090`, worker `127.0.0.1:9091`",
        BOTH,
        "Address of health, readiness, metrics and the admin API.",
    ),
    Key::new("admin_token", "", WORKER, "Bearer token of the admin API; empty, the admin API refuses everything."),
    Key::described("node_id", "generated", BOTH, "This process's name in logs, leases and Redis."),
    Key::new("log", "info", BOTH, "A tracing filter, as in `RUST_LOG` (which wins when set)."),
    Key::new(
        "log_format",
        "text",
        BOTH,
        "Log lines: `text` for people, or `json` (one object per line) for log collectors.",
    ),
];

/// The documented default of a process-wide key.
fn root_default<T: table::Setting>(name: &str) -> T {
    match ROOT_KEYS.iter().find(|k| k.name == name).map(|k| k.default) {
        Some(DefaultText::Value(v)) => T::parse(v).unwrap_or_else(|e| panic!("the default of {name}: {e}")),
        _ => panic!("{name} has no documented default value"),
    }
}

impl Config {
    pub fn defaults(role: Role) -> Config {
        let (admin, kind) = match role {
            Role::Gateway => ("127.0.0.1:9090", "gw"),
            Role::Worker => ("127.0.0.1:9091", "wk"),
            Role::Loadtest => ("127.0.0.1:9099", "lt"),
        };
        Config {
            mysql_url: root_default("mysql_url"),
            redis_url: root_default("redis_url"),
            mysql_statement_timeout_ms: root_default("mysql_statement_timeout_ms"),
            runtime_threads: root_default("runtime_threads"),
            redis_key_prefix: root_default("redis_key_prefix"),
            jwt_secret: root_default("jwt_secret"),
            service_secret: root_default("service_secret"),
            listen: root_default("listen"),
            admin_listen: admin.parse().expect("default address"),
            admin_token: root_default("admin_token"),
            node_id: format!("{kind}-{:08x}", rand::random::<u32>()),
            log: root_default("log"),
            log_format: root_default("log_format"),
            auth: AuthConfig::default(),
            redis: RedisConfig::default(),
            ingress: IngressConfig::default(),
            gateway: GatewayConfig::default(),
            worker: WorkerConfig::default(),
            delivery: DeliveryConfig::default(),
            outbox: OutboxConfig::default(),
            push: PushConfig::default(),
            otel: OtelConfig::default(),
        }
    }

    /// Applies one dotted key of the key table. Errors name what the key expects.
    pub fn set(&mut self, key: &str, v: &str) -> Result<(), SetError> {
        if !matches!(lookup(key), Lookup::Key(_)) {
            return Err(SetError::UnknownKey);
        }
        match key.split_once('.') {
            None => self.set_root(key, v),
            Some(("auth", name)) => self.auth.set(name, v),
            Some(("redis", name)) => self.redis.set(name, v),
            Some(("ingress", name)) => self.ingress.set(name, v),
            Some(("gateway", name)) => self.gateway.set(name, v),
            Some(("worker", name)) => self.worker.set(name, v),
            Some(("delivery", name)) => self.delivery.set(name, v),
            Some(("outbox", name)) => self.outbox.set(name, v),
            Some(("push", name)) => self.push.set(name, v),
            Some(("otel", name)) => self.otel.set(name, v),
            Some(_) => Err(SetError::UnknownKey),
        }
    }

    fn set_root(&mut self, key: &str, v: &str) -> Result<(), SetError> {
        match key {
            "mysql_url" => self.mysql_url = parse(v)?,
            "redis_url" => self.redis_url = parse(v)?,
            "mysql_statement_timeout_ms" => self.mysql_statement_timeout_ms = parse(v)?,
            "runtime_threads" => self.runtime_threads = parse(v)?,
            "redis_key_prefix" => self.redis_key_prefix = parse(v)?,
            "jwt_secret" => self.jwt_secret = parse(v)?,
            "service_secret" => self.service_secret = parse(v)?,
            "listen" => self.listen = parse(v)?,
            "admin_listen" => self.admin_listen = parse(v)?,
            "admin_token" => self.admin_token = parse(v)?,
            "node_id" => self.node_id = parse(v)?,
            "log" => self.log = parse(v)?,
            "log_format" => self.log_format = parse(v)?,
            _ => return Err(SetError::UnknownKey),
        }
        Ok(())
    }

    /// Checks values that parse but make no sense together.
    fn validate(&self, role: Role, errors: &mut Vec<ConfigError>) {
        let mut bad = Problems(errors);
        // Only gateways check tokens; one with a trust file may trust no shared key.
        let trust_file = self.auth.trust_file().is_some();
        if self.jwt_secret.0.is_empty() && !trust_file && role == Role::Gateway {
            bad.push("jwt_secret", "required unless auth.trust_file is set (HERALD_JWT_SECRET)");
        } else if !self.jwt_secret.0.is_empty() && self.jwt_secret.0.len() < 16 {
            bad.push("jwt_secret", "at least 16 bytes (HERALD_JWT_SECRET)");
        }
        if !self.service_secret.0.is_empty() && self.service_secret.0.len() < 16 {
            bad.push("service_secret", "at least 16 bytes, or empty to refuse the server API");
        }
        if !self.service_secret.0.is_empty() && self.service_secret.0 == self.jwt_secret.0 {
            bad.push("service_secret", "must differ from jwt_secret (devices must not mint service tokens)");
        }
        if !self.mysql_url.starts_with("mysql://") && !self.mysql_url.starts_with("mariadb://") {
            bad.push("mysql_url", "must start with mysql://");
        }
        for problem in crate::db::tls_file_problems(&self.mysql_url) {
            bad.push("mysql_url", &problem);
        }
        let schemes = ["redis://", "rediss://", "redis-cluster://", "rediss-cluster://"];
        if !schemes.iter().any(|s| self.redis_url.starts_with(s)) {
            bad.push("redis_url", "must start with redis://, rediss://, redis-cluster:// or rediss-cluster://");
        }
        if !(100..=3_600_000).contains(&self.mysql_statement_timeout_ms) {
            bad.push("mysql_statement_timeout_ms", "must be 100..=3600000");
        }
        if self.runtime_threads > 1_024 {
            bad.push("runtime_threads", "must be 0..=1024 (0: one per CPU)");
        }
        if self.redis_key_prefix.is_empty() || self.redis_key_prefix.contains(['{', '}', ' ']) {
            bad.push("redis_key_prefix", "must be non-empty without braces or spaces");
        }
        if !crate::auth::is_valid_ident(&self.node_id) || self.node_id.contains(['{', '}', '|']) {
            bad.push("node_id", "must be 1..64 printable ASCII characters without braces or `|`");
        }
        self.auth.validate(&mut bad);
        self.redis.validate(&self.redis_url, &mut bad);
        self.ingress.validate(&mut bad);
        self.gateway.validate(&mut bad);
        self.worker.validate(&mut bad);
        self.delivery.validate(&mut bad);
        self.outbox.validate(&mut bad);
        self.push.validate(&mut bad);
        self.otel.validate(&mut bad);
        // A fan-out the outbox still retries must find its message above the watermark,
        // or a Redis data loss in between would lose it (docs/reliability.md).
        let retry = self.outbox.retry_window_ms();
        if self.gateway.watermark_margin_ms < retry {
            bad.push(
                "gateway.watermark_margin_ms",
                &format!(
                    "must be at least the outbox's whole retry schedule, {retry} ms (outbox.first_retry_delay_ms, \
                     every outbox.backoff_ms up to outbox.max_attempts, and outbox.sending_stale_ms)"
                ),
            );
        }
    }
}

/// Why one key could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    /// The key table has no such key.
    #[error("unknown key")]
    UnknownKey,
    /// The value does not parse; the message says what the key expects.
    #[error("{0}")]
    Invalid(String),
}

/// Collects validation problems, each naming its key.
struct Problems<'a>(&'a mut Vec<ConfigError>);

impl Problems<'_> {
    fn push(&mut self, key: &str, message: &str) {
        self.0.push(ConfigError { key: key.into(), message: message.into() });
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

/// Test helpers shared by the sections' tests.
#[cfg(test)]
mod testing {
    use std::collections::BTreeMap;

    pub const SECRET: (&str, &str) = ("HERALD_JWT_SECRET", "0123456789abcdef");

    pub fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    pub fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }
}
